package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// chunkState is where one chunk of a bounce request stands on the sender.
type chunkState uint8

const (
	cIdle      chunkState = iota // not started
	cGathering                   // gather op outstanding (reads caller memory)
	cGathered                    // staged, waiting for its credit
	cWriting                     // bulk write outstanding (reads staging)
	cDataSent                    // landed at the peer, DATA sent, waiting for ACK
	cAcked                       // scattered by the peer
)

type sendChunk struct {
	st     chunkState
	staged bool   // holds a staging region at off
	off    uint64 // staging region offset in the local arena
	eager  bool   // staging counted against the eager budget
	// offered: the staging region is offered to the puller to read
	// (STAGED) and its read grant is in force until the ACK or a failure.
	offered bool
	credit  *wire.Credit
	op      transfer.Op

	started time.Time   // gather start, for the chunk latency metric
	tr      *chunkTrace // nil unless the request is traced
	phase   time.Time   // start of the current gather, write or ACK wait (Stages)
}

type sendReq struct {
	id    uint64
	peer  string
	pi    *peerInfo // the peer as it was loaded when the request was submitted
	b     *Batch
	plan  *plan.Plan
	ch    []sendChunk
	next  int // chunks below next have been started
	acked int
	live  int // started and not yet acked

	started      time.Time // when the request was submitted
	lastProgress time.Time
	err          error     // non-nil once failing
	failedAt     time.Time // when err was set
	gathers      int       // gather ops outstanding (touch caller memory)
	writes       int       // write ops outstanding (touch staging)
	cancelSent   bool
	noCancel     bool // the peer is gone: no cancel to send
	tainted      bool // an op ended without proof of quiescence
	unproven     bool // a write ended without proof that it stopped
	// pull is set on a request serving a peer's pull (pull.go).
	pull      *servedPull
	published bool
	wantAt    time.Time // when the WANT went out
	granted   bool      // the first GRANT arrived
	stages    Stages

	// parked, parkPrev and parkNext place the request in reactor.parked.
	parked             bool
	parkPrev, parkNext *sendReq
}

type chunkRef struct {
	q *sendReq
	k int
}

func (r *reactor) submitBounce(b *Batch, pi *peerInfo, p *plan.Plan, tag []byte, blocks *wire.WantBlocks) {
	if r.shuttingDown {
		r.publish(b, fmt.Errorf("pipeline: submit: %w", transfer.ErrClosed), true)
		return
	}
	peer := pi.name
	if pi.forgotten.Load() {
		r.publish(b, fmt.Errorf("pipeline: submit to %q: forgotten before the request started: %w", peer, transfer.ErrPeerLost), true)
		return
	}
	now := r.clock.Now()
	q := &sendReq{id: b.id, peer: peer, pi: pi, b: b, plan: p, ch: make([]sendChunk, len(p.Chunks)), started: now, lastProgress: now}
	if len(p.Chunks) == 0 {
		r.publish(b, nil, true)
		return
	}
	sizes := p.ChunkBytes()
	r.reqs[q.id] = q
	want := &wire.Want{Request: q.id, ChunkBytes: sizes, Endpoint: r.a.set.Control.LocalEndpoint(), Tag: tag, Blocks: blocks, Incarnation: r.a.inc}
	r.a.obs.inject(b.obs.ctx, &want.TraceParent)
	q.wantAt = time.Now()
	// The receiver admits this agent by now (it is asked to grant to it):
	// an engine that can opens its connection ahead of the first write, so
	// the receiver notices this process die even before that write.
	if c, ok := r.a.set.Engine.(transfer.Connector); ok {
		c.Connect(peer)
	}
	if err := r.send(peer, want); err != nil {
		q.noCancel = true // the flow never reached the peer
		r.fail(q, fmt.Errorf("pipeline: send WANT to %q: %w", peer, err))
		return
	}
	r.advance(q)
}

