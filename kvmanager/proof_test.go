package kvmanager

import (
	"encoding/binary"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/cuda"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// proofRank is a decode rank's memory and identity as a test drives it: an
// agent of its own (named by default, "<instance>-decode-0") with regions of
// the prefill's layout, each followed by its proof slot holding the value
// its seed gives, and a control loop that sends REGISTERs as that rank.
type proofRank struct {
	name, owner string
	agent       *nixl.Agent
	md          []byte
	kv          []wire.Region
	mem         [][]byte
	seed        []byte
	loop        *control.Loop
	acks        chan *wire.RegisterAck
}

func newProofRank(t testing.TB, engine nixl.Config, instance string, regions int) *proofRank {
	t.Helper()
	return newProofRankNamed(t, engine, instance, instance+"-decode-0", regions)
}

// newProofRankNamed is a proofRank whose agent has a name of its own.
func newProofRankNamed(t testing.TB, engine nixl.Config, instance, agent string, regions int) *proofRank {
	t.Helper()
	engine.Name = agent
	a, err := nixl.Open(engine)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	from := wire.From{Role: wire.RoleDecode, Instance: instance, Rank: 0}
	r := &proofRank{name: engine.Name, owner: from.Peer(), agent: a, seed: make([]byte, proofLen), acks: make(chan *wire.RegisterAck, 4)}
	copy(r.seed, instance)
	for i := range regions {
		_, buf, err := a.Alloc(8*64 + transfer.ProofBytes)
		require.NoError(t, err)
		for k := range buf[:8*64] {
			buf[k] = byte(i*31 + k) // the rank's KV: must never change
		}
		r.mem = append(r.mem, buf)
		r.kv = append(r.kv, wire.Region{Addr: uint64(nixl.BytesDesc(buf).Addr), Len: 8 * 64, ItemLen: 64, Mem: wire.MemDRAM})
	}
	lay, err := core.LayoutFrom(r.kv, []wire.Region{}, []wire.Region{})
	require.NoError(t, err)
	for i, pr := range proofRegions(lay) {
		copy(r.mem[i][8*64:], pr.value(r.seed, r.owner))
	}
	r.md, err = a.Metadata()
	require.NoError(t, err)
	r.loop, err = control.NewLoop(control.LoopConfig{
		Identity: from, Bind: "tcp://127.0.0.1:*", Auth: testauth.Auth(),
		Handler: func(m wire.Message) {
			if a, ok := m.(*wire.RegisterAck); ok {
				r.acks <- a
			}
		}})
	require.NoError(t, err)
	t.Cleanup(func() { r.loop.Close() })
	return r
}

// shifted is regions moved by off bytes.
func shifted(kv []wire.Region, off uint64) []wire.Region {
	out := append([]wire.Region(nil), kv...)
	for i := range out {
		out[i].Addr += off
	}
	return out
}

// register sends a REGISTER as this rank and returns the prefill's answer.
func (r *proofRank) register(t *testing.T, p *Prefill, agent string, md []byte, kv []wire.Region, proof []byte) *wire.RegisterAck {
	t.Helper()
	reg := &wire.Register{Compat: p.cfg.Compat, Agent: agent, AgentMD: md, TPSize: 1,
		KV: kv, Aux: []wire.Region{}, State: []wire.Region{}, Proof: proof}
	return echoingRegister(t, r.loop, r.agent, r.owner, wire.Peer{Endpoint: p.Endpoint()}, reg, r.acks)
}

// echoingRegister sends reg as a decode rank does until an answer comes:
// again every second (its RegisterRetry), and at once, echoing it, when
// the rank's agent gets an agent challenge for its identity owner.
func echoingRegister(t *testing.T, loop *control.Loop, agent *nixl.Agent, owner string, to wire.Peer, reg *wire.Register, acks chan *wire.RegisterAck) *wire.RegisterAck {
	t.Helper()
	for len(acks) > 0 {
		<-acks // a late answer to an earlier repeat
	}
	send := func() {
		require.NoError(t, loop.Send(to, reg))
	}
	send()
	deadline := time.After(30 * time.Second)
	poll := time.NewTicker(10 * time.Millisecond) // the agent's notifications (a decode rank's notifier)
	defer poll.Stop()
	repeat := time.NewTicker(time.Second)
	defer repeat.Stop()
	for {
		select {
		case a := <-acks:
			return a
		case <-deadline:
			t.Fatal("no REGISTER_ACK within 30 s")
			return nil
		case <-repeat.C:
			send()
		case <-poll.C:
			ns, _ := agent.Notifs()
			for _, n := range ns {
				if x, ok := core.ParseChallenge(string(n.Msg)); ok && x.For == owner {
					reg.Echo = append(reg.Echo, x.Nonce...)
					reg.Echo = reg.Echo[max(0, len(reg.Echo)-core.MaxEchoes*core.ChallengeBytes):]
					send()
				}
			}
		}
	}
}

// awaitChallenge returns the nonce of the first agent challenge for r's
// identity that r's agent gets (30 s at most).
func awaitChallenge(t *testing.T, r *proofRank) []byte {
	t.Helper()
	deadline := time.After(30 * time.Second)
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-deadline:
			t.Fatalf("%s: no agent challenge within 30 s", r.owner)
			return nil
		case <-poll.C:
			ns, _ := r.agent.Notifs()
			for _, n := range ns {
				if x, ok := core.ParseChallenge(string(n.Msg)); ok && x.For == r.owner {
					return x.Nonce
				}
			}
		}
	}
}

