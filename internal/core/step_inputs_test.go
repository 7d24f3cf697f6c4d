package core

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// everyInput is one value of each input type.
func everyInput() map[string]Input {
	w := &kvlayout.Write{AuxSrc: -1, State: -1}
	return map[string]Input{
		"CreateSender": CreateSender{Room: 1}, "InitSender": InitSender{Room: 1}, "SendChunk": SendChunk{Room: 1},
		"AbortSender": AbortSender{Room: 1}, "ClearSender": ClearSender{Room: 1},
		"CreateReceiver": CreateReceiver{Room: 1, Targets: []Target{prefillT}}, "InitReceiver": InitReceiver{Room: 1},
		"AbortReceiver": AbortReceiver{Room: 1}, "ClearReceiver": ClearReceiver{Room: 1}, "RefuseRoom": RefuseRoom{Room: 1},
		"Received":         Received{Msg: &wire.Ping{From: decodeFrom}},
		"Registered":       Registered{From: decodeFrom},
		"RegisterRefused":  RegisterRefused{From: decodeFrom, Reason: "test"},
		"MalformedRequest": MalformedRequest{Room: 1, Endpoint: decodeFrom.Endpoint, Reason: "test"},
		"Posting":          Posting{Room: 1, Write: w}, "WriteDone": WriteDone{Room: 1, Write: w},
		"Notified": Notified{Room: 1}, "Challenged": Challenged{For: decodeFrom.Peer(), Nonce: make([]byte, ChallengeBytes)}, "Bound": Bound{Endpoint: prefillFrom.Endpoint}, "Resolved": Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint},
		"ResolveFailed":   ResolveFailed{Target: prefillT, Err: errors.New("test")},
		"TargetChanged":   TargetChanged{Target: prefillT, Gone: true},
		"PeerUnreachable": PeerUnreachable{Endpoint: "tcp://x:1", Reason: "test"}, "Tick": Tick{}, "Close": Close{Reason: "test"},
		"Fail": Fail{Room: 1, Reason: "test"}, "AgentClosed": AgentClosed{},
		"OfferLoaded":     OfferLoaded{Plan: &OfferPlan{Ack: &wire.RegisterAck{From: prefillFrom, OK: true, Pull: &wire.PullOffer{Agent: "a"}}}},
		"OfferChallenged": OfferChallenged{Plan: &OfferPlan{Ack: &wire.RegisterAck{From: prefillFrom, OK: true, Pull: &wire.PullOffer{Agent: "a"}}}},
		"TopologyLearned": TopologyLearned{URL: prefillT.Bootstrap, Topo: Topology{Instance: "p", TPSize: 1}},
		"PagesReady":      PagesReady{To: wire.Peer{Endpoint: decodeFrom.Endpoint}, Msg: &wire.Pages{Room: 1}},
		"ReadPosting":     ReadPosting{Room: 1, Read: &Read{}},
		"ReadDone":        ReadDone{Room: 1, Read: &Read{}},
	}
}

// TestStepHandlesEveryInput: every type that implements Input (read from
// the package's sources, so a new one cannot be missed) has a case in Step on
// both roles — handled, or refused as the other role's —, and an input
// with no case (nil) is refused with ErrUnknownInput instead of being
// dropped silently.
func TestStepHandlesEveryInput(t *testing.T) {
	fs := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var declared []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == "input" && fn.Recv != nil {
				if id, ok := fn.Recv.List[0].Type.(*ast.Ident); ok {
					declared = append(declared, id.Name)
				}
			}
		}
	}
	inputs := everyInput()
	var listed []string
	for n := range inputs {
		listed = append(listed, n)
	}
	slices.Sort(declared)
	slices.Sort(listed)
	if len(declared) == 0 || !slices.Equal(declared, listed) {
		t.Fatalf("step.go declares the inputs %v; this test lists %v", declared, listed)
	}
	now := time.Unix(1_000_000, 0)
	for _, role := range []Role{RolePrefill, RoleDecode} {
		for _, n := range listed {
			out := testCore(t, role).Step(now, inputs[n])
			if errors.Is(out.Err, ErrUnknownInput) || errors.Is(out.Result.Err, ErrUnknownInput) {
				t.Errorf("%v core: %s has no case in Step: %v", role, n, out.Err)
			}
		}
		c := testCore(t, role)
		if out := c.Step(now, nil); !errors.Is(out.Err, ErrUnknownInput) || out.Result.Outcome != Rejected {
			t.Errorf("%v core: a nil input gave %+v, want ErrUnknownInput", role, out)
		}
		if e := c.Effects(); len(e) != 0 {
			t.Errorf("%v core: a nil input had effects %v", role, e)
		}
		// A type Step has no case for (one of this test's own).
		if out := c.Step(now, strayInput{}); !errors.Is(out.Err, ErrUnknownInput) || out.Result.Outcome != Rejected {
			t.Errorf("%v core: an input without a case gave %+v, want ErrUnknownInput", role, out)
		}
		if e := c.Effects(); len(e) != 0 {
			t.Errorf("%v core: an input without a case had effects %v", role, e)
		}
	}
}

