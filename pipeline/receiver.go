package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// onWant registers a sender's flow (or cancels it) and hands out credits.
// The WANT carries the sender's control endpoint so the receiver can open
// the reverse path; a cancel is honoured even when that endpoint is bad, so
// it can still reclaim what an earlier valid WANT left behind.
func (r *reactor) onWant(peer string, w *wire.Want) {
	key := credit.FlowKey{Peer: peer, Request: w.Request}
	epErr := r.addControlPeer(peer, w.Endpoint)
	if w.IsCancel() {
		r.flowFailed(key, ErrSenderCancelled)
		r.a.obs.flowEnded(r, key, "cancelled")
		r.cancelFlow(key)
		delete(r.flowSeen, key)
		r.schedule()
		return
	}
	if epErr != nil {
		r.a.stats.rejectedWants.Add(1)
		r.a.obs.reject(r, peer, rejectBadWant)
		r.log.Warn("WANT rejected: bad sender endpoint", "peer", peer, "request", w.Request, "err", epErr)
		return
	}
	if r.shuttingDown {
		r.nack(peer, w.Request, 0, wire.NackShutdown, "receiver is shutting down")
		r.refused(key, w, "receiver is shutting down")
		return
	}
	for i, n := range w.ChunkBytes {
		if n == 0 || n > r.cfg.MaxChunk {
			r.a.stats.rejectedWants.Add(1)
			r.a.obs.reject(r, peer, rejectBadWant)
			why := fmt.Sprintf("chunk %d has %d bytes; accepted 1..%d", i, n, r.cfg.MaxChunk)
			r.nack(peer, w.Request, uint32(i), wire.NackChunkTooLarge, why)
			r.refused(key, w, why)
			return
		}
	}
	switch err := r.sched.Want(key, w.ChunkBytes); {
	case errors.Is(err, credit.ErrDuplicateWant):
		// A repeated message: the flow already has its reservation.
		r.a.stats.duplicateWants.Add(1)
		r.a.obs.reject(r, peer, rejectDuplicateWant)
		r.log.Info("duplicate WANT dropped", "peer", peer, "request", w.Request)
		return
	case errors.Is(err, credit.ErrConflictingWant):
		r.a.stats.rejectedWants.Add(1)
		r.a.obs.reject(r, peer, rejectBadWant)
		r.log.Warn("WANT rejected: it conflicts with the live flow", "peer", peer, "request", w.Request, "err", err)
		r.nack(peer, w.Request, wire.WholeRequest, wire.NackConflictingWant, err.Error())
		return
	case err != nil:
		r.a.stats.rejectedWants.Add(1)
		r.a.obs.reject(r, peer, rejectBadWant)
		r.nack(peer, w.Request, wire.WholeRequest, wire.NackMalformed, err.Error())
		r.refused(key, w, err.Error())
		return
	}
	r.flowStarted(key, w)
	r.flowSeen[key] = time.Now()
	r.a.obs.wantReceived(r, key, w)
	r.schedule()
}

// expireFlows reclaims the flows whose sender has been silent for longer
// than FlowExpiry (a crashed sender never cancels), and forgets the
// bookkeeping of flows that ended. Only a flow that holds granted regions
// waiting for its sender (not scattering) can be stale: a flow waiting for
// its first grant, or whose regions are all being scattered, waits for the
// receiver, not for its sender. The silence is counted from the flow's last
// WANT, DATA or grant, whichever came last.
func (r *reactor) expireFlows(now time.Time) {
	if r.sched == nil {
		return
	}
	expired := false
	for key, seen := range r.flowSeen {
		switch {
		case !r.sched.Active(key):
			delete(r.flowSeen, key)
			r.a.obs.flowEnded(r, key, "")
		case now.Sub(seen) > r.cfg.FlowExpiry && r.sched.IdleRegions(key) > 0:
			delete(r.flowSeen, key)
			r.flowFailed(key, fmt.Errorf("flow reclaimed: its sender was silent for %v: %w", now.Sub(seen).Round(time.Millisecond), transfer.ErrTimeout))
			r.a.obs.flowEnded(r, key, "expired")
			// The sender may only be slow: a write it still lands must not
			// reach a region granted to another flow meanwhile.
			r.quarantine(r.sched.Quarantine(key))
			r.cancelScatters(func(k credit.FlowKey) bool { return k == key })
			r.a.stats.expiredFlows.Add(1)
			r.log.Warn("flow reclaimed: its sender went silent", "peer", key.Peer, "request", key.Request, "silent_for", now.Sub(seen))
			expired = true
		}
	}
	if expired {
		r.schedule()
	}
}

