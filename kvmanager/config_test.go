package kvmanager

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
)

// Bug 10: zero means "default" only where zero is not a valid value.
func TestConfigDefaultsFieldByField(t *testing.T) {
	cfg := Config{Role: core.RoleDecode, Rank: 3, PrefillRank: 0}
	cfg.Registry.StallTimeout = 7 * time.Second // custom; BootstrapTimeout left zero
	cfg.Registry.TombstoneTTL = time.Hour
	cfg.fillDefaults()
	if cfg.PrefillRank != 0 {
		t.Fatalf("PrefillRank 0 replaced by %d", cfg.PrefillRank)
	}
	def := core.DefaultRegistryConfig()
	if cfg.Registry.StallTimeout != 7*time.Second || cfg.Registry.TombstoneTTL != time.Hour {
		t.Fatalf("custom timeouts replaced: %+v", cfg.Registry)
	}
	if cfg.Registry.BootstrapTimeout != def.BootstrapTimeout || cfg.QuarantineTimeout != 14*time.Second {
		t.Fatalf("zero fields not defaulted: %+v quarantine %v", cfg.Registry, cfg.QuarantineTimeout)
	}
}

// kvbridge_transfer_bytes_total counts the layers a write moved, not every
// layer of its pages.
func TestWriteBytesCountsItsLayers(t *testing.T) {
	l := transfer.Layout{Regions: make([]nixl.Desc, 4), PageBytes: 64} // 2 layers, 64-byte pages
	w := transfer.Write{Runs: []transfer.Run{{Src: 0, Dst: 0, Len: 3}}, AuxSrc: -1, State: -1}
	if got := writeBytes(&w, l); got != 3*64*4 {
		t.Fatalf("whole chunk: %d bytes, want %d", got, 3*64*4)
	}
	w.Layers = transfer.Layers{Lo: 1, Hi: 2}
	if got := writeBytes(&w, l); got != 3*64*2 {
		t.Fatalf("layer 1 of 2: %d bytes, want %d", got, 3*64*2)
	}
}
