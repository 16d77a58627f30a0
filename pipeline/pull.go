package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// PullRequest is a decode-initiated transfer: this agent (the puller) asks
// Peer (the holder) to send it memory the holder registered for it, once
// this agent is ready for the bytes. Src names the holder's memory and Dst
// this agent's (the descriptor form), or Blocks names them by pool and
// block id: Blocks.SrcPool is a pool of the peer's descriptor, DstPool a
// pool registered here (the BlockRequest rules apply, sides swapped).
//
// A pull rides the bounce path: the puller plans the request, reserves its
// flow in its own credit scheduler and sends the grant of its first regions
// with the PULL, so the holder gathers and writes at once (no WANT → GRANT
// round trip); the holder's DATAs are scattered and ACKed here as a push's.
// What may be pulled is the holder's decision (Agent.RegisterMemoryFor,
// pools in such memory): anything else is refused with the reason.
//
// The agent reads the slices until the batch is terminal; the caller must
// not change them before.
type PullRequest struct {
	Peer   string
	Src    []transfer.Desc
	Dst    []transfer.Desc
	Blocks *BlockRequest
	// OnComplete and Tag are as in Request.
	OnComplete func(*Batch)
	Tag        []byte
}

// ErrPullCancelled is the failure cause on the holder of a pull its puller
// gave up (its timeout, Abandon, shutdown).
var ErrPullCancelled = errors.New("cancelled by the puller")

// Pull starts a pull and returns at once; see PullRequest. The batch has a
// push's retirement semantics: it is quiescent once no scatter into Dst
// runs any more. Argument errors, a peer without the bounce path (bounce
// off at either end, another wire version: ErrBounceUnavailable with the
// reason) and a pull this agent could not scatter are returned directly;
// the holder's refusal (ErrRefused, and transfer.ErrForbidden for memory
// not registered for this agent) and every other failure resolve the
// batch.
func (a *Agent) Pull(req PullRequest) (*Batch, error) {
	return a.PullContext(context.Background(), req)
}

// PullContext is Pull with a context whose span, if any, becomes the
// parent of the transfer's span.
func (a *Agent) PullContext(ctx context.Context, req PullRequest) (*Batch, error) {
	st, err := a.validatePull(req)
	if err != nil {
		return nil, err
	}
	s, p := st.s, st.p
	id := a.nextID.Add(1)
	b := newBatch(id, RouteBounce, "pull", req.OnComplete)
	b.obs.start, b.obs.why, b.obs.tag, b.start = s.start, whyRequested, s.req.Tag, s.start
	b.obs.bytes = p.Payload
	if s.pinned {
		lp := s.pool
		b.unpin = func() { a.unusePool(lp) }
	}
	b.abandon = func(timeout time.Duration) transfer.AbandonOutcome { return a.abandon(b, timeout) }
	a.obs.submitted(ctx, b, req.Peer, s.pi.endpoint, s.req.count(), "pull")
	a.obs.planned(b, p)
	a.stats.pulls.Add(1)
	a.post(func(r *reactor) { r.startPull(b, st) })
	return b, nil
}

// pullStart is a validated pull: its submission, plan and PULL (without
// its id, credits and trace context) and the PULL's encoded length then
// (0 without a control message limit).
type pullStart struct {
	s   *submission
	p   *plan.Plan
	m   *wire.Pull
	len int
}

// whyRequested is the route reason of a pull (it always rides bounce).
const whyRequested = "pull"

