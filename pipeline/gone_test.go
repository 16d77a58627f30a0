package pipeline

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// "Gone means gone": once a flow is cancelled, expired or its peer
// forgotten, nothing of it lands in the receiver's memory any more.

func withBusyScatter(bs **busyScatterer) nodeOpt {
	return func(s *Settings) {
		f := &busyScatterer{Scatterer: s.Scatterer}
		s.Scatterer = f
		*bs = f
	}
}

// TestGivenUpFlowQueuedScatterNeverRuns: a DATA whose scatter waits for a
// busy copy pool, then its flow is given up (the sender cancels, the flow
// expires, the peer is forgotten). Once the pool frees, the scatter must not
// run: the destination keeps its bytes, no ACK is sent, the region is freed.
func TestGivenUpFlowQueuedScatterNeverRuns(t *testing.T) {
	for _, how := range []string{"cancel", "expiry", "forget-peer"} {
		t.Run(how, func(t *testing.T) {
			w := newWorld(t)
			cfg := testConfig()
			cfg.RequestTimeout = 100 * time.Millisecond // FlowExpiry 400ms
			var bs *busyScatterer
			b := w.node("b", cfg, withBusyScatter(&bs))
			dst := b.buffer(t, 1<<20)
			for i := range dst {
				dst[i] = 0xab
			}
			im := newImpostor(t, w, b)
			bs.busy.Store(true)
			const req = 5
			// Two chunks: the second stays granted and unwritten, so the
			// flow holds a region and a silent sender's flow expires.
			im.send(t, "b", &wire.Want{Request: req, ChunkBytes: []uint64{64 << 10, 64 << 10}, Endpoint: im.ch.LocalEndpoint()})
			g, ok := im.recv(t, 5*time.Second).(*wire.Grant)
			if !ok || len(g.Credits) != 2 {
				t.Fatalf("expected one GRANT with 2 credits, got %#v", g)
			}
			im.send(t, "b", &wire.Data{Request: req, Chunk: 0, Region: g.Credits[0].Region,
				Runs: []transfer.Run{{Addr: mem.DescOf(dst).Addr, Len: 64 << 10, Count: 1}}})
			eventually(t, func() bool { return bs.tries.Load() > 0 }) // queued behind the busy pool
			switch how {
			case "cancel":
				im.send(t, "b", &wire.Want{Request: req, Endpoint: im.ch.LocalEndpoint()})
			case "forget-peer":
				if err := b.ForgetPeer("evil"); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, func() bool { return b.ArenaStats().Flows == 0 })
			bs.busy.Store(false)
			settled(t, b)
			if !bytes.Equal(dst, bytes.Repeat([]byte{0xab}, len(dst))) {
				t.Fatal("a scatter of the given-up flow ran: the destination changed")
			}
			if m := im.recv(t, 50*time.Millisecond); m != nil {
				t.Fatalf("unexpected reply %#v for a given-up flow", m)
			}
			if got := b.Stats().CancelledScatters; got != 1 {
				t.Fatalf("cancelled scatters = %d, want 1", got)
			}
		})
	}
}

// TestRepeatedWantReservesOnce: a repeated WANT of a live flow reserves
// nothing more and is counted; a WANT with a different chunk list is
// refused with a NACK and leaves the flow as it was.
func TestRepeatedWantReservesOnce(t *testing.T) {
	w := newWorld(t)
	b := w.node("b", testConfig())
	im := newImpostor(t, w, b)
	want := &wire.Want{Request: 3, ChunkBytes: []uint64{64 << 10, 64 << 10}, Endpoint: im.ch.LocalEndpoint()}
	im.send(t, "b", want)
	if g, ok := im.recv(t, 5*time.Second).(*wire.Grant); !ok || len(g.Credits) != 2 {
		t.Fatalf("expected one GRANT with 2 credits, got %#v", g)
	}
	before := b.ArenaStats()
	im.send(t, "b", want)
	if m := im.recv(t, 100*time.Millisecond); m != nil {
		t.Fatalf("a repeated WANT got %#v", m)
	}
	eventually(t, func() bool { return b.Stats().DuplicateWants == 1 })
	if after := b.ArenaStats(); after != before {
		t.Fatalf("a repeated WANT changed the arena: %+v -> %+v", before, after)
	}
	im.send(t, "b", &wire.Want{Request: 3, ChunkBytes: []uint64{64 << 10, 64 << 10, 64 << 10}, Endpoint: im.ch.LocalEndpoint()})
	if n, ok := im.recv(t, 5*time.Second).(*wire.Nack); !ok || n.Request != 3 || n.Code != wire.NackConflictingWant {
		t.Fatalf("a conflicting WANT got %#v, want a NACK %v", n, wire.NackConflictingWant)
	}
	if got := b.Stats().RejectedWants; got != 1 {
		t.Fatalf("rejected wants = %d, want 1", got)
	}
	if after := b.ArenaStats(); after != before {
		t.Fatalf("a conflicting WANT changed the arena: %+v -> %+v", before, after)
	}
	im.send(t, "b", &wire.Want{Request: 3, Endpoint: im.ch.LocalEndpoint()})
	settled(t, b)
}

