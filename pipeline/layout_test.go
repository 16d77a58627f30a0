package pipeline

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline/convert"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// newLayoutPool registers a pool of layout l (blocks blocks, pad bytes
// between blocks, regions apart and unaligned) on n; every byte of its
// buffer is guardByte.
func newLayoutPool(t testing.TB, n *node, name string, l transfer.Layout, blocks, pad, skew uint64) *workload.KVPool {
	t.Helper()
	bl := l.BlockLen()
	stride := bl + pad
	ext := (blocks-1)*stride + bl
	gap := stride + 13
	size := skew + uint64(l.Regions())*(ext+gap) + 64
	buf := n.buffer(t, size)
	for i := range buf {
		buf[i] = guardByte
	}
	base := mem.DescOf(buf).Addr
	p := transfer.Pool{BlockLen: bl, Stride: stride, Blocks: blocks, Kind: transfer.Host}
	for r := range l.Regions() {
		p.Regions = append(p.Regions, base+skew+uint64(r)*(ext+gap))
	}
	if err := n.RegisterPoolLayout(name, p, l); err != nil {
		t.Fatal(err)
	}
	return &workload.KVPool{Pool: p, Layout: l, Mem: buf, Base: base}
}

// convCase is a set of prefill ranks (senders) and decode ranks
// (receivers) of one model: every sender sends the request's tokens to
// every receiver it shares a head with, all at once.
type convCase struct {
	name     string
	src, dst []transfer.Layout
}

func kvl(heads, first, tokens uint32, o transfer.Order) transfer.Layout {
	return transfer.Layout{Layers: 3, KV: 2, Heads: heads, FirstHead: first, HeadDim: 8, Tokens: tokens, Elem: 2, Order: o}
}

func convCases() []convCase {
	const nhd, hnd = transfer.NHD, transfer.HND
	return []convCase{
		{"tp-split", []transfer.Layout{kvl(4, 0, 4, nhd)}, []transfer.Layout{kvl(2, 0, 4, nhd), kvl(2, 2, 4, nhd)}},
		{"tp-merge", []transfer.Layout{kvl(1, 0, 4, nhd), kvl(1, 1, 4, nhd), kvl(2, 2, 4, nhd)}, []transfer.Layout{kvl(4, 0, 4, nhd)}},
		{"block-16-to-32", []transfer.Layout{kvl(2, 0, 4, nhd)}, []transfer.Layout{kvl(2, 0, 8, nhd)}},
		{"block-32-to-16", []transfer.Layout{kvl(2, 0, 8, hnd)}, []transfer.Layout{kvl(2, 0, 4, hnd)}},
		{"nhd-to-hnd", []transfer.Layout{kvl(2, 0, 4, nhd)}, []transfer.Layout{kvl(2, 0, 4, hnd)}},
		{"merge-grow-swap", []transfer.Layout{kvl(2, 0, 4, nhd), kvl(2, 2, 4, hnd)}, []transfer.Layout{kvl(4, 0, 8, hnd)}},
		{"split-shrink-swap", []transfer.Layout{kvl(4, 0, 8, hnd)}, []transfer.Layout{kvl(2, 0, 4, nhd), kvl(2, 2, 2, hnd)}},
	}
}

// TestConvertedBlocks moves every conversion class between host pools,
// on the bounce route (the host stages' shaped copies, and stages without
// the capability, which get runs), the direct route and route auto: senders run at
// once, several into the same destination blocks in a merge, and every
// destination byte is checked: each head of each token of each layer's K
// and V where the destination layout puts it, every other byte guard.
func TestConvertedBlocks(t *testing.T) {
	for _, c := range convCases() {
		for _, mode := range []string{"bounce", "direct", "plain-stages", "auto"} {
			t.Run(c.name+"/"+mode, func(t *testing.T) {
				w := newWorld(t)
				route := RouteBounce
				switch mode {
				case "direct":
					route = RouteDirect
				case "plain-stages":
					w.stages = plainStages
				case "auto":
					route = RouteAuto
				}
				testConverted(t, w, c, route)
			})
		}
	}
}

// TestConvertedBlocksTCP is TestConvertedBlocks's merge over tcp and zmq.
func TestConvertedBlocksTCP(t *testing.T) {
	testConverted(t, tcpZMQWorld(t), convCases()[5], RouteBounce)
}

