package benchreport

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestWritePlots(t *testing.T) {
	r := sample()
	// A wide latency spread at the highest concurrency.
	for i := range r.Cells {
		if r.Cells[i].Concurrency == 8 {
			lat := make([]time.Duration, 8)
			for k := range lat {
				lat[k] = time.Duration(k+1) * time.Duration(r.Cells[i].Iteration+1) * time.Millisecond
			}
			c := NewCell(r.Cells[i].Group, r.Cells[i].Route, r.Cells[i].Iteration, 0, 8, 0, r.Cells[i].Bytes, time.Duration(r.Cells[i].ElapsedNS), lat)
			c.Verified = true
			r.Cells[i] = c
		}
	}
	dir := filepath.Join(t.TempDir(), "plots")
	paths, _, err := WritePlots(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
	}
	want := []string{
		"throughput-fragmented-c1.png",
		"latency-tail-gptoss120b-tp8-b16-2048x2KiB-fragmented-c1.png",
		"latency-tail-llama70b-tp8-b16-4096x4KiB-fragmented-c8.png",
		"throughput-vs-concurrency-llama70b-tp8-b16_4096x4KiB_fragmented.png",
		"latency-vs-concurrency-llama70b-tp8-b16_4096x4KiB_fragmented.png",
		"ratios-vs-concurrency-llama70b-tp8-b16_4096x4KiB_fragmented.png",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("plots %v, want %v", names, want)
	}
	for _, p := range paths {
		checkPNG(t, p)
	}
}

// TestWritePlotsOnePoint covers a sweep with one descriptor size, one
// route and one request: still a valid throughput plot, and no latency
// tail (one request is no tail), with the reason.
func TestWritePlotsOnePoint(t *testing.T) {
	r := &Report{Schema: Schema, Cells: []Cell{cell(small, RouteDirect, 0, 1)}}
	paths, skipped, err := WritePlots(t.TempDir(), r)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 1 || filepath.Base(paths[0]) != "throughput-fragmented-c1.png" || len(skipped) != 1 || !strings.Contains(skipped[0], "latency-tail plots not drawn for 1 cell") {
		t.Fatalf("plots %v, skipped %q: want a throughput plot and the tail's reason", paths, skipped)
	}
	for _, p := range paths {
		checkPNG(t, p)
	}
}

