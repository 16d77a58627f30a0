package loopback_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/engines/enginetest"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func buffer(t *testing.T, n uint64) *mem.Buffer {
	t.Helper()
	b, err := mem.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Free() })
	return b
}

func engine(t *testing.T, f *loopback.Fabric, name string, opts ...loopback.Options) *loopback.Engine {
	t.Helper()
	e, err := f.NewEngine(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func register(t *testing.T, e *loopback.Engine, b *mem.Buffer) transfer.Desc {
	t.Helper()
	if err := e.RegisterMemory(b.Desc()); err != nil {
		t.Fatal(err)
	}
	return b.Desc()
}

// load makes from know to.
var load = enginetest.Load

func sub(d transfer.Desc, off, n uint64) transfer.Desc {
	return transfer.Desc{Addr: d.Addr + off, Len: n, Kind: transfer.Host}
}

func await(t *testing.T, op transfer.Op, ch <-chan struct{}) (transfer.Status, error) {
	t.Helper()
	for {
		if s, err := op.Poll(); s.Terminal() {
			return s, err
		}
		<-ch
	}
}

func signal(ch chan struct{}) func() {
	return func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i)*31 + seed
	}
}

// pair returns engines a and b, each with one registered 64 KiB buffer,
// a knowing b.
func pair(t *testing.T, aOpts loopback.Options) (a, b *loopback.Engine, src, dst *mem.Buffer, done chan struct{}) {
	f := loopback.NewFabric()
	done = make(chan struct{}, 1)
	if aOpts.OnComplete == nil {
		aOpts.OnComplete = signal(done)
	}
	a, b = engine(t, f, "a", aOpts), engine(t, f, "b")
	src, dst = buffer(t, 1<<16), buffer(t, 1<<16)
	pattern(src.Bytes(), 5)
	register(t, a, src)
	register(t, b, dst)
	load(t, a, b)
	return a, b, src, dst, done
}

func TestPostWriteByteExactMultiOp(t *testing.T) {
	a, _, src, dst, done := pair(t, loopback.Options{})
	S, D := src.Desc(), dst.Desc()
	ops := []transfer.WriteOp{
		{Src: sub(S, 0, 4096), Dst: sub(D, 8192, 4096)},
		{Src: sub(S, 100, 1), Dst: sub(D, 0, 1)},
		{Src: sub(S, 30000, 20000), Dst: sub(D, 40000, 20000)},
	}
	op, err := a.PostWrite("b", ops)
	if err != nil {
		t.Fatal(err)
	}
	ops[0].Dst.Addr = 0 // the engine keeps its own copy of ops
	if s, err := await(t, op, done); s != transfer.Done || err != nil {
		t.Fatalf("op = %v, %v", s, err)
	}
	want := make([]byte, 1<<16)
	copy(want[8192:], src.Bytes()[:4096])
	want[0] = src.Bytes()[100]
	copy(want[40000:60000], src.Bytes()[30000:50000])
	if !bytes.Equal(dst.Bytes(), want) {
		t.Fatal("destination bytes differ")
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	if err := op.Release(); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("double release: %v", err)
	}
	if a.InFlight() != 0 {
		t.Fatalf("in flight = %d", a.InFlight())
	}
}

