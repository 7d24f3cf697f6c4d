package core

// Pull offers on a decode rank (docs/PROTOCOL.md "Pull"). A prefill rank
// that serves pull sends its offer — its agent's metadata, its regions and
// its proof seed — with an ok REGISTER_ACK. A decode rank that pulls
// (CoreConfig.Register.Pull) reads only through an offer it accepted: the
// core checks what needs no I/O (an offer present, an agent name of the
// sender's own and no other process's accepted one, regions that make a
// layout, a repeat of the accepted offer), then asks the shell to load the
// metadata and prove the memory (EffectLoadOffer); the shell steps
// OfferLoaded, and only then does the core take the REGISTER_ACK. The
// accepted offers are the core's: each read carries the remote and layout
// of the offer it goes through, and the gate right before its post refuses
// a read whose offer was replaced meanwhile.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// offerKey names one prefill process a decode rank reads from.
type offerKey struct {
	endpoint string
	epoch    uint64
}

// acceptedOffer is a prefill process's offer this decode rank proved.
type acceptedOffer struct {
	remote string // its agent, loaded
	owner  string // the offering rank's identity (From.Peer())
	layout kvlayout.Layout
	hash   [32]byte // offerHash: a repeat of the same offer is not proven again
	gen    uint64   // distinct per acceptance: a read names the one it goes through
}

// maxOfferChecks bounds the offers a decode rank loads at once: a
// REGISTER_ACK past it, or one whose agent's offer is being loaded, is left
// unanswered (counted; its REGISTER is sent again).
const maxOfferChecks = 16

// ErrNoOffer: a prefill rank's REGISTER_ACK to a decode rank that pulls
// offers nothing to read.
var ErrNoOffer = errors.New("its REGISTER_ACK offers nothing to read: it does not serve pull (PullLease < 0 there)")

// OfferPlan is what an EffectLoadOffer asks the shell to load and prove:
// the REGISTER_ACK carrying the offer, the layout its regions make, and
// whether it repeats the offer accepted from its process (proven then: the
// shell need load and prove it again only if that remote is no longer
// usable).
type OfferPlan struct {
	Ack    *wire.RegisterAck
	Layout kvlayout.Layout
	Repeat bool
	// Loaded: the offer's challenge, just echoed, loaded this very blob
	// under its agent name, and nothing has loaded that name since (the
	// challenge held it): the shell proves it without loading it again,
	// if that remote is still usable.
	Loaded bool
	hash   [32]byte
}

// OfferLoaded reports an EffectLoadOffer's outcome (decode): Err nil once
// the offer's agent metadata is loaded and its memory proven the offering
// process's — the REGISTER_ACK is then taken —; otherwise the REGISTER_ACK
// is taken as a refusal naming Err.
type OfferLoaded struct {
	Plan *OfferPlan
	Err  error
}

func (OfferLoaded) input() {}

