package kvmanager

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
)

// This file is a deterministic simulator of kvbridge's protocol, in the
// style of etcd-io/raft's rafttest network and FoundationDB's simulation
// testing: several real Cores (prefill and decode ranks) composed over a
// simulated network in one goroutine. Everything that can happen is an
// event: deliver the next message of a link (FIFO per direction), resolve a
// target, post the next write, complete a write (ok; failed and quiesced;
// failed but still able to land; stalled), land a late write, deliver a
// notification (always after its data), a local call on a room (create,
// init, send a chunk, abort, clear), restart a rank (new epoch; messages
// to it and its pending work are lost, its writes in flight may still
// land), a false or true "peer dead" report, a restart noticed through
// heartbeats, and time jumping past each deadline. The simulator checks
// global invariants after every event (see check*). Two modes: explore
// (breadth first over every interleaving, states deduplicated by a
// fingerprint of the whole world) and random runs from a seed; a failure
// prints the seed and the event trace, which replays exactly.

// simConfig is one topology and its bounds.
type simConfig struct {
	prefills, decodes int
	rooms             []simRoomSpec
	restarts          int  // rank restarts allowed
	peerDowns         int  // "peer dead" reports allowed (true or false)
	mayLand           bool // writes may fail without being quiesced, and stall
	ticks             int  // time jumps allowed (0: unbounded, <0: none)
	// What the applications may do besides the normal path (exhaustive
	// configurations choose, to keep the state space small).
	prefillAbort, decodeAbort bool
	clearLive                 bool // decode and prefill may Clear a live room directly
	prefillClearLive          bool // prefill may Clear a live room directly
	noClear                   bool // rooms are never cleared (smaller spaces)
	reg                       RegistryConfig
	quarantine                time.Duration
	bugs                      []bugID // mutants on in every core (-tags kvbmutants)
}

// simRoomSpec: a room that the listed decode ranks receive from the listed
// prefill ranks (each a source), in chunks of one page.
type simRoomSpec struct {
	id       uint64
	decodes  []int
	prefills []int
	chunks   int
	dummies  []int // prefill ranks that are dummy links (they write nothing, as MLA's extra ranks)
}

func simRegistryConfig() RegistryConfig {
	return RegistryConfig{BootstrapTimeout: 10 * time.Second, WaitingTimeout: 20 * time.Second, StallTimeout: 5 * time.Second,
		PendingTimeout: 15 * time.Second, TombstoneTTL: 100 * time.Second, MaxPendingRooms: 64, MaxTombstones: 64,
		MaxPendingPerPeer: 32, MaxReasonBytes: 512}
}

const simPages = 8

func simLayout() transfer.Layout {
	return transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, AuxItemBytes: 16, Aux: nixl.Desc{Addr: 0x9000, Len: 4 * 16},
		Regions: []nixl.Desc{{Addr: 0x1000, Len: simPages * 64}, {Addr: 0x2000, Len: simPages * 64}}}
}

type simProc struct {
	core   *Core
	from   bootstrap.From
	inc    int      // incarnation: unique per process start
	jobs   []simJob // prefill: chunks queued in the pool
	notifs []string // decode: notifications arrived, in order
}

type simJob struct {
	room   uint64
	writes []transfer.Write
}

type simMsg struct {
	from bootstrap.From
	msg  bootstrap.Message
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
}

// simSide is what the application did with a room on one rank.
type simSide struct {
	inc                            int // incarnation that created it (0: not created)
	inited, aborted, cleared, lost bool
	abortApplied                   bool // decode: an app abort changed the room
	clearAt                        time.Time
	sent                           int // prefill: chunks sent
	abortAt                        time.Time
	abortInc                       []int // decode: prefill incarnations at abort time
}

type simWorld struct {
	cfg       simConfig
	now       time.Time
	procs     []*simProc // prefill slots first, then decode slots
	net       [][][]simMsg
	resolves  [][]Target // per slot
	writes    []simWrite
	nextWrite int
	incs      int
	sides     map[[2]uint64]*simSide // (slot, room)
	released  map[[2]int]bool        // (decode inc, room) released safely
	restarts  int
	peerDowns int
	ticks     int
	trace     []string
	unwatched int // EffectUnwatch seen
	// outcomes records each (incarnation, room) that reached a terminal
	// status (random runs only, to show they are not vacuous).
	outcomes map[Poll]map[[2]uint64]bool
	err      error
}

func (c simConfig) slots() int { return c.prefills + c.decodes }

func (w *simWorld) isPrefill(slot int) bool { return slot < w.cfg.prefills }

