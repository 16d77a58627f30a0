package pipeline

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/transfer"
)

// offered returns the read grants n's read guard holds now.
func offered(n *node) int {
	if n.rguard == nil {
		return 0
	}
	n.rguard.mu.RLock()
	defer n.rguard.mu.RUnlock()
	return len(n.rguard.grants)
}

func tcpEngine(n *node) *tcp.Engine { return n.eng.(*tcp.Engine) }

// pullBoth pulls descriptors and blocks from a into b and checks every
// byte; it returns the bytes pulled.
func pullBoth(t *testing.T, a, b *node, events <-chan Received) {
	t.Helper()
	layout := kvLayout{count: 512, size: 4096, fragmented: true}
	var jobs []job
	for i := range 3 {
		jobs = append(jobs, prepare(a.buffer(t, 512*4096), b.buffer(t, 512*4096), layout, uint64(60+i)))
	}
	const blocks, blen = 300, 2048
	src := newKVPool(t, a, "kv", 2, blocks, blen, blen+96, 5)
	dst := newKVPool(t, b, "kv-in", 2, blocks, blen, blen+40, 3)
	connect(t, a, b)
	var batches []*Batch
	for _, j := range jobs {
		bt, err := b.Pull(PullRequest{Peer: "a", Src: j.src, Dst: j.dst})
		if err != nil {
			t.Fatal(err)
		}
		batches = append(batches, bt)
	}
	rng := rand.New(rand.NewPCG(8, 9))
	srcIDs, dstIDs := randomIDs(rng, 250, blocks), randomIDs(rng, 250, blocks)
	src.fillPieces(4, srcIDs)
	bb, err := b.Pull(PullRequest{Peer: "a", Blocks: &BlockRequest{SrcPool: "kv", SrcIDs: srcIDs, DstPool: "kv-in", DstIDs: dstIDs}})
	if err != nil {
		t.Fatal(err)
	}
	batches = append(batches, bb)
	for i, bt := range batches {
		if err := wait(t, bt); err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
		if _, q := bt.Retirement(); !q {
			t.Fatalf("pull %d is not quiescent", i)
		}
		if err := bt.Release(); err != nil {
			t.Fatal(err)
		}
	}
	for _, j := range jobs {
		j.verify(t)
	}
	checkLanded(t, src, dst, srcIDs, dstIDs)
	for range batches {
		if ev := waitEvent(t, events); !ev.Pull || ev.Err != nil || !ev.Quiescent {
			t.Fatalf("holder's event %+v, want a quiescent served pull", ev)
		}
	}
}

// TestPullByRead: between tcp engines (they read and serve reads) a pull
// reads the holder's staged regions by default and lands every byte of
// descriptors and blocks exactly; with bounce.pull_read off at either end
// the holder writes them instead, byte-exact too. Loopback engines read
// too.
func TestPullByRead(t *testing.T) {
	plain := func(mk func(testing.TB) *world) func(testing.TB) (*world, nodeOpt) {
		return func(t testing.TB) (*world, nodeOpt) { return mk(t), func(*Settings) {} }
	}
	cases := []struct {
		name         string
		world        func(testing.TB) (*world, nodeOpt)
		holder, pull PullRead
		reads        bool
	}{
		{"tcp-auto", plain(tcpZMQWorld), PullReadAuto, PullReadAuto, true},
		// Authenticated: the holder's guard is asked with the proven name.
		{"tcp-authenticated", authWorld, PullReadAuto, PullReadAuto, true},
		{"tcp-off-at-puller", plain(tcpZMQWorld), PullReadAuto, PullReadOff, false},
		{"tcp-off-at-holder", plain(tcpZMQWorld), PullReadOff, PullReadAuto, false},
		{"loopback", plain(newWorld), PullReadAuto, PullReadAuto, true},
		{"loopback-off", plain(newWorld), PullReadAuto, PullReadOff, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, opt := c.world(t)
			events := make(chan Received, 8)
			acfg, bcfg := testConfig(), testConfig()
			acfg.PullRead, bcfg.PullRead = c.holder, c.pull
			a, b := w.node("a", acfg, withReceived(events), opt), w.node("b", bcfg, opt)
			pullBoth(t, a, b, events)
			offers := a.Stats().PullReadOffers
			if c.reads != (offers > 0) {
				t.Fatalf("holder offered %d chunks to read; reads expected: %v", offers, c.reads)
			}
			if n := b.Stats().FailedReads; n != 0 {
				t.Fatalf("%d reads failed", n)
			}
			if te, ok := a.eng.(*tcp.Engine); ok && c.reads {
				if st := te.Stats(); st.ForbiddenReads != 0 || st.FencedReads != 0 {
					t.Fatalf("holder's engine: %d forbidden, %d fenced reads in a clean run", st.ForbiddenReads, st.FencedReads)
				}
			}
			eventually(t, func() bool { return offered(a) == 0 })
			settled(t, a, b)
		})
	}
}

