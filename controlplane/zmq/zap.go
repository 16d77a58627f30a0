package zmq

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq4 "github.com/pebbe/zmq4"

	"github.com/bouncekv/bounce/security"
)

// zapEndpoint is where libzmq asks for authentication (RFC 27). Inproc
// names are per context and every Channel has its own context, so each
// channel answers only for its own sockets (zmq4's AuthStart, by contrast,
// is process-global).
const zapEndpoint = "inproc://zeromq.zap.01"

// zapDomain is the ZAP domain of the channel's ROUTER. A domain set makes
// libzmq ask the handler for every incoming connection, NULL mechanism
// (security off) included.
const zapDomain = "bounce"

// zapWakeEndpoint wakes the handler for Close.
const zapWakeEndpoint = "inproc://bounce-zap-wake"

// routerMonEndpoint is where the ROUTER's socket monitor reports to the
// handler.
const routerMonEndpoint = "inproc://bounce-zmq-router-monitor"

// routerMonEvents are the ROUTER's monitor events the handler counts
// connections with: each accepted connection (value: its descriptor)
// and each that ended (DISCONNECTED, emitted for every engine that stops,
// a refused handshake included, before its descriptor is closed).
const routerMonEvents = zmq4.EVENT_ACCEPTED | zmq4.EVENT_DISCONNECTED | zmq4.EVENT_MONITOR_STOPPED

// ZAP status codes (RFC 27). A connection over a cap is refused with
// 500 so that its DEALER can tell it from a key refused (400); 300 (a
// temporary error) would leave a NULL handshake hanging until
// HandshakeTimeout and make a CURVE client reconnect at once.
const (
	zapOK      = "200"
	zapDenied  = "400"
	zapOverCap = "500"
)

// zapHandler answers libzmq's ZAP requests for the channel's ROUTER on
// its own goroutine, in every security mode. With CURVE (Peers enabled) a
// client is admitted only when its public key belongs to an admitted
// peer, and the connection's User-Id is set to that peer's agent name,
// which the channel then reports as Message.Peer; without, every NULL
// client is. Either way a connection is refused (status 500) when it
// would take its host past MaxConnsPerHost admitted connections, or all
// hosts past MaxConns (security.HostConns decides): the handler counts
// the ROUTER's connections from its socket monitor, reading the host of
// each accepted descriptor, so the caps hold whether names are proven or
// not. The goroutine owns the REP, the monitor PAIR and the count.
type zapHandler struct {
	peers   *security.Peers
	log     *slog.Logger
	rep     *zmq4.Socket
	mon     *zmq4.Socket // PAIR connected to the ROUTER's monitor
	wakeIn  *zmq4.Socket
	wakeOut *zmq4.Socket
	done    chan struct{}
	once    sync.Once

	conns security.HostConns // owned by the goroutine

	admitted, refused, overCap atomic.Uint64
	live                       atomic.Int64 // conns.Live(), published
}

// startZAP binds the handler in zctx and starts it. It must run before
// any socket of zctx with a ZAP domain binds or connects, and the ROUTER
// must report to routerMonEndpoint (openRouter) before it binds.
func startZAP(zctx *zmq4.Context, peers *security.Peers, perHost, total int, log *slog.Logger) (*zapHandler, error) {
	h := &zapHandler{peers: peers, log: log, done: make(chan struct{}),
		conns: security.HostConns{PerHost: perHost, Total: total}}
	var err error
	if h.rep, err = zctx.NewSocket(zmq4.REP); err != nil {
		return nil, fmt.Errorf("zmq: zap handler: %w", err)
	}
	if h.wakeIn, h.wakeOut, err = openPair(zctx, zapWakeEndpoint); err != nil {
		_ = h.rep.Close()
		return nil, fmt.Errorf("zmq: zap handler: %w", err)
	}
	if err = h.rep.SetLinger(0); err == nil {
		err = h.rep.Bind(zapEndpoint)
	}
	if err != nil {
		h.closeSockets()
		return nil, fmt.Errorf("zmq: zap handler bind %s: %w", zapEndpoint, err)
	}
	if h.mon, err = zctx.NewSocket(zmq4.PAIR); err != nil {
		h.mon = nil
		h.closeSockets()
		return nil, fmt.Errorf("zmq: router monitor: %w", err)
	}
	// No high-water mark: the monitor's send would otherwise block the
	// I/O thread while a flood's events wait here (libzmq sends monitor
	// events blocking).
	if err = h.mon.SetLinger(0); err == nil {
		if err = h.mon.SetRcvhwm(0); err == nil {
			err = h.mon.Connect(routerMonEndpoint)
		}
	}
	if err != nil {
		h.closeSockets()
		return nil, fmt.Errorf("zmq: router monitor: %w", err)
	}
	go h.run()
	return h, nil
}

