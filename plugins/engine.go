package plugins

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// opener is a plugin service that opens one instance.
type opener interface {
	Open(ctx context.Context, in *pb.OpenRequest, opts ...grpc.CallOption) (*pb.OpenReply, error)
}

// open claims c for kind, takes its gRPC client of type C and opens the
// instance named name; on any failure it ends the plugin process.
func open[C opener](c *Client, kind, what, name string, opts map[string]string) (C, *pb.OpenReply, error) {
	var zero C
	if err := c.claim(kind); err != nil {
		return zero, nil, err
	}
	rpc, ok := c.raw.(C)
	if !ok {
		c.Close()
		return zero, nil, fmt.Errorf("plugin %s: no %s client (got %T)", c.name, what, c.raw)
	}
	cx, cancel := ctx(CallTimeout)
	defer cancel()
	rep, err := rpc.Open(cx, &pb.OpenRequest{Name: []byte(name), Options: opts})
	if err == nil {
		err = fromProtoError(rep.GetError())
	} else {
		err = c.rpcErr("open "+what, err)
	}
	if err != nil {
		c.Close()
		return zero, nil, fmt.Errorf("plugin %s: open %s %q: %w", c.name, what, name, err)
	}
	return rpc, rep, nil
}

// call makes one unary call of an open instance (what names it in errors)
// within CallTimeout, mapping a transport failure and the reply's error to
// errors that wrap transfer's sentinels.
func call[R interface{ GetError() *pb.Error }](c *Client, noun, what string, f func(context.Context) (R, error)) error {
	return callIn(context.Background(), c, noun, what, f)
}

// callIn is call with a parent context: its values (the trace span) travel
// with the call, its cancellation does not.
func callIn[R interface{ GetError() *pb.Error }](parent context.Context, c *Client, noun, what string, f func(context.Context) (R, error)) error {
	if c.closed() {
		return fmt.Errorf("plugin %s: %s: %s closed: %w", c.name, what, noun, transfer.ErrClosed)
	}
	cx, cancel := context.WithTimeout(context.WithoutCancel(parent), CallTimeout)
	defer cancel()
	rep, err := f(cx)
	if err != nil {
		return c.rpcErr(what, err)
	}
	if rerr := fromProtoError(rep.GetError()); rerr != nil {
		return fmt.Errorf("plugin %s: %s: %w", c.name, what, rerr)
	}
	return nil
}

// closeRemote closes an open instance in the plugin (unless the process is
// already gone) and then the Client, which ends the process.
func closeRemote(c *Client, noun string, rpcClose func(context.Context, *pb.Empty, ...grpc.CallOption) (*pb.Reply, error)) error {
	if c.closed() {
		return nil
	}
	var err error
	if !c.gone() {
		err = call(c, noun, "close "+noun, func(cx context.Context) (*pb.Reply, error) { return rpcClose(cx, &pb.Empty{}) })
		if errors.Is(err, transfer.ErrPeerLost) {
			err = nil // the process is gone: closed either way
		}
	}
	c.Close()
	return err
}

// Engine opens the plugin's engine named name with opts. The engine owns
// the Client: closing it ends the plugin process. It implements
// transfer.Notifier when the plugin's engine does.
func (c *Client) Engine(name string, opts map[string]string) (transfer.Engine, error) {
	rpc, rep, err := open[pb.EngineClient](c, KindEngine, "engine", name, opts)
	if err != nil {
		return nil, err
	}
	return newRemoteEngine(c, rpc, rep).declared(), nil
}

func newRemoteEngine(c *Client, rpc pb.EngineClient, rep *pb.OpenReply) *remoteEngine {
	return &remoteEngine{c: c, rpc: rpc, name: string(rep.GetName()), caps: capsFrom(rep), cb: &hostCallbacks{c: c, rpc: rpc}}
}

// remoteEngine is a transfer.Engine in a plugin process.
type remoteEngine struct {
	c    *Client
	rpc  pb.EngineClient
	name string
	caps caps
	hs   handles
	cb   *hostCallbacks
	wake recvWake // of RecvNotification
}

// declared returns e as the engine type that implements exactly the
// optional capabilities the plugin's engine declared.
func (e *remoteEngine) declared() transfer.Engine { return declare(e) }

// capabilities returns what the plugin's engine declared.
func (e *remoteEngine) capabilities() caps { return e.caps }

