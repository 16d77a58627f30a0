package credit

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/bouncekv/bounce/transfer"
)

// Errors reported by Scheduler methods; test with errors.Is. ErrNotHeld also
// matches transfer.ErrOutOfBounds and ErrScattering transfer.ErrInUse.
var (
	// ErrNotHeld means the region is not held by the named flow: unknown
	// offset, another flow's region, an orphan, or a late message after the
	// flow was cancelled.
	ErrNotHeld = fmt.Errorf("region not held by flow: %w", transfer.ErrOutOfBounds)
	// ErrScattering means the region is being scattered and cannot be
	// scattered again or dropped.
	ErrScattering = fmt.Errorf("region is scattering: %w", transfer.ErrInUse)
	// ErrNotScattering means EndScatter named a region with no scatter.
	ErrNotScattering = errors.New("region is not scattering")
	// ErrNotLocal means the offset is not a local staging region.
	ErrNotLocal = errors.New("not a local staging region")
	// ErrNotQuarantined means ReleaseQuarantined named an offset that is not
	// a quarantined region.
	ErrNotQuarantined = errors.New("region is not quarantined")
	// ErrNotEager means PromoteLocal named a credit-backed staging region.
	ErrNotEager = errors.New("local region is not eager")
	// ErrDuplicateWant means Want named a live flow with the chunk list it
	// already wanted: a repeated WANT, to be dropped.
	ErrDuplicateWant = errors.New("duplicate want for a live flow")
	// ErrConflictingWant means Want named a live flow with a different chunk
	// list: a flow is wanted once, so this is a protocol error.
	ErrConflictingWant = errors.New("want for a live flow with a different chunk list")
)

// DefaultBypassRounds is the number of full rounds a blocked flow may be
// bypassed before the scheduler drains for it, used when Config.BypassRounds
// is 0.
const DefaultBypassRounds = 2

// FlowKey names one flow: one request stream from one peer.
type FlowKey struct {
	Peer    string
	Request uint64
}

// String formats the key as peer/request for logs and errors.
func (k FlowKey) String() string { return fmt.Sprintf("%s/%d", k.Peer, k.Request) }

// Grant is one credit: the region [Offset, Offset+Len) of the arena is
// reserved for chunk Chunk of flow Flow. Chunk indexes the flow's Want from
// 0; Len is the chunk's requested bytes (the region's buddy block may be
// larger).
type Grant struct {
	Flow   FlowKey
	Chunk  int
	Offset uint64
	Len    uint64
}

// Config configures a Scheduler.
type Config struct {
	// Capacity is the arena size in bytes; the usable part is the largest
	// power-of-two multiple of Granularity that fits.
	Capacity uint64
	// Granularity is the smallest region (buddy block), a power of two.
	Granularity uint64
	// MaxInflight is W, the most regions one flow may hold at once
	// (scattering ones included). At least 1.
	MaxInflight int
	// BypassRounds is how many full rounds a flow whose head chunk does not
	// fit may be bypassed before drain mode serves it; 0 means
	// DefaultBypassRounds.
	BypassRounds int
	// PeerShare caps what one peer holds while other peers wait: a peer
	// whose flows hold at least Capacity / (peers with live flows) block
	// bytes gets no further grant while another peer has chunks pending.
	// A peer holding nothing is never capped, so every peer can always be
	// granted one region. Off, flows share the arena round-robin whatever
	// peer they belong to (one peer's many flows can then take it all).
	PeerShare bool
	// PeerMax, with PeerShare, caps what one peer holds even when no other
	// peer waits (block bytes; 0 means Capacity), so a peer that takes
	// grants and never writes them cannot hold the whole arena against the
	// next peer to arrive.
	PeerMax uint64
}

