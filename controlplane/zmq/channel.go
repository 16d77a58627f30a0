// Package zmq implements transfer.ControlChannel on ZeroMQ (libzmq through
// github.com/pebbe/zmq4).
//
// A Channel binds one ROUTER socket on a routable address and an ephemeral
// port; that is where peers reach it, and the sending peer's routing
// identity becomes Message.Peer. It opens one DEALER per added peer, whose
// identity is the channel's Name. Sends never block: each DEALER queues at
// most SendHWM messages and a send beyond that is dropped with
// transfer.ErrQueueFull.
//
// Every Channel owns its own ZeroMQ context, so Close releases all of its
// sockets and libzmq threads and affects no other Channel.
package zmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/transfer"
)

// Kind is the value Channel.Kind returns.
const Kind = "zmq"

// pollInterval bounds how long the receive loop sleeps in zmq_poll before
// rechecking for Close. Close normally wakes it at once by terminating the
// context; the bound is a second line of defence, not a latency knob.
const pollInterval = 250 * time.Millisecond

var _ transfer.ControlChannel = (*Channel)(nil)

// Channel is a transfer.ControlChannel over a ZeroMQ ROUTER (receive) and
// one DEALER per peer (send). All methods are safe for concurrent use.
//
// Socket ownership: the ROUTER is used only by the channel's receive
// goroutine. Each DEALER is used only under its peer's mutex, and only with
// non-blocking calls, so Send never waits on the network and Recv never
// waits on Send.
type Channel struct {
	name     string
	sendHWM  int
	log      *slog.Logger
	lookup   hostLookup
	zctx     *zmq4.Context
	endpoint string

	// mu guards peers and closed. Send holds it shared for the duration of
	// one non-blocking send; AddPeer, RemovePeer and Close hold it
	// exclusively while they create, swap or close DEALERs, so no DEALER is
	// closed under a running Send and no socket is created after Close.
	mu     sync.RWMutex
	peers  map[string]*dealer
	closed bool

	inbox   chan transfer.Message
	done    chan struct{} // closed by Close
	exited  chan struct{} // closed when the receive goroutine returns
	recvErr error         // why the receive goroutine stopped early; read after exited

	closeOnce sync.Once
	closeErr  error

	sent, received, dropped, badEndpoints, malformed atomic.Uint64
}

// dealer is the send socket to one peer.
type dealer struct {
	mu       sync.Mutex // serializes use of sock
	sock     *zmq4.Socket
	endpoint string
	dropping bool // the last send was dropped; used to warn once per episode
}

// Stats are the channel's cumulative counters.
type Stats struct {
	// Sent counts messages handed to a peer's DEALER queue.
	Sent uint64
	// Received counts messages queued for Recv.
	Received uint64
	// Dropped counts sends refused with ErrQueueFull.
	Dropped uint64
	// BadEndpoints counts AddPeer calls rejected for their endpoint.
	BadEndpoints uint64
	// Malformed counts incoming messages discarded because they were not a
	// single frame from a named peer.
	Malformed uint64
}

// New binds a Channel's ROUTER on the address chosen from cfg (see Config)
// and starts its receive goroutine. Close releases everything New acquired.
func New(cfg Config) (*Channel, error) {
	return newChannel(cfg, hostProbe(), net.DefaultResolver.LookupHost)
}

func newChannel(cfg Config, probe netProbe, lookup hostLookup) (*Channel, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ip, err := resolveBind(cfg, probe)
	if err != nil {
		return nil, err
	}
	bindEP, ipv6 := bindEndpoint(ip)

	zctx, err := zmq4.NewContext()
	if err != nil {
		return nil, fmt.Errorf("zmq: new context: %w", err)
	}
	router, endpoint, err := openRouter(zctx, bindEP, ipv6)
	if err != nil {
		_ = zctx.Term()
		return nil, err
	}
	c := &Channel{
		name:     cfg.Name,
		sendHWM:  cfg.SendHWM,
		log:      cfg.Logger,
		lookup:   lookup,
		zctx:     zctx,
		endpoint: endpoint,
		peers:    make(map[string]*dealer),
		inbox:    make(chan transfer.Message, cfg.RecvQueue),
		done:     make(chan struct{}),
		exited:   make(chan struct{}),
	}
	go c.serve(router)
	return c, nil
}

