package gpucopy_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/stages/gpucopy"
	"github.com/bouncekv/bounce/transfer"
)

// The conversion shapes of issue 28, for heads of piece bytes a token
// (head size × element size) and blocks of tokens tokens.

// tpPart is the shape of rank part of parts in a TP merge (or split) of
// head-major blocks: the part-th of parts equal slices of a block, whole
// heads one after the other.
func tpPart(blockLen uint32, part, parts uint32) transfer.Shape {
	n := blockLen / parts
	return transfer.Shape{Group: 1, Segs: []transfer.Segment{{Off: part * n, Len: n}}}
}

// nhdHead is the shape of head h of a token-major (NHD) block of heads
// heads, in token order: the pieces a head-major one-head block of a TP
// rank is made of (the 256 B interleave of NHD↔HND at 128 × fp16).
func nhdHead(tokens, heads, piece, h uint32) transfer.Shape {
	s := transfer.Shape{Group: 1}
	for t := range tokens {
		s.Segs = append(s.Segs, transfer.Segment{Off: (t*heads + h) * piece, Len: piece})
	}
	return s
}

// hndAsNHD reads a head-major block of heads heads in token-major order:
// the whole-block permutation HND → NHD.
func hndAsNHD(tokens, heads, piece uint32) transfer.Shape {
	s := transfer.Shape{Group: 1}
	for t := range tokens {
		for h := range heads {
			s.Segs = append(s.Segs, transfer.Segment{Off: (h*tokens + t) * piece, Len: piece})
		}
	}
	return s
}

// mergeBlocks is the block-size change of head-major blocks: groups of
// two blocks of heads heads × tokens tokens read as one block of twice
// the tokens (each head's two halves one after the other).
func mergeBlocks(tokens, heads, piece uint32) transfer.Shape {
	s := transfer.Shape{Group: 2}
	per := tokens * piece
	for h := range heads {
		for b := range uint32(2) {
			s.Segs = append(s.Segs, transfer.Segment{Block: b, Off: h * per, Len: per})
		}
	}
	return s
}

// shapeRig is a pool and a bounce region inside registered buffers of
// fixed size (the tests draw geometries that fit).
type shapeRig struct {
	poolMem, regionMem transfer.Desc
}

const (
	rigPool   = 32 << 20
	rigRegion = 16 << 20
)

func newShapeRig(t *testing.T, f *fixture, c *cuda.Context, hostPool, hostRegion bool) shapeRig {
	t.Helper()
	alloc := func(host bool, n uint64) transfer.Desc {
		if host {
			d, _ := cudatest.Pinned(t, c, n)
			return d
		}
		return cudatest.Device(t, c, n)
	}
	r := shapeRig{poolMem: alloc(hostPool, rigPool), regionMem: alloc(hostRegion, rigRegion)}
	for _, d := range []transfer.Desc{r.poolMem, r.regionMem} {
		if err := f.reg.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []transfer.Desc{r.poolMem, r.regionMem} {
			if err := f.reg.Remove(d); err != nil {
				t.Errorf("remove %v: %v", d, err)
			}
		}
	})
	return r
}

// shapedCase is one shaped request against a rig: the pool (regions at
// offsets of the pool buffer), its ids, the shape, the bounce region's
// offset in the region buffer and the chunks' unit counts.
type shapedCase struct {
	pool      transfer.Pool // Regions relative to the pool buffer
	ids       []uint32
	shape     transfer.Shape
	regionOff uint64 // of the bounce region in the region buffer
	chunks    []uint64
}

// units is the request's units.
func (sc shapedCase) units() uint64 {
	return uint64(len(sc.pool.Regions)) * uint64(len(sc.ids)) / uint64(sc.shape.Group)
}