// Stats is a snapshot of the scheduler's accounting. Byte counts are in
// buddy block bytes, so Capacity = FreeBytes + HeldBytes + OrphanBytes +
// LocalBytes + QuarantinedBytes.
type Stats struct {
	Capacity, FreeBytes, HeldBytes, LocalBytes, EagerBytes uint64
	// Flows is the number of live flows (with pending chunks or held
	// regions); Scattering counts regions being scattered, orphans included;
	// Orphans counts scattering regions whose flow was reclaimed.
	Flows, Scattering, Orphans int
	// Draining is true while drain mode holds back remote grants.
	Draining bool
	// OrphanBytes is the block bytes of orphaned regions.
	OrphanBytes uint64
	// Regions is the number of held regions, Locals the number of local
	// staging regions.
	Regions, Locals int
	// Quarantined is the number of quarantined regions (reclaimed from a
	// flow whose sender may still write them) and QuarantinedBytes their
	// block bytes.
	Quarantined      int
	QuarantinedBytes uint64
	// Pending is the number of chunks wanted but not yet granted; Ready is
	// the number of flows on the ring (pending and under their cap).
	Pending, Ready int
	// DrainFlow is the flow drain mode waits for (valid when Draining).
	DrainFlow FlowKey
}

// Scheduler hands out regions of one arena to remote flows (credits) and to
// the local sender (staging). See the package documentation for the rules.
// A Scheduler is not safe for concurrent use.
type Scheduler struct {
	buddy        *Buddy
	w            int
	bypassRounds int

	peerShare bool
	peerMax   uint64
	peers     map[string]*peerLoad // peers with live flows
	waiting   int                  // peers with chunks pending

	flows       map[FlowKey]*flow
	regions     map[uint64]region
	locals      map[uint64]local
	quarantined map[uint64]uint64 // block size of each quarantined region

	cursor    *flow // next flow a sweep looks at; nil when the ring is empty
	ringLen   int
	ringCount [64]int // ring flows per head block order
	ringMask  uint64  // bit k set when ringCount[k] > 0

	visits   uint64  // flows looked at by sweeps, for benchmarks
	blockSeq uint64  // stamps of flows whose head did not fit
	drain    *flow   // flow drain mode waits for, or nil
	starving []*flow // flows bypassed >= bypassRounds times, any order

	pending                                   int
	heldBytes, orphanBytes, localBytes, eager uint64
	quarantinedBytes                          uint64
	scattering, orphans                       int
}

// peerLoad is one peer's share of the scheduler: the block bytes its flows
// hold, its pending chunks and its live flows.
type peerLoad struct {
	held    uint64
	pending int
	// first..last lists the peer's live flows, least recently granted
	// first (a flow never granted counts from its Want): the order the
	// ring serves them in, restored when a cap takes them off it.
	first, last *flow
	flows       int
	capped      bool // capped as of the last rebalance
}

// push appends f to the peer's flows (the most recently served).
func (pl *peerLoad) push(f *flow) {
	f.pPrev, f.pNext = pl.last, nil
	if pl.last != nil {
		pl.last.pNext = f
	} else {
		pl.first = f
	}
	pl.last = f
	pl.flows++
}

// remove takes f out of the peer's flows.
func (pl *peerLoad) remove(f *flow) {
	if f.pPrev != nil {
		f.pPrev.pNext = f.pNext
	} else {
		pl.first = f.pNext
	}
	if f.pNext != nil {
		f.pNext.pPrev = f.pPrev
	} else {
		pl.last = f.pPrev
	}
	f.pPrev, f.pNext = nil, nil
	pl.flows--
}

// flow is one (peer, request) stream.
type flow struct {
	key     FlowKey
	pending []uint64 // the flow's Want, chunk bytes; pending[head:] are still wanted
	head    int      // chunks granted so far = index of the next chunk
	held    []uint64 // region offsets, scattering ones included

	prev, next   *flow // ring links, valid while inRing
	pPrev, pNext *flow // links in the peer's flows (peerLoad.first)
	inRing       bool
	headOrder    int // buddy order of the head chunk, valid while inRing

	stamped  bool
	stamp    uint64
	bypass   int
	starving bool
}

// region is a block held by a remote flow (or orphaned when f is nil).
type region struct {
	key        FlowKey
	f          *flow
	chunk      int
	len, size  uint64
	scattering bool
}

// local is a gather staging block of the local sender.
type local struct {
	size  uint64
	eager bool
}

