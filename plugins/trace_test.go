package plugins

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/bouncekv/bounce/engines/loopback"
	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// traced is a host and a plugin, each with its own tracer provider and
// span recorder, joined by a gRPC connection traced as Load and Serve
// trace it.
type traced struct {
	hostTP                 *sdktrace.TracerProvider
	hostSpans, pluginSpans *tracetest.SpanRecorder
	conn                   *grpc.ClientConn
}

// newTraced serves what register registers on an in-memory connection;
// everything ends with the test.
func newTraced(t *testing.T, register func(*grpc.Server)) *traced {
	tr := &traced{hostSpans: tracetest.NewSpanRecorder(), pluginSpans: tracetest.NewSpanRecorder()}
	tr.hostTP = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tr.hostSpans))
	pluginTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tr.pluginSpans))
	prop := propagation.TraceContext{}
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.StatsHandler(serverTracing(pluginTP, prop)))
	register(srv)
	go func() { _ = srv.Serve(ln) }()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return ln.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(clientTracing(tr.hostTP, prop)))
	if err != nil {
		t.Fatal(err)
	}
	tr.conn = conn
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		tr.hostTP.Shutdown(context.Background())
		pluginTP.Shutdown(context.Background())
	})
	return tr
}

// untraced fails the test if any span was made so far.
func (tr *traced) untraced(t *testing.T, what string) {
	t.Helper()
	if n := len(tr.hostSpans.Ended()) + len(tr.pluginSpans.Ended()); n != 0 {
		t.Fatalf("%s made %d spans", what, n)
	}
}

// joined checks that the one call method made under parent (ended) is one
// client span under parent on the host and one server span under it in
// the plugin, in parent's trace, and returns the server span.
func (tr *traced) joined(t *testing.T, parent trace.Span, method string) sdktrace.ReadOnlySpan {
	t.Helper()
	// The server span ends once the reply is sent, a moment after the
	// client has it.
	for deadline := time.Now().Add(10 * time.Second); len(tr.pluginSpans.Ended()) == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	var client sdktrace.ReadOnlySpan
	for _, s := range tr.hostSpans.Ended() {
		if s.Name() == method {
			client = s
		}
	}
	if client == nil || len(tr.hostSpans.Ended()) != 2 {
		t.Fatalf("host spans %v, want the caller's and one %s client span", names(tr.hostSpans.Ended()), method)
	}
	if client.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("client span parent %v, want the caller's span", client.Parent().SpanID())
	}
	server := tr.pluginSpans.Ended()
	if len(server) != 1 || server[0].Name() != method {
		t.Fatalf("plugin spans %v, want one %s server span", names(server), method)
	}
	if server[0].SpanContext().TraceID() != parent.SpanContext().TraceID() || server[0].Parent().SpanID() != client.SpanContext().SpanID() {
		t.Errorf("plugin span in trace %s under %s, want trace %s under the client span %s",
			server[0].SpanContext().TraceID(), server[0].Parent().SpanID(), parent.SpanContext().TraceID(), client.SpanContext().SpanID())
	}
	return server[0]
}

// A traced post crosses the plugin boundary in gRPC metadata: the plugin's
// server span is a child of the host's client span, which is a child of the
// caller's span, all in one trace. Untraced calls (Poll, Release, a post
// without a span) make no span on either side.
func TestTraceCrossesThePluginBoundary(t *testing.T) {
	fab := loopback.NewFabric()
	tr := newTraced(t, func(s *grpc.Server) {
		pb.RegisterEngineServer(s, &engineServer{open: func(name string, _ map[string]string) (transfer.Engine, error) {
			return fab.NewEngine(name, loopback.Options{})
		}, maps: newMapper()})
	})
	eng, err := newClient(KindEngine, "bufconn", pb.NewEngineClient(tr.conn), func() {}).Engine("p", nil)
	if err != nil {
		t.Fatal(err)
	}
	cp, ok := eng.(transfer.ContextPoster)
	if !ok {
		t.Fatalf("the plugin engine client %T does not take a context", eng)
	}
	// Unregistered memory: the post fails in the plugin, which is fine —
	// the call is what is traced.
	ops := []transfer.WriteOp{{Src: transfer.Desc{Addr: 0x1000, Len: 8}, Dst: transfer.Desc{Addr: 0x2000, Len: 8}}}
	if op, err := eng.PostWrite("nobody", ops); err == nil {
		_ = op.Release()
	}
	tr.untraced(t, "an untraced post")
	ctx, parent := tr.hostTP.Tracer("test").Start(context.Background(), "chunk")
	if op, err := cp.PostWriteContext(ctx, "nobody", ops); err == nil {
		for st, _ := op.Poll(); st == transfer.Pending; st, _ = op.Poll() {
			time.Sleep(time.Millisecond)
		}
		_ = op.Release()
	}
	parent.End()
	if err := eng.Close(); err != nil {
		t.Log(err)
	}
	tr.joined(t, parent, "bounce.plugin.v1.Engine/PostWrite")
}

// spanWriter is a writer plugin's transfer.ContextWriter that records the
// span of the context each write got and posts nothing.
type spanWriter struct{ got chan trace.SpanContext }

func (w spanWriter) Write(peer string, src, dst transfer.Desc) (transfer.Op, error) {
	return w.WriteContext(context.Background(), peer, src, dst)
}

func (w spanWriter) WriteContext(ctx context.Context, _ string, _, _ transfer.Desc) (transfer.Op, error) {
	w.got <- trace.SpanContextFromContext(ctx)
	return nil, fmt.Errorf("spanWriter posts nothing: %w", transfer.ErrUnsupported)
}

// A traced write crosses to a writer plugin as a post does to an engine
// plugin: RemoteWriter.WriteContext carries the trace in gRPC metadata, the
// plugin's server span is a child of the host's client span, and the
// plugin's writer gets a context holding that server span (so its post
// through the host's engine joins the trace too). An untraced Write makes
// no span.
func TestWriterTraceCrossesThePluginBoundary(t *testing.T) {
	got := make(chan trace.SpanContext, 2)
	tr := newTraced(t, func(s *grpc.Server) { pb.RegisterWriterServer(s, &writerServer{w: spanWriter{got}}) })
	var w transfer.Writer = &RemoteWriter{c: newClient(KindWriter, "bufconn", nil, func() {}), rpc: pb.NewWriterClient(tr.conn)}
	cw, ok := w.(transfer.ContextWriter)
	if !ok {
		t.Fatalf("the writer plugin client %T does not take a context", w)
	}
	src, dst := transfer.Desc{Addr: 0x1000, Len: 8}, transfer.Desc{Addr: 0x2000, Len: 8}
	if _, err := w.Write("b", src, dst); !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("untraced write: %v, want the plugin writer's refusal", err)
	}
	if sc := <-got; sc.IsValid() {
		t.Errorf("an untraced write reached the plugin's writer with span %v", sc.SpanID())
	}
	tr.untraced(t, "an untraced write")
	ctx, parent := tr.hostTP.Tracer("test").Start(context.Background(), "chunk")
	if _, err := cw.WriteContext(ctx, "b", src, dst); !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("traced write: %v, want the plugin writer's refusal", err)
	}
	inPlugin := <-got
	parent.End()
	server := tr.joined(t, parent, "bounce.plugin.v1.Writer/Write")
	if inPlugin.SpanID() != server.SpanContext().SpanID() {
		t.Errorf("the plugin's writer got span %v, want the server span %v", inPlugin.SpanID(), server.SpanContext().SpanID())
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}
