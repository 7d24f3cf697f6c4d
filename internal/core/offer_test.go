package core

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// offerCore is a decode core that pulls through offers, its room 1 (pull)
// waiting for the REGISTER_ACK of prefillFrom (its REGISTER sent).
func offerCore(t *testing.T) *Core {
	t.Helper()
	kv, aux, state := RegionsOf(simLayout())
	cfg := CoreConfig{Role: RoleDecode, Compat: "sim", Layout: simLayout(), Registry: simRegistryConfig(),
		QuarantineTimeout: 30 * time.Second, RegisterRetry: time.Second, Lease: simPullLease, Identity: decodeFrom.Peer(),
		Register: wire.Register{Compat: "sim", Agent: "decode-agent", KV: kv, Aux: aux, State: state, TPSize: 1, Pull: true}}
	c, err := NewCore(cfg)
	require.NoError(t, err)
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1, Pull: true}})
	require.Len(t, sent[*wire.Register](c.Effects()), 1)
	return c
}

// testOffer is prefillFrom's genuine offer.
func testOffer() *wire.PullOffer {
	kv, aux, state := RegionsOf(simLayout())
	return &wire.PullOffer{Agent: "agent-of-p", AgentMD: []byte("blob of agent-of-p"), KV: kv, Aux: aux, State: state, Proof: []byte("seed"), LeaseMillis: 4000}
}

// offerChallenges are the EffectChallengeOffer effects' plans.
func offerChallenges(effects []Effect) (plans []*OfferPlan, notifs []string) {
	for _, e := range effects {
		if e.Kind == EffectChallengeOffer {
			plans, notifs = append(plans, e.Offer), append(notifs, e.Notif)
		}
	}
	return plans, notifs
}

// echoed steps ack, whose offer is new to c: the offer's agent is
// challenged (loaded, nothing proven or read yet), and the REGISTER_ACK
// returned is ack echoing the challenge's nonce, as the offering rank
// sends it once its agent got the notification.
func echoed(t *testing.T, c *Core, ack *wire.RegisterAck) *wire.RegisterAck {
	t.Helper()
	c.Step(t0, Received{Msg: ack})
	effects := c.Effects()
	assert.Empty(t, offerLoads(effects), "an offer loaded before its challenge was echoed")
	plans, notifs := offerChallenges(effects)
	require.Len(t, plans, 1)
	c.Step(t0, OfferChallenged{Plan: plans[0]})
	c.Effects()
	x, ok := ParseChallenge(notifs[0])
	require.True(t, ok)
	require.Equal(t, ack.From.Peer(), x.For)
	e := *ack
	e.Echo = x.Nonce
	return &e
}

func offerLoads(effects []Effect) (plans []*OfferPlan) {
	for _, e := range effects {
		if e.Kind == EffectLoadOffer {
			plans = append(plans, e.Offer)
		}
	}
	return plans
}

