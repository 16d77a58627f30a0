package ucx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// pendingWrite pauses b and posts a 64 MiB write from a to b that cannot
// finish while b is paused (over tcp, UCX 1.13 emulates puts with active
// messages the target must progress).
func pendingWrite(t *testing.T, p pair) (transfer.Op, func()) {
	t.Helper()
	// Finish UCX's connection wireup first: UCX 1.13.1 aborts a process whose
	// wireup reply is pending when the other side's worker disappears (see
	// doc.go).
	op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: desc(p.abuf, 0, 1), Dst: desc(p.bbuf, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	resume := pause(t, p.b)
	op, err = p.a.PostWrite("b", []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := op.Poll(); s != transfer.Pending {
		resume()
		t.Skipf("write to a paused target finished (%v): this transport does not need target progress", s)
	}
	return op, resume
}

// TestForgetPeerWithOpsInFlight forgets a peer while a write to it cannot
// finish: the write fails with ErrPeerLost once UCX completed (cancelled)
// its requests, the source is no longer in use, and the peer can be loaded
// again. Bytes of the cancelled write already inside the transport may
// still land in the target's memory later (the bounce orphan rule), so the
// check after reloading uses a separate target buffer.
func TestForgetPeerWithOpsInFlight(t *testing.T) {
	fresh := alloc(t, 1<<20)
	p := newPair(t, PeerErrors, 64<<20)
	register(t, p.b, fresh)
	op, resume := pendingWrite(t, p)
	if err := p.a.DeregisterMemory(p.abuf.Desc()); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("deregister in use: %v", err)
	}
	if err := op.Release(); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("release pending: %v", err)
	}
	if err := p.a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	mustFail(t, op, transfer.ErrPeerLost)
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	if err := op.Release(); err == nil {
		t.Fatal("second release accepted")
	}
	if err := p.a.ForgetPeer("b"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("forget twice: %v", err)
	}
	if _, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("write to forgotten peer: %v", err)
	}
	if err := p.a.DeregisterMemory(p.abuf.Desc()); err != nil {
		t.Fatalf("deregister after the op failed: %v", err)
	}
	resume()
	// Loading the peer again works and writes land.
	register(t, p.a, p.abuf)
	load(t, p.a, p.b)
	fill(p.abuf.Bytes()[:1<<20], 9)
	op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: desc(p.abuf, 0, 1<<20), Dst: fresh.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	if !bytes.Equal(fresh.Bytes(), p.abuf.Bytes()[:1<<20]) {
		t.Fatal("bytes differ after reload")
	}
}

// TestCloseDrainsLiveWrites closes the writer right after posting to a live
// target: Close lets the write finish (Done) before tearing down.
func TestCloseDrainsLiveWrites(t *testing.T) {
	p := newPair(t, PeerErrors, 16<<20)
	fill(p.abuf.Bytes(), 21)
	op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.a.Close(); err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	if !bytes.Equal(p.abuf.Bytes(), p.bbuf.Bytes()) {
		t.Fatal("bytes differ after a draining close")
	}
	if err := p.a.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	for name, err := range map[string]error{
		"register":   p.a.RegisterMemory(p.abuf.Desc()),
		"deregister": p.a.DeregisterMemory(p.abuf.Desc()),
		"forget":     p.a.ForgetPeer("b"),
		"notify":     p.a.Notify("b", nil),
	} {
		if !errors.Is(err, transfer.ErrClosed) {
			t.Errorf("%s after close: %v", name, err)
		}
	}
	if _, err := p.a.Metadata(); !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("metadata after close: %v", err)
	}
	if _, err := p.a.LoadPeer(nil); err == nil {
		t.Error("load after close accepted")
	}
	if _, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}}); !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("write after close: %v", err)
	}
	if _, err := p.a.RecvNotification(time.Second); !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("recv after close: %v", err)
	}
}

// TestPeerCloseFailsWrites closes the target engine while a write to it is
// in flight: the writer's op must fail (ErrPeerLost), not hang.
func TestPeerCloseFailsWrites(t *testing.T) {
	p := newPair(t, PeerErrors, 64<<20)
	op, resume := pendingWrite(t, p)
	resume()
	p.b.Close()
	s, err := wait(t, op)
	if s == transfer.Failed && !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("op failed with %v, want ErrPeerLost", err)
	}
}

