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

// correction bounds: an observed factor (observed over predicted time) is
// clamped to [minCorrection, maxCorrection] (wide: UCX 1.13 over tcp posts
// a descriptor in 20-60 µs against the 1 µs its engine declares), and a correction resting on one
// observation moves at most a factor of maxStep from 1, so one cold or
// stalled request (a first transfer's connection setup and page faults)
// cannot flip every later decision; from three observations on it is the
// median of the last three, so one outlier never moves it and a real change
// is learned in two.
const (
	minCorrection, maxCorrection = 0.01, 100.0
	maxStep                      = 2.0
	window                       = 3
)

// The model's corrections: the bounce path's, and two of the engine's
// costs as the direct path observes them — its posting cost (learned from
// direct requests whose prediction is posting-bound, many small
// descriptors) and its bandwidth (from those that are bandwidth-bound, few
// large ones). Both engine corrections feed the bounce prediction too (its
// bulk writes run at the engine's bandwidth). Keeping them apart means a
// bulk transfer and a fragmented one, which the engine serves at very
// different costs per byte, do not pull one factor back and forth.
const (
	corrBounce = iota
	corrPost
	corrWire
	nCorr
)

// correction is one learned factor: the last observed factors and their
// summary.
type correction struct {
	f   float64 // the factor predictions are scaled by (1: none)
	n   uint64  // observations
	win [window]float64
}

// observe records an observed factor x and updates f.
func (c *correction) observe(x float64) {
	x = math.Min(math.Max(x, minCorrection), maxCorrection)
	c.win[c.n%window] = x
	c.n++
	switch c.n {
	case 1:
		c.f = math.Min(math.Max(x, 1/maxStep), maxStep)
	case 2:
		// Two that agree (within maxStep of each other) are trusted;
		// otherwise the one nearer the current factor wins.
		a, b := c.win[0], c.win[1]
		if r := a / b; r <= maxStep && r >= 1/maxStep {
			c.f = math.Sqrt(a * b)
		} else if math.Abs(math.Log(a/c.f)) < math.Abs(math.Log(b/c.f)) {
			c.f = a
		} else {
			c.f = b
		}
	default:
		w := c.win
		// median of three
		c.f = math.Max(math.Min(w[0], w[1]), math.Min(math.Max(w[0], w[1]), w[2]))
	}
}

// Model predicts both paths for one engine and host and learns from
// observed transfers. The zero value is not usable: call New.
type Model struct {
	engine Engine
	host   Host
	corr   [nCorr]correction
	// ExploreEvery and CloseCall tune exploration (zero = defaults).
	exploreEvery uint64
	closeCall    float64
	closeCalls   uint64
}

// Options tune a Model's exploration; zero fields take the defaults.
type Options struct {
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
	m := &Model{engine: e, host: h, exploreEvery: uint64(max(o.ExploreEvery, 0)), closeCall: o.CloseCall}
	for i := range m.corr {
		m.corr[i].f = 1
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

// Corrections returns the learned factors (1 before any observation): the
// bounce path's, over its prediction from the corrected engine costs, and
// the engine's posting cost and bulk time (the inverse of its bandwidth)
// as observed on the direct path; nb and nd count the observations of
// each path.
func (m *Model) Corrections() (bounce, post, wire float64, nb, nd uint64) {
	return m.corr[corrBounce].f, m.corr[corrPost].f, m.corr[corrWire].f, m.corr[corrBounce].n, m.corr[corrPost].n + m.corr[corrWire].n
}

// learned returns the engine costs with the learned corrections applied.
func (m *Model) learned() Engine {
	e := m.engine
	e.PostPerDesc = scale(e.PostPerDesc, m.corr[corrPost].f)
	e.Bandwidth /= m.corr[corrWire].f
	return e
}

// Raw predicts s from the costs alone, without corrections.
func (m *Model) Raw(s Shape) Prediction {
	return Prediction{Bounce: BounceTime(m.engine, m.host, s), Direct: DirectTime(m.engine, s)}
}

// Predict predicts s with the learned corrections applied.
func (m *Model) Predict(s Shape) Prediction {
	e := m.learned()
	return Prediction{Bounce: scale(BounceTime(e, m.host, s), m.corr[corrBounce].f), Direct: DirectTime(e, s)}
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
	case m.observed(other) == 0 && m.observed(d.Route) > 0 && ratio <= unobservedCall:
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

// observed counts the observations of route r.
func (m *Model) observed(r Route) uint64 {
	if r == Bounce {
		return m.corr[corrBounce].n
	}
	return m.corr[corrPost].n + m.corr[corrWire].n
}

// Observe records that a request of shape s took elapsed on route r. A
// bounce request moves the bounce correction toward elapsed over its
// prediction (from the corrected engine costs); a direct one moves the
// engine's posting or bandwidth correction toward what the term must have
// cost: the posting cost when its prediction was bound by posting or when
// it has more descriptors than the bounce path has chunks (a fragmented
// request measures what its descriptors cost, not the engine's bulk
// bandwidth, which the bounce path's writes run at), the bandwidth only
// from a bulk-shaped request bound by it (or from any, over an engine that
// declares free posts).
func (m *Model) Observe(r Route, s Shape, elapsed time.Duration) {
	if r > Bounce || elapsed <= 0 {
		return
	}
	e := m.learned()
	if r == Bounce {
		if pred := BounceTime(e, m.host, s); pred > 0 {
			m.corr[corrBounce].observe(elapsed.Seconds() / pred.Seconds())
		}
		return
	}
	// The declared terms: observed factors are relative to them.
	post := float64(s.Descs) * m.engine.PostPerDesc.Seconds()
	wire := seconds(float64(s.Bytes), m.engine.Bandwidth)
	rest := math.Max(elapsed.Seconds()-m.engine.PerWrite.Seconds(), elapsed.Seconds()/2)
	fragmented := s.Descs > max(s.Chunks, 1)
	if post > 0 && (fragmented || post*m.corr[corrPost].f >= wire*m.corr[corrWire].f) {
		m.corr[corrPost].observe(rest / post)
		return
	}
	if wire > 0 {
		m.corr[corrWire].observe(rest / wire)
	}
}
