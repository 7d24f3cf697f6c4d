package sender_test

import (
	"github.com/kvbridge/kvbridge/internal/testauth"
	"testing"

	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

func prefill(t *testing.T) *kvmanager.Prefill {
	cfg := kvmanager.DefaultConfig(kvmanager.RolePrefill)
	cfg.Auth = testauth.Auth()
	cfg.Instance, cfg.Compat = "sender-test", "v1:test"
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 1024, Regions: []nixl.Desc{{Len: 1 << 16}, {Len: 1 << 16}}}
	m, err := kvmanager.NewPrefill(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func TestSenderHandle(t *testing.T) {
	m := prefill(t)
	s, err := sender.New(m, 1)
	require.NoError(t, err)
	_, err = sender.New(m, 1)
	require.ErrorIs(t, err, kvmanager.ErrRoomInUse, "duplicate")
	require.ErrorIs(t, s.Send([]uint32{0}, true, -1), kvmanager.ErrNotReady, "send before Init")
	require.NoError(t, s.Init())
	require.Equal(t, kvmanager.Bootstrapping, s.Poll(), "no decode request yet")
	require.NoError(t, s.Send([]uint32{0}, true, -1), "send before the request: kept until it comes")
	require.ErrorIs(t, s.Send([]uint32{1}, true, -1), kvmanager.ErrBadChunk, "a chunk after the last, handed over early")
	require.Equal(t, kvmanager.Bootstrapping, s.Poll(), "still no decode request")
	s.Abort("operator")
	require.Equal(t, kvmanager.Failed, s.Poll(), "after abort")
	require.Equal(t, "aborted: operator", s.Failure(), "after abort")
	s.Clear()
	require.Zero(t, s.Poll(), "a cleared room still answers")
	_, err = sender.New(m, 1)
	require.ErrorIs(t, err, kvmanager.ErrRoomCleared, "reuse inside the TTL")
	// An abort before the sender (here from the prefill side itself).
	m.Abort(2, "early")
	s2, err := sender.New(m, 2)
	require.NoError(t, err, "sender after an early abort")
	require.Equal(t, kvmanager.Failed, s2.Poll(), "sender after an early abort: %v", s2)
}
