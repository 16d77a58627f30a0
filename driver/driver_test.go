package driver

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/workload"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair builds two in-process nodes (loopback engine, inproc control plane)
// and a registered destination buffer of size bytes on the receiver.
func pair(t *testing.T, size uint64) (*node.Node, *node.Node, *mem.Buffer) {
	t.Helper()
	// Allocated first, so it is freed last: after both nodes closed, when
	// no scatter of an abandoned request can still write into it.
	dst, err := mem.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Free() })
	f := node.Builtin()
	mk := func(name string) *node.Node {
		c := config.Default()
		c.Agent.Name = name
		c.Engine.Kind, c.ControlPlane.Kind = "loopback", "inproc"
		c.Bounce.ArenaSize, c.Bounce.MaxChunk, c.Bounce.MinDescriptors = 16*config.MiB, 2*config.MiB, 64
		n, err := node.Build(c, f, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close(context.Background()) })
		return n
	}
	a, b := mk("a"), mk("b")
	if err := b.Agent.RegisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]*node.Node{{a, b}, {b, a}} {
		blob, err := p[1].Agent.Descriptor()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p[0].Agent.LoadPeer(blob); err != nil {
			t.Fatal(err)
		}
	}
	return a, b, dst
}

// driverPair is pair with a driver of size bytes of source on the sender,
// closed before the nodes.
func driverPair(t *testing.T, size uint64) (*node.Node, *node.Node, *mem.Buffer, *Driver) {
	t.Helper()
	a, b, dst := pair(t, size)
	d, err := New(a.Agent, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return a, b, dst, d
}

func TestRunMeasuresAndLands(t *testing.T) {
	spec := workload.Spec{DescSize: 4096, Count: 512, Fragmented: true, Seed: 3}
	const requests = 4
	_, _, dst, d := driverPair(t, requests*spec.Bytes())
	for _, route := range []pipeline.Route{pipeline.RouteBounce, pipeline.RouteDirect} {
		clear(dst.Bytes())
		o := Options{Spec: spec, Requests: requests, Route: route}
		res, err := d.Run(context.Background(), Target{Peer: "b", Buffer: dst.Desc()}, o)
		if err != nil {
			t.Fatal(err)
		}
		if res.Route != route.String() || res.Requests != requests || res.Failed != 0 || res.Bytes != requests*spec.Bytes() {
			t.Fatalf("%v: result %+v", route, res)
		}
		if len(res.Latencies) != requests || !slices.IsSorted(res.Latencies) || res.Elapsed < res.Latencies[requests-1] {
			t.Fatalf("%v: latencies %v, elapsed %v", route, res.Latencies, res.Elapsed)
		}
		if res.Percentile(100) != res.Latencies[requests-1] || res.Percentile(0) != res.Latencies[0] || res.Throughput() <= 0 {
			t.Fatalf("%v: percentiles or throughput wrong: %+v", route, res)
		}
		for i := 0; i < requests; i++ { // request i landed in the i-th slice, with its own seed
			per := spec.Bytes()
			if err := o.RequestSpec(i).Verify(dst.Bytes()[uint64(i)*per : uint64(i+1)*per]); err != nil {
				t.Fatalf("%v: request %d: %v", route, i, err)
			}
		}
	}
}

// TestRunClosedLoop checks the closed loop: never more than InFlight
// requests at once, every request lands with its own bytes, and the steady
// window holds exactly the requests after the first InFlight.
func TestRunClosedLoop(t *testing.T) {
	// 8 MiB requests take milliseconds, far longer than a submit, so the
	// loop reaches its cap and the burst has several in flight.
	spec := workload.Spec{DescSize: 4096, Count: 2048, Fragmented: true, Seed: 9}
	const requests, inFlight = 7, 2
	_, _, dst, d := driverPair(t, requests*spec.Bytes())
	o := Options{Spec: spec, Requests: requests, InFlight: inFlight, Route: pipeline.RouteBounce}
	res, err := d.Run(context.Background(), Target{Peer: "b", Buffer: dst.Desc()}, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 0 || len(res.Latencies) != requests || len(res.Steady) != requests-inFlight || !slices.IsSorted(res.Steady) {
		t.Fatalf("result %+v", res)
	}
	if res.PeakInFlight != inFlight {
		t.Fatalf("peak in flight %d, want the cap %d", res.PeakInFlight, inFlight)
	}
	for i := 0; i < requests; i++ {
		per := spec.Bytes()
		if err := o.RequestSpec(i).Verify(dst.Bytes()[uint64(i)*per : uint64(i+1)*per]); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	// A burst has no steady window and may have every request in flight.
	clear(dst.Bytes())
	o.InFlight = 0
	if res, err = d.Run(context.Background(), Target{Peer: "b", Buffer: dst.Desc()}, o); err != nil {
		t.Fatal(err)
	}
	if res.Steady != nil || len(res.Latencies) != requests || res.PeakInFlight < 2 || res.PeakInFlight > requests {
		t.Fatalf("burst result: %d latencies, steady %v, peak in flight %d", len(res.Latencies), res.Steady, res.PeakInFlight)
	}
	// A cancelled context stops submitting; what was submitted is waited for.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.Run(ctx, Target{Peer: "b", Buffer: dst.Desc()}, o); err == nil || !strings.Contains(err.Error(), "not submitted") {
		t.Fatalf("cancelled run: err = %v", err)
	}
}

// TestRunDeadlineMidRun: when ctx ends with requests in flight, Run abandons
// them and returns only once every submitted request is retired and
// quiescent, so the buffers can be reused at once.
func TestRunDeadlineMidRun(t *testing.T) {
	spec := workload.Spec{DescSize: 4096, Count: 2048, Fragmented: true, Seed: 5}
	const requests = 7
	a, _, dst, d := driverPair(t, requests*spec.Bytes())
	interrupted := false
	for _, delay := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond} {
		// Cancel delay after the run's first submit (the source fill before
		// it takes a while), so requests are in flight when ctx ends.
		before := a.Agent.Stats().BounceSubmits
		ctx, cancel := context.WithCancel(context.Background())
		canceller := make(chan struct{})
		go func() {
			defer close(canceller)
			for a.Agent.Stats().BounceSubmits == before {
				time.Sleep(50 * time.Microsecond)
			}
			time.Sleep(delay)
			cancel()
		}()
		res, err := d.Run(ctx, Target{Peer: "b", Buffer: dst.Desc()}, Options{Spec: spec, Requests: requests, InFlight: 2, Route: pipeline.RouteBounce})
		<-canceller
		st := a.Agent.Stats()
		if submitted := st.BounceSubmits + st.DirectSubmits; st.Succeeded+st.Failed != submitted {
			t.Fatalf("after %v: %d submitted, %d succeeded + %d failed: requests outlived Run", delay, submitted, st.Succeeded, st.Failed)
		}
		if res.NotQuiescent != 0 {
			t.Fatalf("after %v: %d requests not quiescent", delay, res.NotQuiescent)
		}
		if err != nil || res.Failed > 0 {
			interrupted = true
			if len(res.Latencies)+res.Failed > requests {
				t.Fatalf("after %v: %d succeeded + %d failed of %d", delay, len(res.Latencies), res.Failed, requests)
			}
		}
	}
	if !interrupted {
		t.Skip("every run finished before its deadline; nothing was interrupted")
	}
}

func TestRunRefusesWhatDoesNotFit(t *testing.T) {
	spec := workload.Spec{DescSize: 4096, Count: 256, Seed: 1}
	a, _, dst := pair(t, spec.Bytes())
	d, err := New(a.Agent, 2*spec.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	tgt := Target{Peer: "b", Buffer: dst.Desc()}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Spec: spec, Requests: 0}, "requests must be positive"},
		{Options{Spec: spec, Requests: 3}, "source buffer"},
		{Options{Spec: spec, Requests: 2}, "peer's"},
		{Options{Spec: workload.Spec{}, Requests: 1}, "positive descriptor size"},
	} {
		if _, err := d.Run(context.Background(), tgt, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%+v: err = %v, want it to mention %q", tc.o, err, tc.want)
		}
	}
}