// New validates cfg and returns an empty scheduler.
func New(cfg Config) (*Scheduler, error) {
	if cfg.MaxInflight < 1 {
		return nil, fmt.Errorf("credit: config: MaxInflight %d: must be at least 1", cfg.MaxInflight)
	}
	if cfg.BypassRounds < 0 {
		return nil, fmt.Errorf("credit: config: BypassRounds %d: must not be negative", cfg.BypassRounds)
	}
	b, err := NewBuddy(cfg.Capacity, cfg.Granularity)
	if err != nil {
		return nil, fmt.Errorf("credit: config: arena: %w", err)
	}
	rounds := cfg.BypassRounds
	if rounds == 0 {
		rounds = DefaultBypassRounds
	}
	return &Scheduler{
		buddy:        b,
		w:            cfg.MaxInflight,
		bypassRounds: rounds,
		peerShare:    cfg.PeerShare,
		peerMax:      cfg.PeerMax,
		peers:        make(map[string]*peerLoad),
		flows:        make(map[FlowKey]*flow),
		regions:      make(map[uint64]region),
		locals:       make(map[uint64]local),
		quarantined:  make(map[uint64]uint64),
	}, nil
}

// Capacity returns the usable arena bytes (see NewBuddy).
func (s *Scheduler) Capacity() uint64 { return s.buddy.Capacity() }

// BlockSize returns the arena block a region or staging request of n bytes
// takes, or 0 when n is 0 or exceeds Capacity().
func (s *Scheduler) BlockSize(n uint64) uint64 { return s.buddy.BlockSize(n) }

// Want creates flow k wanting chunks of the given byte sizes, granted in
// order as chunks 0, 1, ... A flow is wanted once: while k is live (it has
// chunks pending or regions held), a Want with the same list changes
// nothing and returns ErrDuplicateWant (a repeated message), and one with a
// different list changes nothing and returns ErrConflictingWant (a protocol
// error). Every size must be in [1, Capacity()]; otherwise Want changes
// nothing and returns an error. An empty list is a no-op (use Cancel to
// withdraw a flow).
func (s *Scheduler) Want(k FlowKey, chunkBytes []uint64) error {
	for i, n := range chunkBytes {
		if n == 0 || n > s.Capacity() {
			return fmt.Errorf("credit: want %v: chunk %d is %d bytes, must be in [1, %d]", k, i, n, s.Capacity())
		}
	}
	if len(chunkBytes) == 0 {
		return nil
	}
	if f := s.flows[k]; f != nil {
		if slices.Equal(f.pending, chunkBytes) {
			return fmt.Errorf("credit: want %v: %w", k, ErrDuplicateWant)
		}
		return fmt.Errorf("credit: want %v: %d chunks, the live flow wanted %d: %w", k, len(chunkBytes), len(f.pending), ErrConflictingWant)
	}
	f := &flow{key: k, pending: slices.Clone(chunkBytes)}
	s.flows[k] = f
	pl := s.peers[k.Peer]
	if pl == nil {
		pl = &peerLoad{}
		s.peers[k.Peer] = pl
	}
	pl.push(f)
	s.pending += len(chunkBytes)
	s.addPending(pl, len(chunkBytes))
	s.update(f)
	s.rebalance()
	return nil
}

// addPending changes pl's pending chunk count by d, keeping the count of
// waiting peers.
func (s *Scheduler) addPending(pl *peerLoad, d int) {
	was := pl.pending > 0
	pl.pending += d
	switch now := pl.pending > 0; {
	case now && !was:
		s.waiting++
	case was && !now:
		s.waiting--
	}
}

// capped reports whether the peer holds at least its fair share while
// another peer waits, or PeerMax (Config.PeerShare).
func (s *Scheduler) capped(pl *peerLoad) bool {
	if !s.peerShare || pl == nil || pl.held == 0 {
		return false
	}
	if s.peerMax > 0 && pl.held >= s.peerMax {
		return true
	}
	if len(s.peers) < 2 {
		return false
	}
	others := s.waiting
	if pl.pending > 0 {
		others--
	}
	return others > 0 && pl.held >= s.Capacity()/uint64(len(s.peers))
}

// rebalance puts on or takes off the ring the flows of every peer whose
// capped state changed. Every mutating method ends with it.
func (s *Scheduler) rebalance() {
	if !s.peerShare {
		return
	}
	// A peer's flows go back on the ring least recently granted first,
	// so a cap that comes and goes keeps the round-robin order.
	var flows []*flow
	for _, pl := range s.peers {
		if c := s.capped(pl); c != pl.capped {
			pl.capped = c
			for f := pl.first; f != nil; f = f.pNext {
				flows = append(flows, f)
			}
		}
	}
	for _, f := range flows {
		if s.flows[f.key] == f {
			s.update(f)
		}
	}
}

