package core

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// This file is a deterministic simulator of kvbridge's protocol, in the
// style of etcd-io/raft's rafttest network, FoundationDB's simulation
// testing and TigerBeetle's VOPR: several real Cores (prefill and decode
// ranks) composed over a simulated network and discovery service in one
// goroutine. Everything that can happen is an event:
//
//   - the network: deliver the next message of a link (FIFO per direction,
//     to the endpoint it was sent to: nobody may listen there any more),
//     lose it, duplicate it, or replay the last message a link delivered
//     (byte for byte, from whoever sent it, to whatever process now holds
//     the receiving slot);
//   - discovery: a rank's record (endpoint, epoch) with a lease that runs
//     out after its process dies; a lookup answers the record, a stale view
//     of it (the record before a restart, within its lease), or fails
//     (bootstrap service down); a watch pushes a changed record to a decode
//     rank, late and coalesced;
//   - the data plane: post the next write, complete it (ok; failed and
//     quiesced; failed but still able to land; stalled), land a late write,
//     deliver a notification (always after its data);
//   - the applications: create, init, send a chunk, abort, clear;
//   - processes: restart in place (new epoch, same endpoint), kill -9 (its
//     record stays until the lease ends) and start again on a new endpoint
//     (a pod restart), pause (SIGSTOP: no step, no tick, messages queue)
//     and resume with the old state, heartbeats (a PONG from a new epoch at
//     a watched endpoint; a watched endpoint found dead, truly or falsely);
//   - time jumping past each deadline.
//
// Safety is checked after every event (check* and the effect checks),
// against a record the simulator keeps itself: which REQUESTs each prefill
// process accepted from which decode process (pages and all), which ABORTs
// it heard and acknowledged, when each decode room failed and when its
// pages were released. Liveness is checked in a quiet phase after faults
// stop (simlive_test.go). Two modes: explore (depth first over every
// interleaving, states deduplicated by a fingerprint of the whole world)
// and swarm-random runs from a seed; a failure prints the seed and the
// minimised event trace, which replays exactly (runScript).

// simConfig is one topology and its bounds.
type simConfig struct {
	prefills, decodes int
	rooms             []simRoomSpec
	restarts          int // in-place restarts allowed (new epoch, same endpoint)
	kills             int // kill -9s allowed: the slot is empty until a start, on a new endpoint
	// closes: Closes allowed (the application closes its rank: Step
	// Close); the process goes on, its application calling as before,
	// until it exits (an event of its own, a kill) and starts again.
	closes int
	// recordEpochs: a lookup answers with its record's epoch too (as the
	// shells' bootstrap records do), so a decode rank tells a record
	// still naming a closed process from its next one.
	recordEpochs bool
	peerDowns    int  // "peer dead" reports allowed (true or false)
	mayLand      bool // writes may fail without being quiesced, and stall
	writesOK     bool // writes never fail by themselves (they may still stall past a time jump)
	ticks        int  // time jumps allowed (0: unbounded, <0: none)
	losses, dups int  // control messages lost, duplicated
	replays      int  // last-delivered messages replayed
	pauses       int  // SIGSTOPs
	staleViews   bool // a lookup may answer the record before a restart (within its lease)
	lookupFails  int  // lookups that fail for want of the bootstrap service
	pushes       bool // discovery watches push changed records to decode ranks
	// regWindow: a prefill rank's REGISTER is three events, as the shell
	// runs it — the epoch check and CheckRegister when it arrives, then
	// (another event, other events between) the metadata load and the
	// bind (Registered), or the load failing (RegisterRefused).
	regWindow bool
	loadFails int             // metadata loads that fail (regWindow)
	jumps     []time.Duration // the time jumps (nil: past every deadline, see deadlines)
	// prefix: events applied before exploring (the start state is after
	// them), to leave out interleavings the configuration is not about.
	prefix []string
	// What the applications may do besides the normal path (exhaustive
	// configurations choose, to keep the state space small).
	prefillAbort, decodeAbort bool
	abortDecodes              []int // decode ranks whose application may abort (nil: all)
	clearLive                 bool  // decode and prefill may Clear a live room directly
	prefillClearLive          bool  // prefill may Clear a live room directly
	noClear                   bool  // rooms are never cleared (smaller spaces)
	decodeNoClear             bool  // decode rooms are never cleared
	decodeNoInit              bool  // decode rooms never send their REQUEST (they only abort)
	reg                       RegistryConfig
	quarantine                time.Duration
	// spawn: random runs start a new room (the next template, a fresh id)
	// whenever fewer than len(rooms) are unfinished, up to spawn rooms.
	spawn int
	// live: run the quiet phase and its liveness checks at the end of
	// exploration's quiescent states (random runs always do).
	live bool
	// firstProbeRoundMust: the quiet phase's first round of probe rooms
	// must succeed too (configurations whose faults leave no REGISTER
	// unanswered at a dead endpoint, only registrations).
	firstProbeRoundMust bool
	// mustSucceed: rooms whose every side must end Success by the end of
	// the quiet phase (configurations where nothing may fail them).
	mustSucceed []uint64
	// hostileRenew: decode rank 0 is hostile (simhostile_test.go): it
	// never reads what it is offered, never says its reads are over or
	// aborts, and sends a RENEW for every pull room of the configuration
	// to every prefill rank at every tick, the quiet phase included.
	hostileRenew bool
	// intruder: the last decode rank is another decode instance that may,
	// intrusions times, ask for, abort, renew or end the reads of rooms of
	// the other instance (simhostile_test.go).
	intruder   bool
	intrusions int
	// forger: prefill rank 0 holds a valid identity and, intrusions
	// times, answers decode rank 0 with an offer under a name of its own
	// whose blob names the last decode rank's agent (simhostile_test.go).
	forger bool
	// hostileFlood: decode rank 0 is hostile and floods: at every tick
	// (the quiet phase's too) it sends ABORTs and READ_DONEs for
	// simFloodIDs fresh room ids and for every room of the configuration
	// it is not a decode rank of (simhostile_test.go).
	hostileFlood bool
	// hostilePrefill: prefill rank 0 holds a valid identity and misuses
	// it at every tick (the quiet phase's too): it sends every decode
	// rank notifications and PAGES with hostile ranges for every room
	// (simhostile_test.go). latePongs: prefill rank 0 answers PINGs only
	// past the probe timeout.
	hostilePrefill, latePongs bool
	// silentWrites: writes the engine may report done whose data did not
	// land (NIXL 1.4.0 over cma, docs/ENGINES.md), their notification
	// still sent. The decode shell's write check is modelled at the
	// notification's delivery: a notification naming a page and layer
	// that did not land gets Undelivered, as the canary would.
	silentWrites int
	// digest: every room asks for a digest (docs/PROTOCOL.md "Digest");
	// the simulator's pool appends one to each notification of pages, and
	// its prefill shell to each PAGES of pages — every page's sum is 0 —
	// and the decode shell's check is modelled at the notification's
	// delivery and at a read's completion. corruptWrites: writes and reads
	// whose bytes land corrupted (a write's notification's first sum is
	// not the page's; a read's check finds a page that is not).
	digest        bool
	corruptWrites int
	// unsummedNotifs: notifications of pages whose decode shell cannot
	// sum its pieces for their digest (its own failure, its CUDA
	// driver's, say: Notified.Unsummed).
	unsummedNotifs int
}

// simRoomSpec: a room that the listed decode ranks receive from the listed
// prefill ranks (each a source), in chunks of one page.
type simRoomSpec struct {
	id       uint64
	decodes  []int
	prefills []int
	chunks   int
	dummies  []int // prefill ranks that are dummy links (they write nothing, as MLA's extra ranks)
	required int   // REQUESTs a prefill rank waits for (0: len(decodes)); fewer than decodes sends more REQUESTs than required
	// layered: each chunk is sent layer by layer (simLayers calls of one
	// layer each), not in one call.
	layered bool
	// pull: the decode ranks read the pages (simpull_test.go).
	pull bool
	// early: the prefill application may send its chunks once the sender
	// is initialised, before the REQUEST came (kept, then planned in the
	// REQUEST's step).
	early bool
}

func (r simRoomSpec) req() int {
	if r.required > 0 {
		return r.required
	}
	return len(r.decodes)
}

func simRegistryConfig() RegistryConfig {
	return RegistryConfig{BootstrapTimeout: 10 * time.Second, WaitingTimeout: 20 * time.Second, StallTimeout: 5 * time.Second,
		PendingTimeout: 15 * time.Second, TombstoneTTL: 100 * time.Second, MaxPendingRooms: 64, MaxTombstones: 64,
		MaxPendingPerPeer: 32, MaxReasonBytes: 512}
}

const (
	simPages = 64
	// simAuxItems: simLayout's aux items. A room's pages and aux item
	// follow from its id (simDests), so the rooms live at once on a
	// decode rank name distinct ones, as an application reusing a room's
	// memory only once it is Released does (the prefill rank refuses a
	// REQUEST naming a page another live room of the process holds).
	simAuxItems = 16
	// simLease is a discovery record's lease: it outlives its dead process
	// this long.
	simLease = 2 * time.Second
	// simProbeIdle is the decode cores' ProbeIdle (their ProbeTimeout a
	// quarter of it): after any time jump a REQUEST first PINGs.
	simProbeIdle = time.Second
	// simChallengeTimeout: how long a REGISTER's sender has to echo its
	// agent challenge.
	simChallengeTimeout = 2 * time.Second
	// simWriteLife is the model's one timing assumption about the data
	// plane: no write lands later than this after it was posted. The
	// quarantine (30 s) must exceed it: that is what makes a forced
	// release safe for every write posted before the room failed.
	simWriteLife = 20 * time.Second
)

// simDests are a room's destination pages (one per chunk, at most
// simPages/simAuxItems) and aux item: rooms whose ids differ by less than
// simAuxItems name none in common.
func simDests(r simRoomSpec) (pages []uint32, aux int) {
	slot := int(r.id % simAuxItems)
	pages = make([]uint32, r.chunks)
	for i := range pages {
		pages[i] = uint32(slot*(simPages/simAuxItems) + i)
	}
	return pages, slot
}

// simLayers is how many layers simLayout holds (two regions each).
const simLayers = 2

func simLayout() kvlayout.Layout {
	return kvlayout.Layout{Kind: mem.DRAM, PageBytes: 64, AuxItemBytes: 16, Aux: mem.Desc{Addr: 0x9000, Len: simAuxItems * 16},
		Regions: []mem.Desc{{Addr: 0x1000, Len: simPages * 64}, {Addr: 0x2000, Len: simPages * 64},
			{Addr: 0x3000, Len: simPages * 64}, {Addr: 0x4000, Len: simPages * 64}}}
}

type simProc struct {
	core     *Core
	from     wire.From
	endpoint string
	inc      int             // incarnation: unique per process start
	jobs     []simJob        // prefill: chunks queued in the pool
	handed   map[uint64]bool // prefill: rooms with writes handed to the pool (Effect.First's check)
	notifs   []string        // decode: notifications arrived, in order
	loads    []simLoad       // prefill: REGISTERs checked whose metadata load is in progress (regWindow)
	offers   []*OfferPlan    // decode: offers to load and prove (answered in the same event)
	dead     bool            // killed, not started again
	closed   bool            // its application closed it (Close), not exited yet
	paused   bool            // SIGSTOPped
	pausedAt time.Time
	// shareFull: a rank other than a flooding one (hostileFlood) kept its
	// whole share of early aborts here: its own may have been forgotten.
	shareFull bool
}

// simLoad is a REGISTER that passed its checks and whose metadata a
// prefill process is loading (the shell does it off the control loop).
type simLoad struct {
	from  wire.From
	agent string // the agent its blob names (the sim's blob is the agent's name)
	plan  PeerPlan
	at    int // the trace's length when the check ran (coverage only)
}

type simJob struct {
	room   uint64
	writes []kvlayout.Write
}

type simMsg struct {
	from wire.From
	to   string // the endpoint it was sent to
	msg  wire.Message
}

type simWrite struct {
	id      int
	srcInc  int
	room    uint64
	dstSlot int
	dstInc  int
	notif   string
	last    bool
	posted  time.Time
	ghost   bool // its completion was reported as failed, but it may still land
	landed  bool // its data is in (a paused pool has not seen it complete)
	aborted bool // the prefill process had heard the room's ABORT from its destination when it posted it
	digest  bool // its notification carries a digest
	pages   []uint32
	layers  kvlayout.Layers
	auxDst  int
	remote  string // the destination agent
}

// simCell is one page and layer of a room, landed in a decode process
// from a prefill slot (the simulator's record of what arrived).
type simCell struct {
	dInc, src int
	room      uint64
	page      uint32
	layer     int
}