// openRouter creates, configures and binds the receive socket and returns
// it with the endpoint it actually bound.
func openRouter(zctx *zmq4.Context, bindEP string, ipv6 bool) (*zmq4.Socket, string, error) {
	router, err := zctx.NewSocket(zmq4.ROUTER)
	if err != nil {
		return nil, "", fmt.Errorf("zmq: new router: %w", err)
	}
	fail := func(what string, err error) (*zmq4.Socket, string, error) {
		_ = router.Close()
		return nil, "", fmt.Errorf("zmq: router %s: %w", what, err)
	}
	if err := router.SetLinger(0); err != nil {
		return fail("set linger", err)
	}
	// A peer that reconnects with the same identity (after being forgotten,
	// or restarted) takes over the identity instead of being ignored while
	// its stale connection is reaped.
	if err := router.SetRouterHandover(true); err != nil {
		return fail("set router_handover", err)
	}
	if ipv6 {
		if err := router.SetIpv6(true); err != nil {
			return fail("set ipv6", err)
		}
	}
	if err := router.Bind(bindEP); err != nil {
		return fail("bind "+bindEP, err)
	}
	endpoint, err := router.GetLastEndpoint()
	if err != nil {
		return fail("read last_endpoint", err)
	}
	return router, endpoint, nil
}

// Kind returns "zmq".
func (c *Channel) Kind() string { return Kind }

// Name returns the channel's routing identity.
func (c *Channel) Name() string { return c.name }

// LocalEndpoint returns the bound tcp://ip:port peers pass to AddPeer.
func (c *Channel) LocalEndpoint() string { return c.endpoint }

// Stats returns a snapshot of the channel's counters.
func (c *Channel) Stats() Stats {
	return Stats{
		Sent:         c.sent.Load(),
		Received:     c.received.Load(),
		Dropped:      c.dropped.Load(),
		BadEndpoints: c.badEndpoints.Load(),
		Malformed:    c.malformed.Load(),
	}
}

// AddPeer validates endpoint (tcp://host:port: an IP literal, IPv6 in
// brackets, or a resolvable host name; port 1..65535) and opens a DEALER to
// it. An unusable endpoint is an error wrapping transfer.ErrBadEndpoint and
// leaves any existing entry for peer untouched. Adding a known peer with the
// same endpoint keeps its connection and queue; with a different endpoint
// it replaces the connection, dropping messages still queued for the old
// one.
func (c *Channel) AddPeer(peer, endpoint string) error {
	if err := checkName(peer); err != nil {
		return fmt.Errorf("zmq: add peer %q: name %v: %w", peer, err, transfer.ErrBadEndpoint)
	}
	if c.isClosed() {
		return fmt.Errorf("zmq: add peer %q: %w", peer, transfer.ErrClosed)
	}
	if err := validateEndpoint(context.Background(), endpoint, c.lookup); err != nil {
		c.badEndpoints.Add(1)
		return fmt.Errorf("zmq: add peer %q: %w", peer, err)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("zmq: add peer %q: %w", peer, transfer.ErrClosed)
	}
	old := c.peers[peer]
	if old != nil && old.endpoint == endpoint {
		return nil
	}
	sock, err := c.openDealer(endpoint)
	if err != nil {
		return fmt.Errorf("zmq: add peer %q: %w", peer, err)
	}
	if old != nil {
		old.close()
	}
	c.peers[peer] = &dealer{sock: sock, endpoint: endpoint}
	return nil
}

