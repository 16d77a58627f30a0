package benchreport

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// series is one route's (or ratio's: its Ratio.Name) points along a swept
// axis, each point the median over iterations with its spread (the lowest
// and highest iteration).
type series struct {
	route string
	x     []float64
	mid   []float64
	lo    []float64
	hi    []float64
}

// sweepKey is what stays fixed along a sweep: the workload shape minus the
// swept quantity.
type sweepKey struct {
	workload string
	layout   string
	desc     uint64 // 0 when the descriptor size is swept
	count    int    // 0 when the descriptor size is swept
	conc     int    // 0 when the concurrency is swept
	gens     int
}

// sweepSeries groups the successful cells by key (what stays fixed) and
// route, with x the swept quantity and y a value of each cell; keys with
// fewer than two x values are dropped.
func sweepSeries(cells []Cell, key func(Cell) sweepKey, x func(Cell) float64, y func(Cell) float64) ([]sweepKey, map[sweepKey][]series) {
	type rk struct {
		k     sweepKey
		route string
	}
	vals := map[rk]map[float64][]float64{}
	var keys []sweepKey
	routes := map[sweepKey][]string{}
	for _, c := range cells {
		if c.Verification() == VerifiedFailed || c.ElapsedNS <= 0 {
			continue
		}
		k := key(c)
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
		if !slices.Contains(routes[k], c.Route) {
			routes[k] = append(routes[k], c.Route)
		}
		r := rk{k, c.Route}
		if vals[r] == nil {
			vals[r] = map[float64][]float64{}
		}
		vals[r][x(c)] = append(vals[r][x(c)], y(c))
	}
	out := map[sweepKey][]series{}
	var kept []sweepKey
	for _, k := range keys {
		var ss []series
		wide := false
		for _, route := range orderRoutes(routes[k]) {
			m := vals[rk{k, route}]
			xs := make([]float64, 0, len(m))
			for v := range m {
				xs = append(xs, v)
			}
			slices.Sort(xs)
			s := series{route: route, x: xs}
			for _, v := range xs {
				ys := m[v]
				s.mid = append(s.mid, Median(ys))
				s.lo = append(s.lo, slices.Min(ys))
				s.hi = append(s.hi, slices.Max(ys))
			}
			wide = wide || len(xs) > 1
			ss = append(ss, s)
		}
		if wide {
			out[k] = ss
			kept = append(kept, k)
		}
	}
	return kept, out
}

// orderRoutes puts bounce, direct and bulk first.
func orderRoutes(rs []string) []string {
	rows := make([]Row, len(rs))
	for i, r := range rs {
		rows[i] = Row{Route: r}
	}
	return routesOf(rows)
}

// spreadBars draws the lowest..highest iteration as vertical error bars.
type spreadBars struct {
	pts    plotter.XYs
	lo, hi []float64
}

func (s spreadBars) Len() int                    { return len(s.pts) }
func (s spreadBars) XY(i int) (float64, float64) { return s.pts[i].X, s.pts[i].Y }
func (s spreadBars) YError(i int) (float64, float64) {
	return s.pts[i].Y - s.lo[i], s.hi[i] - s.pts[i].Y
}

// addSeries adds one route's line with its spread to p.
func addSeries(p *plot.Plot, s series, label string, dashed bool, scale float64) error {
	pts := make(plotter.XYs, len(s.x))
	lo, hi := make([]float64, len(s.x)), make([]float64, len(s.x))
	for i := range s.x {
		pts[i] = plotter.XY{X: s.x[i], Y: s.mid[i] * scale}
		lo[i], hi[i] = s.lo[i]*scale, s.hi[i]*scale
	}
	line, glyphs, err := plotter.NewLinePoints(pts)
	if err != nil {
		return fmt.Errorf("benchreport: %s series: %w", s.route, err)
	}
	st := styleOf(s.route)
	line.Color, line.Width = st.color, vg.Points(2)
	if dashed {
		line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	}
	glyphs.Color, glyphs.Shape, glyphs.Radius = st.color, st.shape, vg.Points(4)
	bars, err := plotter.NewYErrorBars(spreadBars{pts: pts, lo: lo, hi: hi})
	if err != nil {
		return fmt.Errorf("benchreport: %s spread: %w", s.route, err)
	}
	bars.Color, bars.Width, bars.CapWidth = st.color, vg.Points(1.2), vg.Points(6)
	p.Add(line, glyphs, bars)
	p.Legend.Add(label, line, glyphs)
	return nil
}

// concTicks labels every concurrency level swept; fewer than three in
// range also label the powers of two between them (1, 2, 4 for a sweep of
// 1 and 4).
type concTicks []float64