// validatePull checks a pull's arguments and plans it: the peer is loaded
// and bounce-capable, the destinations are this agent's (pool pinned) and
// writable by the holder, the sources lie in the holder's advertised pool.
// O(descriptors) or O(ids).
func (a *Agent) validatePull(req PullRequest) (*pullStart, error) {
	if a.closing.Load() {
		return nil, fmt.Errorf("pipeline: pull: %w", transfer.ErrClosed)
	}
	switch {
	case req.Blocks != nil && (len(req.Src) > 0 || len(req.Dst) > 0):
		return nil, fmt.Errorf("pipeline: pull: a request has descriptors (Src, Dst) or blocks (Blocks), not both")
	case len(req.Src) != len(req.Dst):
		return nil, fmt.Errorf("pipeline: pull: %d sources but %d destinations", len(req.Src), len(req.Dst))
	case len(req.Tag) > wire.MaxTag:
		return nil, fmt.Errorf("pipeline: pull: tag is %d bytes; a tag holds at most %d", len(req.Tag), wire.MaxTag)
	case req.Blocks == nil && len(req.Src) == 0:
		return nil, fmt.Errorf("pipeline: pull: nothing to pull (no descriptors, no blocks)")
	}
	for i := range req.Src {
		if req.Src[i].Len != req.Dst[i].Len {
			return nil, fmt.Errorf("pipeline: pull: descriptor %d: source length %d != destination length %d", i, req.Src[i].Len, req.Dst[i].Len)
		}
	}
	a.peersMu.RLock()
	pi, ok := a.peers[req.Peer]
	a.peersMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("pipeline: pull from %q: %w (call LoadPeer first)", req.Peer, transfer.ErrUnknownPeer)
	}
	if !pi.bounce {
		return nil, fmt.Errorf("pipeline: pull from %q: %w: a pull rides the bounce path: %s", req.Peer, ErrBounceUnavailable, pi.reason)
	}
	s := &submission{pi: pi, start: time.Now(), a: a, want: RouteBounce}
	r := Request{Peer: req.Peer, Src: req.Src, Dst: req.Dst, Tag: bytes.Clone(req.Tag), Route: RouteBounce}
	if req.Blocks != nil {
		br, lp, err := a.resolvePullBlocks(req.Blocks, pi)
		if err != nil {
			return nil, fmt.Errorf("pipeline: pull from %q: %w", req.Peer, err)
		}
		r.Blocks, s.pool, s.pinned = br, lp, true
	} else if i, err := a.dests.allowedAll(req.Peer, req.Dst); err != nil {
		return nil, fmt.Errorf("pipeline: pull from %q: destination %d: %w", req.Peer, i, err)
	}
	s.req = r
	dst := r.Dst
	if r.Blocks != nil {
		dst = []transfer.Desc{r.Blocks.dst.Pool.Span(0)}
	}
	if err := transfer.CheckKinds(a.set.Scatterer, "the scatter stage", dst); err != nil {
		s.release()
		return nil, fmt.Errorf("pipeline: pull from %q: %w", req.Peer, err)
	}
	p, err := a.planWith(r, a.cfg.MinChunk)
	if err != nil {
		s.release()
		return nil, err
	}
	st := &pullStart{s: s, p: p, m: pullOf(p, r, a.cfg.MinChunk)}
	st.m.Endpoint, st.m.Incarnation, st.m.Read = a.set.Control.LocalEndpoint(), a.inc, a.canRead && readsInto(p)
	if a.ctrlMax > 0 && len(p.Chunks) > 0 { // a pull of nothing sends nothing
		st.len, err = wire.EncodedLen(st.m)
		switch {
		case err != nil:
			s.release()
			return nil, fmt.Errorf("pipeline: pull from %q: %w", req.Peer, err)
		case st.len+traceAllowance > a.ctrlMax:
			s.release()
			return nil, fmt.Errorf("pipeline: pull from %q: %w: a PULL of %d chunks exceeds the %s control channel's %d-byte messages",
				req.Peer, ErrBounceUnavailable, len(p.Chunks), a.set.Control.Kind(), a.ctrlMax)
		}
	}
	return st, nil
}

