package plugins

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// writerConn is the host side of a writer plugin before it is opened: its
// client and the broker that carries the host's engine back to it.
type writerConn struct {
	rpc    pb.WriterClient
	broker *plugin.GRPCBroker
}

// RemoteWriter is a transfer.Writer in a plugin process. Close ends the
// plugin process.
type RemoteWriter struct {
	c   *Client
	rpc pb.WriterClient
	hs  handles
}

// Writer opens the plugin's writer for agent name with opts, lending it
// engine: the plugin posts its writes through the host's engine, reached
// back over the plugin connection (go-plugin's broker), so the host keeps
// registering memory and loading peers. The writer owns the Client.
func (c *Client) Writer(name string, opts map[string]string, engine transfer.Engine) (*RemoteWriter, error) {
	if err := c.claim(KindWriter); err != nil {
		return nil, err
	}
	wc, ok := c.raw.(writerConn)
	if !ok || wc.broker == nil {
		c.Close()
		return nil, fmt.Errorf("plugin %s: no writer client (got %T)", c.name, c.raw)
	}
	id := wc.broker.NextId()
	go wc.broker.AcceptAndServe(id, func(opts []grpc.ServerOption) *grpc.Server {
		s := grpc.NewServer(opts...)
		pb.RegisterEngineServer(s, lendEngine(engine))
		return s
	})
	cx, cancel := ctx(CallTimeout)
	defer cancel()
	rep, err := wc.rpc.Open(cx, &pb.OpenRequest{Name: []byte(name), Options: opts, BrokerId: id})
	if err == nil {
		err = fromProtoError(rep.GetError())
	} else {
		err = c.rpcErr("open writer", err)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("plugin %s: open writer %q: %w", c.name, name, err)
	}
	return &RemoteWriter{c: c, rpc: wc.rpc}, nil
}

// Write posts one bulk write in the plugin and returns it by handle.
func (w *RemoteWriter) Write(peer string, src, dst transfer.Desc) (transfer.Op, error) {
	return w.WriteContext(context.Background(), peer, src, dst)
}

// WriteContext is Write whose RPC carries ctx's trace context in its gRPC
// metadata (transfer.ContextWriter), so the plugin's span of the write —
// and its post through the host's engine — joins the trace.
func (w *RemoteWriter) WriteContext(ctx context.Context, peer string, src, dst transfer.Desc) (transfer.Op, error) {
	what := fmt.Sprintf("write %v to %q %v", src, peer, dst)
	var rep *pb.HandleReply
	err := callIn(ctx, w.c, "writer", what, func(cx context.Context) (_ *pb.HandleReply, err error) {
		rep, err = w.rpc.Write(cx, &pb.WriteRequest{Peer: []byte(peer), Src: toProtoDesc(src), Dst: toProtoDesc(dst)})
		return rep, err
	})
	if err != nil {
		return nil, err
	}
	return started(w.c, &w.hs, w.rpc, what, rep.GetHandle(), nil)
}

// Close closes the writer in the plugin and ends the plugin process.
func (w *RemoteWriter) Close() error { return closeRemote(w.c, "writer", w.rpc.Close) }

// writerServer is the plugin side of the Writer service.
type writerServer struct {
	open   func(name string, opts map[string]string, engine transfer.Engine) (transfer.Writer, error)
	broker *plugin.GRPCBroker

	mu     sync.Mutex
	w      transfer.Writer
	host   *Client // the host's lent engine
	closed bool
	ops    opTable
}

func (s *writerServer) Open(_ context.Context, r *pb.OpenRequest) (*pb.OpenReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w != nil || s.closed {
		return &pb.OpenReply{Error: toProtoError(errors.New("plugin: this process already opened its writer"))}, nil
	}
	conn, err := s.broker.Dial(r.GetBrokerId())
	if err != nil {
		return &pb.OpenReply{Error: toProtoError(fmt.Errorf("plugin: reach the host's engine: %w", err))}, nil
	}
	rpc := pb.NewEngineClient(conn)
	host := newClient(KindEngine, "host engine", rpc, func() { _ = conn.Close() })
	cx, cancel := ctx(CallTimeout)
	defer cancel()
	desc, err := rpc.Open(cx, &pb.OpenRequest{})
	if err != nil {
		host.Close()
		return &pb.OpenReply{Error: toProtoError(host.rpcErr("describe the host's engine", err))}, nil
	}
	w, err := s.open(string(r.GetName()), r.GetOptions(), newRemoteEngine(host, rpc, desc).declared())
	if err != nil {
		host.Close()
		return &pb.OpenReply{Error: toProtoError(err)}, nil
	}
	s.w, s.host = w, host
	return &pb.OpenReply{Name: []byte(KindWriter)}, nil
}

func (s *writerServer) writer() (transfer.Writer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w == nil || s.closed {
		return nil, fmt.Errorf("plugin: writer not open: %w", transfer.ErrClosed)
	}
	return s.w, nil
}

func (s *writerServer) Write(cx context.Context, r *pb.WriteRequest) (*pb.HandleReply, error) {
	w, err := s.writer()
	if err != nil {
		return &pb.HandleReply{Error: toProtoError(err)}, nil
	}
	peer, src, dst := string(r.GetPeer()), fromProtoDesc(r.GetSrc()), fromProtoDesc(r.GetDst())
	var op transfer.Op
	if cw, ok := w.(transfer.ContextWriter); ok {
		// The call's context holds the host's trace span (its cancellation
		// ends with the call, the write does not).
		op, err = cw.WriteContext(context.WithoutCancel(cx), peer, src, dst)
	} else {
		op, err = w.Write(peer, src, dst)
	}
	return s.ops.posted(op, err), nil
}

func (s *writerServer) Poll(_ context.Context, r *pb.HandleRequest) (*pb.PollReply, error) {
	return s.ops.poll(r.GetHandle()), nil
}

func (s *writerServer) Wait(cx context.Context, r *pb.WaitRequest) (*pb.PollReply, error) {
	return s.ops.wait(cx, r.GetHandle(), time.Duration(r.GetTimeoutNs())), nil
}

func (s *writerServer) Release(_ context.Context, r *pb.HandleRequest) (*pb.Reply, error) {
	return s.ops.release(r.GetHandle()), nil
}

func (s *writerServer) Close(context.Context, *pb.Empty) (*pb.Reply, error) {
	s.mu.Lock()
	w, host, closed := s.w, s.host, s.closed
	s.closed = true
	s.mu.Unlock()
	if w == nil || closed {
		return &pb.Reply{}, nil
	}
	var err error
	if c, ok := w.(io.Closer); ok {
		err = c.Close()
	}
	host.Close()
	return reply(err), nil
}
