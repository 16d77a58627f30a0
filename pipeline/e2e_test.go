package pipeline

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

// e2e runs the end-to-end suite on one world constructor, so the same tests
// pass over every control plane.
func e2e(t *testing.T, mk func(testing.TB) *world) {
	t.Run("one-transfer", func(t *testing.T) { testOneTransfer(t, mk(t)) })
	t.Run("ten-times-the-arena", func(t *testing.T) { testLargerThanArena(t, mk(t)) })
	t.Run("bidirectional-8", func(t *testing.T) { testBidirectional(t, mk(t)) })
	t.Run("four-senders-one-receiver", func(t *testing.T) { testManySenders(t, mk(t)) })
	t.Run("submit-from-many-goroutines", func(t *testing.T) { testConcurrentSubmit(t, mk(t)) })
	t.Run("direct-below-gates", func(t *testing.T) { testDirectBelowGates(t, mk(t)) })
	t.Run("bounce-disabled-equals-direct", func(t *testing.T) { testBounceDisabled(t, mk(t)) })
}

func TestEndToEndInproc(t *testing.T) { e2e(t, newWorld) }

func testOneTransfer(t *testing.T, w *world) {
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	l := kvLayout{count: 1024, size: 4096, fragmented: true}
	src, dst := a.buffer(t, 4<<20), b.buffer(t, 4<<20)
	connect(t, a, b)
	j := prepare(src, dst, l, 1)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if bt.Route() != RouteBounce {
		t.Fatalf("route = %v (%s), want bounce", bt.Route(), bt.RouteReason())
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
	if r, q := bt.Retirement(); !r || !q {
		t.Fatalf("retirement = (%v, %v), want retired and quiescent", r, q)
	}
	if err := bt.Release(); err != nil {
		t.Fatal(err)
	}
	if got := a.Stats().BounceBytes; got != 4<<20 {
		t.Fatalf("bounce bytes = %d, want %d", got, 4<<20)
	}
	settled(t, a, b)
}

func testLargerThanArena(t *testing.T, w *world) {
	cfg := testConfig()
	cfg.ArenaSize = 2 << 20 // both arenas: the transfer is 10x larger
	a, b := w.node("a", cfg), w.node("b", cfg)
	l := kvLayout{count: 5120, size: 4096, fragmented: true}
	src, dst := a.buffer(t, 20<<20), b.buffer(t, 20<<20)
	connect(t, a, b)
	j := prepare(src, dst, l, 2)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
	if g := b.Stats().Grants; g < 20 {
		t.Fatalf("receiver granted %d regions; a 20 MiB transfer through a 2 MiB arena in 1 MiB chunks needs >= 20", g)
	}
	settled(t, a, b)
}

func testBidirectional(t *testing.T, w *world) {
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	l := kvLayout{count: 512, size: 4096, fragmented: true}
	const per = 2 << 20
	srcA, dstA := a.buffer(t, 4*per), a.buffer(t, 4*per)
	srcB, dstB := b.buffer(t, 4*per), b.buffer(t, 4*per)
	connect(t, a, b)
	var jobs []job
	var batches []*Batch
	for i := 0; i < 4; i++ {
		o := uint64(i) * per
		ja := prepare(srcA[o:o+per], dstB[o:o+per], l, uint64(100+i))
		jb := prepare(srcB[o:o+per], dstA[o:o+per], l, uint64(200+i))
		ba, err := a.Submit(Request{Peer: "b", Src: ja.src, Dst: ja.dst})
		if err != nil {
			t.Fatal(err)
		}
		bb, err := b.Submit(Request{Peer: "a", Src: jb.src, Dst: jb.dst})
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, ja, jb)
		batches = append(batches, ba, bb)
	}
	for _, bt := range batches {
		if err := wait(t, bt); err != nil {
			t.Fatal(err)
		}
		if bt.Route() != RouteBounce {
			t.Fatalf("route %v: %s", bt.Route(), bt.RouteReason())
		}
	}
	for _, j := range jobs {
		j.verify(t)
	}
	settled(t, a, b)
}

