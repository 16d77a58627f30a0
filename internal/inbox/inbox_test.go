package inbox

import (
	"errors"
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