// Ticks implements plot.Ticker.
func (c concTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, v := range c {
		if v >= lo && v <= hi {
			out = append(out, plot.Tick{Value: v, Label: fmt.Sprintf("%g", v)})
		}
	}
	if len(out) < 3 {
		for v := 1.0; v <= hi; v *= 2 {
			if v >= lo && !slices.Contains(c, v) {
				out = append(out, plot.Tick{Value: v, Label: fmt.Sprintf("%g", v)})
			}
		}
		slices.SortFunc(out, func(a, b plot.Tick) int { return cmp.Compare(a.Value, b.Value) })
	}
	return out
}

func allX(ss []series) []float64 {
	var xs []float64
	for _, s := range ss {
		for _, x := range s.x {
			if !slices.Contains(xs, x) {
				xs = append(xs, x)
			}
		}
	}
	slices.Sort(xs)
	return xs
}

func shapeName(k sweepKey) string {
	s := k.workload
	if k.desc != 0 {
		s += fmt.Sprintf(" %dx%s", k.count, FormatSize(k.desc))
	}
	s += " " + k.layout
	if k.conc != 0 {
		s += fmt.Sprintf(" c%d", k.conc)
	}
	if k.gens > 1 {
		s += fmt.Sprintf(" loop%d", k.gens)
	}
	return s
}

func shapeFile(prefix string, k sweepKey) string {
	return fileSafe(fmt.Sprintf("%s-%s.png", prefix, shapeName(k)))
}

func byConcurrency(c Cell) sweepKey {
	return sweepKey{workload: c.Workload, layout: c.LayoutForm(), desc: c.DescSize, count: c.Count, gens: c.Generations}
}

func byDescSize(c Cell) sweepKey {
	return sweepKey{workload: c.Workload, layout: c.LayoutForm(), conc: c.Concurrency, gens: c.Generations}
}

// throughputVsConcurrency plots throughput against concurrency for one
// shape, one line per route, with the spread over iterations.
func throughputVsConcurrency(k sweepKey, ss []series, cfg Config) (*plot.Plot, error) {
	title := fmt.Sprintf("Throughput vs concurrency: %s\n%s; bars: lowest..highest iteration", shapeName(k), subtitle(cfg))
	return seriesThroughput(title, "concurrent requests", concTicks(allX(ss)), 1.4, ss)
}

// throughputVsDescSize plots throughput against descriptor size for one
// preset (a --desc-size sweep), with the spread over iterations.
func throughputVsDescSize(k sweepKey, ss []series, cfg Config) (*plot.Plot, error) {
	title := fmt.Sprintf("Throughput vs descriptor size: %s (same bytes per request)\n%s; bars: lowest..highest iteration", shapeName(k), subtitle(cfg))
	return seriesThroughput(title, "descriptor size", sizeTicks{}, 1.5, ss)
}

// seriesThroughput plots throughput (GB/s) per route against a logarithmic x
// axis with the given ticks, leaving margin (a factor) on either side.
func seriesThroughput(title, xLabel string, ticks plot.Ticker, margin float64, ss []series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = "throughput (GB/s)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = ticks
	p.Add(plotter.NewGrid())
	for _, s := range ss {
		if err := addSeries(p, s, routeLabel(s.route), false, 1e-9); err != nil {
			return nil, err
		}
	}
	xs := allX(ss)
	p.X.Min, p.X.Max = xs[0]/margin, xs[len(xs)-1]*margin
	p.Y.Min, p.Y.Max = 0, p.Y.Max*1.25
	p.Y.Tick.Marker = niceTicks{}
	return p, nil
}

// latencyVsConcurrency plots p50 (solid) and p99 (dashed) request latency
// against concurrency, per route, with the spread over iterations.
func latencyVsConcurrency(k sweepKey, p50, p99 []series, cfg Config) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Request latency vs concurrency: %s\n%s; solid p50, dashed p99; bars: lowest..highest iteration", shapeName(k), subtitle(cfg))
	p.X.Label.Text = "concurrent requests"
	p.Y.Label.Text = "request latency (ms, log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = concTicks(allX(p50))
	p.Y.Tick.Marker = logTicks{}
	p.Add(plotter.NewGrid())
	for i := range p50 {
		if err := addSeries(p, p50[i], routeLabel(p50[i].route)+" p50", false, 1e-6); err != nil {
			return nil, err
		}
		if i < len(p99) {
			if err := addSeries(p, p99[i], routeLabel(p99[i].route)+" p99", true, 1e-6); err != nil {
				return nil, err
			}
		}
	}
	xs := allX(p50)
	p.X.Min, p.X.Max = xs[0]/1.4, xs[len(xs)-1]*1.4
	p.Y.Min, p.Y.Max = p.Y.Min/1.3, p.Y.Max*1.3
	return p, nil
}

