package kvmanager

import (
	"testing"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// TestWriteCheckNeedsTheInstanceShape: under a Model, what a prefill rank
// writes into this decode rank follows from its instance's shape; a link
// named without it (CreateReceiver's explicit targets) is left unchecked
// (an error), not planned as a rank of a TP-1 instance, which would put
// tails where another rank writes (a false not_delivered) — while a link
// with its shape is planned: prefill TP 2 → this decode TP 1, each rank
// half the heads of every page.
func TestWriteCheckNeedsTheInstanceShape(t *testing.T) {
	m := kvmodel.Presets["tiny"]
	cfg := DefaultConfig(core.RoleDecode)
	cfg.Auth, cfg.Instance, cfg.Compat, cfg.BootstrapURL = testauth.Auth(), "wcheck-shape", m.Compat(), "http://127.0.0.1:1"
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Model = m.Mapping(transfer.HND)
	var err error
	cfg.Layout, err = m.RankLayout(nixl.DRAM, transfer.HND, transfer.Parallel{}, 8, 4)
	require.NoError(t, err)
	d, err := NewDecode(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })

	for _, rank := range []int{0, 1} {
		_, _, _, write, err := d.slice(core.Link{Target: core.Target{Rank: rank}})
		require.Error(t, err, "rank %d without its instance's shape", rank)
		require.False(t, write)
		s, lo, hi, write, err := d.slice(core.Link{Target: core.Target{Rank: rank, InstTP: 2, InstPP: 1}})
		require.NoError(t, err)
		require.True(t, write)
		require.Equal(t, 1, s.Heads, "rank %d of 2 writes one of the two heads", rank)
		require.Equal(t, rank, s.DstHead)
		require.Equal(t, [2]int{0, len(cfg.Layout.Regions)}, [2]int{lo, hi})
	}
}
