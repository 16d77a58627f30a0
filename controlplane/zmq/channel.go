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
// With Config.Peers enabled (security.mode authenticate) every connection
// is ZeroMQ CURVE: the ROUTER is a CURVE server holding this agent's key,
// each DEALER a client pinned to its peer's public key, and a ZAP handler
// bound in the channel's own context admits only the keys of admitted
// peers, setting the connection's User-Id to the agent that owns the key.
// Message.Peer is that agent; a message whose declared routing identity
// differs is dropped and counted (Stats.Spoofed). ZMQ_MAXMSGSIZE bounds
// every message (a peer sending more is disconnected before it is
// buffered) and ZMQ_HANDSHAKE_IVL every handshake.
//
// In every security mode the ZAP handler also caps the ROUTER's
// connections: one host may hold Config.MaxConnsPerHost and all hosts
// Config.MaxConns (each counted up to its cap); a connection past either
// is refused at its handshake (ZAP status 500), so libzmq closes it and
// its descriptor is released. It counts them from the ROUTER's socket
// monitor. Without CURVE the ZAP request carries the NULL mechanism,
// which the handler admits within the caps.
//
// Every DEALER's connection is watched through the ZeroMQ socket monitor:
// one that drops after its handshake (the peer process died, or its
// heartbeats timed out) is reported at once (SetPeerLost); PeerDownFor
// says how long one has been without a completed handshake.
//
// A Channel starts one goroutine for the DEALERs' socket monitor and one
// for the ZAP handler; Recv reads the ROUTER itself. Every
// Channel owns its own ZeroMQ context, so Close releases all of its sockets
// and libzmq threads and affects no other Channel.
package zmq

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// Kind is the value Channel.Kind returns.
const Kind = "zmq"

// wakeEndpoint is the inproc address of the pair Close uses to wake a Recv
// parked in zmq_poll. Inproc names are per context, and every Channel has
// its own context.
const wakeEndpoint = "inproc://bounce-zmq-wake"

var (
	_ transfer.ControlChannel   = (*Channel)(nil)
	_ transfer.PeerLossReporter = (*Channel)(nil)
)

// Channel is a transfer.ControlChannel over a ZeroMQ ROUTER (receive) and
// one DEALER per peer (send). All methods are safe for concurrent use.
//
// Socket ownership: the ROUTER and the wake pair are used only by the
// holder of the receive turn (one Recv at a time, or Close). Each DEALER is
// used only under its peer's mutex, and only with non-blocking calls, so
// Send never waits on the network and Recv never waits on Send.
type Channel struct {
	name     string
	sendHWM  int
	auth     *security.Peers // nil or disabled: no CURVE
	maxMsg   int64
	zap      *zapHandler
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

	// recvTurn holds a token while a Recv (or Close) uses router, poller
	// and wakeRecv.
	recvTurn chan struct{}
	router   *zmq4.Socket
	wakeRecv *zmq4.Socket // PAIR polled with router; readable after WakeRecv or Close
	wakeSend *zmq4.Socket // PAIR written by WakeRecv and Close, under wakeMu
	wakeMu   sync.Mutex
	poller   *zmq4.Poller
	done     chan struct{} // closed by Close

	closeOnce sync.Once
	closeErr  error

	mon       *monitor                            // watches every DEALER's connection
	onLost    atomic.Pointer[func(string)]        // SetPeerLost's callback
	onUp      atomic.Pointer[func(string)]        // SetPeerUp's callback
	onRefused atomic.Pointer[func(string, error)] // SetPeerRefused's callback
	dealerIDs atomic.Uint64

	sent, received, dropped, badEndpoints, malformed, spoofed, lost, refusedBy atomic.Uint64
}