// run submits the case chunk by chunk on eng, applies the same copies to
// host images of the two buffers by ShapedCopy.Runs, and compares every
// byte of the spans used (guards around and between the segments too).
// It returns a description of the first difference, or "".
func (r shapeRig) run(t *testing.T, f *fixture, c *cuda.Context, eng *gpucopy.Engine, gather bool, sc shapedCase, seed uint64) string {
	t.Helper()
	pool := sc.pool
	pool.Regions = make([]uint64, len(sc.pool.Regions))
	var poolSpan uint64
	for i, o := range sc.pool.Regions {
		pool.Regions[i] = r.poolMem.Addr + o
		poolSpan = max(poolSpan, o+(pool.Blocks-1)*pool.Stride+pool.BlockLen)
	}
	total := sc.units() * sc.shape.UnitLen()
	regionSpan := sc.regionOff + total + 64
	if poolSpan+64 > r.poolMem.Len || regionSpan > r.regionMem.Len {
		t.Fatalf("case needs %d pool and %d region bytes; the rig has %d and %d", poolSpan+64, regionSpan, r.poolMem.Len, r.regionMem.Len)
	}
	poolD := transfer.Desc{Addr: r.poolMem.Addr, Len: poolSpan + 64, Kind: r.poolMem.Kind, Device: r.poolMem.Device}
	regD := transfer.Desc{Addr: r.regionMem.Addr, Len: regionSpan, Kind: r.regionMem.Kind, Device: r.regionMem.Device}
	poolB := cudatest.Fill(t, c, poolD, seed)
	regionB := cudatest.Fill(t, c, regD, seed+1)
	region := transfer.Desc{Addr: r.regionMem.Addr + sc.regionOff, Len: total, Kind: r.regionMem.Kind, Device: r.regionMem.Device}
	blocks := transfer.Blocks{Pool: pool, IDs: sc.ids}
	var ops []transfer.Op
	first := uint64(0)
	for _, n := range sc.chunks {
		cp := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: blocks, First: first, Count: n, RegionOff: first * sc.shape.UnitLen()}, Shape: sc.shape}
		if err := cp.Check(region.Len); err != nil {
			t.Fatalf("case chunk at %d: %v", first, err)
		}
		op, err := eng.SubmitShaped(region, cp)
		if errors.Is(err, transfer.ErrBusy) {
			for _, o := range ops {
				cudatest.Finish(t, o)
			}
			ops = ops[:0]
			op, err = eng.SubmitShaped(region, cp)
		}
		if err != nil {
			t.Fatalf("chunk at %d: %v", first, err)
		}
		ops = append(ops, op)
		cp.Runs(func(addr, off, n uint64) bool {
			po, ro := addr-r.poolMem.Addr, sc.regionOff+off
			if gather {
				copy(regionB[ro:ro+n], poolB[po:po+n])
			} else {
				copy(poolB[po:po+n], regionB[ro:ro+n])
			}
			return true
		})
		first += n
	}
	for _, o := range ops {
		cudatest.Finish(t, o)
	}
	if d := cudatest.Diff(cudatest.Read(t, c, regD), regionB); d != "" {
		return "region buffer: " + d
	}
	if d := cudatest.Diff(cudatest.Read(t, c, poolD), poolB); d != "" {
		return "pool buffer: " + d
	}
	if n := f.reg.Pinned(); n != 0 {
		return fmt.Sprintf("%d ranges pinned after release", n)
	}
	return ""
}