// quarantine starts the quarantine of regions the scheduler just
// quarantined; releaseQuarantine frees them when it is over.
func (r *reactor) quarantine(offs []uint64) {
	if len(offs) == 0 {
		return
	}
	until := time.Now().Add(r.cfg.Quarantine)
	for _, off := range offs {
		r.quarantined = append(r.quarantined, quarantined{off: off, until: until})
	}
	r.a.stats.quarantines.Add(uint64(len(offs)))
	r.publishQuarantine()
}

// releaseQuarantine frees the regions whose quarantine is over.
func (r *reactor) releaseQuarantine(now time.Time) {
	n := 0
	for n < len(r.quarantined) && !now.Before(r.quarantined[n].until) {
		if err := r.sched.ReleaseQuarantined(r.quarantined[n].off); err != nil {
			r.log.Error("release quarantined region", "off", r.quarantined[n].off, "err", err)
		}
		n++
	}
	if n == 0 {
		return
	}
	r.quarantined = r.quarantined[:copy(r.quarantined, r.quarantined[n:])]
	r.publishQuarantine()
	r.schedule()
}

// publishQuarantine mirrors the quarantine gauges into the agent's stats.
func (r *reactor) publishQuarantine() {
	st := r.sched.Stats()
	r.a.stats.quarantinedRegions.Store(uint64(st.Quarantined))
	r.a.stats.quarantinedBytes.Store(st.QuarantinedBytes)
}

func (r *reactor) addControlPeer(peer, endpoint string) error {
	if endpoint == "" {
		if _, ok := r.ctrlPeers[peer]; ok {
			return nil
		}
		return fmt.Errorf("no endpoint for unknown peer %q: %w", peer, transfer.ErrBadEndpoint)
	}
	if r.ctrlPeers[peer] == endpoint {
		return nil
	}
	if err := r.a.set.Control.AddPeer(peer, endpoint); err != nil {
		return err
	}
	r.ctrlPeers[peer] = endpoint
	return nil
}

func (r *reactor) nack(peer string, req uint64, chunk uint32, code wire.NackCode, reason string) {
	if _, ok := r.ctrlPeers[peer]; !ok {
		return // no reverse path to tell it
	}
	r.a.obs.nack("sent", code)
	_ = r.send(peer, &wire.Nack{Request: req, Chunk: chunk, Code: code, Reason: reason})
}

// schedule hands out credits and sends them, one GRANT per flow.
func (r *reactor) schedule() {
	// Every path that frees arena bytes ends here: parked senders may fit.
	r.retryParked = true
	if r.sched == nil || r.shuttingDown {
		return
	}
	grants := r.sched.Schedule()
	if len(grants) == 0 {
		return
	}
	r.a.stats.grants.Add(uint64(len(grants)))
	type out struct {
		key     credit.FlowKey
		credits []wire.Credit
	}
	var order []*out
	byFlow := make(map[credit.FlowKey]*out, 4)
	now := time.Now()
	for _, g := range grants {
		r.a.obs.grantedChunk(r, g)
		o := byFlow[g.Flow]
		if o == nil {
			o = &out{key: g.Flow}
			byFlow[g.Flow] = o
			order = append(order, o)
			// The sender's silence counts from its latest grant: it cannot
			// answer a credit before it has it.
			r.flowSeen[g.Flow] = now
		}
		o.credits = append(o.credits, wire.Credit{
			Chunk: uint32(g.Chunk), Region: g.Offset, Addr: r.a.arenaD.Addr + g.Offset, Len: g.Len, Device: r.a.arenaD.Device,
		})
	}
	for _, o := range order {
		// A lost GRANT leaves the regions held; the sender times out and its
		// cancel reclaims them.
		for _, cs := range splitCredits(o.credits, r.a.ctrlMax) {
			_ = r.send(o.key.Peer, &wire.Grant{Request: o.key.Request, Credits: cs})
		}
	}
}