// advance starts every chunk it may: eagerly (before a credit) when enabled,
// or once its credit arrived, up to W live chunks. A chunk that cannot get a
// staging region or a copy context parks the request for a later retry.
//
// Parked requests are served oldest first: while something freed since
// they were last tried waits for them (retryParked), a request that is not
// parked queues behind them instead of taking it.
func (r *reactor) advance(q *sendReq) {
	if q.err != nil {
		return
	}
	if !r.parked.has(q) && r.retryParked && r.parked.len() > 0 {
		r.parked.push(q)
		return
	}
	if r.startChunks(q) {
		r.parked.push(q) // a request parked already keeps its place
	} else {
		r.parked.remove(q)
	}
}

// startChunks is advance's loop; it reports whether q must park.
func (r *reactor) startChunks(q *sendReq) (park bool) {
	for q.next < len(q.ch) && q.live < r.cfg.MaxInflight {
		k := q.next
		c := &q.ch[k]
		if c.credit == nil && !r.cfg.EagerGather {
			return false
		}
		bytes := q.plan.Chunks[k].Bytes
		q.plan.FillFrom(k, &r.runPool) // emit the chunk's runs now that it starts (Agent.plan)
		eager := c.credit == nil
		off, ok := r.sched.AcquireLocal(bytes, eager)
		if !ok {
			return true
		}
		op, err := r.gather(q.plan, k, r.regionDesc(off, bytes))
		if err != nil {
			r.releaseLocal(off)
			if errors.Is(err, transfer.ErrBusy) {
				return true
			}
			r.fail(q, fmt.Errorf("pipeline: gather chunk %d: %w", k, err))
			return false
		}
		c.st, c.staged, c.off, c.eager, c.op = cGathering, true, off, eager, op
		c.started = time.Now()
		c.phase = c.started
		r.a.obs.chunkStarted(q, k, c.started)
		q.gathers++
		q.live++
		q.next++
		r.gathering = append(r.gathering, chunkRef{q, k})
	}
	return false
}

// pumpParked retries parked requests, oldest first, but only after
// something was freed (arena bytes, a copy context) or the periodic
// safety-net retry; a parked request never keeps the reactor spinning.
// Every parked request is tried, not only up to the first that stays
// parked: a request with its credit may fit where an eager one is over the
// eager budget, and holding it back would leave the receiver's granted
// region idle.
func (r *reactor) pumpParked() bool {
	if r.parked.len() == 0 || !r.retryParked {
		return false
	}
	r.retryParked = false
	progressed := false
	snap := r.parked.appendTo(r.parkBuf[:0])
	for _, q := range snap {
		if !r.parked.has(q) {
			continue // failed or finished meanwhile
		}
		before := q.next
		r.advance(q)
		if q.next != before {
			progressed = true
		}
	}
	clear(snap)
	r.parkBuf = snap[:0]
	return progressed
}

// gather starts chunk k's gather into region: its runs, or a block-table
// chunk's piece range (gatherBlocks).
func (r *reactor) gather(p *plan.Plan, k int, region transfer.Desc) (transfer.Op, error) {
	if _, _, ok := p.Shapes(); ok {
		return gatherShaped(r.a.set.Gatherer, region, p.GatherShaped(k))
	}
	if _, _, ok := p.BlockTables(); ok {
		return gatherBlocks(r.a.set.Gatherer, region, p.GatherCopy(k))
	}
	return r.a.set.Gatherer.Gather(region, p.Chunks[k].Gather)
}

func (r *reactor) regionDesc(off, n uint64) transfer.Desc {
	return transfer.Desc{Addr: r.a.arenaD.Addr + off, Len: n, Kind: r.a.arenaD.Kind, Device: r.a.arenaD.Device}
}

func (r *reactor) releaseLocal(off uint64) {
	if err := r.sched.ReleaseLocal(off); err != nil {
		r.log.Error("release staging region", "off", off, "err", err)
	}
	r.schedule() // freed bytes may serve a waiting remote flow
}

