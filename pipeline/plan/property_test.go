package plan

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/transfer"
)

// drawLayout places descriptors of the given lengths in one address space
// starting at base and returns their addresses and the space's size. Modes:
// packed back to back, a uniform gap, or random gaps in shuffled order.
func drawLayout(t *rapid.T, label string, base uint64, lens []uint64) ([]uint64, uint64) {
	mode := rapid.SampledFrom([]string{"packed", "uniform", "shuffled"}).Draw(t, label+".mode")
	order := make([]int, len(lens))
	for i := range order {
		order[i] = i
	}
	gap := uint64(0)
	switch mode {
	case "uniform":
		gap = rapid.Uint64Range(0, 100).Draw(t, label+".gap")
	case "shuffled":
		order = rapid.Permutation(order).Draw(t, label+".order")
	}
	addrs := make([]uint64, len(lens))
	pos := uint64(0)
	for _, i := range order {
		if mode == "shuffled" {
			gap = rapid.Uint64Range(0, 40).Draw(t, label+".gap")
		}
		addrs[i] = base + pos
		pos += lens[i] + gap
	}
	return addrs, pos
}

// roundTrip runs a plan over plain memory: gather every chunk from srcMem
// into a fresh region buffer, scatter it into dstMem. It fails on any copy
// outside the region or the memories, on gather copies that overlap, on
// scatter copies that read region bytes no gather wrote, and when the
// copies do not move exactly each chunk's payload.
func roundTrip(t *rapid.T, p *Plan, srcMem, dstMem []byte) {
	for _, c := range p.Chunks {
		region := make([]byte, c.Bytes)
		written := make([]bool, c.Bytes)
		var gathered, scattered uint64
		for _, r := range c.Gather {
			for j := uint64(0); j < r.Count; j++ {
				reg, addr := r.RegionOff+j*r.RegionStride, r.Addr+j*r.AddrStride
				if r.Count == 1 {
					reg, addr = r.RegionOff, r.Addr
				}
				if reg+r.Len > c.Bytes || addr < srcBase || addr-srcBase+r.Len > uint64(len(srcMem)) {
					t.Fatalf("chunk %d gather copy %+v #%d out of bounds", c.Index, r, j)
				}
				for b := uint64(0); b < r.Len; b++ {
					if written[reg+b] {
						t.Fatalf("chunk %d: region byte %d gathered twice", c.Index, reg+b)
					}
					written[reg+b] = true
				}
				copy(region[reg:reg+r.Len], srcMem[addr-srcBase:])
				gathered += r.Len
			}
		}
		for _, r := range c.Scatter {
			for j := uint64(0); j < r.Count; j++ {
				reg, addr := r.RegionOff+j*r.RegionStride, r.Addr+j*r.AddrStride
				if r.Count == 1 {
					reg, addr = r.RegionOff, r.Addr
				}
				if reg+r.Len > c.Bytes || addr < dstBase || addr-dstBase+r.Len > uint64(len(dstMem)) {
					t.Fatalf("chunk %d scatter copy %+v #%d out of bounds", c.Index, r, j)
				}
				for b := uint64(0); b < r.Len; b++ {
					if !written[reg+b] {
						t.Fatalf("chunk %d: scatter reads region byte %d no gather wrote", c.Index, reg+b)
					}
				}
				copy(dstMem[addr-dstBase:], region[reg:reg+r.Len])
				scattered += r.Len
			}
		}
		if gathered != c.Payload || scattered != c.Payload {
			t.Fatalf("chunk %d: gathered %d, scattered %d, payload %d", c.Index, gathered, scattered, c.Payload)
		}
	}
}

