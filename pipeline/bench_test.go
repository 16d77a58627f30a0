package pipeline

import (
	"context"
	"runtime"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/bouncekv/bounce/mem"
)

// BenchmarkHostPipeline moves 16,384 x 4 KiB fragmented blocks between two
// agents on the loopback engine, alternating the bounce and the direct path
// in every iteration, and reports both throughputs and their ratio.
func BenchmarkHostPipeline(b *testing.B) {
	w := newWorld(b)
	cfg := DefaultConfig()
	cfg.ArenaSize = 64 << 20
	cfg.MaxChunk = 8 << 20
	cfg.Granularity = 1 << 20
	x, y := w.node("x", cfg), w.node("y", cfg)
	const n, size = 16384, 4096
	src, dst := x.buffer(b, n*size), y.buffer(b, n*size)
	connect(b, x, y)
	j := prepare(src, dst, kvLayout{count: n, size: size, fragmented: true}, 42)
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
// pairs of agents on the loopback engine, one pair untraced (the no-op
// TracerProvider) and one traced with every span sampled and batch-exported
// (to a discarding exporter), alternating in every iteration (in an order
// that alternates too). It reports
// both throughputs, their ratio (traced/untraced) and the heap allocations
// of one transfer in each mode.
func BenchmarkTracingOverhead(b *testing.B) {
	w := newWorld(b)
	cfg := DefaultConfig()
	cfg.ArenaSize = 64 << 20
	cfg.MaxChunk = 8 << 20
	cfg.Granularity = 1 << 20
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	traced := func(s *Settings) { s.TracerProvider, s.Propagator = tp, propagation.TraceContext{} }
	off := func(s *Settings) {
		s.TracerProvider, s.MeterProvider = tracenoop.NewTracerProvider(), metricnoop.NewMeterProvider()
	}
	x, y := w.node("x", cfg, off), w.node("y", cfg, off)
	u, v := w.node("u", cfg, traced), w.node("v", cfg, traced)
	const n, size = 81920, 4096
	sb, db := x.buffer(b, n*size), y.buffer(b, n*size)
	for _, p := range []struct {
		n *node
		b []byte
	}{{u, sb}, {v, db}} {
		if err := p.n.RegisterMemory(mem.DescOf(p.b)); err != nil {
			b.Fatal(err)
		}
	}
	connect(b, x, y)
	connect(b, u, v)
	j := prepare(sb, db, kvLayout{count: n, size: size, fragmented: true}, 42)
	run := func(from *node, to string) (time.Duration, uint64) {
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		start := time.Now()
		bt, err := from.Submit(Request{Peer: to, Src: j.src, Dst: j.dst, Route: RouteBounce})
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
	run(x, "y") // warm both pairs up outside the measurement
	run(u, "v")
	var toff, ton time.Duration
	var aoff, aon uint64
	b.SetBytes(2 * n * size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Alternate which pair goes first, so neither gains from order.
		for _, traced := range [2][2]bool{{false, true}, {true, false}}[i%2] {
			if traced {
				d, a := run(u, "v")
				ton, aon = ton+d, aon+a
			} else {
				d, a := run(x, "y")
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