func (r *reactor) onGrant(peer string, g *wire.Grant) {
	q, ok := r.sendReqOf(peer, g.Request)
	if !ok || q.err != nil {
		return // stale: the request ended; its cancel reclaims the regions
	}
	if q.peer != peer {
		r.a.stats.badMessages.Add(1)
		r.a.obs.reject(r, peer, rejectUnexpected)
		r.log.Warn("GRANT from the wrong peer dropped", "peer", peer, "request", g.Request, "owner", q.peer)
		return
	}
	for _, cr := range g.Credits {
		k := int(cr.Chunk)
		if k >= len(q.ch) || q.ch[k].credit != nil || cr.Len < q.plan.Chunks[k].Bytes {
			r.a.stats.badMessages.Add(1)
			r.a.obs.reject(r, peer, rejectBadCredit)
			r.fail(q, fmt.Errorf("pipeline: peer %q sent an invalid credit %+v for request %d", peer, cr, q.id))
			return
		}
		c := &q.ch[k]
		c.credit = &cr
		r.a.obs.granted(q, k, c.credit)
		q.lastProgress = r.clock.Now()
		if !q.granted {
			q.granted = true
			q.stages.GrantWait = q.lastProgress.Sub(q.wantAt)
		}
		if c.staged && c.eager {
			if err := r.sched.PromoteLocal(c.off); err != nil {
				r.log.Error("promote staging region", "err", err)
			}
			c.eager = false
		}
		if c.st == cGathered {
			r.postWrite(q, k)
		}
	}
	r.advance(q)
}

// pollRefs polls the op of every chunk in refs, releases each terminal one
// and hands it to done; it returns the chunks still pending and whether any
// op finished.
func (r *reactor) pollRefs(refs []chunkRef, what string, done func(q *sendReq, k int, st transfer.Status, err error)) ([]chunkRef, bool) {
	progressed := false
	keep := refs[:0]
	for _, ref := range refs {
		c := &ref.q.ch[ref.k]
		st, err := c.op.Poll()
		if st == transfer.Pending {
			keep = append(keep, ref)
			continue
		}
		progressed = true
		if rerr := c.op.Release(); rerr != nil {
			r.log.Warn("release "+what+" op", "err", rerr)
		}
		c.op = nil
		done(ref.q, ref.k, st, err)
	}
	clear(refs[len(keep):])
	return keep, progressed
}

func (r *reactor) pollGathers() bool {
	var progressed bool
	r.gathering, progressed = r.pollRefs(r.gathering, "gather", r.gatherDone)
	return progressed
}

// gatherDone moves a chunk whose gather ended to its write, or settles its
// failing request.
func (r *reactor) gatherDone(q *sendReq, k int, st transfer.Status, err error) {
	c := &q.ch[k]
	q.gathers--
	r.retryParked = true // a copy context is free again
	q.stages.Gather += time.Since(c.phase)
	r.a.obs.gatherEnded(q, k, err)
	if st == transfer.Failed {
		if errors.Is(err, transfer.ErrDeviceFault) {
			q.b.markFault()
		}
		if errors.Is(err, transfer.ErrNotQuiescent) {
			// No proof the gather stopped: neither the caller's memory
			// nor the staging region may be reused.
			c.staged = false
			q.tainted = true
		}
		r.fail(q, fmt.Errorf("pipeline: gather chunk %d: %w", k, err))
	}
	if q.err != nil {
		r.a.obs.chunkFailed(q, k, q.err)
		r.dropStaging(c)
		r.settle(q)
		return
	}
	c.st = cGathered
	q.plan.RecycleGather(k, &r.runPool) // the gather op is over: nothing reads its runs
	if c.credit != nil {
		r.postWrite(q, k)
	}
}

func (r *reactor) dropStaging(c *sendChunk) {
	if c.staged {
		c.staged = false
		r.releaseLocal(c.off)
	}
}

