package kvmanager

import (
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
)

// step runs f on the core under the rank's lock, as one critical section
// (several inputs at once), then carries out the effects as stepIn does:
// for tests that need a batch no other step can come between.
func (m *Manager) step(f func(c *core.Core, now time.Time)) {
	m.mu.Lock()
	f(m.core, m.cfg.hooks.Now())
	m.carryOut()
}
