// Package nixlnotif implements transfer.ControlChannel on an engine's own
// notifications (transfer.Notifier), so control messages travel on the data
// fabric's connections and no control socket is opened.
//
// The endpoint a peer passes to AddPeer is the engine's Metadata, base64url
// encoded (RFC 4648 §5, no padding) so that it is a printable string.
// AddPeer loads it into the engine, which is how the engine learns to reach
// the peer.
//
// Authentication is the engine's: a notification's Peer is the agent the
// engine authenticated on the connection it arrived on (the tcp engine's
// Noise handshake binds each connection to the key of an admitted agent),
// and the channel adds no check of its own. Over an engine that does not
// authenticate (UCX), neither does this channel (docs/SECURITY.md).
//
// The Channel borrows the engine: it never closes it and never forgets its
// peers, because the data path uses the same engine and the same peers. It
// assumes it is the only consumer of the engine's notifications.
package nixlnotif

import (
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// Kind is the value Channel.Kind returns.
const Kind = "nixlnotif"

// closeCheckInterval bounds how long a Recv in progress waits in the
// engine before noticing Close: the engine cannot be interrupted (the
// channel does not own it), so Recv waits in slices of at most this long.
// A notification that arrives is returned at once regardless.
const closeCheckInterval = 50 * time.Millisecond

// engine is what the channel needs from its engine.
type engine interface {
	transfer.Engine
	transfer.Notifier
}

var _ transfer.ControlChannel = (*Channel)(nil)

// Channel is a transfer.ControlChannel over an engine's notifications. It
// is safe for concurrent use.
type Channel struct {
	eng engine
	// enc is the endpoint encoding: printable, no padding, and strict, so
	// every endpoint has exactly one spelling.
	enc *base64.Encoding

	mu    sync.RWMutex
	peers map[string]struct{} // peers added and not removed
	done  chan struct{}       // closed by Close, under mu
}

// New returns a channel carried by eng's notifications. eng must implement
// transfer.Notifier; otherwise the error wraps transfer.ErrUnsupported. The
// channel does not take ownership of eng.
func New(eng transfer.Engine) (*Channel, error) {
	if eng == nil {
		return nil, fmt.Errorf("nixlnotif: nil engine: %w", transfer.ErrUnsupported)
	}
	e, ok := eng.(engine)
	if !ok {
		return nil, fmt.Errorf("nixlnotif: engine %q (%T) does not implement transfer.Notifier: %w",
			eng.Name(), eng, transfer.ErrUnsupported)
	}
	return &Channel{eng: e, enc: base64.RawURLEncoding.Strict(), peers: make(map[string]struct{}), done: make(chan struct{})}, nil
}

// Kind returns "nixlnotif".
func (c *Channel) Kind() string { return Kind }

// ReadsEngineNotifications reports true: the channel is the consumer of its
// engine's notifications, so an agent over it reads none itself (a DONE
// notice a peer sends as an engine notification arrives through Recv).
func (c *Channel) ReadsEngineNotifications() bool { return true }

// notifyLimiter is an engine that bounds its notification payloads.
type notifyLimiter interface{ MaxNotifySize() int }

// MaxMessageSize returns the largest payload Send accepts: the engine's
// notification limit when it declares one (MaxNotifySize), else 0, meaning
// the engine states no limit.
func (c *Channel) MaxMessageSize() int {
	if l, ok := c.eng.(notifyLimiter); ok {
		return max(l.MaxNotifySize(), 0)
	}
	return 0
}

// LocalEndpoint returns the engine's current Metadata, base64url encoded.
// It is computed on every call, so it includes memory registered since the
// last one. It is "" when the engine cannot produce metadata (it is closed,
// say); AddPeer rejects an empty endpoint.
func (c *Channel) LocalEndpoint() string {
	md, err := c.eng.Metadata()
	if err != nil || len(md) == 0 {
		return ""
	}
	return c.enc.EncodeToString(md)
}

// AddPeer decodes endpoint and loads it into the engine (eng.LoadPeer),
// which also refreshes a peer the engine already knows. The metadata must
// name peer. Undecodable text, metadata the engine rejects and metadata
// naming another engine are errors wrapping transfer.ErrBadEndpoint (and
// the engine's cause). In the last case the engine has already loaded the
// engine the metadata names, exactly as a data-path load of it would have;
// the channel does not undo that, as the data path may rely on it.
func (c *Channel) AddPeer(peer, endpoint string) error {
	if c.isDone() {
		return fmt.Errorf("nixlnotif: add peer %q: %w", peer, transfer.ErrClosed)
	}
	if peer == "" {
		return fmt.Errorf("nixlnotif: add peer: empty peer name: %w", transfer.ErrBadEndpoint)
	}
	if endpoint == "" {
		return fmt.Errorf("nixlnotif: add peer %q: empty endpoint: %w", peer, transfer.ErrBadEndpoint)
	}
	md, err := c.enc.DecodeString(endpoint)
	if err != nil {
		return fmt.Errorf("nixlnotif: add peer %q: endpoint is not base64url metadata: %w: %w",
			peer, transfer.ErrBadEndpoint, err)
	}
	name, err := c.eng.LoadPeer(md)
	if err != nil {
		return fmt.Errorf("nixlnotif: add peer %q: load metadata: %w: %w", peer, transfer.ErrBadEndpoint, err)
	}
	if name != peer {
		return fmt.Errorf("nixlnotif: add peer %q: endpoint belongs to engine %q: %w",
			peer, name, transfer.ErrBadEndpoint)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isDone() {
		return fmt.Errorf("nixlnotif: add peer %q: %w", peer, transfer.ErrClosed)
	}
	c.peers[peer] = struct{}{}
	return nil
}

// RemovePeer forgets peer in the channel only: later Sends to it fail with
// ErrUnknownPeer. It does not call eng.ForgetPeer, since the data path
// shares the engine and may still write to the peer; messages from the peer
// are still received. An unknown peer is an error wrapping
// transfer.ErrUnknownPeer.
func (c *Channel) RemovePeer(peer string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isDone() {
		return fmt.Errorf("nixlnotif: remove peer %q: %w", peer, transfer.ErrClosed)
	}
	if _, ok := c.peers[peer]; !ok {
		return fmt.Errorf("nixlnotif: remove peer %q: %w", peer, transfer.ErrUnknownPeer)
	}
	delete(c.peers, peer)
	return nil
}

// Send notifies peer with payload through the engine, which never blocks;
// its errors (ErrQueueFull, ErrPeerLost, ...) are returned wrapped. A peer
// not added to this channel is ErrUnknownPeer.
func (c *Channel) Send(peer string, payload []byte) error {
	c.mu.RLock()
	closed := c.isDone()
	_, known := c.peers[peer]
	c.mu.RUnlock()
	switch {
	case closed:
		return fmt.Errorf("nixlnotif: send to %q: %w", peer, transfer.ErrClosed)
	case !known:
		return fmt.Errorf("nixlnotif: send to %q: %w", peer, transfer.ErrUnknownPeer)
	}
	if err := c.eng.Notify(peer, payload); err != nil {
		return fmt.Errorf("nixlnotif: send to %q: %w", peer, err)
	}
	return nil
}

// Recv returns the next notification from any peer, added or not (a new
// sender's first message arrives before the receiver adds it). It waits at
// most timeout (a timeout <= 0 only checks), returns an error wrapping
// transfer.ErrTimeout when nothing arrived, and transfer.ErrClosed after
// Close or once the engine is closed. A Recv in progress notices Close
// within closeCheckInterval.
func (c *Channel) Recv(timeout time.Duration) (transfer.Message, error) {
	deadline := time.Now().Add(timeout)
	for {
		if c.isDone() {
			return transfer.Message{}, fmt.Errorf("nixlnotif: recv: %w", transfer.ErrClosed)
		}
		wait := min(time.Until(deadline), closeCheckInterval)
		m, err := c.eng.RecvNotification(wait)
		switch {
		case err == nil:
			if c.isDone() {
				return transfer.Message{}, fmt.Errorf("nixlnotif: recv: %w", transfer.ErrClosed)
			}
			return m, nil
		case !errors.Is(err, transfer.ErrTimeout):
			return transfer.Message{}, fmt.Errorf("nixlnotif: recv: %w", err)
		case wait <= 0 || !time.Now().Before(deadline):
			return transfer.Message{}, fmt.Errorf("nixlnotif: recv: nothing within %v: %w", timeout, transfer.ErrTimeout)
		}
	}
}

// Close stops the channel: later calls return ErrClosed and a Recv in
// progress returns ErrClosed within closeCheckInterval. It does not close
// the engine, which the channel does not own, nor forget any peer.
// Close is idempotent.
func (c *Channel) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.isDone() {
		c.peers = nil
		close(c.done)
	}
	return nil
}

func (c *Channel) isDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}
