package pipeline

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// onWant registers a sender's flow (or cancels it) and hands out credits.
// The WANT carries the sender's control endpoint so the receiver can open
// the reverse path; a cancel is honoured even when that endpoint is bad, so
// it can still reclaim what an earlier valid WANT left behind.
//
// Per-peer limits apply first: WANTs over the peer's rate are dropped, and a
// WANT that would open more than MaxFlowsPerPeer flows is refused. When the
// peer's descriptor was loaded, the reverse path uses the endpoint it names
// and the WANT's is ignored (a differing one is counted): the receiver never
// dials an address only because a message named it. A peer whose
// descriptor was not loaded (admitted by allowed_peers alone, or any peer
// with security off) is reached at its WANT endpoint only when that names
// the host the WANT came from (when the channel knows it, from), so a
// message cannot make the receiver dial a third host; with authentication
// the channel also pins the peer's key there (zmq CURVE).
func (r *reactor) onWant(peer, from string, w *wire.Want) {
	key := credit.FlowKey{Peer: peer, Request: w.Request}
	if wire.IsPullID(w.Request) {
		// Ids with the pull bit name pulls; a holder ends one with a
		// PULL_END, never a WANT.
		r.a.stats.badMessages.Add(1)
		r.a.obs.reject(r, peer, rejectUnexpected)
		return
	}
	now := r.clock.Now()
	b := r.wantRate[peer]
	if b == nil {
		b = &security.Bucket{Rate: r.cfg.WantRate, Burst: float64(r.cfg.WantBurst)}
		r.wantRate[peer] = b
	}
	if !b.Allow(now) {
		n := r.a.stats.rateLimited.Add(1)
		if n&(n-1) == 0 {
			r.log.Warn("WANT dropped: peer over its WANT rate", "peer", peer, "rate", r.cfg.WantRate, "rate_limited_total", n)
		}
		return
	}
	if f, ok := r.fencedUntil[peer]; ok {
		// Loading the peer again lifted the engine's fence: it is trusted.
		_, loaded := r.descEndpoint(peer)
		switch {
		case !now.Before(f.until) || loaded:
			delete(r.fencedUntil, peer)
		case f.refuses(w.Incarnation):
			r.log.Debug("WANT dropped: its sender was lost and is fenced", "peer", peer, "until", f.until, "incarnation", w.Incarnation)
			return
		}
		// Another incarnation: the sender restarted with its key. Its old
		// incarnation stays fenced here and in the engine.
	}
	if w.Incarnation != 0 {
		r.wantInc[peer] = w.Incarnation
	}
	epErr := r.reversePath(peer, from, w.Endpoint, now)
	if w.IsCancel() {
		r.flowFailed(key, ErrSenderCancelled)
		r.a.obs.flowEnded(r, key, "cancelled")
		r.cancelFlow(key)
		r.endFlow(key)
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
	_, known := r.flowSeen[key]
	if !known && r.peerFlows[peer] >= r.cfg.MaxFlowsPerPeer && now.Sub(r.lastPurge[peer]) > time.Millisecond {
		// Flows that ended are swept lazily, at most once a millisecond
		// per peer, so a peer hammering its limit costs no table walks.
		r.lastPurge[peer] = now
		r.purgeEndedFlows(peer)
	}
	if !known && r.peerFlows[peer] >= r.cfg.MaxFlowsPerPeer {
		r.a.stats.flowLimited.Add(1)
		r.a.stats.rejectedWants.Add(1)
		r.nack(peer, w.Request, wire.WholeRequest, wire.NackMalformed, fmt.Sprintf("peer has %d open flows, the limit", r.cfg.MaxFlowsPerPeer))
		return
	}
	// The block table's O(ids) check runs only for a WANT within the
	// peer's flow limit that starts a flow: one naming a live flow is a
	// repeat or a conflict, which sched.Want tells below (its table was
	// checked when the flow began).
	var rb *recvBlocks
	if w.Blocks != nil && !r.sched.Active(key) {
		var err error
		if rb, err = r.checkWantBlocks(peer, w.Blocks); err != nil {
			r.a.stats.rejectedWants.Add(1)
			r.a.obs.reject(r, peer, rejectBadWant)
			r.log.Warn("WANT rejected: bad block table", "peer", peer, "request", w.Request, "err", err)
			r.nack(peer, w.Request, wire.WholeRequest, wire.NackBadBlocks, err.Error())
			r.refused(key, w, err.Error())
			return
		}
	}
	accepted := false
	defer func() {
		if rb != nil && !accepted {
			r.a.unusePool(rb.pool)
		}
	}()
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
	r.flowStarted(key, w, rb)
	accepted = true
	if !known {
		r.peerFlows[peer]++
	}
	r.flowSeen[key] = now
	r.a.obs.wantReceived(r, key, w)
	r.schedule()
}

// endFlow forgets a flow's bookkeeping (its last-seen time and its place in
// the peer's flow count).
func (r *reactor) endFlow(key credit.FlowKey) {
	if _, ok := r.flowSeen[key]; !ok {
		return
	}
	delete(r.flowSeen, key)
	if r.peerFlows[key.Peer]--; r.peerFlows[key.Peer] <= 0 {
		delete(r.peerFlows, key.Peer)
	}
}

// purgeEndedFlows forgets the bookkeeping of peer's flows that ended.
func (r *reactor) purgeEndedFlows(peer string) {
	for key := range r.flowSeen {
		if key.Peer == peer && !r.sched.Active(key) {
			r.endFlow(key)
		}
	}
}

// descEndpoint returns the control endpoint of peer's loaded descriptor.
func (r *reactor) descEndpoint(peer string) (string, bool) {
	r.a.peersMu.RLock()
	defer r.a.peersMu.RUnlock()
	pi, ok := r.a.peers[peer]
	if !ok || pi.endpoint == "" {
		return "", false
	}
	return pi.endpoint, true
}

// expireFlows reclaims the flows whose sender has been silent for longer
// than FlowExpiry (a crashed sender never cancels), and forgets the
// bookkeeping of flows that ended. Only a flow that holds granted regions
// waiting for its sender (not scattering) can be stale: a flow waiting for
// its first grant, or whose regions are all being scattered, waits for the
// receiver, not for its sender. The silence is counted from the flow's last
// WANT, DATA or grant, whichever came last. A sender that left a grant
// unused that long is gone for its waiting flows too: those it queued as
// long ago are reclaimed with it, rather than granted in turn to be
// reclaimed one FlowExpiry later each.
func (r *reactor) expireFlows(now time.Time) {
	if r.sched == nil {
		return
	}
	var unreached, silent []string
	for key, seen := range r.flowSeen {
		switch {
		case !r.sched.Active(key):
			r.endFlow(key)
			r.a.obs.flowEnded(r, key, "")
		case now.Sub(seen) > r.cfg.UnreachedGrace && now.Sub(seen) <= r.cfg.FlowExpiry && r.sched.IdleRegions(key) > 0 &&
			!slices.Contains(unreached, key.Peer) && r.pathDownFor(key.Peer) > r.cfg.UnreachedGrace:
			unreached = append(unreached, key.Peer)
		case now.Sub(seen) > r.cfg.FlowExpiry && r.sched.IdleRegions(key) > 0:
			r.expireFlow(key, now.Sub(seen))
			if !slices.Contains(silent, key.Peer) {
				silent = append(silent, key.Peer)
			}
		}
	}
	if len(silent) > 0 { // their waiting flows queued as long ago
		for key, seen := range r.flowSeen {
			if slices.Contains(silent, key.Peer) && now.Sub(seen) > r.cfg.FlowExpiry && r.sched.Waiting(key) {
				r.expireFlow(key, now.Sub(seen))
			}
		}
	}
	for _, peer := range unreached {
		// Held as lost (quarantined, fenced where it qualifies), as if the
		// missing report had come.
		r.peerGone(peer, fmt.Sprintf("its control path never completed a handshake in the %v its flow held grants", r.cfg.UnreachedGrace))
	}
	if len(silent) > 0 {
		r.schedule()
	}
}

// expireFlow reclaims flow key, its sender silent for silence.
func (r *reactor) expireFlow(key credit.FlowKey, silence time.Duration) {
	r.endFlow(key)
	r.flowFailed(key, fmt.Errorf("flow reclaimed: its sender was silent for %v: %w", silence.Round(time.Millisecond), transfer.ErrTimeout))
	r.a.obs.flowEnded(r, key, "expired")
	// The sender may only be slow: a write it still lands must not reach a
	// region granted to another flow meanwhile.
	if r.a.guard != nil {
		r.a.guard.revokeMatching(func(k credit.FlowKey) bool { return k == key })
	}
	r.quarantine(r.sched.Quarantine(key))
	r.cancelScatters(func(k credit.FlowKey) bool { return k == key })
	r.a.stats.expiredFlows.Add(1)
	r.log.Warn("flow reclaimed: its sender went silent", "peer", key.Peer, "request", key.Request, "silent_for", silence)
}

// pathDownFor says how long the control channel's path to peer has been
// without a completed handshake; 0 when up, unknown, or when the channel
// cannot tell.
func (r *reactor) pathDownFor(peer string) time.Duration {
	pd, ok := r.a.set.Control.(pathDowner)
	if !ok {
		return 0
	}
	d, known := pd.PeerDownFor(peer)
	if !known {
		return 0
	}
	return d
}

// quarantine starts the quarantine of regions the scheduler just
// quarantined; releaseQuarantine frees them when it is over.
func (r *reactor) quarantine(offs []uint64) (until time.Time) {
	if len(offs) == 0 {
		return time.Time{}
	}
	until = r.clock.Now().Add(r.cfg.Quarantine)
	for _, off := range offs {
		r.quarantined = append(r.quarantined, quarantined{off: off, until: until})
	}
	r.a.stats.quarantines.Add(uint64(len(offs)))
	r.publishQuarantine()
	return until
}

// quarantineLocal keeps a staging region an engine may still read (its
// write ended without proof that it stopped) out of use for cfg.Quarantine.
func (r *reactor) quarantineLocal(off uint64) {
	r.staleLocal = append(r.staleLocal, quarantined{off: off, until: r.clock.Now().Add(r.cfg.Quarantine)})
}

// releaseQuarantine frees the regions whose quarantine is over.
func (r *reactor) releaseQuarantine(now time.Time) {
	if len(r.staleLocal) > 0 && !now.Before(r.staleLocal[0].until) {
		n := 0
		for n < len(r.staleLocal) && !now.Before(r.staleLocal[n].until) {
			r.releaseLocal(r.staleLocal[n].off)
			n++
		}
		r.staleLocal = r.staleLocal[:copy(r.staleLocal, r.staleLocal[n:])]
	}
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

// releaseEarly frees the regions at offs that are still in the quarantine
// that ends at until (not one that ended, or one they entered since)
// before it ends: a fence proved nothing lands in them any more.
func (r *reactor) releaseEarly(offs []uint64, until time.Time) {
	if len(offs) == 0 {
		return
	}
	set := make(map[uint64]bool, len(offs))
	for _, off := range offs {
		set[off] = true
	}
	kept := r.quarantined[:0]
	for _, q := range r.quarantined {
		if !set[q.off] || !q.until.Equal(until) {
			kept = append(kept, q)
			continue
		}
		if err := r.sched.ReleaseQuarantined(q.off); err != nil {
			r.log.Error("release quarantined region", "off", q.off, "err", err)
		}
	}
	clear(r.quarantined[len(kept):])
	r.quarantined = kept
	r.publishQuarantine()
}

// publishQuarantine mirrors the quarantine gauges into the agent's stats.
func (r *reactor) publishQuarantine() {
	st := r.sched.Stats()
	r.a.stats.quarantinedRegions.Store(uint64(st.Quarantined))
	r.a.stats.quarantinedBytes.Store(st.QuarantinedBytes)
}

// reversePath opens (or keeps) the control path back to peer for a message
// (WANT, PULL) that came from host from naming endpoint. A loaded
// descriptor's endpoint is authoritative and the message's is not dialed
// (nixlnotif endpoints are engine metadata and change as memory is
// registered, so a difference alone is no attack); otherwise the endpoint
// must be on the host the message came from, and with names not proven
// that host is what bounds the peer's paths (MaxControlPeersPerHost).
func (r *reactor) reversePath(peer, from, endpoint string, now time.Time) error {
	host := ""
	if ep, ok := r.descEndpoint(peer); ok {
		if endpoint != "" && endpoint != ep {
			r.a.stats.foreignEndpoints.Add(1)
		}
		endpoint = ep
	} else if err := endpointOnHost(endpoint, from, r.a.set.Control.LocalEndpoint()); err != nil {
		r.a.stats.foreignEndpoints.Add(1)
		return err
	} else if ip, ok, _ := endpointIP(endpoint); ok && ip != nil && !r.a.set.Peers.Enabled() {
		host = ip.String()
	}
	return r.addControlPeer(peer, endpoint, host, now)
}

// endpointOnHost checks that a WANT's endpoint (scheme://host:port) names
// the host its message came from; nil when either is unknown ("" from a
// channel that does not say, an endpoint in another form). A WANT from
// this host itself (from is the host of self, this agent's own endpoint)
// may name a loopback endpoint too.
func endpointOnHost(endpoint, from, self string) error {
	if from == "" || endpoint == "" {
		return nil
	}
	ip, ok, err := endpointIP(endpoint)
	if !ok {
		return err
	}
	src := net.ParseIP(from)
	own, _, _ := endpointIP(self)
	if ip == nil || src == nil || !ip.Equal(src) && !(ip.IsLoopback() && !src.IsLoopback() && own != nil && own.Equal(src)) {
		return fmt.Errorf("endpoint %q is not on the host the message came from (%s): a peer whose descriptor was not loaded is dialed only there (load its descriptor to reach it elsewhere): %w", endpoint, from, transfer.ErrBadEndpoint)
	}
	return nil
}

// endpointIP returns the IP of a scheme://host:port endpoint (nil when the
// host is a name); ok false when the endpoint is in another form or
// malformed (err says which).
func endpointIP(endpoint string) (net.IP, bool, error) {
	_, hostPort, ok := strings.Cut(endpoint, "://")
	if !ok {
		return nil, false, nil
	}
	host, _, err := net.SplitHostPort(hostPort)
	if err != nil {
		return nil, false, fmt.Errorf("endpoint %q: %v: %w", endpoint, err, transfer.ErrBadEndpoint)
	}
	return net.ParseIP(host), true, nil
}

// ctrlPeer is a reverse control path the receiver opened.
type ctrlPeer struct {
	endpoint string
	used     time.Time
	// host is the sending host whose share (MaxControlPeersPerHost) the
	// path takes: set for a peer whose descriptor was not loaded while
	// names are not proven (security off), "" otherwise.
	host string
}

// MaxControlPeersPerHost caps the reverse control paths of peers whose
// descriptors were not loaded on one sending host while names are not
// proven (security.mode off), as tcp.Config.MaxConnsPerPeer caps one
// peer's connections: a host claiming many names holds at most this many
// DEALERs here. With authentication, names are proven and the admitted
// set bounds them.
const MaxControlPeersPerHost = 64

// addControlPeer opens (or keeps) the reverse control path to peer. The
// table holds at most MaxControlPeers entries, and the paths of one host
// (host, when set) at most MaxControlPeersPerHost: to make room the least
// recently used one without open flows (of that host) is closed; when
// every one has open flows the WANT is refused.
func (r *reactor) addControlPeer(peer, endpoint, host string, now time.Time) error {
	cp := r.ctrlPeers[peer]
	if endpoint == "" || cp != nil && cp.endpoint == endpoint {
		if cp == nil {
			return fmt.Errorf("no endpoint for unknown peer %q: %w", peer, transfer.ErrBadEndpoint)
		}
		cp.used = now
		return nil
	}
	if host != "" && (cp == nil || cp.host != host) {
		n := 0
		for _, o := range r.ctrlPeers {
			if o.host == host {
				n++
			}
		}
		if n >= MaxControlPeersPerHost && !r.evictControlPeer(host) {
			r.a.stats.hostLimited.Add(1)
			return fmt.Errorf("host %s holds %d reverse control paths with open flows, the limit for names not proven (security.mode off): %w", host, n, transfer.ErrQueueFull)
		}
	}
	if cp == nil && len(r.ctrlPeers) >= r.cfg.MaxControlPeers && !r.evictControlPeer("") {
		return fmt.Errorf("control peer table full (%d peers with open flows): %w", r.cfg.MaxControlPeers, transfer.ErrQueueFull)
	}
	if err := r.a.set.Control.AddPeer(peer, endpoint); err != nil {
		return err
	}
	r.ctrlPeers[peer] = &ctrlPeer{endpoint: endpoint, used: now, host: host}
	return nil
}

// evictControlPeer closes the least recently used reverse path of a peer
// with no open flow and no loaded descriptor (of host, when set); false
// when there is none.
func (r *reactor) evictControlPeer(host string) bool {
	victim, oldest := "", time.Time{}
	for name, cp := range r.ctrlPeers {
		if r.peerFlows[name] > 0 || host != "" && cp.host != host {
			continue
		}
		if _, loaded := r.descEndpoint(name); loaded {
			continue
		}
		if victim == "" || cp.used.Before(oldest) {
			victim, oldest = name, cp.used
		}
	}
	if victim == "" {
		return false
	}
	delete(r.ctrlPeers, victim)
	if err := r.a.set.Control.RemovePeer(victim); err != nil && !errors.Is(err, transfer.ErrUnknownPeer) {
		r.log.Warn("evict idle control peer", "peer", victim, "err", err)
	}
	return true
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
	now := r.clock.Now()
	for _, g := range grants {
		r.a.obs.grantedChunk(r, g)
		o := byFlow[g.Flow]
		if o == nil {
			o = &out{key: g.Flow}
			byFlow[g.Flow] = o
			order = append(order, o)
			// The sender's silence counts from its latest grant: it cannot
			// answer a credit before it has it.
			if _, seen := r.flowSeen[g.Flow]; seen {
				r.flowSeen[g.Flow] = now
			}
		}
		if wg := r.a.guard; wg != nil {
			wg.grant(g.Flow, g.Offset, g.Len)
		}
		o.credits = append(o.credits, wire.Credit{
			Chunk: uint32(g.Chunk), Region: g.Offset, Addr: r.a.arenaD.Addr + g.Offset, Len: g.Len, Device: r.a.arenaD.Device, Kind: r.a.arenaD.Kind,
		})
	}
	for _, o := range order {
		if sp := r.startingPull; sp != nil && sp.key == o.key {
			sp.credits = o.credits // they travel with the PULL
			continue
		}
		// A lost GRANT leaves the regions held; the sender times out and its
		// cancel reclaims them.
		for _, cs := range splitCredits(o.credits, r.a.ctrlMax) {
			_ = r.send(o.key.Peer, &wire.Grant{Request: o.key.Request, Credits: cs})
		}
	}
}

// onData validates a DATA against the flow's grant and queues the scatter.
// A DATA for a region the flow no longer holds (it raced a cancel) is
// dropped; runs reading outside the granted region, copying more than it
// holds or writing memory the peer may not write (checkData) are refused
// with a NACK before any copy.
func (r *reactor) onData(peer string, d *wire.Data) {
	key := credit.FlowKey{Peer: peer, Request: d.Request}
	grant, ok := r.sched.Region(d.Region)
	if !ok || grant.Orphan || grant.Flow != key {
		r.a.stats.lateData.Add(1)
		r.a.obs.reject(r, peer, rejectLateData)
		r.log.Info("late or foreign DATA dropped", "peer", peer, "request", d.Request, "region", d.Region)
		return
	}
	if pr := r.pulls[key]; pr != nil {
		pr.lastProgress = r.clock.Now()
		if pr.plan != nil {
			r.onPulledData(peer, key, grant, d, pr)
			return
		}
	}
	if f := r.rflows[key]; d.IsBlocks() || f != nil && f.blocks != nil {
		r.onBlockData(peer, key, grant, d, f)
		return
	}
	if err := r.checkData(peer, d.Runs, grant.Len); err != nil {
		r.a.stats.badRuns.Add(1)
		r.a.obs.reject(r, peer, rejectBadRuns)
		r.log.WarnContext(spanContext(r.a.obs.extract(d.TraceParent)), "DATA rejected: bad scatter runs", "peer", peer, "request", d.Request, "err", err)
		r.refuseData(peer, key, d, fmt.Errorf("chunk %d: %w: bad scatter runs: %w", d.Chunk, ErrRefused, err), nackCodeOf(err), "DATA refused: "+err.Error())
		return
	}
	if !r.beginScatter(peer, key, d) {
		return
	}
	r.queueScatter(d, &scatterTask{key: key, chunk: d.Chunk, region: r.regionDesc(d.Region, grant.Len), off: d.Region, runs: d.Runs, queued: time.Now()})
}

// refuseData ends a DATA the receiver refused (the caller counted and
// logged why): its region is revoked and dropped, its flow failed with
// flowErr, and the sender told by a NACK.
func (r *reactor) refuseData(peer string, key credit.FlowKey, d *wire.Data, flowErr error, code wire.NackCode, reason string) {
	r.revoke(d.Region)
	if err := r.sched.Drop(key, d.Region); err != nil {
		r.log.Error("drop rejected region", "err", err)
	}
	r.flowFailed(key, flowErr)
	r.nack(peer, d.Request, d.Chunk, code, reason)
	r.schedule()
}

// beginScatter marks the region of an accepted DATA as scattering (the
// sender wrote it: no more writes into it) and refreshes its flow's
// last-seen time; false when the region already scatters (the DATA is
// dropped, counted as late).
func (r *reactor) beginScatter(peer string, key credit.FlowKey, d *wire.Data) bool {
	if _, ok := r.flowSeen[key]; ok {
		r.flowSeen[key] = r.clock.Now()
	}
	r.revoke(d.Region)
	if err := r.sched.BeginScatter(key, d.Region); err != nil {
		r.a.stats.lateData.Add(1)
		r.a.obs.reject(r, peer, rejectLateData)
		r.log.Warn("DATA for a region already scattering dropped", "peer", peer, "err", err)
		return false
	}
	return true
}

// queueScatter hands t, the scatter of d's region, to the workers.
func (r *reactor) queueScatter(d *wire.Data, t *scatterTask) {
	r.a.obs.scatterQueued(r, t, d)
	r.scatters++
	r.tasks[d.Region] = t
	if src := r.offered; src != nil {
		r.offered = nil
		r.startRead(t, *src) // the scatter starts once the chunk is read
		return
	}
	r.jobs <- t
}

// cancelFlow reclaims flow key: its idle regions are freed, and its queued
// scatters are cancelled so that none starts any more. A scatter already
// running finishes (its region is freed then, without an ACK).
func (r *reactor) cancelFlow(key credit.FlowKey) {
	if r.a.guard != nil {
		r.a.guard.revokeMatching(func(k credit.FlowKey) bool { return k == key })
	}
	r.sched.Cancel(key)
	r.cancelScatters(func(k credit.FlowKey) bool { return k == key })
}

// revoke ends the writability of the region at off (write guard).
func (r *reactor) revoke(off uint64) {
	if r.a.guard != nil {
		r.a.guard.revoke(off)
	}
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
		if len(r.pullQuiet) > 0 {
			r.pullScatterEnded(t.key)
		}
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
			// A NACK with the cause instead, so the sender fails now with
			// it rather than at its request timeout (a crashed scatter
			// plugin, a scatter into memory that is gone).
			r.a.stats.scatterFailures.Add(1)
			r.log.WarnContext(spanContext(t.parent), "scatter failed; no ACK sent", "peer", t.key.Peer, "request", t.key.Request, "chunk", t.chunk, "err", t.err)
			why := fmt.Errorf("chunk %d: scatter failed: %w", t.chunk, t.err)
			if _, live := r.rflows[t.key]; live && !orphan {
				r.nack(t.key.Peer, t.key.Request, t.chunk, wire.NackScatterFailed, scatterReason(why))
			}
			r.flowFailed(t.key, why)
		case orphan:
			// The flow was reclaimed while scattering: nobody to ACK.
		default:
			_ = r.send(t.key.Peer, &wire.Ack{Request: t.key.Request, Chunk: t.chunk, Region: t.off, ScatterNS: uint64(max(time.Since(t.queued), 0))})
			r.chunkLanded(t.key, t.payload())
		}
		if t.err == nil || errors.Is(t.err, errScatterCancelled) {
			// The scatter finished (or never started): nothing reads its
			// runs any more. A failed one keeps its array, in case its
			// copy still runs.
			r.recycleRuns(t.runs)
			t.runs = nil
		}
	}
	if len(res) > 0 {
		r.schedule()
	}
	return len(res) > 0
}

// scatterReason is a scatter failure's cause as a NACK carries it: the
// error's text, cut to 1 KiB (a NACK must fit any control channel).
func scatterReason(err error) string {
	const most = 1 << 10
	s := "receiver: " + err.Error()
	if len(s) > most {
		s = strings.ToValidUTF8(s[:most], "")
	}
	return s
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