// simSide is what the application did with a room on one rank.
type simSide struct {
	inc                            int // incarnation that created it (0: not created)
	inited, aborted, cleared, lost bool
	abortApplied                   bool // decode: an app abort changed the room
	clearAt                        time.Time
	sent                           int // prefill: chunks sent
	layer                          int // prefill: layers of the next chunk sent (layered rooms)
	abortAt                        time.Time
	abortInc                       []int // decode: prefill incarnations at abort time
}

// simRecord is a rank's discovery record.
type simRecord struct {
	set      bool
	endpoint string
	epoch    uint64
	gen      int       // bumped on every change (watches push the latest)
	dead     bool      // its process is gone: the record lives until expires
	expires  time.Time // dead records: the lease's end
	replaced time.Time // prev records: when the next one replaced it
}

func (r simRecord) live(now time.Time) bool { return r.set && (!r.dead || now.Before(r.expires)) }

// simKey names a (prefill process, decode process, room) triple of the
// simulator's own record.
type simKey struct {
	pInc, dInc int
	room       uint64
}

// simAsk is a REQUEST a prefill process accepted.
type simAsk struct {
	pages []uint32
	aux   int
}

type simRel struct {
	at     time.Time
	forced bool
}

type simWorld struct {
	cfg       simConfig
	now       time.Time
	procs     []*simProc // prefill slots first, then decode slots
	net       [][][]simMsg
	hist      [][]*simMsg // the last message each link delivered (replays)
	resolves  [][]Target  // per slot
	writes    []simWrite
	nextWrite int
	reads     []simRead // pull reads asked for, posted or not (simpull_test.go)
	nextRead  int
	srel      map[[2]int]time.Time // (prefill inc, room): source pages released
	incs      int
	incSlot   []int    // incarnation → slot
	incEp     []string // incarnation → its endpoint
	rooms     []simRoomSpec
	sides     map[[2]uint64]*simSide // (slot, room)
	records   []simRecord            // per prefill slot
	prev      []simRecord            // the record before the last start
	pushed    [][]int                // [decode][prefill]: the record gen last pushed
	// The simulator's own record (the checks' ground truth).
	asked map[simKey]simAsk
	heard map[simKey]bool // ABORTs a prefill process heard from a decode process
	// earlyAbort: (prefill incarnation, room) → the first and the last
	// ABORT that process heard while it had no sender for the room.
	earlyAbort map[[2]uint64][2]time.Time
	acked      map[simKey]bool // ... and answered with an ABORT_ACK (value: drained)
	failedAt   map[[2]int]time.Time
	rel        map[[2]int]simRel // (decode inc, room): pages released
	reported   map[string]bool   // deaths heartbeats reported (reporter, endpoint, process there)
	got        map[simCell]bool  // pages and layers landed
	bad        map[simCell]bool  // ... of them, landed corrupted (corruptWrites)
	corrupts   int
	unsummed   int // notifications delivered unsummed (unsummedNotifs)
	// Faults used (bounded by the configuration).
	restarts, kills, peerDowns, ticks, losses, dups, replays, pauses, lookupFails, stales, loadFails, intrusions, silents, closes int
	floods                                                                                                                        int // the hostile flood's ticks (its room ids)
	// doneBy: the effects being carried out are a write completion's
	// ("writes") or a READ_DONE's.
	doneBy  string
	late    []simLate // hostilePrefill: PONGs held past the probe timeout
	calm    bool      // the quiet phase: no faults
	trace   []string
	cov     *simCoverage // random runs and explorations: what was reached (not state)
	weights map[string]int
	err     error
}

func (c simConfig) slots() int { return c.prefills + c.decodes }

func (w *simWorld) isPrefill(slot int) bool { return slot < w.cfg.prefills }

// endpointFor is where slot's next process listens: the slot's endpoint
// for a restart in place, a new one after a kill (a pod restarted on
// another port).
func (w *simWorld) endpointFor(slot int, moved bool) string {
	if p := w.procs[slot]; p != nil && !moved {
		return p.endpoint
	}
	if !moved {
		return "sim://" + strconv.Itoa(slot)
	}
	return "sim://" + strconv.Itoa(slot) + "/" + strconv.Itoa(w.incs)
}

