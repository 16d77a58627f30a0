package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

func recv(t testing.TB, e *Engine) transfer.Message {
	t.Helper()
	m, err := e.RecvNotification(hangGuard)
	if err != nil {
		t.Fatalf("%s: receive: %v", e.Name(), err)
	}
	return m
}

func TestNotificationsInOrderWithSenderName(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	src := v.buf(1<<20, 41, a)
	dst := v.buf(1<<20, 0, b)
	connect(t, a, b) // b never loads a
	const n = 2000
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := 0; i < n; {
			err := a.Notify("b", fmt.Appendf(nil, "msg %d", i))
			if errors.Is(err, transfer.ErrQueueFull) {
				runtime.Gosched()
				continue
			}
			if err != nil {
				t.Error(err)
				return
			}
			i++
		}
	}()
	// Writes striped over all connections run at the same time.
	op, err := a.PostWrite("b", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		m := recv(t, b)
		if m.Peer != "a" || string(m.Payload) != fmt.Sprintf("msg %d", i) {
			t.Fatalf("notification %d = {%q %q}", i, m.Peer, m.Payload)
		}
	}
	mustDone(t, op, nil)
	<-sent

	// The reverse path works from the HELLO alone: b answers a and writes
	// into memory a registered before it dialed.
	back := v.buf(4096, 0, a) // registered after a's HELLO: unknown to b
	if err := b.Notify("a", []byte("pong")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, a); m.Peer != "b" || string(m.Payload) != "pong" {
		t.Fatalf("reverse notification = {%q %q}", m.Peer, m.Payload)
	}
	op, err = b.PostWrite("a", []transfer.WriteOp{{Src: dst.Desc(), Dst: src.Desc()}})
	mustDone(t, op, err)
	if _, err := b.PostWrite("a", []transfer.WriteOp{{Src: sub(dst, 0, 4096), Dst: back.Desc()}}); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("write to memory a registered after its HELLO: %v", err)
	}
	if !bytes.Equal(src.Bytes(), dst.Bytes()) {
		t.Fatal("bytes differ")
	}
}

func TestNotifyEmptyAndLimits(t *testing.T) {
	v := newEnv(t)
	a, b := v.engine("a"), v.engine("b")
	connect(t, a, b)
	if err := a.Notify("b", nil); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, MaxNotification)
	big[MaxNotification-1] = 7
	if err := a.Notify("b", big); err != nil {
		t.Fatal(err)
	}
	if err := a.Notify("b", make([]byte, MaxNotification+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized notification: %v", err)
	}
	if err := a.Notify("nobody", nil); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("unknown peer: %v", err)
	}
	if m := recv(t, b); m.Peer != "a" || len(m.Payload) != 0 {
		t.Fatalf("empty notification = %+v", m)
	}
	if m := recv(t, b); !bytes.Equal(m.Payload, big) {
		t.Fatal("large notification differs")
	}
	if _, err := b.RecvNotification(0); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("poll with nothing queued: %v", err)
	}
	if _, err := b.RecvNotification(time.Millisecond); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("wait with nothing queued: %v", err)
	}
}

func TestNotifyQueueFull(t *testing.T) {
	// The peer cannot be dialed, so notifications stay queued.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	v := newEnv(t)
	a := v.engine("a", func(c *Config) { c.NotifyQueue = 4 })
	if _, err := a.LoadPeer(encodeMetadata(metadata{name: "gone", addr: addr})); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := a.Notify("gone", []byte{byte(i)}); err != nil {
			t.Fatalf("notification %d: %v", i, err)
		}
	}
	if err := a.Notify("gone", []byte{4}); !errors.Is(err, transfer.ErrQueueFull) {
		t.Fatalf("fifth notification: %v, want ErrQueueFull", err)
	}
}

func TestRecvNotificationUnblocksOnClose(t *testing.T) {
	e, err := New(Config{Name: "r"})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := e.RecvNotification(hangGuard)
		errc <- err
	}()
	e.Close()
	if err := <-errc; !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("receive across close: %v, want ErrClosed", err)
	}
}
