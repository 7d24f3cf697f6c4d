package sender_test

import (
	"errors"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"testing"

	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
)

func prefill(t *testing.T) *kvmanager.Prefill {
	cfg := kvmanager.DefaultConfig(kvmanager.RolePrefill)
	cfg.Auth = testauth.Auth()
	cfg.Instance, cfg.Compat = "sender-test", "v1:test"
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 1024, Regions: []nixl.Desc{{Len: 1 << 16}, {Len: 1 << 16}}}
	m, err := kvmanager.NewPrefill(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestSenderHandle(t *testing.T) {
	m := prefill(t)
	s, err := sender.New(m, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sender.New(m, 1); !errors.Is(err, kvmanager.ErrRoomInUse) {
		t.Fatalf("duplicate: %v", err)
	}
	if err := s.Init(); err != nil {
		t.Fatal(err)
	}
	if s.Poll() != kvmanager.Bootstrapping {
		t.Fatalf("no decode request yet, status %v", s.Poll())
	}
	if err := s.Send([]uint32{0}, true, -1); !errors.Is(err, kvmanager.ErrNotReady) {
		t.Fatalf("send before the request: %v", err)
	}
	s.Abort("operator")
	if s.Poll() != kvmanager.Failed || s.Failure() != "aborted: operator" {
		t.Fatalf("after abort: %v %q", s.Poll(), s.Failure())
	}
	s.Clear()
	if s.Poll() != 0 {
		t.Fatal("a cleared room still answers")
	}
	if _, err := sender.New(m, 1); !errors.Is(err, kvmanager.ErrRoomCleared) {
		t.Fatalf("reuse inside the TTL: %v", err)
	}
	// An abort before the sender (here from the prefill side itself).
	m.AbortSender(2, "early")
	s2, err := sender.New(m, 2)
	if err != nil || s2.Poll() != kvmanager.Failed {
		t.Fatalf("sender after an early abort: %v %v", s2, err)
	}
}
