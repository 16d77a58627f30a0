package benchreport

import (
	"image/color"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/vgimg"
	"pgregory.net/rapid"
)

// sweepReport has every kind of plot: two presets at the lowest
// concurrency (one of them swept over concurrency 1, 8, 64), a preset swept
// over descriptor sizes, four routes, and ratios.
func sweepReport() *Report {
	r := &Report{Schema: Schema, Config: Config{Engine: "tcp", ControlPlane: "zmq", ArenaSize: 256 << 20}}
	speed := map[string]float64{RouteBounce: 2, RouteDirect: 1.5, RouteBulk: 2.5, RouteAuto: 1.8}
	routes := []string{RouteBounce, RouteDirect, RouteBulk, RouteAuto}
	for _, c := range []int{1, 8, 64} {
		g := small
		g.Concurrency = c
		for it := range 3 {
			for _, route := range routes {
				r.Cells = append(r.Cells, cell(g, route, it, speed[route]*(1+0.05*float64(it))))
			}
		}
	}
	for it := range 3 {
		for _, route := range routes {
			r.Cells = append(r.Cells, cell(big, route, it, speed[route]*1.3))
		}
	}
	for _, ds := range []uint64{512, 4 << 10, 32 << 10} {
		g := Group{Workload: "llama70b-tp8-b32", DescSize: ds, Count: int((8 << 20) / ds), Layout: "fragmented", Concurrency: 2}
		for it := range 2 {
			for _, route := range routes {
				r.Cells = append(r.Cells, cell(g, route, it, speed[route]*float64(ds)/4096))
			}
		}
	}
	r.Ratios = ComputeRatios(r.Cells)
	return r
}

// onePresetReport is one preset at one size, one iteration, one request
// per route: the fewest points every plot must still label and lay out.
func onePresetReport() *Report {
	r := &Report{Schema: Schema}
	for _, route := range []string{RouteBounce, RouteDirect} {
		r.Cells = append(r.Cells, cell(big, route, 0, 1))
	}
	r.Ratios = ComputeRatios(r.Cells)
	return r
}

func built(t *testing.T, r *Report) []namedPlot {
	t.Helper()
	plots, _, err := buildPlots(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(plots) == 0 {
		t.Fatal("no plots")
	}
	return plots
}

func labelled(ticks []plot.Tick, lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, tk := range ticks {
		if tk.Label != "" && tk.Value >= lo && tk.Value <= hi {
			out = append(out, tk)
		}
	}
	return out
}

// TestLogAxesHaveThreeLabels: every log axis of every plot carries at
// least three labels within its range (the latency axes once had one or
// two: "10" and "100").
func TestLogAxesHaveThreeLabels(t *testing.T) {
	for _, r := range []*Report{sweepReport(), onePresetReport(), sample()} {
		for _, np := range built(t, r) {
			for _, ax := range []struct {
				name string
				a    *plot.Axis
			}{{"x", &np.p.X}, {"y", &np.p.Y}} {
				if _, log := ax.a.Scale.(plot.LogScale); !log {
					continue
				}
				l := labelled(ax.a.Tick.Marker.Ticks(ax.a.Min, ax.a.Max), ax.a.Min, ax.a.Max)
				if len(l) < 3 {
					t.Errorf("%s: log %s axis [%g, %g] has %d labels %v, want at least 3", np.name, ax.name, ax.a.Min, ax.a.Max, len(l), l)
				}
			}
		}
	}
}

// TestLogTicksLabels: on any positive range, logTicks labels at least
// three and at most ten values in it, each label reads as its value
// without a float's noise, and no two labels are equal.
func TestLogTicksLabels(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lo := math.Pow(10, rapid.Float64Range(-4, 6).Draw(t, "log lo"))
		hi := lo * math.Pow(10, rapid.Float64Range(0.02, 9).Draw(t, "log span"))
		l := labelled(logTicks{}.Ticks(lo, hi), lo*(1-1e-9), hi*(1+1e-9))
		if len(l) < 3 || len(l) > 10 {
			t.Fatalf("[%g, %g]: %d labels %v", lo, hi, len(l), l)
		}
		seen := map[string]bool{}
		for _, tk := range l {
			v, err := strconv.ParseFloat(tk.Label, 64)
			if err != nil || math.Abs(v-tk.Value) > 1e-9*math.Abs(tk.Value) {
				t.Fatalf("label %q for value %g", tk.Label, tk.Value)
			}
			if len(tk.Label) > 12 || seen[tk.Label] {
				t.Fatalf("label %q (long or repeated) in %v", tk.Label, l)
			}
			seen[tk.Label] = true
		}
	})
}