// RouteCosts returns the costs the plugin's engine declared for route
// auto; zero costs (it declared none) are invalid, so route auto assumes
// its defaults, as for an in-process engine that declares none.
func (e *remoteEngine) RouteCosts() (postPerDesc, perWrite time.Duration, bandwidth float64) {
	return e.caps.postPerDesc, e.caps.perWrite, e.caps.bandwidth
}

func (e *remoteEngine) call(what string, f func(context.Context) (interface{ GetError() *pb.Error }, error)) error {
	return call(e.c, "engine", what, f)
}

// Name returns the plugin engine's name.
func (e *remoteEngine) Name() string { return e.name }

// RegisterMemory shares d's memfd with the plugin, which maps it at the
// same address and registers it with its engine.
func (e *remoteEngine) RegisterMemory(d transfer.Desc) error {
	share, err := shareOf(d)
	if err != nil {
		return fmt.Errorf("plugin: register %v: %w", d, err)
	}
	return e.call(fmt.Sprintf("register %v", d), func(cx context.Context) (interface{ GetError() *pb.Error }, error) {
		return e.rpc.RegisterMemory(cx, &pb.RegisterRequest{Desc: toProtoDesc(d), Share: share})
	})
}

// DeregisterMemory deregisters d in the plugin, which then unmaps it.
func (e *remoteEngine) DeregisterMemory(d transfer.Desc) error {
	return e.call(fmt.Sprintf("deregister %v", d), func(cx context.Context) (interface{ GetError() *pb.Error }, error) {
		return e.rpc.DeregisterMemory(cx, &pb.DescRequest{Desc: toProtoDesc(d)})
	})
}

// Metadata returns the plugin engine's metadata.
func (e *remoteEngine) Metadata() ([]byte, error) {
	var rep *pb.BytesReply
	err := e.call("metadata", func(cx context.Context) (_ interface{ GetError() *pb.Error }, err error) {
		rep, err = e.rpc.Metadata(cx, &pb.Empty{})
		return rep, err
	})
	if err != nil {
		return nil, err
	}
	return rep.GetData(), nil
}

// LoadPeer loads a peer's metadata into the plugin engine.
func (e *remoteEngine) LoadPeer(md []byte) (string, error) {
	var rep *pb.PeerReply
	err := e.call("load peer", func(cx context.Context) (_ interface{ GetError() *pb.Error }, err error) {
		rep, err = e.rpc.LoadPeer(cx, &pb.BytesRequest{Data: md})
		return rep, err
	})
	if err != nil {
		return "", err
	}
	return string(rep.GetPeer()), nil
}

// ForgetPeer forgets peer in the plugin engine.
func (e *remoteEngine) ForgetPeer(peer string) error {
	return e.call(fmt.Sprintf("forget peer %q", peer), func(cx context.Context) (interface{ GetError() *pb.Error }, error) {
		return e.rpc.ForgetPeer(cx, &pb.PeerRequest{Peer: []byte(peer)})
	})
}

// PostWrite posts the writes in the plugin and returns the op by handle. A
// malformed reply (no handle, a handle already live) is an error wrapping
// ErrNotQuiescent: the plugin may have started a write the host cannot poll.
func (e *remoteEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	return e.PostWriteContext(context.Background(), peer, ops)
}

// PostWriteContext is PostWrite whose RPC carries ctx's trace context in
// its gRPC metadata, so the plugin's span of the post joins the trace.
func (e *remoteEngine) PostWriteContext(ctx context.Context, peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	what := fmt.Sprintf("post %d write(s) to %q", len(ops), peer)
	var rep *pb.HandleReply
	err := callIn(ctx, e.c, "engine", what, func(cx context.Context) (_ interface{ GetError() *pb.Error }, err error) {
		rep, err = e.rpc.PostWrite(cx, &pb.PostWriteRequest{Peer: []byte(peer), Ops: toProtoWrites(ops)})
		return rep, err
	})
	if err != nil {
		return nil, err
	}
	return started(e.c, &e.hs, e.rpc, what, rep.GetHandle(), nil)
}

// Close closes the plugin engine and ends the plugin process.
func (e *remoteEngine) Close() error {
	err := closeRemote(e.c, "engine", e.rpc.Close)
	e.cb.stop()
	return err
}

// notify sends a notification through the plugin engine.
func (e *remoteEngine) notify(peer string, payload []byte) error {
	return e.call(fmt.Sprintf("notify %q", peer), func(cx context.Context) (interface{ GetError() *pb.Error }, error) {
		return e.rpc.Notify(cx, &pb.MessageRequest{Peer: []byte(peer), Payload: payload})
	})
}

