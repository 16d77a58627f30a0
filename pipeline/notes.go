package pipeline

import (
	"errors"
	"sync"
	"time"

	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// notificationReader is the optional capability of a control channel that
// is itself carried by the engine's notifications (package nixlnotif): it
// already reads them, so the agent must not read them too.
type notificationReader interface {
	ReadsEngineNotifications() bool
}

// engineNotes returns the engine's notifications when the agent reads them
// for DONE notices: the engine has them and the control channel does not
// read them itself. A control channel that does (nixlnotif) delivers a
// DONE sent as a notification through its own Recv, so none is lost.
func engineNotes(s Settings) transfer.Notifier {
	n, ok := s.Engine.(transfer.Notifier)
	if !ok {
		return nil
	}
	if nr, ok := s.Control.(notificationReader); ok && nr.ReadsEngineNotifications() {
		return nil
	}
	return n
}

// notePump moves the DONE notices that peers without a control path send
// as engine notifications into the reactor's inbox. Nothing else is
// accepted there: any other message, or one that does not decode, is
// counted and dropped.
type notePump struct {
	notes transfer.Notifier
	inbox *fairInbox
	quit  <-chan struct{}
	// admitted says whether the sender of a notification is an admitted
	// peer (security); bad counts a dropped notification.
	admitted   func(peer string) bool
	unadmitted func(peer string)
	bad        func(peer string, err error)
}

func (p *notePump) start(wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.run()
	}()
}

func (p *notePump) run() {
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		m, err := p.notes.RecvNotification(20 * time.Millisecond)
		switch {
		case err == nil:
		case errors.Is(err, transfer.ErrClosed), errors.Is(err, transfer.ErrUnsupported):
			return
		case errors.Is(err, transfer.ErrTimeout):
			continue
		default:
			select {
			case <-p.quit:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if !p.admitted(m.Peer) {
			p.unadmitted(m.Peer)
			continue
		}
		msg, err := wire.Unmarshal(m.Payload)
		if err == nil {
			if _, ok := msg.(*wire.Done); !ok {
				err = errors.New("only DONE notices travel as engine notifications, got " + msg.Type().String())
			}
		}
		if err != nil {
			p.bad(m.Peer, err)
			continue
		}
		for !p.inbox.push(m) {
			// The control pump may be waiting on the same token: retry
			// on a timer too, so neither waits for the other's.
			select {
			case <-p.inbox.space:
			case <-time.After(10 * time.Millisecond):
			case <-p.quit:
				return
			}
		}
	}
}

// notify sends a DONE notice to a peer as an engine notification, fitted
// to the engine's stated payload limit by shortening the reason.
func notify(n transfer.Notifier, peer string, m *wire.Done) error {
	b, err := wire.Marshal(m)
	if err != nil {
		return err
	}
	if l, ok := n.(transfer.NotifyLimiter); ok && l.MaxNotifySize() > 0 && len(b) > l.MaxNotifySize() {
		if cut := len(b) - l.MaxNotifySize(); cut <= len(m.Reason) {
			short := *m
			short.Reason = m.Reason[:len(m.Reason)-cut]
			if b, err = wire.Marshal(&short); err != nil {
				return err
			}
		}
	}
	return n.Notify(peer, b)
}