// Schedule issues every grant possible right now, in round-robin order, and
// returns them (nil when none). Arena exhaustion only means fewer grants.
// While draining, it grants nothing until the drain flow's head chunk fits.
func (s *Scheduler) Schedule() []Grant {
	var out []Grant
	for {
		if s.drain == nil && len(s.starving) > 0 {
			s.drain = s.oldestStarving()
		}
		if f := s.drain; f != nil {
			if !f.inRing {
				// Defensive: a drain flow always stays ready until granted.
				s.clearStamp(f)
				continue
			}
			off, ok := s.buddy.Alloc(f.pending[f.head])
			if !ok {
				return out
			}
			out = append(out, s.grant(f, off))
			continue
		}
		if s.cursor == nil {
			return out
		}
		largest := s.buddy.largestOrder()
		if largest < 0 || s.ringMask&(uint64(2)<<uint(largest)-1) == 0 {
			return out // no ready head chunk fits anywhere: a sweep would grant nothing
		}
		// Some ready head fits, so this sweep ends in a grant: every flow it
		// passes over is bypassed once.
		f := s.cursor
		for range s.ringLen {
			s.visits++
			if f.headOrder <= largest {
				break
			}
			s.bypassed(f)
			f = f.next
		}
		off, ok := s.buddy.Alloc(f.pending[f.head])
		if !ok {
			return out // unreachable while the order bookkeeping holds; Check reports it
		}
		out = append(out, s.grant(f, off))
	}
}

// Active reports whether flow k exists: it has chunks pending or regions
// held (scattering ones included).
func (s *Scheduler) Active(k FlowKey) bool { return s.flows[k] != nil }

// IdleRegions returns the number of regions flow k holds that are granted
// and not being scattered: regions only its sender can move on (by a DATA
// or a cancel). 0 for an unknown flow.
func (s *Scheduler) IdleRegions(k FlowKey) int {
	f := s.flows[k]
	if f == nil {
		return 0
	}
	n := 0
	for _, off := range f.held {
		if !s.regions[off].scattering {
			n++
		}
	}
	return n
}

// Waiting reports whether flow k exists and none of its regions is being
// scattered: it waits for its sender (a grant to use) or for grants.
func (s *Scheduler) Waiting(k FlowKey) bool {
	f := s.flows[k]
	if f == nil {
		return false
	}
	for _, off := range f.held {
		if s.regions[off].scattering {
			return false
		}
	}
	return true
}

// Held reports whether the region at off is held by flow k (scattering or
// not). Orphaned regions are held by no flow.
func (s *Scheduler) Held(k FlowKey, off uint64) bool {
	r, ok := s.regions[off]
	return ok && r.f != nil && r.key == k
}

// Region describes a held or orphaned region.
type Region struct {
	Flow       FlowKey
	Chunk      int
	Offset     uint64
	Len        uint64 // requested chunk bytes
	Block      uint64 // buddy block bytes
	Scattering bool
	Orphan     bool
}

// Region returns the region granted at off, held or orphaned, and false when
// there is none.
func (s *Scheduler) Region(off uint64) (Region, bool) {
	r, ok := s.regions[off]
	if !ok {
		return Region{}, false
	}
	return Region{Flow: r.key, Chunk: r.chunk, Offset: off, Len: r.len, Block: r.size, Scattering: r.scattering, Orphan: r.f == nil}, true
}

// BeginScatter marks the region at off, held by flow k, as being scattered.
// It fails with ErrNotHeld when k does not hold it (for example a late DATA
// after a cancel) and ErrScattering when a scatter already runs.
func (s *Scheduler) BeginScatter(k FlowKey, off uint64) error {
	r, ok := s.regions[off]
	if !ok || r.f == nil || r.key != k {
		return fmt.Errorf("credit: begin scatter %v at %#x: %w", k, off, ErrNotHeld)
	}
	if r.scattering {
		return fmt.Errorf("credit: begin scatter %v at %#x: %w", k, off, ErrScattering)
	}
	r.scattering = true
	s.regions[off] = r
	s.scattering++
	return nil
}