// offerHash hashes an offer's agent, metadata, seed and regions.
func offerHash(o *wire.PullOffer) [32]byte {
	h := sha256.New()
	fmt.Fprintf(h, "%d;%s;%d;%s;%d;%s;", len(o.Agent), o.Agent, len(o.AgentMD), o.AgentMD, len(o.Proof), o.Proof)
	hashRegions(h, o.KV, o.Aux, o.State)
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// pullsOffers: this decode rank reads through prefill ranks' offers (its
// REGISTERs ask for them).
func (c *decodeCore) pullsOffers() bool { return c.cfg.Register.Pull }

// refuseOffer takes the REGISTER_ACK as a refusal naming why its offer
// was not accepted (counted).
func (c *decodeCore) refuseOffer(msg *wire.RegisterAck, err error) {
	c.stats.OffersRefused++
	r := *msg
	r.OK, r.Pull = false, nil
	r.Reason = fmt.Sprintf("pull from prefill %s (%s): %v", msg.From.Peer(), msg.From.Endpoint, err)
	c.onRegisterAck(&r)
}

// onOfferAck takes an ok REGISTER_ACK on a decode rank that pulls: every
// one the core would take — from a target of ours not registered with
// that process yet — has its offer checked, then loaded and proven by the
// shell (EffectLoadOffer) before the core takes it. (Taking one without
// its offer, as when the shell checked only the answers to a REGISTER in
// flight, left that process's reads to fail their rooms: 13 of the
// simulator's 714 successful room sides.)
func (c *decodeCore) onOfferAck(msg *wire.RegisterAck) {
	tg := c.targetAt(msg.From.Endpoint)
	if tg == nil || (tg.reg == regOK && tg.epoch == msg.From.Epoch) {
		c.onRegisterAck(msg) // not a target of ours, or registered already: dropped there, nothing is loaded
		return
	}
	o, from := msg.Pull, msg.From
	if o == nil {
		c.refuseOffer(msg, ErrNoOffer)
		return
	}
	if DefaultNameOwner(o.Agent) != "" {
		if want := fmt.Sprintf("%s-prefill-%d", from.Instance, from.Rank); o.Agent != want {
			c.refuseOffer(msg, fmt.Errorf("not_owner: agent %q has the form of another rank's default name (want %q)", o.Agent, want))
			return
		}
	}
	lay, err := LayoutFrom(o.KV, o.Aux, o.State)
	if err != nil {
		c.refuseOffer(msg, fmt.Errorf("its regions: %w", err))
		return
	}
	key := offerKey{from.Endpoint, from.Epoch}
	plan := &OfferPlan{Ack: msg, Layout: lay, hash: offerHash(o)}
	if cur := c.offers[key]; cur != nil && cur.hash == plan.hash {
		plan.Repeat = true
	} else {
		for _, k := range slices.SortedFunc(maps.Keys(c.offers), cmpOfferKeys) {
			if p := c.offers[k]; p.remote == o.Agent && p.owner != from.Peer() {
				c.refuseOffer(msg, fmt.Errorf("not_owner: agent %q is %s's, whose offer was accepted here", o.Agent, p.owner))
				return
			}
		}
	}
	if c.offerChecks[o.Agent] || len(c.offerChecks) >= maxOfferChecks {
		c.stats.OffersDeferred++ // its REGISTER is sent again
		return
	}
	if !plan.Repeat {
		if c.challengeHolds(o.Agent, key) {
			// Another process's offer challenge loaded that name: left
			// for its REGISTER to be sent again.
			c.stats.OffersDeferred++
			return
		}
		// No read goes through the agent's remote, nor through this
		// endpoint's other processes', while its metadata is replaced:
		// their offers go first (a read already past its gate finishes
		// before the shell loads the new metadata).
		maps.DeleteFunc(c.offers, func(k offerKey, p *acceptedOffer) bool {
			return p.remote == o.Agent || k.endpoint == from.Endpoint
		})
		if !c.offerEchoed(msg, plan, key, tg) {
			return // its agent challenged: the offering rank's next REGISTER_ACK echoes it
		}
		plan.Loaded = true
	}
	c.offerChecks[o.Agent] = true
	c.emit(Effect{Kind: EffectLoadOffer, To: tg.peer(), Offer: plan})
}

// offerChallenge is one offering process's challenge: the offer it was
// sent for, its nonce, and the last REGISTER_ACK that carried the offer
// without the echo (refused if the challenge expires).
type offerChallenge struct {
	agent    string
	hash     [32]byte
	nonce    [ChallengeBytes]byte
	deadline time.Time
	repeats  int
	ack      *wire.RegisterAck
}

// maxOfferChallenges bounds the offer challenges a decode rank keeps (one
// per prefill process it registers with at once).
const maxOfferChallenges = 1024

// OfferChallenged reports an EffectChallengeOffer's outcome (decode): Err
// nil once the offer's agent metadata is loaded and the challenge sent to
// it; otherwise the REGISTER_ACK is taken as a refusal naming Err.
type OfferChallenged struct {
	Plan *OfferPlan
	Err  error
}

func (OfferChallenged) input() {}

// offerEchoed decides whether a new offer may be loaded and proven (the
// proof reads through it, docs/PROTOCOL.md "The agent challenge"): only
// once the REGISTER_ACK carrying it echoes the nonce this rank sent, as a
// data-plane notification, to the agent the offer names — which only that
// process reads. Otherwise the challenge is sent (again: a REGISTER_ACK
// repeated before its echo came sends the same nonce).
func (c *decodeCore) offerEchoed(msg *wire.RegisterAck, plan *OfferPlan, key offerKey, tg *target) bool {
	o := msg.Pull
	ch := c.offerChallenges[key]
	if ch != nil && ch.hash != plan.hash {
		delete(c.offerChallenges, key) // another offer of the process
		if ch.agent != o.Agent {
			c.unloadOffer(ch.agent) // (under the same name the new challenge loads it again)
		}
		ch = nil
	}
	if ch != nil && echoes(msg.Echo, ch.nonce) {
		delete(c.offerChallenges, key) // passed: the proof follows
		c.stats.OfferChallengesPassed++
		return true
	}
	if ch == nil {
		if len(c.offerChallenges) >= maxOfferChallenges {
			c.pruneOfferChallenges(c.now)
		}
		if len(c.offerChallenges) >= maxOfferChallenges {
			c.stats.OffersDeferred++ // its REGISTER is sent again
			return false
		}
		ch = &offerChallenge{agent: o.Agent, hash: plan.hash, deadline: c.now.Add(c.cfg.challengeTimeout())}
		c.offerSeq++
		h := hmac.New(sha256.New, c.cfg.ChallengeKey[:])
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:], c.offerSeq)
		binary.LittleEndian.PutUint64(b[8:], msg.From.Epoch)
		h.Write(b[:])
		h.Write(plan.hash[:])
		h.Write([]byte(key.endpoint))
		copy(ch.nonce[:], h.Sum(nil))
		c.offerChallenges[key] = ch
		c.stats.OfferChallenges++
	} else {
		ch.repeats++
	}
	ch.ack = msg
	c.offerChecks[o.Agent] = true // its load: until OfferChallenged
	c.emit(Effect{Kind: EffectKeepProgress, Keep: min(c.cfg.challengeTimeout(), challengeProgress)})
	c.emit(Effect{Kind: EffectChallengeOffer, To: tg.peer(), Offer: plan, Notif: ChallengeNotif(ch.nonce[:], msg.From.Peer(), c.cfg.Identity)})
	return false
}

