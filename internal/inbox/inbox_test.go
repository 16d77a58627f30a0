package inbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

func TestReceive(t *testing.T) {
	q := make(chan transfer.Message, 2)
	closed := make(chan struct{})
	if _, err := Receive(q, closed, 0); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("empty, no wait: %v", err)
	}
	q <- transfer.Message{Peer: "a", Payload: []byte{1}}
	if m, err := Receive(q, closed, 0); err != nil || m.Peer != "a" {
		t.Fatalf("queued: %v %v", m, err)
	}
	if _, err := Receive(q, closed, 5*time.Millisecond); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("empty, waited: %v", err)
	}
	go func() { time.Sleep(5 * time.Millisecond); q <- transfer.Message{Peer: "b"} }()
	if m, err := Receive(q, closed, 10*time.Second); err != nil || m.Peer != "b" {
		t.Fatalf("arrives while waiting: %v %v", m, err)
	}
	go func() { time.Sleep(5 * time.Millisecond); close(closed) }()
	if _, err := Receive(q, closed, 10*time.Second); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("closed while waiting: %v", err)
	}
	q <- transfer.Message{Peer: "c"}
	if _, err := Receive(q, closed, 0); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

// TestReceiveWake: a wake ends a wait at once (long before its timeout),
// a wake taken by no one ends the next wait, wakes coalesce, and a queued
// message is still returned before a pending wake.
func TestReceiveWake(t *testing.T) {
	q := make(chan transfer.Message, 1)
	closed := make(chan struct{})
	w := NewWake()
	res := make(chan error, 1)
	go func() {
		_, err := ReceiveWake(q, closed, w, time.Hour)
		res <- err
	}()
	w.Wake()
	select {
	case err := <-res:
		if !errors.Is(err, transfer.ErrTimeout) {
			t.Fatalf("woken: %v, want ErrTimeout", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a wake did not end a wait of an hour")
	}
	w.Wake()
	w.Wake()
	q <- transfer.Message{Peer: "a"}
	if m, err := ReceiveWake(q, closed, w, time.Hour); err != nil || m.Peer != "a" {
		t.Fatalf("queued message with a wake pending: %v %v", m, err)
	}
	if _, err := ReceiveWake(q, closed, w, time.Hour); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("pending wake: %v, want ErrTimeout", err)
	}
	if _, err := ReceiveWake(q, closed, w, 10*time.Millisecond); !errors.Is(err, transfer.ErrTimeout) || !strings.Contains(err.Error(), "nothing within") {
		t.Fatalf("two wakes count as one; then a plain timeout: %v", err)
	}
	var none Wake
	if _, err := ReceiveWake(q, closed, none, time.Millisecond); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("nil wake: %v", err)
	}
}
