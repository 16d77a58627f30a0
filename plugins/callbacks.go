package plugins

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// Callbacks from a plugin's engine to the host. A transfer.WriteGuard and
// a transfer.PeerLossReporter callback are functions of the host; the
// plugin's engine calls them from its own goroutines. The host carries
// them over one bidirectional stream it opens (Engine.Callbacks) when it
// first installs either: the plugin sends a guard check (an id, the peer,
// the destination) and waits for the host's answer; it sends a lost peer
// and does not wait. One check costs one message each way on an open
// HTTP/2 stream, and the tcp engine asks once per incoming frame (the
// range the guard allows covers the frame's segments). A check that gets
// no answer (the stream ended, the host is gone, CallTimeout passed) is
// refused: the write fails with ErrForbidden, it never lands.
//
// The same stream lends the host's transfer.Authenticator to an engine
// that declared transfer.Authenticating: the install says so and carries
// the agent's public key, and the engine's handshakes ask the host for
// each DH product with the agent's private key and for the admitted set's
// answers (AuthQuery). The private key never leaves the host. A query
// that gets no answer fails: the handshake fails, no connection is
// admitted.

// hostCallbacks is the host end of an engine's Callbacks stream. Its
// goroutine (run) answers guard checks with the installed guard and hands
// lost peers to the installed callback.
type hostCallbacks struct {
	c   *Client
	rpc pb.EngineClient

	guard atomic.Pointer[transfer.WriteGuard]
	lost  atomic.Pointer[func(peer string)]
	auth  atomic.Pointer[authBox]

	mu     sync.Mutex // serializes installs; guards the fields below
	stream pb.Engine_CallbacksClient
	cancel context.CancelFunc
	acks   chan struct{}
	done   chan struct{}
	sendMu sync.Mutex // one sender at a time on stream
}

// setGuard installs g (nil removes it) in the plugin's engine.
func (h *hostCallbacks) setGuard(g transfer.WriteGuard) {
	if g == nil {
		h.guard.Store(nil)
	} else {
		h.guard.Store(&g)
	}
	h.install()
}

// setLost installs fn (nil removes it) as the engine's peer-loss callback.
func (h *hostCallbacks) setLost(fn func(peer string)) {
	if fn == nil {
		h.lost.Store(nil)
	} else {
		h.lost.Store(&fn)
	}
	h.install()
}

// setAuth lends a (nil takes it back) to the plugin's engine.
func (h *hostCallbacks) setAuth(a transfer.Authenticator) {
	if a == nil {
		h.auth.Store(nil)
	} else {
		h.auth.Store(&authBox{a})
	}
	h.install()
}

// authBox holds an Authenticator in an atomic.Pointer.
type authBox struct{ a transfer.Authenticator }

// install opens the stream unless it is open and tells the plugin which
// callbacks are set, waiting (CallTimeout) for its ack, so that a guard
// is in force in the plugin once SetWriteGuard returns. SetWriteGuard has
// no error to return, so a failure fails closed: when a guard was asked
// for, the plugin process is killed (its engine could otherwise land
// writes no guard checked; a supervised engine restarts and installs the
// guard again), and the failure is logged.
func (h *hostCallbacks) install() {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.installLocked()
	if err == nil {
		return
	}
	if (h.guard.Load() != nil || h.auth.Load() != nil) && !h.c.gone() {
		h.c.log.Error("plugin engine's write guard or authenticator not installed: killing the plugin so that no unguarded or unauthenticated write lands", "plugin", h.c.name, "err", err)
		h.c.kill()
		return
	}
	h.c.log.Error("plugin engine callbacks not installed", "plugin", h.c.name, "err", err)
}

