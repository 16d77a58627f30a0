// Package credit is the receiver side of bounce's credit flow control: a
// buddy allocator over the shared bounce arena and a Scheduler that hands
// its regions to remote flows (WANT -> GRANT), tracks them through scatter
// (DATA -> scatter -> ACK), reclaims them on cancel or peer loss, and serves
// the local sender's gather staging from the same arena.
//
// Everything here is pure logic: no goroutines, locks, clocks or IO. The
// owner (the pipeline's IO loop) feeds events in and acts on what comes back.
//
// # Region ownership
//
// Every byte of the arena is, at any moment, exactly one of: free; held by
// one remote flow (granted, written, queued or scattering); orphaned (its flow
// was cancelled while a scatter was reading it, so it is freed only when that
// scatter ends); local (sender gather staging, eager or credit-backed); or
// quarantined (reclaimed from a flow whose sender may still land a write in
// it: held by nobody, never granted, freed only by ReleaseQuarantined).
// Scheduler.Check verifies this conservation invariant.
//
// A flow is reclaimed with Cancel (its idle regions are free at once) when
// its sender can no longer write them, and with Quarantine or
// QuarantinePeer otherwise (an expired flow, a lost peer its engine did not
// fence). The scheduler keeps no clock: its owner decides when a quarantine
// is over and calls ReleaseQuarantined.
//
// # Wants
//
// A flow is wanted once: Want creates it with its whole chunk list, and its
// chunks are granted in that order. While the flow is live (chunks pending
// or regions held), a repeated Want with the same list is dropped
// (ErrDuplicateWant: the network or a confused sender repeated a message;
// the reservation must not double) and one with a different list is a
// protocol error (ErrConflictingWant); neither changes anything. After the
// flow ended, a Want of the same key is a new flow.
//
// # Scheduling
//
// Schedule grants regions round-robin: each sweep starts at the cursor, grants
// one region to the first ready flow whose head chunk fits, and moves the
// cursor past it; sweeps repeat until none can grant. A flow is ready when it
// has pending chunks and holds fewer than MaxInflight regions (W); only ready
// flows sit on the ring, so flows parked at their cap or with every chunk granted
// cost nothing per grant. A flow that becomes ready (a new flow, or a region
// freed below its cap) joins the ring just before the cursor: last in the
// current round. A head chunk that does not fit is skipped (backpressure,
// never an error).
//
// A peer at its cap (PeerShare, PeerMax) has all of its flows off the ring
// until rebalance lifts the cap. Each peer lists its flows least recently
// granted first, and rebalance puts them back in that order, so a cap
// that comes and goes on every grant (one sender with many flows against
// PeerMax) keeps the round robin instead of reshuffling it; ready reads
// the cap as of the last rebalance, so the flow whose freed region lifted
// it does not jump ahead of its peer's others.
//
// # Drain mode
//
// Skipping lets small chunks starve a large one. A ready flow whose head did
// not fit when a sweep passed over it is stamped (oldest first) and, every
// time a sweep passes over it and then grants another flow, it counts one
// bypass. Since the cursor only moves forward round the ring, a flow is passed
// over at most once per full rotation, so the bypass count is the number of
// full rounds other flows were served while it waited. Once a flow reaches
// BypassRounds bypasses, the scheduler drains for the oldest such flow: it
// issues no new remote grant until that flow's head chunk fits (regions in
// flight keep finishing and freeing space), grants it, and leaves drain mode.
// Local staging (AcquireLocal) is never held back by drain mode.
//
// # Cost
//
// Buddy operations cost O(log(capacity/granule)). Schedule keeps, per buddy
// order, a count of ready flows whose head chunk has that order, so it stops
// as soon as no ready head fits the largest free block, without sweeping. A
// sweep that runs always ends in a grant, and every flow it passes over
// counts a bypass; a flow's bypasses reset only when it is granted or leaves
// the ring, and drain mode starts before any flow exceeds BypassRounds. So a
// sweep visits amortised O(BypassRounds) flows per grant, whatever the number
// of flows; flows at their cap are off the ring and cost nothing.
package credit
