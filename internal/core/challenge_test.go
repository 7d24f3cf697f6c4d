package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// The agent challenge (challenge.go, docs/PROTOCOL.md "The agent
// challenge"): each rule seen to fail by a mutant in make mutants.

// challengeOf steps msg and returns the challenge it drew (nil: none) and
// the step's other effects.
func challengeOf(t *testing.T, c *Core, msg *wire.Register, now time.Time) (*Challenged, []Effect) {
	t.Helper()
	c.Step(now, Received{Msg: msg})
	var ch *Challenged
	var rest []Effect
	for _, e := range c.Effects() {
		if e.Kind == EffectChallenge {
			require.Equal(t, msg.From.Endpoint, e.To.Endpoint)
			x, ok := ParseChallenge(e.Notif)
			require.True(t, ok, "challenge notification %q", e.Notif)
			ch = &x
			continue
		}
		rest = append(rest, e)
	}
	return ch, rest
}

func testRegister(from wire.From, agent string, md string) *wire.Register {
	kv, aux, state := RegionsOf(simLayout())
	return &wire.Register{From: from, Compat: "sim", Agent: agent, AgentMD: []byte(md), KV: kv, Aux: aux, State: state}
}

func loads(effects []Effect) int {
	n := 0
	for _, e := range effects {
		if e.Kind == EffectLoadMetadata {
			n++
		}
	}
	return n
}

// TestNothingLoadedBeforeTheEcho: a REGISTER's blob is loaded (and its
// proof read through it) only once its sender echoes the nonce sent to
// the blob's agent; a wrong or missing echo only repeats the challenge;
// the nonce is bound to the sender's identity, process and blob — another
// identity's echo, another epoch's, or the echo with another blob does not
// pass.
func TestNothingLoadedBeforeTheEcho(t *testing.T) {
	c := testCore(t, RolePrefill)
	msg := testRegister(decodeFrom, "decode-agent", "blob A")
	ch, rest := challengeOf(t, c, msg, t0)
	require.NotNil(t, ch, "a first REGISTER must draw a challenge")
	assert.Equal(t, decodeFrom.Peer(), ch.For)
	assert.Len(t, ch.Nonce, ChallengeBytes)
	assert.Zero(t, loads(rest), "loaded before the echo")

	wrong := *msg
	wrong.Echo = make([]byte, ChallengeBytes)
	again, rest := challengeOf(t, c, &wrong, t0)
	require.NotNil(t, again, "a wrong echo must draw the challenge again")
	assert.Equal(t, ch.Nonce, again.Nonce, "a repeat sends the same nonce")
	assert.Zero(t, loads(rest), "loaded on a wrong echo")

	other := decodeFrom
	other.Rank, other.Endpoint = 1, "tcp://d:2"
	stolen := testRegister(other, "decode-agent-1", "blob A")
	stolen.Echo = ch.Nonce
	_, rest = challengeOf(t, c, stolen, t0)
	assert.Zero(t, loads(rest), "another identity passed with decode 0's echo")

	swapped := testRegister(decodeFrom, "decode-agent", "blob B")
	swapped.Echo = ch.Nonce
	_, rest = challengeOf(t, c, swapped, t0)
	assert.Zero(t, loads(rest), "the echo passed with another blob than the one challenged")

	// Blob A again: its challenge was voided by blob B's; a fresh one.
	fresh, _ := challengeOf(t, c, msg, t0)
	require.NotNil(t, fresh)
	assert.NotEqual(t, ch.Nonce, fresh.Nonce, "a new challenge reuses an old nonce")
	restarted := *msg
	restarted.From.Epoch++
	restarted.Echo = fresh.Nonce
	_, rest = challengeOf(t, c, &restarted, t0)
	assert.Zero(t, loads(rest), "another process (epoch) passed with the echo")

	// The new process (the old epoch is stale from now on).
	good := *msg
	good.From = restarted.From
	fr, _ := challengeOf(t, c, &good, t0)
	require.NotNil(t, fr)
	good.Echo = append(make([]byte, ChallengeBytes), fr.Nonce...) // among others
	ch2, rest := challengeOf(t, c, &good, t0)
	assert.Nil(t, ch2)
	assert.Equal(t, 1, loads(rest), "the echo did not admit the REGISTER")
	assert.EqualValues(t, 1, c.Stats().ChallengesPassed)

	// A repeat of the same process and blob is not challenged again.
	repeat := *msg
	repeat.From = restarted.From
	_, rest = challengeOf(t, c, &repeat, t0)
	assert.Equal(t, 1, loads(rest))
}

// TestBindNeedsThePassedChallenge: Registered binds only a process whose
// challenge passed; otherwise it is refused, not_owner.
func TestBindNeedsThePassedChallenge(t *testing.T) {
	c := testCore(t, RolePrefill)
	plan, err := c.CheckRegister(testRegister(decodeFrom, "decode-agent", "blob"))
	require.NoError(t, err)
	c.Step(t0, Registered{From: decodeFrom, Remote: "decode-agent", Plan: plan})
	acks := sent[*wire.RegisterAck](c.Effects())
	require.Len(t, acks, 1)
	assert.False(t, acks[0].OK, "bound without a challenge")
	assert.Contains(t, acks[0].Reason, "not_owner")
	assert.False(t, c.Registered(decodeFrom.Peer(), decodeFrom.Epoch))
}

