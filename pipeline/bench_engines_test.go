package pipeline

import (
	"fmt"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/ucx"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// BenchmarkEngineMatrix moves the same fragmented 4 KiB-block transfer on
// each real engine three ways in every iteration — the bounce path, the
// direct path (one post of every descriptor) and one bulk write of the same
// bytes as a single descriptor — and reports the throughputs and the ratios
// bounce/direct and bounce/bulk measured side by side.
func BenchmarkEngineMatrix(b *testing.B) {
	engines := map[string]func(testing.TB, string, loopback.Options) transfer.Engine{
		"tcp": newTCPEngine,
		"ucx": func(t testing.TB, name string, _ loopback.Options) transfer.Engine {
			e, err := ucx.New(ucx.Config{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			return e
		},
	}
	for _, engine := range []string{"tcp", "ucx"} {
		for _, n := range []int{16384, 81920} {
			b.Run(fmt.Sprintf("%s/%dx4KiB", engine, n), func(b *testing.B) {
				w := zmqWorld(b, 0)
				w.engine = engines[engine]
				cfg := DefaultConfig()
				cfg.MaxChunk = 8 << 20
				x, y := w.node("x", cfg), w.node("y", cfg)
				const size = 4096
				total := uint64(n) * size
				src, dst := x.buffer(b, total), y.buffer(b, total)
				connect(b, x, y)
				j := prepare(src, dst, kvLayout{count: n, size: size, fragmented: true}, 7)
				bulkSrc := []transfer.Desc{mem.DescOf(src)}
				bulkDst := []transfer.Desc{mem.DescOf(dst)}
				move := func(route Route, s, d []transfer.Desc) time.Duration {
					start := time.Now()
					bt, err := x.Submit(Request{Peer: "y", Src: s, Dst: d, Route: route})
					if err != nil {
						b.Fatal(err)
					}
					if err := wait(b, bt); err != nil {
						b.Fatal(err)
					}
					return time.Since(start)
				}
				var tb, td, tk time.Duration
				b.SetBytes(int64(3 * total))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					tk += move(RouteDirect, bulkSrc, bulkDst) // overwrites dst in source order
					tb += move(RouteBounce, j.src, j.dst)
					td += move(RouteDirect, j.src, j.dst)
				}
				b.StopTimer()
				j.verify(b) // the last direct move put every block in place again
				mb := float64(total) * float64(b.N) / 1e6
				b.ReportMetric(mb/tb.Seconds(), "bounce-MB/s")
				b.ReportMetric(mb/td.Seconds(), "direct-MB/s")
				b.ReportMetric(mb/tk.Seconds(), "bulk-MB/s")
				b.ReportMetric(td.Seconds()/tb.Seconds(), "bounce/direct")
				b.ReportMetric(tk.Seconds()/tb.Seconds(), "bounce/bulk")
			})
		}
	}
}