// TestPendingFlowDoesNotExpire: a flow waiting for its first grant (the
// arena is full) and a flow whose regions are all being scattered wait for
// the receiver, not for their senders: neither expires, however long that
// takes. The granted flow's silence counts from its grant: it is not
// reclaimed at once for having waited, only once it stays silent after it.
func TestPendingFlowDoesNotExpire(t *testing.T) {
	w := newWorld(t)
	cfg := testConfig()
	cfg.MaxInflight = 8
	cfg.RequestTimeout = 50 * time.Millisecond
	cfg.FlowExpiry = 200 * time.Millisecond
	cfg.MaxArenaShare = 1 // one peer may take the whole arena here
	var bs *busyScatterer
	b := w.node("b", cfg, withBusyScatter(&bs))
	dst := b.buffer(t, 8<<20)
	hog, waiter := newNamedImpostor(t, w, b, "hog"), newNamedImpostor(t, w, b, "waiter")
	bs.busy.Store(true)
	// The hog takes the whole arena and hands every region to a scatter
	// that waits for the busy copy pool.
	chunks := make([]uint64, 8)
	for i := range chunks {
		chunks[i] = 1 << 20
	}
	hog.send(t, "b", &wire.Want{Request: 1, ChunkBytes: chunks, Endpoint: hog.ch.LocalEndpoint()})
	g, ok := hog.recv(t, 5*time.Second).(*wire.Grant)
	if !ok || len(g.Credits) != 8 {
		t.Fatalf("expected one GRANT with 8 credits, got %#v", g)
	}
	for i, cr := range g.Credits {
		hog.send(t, "b", &wire.Data{Request: 1, Chunk: cr.Chunk, Region: cr.Region,
			Runs: []transfer.Run{{Addr: mem.DescOf(dst).Addr + uint64(i)<<20, Len: 1 << 20, Count: 1}}})
	}
	eventually(t, func() bool { return b.ArenaStats().Scattering == 8 })
	waiter.send(t, "b", &wire.Want{Request: 2, ChunkBytes: []uint64{1 << 20}, Endpoint: waiter.ch.LocalEndpoint()})
	time.Sleep(3 * cfg.FlowExpiry) // both flows wait for the receiver
	if got := b.Stats().ExpiredFlows; got != 0 {
		t.Fatalf("%d flows expired while they waited for the receiver", got)
	}
	if st := b.ArenaStats(); st.Flows != 2 || st.Pending != 1 {
		t.Fatalf("arena %+v: want the hog's flow and the waiter's pending chunk", st)
	}
	// The waiter's grant is sent after this, so its flow may expire no
	// sooner than FlowExpiry after it (a lower bound: a late test cannot
	// fail for being late).
	released := time.Now()
	bs.busy.Store(false)
	for range 8 {
		if a, ok := hog.recv(t, 5*time.Second).(*wire.Ack); !ok || a.Request != 1 {
			t.Fatalf("expected the hog's ACKs, got %#v", a)
		}
	}
	if g, ok := waiter.recv(t, 5*time.Second).(*wire.Grant); !ok || g.Request != 2 {
		t.Fatalf("the waiting flow got %#v, want its GRANT", g)
	}
	time.Sleep(cfg.FlowExpiry / 4)
	if got := b.Stats().ExpiredFlows; got != 0 && time.Since(released) < cfg.FlowExpiry {
		t.Fatal("the flow was reclaimed right after its grant: its silence was counted from its WANT")
	}
	// Silent after its grant, it is reclaimed.
	eventually(t, func() bool { return b.Stats().ExpiredFlows == 1 })
	settled(t, b)
}

// holdReactor parks n's reactor until the returned release is called, so
// commands posted meanwhile run later, in order.
func holdReactor(t *testing.T, n *node) (release func()) {
	t.Helper()
	held, gate := make(chan struct{}), make(chan struct{})
	n.post(func(*reactor) {
		close(held)
		<-gate
	})
	<-held
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return release
}

