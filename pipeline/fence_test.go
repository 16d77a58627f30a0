package pipeline

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// gatedForget is the receiver's tcp engine with its ForgetPeer recorded,
// and held for one peer until release is closed: the peerFencer, which
// fences lost senders one after another, stays busy with that peer while
// the test queues more.
type gatedForget struct {
	*tcp.Engine
	gate    string
	entered chan struct{} // closed when ForgetPeer(gate) starts
	release chan struct{}

	mu     sync.Mutex
	called []string // ForgetPeer's peers, in order
}

func (g *gatedForget) ForgetPeer(peer string) error {
	g.mu.Lock()
	g.called = append(g.called, peer)
	g.mu.Unlock()
	if peer == g.gate {
		close(g.entered)
		<-g.release
	}
	return g.Engine.ForgetPeer(peer)
}

func (g *gatedForget) calls() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.called)
}

// TestFenceDoesNotUndoLoadPeer: the receiver queues a lost sender's fence
// when it checked the sender was only learned, not loaded; a LoadPeer of
// that name before the fence runs (the sender restarted under its name
// and the operator loaded it) was undone by the fence: the engine dropped
// the loaded metadata and refused the name for the quarantine. The fence
// must skip a peer loaded by the time it runs.
func TestFenceDoesNotUndoLoadPeer(t *testing.T) {
	w := tcpZMQWorld(t)
	cfg := testConfig()
	cfg.Quarantine = time.Minute
	rcfg := cfg
	rcfg.ArenaSize = 32 << 20
	g := &gatedForget{gate: "victim-a", entered: make(chan struct{}), release: make(chan struct{})}
	released := sync.OnceFunc(func() { close(g.release) })
	t.Cleanup(released)
	r := w.node("r", rcfg, func(s *Settings) {
		g.Engine = s.Engine.(*tcp.Engine)
		s.Engine = g
	})
	stalled := func(name string, seed uint64) *node {
		s := stalledSender(w, name, cfg)
		loadInto(t, s, r)
		j := simple(t, s, r, seed)
		if _, err := s.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	kill := func(s *node) {
		s.ctrl.Close()
		s.eng.Close()
	}
	await := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("20 s without %s: %+v, %+v, ForgetPeer calls %q", what, r.ArenaStats(), r.Stats(), g.calls())
			}
			time.Sleep(time.Millisecond)
		}
	}
	a, b := stalled("victim-a", 1), stalled("victim-b", 2)
	await("both stalled flows granted", func() bool { return r.ArenaStats().Flows == 2 })
	kill(a)
	select {
	case <-g.entered:
	case <-time.After(20 * time.Second):
		t.Fatalf("victim-a was never fenced: %+v", r.Stats())
	}
	// The fencer is busy with victim-a: victim-b's fence waits in its
	// queue, checked "not loaded" now.
	kill(b)
	await("victim-b's flow reclaimed", func() bool { return r.ArenaStats().Flows == 0 })
	a.close(t)
	b.close(t)

	// victim-b restarts under its name and the receiver loads it.
	b2 := w.node("victim-b", cfg)
	loadInto(t, b2, r)
	loadInto(t, r, b2)
	released()
	// A third lost sender's fence comes after victim-b's in the queue: once
	// it started, victim-b's fence is over, run or skipped.
	c := stalled("victim-c", 3)
	await("victim-c's flow granted", func() bool { return r.ArenaStats().Flows >= 1 })
	kill(c)
	await("victim-c fenced", func() bool { return slices.Contains(g.calls(), "victim-c") })
	c.close(t)

	if calls := g.calls(); slices.Contains(calls, "victim-b") {
		t.Errorf("the fence queued before victim-b was loaded ran after it: ForgetPeer calls %q", calls)
	}
	j := simple(t, b2, r, 4)
	bt, err := b2.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatalf("the restarted sender the receiver loaded: %v", err)
	}
	if bt.Route() != RouteBounce {
		t.Fatalf("the restarted sender's request took %v (%s)", bt.Route(), bt.RouteReason())
	}
	j.verify(t)
	if n := g.Stats().Fenced; n != 2 {
		t.Errorf("the receiver's engine fences %d names, want victim-a and victim-c", n)
	}
	conserve(t, r)
}

// heldScatter holds every scatter until release is closed (then runs it):
// a receiver whose copy stage is slow, so a flow's regions are all being
// scattered.
type heldScatter struct {
	transfer.Scatterer
	release chan struct{}
}

func (h *heldScatter) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	return &heldOp{release: h.release, start: func() (transfer.Op, error) { return h.Scatterer.Scatter(region, runs) }}, nil
}

type heldOp struct {
	release <-chan struct{}
	start   func() (transfer.Op, error)
	op      transfer.Op
	err     error
}

func (o *heldOp) Poll() (transfer.Status, error) {
	if o.op == nil && o.err == nil {
		select {
		case <-o.release:
			o.op, o.err = o.start()
		default:
			return transfer.Pending, nil
		}
	}
	if o.err != nil {
		return transfer.Failed, o.err
	}
	return o.op.Poll()
}

func (o *heldOp) Release() error {
	if o.op != nil {
		return o.op.Release()
	}
	return nil
}