// resolvePullBlocks is resolveBlocks for a pull: the source pool is the
// peer's, the destination pool is local (pinned) and must be writable by
// the peer.
func (a *Agent) resolvePullBlocks(br *BlockRequest, pi *peerInfo) (*BlockRequest, *localPool, error) {
	if len(br.SrcIDs) != len(br.DstIDs) {
		return nil, nil, fmt.Errorf("%d source block ids but %d destination ids", len(br.SrcIDs), len(br.DstIDs))
	}
	sp, ok := pi.pools[br.SrcPool]
	if !ok {
		return nil, nil, fmt.Errorf("peer %q advertises no pool %q (reload its descriptor after it registered the pool): %w", pi.name, br.SrcPool, transfer.ErrNotRegistered)
	}
	lp, ok := a.usePool(br.DstPool)
	if !ok {
		return nil, nil, fmt.Errorf("no local pool %q (RegisterPool first): %w", br.DstPool, transfer.ErrNotRegistered)
	}
	out := *br
	out.src = transfer.Blocks{Pool: sp, IDs: br.SrcIDs}
	out.dst = transfer.Blocks{Pool: lp.pool, IDs: br.DstIDs}
	err := pullLayouts(pi.layouts[br.SrcPool], lp.layout, br)
	switch dp := lp.pool; {
	case err != nil: // the layouts' reason first: it explains the geometry
	case sp.BlockLen != dp.BlockLen:
		err = fmt.Errorf("source pool %q has blocks of %d bytes, destination pool %q of %d: %w", br.SrcPool, sp.BlockLen, br.DstPool, dp.BlockLen, transfer.ErrUnsupported)
	case len(sp.Regions) != len(dp.Regions):
		err = fmt.Errorf("source pool %q has %d regions, destination pool %q %d: %w", br.SrcPool, len(sp.Regions), br.DstPool, len(dp.Regions), transfer.ErrUnsupported)
	case !lp.writable(pi.name):
		err = fmt.Errorf("destination pool %q lies in memory %q may not write: %w", br.DstPool, pi.name, transfer.ErrForbidden)
	default:
		if err = out.src.CheckIDs(false); err != nil {
			err = fmt.Errorf("source pool %q: %w", br.SrcPool, err)
		} else if err = out.dst.CheckIDs(true); err != nil {
			err = fmt.Errorf("destination pool %q: %w", br.DstPool, err)
		}
	}
	if err != nil {
		a.unusePool(lp)
		return nil, nil, err
	}
	return &out, lp, nil
}

// pullLayouts refuses a block pull between pools whose KV layouts differ
// (both advertised): a pull moves blocks as they are (no conversion is
// planned for it; a push converts), so such a pull would land its bytes in
// the wrong order. Layouts that cannot be converted at all say why
// (convert.ErrIncompatible). Pools without a layout move as they are.
func pullLayouts(src, dst *transfer.Layout, br *BlockRequest) error {
	c, err := planLayouts(src, dst, br)
	switch {
	case err != nil:
		return err
	case c != nil:
		return fmt.Errorf("source pool %q (%v) and destination pool %q (%v) have different layouts, and a pull does not convert layouts (push the request to convert it): %w", br.SrcPool, *src, br.DstPool, *dst, transfer.ErrUnsupported)
	}
	return nil
}

// readsInto says whether a pull planned as p is read where both engines
// can (bounce.pull_read auto): when it lands in host memory. A pull into
// device memory is written by the holder: on the H200, device KV over tcp
// pulled by READ ran at 0.87–0.94 of push for gpt-oss-sized requests
// (36,864 × 2 KiB) where the holder's write ran at 0.97–1.01 — with the
// copy stages on the GPU, a chunk's extra trip (STAGED, then the READ)
// is no longer hidden behind them (docs/BENCHMARKS.md).
func readsInto(p *plan.Plan) bool {
	for _, c := range p.Chunks {
		if c.DstKind != transfer.Host {
			return false
		}
	}
	return true
}

// pullOf is the PULL of plan p for req, without its id and credits.
func pullOf(p *plan.Plan, req Request, minChunk uint64) *wire.Pull {
	m := &wire.Pull{ChunkBytes: p.ChunkBytes(), MinChunk: minChunk, Tag: req.Tag}
	if br := req.Blocks; br != nil {
		m.Blocks = &wire.PullBlocks{SrcPool: br.SrcPool, SrcIDs: br.SrcIDs}
	} else {
		// Where they land stays here (onPulledData). Empty pairs move
		// nothing and are no piece of either plan: the PULL leaves them out.
		m.Src = req.Src
		if slices.ContainsFunc(m.Src, func(d transfer.Desc) bool { return d.Len == 0 }) {
			m.Src = slices.DeleteFunc(slices.Clone(m.Src), func(d transfer.Desc) bool { return d.Len == 0 })
		}
	}
	return m
}

// pullReq is a pull on the puller, while its flow lives; the reactor owns
// it.
type pullReq struct {
	key          credit.FlowKey // the holder and PullID(b.id)
	b            *Batch
	pi           *peerInfo
	lastProgress time.Time
	// ended is set once the holder said it is done writing (PULL_END):
	// no cancel is sent and its regions are freed, not quarantined.
	ended    bool
	unproven bool
	// read: the PULL said this agent reads staged regions (Pull.Read);
	// a STAGED for a pull that did not is refused.
	read bool
	// pieces are the chunks' piece ranges, which the holder's DATAs must
	// name (checkRange); plan is a descriptor pull's plan, whose runs
	// scatter each chunk (onPulledData; nil for a block pull).
	plan   *plan.Plan
	pieces [][2]uint64
}

