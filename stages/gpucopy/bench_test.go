package gpucopy_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/stages/gpucopy"
	"github.com/bouncekv/bounce/transfer"
)

// BenchmarkChunkHost measures the stage's host work per chunk, side by
// side: the block form (ids checked and staged, no piece table) with
// completion by the host-mapped flag and by event polling, the ids
// staged or read zero-copy, against the descriptor form (the chunk's runs
// checked and cut into the piece table: compact, the default for
// unstrided runs of 4 KiB and more, and full (descs-full), on one goroutine and on the
// automatic number of build workers) on the same pieces. A
// request of 81,920 × 4 KiB (and 36,864 × 2 KiB) random blocks of a
// device pool is gathered chunk by chunk (8 MiB chunks, the pipeline's
// default) into a device region. It reports the Submit time per chunk and
// per block, the mean time of one Poll call, and Polls per chunk; the
// device is drained before each chunk (so each chunk's Submit finds a
// free context and an idle device, as in a pipeline that keeps up).
//
//	go test -run '^$' -bench ChunkHost -benchtime 2000x ./stages/gpucopy/
func BenchmarkChunkHost(b *testing.B) {
	for _, w := range []struct {
		size  uint64
		count int
	}{{4096, 81920}, {2048, 36864}} {
		chunk := uint64(8<<20) / w.size
		type variant struct {
			form    string
			comp    gpucopy.Completion
			zero    bool
			workers int
		}
		vs := []variant{
			{"blocks", gpucopy.CompletionFlag, false, 0}, {"blocks", gpucopy.CompletionEvent, false, 0},
			{"blocks", gpucopy.CompletionFlag, true, 0}, {"blocks", gpucopy.CompletionEvent, true, 0},
			{"descs", gpucopy.CompletionEvent, false, 1}, {"descs", gpucopy.CompletionEvent, true, 1},
			{"descs", gpucopy.CompletionEvent, false, 0}, {"descs", gpucopy.CompletionEvent, true, 0},
			{"descs-full", gpucopy.CompletionEvent, false, 1}, {"descs-full", gpucopy.CompletionEvent, false, 0},
			{"descs-full", gpucopy.CompletionEvent, true, 0},
		}
		for _, v := range vs {
			table := "staged"
			if v.zero {
				table = "zero-copy"
			}
			name := fmt.Sprintf("%dx%dB/%s/%s/table-%s", w.count, w.size, v.form, v.comp, table)
			if v.form != "blocks" {
				name += fmt.Sprintf("/workers-%d", v.workers)
			}
			set := gpucopy.Settings{Contexts: 2, ZeroCopyTable: v.zero, Completion: v.comp, BuildWorkers: v.workers}
			if v.form == "descs-full" {
				set = gpucopy.WithFullTables(set)
			}
			b.Run(name, func(b *testing.B) {
				f, _ := newFixtureWith(b, set)
				benchChunks(b, f, w.size, w.count, chunk, v.form == "blocks")
			})
		}
	}
}

func benchChunks(b *testing.B, f *fixture, size uint64, count int, chunk uint64, blocksForm bool) {
	c := cudatest.Context(b)
	if !f.g.HasBlocks() {
		b.Skip("the kernel module has no block kernels")
	}
	total := size * uint64(count)
	poolMem := cudatest.Device(b, c, 2*total)
	region := cudatest.Device(b, c, chunk*size)
	for _, d := range []transfer.Desc{poolMem, region} {
		if err := f.reg.Add(d); err != nil {
			b.Fatal(err)
		}
	}
	pool := transfer.Pool{Regions: []uint64{poolMem.Addr}, BlockLen: size, Stride: size, Blocks: uint64(2 * count), Kind: transfer.CUDA}
	perm := rand.New(rand.NewPCG(1, 2)).Perm(2 * count)
	ids := make([]uint32, count)
	for i := range ids {
		ids[i] = uint32(perm[i])
	}
	blocks := transfer.Blocks{Pool: pool, IDs: ids}
	chunks := (uint64(count) + chunk - 1) / chunk
	// The descriptor form of each chunk, built before timing (the
	// pipeline's planning, not the stage's work).
	runs := make([][]transfer.Run, chunks)
	for k := range chunks {
		for i := k * chunk; i < min(uint64(count), (k+1)*chunk); i++ {
			runs[k] = append(runs[k], transfer.Run{RegionOff: (i - k*chunk) * size, Addr: poolMem.Addr + uint64(ids[i])*size, Len: size, Count: 1, RegionStride: size, AddrStride: size})
		}
	}
	var submit, polling time.Duration
	var polls, pieces int
	one := func(k uint64) {
		t0 := time.Now()
		var op transfer.Op
		var err error
		if blocksForm {
			first := k * chunk
			op, err = f.g.SubmitBlocks(region, transfer.BlockCopy{Blocks: blocks, First: first, Count: min(chunk, uint64(count)-first)})
		} else {
			op, err = f.g.Submit(region, runs[k])
		}
		t1 := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		submit += t1.Sub(t0)
		for {
			p0 := time.Now()
			s, err := op.Poll()
			polling += time.Since(p0)
			polls++
			if s.Terminal() {
				if s != transfer.Done {
					b.Fatal(s, err)
				}
				break
			}
		}
		if err := op.Release(); err != nil {
			b.Fatal(err)
		}
	}
	for k := range chunks {
		one(k) // warm-up
	}
	submit, polling, polls = 0, 0, 0
	b.ResetTimer()
	for i := range b.N {
		k := uint64(i) % chunks
		pieces += len(runs[k])
		one(k)
	}
	b.StopTimer()
	b.ReportMetric(float64(submit.Nanoseconds())/float64(b.N), "submit-ns/chunk")
	b.ReportMetric(float64(submit.Nanoseconds())/float64(pieces), "submit-ns/block")
	b.ReportMetric(float64(polling.Nanoseconds())/float64(polls), "ns/poll")
	b.ReportMetric(float64(polls)/float64(b.N), "polls/chunk")
}
