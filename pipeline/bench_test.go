package pipeline

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// loopbackPair builds agents x and y on the loopback engine (64 MiB
// arenas, 8 MiB chunks) and a job of n fragmented blocks of size bytes
// from x to y.
func loopbackPair(b *testing.B, n, size uint64) (*node, job) {
	w := newWorld(b)
	cfg := DefaultConfig()
	cfg.ArenaSize = 64 << 20
	cfg.MaxChunk = 8 << 20
	cfg.Granularity = 1 << 20
	x, y := w.node("x", cfg), w.node("y", cfg)
	src, dst := x.buffer(b, n*size), y.buffer(b, n*size)
	connect(b, x, y)
	return x, prepare(src, dst, kvLayout{count: int(n), size: size, fragmented: true}, 42)
}

// BenchmarkHostPipeline moves 16,384 x 4 KiB fragmented blocks between two
// agents on the loopback engine, alternating the bounce and the direct path
// in every iteration, and reports both throughputs and their ratio.
func BenchmarkHostPipeline(b *testing.B) {
	const n, size = 16384, 4096
	x, j := loopbackPair(b, n, size)
	var tb, td time.Duration
	run := func(route Route) time.Duration {
		start := time.Now()
		bt, err := x.Submit(Request{Peer: "y", Src: j.src, Dst: j.dst, Route: route})
		if err != nil {
			b.Fatal(err)
		}
		if err := wait(b, bt); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if bt.Route() != route {
			b.Fatalf("route %v, want %v", bt.Route(), route)
		}
		return d
	}
	b.SetBytes(2 * n * size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tb += run(RouteBounce)
		td += run(RouteDirect)
	}
	b.StopTimer()
	j.verify(b)
	mb := float64(n*size) * float64(b.N) / 1e6
	b.ReportMetric(mb/tb.Seconds(), "bounce-MB/s")
	b.ReportMetric(mb/td.Seconds(), "direct-MB/s")
	b.ReportMetric(td.Seconds()/tb.Seconds(), "bounce/direct")
}

// BenchmarkTracingOverhead moves 81,920 x 4 KiB fragmented blocks (one rank
// of Llama-3.1-70B at TP=8, block 16) over the bounce path between two
// agents on the loopback engine, with tracing off and on (every span
// sampled, batch-exported to a discarding exporter) in alternating
// transfers, in an order that alternates too. One pair of agents serves
// both modes (a switch in their TracerProvider), so no difference between
// two pairs' memory or goroutines enters the ratio. It reports both
// throughputs, their ratio (traced/untraced) and the heap allocations of one
// transfer in each mode.
func BenchmarkTracingOverhead(b *testing.B) {
	w := newWorld(b)
	cfg := DefaultConfig()
	cfg.ArenaSize = 64 << 20
	cfg.MaxChunk = 8 << 20
	cfg.Granularity = 1 << 20
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	tp := &switchTP{sdk: sdk}
	set := func(s *Settings) {
		s.TracerProvider, s.MeterProvider, s.Propagator = tp, metricnoop.NewMeterProvider(), propagation.TraceContext{}
	}
	x, y := w.node("x", cfg, set), w.node("y", cfg, set)
	const n, size = 81920, 4096
	src, dst := x.buffer(b, n*size), y.buffer(b, n*size)
	connect(b, x, y)
	j := prepare(src, dst, kvLayout{count: n, size: size, fragmented: true}, 42)
	run := func(traced bool) (time.Duration, uint64) {
		tp.on.Store(traced)
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		start := time.Now()
		bt, err := x.Submit(Request{Peer: "y", Src: j.src, Dst: j.dst, Route: RouteBounce})
		if err != nil {
			b.Fatal(err)
		}
		if err := wait(b, bt); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		runtime.ReadMemStats(&ms1)
		if bt.Route() != RouteBounce {
			b.Fatalf("route %v", bt.Route())
		}
		return d, ms1.Mallocs - ms0.Mallocs
	}
	run(false) // warm up outside the measurement
	run(true)
	var toff, ton time.Duration
	var aoff, aon uint64
	b.SetBytes(2 * n * size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, traced := range [2][2]bool{{false, true}, {true, false}}[i%2] {
			d, a := run(traced)
			if traced {
				ton, aon = ton+d, aon+a
			} else {
				toff, aoff = toff+d, aoff+a
			}
		}
	}
	b.StopTimer()
	j.verify(b)
	mb := float64(n*size) * float64(b.N) / 1e6
	b.ReportMetric(mb/toff.Seconds(), "untraced-MB/s")
	b.ReportMetric(mb/ton.Seconds(), "traced-MB/s")
	b.ReportMetric(toff.Seconds()/ton.Seconds(), "traced/untraced")
	b.ReportMetric(float64(aoff)/float64(b.N), "untraced-allocs/transfer")
	b.ReportMetric(float64(aon)/float64(b.N), "traced-allocs/transfer")
}

// switchTP is a TracerProvider whose tracers start SDK spans while on is
// set and no-op spans otherwise.
type switchTP struct {
	embedded.TracerProvider
	on  atomic.Bool
	sdk trace.TracerProvider
}

// Tracer returns a tracer that follows the switch.
func (p *switchTP) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return switchTracer{p: p, sdk: p.sdk.Tracer(name, opts...)}
}

type switchTracer struct {
	embedded.Tracer
	p   *switchTP
	sdk trace.Tracer
}

// Start starts an SDK span while the switch is on, else a no-op span.
func (t switchTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.p.on.Load() {
		return t.sdk.Start(ctx, name, opts...)
	}
	return tracenoop.Tracer{}.Start(ctx, name, opts...)
}

// BenchmarkHostCostPerDescriptor moves 81,920 fragmented 64-byte blocks
// over the bounce path on the loopback engine: the bytes are few (5 MiB),
// so the time is the pipeline's host work per descriptor (planning, run
// validation, DATA encoding and decoding, the copies' setup), which is
// what bounds the pipeline when a GPU moves the bytes. It reports ns/desc.
func BenchmarkHostCostPerDescriptor(b *testing.B) {
	const n = 81920
	x, j := loopbackPair(b, n, 64)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		bt, err := x.Submit(Request{Peer: "y", Src: j.src, Dst: j.dst, Route: RouteBounce})
		if err != nil {
			b.Fatal(err)
		}
		if err := wait(b, bt); err != nil {
			b.Fatal(err)
		}
	}
	el := time.Since(start)
	b.StopTimer()
	j.verify(b)
	b.ReportMetric(float64(el.Nanoseconds())/float64(b.N*n), "ns/desc")
}