// TestLegendOutsideDataArea: every plot's legend box lies in the image
// and does not intersect the data area (it once sat over the axis and the
// curves, top left inside the plot).
func TestLegendOutsideDataArea(t *testing.T) {
	for _, r := range []*Report{sweepReport(), onePresetReport(), sample()} {
		for _, np := range built(t, r) {
			rd := render(np.p)
			w, h := rd.img.Size()
			if rd.legend.Size().X <= 0 || rd.legend.Size().Y <= 0 {
				t.Errorf("%s: no legend", np.name)
				continue
			}
			l, d := rd.legend, rd.data
			if l.Min.X < d.Max.X && d.Min.X < l.Max.X && l.Min.Y < d.Max.Y && d.Min.Y < l.Max.Y {
				t.Errorf("%s: legend %v intersects the data area %v", np.name, l, d)
			}
			if l.Min.X < 0 || l.Min.Y < 0 || l.Max.X > w || l.Max.Y > h {
				t.Errorf("%s: legend %v outside the %vx%v image", np.name, l, w, h)
			}
		}
	}
}

// pixelsOf counts the pixels of colour c (each channel within 24 of it,
// so antialiased edges count) inside rectangle r (in the canvas's
// coordinates: points, origin bottom left) of a rendered plot.
func pixelsOf(rd rendered, r vg.Rectangle, c color.Color) int {
	img := rd.img.Image()
	_, h := rd.img.Size()
	dpi := float64(vgimg.DefaultDPI) / 72
	px := func(x vg.Length) int { return int(float64(x) * dpi) }
	py := func(y vg.Length) int { return int(float64(h-y) * dpi) }
	cr, cg, cb, _ := c.RGBA()
	n := 0
	for y := py(r.Max.Y); y < py(r.Min.Y); y++ {
		for x := px(r.Min.X); x < px(r.Max.X); x++ {
			pr, pg, pb, _ := img.At(x, y).RGBA()
			if nearByte(pr>>8, cr>>8) && nearByte(pg>>8, cg>>8) && nearByte(pb>>8, cb>>8) {
				n++
			}
		}
	}
	return n
}

// TestNoLineBetweenPresets: two presets at two descriptor sizes are two
// points per route, not a line: the column halfway between them holds no
// pixel of any route's colour (the old plot drew each route's line through
// it). A preset swept over sizes is still one line through its points.
func TestNoLineBetweenPresets(t *testing.T) {
	r := sample()
	var p *plot.Plot
	for _, np := range built(t, r) {
		if np.name == "throughput-fragmented-c1.png" {
			p = np.p
		}
	}
	if p == nil {
		t.Fatal("no throughput plot")
	}
	rd := render(p)
	// The two presets are at 2 KiB and 4 KiB, the axis symmetric around
	// them on a log scale: halfway is the data area's middle column.
	mid := (rd.data.Min.X + rd.data.Max.X) / 2
	col := vg.Rectangle{Min: vg.Point{X: mid - 3, Y: rd.data.Min.Y}, Max: vg.Point{X: mid + 3, Y: rd.data.Max.Y}}
	for _, route := range []string{RouteBounce, RouteDirect, RouteBulk} {
		if n := pixelsOf(rd, col, styleOf(route).color); n > 0 {
			t.Errorf("%s: %d pixels of its colour between the two presets", route, n)
		}
		if n := pixelsOf(rd, rd.data, styleOf(route).color); n == 0 {
			t.Errorf("%s: its points are not drawn", route)
		}
	}
	series := presetPoints(Rows(r.Cells))
	for _, s := range series {
		if len(s.pts) != 1 && s.workload != "llama70b-tp8-b16" {
			t.Errorf("%s %s: %d points", s.route, s.workload, len(s.pts))
		}
	}
	// One preset over three sizes: one series of three points per route.
	var rows []Row
	for _, ds := range []uint64{512, 4 << 10, 32 << 10} {
		g := Group{Workload: "w", DescSize: ds, Count: 8, Layout: "fragmented", Concurrency: 1}
		rows = append(rows, Rows([]Cell{cell(g, RouteBounce, 0, 1), cell(g, RouteDirect, 0, 2)})...)
	}
	ss := presetPoints(rows)
	if len(ss) != 2 || len(ss[0].pts) != 3 || ss[0].pts[0].X != 512 || ss[0].pts[2].X != 32<<10 {
		t.Fatalf("one preset's sweep: %+v", ss)
	}
}

