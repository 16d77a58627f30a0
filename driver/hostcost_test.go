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
// reported as ns/block-<step> and each side's sum as ns/block-sender and
// ns/block-receiver; the goal is ≤ 10 ns per block per side on the block
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

// steps accumulates the time of each step over a benchmark's iterations.
type steps struct {
	names []string
	side  map[string]string // step -> "sender" or "receiver"
	total map[string]time.Duration
}

func newSteps() *steps {
	return &steps{side: map[string]string{}, total: map[string]time.Duration{}}
}

// time runs f and adds its duration to step (of side).
func (s *steps) time(step, side string, f func()) {
	if _, ok := s.side[step]; !ok {
		s.names = append(s.names, step)
		s.side[step] = side
	}
	t0 := time.Now()
	f()
	s.total[step] += time.Since(t0)
}

// report reports every step and each side's sum in ns per block.
func (s *steps) report(b *testing.B, blocks int) {
	per := float64(b.N) * float64(blocks)
	sums := map[string]float64{}
	for _, n := range s.names {
		v := float64(s.total[n].Nanoseconds()) / per
		b.ReportMetric(v, "ns/block-"+n)
		sums[s.side[n]] += v
	}
	for _, side := range []string{"sender", "receiver"} {
		b.ReportMetric(sums[side], "ns/block-"+side)
	}
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
		st.time("plan", "sender", func() {
			var err error
			if p, err = plan.Build(src, dst, opt); err != nil {
				b.Fatal(err)
			}
		})
		st.time("table", "sender", func() {
			for _, c := range p.Chunks {
				pieces = pieces[:0]
				for _, r := range c.Gather {
					pieces = kernels.AppendPieces(pieces, r, 1<<20)
				}
			}
		})
		msgs := make([][]byte, len(p.Chunks))
		st.time("encode", "sender", func() {
			for k, c := range p.Chunks {
				var err error
				buf, err = wire.AppendMarshal(buf[:0], &wire.Data{Request: 1, Chunk: uint32(k), Region: 4096, Runs: c.Scatter})
				if err != nil {
					b.Fatal(err)
				}
				msgs[k] = append(msgs[k][:0], buf...)
			}
		})
		st.time("decode", "receiver", func() {
			for _, m := range msgs {
				if err := wire.UnmarshalData(m, &got); err != nil {
					b.Fatal(err)
				}
			}
		})
		st.time("validate", "receiver", func() {
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

func BenchmarkHostCost(b *testing.B) {
	for _, name := range hostCostPresets {
		s := costSpec(b, name)
		b.Run(fmt.Sprintf("form=descs/%s", name), func(b *testing.B) { descCost(b, s) })
	}
}