// TestForgetPeerRacingSubmit: a Submit accepted just before ForgetPeer (its
// request reaches the reactor after the peer was removed from the control
// channel and the engine) fails with ErrPeerLost, on both routes, and
// nothing of it lands.
func TestForgetPeerRacingSubmit(t *testing.T) {
	w := newWorld(t)
	a, b := w.node("a", testConfig()), w.node("b", testConfig())
	j := simple(t, a, b, 60)
	connect(t, a, b)
	release := holdReactor(t, a)
	bounce, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := a.Submit(Request{Peer: "b", Src: j.src[:1], Dst: j.dst[:1]})
	if err != nil {
		t.Fatal(err)
	}
	if bounce.Route() != RouteBounce || direct.Route() != RouteDirect {
		t.Fatalf("routes %v, %v: want bounce and direct", bounce.Route(), direct.Route())
	}
	if err := a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	release()
	for _, bt := range []*Batch{bounce, direct} {
		if err := wait(t, bt); !errors.Is(err, transfer.ErrPeerLost) {
			t.Fatalf("%v batch: err = %v, want ErrPeerLost", bt.Route(), err)
		}
		if _, quiet := bt.Retirement(); !quiet {
			t.Fatalf("%v batch: not quiescent, though nothing started", bt.Route())
		}
	}
	if !bytes.Equal(j.dstB, make([]byte, len(j.dstB))) {
		t.Fatal("bytes of a request to a forgotten peer landed")
	}
	if _, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("submit after ForgetPeer returned: err = %v, want ErrUnknownPeer", err)
	}
	settled(t, a, b)
}

// TestForgetPeerRacingSubmitLoop races Submit and ForgetPeer freely:
// Submits run back to back until one is refused, ForgetPeer comes once the
// first was accepted. Every batch succeeds or fails with ErrPeerLost, and the
// refused Submit says ErrUnknownPeer.
//
// A round submits fewer requests than b's flow limit: the requests a
// forgot stay open on b (a sends no cancel to a forgotten peer) until b
// forgets a, so a loop that outran ForgetPeer by the limit (a loaded
// machine let it submit hundreds) was rightly refused by b ("peer has 256
// open flows, the limit"), which is not what this test is about. Past that
// many the loop waits for ForgetPeer, then submits the refused one.
func TestForgetPeerRacingSubmitLoop(t *testing.T) {
	w := newWorld(t)
	// A WANT of a's still in flight when b forgets a starts a flow that a
	// never serves; b reclaims it by expiry, kept short here.
	cfgB := testConfig()
	cfgB.FlowExpiry = time.Second
	a, b := w.node("a", testConfig()), w.node("b", cfgB)
	j := simple(t, a, b, 61)
	for i := range 10 {
		connect(t, a, b)
		var batches []*Batch
		first, forgot, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for n := 0; ; n++ {
				if n == b.Config().MaxFlowsPerPeer-1 {
					<-forgot
				}
				bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
				if err != nil {
					if !errors.Is(err, transfer.ErrUnknownPeer) {
						t.Errorf("round %d: submit: %v", i, err)
					}
					if n == 0 {
						close(first)
					}
					return
				}
				batches = append(batches, bt)
				if n == 0 {
					close(first)
				}
			}
		}()
		<-first
		err := a.ForgetPeer("b")
		close(forgot)
		<-done
		if err != nil {
			t.Fatal(err)
		}
		for _, bt := range batches {
			if err := wait(t, bt); err != nil && !errors.Is(err, transfer.ErrPeerLost) {
				t.Fatalf("round %d: batch %d of %d: err = %v, want nil or ErrPeerLost", i, bt.ID(), len(batches), err)
			}
		}
		if err := b.ForgetPeer("a"); err != nil {
			t.Fatal(err)
		}
		// b may still be scattering chunks that landed before a gave up, or
		// hold flows of WANTs that arrived after it forgot a: wait for all
		// of it before the destination is reused or freed.
		settled(t, a, b)
	}
}

// quarantineConfig is an agent whose arena holds exactly one 1 MiB region,
// so a waiting flow can only be granted the region another flow gave up.
func quarantineConfig(quarantine time.Duration) Config {
	c := testConfig()
	c.ArenaSize = 1 << 20
	c.MaxChunk = 1 << 20
	c.RequestTimeout = 100 * time.Millisecond // FlowExpiry 400ms
	c.Quarantine = quarantine
	return c
}

