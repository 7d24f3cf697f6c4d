package main

import (
	"fmt"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// chart draws engine write bandwidth against size, kvbridge next to each
// reference, on a log-2 size axis.
func chart(rows []Row, path string) error {
	series := map[string]plotter.XYs{}
	for _, r := range rows {
		if r.Mode != "engine" {
			continue
		}
		x := float64(r.Bytes)
		series["kvbridge"] = append(series["kvbridge"], plotter.XY{X: x, Y: r.Value})
		for k, v := range r.References {
			series[k] = append(series[k], plotter.XY{X: x, Y: v})
		}
	}
	if len(series) == 0 {
		return fmt.Errorf("no engine rows to chart")
	}
	p := plot.New()
	p.Title.Text = "kvbridge engine write bandwidth"
	p.X.Label.Text = "transfer size (bytes)"
	p.Y.Label.Text = "GB/s"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	names := make([]string, 0, len(series))
	for k := range series {
		names = append(names, k)
	}
	sort.Strings(names)
	var args []any
	for _, k := range names {
		args = append(args, k, series[k])
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}