// renamed is a kvbridge metadata blob (internal/nixl/metadata.go: "KVBN" version,
// then engine, agent and library as length-prefixed strings, ...) with its
// agent name replaced: the same process, memory and keys, another name.
func renamed(t *testing.T, md []byte, name string) []byte {
	t.Helper()
	require.True(t, len(md) >= 5 && string(md[:4]) == "KVBN", "not a kvbridge blob: %x", md[:min(5, len(md))])
	off := 5
	skip := func() (int, int) {
		n := int(binary.LittleEndian.Uint32(md[off:]))
		s := off
		off += 4 + n
		return s, off
	}
	skip() // engine
	s, e := skip()
	out := append([]byte(nil), md[:s]...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(name)))
	out = append(out, name...)
	return append(out, md[e:]...)
}

// TestRegisterForeignMemoryRefused (issue 41, 1): a decode rank that holds
// only its own identity describes another decode process's memory as its
// own, each time with a seed of its choice: that process's blob and name;
// its blob renamed to the attacker (the victim's process, memory and
// keys); the same with the regions shifted so each slot falls on bytes the
// victim never wrote (zeros) and a seed of zeros; with the value read from
// the victim's slot as the seed; with the victim's seed itself (bound to
// the victim's identity, not the attacker's); the attacker's own blob with
// the victim's regions; another rank's default agent name for the
// attacker's own memory (a squat, before that rank registers); and its own
// memory without a seed or with another's. The prefill rank refuses each
// (not_owner, counted). The victim's registration survives (its remote stays
// loaded, its name its own), its memory is untouched, the squatted rank
// then registers, and the attacker's genuine REGISTER is accepted: the
// check refuses foreign memory, not everything.
func TestRegisterForeignMemoryRefused(t *testing.T) {
	double := libnixlDouble(t)
	for _, tc := range []struct {
		name   string
		engine nixl.Config
	}{
		{"loopback", nixl.Config{Engine: nixl.EngineLoopback}},
		{"ucx-shm", nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}},
		{"ucx-tcp", nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "tcp", "NET_DEVICES": "lo"}}},
		{"libnixl-double", nixl.Config{Engine: nixl.EngineLibNIXL, NIXLLib: double}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPrefill(t, func(c *Config) {
				c.Engine = tc.engine
				c.Instance = "proof-prefill-" + tc.name
			})
			n := len(p.cfg.Layout.Regions)
			victim := newProofRank(t, tc.engine, "victim-"+tc.name, n)
			custom := newProofRankNamed(t, tc.engine, "custom-"+tc.name, "kv-agent-of-"+tc.name, n) // a name of its own choosing
			late := newProofRank(t, tc.engine, "late-"+tc.name, n)
			attacker := newProofRank(t, tc.engine, "attacker-"+tc.name, n)
			for _, r := range []*proofRank{victim, custom} {
				a := r.register(t, p, r.name, r.md, r.kv, r.seed)
				require.True(t, a.OK, "%s's genuine REGISTER refused: %s", r.owner, a.Reason)
			}
			refusals := func() uint64 {
				var s core.CoreStats
				p.read(func(c *core.Core) { s = c.Stats() })
				return s.LayoutRefused[core.RefusedNotOwner]
			}
			victimAs := renamed(t, victim.md, attacker.name) // the victim's process, memory and keys under the attacker's name
			slotValue := victim.mem[0][8*64 : 8*64+proofLen]
			zeros := make([]byte, proofLen)
			for _, c := range []struct {
				what  string
				agent string
				md    []byte
				kv    []wire.Region
				seed  []byte
			}{
				{"the victim's blob, name and regions", victim.name, victim.md, victim.kv, attacker.seed},
				{"another rank's blob and custom agent name", custom.name, custom.md, custom.kv, attacker.seed},
				{"the victim's blob renamed to the attacker, the victim's regions", attacker.name, victimAs, victim.kv, attacker.seed},
				{"the same, regions shifted onto bytes never written, a seed of zeros", attacker.name, victimAs, shifted(victim.kv, proofLen), zeros},
				{"the same, the victim's slot value read back as the seed", attacker.name, victimAs, victim.kv, slotValue},
				{"the same, the victim's seed itself", attacker.name, victimAs, victim.kv, victim.seed},
				{"the attacker's own blob, the victim's regions", attacker.name, attacker.md, victim.kv, attacker.seed},
				{"the attacker's own memory under another rank's default name (a squat)", late.name, renamed(t, attacker.md, late.name), attacker.kv, attacker.seed},
				{"the attacker's own memory without a seed", attacker.name, attacker.md, attacker.kv, nil},
				{"the attacker's own memory, another rank's seed", attacker.name, attacker.md, attacker.kv, victim.seed},
			} {
				before := refusals()
				a := attacker.register(t, p, c.agent, c.md, c.kv, c.seed)
				require.False(t, a.OK, "%s: accepted (REGISTER_ACK ok): the prefill rank would write the attacker's rooms there", c.what)
				require.True(t, strings.Contains(a.Reason, "not_owner") || strings.Contains(a.Reason, "agent metadata"),
					"%s: refused for a reason that does not name the ownership check: %s", c.what, a.Reason)
				if got := refusals(); strings.Contains(a.Reason, "not_owner") {
					require.Equal(t, before+1, got, "%s: kvbridge_layout_refused_total{reason=not_owner} after one more refusal", c.what)
				}
				t.Logf("%s: refused: %s", c.what, a.Reason)
			}
			// (The NIXL double refuses a renamed blob as bad metadata first.)
			require.GreaterOrEqual(t, refusals(), uint64(5), "refusals counted as not_owner")
			// The victims' registrations are intact: their remotes are
			// loaded, their names still their own, the memory as written.
			for _, r := range []*proofRank{victim, custom} {
				require.True(t, p.agent.RemoteContains(r.name, nixl.DRAM, nixl.BytesDesc(r.mem[0])), "%s's remote agent is gone from the prefill rank: an attacker's REGISTER replaced or dropped it", r.owner)
			}
			var owner string
			p.read(func(c *core.Core) { owner = c.AgentOwner(victim.name) })
			require.Equal(t, victim.owner, owner, "the victim's agent is registered to another")
			for i, buf := range victim.mem {
				for k := range buf[:8*64] {
					require.Equal(t, byte(i*31+k), buf[k], "the victim's region %d changed at byte %d", i, k)
				}
			}
			for _, r := range []*proofRank{victim, late, attacker} {
				a := r.register(t, p, r.name, r.md, r.kv, r.seed)
				require.True(t, a.OK, "%s's genuine REGISTER refused after the attacks: %s", r.owner, a.Reason)
			}
			// A repeat of a proven registration is not read again; the same
			// process with another blob is refused, its registration kept.
			a := victim.register(t, p, victim.name, victim.md, victim.kv, victim.seed)
			require.True(t, a.OK, "the victim's repeated REGISTER refused: %s", a.Reason)
			a = victim.register(t, p, victim.name+"x", renamed(t, victim.md, victim.name+"x"), victim.kv, victim.seed)
			require.False(t, a.OK, "the victim's process registered again with another blob: %s", a.Reason)
			require.Contains(t, a.Reason, "other agent metadata", "the victim's process registered again with another blob")
			require.True(t, p.agent.RemoteContains(victim.name, nixl.DRAM, nixl.BytesDesc(victim.mem[0])), "a refused repeat dropped the victim's remote")
		})
	}
}

