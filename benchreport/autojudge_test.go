package benchreport

import (
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// autoCells builds one group's iterations: bounce at 1 GB/s times ratio[i]
// over direct at 1 GB/s, and auto at took[i]'s throughput, reported as
// having taken took[i].
func autoCells(g Group, ratios []float64, took []string) []Cell {
	var cells []Cell
	for i, r := range ratios {
		a := cell(g, RouteAuto, i, 1)
		if took[i] == RouteBounce {
			a = cell(g, RouteAuto, i, r)
		}
		a.Took = took[i]
		b, d := cell(g, RouteBounce, i, r), cell(g, RouteDirect, i, 1)
		b.Took, d.Took = RouteBounce, RouteDirect
		cells = append(cells, b, d, a)
	}
	return cells
}

func repeatRoute(r string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = r
	}
	return out
}

// TestJudgeAuto checks each verdict on cells whose answer is known: a
// path faster in every iteration despite wide scatter, auto on the slower
// one, paths that cross over from iteration to iteration, and too few
// iterations to judge.
func TestJudgeAuto(t *testing.T) {
	bounceWins := []float64{1.5, 2.1, 1.3, 1.8, 2.6, 1.4, 1.9, 1.2, 1.7}
	noisy := []float64{0.7, 1.4, 0.9, 1.2, 1.05, 0.8, 1.3, 0.95, 1.1}
	mostlyBounce := repeatRoute(RouteBounce, 9)
	mostlyBounce[4] = RouteDirect // one exploration
	cases := []struct {
		name        string
		g           Group
		ratios      []float64
		took        []string
		wantFaster  string
		wantTook    string
		wantVerdict string
	}{
		{"faster", small, bounceWins, mostlyBounce, RouteBounce, RouteBounce, AutoFaster},
		{"slower", big, bounceWins, repeatRoute(RouteDirect, 9), RouteBounce, RouteDirect, AutoSlower},
		{"noise", bigC8, noisy, repeatRoute(RouteDirect, 9), "", RouteDirect, AutoWithinNoise},
		// bounce faster in every iteration, but by 1-6%: direct is not
		// shown more than 5% slower.
		{"slightly", big, []float64{1.02, 1.05, 1.03, 1.04, 1.06, 1.01, 1.03}, repeatRoute(RouteDirect, 7), RouteBounce, RouteDirect, AutoWithinNoise},
		{"too few", small, bounceWins[:3], repeatRoute(RouteDirect, 3), RouteBounce, RouteDirect, AutoTooFew},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			js := JudgeAuto(autoCells(tc.g, tc.ratios, tc.took))
			if len(js) != 1 {
				t.Fatalf("%d judgements, want 1", len(js))
			}
			j := js[0]
			if j.Group != tc.g || j.Iterations != len(tc.ratios) || j.Faster != tc.wantFaster || j.Took != tc.wantTook || j.Verdict != tc.wantVerdict {
				t.Fatalf("judgement %+v; want faster %q, took %q, verdict %q", j, tc.wantFaster, tc.wantTook, tc.wantVerdict)
			}
			if again := JudgeAuto(autoCells(tc.g, tc.ratios, tc.took)); again[0] != j {
				t.Fatalf("not deterministic: %+v then %+v", j, again[0])
			}
		})
	}
}

// TestJudgeAutoTable checks the summary's verdict lines and tally, and
// that a failed cell drops its iteration.
func TestJudgeAutoTable(t *testing.T) {
	cells := autoCells(small, []float64{1.5, 2.1, 1.3, 1.8, 2.6, 1.4}, repeatRoute(RouteBounce, 6))
	cells = append(cells, autoCells(big, []float64{1.5, 2.1, 1.3, 1.8, 2.6, 1.4}, repeatRoute(RouteDirect, 6))...)
	cells[0].Error, cells[0].Throughput = "1 of 1 requests failed", 0 // small's iteration 0 bounce
	rep := &Report{Cells: cells, AutoJudgements: JudgeAuto(cells)}
	if n := rep.AutoJudgements[0].Iterations; n != 5 {
		t.Fatalf("small judged on %d iterations, want 5 (one failed)", n)
	}
	var sb strings.Builder
	if err := WriteTable(&sb, rep); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	for _, want := range []string{
		"auto took bounce (5 bounce, 0 direct)",
		"the faster path beyond noise",
		"WRONG: bounce is faster beyond noise",
		"route auto took the faster path or one within noise (or within 5%): 1 of 2 cells judged (0 with fewer than 5 iterations not judged)",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("summary lacks %q:\n%s", want, out)
		}
	}
}

// TestJudgeAutoInterval checks, for any ratios, that the interval lies
// within the ratios' range and around the median's side of 1 when every
// iteration agrees: all above 1 is bounce faster, all below direct.
func TestJudgeAutoInterval(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 15).Draw(t, "n")
		ratios := rapid.SliceOfN(rapid.Float64Range(0.2, 5), n, n).Draw(t, "ratios")
		took := make([]string, n)
		for i := range took {
			took[i] = rapid.SampledFrom([]string{RouteBounce, RouteDirect}).Draw(t, "took")
		}
		js := JudgeAuto(autoCells(small, ratios, took))
		if len(js) != 1 {
			t.Fatalf("%d judgements", len(js))
		}
		j := js[0]
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, r := range ratios {
			lo, hi = min(lo, r), max(hi, r)
		}
		const eps = 1e-9
		if j.Low < lo*(1-eps) || j.High > hi*(1+eps) || j.Low > j.High {
			t.Fatalf("interval [%v, %v] outside the ratios' range [%v, %v]", j.Low, j.High, lo, hi)
		}
		if lo > 1 && j.Faster != RouteBounce || hi < 1 && j.Faster != RouteDirect {
			t.Fatalf("ratios in [%v, %v]: faster %q", lo, hi, j.Faster)
		}
		if j.TookBounce+j.TookDirect != n {
			t.Fatalf("took %d+%d of %d", j.TookBounce, j.TookDirect, n)
		}
		if n < MinJudgedIterations && j.Verdict != AutoTooFew {
			t.Fatalf("%d iterations judged %q", n, j.Verdict)
		}
	})
}
