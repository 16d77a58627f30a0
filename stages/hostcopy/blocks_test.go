package hostcopy_test

import (
	"bytes"
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/stages/hostcopy"
	"github.com/bouncekv/bounce/transfer"
)

// TestSubmitBlocksMatchesModel checks block copies in both directions
// against a byte-by-byte model: random pools (unaligned bases, strides at
// or above the block), random ids (repeats allowed on a gather's sources,
// distinct on a scatter's destinations), random piece ranges and region
// offsets, and shares on several workers. Every byte outside the pieces
// keeps its old value.
func TestSubmitBlocksMatchesModel(t *testing.T) {
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
		blocks := rapid.Uint64Range(1, 64).Draw(rt, "blocks")
		regions := rapid.IntRange(1, 3).Draw(rt, "regions")
		extent := (blocks-1)*stride + blen
		base := ext.Desc().Addr + rapid.Uint64Range(0, 63).Draw(rt, "skew")
		p := transfer.Pool{BlockLen: blen, Stride: stride, Blocks: blocks, Kind: transfer.Host}
		for r := range regions {
			p.Regions = append(p.Regions, base+uint64(r)*(extent+7))
		}
		nIDs := rapid.IntRange(1, 40).Draw(rt, "ids")
		ids := make([]uint32, nIDs)
		if dir == hostcopy.Scatter {
			n := min(nIDs, int(blocks))
			ids = rapid.SliceOfNDistinct(rapid.Uint32Range(0, uint32(blocks-1)), n, n, rapid.ID[uint32]).Draw(rt, "dstIDs")
		} else {
			for i := range ids {
				ids[i] = rapid.Uint32Range(0, uint32(blocks-1)).Draw(rt, "id")
			}
		}
		bl := transfer.Blocks{Pool: p, IDs: ids}
		total := bl.Len()
		first := rapid.Uint64Range(0, total-1).Draw(rt, "first")
		count := rapid.Uint64Range(1, total-first).Draw(rt, "count")
		c := transfer.BlockCopy{Blocks: bl, First: first, Count: count, RegionOff: rapid.Uint64Range(0, 100).Draw(rt, "regionOff")}
		region := transfer.Desc{Addr: regionB.Desc().Addr, Len: c.RegionOff + count*blen + rapid.Uint64Range(0, 50).Draw(rt, "slack"), Kind: transfer.Host}

		fill(ext.Bytes(), rapid.Uint64().Draw(rt, "seedExt"))
		fill(regionB.Bytes(), rapid.Uint64().Draw(rt, "seedRegion"))
		wantExt, wantRegion := bytes.Clone(ext.Bytes()), bytes.Clone(regionB.Bytes())
		for k := uint64(0); k < count; k++ {
			d := bl.Piece(first + k)
			eo := d.Addr - ext.Desc().Addr
			ro := c.RegionOff + k*blen
			if dir == hostcopy.Gather {
				copy(wantRegion[ro:ro+blen], wantExt[eo:eo+blen])
			} else {
				copy(wantExt[eo:eo+blen], wantRegion[ro:ro+blen])
			}
		}
		op, err := engines[dir].SubmitBlocks(region, c)
		if err != nil {
			rt.Fatalf("submit: %v", err)
		}
		mustDone(t, op, ch)
		if !bytes.Equal(ext.Bytes(), wantExt) || !bytes.Equal(regionB.Bytes(), wantRegion) {
			rt.Fatalf("%v of %d pieces from %d differs from the model", dir, count, first)
		}
	})
}

// TestSubmitBlocksLargeShares runs one block copy big enough to be shared
// among workers and checks it byte for byte.
func TestSubmitBlocksLargeShares(t *testing.T) {
	reg := &mem.Registry{}
	const blocks, blen, stride = 2048, 4096, 4096
	pool := buffer(t, reg, blocks*stride*2)
	region := buffer(t, reg, 4<<20)
	ch := make(chan struct{}, 1)
	e := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Workers: 4, Notify: hostcopy.Signal(ch)})
	fill(pool.Bytes(), 3)
	p := transfer.Pool{Regions: []uint64{pool.Desc().Addr, pool.Desc().Addr + blocks*stride}, BlockLen: blen, Stride: stride, Blocks: blocks, Kind: transfer.Host}
	ids := make([]uint32, 512)
	for i := range ids {
		ids[i] = uint32((i * 7) % blocks)
		if i%4 != 0 {
			ids[i] = ids[i-1] + 1 // runs of consecutive ids merge
		}
	}
	c := transfer.BlockCopy{Blocks: transfer.Blocks{Pool: p, IDs: ids}, First: 100, Count: 900}
	op, err := e.SubmitBlocks(region.Desc(), c)
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op, ch)
	for k := uint64(0); k < c.Count; k++ {
		d := c.Blocks.Piece(c.First + k)
		got := region.Bytes()[k*blen : (k+1)*blen]
		want := pool.Bytes()[d.Addr-pool.Desc().Addr:][:blen]
		if !bytes.Equal(got, want) {
			t.Fatalf("piece %d differs", c.First+k)
		}
	}
}