// startPull opens the pull's flow in the local scheduler, takes the grant
// it gets at once and sends the PULL with it.
func (r *reactor) startPull(b *Batch, st *pullStart) {
	s, p, m := st.s, st.p, st.m
	peer := s.pi.name
	switch {
	case r.shuttingDown:
		r.publish(b, fmt.Errorf("pipeline: pull: %w", transfer.ErrClosed), true)
		return
	case s.pi.forgotten.Load():
		r.publish(b, fmt.Errorf("pipeline: pull from %q: forgotten before the request started: %w", peer, transfer.ErrPeerLost), true)
		return
	case len(p.Chunks) == 0:
		r.publish(b, nil, true)
		return
	}
	key := credit.FlowKey{Peer: peer, Request: wire.PullID(b.id)}
	m.Request = b.id
	r.a.obs.inject(b.obs.ctx, &m.TraceParent)
	if err := r.sched.Want(key, m.ChunkBytes); err != nil {
		r.publish(b, fmt.Errorf("pipeline: pull from %q: %w", peer, err), true)
		return
	}
	now := r.clock.Now()
	pr := &pullReq{key: key, b: b, pi: s.pi, lastProgress: now, read: m.Read}
	f := &recvFlow{tag: s.req.Tag, chunks: len(p.Chunks), start: now, pull: pr}
	if br := s.req.Blocks; br != nil {
		// The batch holds the pool pinned until it is quiescent; the flow
		// shares that pin (endRecvFlow must not unpin it).
		f.blocks = &recvBlocks{table: br.dst}
	} else {
		pr.plan = p
	}
	pr.pieces = p.PieceRanges()
	r.rflows[key] = f
	r.pulls[key] = pr
	r.peerFlows[peer]++
	r.flowSeen[key] = now
	r.a.obs.wantReceived(r, key, &wire.Want{Request: key.Request, ChunkBytes: m.ChunkBytes, TraceParent: m.TraceParent, Tag: m.Tag})
	if c, ok := r.a.set.Engine.(transfer.Connector); ok {
		c.Connect(peer)
	}
	// The grant that travels with the request: schedule hands this flow's
	// credits to startingPull instead of sending them in a GRANT.
	r.startingPull = &startingPull{key: key}
	r.schedule()
	m.Credits = r.startingPull.credits
	r.startingPull = nil
	if r.a.ctrlMax > 0 {
		if st.len+wire.CreditSize*len(m.Credits)+traceAllowance > r.a.ctrlMax {
			// Too many credits for one message: they follow as GRANTs.
			grants := m.Credits
			m.Credits = nil
			defer r.sendGrants(key, grants)
		}
	}
	if err := r.send(peer, m); err != nil {
		pr.ended = true // never reached the holder: nothing to cancel there
		r.flowFailed(key, fmt.Errorf("send PULL to %q: %w", peer, err))
	}
}

// onPulledData takes a holder's DATA for a descriptor pull of this
// agent's: it names chunk Chunk's piece range, in the region granted for
// that chunk, and the chunk is scattered by this agent's own plan (the
// destinations it checked at Pull), so nothing the holder sends says
// where bytes land. Anything else is refused as a bad DATA.
func (r *reactor) onPulledData(peer string, key credit.FlowKey, grant credit.Region, d *wire.Data, pr *pullReq) {
	k := int(d.Chunk)
	if !r.acceptPieces(peer, key, d, pr.checkRange(grant, d)) {
		return
	}
	pr.plan.FillFrom(k, &r.runPool)
	pr.plan.RecycleGather(k, &r.runPool) // the holder's side: not needed here
	runs := pr.plan.TakeScatter(k)       // the task's now (recycleRuns)
	r.queueScatter(d, &scatterTask{key: key, chunk: d.Chunk, region: r.regionDesc(d.Region, grant.Len), off: d.Region, runs: runs, queued: time.Now()})
}