// giveUpAndWait has slow take the whole arena of b and next wait for it.
// It returns the region slow was granted.
func giveUpAndWait(t *testing.T, b *node, slow, next *impostor) uint64 {
	t.Helper()
	slow.send(t, "b", &wire.Want{Request: 1, ChunkBytes: []uint64{1 << 20}, Endpoint: slow.ch.LocalEndpoint()})
	g, ok := slow.recv(t, 5*time.Second).(*wire.Grant)
	if !ok || len(g.Credits) != 1 {
		t.Fatalf("expected a GRANT, got %#v", g)
	}
	next.send(t, "b", &wire.Want{Request: 2, ChunkBytes: []uint64{1 << 20}, Endpoint: next.ch.LocalEndpoint()})
	eventually(t, func() bool { return b.ArenaStats().Pending == 1 })
	return g.Credits[0].Region
}

// expectQuarantined checks that b keeps region off out of use (it is not
// granted to next) for the whole quarantine, then grants it to next. since
// is a time no later than the quarantine's start: the grant must come at
// least quarantine after it. Only lower bounds on time are checked, so a
// loaded machine that runs the test late cannot fail it: the snapshot of
// the stats is checked only when it was surely taken inside the quarantine.
func expectQuarantined(t *testing.T, b *node, next *impostor, off uint64, quarantine time.Duration, since time.Time) {
	t.Helper()
	st, ast := b.Stats(), b.ArenaStats()
	if time.Since(since) < quarantine {
		if st.QuarantinedRegions != 1 || st.QuarantinedBytes != 1<<20 || st.Quarantines != 1 {
			t.Fatalf("stats %+v: want one 1 MiB region in quarantine", st)
		}
		if ast.Quarantined != 1 || ast.FreeBytes != 0 || ast.Flows != 1 {
			t.Fatalf("arena %+v: want the region quarantined, the next flow waiting", ast)
		}
	}
	conserve(t, b)
	g, ok := next.recv(t, quarantine+5*time.Second).(*wire.Grant)
	if elapsed := time.Since(since); elapsed < quarantine {
		t.Fatalf("the waiting flow got %#v %v after the quarantine began, inside its %v", g, elapsed, quarantine)
	}
	if !ok || len(g.Credits) != 1 || g.Credits[0].Region != off {
		t.Fatalf("after the quarantine: got %#v, want a GRANT of region %#x", g, off)
	}
	if st := b.Stats(); st.QuarantinedRegions != 0 || st.QuarantinedBytes != 0 {
		t.Fatalf("stats %+v after the quarantine", st)
	}
}

// TestExpiredRegionQuarantined: the region of an expired flow (its sender
// may only be slow and still land a write) is not granted to another flow
// until its quarantine is over; a late DATA for it is dropped.
func TestExpiredRegionQuarantined(t *testing.T) {
	w := newWorld(t)
	const quarantine = 400 * time.Millisecond
	b := w.node("b", quarantineConfig(quarantine))
	slow, next := newNamedImpostor(t, w, b, "slow"), newNamedImpostor(t, w, b, "next")
	// The flow expires no sooner than FlowExpiry after its grant, which
	// comes after this.
	since := time.Now().Add(4 * quarantineConfig(quarantine).RequestTimeout)
	off := giveUpAndWait(t, b, slow, next)
	eventually(t, func() bool { return b.Stats().ExpiredFlows == 1 })
	expectQuarantined(t, b, next, off, quarantine, since)
	dst := b.buffer(t, 1<<20)
	slow.send(t, "b", &wire.Data{Request: 1, Region: off, Runs: []transfer.Run{{Addr: mem.DescOf(dst).Addr, Len: 4096, Count: 1}}})
	eventually(t, func() bool { return b.Stats().LateData == 1 })
	next.send(t, "b", &wire.Want{Request: 2, Endpoint: next.ch.LocalEndpoint()})
	settled(t, b)
}