func slotOf(endpoint string) int {
	s := strings.TrimPrefix(endpoint, "sim://")
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s = s[:i]
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func epochOf(inc int) uint64 { return uint64(1000 + inc) }

func incOf(epoch uint64) int { return int(epoch) - 1000 }

func remoteName(from wire.From) string {
	return fmt.Sprintf("agent|%s|%d", from.Endpoint, from.Epoch)
}

// remoteInc and remoteSlot read the process a remote agent name belongs to.
func remoteInc(remote string) int {
	f := strings.Split(remote, "|")
	e, _ := strconv.ParseUint(f[len(f)-1], 10, 64)
	return incOf(e)
}

func remoteSlot(remote string) int { return slotOf(strings.Split(remote, "|")[1]) }

func newSimWorld(cfg simConfig) *simWorld {
	w := &simWorld{cfg: cfg, now: time.Unix(1_000_000, 0), sides: map[[2]uint64]*simSide{},
		asked: map[simKey]simAsk{}, heard: map[simKey]bool{}, acked: map[simKey]bool{},
		failedAt: map[[2]int]time.Time{}, rel: map[[2]int]simRel{}, earlyAbort: map[[2]uint64][2]time.Time{}}
	n := cfg.slots()
	w.net = make([][][]simMsg, n)
	w.hist = make([][]*simMsg, n)
	for i := range w.net {
		w.net[i] = make([][]simMsg, n)
		w.hist[i] = make([]*simMsg, n)
	}
	w.resolves = make([][]Target, n)
	w.procs = make([]*simProc, n)
	w.records = make([]simRecord, cfg.prefills)
	w.prev = make([]simRecord, cfg.prefills)
	w.pushed = make([][]int, cfg.decodes)
	for d := range w.pushed {
		w.pushed[d] = make([]int, cfg.prefills)
	}
	for s := 0; s < n; s++ {
		w.start(s, false)
	}
	for _, r := range cfg.rooms {
		w.addRoom(r)
	}
	return w
}

func (w *simWorld) addRoom(r simRoomSpec) {
	w.rooms = append(w.rooms, r)
	for _, s := range r.prefills {
		w.sides[[2]uint64{uint64(s), r.id}] = &simSide{}
	}
	for _, s := range r.decodes {
		w.sides[[2]uint64{uint64(w.cfg.prefills + s), r.id}] = &simSide{}
	}
}

// start (re)starts the rank in slot with a new epoch (at a new endpoint
// if moved) and publishes its record.
func (w *simWorld) start(slot int, moved bool) {
	w.incs++
	ep := w.endpointFor(slot, moved)
	for len(w.incSlot) <= w.incs {
		w.incSlot = append(w.incSlot, -1)
		w.incEp = append(w.incEp, "")
	}
	w.incSlot[w.incs], w.incEp[w.incs] = slot, ep
	role, name, rank := RolePrefill, "prefill", slot
	if !w.isPrefill(slot) {
		role, name, rank = RoleDecode, "decode", slot-w.cfg.prefills
	}
	inst := name
	if w.isIntruder(slot) {
		inst = simIntruder
	}
	from := wire.From{Role: name, Instance: inst, Rank: rank, Endpoint: ep, Epoch: epochOf(w.incs)}
	cc := CoreConfig{Role: role, Rank: rank, Compat: "sim", Layout: simLayout(), Registry: w.cfg.reg,
		QuarantineTimeout: w.cfg.quarantine, RegisterRetry: time.Second, RecheckIdle: 8 * time.Second,
		ProbeIdle: simProbeIdle, ProbeTimeout: simProbeIdle / 4, Lease: simPullLease}
	if role == RoleDecode {
		kv, aux, state := RegionsOf(simLayout())
		cc.Register = wire.Register{Compat: "sim", Agent: remoteName(from), AgentMD: []byte(remoteName(from)), KV: kv, Aux: aux, State: state, TPSize: 1}
		// A configuration with pull rooms has its decode ranks pull as a
		// rank with Config.Pull does: through the offers their
		// REGISTER_ACKs carry, each loaded and proven (OfferLoaded).
		cc.Register.Pull = slices.ContainsFunc(w.cfg.rooms, func(r simRoomSpec) bool { return r.pull })
		cc.Identity = from.Peer()
	} else {
		kv, aux, state := RegionsOf(simLayout())
		cc.Offer = &wire.PullOffer{Agent: remoteName(from), AgentMD: []byte(remoteName(from)), KV: kv, Aux: aux, State: state, Proof: []byte(from.Peer()),
			LeaseMillis: int(simPullLease / time.Millisecond)}
	}
	cc.ChallengeTimeout = simChallengeTimeout
	// Each process its own challenge key, as a real one draws it at
	// random: with one key two prefill ranks challenged the same decode
	// process with the same nonce, and the decode rank, taking the second
	// for a repeat of the first, never echoed it.
	binary.LittleEndian.PutUint64(cc.ChallengeKey[:], uint64(w.incs)+1)
	cc.Identity = from.Peer()
	c, err := NewCore(cc)
	if err != nil {
		panic(err)
	}
	if role == RolePrefill {
		c.Step(w.now, Bound{Endpoint: ep})
	}
	w.procs[slot] = &simProc{core: c, from: from, endpoint: ep, inc: w.incs}
	if w.isPrefill(slot) {
		old := w.records[slot]
		if old.set {
			old.replaced = w.now
			w.prev[slot] = old
		}
		w.records[slot] = simRecord{set: true, endpoint: ep, epoch: from.Epoch, gen: old.gen + 1}
	} else {
		// A new decode process watches from now: it has seen every record.
		for p := range w.records {
			w.pushed[rank][p] = w.records[p].gen
		}
	}
}

func (w *simWorld) fail(format string, a ...any) {
	if w.err == nil {
		w.err = fmt.Errorf(format, a...)
	}
}

// procAt is the live process listening at endpoint (nil if none).
func (w *simWorld) procAt(endpoint string) *simProc {
	s := slotOf(endpoint)
	if s < 0 || s >= len(w.procs) {
		return nil
	}
	if p := w.procs[s]; !p.dead && p.endpoint == endpoint {
		return p
	}
	return nil
}

// active: the process in slot can step (neither dead nor paused).
func (w *simWorld) active(slot int) bool { p := w.procs[slot]; return !p.dead && !p.paused }

// effects carries out what a step of slot's core asked for, checking the
// invariants that concern single effects.
func (w *simWorld) effects(slot int) {
	p := w.procs[slot]
	for _, e := range p.core.Effects() {
		switch e.Kind {
		case EffectSend:
			dst := slotOf(e.To.Endpoint)
			if dst < 0 || dst >= len(w.procs) {
				w.fail("%s sent %v to unknown endpoint %q", p.from.Peer(), e.Msg.Type(), e.To.Endpoint)
				continue
			}
			switch m := e.Msg.(type) {
			case *wire.AbortAck:
				if m.Drained {
					// Invariant 7: drained only when no write of the room
					// from this process can land in the ACK's recipient.
					for _, wr := range w.writes {
						if wr.srcInc == p.inc && wr.room == m.Room && !wr.landed && w.incEp[wr.dstInc] == e.To.Endpoint {
							w.fail("room %d: %s sent ABORT_ACK drained while write %d can still land (ghost %v)", m.Room, p.from.Peer(), wr.id, wr.ghost)
						}
					}
				}
				for k := range w.heard {
					if k.pInc == p.inc && k.room == m.Room && w.incEp[k.dInc] == e.To.Endpoint {
						w.acked[k] = w.acked[k] || m.Drained
						w.cov.hit(fmt.Sprintf("ABORT_ACK drained=%v", m.Drained))
					}
				}
				if m.Drained {
					// Unasked: owed at Close to each decode rank whose
					// REQUEST the closed rank took, or sent with a STATUS
					// failed or cleared when nothing of the room can land
					// (invariant 7 above holds it to the same drain).
					for k := range w.asked {
						if k.pInc == p.inc && k.room == m.Room && w.incEp[k.dInc] == e.To.Endpoint && !w.heard[k] {
							w.acked[k] = true
							switch _, room := p.core.reg.rooms[m.Room]; {
							case !p.closed && room:
								w.cov.hit("drained ABORT_ACK with a STATUS failed, unasked")
							case !p.closed:
								w.cov.hit("drained ABORT_ACK with a STATUS cleared, unasked")
							case w.doneBy != "" && room:
								w.cov.hit("drained ABORT_ACK from a closed rank, unasked, once its " + w.doneBy + " drained")
							case w.doneBy != "":
								w.cov.hit("drained ABORT_ACK from a closed rank, unasked, once its " + w.doneBy + " drained (cleared)")
							case room:
								w.cov.hit("drained ABORT_ACK from a closed rank, unasked, for a room")
							default:
								w.cov.hit("drained ABORT_ACK from a closed rank, unasked, for a REQUEST it never served")
							}
						}
					}
				}
			}
			if a, ok := e.Msg.(*wire.RegisterAck); ok && p.closed {
				// Invariant 22: a closed rank binds no registration and
				// answers none (its peers' retries and lookups find the
				// rank's next process).
				w.fail("invariant 22: %s is closed and answered a REGISTER from %s (ok %v)", p.from.Peer(), e.To.Endpoint, a.OK)
			}
			if pg, ok := e.Msg.(*wire.Pages); ok && e.Digest != nil {
				// The shell's sums of what it publishes: every page's is 0
				// here (digestCheck), one a position.
				_, ends := kvlayout.DigestPieces(kvlayout.Layout{}, e.Digest.Slice, true, 0, 0, e.Digest.Runs, nil, nil)
				pg.Digests, pg.Units = make([]uint32, len(ends)), kvlayout.LastUnits(e.Digest.Slice, e.Digest.Runs)
				w.cov.hit("PAGES with a digest")
			}
			if w.hostileDrops(slot, e.Msg) {
				continue
			}
			w.net[slot][dst] = append(w.net[slot][dst], simMsg{from: p.from, to: e.To.Endpoint, msg: e.Msg})
		case EffectPost:
			// Effect.First: exactly the room's first writes handed to
			// the pool. The shell posts the first of them at once, ahead
			// of every queued write (pool.Job.First): here, the job goes
			// to the front of the queue.
			if e.First == p.handed[e.Room] {
				w.fail("room %d: %s's post has First %v, with writes handed before: %v", e.Room, p.from.Peer(), e.First, p.handed[e.Room])
			}
			p.handed = maps.Clone(p.handed) // shared with clones (exhaustive search)
			if p.handed == nil {
				p.handed = map[uint64]bool{}
			}
			p.handed[e.Room] = true
			job := simJob{room: e.Room, writes: slices.Clone(e.Writes)}
			if e.First && len(job.writes) > 0 {
				if len(p.jobs) > 0 {
					w.cov.hit("first writes ahead of queued writes")
				}
				p.jobs = slices.Insert(p.jobs, 0, job)
				continue
			}
			p.jobs = append(p.jobs, job)
		case EffectRead:
			if w.isHostile(slot) {
				w.cov.hit("hostile: read never posted")
				continue
			}
			w.addRead(slot, p, e)
		case EffectResolve:
			w.resolves[slot] = append(w.resolves[slot], e.Target)
		case EffectWatch:
			// A new watch: heartbeats report the endpoint's death again.
			prefix := fmt.Sprintf("%d|%s|", p.inc, e.To.Endpoint)
			for k := range w.reported {
				if strings.HasPrefix(k, prefix) {
					w.reported = maps.Clone(w.reported)
					maps.DeleteFunc(w.reported, func(k string, _ bool) bool { return strings.HasPrefix(k, prefix) })
					break
				}
			}
		case EffectUnwatch:
			w.cov.hit("peer unwatched")
		case EffectWake:
			w.checkWake(p, e)
		case EffectKeepProgress:
			if e.Keep <= 0 {
				w.fail("%s asked to keep progressing for %v", p.from.Peer(), e.Keep)
			}
			w.cov.hit("agent kept progressing")
		case EffectReleased:
			if w.isPrefill(slot) {
				w.sourceReleased(p, e)
				continue
			}
			w.released(p, e)
		case EffectTimer:
			// Only a decode rank's probe asks for a timer, for its
			// ProbeTimeout (the simulator's ticks reach it: a lost probe
			// is covered).
			if w.isPrefill(slot) || !e.At.Equal(w.now.Add(simProbeIdle/4)) {
				w.fail("%s asked for a timer at %v (now %v)", p.from.Peer(), e.At, w.now)
			}
			w.cov.hit("probe timer asked")
		case EffectUnload:
			if !w.isPrefill(slot) {
				for _, o := range p.core.decodeCore.offers {
					if o.remote == e.Remote {
						w.fail("%s unloads agent %q, an accepted offer's", p.from.Peer(), e.Remote)
					}
				}
				for _, ch := range p.core.decodeCore.offerChallenges {
					if ch.agent == e.Remote {
						w.fail("%s unloads agent %q, an open offer challenge's", p.from.Peer(), e.Remote)
					}
				}
				w.cov.hit("unechoed offer challenge's agent unloaded")
				continue
			}
			if p.core.AgentOwner(e.Remote) != "" {
				w.fail("%s unloads agent %q (owner %q)", p.from.Peer(), e.Remote, p.core.AgentOwner(e.Remote))
			}
			w.cov.hit("unechoed challenge's agent unloaded")
		case EffectChallenge:
			if !w.isPrefill(slot) {
				w.fail("%s sent an agent challenge", p.from.Peer())
				continue
			}
			if p.closed {
				w.fail("invariant 22: %s is closed and challenged a REGISTER's agent %q", p.from.Peer(), e.Msg.(*wire.Register).Agent)
			}
			w.challenge(e)
		case EffectChallengeOffer:
			if w.isPrefill(slot) {
				w.fail("%s sent an offer challenge", p.from.Peer())
				continue
			}
			w.challengeOffer(slot, e)
		case EffectLoadOffer:
			if w.isPrefill(slot) {
				w.fail("%s asked to load a pull offer", p.from.Peer())
				continue
			}
			p.offers = append(p.offers, e.Offer)
		case EffectLoadMetadata:
			if !w.isPrefill(slot) {
				w.fail("%s asked to load metadata", p.from.Peer())
				continue
			}
			if p.closed {
				w.fail("invariant 22: %s is closed and loads the metadata of a REGISTER from %s", p.from.Peer(), e.Msg.Sender().Peer())
			}
			p.loads = append(p.loads, simLoad{from: e.Msg.Sender(), agent: string(e.Msg.(*wire.Register).AgentMD), plan: *e.Plan, at: len(w.trace)})
			if w.cfg.regWindow {
				w.cov.hit("REGISTER's metadata load in progress")
			}
		}
	}
	if !w.cfg.regWindow {
		for len(p.loads) > 0 { // the load and the bind in the same event
			w.bind(slot)
		}
	}
	for len(p.offers) > 0 { // the offer's load and proof in the same event
		w.acceptOffer(slot)
	}
}

// checkWake: a waiter is woken only when what it waits for happened: a
// room's done waiter once it is terminal, its ready waiter once it left
// Bootstrapping, a hold's waiter once the pages are released.
func (w *simWorld) checkWake(p *simProc, e Effect) {
	if rm, ok := p.core.reg.rooms[e.Room]; ok {
		switch e.Wake {
		case WakeDone:
			if !rm.status.Terminal() {
				w.fail("room %d: %s woke its done waiter while %v", e.Room, p.from.Peer(), rm.status)
			}
			if rm.status == Success && rm.dec != nil {
				w.landedAll(p, e.Room)
			}
			if rm.status == Success && rm.dec == nil && !w.isPull(e.Room) {
				// (A pull room succeeds on its decode process's READ_DONE,
				// which may arrive after that process died.)
				// A room bound to a dead epoch fails: it cannot succeed
				// after a decode process whose REQUEST it took died (a
				// write to a gone process fails).
				for _, k := range slices.SortedFunc(maps.Keys(w.asked), cmpKeys) {
					if a, d := w.asked[k], w.procs[w.incSlot[k.dInc]]; k.pInc == p.inc && k.room == e.Room && len(a.pages) > 0 && (d.inc != k.dInc || d.dead) {
						w.fail("room %d: %s succeeded after decode process %d, whose REQUEST it took, died", e.Room, p.from.Peer(), k.dInc)
					}
				}
			}
		case WakeReady:
			if rm.status == Bootstrapping {
				w.fail("room %d: %s woke its ready waiter while %v", e.Room, p.from.Peer(), rm.status)
			}
		}
	}
	if d := p.core.decodeCore; d != nil {
		if _, ok := d.holds[e.Room]; ok && e.Wake == WakeHold {
			w.fail("room %d: %s woke its hold's waiter while the pages are held", e.Room, p.from.Peer())
		}
	}
	if pc := p.core.prefillCore; pc != nil {
		if _, ok := pc.pulls[e.Room]; ok && e.Wake == WakePull {
			w.fail("room %d: %s woke its pull hold's waiter while the published pages are held", e.Room, p.from.Peer())
		}
	}
	if (e.Wake == WakeHold && p.core.decodeCore == nil) || (e.Wake == WakePull && p.core.prefillCore == nil) {
		w.fail("room %d: %s woke a %v waiter, which its role has not", e.Room, p.from.Peer(), e.Wake)
	}
}

// landedAll: a decode room succeeds only when every page and layer of it
// landed from every prefill rank that writes it.
func (w *simWorld) landedAll(p *simProc, room uint64) {
	spec := w.roomSpec(room)
	dests, _ := simDests(spec)
	for _, src := range spec.prefills {
		if slices.Contains(spec.dummies, src) {
			continue
		}
		for _, pg := range dests {
			for l := 0; l < simLayers; l++ {
				c := simCell{dInc: p.inc, src: src, room: room, page: pg, layer: l}
				if !w.got[c] {
					w.fail("room %d: %s succeeded without page %d layer %d from prefill %d", room, p.from.Peer(), pg, l, src)
					return
				}
				if w.bad[c] {
					w.fail("room %d: %s succeeded with page %d layer %d from prefill %d corrupted", room, p.from.Peer(), pg, l, src)
					return
				}
			}
		}
	}
	if spec.layered {
		w.cov.hit("layered room succeeded")
	}
	if w.cfg.digest {
		w.cov.hit(fmt.Sprintf("room with a digest succeeded (pull %v)", spec.pull))
	}
}

// released checks a release of decode pages against the simulator's own
// record: no write may land after it, a forced release comes no sooner
// than the quarantine after the room failed, and a failed room's pages are
// released unforced only once every prefill process that accepted its
// REQUEST acknowledged the ABORT as drained.
func (w *simWorld) released(p *simProc, e Effect) {
	key := [2]int{p.inc, int(e.Room)}
	st, live := p.core.Status(e.Room)
	failed, wasFailed := w.failedAt[key]
	switch {
	case e.Forced:
		w.cov.hit("forced release")
		if !wasFailed || w.now.Sub(failed) <= w.cfg.quarantine {
			w.fail("room %d: %s released its pages as forced %v after the room failed (failed: %v), before the quarantine (%v)",
				e.Room, p.from.Peer(), w.now.Sub(failed), wasFailed, w.cfg.quarantine)
		}
	case st == Success && live:
		w.cov.hit("release after success")
		w.noWriteCanLand(p, e.Room)
	default:
		w.cov.hit("release after drained ABORT_ACKs")
		for _, k := range slices.SortedFunc(maps.Keys(w.asked), cmpKeys) {
			if k.dInc == p.inc && k.room == e.Room && !w.acked[k] {
				what := "cleared"
				if live {
					what = st.String()
				}
				w.fail("room %d: %s released its pages (room %s) before prefill process %d, which accepted its REQUEST, acknowledged the ABORT as drained",
					e.Room, p.from.Peer(), what, k.pInc)
			}
		}
		w.noWriteCanLand(p, e.Room)
	}
	if _, again := w.rel[key]; again {
		w.fail("room %d: %s released its pages twice", e.Room, p.from.Peer())
	}
	w.rel[key] = simRel{at: w.now, forced: e.Forced}
}

// noWriteCanLand: invariant 1, no page released while a write to it can
// land.
func (w *simWorld) noWriteCanLand(p *simProc, room uint64) {
	w.noReadCanLand(p, room)
	for _, wr := range w.writes {
		if wr.dstInc == p.inc && wr.room == room && !wr.landed {
			w.fail("room %d: %s released its pages while write %d can still land", room, p.from.Peer(), wr.id)
		}
	}
}

// land puts a write's data (and then its notification) into its
// destination, if that process still lives.
func (w *simWorld) land(wr simWrite) {
	if r, ok := w.rel[[2]int{wr.dstInc, int(wr.room)}]; ok {
		switch {
		case !r.forced:
			w.fail("room %d: write %d landed in pages already released", wr.room, wr.id)
		case wr.aborted:
			w.fail("room %d: write %d, posted after its prefill heard the ABORT, landed in pages released by the quarantine", wr.room, wr.id)
		case !wr.posted.After(w.failedAt[[2]int{wr.dstInc, int(wr.room)}]):
			w.fail("room %d: write %d, posted before the room failed, landed after the quarantine released its pages", wr.room, wr.id)
		default:
			// Posted after the room failed, by a prefill that had not
			// heard the ABORT (in flight, lost, or the prefill paused):
			// the exposure the quarantine bounds, counted.
			w.cov.hit("write landed after a forced release (prefill had not heard the ABORT)")
		}
	}
	if len(wr.pages) > 0 {
		w.got = maps.Clone(w.got) // clones share it
		if w.got == nil {
			w.got = map[simCell]bool{}
		}
		lo, hi := wr.layers.Lo, wr.layers.Hi
		if hi == 0 {
			lo, hi = 0, simLayers
		}
		for _, pg := range wr.pages {
			for l := lo; l < hi; l++ {
				w.got[simCell{dInc: wr.dstInc, src: w.incSlot[wr.srcInc], room: wr.room, page: pg, layer: l}] = true
			}
		}
	}
	if d := w.procs[wr.dstSlot]; d.inc == wr.dstInc && !d.dead && wr.notif != "" {
		d.notifs = append(d.notifs, wr.notif)
	}
}

// digestCheck models the decode shell's digest check (kvmanager's
// checkDigest): every page's true sum is 0 here, so a notification whose
// digest names another for a position does not match ("" when all do).
func (w *simWorld) digestCheck(x Notified) (corrupt string, checked bool) {
	for i, s := range x.Digests {
		if s != 0 {
			return fmt.Sprintf("position %d: CRC-32C 00000000, the prefill rank's digest %08x", x.Off+i, s), false
		}
	}
	if x.Digests != nil && x.N > 0 {
		w.cov.hit("digest checked")
		return "", true
	}
	return "", false
}

// markBad records the pages and layers of a write that landed corrupted.
func (w *simWorld) markBad(wr simWrite) {
	w.bad = maps.Clone(w.bad) // clones share it
	if w.bad == nil {
		w.bad = map[simCell]bool{}
	}
	lo, hi := wr.layers.Lo, wr.layers.Hi
	if hi == 0 {
		lo, hi = 0, simLayers
	}
	for _, pg := range wr.pages {
		for l := lo; l < hi; l++ {
			w.bad[simCell{dInc: wr.dstInc, src: w.incSlot[wr.srcInc], room: wr.room, page: pg, layer: l}] = true
		}
	}
}

// writeCheck models the decode shell's write check (kvmanager's
// checkWrite): what of a chunk notification's pages and layers did not
// land in process p ("" when all did).
func (w *simWorld) writeCheck(p *simProc, x Notified) string {
	if x.Aux || x.Hi == 0 {
		return ""
	}
	spec, ok := w.specOf(x.Room)
	if !ok || x.UID < 0 || x.UID >= len(spec.prefills) {
		return ""
	}
	dests, _ := simDests(spec)
	for pos := max(x.Off, 0); pos < x.Off+x.N && pos < len(dests); pos++ {
		for l := x.Lo; l < x.Hi && l < simLayers; l++ {
			if !w.got[simCell{dInc: p.inc, src: spec.prefills[x.UID], room: x.Room, page: dests[pos], layer: l}] {
				return fmt.Sprintf("page %d layer %d from prefill %d did not land", dests[pos], l, spec.prefills[x.UID])
			}
		}
	}
	return ""
}

// checkReport: a decode room's load report is given only once nothing
// more can land (terminal, pages released), claims only pages and layers
// that landed from the source it names, and on Success claims all of
// them; a failed room's has a code.
func (w *simWorld) checkReport(p *simProc, room uint64) {
	rep, ok := p.core.Report(room)
	st, live := p.core.Status(room)
	_, held := p.core.decodeCore.holds[room]
	switch {
	case !live:
		return
	case ok && (held || !st.Terminal()):
		w.fail("room %d: %s gave a load report while %v with its pages held", room, p.from.Peer(), st)
		return
	case !ok && !held && st.Terminal():
		w.fail("room %d: %s gave no load report once %v and released", room, p.from.Peer(), st)
		return
	case !ok:
		return
	case st == Failed && rep.Code == "":
		w.fail("room %d: %s's load report of a failed room has no code", room, p.from.Peer())
	}
	spec := w.roomSpec(room)
	dests, _ := simDests(spec)
	for _, sr := range rep.Sources {
		if sr.Source < 0 || sr.Source >= len(spec.prefills) {
			w.fail("room %d: load report names source %d", room, sr.Source)
			continue
		}
		src := spec.prefills[sr.Source]
		for _, l := range sr.Landed {
			for i := l.First; i < l.First+l.Count; i++ {
				for layer := l.LayerLo; layer < l.LayerHi; layer++ {
					if i < 0 || i >= len(dests) || !w.got[simCell{dInc: p.inc, src: src, room: room, page: dests[i], layer: layer}] {
						w.fail("room %d: %s's load report says page %d layer %d landed from prefill %d; it did not", room, p.from.Peer(), i, layer, src)
						return
					}
				}
			}
		}
		if st == Success && !slices.Contains(spec.dummies, src) {
			n := 0
			for _, l := range sr.Landed {
				n += l.Count * (l.LayerHi - l.LayerLo)
			}
			if n != len(dests)*simLayers {
				w.fail("room %d: %s's load report of a successful room lists %d of %d page layers from prefill %d", room, p.from.Peer(), n, len(dests)*simLayers, src)
			}
		}
		if len(sr.Landed) > 0 && st == Failed {
			w.cov.hit("load report of a failed room with pages")
		}
	}
	// Whole: every page layer it claims landed from every prefill rank
	// that writes it (here every non-dummy source writes every layer).
	for _, l := range rep.Whole() {
		for i := l.First; i < l.First+l.Count; i++ {
			for layer := l.LayerLo; layer < l.LayerHi; layer++ {
				for _, src := range spec.prefills {
					if slices.Contains(spec.dummies, src) {
						continue
					}
					if i < 0 || i >= len(dests) || !w.got[simCell{dInc: p.inc, src: src, room: room, page: dests[i], layer: layer}] {
						w.fail("room %d: %s's load report says page %d layer %d is whole; prefill %d's part did not land", room, p.from.Peer(), i, layer, src)
						return
					}
				}
			}
		}
	}
	w.cov.hit("load report " + st.String())
}

// betweenLayers reports whether a prefill rank has sent some layers of a
// chunk of the room (any room: −1) and not the rest.
func (w *simWorld) betweenLayers(room int64) bool {
	for _, r := range w.rooms {
		if !r.layered || (room >= 0 && r.id != uint64(room)) {
			continue
		}
		for _, ps := range r.prefills {
			if sd := w.sides[[2]uint64{uint64(ps), r.id}]; sd != nil && sd.layer > 0 {
				return true
			}
		}
	}
	return false
}

func (w *simWorld) roomSpec(id uint64) simRoomSpec {
	r, ok := w.specOf(id)
	if !ok {
		panic(fmt.Sprintf("no room %d", id))
	}
	return r
}

// specOf is room id's spec, if it is one of the configuration's.
func (w *simWorld) specOf(id uint64) (simRoomSpec, bool) {
	for _, r := range w.rooms {
		if r.id == id {
			return r, true
		}
	}
	return simRoomSpec{}, false
}

func (w *simWorld) removeWrite(id int) simWrite {
	for i, wr := range w.writes {
		if wr.id == id {
			w.writes = append(w.writes[:i], w.writes[i+1:]...)
			return wr
		}
	}
	panic("no such write")
}

func (w *simWorld) writeDone(wr simWrite, err error, quiesced bool) {
	s := w.incSlot[wr.srcInc]
	p := w.procs[s]
	if p.inc != wr.srcInc || p.dead {
		return // the process that posted it is gone
	}
	p.core.Step(w.now, WriteDone{Room: wr.room, Write: &kvlayout.Write{Last: wr.last, Remote: wr.remote}, Err: err, Quiesced: quiesced})
	w.doneBy = "writes" // ("" between steps: no part of the state)
	w.effects(s)
	w.doneBy = ""
}

// simEvent is one thing that can happen next.
type simEvent struct {
	name string
	do   func(w *simWorld)
}

// events lists every event enabled in w, in a deterministic order.
func (w *simWorld) events() []simEvent {
	var evs []simEvent
	add := func(name string, f func(w *simWorld)) { evs = append(evs, simEvent{name, f}) }
	n := w.cfg.slots()
	for src := 0; src < n; src++ {
		for dst := 0; dst < n; dst++ {
			src, dst := src, dst
			if q := w.net[src][dst]; len(q) > 0 {
				t := q[0].msg.Type()
				if !w.procs[dst].paused {
					add(fmt.Sprintf("deliver %d→%d %v", src, dst, t), func(w *simWorld) { w.deliver(src, dst) })
				}
				if !w.calm && w.losses < w.cfg.losses {
					add(fmt.Sprintf("lose %d→%d %v", src, dst, t), func(w *simWorld) {
						w.losses++
						w.cov.hit("message lost")
						w.net[src][dst] = w.net[src][dst][1:]
					})
				}
				if !w.calm && w.dups < w.cfg.dups {
					add(fmt.Sprintf("duplicate %d→%d %v", src, dst, t), func(w *simWorld) {
						w.dups++
						w.cov.hit("message duplicated")
						q := w.net[src][dst]
						w.net[src][dst] = append([]simMsg{q[0]}, q...)
					})
				}
			}
			if h := w.hist[src][dst]; h != nil && !w.calm && w.replays < w.cfg.replays && !w.procs[dst].dead {
				add(fmt.Sprintf("replay %d→%d %v", src, dst, h.msg.Type()), func(w *simWorld) {
					w.replays++
					w.cov.hit("message replayed")
					m := *w.hist[src][dst]
					m.to = w.procs[dst].endpoint // to whatever process holds the slot now
					w.net[src][dst] = append(w.net[src][dst], m)
				})
			}
		}
	}
	for s := 0; s < n; s++ {
		s := s
		if !w.active(s) {
			continue
		}
		if len(w.resolves[s]) > 0 {
			t := w.resolves[s][0]
			add(fmt.Sprintf("resolve at %d", s), func(w *simWorld) { w.resolve(s, w.records[t.Rank]) })
			if pr := w.prev[t.Rank]; w.cfg.staleViews && !w.calm && pr.set && w.now.Sub(pr.replaced) < simLease {
				add(fmt.Sprintf("resolve at %d (stale view)", s), func(w *simWorld) {
					w.cov.hit("stale lookup")
					w.stales++
					w.resolve(s, w.prev[t.Rank])
				})
			}
			if !w.calm && w.lookupFails < w.cfg.lookupFails {
				add(fmt.Sprintf("resolve at %d fails (bootstrap down)", s), func(w *simWorld) {
					w.lookupFails++
					w.cov.hit("lookup failed")
					w.resolves[s] = w.resolves[s][1:]
					w.procs[s].core.Step(w.now, ResolveFailed{Target: t, Err: errors.New("bootstrap server unreachable")})
					w.effects(s)
				})
			}
		}
		if !w.isPrefill(s) && w.cfg.pushes {
			d := s - w.cfg.prefills
			for pr := range w.records {
				pr := pr
				if w.pushed[d][pr] != w.records[pr].gen {
					add(fmt.Sprintf("push %d's record to %d", pr, s), func(w *simWorld) { w.push(s, pr) })
				}
			}
		}
		if len(w.procs[s].jobs) > 0 {
			add(fmt.Sprintf("post at %d", s), func(w *simWorld) { w.post(s) })
		}
		if len(w.procs[s].loads) > 0 {
			add(fmt.Sprintf("metadata loaded at %d", s), func(w *simWorld) {
				if ld := w.procs[s].loads[0]; len(w.trace) > ld.at+1 {
					w.cov.hit("REGISTER bound with other events between its check and its bind")
				}
				w.bind(s)
			})
			if !w.calm && w.loadFails < w.cfg.loadFails {
				add(fmt.Sprintf("metadata load at %d fails", s), func(w *simWorld) {
					w.loadFails++
					w.cov.hit("metadata load failed")
					p := w.procs[s]
					if p.closed {
						w.cov.hit("REGISTER's load failed at a closed rank")
					}
					ld := p.loads[0]
					p.loads = p.loads[1:]
					p.core.Step(w.now, RegisterRefused{From: ld.from, Reason: "loading the peer's metadata: refused by the engine"})
					w.effects(s)
				})
			}
		}
		// deliver steps the next notification; unsummed: its decode shell
		// could not sum its pages (unsummedNotifs).
		deliver := func(w *simWorld, unsummed bool) {
			p := w.procs[s]
			nt := p.notifs[0]
			p.notifs = p.notifs[1:]
			if IsChallenge(nt) {
				w.deliverChallenge(s, nt)
				return
			}
			x, ok := ParseNotif(nt)
			if !ok {
				w.fail("bad notification %q", nt)
				return
			}
			x.Undelivered = w.writeCheck(p, x)
			if st, live := p.core.Status(x.Room); x.Undelivered == "" && live && !st.Terminal() {
				if unsummed && x.Digests != nil && x.N > 0 {
					w.unsummed++
					x.Unsummed = "the device failed (simulated)"
				} else {
					x.Corrupt, x.Checked = w.digestCheck(x) // (the shell checks a live room's only)
				}
			}
			st, _ := p.core.Status(x.Room)
			p.core.Step(w.now, x)
			if x.Unsummed != "" && !st.Terminal() {
				if now, live := p.core.Status(x.Room); live && now != Failed {
					w.fail("room %d: %s took a notification its shell could not sum and is %v", x.Room, p.from.Peer(), now)
				}
				if code := failCode(p.core, x.Room); code != CodeFailed {
					w.fail("room %d: failed by its own shell's failure to sum, code %q", x.Room, code)
				}
				w.cov.hit("notification its shell could not sum failed its room")
			}
			w.notified(s, x, st)
		}
		if n := w.procs[s].notifs; len(n) > 0 && !w.calm && w.unsummed < w.cfg.unsummedNotifs && !IsChallenge(n[0]) {
			add(fmt.Sprintf("notif at %d unsummed", s), func(w *simWorld) { deliver(w, true) })
		}
		if len(w.procs[s].notifs) > 0 {
			add(fmt.Sprintf("notif at %d", s), func(w *simWorld) { deliver(w, false) })
		}
	}
	for _, wr := range w.writes {
		id := wr.id
		if wr.ghost {
			add(fmt.Sprintf("late landing of write %d", id), func(w *simWorld) {
				w.cov.hit("failed write landed")
				w.land(w.removeWrite(id))
			})
			continue
		}
		if !w.active(w.incSlot[wr.srcInc]) {
			continue // its pool is paused (a dead one's writes are ghosts)
		}
		if d := w.procs[wr.dstSlot]; (d.inc != wr.dstInc || d.dead) && !wr.landed {
			// Its destination process is gone: the transport reports the
			// write failed (nothing of it lands).
			add(fmt.Sprintf("write %d fails quiesced", id), func(w *simWorld) {
				w.cov.hit("write to a gone process failed")
				w.writeDone(w.removeWrite(id), errors.New("remote agent gone"), true)
			})
			continue
		}
		add(fmt.Sprintf("write %d ok", id), func(w *simWorld) {
			wr := w.removeWrite(id)
			if !wr.landed {
				w.land(wr)
			}
			w.writeDone(wr, nil, true)
		})
		if !w.calm && !wr.landed && wr.digest && w.corrupts < w.cfg.corruptWrites {
			add(fmt.Sprintf("write %d lands corrupted", id), func(w *simWorld) {
				w.corrupts++
				wr := w.removeWrite(id)
				w.cov.hit("write landed corrupted")
				// Its bytes are not the ones digested: the notification's
				// first sum is not the page's.
				n, _ := ParseNotif(wr.notif)
				i := strings.LastIndexByte(wr.notif, ':') - 8*n.N
				wr.notif = wr.notif[:i] + "0badbad0" + wr.notif[i+8:]
				w.land(wr)
				w.markBad(wr)
				w.writeDone(wr, nil, true)
			})
		}
		if !w.calm && !wr.landed && len(wr.pages) > 0 && w.silents < w.cfg.silentWrites {
			add(fmt.Sprintf("write %d reported done, not landed", id), func(w *simWorld) {
				w.silents++
				wr := w.removeWrite(id)
				w.cov.hit("write reported done, its data lost (silent)")
				if d := w.procs[wr.dstSlot]; d.inc == wr.dstInc && !d.dead && wr.notif != "" {
					d.notifs = append(d.notifs, wr.notif)
				}
				w.writeDone(wr, nil, true)
			})
		}
		if w.calm || wr.landed || w.cfg.writesOK {
			continue
		}
		add(fmt.Sprintf("write %d fails quiesced", id), func(w *simWorld) {
			w.writeDone(w.removeWrite(id), errors.New("refused by the engine"), true)
		})
		if w.cfg.mayLand {
			add(fmt.Sprintf("write %d fails but may land", id), func(w *simWorld) {
				for i := range w.writes {
					if w.writes[i].id == id {
						w.writes[i].ghost = true
						w.writeDone(w.writes[i], errors.New("transport error"), false)
						return
					}
				}
			})
		}
	}
	w.readEvents(add)
	w.intruderEvents(add)
	w.forgerEvents(add)
	w.appEvents(add)
	w.heartbeatEvents(add)
	if !w.calm {
		w.faultEvents(add)
		if w.cfg.ticks == 0 || (w.cfg.ticks > 0 && w.ticks < w.cfg.ticks) {
			for _, d := range w.deadlines() {
				d := d
				add(fmt.Sprintf("time +%v", d), func(w *simWorld) { w.ticks++; w.tick(d) })
			}
		}
	}
	return evs
}

// resolve answers the slot's first lookup from rec.
func (w *simWorld) resolve(s int, rec simRecord) {
	t := w.resolves[s][0]
	w.resolves[s] = w.resolves[s][1:]
	c := w.procs[s].core
	if rec.live(w.now) {
		tg := c.decodeCore.targets[t.key()]
		moved := tg != nil && tg.probeLost && tg.resolved && tg.endpoint != rec.endpoint
		var old string
		if moved {
			old = tg.endpoint
		}
		in := Resolved{Target: t, Endpoint: rec.endpoint}
		if w.cfg.recordEpochs {
			in.Epoch = rec.epoch
		}
		before := c.stats.ClosedRecords
		c.Step(w.now, in)
		if c.stats.ClosedRecords > before {
			w.cov.hit("lookup names the process that said it closed")
		}
		if moved {
			// A lookup after a lost probe that names another process: the
			// rooms whose REQUEST went to the silent one fail at once
			// (both sides told), not at the heartbeat bound.
			w.cov.hit("lookup after a lost probe names another endpoint")
			for _, id := range slices.Sorted(maps.Keys(c.reg.rooms)) {
				rm := c.reg.rooms[id]
				if rm.dec == nil || rm.status.Terminal() {
					continue
				}
				for _, src := range rm.dec.sources {
					if src.target == t.key() && src.sent {
						w.fail("room %d: %s still %v bound to %s after a lookup that followed a lost probe named %s", id, w.procs[s].from.Peer(), rm.status, old, rec.endpoint)
					}
				}
			}
		}
	} else {
		w.cov.hit("lookup found no record")
		c.Step(w.now, ResolveFailed{Target: t, Err: fmt.Errorf("%w: sim rank %d", wire.ErrRankUnknown, t.Rank)})
	}
	w.effects(s)
}

// push delivers prefill rank pr's latest record to the decode rank in
// slot s, as a discovery watch does (late, the changes between coalesced).
func (w *simWorld) push(s, pr int) {
	w.cov.hit("discovery push")
	rec := w.records[pr]
	w.pushed[s-w.cfg.prefills][pr] = rec.gen
	w.procs[s].core.Step(w.now, TargetChanged{Target: Target{Bootstrap: "sim", Rank: pr}, Endpoint: rec.endpoint, Epoch: rec.epoch, Gone: !rec.live(w.now)})
	w.effects(s)
}

// deadlines are the time jumps: past the register retry (restarts and
// losses), past the stall deadline, past every room deadline, past the
// quarantine, past the TTL.
func (w *simWorld) deadlines() []time.Duration {
	if w.cfg.jumps != nil {
		return w.cfg.jumps
	}
	r := w.cfg.reg
	ds := []time.Duration{r.StallTimeout, max(r.BootstrapTimeout, r.PendingTimeout, r.WaitingTimeout), w.cfg.quarantine, r.TombstoneTTL}
	if w.cfg.restarts > 0 || w.cfg.kills > 0 || w.cfg.losses > 0 || w.cfg.pauses > 0 {
		ds = append(ds, time.Second)
	}
	slices.Sort(ds)
	return slices.Compact(ds)
}

func (w *simWorld) tick(d time.Duration) {
	w.now = w.now.Add(d + time.Millisecond)
	// The pool reports a write that did not finish within the stall
	// deadline as failed: it may still land.
	for i := range w.writes {
		if wr := w.writes[i]; !wr.ghost && !wr.landed && w.now.Sub(wr.posted) > w.cfg.reg.StallTimeout && w.active(w.incSlot[wr.srcInc]) {
			w.writes[i].ghost = true
			w.writeDone(w.writes[i], errors.New("stalled"), false)
		}
	}
	// A paused pool's writes land all the same (the NIC does not wait for
	// the CPU): by simWriteLife; the pool sees them complete when it
	// resumes.
	for i := range w.writes {
		if wr, d := w.writes[i], w.procs[w.writes[i].dstSlot]; !wr.ghost && !wr.landed && w.now.Sub(wr.posted) > simWriteLife && d.inc == wr.dstInc && !d.dead {
			w.writes[i].landed = true
			w.cov.hit("write landed while its pool was paused")
			w.land(wr)
		}
	}
	// The model's timing assumption: no write lands later than
	// simWriteLife after it was posted.
	w.writes = slices.DeleteFunc(w.writes, func(wr simWrite) bool {
		return wr.ghost && w.now.Sub(wr.posted) > simWriteLife
	})
	w.tickReads()
	w.hostileRenews()
	// A dead process's record lives out its lease.
	for pr, rec := range w.records {
		if rec.set && rec.dead && !w.now.Before(rec.expires) {
			w.records[pr] = simRecord{gen: rec.gen + 1}
			w.cov.hit("record expired")
		}
	}
	for s, p := range w.procs {
		if !w.active(s) {
			continue
		}
		lost, expired, renewed := p.core.stats.ProbesLost, p.core.stats.LeaseExpiries, p.core.stats.LeaseRenewals
		unechoed, notOwner := p.core.stats.ChallengesExpired, p.core.stats.LayoutRefused[RefusedNotOwner]
		offerUnechoed, offersRefused := p.core.stats.OfferChallengesExpired, p.core.stats.OffersRefused
		p.core.Step(w.now, Tick{})
		if p.core.stats.OfferChallengesExpired > offerUnechoed {
			if p.core.stats.OffersRefused > offersRefused {
				w.cov.hit("offer challenge expired: offer refused")
			} else {
				w.cov.hit("offer challenge expired: forgotten")
			}
		}
		if p.core.stats.LayoutRefused[RefusedNotOwner] > notOwner {
			w.cov.hit("challenge expired: registration refused")
		} else if p.core.stats.ChallengesExpired > unechoed {
			w.cov.hit("challenge expired: forgotten")
		}
		if p.core.stats.ProbesLost > lost {
			w.cov.hit("probe lost: rank looked up again")
		}
		if p.core.stats.LeaseExpiries > expired {
			w.cov.hit("lease expired")
		}
		if p.core.stats.LeaseRenewals > renewed {
			w.cov.hit("lease renewed")
		}
		w.effects(s)
		// No room may stay non-terminal past its deadline.
		if n := p.core.reg.Overdue(w.now); n > 0 {
			w.fail("%s: %d rooms past their deadline after a tick", p.from.Peer(), n)
		}
	}
}

// deliver hands the next message of a link to the destination's core, as
// the control loop and shell do; nobody receives it if no process listens
// at the endpoint it was sent to any more.
func (w *simWorld) deliver(src, dst int) {
	m := w.net[src][dst][0]
	w.net[src][dst] = w.net[src][dst][1:]
	p := w.procs[dst]
	if p.dead || p.endpoint != m.to {
		w.cov.hit("message to a gone process")
		return
	}
	if w.cfg.replays > 0 {
		w.hist[src][dst] = &m
	}
	c := p.core
	switch msg := m.msg.(type) {
	case *wire.Register:
		// The epoch check and CheckRegister; a REGISTER that passes comes
		// back as EffectLoadMetadata (effects: a load in progress, bound
		// at once unless regWindow makes the bind an event of its own).
		if p.closed {
			w.cov.hit("REGISTER to a closed rank")
		}
		cp := *msg
		cp.From = m.from
		c.Step(w.now, Received{&cp})
	case *wire.RegisterAck:
		cp := *msg
		cp.From = m.from
		c.Step(w.now, Received{&cp})
	case *wire.Request:
		if p.closed {
			w.cov.hit("REQUEST to a closed rank")
		}
		cp := *msg
		cp.From = m.from
		if rm := c.reg.rooms[msg.Room]; rm != nil && rm.required > 0 && len(rm.requests) >= rm.required {
			w.cov.hit("REQUEST beyond the room's required")
		}
		if w.foreign(dst, m.from, msg.Room) {
			w.checkForeign(dst, msg, msg.Room, func() { c.Step(w.now, Received{&cp}) })
			break
		}
		kept := 0
		if rm := c.reg.rooms[msg.Room]; rm != nil {
			kept = len(rm.pre.early)
		}
		if c.Step(w.now, Received{&cp}).OK {
			if rm := c.reg.rooms[msg.Room]; kept > 0 && rm != nil && len(rm.pre.early) == 0 {
				// Planned in the REQUEST's step (or the room failed there).
				w.cov.hit("kept chunks planned at the REQUEST")
			}
			w.checkOneInstance(dst, msg.Room)
			k := simKey{pInc: p.inc, dInc: incOf(m.from.Epoch), room: msg.Room}
			if _, again := w.asked[k]; again {
				w.cov.hit("REQUEST accepted twice")
			}
			w.asked[k] = simAsk{pages: slices.Clone(msg.DstPages), aux: msg.AuxIndex}
		}
	case *wire.Abort:
		cp := *msg
		cp.From = m.from
		if w.foreign(dst, m.from, msg.Room) {
			w.checkForeign(dst, msg, msg.Room, func() { c.Step(w.now, Received{&cp}) })
			break
		}
		w.heard[simKey{pInc: p.inc, dInc: incOf(m.from.Epoch), room: msg.Room}] = true
		if w.isPrefill(dst) {
			w.noteEarlyAbort(p, msg.Room)
		}
		c.Step(w.now, Received{&cp})

	case *wire.AbortAck:
		cp := *msg
		cp.From = m.from
		c.Step(w.now, Received{&cp})
	case *wire.Status:
		cp := *msg
		cp.From = m.from
		if msg.Code == CodeClosed && c.decodeCore != nil {
			w.closingNotice(c, &cp)
			break
		}
		c.Step(w.now, Received{&cp})
	case *wire.Pages:
		cp := *msg
		cp.From = m.from
		c.Step(w.now, Received{&cp})
	case *wire.Renew:
		cp := *msg
		cp.From = m.from
		if w.foreign(dst, m.from, msg.Room) {
			w.checkForeign(dst, msg, msg.Room, func() { c.Step(w.now, Received{&cp}) })
			break
		}
		c.Step(w.now, Received{&cp})
	case *wire.ReadDone:
		cp := *msg
		cp.From = m.from
		if msg.Drained {
			w.cov.hit("READ_DONE drained")
		} else {
			w.cov.hit("READ_DONE not drained")
		}
		if w.foreign(dst, m.from, msg.Room) {
			w.checkForeign(dst, msg, msg.Room, func() { c.Step(w.now, Received{&cp}) })
			break
		}
		c.Step(w.now, Received{&cp})
		w.doneBy = "READ_DONE" // (reset below, after its effects)
	case *wire.Ping:
		// The control loop answers a PING itself (a decode core's probe).
		pong := simMsg{from: p.from, to: m.from.Endpoint, msg: &wire.Pong{Seq: msg.Seq}}
		if w.cfg.latePongs && dst == 0 {
			// latePongs: answered, but only past the probe timeout.
			w.late = append(w.late, simLate{src: dst, dst: src, due: w.now.Add(simProbeIdle/4 + time.Millisecond), msg: pong})
			w.cov.hit("hostile: PONG held past the probe timeout")
			break
		}
		w.net[dst][src] = append(w.net[dst][src], pong)
	case *wire.Pong:
		cp := *msg
		cp.From = m.from
		if c.decodeCore != nil && c.decodeCore.targetAt(m.from.Endpoint) != nil && c.decodeCore.targetAt(m.from.Endpoint).probing {
			w.cov.hit("probe answered")
		}
		c.Step(w.now, Received{&cp})
	}
	w.effects(dst)
	w.doneBy = ""
}

// closingNotice steps a closing prefill process's notice into a decode
// core, recording what it reached: rooms it fails at once (their REQUEST
// never taken: the released checks prove no write of them can land) and
// rooms it leaves to their writes.
func (w *simWorld) closingNotice(c *Core, msg *wire.Status) {
	if tg := c.decodeCore.targetAt(msg.From.Endpoint); tg != nil && tg.epoch == msg.From.Epoch {
		for _, rm := range c.decodeCore.roomsAt(tg.t.key()) {
			for _, s := range rm.dec.sources {
				if !rm.status.Terminal() && s.target == tg.t.key() && s.sent && s.epoch == msg.From.Epoch && s.n <= msg.Taken {
					w.cov.hit("closing notice: a room taken before Close left to its writes")
				}
			}
		}
	}
	for _, h := range c.decodeCore.holds {
		for _, s := range h.srcs {
			if h.failed && s.sent && s.epoch == msg.From.Epoch && s.n > msg.Taken {
				w.cov.hit("closing notice: a room failed before it, its REQUEST never taken, pages freed")
			}
		}
	}
	heard, untaken := c.stats.ClosedHeard, c.stats.ClosedUntaken
	c.Step(w.now, Received{msg})
	if c.stats.ClosedHeard > heard {
		w.cov.hit("closing notice heard")
	}
	if c.stats.ClosedUntaken > untaken {
		w.cov.hit("closing notice: a REQUEST never taken, its room failed and pages freed at once")
	}
}

// bind completes the slot's first metadata load: Registered.
func (w *simWorld) bind(slot int) {
	p := w.procs[slot]
	ld := p.loads[0]
	p.loads = p.loads[1:]
	if ld.agent != remoteName(ld.from) {
		// The data plane would now go through another process's agent:
		// its proof read first (the confused deputy).
		w.fail("%s loads, for %s, a blob naming agent %s: another process's", p.from.Peer(), ld.from.Peer(), ld.agent)
	}
	if p.closed {
		w.cov.hit("REGISTER's load ended at a closed rank")
	}
	p.core.Step(w.now, Registered{From: ld.from, Remote: remoteName(ld.from), Plan: ld.plan})
	w.effects(slot)
}

// acceptOffer loads and proves a decode process's next offer: a proof read
// through another process's agent than the offering one's would be the
// confused deputy; the simulator's offers are each their process's own.
func (w *simWorld) acceptOffer(slot int) {
	p := w.procs[slot]
	pl := p.offers[0]
	p.offers = p.offers[1:]
	from := pl.Ack.From
	if pl.Ack.Pull.Agent != remoteName(from) {
		w.fail("%s loads, for %s's offer, agent %s: another process's", p.from.Peer(), from.Peer(), pl.Ack.Pull.Agent)
	}
	w.cov.hit(fmt.Sprintf("pull offer loaded (repeat %v)", pl.Repeat))
	p.core.Step(w.now, OfferLoaded{Plan: pl})
	w.effects(slot)
}

// post gates and posts the next write of the pool's first job.
func (w *simWorld) post(slot int) {
	p := w.procs[slot]
	job := &p.jobs[0]
	wr := job.writes[0]
	job.writes = job.writes[1:]
	room := job.room
	if len(job.writes) == 0 {
		p.jobs = p.jobs[1:]
	}
	ok := p.core.Step(w.now, Posting{Room: room, Write: &wr}).OK
	w.effects(slot)
	if !ok {
		return
	}
	// Invariant 2: nothing is posted for a room that failed here.
	if st, _ := p.core.Status(room); st != Transferring {
		w.fail("room %d: %s posted a write in %v", room, p.from.Peer(), st)
	}
	// Invariant 8, against the simulator's own record: the write goes to
	// a decode process whose REQUEST for this room this prefill process
	// accepted, into pages that REQUEST named.
	dstInc := remoteInc(wr.Remote)
	k := simKey{pInc: p.inc, dInc: dstInc, room: room}
	ask, asked := w.asked[k]
	var pages []uint32
	for _, r := range wr.Runs {
		for i := uint32(0); i < r.Len; i++ {
			pages = append(pages, r.Dst+i)
		}
	}
	switch {
	case !asked:
		w.fail("room %d: write aimed at process %d (epoch %d), whose REQUEST this prefill process never accepted", room, dstInc, epochOf(dstInc))
	case wr.AuxSrc >= 0 && wr.AuxDst != ask.aux:
		w.fail("room %d: aux write into item %d, the REQUEST named %d", room, wr.AuxDst, ask.aux)
	case wr.AuxSrc < 0 && slices.ContainsFunc(pages, func(pg uint32) bool { return !slices.Contains(ask.pages, pg) }):
		w.fail("room %d: write into pages %v, the REQUEST named %v", room, pages, ask.pages)
	}
	if r, ok := w.rel[[2]int{dstInc, int(room)}]; ok && !r.forced {
		w.fail("room %d: write posted into pages already released", room)
	}
	notif, digest := wr.Notif, false
	if n, ok := ParseNotif(notif); ok && wr.Digest && !n.Aux && n.N > 0 && wr.AuxSrc < 0 && wr.State < 0 {
		// The pool's digest: a sum a position, and the last page's units.
		notif, digest = notif+":"+strings.Repeat("00000000", n.N)+":1", true
	}
	w.nextWrite++
	w.writes = append(w.writes, simWrite{id: w.nextWrite, srcInc: p.inc, room: room, dstSlot: remoteSlot(wr.Remote),
		dstInc: dstInc, notif: notif, last: wr.Last, posted: w.now, aborted: w.heard[k], pages: pages, layers: wr.Layers, auxDst: wr.AuxDst,
		remote: wr.Remote, digest: digest})
}

// appEvents: what the applications on each rank may do with each room.
func (w *simWorld) appEvents(add func(string, func(*simWorld))) {
	for _, r := range w.rooms {
		r := r
		for _, ps := range r.prefills {
			ps := ps
			pkey := [2]uint64{uint64(ps), r.id}
			sd, p := w.sides[pkey], w.procs[ps]
			// Closures act on the world they are applied to (a clone).
			at := func(f func(w *simWorld, sd *simSide, p *simProc)) func(*simWorld) {
				return func(w *simWorld) { f(w, w.sides[pkey], w.procs[ps]) }
			}
			if (sd.inc != 0 && sd.inc != p.inc) || !w.active(ps) {
				continue // created by a process that is gone, or paused
			}
			name := fmt.Sprintf("room %d prefill %d", r.id, ps)
			st, _ := p.core.Status(r.id)
			switch {
			case sd.inc == 0:
				if !w.calm {
					add(name+" create", at(func(w *simWorld, sd *simSide, p *simProc) {
						sd.inc = p.inc
						if errors.Is(p.core.Step(w.now, CreateSender{Room: r.id}).Result.Err, ErrRankClosed) {
							w.cov.hit("room refused: rank closed")
						}
						w.checkEarlyAbort(p, r.id)
						w.effects(ps)
					}))
				}
				continue
			case sd.cleared:
				continue
			case !sd.inited:
				add(name+" init", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.inited = true
					p.core.Step(w.now, InitSender{Room: r.id})
					w.effects(ps)
				}))
			case sd.sent < r.chunks && !sd.aborted && r.layered:
				if st == WaitingForInput || st == Transferring || (r.early && st == Bootstrapping) {
					add(fmt.Sprintf("%s send chunk %d layer %d", name, sd.sent, sd.layer), at(func(w *simWorld, sd *simSide, p *simProc) {
						k, l := sd.sent, sd.layer
						if sd.layer++; sd.layer == simLayers {
							sd.sent, sd.layer = sd.sent+1, 0
						}
						if err := p.core.Step(w.now, SendChunk{Room: r.id, Pages: []uint32{uint32(k)}, Last: k == r.chunks-1,
							Layers: kvlayout.Layers{Lo: l, Hi: l + 1}}).Err; err == nil {
							w.cov.hit("layer group sent")
							if st, _ := p.core.Status(r.id); st == Bootstrapping {
								w.cov.hit("chunk handed over before the REQUEST")
							}
						}
						w.effects(ps)
					}))
				}
			case sd.sent < r.chunks && !sd.aborted:
				if st == WaitingForInput || st == Transferring || (r.early && st == Bootstrapping) {
					add(fmt.Sprintf("%s send chunk %d", name, sd.sent), at(func(w *simWorld, sd *simSide, p *simProc) {
						k := sd.sent
						sd.sent++
						err := p.core.Step(w.now, SendChunk{Room: r.id, Pages: []uint32{uint32(k)}, Last: k == r.chunks-1}).Err
						if st, _ := p.core.Status(r.id); err == nil && st == Bootstrapping {
							w.cov.hit("chunk handed over before the REQUEST")
						}
						w.effects(ps)
					}))
				}
			}
			if !sd.aborted && w.cfg.prefillAbort && !w.calm {
				add(name+" abort", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.aborted = true
					st, _ := p.core.Status(r.id)
					if rm := p.core.reg.rooms[r.id]; rm != nil && len(rm.pre.early) > 0 {
						w.cov.hit("prefill abort with chunks kept")
					}
					if p.core.Step(w.now, AbortSender{Room: r.id, Reason: "app"}).Result.Outcome == Applied {
						w.cov.hit("prefill abort in " + st.String())
						if w.betweenLayers(int64(r.id)) {
							w.cov.hit("prefill abort between layers")
						}
					}
					w.effects(ps)
				}))
			}
			if w.cfg.noClear || r.id >= simProbeRooms || !(st.Terminal() || ((sd.aborted || w.cfg.clearLive || w.cfg.prefillClearLive) && !w.calm)) {
				continue
			}
			add(name+" clear", at(func(w *simWorld, sd *simSide, p *simProc) {
				sd.cleared, sd.clearAt = true, w.now
				p.core.Step(w.now, ClearSender{Room: r.id})
				w.effects(ps)
			}))
		}
		for _, ds := range r.decodes {
			ds := ds
			slot := w.cfg.prefills + ds
			dkey := [2]uint64{uint64(slot), r.id}
			sd, p := w.sides[dkey], w.procs[slot]
			at := func(f func(w *simWorld, sd *simSide, p *simProc)) func(*simWorld) {
				return func(w *simWorld) { f(w, w.sides[dkey], w.procs[slot]) }
			}
			if (sd.inc != 0 && sd.inc != p.inc) || !w.active(slot) {
				continue
			}
			name := fmt.Sprintf("room %d decode %d", r.id, ds)
			st, _ := p.core.Status(r.id)
			switch {
			case sd.inc == 0:
				if !w.calm {
					add(name+" create", at(func(w *simWorld, sd *simSide, p *simProc) {
						sd.inc = p.inc
						var ls []Link
						aux := false
						for _, ps := range r.prefills {
							dummy := slices.Contains(r.dummies, ps)
							ls = append(ls, Link{Target: Target{Bootstrap: "sim", Rank: ps}, Dummy: dummy, Aux: !dummy && !aux})
							aux = aux || !dummy
						}
						if errors.Is(p.core.Step(w.now, CreateReceiver{Room: r.id, Links: ls}).Result.Err, ErrRankClosed) {
							w.cov.hit("room refused: rank closed")
						}
						w.effects(slot)
					}))
				}
				continue
			case sd.cleared:
				continue
			case !sd.inited && !w.cfg.decodeNoInit:
				add(name+" init", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.inited = true
					pages, aux := simDests(r)
					p.core.Step(w.now, InitReceiver{Room: r.id, Spec: RequestSpec{DstPages: pages, AuxIndex: aux, Required: r.req(), Pull: r.pull, Digest: w.cfg.digest}})
					w.effects(slot)
				}))
			}
			mayAbort := w.cfg.decodeAbort && (w.cfg.abortDecodes == nil || slices.Contains(w.cfg.abortDecodes, ds))
			if !sd.aborted && mayAbort && !w.calm {
				add(name+" abort", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.aborted = true
					st, _ := p.core.Status(r.id)
					if rm := p.core.reg.rooms[r.id]; rm != nil && len(rm.pre.early) > 0 {
						w.cov.hit("prefill abort with chunks kept")
					}
					stage := st.String()
					if rm := p.core.reg.rooms[r.id]; rm != nil && rm.dec != nil && slices.ContainsFunc(rm.dec.sources, func(s *source) bool { return s.sent }) {
						stage += ", REQUEST sent"
					}
					if p.core.Step(w.now, AbortReceiver{Room: r.id, Reason: "app"}).Result.Outcome == Applied {
						w.cov.hit("decode abort in " + stage)
						if w.betweenLayers(int64(r.id)) {
							w.cov.hit("decode abort between layers")
						}
						// The invariant follows aborts that changed the room.
						sd.abortAt, sd.abortInc, sd.abortApplied = w.now, nil, true
						for _, ps := range r.prefills {
							sd.abortInc = append(sd.abortInc, w.procs[ps].inc)
						}
					}
					w.effects(slot)
				}))
			}
			// A live room's Clear is an abort then a clear (both reachable).
			if !w.cfg.noClear && !w.cfg.decodeNoClear && r.id < simProbeRooms && (st.Terminal() || ((sd.aborted || w.cfg.clearLive) && !w.calm)) {
				add(name+" clear", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.cleared = true
					p.core.Step(w.now, ClearReceiver{Room: r.id})
					w.effects(slot)
				}))
			}
		}
	}
}