func endpointOf(slot int) string { return "sim://" + strconv.Itoa(slot) }

func slotOf(endpoint string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(endpoint, "sim://"))
	if err != nil {
		return -1
	}
	return n
}

func epochOf(inc int) uint64 { return uint64(1000 + inc) }

func remoteName(from bootstrap.From) string {
	return fmt.Sprintf("agent|%s|%d", from.Endpoint, from.Epoch)
}

// remoteInc and remoteSlot read the process a remote agent name belongs to.
func remoteInc(remote string) int {
	f := strings.Split(remote, "|")
	e, _ := strconv.ParseUint(f[len(f)-1], 10, 64)
	return int(e) - 1000
}

func remoteSlot(remote string) int { return slotOf(strings.Split(remote, "|")[1]) }

func newSimWorld(cfg simConfig) *simWorld {
	w := &simWorld{cfg: cfg, now: time.Unix(1_000_000, 0), sides: map[[2]uint64]*simSide{}, released: map[[2]int]bool{}}
	n := cfg.slots()
	w.net = make([][][]simMsg, n)
	for i := range w.net {
		w.net[i] = make([][]simMsg, n)
	}
	w.resolves = make([][]Target, n)
	w.procs = make([]*simProc, n)
	for s := 0; s < n; s++ {
		w.start(s)
	}
	for _, r := range cfg.rooms {
		for _, s := range r.prefills {
			w.sides[[2]uint64{uint64(s), r.id}] = &simSide{}
		}
		for _, s := range r.decodes {
			w.sides[[2]uint64{uint64(cfg.prefills + s), r.id}] = &simSide{}
		}
	}
	return w
}

// start (re)starts the rank in slot with a new epoch.
func (w *simWorld) start(slot int) {
	w.incs++
	role, name, rank := RolePrefill, "prefill", slot
	if !w.isPrefill(slot) {
		role, name, rank = RoleDecode, "decode", slot-w.cfg.prefills
	}
	from := bootstrap.From{Role: name, Instance: name, Rank: rank, Endpoint: endpointOf(slot), Epoch: epochOf(w.incs)}
	cc := CoreConfig{Role: role, Rank: rank, Compat: "sim", Layout: simLayout(), Registry: w.cfg.reg,
		QuarantineTimeout: w.cfg.quarantine, RegisterRetry: time.Second, RecheckIdle: 8 * time.Second}
	if role == RoleDecode {
		kv, aux, state := regionsOf(simLayout())
		cc.Register = bootstrap.Register{Compat: "sim", Agent: remoteName(from), KV: kv, Aux: aux, State: state, TPSize: 1}
	}
	c, err := NewCore(cc)
	if err != nil {
		panic(err)
	}
	c.bugs = withBugs(w.cfg.bugs...)
	w.procs[slot] = &simProc{core: c, from: from, inc: w.incs}
}

func (w *simWorld) fail(format string, a ...any) {
	if w.err == nil {
		w.err = fmt.Errorf(format, a...)
	}
}

// effects carries out what a step of slot's core asked for, checking the
// invariants that concern single effects.
func (w *simWorld) effects(slot int) {
	p := w.procs[slot]
	for _, e := range p.core.Effects() {
		switch e.Kind {
		case EffectSend:
			dst := slotOf(e.To.Endpoint)
			if dst < 0 {
				w.fail("%s sent %v to unknown endpoint %q", p.from.Peer(), e.Msg.Type(), e.To.Endpoint)
				continue
			}
			if a, ok := e.Msg.(*bootstrap.AbortAck); ok && a.Drained {
				// Invariant 7: drained only when no write of the room from
				// this process can land.
				for _, wr := range w.writes {
					if wr.srcInc == p.inc && wr.room == a.Room {
						w.fail("room %d: %s sent ABORT_ACK drained while write %d can still land (ghost %v)", a.Room, p.from.Peer(), wr.id, wr.ghost)
					}
				}
			}
			w.net[slot][dst] = append(w.net[slot][dst], simMsg{from: p.from, msg: e.Msg})
		case EffectPost:
			p.jobs = append(p.jobs, simJob{room: e.Room, writes: slices.Clone(e.Writes)})
		case EffectResolve:
			w.resolves[slot] = append(w.resolves[slot], e.Target)
		case EffectUnwatch:
			w.unwatched++
		case EffectReleased:
			if e.Forced {
				continue // the quarantine deadline: counted, outside the safety claim
			}
			// Invariant 1: no page released while a write to it can land.
			for _, wr := range w.writes {
				if wr.dstInc == p.inc && wr.room == e.Room {
					w.fail("room %d: %s released its pages while write %d can still land", e.Room, p.from.Peer(), wr.id)
				}
			}
			w.released[[2]int{p.inc, int(e.Room)}] = true
		}
	}
}

