package sim

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
	// Err, if set, draws ±Err[i] error bars.
	Err []float64
}

// Chart is a line chart with a legend, drawn with gonum.org/v1/plot.
type Chart struct {
	Title, XLabel, YLabel string
	// LogX draws the x axis on a log scale (points with x ≤ 0 are left
	// out).
	LogX bool
	// LegendTop puts the legend at the top left instead of the bottom
	// right.
	LegendTop bool
	Series    []Series
}

// Chart dimensions.
const (
	ChartWidth  = 16 * vg.Centimeter
	ChartHeight = 10 * vg.Centimeter
)

// PlotFormats are the file formats WritePlots and Chart.Save write.
var PlotFormats = []string{"svg", "pdf", "png"}

type errPoints struct {
	plotter.XYs
	plotter.YErrors
}

// Plot builds the chart.
func (c Chart) Plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text, p.Y.Label.Text = c.XLabel, c.YLabel
	p.Add(plotter.NewGrid())
	if c.LogX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Legend.Top, p.Legend.Left = c.LegendTop, c.LegendTop
	for i, s := range c.Series {
		var pts plotter.XYs
		var errs plotter.YErrors
		for k := range s.X {
			if c.LogX && !(s.X[k] > 0) {
				continue
			}
			pts = append(pts, plotter.XY{X: s.X[k], Y: s.Y[k]})
			if s.Err != nil {
				errs = append(errs, struct{ Low, High float64 }{s.Err[k], s.Err[k]})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("sim: chart %q series %q: %w", c.Title, s.Name, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Name, l)
		if s.Err != nil {
			// Few points, each a measurement: mark them.
			dots, err := plotter.NewScatter(pts)
			if err != nil {
				return nil, fmt.Errorf("sim: chart %q series %q: %w", c.Title, s.Name, err)
			}
			dots.Color, dots.Shape = l.Color, plotutil.Shape(i)
			p.Add(dots)
			eb, err := plotter.NewYErrorBars(errPoints{pts, errs})
			if err != nil {
				return nil, fmt.Errorf("sim: chart %q series %q: %w", c.Title, s.Name, err)
			}
			eb.Color = l.Color
			p.Add(eb)
		}
	}
	if !c.LogX {
		// Times are not negative, whatever an interval says; a margin keeps
		// the outermost error bars off the frame.
		p.Y.Min = 0
		pad := (p.X.Max - p.X.Min) * 0.03
		p.X.Min, p.X.Max = p.X.Min-pad, p.X.Max+pad
	}
	return p, nil
}

// Save writes the chart to path in the format its extension names: .svg,
// .pdf or .png.
func (c Chart) Save(path string) error {
	ext := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	if !slices.Contains(PlotFormats, ext) {
		return fmt.Errorf("sim: plot %s: format %q is not one of %v", path, ext, PlotFormats)
	}
	p, err := c.Plot()
	if err != nil {
		return err
	}
	return p.Save(ChartWidth, ChartHeight, path)
}

// WritePlots writes, per workload of the report, into dir in the given
// format (one of PlotFormats): NAME_ttft_vs_load (mean TTFT against load
// with 95% confidence bars), NAME_p99_vs_load (p99 TTFT likewise) and
// NAME_ttft_cdf (the TTFT CDF per policy at cdfLoad, the nearest load run,
// from the points' TTFTQuantiles), NAME being the workload's name with ":",
// "/" and "," replaced by "_". It returns the paths written.
func WritePlots(rep *Report, dir string, cdfLoad float64, format string) ([]string, error) {
	if !slices.Contains(PlotFormats, format) {
		return nil, fmt.Errorf("sim: plot format %q is not one of %v", format, PlotFormats)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	write := func(name string, c Chart) error {
		p := filepath.Join(dir, name+"."+format)
		if err := c.Save(p); err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	}
	for _, w := range rep.Workloads {
		file := PlotName(w.Name)
		loads, policies := pointsIndex(w)
		best := loads[0]
		for _, l := range loads {
			if math.Abs(l-cdfLoad) < math.Abs(best-cdfLoad) {
				best = l
			}
		}
		cdf := Chart{Title: fmt.Sprintf("%s: TTFT CDF at load %.2f (all seeds pooled)", w.Name, best),
			XLabel: "TTFT (s, log scale)", YLabel: "fraction of requests", LogX: true}
		mean := Chart{Title: fmt.Sprintf("%s: mean TTFT vs load (95%% CI over seeds)", w.Name),
			XLabel: "load (fraction of FCFS saturation)", YLabel: "mean TTFT (s)", LegendTop: true}
		p99 := Chart{Title: fmt.Sprintf("%s: p99 TTFT vs load (95%% CI over seeds)", w.Name),
			XLabel: "load (fraction of FCFS saturation)", YLabel: "p99 TTFT (s)", LegendTop: true}
		for _, p := range policies {
			sm, sp := Series{Name: p}, Series{Name: p}
			for _, pt := range w.Points {
				if pt.Policy != p {
					continue
				}
				sm.X, sp.X = append(sm.X, pt.Load), append(sp.X, pt.Load)
				sm.Y, sm.Err = append(sm.Y, pt.Agg.TTFTMean.Mean), append(sm.Err, pt.Agg.TTFTMean.CI)
				sp.Y, sp.Err = append(sp.Y, pt.Agg.TTFTP99.Mean), append(sp.Err, pt.Agg.TTFTP99.CI)
				if pt.Load == best && len(pt.TTFTQuantiles) > 1 {
					q := pt.TTFTQuantiles
					ys := make([]float64, len(q))
					for i := range ys {
						ys[i] = float64(i) / float64(len(q)-1)
					}
					cdf.Series = append(cdf.Series, Series{Name: p, X: q, Y: ys})
				}
			}
			mean.Series, p99.Series = append(mean.Series, sm), append(p99.Series, sp)
		}
		if err := write(file+"_ttft_vs_load", mean); err != nil {
			return paths, err
		}
		if err := write(file+"_p99_vs_load", p99); err != nil {
			return paths, err
		}
		if len(cdf.Series) > 0 {
			if err := write(file+"_ttft_cdf", cdf); err != nil {
				return paths, err
			}
		}
	}
	return paths, nil
}

// PlotName is the file name stem of a workload's plots.
func PlotName(workload string) string {
	return strings.NewReplacer(":", "_", "/", "_", ",", "_").Replace(workload)
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
