package kernels_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/transfer"
)

func TestVectorShift(t *testing.T) {
	for _, c := range []struct {
		len uint64
		sh  uint32
		ok  bool
	}{{128, 7, true}, {512, 9, true}, {4096, 12, true}, {8192, 12, true}, {12288, 12, true},
		{64, 0, false}, {100, 0, false}, {2064, 0, false}, {4112, 0, false}} {
		sh, ok := kernels.VectorShift(c.len)
		if sh != c.sh || ok != c.ok {
			t.Errorf("VectorShift(%d) = %d, %v; want %d, %v", c.len, sh, ok, c.sh, c.ok)
		}
	}
}

// blockCase is one block-form launch checked byte for byte.
type blockCase struct {
	len, stride  uint64
	regions      int
	blocks       int // pool block count
	nids         int
	first, count uint64
	poolSkew     uint64 // added to every region base (unaligned bases)
	regionSkew   uint64 // added to the region address
}

// window returns the ids a chunk of [first, first+count) needs (see
// kernels.BlockJob) and the pool regions it touches.
func window(ids []uint32, first, count uint64) (w []uint32, off0 uint64, lo, hi int) {
	n := uint64(len(ids))
	off0 = first % n
	for i := range min(count, n) {
		w = append(w, ids[(off0+i)%n])
	}
	b := transfer.Blocks{IDs: ids}
	lo, hi = b.RegionsTouched(first, count)
	return w, off0, lo, hi
}

// upload puts the chunk's window and bases in pinned memory (zero) or
// device memory.
func upload(t *testing.T, c *cuda.Context, zero bool, w []uint32, bases []uint64) (idsAt, basesAt cuda.DevicePtr) {
	t.Helper()
	buf := make([]byte, 8*len(bases)+4*len(w))
	for i, b := range bases {
		binary.LittleEndian.PutUint64(buf[8*i:], b)
	}
	for i, id := range w {
		binary.LittleEndian.PutUint32(buf[8*len(bases)+4*i:], id)
	}
	d, host := cudatest.Pinned(t, c, uint64(len(buf)))
	copy(host, buf)
	at := d.Addr
	if !zero {
		dd := cudatest.Device(t, c, uint64(len(buf)))
		if err := c.CopyHtoD(cuda.DevicePtr(dd.Addr), buf); err != nil {
			t.Fatal(err)
		}
		at = dd.Addr
	}
	return cuda.DevicePtr(at + uint64(8*len(bases))), cuda.DevicePtr(at)
}

