package tcp

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// fakeReceiver advertises a large range at an address this process never
// touches and handles accepted connections with a test-chosen behaviour.
type fakeReceiver struct {
	ln   net.Listener
	md   []byte
	dst  transfer.Desc
	quit chan struct{} // closed when the test ends
	wg   sync.WaitGroup
	mu   sync.Mutex
	conn []net.Conn
}

func newFakeReceiver(t testing.TB, name string, handle func(c net.Conn, quit <-chan struct{})) *fakeReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeReceiver{ln: ln, dst: transfer.Desc{Addr: 1 << 40, Len: 1 << 32}, quit: make(chan struct{})}
	f.md = encodeMetadata(metadata{name: name, addr: ln.Addr().String(), ranges: []transfer.Desc{f.dst}})
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conn = append(f.conn, c)
			f.mu.Unlock()
			f.wg.Add(1)
			go func() { defer f.wg.Done(); handle(c, f.quit) }()
		}
	}()
	t.Cleanup(f.close)
	return f
}

func (f *fakeReceiver) close() {
	close(f.quit)
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conn {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// stall reads nothing, so the sender's socket fills and its write blocks.
func stall(_ net.Conn, quit <-chan struct{}) { <-quit }

func postToFake(t testing.TB, a *Engine, f *fakeReceiver, src transfer.Desc) transfer.Op {
	t.Helper()
	if _, err := a.LoadPeer(f.md); err != nil {
		t.Fatal(err)
	}
	dst := transfer.Desc{Addr: f.dst.Addr, Len: src.Len, Kind: transfer.Host}
	op, err := a.PostWrite("fake", []transfer.WriteOp{{Src: src, Dst: dst}})
	if err != nil {
		t.Fatal(err)
	}
	return op
}

func TestForgetPeerFailsInFlight(t *testing.T) {
	v := newEnv(t)
	a := v.engine("a")
	src := v.buf(64<<20, 0, a)
	f := newFakeReceiver(t, "fake", stall)
	op := postToFake(t, a, f, src.Desc())
	if st, err := op.Poll(); st != transfer.Pending {
		t.Fatalf("poll = %v, %v; want pending", st, err)
	}
	if err := op.Release(); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("release while pending: %v, want ErrInUse", err)
	}
	if err := a.DeregisterMemory(src.Desc()); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("deregister while writing: %v, want ErrInUse", err)
	}
	if err := a.ForgetPeer("fake"); err != nil {
		t.Fatal(err)
	}
	// ForgetPeer returns after the operation is terminal.
	if st, err := op.Poll(); st != transfer.Failed || !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("after ForgetPeer: %v, %v; want failed with ErrPeerLost", st, err)
	}
	mustFail(t, op, transfer.ErrPeerLost)
	if err := a.DeregisterMemory(src.Desc()); err != nil {
		t.Fatalf("deregister after the op failed: %v", err)
	}
	if err := a.ForgetPeer("fake"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("forget twice: %v", err)
	}
	if _, err := a.PostWrite("fake", nil); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("post to forgotten peer: %v", err)
	}
}

func TestCloseFailsInFlight(t *testing.T) {
	v := newEnv(t)
	a := v.engine("a")
	src := v.buf(64<<20, 0, a)
	f := newFakeReceiver(t, "fake", stall)
	op := postToFake(t, a, f, src.Desc())
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := op.Poll(); st != transfer.Failed || !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("after Close: %v, %v; want failed with ErrClosed", st, err)
	}
}

func TestStalledReceiverFailsWithinWriteTimeout(t *testing.T) {
	v := newEnv(t)
	const wt = 200 * time.Millisecond
	a := v.engine("a", func(c *Config) { c.WriteTimeout = wt })
	src := v.buf(64<<20, 0, a)
	f := newFakeReceiver(t, "fake", stall)
	start := time.Now()
	mustFailWithin(t, postToFake(t, a, f, src.Desc()), transfer.ErrPeerLost, start, wt)
}

func TestSilentReceiverFailsWithinIdleTimeout(t *testing.T) {
	// The receiver reads every byte but never acknowledges.
	v := newEnv(t)
	const it = 200 * time.Millisecond
	a := v.engine("a", func(c *Config) { c.IdleTimeout = it })
	src := v.buf(1<<20, 34, a)
	f := newFakeReceiver(t, "fake", func(c net.Conn, _ <-chan struct{}) { io.Copy(io.Discard, c) })
	start := time.Now()
	mustFailWithin(t, postToFake(t, a, f, src.Desc()), transfer.ErrPeerLost, start, 2*it) // doc.go: within 2 x IdleTimeout
}

func TestReceiverDiesMidFrame(t *testing.T) {
	v := newEnv(t)
	a := v.engine("a", func(c *Config) { c.Connections = 1 })
	src := v.buf(8<<20, 35, a)
	f := newFakeReceiver(t, "fake", func(c net.Conn, _ <-chan struct{}) {
		// Take the HELLO and part of the first frame, then drop the
		// connection: the sender is inside its write.
		io.CopyN(io.Discard, c, 64<<10)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	mustFail(t, postToFake(t, a, f, src.Desc()), transfer.ErrPeerLost)
}

func TestBogusAckFailsConnection(t *testing.T) {
	// A receiver acknowledging a part that was never sent breaks the
	// protocol; the sender drops the connection and fails its work.
	v := newEnv(t)
	a := v.engine("a", func(c *Config) { c.Connections = 1 })
	src := v.buf(4096, 36, a)
	f := newFakeReceiver(t, "fake", func(c net.Conn, _ <-chan struct{}) {
		c.Write(encodeFrame(frameAck, 1<<60, nil))
		io.Copy(io.Discard, c)
	})
	err := mustFail(t, postToFake(t, a, f, src.Desc()), transfer.ErrPeerLost)
	if !errors.Is(err, errProtocol) {
		t.Fatalf("error %v does not report the protocol violation", err)
	}
}

func TestPeerEngineClosedMidWrite(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(16<<20, 37, a)
	dst := v.buf(16<<20, 0, b)
	connect(t, a, b)
	// 4 GiB in 16 MiB ops to the same destination: far more than can land
	// before b is closed below.
	ops := make([]transfer.WriteOp, 256)
	for i := range ops {
		ops[i] = transfer.WriteOp{Src: src.Desc(), Dst: dst.Desc()}
	}
	op, err := a.PostWrite("b", ops)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "first bytes land", func() bool { return anyNonZero(dst.Bytes()[:4096]) })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	mustFail(t, op, transfer.ErrPeerLost)
	// The source is free again.
	if err := a.DeregisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
}