// checkRange says why d, a DATA of this pull in region grant, does not
// name what this agent's plan has for its chunk — the chunk's exact piece
// range, in the region granted for that chunk —, or "".
func (pr *pullReq) checkRange(grant credit.Region, d *wire.Data) string {
	k := int(d.Chunk)
	switch {
	case !d.IsBlocks():
		return "scatter runs for a pull (its DATA names a piece range)"
	case k >= len(pr.pieces):
		return fmt.Sprintf("chunk %d of a pull of %d chunks", k, len(pr.pieces))
	case grant.Chunk != k:
		return fmt.Sprintf("chunk %d's DATA in the region granted for chunk %d", k, grant.Chunk)
	case d.Pieces.First != pr.pieces[k][0] || d.Pieces.Count != pr.pieces[k][1]:
		return fmt.Sprintf("pieces [%d, +%d) where chunk %d has [%d, +%d)", d.Pieces.First, d.Pieces.Count, k, pr.pieces[k][0], pr.pieces[k][1])
	}
	return ""
}

// startingPull collects the first credits of a pull being started.
type startingPull struct {
	key     credit.FlowKey
	credits []wire.Credit
}

// sendGrants sends credits to a flow's sender in GRANTs that fit the
// control channel.
func (r *reactor) sendGrants(key credit.FlowKey, credits []wire.Credit) {
	if len(credits) == 0 {
		return
	}
	for _, cs := range splitCredits(credits, r.a.ctrlMax) {
		_ = r.send(key.Peer, &wire.Grant{Request: key.Request, Credits: cs})
	}
}

// pullFailed ends a failed pull on the puller (flowFailed calls it, with
// the flow's record already gone): unless the holder said it is done, it
// is told to stop (a cancel) and the regions it holds are quarantined, as
// it may still write them; its queued scatters never start, and the batch
// is quiescent once no scatter of the flow runs.
func (r *reactor) pullFailed(pr *pullReq, err error) {
	key := pr.key
	delete(r.pulls, key)
	if r.a.guard != nil {
		r.a.guard.revokeMatching(func(k credit.FlowKey) bool { return k == key })
	}
	if r.sched != nil {
		if !pr.ended && !pr.pi.forgotten.Load() {
			_ = r.send(key.Peer, &wire.Pull{Request: key.Request &^ wire.PullBit, Endpoint: r.a.set.Control.LocalEndpoint(), Incarnation: r.a.inc})
		}
		if pr.ended && !pr.unproven {
			r.sched.Cancel(key)
		} else {
			r.quarantine(r.sched.Quarantine(key))
		}
	}
	r.cancelScatters(func(k credit.FlowKey) bool { return k == key })
	r.a.obs.flowEnded(r, key, "failed")
	r.endFlow(key)
	quiet := !r.scattering(key)
	if !quiet {
		r.pullQuiet[key] = pr.b
	}
	r.publish(pr.b, pr.pi.lostErr(err), quiet)
	r.schedule()
}

// scattering reports whether a scatter of flow key is queued or running.
func (r *reactor) scattering(key credit.FlowKey) bool {
	for _, t := range r.tasks {
		// A chunk still being read touches only its arena region, not
		// the batch's memory: its scatter, cancelled, never starts.
		if t.key == key && !t.reading {
			return true
		}
	}
	return false
}

// pullScatterEnded marks a failed pull's batch quiescent once its last
// scatter was reported.
func (r *reactor) pullScatterEnded(key credit.FlowKey) {
	if b, ok := r.pullQuiet[key]; ok && !r.scattering(key) {
		delete(r.pullQuiet, key)
		b.markQuiescent()
	}
}

// pullLanded resolves a pull whose every chunk was scattered.
func (r *reactor) pullLanded(pr *pullReq) {
	delete(r.pulls, pr.key)
	r.endFlow(pr.key)
	r.publish(pr.b, nil, true)
}

// onPullEnd handles the holder's end of a pull: it refused it or gave it
// up, and writes no more into its regions (unless Unproven).
func (r *reactor) onPullEnd(peer string, m *wire.PullEnd) {
	key := credit.FlowKey{Peer: peer, Request: wire.PullID(m.Request)}
	pr, ok := r.pulls[key]
	if !ok {
		return // ended here already
	}
	pr.ended, pr.unproven = true, m.Unproven
	r.a.obs.nack("received", m.Code)
	err := fmt.Errorf("pipeline: peer %q refused pull %d (%s): %s: %w", peer, m.Request, m.Code, m.Reason, ErrRefused)
	if m.Code == wire.NackForbidden {
		err = fmt.Errorf("%w: %w", err, transfer.ErrForbidden)
	}
	if pr.pi.forgotten.Load() {
		// ForgetPeer is under way here: the holder's end (it saw the
		// engine's connections go) raced it, and the pull is lost.
		err = fmt.Errorf("%w: peer %q was forgotten: %w", transfer.ErrPeerLost, peer, err)
	}
	r.flowFailed(key, err)
}