// TestOfferChecks: the pull offers a decode rank accepts are the core's
// decisions. A REGISTER_ACK offering nothing, another rank's default agent
// name, regions that make no layout, or an agent another process's
// accepted offer holds is refused at once — the room fails naming why,
// counted, nothing loaded; a sound one is loaded and proven by the shell
// first (EffectLoadOffer: no REQUEST goes before OfferLoaded), another
// offer of the agent meanwhile is left unanswered, a failed proof is a
// refusal, and a repeat of the accepted offer is a Repeat.
func TestOfferChecks(t *testing.T) {
	for _, tc := range []struct {
		what string
		edit func(o *wire.PullOffer) *wire.PullOffer
		want string
	}{
		{"no offer", func(*wire.PullOffer) *wire.PullOffer { return nil }, "does not serve pull"},
		{"another rank's default name", func(o *wire.PullOffer) *wire.PullOffer { o.Agent = "p-prefill-7"; return o }, "not_owner"},
		{"regions that make no layout", func(o *wire.PullOffer) *wire.PullOffer { o.KV = o.KV[:1]; return o }, "its regions"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			c := offerCore(t)
			c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true, Pull: tc.edit(testOffer())}})
			effects := c.Effects()
			assert.Empty(t, offerLoads(effects), "loaded")
			assert.Empty(t, sent[*wire.Request](effects), "REQUEST sent")
			st, _ := c.Status(1)
			require.Equal(t, Failed, st)
			reason, _ := c.Failure(1)
			assert.Contains(t, reason, tc.want)
			assert.Contains(t, reason, prefillFrom.Peer())
			assert.EqualValues(t, 1, c.Stats().OffersRefused)
			assert.Zero(t, c.Sizes().Offers)
		})
	}

	c := offerCore(t)
	ack := echoed(t, c, &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()})
	c.Step(t0, Received{Msg: ack})
	effects := c.Effects()
	plans := offerLoads(effects)
	require.Len(t, plans, 1)
	assert.False(t, plans[0].Repeat)
	assert.Empty(t, sent[*wire.Request](effects), "REQUEST before the offer is proven")

	// Another ACK offering the same agent while it is loaded: left for the
	// REGISTER's repeat.
	c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()}})
	assert.Empty(t, offerLoads(c.Effects()))
	assert.EqualValues(t, 1, c.Stats().OffersDeferred)

	// Proven: accepted, the REGISTER_ACK taken, the REQUEST goes.
	c.Step(t0, OfferLoaded{Plan: plans[0]})
	reqs := sent[*wire.Request](c.Effects())
	require.Len(t, reqs, 1)
	assert.Equal(t, 1, c.Sizes().Offers)
	st, _ := c.Status(1)
	assert.Equal(t, WaitingForInput, st)

	// Another process's offer of the same agent is refused (not_owner).
	other := prefillFrom
	other.Rank, other.Endpoint = 1, "tcp://p:2"
	otherT := Target{Bootstrap: prefillT.Bootstrap, Rank: 1}
	c.Step(t0, CreateReceiver{Room: 2, Targets: []Target{otherT}})
	c.Step(t0, Resolved{Target: otherT, Endpoint: other.Endpoint})
	c.Step(t0, InitReceiver{Room: 2, Spec: RequestSpec{DstPages: []uint32{2}, AuxIndex: -1, Pull: true}})
	c.Effects()
	c.Step(t0, Received{Msg: &wire.RegisterAck{From: other, OK: true, Pull: testOffer()}})
	assert.Empty(t, offerLoads(c.Effects()))
	reason, _ := c.Failure(2)
	assert.Contains(t, reason, "not_owner")
	assert.Contains(t, reason, "is "+prefillFrom.Peer()+"'s")
	assert.Equal(t, 1, c.Sizes().Offers)

	// A failed proof is a refusal naming it.
	c.Step(t0, CreateReceiver{Room: 3, Targets: []Target{otherT}})
	c.Step(t0, InitReceiver{Room: 3, Spec: RequestSpec{DstPages: []uint32{3}, AuxIndex: -1, Pull: true}})
	c.Effects()
	o := testOffer()
	o.Agent = "agent-of-p1"
	c.Step(t0, Received{Msg: echoed(t, c, &wire.RegisterAck{From: other, OK: true, Pull: o})})
	plans = offerLoads(c.Effects())
	require.Len(t, plans, 1)
	c.Step(t0, OfferLoaded{Plan: plans[0], Err: errNotOwnerForTest})
	reason, _ = c.Failure(3)
	assert.Contains(t, reason, errNotOwnerForTest.Error())
	assert.Equal(t, 1, c.Sizes().Offers, "the failed offer not accepted")
}

var errNotOwnerForTest = &testErr{"proof slot 0 holds another process's value (not_owner)"}

type testErr struct{ s string }

func (e *testErr) Error() string { return e.s }

// TestReadGatedByItsOffer: a read carries the remote and layout of the
// accepted offer it goes through. Once the decode rank registers again and
// the same process offers other metadata, that offer is dropped at once —
// before the shell loads the new metadata under the same agent name — so
// the gate right before the read's post refuses it and the room fails
// naming why: nothing is read through metadata not yet proven. A PAGES
// from a process with no accepted offer fails its room.
func TestReadGatedByItsOffer(t *testing.T) {
	script := pullScript[:14] // up to the PAGES delivered: read 1 asked, not posted
	w, n := runScript(pullScriptConfig(), script)
	require.NoError(t, w.err)
	require.Equal(t, len(script), n)
	require.Len(t, w.reads, 1)
	rd := w.reads[0].rd
	prefill := w.procs[0].from
	assert.Equal(t, remoteName(prefill), rd.Remote, "the read names its offer's remote")
	assert.Equal(t, simLayout().Regions, rd.Layout.Regions, "and its layout")

	d := w.procs[1].core
	d.decodeCore.targetAt(prefill.Endpoint).reg = regSent // registering again (as after a STATUS not_registered)
	o := *w.procs[0].core.cfg.Offer
	o.AgentMD = []byte("other metadata")
	d.Step(w.now, Received{Msg: &wire.RegisterAck{From: prefill, OK: true, Pull: &o}})
	plans, _ := offerChallenges(d.Effects()) // its agent challenged, the load under way: not carried out yet
	require.Len(t, plans, 1)
	assert.Zero(t, d.Sizes().Offers, "the replaced offer dropped before the new metadata is loaded")

	w.postRead(w.reads[0].id)
	st, _ := d.Status(7)
	assert.Equal(t, Failed, st)
	reason, _ := d.Failure(7)
	assert.Contains(t, reason, "pull offer was replaced")
	assert.EqualValues(t, 1, d.Stats().ReadsRefused)

	t.Run("no accepted offer", func(t *testing.T) {
		script := pullScript[:13] // the PAGES sent, not delivered
		w, n := runScript(pullScriptConfig(), script)
		require.NoError(t, w.err)
		require.Equal(t, len(script), n)
		d := w.procs[1].core
		clear(d.decodeCore.offers) // (as when a REGISTER_ACK it did not wait for registered it)
		w.deliver(0, 1)
		assert.Empty(t, w.reads)
		reason, _ := d.Failure(7)
		assert.Contains(t, reason, "no accepted pull offer")
	})
}

