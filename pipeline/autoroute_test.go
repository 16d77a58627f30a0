package pipeline

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/transfer"
)

// costlyEngine is a loopback engine that declares costs of its own, so a
// test controls what route auto's model believes about the engine.
type costlyEngine struct {
	*loopback.Engine
	post, write time.Duration
	bw          float64
}

func (e costlyEngine) RouteCosts() (time.Duration, time.Duration, float64) {
	return e.post, e.write, e.bw
}

func autoWorld(t *testing.T, post time.Duration, bw float64) *world {
	w := newWorld(t)
	w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine {
		e, err := w.fab.NewEngine(name, opt)
		if err != nil {
			t.Fatal(err)
		}
		return costlyEngine{Engine: e, post: post, write: 10 * time.Microsecond, bw: bw}
	}
	return w
}

// TestRouteAutoFollowsTheEngineCosts: with the cost model on, an eligible
// auto request goes bounce over an engine that declares slow per-descriptor
// posts and direct over one that declares them free; the batch carries the
// prediction and the reason; the completed request is observed.
func TestRouteAutoFollowsTheEngineCosts(t *testing.T) {
	for _, c := range []struct {
		name string
		post time.Duration
		bw   float64
		want Route
	}{
		// 1ms a post: 2s predicted for direct, beyond any copy bandwidth
		// the start-up probe measures on a loaded machine.
		{"slow-posts", time.Millisecond, 10e9, RouteBounce},
		{"free-posts", 0, 1e12, RouteDirect},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := autoWorld(t, c.post, c.bw)
			cfg := testConfig()
			cfg.CostModel = true
			logs := &syncBuffer{}
			a := w.node("a", cfg, func(s *Settings) { s.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
			b := w.node("b", cfg)
			const n, size = 2048, 2048
			src, dst := a.buffer(t, n*size), b.buffer(t, n*size)
			connect(t, a, b)
			m, ok := a.RouteModel()
			if !ok || m.Host.CopyBandwidth <= 0 {
				t.Fatalf("RouteModel = %+v, %v; want a calibrated copy bandwidth", m, ok)
			}
			j := prepare(src, dst, kvLayout{count: n, size: size, fragmented: true}, 3)
			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
			if err != nil {
				t.Fatal(err)
			}
			if err := wait(t, bt); err != nil {
				t.Fatal(err)
			}
			j.verify(t)
			p := bt.Prediction()
			if bt.Route() != c.want || !p.Made || p.Explore {
				t.Fatalf("route %v (%s), prediction %+v; want %v predicted", bt.Route(), bt.RouteReason(), p, c.want)
			}
			if (p.Bounce < p.Direct) != (c.want == RouteBounce) {
				t.Fatalf("prediction %+v does not favour %v", p, c.want)
			}
			if !strings.HasPrefix(bt.RouteReason(), "auto: predicted bounce ") {
				t.Fatalf("reason %q", bt.RouteReason())
			}
			m, _ = a.RouteModel()
			nb, nd := m.BounceObserved, m.DirectObserv
			if (c.want == RouteBounce && (nb != 1 || nd != 0)) || (c.want == RouteDirect && (nb != 0 || nd != 1)) {
				t.Fatalf("observations bounce %d direct %d after one %v request", nb, nd, c.want)
			}
			st := a.Stats()
			if st.AutoBounce+st.AutoDirect != 1 {
				t.Fatalf("auto decisions counted: %+v", st)
			}
			// The model's choice of direct is no fallback: not counted
			// as one, not warned.
			if st.Fallbacks != 0 || strings.Contains(logs.String(), "take the direct path") {
				t.Fatalf("the cost model's choice counted as %d fallback(s); logs:\n%s", st.Fallbacks, logs.String())
			}

			// A forced route is not predicted but still observed.
			j2 := prepare(src, dst, kvLayout{count: n, size: size, fragmented: true}, 4)
			bt, err = a.Submit(Request{Peer: "b", Src: j2.src, Dst: j2.dst, Route: RouteBounce})
			if err != nil {
				t.Fatal(err)
			}
			if err := wait(t, bt); err != nil {
				t.Fatal(err)
			}
			j2.verify(t)
			if bt.Route() != RouteBounce || bt.Prediction().Made {
				t.Fatalf("forced bounce: route %v, prediction %+v", bt.Route(), bt.Prediction())
			}
			if m, _ = a.RouteModel(); m.BounceObserved != nb+1 {
				t.Fatalf("forced bounce not observed: %d bounce observations, had %d", m.BounceObserved, nb)
			}
			settled(t, a, b)
		})
	}
}

// TestRouteAutoGatesStillApply: a request below min_descriptors goes direct
// by the gate, with no prediction.
func TestRouteAutoGatesStillApply(t *testing.T) {
	w := autoWorld(t, 20*time.Microsecond, 10e9)
	cfg := testConfig()
	cfg.CostModel = true
	a, b := w.node("a", cfg), w.node("b", cfg)
	src, dst := a.buffer(t, 1<<20), b.buffer(t, 1<<20)
	connect(t, a, b)
	j := prepare(src, dst, kvLayout{count: 8, size: 4096, fragmented: true}, 5)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
	if bt.Route() != RouteDirect || bt.Prediction().Made || !strings.Contains(bt.RouteReason(), "min_descriptors") {
		t.Fatalf("route %v (%s), prediction %+v; want direct by the gate", bt.Route(), bt.RouteReason(), bt.Prediction())
	}
}

// TestRouteAutoPredictionOnTheSpan: the transfer span carries route auto's
// reason and both predicted times.
func TestRouteAutoPredictionOnTheSpan(t *testing.T) {
	w := autoWorld(t, 20*time.Microsecond, 10e9)
	cfg := testConfig()
	cfg.CostModel = true
	oa := newObserved(t)
	a, b := w.node("a", cfg, withObs(oa)), w.node("b", cfg)
	j := kvJob(t, a, b, 1024, 9)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
	p := bt.Prediction()
	tr := one(t, oa, spanTransfer)
	wantAttr(t, tr, attrReason, whyCostModel)
	wantAttr(t, tr, attrPredBounce, float64(p.Bounce)/float64(time.Millisecond))
	wantAttr(t, tr, attrPredDirect, float64(p.Direct)/float64(time.Millisecond))
	wantAttr(t, tr, attrPredExplore, false)
}
