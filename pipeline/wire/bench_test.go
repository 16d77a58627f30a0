package wire

import (
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

const benchDescs = 16384

// unmergedData is a DATA for n 4 KiB descriptors packed back to back in the
// region and scattered to pages that follow no stride (a shuffled block
// table), so no two merge: n single-copy runs.
func unmergedData(n int) *Data {
	runs := make([]transfer.Run, n)
	for i := range runs {
		page := uint64(i*7919) % uint64(n) // a permutation of 0..n-1 (7919 is prime)
		runs[i] = transfer.Run{RegionOff: uint64(i) * 4096, Addr: 0x7f0000000000 + page*16384, Len: 4096, Count: 1}
	}
	return &Data{Request: 1, Chunk: 3, Region: 64 << 20, Runs: runs, TraceParent: testTraceParent}
}

// mergedData is the same n descriptors when the destination is uniformly
// strided (e.g. one layer's blocks for 4 heads): 4 strided runs.
func mergedData(n int) *Data {
	const parts = 4
	runs := make([]transfer.Run, parts)
	per := uint64(n / parts)
	for p := range runs {
		runs[p] = transfer.Run{
			RegionOff: uint64(p) * per * 4096, Addr: 0x7f0000000000 + uint64(p)*4096,
			Len: 4096, Count: per, RegionStride: 4096, AddrStride: 16384,
		}
	}
	return &Data{Request: 1, Chunk: 3, Region: 64 << 20, Runs: runs, TraceParent: testTraceParent}
}

func descCount(d *Data) uint64 {
	var n uint64
	for _, r := range d.Runs {
		n += r.Count
	}
	return n
}

func benchCases(b *testing.B) []struct {
	name string
	msg  *Data
} {
	cases := []struct {
		name string
		msg  *Data
	}{{"merged", mergedData(benchDescs)}, {"unmerged", unmergedData(benchDescs)}}
	for _, c := range cases {
		if n := descCount(c.msg); n != benchDescs {
			b.Fatalf("%s carries %d descriptors", c.name, n)
		}
	}
	return cases
}

func BenchmarkDataEncode(b *testing.B) {
	for _, c := range benchCases(b) {
		b.Run(c.name, func(b *testing.B) {
			buf, err := Marshal(c.msg)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				if buf, err = AppendMarshal(buf[:0], c.msg); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(buf)), "bytes/msg")
		})
	}
}

func BenchmarkDataDecode(b *testing.B) {
	for _, c := range benchCases(b) {
		enc, err := Marshal(c.msg)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Unmarshal(enc); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(enc)), "bytes/msg")
		})
		b.Run(c.name+"-reuse", func(b *testing.B) {
			var d Data
			b.SetBytes(int64(len(enc)))
			b.ReportAllocs()
			for b.Loop() {
				if err := UnmarshalData(enc, &d); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(enc)), "bytes/msg")
		})
	}
}

// BenchmarkDataMergedVsUnmerged measures both plans side by side in one run:
// "ratio" is merged bytes / unmerged bytes per DATA, "time-ratio" the same
// for the time to encode and decode one.
func BenchmarkDataMergedVsUnmerged(b *testing.B) {
	cases := benchCases(b)
	merged, unmerged := cases[0].msg, cases[1].msg
	mb, _ := Marshal(merged)
	ub, _ := Marshal(unmerged)
	var md, ud Data
	var tm, tu time.Duration
	for b.Loop() {
		t0 := time.Now()
		mb, _ = AppendMarshal(mb[:0], merged)
		if err := UnmarshalData(mb, &md); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		ub, _ = AppendMarshal(ub[:0], unmerged)
		if err := UnmarshalData(ub, &ud); err != nil {
			b.Fatal(err)
		}
		tu += time.Since(t1)
		tm += t1.Sub(t0)
	}
	b.ReportMetric(float64(len(mb))/float64(len(ub)), "ratio")
	b.ReportMetric(float64(tm)/float64(tu), "time-ratio")
	b.ReportMetric(float64(len(mb)), "merged-bytes")
	b.ReportMetric(float64(len(ub)), "unmerged-bytes")
}

func BenchmarkAckRoundTrip(b *testing.B) {
	m := &Ack{Request: 1, Chunk: 2, Region: 3}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendMarshal(buf[:0], m)
		if _, err := Unmarshal(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDataDecodeFreshVsReused decodes one DATA of 16,384 unmerged
// runs into a fresh Data (Unmarshal) and into one whose run array is reused
// (UnmarshalData, as the receiver's reactor does with the arrays of
// finished scatters), alternating in every iteration, and reports both
// times and fresh/reused.
func BenchmarkDataDecodeFreshVsReused(b *testing.B) {
	enc, err := Marshal(unmergedData(benchDescs))
	if err != nil {
		b.Fatal(err)
	}
	var d Data
	var tf, tr time.Duration
	for i := 0; b.Loop(); i++ {
		for _, reuse := range [2][2]bool{{false, true}, {true, false}}[i%2] {
			start := time.Now()
			if reuse {
				err = UnmarshalData(enc, &d)
				tr += time.Since(start)
			} else {
				_, err = Unmarshal(enc)
				tf += time.Since(start)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(tf.Nanoseconds())/float64(b.N)/benchDescs, "ns/run-fresh")
	b.ReportMetric(float64(tr.Nanoseconds())/float64(b.N)/benchDescs, "ns/run-reused")
	b.ReportMetric(float64(tf)/float64(tr), "fresh/reused")
}