// TestLateWantOfLostSenderReclaimed is the race behind the one
// TestKillSenderMidTransfer failure (a dead sender's flow holding 8
// regions 5 s after kill -9): a WANT the sender sent before it died is
// processed after the receiver reclaimed its flows (it sat in the control
// channel's queue; the engine's loss report does not wait behind it) and
// opens a flow nobody will write. Dropping such WANTs, or reclaiming what
// they opened, rests on the lost sender's fence; the fence ran only when
// the lost flows held a region waiting for a write, and here the sender's
// only region is being scattered when it dies (no region to release
// early), so no fence ran and the late flow held its grant until flow
// expiry (4 × the request timeout: 2 min here).
func TestLateWantOfLostSenderReclaimed(t *testing.T) {
	w := tcpZMQWorld(t)
	cfg := testConfig()
	rcfg := cfg
	rcfg.RequestTimeout = 30 * time.Second
	rcfg.Quarantine = time.Minute
	hs := &heldScatter{release: make(chan struct{})}
	released := sync.OnceFunc(func() { close(hs.release) })
	t.Cleanup(released)
	r := w.node("r", rcfg, func(s *Settings) {
		hs.Scatterer = s.Scatterer
		s.Scatterer = hs
	})
	await := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("20 s without %s: %+v, %+v", what, r.ArenaStats(), r.Stats())
			}
			time.Sleep(time.Millisecond)
		}
	}
	v := w.node("victim", cfg)
	loadInto(t, v, r)
	j := simple(t, v, r, 1)
	if _, err := v.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst}); err != nil {
		t.Fatal(err)
	}
	await("the victim's whole request written and being scattered", func() bool {
		st := r.ArenaStats()
		return st.Flows == 1 && st.Pending == 0 && st.Regions > 0 && st.Scattering == st.Regions
	})
	endpoint := v.ctrl.LocalEndpoint()
	killed := time.Now()
	v.ctrl.Close()
	v.eng.Close()
	await("the victim's flow reclaimed", func() bool {
		st := r.ArenaStats()
		return st.Flows == 0 && st.Orphans > 0
	})
	// The victim's second request's WANT, still queued when it died.
	r.post(func(rr *reactor) {
		rr.onWant("victim", "", &wire.Want{Request: 99, ChunkBytes: []uint64{cfg.MaxChunk}, Endpoint: endpoint})
	})
	released()
	for {
		st := r.ArenaStats()
		if st.Flows == 0 && st.HeldBytes == 0 && st.Scattering == 0 {
			break
		}
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("10 s after the sender died the receiver holds a flow its late WANT opened: %+v (flow expiry %v)", st, 4*rcfg.RequestTimeout)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("the dead sender's late flow gone %v after its death", time.Since(killed))
	v.close(t)
	conserve(t, r)
}

// TestFencedOldIncarnationWantDropped: a sender dies holding a grant and
// the receiver fences it (its regions free at once). The sender restarted
// under its name (a new agent and engine: a new incarnation), which the
// receiver did not load (it only learned it), is served at once, within
// the quarantine its old incarnation is fenced for; a late WANT of the old
// incarnation is still dropped, and its engine connection refused.
func TestFencedOldIncarnationWantDropped(t *testing.T) {
	w := tcpZMQWorld(t)
	cfg := testConfig()
	cfg.Quarantine = time.Minute
	r := w.node("r", cfg)
	s := stalledSender(w, "victim", cfg)
	loadInto(t, s, r)
	j := simple(t, s, r, 1)
	if _, err := s.Submit(Request{Peer: "r", Src: j.src, Dst: j.dst}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for r.ArenaStats().HeldBytes == 0 || r.eng.(*tcp.Engine).Stats().IncomingConns == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the receiver never granted the stalled request (or the sender never connected)")
		}
		time.Sleep(time.Millisecond)
	}
	oldInc, endpoint := s.inc, s.ctrl.LocalEndpoint()
	killed := time.Now()
	s.ctrl.Close()
	s.eng.Close()
	for r.Stats().FencedReleases == 0 || r.ArenaStats().Flows != 0 {
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("10 s after the sender died it is not fenced: %+v, %+v", r.ArenaStats(), r.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	s.close(t)
	// The restart: served at once, though the receiver never loaded it.
	again := w.node("victim", cfg)
	if again.inc == oldInc {
		t.Fatal("the restarted agent has the old incarnation")
	}
	loadInto(t, again, r)
	ja := simple(t, again, r, 11)
	ba, err := again.Submit(Request{Peer: "r", Src: ja.src, Dst: ja.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, ba); err != nil {
		t.Fatalf("the restarted sender, %v after the kill (quarantine %v): %v", time.Since(killed), cfg.Quarantine, err)
	}
	if ba.Route() != RouteBounce {
		t.Fatalf("the restarted sender's request took %v (%s)", ba.Route(), ba.RouteReason())
	}
	ja.verify(t)
	// A late WANT of the old incarnation opens nothing.
	done := make(chan struct{})
	r.post(func(rr *reactor) {
		rr.onWant("victim", "", &wire.Want{Request: 99, ChunkBytes: []uint64{cfg.MaxChunk}, Endpoint: endpoint, Incarnation: oldInc})
		close(done)
	})
	<-done
	if st := r.ArenaStats(); st.Flows != 0 || st.HeldBytes != 0 {
		t.Fatalf("a WANT of the fenced incarnation opened a flow: %+v", st)
	}
	conserve(t, r)
}
