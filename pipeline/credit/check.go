package credit

import "fmt"

// Check verifies the scheduler's invariants and describes the first
// violation it finds:
//   - conservation: every allocated arena block is exactly one held region
//     (of one live flow, scattering or not), one orphaned scattering region,
//     one local staging region or one quarantined region, and free + held +
//     orphaned + local + quarantined bytes equal the capacity;
//   - no flow holds more than W regions, and each flow's held list matches
//     the regions that name it;
//   - eager staging bytes stay within Capacity()/2;
//   - the ring holds exactly the ready flows (pending chunks, under the cap),
//     each once, with correct per-order counts; no done flow is kept;
//   - drain and starvation bookkeeping name live ready flows;
//   - the buddy allocator's own invariants (Buddy.Check).
//
// It walks every table, so it is meant for tests and debugging.
func (s *Scheduler) Check() error {
	if err := s.buddy.Check(); err != nil {
		return fmt.Errorf("credit: check: %w", err)
	}
	var blocks, blockBytes uint64
	var err error
	s.buddy.Blocks(func(off, size uint64) {
		blocks++
		blockBytes += size
		if err != nil {
			return
		}
		r, isRegion := s.regions[off]
		l, isLocal := s.locals[off]
		q, isQuarantined := s.quarantined[off]
		switch {
		case isRegion && isLocal:
			err = fmt.Errorf("credit: check: block %#x is both a region of %v and local staging", off, r.key)
		case isQuarantined && (isRegion || isLocal):
			err = fmt.Errorf("credit: check: block %#x is quarantined and also a region (%v) or local (%v)", off, isRegion, isLocal)
		case isQuarantined && q != size:
			err = fmt.Errorf("credit: check: quarantined %#x records %d bytes, block is %d", off, q, size)
		case isQuarantined:
		case !isRegion && !isLocal:
			err = fmt.Errorf("credit: check: block %#x (%d bytes) is allocated but owned by nobody (leak)", off, size)
		case isRegion && r.size != size:
			err = fmt.Errorf("credit: check: region %#x of %v records %d bytes, block is %d", off, r.key, r.size, size)
		case isLocal && l.size != size:
			err = fmt.Errorf("credit: check: local %#x records %d bytes, block is %d", off, l.size, size)
		}
	})
	if err != nil {
		return err
	}
	if n := uint64(len(s.regions) + len(s.locals) + len(s.quarantined)); n != blocks {
		return fmt.Errorf("credit: check: %d regions + %d locals + %d quarantined but %d allocated blocks", len(s.regions), len(s.locals), len(s.quarantined), blocks)
	}
	var quarantined uint64
	for _, size := range s.quarantined {
		quarantined += size
	}

	var held, orphanBytes, localBytes, eager uint64
	scattering, orphans := 0, 0
	for off, r := range s.regions {
		if r.scattering {
			scattering++
		}
		if r.f == nil {
			if !r.scattering {
				return fmt.Errorf("credit: check: orphan region %#x of %v is not scattering", off, r.key)
			}
			orphans++
			orphanBytes += r.size
			continue
		}
		if s.flows[r.key] != r.f {
			return fmt.Errorf("credit: check: region %#x names flow %v, which is not live", off, r.key)
		}
		if r.f.key != r.key {
			return fmt.Errorf("credit: check: region %#x keyed %v points at flow %v", off, r.key, r.f.key)
		}
		if !contains(r.f.held, off) {
			return fmt.Errorf("credit: check: region %#x missing from held list of %v", off, r.key)
		}
		held += r.size
	}
	for _, l := range s.locals {
		localBytes += l.size
		if l.eager {
			eager += l.size
		}
	}
	switch {
	case scattering != s.scattering:
		return fmt.Errorf("credit: check: %d scattering regions, counter says %d", scattering, s.scattering)
	case orphans != s.orphans || orphanBytes != s.orphanBytes:
		return fmt.Errorf("credit: check: %d orphans (%d bytes), counters say %d (%d bytes)", orphans, orphanBytes, s.orphans, s.orphanBytes)
	case held != s.heldBytes:
		return fmt.Errorf("credit: check: held regions sum to %d bytes, counter says %d", held, s.heldBytes)
	case localBytes != s.localBytes || eager != s.eager:
		return fmt.Errorf("credit: check: local %d / eager %d bytes, counters say %d / %d", localBytes, eager, s.localBytes, s.eager)
	case eager > s.Capacity()/2:
		return fmt.Errorf("credit: check: eager staging %d bytes exceeds half the arena (%d)", eager, s.Capacity()/2)
	case quarantined != s.quarantinedBytes:
		return fmt.Errorf("credit: check: quarantined regions sum to %d bytes, counter says %d", quarantined, s.quarantinedBytes)
	case s.buddy.FreeBytes()+held+orphanBytes+localBytes+quarantined != s.Capacity():
		return fmt.Errorf("credit: check: free %d + held %d + orphaned %d + local %d + quarantined %d != capacity %d",
			s.buddy.FreeBytes(), held, orphanBytes, localBytes, quarantined, s.Capacity())
	}

	pending, ready := 0, 0
	var count [64]int
	for k, f := range s.flows {
		if f.key != k {
			return fmt.Errorf("credit: check: flow table key %v holds flow %v", k, f.key)
		}
		n := len(f.pending) - f.head
		if n < 0 {
			return fmt.Errorf("credit: check: flow %v: pending head %d past %d chunks", k, f.head, len(f.pending))
		}
		pending += n
		if n == 0 && len(f.held) == 0 {
			return fmt.Errorf("credit: check: flow %v is done but not erased", k)
		}
		if len(f.held) > s.w {
			return fmt.Errorf("credit: check: flow %v holds %d regions, cap W is %d", k, len(f.held), s.w)
		}
		for i, off := range f.held {
			r, ok := s.regions[off]
			if !ok || r.f != f {
				return fmt.Errorf("credit: check: flow %v lists region %#x it does not own", k, off)
			}
			if contains(f.held[:i], off) {
				return fmt.Errorf("credit: check: flow %v lists region %#x twice", k, off)
			}
		}
		if f.inRing != s.ready(f) {
			return fmt.Errorf("credit: check: flow %v: on ring %v, ready %v (pending %d, held %d, W %d)", k, f.inRing, s.ready(f), n, len(f.held), s.w)
		}
		if f.inRing {
			ready++
			if o := s.buddy.orderOf(f.pending[f.head]); o != f.headOrder {
				return fmt.Errorf("credit: check: flow %v head order %d recorded as %d", k, o, f.headOrder)
			}
			count[f.headOrder]++
		}
		if f.starving && (!f.stamped || f.bypass < s.bypassRounds) {
			return fmt.Errorf("credit: check: flow %v starving with %d bypasses (stamped %v)", k, f.bypass, f.stamped)
		}
	}
	if pending != s.pending {
		return fmt.Errorf("credit: check: %d chunks pending, counter says %d", pending, s.pending)
	}
	if err := s.checkPeers(); err != nil {
		return err
	}
	if ready != s.ringLen {
		return fmt.Errorf("credit: check: %d ready flows, ring length %d", ready, s.ringLen)
	}
	if count != s.ringCount {
		return fmt.Errorf("credit: check: ring order counts %v, recorded %v", count, s.ringCount)
	}
	for o, c := range count {
		if (c > 0) != (s.ringMask&(1<<uint(o)) != 0) {
			return fmt.Errorf("credit: check: ring order mask %#x disagrees with count %d at order %d", s.ringMask, c, o)
		}
	}
	// Walk the ring from the cursor: every member live and on the ring, once.
	if (s.cursor == nil) != (s.ringLen == 0) {
		return fmt.Errorf("credit: check: cursor nil %v with ring length %d", s.cursor == nil, s.ringLen)
	}
	if s.cursor != nil {
		seen := make(map[*flow]bool, s.ringLen)
		f := s.cursor
		for range s.ringLen {
			if seen[f] {
				return fmt.Errorf("credit: check: flow %v twice on the ring", f.key)
			}
			seen[f] = true
			if !f.inRing || s.flows[f.key] != f {
				return fmt.Errorf("credit: check: ring holds flow %v that is not live and ready", f.key)
			}
			if f.next.prev != f {
				return fmt.Errorf("credit: check: ring links broken after flow %v", f.key)
			}
			f = f.next
		}
		if f != s.cursor {
			return fmt.Errorf("credit: check: ring does not close after %d flows", s.ringLen)
		}
	}
	for _, f := range s.starving {
		if !f.starving || s.flows[f.key] != f || !f.inRing {
			return fmt.Errorf("credit: check: starving list holds flow %v that is not a live ready starving flow", f.key)
		}
	}
	if d := s.drain; d != nil && (!d.starving || s.flows[d.key] != d || !d.inRing) {
		return fmt.Errorf("credit: check: drain flow %v is not a live ready starving flow", d.key)
	}
	return nil
}

