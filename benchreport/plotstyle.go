package benchreport

import (
	"fmt"
	"hash/fnv"
	"image/color"
	"math"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// style is the colour and glyph of one series, the same in every plot.
type style struct {
	color color.Color
	shape draw.GlyphDrawer
}

// namedStyles gives each route, and each ratio (by Ratio.Name), its own
// colour: a ratio never wears the colour of a route (bounce/direct is not
// drawn in direct's green).
var namedStyles = map[string]style{
	// Routes: filled glyphs, legible as lone points.
	RouteBounce: {color.RGBA{241, 90, 96, 255}, draw.CircleGlyph{}},
	RouteDirect: {color.RGBA{122, 195, 106, 255}, draw.BoxGlyph{}},
	RouteBulk:   {color.RGBA{90, 155, 212, 255}, draw.PyramidGlyph{}},
	RouteAuto:   {color.RGBA{250, 167, 91, 255}, draw.CrossGlyph{}},
	// Ratios: colours no route wears.
	RouteBounce + "/" + RouteDirect: {color.RGBA{128, 70, 160, 255}, draw.RingGlyph{}},
	RouteBounce + "/" + RouteBulk:   {color.RGBA{215, 110, 180, 255}, draw.SquareGlyph{}},
	RouteBounce + "/" + RouteAuto:   {color.RGBA{128, 128, 0, 255}, draw.PlusGlyph{}},
	RouteAuto + "/" + RouteBest:     {color.RGBA{70, 70, 70, 255}, draw.TriangleGlyph{}},
}

// otherStyles are for names without a style of their own (form ratios),
// chosen by a hash of the name.
var otherStyles = []style{
	{color.RGBA{0, 128, 128, 255}, draw.RingGlyph{}},
	{color.RGBA{140, 86, 75, 255}, draw.SquareGlyph{}},
	{color.RGBA{40, 40, 140, 255}, draw.TriangleGlyph{}},
}

// styleOf returns the style of a route or ratio name.
func styleOf(name string) style {
	if s, ok := namedStyles[name]; ok {
		return s
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return otherStyles[h.Sum32()%uint32(len(otherStyles))]
}

// logTicks labels a logarithmic axis with at least three values whatever
// its span: powers of ten across three decades or more, else 1-2-5 steps,
// with unlabelled minor ticks at the decade's multiples; else, on a span
// under a decade or so, round linear steps (linearTicks: 5, 10, 15).
type logTicks struct{}

// Ticks implements plot.Ticker.
func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(lo > 0) || !(hi > lo) {
		return niceTicks{}.Ticks(lo, hi)
	}
	var ticks []plot.Tick
	for _, mults := range [][]int{{1}, {1, 2, 5}} {
		ticks = ticks[:0]
		labelled := 0
		for e := int(math.Floor(math.Log10(lo))); e <= int(math.Ceil(math.Log10(hi))); e++ {
			for m := 1; m <= 9; m++ {
				v := decade(m, e)
				if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
					continue
				}
				t := plot.Tick{Value: v}
				for _, k := range mults {
					if k == m {
						t.Label = decadeLabel(m, e)
						labelled++
					}
				}
				ticks = append(ticks, t)
			}
		}
		if labelled >= 3 {
			return thinLabels(ticks, 10)
		}
	}
	return linearTicks(lo, hi)
}

// linearTicks labels the largest round step (1, 2 or 5 times a power of
// ten) that puts at least three labels in [lo, hi], hi > lo > 0.
func linearTicks(lo, hi float64) []plot.Tick {
	e := int(math.Floor(math.Log10(hi - lo)))
	for ; e > -300; e-- {
		for _, m := range []int{5, 2, 1} {
			step := decade(m, e)
			first, last := math.Ceil(lo/step*(1-1e-12)), math.Floor(hi/step*(1+1e-12))
			if last-first+1 < 3 {
				continue
			}
			decimals := max(0, -e)
			var ticks []plot.Tick
			for k := first; k <= last; k++ {
				v := k * step
				if e < 0 {
					v = k * float64(m) / math.Pow10(-e)
				}
				ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', decimals, 64)})
			}
			return thinLabels(ticks, 10)
		}
	}
	return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'g', 4, 64)}}
}

// decade is m × 10^e, computed so that 3 × 10^-1 is 0.3 exactly as printed.
func decade(m, e int) float64 {
	if e < 0 {
		return float64(m) / math.Pow10(-e)
	}
	return float64(m) * math.Pow10(e)
}

// decadeLabel formats m × 10^e without a float's noise (0.3, not
// 0.30000000000000004), in exponent form far from 1 (2e+06, 5e-05).
func decadeLabel(m, e int) string {
	if e >= 6 || e <= -5 {
		return strconv.FormatFloat(decade(m, e), 'g', -1, 64)
	}
	return strconv.FormatFloat(decade(m, e), 'f', max(0, -e), 64)
}

// thinLabels keeps at most n labels, clearing every other one (from the
// second) until they fit.
func thinLabels(ticks []plot.Tick, n int) []plot.Tick {
	for {
		var idx []int
		for i, t := range ticks {
			if t.Label != "" {
				idx = append(idx, i)
			}
		}
		if len(idx) <= n {
			return ticks
		}
		for k, i := range idx {
			if k%2 == 1 {
				ticks[i].Label = ""
			}
		}
	}
}

// legendGap separates the data area from the legend on its right.
const legendGap = 0.2 * vg.Inch

// rendered is a drawn plot: the image, its data area and the legend's box
// (empty when the plot has no legend), in the image's coordinates.
type rendered struct {
	img          *vgimg.Canvas
	data, legend vg.Rectangle
}

// render draws p plotWidth × plotHeight with its legend outside the data
// area, on the right (the image is that much wider), top-aligned with the
// data, so the legend hides no curve, point or axis.
func render(p *plot.Plot) rendered {
	leg := p.Legend
	leg.Padding = vg.Points(3)
	p.Legend = plot.NewLegend()
	defer func() { p.Legend = leg }()
	probe := draw.New(vgimg.New(plotWidth, plotHeight))
	size := leg.Rectangle(probe).Size()
	extra := vg.Length(0)
	if size.X > 0 {
		extra = size.X + 2*legendGap
	}
	img := vgimg.New(plotWidth+extra, plotHeight)
	dc := draw.New(img)
	area := draw.Crop(dc, 0, -extra, 0, 0)
	p.Draw(area)
	r := rendered{img: img, data: p.DataCanvas(area).Rectangle}
	if size.X > 0 {
		la := dc
		la.Min.X = r.data.Max.X + legendGap
		la.Max.X = la.Min.X + size.X + legendGap
		la.Min.Y, la.Max.Y = r.data.Min.Y, r.data.Max.Y
		leg.Top, leg.Left, leg.XOffs, leg.YOffs = true, true, 0, 0
		leg.Draw(la)
		r.legend = vg.Rectangle{Min: vg.Point{X: la.Min.X, Y: la.Max.Y - size.Y}, Max: vg.Point{X: la.Min.X + size.X, Y: la.Max.Y}}
	}
	return r
}

// savePNG renders p (render) into a PNG file at path.
func savePNG(p *plot.Plot, path string) error {
	r := render(p)
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("benchreport: save %s: %w", path, err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: r.img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("benchreport: save %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("benchreport: save %s: %w", path, err)
	}
	return nil
}
