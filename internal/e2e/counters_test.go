package e2e

import (
	"errors"
	"fmt"

	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/promread"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/prometheus/client_golang/prometheus"
)

// The ranks' counters are read from their metrics (docs/METRICS.md):
// kvmanager exports them as metrics only. A Manager made from a Config
// through metered has a registry of its own.

// metered gives cfg a registry of its own, unless it has one that can be
// read back.
func metered(cfg *kvmanager.Config) {
	if _, ok := cfg.Registerer.(prometheus.Gatherer); !ok {
		cfg.Registerer = prometheus.NewRegistry()
	}
}

// counter is m's metric name, summed over the series whose labels include
// the pairs labels.
func counter(m *kvmanager.Manager, name string, labels ...string) uint64 {
	g, ok := m.Config().Registerer.(prometheus.Gatherer)
	if !ok {
		panic(fmt.Sprintf("counter %s: the Manager's Config has no registry to read back (metered)", name))
	}
	v, err := promread.Value(g, name, labels...)
	if errors.Is(err, promread.ErrNoFamily) && name == "kvbridge_registry_events_total" {
		return 0 // (its series are exported once they count something)
	}
	if err != nil {
		panic(err) // a misspelt name, or a rank read after Close: the check would pass on nothing
	}
	return uint64(v)
}

// coreEntries counts what m's core holds that an idle rank gives back by
// the tombstone TTL (kvbridge_core_entries but epochs, peers, targets and
// offers).
func coreEntries(m *kvmanager.Manager) (n uint64) {
	for _, t := range []string{"live", "pending", "tombstones", "draining", "pending_peers", "holds", "owed_aborts", "in_use", "pull_holds", "waiters"} {
		n += counter(m, "kvbridge_core_entries", "table", t)
	}
	return n
}

// byLabel is m's metric name by the value of its label label.
func byLabel(m *kvmanager.Manager, name, label string) map[string]uint64 {
	g, ok := m.Config().Registerer.(prometheus.Gatherer)
	if !ok {
		panic(fmt.Sprintf("byLabel %s: the Manager's Config has no registry to read back (metered)", name))
	}
	v, err := promread.ByLabel(g, name, label)
	if err != nil {
		panic(err)
	}
	out := make(map[string]uint64, len(v))
	for k, x := range v {
		out[k] = uint64(x)
	}
	return out
}

// controlStats is m's control loop's counters, read from its metrics
// (docs/METRICS.md: kvbridge_control_*, kvbridge_unauthenticated_*,
// kvbridge_replayed_messages_total, ...).
func controlStats(m *kvmanager.Manager) control.Stats {
	return control.Stats{
		Received:        counter(m, "kvbridge_control_messages_received_total"),
		Sent:            counter(m, "kvbridge_control_messages_sent_total"),
		Malformed:       byLabel(m, "kvbridge_malformed_messages_total", "reason"),
		Dropped:         byLabel(m, "kvbridge_control_send_dropped_total", "reason"),
		Unauthenticated: counter(m, "kvbridge_unauthenticated_connections_total"),
		Refused:         byLabel(m, "kvbridge_unauthenticated_messages_total", "reason"),
		Replayed:        byLabel(m, "kvbridge_replayed_messages_total", "reason"),
		PeersDead:       counter(m, "kvbridge_peers_dead_total"),
		Backlogged:      counter(m, "kvbridge_control_backlog_dropped_total"),
		Sockets:         counter(m, "kvbridge_control_sockets"),
	}
}
