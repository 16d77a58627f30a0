package pipeline

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"

	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// scatterDests is the memory a DATA's scatter may write: the user memory
// registered with the agent (RegisterMemory, RegisterMemoryFor, device KV
// registered with the stages alone), with who may write it. The arena is
// never in it (the registry refuses overlapping registrations), so a DATA
// can neither rewrite another flow's region nor a region of its own. It is
// kept in every security mode; the peers named by RegisterMemoryFor are
// honoured when authentication is on (byPeer), when names are proven.
type scatterDests struct {
	mu     sync.RWMutex
	ranges []userRange // sorted by address, non-overlapping
	byPeer bool
}

// add records registered user memory d, writable by peers (nil: all).
func (s *scatterDests) add(d transfer.Desc, peers []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearchFunc(s.ranges, d.Addr, func(u userRange, a uint64) int {
		switch {
		case u.d.Addr < a:
			return -1
		case u.d.Addr > a:
			return 1
		}
		return 0
	})
	s.ranges = slices.Insert(s.ranges, i, userRange{d: d, peers: peers})
}

// remove forgets the registration d.
func (s *scatterDests) remove(d transfer.Desc) {
	s.mu.Lock()
	s.ranges = slices.DeleteFunc(s.ranges, func(u userRange) bool { return u.d == d })
	s.mu.Unlock()
}

// writers returns who the registration d was made for (nil: every
// peer). A block pool keeps it in every mode: its WANT names the pool, so
// the restriction is checked once, where it costs nothing.
func (s *scatterDests) writers(d transfer.Desc) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, u := range s.ranges {
		if u.d == d {
			return u.peers
		}
	}
	return nil
}

// allowed returns the registration holding [addr, addr+n) that peer may
// write (the write guard's answer outside the arena), or why there is none.
func (s *scatterDests) allowed(peer string, addr, n uint64) (transfer.Desc, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, err := s.find(peer, addr, n)
	if err != nil {
		return transfer.Desc{}, err
	}
	return s.ranges[i].d, nil
}

// find returns the index of the range holding [addr, addr+n) that peer may
// write, or why there is none.
func (s *scatterDests) find(peer string, addr, n uint64) (int, error) {
	i, err := s.findRange(addr, n)
	if err != nil {
		return 0, err
	}
	u := &s.ranges[i]
	if s.byPeer && u.peers != nil && !slices.Contains(u.peers, peer) {
		return 0, fmt.Errorf("[%#x+%d] lies in %v, registered for %v, not %q: %w", addr, n, u.d, u.peers, peer, transfer.ErrForbidden)
	}
	return i, nil
}

// findRange returns the index of the range holding [addr, addr+n),
// whoever it was registered for.
func (s *scatterDests) findRange(addr, n uint64) (int, error) {
	lo, hi := 0, len(s.ranges)
	for lo < hi { // the first range starting past addr
		m := int(uint(lo+hi) >> 1)
		if s.ranges[m].d.Addr <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 || !s.ranges[lo-1].d.Contains(addr, n) {
		return 0, fmt.Errorf("[%#x+%d] is not registered user memory (a DATA never writes the arena): %w", addr, n, transfer.ErrForbidden)
	}
	return lo - 1, nil
}

// readableAll says why peer may not pull ds, checked under one lock: the
// index of the first descriptor that does not lie in one registration made
// for peer or for every peer, and why. The peers RegisterMemoryFor named
// are honoured in every security mode here (as for a pool's writers): what
// a peer may pull is the holder's decision, and without authentication a
// name is all there is to decide by.
func (s *scatterDests) readableAll(peer string, ds []transfer.Desc) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var u *userRange // the previous descriptor's range: a pool's blocks share a few
	for j, d := range ds {
		if u == nil || !u.d.Contains(d.Addr, d.Len) {
			i, err := s.findRange(d.Addr, d.Len)
			if err != nil {
				return j, fmt.Errorf("%v is not memory registered with the holder: %w", d, transfer.ErrForbidden)
			}
			if u = &s.ranges[i]; u.peers != nil && !slices.Contains(u.peers, peer) {
				return j, fmt.Errorf("%v lies in %v, registered for %v, not %q: %w", d, u.d, u.peers, peer, transfer.ErrForbidden)
			}
		}
		if u.d.Kind != d.Kind || u.d.Device != d.Device {
			return j, fmt.Errorf("%v lies in %v, memory of another kind or device: %w", d, u.d, transfer.ErrForbidden)
		}
	}
	return 0, nil
}

