package pipeline

import (
	"testing"
	"time"
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