func contains(s []uint64, v uint64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// checkPeers checks the per-peer accounting against the flows: every live
// flow is in its peer's set and nothing else is, held bytes and pending
// chunks add up, and the waiting count is right.
func (s *Scheduler) checkPeers() error {
	type sum struct {
		held    uint64
		pending int
		flows   int
	}
	want := map[string]*sum{}
	for k, f := range s.flows {
		w := want[k.Peer]
		if w == nil {
			w = &sum{}
			want[k.Peer] = w
		}
		w.flows++
		w.pending += len(f.pending) - f.head
		for _, off := range f.held {
			w.held += s.regions[off].size
		}
		if pl := s.peers[k.Peer]; pl == nil {
			return fmt.Errorf("credit: check: flow %v has no peer entry", k)
		} else if !inPeerList(pl, f) {
			return fmt.Errorf("credit: check: flow %v is missing from its peer's set", k)
		}
	}
	waiting := 0
	for p, pl := range s.peers {
		w := want[p]
		switch {
		case w == nil:
			return fmt.Errorf("credit: check: peer %q has an entry but no live flow", p)
		case w.flows != pl.flows || w.held != pl.held || w.pending != pl.pending:
			return fmt.Errorf("credit: check: peer %q: %d flows, %d held, %d pending; entry says %d, %d, %d",
				p, w.flows, w.held, w.pending, pl.flows, pl.held, pl.pending)
		}
		if pl.capped != s.capped(pl) {
			return fmt.Errorf("credit: check: peer %q: capped %v as of the last rebalance, %v now", p, pl.capped, s.capped(pl))
		}
		n := 0
		for f := pl.first; f != nil; f = f.pNext {
			if n++; n > pl.flows || s.flows[f.key] != f || f.key.Peer != p || (f.pNext == nil) != (f == pl.last) {
				return fmt.Errorf("credit: check: peer %q: its flow list is broken at %v", p, f.key)
			}
		}
		if n != pl.flows {
			return fmt.Errorf("credit: check: peer %q: %d flows listed, entry says %d", p, n, pl.flows)
		}
		if pl.pending > 0 {
			waiting++
		}
	}
	if waiting != s.waiting {
		return fmt.Errorf("credit: check: %d peers waiting, counter says %d", waiting, s.waiting)
	}
	return nil
}

// inPeerList reports whether f is linked into pl's flow list (a walk back
// from f reaches pl.first).
func inPeerList(pl *peerLoad, f *flow) bool {
	for g := f; g != nil; g = g.pPrev {
		if g == pl.first {
			return true
		}
	}
	return false
}
