package ucx

import (
	"fmt"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// timeWrite posts ops from a to peer "b" and returns how long until Done.
// It polls with short sleeps so the 2-core machine's CPUs stay with the two
// progress goroutines.
func timeWrite(b *testing.B, a *Engine, ops []transfer.WriteOp) time.Duration {
	start := time.Now()
	op, err := a.PostWrite("b", ops)
	if err != nil {
		b.Fatal(err)
	}
	for {
		s, err := op.Poll()
		if s == transfer.Done {
			break
		}
		if s == transfer.Failed {
			b.Fatal(err)
		}
		time.Sleep(20 * time.Microsecond)
	}
	d := time.Since(start)
	op.Release()
	return d
}

// BenchmarkScatteredVsBulk moves the same 64 MiB as 16,384 separate 4 KiB
// ops in one post and as one 64 MiB op, side by side in every iteration, in
// both error modes. ratio = scattered time / bulk time (1 = descriptors cost
// nothing extra).
func BenchmarkScatteredVsBulk(b *testing.B) {
	for _, mode := range allModes() {
		b.Run("errmode="+mode.String(), func(b *testing.B) {
			const n, sz = 16384, 4096
			p := newPair(b, mode, n*sz)
			scattered := make([]transfer.WriteOp, n)
			for i := range scattered {
				j := (i * 7919) % n // permuted: destinations are not one run
				scattered[i] = transfer.WriteOp{Src: desc(p.abuf, uint64(i*sz), sz), Dst: desc(p.bbuf, uint64(j*sz), sz)}
			}
			bulk := []transfer.WriteOp{{Src: p.abuf.Desc(), Dst: p.bbuf.Desc()}}
			timeWrite(b, p.a, bulk) // connect
			var ts, tb time.Duration
			b.SetBytes(2 * n * sz)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ts += timeWrite(b, p.a, scattered)
				tb += timeWrite(b, p.a, bulk)
			}
			mb := func(d time.Duration) float64 { return float64(b.N) * n * sz / d.Seconds() / 1e6 }
			b.ReportMetric(mb(ts), "scattered-MB/s")
			b.ReportMetric(mb(tb), "bulk-MB/s")
			b.ReportMetric(ts.Seconds()/tb.Seconds(), "ratio")
		})
	}
}

// BenchmarkFragmentSize writes one 64 MiB op to the same target from writers
// with different FragmentSize, side by side in every iteration. Each ratio
// is that fragment size's time over the default's.
func BenchmarkFragmentSize(b *testing.B) {
	for _, mode := range allModes() {
		b.Run("errmode="+mode.String(), func(b *testing.B) {
			const size = 64 << 20
			frags := []uint64{64 << 10, 256 << 10, DefaultFragmentSize, 4 << 20, 16 << 20, 64 << 20}
			dst := alloc(b, size)
			target := newEngine(b, Config{Name: "b", ErrMode: mode})
			register(b, target, dst)
			writers := make([]*Engine, len(frags))
			for k, f := range frags {
				src := alloc(b, size)
				writers[k] = newEngine(b, Config{Name: fmt.Sprintf("a%d", k), ErrMode: mode, FragmentSize: f})
				register(b, writers[k], src)
				load(b, writers[k], target)
			}
			opsOf := make([][]transfer.WriteOp, len(writers))
			for k, w := range writers {
				opsOf[k] = []transfer.WriteOp{{Src: w.reg.Ranges()[0], Dst: dst.Desc()}}
			}
			ops := func(k int) []transfer.WriteOp { return opsOf[k] }
			for k := range writers {
				timeWrite(b, writers[k], ops(k)) // connect
			}
			ts := make([]time.Duration, len(frags))
			b.SetBytes(size * int64(len(frags)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for k := range writers {
					ts[k] += timeWrite(b, writers[k], ops(k))
				}
			}
			var def time.Duration
			for k, f := range frags {
				if f == DefaultFragmentSize {
					def = ts[k]
				}
			}
			for k, f := range frags {
				b.ReportMetric(float64(b.N)*size/ts[k].Seconds()/1e6, fmt.Sprintf("frag%dK-MB/s", f>>10))
				b.ReportMetric(ts[k].Seconds()/def.Seconds(), fmt.Sprintf("frag%dK-ratio", f>>10))
			}
		})
	}
}
