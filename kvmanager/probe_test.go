package kvmanager

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// TestProbeTimerTicksTheCore: a probe's deadline (ProbeTimeout) is the
// core's timer, an EffectTimer the shell carries out, not a timer the shell
// chooses by looking at the messages it sends. With the sweep an hour away,
// only that timer can tell the core its PING went unanswered: the rank is
// then looked up again.
func TestProbeTimerTicksTheCore(t *testing.T) {
	cfg := DefaultConfig(RoleDecode)
	cfg.Auth = testauth.Auth()
	cfg.Instance, cfg.Compat, cfg.BootstrapURL = "probe-test", "v1:test", "http://127.0.0.1:1"
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}} // allocated here
	cfg.SweepInterval = time.Hour                                                                                    // no sweep in this test
	cfg.ProbeIdle, cfg.ProbeTimeout = time.Nanosecond, 20*time.Millisecond
	d, err := NewDecode(cfg)
	require.NoError(t, err)
	defer d.Close()
	lookups := make(chan core.Target, 8)
	d.resolver = func(t core.Target) { lookups <- t } // the test answers lookups itself

	target := core.Target{Bootstrap: cfg.BootstrapURL, Rank: 0}
	prefill := wire.From{Role: "prefill", Instance: "p", Rank: 0, Endpoint: "tcp://127.0.0.1:9", Epoch: 10}
	require.Equal(t, core.Applied, d.createReceiver(1, targetOf(target)).Outcome)
	require.Equal(t, target, <-lookups)
	d.stepIn(core.Resolved{Target: target, Endpoint: prefill.Endpoint})
	spec := core.RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}
	require.Equal(t, core.Applied, d.stepIn(core.InitReceiver{Room: 1, Spec: spec}).Result.Outcome)
	d.stepIn(core.Received{Msg: &wire.RegisterAck{From: prefill, OK: true}}) // room 1's REQUEST goes: just heard

	// Room 2's REQUEST waits for a PING's PONG (not heard from within
	// ProbeIdle); none comes.
	require.Equal(t, core.Applied, d.createReceiver(2, targetOf(target)).Outcome)
	require.Equal(t, core.Applied, d.stepIn(core.InitReceiver{Room: 2, Spec: core.RequestSpec{DstPages: []uint32{2}, AuxIndex: -1}}).Result.Outcome)
	require.Equal(t, uint64(1), d.stats().Probes, "room 2's REQUEST probes first")
	select {
	case got := <-lookups:
		require.Equal(t, target, got, "the rank looked up again after its probe was lost")
	case <-time.After(10 * time.Second):
		t.Fatalf("no lookup 10 s after a probe of %v: its deadline never reached the core (lost: %d)", cfg.ProbeTimeout, d.stats().ProbesLost)
	}
	require.Equal(t, uint64(1), d.stats().ProbesLost)
}
