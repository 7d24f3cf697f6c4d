package e2e

import (
	"testing"

	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// TestPagesOfDifferentSizesByteExact: a prefill rank and a decode rank
// whose pages hold different numbers of tokens (both ways, HND and NHD)
// move rooms on every engine — a room whose last page is partly filled,
// one sent in several chunks, one with a prefix decode holds — and every
// head of every token of the room lands in the decode page and slot its
// token maps to (kvmodel's token-indexed pattern, checked page by page).
// Pushed (the prefill rank writes) and pulled (the decode rank reads),
// every room with a digest.
func TestPagesOfDifferentSizesByteExact(t *testing.T) {
	t.Parallel() // its own processes and ports

	const rankPages = 1024 // (newCluster fills 1 MiB of each region)
	for engine, pull := range modes() {
		for _, tc := range []struct {
			name            string
			prefill, decode int
			layout          transfer.PageLayout
		}{
			{"4 to 16 HND", 4, 16, transfer.HND},
			{"16 to 4 NHD", 16, 4, transfer.NHD},
			{"32 to 8 HND", 32, 8, transfer.HND},
		} {
			t.Run(engine+"/"+tc.name, func(t *testing.T) {
				engine, mode := splitMode(engine)
				model := func(role kvmanager.Role) kvmodel.Model {
					m := kvmodel.Presets["tiny"]
					m.PageTokens = tc.prefill
					if role == kvmanager.RoleDecode {
						m.PageTokens = tc.decode
					}
					return m
				}
				c := newCluster(t, engine, func(cfg *kvmanager.Config) {
					cfg.Pull = pull && cfg.Role == kvmanager.RoleDecode
					cfg.Digest = cfg.Role == kvmanager.RoleDecode // (every room checked by its digest too)
					m := model(cfg.Role)
					cfg.Compat, cfg.Model, cfg.PageTokens = m.Compat(), m.Mapping(tc.layout), m.PageTokens
					var err error
					cfg.Layout, err = m.RankLayout(nixl.DRAM, tc.layout, transfer.Parallel{}, rankPages, 64)
					require.NoError(t, err)
				})
				pm, dm := model(kvmanager.RolePrefill).Mapping(tc.layout), model(kvmanager.RoleDecode).Mapping(tc.layout)
				pKV, _ := c.prefill.Memory()
				dKV, _ := c.decode.Memory()
				pb, _ := pm.PageBytes(1)
				db, _ := dm.PageBytes(1)
				seed := kvmodel.InstanceSeed("e2e")
				for i, room := range []struct {
					tokens, prefix, chunkTokens int
				}{{200, 0, 0}, {133, 0, 64}, {100, 2, 32}} {
					id := uint64(500 + i)
					np, nd := (room.tokens+tc.prefill-1)/tc.prefill, (room.tokens+tc.decode-1)/tc.decode
					src := make([]uint32, np)
					for k := range src {
						src[k] = uint32((k*7 + 3) % rankPages)
					}
					dst := make([]uint32, nd-room.prefix)
					for k := range dst {
						dst[k] = uint32((k*11 + 5) % rankPages)
					}
					for region, mem := range pKV {
						for pos, pg := range src {
							kvmodel.FillHeads(mem[uint64(pg)*pb:uint64(pg+1)*pb], pm, 0, pm.KVHeads, seed, id, pos, region)
						}
					}
					for region := range dKV {
						clear(dKV[region])
					}
					r, err := receiver.New(c.decode, id)
					require.NoError(t, err)
					require.NoError(t, r.Init(ctx(t), kvmanager.RequestSpec{DstPages: dst, AuxIndex: -1, Prefix: room.prefix}))
					s, err := sender.New(c.prefill, id)
					require.NoError(t, err)
					s.Init()
					st, err := s.WaitReady(ctx(t))
					require.Equal(t, kvmanager.WaitingForInput, st, "room %d: %v", id, err)
					step := len(src)
					if room.chunkTokens > 0 {
						step = max(room.chunkTokens/tc.prefill, 1)
					}
					for k := 0; k < len(src); k += step {
						end := min(k+step, len(src))
						require.NoError(t, s.Send(src[k:end], end == len(src), -1), "room %d chunk at %d", id, k)
					}
					waitStatus(t, r, kvmanager.Success)
					waitStatus(t, s, kvmanager.Success)
					released(t, s)
					for region, mem := range dKV {
						for k, pg := range dst {
							pos := room.prefix + k
							require.True(t, kvmodel.CheckHeads(mem[uint64(pg)*db:uint64(pg+1)*db], dm, 0, dm.KVHeads, seed, id, pos, region, room.tokens),
								"room %d (%d tokens, prefix %d): region %d decode page %d (position %d) differs", id, room.tokens, room.prefix, region, pg, pos)
						}
					}
					r.Clear()
					s.Clear()
				}
				require.Equal(t, pull, counter(c.prefill.Manager, "kvbridge_pull_pages_published_total") > 0, "%s: pages published", mode)
				require.NotZero(t, counter(c.decode.Manager, "kvbridge_digest_pages_checked_total"), "%s: pages checked by digest", mode)
			})
		}
	}
}
