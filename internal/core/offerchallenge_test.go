package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// The offer challenge (offer.go, challenge.go; docs/PROTOCOL.md "The agent
// challenge"): a decode rank that pulls reads nothing through an offer —
// not even the ownership proof's slots — until the offering rank echoes
// the nonce this rank sent the offer's agent through the data plane. Each
// rule seen to fail by a mutant in make mutants.

// challengedOffer steps ack on c and returns the offer challenge it drew
// (nil: none), its plan, and the step's other effects.
func challengedOffer(t *testing.T, c *Core, ack *wire.RegisterAck, now time.Time) (*Challenged, *OfferPlan, []Effect) {
	t.Helper()
	c.Step(now, Received{Msg: ack})
	var ch *Challenged
	var plan *OfferPlan
	var rest []Effect
	for _, e := range c.Effects() {
		if e.Kind == EffectChallengeOffer {
			require.Equal(t, ack.From.Endpoint, e.To.Endpoint)
			x, ok := ParseChallenge(e.Notif)
			require.True(t, ok, "offer challenge notification %q", e.Notif)
			ch, plan = &x, e.Offer
			continue
		}
		rest = append(rest, e)
	}
	return ch, plan, rest
}

func withEcho(ack *wire.RegisterAck, nonce []byte) *wire.RegisterAck {
	e := *ack
	e.Echo = nonce
	return &e
}

// TestNothingReadThroughAnOfferBeforeItsEcho: an offer's agent is
// challenged — loaded, and sent a notification naming the offering
// identity and this rank's tag, the agent kept progressing so it goes —
// before anything is proven or read through it; an answer without the
// echo, or with a wrong one, or another identity's, only sends the
// challenge again (the same nonce, once its load is over); the echo
// passes to the proof (EffectLoadOffer), and no REQUEST goes before it.
func TestNothingReadThroughAnOfferBeforeItsEcho(t *testing.T) {
	c := offerCore(t)
	ack := &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()}
	ch, plan, rest := challengedOffer(t, c, ack, t0)
	require.NotNil(t, ch, "a new offer must draw a challenge")
	assert.Equal(t, prefillFrom.Peer(), ch.For)
	assert.Equal(t, EndpointTag(decodeFrom.Peer()), ch.EndpointTag, "the challenger's tag: this rank's identity")
	assert.Len(t, ch.Nonce, ChallengeBytes)
	assert.Empty(t, offerLoads(rest), "proven before the echo")
	assert.Empty(t, sent[*wire.Request](rest), "a REQUEST before the echo")
	require.NotEmpty(t, rest)
	assert.Equal(t, EffectKeepProgress, rest[0].Kind, "the agent keeps progressing, so the notification goes")
	assert.Equal(t, 1, c.Sizes().OfferChecks, "its load is under way")

	// An answer while the challenge's load runs: left (counted).
	deferred := c.Stats().OffersDeferred
	again, _, rest := challengedOffer(t, c, ack, t0)
	assert.Nil(t, again, "challenged again while its load runs")
	assert.Empty(t, offerLoads(rest))
	assert.Equal(t, deferred+1, c.Stats().OffersDeferred)

	c.Step(t0, OfferChallenged{Plan: plan})
	assert.Empty(t, c.Effects(), "a challenge still awaited: its agent kept")
	assert.Zero(t, c.Sizes().OfferChecks)

	for _, bad := range [][]byte{nil, make([]byte, ChallengeBytes), append([]byte{}, ch.Nonce[1:]...)} {
		again, p2, rest := challengedOffer(t, c, withEcho(ack, bad), t0)
		require.NotNil(t, again, "echo %x passed", bad)
		assert.Equal(t, ch.Nonce, again.Nonce, "a repeat sends the same nonce")
		assert.Empty(t, offerLoads(rest), "proven on echo %x", bad)
		c.Step(t0, OfferChallenged{Plan: p2})
		c.Effects()
	}

	_, _, rest = challengedOffer(t, c, withEcho(ack, ch.Nonce), t0)
	plans := offerLoads(rest)
	require.Len(t, plans, 1, "the echo must pass to the proof")
	assert.False(t, plans[0].Repeat)
	assert.True(t, plans[0].Loaded, "the challenge's load of this blob not told: the shell loads it a second time")
	assert.Empty(t, sent[*wire.Request](rest), "a REQUEST before the proof")
	assert.EqualValues(t, 1, c.Stats().OfferChallengesPassed)
	c.Step(t0, OfferLoaded{Plan: plans[0]})
	require.Len(t, sent[*wire.Request](c.Effects()), 1)
	st, _ := c.Status(1)
	assert.Equal(t, WaitingForInput, st)

	// A repeat of the accepted offer is not challenged again.
	c.decodeCore.targetAt(prefillFrom.Endpoint).reg = regSent
	again, _, rest = challengedOffer(t, c, ack, t0)
	assert.Nil(t, again, "a repeat of the accepted offer challenged again")
	plans = offerLoads(rest)
	require.Len(t, plans, 1)
	assert.True(t, plans[0].Repeat)
}

