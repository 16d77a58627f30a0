package pipeline

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/bouncekv/bounce/pipeline/costmodel"
	"github.com/bouncekv/bounce/transfer"
)

// costDeclarer is an engine that declares its costs for route auto: the
// cost of posting one descriptor of a direct write, the fixed cost of one
// write and its bulk bandwidth in bytes per second.
type costDeclarer interface {
	RouteCosts() (postPerDesc, perWrite time.Duration, bandwidth float64)
}

// Engine costs assumed for an engine that declares none; the model's
// corrections learn the rest from observed transfers.
var undeclaredCosts = costmodel.Engine{PostPerDesc: time.Microsecond, PerWrite: 50 * time.Microsecond, Bandwidth: 2e9}

// Host costs the copy probe does not measure: the control round of one
// chunk and the WANT/GRANT round trip (learned through the corrections).
const (
	defaultPerChunk  = 20 * time.Microsecond
	defaultRoundTrip = 100 * time.Microsecond
)

// engineCosts returns what eng declares, or undeclaredCosts.
func engineCosts(eng transfer.Engine) costmodel.Engine {
	if d, ok := eng.(costDeclarer); ok {
		post, write, bw := d.RouteCosts()
		c := costmodel.Engine{PostPerDesc: post, PerWrite: write, Bandwidth: bw}
		if c.Validate() == nil {
			return c
		}
	}
	return undeclaredCosts
}

// RoutePrediction is route auto's prediction for one request: how long it
// would take on each path. Made is false when no prediction was made (a
// forced route, or a request the gates sent direct).
type RoutePrediction struct {
	Made           bool
	Bounce, Direct time.Duration
	// Explore says the route is the one predicted slower, taken on purpose
	// to re-measure it.
	Explore bool
}

// RouteModel is a snapshot of route auto's cost model: the engine and host
// costs it predicts with and the corrections it learned (observed over
// predicted: the bounce path's, and the engine's posting cost and bulk time
// as the direct path observed them), with the observations of each path.
type RouteModel struct {
	Engine                       costmodel.Engine
	Host                         costmodel.Host
	BounceCorrection             float64
	PostCorrection               float64
	WireCorrection               float64
	BounceObserved, DirectObserv uint64
}

// router is route auto's cost model. Submit callers decide with it and
// completing batches feed it, on many goroutines, hence the mutex.
type router struct {
	maxChunk uint64
	mu       sync.Mutex
	m        *costmodel.Model
}

func newRouter(eng transfer.Engine, host costmodel.Host, maxChunk uint64) (*router, error) {
	m, err := costmodel.New(engineCosts(eng), host, costmodel.Options{})
	if err != nil {
		return nil, fmt.Errorf("pipeline: route model: %w", err)
	}
	return &router{maxChunk: maxChunk, m: m}, nil
}

// shape describes req for the model without planning it.
func (r *router) shape(req Request) costmodel.Shape {
	var s costmodel.Shape
	if br := req.Blocks; br != nil {
		s = costmodel.Shape{Runs: blockRuns(br), Descs: req.count(), Bytes: req.bytes()}
	} else {
		s.Runs = costmodel.Runs(req.Src, req.Dst)
		for _, d := range req.Src {
			if d.Len != 0 {
				s.Descs++
				s.Bytes += d.Len
			}
		}
	}
	s.Chunks = int((s.Bytes + r.maxChunk - 1) / r.maxChunk)
	return s
}

// decide predicts req on both paths and picks one.
func (r *router) decide(req Request) (costmodel.Decision, costmodel.Shape) {
	s := r.shape(req)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.Decide(s), s
}

// observe feeds the model what a request of shape s took on route.
func (r *router) observe(route costmodel.Route, s costmodel.Shape, elapsed time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m.Observe(route, s, elapsed)
}

func (r *router) snapshot() RouteModel {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, h := r.m.Costs()
	b, p, w, nb, nd := r.m.Corrections()
	return RouteModel{Engine: e, Host: h, BounceCorrection: b, PostCorrection: p, WireCorrection: w, BounceObserved: nb, DirectObserv: nd}
}