func TestPostWriteRejectsWithoutWriting(t *testing.T) {
	a, b, src, dst, done := pair(t, loopback.Options{})
	S, D := src.Desc(), dst.Desc()
	unreg := buffer(t, 4096)
	late := buffer(t, 4096) // registered by b after a loaded b's metadata
	register(t, b, late)
	good := transfer.WriteOp{Src: sub(S, 0, 64), Dst: sub(D, 0, 64)}

	for _, tc := range []struct {
		name string
		peer string
		op   transfer.WriteOp
		want error
	}{
		{"unregistered source", "b", transfer.WriteOp{Src: sub(unreg.Desc(), 0, 64), Dst: sub(D, 64, 64)}, transfer.ErrNotRegistered},
		{"source overrun", "b", transfer.WriteOp{Src: sub(S, 1<<16-10, 64), Dst: sub(D, 64, 64)}, transfer.ErrOutOfBounds},
		{"unregistered destination", "b", transfer.WriteOp{Src: sub(S, 0, 64), Dst: sub(unreg.Desc(), 0, 64)}, transfer.ErrNotRegistered},
		{"destination overrun", "b", transfer.WriteOp{Src: sub(S, 0, 64), Dst: sub(D, 1<<16-63, 64)}, transfer.ErrOutOfBounds},
		{"destination not in loaded metadata", "b", transfer.WriteOp{Src: sub(S, 0, 64), Dst: sub(late.Desc(), 0, 64)}, transfer.ErrNotRegistered},
		{"length mismatch", "b", transfer.WriteOp{Src: sub(S, 0, 64), Dst: sub(D, 0, 65)}, transfer.ErrOutOfBounds},
		{"empty", "b", transfer.WriteOp{Src: sub(S, 0, 0), Dst: sub(D, 0, 0)}, transfer.ErrOutOfBounds},
		{"device memory", "b", transfer.WriteOp{Src: S, Dst: transfer.Desc{Addr: D.Addr, Len: D.Len, Kind: transfer.CUDA}}, transfer.ErrUnsupported},
		{"unknown peer", "c", transfer.WriteOp{Src: sub(S, 0, 64), Dst: sub(D, 64, 64)}, transfer.ErrUnknownPeer},
	} {
		op, err := a.PostWrite(tc.peer, []transfer.WriteOp{good, tc.op})
		if !errors.Is(err, tc.want) || op != nil {
			t.Errorf("%s: PostWrite = %v, %v; want %v", tc.name, op, err, tc.want)
		}
	}
	if _, err := a.PostWrite("b", nil); err == nil {
		t.Error("empty post accepted")
	}
	for _, b := range [][]byte{dst.Bytes(), unreg.Bytes(), late.Bytes()} {
		if !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatal("a rejected post wrote bytes")
		}
	}
	if a.InFlight() != 0 {
		t.Fatalf("rejected posts left %d in flight", a.InFlight())
	}

	// After a reload the late buffer is a valid destination; after b
	// deregisters it, it is not, even though a's loaded view still lists it.
	load(t, a, b)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(S, 0, 64), Dst: sub(late.Desc(), 0, 64)}})
	if err != nil {
		t.Fatalf("after reload: %v", err)
	}
	if s, err := await(t, op, done); s != transfer.Done {
		t.Fatalf("after reload: op = %v, %v", s, err)
	}
	if !bytes.Equal(late.Bytes()[:64], src.Bytes()[:64]) {
		t.Fatal("write into the late buffer differs")
	}
	if err := b.DeregisterMemory(late.Desc()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(S, 0, 64), Dst: sub(late.Desc(), 64, 64)}}); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("destination deregistered by the peer: err = %v", err)
	}
}

func TestForgetPeerFailsInFlight(t *testing.T) {
	gate := make(chan struct{})
	a, b, src, dst, done := pair(t, loopback.Options{Gate: gate})
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := op.Poll(); s != transfer.Pending {
		t.Fatalf("gated op = %v", s)
	}
	if err := op.Release(); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("release pending: %v", err)
	}
	if err := a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	// ForgetPeer returned, so the operation is already terminal.
	s, err := op.Poll()
	if s != transfer.Failed || !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("op after forget = %v, %v; want failed with ErrPeerLost", s, err)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Bytes(), make([]byte, 1<<16)) {
		t.Fatal("a failed write wrote bytes")
	}
	if _, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("post after forget: %v", err)
	}
	if err := a.ForgetPeer("b"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("second forget: %v", err)
	}
	// Reloading reconnects.
	load(t, a, b)
	op, err = a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	gate <- struct{}{}
	if s, err := await(t, op, done); s != transfer.Done {
		t.Fatalf("after reload = %v, %v", s, err)
	}
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("bytes differ after reload")
	}
}