// challengeHolds: an offer challenge of another process than key's holds
// the agent name (loaded under it, its echo awaited).
func (c *decodeCore) challengeHolds(agent string, key offerKey) bool {
	for k, ch := range c.offerChallenges {
		if k != key && ch.agent == agent {
			return true
		}
	}
	return false
}

// offerChallenged takes an EffectChallengeOffer's outcome: a failed load
// refuses the offer; a challenge that is no longer awaited (expired,
// replaced, its process gone) has its agent unloaded.
func (c *decodeCore) offerChallenged(in OfferChallenged) {
	if in.Plan == nil || in.Plan.Ack == nil || in.Plan.Ack.Pull == nil {
		return
	}
	p, o := in.Plan, in.Plan.Ack.Pull
	delete(c.offerChecks, o.Agent)
	from := p.Ack.From
	key := offerKey{from.Endpoint, from.Epoch}
	ch := c.offerChallenges[key]
	held := ch != nil && ch.hash == p.hash
	if held && in.Err != nil {
		delete(c.offerChallenges, key)
		held = false
		if c.hear(from) {
			c.refuseOffer(p.Ack, in.Err)
		}
	}
	if !held {
		c.unloadOffer(o.Agent)
	}
}

// unloadOffer asks the shell to drop the remote agent an offer challenge
// loaded, unless a load of that name is still running (its
// OfferChallenged unloads it then). No accepted offer and no other
// challenge can hold the name: a challenge's name is its own from its
// creation (the accepted offers through it dropped, other processes'
// offers of it deferred) — the simulator fails a run that unloads one.
func (c *decodeCore) unloadOffer(agent string) {
	if agent == "" || c.offerChecks[agent] {
		return
	}
	c.emit(Effect{Kind: EffectUnload, Remote: agent})
}