// TestReadGuardRules: the holder's read guard allows a peer exactly the
// staged regions offered to it, until revoked (at once, its fence later),
// and nothing after close.
func TestReadGuardRules(t *testing.T) {
	arena := transfer.Desc{Addr: 0x100000, Len: 1 << 20}
	var fenced []transfer.Desc // appended to before done is told
	done := make(chan uint64, 1)
	g := newReadGuard(arena, func(d transfer.Desc) { fenced = append(fenced, d) }, func(off uint64) { done <- off })
	g.grant("b", 64<<10, 8192)
	region := transfer.Desc{Addr: arena.Addr + 64<<10, Len: 8192}
	if got, err := g.check("b", transfer.Desc{Addr: region.Addr + 100, Len: 4000}); err != nil || got != region {
		t.Fatalf("read inside the offer: %v, %v", got, err)
	}
	for _, c := range []struct {
		name string
		peer string
		d    transfer.Desc
	}{
		{"another peer", "c", region},
		{"past the offer", "b", transfer.Desc{Addr: region.Addr + 4096, Len: 8192}},
		{"another arena region", "b", transfer.Desc{Addr: arena.Addr, Len: 4096}},
		{"outside the arena", "b", transfer.Desc{Addr: 0x1000, Len: 16}},
	} {
		if _, err := g.check(c.peer, c.d); !errors.Is(err, transfer.ErrForbidden) {
			t.Fatalf("%s: %v, want ErrForbidden", c.name, err)
		}
	}
	if !g.revoke(64 << 10) {
		t.Fatal("revoke queued no fence")
	}
	if _, err := g.check("b", region); !errors.Is(err, transfer.ErrForbidden) {
		t.Fatalf("read after revoke, its fence maybe not run yet: %v", err)
	}
	if off := <-done; off != 64<<10 || len(fenced) != 1 || fenced[0] != region {
		t.Fatalf("revoke fenced %v, want %v", fenced, region)
	}
	if _, err := g.check("b", region); !errors.Is(err, transfer.ErrForbidden) {
		t.Fatalf("read after revoke: %v", err)
	}
	if g.revoke(64 << 10) {
		t.Fatal("revoking nothing queued a fence")
	}
	g.grant("b", 0, 4096)
	g.close()
	if _, err := g.check("b", transfer.Desc{Addr: arena.Addr, Len: 16}); !errors.Is(err, transfer.ErrForbidden) {
		t.Fatalf("read after close: %v", err)
	}
	if len(fenced) != 2 || fenced[1] != arena {
		t.Fatalf("close fenced %v, want the arena", fenced)
	}
}