func (h *hostCallbacks) installLocked() error {
	if h.c.closed() {
		return fmt.Errorf("plugin %s: install callbacks: %w", h.c.name, transfer.ErrClosed)
	}
	if h.stream == nil {
		cx, cancel := context.WithCancel(context.Background())
		st, err := h.rpc.Callbacks(cx)
		if err != nil {
			cancel()
			return h.c.rpcErr("open callbacks", err)
		}
		h.stream, h.cancel = st, cancel
		h.acks, h.done = make(chan struct{}, 1), make(chan struct{})
		go h.run(st, h.acks, h.done)
	}
	select { // an ack of an earlier install that timed out is not this one's
	case <-h.acks:
	default:
	}
	h.sendMu.Lock()
	err := h.stream.Send(h.installMessage())
	h.sendMu.Unlock()
	if err != nil {
		return h.c.rpcErr("install callbacks", err)
	}
	t := time.NewTimer(CallTimeout)
	defer t.Stop()
	select {
	case <-h.acks:
		return nil
	case <-h.done:
		return fmt.Errorf("plugin %s: install callbacks: the stream ended: %w", h.c.name, transfer.ErrPeerLost)
	case <-t.C:
		return fmt.Errorf("plugin %s: install callbacks: no ack within %v: %w", h.c.name, CallTimeout, transfer.ErrTimeout)
	}
}

// installMessage says which callbacks are set; a lent authenticator
// crosses as its public key alone.
func (h *hostCallbacks) installMessage() *pb.HostCallback {
	in := &pb.HostCallback{Guard: h.guard.Load() != nil, PeerLost: h.lost.Load() != nil}
	if b := h.auth.Load(); b != nil {
		pub := b.a.PublicKey()
		in.Auth, in.PublicKey = true, pub[:]
	}
	return in
}

// run reads the stream until it ends.
func (h *hostCallbacks) run(st pb.Engine_CallbacksClient, acks, done chan struct{}) {
	defer close(done)
	for {
		m, err := st.Recv()
		if err != nil {
			return
		}
		switch {
		case m.GetAck():
			select {
			case acks <- struct{}{}:
			default:
			}
		case m.GetId() != 0:
			var rep *pb.HostCallback
			if m.GetAuth() != nil {
				rep = h.answerAuth(m)
			} else {
				rep = h.check(m)
			}
			h.sendMu.Lock()
			err := st.Send(rep)
			h.sendMu.Unlock()
			if err != nil {
				return
			}
		case len(m.GetPeer()) > 0:
			if fn := h.lost.Load(); fn != nil {
				(*fn)(string(m.GetPeer()))
			}
		}
	}
}

// check answers one guard check with the installed guard; none installed
// (removed while the check was on its way) refuses.
func (h *hostCallbacks) check(m *pb.PluginCallback) *pb.HostCallback {
	g := h.guard.Load()
	if g == nil {
		return &pb.HostCallback{Id: m.GetId(), Error: toProtoError(fmt.Errorf("the host has no write guard installed: %w", transfer.ErrForbidden))}
	}
	a, err := (*g)(string(m.GetPeer()), fromProtoDesc(m.GetDst()))
	return &pb.HostCallback{Id: m.GetId(), Allowed: toProtoDesc(a), Error: toProtoError(err)}
}

// answerAuth answers one AuthQuery with the lent authenticator; none lent
// (taken back while the query was on its way) fails it.
func (h *hostCallbacks) answerAuth(m *pb.PluginCallback) *pb.HostCallback {
	rep := &pb.HostCallback{Id: m.GetId()}
	b := h.auth.Load()
	if b == nil {
		rep.Error = toProtoError(fmt.Errorf("the host lends no authenticator: %w", transfer.ErrForbidden))
		return rep
	}
	q := m.GetAuth()
	arg := q.GetArg()
	switch q.GetOp() {
	case pb.AuthQuery_OP_DH:
		if len(arg) != 32 {
			rep.Error = toProtoError(fmt.Errorf("DH with a public key of %d bytes, want 32: %w", len(arg), transfer.ErrForbidden))
			break
		}
		out, err := b.a.DH([32]byte(arg))
		if err != nil {
			rep.Error = toProtoError(fmt.Errorf("%w: %w", transfer.ErrForbidden, err))
			break
		}
		rep.AuthResult, rep.AuthFound = out[:], true
	case pb.AuthQuery_OP_KEY_OF:
		if k, ok := b.a.KeyOf(string(arg)); ok {
			rep.AuthResult, rep.AuthFound = k[:], true
		}
	case pb.AuthQuery_OP_NAME_OF:
		if len(arg) == 32 {
			if n, ok := b.a.NameOf([32]byte(arg)); ok {
				rep.AuthResult, rep.AuthFound = []byte(n), true
			}
		}
	default:
		rep.Error = toProtoError(fmt.Errorf("unknown authenticator query %v: %w", q.GetOp(), transfer.ErrUnsupported))
	}
	return rep
}