func TestRunCountsFailures(t *testing.T) {
	spec := workload.Spec{DescSize: 4096, Count: 256, Seed: 1}
	_, b, dst, d := driverPair(t, spec.Bytes())
	// The receiver drops its destination: every write is refused.
	if err := b.Agent.DeregisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := d.Run(ctx, Target{Peer: "b", Buffer: dst.Desc()}, Options{Spec: spec, Requests: 1, Route: pipeline.RouteDirect})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 1 || res.FirstErr == nil || res.Bytes != 0 || len(res.Latencies) != 0 {
		t.Fatalf("result %+v", res)
	}
}

func TestPercentileNearestRank(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	lat := []time.Duration{ms(1), ms(2), ms(3), ms(4), ms(5), ms(6), ms(7), ms(8), ms(9), ms(10)}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{0, ms(1)}, {10, ms(1)}, {50, ms(5)}, {90, ms(9)}, {99, ms(10)}, {100, ms(10)}} {
		if got := Percentile(lat, tc.p); got != tc.want {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %v, want 0", got)
	}
}

// TestCostModelDirectIsNoFallback: route auto's cost model sends a
// request direct when it predicts direct faster (in one process the
// loopback engine's direct path is a memcpy, so it always does); that is
// the agent's choice, reported in Route and Reason, not a fallback.
func TestCostModelDirectIsNoFallback(t *testing.T) {
	spec := workload.Spec{DescSize: 4096, Count: 512, Fragmented: true, Seed: 5}
	_, _, dst, d := driverPair(t, spec.Bytes())
	res, err := d.Run(context.Background(), Target{Peer: "b", Buffer: dst.Desc()}, Options{Spec: spec, Requests: 1, Route: pipeline.RouteAuto})
	if err != nil {
		t.Fatal(err)
	}
	if res.Route != "direct" || !strings.HasPrefix(res.Reason, "auto: predicted bounce ") || res.Failed != 0 {
		t.Fatalf("route %q (%s), %d failed; want direct by the cost model", res.Route, res.Reason, res.Failed)
	}
	if res.Fallbacks != 0 || res.FallbackReason != "" {
		t.Fatalf("the cost model's choice counted as %d fallback(s): %q", res.Fallbacks, res.FallbackReason)
	}
}