func (r *reactor) postWrite(q *sendReq, k int) {
	if q.pull != nil && q.pull.read {
		r.offerStaged(q, k) // the puller reads it: nothing is written
		return
	}
	c := &q.ch[k]
	n := q.plan.Chunks[k].Bytes
	// The destination is the peer's arena: its GRANT credit says which
	// memory that is (a device arena, or host memory: a pinned-host arena
	// staging device KV over a host engine).
	dst := transfer.Desc{Addr: c.credit.Addr, Len: n, Device: c.credit.Device, Kind: c.credit.Kind}
	if dst.Kind == transfer.Host {
		dst.Device = 0
	}
	r.a.obs.writeStarted(q, k)
	op, err := r.a.obs.write(r.a.set.Writer, c.tr, q.peer, r.regionDesc(c.off, n), dst)
	if err != nil {
		r.a.obs.writeEnded(q, k, err)
		r.dropStaging(c)
		r.fail(q, fmt.Errorf("pipeline: write chunk %d to %q: %w", k, q.peer, err))
		return
	}
	c.st, c.op, c.phase = cWriting, op, time.Now()
	q.writes++
	r.writing = append(r.writing, chunkRef{q, k})
}

func (r *reactor) pollWrites() bool {
	var progressed bool
	r.writing, progressed = r.pollRefs(r.writing, "write", r.writeDone)
	return progressed
}

// writeDone sends the DATA of a chunk that landed, or settles its failing
// request.
func (r *reactor) writeDone(q *sendReq, k int, st transfer.Status, err error) {
	c := &q.ch[k]
	q.writes--
	q.stages.Write += time.Since(c.phase)
	r.a.obs.writeEnded(q, k, err)
	if st == transfer.Failed && errors.Is(err, transfer.ErrNotQuiescent) {
		// The engine may still read the staging region: never reuse it.
		// The caller's memory is not involved (the gather finished), so the
		// batch itself stays releasable. The write may also still land in
		// the granted region, so no cancel is sent: a cancel frees the
		// regions at once, while the receiver's expiry of the silent flow
		// quarantines them first.
		// The region goes back to the pool once the quarantine is over: the
		// engine contract bounds how long a write stays in flight, as for
		// the receiver's quarantine (a permanent leak otherwise: one region
		// per such write, for the life of the agent).
		c.staged = false
		q.unproven = true
		if q.pull == nil {
			q.noCancel = true
		}
		r.quarantineLocal(c.off)
	} else {
		r.dropStaging(c) // the engine no longer reads the staging region
	}
	if st == transfer.Failed {
		werr := fmt.Errorf("pipeline: write chunk %d to %q: %w", k, q.peer, err)
		r.fail(q, werr)
		if errors.Is(err, transfer.ErrPeerLost) {
			r.peerLost(q.peer, werr)
		}
	}
	if q.err != nil {
		r.a.obs.chunkFailed(q, k, q.err)
		r.settle(q)
		return
	}
	ch := q.plan.Chunks[k]
	data := &wire.Data{Request: q.wireID(), Chunk: uint32(k), Region: c.credit.Region, Runs: ch.Scatter}
	if ch.Count > 0 { // the block-table form: the piece range, no runs
		data.Pieces = wire.PieceRange{First: ch.First, Count: ch.Count}
	}
	r.a.obs.dataSending(q, k, data)
	sending := time.Now()
	err = r.send(q.peer, data)
	c.phase = time.Now()
	q.stages.Data += c.phase.Sub(sending)
	r.a.obs.dataSent(q, k, data, err)
	q.plan.RecycleScatter(k, &r.runPool) // encoded: nothing reads the runs any more
	if err != nil {
		r.fail(q, fmt.Errorf("pipeline: send DATA for chunk %d: %w", k, err))
		r.settle(q)
		return
	}
	c.st = cDataSent
	q.lastProgress = r.clock.Now()
	r.a.stats.bounceBytes.Add(ch.Payload)
}