// heartbeatEvents: what heartbeats tell a core about the endpoints it
// watches. A PONG from a new epoch at a watched endpoint goes through the
// epoch check; a watched endpoint nobody answers at (the process died,
// moved, or is paused) is reported dead. In the quiet phase these are the
// truth, unbounded; before it, a report counts against peerDowns, and a
// false one (a live process answers there) may be made too.
func (w *simWorld) heartbeatEvents(add func(string, func(*simWorld))) {
	for s := range w.procs {
		s := s
		if !w.active(s) {
			continue
		}
		c := w.procs[s].core
		for _, ep := range slices.Sorted(maps.Keys(c.watching)) {
			ep := ep
			o := w.procAt(ep)
			if o != nil && !o.paused {
				if h, ok := c.epochs[o.from.Peer()]; ok && h.epoch != o.from.Epoch {
					from := o.from
					add(fmt.Sprintf("%d hears %s restarted", s, ep), func(w *simWorld) {
						w.cov.hit("restart heard from a PONG")
						w.procs[s].core.Step(w.now, Received{&wire.Pong{From: from}})
						w.effects(s)
					})
				}
			}
			truly := o == nil || o.paused
			situation := fmt.Sprintf("%d|%s|", w.procs[s].inc, ep)
			if o != nil {
				situation += strconv.Itoa(o.inc)
			}
			if (w.calm && truly && !w.reported[situation]) || (!w.calm && w.peerDowns < w.cfg.peerDowns) {
				what := "dead"
				if !truly {
					what = "dead (falsely)"
				}
				add(fmt.Sprintf("%d finds %s %s", s, ep, what), func(w *simWorld) {
					if !w.calm {
						w.peerDowns++
					}
					w.reported = maps.Clone(w.reported) // shared with clones
					if w.reported == nil {
						w.reported = map[string]bool{}
					}
					w.reported[situation] = true
					w.cov.hit("peer reported " + what)
					w.procs[s].core.Step(w.now, PeerUnreachable{Endpoint: ep, Reason: wire.ReasonPeerUnreachable})
					w.effects(s)
				})
			}
		}
	}
}