func testConverted(t *testing.T, w *world, c convCase, route Route) {
	cfg := testConfig()
	cfg.MaxChunk = 4 << 10 // several chunks a request
	const blocks = 40
	var nodes []*node
	var srcs, dsts []*workload.KVPool
	for i, l := range c.src {
		n := w.node(fmt.Sprintf("p%d", i), cfg)
		nodes = append(nodes, n)
		srcs = append(srcs, newLayoutPool(t, n, "kv", l, blocks, uint64(i)*24, uint64(i)+1))
	}
	for i, l := range c.dst {
		n := w.node(fmt.Sprintf("d%d", i), cfg)
		nodes = append(nodes, n)
		dsts = append(dsts, newLayoutPool(t, n, "kv-in", l, blocks, uint64(i)*40, uint64(i)+3))
	}
	connect(t, nodes...)
	// The request's tokens: a whole number of every block size.
	const tokens = 64
	rng := rand.New(rand.NewPCG(28, uint64(len(c.name))))
	srcIDs := make([][]uint32, len(srcs))
	for i, s := range srcs {
		srcIDs[i] = randomIDs(rng, tokens/int(s.Layout.Tokens), blocks)
		s.Put(5, srcIDs[i], 0, 0)
	}
	dstIDs := make([][]uint32, len(dsts))
	for j, d := range dsts {
		dstIDs[j] = randomIDs(rng, tokens/int(d.Layout.Tokens), blocks)
	}
	var batches []*Batch
	for i := range srcs {
		for j := range dsts {
			if _, err := convert.Plan(srcs[i].Layout, dsts[j].Layout, convert.Auto); err != nil {
				continue // no head in common
			}
			b, err := nodes[i].Submit(Request{Peer: fmt.Sprintf("d%d", j), Route: route, Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: srcIDs[i], DstPool: "kv-in", DstIDs: dstIDs[j]}})
			if err != nil {
				t.Fatalf("p%d -> d%d: %v", i, j, err)
			}
			if route != RouteAuto && b.Route() != route {
				t.Fatalf("p%d -> d%d: route %v (%s), want %v", i, j, b.Route(), b.RouteReason(), route)
			}
			batches = append(batches, b)
		}
	}
	for _, b := range batches {
		if err := wait(t, b); err != nil {
			t.Fatal(err)
		}
		if err := b.Release(); err != nil {
			t.Fatal(err)
		}
	}
	for j, d := range dsts {
		if err := d.Check(5, dstIDs[j], 0, 0); err != nil {
			t.Fatalf("d%d: %v", j, err)
		}
		want := make([]byte, len(d.Mem))
		for i := range want {
			want[i] = guardByte
		}
		m := *d
		m.Mem = want
		m.Put(5, dstIDs[j], 0, 0)
		for i := range want {
			if want[i] != d.Mem[i] {
				t.Fatalf("d%d: byte %d of the pool's buffer is %#x, want %#x (outside every head of the request)", j, i, d.Mem[i], want[i])
			}
		}
	}
	settled(t, nodes...)
}