func (r *reactor) onAck(peer string, m *wire.Ack) {
	q, ok := r.sendReqOf(peer, m.Request)
	if !ok || q.err != nil {
		return
	}
	k := int(m.Chunk)
	if q.peer != peer || k >= len(q.ch) || q.ch[k].st != cDataSent || q.ch[k].credit.Region != m.Region {
		r.a.stats.badMessages.Add(1)
		r.a.obs.reject(r, peer, rejectUnexpected)
		r.log.Warn("unexpected ACK dropped", "peer", peer, "request", m.Request, "chunk", m.Chunk)
		return
	}
	q.ch[k].st = cAcked
	if q.ch[k].offered {
		r.endOffer(&q.ch[k]) // read and scattered: the staging is free again
	}
	// The receiver's scatter time (capped: its clock and word are its
	// own) is the Scatter stage; the rest of DATA→ACK is the trip.
	toAck := time.Since(q.ch[k].phase)
	sc := time.Duration(min(m.ScatterNS, uint64(max(toAck, 0))))
	q.stages.Scatter += sc
	q.stages.AckWait += toAck - sc
	r.a.obs.acked(q, k)
	q.acked++
	q.live--
	q.lastProgress = r.clock.Now()
	if q.acked == len(q.ch) {
		r.parked.remove(q)
		q.published = true
		q.b.setStages(q.stages)
		r.publish(q.b, nil, true)
		r.dropReq(q)
		return
	}
	r.advance(q)
}

func (r *reactor) onNack(peer string, m *wire.Nack) {
	r.a.obs.nack("received", m.Code)
	q, ok := r.sendReqOf(peer, m.Request)
	if !ok || q.peer != peer {
		return
	}
	r.fail(q, fmt.Errorf("pipeline: peer %q refused request %d chunk %d (code %d): %s: %w", peer, m.Request, m.Chunk, m.Code, m.Reason, ErrRefused))
}

// peerLost fails every other request to peer: the engine reported the peer
// gone, so none of them can be acknowledged any more. They fail now rather
// than at their timeout.
func (r *reactor) peerLost(peer string, cause error) {
	for _, q := range r.reqs {
		if q.peer == peer && q.err == nil {
			r.fail(q, fmt.Errorf("pipeline: request %d: %w", q.id, cause))
		}
	}
}

// fail moves a request to failing. Staged-but-idle regions are released at
// once; outstanding ops are polled to completion by the normal pollers, and
// settle finishes the request when they are done.
func (r *reactor) fail(q *sendReq, err error) {
	if q.err != nil {
		return
	}
	q.err, q.failedAt = q.pi.lostErr(err), r.clock.Now()
	r.a.obs.reqFailed(q, q.err)
	r.log.DebugContext(q.b.obs.logContext(), "request failing", "request", q.id, "peer", q.peer, "err", q.err)
	r.parked.remove(q)
	for k := range q.ch {
		if c := &q.ch[k]; c.st == cGathered {
			r.dropStaging(c)
		} else if c.offered {
			r.endOffer(c) // no read of it is served after this
		}
	}
	r.settle(q)
}

// settle publishes a failing request once the caller's memory is provably
// untouched, sends the cancel once every write is terminal (and none ended
// without proof that it stopped: then no cancel is sent, see writeDone), and
// forgets the request once nothing of it is outstanding.
func (r *reactor) settle(q *sendReq) {
	if q.err == nil {
		return
	}
	quiet := q.gathers == 0 && !q.tainted
	if !q.published && q.gathers == 0 {
		q.published = true
		r.publish(q.b, q.err, quiet)
	} else if quiet {
		q.b.markQuiescent()
	}
	if q.writes == 0 && !q.cancelSent && !q.noCancel {
		q.cancelSent = true
		if q.pull != nil {
			// A served pull: the puller learns why, and that no write of
			// it is outstanding any more.
			r.sendPullEnd(q)
		} else {
			_ = r.send(q.peer, &wire.Want{Request: q.id, Endpoint: r.a.set.Control.LocalEndpoint(), Incarnation: r.a.inc})
		}
	}
	if q.gathers == 0 && q.writes == 0 {
		r.dropReq(q)
	}
}

