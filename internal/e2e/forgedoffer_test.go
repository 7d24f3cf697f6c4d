package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/kvmanager"
)

// TestForgedOfferRefusedAcrossProcesses: issue 49's confused deputy in the
// pull direction, on real processes. A prefill rank process and a decode
// rank process (the bystander) work together; a second decode rank process
// (the deputy) pulls its rooms from a prefill rank that is this test — an
// attacker holding a valid identity (prefill rank 0 of instance "forger"),
// listed by a bootstrap server of its own. To each REGISTER of the deputy
// it answers ok with an offer under its own default agent name whose blob
// is the bystander's worker address (its process, its endpoints) and whose
// regions are the bystander's, or moved to memory the bystander never
// mapped, or the bystander's blob under its own (default) name, or a
// second bystander's blob under its own custom agent name — a blob real
// NIXL loads, so there too only the challenge refuses it (before the offer challenge, the deputy's proof read through such
// a blob ran inside the bystander; a read through one naming unmapped
// memory killed the bystander in the push direction: SIGSEGV in
// ucp_get_req_handler). The deputy challenges the offer's agent: the
// notification reaches the bystander, which drops it (another identity's,
// counted); the forger cannot echo it, and past the challenge timeout the
// deputy refuses the offer (not_owner, "did not echo"), counted, its room
// failed. Nothing was read through the forged blob: the bystander's memory
// is byte for byte what it was, and its next room succeeds, verified.
func TestForgedOfferRefusedAcrossProcesses(t *testing.T) {
	t.Parallel() // its own processes, ports and discovery: mostly waiting (the challenge's timeout)
	for _, engine := range []string{"ucx-shm", "ucx-tcp", "libnixl-real"} {
		t.Run(engine, func(t *testing.T) {
			if engine == "libnixl-real" {
				needRealNIXL(t)
			}
			forgerID := wire.From{Role: wire.RolePrefill, Instance: "forger", Rank: 0}
			deputyID := wire.From{Role: wire.RoleDecode, Instance: "deputy", Rank: 0}
			_, envs, ids := identityFiles(t,
				wire.From{Role: wire.RolePrefill, Instance: "proc", Rank: 0},
				wire.From{Role: wire.RoleDecode, Instance: "proc", Rank: 0},
				deputyID, forgerID,
				wire.From{Role: wire.RoleDecode, Instance: "custom", Rank: 0})
			boot := startBoot(t)
			prefill := startChild(t, append([]string{"KVBRIDGE_E2E_ROLE=prefill", "KVBRIDGE_E2E_ENGINE=" + engine, "KVBRIDGE_E2E_BOOT=" + boot}, envs[0]...)...)
			bystander := startChild(t, append([]string{"KVBRIDGE_E2E_ROLE=decode", "KVBRIDGE_E2E_ENGINE=" + engine, "KVBRIDGE_E2E_BOOT=" + boot}, envs[1]...)...)
			pp, dp := newPagePool(pages), newPagePool(pages)
			pdRoom(t, prefill, bystander, 1, pp, dp) // registered and working

			var vm rankMemory
			bystander.do("MEMORY 0")
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(bystander.expect(t, "MEMORY "), "MEMORY ")), &vm))
			sum := func() string { bystander.do("SUM 0"); return bystander.expect(t, "SUM ") }
			before := sum()
			// A second bystander under a custom agent name: its blob, under
			// that name, is one even real NIXL loads (the name its own
			// section carries), so the challenge is what refuses it there.
			custom := startChild(t, append([]string{"KVBRIDGE_E2E_ROLE=decode", "KVBRIDGE_E2E_ENGINE=" + engine, "KVBRIDGE_E2E_BOOT=" + boot,
				"KVBRIDGE_E2E_INSTANCE=custom", "KVBRIDGE_E2E_AGENT=kv-agent-of-custom"}, envs[4]...)...)
			cp := newPagePool(pages)
			pdRoom(t, prefill, custom, 3, pp, cp)
			var cm rankMemory
			custom.do("MEMORY 0")
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(custom.expect(t, "MEMORY "), "MEMORY ")), &cm))
			require.Equal(t, "kv-agent-of-custom", cm.Agent, "the custom bystander's agent name")
			customSum := func() string { custom.do("SUM 0"); return custom.expect(t, "SUM ") }
			customBefore := customSum()

			// The forger: a control loop under its identity, listed as
			// prefill rank 0 of its instance by a bootstrap server of its
			// own, answering every REGISTER with the offer forged at the
			// time.
			regs := make(chan *wire.Register, 16)
			loop, err := control.NewLoop(control.LoopConfig{Identity: forgerID, Bind: "tcp://127.0.0.1:*",
				Auth: testauth.Auth(), RankIdentity: ids[3],
				Handler: func(m wire.Message) {
					if r, ok := m.(*wire.Register); ok {
						select {
						case regs <- r:
						default:
						}
					}
				}})
			require.NoError(t, err)
			defer loop.Close()
			boot2 := startBoot(t)
			def := rankConfig(kvmanager.RolePrefill, engine, boot2)
			cl, err := discovery.Dial(boot2, discovery.DialOptions{Token: testauth.Auth().BootstrapToken()})
			require.NoError(t, err)
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = cl.RegisterRank(ctx, records.RankRecord{Instance: forgerID.Instance, TPSize: 1, PPSize: 1, DPSize: 1,
				Endpoint: loop.Endpoint(), PageSize: def.PageTokens, DType: def.DType, Compat: def.Compat,
				PublicKey: loop.PublicKey(), Epoch: loop.Identity().Epoch, Cert: base64.StdEncoding.EncodeToString(loop.Cert())})
			cancel()
			require.NoError(t, err)

			name := "forger-prefill-0" // the forger's own default name: it passes the name check
			unmappedTable, moveTo := relocated(t, blobTable(t, vm.MD), 0x100000)
			vHead, _, vLib, vTable, vPayload := blobParts(t, vm.MD)
			join := func(parts ...[]byte) []byte {
				var b []byte
				for _, p := range parts {
					b = append(b, p...)
				}
				return b
			}
			deputy := startChild(t, append([]string{"KVBRIDGE_E2E_ROLE=decode", "KVBRIDGE_E2E_ENGINE=" + engine, "KVBRIDGE_E2E_BOOT=" + boot2,
				"KVBRIDGE_E2E_PULL=1", "KVBRIDGE_E2E_INSTANCE=" + deputyID.Instance,
				"KVBRIDGE_E2E_CHALLENGE_TIMEOUT=" + forgeryTimeout.String()}, envs[2]...)...) // each unechoed challenge waits it out
			ignored, customIgnored := procCounter(t, bystander, "kvbridge_challenges_ignored_total"), procCounter(t, custom, "kvbridge_challenges_ignored_total")
			expired := uint64(0) // the forgeries the challenge refused
			for i, c := range []struct {
				what  string
				offer wire.PullOffer
				// challenged: refused by the unechoed challenge on every
				// engine (a blob even real NIXL loads).
				challenged bool
			}{
				{"the bystander's worker address and regions under the forger's name", wire.PullOffer{Agent: name,
					AgentMD: join(vHead, lenStr(name), vLib, vTable, vPayload), KV: vm.KV, Aux: vm.Aux, State: vm.State,
					Proof: make([]byte, 32), LeaseMillis: 1000}, false},
				{"the bystander's worker address, its regions moved to memory it never mapped", wire.PullOffer{Agent: name,
					AgentMD: join(vHead, lenStr(name), vLib, unmappedTable, vPayload), KV: moveTo(vm.KV), Aux: moveTo(vm.Aux), State: moveTo(vm.State),
					Proof: make([]byte, 32), LeaseMillis: 1000}, false},
				{"the bystander's blob and agent name (a decode rank's default name)", wire.PullOffer{Agent: vm.Agent,
					AgentMD: vm.MD, KV: vm.KV, Aux: vm.Aux, State: vm.State, Proof: make([]byte, 32), LeaseMillis: 1000}, false},
				{"a custom-named decode rank's blob and agent name", wire.PullOffer{Agent: cm.Agent,
					AgentMD: cm.MD, KV: cm.KV, Aux: cm.Aux, State: cm.State, Proof: make([]byte, 32), LeaseMillis: 1000}, true},
			} {
				room := uint64(10 + i)
				stop := make(chan struct{})
				answered := make(chan int, 1)
				go func() { // answer every REGISTER of the deputy with the forgery
					n := 0
					for {
						select {
						case <-stop:
							answered <- n
							return
						case r := <-regs:
							o := c.offer
							to := wire.Peer{Endpoint: r.From.Endpoint, Cert: string(ids[2].Cert.Raw()), Epoch: r.From.Epoch}
							if loop.Send(to, &wire.RegisterAck{OK: true, Pull: &o}) == nil {
								n++
							}
						}
					}
				}()
				src, dst := pp.Get(8), dp.Get(8)
				deputy.do(fmt.Sprintf("RECV %d %s %s", room, csv(dst), csv(src)))
				done := deputy.expect(t, fmt.Sprintf("DONE %d", room))
				close(stop)
				n := <-answered
				t.Logf("%s: %d forged REGISTER_ACKs; %s", c.what, n, done)
				// Failed at Init ("error": the registration refused while
				// Init waited for it) or after ("Failed <reason>").
				failedAtInit := strings.HasPrefix(done, fmt.Sprintf("DONE %d error ", room))
				require.True(t, failedAtInit || strings.HasPrefix(done, fmt.Sprintf("DONE %d Failed", room)), "%s: %s", c.what, done)
				reason := strings.ReplaceAll(done, "_", " ")
				if c.challenged {
					assert.Contains(t, reason, "did not echo", "%s: not refused by the unechoed challenge", c.what)
				}
				// Refused by the challenge; or, before anything is loaded,
				// as another rank's default name; or by the engine's check
				// of the blob at its load (regions its keys do not map, on
				// shared memory; on real NIXL a blob whose own section
				// names another agent): never after a read.
				switch {
				case strings.Contains(reason, "bad metadata"):
				case strings.Contains(reason, "another rank's default name"):
					assert.Equal(t, vm.Agent, c.offer.Agent, c.what)
				default:
					assert.Contains(t, reason, "not owner", c.what)
					assert.Contains(t, reason, "did not echo", "%s: refused for another cause than the unechoed challenge: nothing may be read through the blob first", c.what)
					expired++
				}
				assert.Contains(t, reason, forgerID.Peer(), "%s: the refusal names the offering rank", c.what)
				assert.NotContains(t, reason, "proof slot", "%s: the proof was read through the forged blob", c.what)
				if !failedAtInit {
					deputy.expect(t, fmt.Sprintf("RELEASED %d", room))
				}
				pp.Put(src)
				dp.Put(dst)
			}
			assert.GreaterOrEqual(t, procCounter(t, deputy, "kvbridge_offer_challenges_total", "outcome", "expired"), expired, "the deputy's offer challenges expired")
			assert.GreaterOrEqual(t, procCounter(t, deputy, "kvbridge_pull_offers_total", "outcome", "refused"), uint64(3), "the forged offers refused, counted")
			assert.Zero(t, procCounter(t, deputy, "kvbridge_offer_challenges_total", "outcome", "echoed"), "a forged offer's challenge passed")
			if engine != "libnixl-real" {
				// The ucx engine loads the renamed blob: the challenge
				// reaches the bystander, which drops it. (Real NIXL
				// refuses that blob at load: its own section names the
				// bystander's agent — nothing reaches the bystander.)
				require.Positive(t, expired, "no forgery reached the challenge")
				assert.Greater(t, procCounter(t, bystander, "kvbridge_challenges_ignored_total"), ignored, "the bystander never got the offer challenge")
			}
			assert.Equal(t, before, sum(), "the bystander's memory changed under the attack")
			pdRoom(t, prefill, bystander, 2, pp, dp) // alive, registered, byte-exact
			assert.Equal(t, customBefore, customSum(), "the custom-named bystander's memory changed under the attack")
			if engine != "libnixl-real" { // (an idle libnixl rank polls no notifications: the challenge waits unread)
				assert.Greater(t, procCounter(t, custom, "kvbridge_challenges_ignored_total"), customIgnored, "the custom-named bystander never got the offer challenge")
			}
			pdRoom(t, prefill, custom, 4, pp, cp)
		})
	}
}

// blobTable is a blob's region table.
func blobTable(t *testing.T, md []byte) []byte {
	t.Helper()
	_, _, _, table, _ := blobParts(t, md)
	return table
}