// recvNotification waits at most timeout in the plugin.
func (e *remoteEngine) recvNotification(timeout time.Duration) (transfer.Message, error) {
	return recvMessage(e.c, &e.wake, "receive notification", timeout, func(cx context.Context, req *pb.RecvRequest) (*pb.MessageReply, error) {
		return e.rpc.RecvNotification(cx, req)
	})
}

// WakeRecvNotification makes a RecvNotification in progress, or else the
// next one, return at once with ErrTimeout (transfer.NotificationWaker):
// it ends the host's call; the plugin's engine waits out its own timeout.
func (e *remoteEngine) WakeRecvNotification() { e.wake.wake() }

// Connect asks the plugin's engine to open its connection to peer
// (transfer.Connector) when it declared the capability. It does not block:
// the call runs on its own goroutine, and a failure fails nothing.
func (e *remoteEngine) Connect(peer string) {
	if !e.caps.connector || e.c.gone() {
		return
	}
	go func() {
		_ = e.call(fmt.Sprintf("connect %q", peer), func(cx context.Context) (interface{ GetError() *pb.Error }, error) {
			return e.rpc.Connect(cx, &pb.PeerRequest{Peer: []byte(peer)})
		})
	}()
}

// StallWrites stalls the plugin's engine's writes (transfer.WriteStaller,
// a test-only capability) when it declared the capability, and fails
// wrapping ErrUnsupported otherwise. release ends the stall in the plugin,
// within CallTimeout; a plugin gone or closed has ended it already.
func (e *remoteEngine) StallWrites() (release func(), err error) {
	if !e.caps.staller {
		return nil, fmt.Errorf("plugin %s: stall writes: the engine declares no transfer.WriteStaller: %w", e.c.name, transfer.ErrUnsupported)
	}
	var rep *pb.HandleReply
	err = e.call("stall writes", func(cx context.Context) (_ interface{ GetError() *pb.Error }, err error) {
		rep, err = e.rpc.StallWrites(cx, &pb.Empty{})
		return rep, err
	})
	if err != nil {
		return nil, err
	}
	id := rep.GetHandle()
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = e.call(fmt.Sprintf("release stall %d", id), func(cx context.Context) (interface{ GetError() *pb.Error }, error) {
				return e.rpc.ReleaseWrites(cx, &pb.HandleRequest{Handle: id})
			})
		})
	}, nil
}

// SetAuthenticator lends a to the plugin's engine over the callback
// stream when it declared transfer.Authenticating, so it names its peers
// by their keys; the keys stay here (see callbacks.go). An engine that did
// not declare it keeps naming peers by what they claim: that is logged.
func (e *remoteEngine) SetAuthenticator(a transfer.Authenticator) {
	if !e.caps.authenticating {
		if a != nil {
			e.c.log.Warn("plugin engine does not authenticate its peers with the agent's keys: the peer names its write guard checks are what peers claim", "plugin", e.c.name)
		}
		return
	}
	e.cb.setAuth(a)
}

// FenceWrites asks the plugin's engine, when it declared
// transfer.WriteFencer, to fence the writes still landing in d, and
// returns once it answered. A fence that cannot be confirmed (no answer
// within CallTimeout, a failed call) fails closed: the plugin process is
// killed, so no write of it lands after. A process gone lands nothing.
func (e *remoteEngine) FenceWrites(d transfer.Desc) {
	if !e.caps.fencesW || e.c.gone() {
		return
	}
	err := e.call(fmt.Sprintf("fence writes into %v", d), func(cx context.Context) (interface{ GetError() *pb.Error }, error) {
		return e.rpc.FenceWrites(cx, &pb.DescRequest{Desc: toProtoDesc(d)})
	})
	if err != nil && !e.c.gone() {
		e.c.log.Error("plugin engine's write fence not confirmed: killing the plugin so that no write lands after its authorization ended", "plugin", e.c.name, "range", d, "err", err)
		e.c.kill()
	}
}

// setWriteGuard installs g in the plugin's engine over the callback
// stream (see callbacks.go).
func (e *remoteEngine) setWriteGuard(g transfer.WriteGuard) { e.cb.setGuard(g) }

// setPeerLost installs fn as the plugin engine's peer-loss callback.
func (e *remoteEngine) setPeerLost(fn func(peer string)) { e.cb.setLost(fn) }

// Current returns the Client of the engine's process, nil once it is
// gone: an engine opened on a bare Client is never restarted.
func (e *remoteEngine) Current() *Client {
	if e.c.gone() || e.c.closed() {
		return nil
	}
	return e.c
}

