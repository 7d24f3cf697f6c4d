package core

import (
	"fmt"
	"strings"
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
// registered is not unloaded.
func TestChallengeNeverTouchesAnotherRanksAgent(t *testing.T) {
	c := testCore(t, RolePrefill)
	register(t, c, decodeFrom) // its agent: agentOf(decodeFrom)
	other := decodeFrom
	other.Rank, other.Endpoint = 1, "tcp://d:2"
	ch, rest := challengeOf(t, c, testRegister(other, agentOf(decodeFrom), "blob"), t0)
	assert.Nil(t, ch, "challenged under another rank's agent name")
	acks := sent[*wire.RegisterAck](rest)
	require.Len(t, acks, 1)
	assert.False(t, acks[0].OK)
	assert.Contains(t, acks[0].Reason, "is registered here by "+decodeFrom.Peer())

	// Another rank's default name, not registered here yet.
	ch, rest = challengeOf(t, c, testRegister(other, "d-decode-7", "blob"), t0)
	assert.Nil(t, ch, "challenged under another rank's default agent name")
	acks = sent[*wire.RegisterAck](rest)
	require.Len(t, acks, 1)
	assert.Contains(t, acks[0].Reason, "default name of decode/d/7")

	// A name whose challenge another rank passed (its bind under way).
	fourth := decodeFrom
	fourth.Rank, fourth.Endpoint = 4, "tcp://d:4"
	echoChallenge(t, c, testRegister(fourth, "agent-4", "blob 4"), t0)
	ch, rest = challengeOf(t, c, testRegister(other, "agent-4", "blob"), t0)
	assert.Nil(t, ch, "challenged under a name another rank is being bound under")
	acks = sent[*wire.RegisterAck](rest)
	require.Len(t, acks, 1)
	assert.Contains(t, acks[0].Reason, "being registered here by "+fourth.Peer())

	// The registered rank itself sends another blob under its name: the
	// core refuses it at once (a process's blob does not change: not_owner,
	// counted), challenges nothing, and nothing — the refusal, a second
	// one, the time a challenge would expire — unloads the name its
	// registration uses.
	require.Equal(t, decodeFrom.Peer(), c.AgentOwner(agentOf(decodeFrom)))
	refused := c.Stats().LayoutRefused[RefusedNotOwner]
	for i := range 2 {
		ch, rest = challengeOf(t, c, testRegister(decodeFrom, agentOf(decodeFrom), "another blob"), t0)
		assert.Nil(t, ch, "a registered process's changed REGISTER challenged")
		acks = sent[*wire.RegisterAck](rest)
		require.Len(t, acks, 1)
		assert.False(t, acks[0].OK)
		assert.Contains(t, acks[0].Reason, "not_owner")
		assert.Contains(t, acks[0].Reason, "do not change")
		assert.Equal(t, refused+uint64(i)+1, c.Stats().LayoutRefused[RefusedNotOwner])
		c.Step(t0.Add(time.Minute), Tick{})
		for _, e := range append(rest, c.Effects()...) {
			assert.NotEqual(t, EffectUnload, e.Kind, "unloaded %q, a registered rank's agent", e.Remote)
		}
	}
	assert.True(t, c.Registered(decodeFrom.Peer(), decodeFrom.Epoch))

	// The shell refuses a repeat of the registered process (its proof
	// failed after a reload, say): the refusal drops that process's
	// challenge, not the remote its bound registration still uses.
	c.Step(t0.Add(time.Minute), RegisterRefused{From: decodeFrom, Reason: "proof slot 0 holds another value (not_owner)", NotOwner: true})
	for _, e := range c.Effects() {
		assert.NotEqual(t, EffectUnload, e.Kind, "unloaded %q, a registered rank's agent, at its repeat's refusal", e.Remote)
	}
	assert.Equal(t, decodeFrom.Peer(), c.AgentOwner(agentOf(decodeFrom)))
}

// TestDecodeEchoesOnlyItsOwnChallenge: a decode rank echoes a challenge
// for its own identity at once, in a REGISTER to the prefill rank at the
// challenge's endpoint (to every one it is registering with when it knows
// none there); one for another identity (a REGISTER elsewhere named this
// rank's agent) is dropped and counted, and nothing is sent.
func TestDecodeEchoesOnlyItsOwnChallenge(t *testing.T) {
	d := testCore(t, RoleDecode)
	other := Target{Bootstrap: prefillT.Bootstrap, Rank: 1}
	d.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT, other}})
	d.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	d.Step(t0, Resolved{Target: other, Endpoint: "tcp://p:2"})
	d.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{0}, AuxIndex: -1}})
	require.Len(t, sent[*wire.Register](d.Effects()), 2)

	nonce := []byte("0123456789abcdef")
	d.Step(t0, Challenged{For: "decode/attacker/0", Nonce: nonce, EndpointTag: EndpointTag(prefillFrom.Endpoint)})
	assert.Empty(t, d.Effects(), "answered another identity's challenge")
	assert.EqualValues(t, 1, d.Stats().ChallengesIgnored)

	d.Step(t0, Challenged{For: decodeFrom.Peer(), Nonce: nonce, EndpointTag: EndpointTag(prefillFrom.Endpoint)})
	effects := d.Effects()
	regs := sent[*wire.Register](effects)
	require.Len(t, regs, 1, "the echo goes to the challenging rank alone")
	assert.Equal(t, prefillFrom.Endpoint, effects[0].To.Endpoint)
	assert.Equal(t, nonce, regs[0].Echo)
	d.Step(t0, Challenged{For: decodeFrom.Peer(), Nonce: nonce, EndpointTag: EndpointTag(prefillFrom.Endpoint)})
	assert.Empty(t, sent[*wire.Register](d.Effects()), "a repeated challenge sent another REGISTER")

	second := []byte("fedcba9876543210")
	d.Step(t0, Challenged{For: decodeFrom.Peer(), Nonce: second, EndpointTag: EndpointTag("tcp://unknown:9")})
	regs = sent[*wire.Register](d.Effects())
	require.Len(t, regs, 2, "an endpoint it knows by no name: every rank it waits for")
	assert.Equal(t, append(append([]byte(nil), nonce...), second...), regs[0].Echo)
}