// readInto posts a read by n's engine of peer's memory src into a fresh
// registered buffer and returns the result and the buffer.
func readInto(t *testing.T, n *node, peer string, src transfer.Desc) (error, []byte) {
	t.Helper()
	buf := n.buffer(t, src.Len)
	op, err := tcpEngine(n).PostRead(peer, []transfer.ReadOp{{Src: src, Dst: mem.DescOf(buf)}})
	if err != nil {
		return err, buf
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := op.Poll()
		if st.Terminal() {
			_ = op.Release()
			return err, buf
		}
		if time.Now().After(deadline) {
			t.Fatal("read never ended")
		}
		time.Sleep(time.Millisecond)
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// TestPullReadGuarded: a peer reads nothing of the holder's memory but a
// staged region offered to it while the offer lasts: not the arena, not
// user memory registered for it, not a region offered to another peer, not
// the offered region once the pull ended. Each refused read fails with
// ErrForbidden, reads nothing, and is counted by the holder's engine.
func TestPullReadGuarded(t *testing.T) {
	w := tcpZMQWorld(t)
	a, b, c := w.node("a", testConfig()), w.node("b", testConfig()), w.node("c", testConfig())
	j := simple(t, a, b, 31)
	clear(j.dstB)
	connect(t, a, b)
	connect(t, a, c)
	refused := func(what string, n *node, src transfer.Desc) {
		t.Helper()
		err, got := readInto(t, n, "a", src)
		if !errors.Is(err, transfer.ErrForbidden) {
			t.Fatalf("%s: read = %v, want ErrForbidden", what, err)
		}
		if !allZero(got) {
			t.Fatalf("%s: a refused read landed bytes", what)
		}
	}
	arena := a.arenaD
	refused("the arena, nothing offered", b, transfer.Desc{Addr: arena.Addr, Len: 64 << 10})
	refused("user memory registered for every peer", b, j.src[0])
	refused("the arena by a third peer", c, transfer.Desc{Addr: arena.Addr, Len: 4096})

	// The puller's reads are held back, so its offers stay open.
	release, err := tcpEngine(b).StallWrites()
	if err != nil {
		t.Fatal(err)
	}
	bt, err := b.Pull(PullRequest{Peer: "a", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return offered(a) > 0 })
	var offer transfer.Desc
	a.rguard.mu.RLock()
	for off, g := range a.rguard.grants {
		offer = a.rguard.region(off, g.len)
	}
	a.rguard.mu.RUnlock()
	refused("an offer to b, read by c", c, offer)
	refused("past b's offer", c, transfer.Desc{Addr: offer.Addr, Len: offer.Len + 4096})
	before := tcpEngine(a).Stats().ForbiddenReads
	release()
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
	eventually(t, func() bool { return offered(a) == 0 })
	refused("b's offer after its ACK", b, offer)
	if got := tcpEngine(a).Stats().ForbiddenReads; got != before+1 || before < 5 {
		t.Fatalf("holder counted %d then %d forbidden reads, want 5 then 6", before, got)
	}
	settled(t, a, b, c)
}

// stalledReadPull starts a pull by read from a into b whose reads are held
// in b's engine, and waits until a offered a chunk.
func stalledReadPull(t *testing.T, acfg, bcfg Config) (*pullFixture, func()) {
	t.Helper()
	w := tcpZMQWorld(t)
	f := &pullFixture{events: make(chan Received, 8)}
	f.a = w.node("a", acfg, withReceived(f.events))
	f.b = w.node("b", bcfg)
	f.j = simple(t, f.a, f.b, 37)
	clear(f.j.dstB)
	connect(t, f.a, f.b)
	release, err := tcpEngine(f.b).StallWrites()
	if err != nil {
		t.Fatal(err)
	}
	bt, err := f.b.Pull(PullRequest{Peer: "a", Src: f.j.src, Dst: f.j.dst})
	if err != nil {
		t.Fatal(err)
	}
	f.bt = bt
	eventually(t, func() bool { return offered(f.a) > 0 })
	return f, release
}

// TestPullReadGivenUpMidRead: a pull whose reads are in flight is given
// up — the puller abandons it or forgets the holder, the holder forgets
// the puller: both batches resolve (the holder's quiescent with its read
// grants revoked, the puller's quiescent), no byte reaches the puller's
// destination even when the held reads go on afterwards, and both arenas
// come back whole.
func TestPullReadGivenUpMidRead(t *testing.T) {
	t.Run("puller-abandons", func(t *testing.T) {
		f, release := stalledReadPull(t, testConfig(), testConfig())
		if out := f.bt.Abandon(10 * time.Second); out != transfer.Recoverable {
			t.Fatalf("abandon = %v, want Recoverable", out)
		}
		if err := f.bt.Err(); !errors.Is(err, ErrAbandoned) {
			t.Fatalf("err = %v, want ErrAbandoned", err)
		}
		f.holderEnded(t, ErrPullCancelled)
		if n := offered(f.a); n != 0 {
			t.Fatalf("%d read grants left after the cancel", n)
		}
		release()
		time.Sleep(100 * time.Millisecond)
		f.untouched(t)
		settled(t, f.a, f.b)
	})
	t.Run("puller-forgets", func(t *testing.T) {
		f, release := stalledReadPull(t, testConfig(), testConfig())
		if err := f.b.ForgetPeer("a"); err != nil {
			t.Fatal(err)
		}
		if err := wait(t, f.bt); !errors.Is(err, transfer.ErrPeerLost) {
			t.Fatalf("err = %v, want ErrPeerLost", err)
		}
		if _, q := f.bt.Retirement(); !q {
			t.Fatal("the forgotten pull is not quiescent")
		}
		release()
		// The holder hears the cancel, or its engine loses the puller's
		// connections first (the forget reset them): either ends it.
		ev := waitEvent(t, f.events)
		if !ev.Pull || !errors.Is(ev.Err, ErrPullCancelled) && !errors.Is(ev.Err, transfer.ErrPeerLost) || !ev.Quiescent {
			t.Fatalf("holder's event %+v, want a quiescent pull cancelled or lost", ev)
		}
		eventually(t, func() bool { return offered(f.a) == 0 })
		time.Sleep(100 * time.Millisecond)
		f.untouched(t)
		settled(t, f.a, f.b)
	})
	t.Run("holder-forgets", func(t *testing.T) {
		f, release := stalledReadPull(t, testConfig(), testConfig())
		if err := f.a.ForgetPeer("b"); err != nil {
			t.Fatal(err)
		}
		// The holder's engine cuts the puller's connections before its
		// reactor forgets the puller: the puller's reads fail and its
		// cancel may be handled first. Either ends the pull.
		ev := waitEvent(t, f.events)
		if !ev.Pull || !errors.Is(ev.Err, transfer.ErrPeerLost) && !errors.Is(ev.Err, ErrPullCancelled) || !ev.Quiescent {
			t.Fatalf("holder's event %+v, want a quiescent pull lost or cancelled", ev)
		}
		if n := offered(f.a); n != 0 {
			t.Fatalf("%d read grants left after the holder forgot the puller", n)
		}
		release() // the held reads go out now: the holder refuses them
		if err := wait(t, f.bt); err == nil {
			t.Fatal("the pull succeeded after the holder forgot the puller")
		}
		if _, q := f.bt.Retirement(); !q {
			t.Fatal("the puller's failed pull is not quiescent")
		}
		f.untouched(t)
		settled(t, f.a, f.b)
	})
	t.Run("puller-times-out", func(t *testing.T) {
		f, release := stalledReadPull(t, testConfig(), shortTimeouts())
		if err := wait(t, f.bt); !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("err = %v, want ErrTimeout", err)
		}
		if _, q := f.bt.Retirement(); !q {
			t.Fatal("a timed-out pull whose read is held is not quiescent")
		}
		f.holderEnded(t, ErrPullCancelled)
		if n := offered(f.a); n != 0 {
			t.Fatalf("%d read grants left after the puller's timeout", n)
		}
		release()
		time.Sleep(100 * time.Millisecond)
		f.untouched(t)
		settled(t, f.a, f.b)
	})
	t.Run("holder-shuts-down", func(t *testing.T) {
		f, release := stalledReadPull(t, testConfig(), testConfig())
		done := make(chan error, 1)
		go func() { done <- f.a.Shutdown(t.Context()) }()
		err := wait(t, f.bt)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "(shutdown)") {
			t.Fatalf("puller: err = %v, want the holder's shutdown", err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		release() // the held reads go out to a holder that serves none
		if _, q := f.bt.Retirement(); !q {
			t.Fatal("the puller's pull is not quiescent")
		}
		time.Sleep(100 * time.Millisecond)
		f.untouched(t)
		settled(t, f.b)
	})
	t.Run("holder-engine-lost", func(t *testing.T) {
		f, release := stalledReadPull(t, testConfig(), testConfig())
		defer release()
		// The holder's engine goes away (as with kill -9): the reads fail
		// as lost, and so does the pull.
		if err := f.a.eng.Close(); err != nil {
			t.Fatal(err)
		}
		release()
		if err := wait(t, f.bt); !errors.Is(err, transfer.ErrPeerLost) {
			t.Fatalf("err = %v, want ErrPeerLost", err)
		}
		if _, q := f.bt.Retirement(); !q {
			t.Fatal("the puller's lost pull is not quiescent")
		}
		f.untouched(t)
		settled(t, f.b)
	})
}

// TestScatterExtent: the bytes of its region a scatter reads, which a read
// of the holder's staging must cover (a shorter STAGED offer fails the
// chunk instead of scattering what the region held before): runs end at
// their last repetition, block and shaped copies at their pieces' end.
func TestScatterExtent(t *testing.T) {
	pool := transfer.Pool{BlockLen: 256, Stride: 256, Blocks: 8, Kind: transfer.Host, Regions: []uint64{0x1000}}
	bc := transfer.BlockCopy{Blocks: transfer.Blocks{Pool: pool, IDs: []uint32{0, 1, 2, 3}}, First: 1, Count: 3, RegionOff: 64}
	for _, c := range []struct {
		name string
		t    *scatterTask
		want uint64
	}{
		{"none", &scatterTask{}, 0},
		{"runs", &scatterTask{runs: []transfer.Run{
			{RegionOff: 0, Len: 100, Count: 1},
			{RegionOff: 4096, Len: 8, Count: 3, RegionStride: 16},
			{RegionOff: 9000, Len: 8, Count: 0},
		}}, 4096 + 2*16 + 8},
		{"blocks", &scatterTask{blocks: &bc}, 64 + 3*256},
		{"shaped", &scatterTask{shaped: &transfer.ShapedCopy{BlockCopy: bc, Shape: transfer.Shape{Group: 1, Segs: []transfer.Segment{{Block: 0, Off: 0, Len: 128}}}}}, 64 + 3*128},
	} {
		if got := c.t.extent(); got != c.want {
			t.Errorf("%s: extent %d, want %d", c.name, got, c.want)
		}
	}
}

// TestReadsIntoHostOnly: a pull asks to read only when every chunk lands
// in host memory; one into device memory (any chunk) is written.
func TestReadsIntoHostOnly(t *testing.T) {
	d := func(addr uint64, k transfer.MemKind) transfer.Desc {
		return transfer.Desc{Addr: addr, Len: 4096, Kind: k}
	}
	for _, c := range []struct {
		name string
		dst  []transfer.Desc
		want bool
	}{
		{"host", []transfer.Desc{d(0x10000, transfer.Host), d(0x20000, transfer.Host)}, true},
		{"device", []transfer.Desc{d(0x10000, transfer.CUDA), d(0x20000, transfer.CUDA)}, false},
		{"one device chunk", []transfer.Desc{d(0x10000, transfer.Host), d(0x20000, transfer.CUDA)}, false},
	} {
		src := []transfer.Desc{d(0x1000, transfer.Host), d(0x3000, transfer.Host)}
		p, err := plan.Layout(src, c.dst, plan.Options{MaxChunk: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if got := readsInto(p); got != c.want {
			t.Errorf("%s: readsInto = %v, want %v", c.name, got, c.want)
		}
	}
}
