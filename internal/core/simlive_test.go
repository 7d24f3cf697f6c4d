package core

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
)

// ---- what the runs reached ---------------------------------------------

// simCoverage counts what explorations and random runs reached, so tests
// can assert it rather than hope for it. It is not part of a world's state.
type simCoverage struct {
	hits     map[string]int
	outcomes map[[2]uint64]Poll // (incarnation, room) → terminal status
	success  int
	failed   int
	reasons  map[string]int // failure reasons, by their first words
	once     map[string]bool
}

func newSimCoverage() *simCoverage {
	return &simCoverage{hits: map[string]int{}, outcomes: map[[2]uint64]Poll{}, reasons: map[string]int{}, once: map[string]bool{}}
}

// hitOnce counts what under a key the first time that key is seen.
func (c *simCoverage) hitOnce(key, what string) {
	if c != nil && !c.once[key] {
		c.once[key] = true
		c.hits[what]++
	}
}

func (c *simCoverage) hit(what string) {
	if c != nil {
		c.hits[what]++
	}
}

func (c *simCoverage) outcome(inc int, room uint64, st Poll, reason string) {
	k := [2]uint64{uint64(inc), room}
	if _, ok := c.outcomes[k]; ok {
		return
	}
	c.outcomes[k] = st
	if st == Success {
		c.success++
		return
	}
	c.failed++
	f := strings.Fields(reason)
	c.reasons[strings.Join(f[:min(3, len(f))], " ")]++
}

func (c *simCoverage) add(o *simCoverage) {
	for k, v := range o.hits {
		c.hits[k] += v
	}
	for k, v := range o.reasons {
		c.reasons[k] += v
	}
	c.success += o.success
	c.failed += o.failed
}

// ---- every table, counted ----------------------------------------------

// simTables counts every map and slice of a core's state by reflection —
// the registry's, the shared base's and the role's, and the maps held in
// their entries one level down (a target's owed ABORTs, the room index's
// sets) — so a table added later is counted without anyone listing it.
func simTables(c *Core) map[string]int {
	out := make(map[string]int, 24)
	walk := func(prefix string, v reflect.Value) {
		v = v.Elem()
		for _, f := range structFields(v.Type()) {
			fv := v.Field(f.index)
			switch f.kind {
			case reflect.Map:
				out[prefix+f.name] += fv.Len()
				if f.nested == nil {
					continue
				}
				it := fv.MapRange()
				for it.Next() {
					e := it.Value()
					if e.Kind() == reflect.Map {
						out[prefix+f.name+"[]"] += e.Len()
						continue
					}
					if e.Kind() == reflect.Pointer {
						e = e.Elem()
					}
					for _, g := range f.nested {
						out[prefix+f.name+"[]."+g.name] += e.Field(g.index).Len()
					}
				}
			case reflect.Slice:
				out[prefix+f.name] += fv.Len()
			}
		}
	}
	walk("", reflect.ValueOf(c.base))
	walk("reg.", reflect.ValueOf(c.reg))
	if c.prefillCore != nil {
		walk("", reflect.ValueOf(c.prefillCore))
	}
	if c.decodeCore != nil {
		walk("", reflect.ValueOf(c.decodeCore))
	}
	return out
}

// simField is a table field of a core struct (a map or slice), with the
// map fields of its entries (one level down).
type simField struct {
	index  int
	name   string
	kind   reflect.Kind
	nested []simField // nil: entries hold no map, or are maps themselves (then counted as name[])
}

var simFieldCache sync.Map // reflect.Type → []simField

// structFields lists t's table fields (cfg and the effects buffer left
// out), computed once per type.
func structFields(t reflect.Type) []simField {
	if fs, ok := simFieldCache.Load(t); ok {
		return fs.([]simField)
	}
	var fs []simField
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if sf.Name == "cfg" || sf.Name == "out" {
			continue
		}
		f := simField{index: i, name: sf.Name, kind: sf.Type.Kind()}
		if f.kind != reflect.Map && f.kind != reflect.Slice {
			continue
		}
		if f.kind == reflect.Map {
			e := sf.Type.Elem()
			if e.Kind() == reflect.Pointer {
				e = e.Elem()
			}
			switch e.Kind() {
			case reflect.Map:
				f.nested = []simField{}
			case reflect.Struct:
				for j := 0; j < e.NumField(); j++ {
					if e.Field(j).Type.Kind() == reflect.Map {
						f.nested = append(f.nested, simField{index: j, name: e.Field(j).Name, kind: reflect.Map})
					}
				}
			}
		}
		fs = append(fs, f)
	}
	simFieldCache.Store(t, fs)
	return fs
}

