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

// A traced post crosses the plugin boundary in gRPC metadata: the plugin's
// server span is a child of the host's client span, which is a child of the
// caller's span, all in one trace. Untraced calls (Poll, Release, a post
// without a span) make no span on either side.
func TestTraceCrossesThePluginBoundary(t *testing.T) {
	hostSpans, pluginSpans := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
	hostTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(hostSpans))
	pluginTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(pluginSpans))
	defer hostTP.Shutdown(context.Background())
	defer pluginTP.Shutdown(context.Background())
	prop := propagation.TraceContext{}

	fab := loopback.NewFabric()
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.StatsHandler(serverTracing(pluginTP, prop)))
	pb.RegisterEngineServer(srv, &engineServer{open: func(name string, _ map[string]string) (transfer.Engine, error) {
		return fab.NewEngine(name, loopback.Options{})
	}, maps: newMapper()})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return ln.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(clientTracing(hostTP, prop)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	eng, err := newClient(KindEngine, "bufconn", pb.NewEngineClient(conn), func() {}).Engine("p", nil)
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
	if n := len(hostSpans.Ended()) + len(pluginSpans.Ended()); n != 0 {
		t.Fatalf("an untraced post made %d spans", n)
	}
	ctx, parent := hostTP.Tracer("test").Start(context.Background(), "chunk")
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
	var client sdktrace.ReadOnlySpan
	for _, s := range hostSpans.Ended() {
		if s.Name() == "bounce.plugin.v1.Engine/PostWrite" {
			client = s
		}
	}
	if client == nil || len(hostSpans.Ended()) != 2 {
		t.Fatalf("host spans %v, want the caller's and one PostWrite client span", names(hostSpans.Ended()))
	}
	if client.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("client span parent %v, want the caller's span", client.Parent().SpanID())
	}
	server := pluginSpans.Ended()
	if len(server) != 1 || server[0].Name() != "bounce.plugin.v1.Engine/PostWrite" {
		t.Fatalf("plugin spans %v, want one PostWrite server span", names(server))
	}
	if server[0].SpanContext().TraceID() != parent.SpanContext().TraceID() || server[0].Parent().SpanID() != client.SpanContext().SpanID() {
		t.Errorf("plugin span in trace %s under %s, want trace %s under the client span %s",
			server[0].SpanContext().TraceID(), server[0].Parent().SpanID(), parent.SpanContext().TraceID(), client.SpanContext().SpanID())
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
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
	hostSpans, pluginSpans := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
	hostTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(hostSpans))
	pluginTP := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(pluginSpans))
	defer hostTP.Shutdown(context.Background())
	defer pluginTP.Shutdown(context.Background())
	prop := propagation.TraceContext{}

	got := make(chan trace.SpanContext, 2)
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.StatsHandler(serverTracing(pluginTP, prop)))
	pb.RegisterWriterServer(srv, &writerServer{w: spanWriter{got}})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return ln.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(clientTracing(hostTP, prop)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var w transfer.Writer = &RemoteWriter{c: newClient(KindWriter, "bufconn", nil, func() {}), rpc: pb.NewWriterClient(conn)}
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
	if n := len(hostSpans.Ended()) + len(pluginSpans.Ended()); n != 0 {
		t.Fatalf("an untraced write made %d spans", n)
	}
	ctx, parent := hostTP.Tracer("test").Start(context.Background(), "chunk")
	if _, err := cw.WriteContext(ctx, "b", src, dst); !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("traced write: %v, want the plugin writer's refusal", err)
	}
	inPlugin := <-got
	parent.End()
	// The server span ends once the reply is sent, a moment after the
	// client has it.
	for deadline := time.Now().Add(10 * time.Second); len(pluginSpans.Ended()) == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	var client sdktrace.ReadOnlySpan
	for _, s := range hostSpans.Ended() {
		if s.Name() == "bounce.plugin.v1.Writer/Write" {
			client = s
		}
	}
	if client == nil || len(hostSpans.Ended()) != 2 {
		t.Fatalf("host spans %v, want the caller's and one Write client span", names(hostSpans.Ended()))
	}
	if client.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Errorf("client span parent %v, want the caller's span", client.Parent().SpanID())
	}
	server := pluginSpans.Ended()
	if len(server) != 1 || server[0].Name() != "bounce.plugin.v1.Writer/Write" {
		t.Fatalf("plugin spans %v, want one Write server span", names(server))
	}
	if server[0].SpanContext().TraceID() != parent.SpanContext().TraceID() || server[0].Parent().SpanID() != client.SpanContext().SpanID() {
		t.Errorf("plugin span in trace %s under %s, want trace %s under the client span %s",
			server[0].SpanContext().TraceID(), server[0].Parent().SpanID(), parent.SpanContext().TraceID(), client.SpanContext().SpanID())
	}
	if inPlugin.SpanID() != server[0].SpanContext().SpanID() {
		t.Errorf("the plugin's writer got span %v, want the server span %v", inPlugin.SpanID(), server[0].SpanContext().SpanID())
	}
}