// land puts a write's data (and then its notification) into its
// destination, if that process still lives.
func (w *simWorld) land(wr simWrite) {
	if w.released[[2]int{wr.dstInc, int(wr.room)}] {
		w.fail("room %d: write %d landed in pages already released", wr.room, wr.id)
	}
	if d := w.procs[wr.dstSlot]; d.inc == wr.dstInc && wr.notif != "" {
		d.notifs = append(d.notifs, wr.notif)
	}
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
	p := w.procs[slotOfInc(w, wr.srcInc)]
	if p == nil || p.inc != wr.srcInc {
		return // the process that posted it is gone
	}
	p.core.Step(w.now, WriteDone{Room: wr.room, Write: &transfer.Write{Last: wr.last, Remote: endpointOf(wr.dstSlot)}, Err: err, Quiesced: quiesced})
	w.effects(slotOfInc(w, wr.srcInc))
}

func slotOfInc(w *simWorld, inc int) int {
	for s, p := range w.procs {
		if p.inc == inc {
			return s
		}
	}
	return -1
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
			if len(w.net[src][dst]) > 0 {
				src, dst := src, dst
				add(fmt.Sprintf("deliver %d→%d %v", src, dst, w.net[src][dst][0].msg.Type()), func(w *simWorld) { w.deliver(src, dst) })
			}
		}
	}
	for s := 0; s < n; s++ {
		s := s
		if len(w.resolves[s]) > 0 {
			add(fmt.Sprintf("resolve at %d", s), func(w *simWorld) {
				t := w.resolves[s][0]
				w.resolves[s] = w.resolves[s][1:]
				w.procs[s].core.Step(w.now, Resolved{Target: t, Endpoint: endpointOf(t.Rank)})
				w.effects(s)
			})
		}
		if len(w.procs[s].jobs) > 0 {
			add(fmt.Sprintf("post at %d", s), func(w *simWorld) { w.post(s) })
		}
		if len(w.procs[s].notifs) > 0 {
			add(fmt.Sprintf("notif at %d", s), func(w *simWorld) {
				p := w.procs[s]
				nt := p.notifs[0]
				p.notifs = p.notifs[1:]
				x, ok := parseNotif(nt)
				if !ok {
					w.fail("bad notification %q", nt)
					return
				}
				p.core.Step(w.now, Notified{Room: x.room, UID: x.uid, Chunk: x.chunk, Total: x.total, Aux: x.aux})
				w.effects(s)
			})
		}
	}
	for _, wr := range w.writes {
		id := wr.id
		if wr.ghost {
			add(fmt.Sprintf("late landing of write %d", id), func(w *simWorld) { w.land(w.removeWrite(id)) })
			continue
		}
		add(fmt.Sprintf("write %d ok", id), func(w *simWorld) {
			wr := w.removeWrite(id)
			w.land(wr)
			w.writeDone(wr, nil, true)
		})
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
	w.appEvents(add)
	w.faultEvents(add)
	if w.cfg.ticks == 0 || (w.cfg.ticks > 0 && w.ticks < w.cfg.ticks) {
		for _, d := range w.deadlines() {
			d := d
			add(fmt.Sprintf("time +%v", d), func(w *simWorld) { w.ticks++; w.tick(d) })
		}
	}
	return evs
}

// deadlines are the time jumps: past the stall deadline, past every room
// deadline, past the quarantine, past the TTL; and past the REGISTER retry
// where messages can be lost.
func (w *simWorld) deadlines() []time.Duration {
	r := w.cfg.reg
	ds := []time.Duration{r.StallTimeout, max(r.BootstrapTimeout, r.PendingTimeout, r.WaitingTimeout), w.cfg.quarantine, r.TombstoneTTL}
	if w.cfg.restarts > 0 {
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
		if wr := w.writes[i]; !wr.ghost && w.now.Sub(wr.posted) > w.cfg.reg.StallTimeout {
			w.writes[i].ghost = true
			w.writeDone(w.writes[i], errors.New("stalled"), false)
		}
	}
	// The model's one timing assumption: no write lands later than the
	// tombstone TTL after it was posted.
	w.writes = slices.DeleteFunc(w.writes, func(wr simWrite) bool {
		return wr.ghost && w.now.Sub(wr.posted) > w.cfg.reg.TombstoneTTL
	})
	for s, p := range w.procs {
		p.core.Step(w.now, Tick{})
		w.effects(s)
		// No room may stay non-terminal past its deadline.
		if n := p.core.reg.Overdue(w.now); n > 0 {
			w.fail("%s: %d rooms past their deadline after a tick", p.from.Peer(), n)
		}
	}
}

