package gpucopy_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/stages/gpucopy"
	"github.com/bouncekv/bounce/transfer"
)

// BenchmarkShapedVsWhole measures a layout conversion's shaped kernels
// against the whole-block kernels moving the same bytes, side by side in
// one run: a request of random blocks of a device pool gathered into (or
// scattered from) a device region, as 8 MiB chunks (the pipeline's
// default, up to four in flight) and as one launch. The whole form moves
// count blocks of unit bytes; the shaped one count units of the same
// bytes cut out of larger blocks: llama70b TP=8 (81,920 × 4 KiB) as the
// TP-merge half of an 8 KiB two-head block and as a head's 16 × 256 B
// pieces of an NHD block, two 16-token blocks as one 32-token block, and
// gpt-oss (36,864 × 2 KiB) as halves and as 16 × 128 B pieces. It reports
// both rates (GB/s of payload) and shaped/whole.
//
//	go test -run '^$' -bench ShapedVsWhole -benchtime 20x ./stages/gpucopy/
func BenchmarkShapedVsWhole(b *testing.B) {
	type workload struct {
		name     string
		count    int    // whole blocks of unit bytes
		unit     uint64 // bytes a whole block
		blockLen uint64 // the shaped pool's blocks
		shape    transfer.Shape
	}
	ws := []workload{
		{"llama70b/tp-merge-half", 81920, 4096, 8192, tpPart(8192, 1, 2)},
		{"llama70b/nhd-256B", 81920, 4096, 8192, nhdHead(16, 2, 256, 1)},
		{"llama70b/block16to32", 81920, 4096, 4096, mergeBlocks(16, 1, 256)},
		{"gptoss/tp-merge-half", 36864, 2048, 4096, tpPart(4096, 1, 2)},
		{"gptoss/nhd-128B", 36864, 2048, 4096, nhdHead(16, 2, 128, 1)},
	}
	for _, w := range ws {
		for _, gather := range []bool{true, false} {
			for _, chunk := range []uint64{8 << 20, 0} {
				dir := "scatter"
				if gather {
					dir = "gather"
				}
				cn := "chunks-8MiB"
				if chunk == 0 {
					cn = "one-launch"
				}
				b.Run(fmt.Sprintf("%s/%s/%s", w.name, dir, cn), func(b *testing.B) {
					benchShaped(b, w.count, w.unit, w.blockLen, w.shape, gather, chunk)
				})
			}
		}
	}
}

func benchShaped(b *testing.B, count int, unit, blockLen uint64, shape transfer.Shape, gather bool, chunk uint64) {
	f, cc := newFixtureWith(b, gpucopy.Settings{Contexts: 4})
	c := cc.c
	if !f.g.HasShaped() {
		b.Skip("the kernel module has no shaped kernels")
	}
	eng := f.s
	if gather {
		eng = f.g
	}
	total := unit * uint64(count)
	ulen := shape.UnitLen()
	units := total / ulen
	if units*ulen != total {
		b.Fatalf("units of %d bytes do not make %d", ulen, total)
	}
	nBlocks := 2 * count
	wholeMem := cudatest.Device(b, c, uint64(nBlocks)*unit)
	shapedBlocks := nBlocks
	if shape.Group > 1 {
		shapedBlocks = 2 * int(units) * int(shape.Group)
	}
	shapedMem := cudatest.Device(b, c, uint64(shapedBlocks)*blockLen)
	region := cudatest.Device(b, c, total)
	for _, d := range []transfer.Desc{wholeMem, shapedMem, region} {
		if err := f.reg.Add(d); err != nil {
			b.Fatal(err)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	pick := func(n, of int) []uint32 {
		perm := r.Perm(of)
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32(perm[i])
		}
		return ids
	}
	whole := transfer.Blocks{Pool: transfer.Pool{Regions: []uint64{wholeMem.Addr}, BlockLen: unit, Stride: unit, Blocks: uint64(nBlocks), Kind: transfer.CUDA}, IDs: pick(count, nBlocks)}
	shaped := transfer.Blocks{Pool: transfer.Pool{Regions: []uint64{shapedMem.Addr}, BlockLen: blockLen, Stride: blockLen, Blocks: uint64(shapedBlocks), Kind: transfer.CUDA}, IDs: pick(int(units)*int(shape.Group), shapedBlocks)}
	perWhole, perShaped := uint64(count), units
	if chunk != 0 {
		perWhole, perShaped = chunk/unit, chunk/ulen
	}
	submitWhole := func(first, n uint64) (transfer.Op, error) {
		bc := transfer.BlockCopy{Blocks: whole, First: first, Count: n, RegionOff: first * unit}
		if gather {
			return f.g.SubmitBlocks(region, bc)
		}
		return f.s.SubmitBlocks(region, bc)
	}
	submitShaped := func(first, n uint64) (transfer.Op, error) {
		return eng.SubmitShaped(region, transfer.ShapedCopy{BlockCopy: transfer.BlockCopy{Blocks: shaped, First: first, Count: n, RegionOff: first * ulen}, Shape: shape})
	}
	request := func(submit func(first, n uint64) (transfer.Op, error), n, per uint64) time.Duration {
		t0 := time.Now()
		var ops []transfer.Op
		drain := func(keep int) {
			for len(ops) > keep {
				for {
					s, err := ops[0].Poll()
					if s.Terminal() {
						if s != transfer.Done {
							b.Fatal(s, err)
						}
						break
					}
				}
				if err := ops[0].Release(); err != nil {
					b.Fatal(err)
				}
				ops = ops[1:]
			}
		}
		for first := uint64(0); first < n; first += per {
			op, err := submit(first, min(per, n-first))
			for errors.Is(err, transfer.ErrBusy) && len(ops) > 0 {
				drain(len(ops) - 1)
				op, err = submit(first, min(per, n-first))
			}
			if err != nil {
				b.Fatal(err)
			}
			ops = append(ops, op)
		}
		drain(0)
		return time.Since(t0)
	}
	request(submitWhole, uint64(count), perWhole) // warm-up
	request(submitShaped, units, perShaped)
	var tw, ts time.Duration
	b.ResetTimer()
	for range b.N {
		tw += request(submitWhole, uint64(count), perWhole)
		ts += request(submitShaped, units, perShaped)
	}
	b.StopTimer()
	gbs := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / 1e9 }
	b.ReportMetric(gbs(tw), "whole-GB/s")
	b.ReportMetric(gbs(ts), "shaped-GB/s")
	b.ReportMetric(tw.Seconds()/ts.Seconds(), "shaped/whole")
}
