package plan

import (
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/transfer"
)

// drawPairs draws a transfer as TestPlanRoundTrip does: lengths around the
// chunk cap, both sides laid out packed, uniformly gapped or shuffled, the
// source's device and kind changing now and then.
func drawPairs(t *rapid.T, maxChunk uint64) (src, dst []transfer.Desc) {
	lens := rapid.SliceOfN(rapid.OneOf(
		rapid.Just(uint64(0)),
		rapid.Uint64Range(1, 40),
		rapid.SampledFrom([]uint64{32, 64, 128, maxChunk, maxChunk + 1}),
		rapid.Uint64Range(1, 3*maxChunk),
	), 0, 60).Draw(t, "lens")
	srcAddrs, _ := drawLayout(t, "src", srcBase, lens)
	dstAddrs, _ := drawLayout(t, "dst", dstBase, lens)
	var dev int32
	var kind transfer.MemKind
	for i, n := range lens {
		if rapid.IntRange(0, 7).Draw(t, "devChange") == 0 {
			dev = int32(rapid.IntRange(0, 1).Draw(t, "dev"))
			kind = transfer.MemKind(rapid.IntRange(0, 1).Draw(t, "kind"))
		}
		src = append(src, transfer.Desc{Addr: srcAddrs[i], Len: n, Device: dev, Kind: kind})
		dst = append(dst, transfer.Desc{Addr: dstAddrs[i], Len: n, Kind: transfer.CUDA})
	}
	return src, dst
}

// TestLayoutIntoMatchesLayout: packing the sources alone into a plan's
// chunk sizes gives every chunk the pieces, payload, region offsets and
// gather runs the plan has, whatever ramp, scatter limit and merging the
// plan was made with, and piece ranges that are PieceRanges of the plan.
func TestLayoutIntoMatchesLayout(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxChunk := rapid.OneOf(rapid.Uint64Range(1, 64), rapid.Uint64Range(64, 1024)).Draw(t, "maxChunk")
		minChunk := rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64Range(1, maxChunk+1)).Draw(t, "minChunk")
		align := rapid.SampledFrom([]uint64{0, 1, 2, 8, 32, 64, 512}).Draw(t, "align")
		noMerge := rapid.Bool().Draw(t, "noMerge")
		var lim ScatterLimit
		if rapid.Bool().Draw(t, "limitRuns") {
			lim = ScatterLimit{Bytes: rapid.IntRange(49, 400).Draw(t, "limitBytes"), Single: 25, Strided: 49}
		}
		src, dst := drawPairs(t, maxChunk)
		p, err := Layout(src, dst, Options{MaxChunk: maxChunk, MinChunk: minChunk, Align: align, NoMerge: noMerge, Scatter: lim})
		if err != nil {
			t.Fatal(err)
		}
		sizes := make([]uint64, len(p.Chunks))
		for k, c := range p.Chunks {
			sizes[k] = c.Bytes
		}
		ranges := p.PieceRanges()
		q, err := LayoutInto(src, sizes, Options{MaxChunk: maxChunk, Align: align, NoMerge: noMerge})
		if err != nil {
			t.Fatalf("LayoutInto of Layout's sizes %v: %v", sizes, err)
		}
		if len(q.Chunks) != len(p.Chunks) || q.Payload != p.Payload || q.Descs != p.Descs {
			t.Fatalf("LayoutInto: %d chunks, %d bytes, %d descriptors; Layout %d, %d, %d", len(q.Chunks), q.Payload, q.Descs, len(p.Chunks), p.Payload, p.Descs)
		}
		p.FillAll()
		q.FillAll()
		for k := range p.Chunks {
			pc, qc := &p.Chunks[k], &q.Chunks[k]
			if qc.Bytes != pc.Bytes || qc.Payload != pc.Payload || qc.Descs != pc.Descs || qc.SrcDevice != pc.SrcDevice || qc.SrcKind != pc.SrcKind {
				t.Fatalf("chunk %d: LayoutInto %+v, Layout %+v", k, *qc, *pc)
			}
			if !slices.Equal(qc.Gather, pc.Gather) {
				t.Fatalf("chunk %d: gather runs\n LayoutInto %v\n Layout     %v", k, qc.Gather, pc.Gather)
			}
			if qc.Scatter != nil {
				t.Fatalf("chunk %d: LayoutInto emitted scatter runs %v", k, qc.Scatter)
			}
			if qc.First != ranges[k][0] || qc.Count != ranges[k][1] {
				t.Fatalf("chunk %d: piece range [%d,+%d), Layout's %v", k, qc.First, qc.Count, ranges[k])
			}
		}
	})
}