// Restarts returns 0: an engine opened on a bare Client is not restarted.
func (e *remoteEngine) Restarts() int { return 0 }

// recvWake lets a blocking receive be ended from another goroutine: wake
// cancels the receive in progress, or makes the next one return at once.
type recvWake struct {
	mu      sync.Mutex
	cancel  context.CancelFunc // of the receive in progress
	pending bool               // woken with none in progress
}

// begin starts a receive bounded by d; woken says it was woken before it
// began (it must return at once). end releases it.
func (w *recvWake) begin(d time.Duration) (cx context.Context, end func(), woken bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending {
		w.pending = false
		return nil, func() {}, true
	}
	cx, cancel := ctx(d)
	w.cancel = cancel
	return cx, func() {
		w.mu.Lock()
		w.cancel = nil
		w.mu.Unlock()
		cancel()
	}, false
}

func (w *recvWake) wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		w.cancel()
		w.cancel = nil
		return
	}
	w.pending = true
}

// recvMessage is a bounded blocking receive over gRPC that w can end
// early (ErrTimeout).
func recvMessage(c *Client, w *recvWake, what string, timeout time.Duration, f func(context.Context, *pb.RecvRequest) (*pb.MessageReply, error)) (transfer.Message, error) {
	if c.closed() {
		return transfer.Message{}, fmt.Errorf("plugin %s: %s: %w", c.name, what, transfer.ErrClosed)
	}
	timeout = max(timeout, 0)
	cx, end, woken := w.begin(timeout + waitSlack)
	defer end()
	if woken {
		return transfer.Message{}, fmt.Errorf("plugin %s: %s: woken: %w", c.name, what, transfer.ErrTimeout)
	}
	rep, err := f(cx, &pb.RecvRequest{TimeoutNs: int64(timeout)})
	if err != nil {
		if errors.Is(cx.Err(), context.Canceled) && !c.gone() {
			return transfer.Message{}, fmt.Errorf("plugin %s: %s: woken: %w", c.name, what, transfer.ErrTimeout)
		}
		if c.gone() {
			return transfer.Message{}, fmt.Errorf("plugin %s: %s: %w", c.name, what, transfer.ErrClosed)
		}
		return transfer.Message{}, c.rpcErr(what, err)
	}
	if rerr := fromProtoError(rep.GetError()); rerr != nil {
		return transfer.Message{}, fmt.Errorf("plugin %s: %s: %w", c.name, what, rerr)
	}
	return transfer.Message{Peer: string(rep.GetPeer()), Payload: rep.GetPayload(), From: string(rep.GetFrom())}, nil
}

// engineServer is the plugin side of the Engine service.
type engineServer struct {
	pb.UnimplementedEngineServer
	open func(name string, opts map[string]string) (transfer.Engine, error)
	maps *mapper
	// lent marks the host's own engine served back to a writer plugin:
	// the host alone registers memory, loads peers and closes it.
	lent bool

	mu     sync.Mutex
	eng    transfer.Engine
	closed bool
	shares map[transfer.Desc][]*pb.Share
	ops    opTable
	// stalls are the engine's stalls the host holds
	// (transfer.WriteStaller), by the handle StallWrites returned.
	stalls    map[uint64]func()
	lastStall uint64
}

func (s *engineServer) engine() (transfer.Engine, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.eng == nil || s.closed {
		return nil, fmt.Errorf("plugin: engine not open: %w", transfer.ErrClosed)
	}
	return s.eng, nil
}

func reply(err error) *pb.Reply { return &pb.Reply{Error: toProtoError(err)} }

// lendEngine serves the host's engine e to a writer plugin.
func lendEngine(e transfer.Engine) *engineServer { return &engineServer{eng: e, lent: true} }

// owned refuses what only the owner of a lent engine may do.
func (s *engineServer) owned(what string) error {
	if s.lent {
		return fmt.Errorf("plugin: %s: the host owns its engine; a writer plugin may only post writes, notify and read metadata: %w", what, transfer.ErrUnsupported)
	}
	return nil
}

func (s *engineServer) Open(_ context.Context, r *pb.OpenRequest) (*pb.OpenReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lent { // describe the lent engine; its callbacks stay the host's
		rep := describe(s.eng)
		rep.Caps.WriteGuarded, rep.Caps.PeerLoss, rep.Caps.WriteStaller = false, false, false
		return rep, nil
	}
	if s.eng != nil || s.closed {
		return &pb.OpenReply{Error: toProtoError(errors.New("plugin: this process already opened its engine"))}, nil
	}
	e, err := s.open(string(r.GetName()), r.GetOptions())
	if err != nil {
		return &pb.OpenReply{Error: toProtoError(err)}, nil
	}
	s.eng, s.shares = e, map[transfer.Desc][]*pb.Share{}
	return describe(e), nil
}