// checkPullTimeouts fails the pulls that made no progress (no DATA) for
// RequestTimeout: a holder that never answers (it died before it heard
// the PULL, a control message was lost) cannot hang the puller.
func (r *reactor) checkPullTimeouts(now time.Time) {
	for key, pr := range r.pulls {
		if now.Sub(pr.lastProgress) > r.cfg.RequestTimeout {
			r.flowFailed(key, fmt.Errorf("pull %d from %q made no progress for %v: %w", pr.b.id, key.Peer, r.cfg.RequestTimeout, transfer.ErrTimeout))
		}
	}
}

// ---- the holder ----

// servedKey names a pull this agent serves: the puller and its PullID.
type servedKey struct {
	peer string
	id   uint64
}

// servedPull is what a sendReq serving a pull carries.
type servedPull struct {
	wire uint64 // PullID of the puller's request: the id its messages carry
	tag  []byte
	// read: the puller reads each chunk where it is staged here (STAGED)
	// instead of this agent writing it (pullread.go).
	read bool
}

// wireID is the id a request's messages carry: its own, or the puller's
// PullID for a pull it serves.
func (q *sendReq) wireID() uint64 {
	if q.pull != nil {
		return q.pull.wire
	}
	return q.id
}

// sendReqOf returns the request a GRANT, ACK or NACK from peer names by
// id: a served pull when id is a PullID, else a request of this agent's.
func (r *reactor) sendReqOf(peer string, id uint64) (*sendReq, bool) {
	if wire.IsPullID(id) {
		lid, ok := r.served[servedKey{peer, id}]
		if !ok {
			return nil, false
		}
		q, ok := r.reqs[lid]
		return q, ok
	}
	q, ok := r.reqs[id]
	return q, ok
}

// dropReq forgets a request nothing of which is outstanding any more; a
// served pull is reported (Received with Pull set).
func (r *reactor) dropReq(q *sendReq) {
	delete(r.reqs, q.id)
	if q.pull == nil {
		return
	}
	sk := servedKey{q.peer, q.pull.wire}
	if _, ok := r.served[sk]; !ok {
		return
	}
	delete(r.served, sk)
	if r.servedPerPeer[q.peer]--; r.servedPerPeer[q.peer] <= 0 {
		delete(r.servedPerPeer, q.peer)
	}
	ev := Received{Peer: q.peer, Request: q.pull.wire &^ wire.PullBit, Tag: q.pull.tag, Route: RouteBounce, Pull: true, Quiescent: !q.tainted}
	for k := range q.ch {
		if q.ch[k].st == cAcked {
			ev.Bytes += q.plan.Chunks[k].Payload
		}
	}
	if q.err != nil {
		ev.Err = fmt.Errorf("pipeline: pull %d by %q: %w", ev.Request, q.peer, q.err)
	} else {
		r.a.stats.pullsServed.Add(1)
	}
	r.received(ev)
}