// BenchmarkRegisterProof: what the ownership proof adds to a REGISTER — a
// decode rank of 64 KV regions (32 layers), aux and two state regions —
// against the rest of the REGISTER's handling in the same run (the checks,
// the metadata load, the peer's prepared lists): proof-ns/op and rest-ns/op
// per REGISTER, and their ratio.
func BenchmarkRegisterProof(b *testing.B) {
	for _, ec := range []struct {
		name   string
		engine nixl.Config
	}{
		{"ucx-shm", nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}},
		{"ucx-tcp", nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "tcp", "NET_DEVICES": "lo"}}},
	} {
		b.Run(ec.name, func(b *testing.B) {
			const regions, page = 64, 64 << 10
			lay := func() transfer.Layout {
				l := transfer.Layout{Kind: nixl.DRAM, PageBytes: page, AuxItemBytes: 64, Aux: nixl.Desc{Len: 64 * 64},
					State: []transfer.StateRegion{{Desc: nixl.Desc{Len: 16 * 256}, ItemBytes: 256}, {Desc: nixl.Desc{Len: 16 * 256}, ItemBytes: 256}}}
				for range regions {
					l.Regions = append(l.Regions, nixl.Desc{Len: 4 * page})
				}
				return l
			}
			p := newTestPrefill(b, func(c *Config) {
				c.Engine, c.Instance, c.Layout = ec.engine, "proof-bench-"+ec.name, lay()
			})
			dcfg := DefaultConfig(RoleDecode)
			dcfg.Auth = testauth.Auth()
			dcfg.Instance, dcfg.Compat, dcfg.BootstrapURL = "proof-bench-decode", p.cfg.Compat, "http://127.0.0.1:1"
			dcfg.Engine, dcfg.Layout = ec.engine, lay()
			d, err := NewDecode(dcfg)
			require.NoError(b, err)
			defer d.Close()
			msg := d.core.Config().Register // as the decode rank sends it (unsealed: the loop seals it)
			msg.From = wire.From{Role: wire.RoleDecode, Instance: "proof-bench-decode", Rank: 0, Endpoint: "tcp://127.0.0.1:1", Epoch: 1}
			// The agent challenge's data-plane leg: a notification from the
			// prefill's agent to a decode agent, sent until it is read
			// there (a raw agent: the Decode's notifier would take it).
			notified := newProofRank(b, ec.engine, "proof-bench-notif", 2)
			if _, err := p.agent.LoadRemote(notified.md); err != nil {
				b.Fatal(err)
			}
			notif := []byte(core.ChallengeNotif(make([]byte, core.ChallengeBytes), notified.owner, p.Endpoint()))
			var proof, rest, challenge time.Duration
			b.ResetTimer()
			for b.Loop() {
				tc := time.Now()
				require.NoError(b, p.agent.GenNotif(notified.name, notif))
				for {
					if ns, _ := notified.agent.Notifs(); len(ns) > 0 {
						break
					}
				}
				challenge += time.Since(tc)
				t0 := time.Now()
				var plan core.PeerPlan
				p.read(func(c *core.Core) { plan, err = c.CheckRegister(&msg) })
				if err == nil {
					err = p.checkClaims(&msg)
				}
				var name string
				if err == nil {
					name, err = p.agent.LoadRemote(msg.AgentMD)
				}
				t1 := time.Now()
				if err == nil {
					err = p.checkProof(name, &msg, plan.Layout)
				}
				t2 := time.Now()
				if err == nil {
					err = p.pool.PreparePeer(name, plan.Layout)
				}
				require.NoError(b, err)
				proof += t2.Sub(t1)
				rest += t1.Sub(t0) + time.Since(t2)
			}
			b.ReportMetric(float64(proof.Nanoseconds())/float64(b.N), "proof-ns/op")
			b.ReportMetric(float64(rest.Nanoseconds())/float64(b.N), "rest-ns/op")
			b.ReportMetric(float64(proof)/float64(rest), "proof/rest")
			b.ReportMetric(float64(challenge.Nanoseconds())/float64(b.N), "challenge-notif-ns/op")
			b.ReportMetric(float64(challenge)/float64(rest), "challenge/rest")
		})
	}
}

