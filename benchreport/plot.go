package benchreport

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Plot size: about 900 x 560 pixels at the PNG backend's default DPI.
const (
	plotWidth  = 9.5 * vg.Inch
	plotHeight = 5.8 * vg.Inch
)

// WritePlots writes PNG plots of r into dir (created if missing) and returns
// their paths, and a line for each plot it did not draw saying why:
//
//   - throughput-<layout>-c<N>[-loop<K>].png: throughput against descriptor
//     size at the lowest concurrency swept for that layout, a point per
//     preset and route; lines join only the points of one preset swept over
//     descriptor sizes (two presets are not a sweep);
//   - latency-tail-<cell>.png: per route, the fraction of requests slower
//     than each latency (both axes log scale), pooled over iterations, for
//     every workload and layout at its highest concurrency; not drawn when
//     no route has minTailRequests requests there (a tail of one request is
//     an empty plot);
//   - throughput-vs-concurrency-<shape>.png, latency-vs-concurrency-<shape>.png
//     and ratios-vs-concurrency-<shape>.png for every shape swept over two or
//     more concurrency levels: median throughput, p50 and p99 latency, and
//     the bounce/direct and bounce/bulk ratios, each with the lowest..highest
//     iteration as bars;
//   - throughput-vs-desc-size-<preset>.png and ratios-vs-desc-size-<preset>.png
//     for every preset swept over two or more descriptor sizes
//     (bench --desc-size 512B..64KiB).
//
// Every plot has its legend outside the data area, on the right; every
// route and every ratio has a colour of its own (styleOf); log axes carry
// at least three labels (logTicks).
func WritePlots(dir string, r *Report) (paths, skipped []string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("benchreport: plots: %w", err)
	}
	plots, skipped, err := buildPlots(r)
	if err != nil {
		return nil, skipped, err
	}
	for _, np := range plots {
		path := filepath.Join(dir, fileSafe(np.name))
		if err := savePNG(np.p, path); err != nil {
			return paths, skipped, err
		}
		paths = append(paths, path)
	}
	return paths, skipped, nil
}

// minTailRequests is the fewest requests of one route that make a latency
// tail plot worth drawing.
const minTailRequests = 3

// namedPlot is a plot and its file name.
type namedPlot struct {
	name string
	p    *plot.Plot
}

// buildPlots makes every plot WritePlots writes, in order, and says why
// each plot it leaves out is left out.
func buildPlots(r *Report) ([]namedPlot, []string, error) {
	rows := Rows(r.Cells)
	var out []namedPlot
	var skipped []string
	add := func(p *plot.Plot, name string) { out = append(out, namedPlot{name, p}) }
	for _, layout := range layouts(rows) {
		p, name, ok, err := throughputPlot(rows, layout, r.Config)
		if err != nil {
			return out, skipped, err
		}
		if ok {
			add(p, name)
		}
	}
	var thin []string
	for _, g := range highestConcurrency(rows) {
		name := fmt.Sprintf("latency-tail-%s-%dx%s-%s-c%d%s.png", g.Workload, g.Count, FormatSize(g.DescSize), g.LayoutForm(), g.Concurrency, g.loopTag("-"))
		if tailRequests(r.Cells, g) < minTailRequests {
			thin = append(thin, g.String())
			continue
		}
		p, err := tailPlot(r.Cells, g, r.Config)
		if err != nil {
			return out, skipped, err
		}
		add(p, name)
	}
	if len(thin) > 0 {
		skipped = append(skipped, fmt.Sprintf("latency-tail plots not drawn for %d cell(s) with fewer than %d requests per route (raise --repeat or --concurrency): %s",
			len(thin), minTailRequests, strings.Join(thin, "; ")))
	}
	conc := func(c Cell) float64 { return float64(c.Concurrency) }
	keys, tput := sweepSeries(r.Cells, byConcurrency, conc, func(c Cell) float64 { return c.Throughput })
	_, p50 := sweepSeries(r.Cells, byConcurrency, conc, func(c Cell) float64 { return float64(c.Latency.P50NS) })
	_, p99 := sweepSeries(r.Cells, byConcurrency, conc, func(c Cell) float64 { return float64(c.Latency.P99NS) })
	rkeys, ratios := sweepSeries(ratioCells(r.Ratios), byConcurrency, conc, func(c Cell) float64 { return c.Throughput })
	for _, k := range keys {
		p, err := throughputVsConcurrency(k, tput[k], r.Config)
		if err != nil {
			return out, skipped, err
		}
		add(p, shapeFile("throughput-vs-concurrency", k))
		if p, err = latencyVsConcurrency(k, p50[k], p99[k], r.Config); err != nil {
			return out, skipped, err
		}
		add(p, shapeFile("latency-vs-concurrency", k))
	}
	for _, k := range rkeys {
		p, err := ratioPlot(k, ratios[k], "concurrent requests", false, r.Config)
		if err != nil {
			return out, skipped, err
		}
		add(p, shapeFile("ratios-vs-concurrency", k))
	}
	size := func(c Cell) float64 { return float64(c.DescSize) }
	keys, tput = sweepSeries(r.Cells, byDescSize, size, func(c Cell) float64 { return c.Throughput })
	rkeys, ratios = sweepSeries(ratioCells(r.Ratios), byDescSize, size, func(c Cell) float64 { return c.Throughput })
	for _, k := range keys {
		p, err := throughputVsDescSize(k, tput[k], r.Config)
		if err != nil {
			return out, skipped, err
		}
		add(p, shapeFile("throughput-vs-desc-size", k))
	}
	for _, k := range rkeys {
		p, err := ratioPlot(k, ratios[k], "descriptor size", true, r.Config)
		if err != nil {
			return out, skipped, err
		}
		add(p, shapeFile("ratios-vs-desc-size", k))
	}
	return out, skipped, nil
}