// TestOfferChallengeBoundToItsOffer: the nonce is bound to the offering
// process and its offer — another offer of the process (other metadata)
// voids it and draws a new one, the old agent unloaded; the echo of one
// process's challenge does not pass another process's offer.
func TestOfferChallengeBoundToItsOffer(t *testing.T) {
	c := offerCore(t)
	ack := &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()}
	ch, plan, _ := challengedOffer(t, c, ack, t0)
	require.NotNil(t, ch)
	c.Step(t0, OfferChallenged{Plan: plan})
	c.Effects()

	o := testOffer()
	o.Agent, o.AgentMD = "agent-of-p-2", []byte("other metadata")
	other := &wire.RegisterAck{From: prefillFrom, OK: true, Pull: o}
	ch2, _, rest := challengedOffer(t, c, withEcho(other, ch.Nonce), t0)
	require.NotNil(t, ch2, "another offer passed with the first's echo")
	assert.NotEqual(t, ch.Nonce, ch2.Nonce)
	assert.Empty(t, offerLoads(rest))
	var unloaded []string
	for _, e := range rest {
		if e.Kind == EffectUnload {
			unloaded = append(unloaded, e.Remote)
		}
	}
	assert.Equal(t, []string{testOffer().Agent}, unloaded, "the voided challenge's agent unloaded")

	// Another process (a newer epoch at the endpoint) with the echo of
	// the earlier process's challenge.
	newer := prefillFrom
	newer.Epoch++
	_, _, rest = challengedOffer(t, c, &wire.RegisterAck{From: newer, OK: true, Pull: o, Echo: ch2.Nonce}, t0)
	assert.Empty(t, offerLoads(rest), "another process passed with the echo of its predecessor's challenge")
}

// TestUnechoedOfferChallengeEnds: a challenge not echoed within
// ChallengeTimeout refuses the offer (not_owner: the room fails naming
// the agent, counted) if its process answered again meanwhile, else is
// only forgotten (the room waits for its next answer); either way the
// agent it loaded is unloaded, and nothing was proven or read through it.
// A challenge whose load failed refuses the offer at once, naming why.
func TestUnechoedOfferChallengeEnds(t *testing.T) {
	to := DefaultChallengeTimeout
	t.Run("answered again without the echo: refused", func(t *testing.T) {
		c := offerCore(t)
		ack := &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()}
		ch, plan, _ := challengedOffer(t, c, ack, t0)
		require.NotNil(t, ch)
		c.Step(t0, OfferChallenged{Plan: plan})
		_, plan, _ = challengedOffer(t, c, ack, t0.Add(time.Second))
		c.Step(t0, OfferChallenged{Plan: plan})
		c.Effects()
		c.Step(t0.Add(to), Tick{})
		st, _ := c.Status(1)
		require.Equal(t, Bootstrapping, st, "refused before its deadline")
		c.Effects()
		c.Step(t0.Add(to+time.Millisecond), Tick{})
		effects := c.Effects()
		st, _ = c.Status(1)
		require.Equal(t, Failed, st)
		reason, _ := c.Failure(1)
		assert.Contains(t, reason, "not_owner")
		assert.Contains(t, reason, "did not echo")
		assert.Contains(t, reason, testOffer().Agent)
		assert.Contains(t, reason, prefillFrom.Peer())
		assert.EqualValues(t, 1, c.Stats().OffersRefused)
		assert.EqualValues(t, 1, c.Stats().OfferChallengesExpired)
		assert.Empty(t, offerLoads(effects))
		assert.Contains(t, effects, Effect{Kind: EffectUnload, Remote: testOffer().Agent})
	})
	t.Run("silent: forgotten", func(t *testing.T) {
		c := offerCore(t)
		ack := &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()}
		_, plan, _ := challengedOffer(t, c, ack, t0)
		c.Step(t0, OfferChallenged{Plan: plan})
		c.Effects()
		c.Step(t0.Add(to+time.Millisecond), Tick{})
		effects := c.Effects()
		st, _ := c.Status(1)
		assert.Equal(t, Bootstrapping, st, "a silent offerer's room failed by the challenge")
		assert.Zero(t, c.Stats().OffersRefused)
		assert.EqualValues(t, 1, c.Stats().OfferChallengesExpired)
		assert.Contains(t, effects, Effect{Kind: EffectUnload, Remote: testOffer().Agent})
		// Its next answer is challenged afresh.
		ch, _, _ := challengedOffer(t, c, ack, t0.Add(to+time.Second))
		assert.NotNil(t, ch)
	})
	t.Run("its load failed: refused", func(t *testing.T) {
		c := offerCore(t)
		ack := &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()}
		_, plan, _ := challengedOffer(t, c, ack, t0)
		c.Step(t0, OfferChallenged{Plan: plan, Err: errNotOwnerForTest})
		effects := c.Effects()
		st, _ := c.Status(1)
		require.Equal(t, Failed, st)
		reason, _ := c.Failure(1)
		assert.Contains(t, reason, errNotOwnerForTest.Error())
		assert.Contains(t, effects, Effect{Kind: EffectUnload, Remote: testOffer().Agent})
	})
}

