package pipeline

import (
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// BenchmarkPlugins moves 81,920 fragmented 4 KiB blocks (320 MiB) on the
// bounce path through the same components in-process and out of process,
// alternating within every iteration, and reports the throughputs and the
// ratio plugin/in-process measured side by side:
//
//   - engine: the TCP engine in-process vs the same engine in a plugin
//     process (plugins/internal/testplugin);
//
//   - stages: the host gather and scatter stages in-process (waking the
//     reactor on completion, as node builds them) vs the same stages in
//     plugin processes, polled over gRPC (the TCP engine in-process in
//     both);
//
//   - engine-guard: the TCP engine in a plugin process both times, the
//     receiver's asking a write guard installed on the host (one callback
//     round trip per incoming frame, docs/PLUGINS.md) on the "plugin"
//     side, none on the "in-process" side: the ratio is the cost of the
//     guard crossing the process boundary (the guard admits every write;
//     its own cost in process is a map lookup).
//
//     go test -run '^$' -bench BenchmarkPlugins -benchtime 5x ./pipeline/
func BenchmarkPlugins(b *testing.B) {
	bin := buildTestPlugin(b)
	spec := plugins.Spec{Path: bin}
	pluginEngine := func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
		e, err := plugins.OpenEngine(plugins.Spec{Path: bin, Notify: opt.OnComplete}, plugins.Restart{}, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	guardedPluginEngine := func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
		e := pluginEngine(t, name, opt)
		g, ok := e.(transfer.WriteGuarded)
		if !ok {
			t.Fatalf("plugin engine %T is not a transfer.WriteGuarded", e)
		}
		g.SetWriteGuard(func(_ string, d transfer.Desc) (transfer.Desc, error) { return d, nil })
		return e
	}
	pluginStages := func(t testing.TB, name string, reg *mem.Registry, _ transfer.Engine, notify func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
		opts := map[string]string{"copy_contexts": "8"}
		g, err := plugins.OpenGatherer(plugins.Spec{Path: spec.Path, Notify: notify}, plugins.Restart{}, name, opts, reg)
		if err != nil {
			t.Fatal(err)
		}
		sc, err := plugins.OpenScatterer(plugins.Spec{Path: spec.Path, Notify: notify}, plugins.Restart{}, name, opts, reg)
		if err != nil {
			t.Fatal(err)
		}
		return g, sc, nil
	}
	type side struct {
		engine func(testing.TB, string, loopback.Options) transfer.Engine
		stages func(testing.TB, string, *mem.Registry, transfer.Engine, func()) (transfer.Gatherer, transfer.Scatterer, transfer.Writer)
	}
	for _, c := range []struct {
		name            string
		inproc, plugins side
	}{
		{"engine", side{newTCPEngine, nil}, side{pluginEngine, nil}},
		{"gather+scatter", side{newTCPEngine, nil}, side{newTCPEngine, pluginStages}},
		{"engine-guard", side{pluginEngine, nil}, side{guardedPluginEngine, nil}},
	} {
		b.Run(c.name+"/81920x4KiB", func(b *testing.B) {
			const n, size = 81920, 4096
			total := uint64(n) * size
			type rig struct {
				x, y *node
				j    job
			}
			w := zmqWorld(b, 0) // one world: its leak check runs once, after both rigs
			mk := func(s side, suffix string) rig {
				w.engine, w.stages = s.engine, s.stages
				cfg := DefaultConfig()
				x, y := w.node("x"+suffix, cfg), w.node("y"+suffix, cfg)
				src, dst := x.buffer(b, total), y.buffer(b, total)
				connect(b, x, y)
				return rig{x, y, prepare(src, dst, kvLayout{count: n, size: size, fragmented: true}, 7)}
			}
			in, out := mk(c.inproc, "-in"), mk(c.plugins, "-plugin")
			move := func(r rig) time.Duration {
				start := time.Now()
				bt, err := r.x.Submit(Request{Peer: r.y.Name(), Src: r.j.src, Dst: r.j.dst, Route: RouteBounce})
				if err != nil {
					b.Fatal(err)
				}
				if err := wait(b, bt); err != nil {
					b.Fatal(err)
				}
				if err := bt.Release(); err != nil {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			move(in) // warm up both: connections, shares of the memory
			move(out)
			var tin, tout time.Duration
			b.SetBytes(int64(2 * total))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%2 == 0 {
					tin += move(in)
					tout += move(out)
				} else {
					tout += move(out)
					tin += move(in)
				}
			}
			b.StopTimer()
			in.j.verify(b)
			out.j.verify(b)
			mb := float64(total) * float64(b.N) / 1e6
			b.ReportMetric(mb/tin.Seconds(), "inproc-MB/s")
			b.ReportMetric(mb/tout.Seconds(), "plugin-MB/s")
			b.ReportMetric(tin.Seconds()/tout.Seconds(), "plugin/inproc")
		})
	}
}