// deliver hands the next message of a link to the destination's core, as
// the control loop and shell do: a new epoch of a known peer (on anything
// but PING) is reported as a restart first.
func (w *simWorld) deliver(src, dst int) {
	m := w.net[src][dst][0]
	w.net[src][dst] = w.net[src][dst][1:]
	p := w.procs[dst]
	c := p.core
	switch msg := m.msg.(type) {
	case *bootstrap.Register:
		cp := *msg
		cp.From = m.from
		if !c.Step(w.now, Received{&cp}).OK { // the epoch check, as the shell runs it
			break
		}
		if lay, err := c.CheckRegister(&cp); err != nil {
			c.Step(w.now, RegisterRefused{From: m.from, Reason: err.Error()})
		} else {
			c.Step(w.now, Registered{From: m.from, Remote: remoteName(m.from), Plan: lay})
		}
	case *bootstrap.RegisterAck:
		cp := *msg
		cp.From = m.from
		c.Step(w.now, Received{&cp})
	case *bootstrap.Request:
		cp := *msg
		cp.From = m.from
		c.Step(w.now, Received{&cp})
	case *bootstrap.Abort:
		cp := *msg
		cp.From = m.from
		c.Step(w.now, Received{&cp})
	case *bootstrap.AbortAck:
		cp := *msg
		cp.From = m.from
		c.Step(w.now, Received{&cp})
	case *bootstrap.Status:
		cp := *msg
		cp.From = m.from
		c.Step(w.now, Received{&cp})
	}
	w.effects(dst)
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
	asked := wr.Epoch
	ok := p.core.Step(w.now, Posting{Room: room, Write: &wr}).OK
	w.effects(slot)
	if !ok {
		return
	}
	// Invariant 2: nothing is posted for a room that failed here.
	if st, _ := p.core.Status(room); st != Transferring {
		w.fail("room %d: %s posted a write in %v", room, p.from.Peer(), st)
	}
	// Invariant 8: the write goes to the process whose REQUEST named its
	// pages.
	dstInc := remoteInc(wr.Remote)
	if epochOf(dstInc) != asked {
		w.fail("room %d: write aimed at epoch %d, its REQUEST came from epoch %d", room, epochOf(dstInc), asked)
	}
	if w.released[[2]int{dstInc, int(room)}] {
		w.fail("room %d: write posted into pages already released", room)
	}
	w.nextWrite++
	w.writes = append(w.writes, simWrite{id: w.nextWrite, srcInc: p.inc, room: room, dstSlot: remoteSlot(wr.Remote),
		dstInc: dstInc, notif: wr.Notif, last: wr.Last, posted: w.now})
}