// TestUnechoedChallengeEnds: a challenge not echoed within
// ChallengeTimeout ends at the tick past it — refused (not_owner, to the
// sender, counted) when its sender registered again meanwhile without the
// echo, else forgotten; either way the blob loaded for it is unloaded,
// unless its name is a registered rank's.
func TestUnechoedChallengeEnds(t *testing.T) {
	for _, repeat := range []bool{false, true} {
		c := testCore(t, RolePrefill)
		msg := testRegister(decodeFrom, "forged-agent", "someone else's blob")
		ch, _ := challengeOf(t, c, msg, t0)
		require.NotNil(t, ch)
		if repeat {
			challengeOf(t, c, msg, t0.Add(time.Second))
		}
		c.Step(t0.Add(DefaultChallengeTimeout), Tick{})
		assert.Empty(t, c.Effects(), "ended at its deadline, not past it")
		c.Step(t0.Add(DefaultChallengeTimeout+time.Millisecond), Tick{})
		effects := c.Effects()
		acks := sent[*wire.RegisterAck](effects)
		var unloaded []string
		for _, e := range effects {
			if e.Kind == EffectUnload {
				unloaded = append(unloaded, e.Remote)
			}
		}
		assert.Equal(t, []string{"forged-agent"}, unloaded, "repeat %v", repeat)
		assert.EqualValues(t, 1, c.Stats().ChallengesExpired)
		if !repeat {
			assert.Empty(t, acks, "a sender that fell silent is refused")
			assert.Zero(t, c.Stats().LayoutRefused[RefusedNotOwner])
			continue
		}
		require.Len(t, acks, 1)
		assert.False(t, acks[0].OK)
		assert.Contains(t, acks[0].Reason, "not_owner")
		assert.Contains(t, acks[0].Reason, decodeFrom.Peer())
		assert.EqualValues(t, 1, c.Stats().LayoutRefused[RefusedNotOwner])
	}
}

// TestChallengeNeverTouchesAnotherRanksAgent: a REGISTER naming an agent
// another rank registered here is refused at once (its blob would replace
// that rank's remote); an unechoed challenge under a name a rank
// registered since is not unloaded.
func TestChallengeNeverTouchesAnotherRanksAgent(t *testing.T) {
	c := testCore(t, RolePrefill)
	register(t, c, decodeFrom) // agent "agent"
	other := decodeFrom
	other.Rank, other.Endpoint = 1, "tcp://d:2"
	ch, rest := challengeOf(t, c, testRegister(other, "agent", "blob"), t0)
	assert.Nil(t, ch, "challenged under another rank's agent name")
	acks := sent[*wire.RegisterAck](rest)
	require.Len(t, acks, 1)
	assert.False(t, acks[0].OK)
	assert.Contains(t, acks[0].Reason, "registered here by "+decodeFrom.Peer())

	third := decodeFrom
	third.Rank, third.Endpoint = 2, "tcp://d:3"
	ch, _ = challengeOf(t, c, testRegister(third, "agent-3", "blob 3"), t0)
	require.NotNil(t, ch)
	c.prefillCore.peers[other.Peer()] = &decodePeer{from: other, remote: "agent-3"} // a rank that registered that name since
	c.Step(t0.Add(time.Minute), Tick{})
	for _, e := range c.Effects() {
		assert.NotEqual(t, EffectUnload, e.Kind, "unloaded %q, a registered rank's agent", e.Remote)
	}
}

// TestDecodeEchoesOnlyItsOwnChallenge: a decode rank echoes a challenge
// for its own identity at once, in a REGISTER to each prefill rank it is
// registering with; one for another identity (a REGISTER elsewhere named
// this rank's agent) is dropped and counted, and nothing is sent.
func TestDecodeEchoesOnlyItsOwnChallenge(t *testing.T) {
	d := testCore(t, RoleDecode)
	d.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	d.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	d.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{0}, AuxIndex: -1}})
	require.Len(t, sent[*wire.Register](d.Effects()), 1)

	nonce := []byte("0123456789abcdef")
	d.Step(t0, Challenged{For: "decode/attacker/0", Nonce: nonce})
	assert.Empty(t, d.Effects(), "answered another identity's challenge")
	assert.EqualValues(t, 1, d.Stats().ChallengesIgnored)

	d.Step(t0, Challenged{For: decodeFrom.Peer(), Nonce: nonce})
	regs := sent[*wire.Register](d.Effects())
	require.Len(t, regs, 1, "no REGISTER echoing the challenge")
	assert.Equal(t, nonce, regs[0].Echo)
	d.Step(t0, Challenged{For: decodeFrom.Peer(), Nonce: nonce})
	assert.Empty(t, sent[*wire.Register](d.Effects()), "a repeated challenge sent another REGISTER")
}

// TestChallengeNotifParses: the notification's round trip, and what is not
// one.
func TestChallengeNotifParses(t *testing.T) {
	n := []byte("0123456789abcdef")
	x, ok := ParseChallenge(ChallengeNotif(n, "decode/a:b/3"))
	require.True(t, ok)
	assert.Equal(t, Challenged{For: "decode/a:b/3", Nonce: n}, x)
	for _, bad := range []string{"kvbc1:", "kvbc1:00:decode/d/0", "kvbc1:" + "zz" + "00112233445566778899aabbccddee" + ":d", "kvbc1:00112233445566778899aabbccddeeff:", "kvb1:1:0:aux"} {
		_, ok := ParseChallenge(bad)
		assert.False(t, ok, "%q parsed", bad)
	}
}
