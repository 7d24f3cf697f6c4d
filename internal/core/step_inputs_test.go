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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	require.NoError(t, err)
	var declared []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, name, nil, 0)
		require.NoError(t, err)
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
	require.NotEmpty(t, declared, "step.go declares the inputs %v; this test lists %v", declared, listed)
	require.Equal(t, declared, listed, "step.go declares the inputs %v; this test lists %v", declared, listed)
	now := time.Unix(1_000_000, 0)
	for _, role := range []Role{RolePrefill, RoleDecode} {
		for _, n := range listed {
			out := testCore(t, role).Step(now, inputs[n])
			assert.NotErrorIs(t, out.Err, ErrUnknownInput, "%v core: %s has no case in Step", role, n)
			assert.NotErrorIs(t, out.Result.Err, ErrUnknownInput, "%v core: %s has no case in Step: %v", role, n, out.Err)
		}
		c := testCore(t, role)
		out := c.Step(now, nil)
		assert.ErrorIs(t, out.Err, ErrUnknownInput, "%v core: a nil input gave %+v", role, out)
		assert.Equal(t, Rejected, out.Result.Outcome, "%v core: a nil input gave %+v, want ErrUnknownInput", role, out)
		assert.Empty(t, c.Effects(), "%v core: a nil input had effects", role)
		// A type Step has no case for (one of this test's own).
		out = c.Step(now, strayInput{})
		assert.ErrorIs(t, out.Err, ErrUnknownInput, "%v core: an input without a case gave %+v", role, out)
		assert.Equal(t, Rejected, out.Result.Outcome, "%v core: an input without a case gave %+v, want ErrUnknownInput", role, out)
		assert.Empty(t, c.Effects(), "%v core: an input without a case had effects", role)
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
	require.True(t, c.Step(t0, Received{Msg: request(1, decodeFrom)}).OK, "REQUEST refused")
	c.Effects()
	res := c.Step(t0, Fail{Room: 1, Reason: "transfer: pool closed"}).Result
	require.Equal(t, Applied, res.Outcome, "Fail: %+v", res)
	require.Equal(t, Failed, res.Status, "Fail: %+v", res)
	r, _ := c.Failure(1)
	require.Equal(t, "transfer: pool closed", r, "room 1's reason")
	st := sent[*wire.Status](c.Effects())
	require.Len(t, st, 1, "STATUS to the decode rank: %+v", st)
	require.EqualValues(t, 1, st[0].Room, "STATUS to the decode rank: %+v", st)
	require.Equal(t, wire.StatusFailed, st[0].Status, "STATUS to the decode rank: %+v", st)
	require.Equal(t, CodeFailed, st[0].Code, "STATUS to the decode rank: %+v", st)
	res = c.Step(t0, Fail{Room: 9, Reason: "x"}).Result
	require.NotEqual(t, Applied, res.Outcome, "Fail of an unknown room applied: %+v", res)
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
	require.False(t, c.Step(t0, Received{Msg: first}).OK, "a REGISTER was passed on to be loaded before its agent challenge was echoed")
	eff := c.Effects()
	// The agent keeps progressing while the notification goes out, then
	// the challenge.
	require.Len(t, eff, 2, "effects of a first REGISTER: %+v", eff)
	require.Equal(t, EffectKeepProgress, eff[0].Kind, "effects of a first REGISTER: %+v", eff)
	require.Equal(t, EffectChallenge, eff[1].Kind, "effects of a first REGISTER: %+v", eff)
	require.Same(t, first, eff[1].Msg, "effects of a first REGISTER: %+v", eff)
	ch, _ := ParseChallenge(eff[1].Notif)
	good := *first
	good.Echo = ch.Nonce
	require.True(t, c.Step(t0, Received{Msg: &good}).OK, "a valid REGISTER was not passed on to be loaded")
	eff = c.Effects()
	require.Len(t, eff, 1, "effects of a valid REGISTER: %+v", eff)
	require.Equal(t, EffectLoadMetadata, eff[0].Kind, "effects of a valid REGISTER: %+v", eff)
	require.Same(t, &good, eff[0].Msg, "effects of a valid REGISTER: %+v", eff)
	require.NotNil(t, eff[0].Plan, "effects of a valid REGISTER: %+v", eff)
	require.Equal(t, decodeFrom.Endpoint, eff[0].To.Endpoint, "effects of a valid REGISTER: %+v", eff)
	plan := *eff[0].Plan
	c.Step(t0, Registered{From: decodeFrom, Remote: "agent", Plan: plan})
	acks := sent[*wire.RegisterAck](c.Effects())
	require.Len(t, acks, 1, "after the load: %v", acks)
	require.True(t, acks[0].OK, "after the load: %v", acks)

	other := decodeFrom
	other.Rank, other.Endpoint = 1, "tcp://d:2"
	// Valid but for its model (a name of its own, its regions): refused
	// at once for the compat hash, before any challenge or load.
	bad := &wire.Register{From: other, Compat: "another model", Agent: "other-agent", KV: kv, Aux: aux, State: state}
	require.False(t, c.Step(t0, Received{Msg: bad}).OK, "a REGISTER of another compat hash was passed on to be loaded")
	eff = c.Effects()
	acks = sent[*wire.RegisterAck](eff)
	require.Len(t, eff, 1, "effects of an invalid REGISTER: %+v (want one REGISTER_ACK refusing its compat hash)", eff)
	require.Len(t, acks, 1, "effects of an invalid REGISTER: %+v (want one REGISTER_ACK refusing its compat hash)", eff)
	require.False(t, acks[0].OK, "effects of an invalid REGISTER: %+v (want one REGISTER_ACK refusing its compat hash)", eff)
	require.Contains(t, acks[0].Reason, "compat", "effects of an invalid REGISTER: %+v (want one REGISTER_ACK refusing its compat hash)", eff)
}
