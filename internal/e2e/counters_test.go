package e2e

import (
	"fmt"

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
	if err != nil {
		panic(err)
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