// faultEvents: restarts in place, kills and starts on a new endpoint,
// pauses and resumes.
func (w *simWorld) faultEvents(add func(string, func(*simWorld))) {
	for s := range w.procs {
		s := s
		p := w.procs[s]
		switch {
		case p.dead:
			add(fmt.Sprintf("start %d", s), func(w *simWorld) { w.startAgain(s) })
			continue
		case p.paused:
			add(fmt.Sprintf("resume %d", s), func(w *simWorld) { w.resume(s) })
			continue
		}
		if w.restarts < w.cfg.restarts {
			add(fmt.Sprintf("restart %d", s), func(w *simWorld) {
				if w.betweenLayers(-1) {
					w.cov.hit("restart between layers")
				}
				w.restarts++
				w.kill(s)
				w.start(s, false)
			})
		}
		if w.kills < w.cfg.kills {
			add(fmt.Sprintf("kill %d", s), func(w *simWorld) { w.kills++; w.kill(s) })
		}
		switch {
		case p.closed:
			add(fmt.Sprintf("exit %d", s), func(w *simWorld) { w.exit(s) })
		case w.closes < w.cfg.closes:
			add(fmt.Sprintf("close %d", s), func(w *simWorld) {
				w.closes++
				p := w.procs[s]
				if len(p.core.reg.pending) > 0 {
					w.cov.hit("pending requests dropped at close")
				}
				for _, rm := range p.core.reg.rooms {
					if rm.role == RolePrefill && !rm.status.Terminal() && rm.inflight > 0 {
						w.cov.hit("prefill room failed at close with writes in flight")
					}
				}
				p.core.Step(w.now, Close{Reason: "sim close"})
				p.closed = true
				w.cov.hit("rank closed")

				w.effects(s)
			})
		}
		if w.pauses < w.cfg.pauses {
			add(fmt.Sprintf("pause %d", s), func(w *simWorld) {
				w.pauses++
				w.procs[s].paused, w.procs[s].pausedAt = true, w.now
			})
		}
	}
}

