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
	}
}