// TestCallerRegionsNeedProofSlots: regions passed with addresses must each
// be followed by transfer.ProofBytes that no other region uses — the
// constructor refuses regions packed back to back, naming both, and takes
// the same memory spaced by the slot; the slot then holds the process's
// proof.
func TestCallerRegionsNeedProofSlots(t *testing.T) {
	mem := make([]byte, 4*(8*64+transfer.ProofBytes))
	var pin runtime.Pinner
	pin.Pin(&mem[0])
	defer pin.Unpin()
	mk := func(stride int) Config {
		cfg := DefaultConfig(RoleDecode)
		cfg.Auth = testauth.Auth()
		cfg.Instance, cfg.Compat, cfg.BootstrapURL = "slots", "v1:test", "http://127.0.0.1:1"
		cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
		cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64}
		for i := range 2 {
			cfg.Layout.Regions = append(cfg.Layout.Regions, nixl.BytesDesc(mem[i*stride:i*stride+8*64]))
		}
		return cfg
	}
	_, err := NewDecode(mk(8 * 64))
	require.ErrorContains(t, err, "ownership proof slot", "regions back to back: want a refusal naming the proof slot and both regions")
	require.ErrorContains(t, err, "KV region 0", "regions back to back: want a refusal naming the proof slot and both regions")
	d, err := NewDecode(mk(8*64 + transfer.ProofBytes))
	require.NoError(t, err)
	defer d.Close()
	for i, pr := range proofRegions(d.cfg.Layout) {
		off := i*(8*64+transfer.ProofBytes) + 8*64
		require.Equal(t, pr.value(d.proof[:], "decode/slots/0"), mem[off:off+proofLen], "the slot after region %d does not hold the process's value for it", i)
		require.NotEqual(t, make([]byte, proofLen), d.proof[:], "the slot after region %d does not hold the process's value for it (the process's proof is all zero)", i)
	}
}