// TestSubmitBlocksRefused checks that a bad block copy is refused before any
// byte moves, naming why.
func TestSubmitBlocksRefused(t *testing.T) {
	reg := &mem.Registry{}
	pool := buffer(t, reg, 64<<10)
	region := buffer(t, reg, 64<<10)
	stray, err := mem.Alloc(64 << 10) // not registered
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stray.Free() })
	e := newEngine(t, hostcopy.Scatter, hostcopy.Settings{Registry: reg})
	fill(pool.Bytes(), 1)
	fill(region.Bytes(), 2)
	before := bytes.Clone(pool.Bytes())
	good := transfer.Pool{Regions: []uint64{pool.Desc().Addr}, BlockLen: 1024, Stride: 1024, Blocks: 16, Kind: transfer.Host}
	unreg := good
	unreg.Regions = []uint64{stray.Desc().Addr}
	past := good
	past.Blocks = 80 // the span runs past the registered buffer
	cases := []struct {
		name string
		c    transfer.BlockCopy
		want error
	}{
		{"id out of range", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: good, IDs: []uint32{1, 16}}, Count: 2}, transfer.ErrOutOfBounds},
		{"range past the table", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: good, IDs: []uint32{1}}, First: 1, Count: 1}, transfer.ErrOutOfBounds},
		{"region too short", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: good, IDs: []uint32{1}}, Count: 1, RegionOff: 64<<10 - 1000}, transfer.ErrOutOfBounds},
		{"pool not registered", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: unreg, IDs: []uint32{0}}, Count: 1}, transfer.ErrNotRegistered},
		{"pool span past its registration", transfer.BlockCopy{Blocks: transfer.Blocks{Pool: past, IDs: []uint32{0}}, Count: 1}, transfer.ErrOutOfBounds},
	}
	for _, c := range cases {
		if _, err := e.SubmitBlocks(region.Desc(), c.c); !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if !bytes.Equal(pool.Bytes(), before) {
		t.Fatal("a refused block copy wrote the pool")
	}
	if n := reg.Pinned(); n != 0 {
		t.Fatalf("%d pins left after refusals", n)
	}
}

// TestSubmitBlocksUnevenShares: a chunk whose pieces do not split evenly
// over the shares (and one of no pieces) completes, byte-exact: the op
// counts exactly the shares it queued (it once counted one share per
// worker and queued fewer, so such a copy never ended).
func TestSubmitBlocksUnevenShares(t *testing.T) {
	for _, tc := range []struct {
		workers     int
		blen, count uint64
	}{
		{4, 512 << 10, 6}, {8, 128 << 10, 25}, {8, 128 << 10, 29}, {3, 512 << 10, 4}, {4, 4096, 0}, {2, 1 << 20, 3},
	} {
		reg := &mem.Registry{}
		const blocks = 32
		pool := buffer(t, reg, blocks*tc.blen)
		region := buffer(t, reg, max(tc.count, 1)*tc.blen)
		ch := make(chan struct{}, 1)
		e := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Workers: tc.workers, Notify: hostcopy.Signal(ch)})
		fill(pool.Bytes(), 5)
		p := transfer.Pool{Regions: []uint64{pool.Desc().Addr}, BlockLen: tc.blen, Stride: tc.blen, Blocks: blocks, Kind: transfer.Host}
		ids := make([]uint32, tc.count)
		for i := range ids {
			ids[i] = uint32((i*11 + 3) % blocks)
		}
		if tc.count == 0 {
			ids = []uint32{0}
		}
		c := transfer.BlockCopy{Blocks: transfer.Blocks{Pool: p, IDs: ids}, Count: tc.count}
		op, err := e.SubmitBlocks(region.Desc(), c)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		mustDone(t, op, ch)
		for k := uint64(0); k < tc.count; k++ {
			d := c.Blocks.Piece(k)
			if !bytes.Equal(region.Bytes()[k*tc.blen:(k+1)*tc.blen], pool.Bytes()[d.Addr-pool.Desc().Addr:][:tc.blen]) {
				t.Fatalf("%+v: piece %d differs", tc, k)
			}
		}
	}
}

// TestSubmitBlocksRefusesOverflowingPool: a pool whose extent overflows the
// address space is refused before any byte moves (its span would be empty
// and pass the registry).
func TestSubmitBlocksRefusesOverflowingPool(t *testing.T) {
	reg := &mem.Registry{}
	region := buffer(t, reg, 1<<20)
	e := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Workers: 2})
	p := transfer.Pool{Regions: []uint64{region.Desc().Addr}, BlockLen: 4096, Stride: 1 << 62, Blocks: 8, Kind: transfer.Host}
	c := transfer.BlockCopy{Blocks: transfer.Blocks{Pool: p, IDs: []uint32{5}}, Count: 1}
	if _, err := e.SubmitBlocks(region.Desc(), c); !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("overflowing pool: %v, want ErrOutOfBounds", err)
	}
}