func TestNotifyInOrderWithSenderName(t *testing.T) {
	for _, mode := range allModes() {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode, 4096)
			const n = 2000
			sent := 0
			for sent < n {
				err := p.a.Notify("b", []byte(fmt.Sprintf("m%d", sent)))
				if errors.Is(err, transfer.ErrQueueFull) {
					time.Sleep(time.Millisecond)
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				sent++
			}
			for i := 0; i < n; i++ {
				m, err := p.b.RecvNotification(hangGuard)
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if want := fmt.Sprintf("m%d", i); m.Peer != "a" || string(m.Payload) != want {
					t.Fatalf("message %d: %q from %q, want %q from a", i, m.Payload, m.Peer, want)
				}
			}
			if _, err := p.b.RecvNotification(0); !errors.Is(err, transfer.ErrTimeout) {
				t.Fatalf("empty queue: %v", err)
			}
			// Reverse path: b never loaded a but can answer it by name.
			big := bytes.Repeat([]byte{0xab}, DefaultMaxNotifySize)
			for _, payload := range [][]byte{[]byte("pong"), {}, big} {
				if err := p.b.Notify("a", payload); err != nil {
					t.Fatal(err)
				}
				m, err := p.a.RecvNotification(hangGuard)
				if err != nil || m.Peer != "b" || !bytes.Equal(m.Payload, payload) {
					t.Fatalf("reply: %d bytes from %q, %v; want %d bytes from b", len(m.Payload), m.Peer, err, len(payload))
				}
			}
			// ...but cannot write to it before loading its metadata.
			if _, err := p.b.PostWrite("a", []transfer.WriteOp{{Src: desc(p.bbuf, 0, 1), Dst: desc(p.abuf, 0, 1)}}); !errors.Is(err, transfer.ErrNotRegistered) {
				t.Fatalf("write to notify-only peer: %v", err)
			}
			if err := p.a.Notify("b", make([]byte, DefaultMaxNotifySize+1)); err == nil {
				t.Fatal("oversized notification accepted")
			}
			if err := p.a.Notify("nobody", nil); !errors.Is(err, transfer.ErrUnknownPeer) {
				t.Fatalf("notify unknown: %v", err)
			}
			if st := p.b.Stats(); st.RecvDropped != 0 || st.NotifySendFailed != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestNotifyQueueFull(t *testing.T) {
	a := newEngine(t, Config{Name: "a", NotifyQueue: 4})
	b := newEngine(t, Config{Name: "b"})
	load(t, a, b)
	resume := pause(t, a) // sends stay queued while a's progress is blocked
	for i := 0; i < 4; i++ {
		if err := a.Notify("b", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Notify("b", []byte{4}); !errors.Is(err, transfer.ErrQueueFull) {
		t.Fatalf("fifth notification: %v, want ErrQueueFull", err)
	}
	resume()
	for i := 0; i < 4; i++ {
		m, err := b.RecvNotification(hangGuard)
		if err != nil || m.Payload[0] != byte(i) {
			t.Fatalf("message %d: %v %v", i, m, err)
		}
	}
}

func TestRecvQueueFullDropsAndCounts(t *testing.T) {
	a := newEngine(t, Config{Name: "a"})
	b := newEngine(t, Config{Name: "b", RecvQueue: 3})
	load(t, a, b)
	for i := 0; i < 5; i++ {
		if err := a.Notify("b", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing reads b's queue until the two extra messages were dropped.
	deadline := time.Now().Add(hangGuard)
	for b.Stats().RecvDropped != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("RecvDropped = %d, want 2", b.Stats().RecvDropped)
		}
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < 3; i++ {
		m, err := b.RecvNotification(hangGuard)
		if err != nil || m.Payload[0] != byte(i) {
			t.Fatalf("message %d: %v %v", i, m, err)
		}
	}
	if m, err := b.RecvNotification(0); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("queue holds %v after the drops (%v)", m, err)
	}
}

func TestRecvClosedWakesWaiter(t *testing.T) {
	e, err := New(Config{Name: "w"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := e.RecvNotification(hangGuard); got <- err }()
	e.Close()
	if err := <-got; !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("waiter got %v", err)
	}
}

func TestBadMetadata(t *testing.T) {
	e := newEngine(t, Config{Name: "m"})
	good, err := e.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	flip := bytes.Clone(good)
	flip[len(flip)/2] ^= 1
	for name, md := range map[string][]byte{
		"nil": nil, "short": good[:10], "truncated": good[:len(good)-1], "flipped bit": flip,
		"trailing": append(bytes.Clone(good), 0), "garbage": bytes.Repeat([]byte{0xff}, 200),
	} {
		if _, err := e.LoadPeer(md); !errors.Is(err, transfer.ErrBadMetadata) {
			t.Errorf("%s: %v, want ErrBadMetadata", name, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{}, {Name: string(make([]byte, 256))}, {Name: "\xff"},
		{Name: "x", FragmentSize: 100}, {Name: "x", ErrMode: 7},
		{Name: "x", MaxNotifySize: 2 << 20}, {Name: "x", NotifyQueue: -1},
		{Name: "x", RecvQueue: -1}, {Name: "x", CloseTimeout: -1},
	} {
		if e, err := New(c); err == nil {
			e.Close()
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

// levelCounter is a slog handler keeping the records at Warn and above,
// with their attributes.
type levelCounter struct {
	mu    *sync.Mutex
	warns *[]string
}

func newLevelCounter() levelCounter { return levelCounter{mu: new(sync.Mutex), warns: new([]string)} }

func (h levelCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h levelCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		msg := r.Message
		r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
		h.mu.Lock()
		*h.warns = append(*h.warns, msg)
		h.mu.Unlock()
	}
	return nil
}
func (h levelCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h levelCounter) WithGroup(string) slog.Handler      { return h }
func (h levelCounter) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), *h.warns...)
}

// cleanPair is a, which loaded b, wrote 1 MiB to it and notified it, and b,
// which answered on the endpoint back that a's hello made: the state of
// two agents at the end of every clean run. Each logs to its counter.
// a drains for up to drain at Close.
func cleanPair(t *testing.T, drain time.Duration) (a, b *Engine, la, lb levelCounter) {
	t.Helper()
	abuf, bbuf := alloc(t, 1<<20), alloc(t, 1<<20)
	la, lb = newLevelCounter(), newLevelCounter()
	a = newEngine(t, Config{Name: "a", Logger: slog.New(la), DrainTimeout: drain})
	b = newEngine(t, Config{Name: "b", Logger: slog.New(lb)})
	register(t, a, abuf)
	register(t, b, bbuf)
	load(t, a, b)
	fill(abuf.Bytes(), 7)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: desc(abuf, 0, 1<<20), Dst: desc(bbuf, 0, 1<<20)}})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	if !bytes.Equal(abuf.Bytes(), bbuf.Bytes()) {
		t.Fatal("bytes differ after the write")
	}
	if err := a.Notify("b", []byte("done")); err != nil {
		t.Fatal(err)
	}
	if m, err := b.RecvNotification(hangGuard); err != nil || string(m.Payload) != "done" {
		t.Fatalf("notification %q, %v", m.Payload, err)
	}
	if err := b.Notify("a", []byte("ack")); err != nil {
		t.Fatal(err)
	}
	if m, err := a.RecvNotification(hangGuard); err != nil || string(m.Payload) != "ack" {
		t.Fatalf("reply %q, %v", m.Payload, err)
	}
	return a, b, la, lb
}

// waitLost waits until e's notifications to peer fail with ErrPeerLost
// and returns that error.
func waitLost(t *testing.T, e *Engine, peer string) error {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		err := e.Notify(peer, []byte("x"))
		if errors.Is(err, transfer.ErrPeerLost) {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still notifies the closed %s: %v", e.name, peer, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCleanCloseLogsNoWarn: a writer that closes its engine after a
// successful write and notifications (the end of every clean run; `bounce
// run --engine.kind ucx` ended with the peer's WARN "peer endpoint failed
// ... Endpoint timeout") makes neither side log a warning, and the peer
// still learns the writer is gone (ErrPeerLost, naming the close).
func TestCleanCloseLogsNoWarn(t *testing.T) {
	a, b, la, lb := cleanPair(t, 0)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := waitLost(t, b, "a"); !strings.Contains(err.Error(), "closed its engine") {
		t.Fatalf("b's loss of a: %v, want it to name a's close", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if w := append(la.list(), lb.list()...); len(w) > 0 {
		t.Fatalf("a clean close logged warnings: %q", w)
	}
}

// TestCloseWaitsForByeAck is the race behind that warning, made
// deterministic: b's progress goroutine is held while a closes, so when it
// runs again a's bye and the end of a's worker would both be pending, and
// nothing orders a message on one endpoint against the error callback of
// another. a's Close must wait for b's ack of the bye (b marks a departed
// before it acks) before its worker goes: it returns only after b is
// released, and b logs no warning.
func TestCloseWaitsForByeAck(t *testing.T) {
	a, b, la, lb := cleanPair(t, hangGuard) // only b's ack ends a's wait
	release := make(chan struct{})
	held := make(chan struct{})
	if err := b.submit(func() { close(held); <-release }); err != nil {
		t.Fatal(err)
	}
	<-held
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	const hold = 300 * time.Millisecond
	select {
	case err := <-closed:
		close(release)
		t.Fatalf("a's Close returned (%v) while b could not have taken its bye", err)
	case <-time.After(hold):
	}
	close(release)
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangGuard):
		t.Fatal("a's Close hangs after b was released")
	}
	waitLost(t, b, "a")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if w := append(la.list(), lb.list()...); len(w) > 0 {
		t.Fatalf("a clean close logged warnings: %q", w)
	}
}
