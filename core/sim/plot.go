package sim

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
	// Err, if set, draws ±Err[i] error bars.
	Err []float64
}

// Chart is a line chart drawn with the standard library's image packages.
type Chart struct {
	Title, XLabel, YLabel string
	LogX                  bool
	Series                []Series
	Width, Height         int
}

var palette = []color.RGBA{
	{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {255, 127, 14, 255},
	{148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}, {127, 127, 127, 255},
}

// WritePNG renders the chart as PNG.
func (c Chart) WritePNG(w io.Writer) error {
	return png.Encode(w, c.Render())
}

// Render draws the chart.
func (c Chart) Render() *image.RGBA {
	W, H := c.Width, c.Height
	if W == 0 {
		W = 900
	}
	if H == 0 {
		H = 560
	}
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	left, right, top, bottom := 80, W-200, 40, H-60

	tx := func(x float64) float64 {
		if c.LogX {
			return math.Log10(math.Max(x, 1e-9))
		}
		return x
	}
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), 0.0, math.Inf(-1)
	for _, s := range c.Series {
		for i := range s.X {
			x := tx(s.X[i])
			y := s.Y[i]
			e := 0.0
			if s.Err != nil {
				e = s.Err[i]
			}
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			ymax = math.Max(ymax, y+e)
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax, ymax = 0, 1, 1
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	ymax *= 1.05
	px := func(x float64) int { return left + int((tx(x)-xmin)/(xmax-xmin)*float64(right-left)) }
	py := func(y float64) int { return bottom - int((y-ymin)/(ymax-ymin)*float64(bottom-top)) }

	grey := color.RGBA{200, 200, 200, 255}
	black := color.RGBA{0, 0, 0, 255}
	// Grid and ticks.
	for _, yt := range niceTicks(ymin, ymax, 6) {
		y := py(yt)
		hline(img, left, right, y, grey)
		text(img, left-8-textWidth(fmtTick(yt)), y+4, fmtTick(yt), black)
	}
	var xticks []float64
	if c.LogX {
		for e := math.Floor(xmin); e <= math.Ceil(xmax); e++ {
			if e >= xmin-1e-9 && e <= xmax+1e-9 {
				xticks = append(xticks, math.Pow(10, e))
			}
		}
	} else {
		xticks = niceTicks(xmin, xmax, 8)
	}
	for _, xt := range xticks {
		x := px(xt)
		vline(img, x, top, bottom, grey)
		lbl := fmtTick(xt)
		text(img, x-textWidth(lbl)/2, bottom+16, lbl, black)
	}
	hline(img, left, right, bottom, black)
	vline(img, left, top, bottom, black)
	text(img, left, top-16, c.Title, black)
	text(img, (left+right)/2-textWidth(c.XLabel)/2, bottom+40, c.XLabel, black)
	text(img, 8, top-2, c.YLabel, black)

	for i, s := range c.Series {
		col := palette[i%len(palette)]
		for k := 1; k < len(s.X); k++ {
			line(img, px(s.X[k-1]), py(s.Y[k-1]), px(s.X[k]), py(s.Y[k]), col)
		}
		for k := range s.X {
			x, y := px(s.X[k]), py(s.Y[k])
			if s.Err != nil {
				lo, hi := py(s.Y[k]-s.Err[k]), py(s.Y[k]+s.Err[k])
				vline(img, x, hi, lo, col)
				hline(img, x-4, x+4, hi, col)
				hline(img, x-4, x+4, lo, col)
			}
			if len(s.X) < 50 {
				fillRect(img, x-3, y-3, x+3, y+3, col)
			}
		}
		ly := top + 10 + 20*i
		fillRect(img, right+20, ly-4, right+40, ly, col)
		text(img, right+46, ly+2, s.Name, black)
	}
	return img
}

func niceTicks(lo, hi float64, n int) []float64 {
	span := hi - lo
	step := math.Pow(10, math.Floor(math.Log10(span/float64(n))))
	for _, m := range []float64{1, 2, 5, 10} {
		if span/(step*m) <= float64(n) {
			step *= m
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

func fmtTick(v float64) string {
	s := fmt.Sprintf("%.3g", v)
	if strings.Contains(s, "e") {
		s = fmt.Sprintf("%g", v)
	}
	return s
}

func text(img *image.RGBA, x, y int, s string, col color.Color) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func textWidth(s string) int { return 7 * len(s) }

func hline(img *image.RGBA, x0, x1, y int, col color.RGBA) {
	for x := min(x0, x1); x <= max(x0, x1); x++ {
		img.SetRGBA(x, y, col)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, col color.RGBA) {
	for y := min(y0, y1); y <= max(y0, y1); y++ {
		img.SetRGBA(x, y, col)
	}
}

func fillRect(img *image.RGBA, x0, y0, x1, y1 int, col color.RGBA) {
	draw.Draw(img, image.Rect(x0, y0, x1+1, y1+1), image.NewUniform(col), image.Point{}, draw.Src)
}

// line draws a two-pixel-wide segment (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, col color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	err := dx + dy
	for {
		img.SetRGBA(x0, y0, col)
		img.SetRGBA(x0+1, y0, col)
		img.SetRGBA(x0, y0+1, col)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x < 0:
		return -1
	case x > 0:
		return 1
	}
	return 0
}

// CDF returns the empirical CDF of xs, thinned to at most n points.
func CDF(xs []float64, n int) (x, y []float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return nil, nil
	}
	step := max(1, len(s)/n)
	for i := 0; i < len(s); i += step {
		x = append(x, s[i])
		y = append(y, float64(i+1)/float64(len(s)))
	}
	x = append(x, s[len(s)-1])
	y = append(y, 1)
	return x, y
}

// WritePlots writes, per workload of the report, a TTFT CDF per policy at
// cdfLoad (the nearest load run) and mean TTFT against load with 95%
// confidence bars, as PNG files into dir. It returns the paths written.
// TTFT CDFs need a report run with KeepTTFTs.
func WritePlots(rep *Report, dir string, cdfLoad float64) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	write := func(name string, c Chart) error {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		if err := c.WritePNG(f); err != nil {
			f.Close()
			return err
		}
		paths = append(paths, p)
		return f.Close()
	}
	for _, w := range rep.Workloads {
		file := strings.NewReplacer(":", "_", "/", "_").Replace(w.Name)
		loads, policies := pointsIndex(w)
		best := loads[0]
		for _, l := range loads {
			if math.Abs(l-cdfLoad) < math.Abs(best-cdfLoad) {
				best = l
			}
		}
		cdf := Chart{Title: fmt.Sprintf("%s: TTFT CDF at load %.2f (all seeds pooled)", w.Name, best),
			XLabel: "TTFT (s, log scale)", YLabel: "fraction", LogX: true}
		vs := Chart{Title: fmt.Sprintf("%s: mean TTFT vs load (95%% CI over seeds)", w.Name),
			XLabel: "load (fraction of FCFS saturation)", YLabel: "mean TTFT (s)"}
		for _, p := range policies {
			s := Series{Name: p}
			for _, pt := range w.Points {
				if pt.Policy != p {
					continue
				}
				s.X = append(s.X, pt.Load)
				s.Y = append(s.Y, pt.Agg.TTFTMean.Mean)
				s.Err = append(s.Err, pt.Agg.TTFTMean.CI)
				if pt.Load == best && len(pt.TTFTs) > 0 {
					x, y := CDF(pt.TTFTs, 400)
					cdf.Series = append(cdf.Series, Series{Name: p, X: x, Y: y})
				}
			}
			vs.Series = append(vs.Series, s)
		}
		if err := write(file+"_ttft_vs_load.png", vs); err != nil {
			return paths, err
		}
		if len(cdf.Series) > 0 {
			if err := write(file+"_ttft_cdf.png", cdf); err != nil {
				return paths, err
			}
		}
	}
	return paths, nil
}

func pointsIndex(w WorkloadPoint) (loads []float64, policies []string) {
	for _, pt := range w.Points {
		if !slices.Contains(loads, pt.Load) {
			loads = append(loads, pt.Load)
		}
		if !slices.Contains(policies, pt.Policy) {
			policies = append(policies, pt.Policy)
		}
	}
	return loads, policies
}
