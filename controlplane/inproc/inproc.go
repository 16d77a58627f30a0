// Package inproc is an in-process transfer.ControlChannel for tests: the
// channels of one Network reach each other by name through bounded
// in-memory queues.
//
// Every (sender, receiver) pair has its own FIFO, bounded by the sender's
// Options.QueueSize, so one noisy peer cannot fill another's queue; Recv
// takes from the pairs round-robin. The package starts no goroutines.
// Options.Drop and Channel.Stall inject message loss and delay.
package inproc

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// Kind is the value Channel.Kind returns.
const Kind = "inproc"

// Scheme prefixes every inproc endpoint: "inproc://<name>".
const Scheme = "inproc://"

// Queue limits.
const (
	// DefaultQueueSize is the per-peer queue bound used when
	// Options.QueueSize is zero.
	DefaultQueueSize = 1024
	// MaxQueueSize is the largest accepted Options.QueueSize.
	MaxQueueSize = 1 << 20
)

const maxNameLen = transfer.MaxNameLen

// Network connects the channels created from it. It is safe for concurrent
// use.
type Network struct {
	mu    sync.Mutex
	chans map[string]*Channel
}

// NewNetwork returns an empty network.
func NewNetwork() *Network { return &Network{chans: make(map[string]*Channel)} }

func (n *Network) lookup(name string) *Channel {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.chans[name]
}

// Options tunes a channel.
type Options struct {
	// QueueSize bounds the messages this channel has sent to one peer that
	// the peer has not received yet (default DefaultQueueSize). Send beyond
	// it returns ErrQueueFull.
	QueueSize int
	// Drop, when set, is asked before every Send with this channel's name
	// and the peer name given to Send; returning true discards the message
	// silently (Send returns nil), as a lossy network would.
	Drop func(from, to string, payload []byte) bool
}

// Stats are a channel's cumulative counters.
type Stats struct {
	// Sent counts messages queued for a peer.
	Sent uint64
	// Received counts messages returned by Recv.
	Received uint64
	// Dropped counts sends refused with ErrQueueFull.
	Dropped uint64
	// Filtered counts messages discarded by Options.Drop.
	Filtered uint64
}

// Channel is one agent's endpoint on a Network. It implements
// transfer.ControlChannel and is safe for concurrent use.
type Channel struct {
	net  *Network
	name string
	opts Options

	mu     sync.Mutex
	closed bool
	peers  map[string]string // peer name -> channel name its endpoint names
	links  map[string]*link  // inbound queues by sender name
	order  []*link           // links in creation order, for round-robin
	next   int               // index in order where the next Recv starts

	wake      chan struct{} // capacity 1; signalled when a message may be ready
	done      chan struct{} // closed by Close
	closeOnce sync.Once

	sent, received, dropped, filtered atomic.Uint64
}

var _ transfer.ControlChannel = (*Channel)(nil)

// link is the queue of messages from one sender to this channel.
type link struct {
	from    string
	q       [][]byte
	stalled bool
}