func TestWritePlotsSkipsFailed(t *testing.T) {
	c := cell(small, RouteBounce, 0, 1)
	c.Verified = false
	paths, _, err := WritePlots(t.TempDir(), &Report{Schema: Schema, Cells: []Cell{c}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if filepath.Base(p) == "throughput-fragmented-c1.png" {
			t.Fatal("a throughput plot of failed cells was written")
		}
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() < 10<<10 {
		t.Errorf("%s: %d bytes, a trivial image", path, st.Size())
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: not a PNG: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 400 {
		t.Errorf("%s: %dx%d pixels", path, b.Dx(), b.Dy())
	}
}

func TestNiceTicks(t *testing.T) {
	var labels []string
	for _, tk := range (niceTicks{}).Ticks(0, 2700) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if want := []string{"0", "500", "1000", "1500", "2000", "2500"}; !slices.Equal(labels, want) {
		t.Fatalf("labels %v, want %v", labels, want)
	}
	if ts := (niceTicks{}).Ticks(3, 3); len(ts) != 1 {
		t.Fatalf("empty range: %v", ts)
	}
}

func TestSizeTicks(t *testing.T) {
	var labels []string
	for _, tk := range (sizeTicks{}).Ticks(1500, 200000) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if want := []string{"2KiB", "4KiB", "8KiB", "16KiB", "32KiB", "64KiB", "128KiB"}; !slices.Equal(labels, want) {
		t.Fatalf("labels %v, want %v", labels, want)
	}
}

// TestWritePlotsSweeps: a concurrency sweep and a descriptor-size sweep
// each get their throughput, latency and ratio plots, with one point per
// swept value and route.
func TestWritePlotsSweeps(t *testing.T) {
	r := &Report{Schema: Schema}
	routes := map[string]float64{RouteBounce: 2, RouteDirect: 1.5, RouteBulk: 2.5}
	for _, c := range []int{1, 8, 64} {
		g := small
		g.Concurrency = c
		for it := range 3 {
			for _, route := range []string{RouteBounce, RouteDirect, RouteBulk} {
				r.Cells = append(r.Cells, cell(g, route, it, routes[route]*(1+0.05*float64(it))))
			}
		}
	}
	for _, ds := range []uint64{512, 4 << 10, 32 << 10} {
		g := Group{Workload: "llama70b-tp8-b16", DescSize: ds, Count: int((8 << 20) / ds), Layout: "fragmented", Concurrency: 2}
		for it := range 2 {
			for _, route := range []string{RouteBounce, RouteDirect} {
				r.Cells = append(r.Cells, cell(g, route, it, routes[route]*float64(ds)/4096))
			}
		}
	}
	r.Ratios = ComputeRatios(r.Cells)
	paths, _, err := WritePlots(t.TempDir(), r)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
		checkPNG(t, p)
	}
	for _, want := range []string{
		"throughput-vs-concurrency-gptoss120b-tp8-b16_2048x2KiB_fragmented.png",
		"latency-vs-concurrency-gptoss120b-tp8-b16_2048x2KiB_fragmented.png",
		"ratios-vs-concurrency-gptoss120b-tp8-b16_2048x2KiB_fragmented.png",
		"throughput-vs-desc-size-llama70b-tp8-b16_fragmented_c2.png",
		"ratios-vs-desc-size-llama70b-tp8-b16_fragmented_c2.png",
		"latency-tail-gptoss120b-tp8-b16-2048x2KiB-fragmented-c64.png",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s among %v", want, names)
		}
	}
	keys, ss := sweepSeries(r.Cells, byConcurrency, func(c Cell) float64 { return float64(c.Concurrency) }, func(c Cell) float64 { return c.Throughput })
	if len(keys) != 1 || len(ss[keys[0]]) != 3 {
		t.Fatalf("concurrency sweep: %v", keys)
	}
	b := ss[keys[0]][0]
	if b.route != RouteBounce || !slices.Equal(b.x, []float64{1, 8, 64}) || b.lo[0] != 2e9 || b.hi[0] != 2.2e9 || b.mid[0] != 2.1e9 {
		t.Fatalf("bounce series %+v", b)
	}
}

// TestNiceTickLabels: every labelled tick reads as a short round number —
// no more decimals than its step has (0.6, never 0.6000000000000001) — and
// its label is its value.
func TestNiceTickLabels(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lo := rapid.Float64Range(0, 1000).Draw(t, "lo")
		hi := lo + rapid.Float64Range(1e-3, 1000).Draw(t, "span")
		for _, tk := range (niceTicks{}).Ticks(lo, hi) {
			if tk.Label == "" {
				continue
			}
			// No more decimals than a step of at least a sixth of the
			// span needs (a narrow span far from 0 needs many digits, but
			// never a float's noise).
			allowed := max(0, int(-math.Floor(math.Log10((hi-lo)/6))))
			if _, frac, ok := strings.Cut(tk.Label, "."); ok && len(frac) > allowed {
				t.Fatalf("ticks of [%v, %v]: label %q has %d decimals, at most %d", lo, hi, tk.Label, len(frac), allowed)
			}
			v, err := strconv.ParseFloat(tk.Label, 64)
			if err != nil || math.Abs(v-tk.Value) > 1e-6*math.Max(1, math.Abs(v)) {
				t.Fatalf("ticks of [%v, %v]: label %q for value %v", lo, hi, tk.Label, tk.Value)
			}
		}
	})
	for _, tk := range (niceTicks{}).Ticks(0, 1.2) {
		if strings.Contains(tk.Label, "000000") {
			t.Fatalf("label %q", tk.Label)
		}
	}
}