// stop ends the stream and waits for run to return.
func (h *hostCallbacks) stop() {
	h.mu.Lock()
	cancel, done := h.cancel, h.done
	h.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// pluginCallbacks is the plugin end of the Callbacks stream: the engine's
// guard sends its checks on it and waits for the host's answers; lost
// peers are sent without waiting. The stream's handler (Callbacks) reads
// the answers.
type pluginCallbacks struct {
	stream pb.Engine_CallbacksServer
	sendMu sync.Mutex // one sender at a time on stream; guards ended
	ended  bool       // the handler is returning: the stream takes no more sends

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan *pb.HostCallback
	dead    error // why checks are refused; set once the stream ended
}

func newPluginCallbacks(st pb.Engine_CallbacksServer) *pluginCallbacks {
	return &pluginCallbacks{stream: st, pending: map[uint64]chan *pb.HostCallback{}}
}

func (p *pluginCallbacks) send(m *pb.PluginCallback) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.ended {
		return errors.New("the host's callback stream ended")
	}
	return p.stream.Send(m)
}

// check is the transfer.WriteGuard installed in the plugin's engine: it
// asks the host's guard. No answer refuses the write.
func (p *pluginCallbacks) check(peer string, dst transfer.Desc) (transfer.Desc, error) {
	refuse := func(why error) (transfer.Desc, error) {
		return transfer.Desc{}, fmt.Errorf("plugin: write guard: asking the host about [%#x+%d] from %q: %v: %w", dst.Addr, dst.Len, peer, why, transfer.ErrForbidden)
	}
	m, err := p.ask(&pb.PluginCallback{Peer: []byte(peer), Dst: toProtoDesc(dst)})
	if err != nil {
		return refuse(err)
	}
	if err := fromProtoError(m.GetError()); err != nil {
		if !errors.Is(err, transfer.ErrForbidden) {
			err = fmt.Errorf("%w: %w", transfer.ErrForbidden, err)
		}
		return transfer.Desc{}, err
	}
	return fromProtoDesc(m.GetAllowed()), nil
}

// ask sends the check m under a fresh id and waits (CallTimeout) for the
// host's answer; an error says why none came.
func (p *pluginCallbacks) ask(m *pb.PluginCallback) (*pb.HostCallback, error) {
	ch := make(chan *pb.HostCallback, 1)
	p.mu.Lock()
	if p.dead != nil {
		p.mu.Unlock()
		return nil, p.dead
	}
	p.next++
	id := p.next
	p.pending[id] = ch
	p.mu.Unlock()
	m.Id = id
	if err := p.send(m); err != nil {
		p.forget(id)
		return nil, err
	}
	t := time.NewTimer(CallTimeout)
	defer t.Stop()
	select {
	case rep := <-ch:
		if rep == nil {
			p.mu.Lock()
			err := p.dead
			p.mu.Unlock()
			return nil, err
		}
		return rep, nil
	case <-t.C:
		p.forget(id)
		return nil, fmt.Errorf("no answer within %v", CallTimeout)
	}
}

// hostAuthenticator is the transfer.Authenticator lent to the plugin's
// engine: each answer is the host's, asked over the stream. No answer
// fails closed: DH fails, KeyOf and NameOf find nothing.
type hostAuthenticator struct {
	cb  *pluginCallbacks
	pub [32]byte
}

func (a hostAuthenticator) PublicKey() [32]byte { return a.pub }

func (a hostAuthenticator) query(op pb.AuthQuery_Op, arg []byte) ([]byte, bool, error) {
	m, err := a.cb.ask(&pb.PluginCallback{Auth: &pb.AuthQuery{Op: op, Arg: arg}})
	if err != nil {
		return nil, false, fmt.Errorf("plugin: authenticator: asking the host: %v: %w", err, transfer.ErrForbidden)
	}
	if err := fromProtoError(m.GetError()); err != nil {
		return nil, false, fmt.Errorf("plugin: authenticator: %w", err)
	}
	return m.GetAuthResult(), m.GetAuthFound(), nil
}