func TestDeregisterInUse(t *testing.T) {
	gate := make(chan struct{})
	a, b, src, dst, done := pair(t, loopback.Options{Gate: gate})
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src.Desc(), 0, 100), Dst: sub(dst.Desc(), 500, 100)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.DeregisterMemory(src.Desc()); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("deregister source in use: %v", err)
	}
	if err := b.DeregisterMemory(dst.Desc()); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("deregister destination in use: %v", err)
	}
	close(gate)
	if s, _ := await(t, op, done); s != transfer.Done {
		t.Fatal(s)
	}
	if err := a.DeregisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	if err := b.DeregisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	if err := b.DeregisterMemory(dst.Desc()); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("second deregister: %v", err)
	}
}

func TestFaultHooks(t *testing.T) {
	errInjected := errors.New("injected fault")
	var calls int
	a, _, src, dst, done := pair(t, loopback.Options{
		BeforePost: func(peer string, ops []transfer.WriteOp) error {
			calls++
			if calls == 1 {
				return errInjected
			}
			return nil
		},
		BeforeCopy: func(peer string, ops []transfer.WriteOp) error {
			if peer != "b" || len(ops) != 1 {
				return fmt.Errorf("hook saw peer %q with %d ops", peer, len(ops))
			}
			return errInjected
		},
	})
	w := []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}}
	if _, err := a.PostWrite("b", w); !errors.Is(err, errInjected) {
		t.Fatalf("BeforePost: err = %v", err)
	}
	op, err := a.PostWrite("b", w)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := await(t, op, done); s != transfer.Failed || !errors.Is(err, errInjected) {
		t.Fatalf("BeforeCopy: op = %v, %v", s, err)
	}
	if !bytes.Equal(dst.Bytes(), make([]byte, 1<<16)) {
		t.Fatal("failed op wrote bytes")
	}
}