// TestRegisterCheckOffTheControlLoop: a REGISTER whose proof read does not
// come back (held here, as a peer that never answers) holds neither the
// control loop nor another decode rank's registration: the other rank's
// REGISTER is answered meanwhile. A repeat from the held rank is put off,
// counted; once the read returns, the held REGISTER is answered, then the
// repeat, as a repeat (its proof not read again). With the check on the control loop's goroutine (before) the
// other rank waited for the held one.
func TestRegisterCheckOffTheControlLoop(t *testing.T) {
	reg := prometheus.NewRegistry()
	engine := nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
	p := newTestPrefill(t, func(c *Config) {
		c.Engine, c.Instance, c.Registerer = engine, "offloop-prefill", reg
	})
	n := len(p.cfg.Layout.Regions)
	slow := newProofRank(t, engine, "slow", n)
	quick := newProofRank(t, engine, "quick", n)
	hold, holding := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release) // a failure below must not leave the check held
	// Deferrals by rank: the other rank's own repeats (its RegisterRetry,
	// every second) can be deferred too on a loaded machine.
	deferredCh := make(chan struct{}, 4)
	deferrals := map[string]int{}
	p.regMu.Lock()
	var slowReads atomic.Int32
	p.proofHook = func(msg *wire.Register) {
		if msg.From.Instance == "slow" {
			slowReads.Add(1)
			holding <- struct{}{}
			<-hold
		}
	}
	p.deferHook = func(peer string) {
		deferrals[peer]++
		if peer != slow.owner {
			return
		}
		select {
		case deferredCh <- struct{}{}:
		default:
		}
	}
	p.regMu.Unlock()
	slowMsg := &wire.Register{Compat: p.cfg.Compat, Agent: slow.name, AgentMD: slow.md, TPSize: 1,
		KV: slow.kv, Aux: []wire.Region{}, State: []wire.Region{}, Proof: slow.seed}
	send := func(r *proofRank) {
		t.Helper()
		require.NoError(t, r.loop.Send(wire.Peer{Endpoint: p.Endpoint()}, slowMsg))
	}
	send(slow)
	slowMsg.Echo = awaitChallenge(t, slow) // the agent challenge first
	// The challenge's goroutine ends its check after it sent the
	// challenge: an echo before that would be put off (counted), and the
	// count below is of the repeat's deferral alone.
	require.Eventually(t, func() bool {
		p.regMu.Lock()
		defer p.regMu.Unlock()
		return !p.checking[slow.owner] && !p.checking["agent "+slow.name]
	}, 30*time.Second, time.Millisecond, "the held rank's challenge check did not end")
	send(slow)
	select {
	case <-holding: // its proof read is in progress, and does not come back
	case <-time.After(30 * time.Second):
		t.Fatal("the held rank's proof read did not start")
	}
	a := quick.register(t, p, quick.name, quick.md, quick.kv, quick.seed)
	require.True(t, a.OK, "another rank's REGISTER while one is held: %s", a.Reason)
	// The held rank's deferrals, all deferrals and the counter, read under
	// regMu (beginCheck counts and calls the hook under it).
	deferred := func() (held, all int, counted float64) {
		p.regMu.Lock()
		defer p.regMu.Unlock()
		for peer, n := range deferrals {
			all += n
			if peer == slow.owner {
				held += n
			}
		}
		families, err := reg.Gather()
		require.NoError(t, err)
		counted = -1
		for _, f := range families {
			if f.GetName() == "kvbridge_registers_deferred_total" {
				counted = f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return held, all, counted
	}
	send(slow) // a repeat while its first is checked: put off until that check ends and its answer is stepped
	// Two ranks' messages arrive in no set order: wait for the repeat's
	// deferral itself (each rank's own messages stay in order).
	select {
	case <-deferredCh:
	case <-time.After(30 * time.Second):
		t.Fatal("the held rank's repeat was not deferred")
	}
	d := quick.register(t, p, quick.name, quick.md, quick.kv, quick.seed)
	require.True(t, d.OK, "the other rank's repeat refused: %s", d.Reason)
	held, all, counted := deferred()
	require.Equal(t, 1, held, "the held rank's repeat: deferred once")
	require.Equal(t, float64(all), counted, "kvbridge_registers_deferred_total: every deferral counted")
	select {
	case a := <-slow.acks:
		t.Fatalf("an answer to the held rank before its read returned: %+v", a)
	default:
	}
	release()
	select {
	case a := <-slow.acks:
		require.True(t, a.OK, "the held REGISTER, once its read returned: %s", a.Reason)
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the held REGISTER after its read returned")
	}
	// The repeat that waited is stepped into the core again once the
	// held one is bound: a repeat of a proven registration, answered
	// without a second load or read of its proof (checked as it came, its
	// plan had not seen the bind).
	select {
	case a := <-slow.acks:
		require.True(t, a.OK, "the repeat that waited for the held check: %s", a.Reason)
	case <-time.After(30 * time.Second):
		t.Fatal("no answer to the repeat that waited for the held check")
	}
	require.EqualValues(t, 1, slowReads.Load(), "the held rank's proof reads: its repeat read it again")
}

// TestEchoWhileChallengeChecked: a decode rank echoes its agent challenge
// as soon as the notification lands, which can be before the challenge's
// check has ended (held here once the notification went out). The echo
// waits for that check and is answered when it ends, though its rank never
// sends again (a decode rank under a frozen clock, as TestSoak's, has no
// REGISTER retry). Before, it was left for the sender's retry: a second of
// a first registration on a busy machine, and TestSoak hung on it in CI.
func TestEchoWhileChallengeChecked(t *testing.T) {
	engine := nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
	p := newTestPrefill(t, func(c *Config) { c.Engine, c.Instance = engine, "echo-prefill" })
	r := newProofRank(t, engine, "echo", len(p.cfg.Layout.Regions))
	hold, holding := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release) // a failure below must not leave the check held
	deferred := make(chan struct{}, 4)
	p.regMu.Lock()
	p.challengeHook = func(msg *wire.Register) {
		if msg.From.Peer() == r.owner {
			holding <- struct{}{}
			<-hold
		}
	}
	p.deferHook = func(peer string) {
		if peer == r.owner {
			deferred <- struct{}{}
		}
	}
	p.regMu.Unlock()
	msg := &wire.Register{Compat: p.cfg.Compat, Agent: r.name, AgentMD: r.md, TPSize: 1,
		KV: r.kv, Aux: []wire.Region{}, State: []wire.Region{}, Proof: r.seed}
	to := wire.Peer{Endpoint: p.Endpoint()}
	require.NoError(t, r.loop.Send(to, msg))
	select {
	case <-holding: // the challenge went out; its check has not ended
	case <-time.After(30 * time.Second):
		t.Fatal("no agent challenge sent within 30 s")
	}
	msg.Echo = awaitChallenge(t, r)
	require.NoError(t, r.loop.Send(to, msg)) // the echo, once: no retry follows
	select {
	case <-deferred:
	case <-time.After(30 * time.Second):
		t.Fatal("the echo was not put off while the challenge's check was held")
	}
	select {
	case a := <-r.acks:
		t.Fatalf("an answer before the challenge's check ended: %+v", a)
	default:
	}
	release()
	select {
	case a := <-r.acks:
		require.True(t, a.OK, "the echo, once the challenge's check ended: %s", a.Reason)
	case <-time.After(30 * time.Second):
		t.Fatal("the echo was not answered once the challenge's check ended (left for a repeat its rank never sends)")
	}
	p.regMu.Lock()
	defer p.regMu.Unlock()
	require.Empty(t, p.waitingRegs, "REGISTERs still waiting after every check ended")
}

