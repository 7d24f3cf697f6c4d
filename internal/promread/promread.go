// Package promread reads a value out of a Prometheus registry: how the
// library's own tests and benchmarks see a rank's counters, which
// kvmanager exports as metrics (docs/METRICS.md), not as Go structs.
package promread

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// ErrNoFamily: the registry has no metric family of that name (a name
// misspelt, or read from a rank that closed: its collectors are
// unregistered).
var ErrNoFamily = errors.New("promread: no such metric family")

// Value sums the series of the metric family name (a counter, gauge or
// untyped metric) whose labels include every pair of labels ("name",
// "value", ...): 0 when none of its series match. A family that is not
// there at all is ErrNoFamily.
func Value(g prometheus.Gatherer, name string, labels ...string) (float64, error) {
	if len(labels)%2 != 0 {
		return 0, fmt.Errorf("promread: labels %q are not name, value pairs", labels)
	}
	ms, err := family(g, name)
	var sum float64
	for _, m := range ms {
		if match(m, labels) {
			sum += value(m)
		}
	}
	return sum, err
}

// ByLabel is the metric family name's series by the value of their label
// label (summed over their other labels); ErrNoFamily when the family is
// not there.
func ByLabel(g prometheus.Gatherer, name, label string) (map[string]float64, error) {
	ms, err := family(g, name)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range ms {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] += value(m)
			}
		}
	}
	return out, nil
}

// family gathers g and returns the series of the family name.
func family(g prometheus.Gatherer, name string) ([]*dto.Metric, error) {
	fams, err := g.Gather()
	if err != nil {
		return nil, fmt.Errorf("promread: gathering %s: %w", name, err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric(), nil
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrNoFamily, name)
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