// TestBlockKernelsByteExact launches every block family the module holds
// over pools of several shapes (aligned and not, pieces from 100 bytes to
// 8 KiB, chunks crossing regions, partial slabs) with random distinct ids,
// and compares both whole buffers with the same copies done on the host:
// every byte outside the pieces (the guards between and around them) must
// be untouched. Completion is by the host-mapped flag.
func TestBlockKernelsByteExact(t *testing.T) {
	c := cudatest.Context(t)
	m, err := kernels.Load(c, cudatest.PTX(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	if !m.HasBlocks(kernels.BlockGeneral) {
		t.Skip("the module has no block kernels")
	}
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	args, err := kernels.NewArgs(c)
	if err != nil {
		t.Fatal(err)
	}
	defer args.Free()
	flag, flagB := cudatest.Pinned(t, c, 4)
	counter := cudatest.Device(t, c, 4)
	if err := c.Memset(cuda.DevicePtr(counter.Addr), 0, 4); err != nil {
		t.Fatal(err)
	}
	cases := []blockCase{
		{len: 4096, stride: 4096, regions: 1, blocks: 300, nids: 200, first: 0, count: 200},
		{len: 4096, stride: 8192, regions: 2, blocks: 64, nids: 50, first: 20, count: 70}, // K and V interleaved
		{len: 512, stride: 512, regions: 3, blocks: 500, nids: 333, first: 100, count: 700},
		{len: 512, stride: 528, regions: 2, blocks: 40, nids: 7, first: 3, count: 5}, // partial slab
		{len: 2048, stride: 2064, regions: 4, blocks: 90, nids: 80, first: 79, count: 160},
		{len: 8192, stride: 8192 + 4096, regions: 2, blocks: 30, nids: 20, first: 5, count: 30},
		{len: 128, stride: 256, regions: 1, blocks: 2000, nids: 1000, first: 0, count: 1000},
		{len: 1000, stride: 1003, regions: 2, blocks: 100, nids: 60, first: 10, count: 100, poolSkew: 3, regionSkew: 5},
		{len: 4096, stride: 4096, regions: 2, blocks: 100, nids: 90, first: 0, count: 180, poolSkew: 8},
		{len: 100, stride: 100, regions: 1, blocks: 1000, nids: 900, first: 1, count: 899, regionSkew: 1},
		{len: 9000, stride: 9001, regions: 1, blocks: 20, nids: 13, first: 0, count: 13, poolSkew: 1},
		{len: 1, stride: 2, regions: 3, blocks: 10, nids: 10, first: 0, count: 30},
	}
	var seq uint32
	for i, bc := range cases {
		for _, fam := range []kernels.BlockFamily{kernels.BlockGeneral, kernels.BlockVector, kernels.BlockBulk, kernels.BlockBulk2} {
			if !m.HasBlocks(fam) {
				continue
			}
			_, vec := kernels.VectorShift(bc.len)
			vec = vec && kernels.Aligned16(bc.stride, bc.poolSkew, bc.regionSkew)
			if fam != kernels.BlockGeneral && !vec {
				continue
			}
			for _, gather := range []bool{true, false} {
				for _, zero := range []bool{true, false} {
					name := fmt.Sprintf("case %d %s gather=%v zero-copy=%v", i, fam, gather, zero)
					r := rand.New(rand.NewPCG(uint64(i), 9))
					ext := uint64(bc.blocks-1)*bc.stride + bc.len
					// Regions one after another with a 64-byte gap.
					span := (ext + 64 + 15) &^ 15
					poolMem := cudatest.Device(t, c, span*uint64(bc.regions)+64)
					regionMem := cudatest.Device(t, c, bc.count*bc.len+64)
					pool := transfer.Pool{BlockLen: bc.len, Stride: bc.stride, Blocks: uint64(bc.blocks), Kind: transfer.CUDA}
					for k := range bc.regions {
						pool.Regions = append(pool.Regions, poolMem.Addr+32+uint64(k)*span+bc.poolSkew)
					}
					if err := pool.Validate(); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					perm := r.Perm(bc.blocks)
					ids := make([]uint32, bc.nids)
					for k := range ids {
						ids[k] = uint32(perm[k])
					}
					blocks := transfer.Blocks{Pool: pool, IDs: ids}
					rbase := regionMem.Addr + 16 + bc.regionSkew
					poolB := cudatest.Fill(t, c, poolMem, uint64(i)+300)
					regionB := cudatest.Fill(t, c, regionMem, uint64(i)+400)
					w, off0, lo, hi := window(ids, bc.first, bc.count)
					idsAt, basesAt := upload(t, c, zero, w, pool.Regions[lo:hi])
					seq++
					job := kernels.BlockJob{
						Region: cuda.DevicePtr(rbase), Bases: basesAt, IDs: idsAt,
						NIDs: uint64(len(ids)), Off0: off0, Count: bc.count, Len: bc.len, Stride: bc.stride,
						Done: cuda.DevicePtr(flag.Addr), Counter: cuda.DevicePtr(counter.Addr), Seq: seq,
					}
					if err := m.LaunchBlocks(gather, fam, s, args, job); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					deadline := time.Now().Add(10 * time.Second)
					done := (*uint32)(unsafe.Pointer(&flagB[0]))
					for atomic.LoadUint32(done) != seq {
						if time.Now().After(deadline) {
							t.Fatalf("%s: the done flag never reached %d (%d)", name, seq, atomic.LoadUint32(done))
						}
					}
					if err := s.Synchronize(); err != nil {
						t.Fatal(err)
					}
					for k := range bc.count {
						p := blocks.Piece(bc.first + k)
						po := p.Addr - poolMem.Addr
						ro := rbase - regionMem.Addr + k*bc.len
						if gather {
							copy(regionB[ro:ro+bc.len], poolB[po:po+bc.len])
						} else {
							copy(poolB[po:po+bc.len], regionB[ro:ro+bc.len])
						}
					}
					if d := cudatest.Diff(cudatest.Read(t, c, regionMem), regionB); d != "" {
						t.Errorf("%s: region %s", name, d)
					}
					if d := cudatest.Diff(cudatest.Read(t, c, poolMem), poolB); d != "" {
						t.Errorf("%s: pool %s", name, d)
					}
				}
			}
		}
	}
	ctr := cudatest.Read(t, c, counter)
	if v := binary.LittleEndian.Uint32(ctr); v != 0 {
		t.Errorf("block counter left at %d, want 0", v)
	}
}
