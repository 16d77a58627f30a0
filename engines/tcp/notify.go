package tcp

import (
	"errors"
	"fmt"
	"github.com/bouncekv/bounce/internal/inbox"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// ErrTooLarge means a notification exceeds MaxNotification.
var ErrTooLarge = errors.New("tcp: notification too large")

// Notify queues payload (copied) for the peer and returns at once; a full
// queue (Config.NotifyQueue) is ErrQueueFull. Notifications to one peer
// travel in order on connection 0. A queued notification is lost if that
// connection breaks before it is sent; while the peer cannot be dialed,
// notifications stay queued and each Notify tries to dial again.
func (e *Engine) Notify(peerName string, payload []byte) error {
	p, err := e.peer(peerName)
	if err != nil {
		return fmt.Errorf("tcp: notify %q: %w", peerName, err)
	}
	if len(payload) > MaxNotification {
		return fmt.Errorf("tcp: notify %q: %d bytes exceeds %d: %w", peerName, len(payload), MaxNotification, ErrTooLarge)
	}
	msg := append(make([]byte, 0, len(payload)), payload...)
	select {
	case p.notifs <- msg:
	default:
		return fmt.Errorf("tcp: notify %q: %d queued: %w", peerName, cap(p.notifs), transfer.ErrQueueFull)
	}
	s := p.slots[0]
	s.mu.Lock()
	err = s.ensureLocked()
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("tcp: notify %q: %w", peerName, err)
	}
	return nil
}

// WakeRecvNotification makes a RecvNotification in progress, or else the
// next one that waits, return ErrTimeout at once: the agent's notification
// pump, told to stop, then stops without waiting out its timeout.
func (e *Engine) WakeRecvNotification() { e.wake.Wake() }

// RecvNotification returns the next notification, in order per sending
// peer, with Peer set to the sender's name. It waits at most timeout (a
// timeout <= 0 only polls) and returns ErrTimeout when nothing arrived and
// ErrClosed once the engine is closed.
func (e *Engine) RecvNotification(timeout time.Duration) (transfer.Message, error) {
	m, err := inbox.ReceiveWake(e.recvq, e.done, e.wake, timeout)
	if err != nil {
		return m, fmt.Errorf("tcp: receive notification: %w", err)
	}
	return m, nil
}
