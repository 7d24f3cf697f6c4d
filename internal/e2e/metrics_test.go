package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestManagerMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newCluster(t, "loopback", func(cfg *kvmanager.Config) { cfg.Registerer = reg })
	rm := c.start(t, 60, 512)
	ready(t, rm.s)
	c.sendAll(t, rm, 64)
	waitStatus(t, rm.r, kvmanager.Success)
	waitStatus(t, rm.s, kvmanager.Success)
	// (A room's phases are observed right after the step that woke its
	// Success waiter: polled until they are in.)
	require.Eventually(t, func() bool {
		fs, err := reg.Gather()
		if err != nil {
			return false
		}
		got := phaseCounts(fs)
		for _, k := range succeededPhases {
			if got[k] == 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "the succeeded room's phases never observed")
	aborted := c.start(t, 61, 64)
	ready(t, aborted.s)
	aborted.r.Abort("metrics test")
	waitStatus(t, aborted.s, kvmanager.Failed)

	families, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, want := range []string{"kvbridge_rooms", "kvbridge_inflight_writes", "kvbridge_transfers_total",
		"kvbridge_transfer_bytes_total", "kvbridge_transfer_latency_seconds", "kvbridge_aborts_total",
		"kvbridge_registry_events_total", "kvbridge_rooms_past_deadline", "kvbridge_status_failed_sent_total"} {
		assert.True(t, names[want], "metric %s not exposed (have %v)", want, names)
	}
	// 512 tokens = 32 pages × 8 regions × 1 KiB, plus the 64-byte aux item,
	// written by the prefill rank; the decode rank writes nothing.
	want := `
# HELP kvbridge_transfer_bytes_total Bytes moved: written by a prefill rank (push) or read by a decode rank (pull).
# TYPE kvbridge_transfer_bytes_total counter
kvbridge_transfer_bytes_total{instance="` + c.decode.Config().Instance + `",rank="0",role="decode"} 0
kvbridge_transfer_bytes_total{instance="` + c.prefill.Config().Instance + `",rank="0",role="prefill"} 262208
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "kvbridge_transfer_bytes_total"))
	// The succeeded room's phases: on prefill every status before
	// Success, on decode at least the two before its data (its last
	// notification may bring all of it); the aborted room adds none.
	phases := phaseCounts(families)
	for _, k := range succeededPhases {
		assert.EqualValues(t, 1, phases[k], "kvbridge_room_phase_seconds %s: observations (have %v)", k, phases)
	}
	for _, f := range families {
		if f.GetName() == "kvbridge_rooms_past_deadline" {
			for _, m := range f.GetMetric() {
				require.Zero(t, m.GetGauge().GetValue(), "rooms past deadline: %v", m)
			}
		}
	}
	// The core's tables: the two rooms live on each rank until cleared,
	// then tombstones (kvbridge_core_entries, read by the tests' counter).
	for _, role := range []string{"prefill", "decode"} {
		assert.EqualValues(t, 2, counter(c.prefill.Manager, "kvbridge_core_entries", "table", "live", "role", role), "%s: live rooms", role)
	}
	c.finish(rm)
	c.finish(aborted)
	for _, role := range []string{"prefill", "decode"} {
		assert.Zero(t, counter(c.prefill.Manager, "kvbridge_core_entries", "table", "live", "role", role), "%s: live rooms after the clears", role)
		assert.EqualValues(t, 2, counter(c.prefill.Manager, "kvbridge_core_entries", "table", "tombstones", "role", role), "%s: tombstones after the clears", role)
	}
}

// succeededPhases are the kvbridge_room_phase_seconds series (role/status/)
// a pushed room that succeeded observes once each.
var succeededPhases = []string{"prefill/bootstrapping/", "prefill/waiting_for_input/", "prefill/transferring/",
	"decode/bootstrapping/", "decode/waiting_for_input/"}

// phaseCounts is each kvbridge_room_phase_seconds series' observations,
// by "role/status/".
func phaseCounts(families []*dto.MetricFamily) map[string]uint64 {
	phases := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "kvbridge_room_phase_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "role" || l.GetName() == "status" {
					key += l.GetValue() + "/"
				}
			}
			phases[key] = m.GetHistogram().GetSampleCount()
		}
	}
	return phases
}