// NewChannel creates the channel name on n, reachable at "inproc://<name>".
// Names are 1 to 255 bytes of UTF-8 without control characters and unique
// among the open channels of a network; a bad or taken name is an error
// wrapping ErrBadEndpoint.
func (n *Network) NewChannel(name string, opts Options) (*Channel, error) {
	if err := transfer.CheckName(name); err != nil {
		return nil, fmt.Errorf("inproc: new channel: %v: %w", err, transfer.ErrBadEndpoint)
	}
	switch {
	case opts.QueueSize == 0:
		opts.QueueSize = DefaultQueueSize
	case opts.QueueSize < 0 || opts.QueueSize > MaxQueueSize:
		return nil, fmt.Errorf("inproc: new channel %q: QueueSize %d outside [1, %d]", name, opts.QueueSize, MaxQueueSize)
	}
	c := &Channel{
		net:   n,
		name:  name,
		opts:  opts,
		peers: make(map[string]string),
		links: make(map[string]*link),
		wake:  make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.chans[name]; ok {
		return nil, fmt.Errorf("inproc: new channel %q: name in use on this network: %w", name, transfer.ErrBadEndpoint)
	}
	n.chans[name] = c
	return c, nil
}

// Kind returns "inproc".
func (c *Channel) Kind() string { return Kind }

// Name returns the channel's name, which receivers see as Message.Peer.
func (c *Channel) Name() string { return c.name }

// LocalEndpoint returns "inproc://<name>".
func (c *Channel) LocalEndpoint() string { return Scheme + c.name }

// Stats returns the channel's counters.
func (c *Channel) Stats() Stats {
	return Stats{Sent: c.sent.Load(), Received: c.received.Load(), Dropped: c.dropped.Load(), Filtered: c.filtered.Load()}
}

// AddPeer makes peer reachable at endpoint, which must be "inproc://<name>"
// for a channel open on this network right now; anything else is an error
// wrapping ErrBadEndpoint and leaves an existing entry for peer untouched.
// Adding a known peer again replaces its endpoint.
func (c *Channel) AddPeer(peer, endpoint string) error {
	if err := transfer.CheckName(peer); err != nil {
		return fmt.Errorf("inproc %s: add peer: %v: %w", c.name, err, transfer.ErrBadEndpoint)
	}
	target, err := parseEndpoint(endpoint)
	if err != nil {
		return fmt.Errorf("inproc %s: add peer %q: endpoint %q: %v: %w", c.name, peer, endpoint, err, transfer.ErrBadEndpoint)
	}
	if c.net.lookup(target) == nil {
		return fmt.Errorf("inproc %s: add peer %q: endpoint %q: no such channel on this network: %w", c.name, peer, endpoint, transfer.ErrBadEndpoint)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("inproc %s: add peer %q: %w", c.name, peer, transfer.ErrClosed)
	}
	c.peers[peer] = target
	return nil
}

// RemovePeer forgets peer; later sends to it return ErrUnknownPeer.
// Messages already sent stay queued at the peer.
func (c *Channel) RemovePeer(peer string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("inproc %s: remove peer %q: %w", c.name, peer, transfer.ErrClosed)
	}
	if _, ok := c.peers[peer]; !ok {
		return fmt.Errorf("inproc %s: remove peer %q: %w", c.name, peer, transfer.ErrUnknownPeer)
	}
	delete(c.peers, peer)
	return nil
}

// Send queues a copy of payload for peer without blocking. It returns
// ErrUnknownPeer when peer was not added, ErrQueueFull when QueueSize
// messages to peer are still unreceived (the message is dropped),
// ErrPeerLost when the peer's channel is closed, and ErrClosed after Close.
// The peer's channel is looked up by name at every send, so a peer that
// reopens under the same name is reached again.
func (c *Channel) Send(peer string, payload []byte) error {
	target, err := c.target("send to", peer)
	if err != nil {
		return err
	}
	if c.opts.Drop != nil && c.opts.Drop(c.name, peer, payload) {
		c.filtered.Add(1)
		return nil
	}
	t := c.net.lookup(target)
	if t == nil {
		return fmt.Errorf("inproc %s: send to %q: channel %q closed: %w", c.name, peer, target, transfer.ErrPeerLost)
	}
	if err := t.enqueue(c.name, c.opts.QueueSize, bytes.Clone(payload)); err != nil {
		if errors.Is(err, transfer.ErrQueueFull) {
			c.dropped.Add(1)
		}
		return fmt.Errorf("inproc %s: send to %q: %w", c.name, peer, err)
	}
	c.sent.Add(1)
	return nil
}

// target returns the channel name peer was added under; what names the
// call in the error (ErrClosed after Close, ErrUnknownPeer).
func (c *Channel) target(what, peer string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return "", fmt.Errorf("inproc %s: %s %q: %w", c.name, what, peer, transfer.ErrClosed)
	}
	target, ok := c.peers[peer]
	if !ok {
		return "", fmt.Errorf("inproc %s: %s %q: %w", c.name, what, peer, transfer.ErrUnknownPeer)
	}
	return target, nil
}

// Stall holds the messages this channel sends to peer in the peer's queue:
// Recv there skips them (they still count against QueueSize) until Resume.
// It applies to the peer's channel open now.
func (c *Channel) Stall(peer string) error { return c.setStalled(peer, true) }