// TestConvertedRefused: layouts that cannot be converted, and ids that do
// not pair as groups, are refused at Submit with the reason, before
// anything moves.
func TestConvertedRefused(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	src := newLayoutPool(t, a, "kv", kvl(2, 0, 4, transfer.NHD), 16, 0, 1)
	dsts := map[string]transfer.Layout{
		"headdim": {Layers: 3, KV: 2, Heads: 1, HeadDim: 16, Tokens: 4, Elem: 2, Order: transfer.NHD},
		"elem":    {Layers: 3, KV: 2, Heads: 4, HeadDim: 8, Tokens: 4, Elem: 1, Order: transfer.NHD},
		"layers":  {Layers: 2, KV: 2, Heads: 3, HeadDim: 8, Tokens: 2, Elem: 2, Order: transfer.NHD},
		"heads":   kvl(2, 2, 4, transfer.NHD),
		"tokens":  kvl(2, 0, 8, transfer.NHD),
	}
	var pools []*workload.KVPool
	for name, l := range dsts {
		pools = append(pools, newLayoutPool(t, b, name, l, 16, 0, 2))
	}
	connect(t, a, b)
	src.Put(1, []uint32{0, 1, 2}, 0, 0)
	for _, c := range []struct {
		pool string
		ids  []uint32
		want string
	}{
		{"headdim", []uint32{0, 1, 2}, "heads of 8 elements against 16"},
		{"elem", []uint32{0, 1, 2}, "elements of 2 bytes against 1"},
		{"layers", []uint32{0, 1, 2}, "3 layers against 2"},
		{"heads", []uint32{0, 1, 2}, "no head in common"},
		{"tokens", []uint32{0, 1, 2}, "do not pair as groups of 2 and 1"},
		{"tokens", []uint32{0, 0}, "listed twice"},
	} {
		for _, route := range []Route{RouteBounce, RouteDirect, RouteAuto} {
			ids := []uint32{0, 1, 2}
			if c.pool == "tokens" && c.want != "listed twice" {
				ids = []uint32{0, 1, 2}
			} else if c.pool == "tokens" {
				ids = []uint32{0, 1, 2, 3}
			}
			_, err := a.Submit(Request{Peer: "b", Route: route, Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: ids, DstPool: c.pool, DstIDs: c.ids}})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v to %s: %v, want an error saying %q", route, c.pool, err, c.want)
			}
			if c.pool != "tokens" && !errors.Is(err, convert.ErrIncompatible) {
				t.Fatalf("%v to %s: %v does not wrap ErrIncompatible", route, c.pool, err)
			}
		}
	}
	for _, p := range pools {
		for i, c := range p.Mem {
			if c != guardByte {
				t.Fatalf("byte %d of a destination changed though every request was refused", i)
			}
		}
	}
	if err := a.DeregisterPool("kv"); err != nil {
		t.Fatalf("a refused request holds the source pool: %v", err)
	}
	if err := a.RegisterPoolLayout("bad", src.Pool, kvl(3, 0, 4, transfer.NHD)); err == nil || !strings.Contains(err.Error(), "layout block is") {
		t.Fatalf("a layout not matching its pool registered: %v", err)
	}
	settled(t, a, b)
}

// TestConvertedHostileWant sends shaped WANTs a real sender never would:
// each is refused with a bad-blocks NACK before any region is granted.
func TestConvertedHostileWant(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	newLayoutPool(t, b, "kv", transfer.Layout{Layers: 1, KV: 2, Heads: 2, HeadDim: 8, Tokens: 4, Elem: 2, Order: transfer.NHD}, 8, 0, 3) // blocks of 128 B
	im := newImpostor(t, w, b)
	seg := func(blk, off, n uint32) transfer.Segment { return transfer.Segment{Block: blk, Off: off, Len: n} }
	cases := []struct {
		name string
		wb   wire.WantBlocks
		want string
	}{
		{"block length", wire.WantBlocks{Pool: "kv", BlockLen: 256, Pieces: 2, IDs: []uint32{0}, Shape: &transfer.Shape{Group: 1, Segs: []transfer.Segment{seg(0, 0, 64)}}}, "not the shape's 256"},
		{"region count", wire.WantBlocks{Pool: "kv", BlockLen: 128, Pieces: 3, IDs: []uint32{0}, Shape: &transfer.Shape{Group: 1, Segs: []transfer.Segment{seg(0, 0, 64)}}}, "2 regions"},
		{"id out of range", wire.WantBlocks{Pool: "kv", BlockLen: 128, Pieces: 2, IDs: []uint32{0, 8}, Shape: &transfer.Shape{Group: 2, Segs: []transfer.Segment{seg(1, 0, 64)}}}, "not below the pool's 8 blocks"},
		{"id twice", wire.WantBlocks{Pool: "kv", BlockLen: 128, Pieces: 2, IDs: []uint32{3, 3}, Shape: &transfer.Shape{Group: 2, Segs: []transfer.Segment{seg(0, 0, 64), seg(1, 0, 64)}}}, "listed twice"},
	}
	for i, c := range cases {
		wb := c.wb
		req := uint64(100 + i)
		im.send(t, "b", &wire.Want{Request: req, ChunkBytes: []uint64{wb.Pieces * wb.UnitLen()}, Endpoint: im.ch.LocalEndpoint(), Blocks: &wb})
		n, ok := im.recv(t, 5*time.Second).(*wire.Nack)
		if !ok || n.Request != req || n.Code != wire.NackBadBlocks || !strings.Contains(n.Reason, c.want) {
			t.Fatalf("%s: got %#v, want a bad-blocks NACK saying %q", c.name, n, c.want)
		}
	}
	settled(t, b)
	if err := b.DeregisterPool("kv"); err != nil {
		t.Fatalf("refused WANTs left the pool held: %v", err)
	}
}

