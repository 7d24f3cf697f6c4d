package kvmanager

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/nixldouble"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
)

// proofRank is a decode rank's memory and identity as a test drives it: an
// agent of its own with regions of the prefill's layout (each followed by
// its proof slot, holding proof) and a control loop that sends REGISTERs as
// that rank.
type proofRank struct {
	name  string
	agent *nixl.Agent
	md    []byte
	kv    []bootstrap.Region
	mem   [][]byte
	proof []byte
	loop  *bootstrap.Loop
	acks  chan *bootstrap.RegisterAck
}

func newProofRank(t *testing.T, engine nixl.Config, name string, regions int, proof string) *proofRank {
	t.Helper()
	engine.Name = name
	a, err := nixl.Open(engine)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	r := &proofRank{name: name, agent: a, proof: []byte(fmt.Sprintf("%-32s", proof)[:proofLen]), acks: make(chan *bootstrap.RegisterAck, 4)}
	for i := range regions {
		_, buf, err := a.Alloc(8*64 + transfer.ProofBytes)
		if err != nil {
			t.Fatal(err)
		}
		for k := range buf[:8*64] {
			buf[k] = byte(i*31 + k) // the rank's KV: must never change
		}
		copy(buf[8*64:], r.proof)
		r.mem = append(r.mem, buf)
		r.kv = append(r.kv, bootstrap.Region{Addr: uint64(nixl.BytesDesc(buf).Addr), Len: 8 * 64, ItemLen: 64, Mem: bootstrap.MemDRAM})
	}
	if r.md, err = a.Metadata(); err != nil {
		t.Fatal(err)
	}
	r.loop, err = bootstrap.NewLoop(bootstrap.LoopConfig{
		Identity: bootstrap.From{Role: bootstrap.RoleDecode, Instance: name, Rank: 0},
		Bind:     "tcp://127.0.0.1:*", Auth: testauth.Auth(),
		Handler: func(m bootstrap.Message) {
			if a, ok := m.(*bootstrap.RegisterAck); ok {
				r.acks <- a
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.loop.Close() })
	return r
}

// register sends a REGISTER as this rank and returns the prefill's answer.
func (r *proofRank) register(t *testing.T, p *Prefill, agent string, md []byte, kv []bootstrap.Region, proof []byte) *bootstrap.RegisterAck {
	t.Helper()
	reg := &bootstrap.Register{Compat: p.cfg.Compat, Agent: agent, AgentMD: md, TPSize: 1,
		KV: kv, Aux: []bootstrap.Region{}, State: []bootstrap.Region{}, Proof: proof}
	if err := r.loop.Send(bootstrap.Peer{Endpoint: p.Endpoint()}, reg); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-r.acks:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("no REGISTER_ACK within 30 s")
		return nil
	}
}

// renamed is a kvbridge metadata blob (nixl/metadata.go: "KVBN" version,
// then engine, agent and library as length-prefixed strings, ...) with its
// agent name replaced: the same process, memory and keys, another name.
func renamed(t *testing.T, md []byte, name string) []byte {
	t.Helper()
	if len(md) < 5 || string(md[:4]) != "KVBN" {
		t.Fatalf("not a kvbridge blob: %x", md[:min(5, len(md))])
	}
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
// own — that process's agent blob (its name, or renamed to its own: the
// victim's process, memory and keys), the victim's regions under its own
// blob, a process not yet registered here — and a REGISTER without a
// proof. The prefill rank refuses each (not_owner, counted): the proof
// slots it reads back through the data plane hold the victim's proof, not
// the attacker's, and the victim's name is the victim's. The victim's
// registration survives (its remote stays loaded), its memory is
// untouched, and the attacker's genuine REGISTER is accepted: the check
// refuses foreign memory, not everything.
func TestRegisterForeignMemoryRefused(t *testing.T) {
	double, err := nixldouble.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
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
			victim := newProofRank(t, tc.engine, "proof-victim-"+tc.name, n, "the victim's own proof..........")
			bystander := newProofRank(t, tc.engine, "proof-bystander-"+tc.name, n, "a process that never registered.")
			attacker := newProofRank(t, tc.engine, "proof-attacker-"+tc.name, n, "the attacker's own proof........")
			if a := victim.register(t, p, victim.name, victim.md, victim.kv, victim.proof); !a.OK {
				t.Fatalf("the victim's genuine REGISTER refused: %s", a.Reason)
			}
			refusals := func() uint64 {
				var s CoreStats
				p.read(func(c *Core) { s = c.Stats() })
				return s.LayoutRefused[RefusedNotOwner]
			}
			for _, c := range []struct {
				what  string
				agent string
				md    []byte
				kv    []bootstrap.Region
				proof []byte
			}{
				{"the victim's blob, name and regions", victim.name, victim.md, victim.kv, attacker.proof},
				{"the victim's blob renamed to the attacker, the victim's regions", attacker.name, renamed(t, victim.md, attacker.name), victim.kv, attacker.proof},
				{"the attacker's own blob, the victim's regions", attacker.name, attacker.md, victim.kv, attacker.proof},
				{"an unregistered process's blob and regions", bystander.name, bystander.md, bystander.kv, attacker.proof},
				{"the attacker's own memory without a proof", attacker.name, attacker.md, attacker.kv, nil},
				{"the attacker's own memory, another proof", attacker.name, attacker.md, attacker.kv, victim.proof},
			} {
				before := refusals()
				a := attacker.register(t, p, c.agent, c.md, c.kv, c.proof)
				if a.OK {
					t.Fatalf("%s: accepted (REGISTER_ACK ok): the prefill rank would write the attacker's rooms there", c.what)
				}
				if !strings.Contains(a.Reason, "not_owner") && !strings.Contains(a.Reason, "agent metadata") {
					t.Fatalf("%s: refused for a reason that does not name the ownership check: %s", c.what, a.Reason)
				}
				if got := refusals(); strings.Contains(a.Reason, "not_owner") && got != before+1 {
					t.Fatalf("%s: kvbridge_layout_refused_total{reason=not_owner} %d → %d", c.what, before, got)
				}
				t.Logf("%s: refused: %s", c.what, a.Reason)
			}
			if refusals() < 4 {
				t.Fatalf("only %d refusals counted as not_owner", refusals())
			}
			// The victim's registration is intact: its remote is loaded, its
			// name still its own, its memory as it wrote it.
			if !p.agent.RemoteContains(victim.name, nixl.DRAM, nixl.BytesDesc(victim.mem[0])) {
				t.Fatal("the victim's remote agent is gone from the prefill rank: an attacker's REGISTER replaced or dropped it")
			}
			var owner string
			p.read(func(c *Core) { owner = c.AgentOwner(victim.name) })
			if owner != "decode/"+victim.name+"/0" && !strings.Contains(owner, victim.name) {
				t.Fatalf("the victim's agent is registered to %q", owner)
			}
			for i, buf := range victim.mem {
				for k := range buf[:8*64] {
					if buf[k] != byte(i*31+k) {
						t.Fatalf("the victim's region %d changed at byte %d", i, k)
					}
				}
				if !bytes.Equal(buf[8*64:8*64+len(victim.proof)], victim.proof) {
					t.Fatalf("the victim's proof slot %d changed", i)
				}
			}
			if a := victim.register(t, p, victim.name, victim.md, victim.kv, victim.proof); !a.OK {
				t.Fatalf("the victim's REGISTER refused after the attacks: %s", a.Reason)
			}
			if a := attacker.register(t, p, attacker.name, attacker.md, attacker.kv, attacker.proof); !a.OK {
				t.Fatalf("the attacker's genuine REGISTER (its own memory) refused: %s", a.Reason)
			}
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
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			msg := d.core.cfg.Register // as the decode rank sends it (unsealed: the loop seals it)
			msg.From = bootstrap.From{Role: bootstrap.RoleDecode, Instance: "proof-bench-decode", Rank: 0, Endpoint: "tcp://127.0.0.1:1", Epoch: 1}
			var proof, rest time.Duration
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				var plan PeerPlan
				p.read(func(c *Core) { plan, err = c.CheckRegister(&msg) })
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
				if err != nil {
					b.Fatal(err)
				}
				proof += t2.Sub(t1)
				rest += t1.Sub(t0) + time.Since(t2)
			}
			b.ReportMetric(float64(proof.Nanoseconds())/float64(b.N), "proof-ns/op")
			b.ReportMetric(float64(rest.Nanoseconds())/float64(b.N), "rest-ns/op")
			b.ReportMetric(float64(proof)/float64(rest), "proof/rest")
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
	if _, err := NewDecode(mk(8 * 64)); err == nil || !strings.Contains(err.Error(), "ownership proof slot") || !strings.Contains(err.Error(), "KV region 0") {
		t.Fatalf("regions back to back: %v, want a refusal naming the proof slot and both regions", err)
	}
	d, err := NewDecode(mk(8*64 + transfer.ProofBytes))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for i := range 2 {
		off := i*(8*64+transfer.ProofBytes) + 8*64
		if !bytes.Equal(mem[off:off+proofLen], d.proof[:]) || bytes.Equal(d.proof[:], make([]byte, proofLen)) {
			t.Fatalf("the slot after region %d does not hold the process's proof", i)
		}
	}
}
