package kvmanager

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
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
			cfg := DefaultConfig(RoleDecode)
			cfg.Auth, cfg.Instance, cfg.Compat, cfg.Engine, cfg.Pull = testauth.Auth(), "offer-decode-"+tc.name, "v1:test", tc.engine, true
			cfg.BootstrapURL = "http://127.0.0.1:1" // never asked: the offers are handed to it directly
			cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
			reg := prometheus.NewRegistry()
			cfg.Registerer = reg
			var jumped atomic.Int64 // the decode rank's clock runs this far ahead
			cfg.hooks.Now = func() time.Time { return time.Now().Add(time.Duration(jumped.Load())) }
			d, err := NewDecode(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { d.Close() })
			// The offers come from an endpoint of no process (the genuine
			// prefill rank would answer the REGISTERs itself) under the
			// prefill rank's identity: its proofs are for that identity.
			from := wire.From{Role: wire.RolePrefill, Instance: p.cfg.Instance, Rank: 0, Endpoint: "tcp://127.0.0.1:9", Epoch: p.Epoch()}
			target := core.Target{Bootstrap: cfg.BootstrapURL, Rank: 0}
			d.resolver = func(core.Target) {} // the test resolves the target itself
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			room := uint64(0)
			var echoed []byte
			decodeID := wire.From{Role: wire.RoleDecode, Instance: cfg.Instance, Rank: cfg.Rank}.Peer()
			// deliver answers a new room's REGISTER with ack and returns
			// the room's status once it is ready or failed, and why. An
			// offer the core does not refuse at once has its agent
			// challenged first: where that agent is the prefill rank's
			// (answer), the rank's core keeps the nonce its agent got, and
			// ack is delivered again echoing it, as the rank's next
			// REGISTER_ACK would; otherwise ack is repeated without the
			// echo and the challenge expires (the clock jumps past it).
			deliver := func(ack *wire.RegisterAck, challenged, answer bool) (core.Poll, string) {
				t.Helper()
				room++
				require.Equal(t, core.Applied, d.createReceiver(room, targetOf(target)).Outcome)
				d.stepIn(core.Resolved{Target: target, Endpoint: from.Endpoint})
				spec := core.RequestSpec{DstPages: []uint32{uint32(room - 1)}, AuxIndex: -1, Pull: true}
				require.Equal(t, core.Applied, d.stepIn(core.InitReceiver{Room: room, Spec: spec}).Result.Outcome)
				d.handle(ack)
				if challenged {
					require.Eventually(t, func() bool { return d.sizes().OfferChecks == 0 }, 10*time.Second, time.Millisecond, "the challenge's load did not end")
					if answer {
						var nonce []byte
						require.Eventually(t, func() bool {
							p.read(func(c *core.Core) { nonce = c.Echo(decodeID) })
							return nonce != nil && string(nonce) != string(echoed)
						}, 10*time.Second, time.Millisecond, "the prefill rank's agent got no challenge")
						echoed = nonce
						e := *ack
						e.Echo = nonce
						d.handle(&e)
					} else {
						d.handle(ack) // repeated without the echo
						require.Eventually(t, func() bool { return d.sizes().OfferChecks == 0 }, 10*time.Second, time.Millisecond, "the challenge's load did not end")
						jumped.Add(int64(proofTimeout + time.Second))
						d.tick()
					}
				}
				st, err := d.WaitReady(ctx, room)
				require.NoError(t, err)
				return core.Poll(st), d.Failure(room)
			}
			offered, err := p.pullOffer()
			if err != nil || offered == nil {
				t.Fatalf("the prefill rank's offer: %v, %v", offered, err)
			}
			genuine := *offered
			victim := newProofRankNamed(t, tc.engine, "offer-victim-"+tc.name, "kv-agent-of-victim-"+tc.name, len(p.cfg.Layout.Regions)) // a name of its own: the proof, not the name, refuses it
			offer := func(edit func(o *wire.PullOffer)) *wire.RegisterAck {
				o := genuine
				if edit != nil {
					edit(&o)
				}
				return &wire.RegisterAck{From: from, OK: true, Pull: &o}
			}
			for _, c := range []struct {
				what               string
				ack                *wire.RegisterAck
				challenged, answer bool
				want               string
			}{
				{"the victim's blob, name and regions", offer(func(o *wire.PullOffer) {
					o.Agent, o.AgentMD, o.KV, o.Aux = victim.name, victim.md, victim.kv, []wire.Region{}
				}), true, false, "did not echo"},
				{"the same with the victim's seed", offer(func(o *wire.PullOffer) {
					o.Agent, o.AgentMD, o.KV, o.Aux, o.Proof = victim.name, victim.md, victim.kv, []wire.Region{}, victim.seed
				}), true, false, "did not echo"},
				{"the victim's blob renamed to the prefill rank, the victim's regions", offer(func(o *wire.PullOffer) {
					o.AgentMD, o.KV, o.Aux = renamed(t, victim.md, genuine.Agent), victim.kv, []wire.Region{}
				}), true, false, "did not echo"},
				{"the prefill rank's blob, the victim's regions", offer(func(o *wire.PullOffer) { o.KV, o.Aux = victim.kv, []wire.Region{} }), true, true, "not_owner"},
				{"another rank's default agent name", offer(func(o *wire.PullOffer) {
					o.Agent, o.AgentMD = p.cfg.Instance+"-prefill-7", renamed(t, genuine.AgentMD, p.cfg.Instance+"-prefill-7")
				}), false, false, "not_owner"},
				{"a wrong seed", offer(func(o *wire.PullOffer) { o.Proof = victim.seed }), true, true, "not_owner"},
				{"no offer", &wire.RegisterAck{From: from, OK: true}, false, false, "does not serve pull"},
			} {
				st, reason := deliver(c.ack, c.challenged, c.answer)
				require.Equal(t, core.Failed, st, "%s: accepted", c.what)
				require.Contains(t, reason, c.want, "%s: the refusal names why", c.what)
				require.Zero(t, d.sizes().Offers, "%s: refused, yet an offer stays accepted", c.what)
				t.Logf("%s: refused: %s", c.what, reason)
			}
			st, reason := deliver(offer(nil), true, true)
			require.Equal(t, core.WaitingForInput, st, "the genuine offer refused: %s", reason)
			require.Equal(t, 1, d.sizes().Offers, "the genuine offer accepted")
			families, err := reg.Gather()
			require.NoError(t, err)
			refused := -1.0
			for _, f := range families {
				for _, m := range f.GetMetric() {
					for _, l := range m.GetLabel() {
						if f.GetName() == "kvbridge_pull_offers_total" && l.GetName() == "outcome" && l.GetValue() == "refused" {
							refused = m.GetCounter().GetValue()
						}
					}
				}
			}
			require.Equal(t, 7.0, refused, "kvbridge_pull_offers_total{outcome=\"refused\"}")
		})
	}
}

