// Package inbox is the bounded-wait receive the engines share for their
// notification queues.
package inbox

import (
	"fmt"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// Receive takes the next message from q, waiting at most timeout (not at all
// when timeout <= 0). Once closed is closed it returns an error wrapping
// transfer.ErrClosed; when nothing arrives in time, one wrapping
// transfer.ErrTimeout.
func Receive(q <-chan transfer.Message, closed <-chan struct{}, timeout time.Duration) (transfer.Message, error) {
	return ReceiveWake(q, closed, nil, timeout)
}

// Wake ends a wait in ReceiveWake early. The zero value (nil) never
// fires; make one with NewWake.
type Wake chan struct{}

// NewWake returns a Wake ready for use.
func NewWake() Wake { return make(Wake, 1) }

// Wake makes a ReceiveWake waiting on w, or else the next one that waits,
// return ErrTimeout at once. Wakes not yet taken count as one.
func (w Wake) Wake() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// ReceiveWake is Receive that also returns ErrTimeout, without waiting
// out timeout, once wake fires (a receive loop told to stop).
func ReceiveWake(q <-chan transfer.Message, closed <-chan struct{}, wake Wake, timeout time.Duration) (transfer.Message, error) {
	select {
	case <-closed:
		return transfer.Message{}, transfer.ErrClosed
	default:
	}
	select {
	case m := <-q:
		return m, nil
	default:
	}
	if timeout <= 0 {
		return transfer.Message{}, transfer.ErrTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case m := <-q:
		return m, nil
	case <-closed:
		return transfer.Message{}, transfer.ErrClosed
	case <-t.C:
		return transfer.Message{}, fmt.Errorf("nothing within %v: %w", timeout, transfer.ErrTimeout)
	case <-wake:
		return transfer.Message{}, fmt.Errorf("woken: %w", transfer.ErrTimeout)
	}
}