// TestOfferChallengeHoldsItsAgent: while one process's offer challenge
// holds an agent name (loaded under it, its echo awaited), another
// process's offer of that name is left for its next answer, not loaded
// over it.
func TestOfferChallengeHoldsItsAgent(t *testing.T) {
	c := offerCore(t)
	ch, plan, _ := challengedOffer(t, c, &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()}, t0)
	require.NotNil(t, ch)
	c.Step(t0, OfferChallenged{Plan: plan})
	c.Effects()

	other := prefillFrom
	other.Rank, other.Endpoint = 1, "tcp://p:2"
	otherT := Target{Bootstrap: prefillT.Bootstrap, Rank: 1}
	c.Step(t0, CreateReceiver{Room: 2, Targets: []Target{otherT}})
	c.Step(t0, Resolved{Target: otherT, Endpoint: other.Endpoint})
	c.Step(t0, InitReceiver{Room: 2, Spec: RequestSpec{DstPages: []uint32{2}, AuxIndex: -1, Pull: true}})
	c.Effects()
	deferred := c.Stats().OffersDeferred
	ch2, _, rest := challengedOffer(t, c, &wire.RegisterAck{From: other, OK: true, Pull: testOffer()}, t0)
	assert.Nil(t, ch2, "another process's offer challenged under a held name")
	assert.Empty(t, offerLoads(rest))
	assert.Equal(t, deferred+1, c.Stats().OffersDeferred)
}

// offerPrefill is a prefill core that serves pull with decodeFrom
// registered, asking for its offer.
func offerPrefill(t *testing.T) *Core {
	t.Helper()
	cfg := CoreConfig{Role: RolePrefill, Compat: "sim", Layout: simLayout(), Registry: simRegistryConfig(),
		QuarantineTimeout: 30 * time.Second, RegisterRetry: time.Second, Lease: simPullLease, Identity: prefillFrom.Peer(),
		Offer: testOffer(), OfferProgress: time.Second}
	c, err := NewCore(cfg)
	require.NoError(t, err)
	c.Step(t0, Bound{Endpoint: prefillFrom.Endpoint})
	msg := testRegister(decodeFrom, agentOf(decodeFrom), "blob of d")
	msg.Pull = true
	lay, err := c.CheckRegister(msg)
	require.NoError(t, err)
	lay.Pull = true // (the REGISTER's pull, as its receipt sets it)
	echoChallenge(t, c, msg, t0)
	c.Step(t0, Registered{From: decodeFrom, Remote: agentOf(decodeFrom), Plan: lay})
	acks := sent[*wire.RegisterAck](c.Effects())
	require.Len(t, acks, 1)
	require.NotNil(t, acks[0].Pull)
	assert.Empty(t, acks[0].Echo, "an echo before any challenge")
	return c
}

