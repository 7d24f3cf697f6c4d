package kvmanager

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPhaseHistograms: a room that entered Bootstrapping at t0,
// WaitingForInput at +2 s, Transferring at +5 s and Success at +9 s is
// recorded in kvbridge_room_phase_seconds as 2, 3 and 4 s (the core's
// TestRoomPhases checks those entry times come from Step).
func TestPhaseHistograms(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	var entered [core.Success + 1]time.Time
	entered[core.Bootstrapping] = t0
	entered[core.WaitingForInput] = t0.Add(2 * time.Second)
	entered[core.Transferring] = t0.Add(5 * time.Second)
	entered[core.Success] = t0.Add(9 * time.Second)
	reg := prometheus.NewRegistry()
	m := newMetrics(&Manager{cfg: Config{Role: RolePrefill, Instance: "p"}})
	reg.MustRegister(m.phases)
	m.observePhases(entered)
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, mm := range f.GetMetric() {
			for _, l := range mm.GetLabel() {
				if l.GetName() == "status" {
					got[l.GetValue()] = mm.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	want := map[string]float64{"bootstrapping": 2, "waiting_for_input": 3, "transferring": 4}
	for k, v := range want {
		assert.Equal(t, v, got[k], "%s: seconds (all: %v)", k, got)
	}
}
