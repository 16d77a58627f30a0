package tcp

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// BenchmarkScatteredVsBulk moves the same 64 MiB between two engines on
// 127.0.0.1 twice per iteration, side by side: as 16,384 ops of 4 KiB in one
// post (destinations in shuffled block order, like fragmented KV blocks) and
// as one 64 MiB op. The "scattered/bulk" ratio is the per-descriptor cost;
// post-ns/desc is the CPU time PostWrite itself spends per descriptor.
func BenchmarkScatteredVsBulk(b *testing.B) {
	const block, blocks = 4 << 10, 16384
	const total = block * blocks
	v := newEnv(b)
	a, r := v.engine("a"), v.engine("b")
	src := v.buf(total, 61, a)
	dst := v.buf(total, 0, r)
	connect(b, a, r)
	perm := rand.New(rand.NewPCG(62, 63)).Perm(blocks)
	scattered := make([]transfer.WriteOp, blocks)
	for i, j := range perm {
		scattered[i] = transfer.WriteOp{Src: sub(src, i*block, block), Dst: sub(dst, j*block, block)}
	}
	bulk := []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}}
	var post time.Duration // time inside PostWrite for the scattered posts
	run := func(ops []transfer.WriteOp) time.Duration {
		start := time.Now()
		op, err := a.PostWrite("b", ops)
		if err != nil {
			b.Fatal(err)
		}
		if len(ops) > 1 {
			post += time.Since(start)
		}
		<-op.(*writeOp).done
		if st, err := op.Poll(); st != transfer.Done {
			b.Fatalf("%v %v", st, err)
		}
		d := time.Since(start)
		op.Release()
		return d
	}
	run(bulk) // dial and warm up the connections
	var ts, tb time.Duration
	post = 0
	b.SetBytes(2 * total)
	b.ResetTimer()
	for range b.N {
		ts += run(scattered)
		tb += run(bulk)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(ts.Microseconds())/1e3/n, "scattered-ms")
	b.ReportMetric(float64(tb.Microseconds())/1e3/n, "bulk-ms")
	b.ReportMetric(total/ts.Seconds()*n/1e9, "scattered-GB/s")
	b.ReportMetric(total/tb.Seconds()*n/1e9, "bulk-GB/s")
	b.ReportMetric(float64(ts-tb)/n/blocks, "ns/extra-desc")
	b.ReportMetric(float64(post)/n/blocks, "post-ns/desc")
	b.ReportMetric(float64(ts)/float64(tb), "scattered/bulk")
}