// TestPlanRoundTrip: for random descriptor sets, options and layouts, the
// plan (merged and unmerged) moves every source byte to its destination and
// nothing else, and passes the structural verifier.
func TestPlanRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxChunk := rapid.OneOf(rapid.Uint64Range(1, 64), rapid.Uint64Range(64, 1024)).Draw(t, "maxChunk")
		minChunk := rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64Range(1, maxChunk+1)).Draw(t, "minChunk")
		align := rapid.SampledFrom([]uint64{0, 1, 2, 8, 32, 64, 512}).Draw(t, "align")
		// A DATA limit as the wire codec sizes runs (25 and 49 bytes).
		var lim ScatterLimit
		if rapid.Bool().Draw(t, "limitRuns") {
			lim = ScatterLimit{Bytes: rapid.IntRange(49, 400).Draw(t, "limitBytes"), Single: 25, Strided: 49}
		}
		lenGen := rapid.OneOf(
			rapid.Just(uint64(0)),
			rapid.Uint64Range(1, 40),
			rapid.SampledFrom([]uint64{32, 64, 128, maxChunk, maxChunk + 1}),
			rapid.Uint64Range(1, 3*maxChunk),
		)
		lens := rapid.SliceOfN(lenGen, 0, 60).Draw(t, "lens")
		srcAddrs, srcSize := drawLayout(t, "src", srcBase, lens)
		dstAddrs, dstSize := drawLayout(t, "dst", dstBase, lens)
		src := make([]transfer.Desc, len(lens))
		dst := make([]transfer.Desc, len(lens))
		var sdev, ddev int32
		var skind transfer.MemKind
		for i, n := range lens {
			if rapid.IntRange(0, 7).Draw(t, "devChange") == 0 {
				sdev = int32(rapid.IntRange(0, 1).Draw(t, "srcDev"))
				ddev = int32(rapid.IntRange(0, 1).Draw(t, "dstDev"))
				skind = transfer.MemKind(rapid.IntRange(0, 1).Draw(t, "srcKind"))
			}
			src[i] = transfer.Desc{Addr: srcAddrs[i], Len: n, Device: sdev, Kind: skind}
			dst[i] = transfer.Desc{Addr: dstAddrs[i], Len: n, Device: ddev, Kind: transfer.CUDA}
		}
		srcMem := make([]byte, srcSize)
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 7))
		for i := range srcMem {
			srcMem[i] = byte(1 + rng.IntN(255))
		}
		want := make([]byte, dstSize)
		for i := range lens {
			copy(want[dst[i].Addr-dstBase:], srcMem[src[i].Addr-srcBase:src[i].End()-srcBase])
		}

		var plans [2]*Plan
		for i, noMerge := range []bool{false, true} {
			opt := Options{MaxChunk: maxChunk, MinChunk: minChunk, Align: align, NoMerge: noMerge, Scatter: lim}
			p, err := Build(src, dst, opt)
			if err != nil {
				t.Fatalf("Build(NoMerge=%v): %v", noMerge, err)
			}
			if err := verifyPlan(p, src, dst, opt); err != nil {
				t.Fatalf("NoMerge=%v: %v", noMerge, err)
			}
			got := make([]byte, dstSize)
			roundTrip(t, p, srcMem, got)
			if !bytes.Equal(got, want) {
				for j := range got {
					if got[j] != want[j] {
						t.Fatalf("NoMerge=%v: destination byte %d is %d, want %d", noMerge, j, got[j], want[j])
					}
				}
			}
			for _, c := range p.Chunks {
				for _, runs := range [][]transfer.Run{c.Gather, c.Scatter} {
					if n, err := CheckRuns(runs, c.Bytes); err != nil || n != c.Payload {
						t.Fatalf("CheckRuns(chunk %d) = %d, %v; payload %d", c.Index, n, err, c.Payload)
					}
				}
			}
			plans[i] = p
		}
		merged, plain := plans[0], plans[1]
		if lim.Bytes > 0 {
			// Unmerged runs fill a DATA sooner, so the two plans' chunks
			// differ; merging can only need fewer of them.
			if len(merged.Chunks) > len(plain.Chunks) {
				t.Fatalf("merged plan has %d chunks, unmerged %d", len(merged.Chunks), len(plain.Chunks))
			}
			return
		}
		if len(merged.Chunks) != len(plain.Chunks) || merged.Descs != plain.Descs || merged.Payload != plain.Payload {
			t.Fatalf("merging changed the plan's shape")
		}
		for i := range merged.Chunks {
			m, p := merged.Chunks[i], plain.Chunks[i]
			if m.Bytes != p.Bytes || m.Payload != p.Payload || m.Descs != p.Descs || len(m.Gather) > len(p.Gather) || len(m.Scatter) > len(p.Scatter) {
				t.Fatalf("chunk %d: merged %d/%d/%d with %d+%d runs, unmerged %d/%d/%d with %d+%d runs", i,
					m.Bytes, m.Payload, m.Descs, len(m.Gather), len(m.Scatter), p.Bytes, p.Payload, p.Descs, len(p.Gather), len(p.Scatter))
			}
			if got := Coalesce(p.Gather); len(got) != len(m.Gather) {
				t.Fatalf("chunk %d: Coalesce of unmerged gather gives %d runs, Build merged to %d", i, len(got), len(m.Gather))
			}
		}
	})
}