// conversionCases are the shapes of issue 28's conversions at the sizes
// of llama70b (128 × fp16 heads, 16-token blocks) and gpt-oss (64 × bf16),
// on pools of two regions (K and V), chunked unevenly.
func conversionCases() map[string]shapedCase {
	ids := func(n, blocks int, seed uint64) []uint32 {
		perm := rand.New(rand.NewPCG(seed, 3)).Perm(blocks)
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(perm[i])
		}
		return out
	}
	pool := func(blockLen, stride, blocks uint64) transfer.Pool {
		return transfer.Pool{Regions: []uint64{64, 64 + blocks*stride + 4096}, BlockLen: blockLen, Stride: stride, Blocks: blocks, Kind: transfer.CUDA}
	}
	cs := map[string]shapedCase{
		// Decode rank (2 heads, 8 KiB HND blocks) of a TP 8 -> 4 merge:
		// prefill rank 1's half.
		"tp-merge-half-8KiB": {pool: pool(8192, 8192, 300), ids: ids(200, 300, 1), shape: tpPart(8192, 1, 2), chunks: []uint64{128, 200, 72}},
		// The same at 4 heads per block, a quarter (split TP 4 -> 16).
		"tp-quarter-16KiB": {pool: pool(16384, 16384, 100), ids: ids(90, 100, 2), shape: tpPart(16384, 2, 4), chunks: []uint64{90, 90}},
		// NHD decode block of 2 heads: prefill rank 0's head, 16 × 256 B.
		"nhd-head0-256B": {pool: pool(8192, 8192, 300), ids: ids(256, 300, 3), shape: nhdHead(16, 2, 256, 0), chunks: []uint64{100, 300, 112}},
		"nhd-head1-256B": {pool: pool(8192, 8192, 300), ids: ids(256, 300, 4), shape: nhdHead(16, 2, 256, 1), chunks: []uint64{512}},
		// The whole-block permutation HND -> NHD, 2 heads × 16 × 256 B.
		"hnd-as-nhd-256B": {pool: pool(8192, 8192, 200), ids: ids(150, 200, 5), shape: hndAsNHD(16, 2, 256), chunks: []uint64{150, 150}},
		// gpt-oss: 64 × bf16 = 128 B pieces, 2 KiB halves of 4 KiB blocks.
		"gptoss-nhd-head1-128B": {pool: pool(4096, 4096, 400), ids: ids(300, 400, 6), shape: nhdHead(16, 2, 128, 1), chunks: []uint64{256, 256, 88}},
		"gptoss-tp-half-4KiB":   {pool: pool(4096, 4096, 400), ids: ids(300, 400, 7), shape: tpPart(4096, 0, 2), chunks: []uint64{600}},
		// Block size 16 -> 32: groups of two 16-token blocks (1 and 2
		// heads) read as one 32-token block.
		"block16to32-1head": {pool: pool(4096, 4096, 400), ids: ids(300, 400, 8), shape: mergeBlocks(16, 1, 256), chunks: []uint64{100, 100, 100}},
		"block16to32-2head": {pool: pool(8192, 8192, 300), ids: ids(200, 300, 9), shape: mergeBlocks(16, 2, 256), chunks: []uint64{37, 100, 63}},
		// K and V interleaved (stride 2 blocks), unaligned segments
		// (general kernel).
		"interleaved-odd": {pool: pool(8192, 16384, 100), ids: ids(80, 100, 10), shape: transfer.Shape{Group: 2, Segs: []transfer.Segment{{Block: 1, Off: 3, Len: 1000}, {Block: 0, Off: 5000, Len: 3000}, {Block: 1, Off: 7000, Len: 1}}}, chunks: []uint64{11, 29}},
	}
	return cs
}

// TestShapedConversionsByteExact gathers and scatters the real conversion
// shapes on both completions, the ids staged and zero-copy, pools and
// regions in device and pinned host memory, against ShapedCopy.Runs.
func TestShapedConversionsByteExact(t *testing.T) {
	for _, comp := range []gpucopy.Completion{gpucopy.CompletionFlag, gpucopy.CompletionEvent} {
		for _, zero := range []bool{false, true} {
			f, cc := newFixtureWith(t, gpucopy.Settings{Contexts: 3, ZeroCopyTable: zero, Completion: comp})
			c := cc.c
			if !f.g.HasShaped() {
				t.Skip("the kernel module has no shaped kernels")
			}
			for _, m := range []struct{ hostPool, hostRegion bool }{{false, false}, {true, false}, {false, true}} {
				r := newShapeRig(t, f, c, m.hostPool, m.hostRegion)
				for name, sc := range conversionCases() {
					sc.pool.Kind, sc.pool.Device = r.poolMem.Kind, r.poolMem.Device
					sc.regionOff = 16
					for _, gather := range []bool{true, false} {
						eng := f.s
						if gather {
							eng = f.g
						}
						if d := r.run(t, f, c, eng, gather, sc, 7); d != "" {
							t.Errorf("%s %s zero-copy=%v host pool %v host region %v gather=%v: %s", name, comp, zero, m.hostPool, m.hostRegion, gather, d)
						}
					}
				}
			}
			if l := f.g.Launched(); l.Shaped == 0 || l.Runs != 0 {
				t.Errorf("gather launches %+v: want shaped ones only", l)
			}
		}
	}
}

