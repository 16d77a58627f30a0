package plan

import (
	"fmt"
	"math/bits"

	"github.com/bouncekv/bounce/transfer"
)

// Coalesce merges consecutive runs that describe one regular copy pattern
// and returns the merged list; the input is not modified. Walking in order,
// each run (if it is a single copy, Count 1) is folded into the previous
// result when:
//   - contiguous growth: the previous result is a single copy and the run
//     continues it in both region and address (RegionOff and Addr both
//     advance by its Len), so its Len grows;
//   - stride latch: the previous result is a single copy of the same Len and
//     the run starts at or after its end in both region and address, so the
//     two become Count 2 with RegionStride and AddrStride set to the
//     distances;
//   - stride extension: the previous result is strided, the run has its Len
//     and starts exactly one stride after its last copy on both sides, so
//     Count grows.
//
// Contiguous growth is tried first, so pieces packed back to back with
// contiguous addresses become one long run and pieces with a uniform address
// stride become one strided run. Runs that move no bytes (Len or Count 0)
// are dropped. The merged runs copy exactly the same bytes between the same
// places as the input.
func Coalesce(runs []transfer.Run) []transfer.Run {
	if len(runs) == 0 {
		return nil
	}
	out := make([]transfer.Run, 0, len(runs))
	for _, r := range runs {
		out = appendRunFrom(out, 0, r)
	}
	return out
}

// appendRunFrom appends r to runs, folding it into the last run when
// Coalesce's rules allow and that run's index is at least from.
func appendRunFrom(runs []transfer.Run, from int, r transfer.Run) []transfer.Run {
	if r.Len == 0 || r.Count == 0 {
		return runs
	}
	if r.Count == 1 {
		r.RegionStride, r.AddrStride = 0, 0
		if n := len(runs); n > from && merge(&runs[n-1], r) {
			return runs
		}
	}
	return append(runs, r)
}

// merge folds the single copy r into c when it continues c's pattern.
func merge(c *transfer.Run, r transfer.Run) bool {
	if c.Count == 1 {
		regEnd, ok1 := add(c.RegionOff, c.Len)
		addrEnd, ok2 := add(c.Addr, c.Len)
		if !ok1 || !ok2 {
			return false
		}
		if r.RegionOff == regEnd && r.Addr == addrEnd {
			if _, ok := add(c.Len, r.Len); !ok {
				return false
			}
			c.Len += r.Len
			return true
		}
		if r.Len == c.Len && r.RegionOff >= regEnd && r.Addr >= addrEnd {
			c.Count = 2
			c.RegionStride = r.RegionOff - c.RegionOff
			c.AddrStride = r.Addr - c.Addr
			return true
		}
		return false
	}
	if r.Len != c.Len {
		return false
	}
	nextReg, ok1 := mulAdd(c.Count, c.RegionStride, c.RegionOff)
	nextAddr, ok2 := mulAdd(c.Count, c.AddrStride, c.Addr)
	if !ok1 || !ok2 || r.RegionOff != nextReg || r.Addr != nextAddr {
		return false
	}
	c.Count++
	return true
}

// CheckRuns validates runs received from a peer against a region of
// regionLen bytes: every run moves bytes (Len and Count positive), its copies
// do not overlap one another in the region (RegionStride >= Len when Count >
// 1), and all of them lie inside [0, regionLen) without overflow. It returns
// the total bytes the runs move.
func CheckRuns(runs []transfer.Run, regionLen uint64) (payload uint64, err error) {
	for i, r := range runs {
		if r.Len == 0 || r.Count == 0 {
			return 0, fmt.Errorf("plan: run %d moves no bytes (len %d, count %d)", i, r.Len, r.Count)
		}
		if r.Count > 1 && r.RegionStride < r.Len {
			return 0, fmt.Errorf("plan: run %d: region stride %d shorter than its %d-byte copies: %w", i, r.RegionStride, r.Len, transfer.ErrOutOfBounds)
		}
		_, end, ok := r.RegionSpan()
		if !ok || end > regionLen {
			return 0, fmt.Errorf("plan: run %d (region offset %d, %d x %d bytes, stride %d) exceeds the %d-byte region: %w",
				i, r.RegionOff, r.Count, r.Len, r.RegionStride, regionLen, transfer.ErrOutOfBounds)
		}
		if _, _, ok := r.AddrSpan(); !ok {
			return 0, fmt.Errorf("plan: run %d: address range wraps: %w", i, transfer.ErrOutOfBounds)
		}
		hi, n := bits.Mul64(r.Len, r.Count)
		sum, carry := bits.Add64(payload, n, 0)
		if hi != 0 || carry != 0 {
			return 0, fmt.Errorf("plan: run %d: payload overflows: %w", i, transfer.ErrOutOfBounds)
		}
		payload = sum
	}
	return payload, nil
}

func add(a, b uint64) (uint64, bool) {
	s, carry := bits.Add64(a, b, 0)
	return s, carry == 0
}

// mulAdd returns a*b+c and whether it fits in 64 bits.
func mulAdd(a, b, c uint64) (uint64, bool) {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return 0, false
	}
	return add(lo, c)
}