// TestLayoutFillMatchesBuild checks that Layout decides exactly Build's
// chunks with no runs emitted, and that filling its chunks in any order
// gives Build's plan run for run (TestPlanRoundTrip checks Build itself
// against the specification). Half the checks fill from a RunPool shared by
// all of them, so arrays come back holding earlier plans' runs: a pooled
// fill must equal a fresh one all the same.
func TestLayoutFillMatchesBuild(t *testing.T) {
	var pool RunPool
	rapid.Check(t, func(t *rapid.T) {
		pooled := rapid.Bool().Draw(t, "pooled")
		maxChunk := rapid.Uint64Range(1, 512).Draw(t, "maxChunk")
		minChunk := rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64Range(1, maxChunk+1)).Draw(t, "minChunk")
		var lim ScatterLimit
		if rapid.Bool().Draw(t, "limitRuns") {
			lim = ScatterLimit{Bytes: rapid.IntRange(49, 400).Draw(t, "limitBytes"), Single: 25, Strided: 49}
		}
		lens := rapid.SliceOfN(rapid.OneOf(rapid.Just(uint64(0)), rapid.Uint64Range(1, 40), rapid.Uint64Range(1, 3*maxChunk)), 0, 60).Draw(t, "lens")
		srcAddrs, _ := drawLayout(t, "src", srcBase, lens)
		dstAddrs, _ := drawLayout(t, "dst", dstBase, lens)
		src := make([]transfer.Desc, len(lens))
		dst := make([]transfer.Desc, len(lens))
		for i, n := range lens {
			src[i] = transfer.Desc{Addr: srcAddrs[i], Len: n, Device: int32(rapid.IntRange(0, 1).Draw(t, "srcDev")) * int32(i%7/6)}
			dst[i] = transfer.Desc{Addr: dstAddrs[i], Len: n, Kind: transfer.CUDA}
		}
		opt := Options{MaxChunk: maxChunk, MinChunk: minChunk, Align: rapid.SampledFrom([]uint64{0, 1, 8, 64}).Draw(t, "align"), NoMerge: rapid.Bool().Draw(t, "noMerge"), Scatter: lim}
		want, err := Build(src, dst, opt)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Layout(src, dst, opt)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Chunks) != len(want.Chunks) || got.Descs != want.Descs || got.Payload != want.Payload {
			t.Fatalf("Layout: %d chunks, %d descs, %d bytes; Build: %d, %d, %d", len(got.Chunks), got.Descs, got.Payload, len(want.Chunks), want.Descs, want.Payload)
		}
		order := make([]int, len(got.Chunks))
		for i := range order {
			order[i] = i
		}
		order = rapid.Permutation(order).Draw(t, "fillOrder")
		for _, k := range order {
			if got.Filled(k) || got.Chunks[k].Scatter != nil {
				t.Fatalf("chunk %d has runs before Fill", k)
			}
			if pooled {
				got.FillFrom(k, &pool)
				got.FillFrom(k, &pool) // idempotent
			} else {
				got.Fill(k)
				got.Fill(k) // idempotent
			}
			if !got.Filled(k) {
				t.Fatalf("chunk %d not filled after Fill", k)
			}
		}
		for k := range want.Chunks {
			w, g := want.Chunks[k], got.Chunks[k]
			if w.Bytes != g.Bytes || w.Payload != g.Payload || w.Descs != g.Descs || w.SrcDevice != g.SrcDevice ||
				!slices.Equal(w.Gather, g.Gather) || !slices.Equal(w.Scatter, g.Scatter) {
				t.Fatalf("chunk %d: Layout+Fill %+v, Build %+v", k, g, w)
			}
			got.RecycleGather(k, &pool)
			got.RecycleScatter(k, &pool)
			if !got.Filled(k) || len(got.Chunks[k].Gather)+len(got.Chunks[k].Scatter) != 0 && pooled {
				t.Fatalf("chunk %d after recycling: filled %v, %d+%d runs", k, got.Filled(k), len(got.Chunks[k].Gather), len(got.Chunks[k].Scatter))
			}
		}
		if got.src != nil || got.dst != nil {
			t.Fatal("a filled plan still holds the caller's descriptors")
		}
	})
}