// kill ends the process in slot (kill -9): messages to it and its queued
// work are lost; its writes in flight may still land; its discovery
// record lives out its lease.
func (w *simWorld) kill(slot int) {
	p := w.procs[slot]
	for i := range w.writes {
		if w.writes[i].srcInc == p.inc {
			w.writes[i].ghost = true
		}
	}
	w.killReads(p.inc)
	for src := range w.net {
		w.net[src][slot] = nil
	}
	w.resolves[slot] = nil
	p.dead, p.jobs, p.notifs, p.handed = true, nil, nil, nil
	if w.isPrefill(slot) {
		w.records[slot].dead, w.records[slot].expires = true, w.now.Add(simLease)
	}
	for k, sd := range w.sides {
		if int(k[0]) == slot && sd.inc == p.inc {
			sd.lost = true // whatever that process still owed is gone with it
		}
	}
}

// exit ends a closed rank's process (after Close, the shell stops): as a
// kill from then on (counted with them: the protocol's timers carry what
// its peers learn from it).
func (w *simWorld) exit(slot int) {
	w.kills++
	w.kill(slot)
}

// startAgain starts a killed slot's next process, on a new endpoint.
func (w *simWorld) startAgain(slot int) {
	w.cov.hit("restart on a new endpoint")
	w.start(slot, true)
}

