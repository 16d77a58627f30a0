package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// reactor is the agent's IO goroutine. Everything below is owned by it alone
// except where noted; other goroutines talk to it through Agent.post, the
// inbox channel and the scatter result queue.
type reactor struct {
	a     *Agent
	cfg   Config
	log   *slog.Logger
	clock Clock
	sched *credit.Scheduler // nil when bounce is off locally

	// sender role
	reqs      map[uint64]*sendReq
	down      map[string]peerDown    // peers reported lost and not heard from since
	refusals  map[string]peerRefusal // peers that refused this agent's handshake, not heard from since
	gathering []chunkRef
	writing   []chunkRef
	parked    parkQueue  // requests with chunks waiting for arena or copy contexts, oldest first
	parkBuf   []*sendReq // pumpParked's snapshot of parked, reused
	// retryParked is set when arena bytes or a copy context were freed (and
	// by the periodic check), so parked requests are retried then.
	retryParked bool
	direct      map[uint64]*directReq
	// served maps the pulls this agent serves (holder) to their requests
	// in reqs; servedPerPeer counts them per puller (MaxFlowsPerPeer).
	served        map[servedKey]uint64
	servedPerPeer map[string]int
	// runPool holds the run arrays chunks fill into (plan.FillFrom): a
	// chunk's gather runs come back once its gather ended, its scatter
	// runs once its DATA is encoded.
	runPool plan.RunPool

	// receiver role
	flowSeen map[credit.FlowKey]time.Time // last WANT, DATA or grant of each flow
	rflows   map[credit.FlowKey]*recvFlow // live requests awaiting their Received event
	// pulls are this agent's pulls in flight (puller), by flow; pullQuiet
	// the failed ones waiting for their last scatter to be reported.
	pulls        map[credit.FlowKey]*pullReq
	pullQuiet    map[credit.FlowKey]*Batch
	startingPull *startingPull // the pull startPull is granting, if any
	// reads are the reads of holders' staged regions in flight (puller,
	// pullread.go); offered is the staged region onStaged is handing to
	// onData, so the chunk it accepts is read before it is scattered.
	reads   []readTask
	offered *transfer.Desc
	// readFencing holds the holder's staging regions (by offset) whose
	// read grant was revoked and whose fence has not returned yet
	// (readFenced frees them).
	readFencing map[uint64]struct{}
	// quarantined lists quarantined regions in release order (every
	// quarantine lasts cfg.Quarantine, so the order is by time too).
	quarantined []quarantined
	// staleLocal lists local staging regions an engine may still read (a
	// write that ended without proof), released after cfg.Quarantine.
	staleLocal []quarantined
	lastSweep  time.Time
	ctrlPeers  map[string]*ctrlPeer // control peers added from WANT endpoints
	wantRate   map[string]*security.Bucket
	peerFlows  map[string]int // open flows per peer (flowSeen keys)
	lastPurge  map[string]time.Time
	jobs       chan *scatterTask
	tasks      map[uint64]*scatterTask // queued or running scatters by region offset
	resMu      sync.Mutex
	results    []*scatterTask                // finished tasks reported by the workers
	scatters   int                           // scatter tasks handed to workers and not yet reported
	rtraces    map[credit.FlowKey]*recvTrace // receiver spans of traced flows
	// freeRuns holds the run arrays of finished scatters, which the next
	// DATAs decode into (at most maxFreeRuns): a DATA of thousands of runs
	// then costs no allocation and no zeroing of a fresh array.
	freeRuns [][]transfer.Run

	inbox *fairInbox
	quit  chan struct{}
	// fenceJobs feeds the peerFencer (nil when the engine does not fence,
	// or in a simulation, which steps the reactor alone).
	fenceJobs chan<- fenceJob
	// fencedUntil holds the lost senders the engine fenced, until their
	// fence ends: their WANTs are dropped meanwhile (a WANT still queued
	// when the sender died would otherwise open a flow nobody writes),
	// except those of a new incarnation (the process restarted).
	fencedUntil map[string]fencedSender
	// wantInc is the incarnation (wire.Want.Incarnation) of each sender's
	// latest admitted WANT: the one a fence of that sender refuses.
	wantInc map[string]uint64

	shuttingDown bool
	shutdownAt   time.Time
	force        bool
	arenaQuiet   bool

	cmdBuf    []func(*reactor)
	lastCheck time.Time
	lastRetry time.Time

	enc encoder // the one buffer control messages are encoded into
}

