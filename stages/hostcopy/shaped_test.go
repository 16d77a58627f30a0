package hostcopy_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/stages/hostcopy"
	"github.com/bouncekv/bounce/transfer"
)

// TestSubmitShapedMatchesRuns checks shaped copies in both directions
// against the copy's meaning (transfer.ShapedCopy.Runs) byte by byte:
// random pools, shapes (segments in any order; disjoint on a scatter), id
// groups, unit ranges and region offsets, on several workers. Every byte
// outside the runs keeps its old value.
func TestSubmitShapedMatchesRuns(t *testing.T) {
	reg := &mem.Registry{}
	ext := buffer(t, reg, 1<<20)
	regionB := buffer(t, reg, 1<<20)
	ch := make(chan struct{}, 1)
	engines := map[hostcopy.Direction]*hostcopy.Engine{
		hostcopy.Gather:  newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Workers: 3, Notify: hostcopy.Signal(ch)}),
		hostcopy.Scatter: newEngine(t, hostcopy.Scatter, hostcopy.Settings{Registry: reg, Workers: 3, Notify: hostcopy.Signal(ch)}),
	}
	rapid.Check(t, func(rt *rapid.T) {
		dir := hostcopy.Direction(rapid.IntRange(0, 1).Draw(rt, "dir"))
		blen := rapid.Uint64Range(1, 300).Draw(rt, "blockLen")
		stride := blen + rapid.Uint64Range(0, 40).Draw(rt, "gap")
		if rapid.Bool().Draw(rt, "solid") {
			stride = blen
		}
		group := rapid.Uint32Range(1, 3).Draw(rt, "group")
		groups := rapid.IntRange(1, 12).Draw(rt, "groups")
		blocks := uint64(groups)*uint64(group) + rapid.Uint64Range(0, 20).Draw(rt, "spare")
		regions := rapid.IntRange(1, 3).Draw(rt, "regions")
		extent := (blocks-1)*stride + blen
		base := ext.Desc().Addr + rapid.Uint64Range(0, 63).Draw(rt, "skew")
		p := transfer.Pool{BlockLen: blen, Stride: stride, Blocks: blocks, Kind: transfer.Host}
		for r := range regions {
			p.Regions = append(p.Regions, base+uint64(r)*(extent+7))
		}
		// Segments: cut each block of the group into pieces, keep some, in
		// a random order.
		var segs []transfer.Segment
		for b := range group {
			for off := uint64(0); off < blen; {
				n := rapid.Uint64Range(1, blen-off).Draw(rt, "seg len")
				if rapid.IntRange(0, 3).Draw(rt, "keep") > 0 {
					segs = append(segs, transfer.Segment{Block: b, Off: uint32(off), Len: uint32(n)})
				}
				off += n
			}
		}
		if len(segs) == 0 {
			segs = append(segs, transfer.Segment{Len: uint32(blen)})
		}
		perm := rapid.Permutation(segs).Draw(rt, "order")
		shape := transfer.Shape{Group: group, Segs: perm}
		n := groups * int(group)
		ids := rapid.SliceOfNDistinct(rapid.Uint32Range(0, uint32(blocks-1)), n, n, rapid.ID[uint32]).Draw(rt, "ids")
		c := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: p, IDs: ids}, RegionOff: rapid.Uint64Range(0, 100).Draw(rt, "regionOff")}, Shape: shape}
		units := c.Units()
		c.First = rapid.Uint64Range(0, units-1).Draw(rt, "first")
		c.Count = rapid.Uint64Range(1, units-c.First).Draw(rt, "count")
		region := transfer.Desc{Addr: regionB.Desc().Addr, Len: c.RegionOff + c.Bytes() + rapid.Uint64Range(0, 50).Draw(rt, "slack"), Kind: transfer.Host}
		if err := c.Check(region.Len); err != nil {
			rt.Fatalf("check: %v", err)
		}

		fill(ext.Bytes(), rapid.Uint64().Draw(rt, "seedExt"))
		fill(regionB.Bytes(), rapid.Uint64().Draw(rt, "seedRegion"))
		wantExt, wantRegion := bytes.Clone(ext.Bytes()), bytes.Clone(regionB.Bytes())
		c.Runs(func(addr, off, k uint64) bool {
			eo := addr - ext.Desc().Addr
			if dir == hostcopy.Gather {
				copy(wantRegion[off:off+k], wantExt[eo:eo+k])
			} else {
				copy(wantExt[eo:eo+k], wantRegion[off:off+k])
			}
			return true
		})
		op, err := engines[dir].SubmitShaped(region, c)
		if err != nil {
			rt.Fatalf("submit: %v", err)
		}
		mustDone(t, op, ch)
		if !bytes.Equal(ext.Bytes(), wantExt) || !bytes.Equal(regionB.Bytes(), wantRegion) {
			rt.Fatalf("%v: bytes differ from the model", dir)
		}
	})
}