// layouts lists the layouts of rows in order of appearance.
func layouts(rows []Row) []string {
	var out []string
	for _, r := range rows {
		if !slices.Contains(out, r.LayoutForm()) {
			out = append(out, r.LayoutForm())
		}
	}
	return out
}

// routesOf lists the routes of rows: bounce, direct, bulk first, then the
// rest in order of appearance.
func routesOf(rows []Row) []string {
	var out []string
	for _, want := range []string{RouteBounce, RouteDirect, RouteBulk} {
		for _, r := range rows {
			if r.Route == want {
				out = append(out, want)
				break
			}
		}
	}
	for _, r := range rows {
		if !slices.Contains(out, r.Route) {
			out = append(out, r.Route)
		}
	}
	return out
}

func routeLabel(route string) string {
	if route == RouteBulk {
		return "bulk (same bytes, 1 descriptor, direct)"
	}
	return route
}

func subtitle(c Config) string {
	return fmt.Sprintf("engine %s, control plane %s, arena %s", c.EngineLabel(), c.ControlPlane, FormatSize(c.ArenaSize))
}

// presetSeries is one route's throughput points for one preset
// (workload) along descriptor size: a line only when it has two or more.
type presetSeries struct {
	route, workload string
	pts             plotter.XYs // x descriptor size, y median GB/s
}

// presetPoints groups rows by route and preset, a point per descriptor size
// (the median over iterations), in route order then order of appearance.
func presetPoints(sel []Row) []presetSeries {
	var out []presetSeries
	for _, route := range routesOf(sel) {
		var order []string
		by := map[string]map[uint64][]float64{}
		for _, r := range sel {
			if r.Route != route {
				continue
			}
			if by[r.Workload] == nil {
				by[r.Workload] = map[uint64][]float64{}
				order = append(order, r.Workload)
			}
			by[r.Workload][r.DescSize] = append(by[r.Workload][r.DescSize], r.Throughput/1e9)
		}
		for _, w := range order {
			sizes := make([]uint64, 0, len(by[w]))
			for s := range by[w] {
				sizes = append(sizes, s)
			}
			slices.Sort(sizes)
			ps := presetSeries{route: route, workload: w}
			for _, s := range sizes {
				ps.pts = append(ps.pts, plotter.XY{X: float64(s), Y: Median(by[w][s])})
			}
			out = append(out, ps)
		}
	}
	return out
}

// presetTicks labels each descriptor size plotted with its size and the
// presets plotted there, over sizeTicks' labels of the sizes around them.
type presetTicks map[float64][]string

// Ticks implements plot.Ticker.
func (pt presetTicks) Ticks(lo, hi float64) []plot.Tick {
	out := sizeTicks{}.Ticks(lo, hi)
	for v, names := range pt {
		if v < lo || v > hi {
			continue
		}
		label := FormatSize(uint64(v)) + "\n" + strings.Join(names, "\n")
		i := slices.IndexFunc(out, func(t plot.Tick) bool { return t.Value == v })
		if i < 0 {
			out = append(out, plot.Tick{Value: v, Label: label})
		} else {
			out[i].Label = label
		}
	}
	slices.SortFunc(out, func(a, b plot.Tick) int { return cmp.Compare(a.Value, b.Value) })
	return out
}