// appEvents: what the applications on each rank may do with each room.
func (w *simWorld) appEvents(add func(string, func(*simWorld))) {
	for _, r := range w.cfg.rooms {
		r := r
		for _, ps := range r.prefills {
			ps := ps
			pkey := [2]uint64{uint64(ps), r.id}
			sd, p := w.sides[pkey], w.procs[ps]
			// Closures act on the world they are applied to (a clone).
			at := func(f func(w *simWorld, sd *simSide, p *simProc)) func(*simWorld) {
				return func(w *simWorld) { f(w, w.sides[pkey], w.procs[ps]) }
			}
			if sd.inc != 0 && sd.inc != p.inc {
				continue // created by a process that is gone
			}
			name := fmt.Sprintf("room %d prefill %d", r.id, ps)
			switch {
			case sd.inc == 0:
				add(name+" create", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.inc = p.inc
					p.core.Step(w.now, CreateSender{Room: r.id})
					w.effects(ps)
				}))
				continue
			case sd.cleared:
				continue
			case !sd.inited:
				add(name+" init", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.inited = true
					p.core.Step(w.now, InitSender{Room: r.id})
					w.effects(ps)
				}))
			case sd.sent < r.chunks && !sd.aborted:
				if st, _ := p.core.Status(r.id); st == WaitingForInput || st == Transferring {
					add(fmt.Sprintf("%s send chunk %d", name, sd.sent), at(func(w *simWorld, sd *simSide, p *simProc) {
						k := sd.sent
						sd.sent++
						p.core.Step(w.now, SendChunk{Room: r.id, Pages: []uint32{uint32(k)}, Last: k == r.chunks-1})
						w.effects(ps)
					}))
				}
			}
			if !sd.aborted && w.cfg.prefillAbort {
				add(name+" abort", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.aborted = true
					p.core.Step(w.now, AbortSender{Room: r.id, Reason: "app"})
					w.effects(ps)
				}))
			}
			if st, _ := p.core.Status(r.id); w.cfg.noClear || !(st.Terminal() || sd.aborted || w.cfg.clearLive || w.cfg.prefillClearLive) {
				continue
			}
			add(name+" clear", at(func(w *simWorld, sd *simSide, p *simProc) {
				sd.cleared, sd.clearAt = true, w.now
				p.core.Step(w.now, ClearSender{Room: r.id})
				w.effects(ps)
			}))
		}
		for _, ds := range r.decodes {
			slot := w.cfg.prefills + ds
			dkey := [2]uint64{uint64(slot), r.id}
			sd, p := w.sides[dkey], w.procs[slot]
			at := func(f func(w *simWorld, sd *simSide, p *simProc)) func(*simWorld) {
				return func(w *simWorld) { f(w, w.sides[dkey], w.procs[slot]) }
			}
			if sd.inc != 0 && sd.inc != p.inc {
				continue
			}
			name := fmt.Sprintf("room %d decode %d", r.id, ds)
			switch {
			case sd.inc == 0:
				add(name+" create", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.inc = p.inc
					var ls []Link
					aux := false
					for _, ps := range r.prefills {
						dummy := slices.Contains(r.dummies, ps)
						ls = append(ls, Link{Target: Target{Bootstrap: "sim", Rank: ps}, Dummy: dummy, Aux: !dummy && !aux})
						aux = aux || !dummy
					}
					p.core.Step(w.now, CreateReceiver{Room: r.id, Links: ls})
					w.effects(slot)
				}))
				continue
			case sd.cleared:
				continue
			case !sd.inited:
				add(name+" init", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.inited = true
					pages := make([]uint32, r.chunks)
					for i := range pages {
						pages[i] = uint32(simPages - 1 - i)
					}
					p.core.Step(w.now, InitReceiver{Room: r.id, Spec: RequestSpec{DstPages: pages, AuxIndex: 1, Required: len(r.decodes)}})
					w.effects(slot)
				}))
			}
			if !sd.aborted && w.cfg.decodeAbort {
				add(name+" abort", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.aborted = true
					if p.core.Step(w.now, AbortReceiver{Room: r.id, Reason: "app"}).Result.Outcome == Applied {
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
			if st, _ := p.core.Status(r.id); !w.cfg.noClear && (st.Terminal() || sd.aborted || w.cfg.clearLive) {
				add(name+" clear", at(func(w *simWorld, sd *simSide, p *simProc) {
					sd.cleared = true
					p.core.Step(w.now, ClearReceiver{Room: r.id})
					w.effects(slot)
				}))
			}
		}
	}
}

// faultEvents: restarts, "peer dead" reports and restarts noticed through
// heartbeats.
func (w *simWorld) faultEvents(add func(string, func(*simWorld))) {
	n := w.cfg.slots()
	for s := 0; s < n; s++ {
		s := s
		if w.restarts < w.cfg.restarts {
			add(fmt.Sprintf("restart %d", s), func(w *simWorld) { w.restart(s) })
		}
		for o := 0; o < n; o++ {
			o := o
			if w.isPrefill(s) == w.isPrefill(o) {
				continue
			}
			if w.peerDowns < w.cfg.peerDowns {
				add(fmt.Sprintf("%d reports %d dead", s, o), func(w *simWorld) {
					w.peerDowns++
					w.procs[s].core.Step(w.now, PeerUnreachable{Endpoint: endpointOf(o), Reason: bootstrap.ReasonPeerUnreachable})
					w.effects(s)
				})
			}
			other := w.procs[o].from
			if h, ok := w.procs[s].core.epochs[other.Peer()]; ok && h.epoch != other.Epoch {
				// A PONG from the new process answers a heartbeat: the
				// core's epoch check sees the restart.
				add(fmt.Sprintf("%d hears %d restarted", s, o), func(w *simWorld) {
					w.procs[s].core.Step(w.now, Received{&bootstrap.Pong{From: other}})
					w.effects(s)
				})
			}
		}
	}
}