// EndScatter frees the region at off once its scatter finished and returns
// its flow. orphan is true when the flow was reclaimed during the scatter (no
// ACK is due then). A flow with nothing pending or held is erased. It fails
// with ErrNotScattering when no scatter runs at off.
func (s *Scheduler) EndScatter(off uint64) (k FlowKey, orphan bool, err error) {
	r, ok := s.regions[off]
	if !ok || !r.scattering {
		return FlowKey{}, false, fmt.Errorf("credit: end scatter at %#x: %w", off, ErrNotScattering)
	}
	delete(s.regions, off)
	s.buddy.Free(off)
	s.scattering--
	if r.f == nil {
		s.orphans--
		s.orphanBytes -= r.size
		return r.key, true, nil
	}
	s.heldBytes -= r.size
	s.peers[r.key.Peer].held -= r.size
	r.f.removeHeld(off)
	s.update(r.f)
	s.rebalance()
	return r.key, false, nil
}

// Drop frees a region held by k that is not scattering, without a scatter
// (for example after its DATA was rejected). No ACK is implied.
func (s *Scheduler) Drop(k FlowKey, off uint64) error {
	r, ok := s.regions[off]
	if !ok || r.f == nil || r.key != k {
		return fmt.Errorf("credit: drop %v at %#x: %w", k, off, ErrNotHeld)
	}
	if r.scattering {
		return fmt.Errorf("credit: drop %v at %#x: %w", k, off, ErrScattering)
	}
	delete(s.regions, off)
	s.buddy.Free(off)
	s.heldBytes -= r.size
	s.peers[k.Peer].held -= r.size
	r.f.removeHeld(off)
	s.update(r.f)
	s.rebalance()
	return nil
}

// Cancel reclaims flow k: its pending chunks are dropped, its regions that
// are not scattering are freed now, scattering ones become orphans freed by
// EndScatter, and the flow is erased. It returns the number of regions freed
// now; an unknown flow is 0. Cancel is for a flow whose sender can no
// longer write any of its regions (it cancelled once its writes were over);
// otherwise use Quarantine.
func (s *Scheduler) Cancel(k FlowKey) int {
	return len(s.reclaim(k, false))
}

// Quarantine reclaims flow k like Cancel, except that its regions that are
// not scattering are quarantined instead of freed: its sender may still land
// a write in them (it expired, or its peer was lost without proof that it can
// no longer write). A quarantined region is held by nobody and never granted
// until ReleaseQuarantined frees it. It returns the quarantined offsets (nil
// for an unknown flow). Scattering regions become orphans as with Cancel:
// their DATA said the write was over.
func (s *Scheduler) Quarantine(k FlowKey) []uint64 {
	return s.reclaim(k, true)
}

// reclaim erases flow k and returns the offsets of its idle regions, which
// it frees, or quarantines when quarantine is set.
func (s *Scheduler) reclaim(k FlowKey, quarantine bool) []uint64 {
	f := s.flows[k]
	if f == nil {
		return nil
	}
	s.pending -= len(f.pending) - f.head
	pl := s.peers[k.Peer]
	s.addPending(pl, -(len(f.pending) - f.head))
	f.pending, f.head = nil, 0
	var idle []uint64
	for _, off := range f.held {
		r := s.regions[off]
		s.heldBytes -= r.size
		pl.held -= r.size
		if r.scattering {
			r.f = nil
			s.regions[off] = r
			s.orphans++
			s.orphanBytes += r.size
			continue
		}
		delete(s.regions, off)
		if quarantine {
			s.quarantined[off] = r.size
			s.quarantinedBytes += r.size
		} else {
			s.buddy.Free(off)
		}
		idle = append(idle, off)
	}
	f.held = nil
	s.update(f) // erases it
	s.rebalance()
	return idle
}

// ReleaseQuarantined frees a quarantined region once its quarantine is over
// (the owner keeps the clock). It fails with ErrNotQuarantined otherwise.
func (s *Scheduler) ReleaseQuarantined(off uint64) error {
	size, ok := s.quarantined[off]
	if !ok {
		return fmt.Errorf("credit: release quarantined %#x: %w", off, ErrNotQuarantined)
	}
	delete(s.quarantined, off)
	s.quarantinedBytes -= size
	s.buddy.Free(off)
	return nil
}

// ReclaimPeer cancels every flow of peer, in request order, and returns the
// regions freed now. It walks the whole flow table (peer loss is rare). Use
// it only when the peer can no longer write (its engine fenced it);
// otherwise QuarantinePeer.
func (s *Scheduler) ReclaimPeer(peer string) int {
	freed := 0
	for _, k := range s.peerFlows(peer) {
		freed += s.Cancel(k)
	}
	return freed
}