// dealer is the send socket to one peer.
type dealer struct {
	id        uint64     // unique in the channel: its monitor's reports name it
	mu        sync.Mutex // serializes use of sock
	sock      *zmq4.Socket
	endpoint  string
	dropping  bool        // the last send was dropped; used to warn once per episode
	connected bool        // Connect was called (at once without CURVE, on the first Send with it)
	refused   atomic.Bool // the peer refused the last handshake (warned once until a connection is up)
	// downSince is when the connection was last without a completed
	// handshake (the DEALER's creation, or its last drop), in Unix ns; 0
	// while it is up. PeerDownFor reads it.
	downSince atomic.Int64
}

// Stats are the channel's cumulative counters.
type Stats struct {
	// Sent counts messages handed to a peer's DEALER queue.
	Sent uint64
	// Received counts messages returned by Recv.
	Received uint64
	// Dropped counts sends refused with ErrQueueFull.
	Dropped uint64
	// BadEndpoints counts AddPeer calls rejected for their endpoint.
	BadEndpoints uint64
	// Malformed counts incoming messages discarded because they were not a
	// single frame from a named peer.
	Malformed uint64
	// Admitted and Refused count incoming connections the ZAP handler
	// admitted and refused for their key (unknown key, other mechanism).
	Admitted, Refused uint64
	// OverCap counts incoming connections refused because their host held
	// MaxConnsPerHost connections or all hosts MaxConns.
	OverCap uint64
	// Conns is the incoming connections open now (handshakes in progress
	// included).
	Conns int64
	// Spoofed counts messages dropped because the routing identity the
	// sender declared differs from the agent its key belongs to.
	Spoofed uint64
	// LostPeers counts DEALER connections that dropped after completing
	// their handshake (reported to SetPeerLost).
	LostPeers uint64
	// RefusedBy counts handshakes of this channel's DEALERs that the peer
	// refused (reported to SetPeerRefused).
	RefusedBy uint64
}

// New binds a Channel's ROUTER on the address chosen from cfg (see Config).
// Close releases everything New acquired.
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
	// The ZAP handler binds first: libzmq admits clients without asking
	// when no handler is bound.
	zap, err := startZAP(zctx, cfg.Peers, cfg.MaxConnsPerHost, cfg.MaxConns, cfg.Logger)
	if err != nil {
		_ = zctx.Term()
		return nil, err
	}
	stopZAP := zap.stop
	router, endpoint, err := openRouter(zctx, bindEP, ipv6, cfg)
	if err != nil {
		stopZAP()
		_ = zctx.Term()
		return nil, err
	}
	wakeRecv, wakeSend, err := openPair(zctx, wakeEndpoint)
	if err != nil {
		_ = router.Close()
		stopZAP()
		_ = zctx.Term()
		return nil, fmt.Errorf("zmq: wake pair %w", err)
	}
	c := &Channel{
		name:     cfg.Name,
		sendHWM:  cfg.SendHWM,
		auth:     cfg.Peers,
		maxMsg:   cfg.MaxMessageSize,
		zap:      zap,
		log:      cfg.Logger,
		lookup:   lookup,
		zctx:     zctx,
		endpoint: endpoint,
		peers:    make(map[string]*dealer),
		recvTurn: make(chan struct{}, 1),
		router:   router,
		wakeRecv: wakeRecv,
		wakeSend: wakeSend,
		poller:   zmq4.NewPoller(),
		done:     make(chan struct{}),
	}
	if c.mon, err = newMonitor(zctx, c.connLost, c.connUp, c.connRefused); err != nil {
		for _, s := range []*zmq4.Socket{router, wakeRecv, wakeSend} {
			_ = s.Close()
		}
		stopZAP()
		_ = zctx.Term()
		return nil, err
	}
	c.poller.Add(router, zmq4.POLLIN)
	c.poller.Add(wakeRecv, zmq4.POLLIN)
	return c, nil
}

