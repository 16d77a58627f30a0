//go:build nixl

package nixl

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

func TestWriteSizes(t *testing.T) {
	const size = 24 << 20
	p := newPair(t, size, Config{})
	for i, n := range []uint64{1, 7, 4096, 65537, 1<<20 + 3, 16 << 20} {
		src, dst := uint64(i*13)%4096, uint64(i*29+5)%4096
		fill(p.abuf.Bytes()[src:src+n], uint64(i+1))
		op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: sub(p.abuf, src, n), Dst: sub(p.bbuf, dst, n)}})
		if err != nil {
			t.Fatalf("%d bytes: post: %v", n, err)
		}
		mustDone(t, op)
		if !bytes.Equal(p.bbuf.Bytes()[dst:dst+n], p.abuf.Bytes()[src:src+n]) {
			t.Fatalf("%d bytes: destination differs from source", n)
		}
	}
}

func TestWriteManyOpsAndPosts(t *testing.T) {
	const size = 8 << 20
	p := newPair(t, size, Config{})
	fill(p.abuf.Bytes(), 42)
	clear(p.bbuf.Bytes())
	// Four posts of 64 scattered 16 KiB pieces each (plus a zero-length op),
	// all in flight together, landing in reverse order at the target.
	const piece, per = 16 << 10, 64
	var ops []transfer.Op
	for post := 0; post < 4; post++ {
		w := []transfer.WriteOp{{Src: sub(p.abuf, 0, 0), Dst: sub(p.bbuf, 0, 0)}}
		for i := 0; i < per; i++ {
			k := uint64(post*per + i)
			w = append(w, transfer.WriteOp{Src: sub(p.abuf, k*piece, piece), Dst: sub(p.bbuf, size-(k+1)*piece, piece)})
		}
		op, err := p.a.PostWrite("b", w)
		if err != nil {
			t.Fatalf("post %d: %v", post, err)
		}
		ops = append(ops, op)
	}
	for _, op := range ops {
		mustDone(t, op)
	}
	for k := uint64(0); k < 4*per; k++ {
		if !bytes.Equal(p.bbuf.Bytes()[size-(k+1)*piece:size-k*piece], p.abuf.Bytes()[k*piece:(k+1)*piece]) {
			t.Fatalf("piece %d differs", k)
		}
	}
	if n := len(p.a.inflight) + len(p.a.handles) + len(p.a.refs); n != 0 {
		t.Fatalf("engine still tracks %d ops/handles/refs after release", n)
	}
}

func TestZeroLengthOnlyWriteIsDone(t *testing.T) {
	p := newPair(t, 4096, Config{})
	op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: sub(p.abuf, 0, 0), Dst: sub(p.bbuf, 0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
}

func TestWriteRejectsBeforeAnyByteMoves(t *testing.T) {
	const size = 1 << 20
	p := newPair(t, size, Config{})
	other := alloc(t, size) // registered nowhere
	fill(p.abuf.Bytes(), 1)
	clear(p.bbuf.Bytes())
	good := transfer.WriteOp{Src: sub(p.abuf, 0, 4096), Dst: sub(p.bbuf, 0, 4096)}
	cuda := good
	cuda.Dst.Kind = transfer.CUDA
	for _, tc := range []struct {
		name string
		peer string
		op   transfer.WriteOp
		want error
	}{
		{"unregistered source", "b", transfer.WriteOp{Src: sub(other, 0, 4096), Dst: good.Dst}, transfer.ErrNotRegistered},
		{"source past its range", "b", transfer.WriteOp{Src: transfer.Desc{Addr: p.abuf.Desc().Addr + size - 100, Len: 4096}, Dst: good.Dst}, transfer.ErrOutOfBounds},
		{"destination not the peer's", "b", transfer.WriteOp{Src: good.Src, Dst: sub(other, 0, 4096)}, transfer.ErrNotRegistered},
		{"destination past its range", "b", transfer.WriteOp{Src: good.Src, Dst: transfer.Desc{Addr: p.bbuf.Desc().Addr + size - 100, Len: 4096}}, transfer.ErrOutOfBounds},
		{"length mismatch", "b", transfer.WriteOp{Src: good.Src, Dst: sub(p.bbuf, 0, 100)}, transfer.ErrOutOfBounds},
		{"device memory", "b", cuda, transfer.ErrUnsupported},
		{"unknown peer", "nobody", good, transfer.ErrUnknownPeer},
	} {
		// The bad op comes after a good one: nothing of the post may move.
		_, err := p.a.PostWrite(tc.peer, []transfer.WriteOp{good, tc.op})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if !bytes.Equal(p.bbuf.Bytes(), make([]byte, size)) {
		t.Fatal("a rejected post wrote to the destination")
	}
	if _, err := p.a.PostWrite("b", nil); err == nil {
		t.Error("empty post accepted")
	}
}

func TestMetadataRefreshesPeerRanges(t *testing.T) {
	p := newPair(t, 4096, Config{})
	extra := alloc(t, 8192)
	op := transfer.WriteOp{Src: sub(p.abuf, 0, 4096), Dst: sub(extra, 4096, 4096)}
	if _, err := p.a.PostWrite("b", []transfer.WriteOp{op}); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("write to memory b has not registered yet: %v", err)
	}
	register(t, p.b, extra)
	load(t, p.a, p.b)
	fill(p.abuf.Bytes(), 3)
	w, err := p.a.PostWrite("b", []transfer.WriteOp{op})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, w)
	if !bytes.Equal(extra.Bytes()[4096:], p.abuf.Bytes()) {
		t.Fatal("bytes differ")
	}
}

