package plugins

import (
	"context"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// Trace context crosses the plugin boundary in gRPC metadata (otelgrpc's
// stats handlers, W3C traceparent). Only calls made for a traced operation
// (a post whose context holds a span) are traced: the host polls ops in a
// tight loop, and a span per poll would drown the trace.

// clientTracing is the host side's stats handler.
func clientTracing(tp trace.TracerProvider, prop propagation.TextMapPropagator) stats.Handler {
	return tracedOnly{h: otelgrpc.NewClientHandler(otelOptions(tp, prop)...), traced: func(ctx context.Context) bool {
		return trace.SpanContextFromContext(ctx).IsValid()
	}}
}

// serverTracing is the plugin side's stats handler: it traces the calls
// whose metadata carries a trace context.
func serverTracing(tp trace.TracerProvider, prop propagation.TextMapPropagator) stats.Handler {
	return tracedOnly{h: otelgrpc.NewServerHandler(otelOptions(tp, prop)...), traced: func(ctx context.Context) bool {
		md, ok := metadata.FromIncomingContext(ctx)
		return ok && len(md.Get("traceparent")) > 0
	}}
}

func otelOptions(tp trace.TracerProvider, prop propagation.TextMapPropagator) []otelgrpc.Option {
	opts := []otelgrpc.Option{otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider())}
	if tp != nil {
		opts = append(opts, otelgrpc.WithTracerProvider(tp))
	}
	if prop != nil {
		opts = append(opts, otelgrpc.WithPropagators(prop))
	}
	return opts
}

// tracedOnly hands h only the RPCs traced accepts.
type tracedOnly struct {
	h      stats.Handler
	traced func(context.Context) bool
}

type untracedKey struct{}

// TagRPC lets h tag a traced RPC and marks the others.
func (t tracedOnly) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	if t.traced(ctx) {
		return t.h.TagRPC(ctx, info)
	}
	return context.WithValue(ctx, untracedKey{}, true)
}

// HandleRPC passes a traced RPC's events to h.
func (t tracedOnly) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if ctx.Value(untracedKey{}) == nil {
		t.h.HandleRPC(ctx, s)
	}
}

// TagConn delegates to h.
func (t tracedOnly) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	return t.h.TagConn(ctx, info)
}

// HandleConn delegates to h.
func (t tracedOnly) HandleConn(ctx context.Context, s stats.ConnStats) { t.h.HandleConn(ctx, s) }