// Resume releases the messages Stall held, in order.
func (c *Channel) Resume(peer string) error { return c.setStalled(peer, false) }

func (c *Channel) setStalled(peer string, stalled bool) error {
	target, err := c.target("stall", peer)
	if err != nil {
		return err
	}
	t := c.net.lookup(target)
	if t == nil {
		return fmt.Errorf("inproc %s: stall %q: channel %q closed: %w", c.name, peer, target, transfer.ErrPeerLost)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return fmt.Errorf("inproc %s: stall %q: channel %q closed: %w", c.name, peer, target, transfer.ErrPeerLost)
	}
	t.linkLocked(c.name).stalled = stalled
	t.mu.Unlock()
	if !stalled {
		t.signal()
	}
	return nil
}

// enqueue appends a message from sender to c's queue for that sender.
func (c *Channel) enqueue(from string, limit int, payload []byte) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("channel %q closed: %w", c.name, transfer.ErrPeerLost)
	}
	l := c.linkLocked(from)
	if len(l.q) >= limit {
		c.mu.Unlock()
		return fmt.Errorf("%d messages queued: %w", len(l.q), transfer.ErrQueueFull)
	}
	l.q = append(l.q, payload)
	c.mu.Unlock()
	c.signal()
	return nil
}

func (c *Channel) linkLocked(from string) *link {
	l := c.links[from]
	if l == nil {
		l = &link{from: from}
		c.links[from] = l
		c.order = append(c.order, l)
	}
	return l
}

func (c *Channel) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// popLocked takes the next message round-robin across senders and reports
// whether another one is ready.
func (c *Channel) popLocked() (transfer.Message, bool, bool) {
	n := len(c.order)
	for i := range n {
		idx := (c.next + i) % n
		l := c.order[idx]
		if l.stalled || len(l.q) == 0 {
			continue
		}
		m := transfer.Message{Peer: l.from, Payload: l.q[0]}
		l.q[0] = nil
		l.q = l.q[1:]
		c.next = (idx + 1) % n
		for _, o := range c.order {
			if !o.stalled && len(o.q) > 0 {
				return m, true, true
			}
		}
		return m, true, false
	}
	return transfer.Message{}, false, false
}

// Recv returns the next message and the name of the channel that sent it.
// It waits at most timeout (not at all when timeout <= 0), then returns
// ErrTimeout; after Close it returns ErrClosed.
func (c *Channel) Recv(timeout time.Duration) (transfer.Message, error) {
	var timer *time.Timer
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return transfer.Message{}, fmt.Errorf("inproc %s: recv: %w", c.name, transfer.ErrClosed)
		}
		m, ok, more := c.popLocked()
		c.mu.Unlock()
		if ok {
			if more {
				c.signal() // another Recv may be waiting
			}
			c.received.Add(1)
			return m, nil
		}
		if timeout <= 0 {
			return transfer.Message{}, fmt.Errorf("inproc %s: recv: %w", c.name, transfer.ErrTimeout)
		}
		if timer == nil {
			timer = time.NewTimer(timeout)
			defer timer.Stop()
		}
		select {
		case <-c.wake:
		case <-c.done:
		case <-timer.C:
			return transfer.Message{}, fmt.Errorf("inproc %s: recv after %v: %w", c.name, timeout, transfer.ErrTimeout)
		}
	}
}

// Close removes the channel from its network, drops the messages queued for
// it and wakes a waiting Recv, which returns ErrClosed. It is idempotent.
func (c *Channel) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.links, c.order = nil, nil
		clear(c.peers)
		close(c.done)
		c.mu.Unlock()
		c.net.mu.Lock()
		if c.net.chans[c.name] == c {
			delete(c.net.chans, c.name)
		}
		c.net.mu.Unlock()
	})
	return nil
}

// parseEndpoint returns the channel name of an "inproc://<name>" endpoint.
func parseEndpoint(s string) (string, error) {
	name, ok := strings.CutPrefix(s, Scheme)
	if !ok {
		return "", fmt.Errorf("want %s<name>", Scheme)
	}
	if err := transfer.CheckName(name); err != nil {
		return "", err
	}
	return name, nil
}