func (h *zapHandler) run() {
	defer close(h.done)
	poller := zmq4.NewPoller()
	poller.Add(h.rep, zmq4.POLLIN)
	poller.Add(h.mon, zmq4.POLLIN)
	poller.Add(h.wakeIn, zmq4.POLLIN)
	for {
		polled, err := poller.Poll(time.Second)
		if err != nil {
			if zmq4.AsErrno(err) == zmq4.Errno(syscall.EINTR) {
				continue
			}
			return
		}
		for _, p := range polled {
			if p.Socket == h.wakeIn {
				return
			}
		}
		for {
			h.readMonitor()
			req, err := h.rep.RecvMessageBytes(zmq4.DONTWAIT)
			if err != nil {
				if isEAGAIN(err) {
					break
				}
				return
			}
			// The connection's ACCEPTED left the I/O thread before its
			// handshake began: read it (and any since) before judging.
			h.readMonitor()
			if _, err := h.rep.SendMessage(h.answer(req)...); err != nil {
				h.log.Warn("zmq: zap reply failed", "err", err)
			}
		}
	}
}

// readMonitor applies every ROUTER monitor event waiting.
func (h *zapHandler) readMonitor() {
	for {
		ev, _, fd, err := h.mon.RecvEvent(zmq4.DONTWAIT)
		if err != nil {
			return
		}
		switch {
		case ev&zmq4.EVENT_ACCEPTED != 0:
			// The descriptor is open until its DISCONNECTED: a connection
			// that already ended (its DISCONNECTED waits behind) reads as
			// no host, or as the host of the next connection to take the
			// descriptor; either way its close balances it.
			h.conns.Open(fd, peerHost(fd))
		case ev&zmq4.EVENT_DISCONNECTED != 0:
			h.conns.Close(fd)
		}
		h.live.Store(int64(h.conns.Live()))
	}
}

// peerHost is the IP address a connected descriptor comes from, in the
// form hostKey gives ZAP's address; "" when it has none.
func peerHost(fd int) string {
	sa, err := syscall.Getpeername(fd)
	if err != nil {
		return ""
	}
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		return netip.AddrFrom4(a.Addr).String()
	case *syscall.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap().String()
	}
	return ""
}

// hostKey is the host of a ZAP request's address (libzmq's numeric IP,
// an IPv4 peer of an IPv6 socket as ::ffff:a.b.c.d, perhaps with a zone),
// in peerHost's form.
func hostKey(address string) string {
	a, err := netip.ParseAddr(address)
	if err != nil {
		return address
	}
	return a.Unmap().WithZone("").String()
}

// answer builds the ZAP reply to one request: [version, request id,
// domain, address, identity, mechanism, credentials...] in, [version,
// request id, status, text, user id, metadata] out.
func (h *zapHandler) answer(req [][]byte) []any {
	if len(req) < 6 {
		h.refused.Add(1)
		id := ""
		if len(req) > 1 {
			id = string(req[1])
		}
		return []any{"1.0", id, "500", "malformed ZAP request", "", ""}
	}
	id, address, mechanism := string(req[1]), string(req[3]), string(req[5])
	deny := func(why string) []any {
		n := h.refused.Add(1)
		if n&(n-1) == 0 {
			h.log.Warn("zmq: control connection refused", "address", address, "mechanism", mechanism, "why", why, "refused_total", n)
		}
		return []any{"1.0", id, zapDenied, why, "", ""}
	}
	name := ""
	if h.peers.Enabled() {
		if mechanism != "CURVE" || len(req) != 7 || len(req[6]) != security.KeyLen {
			return deny("CURVE with a 32-byte client key required")
		}
		var key security.Key
		copy(key[:], req[6])
		var ok bool
		if name, ok = h.peers.NameOf(key); !ok {
			return deny("key " + key.String() + " is not an admitted peer")
		}
	} else if mechanism != "NULL" {
		return deny("mechanism " + mechanism + ": NULL expected (security off)")
	}
	host := hostKey(address)
	if !h.conns.Admit(host) {
		n := h.overCap.Add(1)
		why := fmt.Sprintf("host %s has %d control connections open (limit %d admitted), all hosts %d (limit %d admitted)",
			address, h.conns.Of(host), h.conns.PerHost, h.conns.Live(), h.conns.Total)
		if n&(n-1) == 0 {
			h.log.Warn("zmq: control connection refused: connection cap", "address", address, "why", why, "over_cap_total", n)
		}
		return []any{"1.0", id, zapOverCap, why, "", ""}
	}
	h.admitted.Add(1)
	return []any{"1.0", id, zapOK, "OK", name, ""}
}

// stop ends the goroutine and closes the handler's sockets.
func (h *zapHandler) stop() {
	h.once.Do(func() {
		_, _ = h.wakeOut.SendBytes([]byte{1}, zmq4.DONTWAIT)
		<-h.done
		h.closeSockets()
	})
}

func (h *zapHandler) closeSockets() {
	for _, s := range []*zmq4.Socket{h.rep, h.mon, h.wakeIn, h.wakeOut} {
		if s != nil {
			_ = s.Close()
		}
	}
}