// serialStages says whether this machine has too few cores for the gather,
// write and scatter of different chunks to overlap.
func serialStages() bool { return runtime.GOMAXPROCS(0) < 4 }

// Probe sizes of the host copy calibration.
const (
	probeBytes = 32 << 20 // beyond the caches, so the probe sees memory bandwidth
	probeRun   = 4 << 10
	probeTries = 2
)

// calibrateHost times the gather stage on the agent's own arena: probeBytes
// copied as one run and as probeBytes/probeRun runs in shuffled order, the
// best of probeTries each, and fits the copy bandwidth and per-run cost.
// It takes some tens of milliseconds at start.
func calibrateHost(g transfer.Gatherer, arena transfer.Desc) (costmodel.Host, error) {
	h := costmodel.Host{PerChunk: defaultPerChunk, RoundTrip: defaultRoundTrip, Serial: serialStages()}
	n := uint64(probeBytes)
	if arena.Len < 2*n {
		n = arena.Len / 2 &^ (probeRun - 1)
	}
	if n < 16*probeRun {
		return h, fmt.Errorf("pipeline: calibrate: arena of %d bytes too small for the copy probe", arena.Len)
	}
	region := transfer.Desc{Addr: arena.Addr + n, Len: n, Device: arena.Device, Kind: arena.Kind}
	one := []transfer.Run{{Addr: arena.Addr, Len: n, Count: 1}}
	k := int(n / probeRun)
	many := make([]transfer.Run, k)
	for i := range many {
		// A fixed permutation (7919 is prime) so no two runs merge.
		src := uint64(i*7919%k) * probeRun
		many[i] = transfer.Run{RegionOff: uint64(i) * probeRun, Addr: arena.Addr + src, Len: probeRun, Count: 1}
	}
	best := func(runs []transfer.Run) (time.Duration, error) {
		var b time.Duration
		for i := 0; i <= probeTries; i++ { // the first try warms up
			start := time.Now()
			if err := gatherNow(g, region, runs); err != nil {
				return 0, err
			}
			if d := time.Since(start); i > 0 && (b == 0 || d < b) {
				b = d
			}
		}
		return b, nil
	}
	t1, err := best(one)
	if err != nil {
		return h, err
	}
	tk, err := best(many)
	if err != nil {
		return h, err
	}
	bw, perRun, err := costmodel.FitCopy(costmodel.Probe{Bytes: n, Runs: 1, Elapsed: t1}, costmodel.Probe{Bytes: n, Runs: k, Elapsed: tk})
	if err != nil {
		return h, err
	}
	h.CopyBandwidth, h.PerRun = bw, perRun
	return h, nil
}

// probeTimeout bounds one probe gather.
const probeTimeout = 2 * time.Second

// gatherNow runs one gather to completion, within probeTimeout.
func gatherNow(g transfer.Gatherer, region transfer.Desc, runs []transfer.Run) error {
	deadline := time.Now().Add(probeTimeout)
	var op transfer.Op
	for {
		if time.Now().After(deadline) {
			return fmt.Errorf("pipeline: calibrate: gather busy for %v", probeTimeout)
		}
		var err error
		if op, err = g.Gather(region, runs); err == nil {
			break
		}
		if !errors.Is(err, transfer.ErrBusy) {
			return fmt.Errorf("pipeline: calibrate: gather: %w", err)
		}
		runtime.Gosched()
	}
	if d, ok := op.(doneSignaller); ok {
		select {
		case <-d.Done():
		case <-time.After(probeTimeout):
		}
	}
	for {
		if time.Now().After(deadline) {
			// The op may still copy within the arena: the caller turns
			// bounce off rather than reuse it.
			return fmt.Errorf("pipeline: calibrate: gather did not finish within %v: %w", probeTimeout, transfer.ErrNotQuiescent)
		}
		st, err := op.Poll()
		if st.Terminal() {
			if rerr := op.Release(); err == nil {
				err = rerr
			}
			if err != nil {
				return fmt.Errorf("pipeline: calibrate: gather: %w", err)
			}
			return nil
		}
		runtime.Gosched()
	}
}
