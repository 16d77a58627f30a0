package gpucopy_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/stages/gpucopy"
	"github.com/bouncekv/bounce/transfer"
)

// blockShape is a pool and request geometry for the block-form tests.
type blockShape struct {
	len, stride uint64
	regions     int
	blocks      int
	ids         int
	chunk       uint64 // pieces a chunk
	skew        uint64 // added to every region base (unaligned bases)
	regionSkew  uint64 // added to the bounce region's address
}

var blockShapes = []blockShape{
	{len: 4096, stride: 4096, regions: 1, blocks: 3000, ids: 2048, chunk: 512},
	{len: 4096, stride: 8192, regions: 4, blocks: 200, ids: 150, chunk: 97}, // K and V interleaved, chunks cross regions
	{len: 2048, stride: 2048, regions: 2, blocks: 500, ids: 300, chunk: 600},
	{len: 512, stride: 544, regions: 3, blocks: 900, ids: 777, chunk: 1000},
	{len: 1000, stride: 1001, regions: 2, blocks: 100, ids: 80, chunk: 33, skew: 3, regionSkew: 1},
	{len: 4096, stride: 4096, regions: 2, blocks: 64, ids: 60, chunk: 50, skew: 8},
	{len: 20000, stride: 20005, regions: 1, blocks: 12, ids: 9, chunk: 4, skew: 1},
	{len: 1, stride: 3, regions: 5, blocks: 50, ids: 40, chunk: 70},
}

// blockRig is a pool and a bounce region, each inside a larger registered
// buffer whose bytes outside the pieces are guards.
type blockRig struct {
	poolMem, regionMem transfer.Desc
	pool               transfer.Pool
	ids                []uint32
	region             transfer.Desc // the bounce region (inside regionMem)
}

func newBlockRig(t *testing.T, f *fixture, c *cuda.Context, sh blockShape, seed uint64, hostPool, hostRegion bool) blockRig {
	t.Helper()
	ext := uint64(sh.blocks-1)*sh.stride + sh.len
	span := (ext + 48 + 15) &^ 15
	alloc := func(host bool, n uint64) transfer.Desc {
		if host {
			d, _ := cudatest.Pinned(t, c, n)
			return d
		}
		return cudatest.Device(t, c, n)
	}
	var r blockRig
	r.poolMem = alloc(hostPool, span*uint64(sh.regions)+64)
	total := uint64(sh.ids*sh.regions) * sh.len
	r.regionMem = alloc(hostRegion, total+64)
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
	r.pool = transfer.Pool{BlockLen: sh.len, Stride: sh.stride, Blocks: uint64(sh.blocks), Kind: r.poolMem.Kind, Device: r.poolMem.Device}
	for k := range sh.regions {
		r.pool.Regions = append(r.pool.Regions, r.poolMem.Addr+32+uint64(k)*span+sh.skew)
	}
	if err := r.pool.Validate(); err != nil {
		t.Fatal(err)
	}
	perm := rand.New(rand.NewPCG(seed, 5)).Perm(sh.blocks)
	for _, b := range perm[:sh.ids] {
		r.ids = append(r.ids, uint32(b))
	}
	r.region = transfer.Desc{Addr: r.regionMem.Addr + 16 + sh.regionSkew, Len: total, Kind: r.regionMem.Kind, Device: r.regionMem.Device}
	return r
}

// apply does chunk bc on host copies of the two buffers.
func (r blockRig) apply(gather bool, bc transfer.BlockCopy, poolB, regionB []byte) {
	l := bc.Blocks.Pool.BlockLen
	for k := range bc.Count {
		p := bc.Blocks.Piece(bc.First + k)
		po := p.Addr - r.poolMem.Addr
		ro := r.region.Addr - r.regionMem.Addr + bc.RegionOff + k*l
		if gather {
			copy(regionB[ro:ro+l], poolB[po:po+l])
		} else {
			copy(poolB[po:po+l], regionB[ro:ro+l])
		}
	}
}

