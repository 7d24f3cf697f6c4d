// Package promread reads a value out of a Prometheus registry: how the
// library's own tests and benchmarks see a rank's counters, which
// kvmanager exports as metrics (docs/METRICS.md), not as Go structs.
package promread

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value sums the series of the metric family name (a counter, gauge or
// untyped metric) whose labels include every pair of labels ("name",
// "value", ...). A family that is not there is 0: a counter never
// incremented may not be exported.
func Value(g prometheus.Gatherer, name string, labels ...string) (float64, error) {
	if len(labels)%2 != 0 {
		return 0, fmt.Errorf("promread: labels %q are not name, value pairs", labels)
	}
	fams, err := g.Gather()
	if err != nil {
		return 0, fmt.Errorf("promread: gathering %s: %w", name, err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if match(m, labels) {
				sum += value(m)
			}
		}
	}
	return sum, nil
}

func match(m *dto.Metric, labels []string) bool {
	for i := 0; i < len(labels); i += 2 {
		ok := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// ByLabel is the metric family name's series by the value of their label
// label (summed over their other labels).
func ByLabel(g prometheus.Gatherer, name, label string) (map[string]float64, error) {
	fams, err := g.Gather()
	if err != nil {
		return nil, fmt.Errorf("promread: gathering %s: %w", name, err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] += value(m)
				}
			}
		}
	}
	return out, nil
}