func (s *engineServer) RegisterMemory(_ context.Context, r *pb.RegisterRequest) (*pb.Reply, error) {
	if err := s.owned("RegisterMemory"); err != nil {
		return reply(err), nil
	}
	e, err := s.engine()
	if err != nil {
		return reply(err), nil
	}
	d := fromProtoDesc(r.GetDesc())
	if err := s.maps.Map(d, r.GetShare()); err != nil {
		return reply(err), nil
	}
	if err := e.RegisterMemory(d); err != nil {
		s.maps.Unmap(d, r.GetShare())
		return reply(err), nil
	}
	s.mu.Lock()
	s.shares[d] = append(s.shares[d], r.GetShare())
	s.mu.Unlock()
	return &pb.Reply{}, nil
}

func (s *engineServer) DeregisterMemory(_ context.Context, r *pb.DescRequest) (*pb.Reply, error) {
	if err := s.owned("DeregisterMemory"); err != nil {
		return reply(err), nil
	}
	e, err := s.engine()
	if err != nil {
		return reply(err), nil
	}
	d := fromProtoDesc(r.GetDesc())
	if err := e.DeregisterMemory(d); err != nil {
		return reply(err), nil
	}
	s.mu.Lock()
	list := s.shares[d]
	if len(list) > 0 {
		// The engine forgot d: unmap every registration of it.
		delete(s.shares, d)
	}
	s.mu.Unlock()
	for _, sh := range list {
		s.maps.Unmap(d, sh)
	}
	return &pb.Reply{}, nil
}

func (s *engineServer) Metadata(context.Context, *pb.Empty) (*pb.BytesReply, error) {
	e, err := s.engine()
	if err != nil {
		return &pb.BytesReply{Error: toProtoError(err)}, nil
	}
	md, err := e.Metadata()
	return &pb.BytesReply{Data: md, Error: toProtoError(err)}, nil
}

func (s *engineServer) LoadPeer(_ context.Context, r *pb.BytesRequest) (*pb.PeerReply, error) {
	if err := s.owned("LoadPeer"); err != nil {
		return &pb.PeerReply{Error: toProtoError(err)}, nil
	}
	e, err := s.engine()
	if err != nil {
		return &pb.PeerReply{Error: toProtoError(err)}, nil
	}
	p, err := e.LoadPeer(r.GetData())
	return &pb.PeerReply{Peer: []byte(p), Error: toProtoError(err)}, nil
}

func (s *engineServer) ForgetPeer(_ context.Context, r *pb.PeerRequest) (*pb.Reply, error) {
	if err := s.owned("ForgetPeer"); err != nil {
		return reply(err), nil
	}
	e, err := s.engine()
	if err != nil {
		return reply(err), nil
	}
	return reply(e.ForgetPeer(string(r.GetPeer()))), nil
}

func (s *engineServer) PostWrite(_ context.Context, r *pb.PostWriteRequest) (*pb.HandleReply, error) {
	e, err := s.engine()
	if err != nil {
		return &pb.HandleReply{Error: toProtoError(err)}, nil
	}
	return s.ops.posted(e.PostWrite(string(r.GetPeer()), fromProtoWrites(r.GetOps()))), nil
}

func (s *engineServer) Poll(_ context.Context, r *pb.HandleRequest) (*pb.PollReply, error) {
	return s.ops.poll(r.GetHandle()), nil
}

func (s *engineServer) Wait(cx context.Context, r *pb.WaitRequest) (*pb.PollReply, error) {
	return s.ops.wait(cx, r.GetHandle(), time.Duration(r.GetTimeoutNs())), nil
}

func (s *engineServer) Release(_ context.Context, r *pb.HandleRequest) (*pb.Reply, error) {
	return s.ops.release(r.GetHandle()), nil
}

func (s *engineServer) Notify(_ context.Context, r *pb.MessageRequest) (*pb.Reply, error) {
	e, err := s.engine()
	if err != nil {
		return reply(err), nil
	}
	n, ok := e.(transfer.Notifier)
	if !ok {
		return reply(fmt.Errorf("plugin: engine has no notifications: %w", transfer.ErrUnsupported)), nil
	}
	return reply(n.Notify(string(r.GetPeer()), r.GetPayload())), nil
}