// quarantined is a region that goes back to the free pool at until.
type quarantined struct {
	off   uint64
	until time.Time
}

func newReactor(a *Agent, sched *credit.Scheduler) *reactor {
	r := &reactor{
		a:             a,
		cfg:           a.cfg,
		log:           a.log,
		clock:         a.set.Clock,
		sched:         sched,
		reqs:          make(map[uint64]*sendReq),
		down:          make(map[string]peerDown),
		refusals:      make(map[string]peerRefusal),
		direct:        make(map[uint64]*directReq),
		served:        make(map[servedKey]uint64),
		pulls:         make(map[credit.FlowKey]*pullReq),
		pullQuiet:     make(map[credit.FlowKey]*Batch),
		servedPerPeer: make(map[string]int),
		flowSeen:      make(map[credit.FlowKey]time.Time),
		rflows:        make(map[credit.FlowKey]*recvFlow),
		ctrlPeers:     make(map[string]*ctrlPeer),
		tasks:         make(map[uint64]*scatterTask),
		readFencing:   make(map[uint64]struct{}),
		rtraces:       make(map[credit.FlowKey]*recvTrace),
		wantRate:      make(map[string]*security.Bucket),
		wantInc:       make(map[string]uint64),
		peerFlows:     make(map[string]int),
		lastPurge:     make(map[string]time.Time),
		inbox:         newFairInbox(),
		quit:          make(chan struct{}),
	}
	if sched != nil {
		// Every queued job holds a distinct region, so this never fills.
		r.jobs = make(chan *scatterTask, int(sched.Capacity()/a.cfg.Granularity)+1)
	}
	return r
}

// startHelpers starts the engine notification pump (when the agent reads
// the engine's notifications: DONE notices from peers without a control
// path), the control receive pump (whenever there is a control channel: a
// direct-only agent still hears DONE notices) and, with bounce up, the
// scatter workers.
func (r *reactor) startHelpers(wg *sync.WaitGroup) {
	if n := engineNotes(r.a.set); n != nil {
		p := &notePump{notes: n, inbox: r.inbox, quit: r.quit, admitted: r.a.set.Peers.Admitted, unadmitted: r.dropUnadmitted,
			bad: func(peer string, err error) {
				if c := r.a.stats.badMessages.Add(1); c&(c-1) == 0 {
					r.log.Warn("dropped engine notification", "peer", peer, "err", err, "bad_total", c)
				}
			}}
		p.start(wg)
	}
	if r.a.set.Control == nil {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.pump()
	}()
	if r.sched == nil {
		return
	}
	if fences(r.a.set.Engine) {
		jobs := make(chan fenceJob, fenceQueue)
		f := &peerFencer{eng: r.a.set.Engine, jobs: jobs, quit: r.quit, claim: r.a.claimFence, done: func(j fenceJob, fenced bool) {
			r.a.post(func(r *reactor) { r.lostPeerFenced(j, fenced) })
		}}
		r.fenceJobs = jobs
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.run()
		}()
	}
	for i := 0; i < r.cfg.ScatterWorkers; i++ {
		w := &scatterWorker{scatterer: r.a.set.Scatterer, tasks: r.jobs, quit: r.quit, report: r.reportScatter}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run()
		}()
	}
}

// reportScatter queues a finished scatter task for the reactor; it runs on
// the worker's goroutine.
func (r *reactor) reportScatter(t *scatterTask) {
	r.resMu.Lock()
	r.results = append(r.results, t)
	r.resMu.Unlock()
	r.a.kick()
}