// TestLateOfferLoadedIsStale (review of 1ffb660): an offer whose process
// retired while it was loaded — a newer epoch heard at the endpoint — is
// not taken when its load ends: the target stays with the newer process,
// no offer of the old one is installed, no REQUEST goes to it. And a
// repeat whose remote was not proven again leaves no accepted offer.
func TestLateOfferLoadedIsStale(t *testing.T) {
	c := offerCore(t)
	c.Step(t0, Received{Msg: echoed(t, c, &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()})})
	plans := offerLoads(c.Effects())
	require.Len(t, plans, 1)
	newer := prefillFrom
	newer.Epoch++
	c.Step(t0, Received{Msg: &wire.Status{From: newer, Room: 99, Status: wire.StatusFailed, Reason: "x"}}) // the newer process heard
	c.Effects()
	stale := c.Stats().StaleEpoch
	c.Step(t0, OfferLoaded{Plan: plans[0]})
	effects := c.Effects()
	assert.Empty(t, sent[*wire.Request](effects), "a REQUEST went to the retired process")
	assert.Zero(t, c.Sizes().Offers, "the retired process's offer installed")
	assert.Equal(t, stale+1, c.Stats().StaleEpoch)

	t.Run("a repeat not proven again", func(t *testing.T) {
		c := offerCore(t)
		ack := echoed(t, c, &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()})
		c.Step(t0, Received{Msg: ack})
		plans := offerLoads(c.Effects())
		require.Len(t, plans, 1)
		c.Step(t0, OfferLoaded{Plan: plans[0]})
		c.Effects()
		require.Equal(t, 1, c.Sizes().Offers)
		c.decodeCore.targetAt(prefillFrom.Endpoint).reg = regSent // registering again
		c.Step(t0, Received{Msg: ack})
		plans = offerLoads(c.Effects())
		require.Len(t, plans, 1)
		require.True(t, plans[0].Repeat)
		c.Step(t0, OfferLoaded{Plan: plans[0], Err: errNotOwnerForTest})
		assert.Zero(t, c.Sizes().Offers, "a repeat whose remote was not proven again stays accepted")
	})
}

// TestOffersOnePerRank (review of 1ffb660): a prefill rank restarted on a
// new port leaves no offer of its earlier process behind: the table holds
// one per prefill rank, whatever its processes' endpoints.
func TestOffersOnePerRank(t *testing.T) {
	c := offerCore(t)
	c.Step(t0, Received{Msg: echoed(t, c, &wire.RegisterAck{From: prefillFrom, OK: true, Pull: testOffer()})})
	plans := offerLoads(c.Effects())
	require.Len(t, plans, 1)
	c.Step(t0, OfferLoaded{Plan: plans[0]})
	c.Effects()
	require.Equal(t, 1, c.Sizes().Offers)

	moved := prefillFrom
	moved.Endpoint, moved.Epoch = "tcp://p:9", prefillFrom.Epoch+1
	c.Step(t0, Resolved{Target: prefillT, Endpoint: moved.Endpoint, Epoch: moved.Epoch})
	c.Effects()
	c.decodeCore.targetAt(moved.Endpoint).reg = regSent // (its REGISTER to the new process)
	o := testOffer()
	o.Agent, o.AgentMD = "agent-of-p-restarted", []byte("the new process's blob") // (another name: the earlier offer's is not replaced by name)
	c.Step(t0, Received{Msg: echoed(t, c, &wire.RegisterAck{From: moved, OK: true, Pull: o})})
	plans = offerLoads(c.Effects())
	require.Len(t, plans, 1)
	c.Step(t0, OfferLoaded{Plan: plans[0]})
	assert.Equal(t, 1, c.Sizes().Offers, "the rank's earlier process's offer kept")
}