// restart kills the process in slot and starts a new one: messages to it
// and its queued work are lost; its writes in flight may still land.
func (w *simWorld) restart(slot int) {
	w.restarts++
	old := w.procs[slot].inc
	for i := range w.writes {
		if w.writes[i].srcInc == old {
			w.writes[i].ghost = true
		}
	}
	for src := range w.net {
		w.net[src][slot] = nil
	}
	w.resolves[slot] = nil
	w.start(slot)
	for k, sd := range w.sides {
		if int(k[0]) == slot && sd.inc == old {
			sd.lost = true // whatever that process still owed is gone with it
		}
	}
}

// quiet reports whether no control work is pending: no message, lookup or
// queued chunk.
func (w *simWorld) quiet() bool {
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
		s := p.core.Sizes()
		if s.Pending > w.cfg.reg.MaxPendingRooms || s.Tombstones > w.cfg.reg.MaxTombstones {
			w.fail("%s: tables over their bounds: %+v", p.from.Peer(), s)
		}
	}
	if !w.quiet() {
		return
	}
	// Invariant 2 (an abort is never lost): once the network is quiet, an
	// abort applied on decode has reached every prefill rank of the room
	// that is still the same process: its room is terminal, or the id is
	// tombstoned so a sender created later starts Failed.
	for _, r := range w.cfg.rooms {
		for _, ds := range r.decodes {
			sd := w.sides[[2]uint64{uint64(w.cfg.prefills + ds), r.id}]
			if !sd.abortApplied || sd.lost || w.now.Sub(sd.abortAt) >= w.cfg.reg.TombstoneTTL {
				continue
			}
			for i, ps := range r.prefills {
				pc := w.procs[ps]
				if pc.inc != sd.abortInc[i] {
					continue
				}
				if st, ok := pc.core.Status(r.id); ok && !st.Terminal() {
					w.fail("room %d: decode %d aborted, prefill %d still %v with the network quiet", r.id, ds, ps, st)
				}
				psd := w.sides[[2]uint64{uint64(ps), r.id}]
				forgotten := psd.cleared && w.now.Sub(psd.clearAt) >= w.cfg.reg.TombstoneTTL // ids are reserved for the TTL only
				if _, ok := pc.core.Status(r.id); !ok && !forgotten {
					if _, tomb := pc.core.reg.tombs[r.id]; !tomb {
						w.fail("room %d: decode %d aborted, prefill %d has no trace of it with the network quiet", r.id, ds, ps)
					}
				}
			}
		}
	}
}

// checkEmpty: after every room is cleared and the tombstone TTL and the
// quarantine passed with no traffic, every table of every core is empty.
func (w *simWorld) checkEmpty() {
	for _, p := range w.procs {
		if s := p.core.Sizes(); s.Total() != 0 {
			w.fail("%s not empty after the TTL: %+v", p.from.Peer(), s)
		}
	}
}

func (w *simWorld) apply(ev simEvent) {
	w.trace = append(w.trace, ev.name)
	ev.do(w)
	if w.outcomes != nil {
		for _, p := range w.procs {
			for id, rm := range p.core.reg.rooms {
				if rm.status == Failed && simFailHook != nil && !w.outcomes[Failed][[2]uint64{uint64(p.inc), id}] {
					simFailHook(rm.reason)
				}
				if rm.status.Terminal() {
					w.outcomes[rm.status][[2]uint64{uint64(p.inc), id}] = true
				}
			}
		}
	}
	if w.err == nil {
		w.checkState()
	}
}

// ---- exhaustive exploration --------------------------------------------

// simExplore visits every state reachable from the initial world, depth
// first, each distinct state (by fingerprint hash) once, and checks every
// invariant on every transition. It returns the number of distinct states
// and transitions, or the first violation with the trace that reaches it
// (which replays exactly).
func simExplore(cfg simConfig, maxStates int) (states, transitions int, err error) {
	start := newSimWorld(cfg)
	seen := map[[16]byte]struct{}{start.hash(): {}}
	var visit func(w *simWorld) error
	visit = func(w *simWorld) error {
		for _, ev := range w.events() {
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
				return fmt.Errorf("more than %d states: bound the configuration", maxStates)
			}
			if err := visit(next); err != nil {
				return err
			}
		}
		return nil
	}
	err = visit(start)
	return len(seen), transitions, err
}

