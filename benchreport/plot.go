package benchreport

import (
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
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot size: about 900 x 560 pixels at the PNG backend's default DPI.
const (
	plotWidth  = 9.5 * vg.Inch
	plotHeight = 5.8 * vg.Inch
)

// WritePlots writes PNG plots of r into dir (created if missing) and returns
// their paths:
//
//   - throughput-<layout>-c<N>[-loop<K>].png: throughput against descriptor size, one
//     line per route, at the lowest concurrency swept for that layout
//     (presets that share a descriptor size are combined by the median);
//   - latency-tail-<cell>.png: per route, the fraction of requests slower
//     than each latency (both axes log scale, the legend in the corner the
//     curves leave empty), pooled over iterations, for every workload and
//     layout at its highest concurrency;
//   - throughput-vs-concurrency-<shape>.png, latency-vs-concurrency-<shape>.png
//     and ratios-vs-concurrency-<shape>.png for every shape swept over two or
//     more concurrency levels: median throughput, p50 and p99 latency, and
//     the bounce/direct and bounce/bulk ratios, each with the lowest..highest
//     iteration as bars;
//   - throughput-vs-desc-size-<preset>.png and ratios-vs-desc-size-<preset>.png
//     for every preset swept over two or more descriptor sizes
//     (bench --desc-size 512B..64KiB).
func WritePlots(dir string, r *Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("benchreport: plots: %w", err)
	}
	rows := Rows(r.Cells)
	var paths []string
	for _, layout := range layouts(rows) {
		p, name, ok, err := throughputPlot(rows, layout, r.Config)
		if err != nil {
			return paths, err
		}
		if !ok {
			continue
		}
		path := filepath.Join(dir, name)
		if err := p.Save(plotWidth, plotHeight, path); err != nil {
			return paths, fmt.Errorf("benchreport: save %s: %w", path, err)
		}
		paths = append(paths, path)
	}
	save := func(p *plot.Plot, name string) error {
		path := filepath.Join(dir, fileSafe(name))
		if err := p.Save(plotWidth, plotHeight, path); err != nil {
			return fmt.Errorf("benchreport: save %s: %w", path, err)
		}
		paths = append(paths, path)
		return nil
	}
	for _, g := range highestConcurrency(rows) {
		p, err := tailPlot(r.Cells, g, r.Config)
		if err != nil {
			return paths, err
		}
		if err := save(p, fmt.Sprintf("latency-tail-%s-%dx%s-%s-c%d%s.png", g.Workload, g.Count, FormatSize(g.DescSize), g.LayoutForm(), g.Concurrency, g.loopTag("-"))); err != nil {
			return paths, err
		}
	}
	conc := func(c Cell) float64 { return float64(c.Concurrency) }
	keys, tput := sweepSeries(r.Cells, byConcurrency, conc, func(c Cell) float64 { return c.Throughput })
	_, p50 := sweepSeries(r.Cells, byConcurrency, conc, func(c Cell) float64 { return float64(c.Latency.P50NS) })
	_, p99 := sweepSeries(r.Cells, byConcurrency, conc, func(c Cell) float64 { return float64(c.Latency.P99NS) })
	rkeys, ratios := sweepSeries(ratioCells(r.Ratios), byConcurrency, conc, func(c Cell) float64 { return c.Throughput })
	for _, k := range keys {
		p, err := throughputVsConcurrency(k, tput[k], r.Config)
		if err != nil {
			return paths, err
		}
		if err := save(p, shapeFile("throughput-vs-concurrency", k)); err != nil {
			return paths, err
		}
		if p, err = latencyVsConcurrency(k, p50[k], p99[k], r.Config); err != nil {
			return paths, err
		}
		if err := save(p, shapeFile("latency-vs-concurrency", k)); err != nil {
			return paths, err
		}
	}
	for _, k := range rkeys {
		p, err := ratioPlot(k, ratios[k], "concurrent requests", false, r.Config)
		if err != nil {
			return paths, err
		}
		if err := save(p, shapeFile("ratios-vs-concurrency", k)); err != nil {
			return paths, err
		}
	}
	size := func(c Cell) float64 { return float64(c.DescSize) }
	keys, tput = sweepSeries(r.Cells, byDescSize, size, func(c Cell) float64 { return c.Throughput })
	rkeys, ratios = sweepSeries(ratioCells(r.Ratios), byDescSize, size, func(c Cell) float64 { return c.Throughput })
	for _, k := range keys {
		p, err := throughputVsDescSize(k, tput[k], r.Config)
		if err != nil {
			return paths, err
		}
		if err := save(p, shapeFile("throughput-vs-desc-size", k)); err != nil {
			return paths, err
		}
	}
	for _, k := range rkeys {
		p, err := ratioPlot(k, ratios[k], "descriptor size", true, r.Config)
		if err != nil {
			return paths, err
		}
		if err := save(p, shapeFile("ratios-vs-desc-size", k)); err != nil {
			return paths, err
		}
	}
	return paths, nil
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

// routeStyle keeps one color and glyph per route across plots.
func routeStyle(route string) int {
	switch route {
	case RouteBounce:
		return 0
	case RouteDirect:
		return 1
	case RouteBulk:
		return 2
	}
	return 3 + len(route)
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

// throughputPlot plots median throughput against descriptor size for one
// layout at its lowest concurrency; ok is false when there is nothing to plot.
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
	p.Title.Text = fmt.Sprintf("Throughput vs descriptor size (%s, %s)\n%s", layout, mode, subtitle(cfg))
	p.X.Label.Text = "descriptor size (of the preset; bulk moves the same bytes as 1 descriptor)"
	p.Y.Label.Text = "throughput (GB/s)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = sizeTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for _, route := range routesOf(sel) {
		bySize := map[uint64][]float64{}
		for _, r := range sel {
			if r.Route == route {
				bySize[r.DescSize] = append(bySize[r.DescSize], r.Throughput/1e9)
			}
		}
		sizes := make([]uint64, 0, len(bySize))
		for s := range bySize {
			sizes = append(sizes, s)
		}
		slices.Sort(sizes)
		pts := make(plotter.XYs, len(sizes))
		for i, s := range sizes {
			pts[i] = plotter.XY{X: float64(s), Y: Median(bySize[s])}
			xmin, xmax = min(xmin, float64(s)), max(xmax, float64(s))
		}
		line, glyphs, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, "", false, fmt.Errorf("benchreport: throughput plot %s: %w", route, err)
		}
		i := routeStyle(route)
		line.Color, line.Width = plotutil.Color(i), vg.Points(2)
		glyphs.Color, glyphs.Shape, glyphs.Radius = plotutil.Color(i), plotutil.Shape(i), vg.Points(4)
		p.Add(line, glyphs)
		p.Legend.Add(routeLabel(route), line, glyphs)
	}
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
// at most about eight labels.
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
	ticks := make([]plot.Tick, 0, len(pows))
	for i, v := range pows {
		t := plot.Tick{Value: v}
		if i%step == 0 {
			t.Label = FormatSize(uint64(v))
		}
		ticks = append(ticks, t)
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
