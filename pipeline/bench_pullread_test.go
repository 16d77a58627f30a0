package pipeline

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPullReadVsWrite moves the same fragmented 4 KiB-block transfer
// over tcp engines on host memory three ways in every iteration, side by
// side: pushed (x submits to y over the bounce path), pulled by write (w,
// whose bounce.pull_read is off, pulls it: x gathers and writes into w's
// granted regions) and pulled by read (y pulls it: x gathers and offers
// its staging, y reads it). It reports the three throughputs and the
// ratios read/write and read/push (time of the other over time of the
// read: above 1 means the read is faster).
func BenchmarkPullReadVsWrite(b *testing.B) {
	for _, n := range []int{4096, 16384} {
		b.Run(fmt.Sprintf("tcp/%dx4KiB", n), func(b *testing.B) {
			w := tcpZMQWorld(b)
			cfg := DefaultConfig()
			cfg.ArenaSize = 128 << 20
			off := cfg
			off.PullRead = PullReadOff
			x, y, wr := w.node("x", cfg), w.node("y", cfg), w.node("w", off)
			const size = 4096
			total := uint64(n) * size
			src := x.buffer(b, total)
			dstY, dstW := y.buffer(b, total), wr.buffer(b, total)
			connect(b, x, y, wr)
			jy := prepare(src, dstY, kvLayout{count: n, size: size, fragmented: true}, 7)
			jw := prepare(src, dstW, kvLayout{count: n, size: size, fragmented: true}, 7)
			run := func(start func() (*Batch, error)) time.Duration {
				t0 := time.Now()
				bt, err := start()
				if err != nil {
					b.Fatal(err)
				}
				if err := wait(b, bt); err != nil {
					b.Fatal(err)
				}
				d := time.Since(t0)
				if err := bt.Release(); err != nil {
					b.Fatal(err)
				}
				return d
			}
			push := func() (*Batch, error) {
				return x.Submit(Request{Peer: "y", Src: jy.src, Dst: jy.dst, Route: RouteBounce})
			}
			pullWrite := func() (*Batch, error) { return wr.Pull(PullRequest{Peer: "x", Src: jw.src, Dst: jw.dst}) }
			pullRead := func() (*Batch, error) { return y.Pull(PullRequest{Peer: "x", Src: jy.src, Dst: jy.dst}) }
			var tp, tw, tr time.Duration
			b.SetBytes(int64(3 * total))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tp += run(push)
				before := x.Stats().PullReadOffers
				tw += run(pullWrite)
				if x.Stats().PullReadOffers != before {
					b.Fatal("the pull by write was offered to read")
				}
				clear(dstY)
				tr += run(pullRead)
				if x.Stats().PullReadOffers == before {
					b.Fatal("the pull by read was written")
				}
			}
			b.StopTimer()
			jy.verify(b) // the last pull by read put every block in place
			jw.verify(b)
			mb := float64(total) * float64(b.N) / 1e6
			b.ReportMetric(mb/tp.Seconds(), "push-MB/s")
			b.ReportMetric(mb/tw.Seconds(), "pull-write-MB/s")
			b.ReportMetric(mb/tr.Seconds(), "pull-read-MB/s")
			b.ReportMetric(tw.Seconds()/tr.Seconds(), "read/write")
			b.ReportMetric(tp.Seconds()/tr.Seconds(), "read/push")
		})
	}
}