// onData validates a DATA against the flow's grant and queues the scatter.
// A DATA for a region the flow no longer holds (it raced a cancel) is
// dropped; runs outside the granted region are rejected before any copy.
func (r *reactor) onData(peer string, d *wire.Data) {
	key := credit.FlowKey{Peer: peer, Request: d.Request}
	grant, ok := r.sched.Region(d.Region)
	if !ok || grant.Orphan || grant.Flow != key {
		r.a.stats.lateData.Add(1)
		r.a.obs.reject(r, peer, rejectLateData)
		r.log.Info("late or foreign DATA dropped", "peer", peer, "request", d.Request, "region", d.Region)
		return
	}
	if _, err := plan.CheckRuns(d.Runs, grant.Len); err != nil {
		r.a.stats.badRuns.Add(1)
		r.a.obs.reject(r, peer, rejectBadRuns)
		r.log.WarnContext(spanContext(r.a.obs.extract(d.TraceParent)), "DATA rejected: scatter runs outside the grant", "peer", peer, "request", d.Request, "err", err)
		if err := r.sched.Drop(key, d.Region); err != nil {
			r.log.Error("drop rejected region", "err", err)
		}
		r.flowFailed(key, fmt.Errorf("chunk %d: %w: scatter runs outside the grant: %w", d.Chunk, ErrRefused, err))
		r.nack(peer, d.Request, d.Chunk, wire.NackBadRuns, err.Error())
		r.schedule()
		return
	}
	r.flowSeen[key] = time.Now()
	if err := r.sched.BeginScatter(key, d.Region); err != nil {
		r.a.stats.lateData.Add(1)
		r.a.obs.reject(r, peer, rejectLateData)
		r.log.Warn("DATA for a region already scattering dropped", "peer", peer, "err", err)
		return
	}
	t := &scatterTask{key: key, chunk: d.Chunk, region: r.regionDesc(d.Region, grant.Len), off: d.Region, runs: d.Runs}
	r.a.obs.scatterQueued(r, t, d)
	r.scatters++
	r.tasks[d.Region] = t
	r.jobs <- t
}

// cancelFlow reclaims flow key: its idle regions are freed, and its queued
// scatters are cancelled so that none starts any more. A scatter already
// running finishes (its region is freed then, without an ACK).
func (r *reactor) cancelFlow(key credit.FlowKey) {
	r.sched.Cancel(key)
	r.cancelScatters(func(k credit.FlowKey) bool { return k == key })
}

// cancelScatters cancels every queued scatter task of the flows match
// selects; it counts those that had not started (they never will).
func (r *reactor) cancelScatters(match func(credit.FlowKey) bool) {
	for _, t := range r.tasks {
		if match(t.key) && t.cancel() {
			r.a.stats.cancelledScatters.Add(1)
		}
	}
}

func (r *reactor) drainScatterResults() bool {
	r.resMu.Lock()
	res := r.results
	r.results = nil
	r.resMu.Unlock()
	for _, t := range res {
		r.scatters--
		delete(r.tasks, t.off)
		_, orphan, err := r.sched.EndScatter(t.off)
		if err != nil {
			r.log.Error("end scatter", "region", t.off, "err", err)
		}
		r.a.obs.scatterEnded(r, t, t.err, t.err == nil && !orphan)
		switch {
		case errors.Is(t.err, errScatterCancelled):
			// Its flow was given up before it started: nothing was copied.
		case t.err != nil:
			// No ACK: the sender must never believe these bytes landed.
			r.a.stats.scatterFailures.Add(1)
			r.log.WarnContext(spanContext(t.parent), "scatter failed; no ACK sent", "peer", t.key.Peer, "request", t.key.Request, "chunk", t.chunk, "err", t.err)
			r.flowFailed(t.key, fmt.Errorf("chunk %d: scatter failed: %w", t.chunk, t.err))
		case orphan:
			// The flow was reclaimed while scattering: nobody to ACK.
		default:
			_ = r.send(t.key.Peer, &wire.Ack{Request: t.key.Request, Chunk: t.chunk, Region: t.off})
			r.chunkLanded(t.key, t.runs)
		}
	}
	if len(res) > 0 {
		r.schedule()
	}
	return len(res) > 0
}

// splitCredits cuts credits into GRANTs that each fit a control message of
// limit bytes (0 = no limit: one GRANT).
func splitCredits(credits []wire.Credit, limit int) [][]wire.Credit {
	per := len(credits)
	if limit > 0 {
		per = max(1, (limit-wire.GrantOverhead)/wire.CreditSize)
	}
	var out [][]wire.Credit
	for len(credits) > per {
		out = append(out, credits[:per:per])
		credits = credits[per:]
	}
	return append(out, credits)
}