func (s *engineServer) RecvNotification(_ context.Context, r *pb.RecvRequest) (*pb.MessageReply, error) {
	e, err := s.engine()
	if err != nil {
		return &pb.MessageReply{Error: toProtoError(err)}, nil
	}
	n, ok := e.(transfer.Notifier)
	if !ok {
		return &pb.MessageReply{Error: toProtoError(fmt.Errorf("plugin: engine has no notifications: %w", transfer.ErrUnsupported))}, nil
	}
	m, err := n.RecvNotification(time.Duration(r.GetTimeoutNs()))
	return &pb.MessageReply{Peer: []byte(m.Peer), Payload: m.Payload, From: []byte(m.From), Error: toProtoError(err)}, nil
}

func (s *engineServer) Connect(_ context.Context, r *pb.PeerRequest) (*pb.Reply, error) {
	e, err := s.engine()
	if err != nil {
		return reply(err), nil
	}
	c, ok := e.(transfer.Connector)
	if !ok {
		return reply(fmt.Errorf("plugin: engine is no transfer.Connector: %w", transfer.ErrUnsupported)), nil
	}
	c.Connect(string(r.GetPeer()))
	return &pb.Reply{}, nil
}

// StallWrites stalls the engine's writes (transfer.WriteStaller) and
// answers the stall's handle for ReleaseWrites.
func (s *engineServer) StallWrites(context.Context, *pb.Empty) (*pb.HandleReply, error) {
	if err := s.owned("StallWrites"); err != nil {
		return &pb.HandleReply{Error: toProtoError(err)}, nil
	}
	e, err := s.engine()
	if err != nil {
		return &pb.HandleReply{Error: toProtoError(err)}, nil
	}
	st, ok := e.(transfer.WriteStaller)
	if !ok {
		return &pb.HandleReply{Error: toProtoError(fmt.Errorf("plugin: engine is no transfer.WriteStaller: %w", transfer.ErrUnsupported))}, nil
	}
	release, err := st.StallWrites()
	if err != nil {
		return &pb.HandleReply{Error: toProtoError(err)}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		release()
		return &pb.HandleReply{Error: toProtoError(fmt.Errorf("plugin: engine closed: %w", transfer.ErrClosed))}, nil
	}
	if s.stalls == nil {
		s.stalls = map[uint64]func(){}
	}
	s.lastStall++
	s.stalls[s.lastStall] = release
	return &pb.HandleReply{Handle: s.lastStall}, nil
}

// ReleaseWrites ends the stall StallWrites named; one already ended (or
// never made) is no error, so a release is idempotent.
func (s *engineServer) ReleaseWrites(_ context.Context, r *pb.HandleRequest) (*pb.Reply, error) {
	s.mu.Lock()
	release := s.stalls[r.GetHandle()]
	delete(s.stalls, r.GetHandle())
	s.mu.Unlock()
	if release != nil {
		release()
	}
	return &pb.Reply{}, nil
}

// FenceWrites serves transfer.WriteFencer: it answers once the engine's
// FenceWrites returned.
func (s *engineServer) FenceWrites(_ context.Context, r *pb.DescRequest) (*pb.Reply, error) {
	if err := s.owned("FenceWrites"); err != nil {
		return reply(err), nil
	}
	e, err := s.engine()
	if err != nil {
		return reply(err), nil
	}
	f, ok := e.(transfer.WriteFencer)
	if !ok {
		return reply(fmt.Errorf("plugin: engine is no transfer.WriteFencer: %w", transfer.ErrUnsupported)), nil
	}
	f.FenceWrites(fromProtoDesc(r.GetDesc()))
	return &pb.Reply{}, nil
}

func (s *engineServer) Close(context.Context, *pb.Empty) (*pb.Reply, error) {
	if err := s.owned("Close"); err != nil {
		return reply(err), nil
	}
	s.mu.Lock()
	e, closed := s.eng, s.closed
	s.closed = true
	shares := s.shares
	s.shares = nil
	stalls := s.stalls
	s.stalls = nil
	s.mu.Unlock()
	for _, release := range stalls {
		release() // the host's stalls end with the engine
	}
	if e == nil || closed {
		return &pb.Reply{}, nil
	}
	err := e.Close()
	for d, list := range shares {
		for _, sh := range list {
			s.maps.Unmap(d, sh)
		}
	}
	return reply(err), nil
}