// openDealer creates a DEALER with our identity and connects it. Connecting
// is asynchronous: messages queue (up to SendHWM) until the peer answers.
func (c *Channel) openDealer(endpoint string) (*zmq4.Socket, error) {
	sock, err := c.zctx.NewSocket(zmq4.DEALER)
	if err != nil {
		return nil, fmt.Errorf("new dealer: %w", err)
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"set linger", func() error { return sock.SetLinger(0) }},
		{"set identity", func() error { return sock.SetIdentity(c.name) }},
		{"set sndhwm", func() error { return sock.SetSndhwm(c.sendHWM) }},
		// Harmless for IPv4, required to reach IPv6 peers.
		{"set ipv6", func() error { return sock.SetIpv6(true) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			_ = sock.Close()
			return nil, fmt.Errorf("dealer %s: %w", s.what, err)
		}
	}
	if err := sock.Connect(endpoint); err != nil {
		_ = sock.Close()
		c.badEndpoints.Add(1)
		return nil, fmt.Errorf("connect %q: %w: %w", endpoint, transfer.ErrBadEndpoint, err)
	}
	return sock, nil
}

// RemovePeer closes the peer's DEALER, dropping anything still queued for
// it. Messages the peer sends are still received. An unknown peer is an
// error wrapping transfer.ErrUnknownPeer.
func (c *Channel) RemovePeer(peer string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("zmq: remove peer %q: %w", peer, transfer.ErrClosed)
	}
	d := c.peers[peer]
	if d == nil {
		return fmt.Errorf("zmq: remove peer %q: %w", peer, transfer.ErrUnknownPeer)
	}
	delete(c.peers, peer)
	d.close()
	return nil
}

// Send queues payload for peer without blocking. A full queue drops the
// message and returns an error wrapping transfer.ErrQueueFull (the first
// drop of an episode is logged); an unknown peer returns
// transfer.ErrUnknownPeer. Messages to one peer are delivered in order.
func (c *Channel) Send(peer string, payload []byte) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return fmt.Errorf("zmq: send to %q: %w", peer, transfer.ErrClosed)
	}
	d := c.peers[peer]
	if d == nil {
		return fmt.Errorf("zmq: send to %q: %w", peer, transfer.ErrUnknownPeer)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, err := d.sock.SendBytes(payload, zmq4.DONTWAIT)
	if isEAGAIN(err) {
		// A non-blocking send sees queue credit returned by the I/O thread
		// only when libzmq gets round to processing socket commands, which
		// it throttles in tight send loops. Reading ZMQ_EVENTS processes
		// them unthrottled; retry once if that freed room, so only a truly
		// full queue drops.
		if ev, e := d.sock.GetEvents(); e == nil && ev&zmq4.POLLOUT != 0 {
			_, err = d.sock.SendBytes(payload, zmq4.DONTWAIT)
		}
	}
	switch {
	case err == nil:
		c.sent.Add(1)
		if d.dropping {
			d.dropping = false
			c.log.Info("zmq: peer queue drained, sending again", "peer", peer)
		}
		return nil
	case isEAGAIN(err):
		n := c.dropped.Add(1)
		if !d.dropping {
			d.dropping = true
			c.log.Warn("zmq: peer send queue full, dropping messages",
				"peer", peer, "send_hwm", c.sendHWM, "dropped_total", n)
		}
		return fmt.Errorf("zmq: send to %q: %w", peer, transfer.ErrQueueFull)
	default:
		return fmt.Errorf("zmq: send to %q: %w", peer, err)
	}
}

