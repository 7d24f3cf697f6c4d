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

// TestDigestNeedsHostMemory (docs/PROTOCOL.md "Digest"): a digest is
// checked by a decode rank whose KV is in host memory, pushed or pulled.
// Config.Digest on a prefill rank or over VRAM is refused by Validate
// naming the field; RequestSpec.Digest on a rank whose layout is VRAM (the
// decode rank made over DRAM, its layout's kind then changed: the check
// reads it) is refused at InitReceiver naming the room (ErrInvalidSpec),
// the room left as it was.
func TestDigestNeedsHostMemory(t *testing.T) {
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
	for name, edit := range map[string]func(*Config){
		"prefill": func(c *Config) { *c = base(RolePrefill) },
		"VRAM":    func(c *Config) { c.Layout.Kind = nixl.VRAM },
	} {
		cfg := base(RoleDecode)
		edit(&cfg)
		require.ErrorContains(t, cfg.Validate(), "Config.Digest", name)
	}

	cfg := base(RoleDecode)
	cfg.Digest = false
	d, err := NewDecode(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	d.cfg.Layout.Kind = nixl.VRAM
	require.Equal(t, core.Applied, d.createReceiver(5, targetOf(d.defaultTarget())).Outcome)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // (accepted, it would wait for a prefill rank that never answers)
	defer cancel()
	err = d.InitReceiver(ctx, 5, RequestSpec{DstPages: []uint32{1}, AuxIndex: -1, Digest: true})
	require.ErrorIs(t, err, core.ErrInvalidSpec)
	require.ErrorContains(t, err, "room 5")
	require.ErrorContains(t, err, "RequestSpec.Digest")
	st, _ := d.Status(5)
	require.Equal(t, Bootstrapping, st, "room 5 after the refused Init")
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