// simTableBound is a table's stated bound in a world, and whether it must
// be empty once every room is cleared and the TTL passed. A table
// simTables finds that is not listed here fails the check: a new table
// needs a bound.
func (w *simWorld) simTableBound(c *Core, name string) (bound int, empty, ok bool) {
	r := w.cfg.reg
	rooms := len(w.rooms)
	// Tombstones that still hold a write or owe an ABORT_ACK are kept past
	// MaxTombstones until they settle (forgetting one would lose what it
	// owes): the bound is MaxTombstones plus those.
	tombs := func() int {
		owing := 0
		for _, t := range c.reg.tombs {
			if t.holds() || len(t.acks) > 0 {
				owing++
			}
		}
		return r.MaxTombstones + owing
	}
	switch name {
	case "reg.rooms", "holds", "pulls":
		return rooms, true, true
	case "reg.pending", "reg.pendingBy":
		return r.MaxPendingRooms, true, true
	case "reg.tombs":
		return tombs(), !w.cfg.hostileFlood, true // (a flood that never stops keeps its share)
	case "reg.draining":
		return tombs(), true, true
	case "reg.tombQ":
		return 2*tombs() + 65, !w.cfg.hostileFlood, true // stale entries compacted past 2×tombs+64
	case "epochs": // bounded by the deployment
		return max(c.cfg.MaxEpochs, DefaultMaxEpochs), false, true
	case "watching": // endpoints ever seen
		return w.incs, true, true
	case "reg.earlyBy", "reg.earlyQ": // the ranks with early-abort tombstones
		return w.cfg.slots(), !w.cfg.hostileFlood, true
	case "reg.earlyQ[]": // each rank's: its share, stale entries compacted past 2×its count+16
		return w.cfg.slots() * (2*max(1, r.MaxTombstones/8) + 17), !w.cfg.hostileFlood, true
	case "peers":
		return w.cfg.slots(), false, true
	case "challenges": // one per registering identity (maxChallenges in a deployment)
		return w.cfg.slots(), false, true
	case "echoes": // one per challenging decode identity (maxChallenges in a deployment)
		return w.cfg.slots(), false, true
	case "offerChallenges": // one per offering prefill process (maxOfferChallenges in a deployment)
		return w.incs, false, true
	case "offers": // one per prefill process (endpoint and epoch) ever offering
		return w.incs, false, true
	case "topos": // the prefill instances' topologies (the simulator looks none up)
		return maxTopologies, false, true
	case "offerChecks": // offers being loaded: each answered (OfferLoaded)
		return maxOfferChecks, true, true
	case "echo": // bytes: the last MaxEchoes nonces
		return MaxEchoes * ChallengeBytes, false, true
	case "peers[].inUse": // each registration's pages and aux items (simLayout has no state)
		return w.cfg.slots() * (simPages + kvlayout.AuxItems(simLayout())), true, true
	case "targets", "roomsOf":
		return w.cfg.prefills, false, true
	case "targets[].owed":
		return w.cfg.prefills * r.MaxPendingRooms, true, true
	case "roomsOf[]":
		return w.cfg.prefills * rooms, true, true
	}
	return 0, false, false
}