func (w *simWorld) resume(slot int) {
	p := w.procs[slot]
	if w.now.Sub(p.pausedAt) > 2*time.Second { // the heartbeat bound the shells use here
		w.cov.hit("paused past the heartbeat bound")
	}
	p.paused = false
}

// netQuiet reports whether no control work is pending: no message, lookup
// or queued chunk.
func (w *simWorld) netQuiet() bool {
	for _, row := range w.net {
		for _, q := range row {
			if len(q) > 0 {
				return false
			}
		}
	}
	for s := range w.procs {
		if len(w.resolves[s]) > 0 || len(w.procs[s].jobs) > 0 {
			return false
		}
	}
	return true
}

// checkState checks the invariants that concern a whole state.
func (w *simWorld) checkState() {
	for _, p := range w.procs {
		if p.dead {
			continue
		}
		w.checkTables(p)
		w.noteShares(p)
		if p.closed { // (the simulator's record, not the core's flag)
			// Invariant 22 (a closed rank holds nothing live): after
			// Close no room of the rank is live, none is created and no
			// request waits for a sender.
			for _, id := range slices.Sorted(maps.Keys(p.core.reg.rooms)) {
				if st := p.core.reg.rooms[id].status; !st.Terminal() {
					w.fail("invariant 22: %s is closed and room %d is %v", p.from.Peer(), id, st)
				}
			}
			if len(p.core.reg.pending) > 0 {
				w.fail("invariant 22: %s is closed and holds pending requests for rooms %v", p.from.Peer(), slices.Sorted(maps.Keys(p.core.reg.pending)))
			}
		}
		if p.core.decodeCore != nil {
			for _, id := range slices.Sorted(maps.Keys(p.core.reg.rooms)) {
				w.checkReport(p, id)
			}
		}
	}
	if !w.netQuiet() || w.losses > 0 || w.kills > 0 || w.pauses > 0 || w.lookupFails > 0 || w.stales > 0 {
		// Once a message was lost, a rank killed or stopped, or a lookup
		// failed or answered a stale record, the protocol's timers
		// (retries, re-lookups, deadlines) carry the news instead: the
		// quiet phase checks that they do.
		return
	}
	// Invariant 10 (a failure is never silent): once the network is
	// quiet, a decode room whose REQUEST a prefill process accepted and
	// whose room there failed is terminal too — no deadline needed —
	// while that decode process lives.
	for _, r := range w.rooms {
		for _, ps := range r.prefills {
			pc := w.procs[ps]
			if st, ok := pc.core.Status(r.id); !ok || st != Failed {
				continue
			}
			for _, ds := range r.decodes {
				dp := w.procs[w.cfg.prefills+ds]
				if _, asked := w.asked[simKey{pInc: pc.inc, dInc: dp.inc, room: r.id}]; !asked || dp.dead {
					continue
				}
				if st, ok := dp.core.Status(r.id); ok && !st.Terminal() {
					w.fail("room %d: prefill %d failed it, decode %d still %v with the network quiet", r.id, ps, ds, st)
				}
			}
		}
	}
	// Invariant 2 (an abort is never lost): once the network is quiet, an
	// abort applied on decode has reached every prefill rank of the room
	// that is still the same process: its room is terminal, or the id is
	// tombstoned so a sender created later starts Failed.
	for _, r := range w.rooms {
		for _, ds := range r.decodes {
			sd := w.sides[[2]uint64{uint64(w.cfg.prefills + ds), r.id}]
			if !sd.abortApplied || sd.lost || w.now.Sub(sd.abortAt) >= w.cfg.reg.TombstoneTTL || w.isHostile(w.cfg.prefills+ds) {
				continue // (the hostile rank withholds its ABORTs: the room ends by its deadline, L1)
			}
			for i, ps := range r.prefills {
				pc := w.procs[ps]
				if pc.inc != sd.abortInc[i] {
					continue
				}
				psd := w.sides[[2]uint64{uint64(ps), r.id}]
				// Ids are reserved for the TTL only, and under the tombstone
				// bound the oldest settled tombstones are forgotten sooner
				// (counted): a sender created later then waits out its
				// bootstrap deadline instead of starting Failed (liveness
				// still ends it).
				// So is an ABORT past the owed-ABORT bound (MaxPendingRooms
				// per rank) before the rank was looked up: dropped, counted.
				// Past its rank's share (MaxTombstones/8) a rank's oldest
				// early aborts are forgotten too — but never an honest rank's
				// for a flooding one's (hostileFlood: its share is its own).
				evicted := pc.core.reg.evicted > 0 || w.procs[w.cfg.prefills+ds].core.stats.AbortsDropped > 0 || w.forgotOwn(pc)
				if st, ok := pc.core.Status(r.id); ok && !st.Terminal() && !evicted {
					w.fail("room %d: decode %d aborted, prefill %d still %v with the network quiet", r.id, ds, ps, st)
				}
				forgotten := psd.cleared && w.now.Sub(psd.clearAt) >= w.cfg.reg.TombstoneTTL || evicted
				if _, ok := pc.core.Status(r.id); !ok && !forgotten {
					if _, tomb := pc.core.reg.tombs[r.id]; !tomb {
						w.fail("room %d: decode %d aborted, prefill %d has no trace of it with the network quiet", r.id, ds, ps)
					}
				}
			}
		}
	}
}