// runScript applies events by name, in order, as far as each is enabled;
// it returns the world and how many events it applied (the first violation
// is in w.err).
func runScript(cfg simConfig, script []string) (*simWorld, int) {
	w := newSimWorld(cfg)
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

// ---- random runs -------------------------------------------------------

// simWeight biases random runs toward progress, so rooms also succeed:
// the protocol's normal steps are 10 times likelier than a fault and 50
// times likelier than a time jump.
func simWeight(name string) int {
	switch {
	case strings.HasPrefix(name, "time"):
		return 1
	case strings.HasSuffix(name, " create"):
		// Rooms arrive over the run, as requests do, so some start after
		// long idle gaps (a registration nobody has heard from since).
		return 12
	case strings.Contains(name, "fails"), strings.Contains(name, "abort"), strings.HasPrefix(name, "restart"),
		strings.Contains(name, "dead"):
		return 5
	case strings.Contains(name, "clear"):
		return 10
	case strings.Contains(name, "late landing"), strings.Contains(name, "restarted"):
		return 25
	default:
		return 50
	}
}

var simFailHook func(reason string)

// simStats counts what random runs reached, so a test can show they are
// not vacuous.
type simStats struct {
	success, failed, released, forced int
	trace                             []string // the events played (random runs)
	// reach counts paths the random mode must reach (asserted over the
	// seeds): idle rechecks, re-lookups after unanswered REGISTERs,
	// restarts found by the epoch check, unwatched peers.
	rechecks, relookups, restarts, unwatched int
}

// runRandomStats plays steps random events from seed, then clears every
// room, lets everything settle and checks that the cores empty after the
// TTL.
func runRandomStats(cfg simConfig, seed uint64, steps int) (simStats, error) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	// Each seed keeps each kind of fault with probability ½: calm runs
	// show rooms succeeding, stormy ones every fault at once.
	keep := func() bool { return rng.IntN(2) == 0 }
	cfg.decodeAbort = cfg.decodeAbort && keep()
	cfg.prefillAbort = cfg.prefillAbort && keep()
	cfg.clearLive = cfg.clearLive && keep()
	cfg.mayLand = cfg.mayLand && keep()
	if !keep() {
		cfg.restarts = 0
	}
	if !keep() {
		cfg.peerDowns = 0
	}
	w := newSimWorld(cfg)
	w.outcomes = map[Poll]map[[2]uint64]bool{Success: {}, Failed: {}}
	for i := 0; i < steps && w.err == nil; i++ {
		evs := w.events()
		if len(evs) == 0 {
			break // nothing can happen any more
		}
		weights := make([]int, len(evs))
		sum := 0
		for j, ev := range evs {
			weights[j] = simWeight(ev.name)
			sum += weights[j]
		}
		k := rng.IntN(sum)
		j := 0
		for k >= weights[j] {
			k -= weights[j]
			j++
		}
		ev := evs[j]
		w.apply(ev)
	}
	if w.err == nil {
		w.settle()
	}
	st := simStats{success: len(w.outcomes[Success]), failed: len(w.outcomes[Failed])}
	for _, p := range w.procs {
		st.forced += int(p.core.stats.ForcedReleases)
		st.rechecks += int(p.core.stats.Rechecks)
		st.relookups += int(p.core.stats.Relookups)
		st.restarts += int(p.core.stats.PeersRestarted)
	}
	st.unwatched = w.unwatched
	st.released = len(w.released)
	st.trace = w.trace
	if w.err != nil {
		min := minimize(cfg, w.trace, w.err)
		return st, fmt.Errorf("seed %d: %w\nminimal trace (replay: runScript(cfg, trace); the whole run: runRandomStats(cfg, %d, %d)):\n  %s",
			seed, w.err, seed, steps, strings.Join(min, "\n  "))
	}
	return st, nil
}

// settle lets every pending message, lookup, chunk, write and
// notification run out and clears every room (nothing new is started, no
// fault is injected), then jumps past the quarantine and the TTL, three
// times, and checks that every core is empty.
func (w *simWorld) settle() {
	skip := []string{"restart", "dead", "time", "create", "init", "send chunk", "abort", "restarted"}
	for round := 0; round < 3 && w.err == nil; round++ {
		for i := 0; i < 100000 && w.err == nil; i++ {
			var next *simEvent
			for _, ev := range w.events() {
				if !slices.ContainsFunc(skip, func(k string) bool { return strings.Contains(ev.name, k) }) {
					next = &ev
					break
				}
			}
			if next == nil {
				break
			}
			w.apply(*next)
		}
		w.apply(simEvent{"time past the quarantine and the TTL", func(w *simWorld) { w.tick(w.cfg.reg.TombstoneTTL + w.cfg.quarantine) }})
	}
	if w.err == nil && !w.cfg.noClear {
		w.checkEmpty()
	}
}

