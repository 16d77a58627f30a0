package pipeline

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// guardByte fills every byte of a destination buffer that no piece of a
// request may touch: the gaps between blocks (stride > block length), the
// blocks no id names and the bytes before and after the pool.
const guardByte = 0xa5

// kvPool is a pool carved from one registered buffer of a node, with its
// base off an aligned address and guard bytes around every block.
type kvPool struct {
	name string
	pool transfer.Pool
	buf  []byte
	base uint64 // the buffer's address
}

// newKVPool registers a pool of blocks × blockLen bytes (at stride) in
// regions regions on n, starting skew bytes into a fresh buffer; every byte
// of the buffer is guardByte until src fills its pieces.
func newKVPool(t testing.TB, n *node, name string, regions int, blocks, blockLen, stride, skew uint64) *kvPool {
	t.Helper()
	ext := (blocks-1)*stride + blockLen
	regionGap := stride + 13 // regions apart, unaligned
	size := skew + uint64(regions)*(ext+regionGap) + 64
	buf := n.buffer(t, size)
	for i := range buf {
		buf[i] = guardByte
	}
	base := mem.DescOf(buf).Addr
	p := transfer.Pool{BlockLen: blockLen, Stride: stride, Blocks: blocks, Kind: transfer.Host}
	for r := range regions {
		p.Regions = append(p.Regions, base+skew+uint64(r)*(ext+regionGap))
	}
	if err := n.RegisterPool(name, p); err != nil {
		t.Fatal(err)
	}
	return &kvPool{name: name, pool: p, buf: buf, base: base}
}

// piece returns the bytes of piece r of block id.
func (k *kvPool) piece(r int, id uint32) []byte {
	off := k.pool.Regions[r] + uint64(id)*k.pool.Stride - k.base
	return k.buf[off : off+k.pool.BlockLen]
}

// fillPieces gives every piece of the named ids a pattern unique to
// (seed, region, id).
func (k *kvPool) fillPieces(seed uint64, ids []uint32) {
	for r := range k.pool.Regions {
		for _, id := range ids {
			fill(k.piece(r, id), seed, uint64(r)<<32|uint64(id))
		}
	}
}

// checkLanded checks that piece r of dst id dstIDs[i] holds piece r of src
// id srcIDs[i], and that every other byte of dst's buffer is still guard.
func checkLanded(t testing.TB, src, dst *kvPool, srcIDs, dstIDs []uint32) {
	t.Helper()
	touched := make([]bool, len(dst.buf))
	for r := range dst.pool.Regions {
		for i := range dstIDs {
			got, want := dst.piece(r, dstIDs[i]), src.piece(r, srcIDs[i])
			if string(got) != string(want) {
				t.Fatalf("region %d: dst block %d differs from src block %d (index %d)", r, dstIDs[i], srcIDs[i], i)
			}
			off := dst.pool.Regions[r] + uint64(dstIDs[i])*dst.pool.Stride - dst.base
			for b := off; b < off+dst.pool.BlockLen; b++ {
				touched[b] = true
			}
		}
	}
	for i, c := range dst.buf {
		if !touched[i] && c != guardByte {
			t.Fatalf("byte %d of the destination buffer (no piece of the request) is %#x, not the guard %#x", i, c, guardByte)
		}
	}
}

// randomIDs returns n distinct ids below blocks in random order.
func randomIDs(rng *rand.Rand, n int, blocks uint64) []uint32 {
	perm := rng.Perm(int(blocks))[:n]
	ids := make([]uint32, n)
	for i, p := range perm {
		ids[i] = uint32(p)
	}
	return ids
}

func blocksSuite(t *testing.T, mk func(testing.TB) *world) {
	for _, c := range []struct {
		name  string
		route Route
	}{{"bounce", RouteBounce}, {"direct", RouteDirect}} {
		t.Run(c.name, func(t *testing.T) { testBlocksByteExact(t, mk(t), c.route) })
	}
	t.Run("refused-before-anything-moves", func(t *testing.T) { testBlocksRefused(t, mk(t)) })
}

func TestBlocksInproc(t *testing.T) { blocksSuite(t, newWorld) }

func TestBlocksTCPZMQ(t *testing.T) { blocksSuite(t, tcpZMQWorld) }