// TestRegisterParking: a REGISTER put off behind a check of its own rank
// waits for that check (the rank's latest only), one put off by another
// rank's check of its agent name does not (its sender repeats it), and
// none is stepped again once the rank is closing.
func TestRegisterParking(t *testing.T) {
	p := newTestPrefill(t, func(c *Config) { c.Instance = "parking-prefill" })
	first, second, other := &wire.Register{Agent: "a"}, &wire.Register{Agent: "a"}, &wire.Register{Agent: "a"}
	require.True(t, p.beginCheck("decode/x/0", "a", nil))
	require.False(t, p.beginCheck("decode/x/0", "a", first))
	require.False(t, p.beginCheck("decode/x/0", "a", second))
	require.False(t, p.beginCheck("decode/y/0", "a", other), "another rank, the same agent name")
	next := p.endCheck("decode/x/0", "a")
	p.wg.Done()
	require.Same(t, second, next, "the rank's latest REGISTER, stepped again")
	require.Empty(t, p.waitingRegs, "parked behind another rank's check of its agent name, or left behind")
	require.True(t, p.beginCheck("decode/x/0", "a", nil))
	require.False(t, p.beginCheck("decode/x/0", "a", first))
	p.regMu.Lock()
	p.regClosed = true // as Close does before it waits for the checks
	p.regMu.Unlock()
	next = p.endCheck("decode/x/0", "a")
	p.wg.Done()
	require.Nil(t, next, "a REGISTER stepped again while the rank closes")
}