// TestRefusedRegistrationDropsItsChallenge: a registration the shell
// refused (its claims, its blob, its proof) drops its challenge and
// unloads its blob; the next REGISTER draws a new nonce.
func TestRefusedRegistrationDropsItsChallenge(t *testing.T) {
	c := testCore(t, RolePrefill)
	msg := testRegister(decodeFrom, "decode-agent", "blob")
	ch, _ := challengeOf(t, c, msg, t0)
	require.NotNil(t, ch)
	c.Step(t0, RegisterRefused{From: decodeFrom, Reason: "agent metadata: refused by the engine"})
	var unloaded []string
	for _, e := range c.Effects() {
		if e.Kind == EffectUnload {
			unloaded = append(unloaded, e.Remote)
		}
	}
	assert.Equal(t, []string{"decode-agent"}, unloaded)
	again, _ := challengeOf(t, c, msg, t0)
	require.NotNil(t, again)
	assert.NotEqual(t, ch.Nonce, again.Nonce)
}

// TestPassedChallengesDoNotFillTheBound: maxChallenges bounds the open
// challenges only; as many registered ranks as that still leave room for
// the next one.
func TestPassedChallengesDoNotFillTheBound(t *testing.T) {
	c := testCore(t, RolePrefill)
	for i := range maxChallenges {
		from := decodeFrom
		from.Rank, from.Endpoint = i, fmt.Sprintf("tcp://d:%d", i)
		echoChallenge(t, c, testRegister(from, fmt.Sprintf("agent-%d", i), "blob"), t0)
	}
	next := decodeFrom
	next.Rank, next.Endpoint = maxChallenges, "tcp://d:next"
	ch, _ := challengeOf(t, c, testRegister(next, "agent-next", "blob"), t0)
	assert.NotNil(t, ch, "a new rank deferred behind passed challenges")
	assert.Zero(t, c.Stats().ChallengesDeferred)
}

// TestChallengeNotifParses: the notification's round trip, and what is not
// one.
func TestChallengeNotifParses(t *testing.T) {
	n := []byte("0123456789abcdef")
	x, ok := ParseChallenge(ChallengeNotif(n, "decode/a:b/3", "tcp://p:1"))
	require.True(t, ok)
	assert.Equal(t, Challenged{For: "decode/a:b/3", Nonce: n, EndpointTag: EndpointTag("tcp://p:1")}, x)
	good := ChallengeNotif(n, "decode/d/0", "tcp://p:1")
	for _, bad := range []string{"kvbc1:", good[:len("kvbc1:")+21] + good[len("kvbc1:")+22:], strings.Replace(good, ":", "", 2), good[:len(good)-len("decode/d/0")],
		strings.Replace(good, EndpointTag("tcp://p:1"), "abc", 1), "kvb1:1:0:aux"} {
		_, ok := ParseChallenge(bad)
		assert.False(t, ok, "%q parsed", bad)
	}
}

// TestChangedRegistrationRefusedAtBind: the registrations proven are the
// core's. Two REGISTERs of one process with different agent metadata both
// pass to be loaded (neither bound yet); the first binds, the second is
// refused at its bind (not_owner: a process's metadata does not change)
// and the first registration stays. A repeat of the bound one is a Repeat
// (its proof need not be read again).
func TestChangedRegistrationRefusedAtBind(t *testing.T) {
	c := testCore(t, RolePrefill)
	first := testRegister(decodeFrom, agentOf(decodeFrom), "blob")
	second := testRegister(decodeFrom, agentOf(decodeFrom), "blob, edited")
	// load passes msg's challenge (when it draws one) and returns the plan
	// its EffectLoadMetadata carries.
	load := func(msg *wire.Register) PeerPlan {
		t.Helper()
		ch, rest := challengeOf(t, c, msg, t0)
		if ch != nil {
			cp := *msg
			cp.Echo = ch.Nonce
			require.True(t, c.Step(t0, Received{Msg: &cp}).OK, "REGISTER %q passed on to be loaded", msg.AgentMD)
			rest = c.Effects()
		}
		var plans []PeerPlan
		for _, e := range rest {
			if e.Kind == EffectLoadMetadata {
				plans = append(plans, *e.Plan)
			}
		}
		require.Len(t, plans, 1, "REGISTER %q's load", msg.AgentMD)
		return plans[0]
	}
	p1, p2 := load(first), load(second)
	assert.False(t, p1.Repeat)
	assert.False(t, p2.Repeat, "nothing bound yet")

	c.Step(t0, Registered{From: decodeFrom, Remote: agentOf(decodeFrom), Plan: p1})
	acks := sent[*wire.RegisterAck](c.Effects())
	require.Len(t, acks, 1)
	require.True(t, acks[0].OK)
	c.Step(t0, Registered{From: decodeFrom, Remote: agentOf(decodeFrom), Plan: p2})
	acks = sent[*wire.RegisterAck](c.Effects())
	require.Len(t, acks, 1)
	assert.False(t, acks[0].OK, "a second registration of the process with other metadata bound")
	assert.Contains(t, acks[0].Reason, "not_owner")
	assert.EqualValues(t, 1, c.Stats().LayoutRefused[RefusedNotOwner])

	assert.True(t, load(first).Repeat, "a repeat of the bound registration")
}
