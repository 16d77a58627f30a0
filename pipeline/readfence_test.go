package pipeline

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/transfer"
)

// fenceStall is a holder's loopback engine whose first fence of a read
// grant, once armed, waits until release: the tcp engine's fence waits so
// (up to its grace per chunk) for a READ response its puller does not
// drain. Every other fence is the loopback engine's.
type fenceStall struct {
	*loopback.Engine
	arm     atomic.Bool
	stalled chan transfer.Desc // the region of the held fence, when it starts
	release chan struct{}
	ended   atomic.Bool // the held fence returned
}

func (e *fenceStall) FenceReads(d transfer.Desc) {
	if !e.arm.CompareAndSwap(true, false) {
		e.Engine.FenceReads(d)
		return
	}
	e.stalled <- d
	<-e.release
	e.Engine.FenceReads(d)
	e.ended.Store(true)
}

// heldOut reports whether n's arena region at off is out of the free pool
// as local staging, granted to no flow: the scheduler keeps exactly one
// local region (the caller's) and the region is no flow's.
func heldOut(t *testing.T, n *node, off uint64) bool {
	t.Helper()
	res := make(chan bool, 1)
	n.post(func(r *reactor) {
		_, granted := r.sched.Region(off)
		st := r.sched.Stats()
		res <- !granted && st.Locals == 1 && st.Flows == 0 && st.FreeBytes == st.Capacity-st.LocalBytes
	})
	select {
	case ok := <-res:
		return ok
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the reactor did not answer within 30s: it is blocked", n.Name())
		return false
	}
}

// TestReadFenceOffReactor: a holder's fence of a revoked read grant that
// waits (its puller's read still being served) does not stall the
// holder's reactor. While the fence of b's chunk is held, another peer's
// push into the holder and pull from it complete byte-exact; the held
// region stays out of the free pool (local staging, waiting for its fence,
// granted to no flow) until the fence returns, then the arena settles.
// Before the fence moved off the reactor, the reactor waited in it: c's
// push got no GRANT and timed out.
func TestReadFenceOffReactor(t *testing.T) {
	w := newWorld(t)
	stall := &fenceStall{stalled: make(chan transfer.Desc, 1), release: make(chan struct{})}
	w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
		eng, err := w.fab.NewEngine(name, opt)
		if err != nil {
			t.Fatal(err)
		}
		if name != "a" {
			return eng
		}
		stall.Engine = eng
		return stall
	}
	a, b, c := w.node("a", testConfig()), w.node("b", testConfig()), w.node("c", testConfig())
	var once sync.Once
	unstall := func() { once.Do(func() { close(stall.release) }) }
	t.Cleanup(unstall) // before the nodes close (cleanups run last first)
	jb := simple(t, a, b, 71)
	clear(jb.dstB)
	push := simple(t, c, a, 72)
	clear(push.dstB)
	pull := simple(t, a, c, 73)
	clear(pull.dstB)
	connect(t, a, b, c)

	stall.arm.Store(true)
	bt, err := b.Pull(PullRequest{Peer: "a", Src: jb.src, Dst: jb.dst})
	if err != nil {
		t.Fatal(err)
	}
	var region transfer.Desc
	select {
	case region = <-stall.stalled:
	case <-time.After(30 * time.Second):
		t.Fatal("the holder never fenced a revoked read grant")
	}

	// c pushes into the holder and pulls from it while b's fence waits.
	pb, err := c.Submit(Request{Peer: "a", Src: push.src, Dst: push.dst, Route: RouteBounce})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := c.Pull(PullRequest{Peer: "a", Src: pull.src, Dst: pull.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, pb); err != nil {
		t.Fatalf("c's push into the holder while b's fence is held: %v (the holder's reactor waits in the fence)", err)
	}
	if err := wait(t, lb); err != nil {
		t.Fatalf("c's pull from the holder while b's fence is held: %v", err)
	}
	push.verify(t)
	pull.verify(t)
	if err := wait(t, bt); err != nil {
		t.Fatalf("b's pull: %v", err)
	}
	jb.verify(t)
	if stall.ended.Load() {
		t.Fatal("the held fence returned before its release: the test proves nothing")
	}

	// The held region is still the fence's: out of the free pool, granted
	// to no flow, whatever c's transfers needed meanwhile.
	off := region.Addr - a.arenaD.Addr
	eventually(t, func() bool { return offered(a) == 0 && heldOut(t, a, off) })
	if st := a.ArenaStats(); st.LocalBytes < region.Len {
		t.Fatalf("holder's arena while the fence is held: %+v, want the %d-byte region local", st, region.Len)
	}
	conserve(t, a, b, c)

	unstall()
	eventually(t, stall.ended.Load)
	settled(t, a, b, c)
}

// TestReadFencerQueues: revoking never waits for a fence; a puller's
// fences run in order on its own goroutine, so one held fence holds up
// only that puller's regions; close waits for the fences under way, drops
// the ones queued behind them and fences the arena; no goroutine is left.
func TestReadFencerQueues(t *testing.T) {
	arena := transfer.Desc{Addr: 0x100000, Len: 1 << 20}
	hold := make(chan struct{})
	holding := make(chan struct{})
	var mu sync.Mutex
	var fenced []transfer.Desc
	done := make(chan uint64, 8)
	g := newReadGuard(arena, func(d transfer.Desc) {
		if d.Addr == arena.Addr && d.Len == 4096 {
			close(holding)
			<-hold
		}
		mu.Lock()
		fenced = append(fenced, d)
		mu.Unlock()
	}, func(off uint64) { done <- off })
	g.grant("b", 0, 4096)
	g.grant("b", 8192, 4096)
	g.grant("c", 16384, 4096)
	if !g.revoke(0) || !g.revoke(8192) || !g.revoke(16384) {
		t.Fatal("a revoked grant queued no fence")
	}
	if g.revoke(0) {
		t.Fatal("revoking no grant queued a fence")
	}
	for _, off := range []uint64{0, 8192, 16384} {
		if _, err := g.check("b", g.region(off, 4096)); err == nil {
			t.Fatalf("region %#x readable after its revoke, before its fence", off)
		}
	}
	<-holding
	// c's fence is not behind b's held one.
	select {
	case off := <-done:
		if off != 16384 {
			t.Fatalf("fenced %#x while b's first fence is held, want c's 0x4000", off)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("c's fence waited for b's")
	}
	closed := make(chan struct{})
	go func() { g.close(); close(closed) }()
	eventually(t, func() bool {
		g.fencer.mu.Lock()
		defer g.fencer.mu.Unlock()
		return g.fencer.closed
	})
	close(hold)
	<-closed
	if off := <-done; off != 0 || len(done) != 0 {
		t.Fatalf("after the held fence: %#x fenced (%d more), want 0 alone", off, len(done))
	}
	mu.Lock()
	defer mu.Unlock()
	want := []transfer.Desc{g.region(16384, 4096), g.region(0, 4096), arena}
	if len(fenced) != len(want) || fenced[0] != want[0] || fenced[1] != want[1] || fenced[2] != want[2] {
		t.Fatalf("fenced %v, want %v (b's queued fence dropped at close, the arena last)", fenced, want)
	}
	g.grant("b", 0, 4096) // a grant after close (the guard refuses its reads)
	if _, err := g.check("b", g.region(0, 4096)); err == nil {
		t.Fatal("a read allowed after close")
	}
	if g.revoke(0) {
		t.Fatal("a revoke after close queued a fence")
	}
}