// onPull serves (or cancels) a peer's pull: the puller's per-peer limits,
// then what it may pull — only memory registered for it or for every peer
// (RegisterMemoryFor; a pool lying in such memory), never the arena —, its
// plan checked against the puller's, then a request of this agent's that
// holds the puller's credits already and starts its gathers at once.
func (r *reactor) onPull(peer, from string, m *wire.Pull) {
	now := r.clock.Now()
	sk := servedKey{peer, wire.PullID(m.Request)}
	if m.IsCancel() {
		if q, ok := r.sendReqOf(peer, sk.id); ok {
			q.noCancel = true       // the puller gave up: it needs no end
			err := ErrPullCancelled // dropReq names the pull
			if q.pi.forgotten.Load() {
				// ForgetPeer is under way here: the puller's cancel (it
				// saw the engine's connections go) raced it.
				err = fmt.Errorf("%w: peer %q was forgotten: %w", transfer.ErrPeerLost, peer, err)
			}
			r.fail(q, err)
		}
		return
	}
	b := r.wantRate[peer]
	if b == nil {
		b = &security.Bucket{Rate: r.cfg.WantRate, Burst: float64(r.cfg.WantBurst)}
		r.wantRate[peer] = b
	}
	if !b.Allow(now) {
		n := r.a.stats.rateLimited.Add(1)
		if n&(n-1) == 0 {
			r.log.Warn("PULL dropped: peer over its WANT rate", "peer", peer, "rate", r.cfg.WantRate, "rate_limited_total", n)
		}
		return
	}
	if _, dup := r.served[sk]; dup {
		r.a.stats.duplicateWants.Add(1)
		return
	}
	q, code, why := r.servePull(peer, m, sk)
	if why != "" {
		r.a.stats.refusedPulls.Add(1)
		r.a.obs.reject(r, peer, rejectPull)
		r.a.obs.nack("sent", code)
		r.log.Warn("PULL refused", "peer", peer, "request", m.Request, "code", code, "why", why)
		if r.reversePath(peer, from, m.Endpoint, now) == nil {
			_ = r.send(peer, &wire.PullEnd{Request: m.Request, Code: code, Reason: why})
		}
		return
	}
	r.advance(q)
}

// servePull checks a PULL and makes its request, or says why not.
func (r *reactor) servePull(peer string, m *wire.Pull, sk servedKey) (*sendReq, wire.NackCode, string) {
	a := r.a
	if r.shuttingDown {
		return nil, wire.NackShutdown, "holder is shutting down"
	}
	a.peersMu.RLock()
	pi, ok := a.peers[peer]
	a.peersMu.RUnlock()
	if !ok || !pi.bounce {
		return nil, wire.NackForbidden, fmt.Sprintf("the holder has not loaded %q on the bounce path (load its descriptor there first)", peer)
	}
	if r.servedPerPeer[peer] >= r.cfg.MaxFlowsPerPeer {
		r.a.stats.flowLimited.Add(1)
		return nil, wire.NackMalformed, fmt.Sprintf("peer has %d open pulls, the limit", r.cfg.MaxFlowsPerPeer)
	}
	for i, n := range m.ChunkBytes {
		if n > r.cfg.MaxChunk {
			return nil, wire.NackChunkTooLarge, fmt.Sprintf("chunk %d has %d bytes; accepted 1..%d", i, n, r.cfg.MaxChunk)
		}
	}
	req := Request{Peer: peer, Src: m.Src, Route: RouteBounce} // the puller keeps the destinations
	s := &submission{pi: pi, a: a, start: time.Now(), want: RouteBounce}
	if bl := m.Blocks; bl != nil {
		lp, ok := a.usePool(bl.SrcPool)
		if !ok {
			return nil, wire.NackBadBlocks, fmt.Sprintf("no pool %q here", bl.SrcPool)
		}
		req.Blocks, s.pool, s.pinned = pulledBlocks(lp, bl), lp, true
		if !lp.writable(peer) {
			s.release()
			return nil, wire.NackForbidden, fmt.Sprintf("pool %q is not registered for %q (RegisterMemoryFor)", bl.SrcPool, peer)
		}
		if err := req.Blocks.src.CheckIDs(false); err != nil {
			s.release()
			return nil, wire.NackBadBlocks, fmt.Sprintf("pool %q: %v", bl.SrcPool, err)
		}
	} else if i, err := a.dests.readableAll(peer, m.Src); err != nil {
		return nil, wire.NackForbidden, fmt.Sprintf("source %d: %v", i, err)
	}
	s.req = req
	if err := a.checkKinds(RouteBounce, s); err != nil {
		s.release()
		return nil, wire.NackForbidden, err.Error()
	}
	var p *plan.Plan
	var err error
	if req.Blocks != nil {
		p, err = a.planWith(req, m.MinChunk)
		if err == nil && !slices.EqualFunc(p.Chunks, m.ChunkBytes, func(c plan.Chunk, n uint64) bool { return c.Bytes == n }) {
			err = fmt.Errorf("the holder plans %d chunks where the puller planned %d (set bounce.max_chunk alike at both ends)", len(p.Chunks), len(m.ChunkBytes))
		}
	} else if p, err = plan.LayoutInto(m.Src, m.ChunkBytes, a.planOptions(0)); err != nil {
		// The sources packed into the puller's chunks, as it packed them.
		err = fmt.Errorf("the sources do not fill the puller's %d chunks: %w", len(m.ChunkBytes), err)
	}
	if err != nil {
		s.release()
		return nil, wire.NackMalformed, err.Error()
	}
	for _, c := range m.Credits {
		if int(c.Chunk) >= len(p.Chunks) || c.Len < p.Chunks[c.Chunk].Bytes {
			s.release()
			return nil, wire.NackMalformed, fmt.Sprintf("credit for chunk %d of %d bytes does not fit the plan", c.Chunk, c.Len)
		}
	}
	// The request, as if submitted here, already granted.
	id := a.nextID.Add(1)
	b := newBatch(id, RouteBounce, "pull by "+peer, nil)
	b.obs.start, b.obs.why, b.obs.tag, b.obs.bytes, b.start = s.start, whyRequested, m.Tag, p.Payload, s.start
	if s.pinned {
		lp := s.pool
		b.unpin = func() { a.unusePool(lp) }
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), a.obs.extract(m.TraceParent))
	a.obs.submitted(ctx, b, peer, pi.endpoint, req.count(), "pull by "+peer)
	a.obs.planned(b, p)
	now := r.clock.Now()
	q := &sendReq{id: id, peer: peer, pi: pi, b: b, plan: p, ch: make([]sendChunk, len(p.Chunks)), started: now, lastProgress: now,
		wantAt: time.Now(), granted: true, pull: &servedPull{wire: sk.id, tag: bytes.Clone(m.Tag), read: m.Read && a.canRead}}
	for _, c := range m.Credits {
		cr := c
		q.ch[c.Chunk].credit = &cr
		a.obs.granted(q, int(c.Chunk), &cr)
	}
	r.reqs[id] = q
	r.served[sk] = id
	r.servedPerPeer[peer]++
	if c, ok := a.set.Engine.(transfer.Connector); ok {
		c.Connect(peer)
	}
	return q, 0, ""
}