func TestRegisterRules(t *testing.T) {
	e := newEngine(t, Config{Name: "r"})
	b := alloc(t, 1<<16)
	register(t, e, b)
	register(t, e, b) // same range again: no-op
	if err := e.RegisterMemory(sub(b, 4096, 4096)); err == nil {
		t.Error("overlapping registration accepted")
	}
	if err := e.RegisterMemory(transfer.Desc{Addr: 1 << 40, Len: 1, Kind: transfer.CUDA}); !errors.Is(err, transfer.ErrUnsupported) {
		t.Errorf("CUDA registration: %v", err)
	}
	if err := e.DeregisterMemory(sub(b, 0, 4096)); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Errorf("deregister a sub-range: %v", err)
	}
	if err := e.DeregisterMemory(b.Desc()); err != nil {
		t.Fatal(err)
	}
	if err := e.DeregisterMemory(b.Desc()); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Errorf("deregister twice: %v", err)
	}
}

func TestDeregisterInUseUntilPolledTerminal(t *testing.T) {
	const size = 32 << 20
	p := newPair(t, size, Config{})
	op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := op.Poll(); s == transfer.Pending {
		if err := p.a.DeregisterMemory(p.abuf.Desc()); !errors.Is(err, transfer.ErrInUse) {
			t.Fatalf("deregister under a pending write: %v, want ErrInUse", err)
		}
		if err := op.Release(); !errors.Is(err, transfer.ErrInUse) {
			t.Fatalf("release of a pending write: %v, want ErrInUse", err)
		}
	}
	mustDone(t, op)
	if err := op.Release(); err == nil {
		t.Fatal("second release accepted")
	}
	if err := p.a.DeregisterMemory(p.abuf.Desc()); err != nil {
		t.Fatalf("deregister after the write: %v", err)
	}
}

func TestLoadPeerRejects(t *testing.T) {
	e := newEngine(t, Config{Name: "x"})
	if _, err := e.LoadPeer([]byte("garbage")); !errors.Is(err, transfer.ErrBadMetadata) {
		t.Errorf("garbage: %v", err)
	}
	own, err := e.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.LoadPeer(own); !errors.Is(err, transfer.ErrBadMetadata) {
		t.Errorf("own metadata: %v", err)
	}
	// An envelope whose name disagrees with NIXL's metadata inside it.
	other := newEngine(t, Config{Name: "y"})
	md, err := other.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeMetadata(md)
	if err != nil {
		t.Fatal(err)
	}
	m.name = "z"
	if _, err := e.LoadPeer(encodeMetadata(m)); !errors.Is(err, transfer.ErrBadMetadata) {
		t.Errorf("name mismatch: %v", err)
	}
	if err := e.ForgetPeer("y"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Errorf("forget a peer never accepted: %v", err)
	}
}

