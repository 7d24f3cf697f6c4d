package core

import (
	"cmp"
	"encoding/binary"
	"hash/maphash"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// fp feeds a simulated world's state into two seeded 64-bit hashes (128
// bits: a collision among a few million states is out of reach). Times are
// written relative to now, so states that differ only by when they
// happened are one.
type fp struct {
	a, b maphash.Hash
	now  time.Time
	buf  [8]byte
}

var fpSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

func (f *fp) u(v uint64) {
	binary.LittleEndian.PutUint64(f.buf[:], v)
	f.a.Write(f.buf[:])
	f.b.Write(f.buf[:])
}

func (f *fp) i(v int) { f.u(uint64(v)) }

func (f *fp) b1(v bool) {
	if v {
		f.u(1)
	} else {
		f.u(2)
	}
}

func (f *fp) s(v string) {
	f.i(len(v))
	f.a.WriteString(v)
	f.b.WriteString(v)
}

func (f *fp) t(t time.Time) {
	if t.IsZero() {
		f.u(0)
		return
	}
	f.u(uint64(t.Sub(f.now)))
}

func sortedPairs[T ~[2]E, E int | uint64](keys []T) []T {
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	return keys
}

// hash identifies a world state: every core's tables, the network, writes,
// notifications and the applications' progress; failure reasons are left
// out (nothing depends on their text).
func (w *simWorld) hash() [16]byte {
	f := &fp{now: w.now}
	f.a.SetSeed(fpSeeds[0])
	f.b.SetSeed(fpSeeds[1])
	for _, p := range w.procs {
		f.i(p.inc)
		f.i(len(p.jobs))
		for _, j := range p.jobs {
			f.u(j.room)
			f.i(len(j.writes))
		}
		f.i(len(p.notifs))
		for _, n := range p.notifs {
			f.s(n)
		}
		f.i(len(p.loads))
		for _, ld := range p.loads {
			f.s(ld.from.Endpoint)
			f.u(ld.from.Epoch)
		}
		f.s(p.endpoint)
		f.b1(p.dead)
		f.b1(p.closed)
		f.b1(p.paused)
		f.b1(p.shareFull)
		if p.paused {
			f.t(p.pausedAt)
		}
		p.core.hash(f)
	}
	for i, row := range w.net {
		for j, q := range row {
			f.i(i<<16 | j<<8 | len(q))
			for _, m := range q {
				f.i(int(m.msg.Type()))
				f.u(m.from.Epoch)
				f.s(m.to)
				hashMsg(f, m.msg)
			}
		}
	}
	for _, q := range w.resolves {
		f.i(len(q))
		for _, t := range q {
			f.i(t.Rank)
		}
	}
	f.i(len(w.writes))
	for _, wr := range w.writes {
		f.i(wr.srcInc)
		f.u(wr.room)
		f.i(wr.dstInc)
		f.i(wr.dstSlot)
		f.s(wr.notif)
		f.b1(wr.last)
		f.t(wr.posted)
		f.b1(wr.ghost)
		f.b1(wr.aborted)
		f.b1(wr.landed)
	}
	f.i(len(w.reads))
	for _, r := range w.reads {
		f.i(r.dInc)
		f.i(r.pInc)
		f.u(r.room)
		f.i(r.rd.Notif.Chunk)
		f.i(r.rd.Notif.Lo)
		f.b1(r.rd.Final)
		f.t(r.rd.Until)
		f.b1(r.posted)
		f.t(r.postedAt)
		f.b1(r.ghost)
		f.b1(r.landed)
	}
	for _, k := range sortedPairs(slices.Collect(maps.Keys(w.srel))) {
		f.i(k[0])
		f.i(k[1])
	}
	for _, k := range slices.Sorted(maps.Keys(w.reported)) {
		f.s(k)
	}
	for _, row := range w.hist {
		for _, m := range row {
			if m == nil {
				f.u(0)
				continue
			}
			f.i(int(m.msg.Type()))
			f.u(m.from.Epoch)
			hashMsg(f, m.msg)
		}
	}
	for i, x := range w.incSlot {
		f.i(x)
		f.s(w.incEp[i])
	}
	f.i(len(w.rooms))
	for i, rec := range w.records {
		for _, r := range []simRecord{rec, w.prev[i]} {
			f.b1(r.set)
			f.s(r.endpoint)
			f.i(r.gen)
			f.b1(r.dead)
			f.t(r.expires)
			f.u(uint64(min(w.now.Sub(r.replaced), simLease+time.Second)))
		}
	}
	for _, row := range w.pushed {
		for _, g := range row {
			f.i(g)
		}
	}
	keys := func(m map[simKey]bool) []simKey { return slices.SortedFunc(maps.Keys(m), cmpKeys) }
	for _, k := range slices.SortedFunc(maps.Keys(w.asked), cmpKeys) {
		f.i(k.pInc)
		f.i(k.dInc)
		f.u(k.room)
		f.i(len(w.asked[k].pages))
	}
	for _, m := range []map[simKey]bool{w.heard, w.acked} {
		f.i(len(m))
		for _, k := range keys(m) {
			f.i(k.pInc)
			f.i(k.dInc)
			f.u(k.room)
			f.b1(m[k])
		}
	}
	f.i(len(w.earlyAbort))
	for _, k := range sortedPairs(slices.Collect(maps.Keys(w.earlyAbort))) {
		f.u(k[0])
		f.u(k[1])
		for _, at := range w.earlyAbort[k] {
			f.u(uint64(min(w.now.Sub(at), w.cfg.reg.TombstoneTTL)))
		}
	}
	f.i(len(w.got))
	for _, k := range slices.SortedFunc(maps.Keys(w.got), func(a, b simCell) int {
		return cmp.Or(cmp.Compare(a.dInc, b.dInc), cmp.Compare(a.src, b.src), cmp.Compare(a.room, b.room), cmp.Compare(a.page, b.page), cmp.Compare(a.layer, b.layer))
	}) {
		f.i(k.dInc)
		f.i(k.src)
		f.u(k.room)
		f.u(uint64(k.page))
		f.i(k.layer)
	}
	for _, k := range sortedPairs(slices.Collect(maps.Keys(w.failedAt))) {
		f.i(k[0])
		f.i(k[1])
		f.u(uint64(min(w.now.Sub(w.failedAt[k]), w.cfg.quarantine+time.Second)))
	}
	for _, k := range sortedPairs(slices.Collect(maps.Keys(w.sides))) {
		sd := w.sides[k]
		f.u(k[0])
		f.u(k[1])
		f.i(sd.inc)
		f.b1(sd.inited)
		f.b1(sd.aborted)
		f.i(sd.layer)
		f.b1(sd.abortApplied)
		f.b1(sd.cleared)
		f.b1(sd.lost)
		f.i(sd.sent)
		f.u(uint64(min(w.now.Sub(sd.abortAt), w.cfg.reg.TombstoneTTL)))
		f.u(uint64(min(w.now.Sub(sd.clearAt), w.cfg.reg.TombstoneTTL)))
		for _, x := range sd.abortInc {
			f.i(x)
		}
	}
	for _, k := range sortedPairs(slices.Collect(maps.Keys(w.rel))) {
		f.i(k[0])
		f.i(k[1])
		f.b1(w.rel[k].forced)
	}
	for _, n := range []int{w.restarts, w.kills, w.peerDowns, w.ticks, w.losses, w.dups, w.replays, w.pauses, w.lookupFails, w.stales, w.intrusions, w.floods, w.silents, w.unsummed, w.closes} {
		f.i(n)
	}
	for _, l := range w.late { // latePongs' held PONGs
		f.i(l.src)
		f.i(l.dst)
		f.t(l.due)
		f.s(l.msg.to)
		f.s(l.msg.from.Endpoint)
		f.u(l.msg.from.Epoch)
	}
	var out [16]byte
	binary.LittleEndian.PutUint64(out[:8], f.a.Sum64())
	binary.LittleEndian.PutUint64(out[8:], f.b.Sum64())
	return out
}

func hashMsg(f *fp, m wire.Message) {
	switch m := m.(type) {
	case *wire.Request:
		f.u(m.Room)
		f.i(len(m.DstPages))
		f.i(m.Required)
		f.u(m.N)
	case *wire.Abort:
		f.u(m.Room)
	case *wire.AbortAck:
		f.u(m.Room)
		f.b1(m.Drained)
	case *wire.Status:
		f.u(m.Room)
		f.s(m.Code)
		f.u(m.Taken)
	case *wire.RegisterAck:
		f.b1(m.OK)
	}
}

// hash feeds every table of the core into f, in a deterministic order.
func (c *Core) hash(f *fp) {
	src := func(s *source) {
		f.s(s.target)
		f.b1(s.sent)
		f.u(s.epoch)
		f.u(s.n)
		f.s(s.endpoint)
		f.i(s.reregs)
		for _, k := range slices.Sorted(maps.Keys(s.chunks)) {
			cs := s.chunks[k]
			f.i(k)
			f.i(cs.off)
			f.i(cs.n)
			f.i(cs.spanLo)
			f.i(cs.spanHi)
			f.i(cs.left)
			for _, g := range cs.got {
				f.u(g)
			}
		}
		f.i(s.full)
		f.i(s.spanLo)
		f.i(s.spanHi)
		f.b1(s.legacy)
		f.i(s.total)
		f.b1(s.aux)
		f.b1(s.acked)
		f.b1(s.pull)
		f.i(s.nstamps)
		f.i(len(s.asked))
		for _, a := range slices.SortedFunc(maps.Keys(s.asked), func(x, y [3]int) int {
			return cmp.Or(cmp.Compare(x[0], y[0]), cmp.Compare(x[1], y[1]), cmp.Compare(x[2], y[2]))
		}) {
			f.i(a[0])
			f.i(a[1])
			f.i(a[2])
		}
		for _, st := range s.stamps {
			f.u(st.wire)
			f.t(st.at)
		}
		f.t(s.lastStamp)
		f.i(s.leaseMillis)
		f.i(s.reads)
		f.i(s.unsettled)
		f.b1(s.readDoneSent)
	}
	f.i(len(c.reg.rooms))
	for _, id := range slices.Sorted(maps.Keys(c.reg.rooms)) {
		rm := c.reg.rooms[id]
		f.u(id)
		f.i(int(rm.role)<<8 | int(rm.status))
		f.b1(rm.initialised)
		f.i(rm.required)
		for _, q := range rm.requests {
			f.s(q.Peer)
			f.u(q.Epoch)
			f.u(q.At)
		}
		f.i(rm.inflight)
		f.i(rm.unsettled)
		f.b1(rm.lastDone)
		f.b1(rm.drainExpired)
		for _, a := range rm.acks {
			f.s(a.Endpoint)
		}
		f.i(int(rm.kind))
		f.t(rm.deadline)
		f.b1(rm.doneWoken)
		f.b1(rm.readyWoken)
		f.i(rm.pre.sent)
		f.i(rm.pre.chunk)
		if op := rm.pre.open; op != nil {
			f.i(op.next)
			f.b1(op.last)
			f.i(op.auxIndex)
			f.i(len(op.pages))
		}
		f.i(len(rm.pre.early))
		for _, e := range rm.pre.early {
			f.i(e.at.chunk)
			f.i(e.at.lo)
			f.b1(e.in.Last)
		}
		if rm.dec != nil {
			f.s(rm.dec.code)
		}
		if rm.dec != nil {
			f.b1(rm.dec.init)
			for _, s := range rm.dec.sources {
				src(s)
			}
		}
	}
	f.i(c.reg.evicted) // exempts invariant 2 (see checkState)
	f.i(c.reg.forgotten)
	for _, by := range slices.Sorted(maps.Keys(c.reg.earlyQ)) { // each rank's forgetting order
		f.s(by)
		for _, ref := range c.reg.earlyQ[by] {
			t, ok := c.reg.tombs[ref.id]
			f.u(ref.id)
			f.b1(ok && t.by == by && t.expires.Equal(ref.expires)) // live or stale
		}
	}
	f.u(c.stats.AbortsDropped)
	for _, ref := range c.reg.tombQ { // the eviction order
		f.u(ref.id)
	}
	f.b1(c.reg.closed != "")
	f.i(len(c.reg.pending))
	for _, id := range slices.Sorted(maps.Keys(c.reg.pending)) {
		p := c.reg.pending[id]
		f.u(id)
		f.i(p.required)
		f.t(p.deadline)
		for _, q := range p.requests {
			f.s(q.Peer)
			f.u(q.Epoch)
			f.u(q.At)
		}
	}
	f.i(len(c.reg.tombs))
	for _, id := range slices.Sorted(maps.Keys(c.reg.tombs)) {
		t := c.reg.tombs[id]
		f.u(id)
		f.i(int(t.kind))
		f.s(t.by)
		f.u(uint64(min(t.expires.Sub(f.now), c.cfg.Registry.TombstoneTTL)))
		f.i(t.inflight)
		f.i(t.unsettled)
		for _, a := range t.acks {
			f.s(a.Endpoint)
		}
		f.t(t.drainBy)
		f.b1(t.drainExpired)
		f.i(len(t.reqs))
	}
	// Each role's own tables (nil for the other role: the same hash as empty).
	var peers map[string]*decodePeer
	var targets map[string]*target
	var holds map[uint64]*hold
	if c.prefillCore != nil {
		peers = c.peers
	}
	if c.decodeCore != nil {
		targets, holds = c.targets, c.holds
	}
	f.i(len(peers))
	for _, k := range slices.Sorted(maps.Keys(peers)) {
		f.s(k)
		f.u(peers[k].from.Epoch)
		f.i(len(peers[k].inUse))
		f.u(peers[k].taken)
	}
	f.i(len(targets))
	for _, k := range slices.Sorted(maps.Keys(targets)) {
		t := targets[k]
		f.s(k)
		f.s(t.endpoint)
		f.b1(t.resolved)
		f.b1(t.resolving)
		f.i(int(t.reg))
		f.u(t.epoch)
		f.u(uint64(t.retry))
		f.t(t.nextRetry)
		f.t(t.heard)
		f.i(t.unanswered)
		f.u(t.reqN)
		f.s(t.closedEP)
		f.u(t.closedEpoch)
		f.u(uint64(t.lookupRetry))
		f.t(t.nextLookup)
		for _, r := range slices.Sorted(maps.Keys(t.owed)) {
			f.u(r)
			f.t(t.owed[r].until)
		}
	}
	f.i(len(c.epochs)) // the epoch check's table (recency order is not state that changes behaviour below the bound)
	for _, k := range slices.Sorted(maps.Keys(c.epochs)) {
		f.s(k)
		f.u(c.epochs[k].epoch)
		for _, e := range c.epochs[k].retired {
			f.u(e)
		}
	}
	for _, ep := range slices.Sorted(maps.Keys(c.watching)) {
		f.s(ep)
	}
	var pulls map[uint64]*pullHold
	if c.prefillCore != nil {
		pulls = c.pulls
	}
	f.i(len(pulls))
	for _, id := range slices.Sorted(maps.Keys(pulls)) {
		h := pulls[id]
		f.u(id)
		f.i(h.pages)
		f.t(h.first)
		f.t(h.published)
		f.t(h.deadline)
		for _, pp := range h.peers {
			f.s(pp.key)
			f.u(pp.epoch)
			f.b1(pp.open)
			f.b1(pp.closed)
			f.b1(pp.drained)
			f.t(pp.leaseEnd)
		}
	}
	// The agent and offer challenges, and the offers accepted.
	if p := c.prefillCore; p != nil {
		for _, k := range slices.Sorted(maps.Keys(p.challenges)) {
			ch := p.challenges[k]
			f.s(k)
			f.u(ch.from.Epoch)
			f.s(ch.agent)
			f.b1(ch.passed)
			f.i(ch.repeats)
			f.t(ch.deadline)
		}
		for _, k := range slices.Sorted(maps.Keys(p.echoes)) {
			f.s(k)
			e := p.echoes[k]
			f.s(string(e.nonce[:]))
		}
	}
	if d := c.decodeCore; d != nil {
		f.s(string(d.echo))
		for _, k := range slices.SortedFunc(maps.Keys(d.offers), cmpOfferKeys) {
			f.s(k.endpoint)
			f.u(k.epoch)
			f.s(d.offers[k].remote)
			f.u(d.offers[k].gen)
		}
		for _, a := range slices.Sorted(maps.Keys(d.offerChecks)) {
			f.s(a)
		}
		for _, k := range slices.SortedFunc(maps.Keys(d.offerChallenges), cmpOfferKeys) {
			ch := d.offerChallenges[k]
			f.s(k.endpoint)
			f.u(k.epoch)
			f.s(ch.agent)
			f.i(ch.repeats)
			f.t(ch.deadline)
		}
	}
	f.i(len(holds))
	for _, id := range slices.Sorted(maps.Keys(holds)) {
		h := holds[id]
		f.u(id)
		f.b1(h.failed)
		f.t(h.deadline)
		for _, s := range h.srcs {
			src(s)
		}
	}
}

// ---- clone -------------------------------------------------------------

// cloneRows copies a slice of slices, each row a copy.
func cloneRows[T any](rows [][]T) [][]T {
	out := make([][]T, len(rows))
	for i, r := range rows {
		out[i] = slices.Clone(r)
	}
	return out
}

func (w *simWorld) clone() *simWorld {
	c := *w
	c.late = slices.Clone(w.late)
	c.procs = make([]*simProc, len(w.procs))
	for i, p := range w.procs {
		cp := *p
		cp.core = p.core.clone()
		cp.jobs = make([]simJob, len(p.jobs))
		for j, jb := range p.jobs {
			cp.jobs[j] = simJob{room: jb.room, writes: slices.Clone(jb.writes)}
		}
		cp.notifs = slices.Clone(p.notifs)
		cp.loads = slices.Clone(p.loads) // plans are never modified
		c.procs[i] = &cp
	}
	c.net = make([][][]simMsg, len(w.net))
	for i, row := range w.net {
		c.net[i] = make([][]simMsg, len(row))
		for j, q := range row {
			c.net[i][j] = slices.Clone(q)
		}
	}
	c.hist = cloneRows(w.hist) // messages are never modified
	c.resolves = cloneRows(w.resolves)
	c.writes = slices.Clone(w.writes)
	c.reads = slices.Clone(w.reads) // their Reads are never modified
	c.srel = maps.Clone(w.srel)
	c.incSlot = slices.Clone(w.incSlot)
	c.incEp = slices.Clone(w.incEp)
	c.rooms = slices.Clone(w.rooms)
	c.sides = make(map[[2]uint64]*simSide, len(w.sides))
	for k, sd := range w.sides {
		cp := *sd
		cp.abortInc = slices.Clone(sd.abortInc)
		c.sides[k] = &cp
	}
	c.records = slices.Clone(w.records)
	c.prev = slices.Clone(w.prev)
	c.pushed = cloneRows(w.pushed)
	c.asked = maps.Clone(w.asked)
	c.heard = maps.Clone(w.heard)
	c.earlyAbort = maps.Clone(w.earlyAbort)
	c.acked = maps.Clone(w.acked)
	c.failedAt = maps.Clone(w.failedAt)
	c.rel = maps.Clone(w.rel)
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
		d.asked = maps.Clone(s.asked)
		d.chunks = make(map[int]*chunkSeen, len(s.chunks))
		for k, cs := range s.chunks {
			c := *cs
			c.got = slices.Clone(cs.got)
			d.chunks[k] = &c
		}
		srcs[s] = &d
		return &d
	}
	reg.rooms = make(map[uint64]*room, len(c.reg.rooms))
	for id, rm := range c.reg.rooms {
		cp := *rm
		cp.requests = slices.Clone(rm.requests)
		cp.acks = slices.Clone(rm.acks)
		if op := rm.pre.open; op != nil {
			o := *op
			cp.pre.open = &o
		}
		cp.pre.early = slices.Clone(rm.pre.early) // each kept chunk is never modified
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
	reg.earlyBy = maps.Clone(c.reg.earlyBy)
	reg.earlyQ = make(map[string][]tombRef, len(c.reg.earlyQ))
	for k, q := range c.reg.earlyQ {
		reg.earlyQ[k] = slices.Clone(q)
	}
	if c.prefillCore != nil {
		n.peers = make(map[string]*decodePeer, len(c.peers))
		for k, p := range c.peers {
			cp := *p
			cp.inUse = maps.Clone(p.inUse)
			n.peers[k] = &cp
		}
		n.pulls = make(map[uint64]*pullHold, len(c.pulls))
		for id, h := range c.pulls {
			cp := *h
			cp.peers = make([]*pullPeer, len(h.peers))
			for i, pp := range h.peers {
				x := *pp
				cp.peers[i] = &x
			}
			n.pulls[id] = &cp
		}
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
	if c.prefillCore != nil {
		n.challenges = make(map[string]*challenge, len(c.challenges))
		for k, ch := range c.challenges {
			cp := *ch
			n.challenges[k] = &cp
		}
		n.echoes = maps.Clone(c.echoes)
	}
	if c.decodeCore != nil {
		n.echo = slices.Clone(c.echo)
		n.offers = maps.Clone(c.offers) // entries are replaced, never modified
		n.offerChecks = maps.Clone(c.offerChecks)
		n.topos = maps.Clone(c.topos)
		n.offerChallenges = make(map[offerKey]*offerChallenge, len(c.offerChallenges))
		for k, ch := range c.offerChallenges {
			cp := *ch
			n.offerChallenges[k] = &cp
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