// TestSubmitShapedRefuses: a unit range past the table, an id past the
// pool, a segment past the block and a region too small are refused before
// any byte moves.
func TestSubmitShapedRefuses(t *testing.T) {
	reg := &mem.Registry{}
	ext := buffer(t, reg, 1<<16)
	regionB := buffer(t, reg, 1<<12)
	ch := make(chan struct{}, 1)
	e := newEngine(t, hostcopy.Scatter, hostcopy.Settings{Registry: reg, Workers: 1, Notify: hostcopy.Signal(ch)})
	p := transfer.Pool{Regions: []uint64{ext.Desc().Addr}, BlockLen: 64, Stride: 64, Blocks: 8, Kind: transfer.Host}
	region := regionB.Desc()
	good := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: p, IDs: []uint32{1, 2}}, Count: 1}, Shape: transfer.Shape{Group: 2, Segs: []transfer.Segment{{Block: 1, Off: 32, Len: 32}}}}
	fill(ext.Bytes(), 1)
	before := bytes.Clone(ext.Bytes())
	for name, edit := range map[string]func(c *transfer.ShapedCopy){
		"units":  func(c *transfer.ShapedCopy) { c.Count = 2 },
		"id":     func(c *transfer.ShapedCopy) { c.Blocks.IDs = []uint32{1, 8} },
		"seg":    func(c *transfer.ShapedCopy) { c.Shape.Segs = []transfer.Segment{{Block: 0, Off: 40, Len: 32}} },
		"group":  func(c *transfer.ShapedCopy) { c.Blocks.IDs = []uint32{1, 2, 3} },
		"region": func(c *transfer.ShapedCopy) { c.RegionOff = region.Len - 8 },
	} {
		c := good
		c.Shape.Segs = append([]transfer.Segment(nil), good.Shape.Segs...)
		edit(&c)
		if _, err := e.SubmitShaped(region, c); !errors.Is(err, transfer.ErrOutOfBounds) {
			t.Fatalf("%s: err %v, want ErrOutOfBounds", name, err)
		}
	}
	if !bytes.Equal(ext.Bytes(), before) {
		t.Fatal("a refused copy wrote the pool")
	}
	op, err := e.SubmitShaped(region, good)
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op, ch)
	if bytes.Equal(ext.Bytes(), before) {
		t.Fatal("the good copy wrote nothing")
	}
}

// BenchmarkShapedScatter scatters 8 MiB chunks of Llama-3.1-70B TP=8 blocks
// into TP=4 NHD blocks (16 pieces of 256 B a 4 KiB unit, every other 256 B
// of an 8 KiB block: the conversion's scatter) next to the same bytes as
// whole 4 KiB blocks (SubmitBlocks), alternating; "converted/whole" is the
// ratio of their throughputs.
func BenchmarkShapedScatter(b *testing.B) {
	reg := &mem.Registry{}
	const units, blen = 2048, 4096
	ext := buffer(b, reg, 2*units*2*blen)
	regionB := buffer(b, reg, units*blen)
	ch := make(chan struct{}, 1)
	e := newEngine(b, hostcopy.Scatter, hostcopy.Settings{Registry: reg, Workers: 4, Notify: hostcopy.Signal(ch)})
	ids := make([]uint32, units)
	for i := range ids {
		ids[i] = uint32((i * 7919) % units) // fragmented
	}
	base := ext.Desc().Addr
	wide := transfer.Pool{Regions: []uint64{base}, BlockLen: 2 * blen, Stride: 2 * blen, Blocks: units, Kind: transfer.Host}
	whole := transfer.Pool{Regions: []uint64{base}, BlockLen: blen, Stride: blen, Blocks: units, Kind: transfer.Host}
	var segs []transfer.Segment
	for t := range uint32(16) {
		segs = append(segs, transfer.Segment{Off: t*512 + 256, Len: 256})
	}
	shaped := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: wide, IDs: ids}, Count: units}, Shape: transfer.Shape{Group: 1, Segs: segs}}
	plain := transfer.BlockCopy{Blocks: transfer.Blocks{Pool: whole, IDs: ids}, Count: units}
	region := regionB.Desc()
	fill(ext.Bytes(), 1) // no first-touch faults in the timings
	fill(regionB.Bytes(), 2)
	var tShaped, tWhole time.Duration
	b.SetBytes(units * blen)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		op, err := e.SubmitShaped(region, shaped)
		if err != nil {
			b.Fatal(err)
		}
		mustDone(b, op, ch)
		tShaped += time.Since(start)
		start = time.Now()
		op, err = e.SubmitBlocks(region, plain)
		if err != nil {
			b.Fatal(err)
		}
		mustDone(b, op, ch)
		tWhole += time.Since(start)
	}
	b.ReportMetric(float64(tWhole)/float64(tShaped), "converted/whole")
}
