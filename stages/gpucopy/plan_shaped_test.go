package gpucopy

import (
	"encoding/binary"
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/transfer"
)

// TestPlanShapedAgreesWithTheContract: on random pools, shapes (some
// invalid), id tables (some ids past the pool, some not whole groups),
// unit ranges and region offsets, planShaped refuses exactly what
// transfer.ShapedCopy.Check refuses, always with ErrOutOfBounds; when it
// accepts, the kernel's address computation (copy.cu's ShapedJob, modelled
// here over the window, the bases and the encoded segment table) yields
// ShapedCopy.Runs in order, and every run lies in the span the plan
// checked from its region's base.
func TestPlanShapedAgreesWithTheContract(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		blockLen := rapid.Uint64Range(1, 5000).Draw(t, "len")
		pool := transfer.Pool{
			BlockLen: blockLen,
			Stride:   blockLen + rapid.Uint64Range(0, 64).Draw(t, "gap"),
			Blocks:   rapid.Uint64Range(1, 300).Draw(t, "blocks"),
			Kind:     transfer.CUDA,
		}
		for r := range rapid.IntRange(1, 4).Draw(t, "regions") {
			pool.Regions = append(pool.Regions, uint64(r+1)<<32+rapid.Uint64Range(0, 15).Draw(t, "skew"))
		}
		group := rapid.Uint32Range(1, 4).Draw(t, "group")
		sh := transfer.Shape{Group: rapid.Uint32Range(0, group).Draw(t, "shape group")}
		for range rapid.IntRange(0, 6).Draw(t, "segs") {
			off := rapid.Uint64Range(0, blockLen).Draw(t, "off")
			sh.Segs = append(sh.Segs, transfer.Segment{
				Block: rapid.Uint32Range(0, group).Draw(t, "block"),
				Off:   uint32(off),
				Len:   uint32(rapid.Uint64Range(0, blockLen-off+1).Draw(t, "seglen")),
			})
		}
		ngroups := rapid.IntRange(1, 50).Draw(t, "groups")
		nids := ngroups*int(max(sh.Group, 1)) + rapid.IntRange(-1, 1).Draw(t, "ragged")
		ids := rapid.SliceOfN(rapid.Uint32Range(0, uint32(pool.Blocks)+rapid.Uint32Range(0, 1).Draw(t, "past")), max(nids, 1), max(nids, 1)).Draw(t, "ids")
		sc := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: pool, IDs: ids}}, Shape: sh}
		units := uint64(0)
		if sh.Group > 0 {
			units = sc.Units()
		}
		ulen := sh.UnitLen()
		var regionLen uint64
		if rapid.Bool().Draw(t, "in range") {
			sc.First = rapid.Uint64Range(0, units).Draw(t, "first")
			sc.Count = rapid.Uint64Range(0, units-sc.First).Draw(t, "count")
			sc.RegionOff = rapid.Uint64Range(0, 100).Draw(t, "off")
			regionLen = max(1, sc.RegionOff+sc.Count*ulen+rapid.Uint64Range(0, 10).Draw(t, "slack"))
		} else {
			sc.First = rapid.Uint64Range(0, units+2).Draw(t, "first")
			sc.Count = rapid.Uint64Range(0, units+2).Draw(t, "count")
			regionLen = rapid.Uint64Range(1, 2*(units+1)*(ulen+1)).Draw(t, "regionLen")
			sc.RegionOff = rapid.Uint64Range(0, regionLen+10).Draw(t, "regionOff")
		}
		var win []uint32
		var nr uint64
		pl, err := planShaped(regionLen, sc, func(r, m uint64) ([]uint32, error) {
			nr = r
			win = make([]uint32, m)
			return win, nil
		})
		want := sc.Check(regionLen)
		if (err == nil) != (want == nil) {
			t.Fatalf("planShaped: %v; ShapedCopy.Check: %v", err, want)
		}
		if err != nil {
			if !errors.Is(err, transfer.ErrOutOfBounds) {
				t.Fatalf("refusal %v is not ErrOutOfBounds", err)
			}
			return
		}
		if sc.Count == 0 {
			return
		}
		lo, hi := sc.RegionsTouched()
		if pl.lo != lo || pl.hi != hi || nr != uint64(hi-lo) {
			t.Fatalf("regions [%d, %d) (%d bases), want [%d, %d)", pl.lo, pl.hi, nr, lo, hi)
		}
		bases := pool.Regions[lo:hi]
		enc := kernels.EncodeSegments(nil, sh.Segs)
		n, grp, ns := pl.n, uint64(sh.Group), uint64(len(sh.Segs))
		var model [][3]uint64
		for k := range sc.Count * ns {
			// copy.cu's ShapedJob::item and unit_addr.
			u := k / ns
			e := enc[(k-u*ns)*kernels.SegmentSize:]
			blk, off, l, roff := binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:]), binary.LittleEndian.Uint32(e[8:]), binary.LittleEndian.Uint32(e[12:])
			q := pl.off0 + u
			r := q / n
			x := q - r*n
			w := x - pl.off0
			if x < pl.off0 {
				w = x + n - pl.off0
			}
			addr := bases[r] + uint64(win[w*grp+uint64(blk)])*pool.Stride + uint64(off)
			model = append(model, [3]uint64{addr, sc.RegionOff + u*ulen + uint64(roff), uint64(l)})
			if addr < bases[r]+pl.spanLo || addr+uint64(l) > bases[r]+pl.spanHi {
				t.Fatalf("item %d at [%#x, +%d) outside the span [%#x, %#x)", k, addr, l, bases[r]+pl.spanLo, bases[r]+pl.spanHi)
			}
		}
		i := 0
		sc.Runs(func(addr, off, l uint64) bool {
			if i >= len(model) || model[i] != [3]uint64{addr, off, l} {
				t.Fatalf("run %d: Runs gives (%#x, %d, %d), the kernel's model %v", i, addr, off, l, model[min(i, len(model)-1)])
			}
			i++
			return true
		})
		if i != len(model) {
			t.Fatalf("Runs gives %d runs, the kernel's model %d", i, len(model))
		}
	})
}
