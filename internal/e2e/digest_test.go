package e2e

import (
	"fmt"
	"testing"

	"github.com/kvbridge/kvbridge/internal/rawagent"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/stretchr/testify/require"
)

// TestDigestFailsAFlippedByte: with Config.Digest on the decode rank,
// rooms of every size land byte-exact and succeed on every engine
// (libnixl: the NIXL double here, a real NIXL under make test-nixl),
// pushed and pulled; then one bit flipped in flight — of a write's
// source after its digest was taken (the agent's fault, CorruptWrites),
// or of what a pull read landed before its completion (CorruptReads): the
// bytes that land are not the ones digested, as a bad link's would be —
// fails that room with code corrupt,
// naming the decode page, layers and prefill rank, counted in
// kvbridge_digest_mismatches_total; its load report vouches for no page
// of that chunk; the next room, not corrupted, succeeds.
func TestDigestFailsAFlippedByte(t *testing.T) {
	for key, pull := range modes() {
		t.Run(key, func(t *testing.T) {
			engine, _ := splitMode(key)
			c := newCluster(t, engine, func(cfg *kvmanager.Config) {
				cfg.Digest = cfg.Role == kvmanager.RoleDecode
				cfg.Pull = pull && cfg.Role == kvmanager.RoleDecode
			})
			for i, tokens := range []int{1, 17, 1000, 4096} {
				c.roomByteExact(t, uint64(100+i), tokens, 64)
			}
			require.Zero(t, counter(c.decode.Manager, "kvbridge_digest_mismatches_total"))
			require.NotZero(t, counter(c.decode.Manager, "kvbridge_digest_pages_checked_total"), "pages checked by digest")

			if pull {
				rawagent.Of(c.decode).CorruptReads(1, pageBytes) // (a KV page; not the aux item or a state item)
			} else {
				rawagent.Of(c.prefill).CorruptWrites(1)
			}
			rm, rep := c.failedRoom(t, 200, 64*pageToks)
			require.Equal(t, kvmanager.CodeCorrupt, rep.Code, "code: %s", rep.Reason)
			require.Contains(t, rep.Reason, c.prefill.Endpoint(), "the failure names the prefill rank")
			require.Regexp(t, fmt.Sprintf(`prefill rank .*, chunk 0: position \d+ \(decode page \d+\), layers 0–%d: CRC-32C [0-9a-f]{8}, the prefill rank's digest [0-9a-f]{8}`, layers), rep.Reason)
			for _, s := range rep.Sources {
				require.Empty(t, s.Landed, "source %d: a corrupted chunk vouched for", s.Source)
			}
			require.EqualValues(t, 1, counter(c.decode.Manager, "kvbridge_digest_mismatches_total"))
			rm.s.Clear()
			rm.r.Clear()
			c.roomByteExact(t, 201, 100, 64)
		})
	}
}

// failedRoom runs a room of tokens that is to fail (a fault set up
// before), in chunks of 64 pages: it waits for Failed and for its pages'
// release, and returns it and its load report.
func (c *cluster) failedRoom(t *testing.T, id uint64, tokens int) (*room, kvmanager.LoadReport) {
	t.Helper()
	rm := c.start(t, id, tokens)
	ready(t, rm.s)
	c.sendAll(t, rm, 64)
	waitStatus(t, rm.r, kvmanager.Failed)
	select {
	case <-rm.r.Released():
	case <-ctx(t).Done():
		t.Fatalf("room %d: its pages never released", id)
	}
	rep, ok := rm.r.Report()
	require.True(t, ok, "room %d: its load report", id)
	return rm, rep
}
