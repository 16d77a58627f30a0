package benchreport

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Judging route auto against noise. One route measured twice in a row on
// a loaded machine can differ by far more than AutoTolerance, so a single
// median of auto/best says little. JudgeAuto instead looks at the
// per-iteration bounce/direct ratio (the two ran back to back, so load
// that drifts between iterations cancels out of the ratio), bootstraps the
// interval of its median, and asks whether the route auto took was slower
// than the other beyond that interval.

// Auto verdicts (AutoJudgement.Verdict).
const (
	// AutoFaster: auto took the path that is faster beyond the noise band.
	AutoFaster = "faster"
	// AutoWithinNoise: the two paths are not told apart by the
	// measurements (their interval includes equal speed), or auto's path
	// is slower but not shown slower by more than AutoTolerance (the
	// upper end of its interval is at least 1 - AutoTolerance).
	AutoWithinNoise = "within noise"
	// AutoSlower: auto took the path that is slower, by more than
	// AutoTolerance, beyond the noise band.
	AutoSlower = "slower"
	// AutoTooFew: fewer than MinJudgedIterations paired iterations.
	AutoTooFew = "too few iterations"
)

// MinJudgedIterations is the fewest paired iterations JudgeAuto judges a
// cell on; with fewer the bootstrap interval is the raw range.
const MinJudgedIterations = 5

// Bootstrap settings of JudgeAuto: resamples, and the two-sided
// confidence of the interval.
const (
	bootstrapResamples  = 2000
	bootstrapConfidence = 0.95
)

// AutoJudgement is route auto's verdict in one group that ran auto,
// bounce and direct.
type AutoJudgement struct {
	Group
	// Iterations counts the iterations where all three cells succeeded.
	Iterations int `json:"iterations"`
	// BounceOverDirect is the median of the per-iteration bounce/direct
	// throughput ratios; Low and High bound its bootstrap interval.
	BounceOverDirect float64 `json:"bounce_over_direct"`
	Low              float64 `json:"low"`
	High             float64 `json:"high"`
	// Faster is the path faster beyond the interval ("bounce" or
	// "direct"), "" when the interval includes 1.
	Faster string `json:"faster,omitempty"`
	// Took is the route auto took in most iterations ("mixed" on a tie);
	// TookBounce and TookDirect count its iterations on each.
	Took       string `json:"took"`
	TookBounce int    `json:"took_bounce"`
	TookDirect int    `json:"took_direct"`
	// AutoBest is the median of auto's throughput over the faster of
	// bounce and direct in each iteration (as the auto/best ratio).
	AutoBest float64 `json:"auto_best"`
	// Verdict is one of AutoFaster, AutoWithinNoise, AutoSlower, AutoTooFew.
	Verdict string `json:"verdict"`
}

// OK reports whether auto chose well: the faster path, or one the
// measurements cannot tell from it within AutoTolerance.
func (j AutoJudgement) OK() bool { return j.Verdict == AutoFaster || j.Verdict == AutoWithinNoise }

// String says the verdict in words.
func (j AutoJudgement) String() string {
	s := fmt.Sprintf("auto took %s (%d bounce, %d direct); bounce/direct %.2fx [%.2f, %.2f] over %d iterations: ",
		j.Took, j.TookBounce, j.TookDirect, j.BounceOverDirect, j.Low, j.High, j.Iterations)
	switch j.Verdict {
	case AutoFaster:
		return s + "the faster path beyond noise"
	case AutoWithinNoise:
		if j.Faster == "" {
			return s + "the paths are within noise"
		}
		return s + fmt.Sprintf("%s faster beyond noise, but auto's route is not shown slower by more than %.0f%%", j.Faster, 100*AutoTolerance)
	case AutoSlower:
		return s + fmt.Sprintf("WRONG: %s is faster beyond noise", j.Faster)
	}
	return s + j.Verdict
}

