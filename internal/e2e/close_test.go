package e2e

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/stretchr/testify/require"
)

// abortsUnreadCluster is a cluster whose decode rank's quarantine is 5
// minutes and whose prefill rank drops every ABORT it receives (a test
// hook), as a process that closes and exits before reading them would:
// only ACKs sent unasked can release the decode rank's pages in time.
func abortsUnreadCluster(t *testing.T, engine string) *cluster {
	return newCluster(t, engine, func(cfg *kvmanager.Config) {
		cfg.QuarantineTimeout = 5 * time.Minute
		if cfg.Role == kvmanager.RolePrefill {
			rankhooks.Set(cfg, rankhooks.Hooks{Drop: func(m any) bool {
				_, abort := m.(*wire.Abort)
				return abort
			}})
		}
	})
}

// releasedSoon waits up to 20 s for a failed room's pages to be released
// (the cluster's quarantine is 5 minutes) and checks that the quarantine
// released nothing.
func releasedSoon(t *testing.T, c *cluster, rc *receiver.Receiver, after string) {
	t.Helper()
	select {
	case <-rc.Released():
	case <-time.After(20 * time.Second):
		t.Fatalf("room %d: the decode rank still holds its pages 20 s after %s (status %v, %q); the quarantine is 5 minutes",
			rc.Room(), after, rc.Poll(), rc.Failure())
	}
	require.Equal(t, kvmanager.Failed, rc.Poll(), "room %d", rc.Room())
	require.Zero(t, counter(c.decode.Manager, "kvbridge_quarantine_expired_total"), "room %d released by the quarantine", rc.Room())
}

// TestPrefillCloseReleasesDecodePages: a prefill rank that closes with a
// room mid-transfer (one chunk written, the rest never sent) and a
// REQUEST still waiting for its sender tells the decode rank both rooms
// failed and acknowledges them drained without waiting for its ABORTs
// (docs/PROTOCOL.md "A rank that closes"), so the decode rank releases
// both rooms' pages at once, not at the quarantine deadline (5 minutes
// here), on every engine. The prefill rank drops every ABORT it receives
// (a test hook), as a process that exits before reading them would: only
// the unasked ACKs can release the pages. Before, the ACKs went out only
// if the decode rank's ABORTs were read before the closing rank's control
// loop stopped.
func TestPrefillCloseReleasesDecodePages(t *testing.T) {
	for engine := range engines {
		t.Run(engine, func(t *testing.T) {
			c := abortsUnreadCluster(t, engine)
			rm := c.start(t, 20, 2048)
			ready(t, rm.s)
			require.NoError(t, rm.s.Send(rm.src[:32], false, -1))

			// Room 21: the decode rank's REQUEST waits at the prefill rank
			// for a sender the application never creates.
			pending := func() uint64 {
				return counter(c.prefill.Manager, "kvbridge_registry_events_total", "event", core.EventRequest.String(), "outcome", core.Pending.String())
			}
			before := pending()
			r, err := receiver.New(c.decode, 21)
			require.NoError(t, err)
			require.NoError(t, r.Init(ctx(t), kvmanager.RequestSpec{DstPages: c.dFree.Get(4), AuxIndex: -1}))
			require.Eventually(t, func() bool { return pending() > before }, 30*time.Second, 10*time.Millisecond,
				"room 21's REQUEST never reached the prefill rank")

			require.NoError(t, c.prefill.Close())
			for _, rc := range []*receiver.Receiver{rm.r, r} {
				releasedSoon(t, c, rc, "the prefill rank closed")
				require.Contains(t, rc.Failure(), "closed", "room %d: its failure names the prefill rank's close", rc.Room())
				rc.Clear()
			}
		})
	}
}