// checkTables: every table of every core within its bound, counted from
// the tables themselves, and Sizes() agreeing with them.
func (w *simWorld) checkTables(p *simProc) {
	t := simTables(p.core)
	bad := false
	for name, n := range t {
		b, _, ok := w.simTableBound(p.core, name)
		if !ok || n > b {
			bad = true
		}
		if ok && b > 0 && n == b && w.cov != nil {
			w.cov.hit("table bound reached: " + name)
		}
	}
	if bad { // name the first violation in a deterministic order
		for _, name := range slices.Sorted(maps.Keys(t)) {
			b, _, ok := w.simTableBound(p.core, name)
			switch {
			case !ok:
				w.fail("%s: table %s (%d entries) has no stated bound in simTableBound", p.from.Peer(), name, t[name])
			case t[name] > b:
				w.fail("%s: table %s has %d entries, over its bound %d", p.from.Peer(), name, t[name], b)
			}
		}
	}
	if t["reg.tombs"] > w.cfg.reg.MaxTombstones && w.cov != nil {
		w.cov.hit("tombstones past MaxTombstones while they owe")
	}
	s := p.core.Sizes()
	if s.Live != t["reg.rooms"] || s.Pending != t["reg.pending"] || s.Tombstones != t["reg.tombs"] || s.Draining != t["reg.draining"] ||
		s.PendingPeers != t["reg.pendingBy"] || s.Holds != t["holds"] || s.OwedAborts != t["targets[].owed"] || s.InUse != t["peers[].inUse"] || s.PullHolds != t["pulls"] {
		w.fail("%s: Sizes() %+v disagrees with the tables %v", p.from.Peer(), s, t)
	}
}

// checkEmpty: after every room is cleared and the tombstone TTL and the
// quarantine passed with no traffic, every room-bound table of every core
// is empty.
func (w *simWorld) checkEmpty() {
	for s, p := range w.procs {
		if p.dead || w.isHostile(s) {
			continue
		}
		t := simTables(p.core)
		for _, name := range slices.Sorted(maps.Keys(t)) {
			if _, empty, _ := w.simTableBound(p.core, name); empty && t[name] != 0 {
				w.fail("%s not empty after the TTL: table %s has %d entries (%v)", p.from.Peer(), name, t[name], t)
			}
		}
		s := p.core.Sizes()
		if w.cfg.hostileFlood {
			// A flood that never stops keeps its share of early aborts:
			// every tombstone left must be the flooder's.
			flooder := w.procs[w.cfg.prefills].from.Peer()
			for id, tb := range p.core.reg.tombs {
				if tb.by != flooder {
					w.fail("%s not empty after the TTL: room %d's tombstone (by %q) outlived it beside the flood", p.from.Peer(), id, tb.by)
				}
			}
			s.Tombstones = 0
		}
		if s.Total() != 0 {
			w.fail("%s not empty after the TTL: %+v", p.from.Peer(), s)
		}
	}
}

// ---- liveness: the quiet phase -----------------------------------------

// simQuietStep is the quiet phase's clock step.
const simQuietStep = time.Second

// liveBound is how long after faults stop every room on every live rank
// must be terminal: a room may still be pending (PendingTimeout), then
// bootstrapping (BootstrapTimeout), waiting for input (WaitingTimeout)
// and transferring (StallTimeout per chunk, at most three here), each
// deadline starting when the one before ended; REGISTER retries and
// re-lookups fit inside the bootstrap deadline.
func (w *simWorld) liveBound() time.Duration {
	r := w.cfg.reg
	return r.PendingTimeout + r.BootstrapTimeout + r.WaitingTimeout + 3*r.StallTimeout
}