// TestConvertedHostileData grants a valid shaped WANT and then sends DATAs
// whose unit range a real sender never would: each is refused with a
// bad-blocks NACK before any byte is scattered.
func TestConvertedHostileData(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	// Blocks of 128 B; the shape writes 32 B at 64 of the second block of
	// each group of two: 3 groups x 2 regions = 6 units of 32 B.
	dst := newLayoutPool(t, b, "kv", transfer.Layout{Layers: 1, KV: 2, Heads: 2, HeadDim: 8, Tokens: 4, Elem: 2, Order: transfer.NHD}, 8, 8, 3)
	im := newImpostor(t, w, b)
	shape := &transfer.Shape{Group: 2, Segs: []transfer.Segment{{Block: 1, Off: 64, Len: 32}}}
	want := func(req uint64) *wire.Want {
		return &wire.Want{Request: req, ChunkBytes: []uint64{128, 64}, Endpoint: im.ch.LocalEndpoint(),
			Blocks: &wire.WantBlocks{Pool: "kv", BlockLen: 128, Pieces: 6, IDs: []uint32{1, 5, 0, 7, 2, 3}, Shape: shape}}
	}
	for i, c := range []struct {
		name string
		pr   wire.PieceRange
		want string
	}{
		{"units past the request", wire.PieceRange{First: 5, Count: 2}, "pass the request's 6"},
		{"units past the region", wire.PieceRange{First: 0, Count: 5}, "pass the 128-byte region"},
	} {
		req := uint64(300 + i)
		im.send(t, "b", want(req))
		g, ok := im.recv(t, 5*time.Second).(*wire.Grant)
		if !ok || g.Request != req {
			t.Fatalf("%s: expected a GRANT, got %#v", c.name, g)
		}
		im.send(t, "b", &wire.Data{Request: req, Region: g.Credits[0].Region, Pieces: c.pr})
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
	for i, c := range dst.Mem {
		if c != guardByte {
			t.Fatalf("destination byte %d changed (%#x) though every DATA was refused", i, c)
		}
	}
	settled(t, b)
	if err := b.DeregisterPool("kv"); err != nil {
		t.Fatalf("ended flows left the pool held: %v", err)
	}
}

// TestPullBetweenLayouts: a pull moves blocks as they are, so a pull
// between pools of the same layout lands byte-exact while one between
// different layouts (here NHD into HND of one block size, which would land
// every element in the wrong place) is refused before anything moves,
// saying that a pull does not convert, and layouts that cannot be
// converted at all say why (convert.ErrIncompatible).
func TestPullBetweenLayouts(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	src := newLayoutPool(t, a, "kv", kvl(2, 0, 4, transfer.NHD), 16, 0, 1)
	same := newLayoutPool(t, b, "same", kvl(2, 0, 4, transfer.NHD), 16, 8, 2)
	hnd := newLayoutPool(t, b, "hnd", kvl(2, 0, 4, transfer.HND), 16, 0, 3)
	wide := newLayoutPool(t, b, "wide", transfer.Layout{Layers: 3, KV: 2, Heads: 1, HeadDim: 16, Tokens: 4, Elem: 2, Order: transfer.NHD}, 16, 0, 4)
	connect(t, a, b)
	ids := []uint32{3, 0, 7}
	src.Put(9, ids, 0, 0)

	bt, err := b.Pull(PullRequest{Peer: "a", Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: ids, DstPool: "same", DstIDs: ids}})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	if err := same.Check(9, ids, 0, 0); err != nil {
		t.Fatalf("pull between equal layouts: %v", err)
	}
	for _, c := range []struct {
		pool string
		is   error
		want string
	}{
		{"hnd", transfer.ErrUnsupported, "a pull does not convert layouts"},
		{"wide", convert.ErrIncompatible, "heads of 8 elements against 16"},
	} {
		_, err := b.Pull(PullRequest{Peer: "a", Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: ids, DstPool: c.pool, DstIDs: ids}})
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("pull into %s: %v, want %v saying %q", c.pool, err, c.is, c.want)
		}
		if err := b.DeregisterPool(c.pool); err != nil {
			t.Fatalf("a refused pull holds pool %s: %v", c.pool, err)
		}
	}
	for _, p := range []*workload.KVPool{hnd, wide} {
		for i, c := range p.Mem {
			if c != guardByte {
				t.Fatalf("byte %d of a refused pull's destination changed", i)
			}
		}
	}
	if st := b.Stats(); st.Pulls != 1 {
		t.Fatalf("pulls counted %d, want the one that was made", st.Pulls)
	}
	settled(t, a, b)
}