// TestPrefillEchoesItsOfferChallenge: a prefill rank that gets an offer
// challenge for its identity answers the challenging decode rank's
// registration at once with a REGISTER_ACK echoing it (and every later
// one to that rank); a repeat sends nothing more; a challenge for another
// identity, or to a rank that serves no pull, is dropped, counted, and
// echoed to no one; echoes are forgotten past twice the challenge timeout.
func TestPrefillEchoesItsOfferChallenge(t *testing.T) {
	c := offerPrefill(t)
	nonce := []byte("0123456789abcdef")
	tag := EndpointTag(decodeFrom.Peer())

	c.Step(t0, Challenged{For: "prefill/other/0", Nonce: nonce, EndpointTag: tag})
	assert.Empty(t, sent[*wire.RegisterAck](c.Effects()), "echoed a challenge for another identity")
	assert.EqualValues(t, 1, c.Stats().ChallengesIgnored)
	assert.Nil(t, c.Echo(decodeFrom.Peer()))

	c.Step(t0, Challenged{For: prefillFrom.Peer(), Nonce: nonce, EndpointTag: EndpointTag("decode/else/0")})
	assert.Empty(t, sent[*wire.RegisterAck](c.Effects()), "answered a rank that did not challenge")

	c.Step(t0, Challenged{For: prefillFrom.Peer(), Nonce: nonce, EndpointTag: tag})
	acks := sent[*wire.RegisterAck](c.Effects())
	require.Len(t, acks, 1, "the challenger's registration answered at once")
	assert.True(t, acks[0].OK)
	assert.NotNil(t, acks[0].Pull)
	assert.Equal(t, nonce, acks[0].Echo)
	assert.EqualValues(t, 2, c.Stats().OfferEchoes)

	c.Step(t0, Challenged{For: prefillFrom.Peer(), Nonce: nonce, EndpointTag: tag})
	assert.Empty(t, sent[*wire.RegisterAck](c.Effects()), "a repeat answered again")

	// A later REGISTER of the rank echoes it too.
	msg := testRegister(decodeFrom, agentOf(decodeFrom), "blob of d")
	msg.Pull = true
	lay, err := c.CheckRegister(msg)
	require.NoError(t, err)
	lay.Pull = true
	c.Step(t0, Registered{From: decodeFrom, Remote: agentOf(decodeFrom), Plan: lay})
	acks = sent[*wire.RegisterAck](c.Effects())
	require.Len(t, acks, 1)
	assert.Equal(t, nonce, acks[0].Echo)

	c.Step(t0.Add(2*DefaultChallengeTimeout), Tick{})
	assert.NotNil(t, c.Echo(decodeFrom.Peer()), "forgotten before twice the timeout")
	c.Step(t0.Add(2*DefaultChallengeTimeout+time.Millisecond), Tick{})
	assert.Nil(t, c.Echo(decodeFrom.Peer()), "kept past twice the timeout")

	t.Run("no pull served", func(t *testing.T) {
		c := testCore(t, RolePrefill)
		c.Step(t0, Challenged{For: "", Nonce: nonce, EndpointTag: tag})
		assert.EqualValues(t, 1, c.Stats().ChallengesIgnored)
		assert.Nil(t, c.Echo(decodeFrom.Peer()))
	})
}

// TestPrefillEchoesBounded: the echoes a prefill rank keeps are bounded
// (maxChallenges): past it the oldest goes.
func TestPrefillEchoesBounded(t *testing.T) {
	c := offerPrefill(t)
	nonce := make([]byte, ChallengeBytes)
	for i := range maxChallenges + 10 {
		nonce[0], nonce[1] = byte(i), byte(i>>8)
		c.Step(t0.Add(time.Duration(i)*time.Microsecond), Challenged{For: prefillFrom.Peer(), Nonce: nonce, EndpointTag: EndpointTag(string(rune(i)) + "x")})
	}
	c.Effects()
	assert.Len(t, c.prefillCore.echoes, maxChallenges)
	_, oldest := c.prefillCore.echoes[EndpointTag(string(rune(0))+"x")]
	assert.False(t, oldest, "the oldest echo kept past the bound")
}

// TestOfferChallengeReplacedUnderItsName: another offer of the process
// under the same agent name voids the challenge and draws a new one,
// whose load replaces the blob under that name: nothing is unloaded
// (an unload would race the new challenge's load of the name).
func TestOfferChallengeReplacedUnderItsName(t *testing.T) {
	c := offerCore(t)
	ch, plan, _ := challengedOffer(t, c, &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()}, t0)
	require.NotNil(t, ch)
	c.Step(t0, OfferChallenged{Plan: plan})
	c.Effects()
	o := testOffer()
	o.AgentMD = []byte("other metadata of the same agent")
	ch2, _, rest := challengedOffer(t, c, &wire.RegisterAck{From: prefillFrom, OK: true, Pull: o}, t0)
	require.NotNil(t, ch2, "another offer of the process not challenged")
	assert.NotEqual(t, ch.Nonce, ch2.Nonce)
	assert.NotContains(t, rest, Effect{Kind: EffectUnload, Remote: o.Agent}, "the name unloaded while its new challenge loads it")
}

// TestOfferChallengeExpiresDuringItsLoad: a challenge that expires while
// the shell still loads its blob leaves the name alone until that load
// ends (OfferChallenged), then unloads it.
func TestOfferChallengeExpiresDuringItsLoad(t *testing.T) {
	c := offerCore(t)
	ch, plan, _ := challengedOffer(t, c, &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()}, t0)
	require.NotNil(t, ch)
	c.Step(t0.Add(DefaultChallengeTimeout+time.Millisecond), Tick{})
	assert.NotContains(t, c.Effects(), Effect{Kind: EffectUnload, Remote: testOffer().Agent}, "unloaded while its load runs")
	assert.EqualValues(t, 1, c.Stats().OfferChallengesExpired)
	c.Step(t0.Add(DefaultChallengeTimeout+time.Millisecond), OfferChallenged{Plan: plan})
	assert.Contains(t, c.Effects(), Effect{Kind: EffectUnload, Remote: testOffer().Agent}, "the expired challenge's blob never unloaded")
}