// Recv returns the next message, waiting at most timeout (a timeout <= 0
// only checks). It returns an error wrapping transfer.ErrTimeout when
// nothing arrived and transfer.ErrClosed after Close.
func (c *Channel) Recv(timeout time.Duration) (transfer.Message, error) {
	if c.isDone() {
		return transfer.Message{}, fmt.Errorf("zmq: recv: %w", transfer.ErrClosed)
	}
	select {
	case m := <-c.inbox:
		return m, nil
	default:
	}
	if timeout <= 0 {
		return transfer.Message{}, fmt.Errorf("zmq: recv: %w", transfer.ErrTimeout)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case m := <-c.inbox:
		return m, nil
	case <-c.done:
		return transfer.Message{}, fmt.Errorf("zmq: recv: %w", transfer.ErrClosed)
	case <-c.exited:
		if c.isDone() {
			return transfer.Message{}, fmt.Errorf("zmq: recv: %w", transfer.ErrClosed)
		}
		return transfer.Message{}, fmt.Errorf("zmq: recv: receive loop stopped: %w", c.recvErr)
	case <-t.C:
		return transfer.Message{}, fmt.Errorf("zmq: recv: nothing within %v: %w", timeout, transfer.ErrTimeout)
	}
}

// Close closes every socket, terminates the channel's ZeroMQ context and
// waits for the receive goroutine. Queued outgoing messages are discarded
// (linger 0). Close is idempotent; later calls return the first result.
func (c *Channel) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		peers := c.peers
		c.peers = nil
		for _, d := range peers {
			d.close()
		}
		c.mu.Unlock()
		close(c.done)
		// Terminating the context wakes the receive goroutine out of
		// zmq_poll with ETERM; it closes the ROUTER, which lets Term return.
		if err := c.zctx.Term(); err != nil {
			c.closeErr = fmt.Errorf("zmq: close: terminate context: %w", err)
		}
		<-c.exited
	})
	return c.closeErr
}

func (c *Channel) isClosed() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.closed
}

func (c *Channel) isDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// close closes the DEALER, discarding its queue. The caller holds the
// channel lock exclusively, so no Send is using the socket.
func (d *dealer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sock != nil {
		_ = d.sock.Close()
		d.sock = nil
	}
}

// serve owns the ROUTER: it moves incoming messages to the inbox until
// Close, and closes the ROUTER on the way out.
func (c *Channel) serve(router *zmq4.Socket) {
	defer close(c.exited)
	defer router.Close()
	poller := zmq4.NewPoller()
	poller.Add(router, zmq4.POLLIN)
	for {
		// Drain everything readable, then sleep in poll.
		for {
			frames, err := router.RecvMessageBytes(zmq4.DONTWAIT)
			if err != nil {
				if isEAGAIN(err) {
					break
				}
				c.stop(fmt.Errorf("router recv: %w", err))
				return
			}
			if !c.deliver(frames) {
				return
			}
		}
		if _, err := poller.Poll(pollInterval); err != nil {
			if zmq4.AsErrno(err) == zmq4.Errno(syscall.EINTR) {
				continue
			}
			c.stop(fmt.Errorf("router poll: %w", err))
			return
		}
		if c.isDone() {
			return
		}
	}
}

// stop records why the receive loop ends. Context termination during Close
// is the normal way out and is not logged.
func (c *Channel) stop(err error) {
	c.recvErr = err
	if c.isDone() || errors.Is(err, zmq4.ETERM) {
		return
	}
	c.log.Error("zmq: receive loop stopped", "err", err)
}

// deliver queues one ROUTER message ([identity, payload]) for Recv, waiting
// while the inbox is full. It returns false once the channel is closing.
func (c *Channel) deliver(frames [][]byte) bool {
	if len(frames) != 2 || len(frames[0]) == 0 || frames[0][0] == 0 {
		n := c.malformed.Add(1)
		if n&(n-1) == 0 { // log the 1st, 2nd, 4th, 8th ... occurrence
			c.log.Warn("zmq: discarding malformed message",
				"frames", len(frames), "malformed_total", n)
		}
		return true
	}
	m := transfer.Message{Peer: string(frames[0]), Payload: frames[1]}
	select {
	case c.inbox <- m:
		c.received.Add(1)
		return true
	case <-c.done:
		return false
	}
}

func isEAGAIN(err error) bool {
	return err != nil && zmq4.AsErrno(err) == zmq4.Errno(syscall.EAGAIN)
}
