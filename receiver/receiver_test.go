package receiver_test

import (
	"context"
	"testing"

	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

func decode(t *testing.T) *kvmanager.Decode {
	cfg := kvmanager.DefaultConfig(kvmanager.RoleDecode)
	cfg.Auth = testauth.Auth()
	cfg.Instance, cfg.Compat = "receiver-test", "v1:test"
	cfg.BootstrapURL = "http://127.0.0.1:1" // nothing answers: the room cannot get past registering
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 1024, Regions: []nixl.Desc{{Len: 1 << 16}, {Len: 1 << 16}}}
	d, err := kvmanager.NewDecode(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// A room that failed between its creation and Init (aborted here; on
// processes, also its prefill rank declared dead) answers Init with
// ErrRoomFailed and the failure's reason, not ErrNotReady: no later status
// can make it ready. Seen in make test-nixl (TestAbortReachesPrefillRestartedElsewhere,
// 2 of 50 runs): the decode rank's ABORT came before its Init, and Init
// answered "request in Failed: room not ready for this event".
func TestInitAfterAbortSaysFailed(t *testing.T) {
	d := decode(t)
	r, err := receiver.New(d, 9)
	require.NoError(t, err)
	r.Abort("client went away")
	err = r.Init(context.Background(), kvmanager.RequestSpec{DstPages: []uint32{0, 1}, AuxIndex: -1})
	require.ErrorIs(t, err, kvmanager.ErrRoomFailed, "Init after abort")
	require.NotErrorIs(t, err, kvmanager.ErrNotReady, "Init after abort")
	require.ErrorContains(t, err, "room 9", "Init after abort: names neither the room nor the reason")
	require.ErrorContains(t, err, "client went away", "Init after abort: names neither the room nor the reason")
	st, err := r.Wait(context.Background())
	require.NoError(t, err, "Wait")
	require.Equal(t, kvmanager.Failed, st, "Wait")
	select {
	case <-r.Released():
	default:
		t.Fatal("a room aborted before its request was sent holds its pages")
	}
	r.Clear()
}
