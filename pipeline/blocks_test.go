package pipeline

import (
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline/wire"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
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
		t.Run(c.name, func(t *testing.T) { testBlocksByteExact(t, mk(t), c.route, testConfig()) })
	}
	t.Run("peer-without-bounce-served-direct", func(t *testing.T) {
		off := testConfig()
		off.Enabled = false
		testBlocksByteExact(t, mk(t), RouteAuto, off)
	})
	t.Run("refused-before-anything-moves", func(t *testing.T) { testBlocksRefused(t, mk(t)) })
	t.Run("stages-without-block-capability", func(t *testing.T) {
		w := mk(t)
		w.stages = plainStages
		testBlocksByteExact(t, w, RouteBounce, testConfig())
	})
}

// plainGather and plainScatter hide the host stages' block capability, as
// a third-party stage that predates the block-table form: the pipeline
// expands each chunk to runs for them.
type plainGather struct{ transfer.Gatherer }
type plainScatter struct{ transfer.Scatterer }

func plainStages(t testing.TB, _ string, reg *mem.Registry, _ transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
	g, err := gatherhost.New(gatherhost.Settings{Registry: reg, Notify: notify})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := scatterhost.New(scatterhost.Settings{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	var _ transfer.BlockGatherer = g // the wrapped stages have it
	return plainGather{g}, plainScatter{sc}, nil
}

func TestBlocksInproc(t *testing.T) { blocksSuite(t, newWorld) }

func TestBlocksTCPZMQ(t *testing.T) { blocksSuite(t, tcpZMQWorld) }

// testBlocksByteExact moves random ids between two 3-region pools with
// unaligned bases and gaps between blocks, over several chunks, and checks
// every destination byte: the named pieces hold their sources, every other
// byte is guard.
// bcfg is the receiver's configuration; route auto to a receiver with
// bounce off must go direct.
func testBlocksByteExact(t *testing.T, w *world, route Route, bcfg Config) {
	a, b := w.node("a", testConfig()), w.node("b", bcfg)
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
		if want := map[Route]Route{RouteAuto: RouteDirect}[route]; bt.Route() != route && bt.Route() != want {
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
	if route == RouteAuto && a.Stats().Fallbacks == 0 {
		t.Fatal("a block request to a peer without bounce was not counted as a fallback")
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

// TestBlocksHostileWant sends block-table WANTs a real sender never would:
// each is refused with a NACK saying why, before any region is granted.
func TestBlocksHostileWant(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	newKVPool(t, b, "kv", 2, 32, 1024, 1024, 3)
	// A pool in memory only "someone" may write.
	buf, err := mem.Alloc(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	w.bufs = append(w.bufs, buf)
	if err := b.RegisterMemoryFor(buf.Desc(), "someone"); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterPool("private", transfer.Pool{Regions: []uint64{buf.Desc().Addr}, BlockLen: 1024, Stride: 1024, Blocks: 8, Kind: transfer.Host}); err != nil {
		t.Fatal(err)
	}
	im := newImpostor(t, w, b)
	cases := []struct {
		name string
		wb   wire.WantBlocks
		want string
	}{
		{"unknown pool", wire.WantBlocks{Pool: "nope", BlockLen: 1024, Pieces: 2, IDs: []uint32{0}}, `no pool "nope"`},
		{"block length", wire.WantBlocks{Pool: "kv", BlockLen: 2048, Pieces: 2, IDs: []uint32{0}}, "blocks of 1024 bytes, not 2048"},
		{"region count", wire.WantBlocks{Pool: "kv", BlockLen: 1024, Pieces: 3, IDs: []uint32{0}}, "2 regions, not 3"},
		{"id out of range", wire.WantBlocks{Pool: "kv", BlockLen: 1024, Pieces: 4, IDs: []uint32{0, 32}}, "not below the pool's 32 blocks"},
		{"id twice", wire.WantBlocks{Pool: "kv", BlockLen: 1024, Pieces: 6, IDs: []uint32{4, 9, 4}}, "listed twice"},
		{"pool not writable by the peer", wire.WantBlocks{Pool: "private", BlockLen: 1024, Pieces: 1, IDs: []uint32{0}}, "may not write"},
	}
	for i, c := range cases {
		wb := c.wb
		req := uint64(100 + i)
		im.send(t, "b", &wire.Want{Request: req, ChunkBytes: []uint64{wb.Pieces * wb.BlockLen}, Endpoint: im.ch.LocalEndpoint(), Blocks: &wb})
		n, ok := im.recv(t, 5*time.Second).(*wire.Nack)
		if !ok || n.Request != req || n.Code != wire.NackBadBlocks || !strings.Contains(n.Reason, c.want) {
			t.Fatalf("%s: got %#v, want a bad-blocks NACK saying %q", c.name, n, c.want)
		}
	}
	if got := b.Stats().RejectedWants; got != uint64(len(cases)) {
		t.Fatalf("rejected WANTs %d, want %d", got, len(cases))
	}
	settled(t, b)
	for _, p := range []string{"kv", "private"} {
		if err := b.DeregisterPool(p); err != nil {
			t.Fatalf("refused WANTs left pool %s held: %v", p, err)
		}
	}
}

// TestBlocksHostileData grants a valid block-table WANT and then sends
// DATAs whose piece range a real sender never would: each is refused with
// a NACK (bad-blocks) before any byte is scattered.
func TestBlocksHostileData(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	dst := newKVPool(t, b, "kv", 2, 32, 1024, 1100, 3)
	im := newImpostor(t, w, b)
	cases := []struct {
		name string
		data func(req, region uint64) *wire.Data
		want string
	}{
		{"range past the request", func(req, region uint64) *wire.Data {
			return &wire.Data{Request: req, Region: region, Pieces: wire.PieceRange{First: 5, Count: 2}}
		}, "pass the request's 6"},
		{"range past the region", func(req, region uint64) *wire.Data {
			return &wire.Data{Request: req, Region: region, Pieces: wire.PieceRange{First: 0, Count: 6}}
		}, "pass the 4096-byte region"},
		{"runs for a block request", func(req, region uint64) *wire.Data {
			return &wire.Data{Request: req, Region: region, Runs: []transfer.Run{{Addr: dst.pool.Regions[0], Len: 1024, Count: 1}}}
		}, "scatter runs for a block-table request"},
	}
	for i, c := range cases {
		req := uint64(200 + i)
		im.send(t, "b", &wire.Want{Request: req, ChunkBytes: []uint64{4096, 2048}, Endpoint: im.ch.LocalEndpoint(),
			Blocks: &wire.WantBlocks{Pool: "kv", BlockLen: 1024, Pieces: 6, IDs: []uint32{1, 30, 7}}})
		g, ok := im.recv(t, 5*time.Second).(*wire.Grant)
		if !ok || g.Request != req {
			t.Fatalf("%s: expected a GRANT, got %#v", c.name, g)
		}
		im.send(t, "b", c.data(req, g.Credits[0].Region))
		var n *wire.Nack
		for n == nil {
			m := im.recv(t, 5*time.Second)
			if m == nil {
				t.Fatalf("%s: no NACK", c.name)
			}
			n, _ = m.(*wire.Nack)
		}
		if n.Request != req || n.Code != wire.NackBadBlocks || !strings.Contains(n.Reason, c.want) {
			t.Fatalf("%s: NACK %#v, want bad-blocks saying %q", c.name, n, c.want)
		}
		im.send(t, "b", &wire.Want{Request: req, Endpoint: im.ch.LocalEndpoint()}) // cancel
	}
	// A piece range for a descriptor-form flow is refused too.
	cr := im.grant(t, b, 300, 4096)
	im.send(t, "b", &wire.Data{Request: 300, Region: cr.Region, Pieces: wire.PieceRange{First: 0, Count: 1}})
	if n, ok := im.recv(t, 5*time.Second).(*wire.Nack); !ok || n.Code != wire.NackBadBlocks || !strings.Contains(n.Reason, "not a block-table one") {
		t.Fatalf("piece range for a descriptor flow: %#v", n)
	}
	for i, c := range dst.buf {
		if c != guardByte {
			t.Fatalf("destination byte %d changed (%#x) though every DATA was refused", i, c)
		}
	}
	settled(t, b)
	if err := b.DeregisterPool("kv"); err != nil {
		t.Fatalf("ended flows left the pool held: %v", err)
	}
}

// TestExpandRunsMatchesPieces checks the one expansion of a block-table
// chunk (for stages without the capability): its runs copy exactly the
// chunk's pieces, piece First+k at region offset RegionOff+k*BlockLen, and
// consecutive ids of contiguous blocks merge.
func TestExpandRunsMatchesPieces(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		blen := rapid.Uint64Range(1, 64).Draw(rt, "blockLen")
		stride := blen + rapid.Uint64Range(0, 8).Draw(rt, "gap")
		blocks := rapid.Uint64Range(1, 40).Draw(rt, "blocks")
		p := transfer.Pool{BlockLen: blen, Stride: stride, Blocks: blocks, Kind: transfer.Host}
		for r := range rapid.IntRange(1, 3).Draw(rt, "regions") {
			p.Regions = append(p.Regions, uint64(r+1)<<20)
		}
		ids := rapid.SliceOfN(rapid.Uint32Range(0, uint32(blocks-1)), 1, 30).Draw(rt, "ids")
		b := transfer.Blocks{Pool: p, IDs: ids}
		first := rapid.Uint64Range(0, b.Len()-1).Draw(rt, "first")
		c := transfer.BlockCopy{Blocks: b, First: first, Count: rapid.Uint64Range(1, b.Len()-first).Draw(rt, "count"), RegionOff: rapid.Uint64Range(0, 9).Draw(rt, "off")}
		// Model: region offset -> source address, byte by byte.
		want := map[uint64]uint64{}
		for k := uint64(0); k < c.Count; k++ {
			d := b.Piece(c.First + k)
			for i := uint64(0); i < blen; i++ {
				want[c.RegionOff+k*blen+i] = d.Addr + i
			}
		}
		got := map[uint64]uint64{}
		for _, r := range expandRuns(c) {
			for j := uint64(0); j < r.Count; j++ {
				for i := uint64(0); i < r.Len; i++ {
					off := r.RegionOff + j*r.RegionStride + i
					if _, dup := got[off]; dup {
						rt.Fatalf("region offset %d copied twice", off)
					}
					got[off] = r.Addr + j*r.AddrStride + i
				}
			}
		}
		if len(got) != len(want) {
			rt.Fatalf("runs copy %d bytes, want %d", len(got), len(want))
		}
		for off, a := range want {
			if got[off] != a {
				rt.Fatalf("region offset %d from %#x, want %#x", off, got[off], a)
			}
		}
	})
}

// TestRegisterPool checks what RegisterPool refuses, naming why, and that a
// pool in use can be neither deregistered nor have its memory deregistered.
func TestRegisterPool(t *testing.T) {
	w := newWorld(t)
	gate := make(chan struct{})
	mkEngine := w.engine
	w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
		if name == "a" {
			opt.Gate = gate // a's direct writes wait until the gate opens
		}
		return mkEngine(t, name, opt)
	}
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	buf := a.buffer(t, 64<<10)
	base := mem.DescOf(buf).Addr
	good := transfer.Pool{Regions: []uint64{base, base + 32<<10}, BlockLen: 1024, Stride: 1024, Blocks: 32, Kind: transfer.Host}
	outside := good
	outside.Regions = []uint64{base, base + 48<<10} // region 1 runs past the buffer
	overlap := good
	overlap.Regions = []uint64{base, base + 512}
	for _, c := range []struct {
		name, pool string
		p          transfer.Pool
		want       string
	}{
		{"empty name", "", good, "empty name"},
		{"control character", "kv\n", good, "control character"},
		{"invalid pool", "kv", overlap, "overlap"},
		{"region outside registered memory", "kv", outside, "region 1"},
	} {
		if err := a.RegisterPool(c.pool, c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	if err := a.RegisterPool("kv", good); err != nil {
		t.Fatal(err)
	}
	if err := a.RegisterPool("kv", good); err == nil {
		t.Fatal("a second pool named kv was registered")
	}
	if err := a.DeregisterMemory(mem.DescOf(buf)); !errors.Is(err, transfer.ErrInUse) || !strings.Contains(err.Error(), `pool "kv"`) {
		t.Fatalf("deregister memory under a pool: %v", err)
	}
	dst := newKVPool(t, b, "kv", 2, 32, 1024, 1024, 0)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Route: RouteDirect, Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: []uint32{1, 2}, DstPool: "kv", DstIDs: []uint32{3, 4}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeregisterPool("kv"); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("deregister a pool a request uses: %v", err)
	}
	close(gate)
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	if err := bt.Release(); err != nil {
		t.Fatal(err)
	}
	checkLanded(t, &kvPool{pool: good, buf: buf, base: base}, dst, []uint32{1, 2}, []uint32{3, 4})
	if err := a.DeregisterPool("kv"); err != nil {
		t.Fatalf("deregister the pool once its request is quiescent: %v", err)
	}
	if err := a.DeregisterMemory(mem.DescOf(buf)); err != nil {
		t.Fatalf("deregister the memory once its pool is gone: %v", err)
	}
}

// TestBlocksRepeatedWantChecksOnce: a retransmitted block-table WANT of a
// live flow is recognised as a repeat before the O(ids) table check (the
// check ran once, for the first WANT), and a conflicting one is refused
// without it too.
func TestBlocksRepeatedWantChecksOnce(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	newKVPool(t, b, "kv", 2, 32, 1024, 1024, 3)
	im := newImpostor(t, w, b)
	want := &wire.Want{Request: 7, ChunkBytes: []uint64{4096, 2048}, Endpoint: im.ch.LocalEndpoint(),
		Blocks: &wire.WantBlocks{Pool: "kv", BlockLen: 1024, Pieces: 6, IDs: []uint32{1, 30, 7}}}
	im.send(t, "b", want)
	if g, ok := im.recv(t, 5*time.Second).(*wire.Grant); !ok || g.Request != 7 {
		t.Fatalf("expected a GRANT, got %#v", g)
	}
	for range 3 {
		im.send(t, "b", want)
	}
	eventually(t, func() bool { return b.Stats().DuplicateWants == 3 })
	conflicting := *want
	conflicting.ChunkBytes = []uint64{6144}
	im.send(t, "b", &conflicting)
	if n, ok := im.recv(t, 5*time.Second).(*wire.Nack); !ok || n.Code != wire.NackConflictingWant {
		t.Fatalf("a conflicting WANT got %#v, want a NACK %v", n, wire.NackConflictingWant)
	}
	if got := b.stats.blockTableChecks.Load(); got != 1 {
		t.Fatalf("the block table was checked %d times for one flow, want 1", got)
	}
	im.send(t, "b", &wire.Want{Request: 7, Endpoint: im.ch.LocalEndpoint()}) // cancel
	settled(t, b)
	if err := b.DeregisterPool("kv"); err != nil {
		t.Fatalf("repeated WANTs left the pool held: %v", err)
	}
}

// poolInMemory returns a node, 64 KiB of memory registered with it and a
// pool of 64 blocks that lies in that memory, not registered.
func poolInMemory(t *testing.T) (*node, transfer.Desc, transfer.Pool) {
	a := newWorld(t).node("a", testConfig())
	d := mem.DescOf(a.buffer(t, 64<<10))
	return a, d, transfer.Pool{Regions: []uint64{d.Addr}, BlockLen: 1024, Stride: 1024, Blocks: 64, Kind: transfer.Host}
}

// TestRegisterPoolRacingDeregisterMemory interleaves RegisterPool of a pool
// in a range with DeregisterMemory of that range: a pool is never left
// registered over memory that was deregistered. Either the pool's
// registration fails (the memory is gone) or the deregistration is refused
// with ErrInUse (the pool lies in it).
func TestRegisterPoolRacingDeregisterMemory(t *testing.T) {
	a, d, p := poolInMemory(t)
	registered, deregistered := 0, 0
	for i := range 1000 {
		var poolErr, memErr error
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			poolErr = a.RegisterPool("kv", p)
		}()
		go func() {
			defer wg.Done()
			<-start
			memErr = a.DeregisterMemory(d)
		}()
		close(start)
		wg.Wait()
		switch {
		case poolErr == nil && memErr == nil:
			t.Fatalf("iteration %d: the pool was registered and its memory deregistered", i)
		case poolErr == nil:
			if !errors.Is(memErr, transfer.ErrInUse) {
				t.Fatalf("iteration %d: deregister under a pool: %v, want ErrInUse", i, memErr)
			}
			registered++
			if err := a.DeregisterPool("kv"); err != nil {
				t.Fatal(err)
			}
		case memErr == nil:
			deregistered++
			if err := a.RegisterMemory(d); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("iteration %d: both failed: pool %v, memory %v", i, poolErr, memErr)
		}
	}
	t.Logf("pool won %d times, deregistration %d", registered, deregistered)
}

// TestRegisterPoolInDeregisterMemoryWindow registers a pool in the moment
// DeregisterMemory has found no pool over its memory and not yet removed
// it: the registration must wait for the removal and then fail, not land
// over memory about to be deregistered.
func TestRegisterPoolInDeregisterMemoryWindow(t *testing.T) {
	a, d, p := poolInMemory(t)
	poolErr := make(chan error, 1)
	a.deregisterChecked = func() {
		go func() { poolErr <- a.RegisterPool("kv", p) }()
		// Give the registration every chance to complete inside the window
		// (it cannot once the window is locked against it).
		select {
		case err := <-poolErr:
			poolErr <- err
		case <-time.After(200 * time.Millisecond):
		}
	}
	memErr := a.DeregisterMemory(d)
	a.deregisterChecked = nil
	if err := <-poolErr; err == nil {
		t.Fatalf("a pool was registered while its memory was deregistered (deregister: %v)", memErr)
	} else if memErr != nil {
		t.Fatalf("deregister: %v (the pool's registration failed: %v)", memErr, err)
	}
	if err := a.RegisterMemory(d); err != nil { // for the world's cleanup
		t.Fatal(err)
	}
}