// QuarantinePeer quarantines every flow of peer (see Quarantine), in
// request order, and returns the quarantined offsets.
func (s *Scheduler) QuarantinePeer(peer string) []uint64 {
	var out []uint64
	for _, k := range s.peerFlows(peer) {
		out = append(out, s.Quarantine(k)...)
	}
	return out
}

// peerFlows returns the keys of peer's flows in request order.
func (s *Scheduler) peerFlows(peer string) []FlowKey {
	var keys []FlowKey
	for k := range s.flows {
		if k.Peer == peer {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Request < keys[j].Request })
	return keys
}

// AcquireLocal takes an n-byte gather staging region for the local sender
// from the same arena. Eager (credit-less) staging is capped so eager block
// bytes never exceed Capacity()/2; credit-backed staging (eager false) is not
// capped. Drain mode never blocks it. ok is false when n is 0, the eager
// budget is spent or no block fits.
func (s *Scheduler) AcquireLocal(n uint64, eager bool) (off uint64, ok bool) {
	size := s.buddy.BlockSize(n)
	if size == 0 {
		return 0, false
	}
	if eager && size > s.Capacity()/2-s.eager {
		return 0, false
	}
	off, ok = s.buddy.Alloc(n)
	if !ok {
		return 0, false
	}
	s.locals[off] = local{size: size, eager: eager}
	s.localBytes += size
	if eager {
		s.eager += size
	}
	return off, true
}

// PromoteLocal moves an eager staging region out of the eager budget once
// its chunk got a credit.
func (s *Scheduler) PromoteLocal(off uint64) error {
	l, ok := s.locals[off]
	if !ok {
		return fmt.Errorf("credit: promote local %#x: %w", off, ErrNotLocal)
	}
	if !l.eager {
		return fmt.Errorf("credit: promote local %#x: %w", off, ErrNotEager)
	}
	l.eager = false
	s.locals[off] = l
	s.eager -= l.size
	return nil
}

// ReleaseLocal frees a local staging region.
func (s *Scheduler) ReleaseLocal(off uint64) error {
	l, ok := s.locals[off]
	if !ok {
		return fmt.Errorf("credit: release local %#x: %w", off, ErrNotLocal)
	}
	delete(s.locals, off)
	s.buddy.Free(off)
	s.localBytes -= l.size
	if l.eager {
		s.eager -= l.size
	}
	return nil
}

// Stats returns a snapshot of the accounting.
func (s *Scheduler) Stats() Stats {
	st := Stats{
		Capacity:    s.Capacity(),
		FreeBytes:   s.buddy.FreeBytes(),
		HeldBytes:   s.heldBytes,
		LocalBytes:  s.localBytes,
		EagerBytes:  s.eager,
		Flows:       len(s.flows),
		Scattering:  s.scattering,
		Orphans:     s.orphans,
		Draining:    s.drain != nil,
		OrphanBytes: s.orphanBytes,

		Quarantined:      len(s.quarantined),
		QuarantinedBytes: s.quarantinedBytes,
		Regions:          len(s.regions) - s.orphans,
		Locals:           len(s.locals),
		Pending:          s.pending,
		Ready:            s.ringLen,
	}
	if s.drain != nil {
		st.DrainFlow = s.drain.key
	}
	return st
}

// HeldByPeer returns the block bytes of the regions each peer's flows hold
// (scattering ones included, orphans excluded). It allocates the map.
func (s *Scheduler) HeldByPeer() map[string]uint64 {
	out := make(map[string]uint64)
	for _, rg := range s.regions {
		if rg.f != nil {
			out[rg.key.Peer] += rg.size
		}
	}
	return out
}

// grant gives f's head chunk the block at off and moves the cursor past f.
func (s *Scheduler) grant(f *flow, off uint64) Grant {
	n := f.pending[f.head]
	g := Grant{Flow: f.key, Chunk: f.head, Offset: off, Len: n}
	f.head++
	s.pending--
	pl := s.peers[f.key.Peer]
	s.addPending(pl, -1)
	size := s.buddy.BlockSize(n) // the block Alloc(n) just took
	s.regions[off] = region{key: f.key, f: f, chunk: g.Chunk, len: n, size: size}
	f.held = append(f.held, off)
	s.heldBytes += size
	pl.held += size
	pl.remove(f)
	pl.push(f) // now the peer's most recently granted flow
	s.clearStamp(f)
	s.cursor = f.next
	s.update(f)
	s.rebalance()
	return g
}