// publish resolves a batch once and counts the outcome.
func (r *reactor) publish(b *Batch, err error, quiescent bool) {
	if b.Status().Terminal() { // only the reactor resolves batches
		if quiescent {
			b.markQuiescent()
		}
		return
	}
	r.a.obs.resolved(b, err, quiescent) // spans end before Wait returns
	// Counted before Wait returns too: a caller that waited reads Stats
	// with its batch in them.
	if err == nil {
		r.a.stats.succeeded.Add(1)
	} else {
		r.a.stats.failed.Add(1)
	}
	b.finish(err, quiescent)
}

func (r *reactor) checkTimeouts(now time.Time) {
	for _, q := range r.reqs {
		d, down := r.down[q.peer]
		switch {
		case q.err == nil && down && now.Sub(d.at) > lostPeerGrace && now.Sub(q.started) > lostPeerGrace:
			r.fail(q, fmt.Errorf("pipeline: request %d: %s to %q %v before it was submitted, and the peer was not heard from in the %v since: %w",
				q.id, d.why, q.peer, max(q.started.Sub(d.at), 0).Round(time.Millisecond), lostPeerGrace, transfer.ErrPeerLost))
		case q.err == nil && r.refusedFor(q, now):
			f := r.refusals[q.peer]
			r.fail(q, fmt.Errorf("pipeline: request %d to %q: %w: %w", q.id, q.peer, ErrRefused, f.err))
		case q.err == nil && now.Sub(q.lastProgress) > r.cfg.RequestTimeout:
			r.fail(q, fmt.Errorf("pipeline: request %d to %q made no progress for %v: %w", q.id, q.peer, r.cfg.RequestTimeout, transfer.ErrTimeout))
		case q.err != nil && !q.published && now.Sub(q.failedAt) > r.cfg.QuiesceTimeout:
			// The gathers did not stop in time: retired, not quiescent.
			q.published = true
			r.publish(q.b, q.err, false)
		}
	}
	for _, d := range r.direct {
		d.checkTimeout(r, now)
	}
	r.checkPullTimeouts(now)
}

// lostPeerGrace is how long a request submitted to a peer reported lost
// (and not heard from since) waits for the peer to come back (a message
// from it, or its control connection up again) before it fails as lost:
// the loss was reported once, before the request existed.
const lostPeerGrace = time.Second

// peerDown is a peer reported lost: when, and by whom.
type peerDown struct {
	at  time.Time
	why string
}

// abandon fails the batch if it is still pending and waits, at most timeout,
// for proof that nothing touches the caller's memory.
func (a *Agent) abandon(b *Batch, timeout time.Duration) (out transfer.AbandonOutcome) {
	start := time.Now()
	defer func() { a.obs.abandoned(b, timeout, start, out) }()
	a.post(func(r *reactor) {
		if q, ok := r.reqs[b.id]; ok {
			r.fail(q, fmt.Errorf("pipeline: request %d: %w", b.id, ErrAbandoned))
		}
		if d, ok := r.direct[b.id]; ok {
			d.fail(r, fmt.Errorf("pipeline: request %d: %w", b.id, ErrAbandoned))
		}
		for k, pr := range r.pulls {
			if pr.b == b {
				r.flowFailed(k, fmt.Errorf("pipeline: pull %d: %w", b.id, ErrAbandoned))
				break
			}
		}
	})
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-b.quiet:
		return transfer.Recoverable
	case <-t.C:
	case <-a.stopped:
		select {
		case <-b.quiet:
			return transfer.Recoverable
		default:
		}
	}
	if b.faulted() {
		return transfer.DeviceFault
	}
	return transfer.NotQuiescent
}
