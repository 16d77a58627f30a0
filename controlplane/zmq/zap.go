package zmq

import (
	"fmt"
	"log/slog"
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

// zapDomain is the ZAP domain of the channel's ROUTER.
const zapDomain = "bounce"

// zapWakeEndpoint wakes the handler for Close.
const zapWakeEndpoint = "inproc://bounce-zap-wake"

// zapHandler answers libzmq's ZAP requests for one channel on its own
// goroutine: a CURVE client is admitted only when its public key belongs to
// an admitted peer, and the connection's User-Id is set to that peer's
// agent name, which the channel then reports as Message.Peer.
type zapHandler struct {
	peers   *security.Peers
	log     *slog.Logger
	rep     *zmq4.Socket
	wakeIn  *zmq4.Socket
	wakeOut *zmq4.Socket
	done    chan struct{}
	once    sync.Once

	admitted, refused atomic.Uint64
}

// startZAP binds the handler in zctx and starts it. It must run before any
// socket of zctx with a ZAP domain binds or connects.
func startZAP(zctx *zmq4.Context, peers *security.Peers, log *slog.Logger) (*zapHandler, error) {
	h := &zapHandler{peers: peers, log: log, done: make(chan struct{})}
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
	go h.run()
	return h, nil
}

func (h *zapHandler) run() {
	defer close(h.done)
	poller := zmq4.NewPoller()
	poller.Add(h.rep, zmq4.POLLIN)
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
		req, err := h.rep.RecvMessageBytes(zmq4.DONTWAIT)
		if err != nil {
			if isEAGAIN(err) {
				continue
			}
			return
		}
		if _, err := h.rep.SendMessage(h.answer(req)...); err != nil {
			h.log.Warn("zmq: zap reply failed", "err", err)
		}
	}
}

// answer builds the ZAP reply to one request: [version, request id,
// mechanism, address, ...] in, [version, request id, status, text, user id,
// metadata] out.
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
		return []any{"1.0", id, "400", why, "", ""}
	}
	if mechanism != "CURVE" || len(req) != 7 || len(req[6]) != security.KeyLen {
		return deny("CURVE with a 32-byte client key required")
	}
	var key security.Key
	copy(key[:], req[6])
	name, ok := h.peers.NameOf(key)
	if !ok {
		return deny("key " + key.String() + " is not an admitted peer")
	}
	h.admitted.Add(1)
	return []any{"1.0", id, "200", "OK", name, ""}
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
	for _, s := range []*zmq4.Socket{h.rep, h.wakeIn, h.wakeOut} {
		if s != nil {
			_ = s.Close()
		}
	}
}
