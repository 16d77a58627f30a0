package plan

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

const (
	benchDescs = 81920
	benchBlock = 4096
	benchChunk = 32 << 20
)

// benchPairs returns 81,920 4 KiB descriptor pairs (320 MiB) laid out as
// named: "contiguous" (both sides back to back), "strided" (destinations
// every other block) or "fragmented" (both sides random blocks of a pool
// twice the size, like a paged KV cache).
func benchPairs(layout string) (src, dst []transfer.Desc) {
	src = make([]transfer.Desc, benchDescs)
	dst = make([]transfer.Desc, benchDescs)
	rng := rand.New(rand.NewPCG(3, 4))
	srcSlots := rng.Perm(2 * benchDescs)
	dstSlots := rng.Perm(2 * benchDescs)
	for i := range src {
		s, d := uint64(i), uint64(i)
		switch layout {
		case "strided":
			d = 2 * uint64(i)
		case "fragmented":
			s, d = uint64(srcSlots[i]), uint64(dstSlots[i])
		}
		src[i] = transfer.Desc{Addr: srcBase + s*benchBlock, Len: benchBlock, Kind: transfer.CUDA}
		dst[i] = transfer.Desc{Addr: dstBase + d*benchBlock, Len: benchBlock, Device: 1, Kind: transfer.CUDA}
	}
	return src, dst
}

func runCount(p *Plan) (gather, scatter int) {
	for _, c := range p.Chunks {
		gather += len(c.Gather)
		scatter += len(c.Scatter)
	}
	return gather, scatter
}

// BenchmarkBuild plans 81,920 x 4 KiB descriptors with 32 MiB chunks.
func BenchmarkBuild(b *testing.B) {
	for _, layout := range []string{"contiguous", "strided", "fragmented"} {
		for _, noMerge := range []bool{false, true} {
			name := layout
			if noMerge {
				name += "/nomerge"
			}
			b.Run(name, func(b *testing.B) {
				src, dst := benchPairs(layout)
				opt := Options{MaxChunk: benchChunk, NoMerge: noMerge}
				var p *Plan
				b.ReportAllocs()
				for b.Loop() {
					var err error
					if p, err = Build(src, dst, opt); err != nil {
						b.Fatal(err)
					}
				}
				g, s := runCount(p)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchDescs, "ns/desc")
				b.ReportMetric(float64(len(p.Chunks)), "chunks")
				b.ReportMetric(float64(g), "gather-runs")
				b.ReportMetric(float64(s), "scatter-runs")
			})
		}
	}
}

// BenchmarkBuildFragmentedVsContiguous times both layouts side by side and
// reports fragmented / contiguous: the cost of emitting one run per
// descriptor instead of one per chunk.
func BenchmarkBuildFragmentedVsContiguous(b *testing.B) {
	cs, cd := benchPairs("contiguous")
	fs, fd := benchPairs("fragmented")
	opt := Options{MaxChunk: benchChunk}
	var tc, tf time.Duration
	for b.Loop() {
		start := time.Now()
		if _, err := Build(cs, cd, opt); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if _, err := Build(fs, fd, opt); err != nil {
			b.Fatal(err)
		}
		tc += mid.Sub(start)
		tf += time.Since(mid)
	}
	b.ReportMetric(float64(tc.Nanoseconds())/float64(b.N)/benchDescs, "ns/desc-contiguous")
	b.ReportMetric(float64(tf.Nanoseconds())/float64(b.N)/benchDescs, "ns/desc-fragmented")
	b.ReportMetric(float64(tf)/float64(tc), "ratio")
}

// BenchmarkTimeToFirstChunk compares, side by side on 81,920 fragmented
// 4 KiB pairs in 8 MiB chunks, what stands between Submit and the first
// WANT and gather: Build (every chunk's runs) against Layout plus Fill of
// chunk 0 (what the agent does; the other chunks fill as they start). It
// reports both per descriptor and build/layout, the critical path's
// speed-up.
func BenchmarkTimeToFirstChunk(b *testing.B) {
	src, dst := benchPairs("fragmented")
	opt := Options{MaxChunk: 8 << 20}
	var tb, tl time.Duration
	for i := 0; b.Loop(); i++ {
		for _, layout := range [2][2]bool{{false, true}, {true, false}}[i%2] {
			start := time.Now()
			if layout {
				p, err := Layout(src, dst, opt)
				if err != nil {
					b.Fatal(err)
				}
				p.Fill(0)
				tl += time.Since(start)
			} else {
				if _, err := Build(src, dst, opt); err != nil {
					b.Fatal(err)
				}
				tb += time.Since(start)
			}
		}
	}
	b.ReportMetric(float64(tb.Nanoseconds())/float64(b.N)/benchDescs, "ns/desc-build")
	b.ReportMetric(float64(tl.Nanoseconds())/float64(b.N)/benchDescs, "ns/desc-layout+fill0")
	b.ReportMetric(float64(tb)/float64(tl), "build/layout")
}

// BenchmarkFillPooled fills every chunk of 81,920 fragmented 4 KiB pairs
// in 8 MiB chunks the two ways, side by side: fresh arrays per chunk
// (Fill) against arrays drawn from a RunPool and recycled once the chunk is
// done, as the agent does (FillFrom, RecycleGather, RecycleScatter). It
// reports ns per descriptor of each and fresh/pooled.
func BenchmarkFillPooled(b *testing.B) {
	src, dst := benchPairs("fragmented")
	opt := Options{MaxChunk: 8 << 20}
	var pool RunPool
	var tf, tp time.Duration
	for i := 0; b.Loop(); i++ {
		for _, pooled := range [2][2]bool{{false, true}, {true, false}}[i%2] {
			p, err := Layout(src, dst, opt)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			for k := range p.Chunks {
				if pooled {
					p.FillFrom(k, &pool)
					p.RecycleGather(k, &pool)
					p.RecycleScatter(k, &pool)
				} else {
					p.Fill(k)
				}
			}
			if pooled {
				tp += time.Since(start)
			} else {
				tf += time.Since(start)
			}
		}
	}
	b.ReportMetric(float64(tf.Nanoseconds())/float64(b.N)/benchDescs, "ns/desc-fresh")
	b.ReportMetric(float64(tp.Nanoseconds())/float64(b.N)/benchDescs, "ns/desc-pooled")
	b.ReportMetric(float64(tf)/float64(tp), "ratio")
}
