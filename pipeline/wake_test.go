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

// parkedNotes is an engine whose RecvNotification waits an hour unless
// WakeRecvNotification ends it.
type parkedNotes struct {
	transfer.Engine
	wake chan struct{}
}

func (p *parkedNotes) Notify(peer string, payload []byte) error {
	return p.Engine.(transfer.Notifier).Notify(peer, payload)
}

func (p *parkedNotes) RecvNotification(time.Duration) (transfer.Message, error) {
	select {
	case <-p.wake:
	case <-time.After(time.Hour):
	}
	return transfer.Message{}, transfer.ErrTimeout
}

func (p *parkedNotes) WakeRecvNotification() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// TestShutdownWakesControlRecv: Shutdown waited for the control pump,
// parked in the channel's Recv, and the notification pump, parked in the
// engine's RecvNotification, to wait out their receive timeouts (20 ms
// each on every agent's Close: a short-lived sender process paid it at
// exit). A channel and an engine that can be woken are woken.
func TestShutdownWakesControlRecv(t *testing.T) {
	w := newWorld(t)
	n := w.node("a", testConfig(), func(s *Settings) {
		s.Control = &parkedRecv{ControlChannel: s.Control, wake: make(chan struct{}, 1)}
		s.Engine = &parkedNotes{Engine: s.Engine, wake: make(chan struct{}, 1)}
	})
	done := make(chan error, 1)
	go func() { done <- n.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown still waits 20 s later for a pump's receive")
	}
}

// unwakeable hides a channel's WakeRecv, unwakeableNotes an engine's
// WakeRecvNotification: Shutdown then waits for the pumps as it did
// before.
type unwakeable struct{ transfer.ControlChannel }

type unwakeableNotes struct {
	transfer.Engine
	transfer.Notifier
}

// BenchmarkShutdownZMQ times Agent.Shutdown over a real zmq channel and
// the loopback engine, side by side: the pumps woken (as now) against the
// same channel and engine with their wakes hidden (each pump's 20 ms
// receive timeout waited out, as before).
func BenchmarkShutdownZMQ(b *testing.B) {
	for _, bc := range []struct {
		name string
		hide bool
	}{{"woken", false}, {"unwoken", true}} {
		b.Run(bc.name, func(b *testing.B) {
			w := zmqWorld(b, 0)
			var total time.Duration
			for i := 0; i < b.N; i++ {
				n := w.node("a", testConfig(), func(s *Settings) {
					if bc.hide {
						s.Control = unwakeable{s.Control}
						s.Engine = unwakeableNotes{s.Engine, s.Engine.(transfer.Notifier)}
					}
				})
				time.Sleep(5 * time.Millisecond) // the pump parked in Recv
				start := time.Now()
				if err := n.Shutdown(context.Background()); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
				n.close(b)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "shutdown-ms")
		})
	}
}
