package gpucopy

import (
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/transfer"
)

// TestPlanBlocksAgreesWithTheContract: on random pools, id tables (some
// ids past the pool), piece ranges (some past the table) and region
// offsets (some past the region), the stage's fused checks refuse exactly
// what transfer.BlockCopy.Check refuses, always with ErrOutOfBounds; when
// they accept, the window they copied is the chunk's ids in order
// (piece First+k's id is window[k mod len(IDs)]), the regions are
// RegionsTouched's, and every piece of the chunk lies in the span they
// report from its region's base.
func TestPlanBlocksAgreesWithTheContract(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		blockLen := rapid.Uint64Range(1, 5000).Draw(t, "len")
		pool := transfer.Pool{
			BlockLen: blockLen,
			Stride:   blockLen + rapid.Uint64Range(0, 64).Draw(t, "gap"),
			Blocks:   rapid.Uint64Range(1, 300).Draw(t, "blocks"),
			Kind:     transfer.CUDA,
		}
		for r := range rapid.IntRange(1, 5).Draw(t, "regions") {
			pool.Regions = append(pool.Regions, uint64(r+1)<<32+rapid.Uint64Range(0, 15).Draw(t, "skew"))
		}
		ids := rapid.SliceOfN(rapid.Uint32Range(0, uint32(pool.Blocks)+rapid.Uint32Range(0, 2).Draw(t, "past")), 1, 200).Draw(t, "ids")
		b := transfer.Blocks{Pool: pool, IDs: ids}
		var first, count, regionLen, off uint64
		if rapid.Bool().Draw(t, "in range") {
			first = rapid.Uint64Range(0, b.Len()).Draw(t, "first")
			count = rapid.Uint64Range(0, b.Len()-first).Draw(t, "count")
			off = rapid.Uint64Range(0, 100).Draw(t, "off")
			regionLen = max(1, off+count*blockLen+rapid.Uint64Range(0, 10).Draw(t, "slack"))
		} else {
			first = rapid.Uint64Range(0, b.Len()+2).Draw(t, "first")
			count = rapid.Uint64Range(0, b.Len()+2).Draw(t, "count")
			regionLen = rapid.Uint64Range(1, 2*b.Len()*blockLen).Draw(t, "regionLen")
			off = rapid.Uint64Range(0, regionLen+10).Draw(t, "off")
		}
		bc := transfer.BlockCopy{Blocks: b, First: first, Count: count, RegionOff: off}
		var win []uint32
		var nr uint64
		pl, err := planBlocks(regionLen, bc, func(r, m uint64) ([]uint32, error) {
			nr = r
			win = make([]uint32, m)
			return win, nil
		})
		want := bc.Check(regionLen)
		if (err == nil) != (want == nil) {
			t.Fatalf("planBlocks: %v; BlockCopy.Check: %v", err, want)
		}
		if err != nil {
			if !errors.Is(err, transfer.ErrOutOfBounds) {
				t.Fatalf("refusal %v is not ErrOutOfBounds", err)
			}
			return
		}
		if count == 0 {
			return
		}
		lo, hi := b.RegionsTouched(first, count)
		if pl.lo != lo || pl.hi != hi || nr != uint64(hi-lo) {
			t.Fatalf("regions [%d, %d) (%d bases), want [%d, %d)", pl.lo, pl.hi, nr, lo, hi)
		}
		n := uint64(len(ids))
		if pl.m != min(count, n) || pl.off0 != first%n {
			t.Fatalf("window of %d from %d, want %d from %d", pl.m, pl.off0, min(count, n), first%n)
		}
		for k := range count {
			q := first + k
			if got, want := win[k%n], ids[q%n]; got != want {
				t.Fatalf("piece %d: window id %d, table id %d", q, got, want)
			}
			pc := b.Piece(q)
			base := pool.Regions[q/n]
			if pc.Addr < base+pl.spanLo || pc.Addr+pc.Len > base+pl.spanHi {
				t.Fatalf("piece %d at [%#x, +%d) outside the span [%#x, %#x)", q, pc.Addr, pc.Len, base+pl.spanLo, base+pl.spanHi)
			}
		}
		if uint64(len(win)) != pl.m {
			t.Fatalf("window of %d ids, plan says %d", len(win), pl.m)
		}
	})
}

// BenchmarkPlanBlocks is the block form's host checks alone (no driver
// call): one 8 MiB chunk of 2,048 random ids of a 163,840-block pool, the
// window copied into ordinary memory. It reports ns a block; the device
// figure (BenchmarkChunkHost) adds the pinned stores and the driver calls.
//
//	go test -run '^$' -bench PlanBlocks ./stages/gpucopy/
func BenchmarkPlanBlocks(b *testing.B) {
	pool := transfer.Pool{Regions: []uint64{1 << 32}, BlockLen: 4096, Stride: 4096, Blocks: 163840, Kind: transfer.CUDA}
	ids := make([]uint32, 81920)
	for i := range ids {
		ids[i] = uint32((i * 7919) % 163840)
	}
	bc := transfer.BlockCopy{Blocks: transfer.Blocks{Pool: pool, IDs: ids}, First: 4096, Count: 2048}
	win := make([]uint32, 2048)
	alloc := func(nr, m uint64) ([]uint32, error) { return win[:m], nil }
	b.ResetTimer()
	for range b.N {
		if _, err := planBlocks(8<<20, bc, alloc); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(bc.Count), "ns/block")
}