// TestSeriesColoursDistinct: every route and ratio has its own colour, and
// a ratio plot carries no pixel of a route's colour (bounce/direct was
// drawn in direct's green) but does carry its ratios'.
func TestSeriesColoursDistinct(t *testing.T) {
	names := make([]string, 0, len(namedStyles))
	for n := range namedStyles {
		names = append(names, n)
	}
	slices.Sort(names)
	for i, a := range names {
		for _, b := range names[i+1:] {
			if styleOf(a).color == styleOf(b).color {
				t.Errorf("%s and %s share colour %v", a, b, styleOf(a).color)
			}
		}
	}
	for _, o := range otherStyles {
		for _, n := range names {
			if o.color == styleOf(n).color {
				t.Errorf("a fallback colour is %s's", n)
			}
		}
	}
	if styleOf("bounce[blocks]/bounce[descs]") != styleOf("bounce[blocks]/bounce[descs]") {
		t.Error("a fallback style is not stable")
	}
	for _, np := range built(t, sweepReport()) {
		if np.name != "ratios-vs-concurrency-gptoss120b-tp8-b16_2048x2KiB_fragmented.png" {
			continue
		}
		rd := render(np.p)
		whole := vg.Rectangle{Max: vg.Point{X: 1e6, Y: 1e6}}
		whole.Max.X, whole.Max.Y = rd.img.Size()
		for _, route := range []string{RouteBounce, RouteDirect, RouteBulk, RouteAuto} {
			if n := pixelsOf(rd, whole, styleOf(route).color); n > 0 {
				t.Errorf("ratio plot has %d pixels of route %s's colour", n, route)
			}
		}
		for _, ratio := range []string{"bounce/direct", "bounce/bulk"} {
			if n := pixelsOf(rd, rd.data, styleOf(ratio).color); n == 0 {
				t.Errorf("ratio plot has no pixel of %s's colour", ratio)
			}
		}
		return
	}
	t.Fatal("no ratios-vs-concurrency plot")
}

// TestTailNeedsRequests: a cell with one request per route gets no latency
// tail plot (it would be an empty axis), and the skip says why.
func TestTailNeedsRequests(t *testing.T) {
	plots, skipped, err := buildPlots(onePresetReport())
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range plots {
		if strings.HasPrefix(np.name, "latency-tail") {
			t.Errorf("%s drawn from one request per route", np.name)
		}
	}
	if len(skipped) != 1 || !containsAll(skipped[0], "latency-tail", big.String(), "fewer than 3 requests") {
		t.Fatalf("skipped %q", skipped)
	}
	r := onePresetReport()
	for i := range r.Cells {
		r.Cells[i] = cell(big, r.Cells[i].Route, 0, 1, time.Millisecond, 2*time.Millisecond, 3*time.Millisecond)
	}
	plots, skipped, _ = buildPlots(r)
	if len(skipped) != 0 || !slices.ContainsFunc(plots, func(np namedPlot) bool { return strings.HasPrefix(np.name, "latency-tail") }) {
		t.Fatalf("three requests per route: skipped %q", skipped)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

func nearByte(a, b uint32) bool { return max(a, b)-min(a, b) <= 24 }