// throughputPlot plots median throughput against descriptor size for one
// layout at its lowest concurrency, a point per preset and route, lines
// only between the sizes of one preset; ok is false when there is nothing
// to plot.
func throughputPlot(rows []Row, layout string, cfg Config) (*plot.Plot, string, bool, error) {
	lowest := math.MaxInt
	for _, r := range rows {
		if r.LayoutForm() == layout {
			lowest = min(lowest, r.Concurrency)
		}
	}
	var sel []Row
	for _, r := range rows {
		if r.LayoutForm() == layout && r.Concurrency == lowest && r.Verified != VerifiedFailed && r.Throughput > 0 {
			sel = append(sel, r)
		}
	}
	if len(sel) == 0 {
		return nil, "", false, nil
	}
	mode := fmt.Sprintf("%d concurrent", lowest)
	if g := sel[0].Generations; g > 1 {
		mode = fmt.Sprintf("closed loop of %d, %d generations", lowest, g)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Throughput by preset and descriptor size (%s, %s)\n%s; lines join one preset's sizes only", layout, mode, subtitle(cfg))
	p.X.Label.Text = "descriptor size and preset (bulk moves the same bytes as 1 descriptor)"
	p.Y.Label.Text = "throughput (GB/s)"
	p.X.Scale = plot.LogScale{}
	p.Add(plotter.NewGrid())
	ticks := presetTicks{}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	inLegend := map[string]bool{}
	for _, ps := range presetPoints(sel) {
		st := styleOf(ps.route)
		glyphs, err := plotter.NewScatter(ps.pts)
		if err != nil {
			return nil, "", false, fmt.Errorf("benchreport: throughput plot %s: %w", ps.route, err)
		}
		glyphs.Color, glyphs.Shape, glyphs.Radius = st.color, st.shape, vg.Points(4)
		p.Add(glyphs)
		thumbs := []plot.Thumbnailer{glyphs}
		if len(ps.pts) > 1 {
			line, err := plotter.NewLine(ps.pts)
			if err != nil {
				return nil, "", false, fmt.Errorf("benchreport: throughput plot %s: %w", ps.route, err)
			}
			line.Color, line.Width = st.color, vg.Points(2)
			p.Add(line)
			thumbs = append(thumbs, line)
		}
		if !inLegend[ps.route] {
			inLegend[ps.route] = true
			p.Legend.Add(routeLabel(ps.route), thumbs...)
		}
		for _, pt := range ps.pts {
			if !slices.Contains(ticks[pt.X], ps.workload) {
				ticks[pt.X] = append(ticks[pt.X], ps.workload)
			}
			xmin, xmax = min(xmin, pt.X), max(xmax, pt.X)
		}
	}
	p.X.Tick.Marker = ticks
	p.X.Min, p.X.Max = xmin/1.5, xmax*1.5
	p.Y.Min = 0
	p.Y.Max *= 1.15
	p.Y.Tick.Marker = niceTicks{}
	return p, fmt.Sprintf("throughput-%s-c%d%s.png", fileSafe(layout), lowest, sel[0].loopTag("-")), true, nil
}

// highestConcurrency returns, per workload shape and layout, the group at
// its highest concurrency, in order of appearance.
func highestConcurrency(rows []Row) []Group {
	type shape struct {
		workload string
		desc     uint64
		count    int
		layout   string
	}
	var order []shape
	best := map[shape]Group{}
	for _, r := range rows {
		s := shape{r.Workload, r.DescSize, r.Count, r.LayoutForm()}
		g, ok := best[s]
		if !ok {
			order = append(order, s)
		}
		if !ok || r.Concurrency > g.Concurrency {
			best[s] = r.Group
		}
	}
	out := make([]Group, len(order))
	for i, s := range order {
		out[i] = best[s]
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// sizeTicks puts a labeled tick on every power of two in range, thinned to
// at most about eight labels; a range holding fewer than three labels this
// way also labels the sizes halfway (3 × 2^k: 3KiB, 6KiB).
type sizeTicks struct{}

// Ticks implements plot.Ticker.
func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var pows []float64
	for e := math.Floor(math.Log2(max(lo, 1))); math.Pow(2, e) <= hi; e++ {
		if v := math.Pow(2, e); v >= lo {
			pows = append(pows, v)
		}
	}
	step := max(1, (len(pows)+7)/8)
	ticks := make([]plot.Tick, 0, 2*len(pows)+2)
	for i, v := range pows {
		t := plot.Tick{Value: v}
		if i%step == 0 {
			t.Label = FormatSize(uint64(v))
		}
		ticks = append(ticks, t)
	}
	if len(pows) < 3 {
		for e := math.Floor(math.Log2(max(lo, 1))) - 1; math.Pow(2, e) <= hi; e++ {
			if v := 3 * math.Pow(2, e); v >= lo && v <= hi && v >= 1 {
				ticks = append(ticks, plot.Tick{Value: v, Label: FormatSize(uint64(v))})
			}
		}
		slices.SortFunc(ticks, func(a, b plot.Tick) int { return cmp.Compare(a.Value, b.Value) })
	}
	return ticks
}

// niceTicks labels about six evenly spaced round values (1, 2 or 5 times a
// power of ten apart), with unlabeled minor ticks between them.
type niceTicks struct{}

// Ticks implements plot.Ticker.
func (niceTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'g', 4, 64)}}
	}
	raw := (hi - lo) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	// As many decimals as the step has, so 3 x 0.2 reads 0.6, never
	// 0.6000000000000001.
	decimals := max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step / 2 {
		t := plot.Tick{Value: v}
		if r := math.Round(v / step); math.Abs(v/step-r) < 1e-6 {
			t.Label = strconv.FormatFloat(r*step, 'f', decimals, 64)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// fileSafe replaces characters that do not belong in a file name.
func fileSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}