// JudgeAuto judges route auto in every group of cells that ran auto,
// bounce and direct, in the order the groups first appear. Failed cells
// are left out; an iteration counts only where all three succeeded.
// The bootstrap is seeded, so the same cells always give the same verdict.
func JudgeAuto(cells []Cell) []AutoJudgement {
	type key struct {
		g    Group
		iter int
	}
	byRoute := map[string]map[key]Cell{RouteAuto: {}, RouteBounce: {}, RouteDirect: {}}
	var groups []Group
	iters := map[Group][]int{}
	for _, c := range cells {
		m, ok := byRoute[c.Route]
		if !ok {
			continue
		}
		if _, seen := iters[c.Group]; !seen {
			groups = append(groups, c.Group)
			iters[c.Group] = nil
		}
		if !slices.Contains(iters[c.Group], c.Iteration) {
			iters[c.Group] = append(iters[c.Group], c.Iteration)
		}
		m[key{c.Group, c.Iteration}] = c
	}
	var out []AutoJudgement
	for _, g := range groups {
		its := iters[g]
		slices.Sort(its)
		j := AutoJudgement{Group: g}
		var logs, best []float64
		for _, it := range its {
			k := key{g, it}
			a, okA := byRoute[RouteAuto][k]
			b, okB := byRoute[RouteBounce][k]
			d, okD := byRoute[RouteDirect][k]
			if !okA || !okB || !okD || !a.OK() || !b.OK() || !d.OK() {
				continue
			}
			logs = append(logs, math.Log(b.Throughput/d.Throughput))
			best = append(best, a.Throughput/max(b.Throughput, d.Throughput))
			switch a.Took {
			case RouteBounce:
				j.TookBounce++
			case RouteDirect:
				j.TookDirect++
			}
		}
		if len(logs) == 0 {
			continue
		}
		j.Iterations = len(logs)
		j.AutoBest = Median(best)
		j.BounceOverDirect = math.Exp(Median(logs))
		lo, hi := bootstrapMedian(logs)
		j.Low, j.High = math.Exp(lo), math.Exp(hi)
		switch {
		case j.Low > 1:
			j.Faster = RouteBounce
		case j.High < 1:
			j.Faster = RouteDirect
		}
		switch {
		case j.TookBounce > j.TookDirect:
			j.Took = RouteBounce
		case j.TookDirect > j.TookBounce:
			j.Took = RouteDirect
		default:
			j.Took = "mixed"
		}
		j.Verdict = verdict(j)
		out = append(out, j)
	}
	return out
}

// verdict judges j's majority route against the interval of
// bounce/direct. Mixed (as many iterations on each) counts as within
// noise only where the paths are within noise.
func verdict(j AutoJudgement) string {
	if j.Iterations < MinJudgedIterations {
		return AutoTooFew
	}
	// lo, hi bound the chosen path's speed over the other's.
	var lo, hi float64
	switch j.Took {
	case RouteBounce:
		lo, hi = j.Low, j.High
	case RouteDirect:
		lo, hi = 1/j.High, 1/j.Low
	default:
		if j.Faster == "" {
			return AutoWithinNoise
		}
		return AutoSlower
	}
	switch {
	case lo > 1:
		return AutoFaster
	case hi >= 1-AutoTolerance:
		return AutoWithinNoise
	}
	return AutoSlower
}

// bootstrapMedian returns the percentile interval of the median of xs
// over bootstrapResamples resamples with replacement, from a fixed seed.
func bootstrapMedian(xs []float64) (lo, hi float64) {
	rng := rand.New(rand.NewPCG(0x5eed, uint64(len(xs))))
	meds := make([]float64, bootstrapResamples)
	sample := make([]float64, len(xs))
	for i := range meds {
		for k := range sample {
			sample[k] = xs[rng.IntN(len(xs))]
		}
		meds[i] = Median(sample)
	}
	slices.Sort(meds)
	tail := (1 - bootstrapConfidence) / 2
	at := func(q float64) float64 {
		i := int(math.Round(q * float64(len(meds)-1)))
		return meds[i]
	}
	return at(tail), at(1 - tail)
}

// AutoJudgementTally counts the judged cells (those with enough
// iterations) and those where auto chose well.
func AutoJudgementTally(js []AutoJudgement) (ok, judged int) {
	for _, j := range js {
		if j.Verdict == AutoTooFew {
			continue
		}
		judged++
		if j.OK() {
			ok++
		}
	}
	return ok, judged
}
