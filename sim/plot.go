package sim

import (
	"fmt"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WritePlots draws two PNGs into dir (created if missing) with one line per policy (SIM-1's
// `--plots`): density.png, live sandboxes per live host over time, and refusals.png, 503
// refusals per minute over time. It returns the files written; errors are the file system's
// or the plotting library's, wrapped.
func WritePlots(dir string, reports []Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("sim: plots: %w", err)
	}
	type chart struct {
		file, title, y string
		value          func(s Sample, period float64) float64
	}
	charts := []chart{
		{"density.png", "Density", "sandboxes per host", func(s Sample, _ float64) float64 { return s.PerHost }},
		{"refusals.png", "Refusals (503)", "refusals per minute", func(s Sample, period float64) float64 {
			return float64(s.Refused) / period * 60
		}},
	}
	var files []string
	for _, c := range charts {
		p := plot.New()
		p.Title.Text = c.title
		p.X.Label.Text = "virtual time (minutes)"
		p.Y.Label.Text = c.y
		p.Legend.Top = true
		for i, r := range reports {
			pts := make(plotter.XYs, len(r.Series))
			prev := 0.0
			for j, s := range r.Series {
				period := s.T - prev
				prev = s.T
				if period <= 0 {
					period = 1
				}
				pts[j] = plotter.XY{X: s.T / 60, Y: c.value(s, period)}
			}
			if len(pts) == 0 {
				continue
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return files, fmt.Errorf("sim: plot %s: %w", c.file, err)
			}
			l.Color = plotutil.Color(i)
			l.Dashes = plotutil.Dashes(i / 7)
			p.Add(l)
			p.Legend.Add(r.Policy, l)
		}
		path := filepath.Join(dir, c.file)
		if err := p.Save(10*vg.Inch, 5*vg.Inch, path); err != nil {
			return files, fmt.Errorf("sim: plot %s: %w", c.file, err)
		}
		files = append(files, path)
	}
	return files, nil
}