// pulledBlocks is the holder's block request of a pull: its pool's ids
// SrcIDs, planned against a destination of the same geometry (the
// puller's own pool, which it checked against this one; the holder needs
// only the pieces' order and length, DATA naming piece ranges).
func pulledBlocks(lp *localPool, bl *wire.PullBlocks) *BlockRequest {
	t := transfer.Blocks{Pool: lp.pool, IDs: bl.SrcIDs}
	return &BlockRequest{SrcPool: bl.SrcPool, SrcIDs: bl.SrcIDs, src: t, dst: t}
}

// planOptions are a pull's plan options with the MinChunk ramp given (a
// block pull is planned with the puller's at both ends). No scatter limit:
// a pull's DATAs carry piece ranges, not runs.
func (a *Agent) planOptions(minChunk uint64) plan.Options {
	return plan.Options{MaxChunk: a.cfg.MaxChunk, MinChunk: minChunk, NoMerge: a.cfg.DisableMerging}
}

// planWith plans a pull here (planOptions).
func (a *Agent) planWith(req Request, minChunk uint64) (*plan.Plan, error) {
	opt := a.planOptions(minChunk)
	var p *plan.Plan
	var err error
	if br := req.Blocks; br != nil {
		p, err = plan.LayoutBlocks(br.src, br.dst, opt)
	} else {
		p, err = plan.Layout(req.Src, req.Dst, opt)
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline: plan pull with %q: %w", req.Peer, err)
	}
	return p, nil
}

// sendPullEnd tells the puller a served pull ended here: no write of it is
// outstanding any more (unproven: one ended without proof it stopped).
func (r *reactor) sendPullEnd(q *sendReq) {
	code := wire.NackGaveUp
	if errors.Is(q.err, transfer.ErrClosed) {
		code = wire.NackShutdown
	}
	reason := "holder gave the pull up: " + q.err.Error()
	if len(reason) > 1<<10 { // a PULL_END must fit any control channel
		reason = strings.ToValidUTF8(reason[:1<<10], "")
	}
	_ = r.send(q.peer, &wire.PullEnd{Request: q.pull.wire &^ wire.PullBit, Code: code, Reason: reason, Unproven: q.unproven})
}