// pump moves control messages from the channel into the reactor's inbox.
func (r *reactor) pump() {
	ctrl := r.a.set.Control
	for {
		select {
		case <-r.quit:
			return
		default:
		}
		m, err := ctrl.Recv(20 * time.Millisecond)
		if err != nil {
			if errors.Is(err, transfer.ErrClosed) {
				return
			}
			if !errors.Is(err, transfer.ErrTimeout) {
				r.log.Warn("control receive failed", "err", err)
				select {
				case <-r.quit:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
			continue
		}
		// Unadmitted senders are dropped here, before they take queue
		// space (see onMessage).
		if !r.a.set.Peers.Admitted(m.Peer) {
			r.dropUnadmitted(m.Peer)
			continue
		}
		for !r.inbox.push(m) {
			select {
			case <-r.inbox.space:
			case <-r.quit:
				return
			}
		}
	}
}

// maxBusyBackoff caps the reactor's sleep while ops are outstanding: engines
// without a completion signal are polled at least this often.
const maxBusyBackoff = 100 * time.Microsecond

// run is the reactor loop: process everything ready, then wait adaptively —
// spin briefly while ops are outstanding, back off up to maxBusyBackoff, and
// block without a deadline (beyond timeout checks) when idle.
func (r *reactor) run() {
	defer close(r.a.stopped)
	defer close(r.quit)
	var wake <-chan struct{} = r.a.set.Wake
	backoff := time.Duration(0)
	spins := 0
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		progressed := r.tick()
		if r.finished() {
			r.arenaQuiet = len(r.gathering) == 0 && len(r.writing) == 0 && r.scatters == 0
			return
		}
		if progressed {
			spins, backoff = 0, 0
			continue
		}
		var wait time.Duration
		if r.busy() {
			if spins < 64 {
				spins++
				runtime.Gosched()
				continue
			}
			switch {
			case backoff == 0:
				backoff = 20 * time.Microsecond
			case backoff < maxBusyBackoff:
				backoff *= 2
			}
			wait = backoff
		} else {
			wait = 10 * time.Millisecond // timeout checks only
		}
		timer.Reset(wait)
		select {
		case <-r.a.kickCh:
		case <-wake:
		case <-r.inbox.ready:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// busy reports whether ops are outstanding that the reactor must poll.
func (r *reactor) busy() bool {
	return len(r.gathering) > 0 || len(r.writing) > 0 || len(r.direct) > 0 || r.scatters > 0
}

func (r *reactor) tick() bool {
	progressed := false
	r.cmdBuf = r.a.takeCmds(r.cmdBuf)
	for _, fn := range r.cmdBuf {
		fn(r)
		progressed = true
	}
	clear(r.cmdBuf)
	for i := 0; i < 256; i++ {
		m, ok := r.inbox.pop()
		if !ok {
			break
		}
		r.onMessage(m)
		progressed = true
	}
	if r.drainScatterResults() {
		progressed = true
	}
	if r.pollGathers() {
		progressed = true
	}
	if r.pollWrites() {
		progressed = true
	}
	if r.pollReads() {
		progressed = true
	}
	if r.pumpParked() {
		progressed = true
	}
	if r.pollDirect() {
		progressed = true
	}
	if now := r.clock.Now(); now.Sub(r.lastCheck) >= time.Millisecond {
		r.lastCheck = now
		r.checkTimeouts(now)
		r.releaseQuarantine(now)
		if now.Sub(r.lastSweep) >= min(r.cfg.FlowExpiry/8, r.cfg.UnreachedGrace/4) {
			r.lastSweep = now
			r.expireFlows(now)
		}
		if now.Sub(r.lastRetry) >= 10*time.Millisecond {
			// Safety net: parked requests are retried at least this often
			// even if no free event was seen.
			r.lastRetry = now
			r.retryParked = true
			r.publishTables()
		}
	}
	return progressed
}

// onMessage decodes and dispatches one control message. Anything malformed
// is dropped with a logged reason and a counter; nothing here panics.
//
// A message whose sender is not an admitted peer is dropped before it is
// decoded: the control channel names the sender from its authenticated key
// (zmq CURVE, the engine's handshake for nixlnotif), and only peers the
// trust policy admits get further.
func (r *reactor) onMessage(m transfer.Message) {
	if !r.a.set.Peers.Admitted(m.Peer) {
		r.dropUnadmitted(m.Peer)
		return
	}
	msg, err := r.decode(m.Payload)
	if err != nil {
		r.a.stats.badMessages.Add(1)
		r.a.obs.reject(r, m.Peer, rejectMalformed)
		r.log.Warn("dropped malformed control message", "peer", m.Peer, "err", err)
		return
	}
	if r.sched == nil {
		switch msg.(type) {
		case *wire.Want, *wire.Data, *wire.Pull, *wire.PullEnd, *wire.Staged:
			// Bounce is off here; the peer's handshake check keeps it
			// from sending these, so this one is unexpected.
			r.a.stats.badMessages.Add(1)
			r.log.Warn("bounce message dropped: bounce is off on this agent", "peer", m.Peer, "type", msg.Type())
			return
		}
	}
	delete(r.down, m.Peer) // heard from: not lost
	delete(r.refusals, m.Peer)
	switch msg := msg.(type) {
	case *wire.Done:
		r.onDone(m.Peer, msg)
	case *wire.Want:
		r.onWant(m.Peer, m.From, msg)
	case *wire.Grant:
		r.onGrant(m.Peer, msg)
	case *wire.Data:
		r.onData(m.Peer, msg)
	case *wire.Ack:
		r.onAck(m.Peer, msg)
	case *wire.Nack:
		r.onNack(m.Peer, msg)
	case *wire.Pull:
		r.onPull(m.Peer, m.From, msg)
	case *wire.PullEnd:
		r.onPullEnd(m.Peer, msg)
	case *wire.Staged:
		r.onStaged(m.Peer, msg)
	default:
		r.a.stats.badMessages.Add(1)
		r.a.obs.reject(r, m.Peer, rejectUnexpected)
	}
}

// maxFreeRuns bounds reactor.freeRuns.
const maxFreeRuns = 16

// decode decodes a control message; a DATA decodes into a recycled run
// array when one is free.
func (r *reactor) decode(b []byte) (wire.Message, error) {
	if t, err := wire.PeekType(b); err != nil || t != wire.TypeData || len(r.freeRuns) == 0 {
		return wire.Unmarshal(b)
	}
	n := len(r.freeRuns) - 1
	d := &wire.Data{Runs: r.freeRuns[n]}
	r.freeRuns[n] = nil
	r.freeRuns = r.freeRuns[:n]
	if err := wire.UnmarshalData(b, d); err != nil {
		r.recycleRuns(d.Runs)
		return nil, err
	}
	return d, nil
}

// recycleRuns keeps a run array nothing reads any more for a later DATA.
func (r *reactor) recycleRuns(runs []transfer.Run) {
	if cap(runs) > 0 && len(r.freeRuns) < maxFreeRuns {
		r.freeRuns = append(r.freeRuns, runs[:0])
	}
}

// dropUnadmitted counts (and now and then logs) a message from a sender
// that is not an admitted peer.
func (r *reactor) dropUnadmitted(peer string) {
	n := r.a.stats.unadmitted.Add(1)
	if n&(n-1) == 0 {
		r.log.Warn("dropped control message from a peer that is not admitted", "peer", peer, "unadmitted_total", n)
	}
}

// send marshals and sends a control message without blocking. A failed send
// is counted and logged; the caller decides what it means for the request.
func (r *reactor) send(peer string, m wire.Message) error {
	b, err := r.enc.encode(m)
	if err == nil {
		err = r.a.set.Control.Send(peer, b)
	}
	if _, ok := m.(*wire.Want); ok && err == nil {
		r.a.stats.wants.Add(1)
	}
	if err != nil {
		r.a.stats.sendDrops.Add(1)
		r.log.Warn("control message dropped", "peer", peer, "type", m.Type(), "err", err)
	}
	return err
}

// maxKeptEncoding is the largest encoding buffer an encoder keeps for the
// next message (a DATA of a few thousand runs); a larger one is dropped
// after its message.
const maxKeptEncoding = 256 << 10

// encoder encodes the reactor's control messages into one reused buffer:
// a control channel copies a payload before Send returns
// (transfer.ControlChannel), so the next message may overwrite it.
type encoder struct{ buf []byte }

// encode returns m's encoding, valid until the next call.
func (e *encoder) encode(m wire.Message) ([]byte, error) {
	b, err := wire.AppendMarshal(e.buf[:0], m)
	if err != nil {
		return nil, err
	}
	if cap(b) <= maxKeptEncoding {
		e.buf = b[:0]
	}
	return b, nil
}

// forgetPeer reclaims the peer's flows and fails the requests to it.
// fenced says the engine proved the peer can no longer write local memory
// (it fences forgotten peers and just forgot this one): the regions are
// free at once; otherwise they are quarantined.
func (r *reactor) forgetPeer(peer string, fenced bool) {
	r.a.obs.peerFlowsEnded(r, peer, "reclaimed")
	delete(r.down, peer)
	delete(r.refusals, peer)
	delete(r.ctrlPeers, peer)
	r.failFlows(func(k credit.FlowKey) bool { return k.Peer == peer }, fmt.Errorf("peer forgotten: %w", transfer.ErrPeerLost))
	delete(r.wantRate, peer)
	delete(r.wantInc, peer)
	delete(r.lastPurge, peer)
	if r.a.guard != nil {
		r.a.guard.revokeMatching(func(k credit.FlowKey) bool { return k.Peer == peer })
	}
	if r.sched != nil {
		if fenced {
			r.sched.ReclaimPeer(peer)
		} else {
			r.quarantine(r.sched.QuarantinePeer(peer))
		}
		r.cancelScatters(func(k credit.FlowKey) bool { return k.Peer == peer })
		r.schedule()
	}
	for _, q := range r.reqs {
		if q.peer == peer {
			q.noCancel = true
			r.fail(q, transfer.ErrPeerLost)
		}
	}
}

// peerGone handles a peer the engine reported lost (the last connection
// it dialed here ended, or the last one dialed to it broke: a process
// killed with kill -9 shows within a round trip), or the control channel
// did (its connection to the peer dropped); why says which. As a receiver it
// reclaims the peer's flows instead of leaving them to expiry and closes
// the control path opened from its WANTs; the regions are quarantined:
// the closed connections prove their writes over, but the peer may dial
// again, and only a fence (ForgetPeer) would refuse that. As a sender it
// fails the requests to the peer (ErrPeerLost), those waiting for a GRANT
// or an ACK included, instead of leaving them to their timeout.
func (r *reactor) peerGone(peer, why string) {
	r.a.stats.lostPeers.Add(1)
	// Requests submitted from now on are failed too unless the peer is
	// heard from again (checkTimeouts): no second report would come for
	// them. Only a loaded peer can be sent to (and ForgetPeer drops the
	// entry), so senders that only wrote here leave nothing behind.
	if _, loaded := r.descEndpoint(peer); loaded {
		r.down[peer] = peerDown{at: r.clock.Now(), why: why}
	}
	for _, q := range r.reqs {
		if q.peer == peer && q.err == nil {
			r.fail(q, fmt.Errorf("pipeline: request %d: %s to %q: %w", q.id, why, peer, transfer.ErrPeerLost))
		}
	}
	live := r.sched != nil && r.liveFlows(peer)
	r.a.obs.peerFlowsEnded(r, peer, "lost")
	r.failFlows(func(k credit.FlowKey) bool { return k.Peer == peer },
		fmt.Errorf("flow reclaimed: %s to its sender: %w", why, transfer.ErrPeerLost))
	if r.a.guard != nil {
		r.a.guard.revokeMatching(func(k credit.FlowKey) bool { return k.Peer == peer })
	}
	if r.sched != nil {
		if offs := r.sched.QuarantinePeer(peer); len(offs) > 0 || live {
			// Warned only when regions were held: flows still waiting for
			// a grant hold nothing, which is nothing to warn about.
			level := slog.LevelDebug
			if len(offs) > 0 {
				level = slog.LevelWarn
			}
			r.log.Log(context.Background(), level, "flows reclaimed: their sender is lost", "peer", peer, "why", why, "regions", len(offs))
			// Fenced even when no region waits for a write (all being
			// scattered, or none granted yet): the fence also drops the
			// WANTs the sender sent before it died that are still queued
			// here, which would open flows nobody writes.
			r.fenceLost(peer, offs, r.quarantine(offs))
		}
		r.cancelScatters(func(k credit.FlowKey) bool { return k.Peer == peer })
		r.purgeEndedFlows(peer)
		r.schedule()
	}
	r.dropControlPeer(peer)
	delete(r.wantInc, peer) // the fence job took it (fenceLost)
	r.publishTables()
}

// fenceQueue bounds the lost senders waiting to be fenced; past it their
// regions just serve out the quarantine.
const fenceQueue = 256

// fenceLost asks the peerFencer to fence a lost sender that had live
// flows (holding offs), so that offs are released before the quarantine
// ends and the sender's late WANTs are dropped (lostPeerFenced). Only a
// sender this agent learned from its WANTs qualifies: the fence drops a
// loaded peer's engine state, which LoadPeer owns.
func (r *reactor) fenceLost(peer string, offs []uint64, until time.Time) {
	if r.fenceJobs == nil {
		return
	}
	if _, loaded := r.descEndpoint(peer); loaded {
		return
	}
	select {
	case r.fenceJobs <- fenceJob{peer: peer, offs: offs, until: until, inc: r.wantInc[peer]}:
	default:
	}
}

// lostPeerFenced handles the engine's fence of a lost sender: the regions
// its flows held are released from quarantine at once, and flows the
// sender opened since (its connections are now refused) are reclaimed
// free. Unfenced (ForgetPeer failed), they serve out the quarantine.
func (r *reactor) lostPeerFenced(j fenceJob, fenced bool) {
	if !fenced || r.sched == nil {
		return
	}
	now := r.clock.Now()
	if r.fencedUntil == nil {
		r.fencedUntil = make(map[string]fencedSender)
	}
	for p, f := range r.fencedUntil {
		if !now.Before(f.until) {
			delete(r.fencedUntil, p)
		}
	}
	r.fencedUntil[j.peer] = fencedSender{until: now.Add(r.cfg.Quarantine), inc: j.inc}
	if r.hasFlows(j.peer) {
		r.failFlows(func(k credit.FlowKey) bool { return k.Peer == j.peer },
			fmt.Errorf("flow reclaimed: its sender was lost and is fenced: %w", transfer.ErrPeerLost))
		if r.a.guard != nil {
			r.a.guard.revokeMatching(func(k credit.FlowKey) bool { return k.Peer == j.peer })
		}
		r.sched.ReclaimPeer(j.peer)
		r.cancelScatters(func(k credit.FlowKey) bool { return k.Peer == j.peer })
		r.purgeEndedFlows(j.peer)
		r.dropControlPeer(j.peer)
	}
	r.releaseEarly(j.offs, j.until)
	r.a.stats.fencedReleases.Add(uint64(len(j.offs)))
	r.schedule()
	r.publishTables()
}

// liveFlows reports whether peer has a flow the scheduler still serves.
func (r *reactor) liveFlows(peer string) bool {
	for k := range r.flowSeen {
		if k.Peer == peer && r.sched.Active(k) {
			return true
		}
	}
	return false
}

// hasFlows reports whether the receiver tracks a flow of peer.
func (r *reactor) hasFlows(peer string) bool {
	for k := range r.flowSeen {
		if k.Peer == peer {
			return true
		}
	}
	return false
}

// dropControlPeer closes the control path to peer that a WANT opened,
// unless the peer's descriptor was loaded (LoadPeer owns that path then).
func (r *reactor) dropControlPeer(peer string) {
	if _, ok := r.ctrlPeers[peer]; !ok {
		return
	}
	if _, loaded := r.descEndpoint(peer); loaded {
		return
	}
	delete(r.ctrlPeers, peer)
	if err := r.a.set.Control.RemovePeer(peer); err != nil && !errors.Is(err, transfer.ErrUnknownPeer) {
		r.log.Warn("remove control peer", "peer", peer, "err", err)
	}
}

// publishTables mirrors the sizes of the reactor's tables into the stats.
func (r *reactor) publishTables() {
	r.a.stats.controlPeers.Store(uint64(len(r.ctrlPeers)))
	r.a.stats.requests.Store(uint64(len(r.reqs) + len(r.direct)))
	if r.sched != nil {
		r.a.stats.flows.Store(uint64(r.sched.Stats().Flows))
	}
}

func (r *reactor) beginShutdown() {
	if r.shuttingDown {
		return
	}
	r.shuttingDown = true
	r.shutdownAt = r.clock.Now()
	r.failFlows(func(credit.FlowKey) bool { return true }, fmt.Errorf("receiver shutting down: %w", transfer.ErrClosed))
	for _, q := range r.reqs {
		r.fail(q, transfer.ErrClosed)
	}
	for _, d := range r.direct {
		d.fail(r, transfer.ErrClosed)
	}
}

func (r *reactor) forceStop() { r.force = true }

// finished reports whether the reactor may exit: shutting down and nothing
// outstanding, or forced.
func (r *reactor) finished() bool {
	if !r.shuttingDown {
		return false
	}
	if r.force {
		r.abandonAll()
		r.endFlowSpans()
		return true
	}
	if len(r.reqs) == 0 && len(r.direct) == 0 && r.scatters == 0 {
		r.endFlowSpans()
		return true
	}
	if r.clock.Now().Sub(r.shutdownAt) > r.cfg.QuiesceTimeout {
		r.log.Warn("shutdown: ops still outstanding after the quiesce timeout", "requests", len(r.reqs), "direct", len(r.direct), "scatters", r.scatters)
		r.abandonAll()
		r.endFlowSpans()
		return true
	}
	return false
}

// endFlowSpans ends the receiver spans of flows still open at shutdown.
func (r *reactor) endFlowSpans() {
	for key := range r.rtraces {
		r.a.obs.flowEnded(r, key, "shutdown")
	}
}

// abandonAll publishes every remaining batch as failed; those with ops still
// outstanding stay not quiescent.
func (r *reactor) abandonAll() {
	for _, q := range r.reqs {
		r.publish(q.b, transfer.ErrClosed, q.gathers == 0 && !q.tainted)
	}
	for _, d := range r.direct {
		r.publish(d.b, transfer.ErrClosed, false)
	}
}
