package costmodel

import (
	"fmt"
	"math"
	"time"
)

// Route is a decision.
type Route uint8

// The two paths.
const (
	Direct Route = iota
	Bounce
)

// String names the route.
func (r Route) String() string {
	if r == Bounce {
		return "bounce"
	}
	return "direct"
}

// Defaults of a Model's zero fields.
const (
	// DefaultAlpha weighs a new observation in the moving average of
	// observed over predicted time.
	DefaultAlpha = 0.2
	// DefaultExploreEvery: one close call in this many takes the path
	// predicted slower, so its correction is refreshed too.
	DefaultExploreEvery = 16
	// DefaultCloseCall is how near (as a ratio) two predictions must be
	// for Decide to explore.
	DefaultCloseCall = 1.5
	// unobservedCall is how near the predictions must be for Decide to try
	// a path never observed yet, once.
	unobservedCall = 4.0
)

// correction bounds: an observation more than this far from its
// prediction is clamped, and one observation moves a correction by at most
// a factor of maxStep, so one cold or stalled request (a first transfer's
// connection setup and page faults) cannot flip every later decision.
const (
	minCorrection, maxCorrection = 0.05, 20.0
	maxStep                      = 2.0
)

// Model predicts both paths for one engine and host and learns from
// observed transfers. The zero value is not usable: call New.
type Model struct {
	engine Engine
	host   Host
	// corr holds, per path, the moving average of observed / predicted.
	corr [2]float64
	// obs counts observations per path.
	obs [2]uint64
	// Alpha, ExploreEvery and CloseCall tune learning (zero = defaults).
	alpha        float64
	exploreEvery uint64
	closeCall    float64
	closeCalls   uint64
}

// Options tune a Model's learning; zero fields take the defaults.
type Options struct {
	Alpha        float64
	ExploreEvery int
	CloseCall    float64
}

// New returns a model of the engine and host costs with no corrections.
func New(e Engine, h Host, o Options) (*Model, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	if err := h.Validate(); err != nil {
		return nil, err
	}
	m := &Model{engine: e, host: h, corr: [2]float64{1, 1}, alpha: o.Alpha, exploreEvery: uint64(max(o.ExploreEvery, 0)), closeCall: o.CloseCall}
	if m.alpha <= 0 || m.alpha > 1 {
		m.alpha = DefaultAlpha
	}
	if m.exploreEvery == 0 {
		m.exploreEvery = DefaultExploreEvery
	}
	if m.closeCall <= 1 {
		m.closeCall = DefaultCloseCall
	}
	return m, nil
}

// Costs returns the model's engine and host costs.
func (m *Model) Costs() (Engine, Host) { return m.engine, m.host }

// Corrections returns the learned observed/predicted factor of each path
// (1 before any observation) and how many observations made it.
func (m *Model) Corrections() (bounce, direct float64, nb, nd uint64) {
	return m.corr[Bounce], m.corr[Direct], m.obs[Bounce], m.obs[Direct]
}

// Raw predicts s from the costs alone, without corrections.
func (m *Model) Raw(s Shape) Prediction {
	return Prediction{Bounce: BounceTime(m.engine, m.host, s), Direct: DirectTime(m.engine, s)}
}

// Predict predicts s with the learned corrections applied.
func (m *Model) Predict(s Shape) Prediction {
	r := m.Raw(s)
	return Prediction{Bounce: scale(r.Bounce, m.corr[Bounce]), Direct: scale(r.Direct, m.corr[Direct])}
}

func scale(d time.Duration, f float64) time.Duration { return dur(d.Seconds() * f) }

// Decision is the route Decide chose, its prediction and why.
type Decision struct {
	Route      Route
	Prediction Prediction
	// Explore is set when the route is the one predicted slower, taken on
	// purpose to refresh its correction.
	Explore bool
	Reason  string
}

// Decide picks the path predicted faster for s. One close call in
// ExploreEvery (predictions within CloseCall of each other) takes the other
// path instead, so both stay observed; so does the first call, within a
// factor of 4, after the chosen path was observed but the other never was.
func (m *Model) Decide(s Shape) Decision {
	p := m.Predict(s)
	d := Decision{Route: Direct, Prediction: p}
	if p.Faster() {
		d.Route = Bounce
	}
	ratio := p.Ratio()
	if ratio < 1 {
		ratio = 1 / ratio
	}
	other := d.Route ^ 1
	switch {
	case m.obs[other] == 0 && m.obs[d.Route] > 0 && ratio <= unobservedCall:
		d.Route, d.Explore = other, true // never measured: try it once
	case ratio <= m.closeCall:
		m.closeCalls++
		if m.closeCalls%m.exploreEvery == 0 {
			d.Route, d.Explore = other, true
		}
	}
	d.Reason = fmt.Sprintf("predicted bounce %v vs direct %v (%.2fx)", round(p.Bounce), round(p.Direct), p.Ratio())
	if d.Explore {
		d.Reason += "; taking " + d.Route.String() + " to re-measure it"
	}
	return d
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d >= 10*time.Microsecond:
		return d.Round(time.Microsecond)
	}
	return d
}

// Observe records that a request of shape s took elapsed on route r: the
// path's correction moves toward elapsed / raw prediction.
func (m *Model) Observe(r Route, s Shape, elapsed time.Duration) {
	if r > Bounce || elapsed <= 0 {
		return
	}
	raw := m.Raw(s)
	pred := raw.Direct
	if r == Bounce {
		pred = raw.Bounce
	}
	if pred <= 0 {
		return
	}
	f := math.Min(math.Max(elapsed.Seconds()/pred.Seconds(), minCorrection), maxCorrection)
	c := m.corr[r]
	f = math.Min(math.Max(f, c/maxStep), c*maxStep)
	if m.obs[r] == 0 {
		m.corr[r] = f
	} else {
		m.corr[r] += m.alpha * (f - c)
	}
	m.obs[r]++
}
