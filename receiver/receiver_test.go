package receiver_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/transfer"
)

func decode(t *testing.T) *kvmanager.Decode {
	cfg := kvmanager.DefaultConfig(kvmanager.RoleDecode)
	cfg.Auth = testauth.Auth()
	cfg.Instance, cfg.Compat = "receiver-test", "v1:test"
	cfg.BootstrapURL = "http://127.0.0.1:1" // nothing answers: the room cannot get past registering
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 1024, Regions: []nixl.Desc{{Len: 1 << 16}, {Len: 1 << 16}}}
	d, err := kvmanager.NewDecode(cfg)
	if err != nil {
		t.Fatal(err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	r.Abort("client went away")
	err = r.Init(context.Background(), kvmanager.RequestSpec{DstPages: []uint32{0, 1}, AuxIndex: -1})
	if !errors.Is(err, kvmanager.ErrRoomFailed) || errors.Is(err, kvmanager.ErrNotReady) {
		t.Fatalf("Init after abort: %v; want ErrRoomFailed", err)
	}
	if !strings.Contains(err.Error(), "room 9") || !strings.Contains(err.Error(), "client went away") {
		t.Fatalf("Init after abort: %q names neither the room nor the reason", err)
	}
	if st, err := r.Wait(context.Background()); st != kvmanager.Failed || err != nil {
		t.Fatalf("Wait = %v, %v; want Failed", st, err)
	}
	select {
	case <-r.Released():
	default:
		t.Fatal("a room aborted before its request was sent holds its pages")
	}
	r.Clear()
}
