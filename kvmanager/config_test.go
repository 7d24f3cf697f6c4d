package kvmanager

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// Bug 10: zero means "default" only where zero is not a valid value.
func TestConfigDefaultsFieldByField(t *testing.T) {
	cfg := Config{Role: RoleDecode, Rank: 3, PrefillRank: 0}
	cfg.Registry.StallTimeout = 7 * time.Second // custom; BootstrapTimeout left zero
	cfg.Registry.TombstoneTTL = time.Hour
	cfg.fillDefaults()
	require.Zero(t, cfg.PrefillRank, "PrefillRank 0 replaced")
	def := core.DefaultRegistryConfig()
	require.Equal(t, 7*time.Second, cfg.Registry.StallTimeout, "custom timeouts replaced: %+v", cfg.Registry)
	require.Equal(t, time.Hour, cfg.Registry.TombstoneTTL, "custom timeouts replaced: %+v", cfg.Registry)
	require.Equal(t, def.BootstrapTimeout, cfg.Registry.BootstrapTimeout, "zero fields not defaulted: %+v", cfg.Registry)
	require.Equal(t, 14*time.Second, cfg.QuarantineTimeout, "zero fields not defaulted: quarantine")
}

// kvbridge_transfer_bytes_total counts the layers a write moved, not every
// layer of its pages.
func TestWriteBytesCountsItsLayers(t *testing.T) {
	l := transfer.Layout{Regions: make([]nixl.Desc, 4), PageBytes: 64} // 2 layers, 64-byte pages
	w := kvlayout.Write{Runs: []kvlayout.Run{{Src: 0, Dst: 0, Len: 3}}, AuxSrc: -1, State: -1}
	require.EqualValues(t, 3*64*4, writeBytes(&w, l), "whole chunk: bytes")
	w.Layers = kvlayout.Layers{Lo: 1, Hi: 2}
	require.EqualValues(t, 3*64*2, writeBytes(&w, l), "layer 1 of 2: bytes")
}