// liveness stops the faults and checks that the protocol ends everything
// by itself (TigerBeetle's VOPR liveness mode, Dynamo's recovery phase):
// paused ranks resume and killed ones start again (a pod restarts), and
// from then on only the protocol runs — messages delivered, lookups
// answering the current record, writes completing, notifications
// arriving, heartbeats reporting what is true, applications sending the
// chunks they owe and clearing rooms once terminal — with time in steps of
// simQuietStep. Checked, with t0 the time faults stopped:
//
//	L1 by t0 + liveBound: every room on every live rank is terminal
//	   (rooms bound to a dead epoch included: they failed);
//	L2 by t0 + liveBound + quarantine: every decode hold is released
//	   (a drained ABORT_ACK, or the quarantine deadline — never sooner,
//	   which released() checks on every release);
//	L3 by then: every ABORT a live prefill process heard was answered by
//	   an ABORT_ACK;
//	L4 after every room is cleared and the TTL passed: every room-bound
//	   table of every core is empty (checkEmpty);
//	L6 by t0 + liveBound + quarantine + stall + lease: every prefill
//	   rank's pull rooms released their published pages (a drained
//	   READ_DONE, or the quarantine past the lease after the room's drain
//	   deadline — a decode process that never answers included).
func (w *simWorld) liveness() {
	if w.err != nil {
		return
	}
	w.calm = true
	for s, p := range w.procs {
		switch {
		case p.dead:
			w.apply(simEvent{fmt.Sprintf("calm: start %d", s), func(w *simWorld) { w.startAgain(s) }})
		case p.closed: // (paused or not)
			w.apply(simEvent{fmt.Sprintf("calm: exit %d", s), func(w *simWorld) { w.exit(s) }})
			w.apply(simEvent{fmt.Sprintf("calm: start %d", s), func(w *simWorld) { w.startAgain(s) }})
		case p.paused:
			w.apply(simEvent{fmt.Sprintf("calm: resume %d", s), func(w *simWorld) { w.resume(s) }})
		}
	}
	t0 := w.now
	// (A pull room's source pages wait past its failure for its drain
	// deadline, then past its lease for the quarantine: L6.)
	end := t0.Add(w.liveBound() + w.cfg.quarantine + w.cfg.reg.StallTimeout + simPullLease + simQuietStep)
	for w.err == nil {
		w.drain()
		w.checkHoldBound(t0)
		if w.err != nil {
			return
		}
		if !w.now.Before(t0.Add(w.liveBound())) {
			for _, p := range w.procs {
				for _, id := range slices.Sorted(maps.Keys(p.core.reg.rooms)) {
					if rm := p.core.reg.rooms[id]; !rm.status.Terminal() {
						w.fail("liveness: room %d on %s still %v %v after faults stopped (bound %v)", id, p.from.Peer(), rm.status, w.now.Sub(t0), w.liveBound())
					}
				}
			}
		}
		if !w.now.Before(end) {
			break
		}
		// One-second steps while retries and lookups run, then coarser
		// ones up to the deadlines.
		step := simQuietStep
		if w.now.Sub(t0) >= 10*simQuietStep {
			step = 5 * simQuietStep
		}
		w.apply(simEvent{"calm: time +" + step.String(), func(w *simWorld) { w.tick(step - time.Millisecond) }})
	}
	for _, id := range w.cfg.mustSucceed {
		r := w.roomSpec(id)
		whole := true // every side created and initialised before the quiet phase
		for _, s := range w.slotsOf(r) {
			sd := w.sides[[2]uint64{uint64(s), id}]
			whole = whole && sd.inc != 0 && sd.inited
		}
		for _, s := range w.slotsOf(r) {
			if !whole {
				break
			}
			if st, _ := w.procs[s].core.Status(id); st != Success && st != 0 {
				reason, _ := w.procs[s].core.Failure(id)
				w.fail("liveness: room %d on %s ended %v %q: nothing in this configuration may fail it", id, w.procs[s].from.Peer(), st, reason)
			}
		}
	}
	for s, p := range w.procs {
		if w.isHostile(s) {
			continue // its own pages are its own affair: it never reads what it asked for
		}
		if pc := p.core.prefillCore; pc != nil && len(pc.pulls) > 0 && !p.dead {
			w.fail("liveness: %s still holds the published pages of pull rooms %v %v after faults stopped (bound %v)",
				p.from.Peer(), slices.Sorted(maps.Keys(pc.pulls)), w.now.Sub(t0), w.liveBound()+w.cfg.quarantine+w.cfg.reg.StallTimeout+simPullLease)
		}
		if d := p.core.decodeCore; d != nil && len(d.holds) > 0 {
			w.fail("liveness: %s still holds the pages of rooms %v %v after faults stopped (bound %v)",
				p.from.Peer(), slices.Sorted(maps.Keys(d.holds)), w.now.Sub(t0), w.liveBound()+w.cfg.quarantine)
		}
	}
	for s, p := range w.procs {
		if d := p.core.decodeCore; d != nil && !w.isHostile(s) {
			for _, k := range slices.Sorted(maps.Keys(d.targets)) {
				if owed := d.targets[k].owed; len(owed) > 0 {
					tg := d.targets[k]
					w.fail("liveness: %s still owes prefill rank %s the ABORTs of rooms %v %v after faults stopped (none acknowledged; target at %s resolved %v resolving %v reg %v; the rank is at %s)",
						p.from.Peer(), k, slices.Sorted(maps.Keys(owed)), w.now.Sub(t0), tg.endpoint, tg.resolved, tg.resolving, tg.reg, w.procs[tg.t.Rank].endpoint)
				}
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(w.heard), func(a, b simKey) int {
		return cmpKeys(a, b)
	}) {
		// Between live processes (a dead decode process's ABORT, or a
		// replay of one, is stale: dropped by the epoch check).
		p, d := w.procs[w.incSlot[k.pInc]], w.procs[w.incSlot[k.dInc]]
		if _, ok := w.acked[k]; !ok && p.inc == k.pInc && !p.dead && d.inc == k.dInc && !d.dead {
			w.fail("liveness: room %d: prefill process %d heard decode process %d's ABORT and never answered it", k.room, k.pInc, k.dInc)
		}
	}
	if w.err == nil {
		w.probe()
	}
	if w.err == nil {
		w.settle()
	}
}

// simProbeRooms is the first probe room id.
const simProbeRooms = 10000

// probe is liveness L5, recovery: after faults stopped and everything
// ended, a new room from every decode rank to every prefill rank succeeds
// — the protocol is not just quiet but working (a decode rank retrying a
// dead endpoint forever, or a registration lost for good, would fail every
// room after the faults). The first round may fail while the protocol
// finds out what the faults left (a dead endpoint it still holds costs its
// REGISTER retries, 1 + 2 + 4 s, before the re-lookup: close to the
// bootstrap deadline); a second round, created right after, must succeed.
// Where faults leave only registrations with processes that are gone
// (firstProbeRoundMust), the first round must succeed too: its REQUESTs
// probe first and find the new processes.
func (w *simWorld) probe() {
	for round := 0; round < 2 && w.err == nil; round++ {
		if w.probeRound(round, round == 1 || w.cfg.firstProbeRoundMust) {
			return
		}
	}
}

// probeRound creates one probe room per (decode, prefill) pair and runs
// the protocol until all succeed (true), or one fails or the bootstrap
// deadline passes (false; a violation if must).
func (w *simWorld) probeRound(round int, must bool) bool {
	var ids []uint64
	for d := 0; d < w.cfg.decodes; d++ {
		for p := 0; p < w.cfg.prefills; p++ {
			id := uint64(simProbeRooms + round*1000 + d*100 + p)
			ids = append(ids, id)
			w.addRoom(simRoomSpec{id: id, decodes: []int{d}, prefills: []int{p}, chunks: 1})
			dp, pp := w.cfg.prefills+d, p
			w.apply(simEvent{fmt.Sprintf("calm: probe room %d create", id), func(w *simWorld) {
				for _, s := range []int{pp, dp} {
					w.sides[[2]uint64{uint64(s), id}].inc = w.procs[s].inc
				}
				w.procs[pp].core.Step(w.now, CreateSender{Room: id})
				w.effects(pp)
				w.procs[dp].core.Step(w.now, CreateReceiver{Room: id, Links: []Link{{Target: Target{Bootstrap: "sim", Rank: pp}, Aux: true}}})
				w.effects(dp)
			}})
		}
	}
	t0 := w.now
	for w.err == nil {
		w.drain()
		done, failed := true, ""
		for _, id := range ids {
			r := w.rooms[slices.IndexFunc(w.rooms, func(r simRoomSpec) bool { return r.id == id })]
			for _, s := range w.slotsOf(r) {
				st, _ := w.procs[s].core.Status(id)
				if st != Success {
					done = false
				}
				if failed == "" && (st == Failed || w.now.Sub(t0) >= w.cfg.reg.BootstrapTimeout) {
					reason, _ := w.procs[s].core.Failure(id)
					failed = fmt.Sprintf("probe room %d on %s is %v %q %v after it was created", id, w.procs[s].from.Peer(), st, reason, w.now.Sub(t0))
				}
			}
		}
		switch {
		case done:
			return true
		case failed != "" && must:
			w.fail("liveness: no recovery after faults stopped and everything ended: %s", failed)
			return false
		case failed != "":
			w.cov.hit("first probe round failed")
			return false
		}
		w.apply(simEvent{"calm: time +1s", func(w *simWorld) { w.tick(simQuietStep - time.Millisecond) }})
	}
	return false
}

func cmpKeys(a, b simKey) int {
	switch {
	case a.pInc != b.pInc:
		return a.pInc - b.pInc
	case a.dInc != b.dInc:
		return a.dInc - b.dInc
	case a.room < b.room:
		return -1
	case a.room > b.room:
		return 1
	}
	return 0
}

// drain applies the first enabled event until none is left (the quiet
// phase has no choices to make: its events are the protocol's own).
func (w *simWorld) drain() {
	for i := 0; i < 100000 && w.err == nil; i++ {
		evs := w.events()
		if len(evs) == 0 {
			return
		}
		w.apply(evs[0])
	}
	if w.err == nil {
		w.fail("liveness: the quiet phase did not settle in 100000 events (a message loop?)")
	}
}

// settle clears every room, jumps past the quarantine and the TTL three
// times, and checks that every core is empty.
func (w *simWorld) settle() {
	for round := 0; round < 3 && w.err == nil; round++ {
		for _, r := range w.rooms {
			for _, s := range w.slotsOf(r) {
				sd, p := w.sides[[2]uint64{uint64(s), r.id}], w.procs[s]
				if sd.inc == p.inc && !sd.cleared { // noClear binds the explored applications, not this phase
					sd.cleared = true
					id := r.id
					w.apply(simEvent{fmt.Sprintf("calm: clear room %d at %d", id, s), func(w *simWorld) {
						if w.isPrefill(s) {
							w.procs[s].core.Step(w.now, ClearSender{Room: id})
						} else {
							w.procs[s].core.Step(w.now, ClearReceiver{Room: id})
						}
						w.effects(s)
					}})
				}
			}
		}
		w.drain()
		w.apply(simEvent{"calm: time past the quarantine and the TTL", func(w *simWorld) { w.tick(w.cfg.reg.TombstoneTTL + w.cfg.quarantine) }})
	}
	w.drain()
	if w.err == nil {
		w.checkEmpty()
	}
}

// ---- swarm-random runs -------------------------------------------------

// simFaults are the fault classes a swarm run draws its mix from: each
// seed turns each on with probability ½, at a weight of its own (swarm
// testing, Groce et al.: a run with few kinds of faults reaches deeper
// into each than one with all at once).
var simFaults = []string{"restart", "kill", "pause", "lose", "duplicate", "replay", "stale view", "lookup fails",
	"finds", "fails quiesced", "fails but may land", "decode abort", "prefill abort", "clear live", "push", "silent", "close"}

// simEventWeight is an event's weight in a swarm run.
func (w *simWorld) simEventWeight(name string) int {
	class := func(k string) int { return w.weights[k] }
	switch {
	case strings.HasPrefix(name, "time"):
		// Short jumps (retries, heartbeats, stalls) at the seed's weight;
		// the long ones (past every room deadline, the quarantine, the
		// TTL) rarely, or hardly a room would finish between them.
		if d, err := time.ParseDuration(strings.TrimPrefix(name, "time +")); err == nil && d < w.cfg.reg.WaitingTimeout {
			return w.weights["time"]
		}
		return 1
	case strings.HasPrefix(name, "restart "):
		return class("restart")
	case strings.HasPrefix(name, "kill"):
		return class("kill")
	case strings.HasPrefix(name, "pause"):
		return class("pause")
	case strings.HasPrefix(name, "lose"):
		return class("lose")
	case strings.HasPrefix(name, "duplicate"):
		return class("duplicate")
	case strings.HasPrefix(name, "replay"):
		return class("replay")
	case strings.HasSuffix(name, "(stale view)"):
		return class("stale view")
	case strings.HasSuffix(name, "(bootstrap down)"):
		return class("lookup fails")
	case strings.Contains(name, " finds "):
		if strings.HasSuffix(name, "(falsely)") {
			return class("finds")
		}
		return 5 + class("finds")
	case strings.HasSuffix(name, "fails quiesced"):
		return class("fails quiesced")
	case strings.HasSuffix(name, "fails but may land"):
		return class("fails but may land")
	case strings.HasSuffix(name, "reported done, not landed"):
		return class("silent")
	case strings.Contains(name, "decode") && strings.HasSuffix(name, " abort"):
		return class("decode abort")
	case strings.Contains(name, "prefill") && strings.HasSuffix(name, " abort"):
		return class("prefill abort")
	case strings.HasPrefix(name, "push"):
		return 10 * class("push")
	case strings.HasPrefix(name, "close "):
		// An application's Close, mid-run (at the default weight it came
		// among the first events, before any rank was bound).
		return class("close")
	case strings.HasPrefix(name, "start"), strings.HasPrefix(name, "resume"), strings.HasPrefix(name, "exit "):
		return 8
	case strings.HasSuffix(name, " create"):
		// Rooms arrive over the run, as requests do, so some start after
		// long idle gaps (a registration nobody has heard from since).
		return 12
	case strings.HasSuffix(name, " clear"):
		return 10
	case strings.Contains(name, "late landing"), strings.Contains(name, "restarted"):
		return 25
	default:
		return 50
	}
}

// simRun is what one random run reached.
type simRun struct {
	cov   *simCoverage
	trace []string
	mix   map[string]int
}

// runRandom plays steps random events from seed with the seed's own fault
// mix, then the quiet phase (liveness), then clears every room and checks
// that the cores empty after the TTL.
func runRandom(cfg simConfig, seed uint64, steps int) (simRun, error) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	mix := map[string]int{"time": []int{2, 4, 8}[rng.IntN(3)]}
	for _, f := range simFaults {
		if rng.IntN(2) == 0 {
			mix[f] = []int{1, 3, 8}[rng.IntN(3)]
		}
	}
	on := func(f string) bool { return mix[f] > 0 }
	cfg.clearLive = cfg.clearLive && on("clear live")
	cfg.mayLand = cfg.mayLand && on("fails but may land")
	cfg.staleViews = cfg.staleViews && on("stale view")
	cfg.pushes = cfg.pushes && on("push")
	w := newSimWorld(cfg)
	w.cov = newSimCoverage()
	w.weights = mix
	weights := []int{}
	for i := 0; i < steps && w.err == nil; i++ {
		evs := w.events()
		if len(evs) == 0 {
			break // nothing can happen any more
		}
		weights = weights[:0]
		sum := 0
		for _, ev := range evs {
			x := w.simEventWeight(ev.name)
			weights = append(weights, x)
			sum += x
		}
		if sum == 0 {
			break
		}
		k := rng.IntN(sum)
		j := 0
		for k >= weights[j] {
			k -= weights[j]
			j++
		}
		if strings.HasPrefix(evs[j].name, "time") {
			w.cov.hit("time jump")
		}
		w.cov.hit("event")
		w.apply(evs[j])
	}
	chaos := len(w.trace)
	if w.err == nil {
		w.liveness()
	}
	run := simRun{cov: w.cov, trace: w.trace, mix: mix}
	if w.err != nil {
		if len(w.trace) <= chaos { // a safety violation in the faulty phase: minimise it
			min := minimize(cfg, w.trace, w.err)
			return run, fmt.Errorf("seed %d (mix %v): %w\nminimal trace (replay: runScript(cfg, trace); the whole run: runRandom(cfg, %d, %d)):\n  %s",
				seed, mix, w.err, seed, steps, strings.Join(min, "\n  "))
		}
		return run, fmt.Errorf("seed %d (mix %v): %w\nthe run (replay: runRandom(cfg, %d, %d)); faults stopped after event %d:\n  %s",
			seed, mix, w.err, seed, steps, chaos, strings.Join(w.trace, "\n  "))
	}
	return run, nil
}