// openPair connects two inproc PAIR sockets at endpoint.
func openPair(zctx *zmq4.Context, endpoint string) (recv, send *zmq4.Socket, err error) {
	var socks [2]*zmq4.Socket
	fail := func(what string, err error) (*zmq4.Socket, *zmq4.Socket, error) {
		for _, s := range socks {
			if s != nil {
				_ = s.Close()
			}
		}
		return nil, nil, fmt.Errorf("pair %s: %w", what, err)
	}
	for i := range socks {
		if socks[i], err = zctx.NewSocket(zmq4.PAIR); err != nil {
			socks[i] = nil
			return fail("new socket", err)
		}
		if err := socks[i].SetLinger(0); err != nil {
			return fail("set linger", err)
		}
	}
	if err := socks[0].Bind(endpoint); err != nil {
		return fail("bind", err)
	}
	if err := socks[1].Connect(endpoint); err != nil {
		return fail("connect", err)
	}
	return socks[0], socks[1], nil
}

// openRouter creates, configures and binds the receive socket and returns
// it with the endpoint it actually bound.
func openRouter(zctx *zmq4.Context, bindEP string, ipv6 bool, cfg Config) (*zmq4.Socket, string, error) {
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
	if err := router.SetRcvhwm(cfg.RecvQueue); err != nil {
		return fail("set rcvhwm", err)
	}
	// A peer that sends a larger message is disconnected by libzmq before
	// the message is buffered whole.
	if err := router.SetMaxmsgsize(cfg.MaxMessageSize); err != nil {
		return fail("set maxmsgsize", err)
	}
	// Connections that have not finished the handshake by then are closed
	// (an attacker opening connections and sending nothing holds an fd at
	// most this long).
	if err := router.SetHandshakeIvl(cfg.HandshakeTimeout); err != nil {
		return fail("set handshake_ivl", err)
	}
	if cfg.Peers.Enabled() {
		id := cfg.Peers.Self()
		if err := router.SetCurveServer(1); err != nil {
			return fail("set curve_server", err)
		}
		if err := router.SetCurveSecretkey(id.SecretZ85()); err != nil {
			return fail("set curve_secretkey", err)
		}
	}
	// A ZAP domain in every mode: libzmq then asks the handler about NULL
	// clients too, which is where the connection caps are applied.
	if err := router.SetZapDomain(zapDomain); err != nil {
		return fail("set zap_domain", err)
	}
	// The handler counts the connections from the monitor's events; it
	// reports before the ROUTER binds, so no connection is missed.
	if err := router.Monitor(routerMonEndpoint, routerMonEvents); err != nil {
		return fail("monitor", err)
	}
	// A peer that reconnects with the same identity (after being forgotten,
	// or restarted) takes over the identity instead of being ignored while
	// its stale connection is reaped.
	if err := router.SetRouterHandover(true); err != nil {
		return fail("set router_handover", err)
	}
	if err := setHeartbeat(router); err != nil {
		return fail("set heartbeat", err)
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
	st := Stats{
		Sent:         c.sent.Load(),
		Received:     c.received.Load(),
		Dropped:      c.dropped.Load(),
		BadEndpoints: c.badEndpoints.Load(),
		Malformed:    c.malformed.Load(),
		Spoofed:      c.spoofed.Load(),
		LostPeers:    c.lost.Load(),
		RefusedBy:    c.refusedBy.Load(),
	}
	st.Admitted, st.Refused, st.OverCap = c.zap.admitted.Load(), c.zap.refused.Load(), c.zap.overCap.Load()
	st.Conns = c.zap.live.Load()
	return st
}

// Refusals counts what this channel refused from peers, by reason:
// not_admitted (a CURVE client whose key its ZAP handler did not admit, or
// another mechanism), over_cap (a connection past MaxConnsPerHost or
// MaxConns), spoofed (a message whose declared identity is not its key's
// agent) and malformed (not one frame from a named peer).
func (c *Channel) Refusals() map[string]uint64 {
	st := c.Stats()
	return map[string]uint64{"not_admitted": st.Refused, "over_cap": st.OverCap, "spoofed": st.Spoofed, "malformed": st.Malformed}
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
	// Re-adding a peer at the endpoint it already has is a no-op: no DNS
	// re-validation and no reconnect that would drop queued messages.
	c.mu.RLock()
	closed := c.closed
	d := c.peers[peer]
	same := d != nil && d.endpoint == endpoint
	c.mu.RUnlock()
	switch {
	case closed:
		return fmt.Errorf("zmq: add peer %q: %w", peer, transfer.ErrClosed)
	case same:
		return nil
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
	id := c.dealerIDs.Add(1)
	sock, err := c.openDealer(peer, endpoint, id)
	if err != nil {
		return fmt.Errorf("zmq: add peer %q: %w", peer, err)
	}
	if old != nil {
		old.close()
	}
	d = &dealer{id: id, sock: sock, endpoint: endpoint, connected: !c.auth.Enabled()}
	d.downSince.Store(time.Now().UnixNano())
	c.peers[peer] = d
	return nil
}

// PeerDownFor reports how long the DEALER to peer has been without a
// completed handshake — since it was added, or since its connection last
// dropped — and 0 while its connection is up; known is false when peer has
// no DEALER. A peer that never completed a handshake never received
// anything sent to it, and a loss report may be missing for it (a dial the
// peer neither refused nor answered, a handshake it refused): the
// pipeline reclaims a sender's grants that sat behind a path down that
// long (pipeline's unreachedGrace).
func (c *Channel) PeerDownFor(peer string) (d time.Duration, known bool) {
	c.mu.RLock()
	dl := c.peers[peer]
	c.mu.RUnlock()
	if dl == nil {
		return 0, false
	}
	since := dl.downSince.Load()
	if since == 0 {
		return 0, true
	}
	return max(time.Since(time.Unix(0, since)), 0), true
}

// SetPeerLost registers fn, called with a peer's name when the connection
// of its DEALER drops after it had completed its handshake: the peer
// process died (its kernel closed the socket: seen within a round trip,
// through the ZeroMQ socket monitor) or went silent past the heartbeat
// timeout (transfer.PeerLossReporter); and when a DEALER whose connection
// never completed a handshake fails a dial (nothing listens at the
// endpoint the peer had bound: it died before this channel's first
// connection to it was up). Once per drop: the DEALER reconnects by
// itself, and its failing redials are no new loss until a handshake
// completed again. A removed or replaced DEALER is not reported. fn must
// not block.
func (c *Channel) SetPeerLost(fn func(peer string)) {
	if fn == nil {
		c.onLost.Store(nil)
		return
	}
	c.onLost.Store(&fn)
}

// SetPeerUp registers fn, called with a peer's name each time the
// connection of its DEALER completes its handshake: the first time, and
// again after each drop reported to SetPeerLost (the peer came back, or
// a process restarted at its endpoint). A removed or replaced DEALER is
// not reported. fn must not block.
func (c *Channel) SetPeerUp(fn func(peer string)) {
	if fn == nil {
		c.onUp.Store(nil)
		return
	}
	c.onUp.Store(&fn)
}

// current says whether w watches the DEALER peers holds now.
func (c *Channel) current(w watch) bool { return c.dealerOf(w) != nil }

// dealerOf returns the dealer w reports for while it is the peer's
// current one, else nil.
func (c *Channel) dealerOf(w watch) *dealer {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if d := c.peers[w.peer]; !c.closed && d != nil && d.id == w.id {
		return d
	}
	return nil
}

// connUp is the monitor's report that w's connection completed its
// handshake.
func (c *Channel) connUp(w watch) {
	d := c.dealerOf(w)
	if d == nil {
		return
	}
	// The peer admits this agent now: a later refusal is news again.
	d.refused.Store(false)
	d.downSince.Store(0)
	if fn := c.onUp.Load(); fn != nil {
		(*fn)(w.peer)
	}
}

// connLost is the monitor's report that w's connection dropped.
func (c *Channel) connLost(w watch) {
	d := c.dealerOf(w)
	if d == nil {
		return
	}
	d.downSince.CompareAndSwap(0, time.Now().UnixNano())
	n := c.lost.Add(1)
	c.log.Info("zmq: connection to peer dropped", "peer", w.peer, "lost_total", n)
	if fn := c.onLost.Load(); fn != nil {
		(*fn)(w.peer)
	}
}

// SetPeerRefused registers fn, called with a peer's name and the cause
// each time the peer refuses a handshake of this channel's DEALER to it:
// its ZAP handler did not admit this agent's key (ZMTP ERROR, reported by
// the socket monitor as a failed authentication) or the CURVE handshake
// failed (a protocol error: the peer's key in its descriptor is stale),
// wrapping security.ErrNotAdmitted; or this host held the peer's limit
// of control connections (ZAP status 500: its max_control_conns_per_host
// or max_control_conns), wrapping transfer.ErrBusy. The error says the
// likely cause.
// libzmq does not dial a refused connection again; the DEALER's next Send
// does, so a peer that admits the key later is reached. fn must not block.
func (c *Channel) SetPeerRefused(fn func(peer string, err error)) {
	if fn == nil {
		c.onRefused.Store(nil)
		return
	}
	c.onRefused.Store(&fn)
}

// connRefused is the monitor's report that the peer of w refused its
// handshake; auth tells a refused key (status: the ZAP status code) from a
// protocol failure (status: libzmq's ZMQ_PROTOCOL_ERROR_* code).
func (c *Channel) connRefused(w watch, auth bool, status int) {
	d := c.dealerOf(w)
	if d == nil {
		return
	}
	n := c.refusedBy.Add(1)
	how := fmt.Sprintf("authentication failed, ZAP status %d", status)
	if !auth {
		how = fmt.Sprintf("handshake failed, protocol error 0x%x", status)
	}
	err := fmt.Errorf("zmq: peer %q refused this agent's control connection (%s): this agent's key is likely not in the peer's security.allowed_peers (add the line 'bounce key' prints for this agent's key file there), or the peer's descriptor is stale: %w",
		w.peer, how, security.ErrNotAdmitted)
	if auth && status == 500 {
		err = fmt.Errorf("zmq: peer %q refused this agent's control connection (ZAP status 500: over its connection cap): this host holds the peer's security.max_control_conns_per_host control connections, or all hosts its security.max_control_conns; the next send dials again: %w",
			w.peer, transfer.ErrBusy)
	}
	if !d.refused.Swap(true) {
		c.log.Warn("zmq: peer refused this agent", "peer", w.peer, "err", err, "refused_total", n)
	}
	// libzmq ends a connection whose handshake was refused and never
	// dials it again: the next Send does, so a peer that admits this
	// agent's key later is reached.
	d.mu.Lock()
	d.connected = false
	d.mu.Unlock()
	if fn := c.onRefused.Load(); fn != nil {
		(*fn)(w.peer, err)
	}
}

// Heartbeats (ZMTP PING/PONG) on every connection: a peer silent for
// heartbeatTimeout (a host gone, a half-open connection that TCP itself
// would keep for hours) has its connection dropped, so the DEALER
// reconnects and queued messages are not stuck behind a dead peer. TTL
// tells the other side to time out the same way.
const (
	heartbeatIvl     = time.Second
	heartbeatTimeout = 3 * time.Second
)

func setHeartbeat(s *zmq4.Socket) error {
	if err := s.SetHeartbeatIvl(heartbeatIvl); err != nil {
		return err
	}
	if err := s.SetHeartbeatTimeout(heartbeatTimeout); err != nil {
		return err
	}
	return s.SetHeartbeatTtl(heartbeatTimeout)
}

// openDealer creates a DEALER with our identity and connects it. Connecting
// is asynchronous: messages queue (up to SendHWM) until the peer answers.
func (c *Channel) openDealer(peer, endpoint string, id uint64) (*zmq4.Socket, error) {
	var server security.Key
	if c.auth.Enabled() {
		k, ok := c.auth.KeyOf(peer)
		if !ok {
			return nil, fmt.Errorf("no public key known for peer %q (load its descriptor or list it in security.allowed_peers): %w: %w", peer, security.ErrNotAdmitted, transfer.ErrUnknownPeer)
		}
		server = k
	}
	sock, err := c.zctx.NewSocket(zmq4.DEALER)
	if err != nil {
		return nil, fmt.Errorf("new dealer: %w", err)
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"set linger", func() error { return sock.SetLinger(0) }},
		{"set identity", func() error { return sock.SetIdentity(routingID(c.name)) }},
		{"set sndhwm", func() error { return sock.SetSndhwm(c.sendHWM) }},
		// Harmless for IPv4, required to reach IPv6 peers.
		{"set ipv6", func() error { return sock.SetIpv6(true) }},
		{"set heartbeat", func() error { return setHeartbeat(sock) }},
		{"set maxmsgsize", func() error { return sock.SetMaxmsgsize(c.maxMsg) }},
	}
	if c.auth.Enabled() {
		id := c.auth.Self()
		steps = append(steps, []struct {
			what string
			do   func() error
		}{
			{"set curve_serverkey", func() error { return sock.SetCurveServerkey(server.String()) }},
			{"set curve_publickey", func() error { return sock.SetCurvePublickey(id.Public.String()) }},
			{"set curve_secretkey", func() error { return sock.SetCurveSecretkey(id.SecretZ85()) }},
		}...)
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			_ = sock.Close()
			return nil, fmt.Errorf("dealer %s: %w", s.what, err)
		}
	}
	if err := c.mon.watch(c.zctx, sock, peer, id); err != nil {
		_ = sock.Close()
		return nil, fmt.Errorf("dealer %w", err)
	}
	if c.auth.Enabled() {
		// With CURVE the DEALER connects on its first Send (see
		// dealer.connect): libzmq never retries a connection whose
		// handshake the peer refused, and a peer often admits us only once
		// it loaded our descriptor, just after we loaded its.
		return sock, nil
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
	if !d.connected {
		_ = d.sock.Disconnect(d.endpoint) // a refused connection's remains, if any
		if err := d.sock.Connect(d.endpoint); err != nil {
			c.badEndpoints.Add(1)
			return fmt.Errorf("zmq: send to %q: connect %q: %w: %w", peer, d.endpoint, transfer.ErrBadEndpoint, err)
		}
		d.connected = true
	}
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
		if d.refused.Load() {
			// No connection to queue on: the peer refused this agent
			// (warned once, by connRefused), which is the news here.
			return fmt.Errorf("zmq: send to %q: %w: the peer refused this agent's handshake (its key is likely not in the peer's security.allowed_peers, or this host is over the peer's control connection cap)", peer, transfer.ErrQueueFull)
		}
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
// nothing arrived and transfer.ErrClosed after Close. Concurrent Recv calls
// take turns reading the socket; each still returns within its timeout
// (rounded up to a millisecond).
func (c *Channel) Recv(timeout time.Duration) (transfer.Message, error) {
	if c.isDone() {
		return transfer.Message{}, fmt.Errorf("zmq: recv: %w", transfer.ErrClosed)
	}
	deadline := time.Now().Add(timeout)
	select {
	case c.recvTurn <- struct{}{}:
	default:
		if timeout <= 0 {
			return transfer.Message{}, fmt.Errorf("zmq: recv: %w", transfer.ErrTimeout)
		}
		t := time.NewTimer(timeout)
		select {
		case c.recvTurn <- struct{}{}:
			t.Stop()
		case <-c.done:
			t.Stop()
			return transfer.Message{}, fmt.Errorf("zmq: recv: %w", transfer.ErrClosed)
		case <-t.C:
			return transfer.Message{}, fmt.Errorf("zmq: recv: nothing within %v: %w", timeout, transfer.ErrTimeout)
		}
	}
	defer func() { <-c.recvTurn }()
	return c.recvTurnHeld(timeout, deadline)
}

// recvTurnHeld reads the ROUTER until a well-formed message arrives, the
// deadline passes or Close wakes it. The caller holds the receive turn.
func (c *Channel) recvTurnHeld(timeout time.Duration, deadline time.Time) (transfer.Message, error) {
	for {
		// Checked on every pass: Close may have taken the sockets away
		// between our taking the turn and now only if done is closed.
		if c.isDone() {
			return transfer.Message{}, fmt.Errorf("zmq: recv: %w", transfer.ErrClosed)
		}
		frames, meta, err := c.recvFrames()
		if err == nil {
			if m, ok := c.accept(frames, meta); ok {
				return m, nil
			}
			continue
		}
		if !isEAGAIN(err) {
			return transfer.Message{}, c.recvError(err)
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return transfer.Message{}, fmt.Errorf("zmq: recv: nothing within %v: %w", timeout, transfer.ErrTimeout)
		}
		// zmq_poll counts whole milliseconds; round up so a short wait
		// sleeps instead of spinning.
		wait = (wait + time.Millisecond - 1).Truncate(time.Millisecond)
		polled, err := c.poller.Poll(wait)
		if err != nil && zmq4.AsErrno(err) != zmq4.Errno(syscall.EINTR) {
			return transfer.Message{}, c.recvError(err)
		}
		for _, p := range polled {
			if p.Socket != c.wakeRecv || c.isDone() {
				continue
			}
			// Every wake pending ends this one Recv.
			woken := false
			for {
				if _, err := c.wakeRecv.RecvBytes(zmq4.DONTWAIT); err != nil {
					break
				}
				woken = true
			}
			if woken {
				return transfer.Message{}, fmt.Errorf("zmq: recv: woken: %w", transfer.ErrTimeout)
			}
		}
	}
}

// WakeRecv makes a Recv in progress, or else the next one that waits,
// return ErrTimeout at once (wakes pending together end one Recv) instead of waiting out its timeout: a receive loop
// that is told to stop then stops without that wait (an agent's shutdown).
// Messages are not lost: they stay queued for the next Recv. After Close
// it does nothing.
func (c *Channel) WakeRecv() {
	c.wakeMu.Lock()
	defer c.wakeMu.Unlock()
	if c.isDone() {
		return
	}
	// A full pipe means a wake is already pending.
	_, _ = c.wakeSend.SendBytes([]byte{1}, zmq4.DONTWAIT)
}

// recvFrames reads one ROUTER message without waiting and the User-Id of
// the connection it came on. The ROUTER synthesizes the identity frame,
// which carries no metadata, so the User-Id is read from the payload
// frame.
func (c *Channel) recvFrames() ([][]byte, msgMeta, error) {
	first, err := c.router.RecvBytes(zmq4.DONTWAIT)
	if err != nil {
		return nil, msgMeta{}, err
	}
	frames := [][]byte{first}
	var mm msgMeta
	for {
		more, err := c.router.GetRcvmore()
		if err != nil {
			return nil, msgMeta{}, err
		}
		if !more {
			return frames, mm, nil
		}
		b, meta, err := c.router.RecvBytesWithMetadata(zmq4.DONTWAIT, "User-Id", "Peer-Address")
		if err != nil {
			return nil, msgMeta{}, err
		}
		if len(frames) == 1 {
			mm = msgMeta{userID: meta["User-Id"], from: meta["Peer-Address"]}
		}
		frames = append(frames, b)
	}
}

// msgMeta is what libzmq tells of a message's connection: the User-Id ZAP
// set (the agent that owns the CURVE key) and the peer's IP address.
type msgMeta struct{ userID, from string }

func (c *Channel) recvError(err error) error {
	if c.isDone() || zmq4.AsErrno(err) == zmq4.ETERM {
		return fmt.Errorf("zmq: recv: %w", transfer.ErrClosed)
	}
	return fmt.Errorf("zmq: recv: %w", err)
}

// routingID is the routing id of a new DEALER of the agent name: the
// name, a zero byte and 8 random bytes, so each DEALER (each AddPeer, each
// process) is its own pipe at the peer's ROUTER instead of a handover of
// the last one's identity (libzmq's ROUTER_HANDOVER can park a DEALER
// that reconnects under a known id while the ROUTER's thread is busy, its
// messages never read: zeromq/libzmq#2892, #2019). A name too long for
// the suffix (routing ids are at most 255 bytes) goes bare, as older
// builds send every name.
func routingID(name string) string {
	if len(name)+1+8 > 255 {
		return name
	}
	var suffix [8]byte
	binary.LittleEndian.PutUint64(suffix[:], rand.Uint64())
	return name + "\x00" + string(suffix[:])
}

// peerName is the agent name in a routing id: what precedes its first
// zero byte (a DEALER's incarnation suffix, routingID), or all of it (an
// older build's bare name). Names never hold a zero byte.
func peerName(id []byte) []byte {
	if i := bytes.IndexByte(id, 0); i > 0 {
		return id[:i]
	}
	return id
}

// accept turns one ROUTER message ([identity, payload]) into a Message.
// Anything else (extra frames, an anonymous libzmq-assigned identity) is
// counted and discarded. With CURVE the peer is the agent that owns the
// connection's key (the ZAP User-Id, userID); a declared identity that
// differs from it is counted as spoofed and discarded.
func (c *Channel) accept(frames [][]byte, meta msgMeta) (transfer.Message, bool) {
	userID := meta.userID
	if len(frames) != 2 || len(frames[0]) == 0 || frames[0][0] == 0 {
		n := c.malformed.Add(1)
		if n&(n-1) == 0 { // log the 1st, 2nd, 4th, 8th ... occurrence
			c.log.Warn("zmq: discarding malformed message",
				"frames", len(frames), "malformed_total", n)
		}
		return transfer.Message{}, false
	}
	name := string(peerName(frames[0]))
	if c.auth.Enabled() && (userID == "" || userID != name) {
		n := c.spoofed.Add(1)
		if n&(n-1) == 0 {
			c.log.Warn("zmq: discarding message whose declared identity is not its key's agent",
				"declared", name, "authenticated", userID, "spoofed_total", n)
		}
		return transfer.Message{}, false
	}
	if err := transfer.CheckName(name); err != nil {
		n := c.malformed.Add(1)
		if n&(n-1) == 0 {
			c.log.Warn("zmq: discarding message with a bad peer name", "err", err, "malformed_total", n)
		}
		return transfer.Message{}, false
	}
	c.received.Add(1)
	return transfer.Message{Peer: name, Payload: frames[1], From: meta.from}, true
}

// Close closes every socket and terminates the channel's ZeroMQ context,
// which stops its libzmq threads. Queued outgoing and unread incoming
// messages are discarded (linger 0). A Recv in progress returns
// ErrClosed. Close is idempotent; later calls return the first result.
func (c *Channel) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		c.mu.Lock()
		c.closed = true
		peers := c.peers
		c.peers = nil
		for _, d := range peers {
			d.close()
		}
		c.mu.Unlock()
		c.mon.stop()
		c.wakeMu.Lock()
		close(c.done)
		// Wake a Recv parked in zmq_poll, then take the receive turn for
		// good: no Recv touches the sockets after this.
		if _, err := c.wakeSend.SendBytes([]byte{1}, zmq4.DONTWAIT); err != nil {
			errs = append(errs, fmt.Errorf("wake receiver: %w", err))
		}
		c.recvTurn <- struct{}{}
		for _, s := range []*zmq4.Socket{c.router, c.wakeRecv, c.wakeSend} {
			if err := s.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close socket: %w", err))
			}
		}
		c.wakeMu.Unlock()
		c.zap.stop()
		if err := c.zctx.Term(); err != nil {
			errs = append(errs, fmt.Errorf("terminate context: %w", err))
		}
		if err := errors.Join(errs...); err != nil {
			c.closeErr = fmt.Errorf("zmq: close: %w", err)
		}
	})
	return c.closeErr
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

func isEAGAIN(err error) bool {
	return err != nil && zmq4.AsErrno(err) == zmq4.Errno(syscall.EAGAIN)
}