// ---- clone and fingerprint ---------------------------------------------

func (w *simWorld) clone() *simWorld {
	c := *w
	c.procs = make([]*simProc, len(w.procs))
	for i, p := range w.procs {
		cp := *p
		cp.core = p.core.clone()
		cp.jobs = make([]simJob, len(p.jobs))
		for j, jb := range p.jobs {
			cp.jobs[j] = simJob{room: jb.room, writes: slices.Clone(jb.writes)}
		}
		cp.notifs = slices.Clone(p.notifs)
		c.procs[i] = &cp
	}
	c.net = make([][][]simMsg, len(w.net))
	for i, row := range w.net {
		c.net[i] = make([][]simMsg, len(row))
		for j, q := range row {
			c.net[i][j] = slices.Clone(q)
		}
	}
	c.resolves = make([][]Target, len(w.resolves))
	for i, q := range w.resolves {
		c.resolves[i] = slices.Clone(q)
	}
	c.writes = slices.Clone(w.writes)
	c.sides = make(map[[2]uint64]*simSide, len(w.sides))
	for k, sd := range w.sides {
		cp := *sd
		cp.abortInc = slices.Clone(sd.abortInc)
		c.sides[k] = &cp
	}
	c.released = maps.Clone(w.released)
	return &c
}

// clone deep-copies a core (test only).
func (c *Core) clone() *Core {
	nb := *c.base
	n := &Core{base: &nb}
	if c.prefillCore != nil {
		np := *c.prefillCore
		np.base = &nb
		n.prefillCore, nb.role = &np, &np
	}
	if c.decodeCore != nil {
		nd := *c.decodeCore
		nd.base = &nb
		n.decodeCore, nb.role = &nd, &nd
	}
	n.out = nil
	reg := *c.reg
	reg.out = &n.out
	n.reg = &reg
	srcs := map[*source]*source{}
	cpSrc := func(s *source) *source {
		if d, ok := srcs[s]; ok {
			return d
		}
		d := *s
		d.chunks = maps.Clone(s.chunks)
		srcs[s] = &d
		return &d
	}
	reg.rooms = make(map[uint64]*room, len(c.reg.rooms))
	for id, rm := range c.reg.rooms {
		cp := *rm
		cp.requests = slices.Clone(rm.requests)
		cp.acks = slices.Clone(rm.acks)
		if rm.dec != nil {
			dec := *rm.dec
			dec.sources = make([]*source, len(rm.dec.sources))
			for i, s := range rm.dec.sources {
				dec.sources[i] = cpSrc(s)
			}
			cp.dec = &dec
		}
		reg.rooms[id] = &cp
	}
	reg.pending = make(map[uint64]*pendingRoom, len(c.reg.pending))
	for id, p := range c.reg.pending {
		cp := *p
		cp.requests = slices.Clone(p.requests)
		reg.pending[id] = &cp
	}
	reg.tombs = make(map[uint64]*tomb, len(c.reg.tombs))
	for id, t := range c.reg.tombs {
		cp := *t
		cp.acks = slices.Clone(t.acks)
		reg.tombs[id] = &cp
	}
	reg.tombQ = slices.Clone(c.reg.tombQ)
	reg.draining = maps.Clone(c.reg.draining)
	reg.pendingBy = maps.Clone(c.reg.pendingBy)
	if c.prefillCore != nil {
		n.peers = maps.Clone(c.peers) // decodePeer values are never modified
	}
	if c.decodeCore != nil {
		n.targets = make(map[string]*target, len(c.targets))
		for k, t := range c.targets {
			cp := *t
			cp.owed = maps.Clone(t.owed)
			n.targets[k] = &cp
		}
		n.holds = make(map[uint64]*hold, len(c.holds))
		for id, h := range c.holds {
			cp := *h
			cp.srcs = make([]*source, len(h.srcs))
			for i, s := range h.srcs {
				cp.srcs[i] = cpSrc(s)
			}
			n.holds[id] = &cp
		}
		n.roomsOf = make(map[string]map[uint64]struct{}, len(c.roomsOf))
		for k, set := range c.roomsOf {
			n.roomsOf[k] = maps.Clone(set)
		}
	}
	n.watching = maps.Clone(c.watching)
	n.epochs = make(map[string]*heardPeer, len(c.epochs))
	for k, h := range c.epochs {
		cp := *h
		cp.retired = slices.Clone(h.retired)
		n.epochs[k] = &cp
	}
	return n
}