func TestNotificationsInOrderWithSender(t *testing.T) {
	p := newPair(t, 4096, Config{})
	load(t, p.b, p.a)
	const n = 200
	for i := 0; i < n; i++ {
		if err := p.a.Notify("b", []byte(fmt.Sprintf("msg %d", i))); err != nil {
			t.Fatalf("notify %d: %v", i, err)
		}
	}
	for i := 0; i < n; i++ {
		m := recv(t, p.b)
		if m.Peer != "a" || string(m.Payload) != fmt.Sprintf("msg %d", i) {
			t.Fatalf("notification %d: %q from %q", i, m.Payload, m.Peer)
		}
	}
	if err := p.b.Notify("a", nil); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, p.a); m.Peer != "b" || len(m.Payload) != 0 {
		t.Fatalf("reply: %q from %q", m.Payload, m.Peer)
	}
	if _, err := p.a.RecvNotification(0); !errors.Is(err, transfer.ErrTimeout) {
		t.Errorf("empty queue: %v, want ErrTimeout", err)
	}
	if err := p.a.Notify("nobody", []byte("x")); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Errorf("unknown peer: %v", err)
	}
	if err := p.a.Notify("b", make([]byte, DefaultMaxNotifySize+1)); err == nil {
		t.Error("oversized notification accepted")
	}
	if s := p.b.Stats(); s != (Stats{}) {
		t.Errorf("stats %+v, want zero", s)
	}
}

// postBig posts k writes of the whole buffer and returns them pending.
func postBig(t *testing.T, p *pair, k int) []transfer.Op {
	t.Helper()
	var ops []transfer.Op
	for i := 0; i < k; i++ {
		op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}})
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	return ops
}

func TestForgetPeerFailsInFlightWrites(t *testing.T) {
	p := newPair(t, 32<<20, Config{})
	ops := postBig(t, p, 4)
	if err := p.a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		s, err := op.Poll()
		if s != transfer.Failed || !errors.Is(err, transfer.ErrPeerLost) || errors.Is(err, transfer.ErrNotQuiescent) {
			t.Fatalf("op %d after ForgetPeer: %v %v, want Failed with ErrPeerLost (quiescent)", i, s, err)
		}
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}}); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("post after forget: %v", err)
	}
	if err := p.a.ForgetPeer("b"); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("forget twice: %v", err)
	}
	if err := p.a.DeregisterMemory(p.abuf.Desc()); err != nil {
		t.Fatalf("deregister after forget: %v", err)
	}
	register(t, p.a, p.abuf)
	// Loading it again makes it writable again.
	load(t, p.a, p.b)
	fill(p.abuf.Bytes()[:4096], 9)
	op, err := p.a.PostWrite("b", []transfer.WriteOp{{Src: sub(p.abuf, 0, 4096), Dst: sub(p.bbuf, 0, 4096)}})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op)
	if !bytes.Equal(p.bbuf.Bytes()[:4096], p.abuf.Bytes()[:4096]) {
		t.Fatal("bytes differ after reload")
	}
}

func TestCloseFailsInFlightWrites(t *testing.T) {
	p := newPair(t, 32<<20, Config{})
	load(t, p.b, p.a)
	ops := postBig(t, p, 4)
	if err := p.a.Close(); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		s, err := op.Poll()
		if s != transfer.Failed || !errors.Is(err, transfer.ErrClosed) || errors.Is(err, transfer.ErrNotQuiescent) {
			t.Fatalf("op %d after Close: %v %v, want Failed with ErrClosed (quiescent)", i, s, err)
		}
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.a.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	_, err1 := p.a.Metadata()
	_, err2 := p.a.PostWrite("b", []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}})
	_, err3 := p.a.RecvNotification(0)
	_, err4 := p.a.LoadPeer(nil)
	for i, err := range []error{err1, err2, err3, p.a.Notify("b", nil), p.a.RegisterMemory(p.abuf.Desc()), p.a.ForgetPeer("b")} {
		if !errors.Is(err, transfer.ErrClosed) {
			t.Errorf("call %d after close: %v, want ErrClosed", i, err)
		}
	}
	if !errors.Is(err4, transfer.ErrBadMetadata) {
		t.Errorf("LoadPeer(nil) after close: %v", err4)
	}
	// b still works and still holds a as a peer; notifying the closed agent
	// must not hang b.
	_ = p.b.Notify("a", []byte("anyone?"))
	if err := p.b.ForgetPeer("a"); err != nil {
		t.Fatal(err)
	}
}