// offerChallengeTick ends each offer challenge unechoed past its
// deadline: the offer is refused (not_owner, counted) if its process
// answered again meanwhile without the echo, else only forgotten.
func (c *decodeCore) offerChallengeTick(now time.Time) {
	for _, key := range slices.SortedFunc(maps.Keys(c.offerChallenges), cmpOfferKeys) {
		ch := c.offerChallenges[key]
		if !now.After(ch.deadline) {
			continue
		}
		delete(c.offerChallenges, key)
		c.stats.OfferChallengesExpired++
		c.unloadOffer(ch.agent)
		if ch.repeats == 0 || ch.ack == nil || !c.hear(ch.ack.From) {
			continue
		}
		c.refuseOffer(ch.ack, fmt.Errorf("not_owner: its process (epoch %d) did not echo, within %v, the challenge sent through the data plane to agent %q, which its offer names: that agent is another process's, or the data plane cannot reach it",
			key.epoch, c.cfg.challengeTimeout(), ch.agent))
	}
}

// pruneOfferChallenges forgets the expired offer challenges.
func (c *decodeCore) pruneOfferChallenges(now time.Time) {
	var gone []string
	maps.DeleteFunc(c.offerChallenges, func(_ offerKey, ch *offerChallenge) bool {
		if now.After(ch.deadline) {
			gone = append(gone, ch.agent)
			return true
		}
		return false
	})
	slices.Sort(gone)
	for _, agent := range gone {
		c.unloadOffer(agent)
	}
}

// offerLoaded takes an EffectLoadOffer's outcome: a proven offer is
// accepted and its REGISTER_ACK taken; a failed one is a refusal.
func (c *decodeCore) offerLoaded(in OfferLoaded) {
	if in.Plan == nil || in.Plan.Ack == nil || in.Plan.Ack.Pull == nil {
		return
	}
	p, o := in.Plan, in.Plan.Ack.Pull
	delete(c.offerChecks, o.Agent)
	from := p.Ack.From
	key := offerKey{from.Endpoint, from.Epoch}
	if !c.hear(from) {
		// Its process retired while the offer was loaded (a newer epoch
		// heard at the endpoint): nothing of it is taken — the target
		// stays with the process that replaced it (counted stale).
		return
	}
	if in.Err != nil {
		if cur := c.offers[key]; cur != nil && cur.remote == o.Agent {
			// A repeat whose remote had to be loaded again and was not
			// proven: no read goes through it.
			delete(c.offers, key)
		}
		c.refuseOffer(p.Ack, in.Err)
		return
	}
	if cur := c.offers[key]; cur == nil || cur.hash != p.hash {
		c.offerGen++
		c.offers[key] = &acceptedOffer{remote: o.Agent, owner: from.Peer(), layout: p.Layout, hash: p.hash, gen: c.offerGen}
	}
	// The rank's earlier processes (elsewhere: a restart on a new port)
	// are gone: their offers go, so the table holds one per prefill rank.
	maps.DeleteFunc(c.offers, func(k offerKey, x *acceptedOffer) bool { return x.owner == from.Peer() && k != key })
	c.onRegisterAck(p.Ack)
}

// readOffer sets the remote and layout of the offer a read from the
// prefill process at endpoint (epoch) goes through; false when that
// process has no accepted offer here.
func (c *decodeCore) readOffer(rd *Read, endpoint string) bool {
	if !c.pullsOffers() {
		return true // (reads without offers: tests of the core alone)
	}
	key := offerKey{endpoint, rd.Epoch}
	o := c.offers[key]
	if o == nil {
		return false
	}
	rd.Remote, rd.Layout, rd.offerAt, rd.offer = o.remote, o.layout, key, o.gen
	return true
}

// offerCurrent: the offer a read goes through is still the accepted one.
func (c *decodeCore) offerCurrent(rd *Read) bool {
	if rd.offer == 0 {
		return true
	}
	o := c.offers[rd.offerAt]
	return o != nil && o.gen == rd.offer
}

func cmpOfferKeys(a, b offerKey) int {
	if a.endpoint != b.endpoint {
		if a.endpoint < b.endpoint {
			return -1
		}
		return 1
	}
	switch {
	case a.epoch < b.epoch:
		return -1
	case a.epoch > b.epoch:
		return 1
	}
	return 0
}
