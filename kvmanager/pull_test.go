package kvmanager

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
)

// TestPullOfferProven: a decode rank that pulls reads only memory proven
// the offering prefill process's own (PROTOCOL.md "Pull", the offer). A
// prefill rank's genuine offer is accepted; offers that describe another
// process's memory — its blob and regions with the offerer's seed or with
// the victim's own seed, the offerer's blob with the victim's regions — or
// that carry another rank's default agent name, or no offer at all, are
// refused, naming why (not_owner), and nothing of them stays loaded.
func TestPullOfferProven(t *testing.T) {
	for _, tc := range []struct {
		name   string
		engine nixl.Config
	}{
		{"loopback", nixl.Config{Engine: nixl.EngineLoopback}},
		{"ucx-shm", nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPrefill(t, func(c *Config) { c.Engine, c.Instance = tc.engine, "offer-prefill-"+tc.name })
			cfg := DefaultConfig(core.RoleDecode)
			cfg.Auth, cfg.Instance, cfg.Compat, cfg.Engine, cfg.Pull = testauth.Auth(), "offer-decode-"+tc.name, "v1:test", tc.engine, true
			cfg.BootstrapURL = "http://127.0.0.1:1" // never asked: the offers are handed to it directly
			cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
			d, err := NewDecode(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			from := bootstrap.From{Role: bootstrap.RolePrefill, Instance: p.cfg.Instance, Rank: 0, Endpoint: p.Endpoint(), Epoch: p.Epoch()}
			offered, err := p.pullOffer()
			if err != nil || offered == nil {
				t.Fatalf("the prefill rank's offer: %v, %v", offered, err)
			}
			genuine := *offered
			victim := newProofRankNamed(t, tc.engine, "offer-victim-"+tc.name, "kv-agent-of-victim-"+tc.name, len(p.cfg.Layout.Regions)) // a name of its own: the proof, not the name, refuses it
			offer := func(edit func(o *bootstrap.PullOffer)) *bootstrap.RegisterAck {
				o := genuine
				if edit != nil {
					edit(&o)
				}
				return &bootstrap.RegisterAck{From: from, OK: true, Pull: &o}
			}
			for _, c := range []struct {
				what string
				ack  *bootstrap.RegisterAck
				want string
			}{
				{"the victim's blob, name and regions", offer(func(o *bootstrap.PullOffer) {
					o.Agent, o.AgentMD, o.KV, o.Aux = victim.name, victim.md, victim.kv, []bootstrap.Region{}
				}), "not_owner"},
				{"the same with the victim's seed", offer(func(o *bootstrap.PullOffer) {
					o.Agent, o.AgentMD, o.KV, o.Aux, o.Proof = victim.name, victim.md, victim.kv, []bootstrap.Region{}, victim.seed
				}), "not_owner"},
				{"the victim's blob renamed to the prefill rank, the victim's regions", offer(func(o *bootstrap.PullOffer) {
					o.AgentMD, o.KV, o.Aux = renamed(t, victim.md, genuine.Agent), victim.kv, []bootstrap.Region{}
				}), "not_owner"},
				{"the prefill rank's blob, the victim's regions", offer(func(o *bootstrap.PullOffer) { o.KV, o.Aux = victim.kv, []bootstrap.Region{} }), "not_owner"},
				{"another rank's default agent name", offer(func(o *bootstrap.PullOffer) {
					o.Agent, o.AgentMD = p.cfg.Instance+"-prefill-7", renamed(t, genuine.AgentMD, p.cfg.Instance+"-prefill-7")
				}), "not_owner"},
				{"a wrong seed", offer(func(o *bootstrap.PullOffer) { o.Proof = victim.seed }), "not_owner"},
				{"no offer", &bootstrap.RegisterAck{From: from, OK: true}, "does not serve pull"},
			} {
				err := d.acceptOffer(c.ack)
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("%s: %v, want a refusal naming %q", c.what, err, c.want)
				}
				if len(d.pull.peers) != 0 {
					t.Fatalf("%s: refused, yet an offer stays accepted: %v", c.what, d.pull.peers)
				}
				t.Logf("%s: refused: %v", c.what, err)
			}
			if err := d.acceptOffer(offer(nil)); err != nil {
				t.Fatalf("the genuine offer refused: %v", err)
			}
			if len(d.pull.peers) != 1 {
				t.Fatalf("accepted offers %v, want the genuine one", d.pull.peers)
			}
		})
	}
}

// TestPullSpecNeedsTheConfig: a room's RequestSpec.Pull on a decode rank
// without Config.Pull is refused at Init (it has no readers, and its
// prefill ranks were not asked for offers: the room's reads would go
// nowhere and hold its pages for good), and the room is left as it was.
func TestPullSpecNeedsTheConfig(t *testing.T) {
	cfg := DefaultConfig(core.RoleDecode)
	cfg.Auth, cfg.Instance, cfg.Compat, cfg.Engine = testauth.Auth(), "spec-decode", "v1:test", nixl.Config{Engine: nixl.EngineLoopback}
	cfg.BootstrapURL = "http://127.0.0.1:1"
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
	d, err := NewDecode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if res := d.CreateReceiver(5, d.DefaultTarget()); res.Outcome != core.Applied {
		t.Fatal(res)
	}
	err = d.InitReceiver(context.Background(), 5, core.RequestSpec{DstPages: []uint32{1}, AuxIndex: -1, Pull: true})
	if !errors.Is(err, core.ErrInvalidSpec) || !strings.Contains(err.Error(), "room 5") || !strings.Contains(err.Error(), "Config.Pull") {
		t.Fatalf("Init: %v, want ErrInvalidSpec naming the room and Config.Pull", err)
	}
	if st, _ := d.Status(5); st != core.Bootstrapping {
		t.Fatalf("room 5 %v after the refused Init, want Bootstrapping", st)
	}
}