// testBlocksByteExact moves random ids between two 3-region pools with
// unaligned bases and gaps between blocks, over several chunks, and checks
// every destination byte: the named pieces hold their sources, every other
// byte is guard.
func testBlocksByteExact(t *testing.T, w *world, route Route) {
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	const blocks, blen = 700, 2048
	src := newKVPool(t, a, "kv", 3, blocks, blen, blen+96, 5)
	dst := newKVPool(t, b, "kv-in", 3, blocks, blen, blen+40, 3)
	connect(t, a, b)
	rng := rand.New(rand.NewPCG(7, 24))
	for round := range 3 {
		n := []int{1, 600, 333}[round]
		srcIDs, dstIDs := randomIDs(rng, n, blocks), randomIDs(rng, n, blocks)
		if round == 2 {
			// Consecutive ids on both sides: the runs merge.
			for i := range srcIDs {
				srcIDs[i], dstIDs[i] = uint32(10+i), uint32(300+i)
			}
		}
		src.fillPieces(uint64(round+1), srcIDs)
		bt, err := a.Submit(Request{Peer: "b", Route: route, Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: srcIDs, DstPool: "kv-in", DstIDs: dstIDs}})
		if err != nil {
			t.Fatal(err)
		}
		if bt.Route() != route {
			t.Fatalf("route %v (%s), want %v", bt.Route(), bt.RouteReason(), route)
		}
		if err := wait(t, bt); err != nil {
			t.Fatal(err)
		}
		if err := bt.Release(); err != nil {
			t.Fatal(err)
		}
		checkLanded(t, src, dst, srcIDs, dstIDs)
		// The next round's guard check sees only its own pieces.
		for i := range dst.buf {
			dst.buf[i] = guardByte
		}
	}
	if route == RouteBounce {
		if got := a.Stats().BounceBytes; got != (1+600+333)*3*blen {
			t.Fatalf("bounce bytes %d, want %d", got, (1+600+333)*3*blen)
		}
	}
	settled(t, a, b)
	for _, n := range []*node{a, b} {
		for _, p := range []string{"kv", "kv-in"} {
			if err := n.DeregisterPool(p); err != nil && !errors.Is(err, transfer.ErrNotRegistered) {
				t.Fatalf("%s: deregister pool %s after the requests: %v", n.Name(), p, err)
			}
		}
	}
}

// testBlocksRefused submits bad block requests: each is refused at Submit,
// before anything moves (the destination stays guard).
func testBlocksRefused(t *testing.T, w *world) {
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	src := newKVPool(t, a, "kv", 2, 64, 1024, 1024, 1)
	dst := newKVPool(t, b, "kv", 2, 32, 1024, 1024, 7)
	newKVPool(t, b, "wide", 2, 32, 2048, 2048, 0)
	newKVPool(t, b, "three", 3, 32, 1024, 1024, 0)
	connect(t, a, b)
	src.fillPieces(1, []uint32{0, 1, 2, 3})
	cases := []struct {
		name string
		br   BlockRequest
		want string
	}{
		{"src id out of range", BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0, 64}, DstPool: "kv", DstIDs: []uint32{0, 1}}, "not below the pool's 64 blocks"},
		{"dst id out of range", BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0, 1}, DstPool: "kv", DstIDs: []uint32{0, 32}}, "not below the pool's 32 blocks"},
		{"dst id twice", BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0, 1, 2}, DstPool: "kv", DstIDs: []uint32{5, 6, 5}}, "listed twice"},
		{"id counts differ", BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0, 1}, DstPool: "kv", DstIDs: []uint32{0}}, "2 source block ids but 1"},
		{"unknown local pool", BlockRequest{SrcPool: "nope", SrcIDs: []uint32{0}, DstPool: "kv", DstIDs: []uint32{0}}, `no local pool "nope"`},
		{"unknown peer pool", BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0}, DstPool: "nope", DstIDs: []uint32{0}}, `advertises no pool "nope"`},
		{"block lengths differ", BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0}, DstPool: "wide", DstIDs: []uint32{0}}, "blocks of 1024 bytes"},
		{"region counts differ", BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0}, DstPool: "three", DstIDs: []uint32{0}}, "2 regions"},
	}
	for _, route := range []Route{RouteBounce, RouteDirect, RouteAuto} {
		for _, c := range cases {
			br := c.br
			_, err := a.Submit(Request{Peer: "b", Route: route, Blocks: &br})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v %s: error %v, want one saying %q", route, c.name, err, c.want)
			}
		}
	}
	if _, err := a.Submit(Request{Peer: "b", Src: []transfer.Desc{src.pool.Piece(0, 0)}, Dst: []transfer.Desc{dst.pool.Piece(0, 0)},
		Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: []uint32{0}, DstPool: "kv", DstIDs: []uint32{0}}}); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("both forms: %v", err)
	}
	for i, c := range dst.buf {
		if c != guardByte {
			t.Fatalf("destination byte %d changed (%#x) though every request was refused", i, c)
		}
	}
	// Nothing refused holds the source pool.
	if err := a.DeregisterPool("kv"); err != nil {
		t.Fatalf("deregister the source pool after refusals: %v", err)
	}
	settled(t, a, b)
}