// noteEarlyAbort records an ABORT a prefill process hears for a room it has
// no sender for (no live room, no Cleared tombstone: before its sender
// exists).
func (w *simWorld) noteEarlyAbort(p *simProc, room uint64) {
	c := p.core
	if _, live := c.reg.rooms[room]; live {
		return
	}
	if t, ok := c.reg.tombs[room]; ok && t.kind == Cleared && w.now.Before(t.expires) {
		return
	}
	k := [2]uint64{uint64(p.inc), room}
	at, ok := w.earlyAbort[k]
	if !ok {
		at[0] = w.now
	}
	at[1] = w.now
	w.earlyAbort[k] = at
}

// checkEarlyAbort: a room id aborted before its sender existed is
// protected for the tombstone TTL from the last ABORT heard, not the
// first: a sender created inside it starts Failed (another decode rank's
// abort may come long after the first). Under the tombstone bound the
// oldest settled tombstones are forgotten sooner (counted).
func (w *simWorld) checkEarlyAbort(p *simProc, room uint64) {
	at, ok := w.earlyAbort[[2]uint64{uint64(p.inc), room}]
	ttl := w.cfg.reg.TombstoneTTL
	if !ok || w.now.Sub(at[1]) >= ttl {
		return
	}
	// (A closed rank creates no sender at all: invariant 22.)
	if st, _ := p.core.Status(room); st != Failed && p.core.reg.evicted == 0 && !w.forgotOwn(p) && !p.closed {
		w.fail("room %d: %s created its sender %s after the last ABORT it heard before the sender existed (inside the tombstone TTL of %s), and it started %v",
			room, p.from.Peer(), w.now.Sub(at[1]), ttl, st)
	}
	if w.now.Sub(at[0]) >= ttl {
		w.cov.hit("sender created past the first early ABORT's TTL, inside the last's")
	}
	if w.cfg.hostileFlood && p.core.reg.forgotten > 0 {
		w.cov.hit("sender created Failed after an early ABORT, the flooder's own forgotten")
	}
}

// observe records, after every event, what the simulator's own checks
// need from the cores' visible state: when each decode room (or its hold)
// first failed, and each room's terminal outcome.
func (w *simWorld) observe() {
	for _, p := range w.procs {
		if p.dead {
			continue
		}
		for _, id := range slices.Sorted(maps.Keys(p.core.reg.rooms)) {
			rm := p.core.reg.rooms[id]
			if rm.dec != nil && rm.status == Failed {
				if _, ok := w.failedAt[[2]int{p.inc, int(id)}]; !ok {
					w.failedAt[[2]int{p.inc, int(id)}] = w.now
				}
			}
			if rm.status.Terminal() && w.cov != nil && id < simProbeRooms { // the probes are counted apart
				if rm.dec != nil && rm.status == Success && p.core.stats.ProbesLost > 0 {
					w.cov.hitOnce(fmt.Sprintf("served after lost probe %d %d", p.inc, id), "room served after a lost probe")
				}
				w.cov.outcome(p.inc, id, rm.status, rm.reason)
			}
		}
		if d := p.core.decodeCore; d != nil {
			for _, id := range slices.Sorted(maps.Keys(d.holds)) {
				if h := d.holds[id]; h.failed {
					if _, ok := w.failedAt[[2]int{p.inc, int(id)}]; !ok {
						w.failedAt[[2]int{p.inc, int(id)}] = w.now
					}
				}
			}
		}
	}
}

func (w *simWorld) apply(ev simEvent) {
	w.trace = append(w.trace, ev.name)
	ev.do(w)
	w.observe()
	if w.err == nil {
		w.checkState()
	}
	if w.cfg.spawn > 0 && !w.calm {
		w.maybeSpawn()
	}
}

// maybeSpawn starts a new room (the next template with a fresh id) when
// fewer rooms than the configuration lists are unfinished, so a long run
// keeps rooms arriving as a server does.
func (w *simWorld) maybeSpawn() {
	open := 0
	for _, r := range w.rooms {
		for _, s := range w.slotsOf(r) {
			sd, p := w.sides[[2]uint64{uint64(s), r.id}], w.procs[s]
			if !sd.cleared && !sd.lost && !(sd.inc != 0 && sd.inc != p.inc) {
				open++
				break
			}
		}
	}
	if open >= len(w.cfg.rooms) || len(w.rooms) >= w.cfg.spawn {
		return
	}
	t := w.cfg.rooms[len(w.rooms)%len(w.cfg.rooms)]
	t.id = uint64(len(w.rooms) + 1)
	w.addRoom(t)
}

func (w *simWorld) slotsOf(r simRoomSpec) []int {
	out := slices.Clone(r.prefills)
	for _, d := range r.decodes {
		out = append(out, w.cfg.prefills+d)
	}
	return out
}

// ---- exhaustive exploration --------------------------------------------

// simExplore visits every state reachable from the initial world, depth
// first, each distinct state (by fingerprint hash) once, and checks every
// invariant on every transition; with cfg.live it also runs the quiet
// phase (liveness) from every state where only faults, time and the
// applications' own choices remain. It returns the number of distinct
// states and transitions, what was reached, or the first violation with
// the trace that reaches it (which replays exactly).
func simExplore(cfg simConfig, maxStates int) (states, transitions int, cov *simCoverage, err error) {
	return simExploreUpTo(cfg, maxStates, false)
}

// errExploredEnough ends a partial exploration at its bound.
var errExploredEnough = errors.New("explored up to the bound")

// simExploreUpTo is simExplore; with partial, it stops without error after
// maxStates distinct states (the first ones depth first: under the race
// detector, raceStates).
func simExploreUpTo(cfg simConfig, maxStates int, partial bool) (states, transitions int, cov *simCoverage, err error) {
	start := startWorld(cfg)
	if start.err != nil {
		return 0, 0, nil, start.err
	}
	cov = start.cov
	seen := map[[16]byte]struct{}{start.hash(): {}}
	var visit func(w *simWorld) error
	visit = func(w *simWorld) error {
		evs := w.events()
		if cfg.live && quiescent(evs) {
			q := w.clone()
			q.trace = slices.Clone(w.trace)
			q.liveness()
			if q.err != nil {
				return fmt.Errorf("%w\ntrace to the quiet phase (replay: runScript(cfg, trace), then liveness()):\n  %s", q.err, strings.Join(w.trace, "\n  "))
			}
		}
		for _, ev := range evs {
			next := w.clone()
			next.trace = slices.Clone(w.trace)
			next.apply(ev)
			transitions++
			if next.err != nil {
				min := minimize(cfg, next.trace, next.err)
				return fmt.Errorf("%w\nminimal trace (replay: runScript(cfg, trace)):\n  %s", next.err, strings.Join(min, "\n  "))
			}
			fp := next.hash()
			if _, ok := seen[fp]; ok {
				continue
			}
			seen[fp] = struct{}{}
			if len(seen) > maxStates {
				if partial {
					return errExploredEnough
				}
				return fmt.Errorf("more than %d states: bound the configuration", maxStates)
			}
			if err := visit(next); err != nil {
				return err
			}
		}
		return nil
	}
	err = visit(start)
	if errors.Is(err, errExploredEnough) {
		err = nil
	}
	return len(seen), transitions, cov, err
}

// quiescent: nothing but faults, time and the applications' choices
// (create, abort, clear) is left to happen.
func quiescent(evs []simEvent) bool {
	for _, ev := range evs {
		if !isChoice(ev.name) {
			return false
		}
	}
	return true
}

func isChoice(name string) bool {
	for _, k := range []string{"time", "restart", "kill", "start", "pause", "resume", "lose", "duplicate", "replay",
		"stale view", "fails", "finds", " create", " abort", " clear", "hears", "late landing"} {
		if strings.Contains(name, k) {
			return true
		}
	}
	return false
}

// startWorld is the initial world, after the configuration's prefix.
func startWorld(cfg simConfig) *simWorld {
	w := newSimWorld(cfg)
	w.cov = newSimCoverage()
	for _, name := range cfg.prefix {
		evs := w.events()
		k := slices.IndexFunc(evs, func(e simEvent) bool { return e.name == name })
		if k < 0 {
			w.fail("prefix event %q not enabled", name)
			return w
		}
		w.apply(evs[k])
	}
	w.trace = nil
	return w
}

// runScript applies events by name, in order, as far as each is enabled;
// it returns the world and how many events it applied (the first violation
// is in w.err).
func runScript(cfg simConfig, script []string) (*simWorld, int) {
	w := startWorld(cfg)
	for i, name := range script {
		evs := w.events()
		k := slices.IndexFunc(evs, func(e simEvent) bool { return e.name == name })
		if k < 0 {
			return w, i
		}
		w.apply(evs[k])
		if w.err != nil {
			return w, i + 1
		}
	}
	return w, len(script)
}

// minimize shrinks a failing trace: it drops events one at a time (from
// the end) while the same violation still happens, and returns the
// shortest trace found, which replays with runScript.
func minimize(cfg simConfig, trace []string, violation error) []string {
	want := violation.Error()
	if i := strings.Index(want, ":"); i > 0 {
		want = want[i:] // the room's message, without the event-specific prefix
	}
	fails := func(tr []string) bool {
		w, _ := runScript(cfg, tr)
		return w.err != nil && strings.HasSuffix(w.err.Error(), want)
	}
	if !fails(trace) {
		return trace
	}
	for changed := true; changed; {
		changed = false
		for i := len(trace) - 1; i >= 0; i-- {
			shorter := append(slices.Clone(trace[:i]), trace[i+1:]...)
			if fails(shorter) {
				trace, changed = shorter, true
			}
		}
	}
	// The violation happens at the last event: cut what follows.
	for n := 1; n <= len(trace); n++ {
		if fails(trace[:n]) {
			return trace[:n]
		}
	}
	return trace
}

// notified checks a delivered notification's outcome at decode process s
// (st: its room's status before the step) and carries out the effects.
func (w *simWorld) notified(s int, x Notified, st Poll) {
	p := w.procs[s]

	if x.Corrupt != "" && !st.Terminal() {
		if now, live := p.core.Status(x.Room); live && now != Failed {
			w.fail("room %d: %s took a notification whose pages do not match their digest (%s) and is %v", x.Room, p.from.Peer(), x.Corrupt, now)
		}
		if code := failCode(p.core, x.Room); code != CodeCorrupt {
			w.fail("room %d: failed by a digest mismatch, code %q", x.Room, code)
		}
		w.cov.hit("digest mismatch failed its room")
	}
	if x.Undelivered != "" && !st.Terminal() {
		if now, live := p.core.Status(x.Room); live && now != Failed {
			w.fail("room %d: %s took a notification naming bytes that did not land (%s) and is %v", x.Room, p.from.Peer(), x.Undelivered, now)
		}
		w.cov.hit("notification of a write not delivered failed its room")
	}
	w.effects(s)
}

// failCode is a failed decode room's code as the core recorded it (its
// load report gives it only once the pages are released).
func failCode(c *Core, room uint64) string {
	if rm, ok := c.reg.rooms[room]; ok && rm.dec != nil {
		return rm.dec.code
	}
	return ""
}