// DH asks the host for the product of the agent's private key and pub.
func (a hostAuthenticator) DH(pub [32]byte) ([32]byte, error) {
	r, ok, err := a.query(pb.AuthQuery_OP_DH, pub[:])
	if err == nil && (!ok || len(r) != 32) {
		err = fmt.Errorf("plugin: authenticator: the host's DH answer has %d bytes: %w", len(r), transfer.ErrForbidden)
	}
	if err != nil {
		return [32]byte{}, err
	}
	return [32]byte(r), nil
}

// KeyOf asks the host for the key of the admitted peer.
func (a hostAuthenticator) KeyOf(peer string) ([32]byte, bool) {
	r, ok, err := a.query(pb.AuthQuery_OP_KEY_OF, []byte(peer))
	if err != nil || !ok || len(r) != 32 {
		return [32]byte{}, false
	}
	return [32]byte(r), true
}

// NameOf asks the host for the admitted peer that owns key.
func (a hostAuthenticator) NameOf(key [32]byte) (string, bool) {
	r, ok, err := a.query(pb.AuthQuery_OP_NAME_OF, key[:])
	if err != nil || !ok || len(r) == 0 {
		return "", false
	}
	return string(r), true
}

func (p *pluginCallbacks) forget(id uint64) {
	p.mu.Lock()
	delete(p.pending, id)
	p.mu.Unlock()
}

// answer hands the host's answer to the check waiting for it.
func (p *pluginCallbacks) answer(m *pb.HostCallback) {
	p.mu.Lock()
	ch := p.pending[m.GetId()]
	delete(p.pending, m.GetId())
	p.mu.Unlock()
	if ch != nil {
		ch <- m
	}
}

// lostPeer is the transfer.PeerLossReporter callback installed in the
// plugin's engine. It must not block, so it sends on its own goroutine.
func (p *pluginCallbacks) lostPeer(peer string) {
	go func() { _ = p.send(&pb.PluginCallback{Peer: []byte(peer)}) }()
}

// fail refuses every waiting and later check: the stream ended. It runs
// before the stream's handler returns, and no send starts after it (gRPC
// forbids sending on a stream whose handler has returned).
func (p *pluginCallbacks) fail(why error) {
	p.sendMu.Lock()
	p.ended = true
	p.sendMu.Unlock()
	p.mu.Lock()
	p.dead = why
	pending := p.pending
	p.pending = map[uint64]chan *pb.HostCallback{}
	p.mu.Unlock()
	for _, ch := range pending {
		ch <- nil
	}
}

// Callbacks serves the host's callback stream: installs tell the engine
// which callbacks to call (and are acked), answers go to the checks
// waiting for them. The guard stays installed after the stream ends and
// refuses every write from then on.
func (s *engineServer) Callbacks(st pb.Engine_CallbacksServer) error {
	if err := s.owned("Callbacks"); err != nil {
		return err
	}
	e, err := s.engine()
	if err != nil {
		return err
	}
	cb := newPluginCallbacks(st)
	defer cb.fail(errors.New("the host's callback stream ended"))
	var lent []byte // the public key of the authenticator lent, nil for none
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if m.GetId() != 0 {
			cb.answer(m)
			continue
		}
		if g, ok := e.(transfer.WriteGuarded); ok {
			if m.GetGuard() {
				g.SetWriteGuard(cb.check)
			} else {
				g.SetWriteGuard(nil)
			}
		}
		if a, ok := e.(transfer.Authenticating); ok {
			// Installs repeat the whole state: lend only a change, since
			// lending closes the engine's incoming connections.
			switch pub := m.GetPublicKey(); {
			case m.GetAuth() && len(pub) != 32:
				return fmt.Errorf("plugin: callbacks: an authenticator with a public key of %d bytes", len(pub))
			case m.GetAuth() && !bytes.Equal(pub, lent):
				a.SetAuthenticator(hostAuthenticator{cb: cb, pub: [32]byte(pub)})
				lent = pub
			case !m.GetAuth() && lent != nil:
				a.SetAuthenticator(nil)
				lent = nil
			}
		}
		if r, ok := e.(transfer.PeerLossReporter); ok {
			if m.GetPeerLost() {
				r.SetPeerLost(cb.lostPeer)
			} else {
				r.SetPeerLost(nil)
			}
		}
		if err := cb.send(&pb.PluginCallback{Ack: true}); err != nil {
			return nil
		}
	}
}
