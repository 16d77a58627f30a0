package node

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/stages/gpucopy"
	"github.com/bouncekv/bounce/transfer"
)

// launchCounter is what the CUDA stages report of the form each launch
// took (gpucopy.Launched).
type launchCounter interface{ Launched() gpucopy.Launched }

// launched reads n's gather and scatter stage counters.
func launched(t *testing.T, n *Node) (g, s gpucopy.Launched) {
	t.Helper()
	gc, ok1 := n.Gatherer.(launchCounter)
	sc, ok2 := n.Scatterer.(launchCounter)
	if !ok1 || !ok2 {
		t.Fatalf("stages %T, %T: not the CUDA stages", n.Gatherer, n.Scatterer)
	}
	return gc.Launched(), sc.Launched()
}

// gpuPool is one side's pool of a block case: regions of blocks at a
// stride in one device allocation, each region at an odd offset and
// followed by a gap, so every piece has guard bytes around it.
type gpuPool struct {
	buf  transfer.Desc
	pool transfer.Pool
}

func newGPUPool(t *testing.T, c *cuda.Context, regions int, blocks, blockLen, stride, off uint64) gpuPool {
	const gap = 61
	span := blocks*stride + gap
	buf := cudatest.Device(t, c, off+uint64(regions)*span+gap)
	p := transfer.Pool{BlockLen: blockLen, Stride: stride, Blocks: blocks, Kind: transfer.CUDA}
	for r := range regions {
		p.Regions = append(p.Regions, buf.Addr+off+uint64(r)*span)
	}
	return gpuPool{buf: buf, pool: p}
}

