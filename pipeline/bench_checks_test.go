package pipeline

import (
	"crypto/rand"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// authWorld is a world of authenticated tcp engines and CURVE zmq
// channels (security.mode authenticate, peers admitted when loaded); opt
// gives a node its identity.
func authWorld(t testing.TB) (w *world, opt nodeOpt) {
	ids := map[string]*security.Peers{}
	peersOf := func(name string) *security.Peers {
		if p := ids[name]; p != nil {
			return p
		}
		id, err := security.Generate(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		p := security.NewPeers(security.Authenticate, id, security.Policy{Loaded: true})
		ids[name] = p
		return p
	}
	w = newWorld(t)
	w.engine = func(t testing.TB, name string, _ loopback.Options) transfer.Engine {
		e, err := tcp.New(tcp.Config{Name: name, Peers: peersOf(name)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	w.ctrl = func(t testing.TB, name string, _ transfer.Engine) transfer.ControlChannel {
		ch, err := zmq.New(zmq.Config{Name: name, BindAddress: "127.0.0.1", Peers: peersOf(name)})
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	return w, func(s *Settings) { s.Peers = peersOf(s.Name) }
}

// BenchmarkReceiverChecks moves fragmented transfers (81,920 × 4 KiB and
// 36,864 × 2 KiB) over the bounce path between two authenticated agents
// on the tcp engine, with the receiver's per-run DATA check and its
// revocation fence on and off (Agent.checksOff, for benchmarks only) in
// alternating transfers of one pair of agents, and reports both
// throughputs and the ratio checked/unchecked of the times (≤ 1.03 is the
// budget).
func BenchmarkReceiverChecks(b *testing.B) {
	for _, c := range []struct{ n, size uint64 }{{81920, 4096}, {36864, 2048}} {
		b.Run(fmt.Sprintf("%dx%dB", c.n, c.size), func(b *testing.B) {
			w, opt := authWorld(b)
			cfg := DefaultConfig()
			cfg.ArenaSize = 64 << 20
			cfg.MaxChunk = 8 << 20
			cfg.Granularity = 1 << 20
			x, y := w.node("x", cfg, opt), w.node("y", cfg, opt)
			if y.guard == nil || y.guard.fence == nil {
				b.Fatal("the receiver has no write guard with a fence: nothing to measure")
			}
			src, dst := x.buffer(b, c.n*c.size), y.buffer(b, c.n*c.size)
			connect(b, x, y)
			j := prepare(src, dst, kvLayout{count: int(c.n), size: c.size, fragmented: true}, 42)
			run := func(checked bool) time.Duration {
				y.checksOff.Store(!checked)
				start := time.Now()
				bt, err := x.Submit(Request{Peer: "y", Src: j.src, Dst: j.dst, Route: RouteBounce})
				if err != nil {
					b.Fatal(err)
				}
				if err := wait(b, bt); err != nil {
					b.Fatal(err)
				}
				if bt.Route() != RouteBounce {
					b.Fatalf("route %v", bt.Route())
				}
				return time.Since(start)
			}
			run(true) // warm up outside the measurement
			run(false)
			var ton, toff time.Duration
			ratios := make([]float64, 0, b.N)
			b.SetBytes(int64(2 * c.n * c.size))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var on, off time.Duration
				for _, checked := range [2][2]bool{{true, false}, {false, true}}[i%2] {
					if d := run(checked); checked {
						on = d
					} else {
						off = d
					}
				}
				ton, toff = ton+on, toff+off
				ratios = append(ratios, on.Seconds()/off.Seconds())
			}
			b.StopTimer()
			y.checksOff.Store(false)
			j.verify(b)
			mb := float64(c.n*c.size) * float64(b.N) / 1e6
			b.ReportMetric(mb/ton.Seconds(), "checked-MB/s")
			b.ReportMetric(mb/toff.Seconds(), "unchecked-MB/s")
			b.ReportMetric(ton.Seconds()/toff.Seconds(), "checked/unchecked")
			// The median of the adjacent pairs' ratios: robust to a burst
			// of load from other work that hits a few pairs.
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "median-checked/unchecked")
		})
	}
}

// BenchmarkDataCheck is the per-run DATA check alone (scatterDests.check):
// 2,048 runs of 4 KiB (one 8 MiB chunk of fragmented blocks) into one of 8
// registrations, with authentication's peer check. It reports ns/run and
// allocations (none).
func BenchmarkDataCheck(b *testing.B) {
	s := &scatterDests{byPeer: true}
	for i := uint64(0); i < 8; i++ {
		s.add(transfer.Desc{Addr: (i + 1) << 30, Len: 512 << 20}, []string{"x", "y"})
	}
	runs := make([]transfer.Run, 2048)
	for i := range runs {
		runs[i] = transfer.Run{RegionOff: uint64(i) * 4096, Addr: 3<<30 + uint64((i*7919)%65536)*4096, Len: 4096, Count: 1}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.check("y", runs, 8<<20); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(runs)), "ns/run")
}