// TestRegisterClaimsCheckedAgainOnceReserved: the control loop checks a
// REGISTER's claims before the check reserves its rank and agent name; a
// registration of that name that completes in between (another rank's,
// under a custom name) must still refuse it. The attacker's REGISTER is
// bound here as if its early check had passed just before the victim's
// registration completed: refused, and the victim's remote stays the
// victim's — where it was replaced by the attacker's own (proven) memory,
// and the victim's rooms were written there.
func TestRegisterClaimsCheckedAgainOnceReserved(t *testing.T) {
	engine := nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
	p := newTestPrefill(t, func(c *Config) { c.Engine, c.Instance = engine, "reserve-prefill" })
	n := len(p.cfg.Layout.Regions)
	victim := newProofRankNamed(t, engine, "reserve-victim", "shared-kv-agent", n)
	attacker := newProofRankNamed(t, engine, "reserve-attacker", "shared-kv-agent", n)
	a := victim.register(t, p, victim.name, victim.md, victim.kv, victim.seed)
	require.True(t, a.OK, "the victim's REGISTER: %s", a.Reason)
	msg := &wire.Register{From: attacker.loop.Identity(), Compat: p.cfg.Compat, Agent: attacker.name, AgentMD: attacker.md, TPSize: 1,
		KV: attacker.kv, Aux: []wire.Region{}, State: []wire.Region{}, Proof: attacker.seed}
	var plan core.PeerPlan
	var err error
	p.read(func(c *core.Core) { plan, err = c.CheckRegister(msg) })
	require.NoError(t, err)
	require.True(t, p.beginCheck(msg.From.Peer(), msg.Agent, nil), "the check could not be reserved")
	p.bindRegister(msg, plan) // (releases the reservation)
	var owner string
	p.read(func(c *core.Core) { owner = c.AgentOwner(victim.name) })
	require.Equal(t, victim.owner, owner, "after the attacker's REGISTER under the victim's name: the name's owner")
	require.True(t, p.agent.RemoteContains(victim.name, nixl.DRAM, nixl.BytesDesc(victim.mem[0])), "after the attacker's REGISTER under the victim's name: the remote no longer holds the victim's memory")
}

// TestRepeatProvenAgainWhenReloaded: a repeat of a proven registration
// whose remote is still usable is left as it is (nothing loaded, nothing
// read); one whose remote had to be loaded again is proven again — the same
// blob can name other memory by then (a pid or a descriptor reused), here
// played by a slot that no longer holds the value: refused.
func TestRepeatProvenAgainWhenReloaded(t *testing.T) {
	engine := nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
	p := newTestPrefill(t, func(c *Config) { c.Engine, c.Instance = engine, "reload-prefill" })
	r := newProofRank(t, engine, "reload", len(p.cfg.Layout.Regions))
	a := r.register(t, p, r.name, r.md, r.kv, r.seed)
	require.True(t, a.OK, "the first REGISTER: %s", a.Reason)
	copy(r.mem[0][8*64:], make([]byte, proofLen)) // the memory the blob names is no longer proven
	a = r.register(t, p, r.name, r.md, r.kv, r.seed)
	require.True(t, a.OK, "a repeat while its remote is usable (left as it is): %s", a.Reason)
	// As after a failed transfer: loaded again at the next REGISTER.
	require.NoError(t, p.agent.InvalidateRemote(r.name))
	a = r.register(t, p, r.name, r.md, r.kv, r.seed)
	require.False(t, a.OK, "a repeat that loads the blob again over memory no longer proven: %s", a.Reason)
	require.Contains(t, a.Reason, "not_owner", "a repeat that loads the blob again over memory no longer proven")
}