// drawShape draws a shape for blocks of blockLen bytes, disjoint (a
// scatter's bytes land once): each block of the group cut into pieces,
// some kept, in random order; uniform draws pieces of one length.
func drawShape(rt *rapid.T, blockLen uint64, uniform uint64) transfer.Shape {
	g := rapid.Uint32Range(1, 4).Draw(rt, "group")
	s := transfer.Shape{Group: g}
	for b := range g {
		for off := uint64(0); off < blockLen; {
			l := uniform
			if l == 0 {
				l = rapid.Uint64Range(1, min(blockLen-off, 3000)).Draw(rt, "len")
			}
			if off+l > blockLen {
				break
			}
			if rapid.IntRange(0, 2).Draw(rt, "keep") > 0 && len(s.Segs) < 48 {
				s.Segs = append(s.Segs, transfer.Segment{Block: b, Off: uint32(off), Len: uint32(l)})
			}
			off += l
			if uniform == 0 {
				off += rapid.Uint64Range(0, 40).Draw(rt, "gap")
			}
		}
	}
	if len(s.Segs) == 0 {
		s.Segs = append(s.Segs, transfer.Segment{Len: uint32(min(blockLen, max(uniform, 1)))})
	}
	perm := rapid.Permutation(s.Segs).Draw(rt, "order")
	s.Segs = perm
	return s
}

// TestShapedRandomByteExact: random pools, shapes (uniform aligned ones
// that take the vector and bulk kernels, and arbitrary ones), ids and
// chunkings, gathered and scattered, byte-exact against ShapedCopy.Runs,
// more distinct shapes than the engine caches (the rest staged with the
// ids).
func TestShapedRandomByteExact(t *testing.T) {
	f, cc := newFixtureWith(t, gpucopy.Settings{Contexts: 3})
	c := cc.c
	if !f.g.HasShaped() {
		t.Skip("the kernel module has no shaped kernels")
	}
	rigs := []shapeRig{newShapeRig(t, f, c, false, false), newShapeRig(t, f, c, true, false), newShapeRig(t, f, c, false, true)}
	rapid.Check(t, func(rt *rapid.T) {
		r := rigs[rapid.IntRange(0, len(rigs)-1).Draw(rt, "memory")]
		var uniform, blockLen, stride uint64
		var skew uint64
		if rapid.Bool().Draw(rt, "aligned") {
			uniform = uint64(1) << rapid.IntRange(7, 13).Draw(rt, "shift") // 128 B to 8 KiB
			blockLen = uniform * rapid.Uint64Range(1, max(1, 16384/uniform)).Draw(rt, "per")
			stride = blockLen + 16*rapid.Uint64Range(0, 8).Draw(rt, "pad")
		} else {
			blockLen = rapid.Uint64Range(1, 9000).Draw(rt, "blockLen")
			stride = blockLen + rapid.Uint64Range(0, 100).Draw(rt, "pad")
			skew = rapid.Uint64Range(0, 15).Draw(rt, "skew")
		}
		sh := drawShape(rt, blockLen, uniform)
		regions := rapid.IntRange(1, 3).Draw(rt, "regions")
		ulen := sh.UnitLen()
		maxGroups := max(1, min(60, int(rigRegion/4/(ulen*uint64(regions)))))
		ng := rapid.IntRange(1, maxGroups).Draw(rt, "groups")
		nids := ng * int(sh.Group)
		blocks := uint64(nids + rapid.IntRange(0, 20).Draw(rt, "spare"))
		if blocks*stride*uint64(regions) > rigPool-4096 {
			blocks = uint64(nids)
			if blocks*stride*uint64(regions) > rigPool-4096 {
				rt.Skip("pool too large for the rig")
			}
		}
		perm := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 1)).Perm(int(blocks))
		sc := shapedCase{shape: sh, regionOff: 16 + skew}
		for _, b := range perm[:nids] {
			sc.ids = append(sc.ids, uint32(b))
		}
		sc.pool = transfer.Pool{BlockLen: blockLen, Stride: stride, Blocks: blocks, Kind: r.poolMem.Kind, Device: r.poolMem.Device}
		for k := range regions {
			sc.pool.Regions = append(sc.pool.Regions, 32+skew+uint64(k)*(blocks*stride+64))
		}
		for left := sc.units(); left > 0; {
			n := rapid.Uint64Range(1, left).Draw(rt, "chunk")
			sc.chunks = append(sc.chunks, n)
			left -= n
		}
		gather := rapid.Bool().Draw(rt, "gather")
		eng := f.s
		if gather {
			eng = f.g
		}
		if d := r.run(t, f, c, eng, gather, sc, 3); d != "" {
			rt.Fatalf("gather=%v shape %+v pool %+v: %s", gather, sh, sc.pool, d)
		}
	})
}