// TestGPUBlocksByteExact moves block-table requests between device pools
// of two agents on one GPU with cudacopy and the CUDA stages (gather
// kernel → cudacopy DtoD write → scatter kernel): random ids on both
// sides, region bases at odd offsets, block lengths from 1 byte to 64 KiB
// that are no multiple of 16, strides with gaps, a request 8 times the
// arena. The destination is filled with known bytes first: only the
// named blocks may change. On the bounce route every chunk reaches the
// stages' block form (GatherBlocks / ScatterBlocks launches counted, no
// piece-table launch); the direct route (cudacopy without BlockPoster: one
// write per piece) lands the same bytes.
func TestGPUBlocksByteExact(t *testing.T) {
	c := cudatest.Context(t)
	f := gpuFactories(t)
	ca, cb := gpuConfig("a"), gpuConfig("b")
	a, b := build(t, ca, f), build(t, cb, f)
	if a.ArenaMemory != "device" {
		t.Fatalf("arena memory %q, want device", a.ArenaMemory)
	}
	arena := uint64(ca.Bounce.ArenaSize)
	cases := []struct {
		name             string
		regions          int
		blocks, blockLen uint64
		stride, ids      uint64
		off              uint64
	}{
		{"one-byte", 1, 7, 1, 1, 5, 3},
		{"odd-strided", 3, 64, 1000, 1003, 40, 5},
		{"4k-gapped", 2, 300, 4096, 4096 + 512, 256, 1},
		{"513-contiguous", 1, 5000, 513, 513, 4000, 7},
		{"kv-like", 16, 512, 2048, 2048, 300, 0},
		{"8x-arena", 4, 8192, 4096 + 16, 4096 + 16, 8 * arena / 4 / (4096 + 16), 9},
		{"64k-mixed", 5, 40, 64<<10 - 3, 64 << 10, 33, 2},
	}
	type side struct{ src, dst gpuPool }
	sides := make([]side, len(cases))
	for i, tc := range cases {
		s := side{
			src: newGPUPool(t, c, tc.regions, tc.blocks, tc.blockLen, tc.stride, tc.off),
			dst: newGPUPool(t, c, tc.regions, tc.blocks, tc.blockLen, tc.stride, tc.off+uint64(i%3)),
		}
		if err := a.Agent.RegisterMemory(s.src.buf); err != nil {
			t.Fatal(err)
		}
		if err := b.Agent.RegisterMemory(s.dst.buf); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("kv%d", i)
		if err := a.Agent.RegisterPool(name, s.src.pool); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if err := b.Agent.RegisterPool(name, s.dst.pool); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		sides[i] = s
	}
	connect(t, a, b) // the descriptors carry the pools

	for i, tc := range cases {
		s := sides[i]
		rng := rand.New(rand.NewPCG(uint64(i), 77))
		srcIDs := idsOf(rng.Perm(int(tc.blocks))[:tc.ids])
		dstIDs := idsOf(rng.Perm(int(tc.blocks))[:tc.ids])
		srcB := cudatest.Fill(t, c, s.src.buf, uint64(i))
		for _, route := range []pipeline.Route{pipeline.RouteBounce, pipeline.RouteDirect} {
			dstB := cudatest.Fill(t, c, s.dst.buf, uint64(i)+100)
			ag0, _ := launched(t, a)
			_, bs0 := launched(t, b)
			name := fmt.Sprintf("kv%d", i)
			bt, err := a.Agent.Submit(pipeline.Request{Peer: "b", Route: route,
				Blocks: &pipeline.BlockRequest{SrcPool: name, SrcIDs: srcIDs, DstPool: name, DstIDs: dstIDs}})
			if err != nil {
				t.Fatalf("%s %v: %v", tc.name, route, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			err = bt.Wait(ctx)
			cancel()
			if err != nil {
				t.Fatalf("%s %v: %v", tc.name, route, err)
			}
			if bt.Route() != route {
				t.Fatalf("%s: route %v (%s), asked %v", tc.name, bt.Route(), bt.RouteReason(), route)
			}
			if retired, quiet := bt.Retirement(); !retired || !quiet {
				t.Fatalf("%s %v: retired %v quiescent %v", tc.name, route, retired, quiet)
			}
			if err := bt.Release(); err != nil {
				t.Fatal(err)
			}
			// Expected: the destination's known bytes with each named block
			// replaced, in every region.
			for r := range tc.regions {
				for k := range srcIDs {
					so := s.src.pool.Regions[r] - s.src.buf.Addr + uint64(srcIDs[k])*tc.stride
					do := s.dst.pool.Regions[r] - s.dst.buf.Addr + uint64(dstIDs[k])*tc.stride
					copy(dstB[do:do+tc.blockLen], srcB[so:so+tc.blockLen])
				}
			}
			if d := cudatest.Diff(cudatest.Read(t, c, s.dst.buf), dstB); d != "" {
				t.Fatalf("%s %v (%d regions x %d ids of %d bytes): %s", tc.name, route, tc.regions, tc.ids, tc.blockLen, d)
			}
			ag1, _ := launched(t, a)
			_, bs1 := launched(t, b)
			if route == pipeline.RouteBounce {
				if ag1.Runs != ag0.Runs || bs1.Runs != bs0.Runs {
					t.Errorf("%s: block request launched piece-table copies: gather %d, scatter %d", tc.name, ag1.Runs-ag0.Runs, bs1.Runs-bs0.Runs)
				}
				if ag1.Blocks == ag0.Blocks || bs1.Blocks == bs0.Blocks {
					t.Errorf("%s: no block-form launch: gather %d, scatter %d", tc.name, ag1.Blocks-ag0.Blocks, bs1.Blocks-bs0.Blocks)
				}
				if bytes := uint64(tc.regions) * tc.ids * tc.blockLen; bytes > arena && bs1.Blocks-bs0.Blocks < 2 {
					t.Errorf("%s: %d bytes in %d scatter launches", tc.name, bytes, bs1.Blocks-bs0.Blocks)
				}
			}
			for _, n := range []*Node{a, b} {
				if err := n.Agent.CheckConservation(); err != nil {
					t.Fatalf("%s %v: %v", tc.name, route, err)
				}
			}
		}
	}
}

func idsOf(p []int) []uint32 {
	ids := make([]uint32, len(p))
	for i, v := range p {
		ids[i] = uint32(v)
	}
	return ids
}