// TestClearedThenCloseReleasesDecodePages: a room the prefill application
// clears before it finished, with nothing in flight, and the rank closing
// right after (a process exiting on SIGTERM): the drained ABORT_ACK goes
// with the STATUS cleared, unasked, so the decode rank releases the pages
// at once; before, the ACK answered the decode rank's ABORT, which a rank
// that closes first never reads, and the pages waited out the quarantine
// (found by a fault hunt). The prefill rank drops every ABORT it
// receives (a test hook), as such a process would.
func TestClearedThenCloseReleasesDecodePages(t *testing.T) {
	prefillEndsRoom(t, 40, "the prefill rank cleared it and closed", func(t *testing.T, c *cluster, rm *room) {
		rm.s.Clear()
		waitStatus(t, rm.r, kvmanager.Failed)
		require.Contains(t, rm.r.Failure(), "cleared")
		require.NoError(t, c.prefill.Close())
	})
}

// prefillEndsRoom runs, on every engine, a room the prefill application
// ends (end) once its REQUEST is in, on a cluster whose prefill rank
// drops every ABORT, and checks that the decode rank's pages are released
// at once, not at the quarantine.
func prefillEndsRoom(t *testing.T, id uint64, after string, end func(t *testing.T, c *cluster, rm *room)) {
	for engine := range engines {
		t.Run(engine, func(t *testing.T) {
			c := abortsUnreadCluster(t, engine)
			rm := c.start(t, id, 256)
			ready(t, rm.s)
			end(t, c, rm)
			releasedSoon(t, c, rm.r, after)
			rm.r.Clear()
			rm.s.Clear()
		})
	}
}

// TestRequestUnreadAtCloseFreesPages: a REQUEST that reaches a prefill
// rank only after its Close — or never, its control loop stopped — was
// left unanswered: the decode rank's room waited for the heartbeats, its
// pages for the quarantine (5 minutes here), and its next rooms went on
// to the closed process (found by a fault hunt). The closing rank's
// notice names the highest REQUEST number it took, so the decode rank
// fails the room at once and frees its pages unforced, on every engine
// (docs/PROTOCOL.md "A rank that closes"). The prefill rank drops the
// room's REQUEST unread (a test hook), as a rank whose loop stopped
// would.
func TestRequestUnreadAtCloseFreesPages(t *testing.T) {
	for engine := range engines {
		t.Run(engine, func(t *testing.T) {
			const id = 31
			dropped := make(chan struct{}, 1)
			c := newCluster(t, engine, func(cfg *kvmanager.Config) {
				cfg.QuarantineTimeout = 5 * time.Minute
				if cfg.Role == kvmanager.RolePrefill {
					rankhooks.Set(cfg, rankhooks.Hooks{Drop: func(m any) bool {
						q, ok := m.(*wire.Request)
						if ok && q.Room == id {
							select {
							case dropped <- struct{}{}:
							default:
							}
						}
						return ok && q.Room == id
					}})
				}
			})
			r, err := receiver.New(c.decode, id)
			require.NoError(t, err)
			require.NoError(t, r.Init(ctx(t), kvmanager.RequestSpec{DstPages: c.dFree.Get(4), AuxIndex: -1}))
			select {
			case <-dropped:
			case <-time.After(30 * time.Second):
				t.Fatal("room 31's REQUEST never reached the prefill rank")
			}

			require.NoError(t, c.prefill.Close())
			releasedSoon(t, c, r, "the prefill rank closed without reading its REQUEST")
			require.Contains(t, r.Failure(), "REQUEST 1 of room 31 not taken", "the failure names the REQUEST the closed rank never took")
			require.EqualValues(t, 1, counter(c.decode.Manager, "kvbridge_closed_notices_total", "outcome", "untaken"))
			require.EqualValues(t, 1, counter(c.decode.Manager, "kvbridge_closed_notices_total", "outcome", "heard"))
			r.Clear()
		})
	}
}

// TestPrefillAbortReleasesDecodePages: a room the prefill application
// aborts with nothing of it in flight sends the decode rank its drained
// ABORT_ACK with the STATUS, unasked, so the decode rank's pages are
// released at once even when its ABORT is never read (the prefill rank
// drops every ABORT, a test hook, as a process killed or closed right
// after would), on every engine; before, they waited out the quarantine
// (5 minutes here).
func TestPrefillAbortReleasesDecodePages(t *testing.T) {
	prefillEndsRoom(t, 50, "the prefill rank aborted it", func(_ *testing.T, _ *cluster, rm *room) {
		rm.s.Abort("the request was cancelled")
	})
}