func TestCloseSemantics(t *testing.T) {
	f := loopback.NewFabric()
	gate := make(chan struct{})
	done := make(chan struct{}, 1)
	a := engine(t, f, "a", loopback.Options{Gate: gate, OnComplete: signal(done)})
	b := engine(t, f, "b")
	c := engine(t, f, "c")
	src, db, dc := buffer(t, 4096), buffer(t, 4096), buffer(t, 4096)
	register(t, a, src)
	register(t, b, db)
	register(t, c, dc)
	load(t, a, b)
	load(t, a, c)
	load(t, b, a)
	oldB, err := b.Metadata()
	if err != nil {
		t.Fatal(err)
	}

	toB, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: db.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	toC, err := a.PostWrite("c", []transfer.WriteOp{{Src: src.Desc(), Dst: dc.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	// The target closing fails writes into it with ErrPeerLost.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err := toB.Poll(); s != transfer.Failed || !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("write into closed peer = %v, %v", s, err)
	}
	if _, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: db.Desc()}}); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("post to closed peer: %v", err)
	}
	if err := a.Notify("b", []byte("x")); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("notify closed peer: %v", err)
	}
	// Closed engine: everything is ErrClosed, Close is idempotent.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"register":   b.RegisterMemory(db.Desc()),
		"deregister": b.DeregisterMemory(db.Desc()),
		"forget":     b.ForgetPeer("a"),
		"notify":     b.Notify("a", nil),
	} {
		if !errors.Is(err, transfer.ErrClosed) {
			t.Errorf("%s after close: %v", name, err)
		}
	}
	if _, err := b.RecvNotification(time.Millisecond); !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("recv after close: %v", err)
	}
	if _, err := b.Metadata(); !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("metadata after close: %v", err)
	}
	if _, err := b.PostWrite("a", []transfer.WriteOp{{Src: db.Desc(), Dst: src.Desc()}}); !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("post after close: %v", err)
	}
	// The name is free again; the old metadata is stale.
	b2 := engine(t, f, "b")
	if _, err := a.LoadPeer(oldB); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("load stale metadata: %v", err)
	}
	load(t, a, b2)

	// The sender closing fails its own in-flight writes with ErrClosed.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err := toC.Poll(); s != transfer.Failed || !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("in-flight write after own close = %v, %v", s, err)
	}
	if !bytes.Equal(db.Bytes(), make([]byte, 4096)) || !bytes.Equal(dc.Bytes(), make([]byte, 4096)) {
		t.Fatal("failed writes wrote bytes")
	}
	for _, op := range []transfer.Op{toB, toC} {
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNotificationsInOrderWithSender(t *testing.T) {
	f := loopback.NewFabric()
	a, c := engine(t, f, "a"), engine(t, f, "c")
	b := engine(t, f, "b", loopback.Options{InboxSize: 400})
	load(t, a, b)
	load(t, c, b)
	load(t, b, b) // an engine may notify itself
	const n = 100
	buf := make([]byte, 8)
	for i := range n {
		for _, s := range []*loopback.Engine{a, c, b} {
			copy(buf, fmt.Sprintf("%s%07d", s.Name(), i))
			if err := s.Notify("b", buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	buf[0] = 'X' // payloads were copied
	next := map[string]int{}
	for range 3 * n {
		m, err := b.RecvNotification(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%s%07d", m.Peer, next[m.Peer])
		if string(m.Payload) != want {
			t.Fatalf("from %q got %q, want %q", m.Peer, m.Payload, want)
		}
		next[m.Peer]++
	}
	if next["a"] != n || next["b"] != n || next["c"] != n {
		t.Fatalf("counts per sender = %v", next)
	}
	if _, err := b.RecvNotification(0); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("empty inbox, no wait: %v", err)
	}
	if _, err := b.RecvNotification(time.Millisecond); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("empty inbox: %v", err)
	}
	if err := a.Notify("c", nil); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("notify unloaded peer: %v", err)
	}
}

func TestNotifyQueueFull(t *testing.T) {
	f := loopback.NewFabric()
	a := engine(t, f, "a")
	b := engine(t, f, "b", loopback.Options{InboxSize: 2})
	load(t, a, b)
	for i := range 2 {
		if err := a.Notify("b", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Notify("b", []byte{2}); !errors.Is(err, transfer.ErrQueueFull) {
		t.Fatalf("third notify: %v", err)
	}
	m, err := b.RecvNotification(0)
	if err != nil || m.Payload[0] != 0 {
		t.Fatalf("recv = %v, %v", m, err)
	}
	if err := a.Notify("b", []byte{3}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []byte{1, 3} {
		if m, err := b.RecvNotification(0); err != nil || m.Payload[0] != want || m.Peer != "a" {
			t.Fatalf("recv = %v, %v; want %d from a", m, err, want)
		}
	}
}

func TestRecvUnblockedByClose(t *testing.T) {
	f := loopback.NewFabric()
	a := engine(t, f, "a")
	got := make(chan error)
	go func() {
		_, err := a.RecvNotification(time.Hour)
		got <- err
	}()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("blocked recv after close: %v", err)
	}
}

func TestLoadPeerRejectsBadMetadata(t *testing.T) {
	f, other := loopback.NewFabric(), loopback.NewFabric()
	a := engine(t, f, "a")
	x := engine(t, other, "x")
	mdX, err := x.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	b := engine(t, f, "b")
	register(t, b, buffer(t, 4096))
	mdB, err := b.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	for name, md := range map[string][]byte{
		"empty":          nil,
		"garbage":        []byte("not metadata at all, really"),
		"truncated":      mdB[:len(mdB)-1],
		"trailing":       append(append([]byte{}, mdB...), 0),
		"bad version":    append([]byte("BLMD\x09"), mdB[5:]...),
		"other fabric":   mdX,
		"json, not ours": []byte(`{"name":"b"}`),
	} {
		if _, err := a.LoadPeer(md); !errors.Is(err, transfer.ErrBadMetadata) {
			t.Errorf("%s: err = %v, want ErrBadMetadata", name, err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadPeer(mdB); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Errorf("closed peer: err = %v, want ErrUnknownPeer", err)
	}
}

func TestNewEngineValidation(t *testing.T) {
	f := loopback.NewFabric()
	engine(t, f, "a")
	for name, fn := range map[string]func() (*loopback.Engine, error){
		"empty name":     func() (*loopback.Engine, error) { return f.NewEngine("") },
		"control char":   func() (*loopback.Engine, error) { return f.NewEngine("a\nb") },
		"duplicate":      func() (*loopback.Engine, error) { return f.NewEngine("a") },
		"two options":    func() (*loopback.Engine, error) { return f.NewEngine("z", loopback.Options{}, loopback.Options{}) },
		"negative inbox": func() (*loopback.Engine, error) { return f.NewEngine("z", loopback.Options{InboxSize: -1}) },
	} {
		if e, err := fn(); err == nil {
			_ = e.Close()
			t.Errorf("%s accepted", name)
		}
	}
}

// TestTargetForgetFencesPeer: once B.ForgetPeer(A) returns, A's write in
// flight into B fails and lands nothing, and so does every write A posts
// later, until B loads A again.
func TestTargetForgetFencesPeer(t *testing.T) {
	gate := make(chan struct{})
	a, b, src, dst, done := pair(t, loopback.Options{Gate: gate})
	inFlight, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	// B never loaded A: a peer that only writes to B is forgotten too.
	if err := b.ForgetPeer("a"); err != nil {
		t.Fatalf("B.ForgetPeer(a) with a write of a in flight: %v", err)
	}
	if s, err := inFlight.Poll(); s != transfer.Failed || !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("in-flight write after B forgot A = %v, %v; want failed with ErrPeerLost", s, err)
	}
	close(gate) // nothing stalls any more
	later, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err == nil {
		s, perr := await(t, later, done)
		if s != transfer.Failed || !errors.Is(perr, transfer.ErrPeerLost) {
			t.Fatalf("write posted after B forgot A = %v, %v; want failed with ErrPeerLost", s, perr)
		}
		_ = later.Release()
	} else if !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("post after B forgot A: %v; want ErrPeerLost", err)
	}
	time.Sleep(20 * time.Millisecond)
	if !bytes.Equal(dst.Bytes(), make([]byte, len(dst.Bytes()))) {
		t.Fatal("bytes of a forgotten peer landed")
	}
	if err := b.ForgetPeer("nobody"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("forget of a peer never seen: %v; want ErrUnknownPeer", err)
	}
	if !b.FencesForgottenPeers() {
		t.Fatal("loopback does not claim the fence")
	}
	// Loading A again admits its writes.
	load(t, b, a)
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := await(t, op, done); s != transfer.Done {
		t.Fatalf("after B loaded A again = %v, %v", s, err)
	}
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("bytes differ after B loaded A again")
	}
	_ = inFlight.Release()
	_ = op.Release()
}

// TestHoldStallsUntilReleasedOrAborted: a held write stays pending and
// writes nothing; it lands once Hold returns, and one failed while held
// (ForgetPeer) writes nothing at all.
func TestHoldStallsUntilReleasedOrAborted(t *testing.T) {
	release := make(chan struct{})
	hold := func(abort <-chan struct{}) {
		select {
		case <-release:
		case <-abort:
		}
	}
	a, _, src, dst, done := pair(t, loopback.Options{Hold: hold})
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if s, _ := op.Poll(); s != transfer.Pending || !bytes.Equal(dst.Bytes(), make([]byte, len(dst.Bytes()))) {
		t.Fatalf("held write = %v, or it wrote bytes", s)
	}
	close(release)
	if s, err := await(t, op, done); s != transfer.Done || !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatalf("released write = %v, %v (or bytes differ)", s, err)
	}
	_ = op.Release()

	release = make(chan struct{})
	clear(dst.Bytes())
	op, err = a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	if s, err := op.Poll(); s != transfer.Failed || !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("write failed while held = %v, %v; want failed with ErrPeerLost", s, err)
	}
	close(release)
	time.Sleep(10 * time.Millisecond)
	if !bytes.Equal(dst.Bytes(), make([]byte, len(dst.Bytes()))) {
		t.Fatal("a write failed while held wrote bytes")
	}
	_ = op.Release()
}