func testManySenders(t *testing.T, w *world) {
	cfg := testConfig()
	rcfg := cfg
	rcfg.ArenaSize = 2 << 20 // four senders wanting 4 x W x 1 MiB over-subscribe it
	recv := w.node("recv", rcfg)
	var senders []*node
	for i := 0; i < 4; i++ {
		senders = append(senders, w.node(fmt.Sprintf("s%d", i), cfg))
	}
	const per = 4 << 20
	dst := recv.buffer(t, 4*per)
	connect(t, append([]*node{recv}, senders...)...)
	l := kvLayout{count: 1024, size: 4096, fragmented: true}
	var jobs []job
	var batches []*Batch
	for i, s := range senders {
		o := uint64(i) * per
		j := prepare(s.buffer(t, per), dst[o:o+per], l, uint64(300+i))
		bt, err := s.Submit(Request{Peer: "recv", Src: j.src, Dst: j.dst})
		if err != nil {
			t.Fatal(err)
		}
		jobs, batches = append(jobs, j), append(batches, bt)
	}
	for i, bt := range batches {
		if err := wait(t, bt); err != nil {
			t.Fatalf("sender %d: %v", i, err)
		}
		jobs[i].verify(t)
	}
	settled(t, append([]*node{recv}, senders...)...)
}

func testConcurrentSubmit(t *testing.T, w *world) {
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	const workers, per = 16, 256 << 10
	src, dst := a.buffer(t, workers*per), b.buffer(t, workers*per)
	connect(t, a, b)
	l := kvLayout{count: 64, size: 4096, fragmented: true}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			o := uint64(i) * per
			j := prepare(src[o:o+per], dst[o:o+per], l, uint64(400+i))
			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteBounce})
			if err != nil {
				errs <- err
				return
			}
			if err := wait(t, bt); err != nil {
				errs <- err
				return
			}
			errs <- j.check()
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := a.Stats().BounceSubmits; got != workers {
		t.Fatalf("bounce submits = %d, want %d", got, workers)
	}
	settled(t, a, b)
}

func testDirectBelowGates(t *testing.T, w *world) {
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	src, dst := a.buffer(t, 1<<20), b.buffer(t, 1<<20)
	connect(t, a, b)
	for _, tc := range []struct {
		name string
		l    kvLayout
	}{
		{"few-descriptors", kvLayout{count: 16, size: 4096, fragmented: true}},    // < MinDescriptors (64)
		{"large-descriptors", kvLayout{count: 64, size: 16384, fragmented: true}}, // avg 16 KiB is the gate: passes
		{"too-large-descriptors", kvLayout{count: 32, size: 32768, fragmented: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := prepare(src[:tc.l.size*uint64(tc.l.count)], dst[:tc.l.size*uint64(tc.l.count)], tc.l, 500)
			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
			if err != nil {
				t.Fatal(err)
			}
			want := RouteDirect
			if tc.name == "large-descriptors" {
				want = RouteBounce
			}
			if bt.Route() != want {
				t.Fatalf("route = %v (%s), want %v", bt.Route(), bt.RouteReason(), want)
			}
			if err := wait(t, bt); err != nil {
				t.Fatal(err)
			}
			j.verify(t)
			clear(dst)
		})
	}
	settled(t, a, b)
}

func testBounceDisabled(t *testing.T, w *world) {
	// The same transfer through bounce and through a bounce-disabled agent
	// produces the same destination bytes.
	on := testConfig()
	off := testConfig()
	off.Enabled = false
	a, b := w.node("a", on), w.node("b", on)
	c := w.node("c", off)
	l := kvLayout{count: 512, size: 4096, fragmented: true}
	src := a.buffer(t, 2<<20)
	srcC := c.buffer(t, 2<<20)
	dst1, dst2 := b.buffer(t, 2<<20), b.buffer(t, 2<<20)
	connect(t, a, b, c)
	j1 := prepare(src, dst1, l, 600)
	j2 := prepare(srcC, dst2, l, 600)
	b1, err := a.Submit(Request{Peer: "b", Src: j1.src, Dst: j1.dst})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := c.Submit(Request{Peer: "b", Src: j2.src, Dst: j2.dst})
	if err != nil {
		t.Fatal(err)
	}
	if b1.Route() != RouteBounce || b2.Route() != RouteDirect {
		t.Fatalf("routes = %v, %v; want bounce, direct", b1.Route(), b2.Route())
	}
	if on, why := c.BounceEnabled(); on || why == "" {
		t.Fatalf("disabled agent reports bounce on=%v reason=%q", on, why)
	}
	for _, bt := range []*Batch{b1, b2} {
		if err := wait(t, bt); err != nil {
			t.Fatal(err)
		}
	}
	j1.verify(t)
	j2.verify(t)
	// Same permutation and seed: the destination buffers must be identical.
	for i := range dst1 {
		if dst1[i] != dst2[i] {
			t.Fatalf("byte %d differs between bounce (%#x) and direct (%#x)", i, dst1[i], dst2[i])
		}
	}
	settled(t, a, b)
}

// isErr reports whether err wraps target (test helper for readability).
func isErr(err, target error) bool { return errors.Is(err, target) }

var _ = transfer.ErrTimeout