// TestPullSpecNeedsTheConfig: a room's RequestSpec.Pull on a decode rank
// without Config.Pull is refused at Init (it has no readers, and its
// prefill ranks were not asked for offers: the room's reads would go
// nowhere and hold its pages for good), and the room is left as it was.
func TestPullSpecNeedsTheConfig(t *testing.T) {
	cfg := DefaultConfig(RoleDecode)
	cfg.Auth, cfg.Instance, cfg.Compat, cfg.Engine = testauth.Auth(), "spec-decode", "v1:test", nixl.Config{Engine: nixl.EngineLoopback}
	cfg.BootstrapURL = "http://127.0.0.1:1"
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
	d, err := NewDecode(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	require.Equal(t, core.Applied, d.createReceiver(5, targetOf(d.defaultTarget())).Outcome)
	err = d.InitReceiver(context.Background(), 5, RequestSpec{DstPages: []uint32{1}, AuxIndex: -1, Pull: true})
	if !errors.Is(err, core.ErrInvalidSpec) || !strings.Contains(err.Error(), "room 5") || !strings.Contains(err.Error(), "Config.Pull") {
		t.Fatalf("Init: %v, want ErrInvalidSpec naming the room and Config.Pull", err)
	}
	if st, _ := d.Status(5); st != Bootstrapping {
		t.Fatalf("room 5 %v after the refused Init, want Bootstrapping", st)
	}
}