// TestShapedRefusedBeforeAnyByteMoves: a shape past the block, a segment
// naming a block outside its group, ids not whole groups, an id past the
// pool, units past the table, region bytes past the region and pool
// memory not registered are refused with their error, nothing moves and
// nothing stays pinned.
func TestShapedRefusedBeforeAnyByteMoves(t *testing.T) {
	f, cc := newFixture(t, 2, false)
	c := cc.c
	if !f.g.HasShaped() {
		t.Skip("the kernel module has no shaped kernels")
	}
	r := newShapeRig(t, f, c, false, false)
	unreg := cudatest.Device(t, c, 1<<20)
	pool := transfer.Pool{Regions: []uint64{r.poolMem.Addr, r.poolMem.Addr + 1<<20}, BlockLen: 8192, Stride: 8192, Blocks: 100, Kind: transfer.CUDA, Device: r.poolMem.Device}
	ids := make([]uint32, 64)
	for i := range ids {
		ids[i] = uint32(99 - i)
	}
	bad := func(k int, v uint32) []uint32 {
		x := append([]uint32(nil), ids...)
		x[k] = v
		return x
	}
	notReg := pool
	notReg.Regions = []uint64{unreg.Addr, unreg.Addr + 512<<10}
	notReg.Blocks = 60
	half := tpPart(8192, 1, 2)
	pair := mergeBlocks(16, 2, 256)
	region := transfer.Desc{Addr: r.regionMem.Addr, Len: 1 << 20, Kind: r.regionMem.Kind, Device: r.regionMem.Device}
	mk := func(p transfer.Pool, ids []uint32, s transfer.Shape, first, count, off uint64) transfer.ShapedCopy {
		return transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: p, IDs: ids}, First: first, Count: count, RegionOff: off}, Shape: s}
	}
	cases := []struct {
		name string
		sc   transfer.ShapedCopy
		want error
	}{
		{"segment past the block", mk(pool, ids, transfer.Shape{Group: 1, Segs: []transfer.Segment{{Off: 8000, Len: 200}}}, 0, 10, 0), transfer.ErrOutOfBounds},
		{"segment outside its group", mk(pool, ids, transfer.Shape{Group: 2, Segs: []transfer.Segment{{Block: 2, Len: 16}}}, 0, 10, 0), transfer.ErrOutOfBounds},
		{"no segments", mk(pool, ids, transfer.Shape{Group: 1}, 0, 10, 0), transfer.ErrOutOfBounds},
		{"ids not whole groups", mk(pool, ids[:63], pair, 0, 10, 0), transfer.ErrOutOfBounds},
		{"last id past the pool", mk(pool, bad(63, 100), half, 0, 64, 0), transfer.ErrOutOfBounds},
		{"wrapped id past the pool", mk(pool, bad(1, 1<<30), pair, 30, 4, 0), transfer.ErrOutOfBounds},
		{"units past the table", mk(pool, ids, pair, 60, 5, 0), transfer.ErrOutOfBounds},
		{"region bytes past the region", mk(pool, ids, half, 0, 64, region.Len-4096*63), transfer.ErrOutOfBounds},
		{"pool not registered", mk(notReg, ids[40:], half, 0, 24, 0), transfer.ErrNotRegistered}, // ids 59 down to 36
	}
	for _, cs := range cases {
		for _, eng := range []*gpucopy.Engine{f.g, f.s} {
			poolB := cudatest.Fill(t, c, r.poolMem, 1)
			regionB := cudatest.Fill(t, c, r.regionMem, 2)
			unregB := cudatest.Fill(t, c, unreg, 3)
			op, err := eng.SubmitShaped(region, cs.sc)
			if err == nil {
				cudatest.Finish(t, op)
				t.Fatalf("%s: accepted", cs.name)
			}
			if !errors.Is(err, cs.want) {
				t.Errorf("%s: %v, want %v", cs.name, err, cs.want)
			}
			if err := c.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if d := cudatest.Diff(cudatest.Read(t, c, r.poolMem), poolB); d != "" {
				t.Errorf("%s: pool changed: %s", cs.name, d)
			}
			if d := cudatest.Diff(cudatest.Read(t, c, r.regionMem), regionB); d != "" {
				t.Errorf("%s: region changed: %s", cs.name, d)
			}
			if d := cudatest.Diff(cudatest.Read(t, c, unreg), unregB); d != "" {
				t.Errorf("%s: unregistered memory changed: %s", cs.name, d)
			}
			if n := f.reg.Pinned(); n != 0 {
				t.Errorf("%s: %d ranges pinned", cs.name, n)
			}
			if f.g.Idle() != 2 || f.s.Idle() != 2 {
				t.Errorf("%s: contexts not returned (%d, %d idle)", cs.name, f.g.Idle(), f.s.Idle())
			}
		}
	}
}

