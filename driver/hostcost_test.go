package driver

import (
	"fmt"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// Host cost per block (issue #24, point 5): what one request costs the
// host, per piece and per side, in the steps that scale with its pieces —
// the sender's planning, the GPU piece table and DATA encoding, the
// receiver's DATA decoding and validation — for each request form, on the
// KV presets' real shapes (fragmented ids, the block-table layout of
// workload.Spec.Regions so both forms name the same pieces). Each step is
// reported as ns/block-<side>-<step> (send-plan, recv-decode, ...) and each
// side's sum as ns/block-sender and ns/block-receiver; the goal is ≤ 10 ns per block per side on the block
// form and ≤ 40 ns on the descriptor form. Run with
//
//	go test -run '^$' -bench HostCost -benchtime 20x ./driver

// hostCostPresets are the shapes measured: Llama-3.1-70B and gpt-oss-120b
// at TP=8, block 16 (81,920 × 4 KiB and 36,864 × 2 KiB pieces).
var hostCostPresets = []string{"llama70b-tp8-b16", "gptoss120b-tp8-b16"}

// costSpec is preset name's fragmented block-table spec.
func costSpec(b *testing.B, name string) workload.Spec {
	p, err := workload.Lookup(name)
	if err != nil {
		b.Fatal(err)
	}
	return workload.Spec{DescSize: p.DescSize, Count: p.Count, Regions: p.Regions(), Fragmented: true, Seed: 1}
}

// costPlanOptions are the planner options of an agent on the default
// configuration over a control channel of zmq's default message limit.
func costPlanOptions() plan.Options {
	def := config.Default().Bounce
	const ctrlMax = 1 << 20
	return plan.Options{
		MaxChunk: uint64(def.MaxChunk), MinChunk: uint64(def.MinChunk),
		Scatter: plan.ScatterLimit{Bytes: ctrlMax - wire.DataOverhead(64), Single: wire.SingleRunSize, Strided: wire.StridedRunSize},
	}
}

// steps accumulates the time of each step of each side over a
// benchmark's iterations.
type steps struct {
	names []string // "send-plan", "recv-decode", ... in order of first use
	side  map[string]string
	total map[string]time.Duration
}

func newSteps() *steps {
	return &steps{side: map[string]string{}, total: map[string]time.Duration{}}
}

// time runs f and adds its duration to step of side ("send" or "recv").
func (s *steps) time(step, side string, f func()) {
	name := side + "-" + step
	if _, ok := s.side[name]; !ok {
		s.names = append(s.names, name)
		s.side[name] = side
	}
	t0 := time.Now()
	f()
	s.total[name] += time.Since(t0)
}

// report reports every step as ns/block-<side>-<step> and each side's sum
// as ns/block-sender and ns/block-receiver, per piece of the request.
func (s *steps) report(b *testing.B, blocks int) {
	per := float64(b.N) * float64(blocks)
	sums := map[string]float64{}
	for _, n := range s.names {
		v := float64(s.total[n].Nanoseconds()) / per
		b.ReportMetric(v, "ns/block-"+n)
		sums[s.side[n]] += v
	}
	b.ReportMetric(sums["send"], "ns/block-sender")
	b.ReportMetric(sums["recv"], "ns/block-receiver")
}

// descCost measures the descriptor form: plan.Build (layout and the runs of
// every chunk), the GPU piece table of every gather run
// (kernels.AppendPieces), DATA encoding of every chunk's scatter runs; on
// the receiver DATA decoding and plan.CheckRuns.
func descCost(b *testing.B, s workload.Spec) {
	src, dst := s.Descs(transfer.Desc{Addr: 1 << 40, Len: s.Bytes()}, transfer.Desc{Addr: 1 << 41, Len: s.Bytes()})
	opt := costPlanOptions()
	st := newSteps()
	var pieces []transfer.Run
	var buf []byte
	var got wire.Data
	b.ResetTimer()
	for range b.N {
		var p *plan.Plan
		st.time("plan", "send", func() {
			var err error
			if p, err = plan.Build(src, dst, opt); err != nil {
				b.Fatal(err)
			}
		})
		st.time("table", "send", func() {
			for _, c := range p.Chunks {
				pieces = pieces[:0]
				for _, r := range c.Gather {
					pieces = kernels.AppendPieces(pieces, r, 1<<20)
				}
			}
		})
		msgs := make([][]byte, len(p.Chunks))
		st.time("encode", "send", func() {
			for k, c := range p.Chunks {
				var err error
				buf, err = wire.AppendMarshal(buf[:0], &wire.Data{Request: 1, Chunk: uint32(k), Region: 4096, Runs: c.Scatter})
				if err != nil {
					b.Fatal(err)
				}
				msgs[k] = append(msgs[k][:0], buf...)
			}
		})
		st.time("decode", "recv", func() {
			for _, m := range msgs {
				if err := wire.UnmarshalData(m, &got); err != nil {
					b.Fatal(err)
				}
			}
		})
		st.time("validate", "recv", func() {
			for _, c := range p.Chunks {
				if _, err := plan.CheckRuns(c.Scatter, c.Bytes); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.StopTimer()
	st.report(b, s.Count)
}

// blockCost measures the block-table form: on the sender the ids'
// validation at submit (each side's Blocks.CheckIDs, destinations unique),
// plan.LayoutBlocks, and the encoding of the WANT (which carries the
// destination ids once) and of every chunk's DATA (a piece range); on the
// receiver their decoding and validation (the WANT's ids once, each DATA's
// range against the request and its region, as the receiver does). The
// form builds no piece table on the host: a block stage computes each
// piece's address from (base, stride, id).
func blockCost(b *testing.B, s workload.Spec) {
	src, dst := s.Blocks(transfer.Desc{Addr: 1 << 40, Len: s.Bytes()}, transfer.Desc{Addr: 1 << 41, Len: s.Bytes()})
	opt := costPlanOptions()
	st := newSteps()
	var buf []byte
	var got wire.Data
	b.ResetTimer()
	for range b.N {
		st.time("validate", "send", func() {
			if err := src.CheckIDs(false); err != nil {
				b.Fatal(err)
			}
			if err := dst.CheckIDs(true); err != nil {
				b.Fatal(err)
			}
		})
		var p *plan.Plan
		st.time("plan", "send", func() {
			var err error
			if p, err = plan.LayoutBlocks(src, dst, opt); err != nil {
				b.Fatal(err)
			}
		})
		var want []byte
		msgs := make([][]byte, len(p.Chunks))
		st.time("encode", "send", func() {
			sizes := make([]uint64, len(p.Chunks))
			for k, c := range p.Chunks {
				sizes[k] = c.Bytes
			}
			var err error
			want, err = wire.Marshal(&wire.Want{Request: 1, ChunkBytes: sizes, Endpoint: "tcp://127.0.0.1:5555",
				Blocks: &wire.WantBlocks{Pool: "kv-dst-0", BlockLen: dst.Pool.BlockLen, Pieces: dst.Len(), IDs: dst.IDs}})
			if err != nil {
				b.Fatal(err)
			}
			for k, c := range p.Chunks {
				if buf, err = wire.AppendMarshal(buf[:0], &wire.Data{Request: 1, Chunk: uint32(k), Region: 4096, Pieces: wire.PieceRange{First: c.First, Count: c.Count}}); err != nil {
					b.Fatal(err)
				}
				msgs[k] = append(msgs[k][:0], buf...)
			}
		})
		var w *wire.Want
		st.time("decode", "recv", func() {
			m, err := wire.Unmarshal(want)
			if err != nil {
				b.Fatal(err)
			}
			w = m.(*wire.Want)
			for _, m := range msgs {
				if err := wire.UnmarshalData(m, &got); err != nil {
					b.Fatal(err)
				}
			}
		})
		st.time("validate", "recv", func() {
			table := transfer.Blocks{Pool: dst.Pool, IDs: w.Blocks.IDs}
			if err := table.CheckIDs(true); err != nil {
				b.Fatal(err)
			}
			for _, c := range p.Chunks {
				if c.First > table.Len() || c.Count > table.Len()-c.First || c.Count > c.Bytes/table.Pool.BlockLen {
					b.Fatalf("chunk %d refused", c.Index)
				}
			}
		})
	}
	b.StopTimer()
	st.report(b, s.Count)
}

func BenchmarkHostCost(b *testing.B) {
	for _, name := range hostCostPresets {
		s := costSpec(b, name)
		b.Run(fmt.Sprintf("form=blocks/%s", name), func(b *testing.B) { blockCost(b, s) })
		b.Run(fmt.Sprintf("form=descs/%s", name), func(b *testing.B) { descCost(b, s) })
	}
}