// TestBlocksByteExact gathers and scatters whole block-table requests,
// chunk by chunk, on both completions and both ways of reading the ids,
// with pools and regions in device and pinned host memory, random
// distinct ids, unaligned bases and lengths; every byte of both buffers
// (the guards around and between the pieces too) is compared with the
// same copies done on the host.
func TestBlocksByteExact(t *testing.T) {
	for _, comp := range []gpucopy.Completion{gpucopy.CompletionFlag, gpucopy.CompletionEvent} {
		for _, zero := range []bool{false, true} {
			f, cc := newFixtureWith(t, gpucopy.Settings{Contexts: 4, ZeroCopyTable: zero, Completion: comp})
			c := cc.c
			if !f.g.HasBlocks() {
				t.Skip("the kernel module has no block kernels")
			}
			for i, sh := range blockShapes {
				for _, mem := range []struct{ hostPool, hostRegion bool }{{false, false}, {true, false}, {false, true}} {
					name := fmt.Sprintf("%s zero-copy=%v shape %d host pool %v host region %v", comp, zero, i, mem.hostPool, mem.hostRegion)
					r := newBlockRig(t, f, c, sh, uint64(i), mem.hostPool, mem.hostRegion)
					blocks := transfer.Blocks{Pool: r.pool, IDs: r.ids}
					for _, gather := range []bool{true, false} {
						poolB := cudatest.Fill(t, c, r.poolMem, uint64(i)+10)
						regionB := cudatest.Fill(t, c, r.regionMem, uint64(i)+20)
						eng := f.s
						if gather {
							eng = f.g
						}
						var ops []transfer.Op
						for first := uint64(0); first < blocks.Len(); first += sh.chunk {
							bc := transfer.BlockCopy{Blocks: blocks, First: first, Count: min(sh.chunk, blocks.Len()-first), RegionOff: first * sh.len}
							op, err := eng.SubmitBlocks(r.region, bc)
							if errors.Is(err, transfer.ErrBusy) {
								for _, o := range ops {
									cudatest.Finish(t, o)
								}
								ops = ops[:0]
								op, err = eng.SubmitBlocks(r.region, bc)
							}
							if err != nil {
								t.Fatalf("%s: chunk at %d: %v", name, first, err)
							}
							ops = append(ops, op)
							r.apply(gather, bc, poolB, regionB)
						}
						for _, o := range ops {
							cudatest.Finish(t, o)
						}
						if d := cudatest.Diff(cudatest.Read(t, c, r.regionMem), regionB); d != "" {
							t.Errorf("%s gather=%v: region buffer %s", name, gather, d)
						}
						if d := cudatest.Diff(cudatest.Read(t, c, r.poolMem), poolB); d != "" {
							t.Errorf("%s gather=%v: pool buffer %s", name, gather, d)
						}
						if n := f.reg.Pinned(); n != 0 {
							t.Fatalf("%s: %d ranges pinned after release", name, n)
						}
					}
				}
			}
		}
	}
}

// TestBlocksRefusedBeforeAnyByteMoves: an id past the pool (the last of
// the window, or one the chunk wraps to), a range past the table, region
// bytes past the region, pool memory not registered or registered as
// another kind are refused with their error, no byte of either buffer
// changes, and nothing stays pinned.
func TestBlocksRefusedBeforeAnyByteMoves(t *testing.T) {
	f, cc := newFixture(t, 2, false)
	c := cc.c
	if !f.g.HasBlocks() {
		t.Skip("the kernel module has no block kernels")
	}
	sh := blockShape{len: 4096, stride: 4096, regions: 2, blocks: 100, ids: 64, chunk: 64}
	r := newBlockRig(t, f, c, sh, 1, false, false)
	unreg := cudatest.Device(t, c, 1<<20)
	bad := func(ids []uint32, k int, v uint32) []uint32 {
		x := append([]uint32(nil), ids...)
		x[k] = v
		return x
	}
	otherKind := r.pool
	otherKind.Kind = transfer.Host
	otherKind.Device = 0
	notReg := r.pool
	notReg.Regions = []uint64{unreg.Addr, unreg.Addr + 512<<10}
	notReg.Blocks = 100
	full := transfer.Blocks{Pool: r.pool, IDs: r.ids}
	cases := []struct {
		name string
		bc   transfer.BlockCopy
		want error
	}{
		{"last id past the pool", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: r.pool, IDs: bad(r.ids, 63, 100)}, First: 0, Count: 64}, transfer.ErrOutOfBounds},
		{"wrapped id past the pool", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: r.pool, IDs: bad(r.ids, 0, 1<<30)}, First: 60, Count: 10}, transfer.ErrOutOfBounds},
		{"range past the table", transfer.BlockCopy{Blocks: full, First: 100, Count: 29}, transfer.ErrOutOfBounds},
		{"region bytes past the region", transfer.BlockCopy{Blocks: full, First: 0, Count: 64, RegionOff: r.region.Len - 4096*63}, transfer.ErrOutOfBounds},
		{"no ids", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: r.pool}, First: 0, Count: 0}, transfer.ErrOutOfBounds},
		{"pool not registered", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: notReg, IDs: r.ids}, First: 0, Count: 64}, transfer.ErrNotRegistered},
		{"pool of another kind", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: otherKind, IDs: r.ids}, First: 0, Count: 64}, transfer.ErrUnsupported},
	}
	for _, cs := range cases {
		for _, eng := range []*gpucopy.Engine{f.g, f.s} {
			poolB := cudatest.Fill(t, c, r.poolMem, 1)
			regionB := cudatest.Fill(t, c, r.regionMem, 2)
			unregB := cudatest.Fill(t, c, unreg, 3)
			op, err := eng.SubmitBlocks(r.region, cs.bc)
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