// ratioPlot plots bounce/direct and bounce/bulk against concurrency (or
// descriptor size), with the spread over iterations and a line at 1.
func ratioPlot(k sweepKey, ss []series, xLabel string, sizes bool, cfg Config) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Throughput ratios: %s\n%s; measured side by side per iteration; bars: lowest..highest", shapeName(k), subtitle(cfg))
	p.X.Label.Text = xLabel
	p.Y.Label.Text = "throughput ratio (numerator / denominator route)"
	p.X.Scale = plot.LogScale{}
	if sizes {
		p.X.Tick.Marker = sizeTicks{}
	} else {
		p.X.Tick.Marker = concTicks(allX(ss))
	}
	p.Add(plotter.NewGrid())
	xs := allX(ss)
	one, err := plotter.NewLine(plotter.XYs{{X: xs[0] / 1.5, Y: 1}, {X: xs[len(xs)-1] * 1.5, Y: 1}})
	if err != nil {
		return nil, err
	}
	one.Color, one.Dashes = color.Gray{Y: 90}, []vg.Length{vg.Points(2), vg.Points(2)}
	p.Add(one)
	for _, s := range ss {
		label := strings.ReplaceAll(s.route, "/", " / ")
		if s.route == RouteBounce+"/"+RouteBulk {
			label = "bounce / bulk (same bytes, 1 descriptor)"
		}
		if err := addSeries(p, s, label, false, 1); err != nil {
			return nil, err
		}
	}
	p.X.Min, p.X.Max = xs[0]/1.5, xs[len(xs)-1]*1.5
	p.Y.Min, p.Y.Max = 0, math.Max(p.Y.Max*1.3, 1.3)
	p.Y.Tick.Marker = niceTicks{}
	return p, nil
}

// ratioCells turns ratios into cells whose route is the ratio's name
// (bounce/direct, bounce/bulk, ...) and whose throughput field holds the
// ratio, so sweepSeries can group them.
func ratioCells(rs []Ratio) []Cell {
	var out []Cell
	for _, r := range rs {
		for it, v := range r.PerIteration {
			out = append(out, Cell{Group: r.Group, Route: r.Name(), Iteration: it, Throughput: v, ElapsedNS: 1, Verified: true})
		}
	}
	return out
}

// tailRequests is the most requests any one route has in group g (the
// points of its latency tail).
func tailRequests(cells []Cell, g Group) int {
	n := map[string]int{}
	best := 0
	for _, c := range cells {
		if c.Group == g {
			n[c.Route] += len(c.Latencies())
			best = max(best, n[c.Route])
		}
	}
	return best
}

// tailPlot plots, per route, the fraction of requests slower than each
// latency, both axes logarithmic, so the tail (p99, p99.9, the slowest) is
// as legible as the median.
func tailPlot(cells []Cell, g Group, cfg Config) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Request latency tail: %s\n%s; pooled over iterations", g, subtitle(cfg))
	p.X.Label.Text = "request latency (ms, log scale)"
	p.Y.Label.Text = "fraction of requests slower (log scale)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = logTicks{}
	p.Y.Tick.Marker = logTicks{}
	p.Add(plotter.NewGrid())
	lat := map[string][]time.Duration{}
	var routes []string
	for _, c := range cells {
		if c.Group == g {
			if !slices.Contains(routes, c.Route) {
				routes = append(routes, c.Route)
			}
			lat[c.Route] = append(lat[c.Route], c.Latencies()...)
		}
	}
	ymin, xmin, xmax := 1.0, math.Inf(1), math.Inf(-1)
	for _, route := range orderRoutes(routes) {
		l := lat[route]
		if len(l) == 0 {
			continue
		}
		slices.Sort(l)
		n := float64(len(l))
		pts := make(plotter.XYs, 0, len(l))
		for i, d := range l {
			x := max(ms(d), 1e-3)
			pts = append(pts, plotter.XY{X: x, Y: (n - float64(i)) / n})
			xmin, xmax = min(xmin, x), max(xmax, x)
		}
		ymin = min(ymin, 1/n)
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("benchreport: latency tail %s: %w", route, err)
		}
		line.StepStyle = plotter.PostStep
		line.Color, line.Width = styleOf(route).color, vg.Points(2)
		p.Add(line)
		st := Summarize(l)
		p.Legend.Add(fmt.Sprintf("%s  p50 %s  p99 %s  max %s", routeLabel(route), dur(st.P50NS), dur(st.P99NS), dur(st.MaxNS)), line)
	}
	if math.IsInf(xmin, 1) {
		return nil, fmt.Errorf("benchreport: latency tail %s: no latencies", g)
	}
	p.X.Min, p.X.Max = xmin/1.3, xmax*1.3
	p.Y.Min, p.Y.Max = ymin/1.5, 1.15
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	return p, nil
}