// bypassed records that a granting sweep passed over f because its head
// chunk did not fit.
func (s *Scheduler) bypassed(f *flow) {
	if !f.stamped {
		f.stamped = true
		s.blockSeq++
		f.stamp = s.blockSeq
	}
	f.bypass++
	if f.bypass >= s.bypassRounds && !f.starving {
		f.starving = true
		s.starving = append(s.starving, f)
	}
}

// clearStamp forgets that f was blocked; it ends drain mode for f.
func (s *Scheduler) clearStamp(f *flow) {
	f.stamped, f.stamp, f.bypass = false, 0, 0
	if f.starving {
		f.starving = false
		for i, g := range s.starving {
			if g == f {
				last := len(s.starving) - 1
				s.starving[i] = s.starving[last]
				s.starving[last] = nil
				s.starving = s.starving[:last]
				break
			}
		}
	}
	if s.drain == f {
		s.drain = nil
	}
}

// oldestStarving returns the starving flow stamped first.
func (s *Scheduler) oldestStarving() *flow {
	best := s.starving[0]
	for _, f := range s.starving[1:] {
		if f.stamp < best.stamp {
			best = f
		}
	}
	return best
}

// ready reports whether f belongs on the ring. The peer's cap is read as
// of the last rebalance, which every mutating method ends with: a flow
// whose region was freed then waits for rebalance to put all of its
// peer's flows back in their order, rather than jumping ahead of them.
func (s *Scheduler) ready(f *flow) bool {
	pl := s.peers[f.key.Peer]
	return f.head < len(f.pending) && len(f.held) < s.w && (pl == nil || !pl.capped)
}

// update restores the ring and table invariants after f changed: ready
// flows are on the ring with their current head order, others are off it,
// and a flow with nothing pending or held is erased.
func (s *Scheduler) update(f *flow) {
	switch ready := s.ready(f); {
	case ready && !f.inRing:
		s.ringInsert(f)
	case !ready && f.inRing:
		s.ringRemove(f)
	case ready:
		if o := s.buddy.orderOf(f.pending[f.head]); o != f.headOrder {
			s.countOrder(f.headOrder, -1)
			f.headOrder = o
			s.countOrder(o, 1)
		}
	}
	if f.head == len(f.pending) && len(f.held) == 0 {
		s.clearStamp(f)
		delete(s.flows, f.key)
		if pl := s.peers[f.key.Peer]; pl != nil {
			pl.remove(f)
			if pl.flows == 0 {
				delete(s.peers, f.key.Peer)
			}
		}
	}
}

// ringInsert puts f just before the cursor: last in the current round.
func (s *Scheduler) ringInsert(f *flow) {
	f.inRing = true
	f.headOrder = s.buddy.orderOf(f.pending[f.head])
	s.countOrder(f.headOrder, 1)
	s.ringLen++
	if s.cursor == nil {
		f.prev, f.next = f, f
		s.cursor = f
		return
	}
	c := s.cursor
	f.prev, f.next = c.prev, c
	c.prev.next = f
	c.prev = f
}

// ringRemove takes f off the ring; the cursor moves on if it pointed at f.
// A flow that leaves the ring is no longer waiting, so its stamp is cleared.
func (s *Scheduler) ringRemove(f *flow) {
	s.countOrder(f.headOrder, -1)
	s.ringLen--
	if s.ringLen == 0 {
		s.cursor = nil
	} else {
		f.prev.next = f.next
		f.next.prev = f.prev
		if s.cursor == f {
			s.cursor = f.next
		}
	}
	f.prev, f.next, f.inRing = nil, nil, false
	s.clearStamp(f)
}

func (s *Scheduler) countOrder(o, d int) {
	s.ringCount[o] += d
	if s.ringCount[o] == 0 {
		s.ringMask &^= 1 << uint(o)
	} else {
		s.ringMask |= 1 << uint(o)
	}
}

// removeHeld deletes off from f's held list.
func (f *flow) removeHeld(off uint64) {
	for i, h := range f.held {
		if h == off {
			last := len(f.held) - 1
			f.held[i] = f.held[last]
			f.held = f.held[:last]
			return
		}
	}
}