// TestLayoutIntoNeverPassesAChunk: for any sizes (a hostile or mistaken
// peer's), LayoutInto either refuses or packs every source byte once,
// every gather run inside its chunk's size, every chunk ending exactly at
// its size.
func TestLayoutIntoNeverPassesAChunk(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxChunk := rapid.Uint64Range(1, 256).Draw(t, "maxChunk")
		align := rapid.SampledFrom([]uint64{1, 8, 32}).Draw(t, "align")
		src, _ := drawPairs(t, maxChunk)
		sizes := rapid.SliceOfN(rapid.Uint64Range(1, maxChunk), 0, 30).Draw(t, "sizes")
		q, err := LayoutInto(src, sizes, Options{MaxChunk: maxChunk, Align: align})
		if err != nil {
			return
		}
		var want uint64
		for _, s := range src {
			want += s.Len
		}
		q.FillAll()
		var got uint64
		for k, c := range q.Chunks {
			var end uint64
			for _, r := range c.Gather {
				if e := r.RegionOff + (r.Count-1)*r.RegionStride + r.Len; e > end {
					end = e
				}
				got += r.Len * r.Count
			}
			if end != sizes[k] || c.Bytes != sizes[k] {
				t.Fatalf("chunk %d: runs end at %d, Bytes %d, size %d", k, end, c.Bytes, sizes[k])
			}
		}
		if got != want || len(q.Chunks) != len(sizes) {
			t.Fatalf("packed %d of %d bytes in %d of %d chunks", got, want, len(q.Chunks), len(sizes))
		}
	})
}

// TestLayoutIntoRefusals: sizes the sources do not fill as Layout would
// are refused, naming the chunk.
func TestLayoutIntoRefusals(t *testing.T) {
	d := func(addr, n uint64, dev int32) transfer.Desc { return transfer.Desc{Addr: addr, Len: n, Device: dev} }
	src := []transfer.Desc{d(0x1000, 64, 0), d(0x2000, 64, 0), d(0x3000, 64, 1)}
	opt := Options{MaxChunk: 256, Align: 32}
	for _, c := range []struct {
		name  string
		src   []transfer.Desc
		sizes []uint64
		want  string
	}{
		{"short chunk", src, []uint64{100, 64}, "chunk 0 ends at 64 bytes where descriptor 1 does not fit, short of its 100"},
		{"device inside a chunk", src, []uint64{192}, "chunk 0 ends at 128 bytes where descriptor 2 changes device"},
		{"too few chunks", src, []uint64{128}, "descriptor 2: the sources outlast the 1 chunks"},
		{"too many chunks", src, []uint64{128, 64, 64}, "the sources fill 2 of the 3 chunks"},
		{"sources end short", src[:1], []uint64{96}, "the sources end at 64 bytes of chunk 0, short of its 96"},
		{"size over max", src, []uint64{512}, "chunk 0 has 512 bytes; accepted 1..256"},
		{"size 0", src, []uint64{0}, "chunk 0 has 0 bytes"},
		{"wraps", []transfer.Desc{d(^uint64(0)-8, 64, 0)}, []uint64{64}, "wraps the address space"},
	} {
		_, err := LayoutInto(c.src, c.sizes, opt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.want)
		}
	}
	// The right sizes for the same sources: 64 + pad to 64 + 64, then the device change.
	q, err := LayoutInto(src, []uint64{128, 64}, opt)
	if err != nil || len(q.Chunks) != 2 || q.Chunks[1].First != 2 || q.Chunks[1].Count != 1 || q.Chunks[1].SrcDevice != 1 {
		t.Fatalf("LayoutInto: %+v, %v", q, err)
	}
}

// TestTakeScatter: the runs taken are the chunk's, the chunk keeps none
// and stays filled, and recycling its scatter afterwards hands nothing
// back to the pool (the caller owns the runs).
func TestTakeScatter(t *testing.T) {
	src := []transfer.Desc{{Addr: 0x1000, Len: 64}, {Addr: 0x3000, Len: 64}}
	dst := []transfer.Desc{{Addr: 0x9000, Len: 64}, {Addr: 0xa000, Len: 64}}
	p, err := Layout(src, dst, Options{MaxChunk: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var pool RunPool
	p.FillFrom(0, &pool)
	want := slices.Clone(p.Chunks[0].Scatter)
	got := p.TakeScatter(0)
	if !slices.Equal(got, want) || len(got) == 0 {
		t.Fatalf("took %v, want the chunk's runs %v", got, want)
	}
	if len(p.Chunks[0].Scatter) != 0 || !p.Filled(0) {
		t.Fatalf("after the take: scatter %v, filled %v", p.Chunks[0].Scatter, p.Filled(0))
	}
	p.RecycleScatter(0, &pool)
	if len(pool.free) != 0 {
		t.Fatalf("the pool got %d arrays back after the runs were taken", len(pool.free))
	}
}

// TestPieceRangesOfBlockPlan: a block-table plan's piece ranges are its
// chunks' First and Count (a pull checks its DATAs against either form's
// PieceRanges), and ChunkBytes its chunks' sizes.
func TestPieceRangesOfBlockPlan(t *testing.T) {
	pool := transfer.Pool{BlockLen: 4096, Stride: 4096, Blocks: 64, Kind: transfer.Host, Regions: []uint64{0x100000, 0x200000}}
	ids := make([]uint32, 40)
	for i := range ids {
		ids[i] = uint32(63 - i)
	}
	b := transfer.Blocks{Pool: pool, IDs: ids}
	p, err := LayoutBlocks(b, b, Options{MaxChunk: 16 << 10, MinChunk: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Chunks) < 3 {
		t.Fatalf("%d chunks: want several", len(p.Chunks))
	}
	ranges, sizes := p.PieceRanges(), p.ChunkBytes()
	for k, c := range p.Chunks {
		if ranges[k] != [2]uint64{c.First, c.Count} || sizes[k] != c.Bytes {
			t.Fatalf("chunk %d: range %v, size %d; the chunk's [%d, +%d), %d", k, ranges[k], sizes[k], c.First, c.Count, c.Bytes)
		}
	}
}
