package hostcopy_test

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/stages/hostcopy"
	"github.com/bouncekv/bounce/transfer"
)

// bytePairs expands runs to the (region offset, address) pair of every byte
// they move, counting repeats.
func bytePairs(runs []transfer.Run) map[[2]uint64]int {
	m := map[[2]uint64]int{}
	for _, r := range runs {
		for i := range r.Count {
			for b := range r.Len {
				m[[2]uint64{r.RegionOff + i*r.RegionStride + b, r.Addr + i*r.AddrStride + b}]++
			}
		}
	}
	return m
}

// TestSplitProperties: the shares move exactly the bytes of the runs, each
// once; there are at most parts of them and no more than one per minBytes;
// every share but the last reaches the target and overshoots it by less than
// one copy.
func TestSplitProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var runs []transfer.Run
		var off, total uint64
		maxLen := uint64(1)
		for range rapid.IntRange(0, 12).Draw(t, "runs") {
			r := transfer.Run{
				RegionOff: off,
				Addr:      1 << 20 * uint64(len(runs)+1),
				Len:       rapid.Uint64Range(0, 48).Draw(t, "len"),
				Count:     rapid.Uint64Range(0, 6).Draw(t, "count"),
			}
			if rapid.Bool().Draw(t, "contiguous") {
				r.RegionStride, r.AddrStride = r.Len, r.Len
			} else {
				r.RegionStride = r.Len + rapid.Uint64Range(0, 8).Draw(t, "rgap")
				r.AddrStride = r.Len + rapid.Uint64Range(0, 8).Draw(t, "agap")
			}
			if _, end, _ := r.RegionSpan(); end > off {
				off = end
			}
			runs = append(runs, r)
			total += r.Bytes()
			if r.Bytes() > 0 {
				maxLen = max(maxLen, r.Len) // a strided cut overshoots by less than one copy
			}
		}
		parts := rapid.IntRange(0, 9).Draw(t, "parts")
		minBytes := rapid.Uint64Range(0, 100).Draw(t, "minBytes")
		prefix := []transfer.Run{{Len: 7, Count: 1}} // Split appends: earlier entries stay
		split, bounds := hostcopy.Split(prefix, nil, runs, parts, minBytes)
		if split[0] != prefix[0] {
			t.Fatalf("Split overwrote dst[0]: %+v", split[0])
		}
		split = split[1:]
		for i := range bounds {
			bounds[i]--
		}
		if len(bounds) == 0 || bounds[len(bounds)-1] != len(split) {
			t.Fatalf("bounds %v for %d runs", bounds, len(split))
		}
		if limit := max(1, min(uint64(max(parts, 0)), total/max(minBytes, 1))); uint64(len(bounds)) > limit {
			t.Fatalf("%d shares, want at most %d (parts %d, %d bytes, min %d)", len(bounds), limit, parts, total, minBytes)
		}
		got, want := bytePairs(split), bytePairs(runs)
		if len(got) != len(want) {
			t.Fatalf("shares move %d distinct bytes, runs %d", len(got), len(want))
		}
		for k, n := range want {
			if got[k] != n {
				t.Fatalf("byte %v moved %d times by the shares, %d by the runs", k, got[k], n)
			}
		}
		if len(bounds) > 1 {
			used := uint64(parts) // the share count Split aims for
			used = min(used, total/max(minBytes, 1))
			target := (total + used - 1) / used
			lo := 0
			for i, hi := range bounds[:len(bounds)-1] {
				var n uint64
				for _, r := range split[lo:hi] {
					if r.Bytes() == 0 {
						t.Fatalf("share %d holds an empty run", i)
					}
					n += r.Bytes()
				}
				if n < target || n >= target+maxLen {
					t.Fatalf("share %d: %d bytes, want [%d, %d)", i, n, target, target+maxLen)
				}
				lo = hi
			}
		}
	})
}

// TestSplitCutsContiguousAtBytes: one 10-byte contiguous run in 3 shares
// of 4, 4 and 2 bytes, addresses and offsets advancing together.
func TestSplitCutsContiguousAtBytes(t *testing.T) {
	split, bounds := hostcopy.Split(nil, nil, []transfer.Run{{RegionOff: 100, Addr: 1000, Len: 5, Count: 2, RegionStride: 5, AddrStride: 5}}, 3, 1)
	want := []transfer.Run{{RegionOff: 100, Addr: 1000, Len: 4, Count: 1}, {RegionOff: 104, Addr: 1004, Len: 4, Count: 1}, {RegionOff: 108, Addr: 1008, Len: 2, Count: 1}}
	if len(split) != 3 || len(bounds) != 3 || bounds[0] != 1 || bounds[1] != 2 || bounds[2] != 3 {
		t.Fatalf("split %+v bounds %v", split, bounds)
	}
	for i := range want {
		if split[i] != want[i] {
			t.Fatalf("share %d: %+v, want %+v", i, split[i], want[i])
		}
	}
	// A strided run is cut between copies: 5 copies of 4 bytes in 2 shares
	// (target 10) are 3 copies (12 bytes, overshooting by less than a copy)
	// and 2.
	split, bounds = hostcopy.Split(nil, nil, []transfer.Run{{RegionOff: 0, Addr: 64, Len: 4, Count: 5, RegionStride: 4, AddrStride: 16}}, 2, 1)
	if len(bounds) != 2 || split[0].Count != 3 || split[1].Count != 2 || split[1].Addr != 64+3*16 || split[1].RegionOff != 12 {
		t.Fatalf("strided split %+v bounds %v", split, bounds)
	}
	// Under twice minBytes, one share.
	if _, bounds = hostcopy.Split(nil, nil, []transfer.Run{{Len: 100, Count: 1}}, 8, 60); len(bounds) != 1 {
		t.Fatalf("small op cut into %d shares", len(bounds))
	}
}