// TestShapedBusy: with every context in use SubmitShaped is ErrBusy and
// moves nothing; once one is released it is accepted.
func TestShapedBusy(t *testing.T) {
	f, cc := newFixture(t, 1, false)
	c := cc.c
	if !f.g.HasShaped() {
		t.Skip("the kernel module has no shaped kernels")
	}
	r := newShapeRig(t, f, c, false, false)
	pool := transfer.Pool{Regions: []uint64{r.poolMem.Addr}, BlockLen: 8192, Stride: 8192, Blocks: 64, Kind: transfer.CUDA, Device: r.poolMem.Device}
	ids := []uint32{3, 1, 4, 5}
	region := transfer.Desc{Addr: r.regionMem.Addr, Len: 1 << 16, Kind: r.regionMem.Kind, Device: r.regionMem.Device}
	sc := transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: transfer.Blocks{Pool: pool, IDs: ids}, Count: 4}, Shape: tpPart(8192, 0, 2)}
	op, err := f.g.SubmitShaped(region, sc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.g.SubmitShaped(region, sc); !errors.Is(err, transfer.ErrBusy) {
		t.Fatalf("second submit with one context: %v, want ErrBusy", err)
	}
	cudatest.Finish(t, op)
	deadline := time.Now().Add(10 * time.Second)
	for f.g.Idle() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	op, err = f.g.SubmitShaped(region, sc)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	cudatest.Finish(t, op)
}

// TestShapedSegmentTablesCached: a shape's table is uploaded once (a
// second request of the same shape adds none), the engine keeps at most
// MaxSegTables, and shapes past them are staged with the ids, byte-exact
// both ways.
func TestShapedSegmentTablesCached(t *testing.T) {
	f, cc := newFixture(t, 2, false)
	c := cc.c
	if !f.g.HasShaped() {
		t.Skip("the kernel module has no shaped kernels")
	}
	r := newShapeRig(t, f, c, false, false)
	base := conversionCases()["nhd-head1-256B"]
	base.pool.Kind, base.pool.Device = r.poolMem.Kind, r.poolMem.Device
	for i := range gpucopy.MaxSegTables + 6 {
		sc := base
		// Distinct shapes: head 1's pieces from token i%16 on, then the rest.
		k := i % 16
		sc.shape = transfer.Shape{Group: 1, Segs: append(append([]transfer.Segment(nil), base.shape.Segs[k:]...), base.shape.Segs[:k]...)}
		sc.shape.Segs[0].Len -= uint32(i / 16 * 16)
		for _, gather := range []bool{true, false} {
			eng := f.s
			if gather {
				eng = f.g
			}
			if d := r.run(t, f, c, eng, gather, sc, uint64(i)); d != "" {
				t.Fatalf("shape %d gather=%v: %s", i, gather, d)
			}
		}
		if n := gpucopy.SegTables(f.g); n != min(i+1, gpucopy.MaxSegTables) {
			t.Fatalf("after %d shapes the gather engine keeps %d tables", i+1, n)
		}
	}
	if d := r.run(t, f, c, f.g, true, base, 99); d != "" {
		t.Fatal(d)
	}
}