// allowedAll is allowed for every descriptor of ds under one lock: the
// index of the first peer may not write, and why.
func (s *scatterDests) allowedAll(peer string, ds []transfer.Desc) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	last := -1 // the previous descriptor's range: a pool's blocks share a few
	for j, d := range ds {
		if last >= 0 && s.ranges[last].d.Contains(d.Addr, d.Len) {
			continue
		}
		i, err := s.find(peer, d.Addr, d.Len)
		if err != nil {
			return j, err
		}
		last = i
	}
	return 0, nil
}

// check validates a DATA's runs before any copy, in one pass and without
// allocating: every run reads inside the flow's granted region (grantLen
// bytes), the runs copy in total no more than the region holds, and every
// copy writes memory peer may write. The error wraps transfer.ErrForbidden
// for a destination peer may not write and transfer.ErrOutOfBounds for the
// rest.
func (s *scatterDests) check(peer string, runs []transfer.Run, grantLen uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var payload uint64
	last := -1 // the range the previous run landed in
	for i := range runs {
		r := &runs[i]
		if r.Len == 0 || r.Count == 0 {
			return fmt.Errorf("run %d moves no bytes (len %d, count %d): %w", i, r.Len, r.Count, transfer.ErrOutOfBounds)
		}
		if r.Count > 1 && r.RegionStride < r.Len {
			return fmt.Errorf("run %d: region stride %d shorter than its %d-byte copies: %w", i, r.RegionStride, r.Len, transfer.ErrOutOfBounds)
		}
		if _, end, ok := r.RegionSpan(); !ok || end > grantLen {
			return fmt.Errorf("run %d (region offset %d, %d x %d bytes, stride %d) exceeds the %d-byte grant: %w",
				i, r.RegionOff, r.Count, r.Len, r.RegionStride, grantLen, transfer.ErrOutOfBounds)
		}
		hi, n := bits.Mul64(r.Len, r.Count)
		sum, carry := bits.Add64(payload, n, 0)
		if hi != 0 || carry != 0 || sum > grantLen {
			return fmt.Errorf("runs up to %d copy more bytes than the %d-byte grant holds: %w", i, grantLen, transfer.ErrOutOfBounds)
		}
		payload = sum
		start, end, ok := r.AddrSpan()
		if !ok {
			return fmt.Errorf("run %d: address range wraps: %w", i, transfer.ErrOutOfBounds)
		}
		if last >= 0 && s.ranges[last].d.Contains(start, end-start) {
			continue
		}
		k, err := s.find(peer, start, end-start)
		if err == nil {
			last = k
			continue
		}
		if r.Count == 1 || r.AddrStride == 0 {
			return fmt.Errorf("run %d: %w", i, err)
		}
		// A strided run whose span crosses registrations: copy by copy,
		// jumping over the copies that fit the range just found.
		for c := uint64(0); c < r.Count; {
			k, err := s.find(peer, r.Addr+c*r.AddrStride, r.Len)
			if err != nil {
				return fmt.Errorf("run %d copy %d: %w", i, c, err)
			}
			c = (s.ranges[k].d.End()-r.Len-r.Addr)/r.AddrStride + 1
		}
	}
	return nil
}

// checkData is onData's check of a DATA's runs against its flow's grant
// of grantLen bytes (scatterDests.check).
func (r *reactor) checkData(peer string, runs []transfer.Run, grantLen uint64) error {
	if r.a.checksOff.Load() {
		_, err := plan.CheckRuns(runs, grantLen)
		return err
	}
	return r.a.dests.check(peer, runs, grantLen)
}

// nackCodeOf is the NACK code for a refused DATA.
func nackCodeOf(err error) wire.NackCode {
	if errors.Is(err, transfer.ErrForbidden) {
		return wire.NackForbidden
	}
	return wire.NackBadRuns
}