// TestProofDriverFromConfig: the ownership proof of device memory is
// written through the CUDA driver Config.Engine.CUDALib names (issue 50:
// the library reads no KVBRIDGE_CUDA_LIB of its own; Config.FromEnv fills
// the field), and a failure names the field.
func TestProofDriverFromConfig(t *testing.T) {
	const lib = "/nonexistent/kvbridge-proof-libcuda.so.1"
	t.Setenv("KVBRIDGE_CUDA_LIB", "")
	m := &Manager{cfg: Config{Engine: nixl.Config{CUDALib: lib}}}
	l := transfer.Layout{Kind: nixl.VRAM, Regions: []nixl.Desc{{Addr: 1 << 20, Len: 64}}}
	err := m.writeProof(l, "decode/i/0")
	require.ErrorIs(t, err, cuda.ErrNoDriver, "a driver path that does not exist")
	require.ErrorContains(t, err, "Config.Engine.CUDALib", "a driver path that does not exist")
	require.Equal(t, 2, strings.Count(err.Error(), lib), "the driver loaded is not the Config's: %v", err)
}

// TestProofReadCutByCloseDropsRegister: a REGISTER whose proof read is
// under way when the prefill rank closes is dropped, counted, not refused
// (docs/PROTOCOL.md "A rank that closes"): Close cancels the read's
// context, and the shell's refusal of the failed read reaches a closed
// core, which answers nothing and counts no ownership failure. Before, it
// went out as not_owner ("context canceled"), and the decode rank failed
// its waiting rooms as incompatible. (A fault hunt's reproduction.)
func TestProofReadCutByCloseDropsRegister(t *testing.T) {
	engine := nixl.Config{Engine: nixl.EngineUCX, UCX: map[string]string{"TLS": "posix,cma,self"}}
	p := newTestPrefill(t, func(c *Config) {
		c.Engine, c.Instance, c.Registerer = engine, "cut-prefill", prometheus.NewRegistry()
	})
	slow := newProofRank(t, engine, "slow", len(p.cfg.Layout.Regions))
	hold, holding := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	p.regMu.Lock()
	p.proofHook = func(*wire.Register) {
		holding <- struct{}{}
		<-hold
	}
	p.regMu.Unlock()
	msg := &wire.Register{Compat: p.cfg.Compat, Agent: slow.name, AgentMD: slow.md, TPSize: 1,
		KV: slow.kv, Aux: []wire.Region{}, State: []wire.Region{}, Proof: slow.seed}
	require.NoError(t, slow.loop.Send(wire.Peer{Endpoint: p.Endpoint()}, msg))
	msg.Echo = awaitChallenge(t, slow)
	require.Eventually(t, func() bool {
		p.regMu.Lock()
		defer p.regMu.Unlock()
		return !p.checking[slow.owner] && !p.checking["agent "+slow.name]
	}, 30*time.Second, time.Millisecond, "the challenge's own check ended")
	require.NoError(t, slow.loop.Send(wire.Peer{Endpoint: p.Endpoint()}, msg))
	select {
	case <-holding: // the echoing REGISTER's proof read under way
	case <-time.After(30 * time.Second):
		t.Fatal("the proof read did not start within 30 s")
	}
	notOwner := p.stats().LayoutRefused[core.RefusedNotOwner]
	closed := make(chan struct{})
	go func() { defer close(closed); p.Close() }()
	require.Eventually(t, func() bool { return p.ctx.Err() != nil }, 10*time.Second, time.Millisecond, "Close cancelled the rank's context")
	release()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return within 30 s")
	}
	st := p.stats()
	require.EqualValues(t, 1, st.ClosedRegisters, "the REGISTER whose read Close cut short: dropped and counted")
	require.Equal(t, notOwner, st.LayoutRefused[core.RefusedNotOwner], "refused as not_owner: an ownership failure that never happened")
}
