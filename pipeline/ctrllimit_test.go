package pipeline

import (
	"testing"

	"github.com/bouncekv/bounce/controlplane/nixlnotif"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/engines/ucx"
	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// TestDenseFragmentedPlanFitsNotifyLimit: a fragmented transfer of 2 KiB
// blocks in 8 MiB chunks needs DATA messages of ~100 KB, more than the
// notification limit of the ucx engine (64 KiB) or of a loopback engine
// set to NIXL's 16 KiB. Over nixlnotif the chunks are planned smaller so
// every DATA fits, and the transfer lands byte for byte with no dropped
// control message. Without the limit-aware plan every DATA is refused by
// the engine and the request times out.
func TestDenseFragmentedPlanFitsNotifyLimit(t *testing.T) {
	const blocks, block = 8192, 2 << 10 // 16 MiB in 2 KiB blocks, shuffled
	engines := append([]limitEngine{
		{"loopback-16KiB", 16 << 10, func(t testing.TB, w *world, name string, opt loopback.Options) transfer.Engine {
			opt.MaxNotifySize = 16 << 10
			e, err := w.fab.NewEngine(name, opt)
			if err != nil {
				t.Fatal(err)
			}
			return e
		}},
		{"tcp", tcp.MaxNotification, func(t testing.TB, _ *world, name string, opt loopback.Options) transfer.Engine {
			return newTCPEngine(t, name, opt)
		}},
		{"ucx", ucx.DefaultMaxNotifySize, func(t testing.TB, _ *world, name string, _ loopback.Options) transfer.Engine {
			e, err := ucx.New(ucx.Config{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}},
	}, tagEngines()...)
	for _, ec := range engines {
		t.Run(ec.name, func(t *testing.T) {
			w := newWorld(t)
			w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine { return ec.make(t, w, name, opt) }
			w.ctrl = func(t testing.TB, _ string, eng transfer.Engine) transfer.ControlChannel {
				ch, err := nixlnotif.New(eng)
				if err != nil {
					t.Fatal(err)
				}
				if got := ch.MaxMessageSize(); got != ec.limit {
					t.Fatalf("nixlnotif MaxMessageSize = %d, want the engine's %d", got, ec.limit)
				}
				return ch
			}
			cfg := testConfig()
			cfg.ArenaSize, cfg.Granularity, cfg.MaxChunk = 32<<20, 1<<20, 8<<20
			a, b := w.node("a", cfg), w.node("b", cfg)
			src, dst := a.buffer(t, blocks*block), b.buffer(t, blocks*block)
			connect(t, a, b)
			j := prepare(src, dst, kvLayout{count: blocks, size: block, fragmented: true}, 7)

			// The plan the sender makes: every DATA within the limit, and
			// more chunks than the 2 an unlimited plan has.
			p, err := a.plan(Request{Peer: "b", Src: j.src, Dst: j.dst})
			if err != nil {
				t.Fatal(err)
			}
			p.FillAll()
			maxData := 0
			for _, c := range p.Chunks {
				n, err := wire.EncodedLen(&wire.Data{Request: 1, Chunk: uint32(c.Index), Region: 1, Runs: c.Scatter, TraceParent: string(make([]byte, traceAllowance))})
				if err != nil {
					t.Fatal(err)
				}
				maxData = max(maxData, n)
			}
			if maxData > ec.limit {
				t.Fatalf("largest DATA is %d bytes, limit %d", maxData, ec.limit)
			}
			free, err := plan.Build(j.src, j.dst, plan.Options{MaxChunk: cfg.MaxChunk})
			if err != nil {
				t.Fatal(err)
			}
			// The unlimited plan's DATA is gpt-oss's (~100 KB for 4,096
			// runs of 2 KiB): more than the 16 and 64 KiB limits, so
			// those cases do test a plan made smaller.
			free.FillAll()
			freeData := 0
			for _, c := range free.Chunks {
				n, err := wire.EncodedLen(&wire.Data{Request: 1, Chunk: uint32(c.Index), Region: 1, Runs: c.Scatter, TraceParent: string(make([]byte, traceAllowance))})
				if err != nil {
					t.Fatal(err)
				}
				freeData = max(freeData, n)
			}
			if freeData < 96<<10 {
				t.Fatalf("the unlimited plan's largest DATA is %d bytes, want gpt-oss's ~100 KB", freeData)
			}
			if ec.limit < freeData && len(p.Chunks) <= len(free.Chunks) {
				t.Fatalf("%d chunks under a %d-byte limit, no more than the unlimited plan's %d", len(p.Chunks), ec.limit, len(free.Chunks))
			}
			t.Logf("%d chunks (unlimited plan: %d, largest DATA %d), largest DATA %d of %d bytes", len(p.Chunks), len(free.Chunks), freeData, maxData, ec.limit)

			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
			if err != nil {
				t.Fatal(err)
			}
			if bt.Route() != RouteBounce {
				t.Fatalf("route = %v (%s), want bounce", bt.Route(), bt.RouteReason())
			}
			if err := wait(t, bt); err != nil {
				t.Fatal(err)
			}
			j.verify(t)
			if d := a.Stats().SendDrops + b.Stats().SendDrops; d != 0 {
				t.Fatalf("%d control messages dropped", d)
			}
			settled(t, a, b)
		})
	}
}

// limitEngine makes the engines of one case of
// TestDenseFragmentedPlanFitsNotifyLimit; limit is their notification limit.
type limitEngine struct {
	name  string
	limit int
	make  func(t testing.TB, w *world, name string, opt loopback.Options) transfer.Engine
}

// TestSplitCredits: GRANTs are cut to fit a message limit, in order, none
// lost; no limit is one GRANT.
func TestSplitCredits(t *testing.T) {
	cs := make([]wire.Credit, 10)
	for i := range cs {
		cs[i] = wire.Credit{Chunk: uint32(i), Len: 1}
	}
	if got := splitCredits(cs, 0); len(got) != 1 || len(got[0]) != 10 {
		t.Fatalf("no limit: %d grants", len(got))
	}
	limit := wire.GrantOverhead + 3*wire.CreditSize
	got := splitCredits(cs, limit)
	if len(got) != 4 {
		t.Fatalf("limit for 3 credits: %d grants, want 4", len(got))
	}
	next := uint32(0)
	for _, g := range got {
		n, err := wire.EncodedLen(&wire.Grant{Request: 1, Credits: g})
		if err != nil || n > limit {
			t.Fatalf("GRANT of %d credits encodes to %d bytes (%v), limit %d", len(g), n, err, limit)
		}
		for _, c := range g {
			if c.Chunk != next {
				t.Fatalf("credit for chunk %d, want %d", c.Chunk, next)
			}
			next++
		}
	}
	if next != 10 {
		t.Fatalf("%d credits after splitting, want 10", next)
	}
}
