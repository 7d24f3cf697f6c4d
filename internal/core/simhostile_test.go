package core

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Hostile peers in the simulator (issue 49; docs/PROTOCOL.md "Bounds that
// hold against a hostile peer"). Two kinds, each a configuration switch:
//
//   - hostileRenew: decode rank 0 holds a valid identity and misuses it
//     forever — the faults stop, it does not. Its core runs, but what it is
//     offered is never read, its ABORTs and READ_DONEs are withheld, and at
//     every tick (the quiet phase's too) it sends a RENEW for every pull
//     room of the configuration to every prefill rank of the room. The
//     liveness phase's bounds (every room terminal, every published page
//     released: L1, L6) are checked while it keeps going.
//   - intruder: the last decode rank belongs to another decode instance.
//     Up to intrusions times it asks for a room of the other instance
//     (the REQUEST copied from the wire, with its own identity), aborts
//     it, renews it, or says its reads of it are over. Checked on every
//     delivery: a prefill process never holds one room's REQUESTs from two
//     instances, and a foreign ABORT, RENEW or READ_DONE changes nothing
//     of a room bound to another instance.

//   - forger: prefill rank 0 holds a valid identity and, up to intrusions
//     times, answers decode rank 0's registration with an offer under an
//     agent name of its own whose blob names the last decode rank's agent
//     (the confused deputy, pull direction). The offer challenge reaches
//     that bystander, which drops it; the offer is refused when the
//     challenge expires (if the forgery was repeated) or replaced by the
//     rank's genuine offer; acceptOffer fails the run if any offer's
//     proof were read through another process's agent.

// simIntruder is the intruder's decode instance name.
const simIntruder = "intruder"

func (w *simWorld) isHostile(slot int) bool {
	return (w.cfg.hostileRenew || w.cfg.hostileFlood) && slot == w.cfg.prefills
}

func (w *simWorld) isIntruder(slot int) bool {
	return w.cfg.intruder && slot == w.cfg.slots()-1 && !w.isPrefill(slot)
}

// hostileDrops: the hostile decode rank withholds what would end its
// hold on a prefill rank's pages (an ABORT, a READ_DONE).
func (w *simWorld) hostileDrops(slot int, m wire.Message) bool {
	if !w.isHostile(slot) {
		return false
	}
	switch m.(type) {
	case *wire.Abort, *wire.ReadDone:
		w.cov.hit("hostile: ABORT or READ_DONE withheld")
		return true
	}
	return false
}

// hostileRenews: the hostile decode process renews every pull room of the
// configuration with every prefill rank of the room, whatever the room's
// state on either side, right before each tick is enforced (the quiet
// phase's ticks included): the RENEWs are stepped at once, as if each
// came just in time for the lease and the stall deadline it could extend.
func (w *simWorld) hostileRenews() {
	if !w.cfg.hostileRenew {
		w.hostileFlood()
		w.hostilePrefillTick()
		return
	}
	defer w.hostilePrefillTick() // prefill rank 0's, whatever the hostile decode process's state (deferred: after the flood)
	defer w.hostileFlood()
	s := w.cfg.prefills
	p := w.procs[s]
	if p.dead || p.paused {
		return
	}
	for _, r := range w.rooms {
		if !r.pull || !slices.Contains(r.decodes, 0) {
			continue
		}
		for _, pr := range r.prefills {
			if q := w.procs[pr]; w.active(pr) {
				w.cov.hit("hostile: RENEW sent")
				q.core.Step(w.now, Received{&wire.Renew{From: p.from, Room: r.id, At: uint64(w.now.UnixNano())}})
				if st, ok := q.core.Status(r.id); ok && st == Failed {
					w.cov.hit("hostile: RENEW for a room that failed")
				}
				w.effects(pr)
			}
		}
	}
}

// simFloodBase, simFloodIDs: the flood's room ids (fresh at every tick),
// and how many of them each tick — past the flooder's share of the
// tombstone bound (MaxTombstones/8) at its first tick.
const (
	simFloodBase = 1 << 40
	simFloodIDs  = 10
)

// hostileFlood (hostileFlood): the hostile decode process sends every
// live prefill process ABORTs and READ_DONEs for simFloodIDs fresh room
// ids no one else uses and for the rooms of the configuration it is not a
// decode rank of (its own instance's: they fail; another instance's are
// the intruder's), stepped at once. The prefill process's answers to the
// fresh ids (ABORT_ACKs for rooms it has none of) are dropped: it ignores
// them. Checked: the
// flood never makes a prefill process forget another rank's tombstone
// (its early aborts are its own share's), and every honest room still
// ends within its bounds (the liveness phase, while it floods).
func (w *simWorld) hostileFlood() {
	if !w.cfg.hostileFlood {
		return
	}
	s := w.cfg.prefills
	p := w.procs[s]
	if p.dead || p.paused {
		return
	}
	var ids []uint64
	for k := range simFloodIDs {
		ids = append(ids, simFloodBase+uint64(w.floods*simFloodIDs+k))
	}
	w.floods++
	for _, r := range w.rooms {
		if !slices.Contains(r.decodes, 0) {
			ids = append(ids, r.id)
		}
	}
	for pr := range w.cfg.prefills {
		q := w.procs[pr]
		if !w.active(pr) {
			continue
		}
		// The others' tombstones before the flood: it may make the
		// prefill process forget one only where they and the flooder's
		// share fill the bound.
		others, evicted := 0, q.core.reg.evicted
		for _, tb := range q.core.reg.tombs {
			if tb.by != p.from.Peer() {
				others++
			}
		}
		share := max(1, w.cfg.reg.MaxTombstones/8)
		for _, id := range ids {
			w.cov.hit("hostile: ABORT flood sent")
			q.core.Step(w.now, Received{&wire.Abort{From: p.from, Room: id, Reason: "flood"}})
			q.core.Step(w.now, Received{&wire.ReadDone{From: p.from, Room: id, OK: true, Drained: true}})
		}
		if q.core.reg.forgotten > 0 {
			w.cov.hit("hostile: its own early aborts forgotten (its share)")
		}
		if n := q.core.reg.earlyBy[p.from.Peer()]; n > share {
			w.fail("%s keeps %d early aborts of the flooding rank %s, past its share of %d", q.from.Peer(), n, p.from.Peer(), share)
		}
		if q.core.reg.evicted > evicted && others+share < w.cfg.reg.MaxTombstones {
			w.fail("%s forgot %d tombstones past MaxTombstones (%d) under one decode rank's ABORT flood, with %d others': the flood must forget its own early aborts (its share, %d), not others'",
				q.from.Peer(), q.core.reg.evicted-evicted, w.cfg.reg.MaxTombstones, others, share)
		}
		w.effects(pr)
		w.net[pr][s] = slices.DeleteFunc(w.net[pr][s], func(m simMsg) bool {
			a, ok := m.msg.(*wire.AbortAck)
			return ok && a.Room >= simFloodBase
		})
	}
}

// roomInstances are the decode instances whose REQUESTs a prefill core
// holds for room (live or pending).
func roomInstances(c *Core, room uint64) []string {
	var out []string
	if c.prefillCore == nil {
		return nil
	}
	for _, pr := range c.prefillCore.roomRequests(room) {
		if pr.Payload != nil && !slices.Contains(out, pr.Payload.From.Instance) {
			out = append(out, pr.Payload.From.Instance)
		}
	}
	return out
}

// intruderEvents: the intruder's forged messages for the other instance's
// rooms, bounded by intrusions (each is one; at most one of each kind and
// room in flight, so the space stays finite).
func (w *simWorld) intruderEvents(add func(string, func(*simWorld))) {
	if !w.cfg.intruder || w.calm || w.intrusions >= w.cfg.intrusions {
		return
	}
	s := w.cfg.slots() - 1
	if !w.active(s) {
		return
	}
	rank := s - w.cfg.prefills
	w.intruderRegisters(add)
	for _, r := range w.rooms {
		if slices.Contains(r.decodes, rank) {
			continue
		}
		for _, pr := range r.prefills {
			if w.procs[pr].dead {
				continue
			}
			r, pr := r, pr
			forge := func(kind string, mk func() wire.Message) {
				add(fmt.Sprintf("intruder %s room %d at %d", kind, r.id, pr), func(w *simWorld) {
					w.intrusions++
					p := w.procs[s]
					w.net[s][pr] = append(w.net[s][pr], simMsg{from: p.from, to: w.procs[pr].endpoint, msg: mk()})
				})
			}
			forge("asks for", func() wire.Message {
				pages, aux := simDests(r)
				return &wire.Request{Room: r.id, DstPages: pages, AuxIndex: aux, Required: r.req(), Pull: r.pull, At: uint64(w.now.UnixNano())}
			})
			forge("aborts", func() wire.Message { return &wire.Abort{Room: r.id, Reason: "forged"} })
			if r.pull {
				forge("renews", func() wire.Message { return &wire.Renew{Room: r.id, At: uint64(w.now.UnixNano())} })
				forge("ends its reads of", func() wire.Message { return &wire.ReadDone{Room: r.id, OK: true, Drained: true} })
			}
		}
	}
}

// foreign reports whether a message from `from` names a room that
// prefill slot dst holds for another decode instance.
func (w *simWorld) foreign(dst int, from wire.From, room uint64) bool {
	if !w.isPrefill(dst) || from.Instance != simIntruder {
		return false
	}
	inst := roomInstances(w.procs[dst].core, room)
	return len(inst) > 0 && !slices.Contains(inst, simIntruder)
}

// roomSnapshot is what a foreign message must not change of a room on a
// prefill core.
type roomSnapshot struct {
	live     bool
	status   Poll
	requests int
	leases   string
}

func snapshotRoom(c *Core, room uint64) roomSnapshot {
	var s roomSnapshot
	if rm, ok := c.reg.rooms[room]; ok {
		s.live, s.status, s.requests = true, rm.status, len(rm.requests)
	} else if p, ok := c.reg.pending[room]; ok {
		s.requests = len(p.requests)
	}
	if h := c.prefillCore.pulls[room]; h != nil {
		for _, pp := range h.peers {
			s.leases += fmt.Sprintf("%s/%d open=%v closed=%v end=%v;", pp.key, pp.epoch, pp.open, pp.closed, pp.leaseEnd.UnixNano())
		}
	}
	return s
}

// checkForeign steps a foreign message on prefill slot dst and checks it
// changed nothing of the room, and was counted.
func (w *simWorld) checkForeign(dst int, msg wire.Message, room uint64, step func()) {
	c := w.procs[dst].core
	before, refused := snapshotRoom(c, room), c.stats.ForeignRefused
	step()
	if after := snapshotRoom(c, room); after != before {
		w.fail("room %d: %s's %v from another decode instance changed the room on %s: %+v → %+v",
			room, simIntruder, msg.Type(), w.procs[dst].from.Peer(), before, after)
		return
	}
	switch msg.(type) {
	case *wire.Request, *wire.Abort:
		registered := false
		for _, p := range c.prefillCore.peers {
			registered = registered || p.from.Instance == simIntruder
		}
		if _, isReq := msg.(*wire.Request); isReq && !registered {
			// An intruder not registered here (its forged REGISTER is
			// never bound) is refused before the room is looked at.
			w.cov.hit("intruder refused: REQUEST unregistered")
			return
		}
		if c.stats.ForeignRefused == refused {
			w.fail("room %d: %s's %v for another instance's room was not counted as refused on %s", room, simIntruder, msg.Type(), w.procs[dst].from.Peer())
		}
	}
	w.cov.hit(fmt.Sprintf("intruder refused: %v", msg.Type()))
}

// checkOneInstance: a prefill core holds each room's REQUESTs from one
// decode instance.
func (w *simWorld) checkOneInstance(dst int, room uint64) {
	if inst := roomInstances(w.procs[dst].core, room); len(inst) > 1 {
		w.fail("room %d: %s holds REQUESTs from decode instances %v", room, w.procs[dst].from.Peer(), inst)
	}
}

// simHoldBound is the hard bound on a pull room's hold on its published
// pages, from its last publish, whatever RENEWs come (docs/PROTOCOL.md
// "RENEW"): the stall deadline, which a RENEW does not move, then the
// failed room's drain deadline, then the quarantine.
func (w *simWorld) simHoldBound() time.Duration {
	return 2*w.cfg.reg.StallTimeout + w.cfg.quarantine
}

// checkHoldBound: with a hostile decode rank renewing, no live prefill
// process holds a pull room's pages past simHoldBound after its last
// publish, or after the faults stopped if that was later (t0: a paused
// process, or a time jump, moves no deadline while the faults go on) —
// plus the clock's grain: the failure, the settling and the release each
// come at the first tick past their deadline, at most one quiet step
// (5 s) late.
func (w *simWorld) checkHoldBound(t0 time.Time) {
	if !w.cfg.hostileRenew {
		return
	}
	for s, p := range w.procs {
		pc := p.core.prefillCore
		if pc == nil || !w.active(s) {
			continue
		}
		for _, id := range slices.Sorted(maps.Keys(pc.pulls)) {
			h := pc.pulls[id]
			if h.published.IsZero() {
				continue
			}
			if from := later(h.published, t0); w.now.Sub(from) > w.simHoldBound()+3*5*simQuietStep {
				w.fail("room %d: %s still holds its published pages %v after its last publish (or the faults' end) while a decode rank renews (bound %v)",
					id, p.from.Peer(), w.now.Sub(from), w.simHoldBound())
			}
		}
	}
}

// TestSimRandomHostile: swarm runs with decode rank 0 hostile (it renews
// every pull room forever and never reads, nor aborts, nor ends its reads),
// every fault class available as in TestSimRandom; the liveness phase —
// every room terminal, every published page released within the hold's
// bound from its last publish — is checked while it keeps renewing.
func TestSimRandomHostile(t *testing.T) {
	t.Parallel() // CPU-bound: alongside the other checkers
	cfg := simRandomConfig()
	cfg.hostileRenew, cfg.hostileFlood = true, true
	total := newSimCoverage()
	const n = 50 / raceSeeds // (make sim's SIM_SEEDS is TestSimRandom's)
	for seed := uint64(0); seed < uint64(n); seed++ {
		run, err := runRandom(cfg, seed, simRandomSteps)
		require.NoError(t, err)
		total.add(run.cov)
	}
	if raceOn {
		return // the coverage of all 50: make test-checkers
	}
	for _, what := range []string{"hostile: RENEW sent", "hostile: read never posted", "hostile: RENEW for a room that failed", "source released forced",
		"hostile: ABORT flood sent", "hostile: its own early aborts forgotten (its share)"} {
		assert.Positive(t, total.hits[what], "the hostile swarm never reached %q (reached: %v)", what, total.hits)
	}
	t.Logf("%d hostile swarm runs: %d RENEWs from the hostile rank, %d pull sources released (%d forced)", n,
		total.hits["hostile: RENEW sent"], total.hits["source released"]+total.hits["source released forced"], total.hits["source released forced"])
}

// forgerEvents: prefill rank 0 answers decode rank 0 with a forged offer
// (forger), as a message on their link, while decode rank 0 waits for its
// REGISTER_ACK.
func (w *simWorld) forgerEvents(add func(string, func(*simWorld))) {
	if !w.cfg.forger || w.calm || w.intrusions >= w.cfg.intrusions {
		return
	}
	d, v := w.cfg.prefills, w.cfg.slots()-1
	if !w.active(0) || !w.active(d) || d == v || w.procs[v].dead {
		return
	}
	tg := w.procs[d].core.decodeCore.targetAt(w.procs[0].endpoint)
	if tg == nil || tg.reg != regSent {
		return
	}
	add("forger offers the last decode rank's agent at 1", func(w *simWorld) {
		w.intrusions++
		w.cov.hit("forger: offer naming another process's agent sent")
		p := w.procs[0]
		o := *p.core.cfg.Offer
		o.Agent, o.AgentMD = "forged|"+p.from.Peer(), []byte(remoteName(w.procs[v].from))
		w.net[0][d] = append(w.net[0][d], simMsg{from: p.from, to: w.procs[d].endpoint, msg: &wire.RegisterAck{OK: true, Pull: &o}})
	})
}

// forgotOwn: the prefill process may have forgotten an honest rank's early
// abort for that rank's share. Outside hostileFlood any forgotten one
// counts (a random run's honest rank may abort many rooms early); with a
// flooder, only where an honest rank itself kept its whole share here
// (noteShares): the flood's own are never another rank's.
func (w *simWorld) forgotOwn(p *simProc) bool {
	return p.core.reg.forgotten > 0 && (!w.cfg.hostileFlood || p.shareFull)
}

// noteShares records that a rank other than the flooder kept its whole
// share of early aborts on p (after any event: one more forgets its
// oldest).
func (w *simWorld) noteShares(p *simProc) {
	if !w.cfg.hostileFlood || p.shareFull {
		return
	}
	flooder := w.procs[w.cfg.prefills].from.Peer()
	for by, n := range p.core.reg.earlyBy {
		if by != flooder && n >= max(1, w.cfg.reg.MaxTombstones/8) {
			p.shareFull = true
		}
	}
}

// simLate is a message a hostile process holds until due.
type simLate struct {
	src, dst int
	due      time.Time
	msg      simMsg
}

// hostileNotifs are notifications with hostile ranges for a room's
// source uid (ParseNotif reads each; the core must refuse each, and count
// it, never count it as data): a chunk id and a total past the bound, a
// span of more layers than the bound, an empty layer range, a layer past
// its span, the positions of chunk 0 contradicted, and a uid that is no
// source of the room.
func hostileNotifs(room uint64, uid, sources int) []string {
	return []string{
		fmt.Sprintf("kvb1:%d:%d:%d:0:0:1:0:1:0:1", room, uid, maxNotifChunks),
		fmt.Sprintf("kvb1:%d:%d:0:%d:0:1:0:1:0:1", room, uid, maxNotifChunks+1),
		fmt.Sprintf("kvb1:%d:%d:0:0:0:1:0:1:0:%d", room, uid, maxNotifLayers+1),
		fmt.Sprintf("kvb1:%d:%d:0:0:0:1:1:1:0:%d", room, uid, simLayers),
		fmt.Sprintf("kvb1:%d:%d:0:0:0:1:0:%d:0:%d", room, uid, simLayers+1, simLayers),
		fmt.Sprintf("kvb1:%d:%d:0:0:%d:1:0:1:0:%d", room, uid, 1<<20, simLayers),
		fmt.Sprintf("kvb1:%d:%d:0:0:0:1:0:1:0:1", room, sources+3),
	}
}

// hostilePages are PAGES with hostile ranges: an empty layer range, a
// lease stamp this decode rank never sent, a chunk past the bound.
func hostilePages(from wire.From, room uint64) []*wire.Pages {
	return []*wire.Pages{
		{From: from, Room: room, Lo: 1, Hi: 1, SpanLo: 0, SpanHi: simLayers, Aux: -1, LeaseMillis: 1000},
		{From: from, Room: room, Lo: 0, Hi: 1, SpanLo: 0, SpanHi: simLayers, Aux: -1, At: 12345, LeaseMillis: 1000},
		{From: from, Room: room, Chunk: wire.MaxChunks, Lo: 0, Hi: 1, SpanLo: 0, SpanHi: 1, Aux: -1, LeaseMillis: 1000},
	}
}

// sourcesData is what a decode room counted as landed, per source.
func sourcesData(c *Core, room uint64) string {
	rm, ok := c.reg.rooms[room]
	if !ok || rm.dec == nil {
		return ""
	}
	out := fmt.Sprint(rm.status, ";")
	for _, s := range rm.dec.sources {
		out += fmt.Sprintf("%d full=%d total=%d aux=%v span=%d-%d legacy=%v:", s.uid, s.full, s.total, s.aux, s.spanLo, s.spanHi, s.legacy)
		for _, k := range slices.Sorted(maps.Keys(s.chunks)) {
			cs := s.chunks[k]
			out += fmt.Sprintf(" %d@%d+%d/%d%v", k, cs.off, cs.n, cs.left, cs.got)
		}
		out += ";"
	}
	return out
}

// hostilePrefillTick: prefill rank 0 releases the PONGs it held past the
// probe timeout (latePongs), then (hostilePrefill) sends every live decode process, for
// every room of the configuration, hostileNotifs (under its own uid where
// it is a source of the room) and, for pull rooms, hostilePages, each
// stepped at once. Checked: a hostile notification changes nothing a
// decode room counted as landed and is counted (BadNotifs) where the room
// is live; a hostile PAGES posts no read (it is refused, and a room it is
// a source of fails: PullRefused).
func (w *simWorld) hostilePrefillTick() {
	w.late = slices.DeleteFunc(w.late, func(l simLate) bool {
		if w.now.Before(l.due) {
			return false
		}
		w.net[l.src][l.dst] = append(w.net[l.src][l.dst], l.msg)
		w.cov.hit("hostile: PONG sent late")
		return true
	})
	if !w.cfg.hostilePrefill {
		return
	}
	h := w.procs[0]
	if h.dead || h.paused {
		return
	}
	for s := w.cfg.prefills; s < w.cfg.slots(); s++ {
		d := w.procs[s]
		if !w.active(s) {
			continue
		}
		for _, r := range w.rooms {
			uid := slices.Index(r.prefills, 0)
			if uid < 0 {
				uid = len(r.prefills) // no source of the room: a uid it has none of
			}
			for _, n := range hostileNotifs(r.id, uid, len(r.prefills)) {
				in, ok := ParseNotif(n)
				if !ok {
					w.fail("hostile notification %q does not parse: it tests nothing", n)
					continue
				}
				before, bad := sourcesData(d.core, r.id), d.core.stats.BadNotifs
				rm := d.core.reg.rooms[r.id]
				counts := rm != nil && rm.dec != nil && rm.status != Success
				if counts && !r.pull && in.UID < len(r.prefills) && rm.dec.sources[in.UID].sent {
					w.cov.hit("hostile: notification from a push source refused")
				}
				d.core.Step(w.now, in)
				if after := sourcesData(d.core, r.id); after != before {
					w.fail("room %d: %s counted the hostile notification %q from %s as data: %s → %s", r.id, d.from.Peer(), n, h.from.Peer(), before, after)
				}
				if counts && d.core.stats.BadNotifs != bad+1 {
					w.fail("room %d: %s did not count the hostile notification %q as bad (%d → %d)", r.id, d.from.Peer(), n, bad, d.core.stats.BadNotifs)
				}
				w.cov.hit("hostile: notification with hostile ranges sent")
				if counts {
					w.cov.hit("hostile: notification refused on a live room")
				}
			}
			if !r.pull {
				continue
			}
			for _, pg := range hostilePages(h.from, r.id) {
				refused := d.core.stats.PullRefused
				if rm := d.core.reg.rooms[r.id]; rm != nil && rm.dec != nil && !rm.status.Terminal() && slices.ContainsFunc(rm.dec.sources, func(s *source) bool { return s.sent }) {
					w.cov.hit("hostile: PAGES from a source refused")
				}
				d.core.Step(w.now, Received{pg})
				for _, e := range d.core.out {
					if e.Kind == EffectRead && e.Room == r.id {
						w.fail("room %d: %s posted a read for hostile PAGES %+v from %s", r.id, d.from.Peer(), *pg, h.from.Peer())
					}
				}
				if d.core.stats.PullRefused == refused {
					w.fail("room %d: %s did not refuse hostile PAGES %+v from %s", r.id, d.from.Peer(), *pg, h.from.Peer())
				}
				w.cov.hit("hostile: PAGES with hostile ranges refused")
			}
			w.effects(s)
		}
		w.effects(s)
	}
}
