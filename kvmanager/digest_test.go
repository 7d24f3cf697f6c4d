package kvmanager

import (
	"context"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// TestDigestIsTheDecodeRanks (docs/PROTOCOL.md "Digest"): Config.Digest
// is a decode rank's, pushed or pulled, its KV in host memory or in VRAM
// (summed by the device kernel: e2e.TestDigestOverVRAM); on a prefill
// rank Validate refuses it naming the field.
func TestDigestIsTheDecodeRanks(t *testing.T) {
	base := func(role Role) Config {
		cfg := DefaultConfig(role)
		cfg.Auth, cfg.Instance, cfg.Compat, cfg.Engine = testauth.Auth(), "digest-"+role.String(), "v1:test", nixl.Config{Engine: nixl.EngineLoopback}
		cfg.BootstrapURL = "http://127.0.0.1:1"
		cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
		cfg.Digest = true
		return cfg
	}
	ok := base(RoleDecode)
	require.NoError(t, ok.Validate(), "a pushing decode rank in host memory")
	ok.Pull = true
	require.NoError(t, ok.Validate(), "a pulling decode rank in host memory")
	ok.Layout.Kind = nixl.VRAM
	require.NoError(t, ok.Validate(), "a pulling decode rank in VRAM")
	p := base(RolePrefill)
	require.ErrorContains(t, p.Validate(), "Config.Digest", "a prefill rank")
}

// TestDigestNeedsTheInstanceShape: under a Model, a room created with
// explicit targets names no instance shape, so what its prefill ranks
// write cannot be planned here (the write check leaves such a link
// unchecked); asking it for a digest is refused at InitReceiver
// (ErrInvalidSpec, naming the room and why) instead of failing the good
// room corrupt at its first notification.
func TestDigestNeedsTheInstanceShape(t *testing.T) {
	d := tinyModelDecode(t, "digest-shape")
	require.Equal(t, core.Applied, d.createReceiver(5, targetOf(d.defaultTarget())).Outcome)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := d.InitReceiver(ctx, 5, RequestSpec{DstPages: []uint32{1}, AuxIndex: -1, Digest: true})
	require.ErrorIs(t, err, core.ErrInvalidSpec)
	require.ErrorContains(t, err, "room 5")
	require.ErrorContains(t, err, "without its instance's shape")
	st, _ := d.Status(5)
	require.Equal(t, Bootstrapping, st, "room 5 after the refused Init")
}
