package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// parkedRecv is a control channel whose Recv waits an hour, whatever its
// timeout, unless WakeRecv ends it: a receive timeout long enough that a
// Shutdown waiting it out shows.
type parkedRecv struct {
	transfer.ControlChannel
	wake chan struct{}
}

func (p *parkedRecv) Recv(time.Duration) (transfer.Message, error) {
	select {
	case <-p.wake:
	case <-time.After(time.Hour):
	}
	return transfer.Message{}, transfer.ErrTimeout
}

func (p *parkedRecv) WakeRecv() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// TestShutdownWakesControlRecv: Shutdown waited for the control pump,
// parked in the channel's Recv, to wait out its receive timeout (20 ms on
// every agent's Close: a short-lived sender process paid it at exit). A
// channel that can be woken is woken.
func TestShutdownWakesControlRecv(t *testing.T) {
	w := newWorld(t)
	n := w.node("a", testConfig(), func(s *Settings) {
		s.Control = &parkedRecv{ControlChannel: s.Control, wake: make(chan struct{}, 1)}
	})
	done := make(chan error, 1)
	go func() { done <- n.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown still waits 20 s later for the control pump's Recv")
	}
}
