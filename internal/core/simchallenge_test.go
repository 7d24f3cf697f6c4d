package core

import (
	"fmt"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// The agent challenge in the simulator (challenge.go). A blob is the name
// of the agent it names (remoteName: the process's endpoint and epoch), so
// a challenge goes to the process of that name — if it is still alive —
// as a data-plane notification: delivered within the prefill's step (with
// the echo), unless regWindow makes it an event of its own. bind fails the run if a
// prefill process ever loads a blob naming another process's agent than
// its REGISTER's sender's. The intruder (simhostile_test.go) also sends a
// REGISTER under its own identity whose blob names decode rank 0's agent:
// under its own agent name, the challenge reaches the victim, which drops
// it, and the registration is refused when the challenge expires (the
// blob unloaded); under the victim's agent name, it is refused at once.

// challenge carries out EffectChallenge: the notification goes to the
// agent the REGISTER's blob names.
func (w *simWorld) challenge(e Effect) {
	reg := e.Msg.(*wire.Register)
	w.cov.hit("agent challenged")
	inc := remoteInc(string(reg.AgentMD))
	if inc < 0 || inc >= len(w.incSlot) {
		w.fail("challenge to agent %q: no such process", reg.AgentMD)
		return
	}
	s := w.incSlot[inc]
	d := w.procs[s]
	if d == nil || d.dead || d.inc != inc {
		w.cov.hit("challenge to a gone agent")
		return
	}
	if w.cfg.regWindow || d.paused {
		d.notifs = append(d.notifs, e.Notif) // read when it runs again
		w.cov.hit("challenge in flight")
		return
	}
	// Delivered within the prefill's step, and the REGISTERs echoing it
	// too where nothing waits ahead of them on their link (the round trip
	// as one event, so the state space grows by little; regWindow
	// explores its interleavings).
	before := make([]int, w.cfg.prefills)
	for pr := range before {
		before[pr] = len(w.net[s][pr])
	}
	w.deliverChallenge(s, e.Notif)
	for pr := range before {
		if q := w.net[s][pr]; before[pr] == 0 && len(q) == 1 {
			if r, ok := q[0].msg.(*wire.Register); ok && len(r.Echo) > 0 {
				w.deliver(s, pr)
			}
		}
	}
}

// challengeOffer carries out EffectChallengeOffer on decode slot s: the
// agent the offer names is loaded (OfferChallenged) and its process gets
// the notification — within the decode's step (with the REGISTER_ACK
// echoing it, where nothing waits ahead of it on its link), unless
// regWindow makes it an event of its own or that process is paused.
func (w *simWorld) challengeOffer(s int, e Effect) {
	w.cov.hit("offer challenged")
	p := w.procs[s]
	p.core.Step(w.now, OfferChallenged{Plan: e.Offer})
	w.effects(s)
	inc := remoteInc(string(e.Offer.Ack.Pull.AgentMD))
	if inc < 0 || inc >= len(w.incSlot) {
		w.fail("offer challenge to agent %q: no such process", e.Offer.Ack.Pull.AgentMD)
		return
	}
	ts := w.incSlot[inc]
	q := w.procs[ts]
	if q == nil || q.dead || q.inc != inc {
		w.cov.hit("offer challenge to a gone agent")
		return
	}
	if w.cfg.regWindow || q.paused {
		q.notifs = append(q.notifs, e.Notif)
		w.cov.hit("offer challenge in flight")
		return
	}
	before := len(w.net[ts][s])
	w.deliverChallenge(ts, e.Notif)
	if q := w.net[ts][s]; before == 0 && len(q) == 1 {
		if a, ok := q[0].msg.(*wire.RegisterAck); ok && len(a.Echo) > 0 {
			w.deliver(ts, s)
		}
	}
}

// deliverChallenge steps a challenge notification into slot s.
func (w *simWorld) deliverChallenge(s int, nt string) {
	p := w.procs[s]
	x, ok := ParseChallenge(nt)
	if !ok {
		w.fail("bad challenge notification %q", nt)
		return
	}
	ignored, closed := p.core.stats.ChallengesIgnored, p.core.stats.ClosedRegisters
	p.core.Step(w.now, x)
	if p.core.stats.ClosedRegisters > closed {
		w.cov.hit("offer challenge not echoed by a closed rank")
		w.effects(s)
		return
	}
	role := "decode"
	if w.isPrefill(s) {
		role = "prefill"
	}
	if p.core.stats.ChallengesIgnored > ignored {
		if x.For == p.from.Peer() {
			w.fail("%s dropped a challenge for itself", p.from.Peer())
		}
		w.cov.hit("challenge for another identity dropped (" + role + ")")
	} else {
		w.cov.hit("challenge echoed (" + role + ")")
	}
	w.effects(s)
}

// intruderRegisters: the intruder REGISTERs, under its own identity, with
// a blob naming decode rank 0's agent (one per prefill rank, bounded by
// intrusions).
func (w *simWorld) intruderRegisters(add func(string, func(*simWorld))) {
	s, v := w.cfg.slots()-1, w.cfg.prefills
	if v == s || !w.active(v) {
		return
	}
	for pr := range w.cfg.prefills {
		if w.procs[pr].dead {
			continue
		}
		// Under its own agent name (challenged: the victim drops it) and
		// under the victim's (refused at once: that name is the victim's).
		for _, own := range []bool{true, false} {
			what := "its own name"
			if !own {
				what = "decode 0's name"
			}
			add(fmt.Sprintf("intruder registers decode 0's agent under %s at %d", what, pr), func(w *simWorld) {
				w.intrusions++
				blob := remoteName(w.procs[v].from)
				name := blob
				if own {
					name = "forged|" + w.procs[s].from.Peer()
				}
				kv, aux, state := RegionsOf(simLayout())
				// With a guessed echo: a nonce is not guessable.
				msg := &wire.Register{Compat: "sim", Agent: name, AgentMD: []byte(blob), KV: kv, Aux: aux, State: state, TPSize: 1,
					Echo: make([]byte, ChallengeBytes)}
				w.net[s][pr] = append(w.net[s][pr], simMsg{from: w.procs[s].from, to: w.procs[pr].endpoint, msg: msg})
			})
		}
	}
}
