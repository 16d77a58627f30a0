package tcp

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// lostRecorder records SetPeerLost reports.
type lostRecorder struct {
	mu    sync.Mutex
	peers []string
}

func (l *lostRecorder) add(p string) { l.mu.Lock(); l.peers = append(l.peers, p); l.mu.Unlock() }
func (l *lostRecorder) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.peers...)
}

// TestPeerLostWhenLastConnectionEnds: B reports A lost once every
// connection A dialed to B ended (A's engine closed, as a killed process's
// would be), exactly once, and not while a connection is left.
func TestPeerLostWhenLastConnectionEnds(t *testing.T) {
	v := newEnv(t)
	a := v.engine("a", func(c *Config) { c.Connections = 2 })
	b := v.engine("b")
	var lost lostRecorder
	var _ transfer.PeerLossReporter = b
	b.SetPeerLost(lost.add)
	src := v.buf(1<<20, 5, a)
	dst := v.buf(1<<20, 0, b)
	connect(t, a, b)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	time.Sleep(50 * time.Millisecond)
	if got := lost.get(); len(got) != 0 {
		t.Fatalf("reported %v while A is connected", got)
	}
	start := time.Now()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "B reports A lost", func() bool { return len(lost.get()) > 0 })
	t.Logf("A lost after %v", time.Since(start))
	time.Sleep(50 * time.Millisecond)
	if got := lost.get(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("reports %v, want exactly [a]", got)
	}
}

// TestPeerLostNotOnForget: a connection cut by B's own ForgetPeer is no
// loss report (the agent forgot the peer itself).
func TestPeerLostNotOnForget(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	var lost lostRecorder
	b.SetPeerLost(lost.add)
	src := v.buf(4096, 5, a)
	dst := v.buf(4096, 0, b)
	connect(t, a, b)
	connect(t, b, a)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	mustDone(t, op, err)
	if err := b.ForgetPeer("a"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if got := lost.get(); len(got) != 0 {
		t.Fatalf("ForgetPeer's own cut reported as a loss: %v", got)
	}
}

// TestPeerLostWhenOutgoingBreaks: A dialed B (at Connect, before any
// write) and B dies: A reports B lost once its connection broke, without
// having written anything.
func TestPeerLostWhenOutgoingBreaks(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	var lost lostRecorder
	a.SetPeerLost(lost.add)
	connect(t, a, b)
	a.Connect("b")
	eventually(t, "A's first connection to B is up", func() bool { return a.peers["b"] != nil && a.peers["b"].connected() })
	time.Sleep(20 * time.Millisecond) // HELLO through
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "A reports B lost", func() bool { return len(lost.get()) > 0 })
	if got := lost.get(); got[0] != "b" {
		t.Fatalf("reports %v, want [b]", got)
	}
}

// TestConnectBeforeAnyWrite: B notices A die from the connection Connect
// opened, A having written nothing, and Connect opens one connection
// however often it is called.
func TestConnectBeforeAnyWrite(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	var lost lostRecorder
	b.SetPeerLost(lost.add)
	connect(t, a, b)
	for range 5 {
		a.Connect("b")
	}
	a.Connect("nobody") // unknown: nothing
	eventually(t, "b learns a", func() bool { _, err := b.peer("a"); return err == nil })
	b.mu.Lock()
	n := len(b.incoming)
	b.mu.Unlock()
	if n != 1 {
		t.Fatalf("b has %d incoming connections after 5 Connects, want 1", n)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "B reports A lost", func() bool { return len(lost.get()) > 0 })
	if got := lost.get(); got[0] != "a" {
		t.Fatalf("reports %v, want [a]", got)
	}
}

// peerCount returns how many peers e keeps.
func peerCount(e *Engine) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.peers)
}

// TestLearnedPeerDroppedWhenGone: a peer B only learned from its HELLO
// (never loaded) leaves B's peer table once its last connection ended, so
// a receiver keeps no entry per sender process that ever wrote to it (the
// soak's heap grew ~7.7 KiB per sender before); one B loaded is kept, and
// a learned peer that comes back is served again.
func TestLearnedPeerDroppedWhenGone(t *testing.T) {
	v := newEnv(t)
	b := v.engine("b")
	var lost lostRecorder
	b.SetPeerLost(lost.add)
	dst := v.buf(1<<20, 0, b)
	loaded := v.engine("loaded")
	connect(t, b, loaded) // b loads this one: it stays
	for round := range 3 {
		a := v.engine("a")
		src := v.buf(64<<10, uint64(round+1), a)
		connect(t, a, b)
		clear(dst.Bytes())
		op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: sub(dst, 0, 64<<10)}})
		mustDone(t, op, err)
		if !bytes.Equal(dst.Bytes()[:64<<10], src.Bytes()) {
			t.Fatalf("round %d: write differs", round)
		}
		if n := peerCount(b); n != 2 {
			t.Fatalf("round %d: b keeps %d peers while a is connected, want 2 (a learned, loaded)", round, n)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		eventually(t, "b reports a lost", func() bool { return len(lost.get()) == round+1 })
		if n := peerCount(b); n != 1 {
			t.Fatalf("round %d: b keeps %d peers after a left, want 1 (the loaded one)", round, n)
		}
	}
}
