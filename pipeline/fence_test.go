package pipeline

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/tcp"
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