// TestForgottenPeerRegionQuarantine: after ForgetPeer the peer's regions
// are quarantined unless the engine fences forgotten peers; with a fencing
// engine they are granted again at once.
func TestForgottenPeerRegionQuarantine(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fencing bool
		wrap    nodeOpt
	}{
		{"not-fencing", false, func(s *Settings) { s.Engine = &plainEngine{s.Engine} }},
		{"fencing-fake", true, func(s *Settings) { s.Engine = &fencingEngine{s.Engine} }},
		{"loopback-fences", true, func(*Settings) {}}, // the real engine is a transfer.Fencer
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			fencing, wrap := tc.fencing, tc.wrap
			quarantine := 400 * time.Millisecond
			if fencing {
				quarantine = time.Hour // a grant in seconds proves no quarantine
			}
			cfg := quarantineConfig(quarantine)
			cfg.RequestTimeout = 5 * time.Second // no expiry in this test
			b := w.node("b", cfg, wrap)
			slow, next := newNamedImpostor(t, w, b, "slow"), newNamedImpostor(t, w, b, "next")
			off := giveUpAndWait(t, b, slow, next)
			since := time.Now() // the quarantine starts in ForgetPeer
			if err := b.ForgetPeer("slow"); err != nil {
				t.Fatal(err)
			}
			if !fencing {
				eventually(t, func() bool { return b.Stats().Quarantines == 1 })
				expectQuarantined(t, b, next, off, quarantine, since)
			} else {
				g, ok := next.recv(t, 5*time.Second).(*wire.Grant)
				if !ok || len(g.Credits) != 1 || g.Credits[0].Region != off {
					t.Fatalf("got %#v, want a GRANT of the forgotten peer's region %#x", g, off)
				}
				if st := b.Stats(); st.Quarantines != 0 {
					t.Fatalf("stats %+v: a fenced peer's region was quarantined", st)
				}
			}
			next.send(t, "b", &wire.Want{Request: 2, Endpoint: next.ch.LocalEndpoint()})
			settled(t, b)
		})
	}
}

// TestQuarantineDefault: an unset (or negative) quarantine is 1 × the
// request timeout; a set one is kept.
func TestQuarantineDefault(t *testing.T) {
	for _, tc := range []struct{ set, want time.Duration }{
		{0, 7 * time.Second}, {-time.Second, 7 * time.Second}, {time.Second, time.Second},
	} {
		c := Config{RequestTimeout: 7 * time.Second, Quarantine: tc.set}
		c.fill()
		if c.Quarantine != tc.want {
			t.Errorf("Quarantine %v with RequestTimeout 7s: got %v, want %v", tc.set, c.Quarantine, tc.want)
		}
	}
	if c := DefaultConfig(); c.Quarantine != 0 {
		t.Errorf("DefaultConfig().Quarantine = %v, want 0 (derived in fill)", c.Quarantine)
	}
}

// TestUnprovenWriteSendsNoCancel: a write that ended without proof that it
// stopped may still land in its granted region, so the sender sends no
// cancel (which would free the region at once); the receiver reclaims the
// silent flow by expiry and quarantines the region.
func TestUnprovenWriteSendsNoCancel(t *testing.T) {
	w := newWorld(t)
	var fe *faultEngine
	cfg := shortTimeouts() // FlowExpiry 1.2s
	a, b := w.node("a", cfg, withFaultEngine(&fe)), w.node("b", cfg)
	j := simple(t, a, b, 70)
	connect(t, a, b)
	fe.unproven.Store(true)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); !errors.Is(err, transfer.ErrNotQuiescent) {
		t.Fatalf("err = %v, want ErrNotQuiescent", err)
	}
	time.Sleep(100 * time.Millisecond) // a cancel would have arrived by now
	if st := b.ArenaStats(); st.Flows != 1 || st.Regions == 0 {
		t.Fatalf("receiver arena %+v: the flow was cancelled although its write may still land", st)
	}
	eventually(t, func() bool { return b.Stats().ExpiredFlows == 1 })
	if b.Stats().Quarantines == 0 {
		t.Fatal("the expired flow's regions were not quarantined")
	}
	settled(t, b)
	conserve(t, a) // a keeps the staging region the unproven write may still read
}

// TestSilentSenderPendingFlowsExpire: a sender that left its grants
// unused for FlowExpiry is gone for its waiting flows too: the flows it
// queued as long ago are reclaimed with the granted ones, instead of each
// being granted in turn and holding the arena for another FlowExpiry (a
// loop of WANTs racing ForgetPeer left hundreds queued that took minutes).
func TestSilentSenderPendingFlowsExpire(t *testing.T) {
	w := newWorld(t)
	cfg := testConfig()
	cfg.RequestTimeout = 100 * time.Millisecond // FlowExpiry defaults to 400ms
	b := w.node("b", cfg)
	im := newImpostor(t, w, b)
	const wants = 100
	for i := range wants {
		im.send(t, "b", &wire.Want{Request: uint64(1 + i), ChunkBytes: []uint64{1 << 20}, Endpoint: im.ch.LocalEndpoint()})
	}
	eventually(t, func() bool { st := b.ArenaStats(); return st.Flows == wants && st.Pending > 0 })
	// With the arena granting a few flows at a time, reclaiming them in
	// turn would take wants/4 expiries and quarantines (over 15 s): past
	// settled's bound.
	settled(t, b)
	if got := b.Stats().ExpiredFlows; got != wants {
		t.Fatalf("expired flows = %d, want %d", got, wants)
	}
}