// strayInput is an Input that Step has no case for.
type strayInput struct{}

func (strayInput) input() {}

// TestFailInput: a failure the shell found (writes not handed to the
// pool) fails the room through Step and tells its decode rank, as any
// failure of a prefill room does.
func TestFailInput(t *testing.T) {
	c := testCore(t, RolePrefill)
	register(t, c, decodeFrom)
	c.Step(t0, CreateSender{Room: 1})
	c.Step(t0, InitSender{Room: 1})
	if !c.Step(t0, Received{Msg: request(1, decodeFrom)}).OK {
		t.Fatal("REQUEST refused")
	}
	c.Effects()
	if res := c.Step(t0, Fail{Room: 1, Reason: "transfer: pool closed"}).Result; res.Outcome != Applied || res.Status != Failed {
		t.Fatalf("Fail: %+v", res)
	}
	if r, _ := c.Failure(1); r != "transfer: pool closed" {
		t.Fatalf("reason %q", r)
	}
	st := sent[*wire.Status](c.Effects())
	if len(st) != 1 || st[0].Room != 1 || st[0].Status != wire.StatusFailed || st[0].Code != CodeFailed {
		t.Fatalf("STATUS to the decode rank: %+v", st)
	}
	if res := c.Step(t0, Fail{Room: 9, Reason: "x"}).Result; res.Outcome == Applied {
		t.Fatalf("Fail of an unknown room applied: %+v", res)
	}
}

// TestRegisterAsLoadEffect: a REGISTER is checked in the core when it
// arrives (the epoch, then CheckRegister); one that passes comes out as
// EffectLoadMetadata, with its plan, and nothing is answered until the
// load's result is stepped; one that fails is answered REGISTER_ACK ok
// false at once, and nothing is loaded.
func TestRegisterAsLoadEffect(t *testing.T) {
	c := testCore(t, RolePrefill)
	kv, aux, state := RegionsOf(simLayout())
	first := &wire.Register{From: decodeFrom, Compat: "sim", KV: kv, Aux: aux, State: state}
	if c.Step(t0, Received{Msg: first}).OK {
		t.Fatal("a REGISTER was passed on to be loaded before its agent challenge was echoed")
	}
	eff := c.Effects()
	// The agent keeps progressing while the notification goes out, then
	// the challenge.
	if len(eff) != 2 || eff[0].Kind != EffectKeepProgress || eff[1].Kind != EffectChallenge || eff[1].Msg != first {
		t.Fatalf("effects of a first REGISTER: %+v", eff)
	}
	ch, _ := ParseChallenge(eff[1].Notif)
	good := *first
	good.Echo = ch.Nonce
	if !c.Step(t0, Received{Msg: &good}).OK {
		t.Fatal("a valid REGISTER was not passed on to be loaded")
	}
	eff = c.Effects()
	if len(eff) != 1 || eff[0].Kind != EffectLoadMetadata || eff[0].Msg != &good || eff[0].Plan == nil || eff[0].To.Endpoint != decodeFrom.Endpoint {
		t.Fatalf("effects of a valid REGISTER: %+v", eff)
	}
	plan := *eff[0].Plan
	c.Step(t0, Registered{From: decodeFrom, Remote: "agent", Plan: plan})
	if acks := sent[*wire.RegisterAck](c.Effects()); len(acks) != 1 || !acks[0].OK {
		t.Fatalf("after the load: %v", acks)
	}

	other := decodeFrom
	other.Rank, other.Endpoint = 1, "tcp://d:2"
	// Valid but for its model (a name of its own, its regions): refused
	// at once for the compat hash, before any challenge or load.
	bad := &wire.Register{From: other, Compat: "another model", Agent: "other-agent", KV: kv, Aux: aux, State: state}
	if c.Step(t0, Received{Msg: bad}).OK {
		t.Fatal("a REGISTER of another compat hash was passed on to be loaded")
	}
	eff = c.Effects()
	acks := sent[*wire.RegisterAck](eff)
	if len(acks) != 1 || acks[0].OK || len(eff) != 1 || !strings.Contains(acks[0].Reason, "compat") {
		t.Fatalf("effects of an invalid REGISTER: %+v (want one REGISTER_ACK refusing its compat hash)", eff)
	}
}
