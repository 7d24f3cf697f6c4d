package e2e

import (
	"sync/atomic"
	"testing"

	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/stretchr/testify/require"
)

// Layer-wise sends over real sockets and every engine (issue 25): each
// chunk is posted layer by layer, each post gated by its layer's
// readiness, and the layer is "computed" — its pages written — only after
// SendLayers returned and just before it is marked ready. A post that did
// not wait for readiness would move the pages' old bytes and verify fails.
// The decode room succeeds only once every layer of every chunk landed,
// and its load report says so; every room with a digest.
func TestLayerwiseByteExact(t *testing.T) {
	for engine := range engines {
		t.Run(engine, func(t *testing.T) {
			// Every room asks for a digest: the pool sums each layer
			// group's source right before its post, after its readiness
			// (the layers are written just before they are marked ready:
			// a sum of the pages' old bytes would fail the room corrupt),
			// and over that group's layers only.
			c := newCluster(t, engine, func(cfg *kvmanager.Config) { cfg.Digest = cfg.Role == kvmanager.RoleDecode })
			for i, tc := range []struct{ tokens, chunk, group int }{{1000, 16, 1}, {4096, 64, 2}, {17, 1, 4}} {
				rm := c.start(t, uint64(300+i), tc.tokens)
				ready(t, rm.s)
				L := rm.s.Layers()
				require.Equal(t, layers, L, "sender's layers (actual), the layout's (expected)")
				for p := 0; p < len(rm.src); p += tc.chunk {
					pages := rm.src[p:min(p+tc.chunk, len(rm.src))]
					last := p+tc.chunk >= len(rm.src)
					for lo := 0; lo < L; lo += tc.group {
						hi := min(lo+tc.group, L)
						var done atomic.Bool
						require.NoError(t, rm.s.SendLayers(pages, lo, hi, last, rm.auxSrc, func() (bool, error) { return done.Load(), nil }))
						for r := 2 * lo; r < 2*hi; r++ { // the forward pass writes the layers
							for _, pg := range pages {
								fillPage(c.pKV[r][int(pg)*pageBytes:(int(pg)+1)*pageBytes], rm.id<<40|uint64(r)<<20|uint64(pg))
							}
						}
						done.Store(true)
					}
				}
				waitStatus(t, rm.r, kvmanager.Success)
				waitStatus(t, rm.s, kvmanager.Success)
				c.verify(t, rm)
				rep, ok := rm.r.Report()
				require.True(t, ok, "room %d: report %+v", rm.id, rep)
				require.Equal(t, kvmanager.Success, rep.Status, "room %d: report %+v", rm.id, rep)
				require.Len(t, rep.Sources, 1, "room %d: report %+v", rm.id, rep)
				cells := 0
				for _, l := range rep.Whole() {
					cells += l.Count * (l.LayerHi - l.LayerLo)
				}
				require.Equal(t, len(rm.dst)*L, cells, "room %d: the report's whole part in page layers: %+v", rm.id, rep.Whole())
				c.finish(rm)
			}
			require.NotZero(t, counter(c.decode.Manager, "kvbridge_digest_pages_checked_total"), "pages checked by digest")
			require.Zero(t, counter(c.decode.Manager, "kvbridge_digest_mismatches_total"))
		})
	}
}
