package core

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// RequestSpec is what a decode rank asks of its prefill ranks for a room.
type RequestSpec struct {
	DstPages []uint32 // destination pages for positions Prefix.. of the request
	AuxIndex int      // −1 for none
	// StateIndices[i] are the items of state region i the state goes to.
	StateIndices [][]uint32
	Required     int // decode ranks' requests the prefill rank waits for (default 1)
	Prefix       int // leading pages decode already holds
	Dummy        bool
	// Pull: read the pages from the prefill ranks once they publish them
	// (docs/PROTOCOL.md "Pull") instead of having them written.
	Pull bool
	// Digest: the prefill ranks send a CRC-32C of every destination page
	// they write, and the room succeeds only once each page's bytes match
	// it; a mismatch fails the room with CodeCorrupt naming the page,
	// layers and prefill rank (docs/PROTOCOL.md "Digest"). Pushed or pulled
	// rooms into host memory; Config.Digest asks it for every room.
	Digest bool
}

type regState uint8

const (
	regNone regState = iota // not registered, no REGISTER outstanding
	regSent                 // REGISTER sent, no REGISTER_ACK yet (retried)
	regOK                   // acknowledged by the process of epoch
)

// target is one prefill rank as a decode rank knows it.
type target struct {
	t                   Target
	endpoint, serverKey string
	cert                string // the record's identity certificate (raw), if any
	recEpoch            uint64 // the record's process, if it says
	resolved, resolving bool
	reg                 regState
	epoch               uint64 // the process that acknowledged our REGISTER
	retry               time.Duration
	nextRetry           time.Time
	heard               time.Time // the last message from the rank's endpoint
	// probing: a PING went to the registered process (REQUESTs wait for
	// its PONG, or probeDeadline, when the rank is looked up again).
	probing       bool
	probeDeadline time.Time
	// probeLost: a probe went unanswered and the rank is being looked up
	// again; a record naming another endpoint fails the rooms whose
	// REQUEST went to the old one at once.
	probeLost bool
	// unanswered counts REGISTER retries that got no answer since the rank
	// was last looked up: past registerLookupAfter the endpoint is looked
	// up again (the record may name a process that is gone).
	unanswered int
	// owed are ABORTs (room → reason) not yet acknowledged by the rank: sent
	// at once when the endpoint is known, and again to every process the
	// rank is found at later (a new endpoint, a new epoch) until an
	// ABORT_ACK from it comes or the tombstone TTL passes. They outlive the
	// rooms (an abort then Clear before the lookup answered must still
	// reach the prefill rank).
	owed map[uint64]owedAbort
	// lookupRetry, nextLookup: while ABORTs are owed to a rank that could
	// not be looked up, it is looked up again with backoff.
	lookupRetry time.Duration
	nextLookup  time.Time
	// owedRetry, nextOwed: owed ABORTs are sent again with backoff while
	// none is acknowledged (a message lost on the way, as at a reconnect,
	// would otherwise leave the prefill room to its deadline).
	owedRetry time.Duration
	nextOwed  time.Time
	// leaseMillis is the pull lease its REGISTER_ACK's offer granted (0:
	// none said): renewals go a third of it apart.
	leaseMillis int
	// reqN numbers the REQUESTs sent to the rank (wire.Request.N), from 1,
	// whichever process they go to.
	reqN uint64
	// closedEP, closedEpoch: the process that said it closed (STATUS
	// closed): no REGISTER or REQUEST goes to it; a lookup whose record
	// still names it fails the rooms waiting for the rank.
	closedEP    string
	closedEpoch uint64
}

// owedAbort is an ABORT a prefill rank has not acknowledged.
type owedAbort struct {
	code, reason string
	until        time.Time // forgotten then: no prefill room outlives the TTL
}

func (o owedAbort) msg(room uint64) *wire.Abort {
	return &wire.Abort{Room: room, Code: o.code, Reason: o.reason}
}

// registerLookupAfter is how many REGISTER retries may go unanswered
// before the rank is looked up again instead of retried at the endpoint it
// had: a pod restarted on a new port leaves a record naming the dead
// process for the rest of its lease.
const registerLookupAfter = 3

func (tg *target) peer() wire.Peer {
	return wire.Peer{Endpoint: tg.endpoint, ServerKey: tg.serverKey, Cert: tg.cert, Epoch: max(tg.epoch, tg.recEpoch)}
}

// source is one prefill rank's part of a decode room.
type source struct {
	target string // key into Core.targets
	uid    int    // the uid its notifications carry (REQUEST.source: its index in the room)
	link   Link
	// sent: our REQUEST went to the process of epoch, which may now write
	// into the room's pages until it acknowledges an ABORT (acked).
	sent  bool
	epoch uint64
	n     uint64 // the REQUEST's number (target.reqN), once sent
	// endpoint: where the REQUEST went (the target may be found elsewhere
	// since: that process's STATUS and ACKs still name this source).
	endpoint string
	reregs   int
	chunks   map[int]*chunkSeen
	full     int // chunks whose every layer landed
	// spanLo, spanHi: the layers it writes, as its first chunk
	// notification said (spanHi 0: none yet); every chunk names them.
	// legacy: its notifications are the earlier revision's (whole
	// chunks, no positions or layers told: the span is a stand-in).
	spanLo, spanHi int
	legacy         bool
	total          int
	aux            bool
	acked          bool
	// Pull (pull.go): stamps are the last stamps its REQUEST and RENEWs
	// carried (nstamps sent in all), lastStamp when the last went;
	// leaseMillis the lease its PAGES said. reads are in flight
	// (EffectRead not yet done), unsettled failed without being quiesced;
	// readDoneSent: READ_DONE went out.
	pull             bool
	stamps           [maxStamps]stamp
	nstamps          int
	asked            map[[3]int]struct{} // (chunk, lo, hi) of each PAGES read, or being read
	lastStamp        time.Time
	leaseMillis      int
	reads, unsettled int
	readDoneSent     bool
}

func (s *source) complete() bool { return s.aux && s.total > 0 && s.full >= s.total }

// chunkSeen is what landed of one chunk of a source: the positions of the
// REQUEST's dst_pages it fills and which of the source's layers landed.
type chunkSeen struct {
	off, n         int // positions [off, off+n); off −1: not told
	spanLo, spanHi int // the layers the source writes, this rank's numbering
	got            []uint64
	left           int // layers of the span not landed yet
}

// Bounds of a notification's numbers (anything past them is refused and
// counted): chunks of a room per source, layers a source writes.
const (
	maxNotifChunks = 1 << 16
	maxNotifLayers = 1 << 12
)

// record counts a chunk notification; false when it is out of range or
// contradicts the chunk's earlier notifications.
func (s *source) record(in Notified) bool {
	if in.Hi == 0 && s.valid(in) { // a whole chunk, positions not told (earlier revision)
		in.Off, in.N, in.Lo, in.Hi, in.SpanLo, in.SpanHi = -1, 0, 0, 1, 0, 1
		s.legacy = true
	}
	if !s.valid(in) {
		return false
	}
	s.spanLo, s.spanHi = in.SpanLo, in.SpanHi
	cs := s.chunks[in.Chunk]
	if cs == nil {
		cs = &chunkSeen{off: in.Off, n: in.N, spanLo: in.SpanLo, spanHi: in.SpanHi,
			got: make([]uint64, (in.SpanHi-in.SpanLo+63)/64), left: in.SpanHi - in.SpanLo}
		s.chunks[in.Chunk] = cs
	}
	was := cs.left
	for l := in.Lo - cs.spanLo; l < in.Hi-cs.spanLo; l++ {
		if cs.got[l/64]&(1<<(l%64)) == 0 {
			cs.got[l/64] |= 1 << (l % 64)
			cs.left--
		}
	}
	if was > 0 && cs.left == 0 {
		s.full++
	}
	if in.Total > 0 {
		s.total = in.Total
	}
	return true
}

// valid reports whether a chunk notification may be recorded: in range,
// and agreeing with the source's span and the chunk's earlier ones.
func (s *source) valid(in Notified) bool {
	if in.Chunk < 0 || in.Chunk >= maxNotifChunks || in.Total < 0 || in.Total > maxNotifChunks {
		return false
	}
	if in.Hi == 0 { // a whole chunk, positions not told (earlier revision)
		in.Off, in.N, in.Lo, in.Hi, in.SpanLo, in.SpanHi = -1, 0, 0, 1, 0, 1
	}
	if in.SpanLo < 0 || in.SpanHi <= in.SpanLo || in.SpanHi-in.SpanLo > maxNotifLayers ||
		in.Lo < in.SpanLo || in.Hi > in.SpanHi || in.Lo >= in.Hi || in.Off < -1 || in.N < 0 || in.N > maxNotifChunks*maxNotifLayers {
		return false
	}
	if s.spanHi != 0 && (in.SpanLo != s.spanLo || in.SpanHi != s.spanHi) {
		return false
	}
	if cs := s.chunks[in.Chunk]; cs != nil && (cs.off != in.Off || cs.n != in.N || cs.spanLo != in.SpanLo || cs.spanHi != in.SpanHi) {
		return false
	}
	return true
}

// decodeRoom is a decode room's per-source state.
type decodeRoom struct {
	spec    RequestSpec
	init    bool
	sources []*source
	started time.Time
	code    string // the failure's code (the STATUS codes), once Failed
}

// failWith fails a room with a failure code for its load report.
func (c *decodeCore) failWith(room uint64, code, reason string) {
	c.failCode = code
	c.failRoom(room, reason)
	c.failCode = ""
}

// hold is a decode room's claim on its destination pages: from creation
// until Success, or until every prefill rank that got our REQUEST
// acknowledged an ABORT as drained, or until the quarantine deadline. It
// outlives Clear.
type hold struct {
	room     uint64
	srcs     []*source
	failed   bool
	deadline time.Time
}

// reading: a pull read of the room is in flight (it lands in the pages).
func (h *hold) reading() bool {
	for _, s := range h.srcs {
		if s.reads > 0 {
			return true
		}
	}
	return false
}

func (h *hold) armed() bool {
	for _, s := range h.srcs {
		if s.sent {
			return true
		}
	}
	return false
}

func (c *decodeCore) ensureTarget(t Target) *target {
	k := t.key()
	tg := c.targets[k]
	if tg == nil {
		tg = &target{t: t}
		c.targets[k] = tg
	}
	if tg.t.InstTP != t.InstTP || tg.t.InstPP != t.InstPP {
		// The room was mapped onto another shape of the instance: what
		// was bound to the old view fails, and the rank is registered
		// again with the new one.
		old := tg.t
		tg.t = t
		if tg.reg != regNone {
			tg.reg = regNone
		}
		for _, rm := range c.roomsAt(k) {
			if rm.status.Terminal() {
				continue
			}
			id := rm.id
			for _, s := range rm.dec.sources {
				if s.target == k && s.link.InstTP == old.InstTP && s.link.InstPP == old.InstPP && (old.InstTP != 0 || old.InstPP != 0) {
					c.failRoom(id, fmt.Sprintf("prefill instance at %s changed shape (TP %d × PP %d → TP %d × PP %d)", t.Bootstrap, old.InstTP, old.InstPP, t.InstTP, t.InstPP))
					break
				}
			}
		}
	}
	if !tg.resolved && !tg.resolving {
		tg.resolving = true
		c.emit(Effect{Kind: EffectResolve, Target: t})
	}
	return tg
}

// createReceiver creates the decode side of a room that pulls from the
// given prefill ranks (at least one), each writing every page, aux and
// state. The targets are resolved now, so an abort before Init can reach
// them.
func (c *decodeCore) createReceiver(now time.Time, room uint64, targets []Target) Result {
	links := make([]Link, len(targets))
	for i, t := range targets {
		links[i] = Link{Target: t, Aux: true}
	}
	return c.createReceiverLinks(now, room, links)
}

// createReceiverLinks creates the decode side of a room from the rank
// mapping's links: each source's REQUEST says whether it is a dummy,
// carries the aux index and state items only for the Aux link, and names
// the source's index in the room as the uid of its notifications.
func (c *decodeCore) createReceiverLinks(now time.Time, room uint64, links []Link) Result {
	if len(links) == 0 {
		return c.count(EventCreate, rejected(fmt.Errorf("room %d: no prefill target: %w", room, ErrInvalidEvent)))
	}
	if len(links) > c.cfg.MaxSources() {
		return c.count(EventCreate, rejected(fmt.Errorf("room %d: %d prefill ranks exceed %d: %w", room, len(links), c.cfg.MaxSources(), ErrInvalidEvent)))
	}
	res := c.count(EventCreate, c.reg.Create(room, RoleDecode))
	if res.Outcome != Applied {
		return res
	}
	rm := c.reg.rooms[room]
	rm.dec = &decodeRoom{started: now}
	for i, l := range links {
		c.ensureTarget(l.Target)
		rm.dec.sources = append(rm.dec.sources, &source{target: l.Target.key(), uid: i, link: l, chunks: map[int]*chunkSeen{}})
	}
	c.index(rm, true)
	h := &hold{room: room, srcs: rm.dec.sources}
	c.holds[room] = h
	if res.Status == Failed { // aborted before it existed: nothing was asked
		c.release(h, false)
	}
	return res
}

// initReceiver records the room's request and sends it to every prefill
// rank that is registered; the others are registered first (REGISTER,
// retried until acknowledged). The room is WaitingForInput once every
// REQUEST is out.
func (c *decodeCore) initReceiver(now time.Time, room uint64, spec RequestSpec) Result {
	rm, ok := c.reg.rooms[room]
	switch {
	case !ok || rm.dec == nil:
		return c.count(EventInit, rejected(fmt.Errorf("room %d: %w", room, ErrUnknownRoom)))
	case rm.status.Terminal():
		return c.count(EventInit, Result{Outcome: IgnoredTerminal, Status: rm.status})
	case rm.dec.init:
		return c.count(EventInit, Result{Outcome: IgnoredStale, Status: rm.status})
	}
	if spec.Required == 0 {
		spec.Required = 1
	}
	if spec.StateIndices == nil {
		spec.StateIndices = [][]uint32{}
	}
	rm.dec.init, rm.dec.spec = true, spec
	c.flushRequests(rm)
	return c.count(EventInit, Result{Outcome: Applied, Status: rm.status})
}

// flushRequests sends the room's REQUEST to every registered source not
// yet asked, and starts registration with the others.
func (c *decodeCore) flushRequests(rm *room) {
	if rm.status.Terminal() || !rm.dec.init {
		return
	}
	all := true
	for _, s := range rm.dec.sources {
		if s.sent {
			continue
		}
		tg := c.targets[s.target]
		_, watched := c.watching[tg.endpoint]
		if tg.reg == regOK && !watched && c.cfg.RecheckIdle > 0 && c.now.Sub(tg.heard) > c.cfg.RecheckIdle {
			// Nothing has been heard from it for longer than heartbeats
			// would take to declare it dead, and nothing heartbeats it:
			// look it up and register again rather than send the REQUEST
			// to a process that may be gone.
			c.stats.Rechecks++
			c.relookup(tg)
		}
		if tg.reg != regOK {
			all = false
			c.ensureRegistered(tg)
			continue
		}
		if c.cfg.ProbeIdle > 0 && c.now.Sub(tg.heard) > c.cfg.ProbeIdle {
			// Not heard from lately: the process may have died and a new
			// one taken the rank elsewhere. Its PONG sends the REQUEST.
			all = false
			c.probe(tg)
			continue
		}
		sp := rm.dec.spec
		tg.reqN++
		s.sent, s.epoch, s.n, s.endpoint = true, tg.epoch, tg.reqN, tg.endpoint
		req := &wire.Request{N: s.n, Room: rm.id, DstPages: sp.DstPages, AuxIndex: sp.AuxIndex,
			StateIndices: sp.StateIndices, Required: sp.Required, Prefix: sp.Prefix, Dummy: sp.Dummy || s.link.Dummy, Source: s.uid}
		if sp.Pull {
			s.pull, s.lastStamp = true, c.now
			req.Pull, req.At = true, s.stamp(c.now)
		}
		req.Digest = sp.Digest
		if !s.link.Aux {
			req.AuxIndex, req.StateIndices = -1, [][]uint32{}
		}
		if s.link.Required > 0 {
			req.Required = s.link.Required
		}
		c.send(tg.peer(), rm.id, req)
		c.watch(rm.id, tg.peer())
		if c.cfg.ProbeIdle > 0 && c.now.Sub(tg.heard) > c.cfg.ProbeTimeout {
			// Heard from within ProbeIdle, not lately: a PING follows the
			// REQUEST, so a process that died meanwhile is found within
			// ProbeTimeout rather than at the heartbeat bound.
			c.probe(tg)
		}
	}
	if all && rm.status == Bootstrapping {
		c.reg.Init(rm.id)
	}
}

// probe PINGs a registered prefill process (once until its PONG or the
// probe deadline).
func (c *decodeCore) probe(tg *target) {
	if tg.probing {
		return
	}
	tg.probing, tg.probeDeadline = true, c.now.Add(c.cfg.ProbeTimeout)
	c.stats.Probes++
	c.send(tg.peer(), 0, &wire.Ping{})
	c.emit(Effect{Kind: EffectTimer, At: tg.probeDeadline})
}

// heardFrom records a message from a target's endpoint; a probe it
// answers sends the REQUESTs that waited for it.
func (c *decodeCore) heardFrom(tg *target, now time.Time) {
	tg.heard = now
	if tg.probing {
		tg.probing = false
		for _, rm := range c.roomsAt(tg.t.key()) {
			c.flushRequests(rm)
		}
	}
}

// relookup looks a resolved target up again and registers at what the
// lookup names. The endpoint it had stays known meanwhile: messages from
// it still count, heartbeats and dead reports still apply to the rooms
// that asked it, and a lookup that fails for want of the bootstrap service
// falls back to it.
func (c *decodeCore) relookup(tg *target) {
	tg.reg = regNone
	if !tg.resolving {
		tg.resolving = true
		c.emit(Effect{Kind: EffectResolve, Target: tg.t})
	}
}

func (c *decodeCore) ensureRegistered(tg *target) {
	switch {
	case !tg.resolved:
		c.ensureTarget(tg.t)
	case tg.resolving: // a lookup is in flight: register at what it names
	case tg.reg == regNone && c.closedAt(tg):
		c.relookup(tg) // the process said it closed: find the rank's next one
	case tg.reg == regNone:
		tg.reg, tg.retry = regSent, c.cfg.RegisterRetry
		tg.nextRetry = c.now.Add(tg.retry)
		c.sendRegister(tg)
	}
}

func (c *decodeCore) sendRegister(tg *target) {
	m := c.cfg.Register
	if m.Topo != nil && tg.t.InstTP != 0 {
		topo := *m.Topo
		topo.PeerTPSize, topo.PeerPPSize = tg.t.InstTP, tg.t.InstPP
		m.Topo = &topo
	}
	if len(c.echo) > 0 {
		m.Echo = append([]byte(nil), c.echo...)
	}
	c.send(tg.peer(), 0, &m)
}

// resolvedRecord records where a target lives (with the record's identity
// certificate and epoch, which address the first messages to the rank)
// and sends what waited for it: ABORTs owed by rooms aborted before, and
// registrations.
func (c *decodeCore) resolvedRecord(now time.Time, t Target, endpoint, serverKey, cert string, recEpoch uint64) {
	tg := c.targets[t.key()]
	if tg == nil {
		return
	}
	if tg.probeLost && tg.resolved && tg.endpoint != endpoint {
		// The process a probe found silent is no longer the rank's: the
		// rooms whose REQUEST went to it fail now (their ABORTs, owed, go
		// to the new process below), not at the heartbeat bound.
		c.peerDown(tg.endpoint, wire.From{}, false, fmt.Sprintf("rank's record names %s after a probe went unanswered: %s", endpoint, tg.endpoint))
	}
	tg.probeLost = false
	if tg.endpoint != endpoint {
		tg.reg = regNone
	}
	tg.endpoint, tg.serverKey, tg.resolved, tg.resolving = endpoint, serverKey, true, false
	tg.cert, tg.recEpoch = cert, recEpoch
	tg.lookupRetry = 0
	c.sendOwed(tg)
	if tg.reg == regNone && c.closedAt(tg) {
		// The record still names the process that said it closed (its
		// deregistration not yet seen): nothing there will take a room.
		c.stats.ClosedRecords++
		c.failWaiting(tg, fmt.Sprintf("prefill rank dp %d tp %d pp %d closed: its record at %s still names the closed process (epoch %d)",
			t.DP, t.Rank, t.PP, t.Bootstrap, tg.closedEpoch))
		return
	}
	for _, rm := range c.roomsAt(tg.t.key()) {
		c.flushRequests(rm)
	}
}

// closedAt: the target's record names the process that said it closed
// (its endpoint and epoch; a record that says no epoch may name the
// rank's next process, restarted in place: it is registered with, and a
// closed process drops the REGISTER, whose retries look the rank up).
func (c *decodeCore) closedAt(tg *target) bool {
	return tg.closedEpoch != 0 && tg.endpoint == tg.closedEP && tg.recEpoch == tg.closedEpoch
}

// onClosed takes a prefill process's closing notice (STATUS closed, room
// 0), sent after every STATUS it owed us: no REGISTER or REQUEST goes to
// it any more (the rank is looked up again), and each live room whose
// REQUEST went to it numbered above the highest it took fails now, its
// source's pages free at once — that REQUEST was refused after Close or
// never read, so nothing of it is written. A room whose REQUEST it took
// is left to its writes (it succeeded there, or its STATUS came first),
// to its ACKs and to heartbeats.
func (c *decodeCore) onClosed(msg *wire.Status) {
	tg := c.targetAt(msg.From.Endpoint)
	pending := tg != nil && tg.reg == regSent && (tg.recEpoch == 0 || tg.recEpoch == msg.From.Epoch)
	if tg == nil || msg.From.Epoch == 0 || (tg.epoch != msg.From.Epoch && !pending) {
		// Neither the process our registration names nor the one it is
		// registering with (whose REGISTER_ACK may be on the way).
		c.stats.StaleEpoch++
		return
	}
	c.stats.ClosedHeard++
	tg.closedEP, tg.closedEpoch = tg.endpoint, msg.From.Epoch
	tg.reg, tg.probing = regNone, false
	reason := fmt.Sprintf("prefill %s: %s", msg.From.Peer(), msg.Reason)
	untaken := func(s *source) bool {
		return s.target == tg.t.key() && s.sent && s.epoch == msg.From.Epoch && s.n > msg.Taken
	}
	for _, rm := range c.roomsAt(tg.t.key()) {
		if rm.status.Terminal() {
			continue
		}
		for _, s := range rm.dec.sources {
			if untaken(s) {
				// Never taken: as a refused REQUEST (not_registered),
				// nothing of it was or will be written.
				s.sent = false
				c.stats.ClosedUntaken++
				c.failWith(rm.id, CodeClosed, fmt.Sprintf("%s; REQUEST %d of room %d not taken", reason, s.n, rm.id))
			}
		}
	}
	// A room that failed, or was cleared, before the notice with such a
	// REQUEST holds its pages for that source no longer either.
	for _, room := range slices.Sorted(maps.Keys(c.holds)) {
		h := c.holds[room]
		if !h.failed {
			continue
		}
		freed := false
		for _, s := range h.srcs {
			if untaken(s) {
				s.sent, freed = false, true
				c.stats.ClosedUntaken++
			}
		}
		if freed {
			c.maybeRelease(h)
		}
	}
	// The rooms still waiting for the rank, and the next ones, go to
	// wherever its record names now.
	c.relookup(tg)
}

// sendOwed sends the target every ABORT it has not acknowledged, in room
// order, and heartbeats it while any is owed: a process that is gone is
// then reported dead and the rank looked up again.
func (c *decodeCore) sendOwed(tg *target) {
	if !tg.resolved || len(tg.owed) == 0 {
		return
	}
	for _, room := range slices.Sorted(maps.Keys(tg.owed)) {
		c.send(tg.peer(), room, tg.owed[room].msg(room))
	}
	c.watch(0, tg.peer())
}

// oweAbort records an ABORT of room for tg and sends it if tg's endpoint
// is known (else it is looked up).
func (c *decodeCore) oweAbort(tg *target, room uint64, code, reason string) {
	o := owedAbort{code: code, reason: reason, until: c.now.Add(c.cfg.Registry.TombstoneTTL)}
	if _, ok := tg.owed[room]; !ok && len(tg.owed) >= c.cfg.Registry.MaxPendingRooms {
		c.stats.AbortsDropped++
		if tg.resolved { // sent once, not kept
			c.send(tg.peer(), room, o.msg(room))
		}
		return
	}
	if tg.owed == nil {
		tg.owed = map[uint64]owedAbort{}
	}
	tg.owed[room] = o
	if tg.owedRetry == 0 {
		tg.owedRetry, tg.nextOwed = c.cfg.RegisterRetry, c.now.Add(c.cfg.RegisterRetry)
	}
	if !tg.resolved {
		c.ensureTarget(tg.t)
		return
	}
	c.send(tg.peer(), room, o.msg(room))
	c.watch(room, tg.peer())
}

// refuseRoom tells the prefill ranks that may hold a room this rank
// refused before creating it (the rank mapping does not support the
// instance, or its model differs): each gets an ABORT with code refused,
// owed until acknowledged like any other, so their rooms fail at once
// instead of waiting for the bootstrap deadline. A room of that id that
// this rank does hold is left alone.
func (c *decodeCore) refuseRoom(now time.Time, room uint64, targets []Target, reason string) {
	if _, live := c.reg.rooms[room]; live || c.reg.closed != "" {
		return // (a closed rank owes nothing new: it exits)
	}
	if _, held := c.holds[room]; held {
		return
	}
	for _, t := range targets {
		c.oweAbort(c.ensureTarget(t), room, CodeRefused, reason)
	}
}

// resolveFailed handles a lookup that failed. For a rank never resolved,
// the rooms waiting for it fail and ABORTs owed to it wait for a later
// lookup (with backoff). For a re-check or re-lookup of a rank whose
// endpoint is known, that endpoint stays: only a vanished record fails the
// rooms that have not asked it yet.
func (c *decodeCore) resolveFailed(now time.Time, t Target, err error) {
	tg := c.targets[t.key()]
	if tg == nil {
		return
	}
	tg.resolving = false
	reason := fmt.Sprintf("resolving prefill rank dp %d tp %d pp %d at %s: %v", t.DP, t.Rank, t.PP, t.Bootstrap, err)
	if tg.resolved { // a re-check or re-lookup of a rank whose endpoint we have
		closed := c.closedAt(tg)
		if closed {
			reason += fmt.Sprintf(" (its last process, %s epoch %d, closed)", tg.closedEP, tg.closedEpoch)
		}
		if errors.Is(err, wire.ErrRankUnknown) || closed {
			// Its record is gone, or the only process we know of said
			// it closed: rooms that have not asked it yet fail (each
			// later room looks the rank up again, once).
			c.failWaiting(tg, reason)
			return
		}
		// The bootstrap service did not answer: register at the endpoint
		// we had (an unanswered REGISTER looks it up again later).
		for _, rm := range c.roomsAt(tg.t.key()) {
			c.flushRequests(rm)
		}
		return
	}
	if len(tg.owed) > 0 {
		tg.lookupRetry = min(max(2*tg.lookupRetry, c.cfg.RegisterRetry), 32*c.cfg.RegisterRetry)
		tg.nextLookup = now.Add(tg.lookupRetry)
	}
	c.failWaiting(tg, reason)
}

// failWaiting fails the live rooms that wait for tg's registration.
func (c *decodeCore) failWaiting(tg *target, reason string) {
	for _, rm := range c.roomsAt(tg.t.key()) {
		if rm.status.Terminal() {
			continue
		}
		for _, s := range rm.dec.sources {
			if s.target == tg.t.key() && (!s.sent || !tg.resolved) {
				c.failRoom(rm.id, reason)
				break
			}
		}
	}
}

// targetAt is the resolved target at endpoint (the least by key, should
// two name one endpoint).
func (c *decodeCore) targetAt(endpoint string) *target {
	var at *target
	for k, tg := range c.targets {
		if tg.resolved && tg.endpoint == endpoint && (at == nil || k < at.t.key()) {
			at = tg
		}
	}
	return at
}

// roomsAt returns the live decode rooms with a source at target key, in
// room order: the index keeps a room from its creation to its Clear, so a
// message about one prefill rank touches only that rank's rooms.
func (c *decodeCore) roomsAt(key string) []*room {
	ids := slices.Sorted(maps.Keys(c.roomsOf[key]))
	out := make([]*room, 0, len(ids))
	for _, id := range ids {
		if rm := c.reg.rooms[id]; rm != nil && rm.dec != nil {
			out = append(out, rm)
		}
	}
	return out
}

// index adds (or with add false removes) a decode room under each of its
// sources' targets.
func (c *decodeCore) index(rm *room, add bool) {
	for _, s := range rm.dec.sources {
		set := c.roomsOf[s.target]
		switch {
		case add && set == nil:
			c.roomsOf[s.target] = map[uint64]struct{}{rm.id: {}}
		case add:
			set[rm.id] = struct{}{}
		default:
			delete(set, rm.id)
			if len(set) == 0 {
				delete(c.roomsOf, s.target)
			}
		}
	}
}

// onRegisterAck completes the registration it answers, whatever epoch it
// comes from (a restarted prefill rank answers with its new one); rooms
// bound to an older epoch of that rank fail.
func (c *decodeCore) onRegisterAck(msg *wire.RegisterAck) {
	tg := c.targetAt(msg.From.Endpoint)
	if tg == nil || (tg.reg == regOK && tg.epoch == msg.From.Epoch) {
		return
	}
	if tg.closedEpoch != 0 && msg.From.Epoch == tg.closedEpoch && msg.From.Endpoint == tg.closedEP {
		// Sent before that process closed (its offer loaded since):
		// nothing goes to it now.
		c.stats.StaleEpoch++
		return
	}
	if !msg.OK {
		tg.reg = regNone
		// A prefill rank refused us: an instance may have changed shape
		// under a cached topology. The next room reads them again.
		c.forgetTopology("")
		c.failWaiting(tg, fmt.Sprintf("%v: prefill %s: %s", ErrIncompatible, msg.From.Peer(), msg.Reason))
		return
	}
	restarted := tg.reg == regOK || (tg.epoch != 0 && tg.epoch != msg.From.Epoch)
	if tg.reg == regOK {
		c.targetRestarted(tg, msg.From.Epoch)
	}
	tg.reg, tg.epoch, tg.unanswered = regOK, msg.From.Epoch, 0
	tg.leaseMillis = 0
	if msg.Pull != nil {
		tg.leaseMillis = msg.Pull.LeaseMillis
	}
	if restarted {
		c.sendOwed(tg) // the new process may hold rooms aborted before it was known
	}
	for _, rm := range c.roomsAt(tg.t.key()) {
		c.flushRequests(rm)
	}
}

// targetRestarted fails every live room whose REQUEST went to another
// epoch of tg than epoch.
func (c *decodeCore) targetRestarted(tg *target, epoch uint64) {
	for _, rm := range c.roomsAt(tg.t.key()) {
		if rm.status.Terminal() {
			continue
		}
		for _, s := range rm.dec.sources {
			if s.target == tg.t.key() && s.sent && s.epoch != epoch {
				c.failWith(rm.id, CodePeerRestarted, fmt.Sprintf("prefill %s: %s", tg.endpoint, wire.ReasonPeerRestarted))
				break
			}
		}
	}
}

// answering finds the room's source whose REQUEST went to from (its
// endpoint and epoch), wherever its rank is found now: a process the rank
// has left (its record moved to the next one) still answers for the
// REQUEST it took — its STATUS, and the drained ACK that frees the pages
// (found by a fault hunt: a closing process's ACKs were dropped once the
// rank's new process was looked up, and the pages waited out the
// quarantine). Reads (pull) go only to where the rank is now: sourceFrom.
func (c *decodeCore) answering(srcs []*source, from wire.From) (*source, *target) {
	for _, s := range srcs {
		if s.sent && s.endpoint == from.Endpoint && s.epoch == from.Epoch {
			return s, c.targets[s.target]
		}
	}
	return nil, nil
}

// sourceFrom finds the room's source at endpoint.
func (c *decodeCore) sourceFrom(srcs []*source, endpoint string) (*source, *target) {
	for _, s := range srcs {
		if tg := c.targets[s.target]; tg != nil && tg.resolved && tg.endpoint == endpoint {
			return s, tg
		}
	}
	return nil, nil
}

// onStatus handles STATUS failed from a prefill rank of the room. Code
// not_registered means that rank lost our registration (it restarted, or
// dropped it): we register again and resend the REQUEST once, instead of
// failing the room. Any other code fails the room.
func (c *decodeCore) onStatus(msg *wire.Status) {
	if msg.Status != wire.StatusFailed {
		return
	}
	if msg.Code == CodeClosed && msg.Room == 0 {
		c.onClosed(msg)
		return
	}
	if msg.Code == CodeLeaseExpired {
		c.resendReadDone(msg)
	}
	rm, ok := c.reg.rooms[msg.Room]
	if !ok || rm.dec == nil || rm.status.Terminal() {
		return
	}
	s, tg := c.sourceFrom(rm.dec.sources, msg.From.Endpoint)
	if a, atg := c.answering(rm.dec.sources, msg.From); a != nil && msg.Code != CodeNotRegistered {
		// (a not_registered from a process the rank has left says
		// nothing of where it is now)
		s, tg = a, atg
	}
	if s == nil || (s.sent && s.epoch != msg.From.Epoch && msg.Code != CodeNotRegistered) {
		c.stats.StaleEpoch++
		return
	}
	if msg.Code == CodeNotRegistered && s.reregs == 0 {
		s.reregs++
		s.sent = false // that rank refused the REQUEST: nothing of it was written
		if tg.reg == regOK {
			tg.reg = regNone
		}
		c.flushRequests(rm)
		return
	}
	c.failWith(msg.Room, cmp.Or(msg.Code, CodeFailed), fmt.Sprintf("prefill %s: %s", msg.From.Peer(), msg.Reason))
}

// onAbortAck ends the quarantine of the room's pages once every prefill
// rank that got our REQUEST acknowledged, from the same process (epoch),
// that nothing of the room can land.
func (c *decodeCore) onAbortAck(msg *wire.AbortAck) {
	if tg := c.targetAt(msg.From.Endpoint); tg != nil {
		delete(tg.owed, msg.Room) // that process has the abort
	}
	h, ok := c.holds[msg.Room]
	if !ok || !h.failed {
		return
	}
	s, _ := c.answering(h.srcs, msg.From)
	if s == nil {
		c.stats.StaleEpoch++
		return
	}
	if msg.Drained {
		s.acked = true
		c.maybeRelease(h)
	}
}

func (c *decodeCore) maybeRelease(h *hold) {
	for _, s := range h.srcs {
		if s.sent && !s.acked {
			return
		}
	}
	c.release(h, false)
}

func (c *decodeCore) release(h *hold, forced bool) {
	delete(c.holds, h.room)
	if forced {
		c.stats.ForcedReleases++
	}
	c.emit(Effect{Kind: EffectWake, Room: h.room, Wake: WakeHold})
	c.emit(Effect{Kind: EffectReleased, Room: h.room, Forced: forced})
}

// notified steps a data-plane notification (Step's Notified). One that
// can be no source's data is refused and counted (BadNotifs) before
// notification sees it: for a room not yet Success, a uid that names no
// source its REQUEST went to, a pull source's (what it lands is what its
// reads land: a notification would count chunks nothing read), and
// positions past the REQUEST's dst_pages.
func (c *decodeCore) notified(now time.Time, in Notified) {
	if rm, ok := c.reg.rooms[in.Room]; ok && rm.dec != nil && rm.status != Success {
		var src *source
		for _, s := range rm.dec.sources {
			if s.uid == in.UID && s.sent {
				src = s
			}
		}
		if src == nil || src.pull || !in.Aux && in.Off >= 0 && in.Off+in.N > len(rm.dec.spec.DstPages) {
			c.stats.BadNotifs++
			return
		}
		if in.Undelivered != "" {
			c.undelivered(rm, src, in)
			return
		}
		if in.Unsummed != "" {
			c.unsummed(rm, src, in)
			return
		}
		if in.Corrupt == "" && rm.dec.spec.Digest && !in.Aux && (in.N > 0 || in.Hi == 0) && in.Digests == nil {
			in.Corrupt = "the room asked for a digest and the notification of its pages carries none (a prefill rank of an earlier revision)"
		}
		if in.Corrupt == "" && rm.dec.spec.Digest && !in.Aux && in.N > 0 && !in.Checked && !rm.status.Terminal() {
			in.Corrupt = "its pages were not checked against their digest"
		}
		if in.Corrupt != "" {
			c.corrupt(rm, src, in)
			return
		}
	}
	c.notification(now, in)
}

// undelivered fails a room whose notification named bytes that did not
// land (Notified.Undelivered): counted, nothing of it recorded as landed.
func (c *decodeCore) undelivered(rm *room, src *source, in Notified) {
	if !in.Aux && !src.valid(in) {
		c.stats.BadNotifs++
		return
	}
	c.stats.NotDelivered++
	if rm.status.Terminal() {
		return
	}
	peer := c.sourcePeer(src)
	what := "its aux write"
	if !in.Aux {
		what = fmt.Sprintf("chunk %d (positions %d+%d, layers %d–%d)", in.Chunk, in.Off, in.N, in.Lo, in.Hi)
	}
	c.failWith(in.Room, CodeNotDelivered, fmt.Sprintf("room %d: prefill rank %s (source %d) notified %s written, but %s", in.Room, peer, in.UID, what, in.Undelivered))
}

// unsummed fails a room whose notification's pages the decode shell could
// not sum for their digest (Notified.Unsummed): this rank's own failure,
// so the room fails CodeFailed, not corrupt; nothing of it recorded as
// landed.
func (c *decodeCore) unsummed(rm *room, src *source, in Notified) {
	if in.Aux || !src.valid(in) {
		c.stats.BadNotifs++
		return
	}
	if rm.status.Terminal() {
		return
	}
	c.failWith(in.Room, CodeFailed, fmt.Sprintf("room %d: chunk %d from prefill rank %s (source %d) could not be checked against its digest here: %s", in.Room, in.Chunk, c.sourcePeer(src), in.UID, in.Unsummed))
}

// sourcePeer names a room's source for a failure: its prefill rank's
// control endpoint once resolved, else its target.
func (c *decodeCore) sourcePeer(src *source) string {
	if tg := c.targets[src.target]; tg != nil && tg.endpoint != "" {
		return tg.endpoint
	}
	return src.target
}

// corrupt fails a room whose notification's pages do not match their
// digest (Notified.Corrupt): counted, nothing of it recorded as landed.
func (c *decodeCore) corrupt(rm *room, src *source, in Notified) {
	if in.Aux || !src.valid(in) {
		c.stats.BadNotifs++
		return
	}
	c.stats.DigestMismatches++
	if rm.status.Terminal() {
		return
	}
	peer := c.sourcePeer(src)
	c.failWith(in.Room, CodeCorrupt, fmt.Sprintf("room %d: prefill rank %s (source %d), chunk %d: %s", in.Room, peer, in.UID, in.Chunk, in.Corrupt))
}

// initable: Core.Initable.
func (c *decodeCore) initable(room uint64) bool {
	rm, live := c.reg.rooms[room]
	return live && rm.dec != nil && !rm.dec.init && !rm.status.Terminal()
}

// writeSource: Core.WriteSource.
func (c *decodeCore) writeSource(room uint64, uid int) (spec RequestSpec, l Link, ok bool) {
	rm, live := c.reg.rooms[room]
	if !live || rm.dec == nil || rm.status.Terminal() || uid < 0 || uid >= len(rm.dec.sources) {
		return spec, l, false
	}
	return rm.dec.spec, rm.dec.sources[uid].link, true
}

// notification counts a prefill rank's notification for a room (a chunk's
// layer group, or its aux write; docs/PROTOCOL.md "Data plane:
// notifications"). The room succeeds when every source delivered every
// layer of all its chunks, and its aux. A failed room still records what
// landed, for its load report.
func (c *decodeCore) notification(now time.Time, in Notified) {
	room := in.Room
	rm, ok := c.reg.rooms[room]
	if !ok || rm.dec == nil || rm.status == Success {
		return
	}
	var src *source
	for _, s := range rm.dec.sources {
		if s.uid == in.UID && s.sent {
			src = s
		}
	}
	if src == nil {
		return
	}
	if tg := c.targets[src.target]; tg != nil {
		tg.heard = now // its data arrived: the process is alive
	}
	if rm.dec.spec.Digest && !in.Aux && (in.N > 0 || in.Hi == 0) && !in.Checked {
		// Pages of a room that asked for a digest, not checked against it
		// (a failed room's: the shell checks a live room's only): not
		// vouched for.
		return
	}
	if in.Aux {
		src.aux = true
	} else if !src.record(in) {
		c.stats.BadNotifs++
		return
	}
	if rm.status.Terminal() {
		return
	}
	c.count(EventProgress, c.reg.Progress(room))
	c.maybeSucceed(room)
}

// maybeSucceed: a live decode room succeeds when every source delivered
// every layer of all its chunks and its aux, and no pull read of it is in
// flight (a duplicate PAGES's read would land in released pages).
func (c *decodeCore) maybeSucceed(room uint64) {
	rm, ok := c.reg.rooms[room]
	if !ok || rm.dec == nil || rm.status.Terminal() {
		return
	}
	for _, s := range rm.dec.sources {
		if !s.complete() || s.reads > 0 {
			return
		}
	}
	if c.count(EventUpdate, c.reg.Update(room, Success, "")).Outcome == Applied {
		if h := c.holds[room]; h != nil {
			c.release(h, false)
		}
	}
}

// decodeFailed runs once a decode room failed: every prefill rank of the
// room gets an ABORT (before or after our REQUEST: a sender created later
// then starts Failed), and the pages stay quarantined if any REQUEST went
// out.
func (c *decodeCore) decodeFailed(room uint64, reason string) {
	rm, ok := c.reg.rooms[room]
	if ok && rm.dec != nil {
		if rm.dec.code == "" {
			rm.dec.code = cmp.Or(c.failCode, CodeFailed)
		}
		for _, s := range rm.dec.sources {
			c.oweAbort(c.targets[s.target], room, "", reason)
			c.maybeReadDone(room, s)
		}
	}
	h, ok := c.holds[room]
	if !ok || h.failed {
		return
	}
	h.failed = true
	if !h.armed() {
		c.release(h, false)
		return
	}
	h.deadline = c.now.Add(c.cfg.QuarantineTimeout)
}

// abortReceiver fails a decode room from this side.
func (c *decodeCore) abortReceiver(now time.Time, room uint64, reason string) Result {
	res := c.count(EventAbort, c.reg.Abort(room, reason, nil))
	if res.Outcome == Applied {
		c.failCode = CodeAborted
		c.decodeFailed(room, reason)
		c.failCode = ""
	}
	return res
}

// clearReceiver forgets a decode room. An unfinished room is failed first
// (its prefill ranks get ABORT); its pages stay quarantined past Clear.
func (c *decodeCore) clearReceiver(now time.Time, room uint64) Result {
	if st, ok := c.reg.Status(room); ok && !st.Terminal() {
		c.failWith(room, CodeCleared, "cleared before it finished")
	}
	rm := c.reg.rooms[room]
	res := c.count(EventClear, c.reg.Clear(room))
	if rm != nil && rm.dec != nil && res.Outcome == Applied {
		c.index(rm, false)
	}
	return res
}

func downCode(restarted bool) string {
	if restarted {
		return CodePeerRestarted
	}
	return CodePeerUnreachable
}

// decodePeerDown handles a prefill rank that heartbeats declared dead or
// that restarted (a message from a new epoch at its endpoint): rooms bound
// to it fail and send ABORT (a live or restarted process answers it). A
// registration still waiting for its REGISTER_ACK is kept: the ACK will
// come from the new process.
func (c *decodeCore) peerDown(endpoint string, from wire.From, restarted bool, reason string) {
	tg := c.targetAt(endpoint)
	if tg == nil {
		return
	}
	owedBefore := slices.Sorted(maps.Keys(tg.owed)) // the rooms failed below send theirs now
	tg.probing = false
	for _, rm := range c.roomsAt(tg.t.key()) {
		if rm.status.Terminal() {
			continue
		}
		for _, s := range rm.dec.sources {
			if s.target == tg.t.key() && s.sent && (!restarted || s.epoch != from.Epoch) {
				c.failWith(rm.id, downCode(restarted), "prefill "+reason)
				break
			}
		}
	}
	switch {
	case restarted:
		if tg.reg == regOK && tg.epoch != from.Epoch {
			tg.reg = regNone
		}
	default: // unreachable: look it up and register again
		tg.reg, tg.resolved = regNone, false
	}
	// Rooms still waiting for this target start over: lookup, REGISTER.
	for _, rm := range c.roomsAt(tg.t.key()) {
		c.flushRequests(rm)
	}
	// ABORTs it has not acknowledged go to whatever process holds the rank
	// now: the new one at this endpoint, or wherever a lookup finds it.
	switch {
	case len(tg.owed) == 0:
	case tg.resolved:
		for _, room := range owedBefore {
			if o, ok := tg.owed[room]; ok {
				c.send(tg.peer(), room, o.msg(room))
			}
		}
	default:
		c.ensureTarget(tg.t)
	}
}

// targetChangedRecord applies what a discovery backend pushed about a prefill
// rank: its record vanished (gone: it died or deregistered) or names
// another endpoint (it restarted elsewhere). Rooms bound to the old process
// fail as on a peer-dead report — every prefill rank of them gets ABORT — and
// the target is looked up again, or takes the new endpoint at once.
//
// A record at the same endpoint with another epoch than the process that
// acknowledged our REGISTER (epoch 0: the record does not say) is a restart
// in place: handled as the control plane's restart report would be. cert
// is the record's identity certificate.
func (c *decodeCore) targetChangedRecord(now time.Time, t Target, endpoint, serverKey, cert string, epoch uint64, gone bool) {
	tg := c.targets[t.key()]
	if tg == nil || !tg.resolved {
		return
	}
	if !gone && tg.endpoint == endpoint {
		if cert != "" {
			tg.cert = cert
		}
		tg.recEpoch = max(tg.recEpoch, epoch)
		if epoch != 0 && tg.reg == regOK && tg.epoch != epoch {
			c.peerDown(endpoint, wire.From{Endpoint: endpoint, Epoch: epoch}, true,
				fmt.Sprintf("rank's discovery record names a new process (epoch %d → %d): %s", tg.epoch, epoch, endpoint))
		}
		return
	}
	old := tg.endpoint
	what := "record vanished"
	if !gone {
		what = "record moved to " + endpoint
	}
	c.peerDown(old, wire.From{}, false, fmt.Sprintf("rank's discovery %s: %s", what, old))
	if !gone {
		tg.resolving = false
		c.resolvedRecord(now, t, endpoint, serverKey, cert, epoch)
	}
}

// tick releases holds past their quarantine deadline, retries
// REGISTERs that got no answer (looking the rank up again after
// registerLookupAfter of them), forgets owed ABORTs past the TTL and looks
// up again the ranks that owed ABORTs still wait for.
func (c *decodeCore) tick(now time.Time) {
	for _, room := range slices.Sorted(maps.Keys(c.holds)) {
		if h := c.holds[room]; h.failed && now.After(h.deadline) && !h.reading() {
			c.release(h, true)
		}
	}
	c.pullTick(now)
	c.offerChallengeTick(now)
	for _, k := range slices.Sorted(maps.Keys(c.targets)) {
		tg := c.targets[k]
		maps.DeleteFunc(tg.owed, func(_ uint64, o owedAbort) bool { return now.After(o.until) })
		switch {
		case len(tg.owed) == 0:
			tg.owed, tg.lookupRetry, tg.owedRetry = nil, 0, 0
		case !tg.resolved && !tg.resolving && !now.Before(tg.nextLookup):
			c.ensureTarget(tg.t)
		case tg.resolved && !tg.resolving && !now.Before(tg.nextOwed):
			// None acknowledged since the last send: send them again.
			c.stats.AbortsResent += uint64(len(tg.owed))
			tg.owedRetry = min(2*tg.owedRetry, 32*c.cfg.RegisterRetry)
			tg.nextOwed = now.Add(tg.owedRetry)
			c.sendOwed(tg)
		}
		if tg.probing && !now.Before(tg.probeDeadline) {
			// No PONG: look the rank up and register wherever its record
			// says (a new process, if it restarted elsewhere).
			tg.probing = false
			if c.busy(tg) {
				c.stats.ProbesLost++
				tg.probeLost = true
				c.relookup(tg)
				continue
			}
		}
		if tg.reg == regSent && tg.resolved && now.After(tg.nextRetry) {
			if !c.waitsFor(tg) {
				tg.reg = regNone // nobody waits any more: stop asking
				continue
			}
			if tg.unanswered >= registerLookupAfter {
				// Nobody answers at that endpoint: look the rank up
				// again rather than retry a cached endpoint forever.
				tg.unanswered = 0
				c.stats.Relookups++
				c.relookup(tg)
				continue
			}
			tg.unanswered++
			c.stats.RegisterRetries++
			tg.retry = min(2*tg.retry, 32*c.cfg.RegisterRetry)
			tg.nextRetry = now.Add(tg.retry)
			c.sendRegister(tg)
		}
	}
}

// busy reports whether a live room is bound to tg (its REQUEST sent or
// waiting to go).
func (c *decodeCore) busy(tg *target) bool {
	for _, rm := range c.roomsAt(tg.t.key()) {
		if !rm.status.Terminal() && rm.dec.init {
			return true
		}
	}
	return false
}

// waitsFor reports whether a live room still waits to send tg its REQUEST.
func (c *decodeCore) waitsFor(tg *target) bool {
	for id := range c.roomsOf[tg.t.key()] {
		rm := c.reg.rooms[id]
		if rm == nil || rm.dec == nil || !rm.dec.init || rm.status.Terminal() {
			continue
		}
		for _, s := range rm.dec.sources {
			if s.target == tg.t.key() && !s.sent {
				return true
			}
		}
	}
	return false
}

// ParseNotif parses "kvb1:<room>:<uid>:<chunk>:<total>:<off>:<n>:<lo>:<hi>:<span_lo>:<span_hi>",
// the earlier revision's "kvb1:<room>:<uid>:<chunk>:<total>" and
// "kvb1:<room>:<uid>:aux" into the core's input (ranges are checked
// there).
func ParseNotif(s string) (Notified, bool) {
	f := strings.Split(s, ":")
	if (len(f) != 4 && len(f) != 5 && len(f) != 11 && len(f) != 13) || f[0] != "kvb1" {
		return Notified{}, false
	}
	var n Notified
	var err error
	if n.Room, err = strconv.ParseUint(f[1], 10, 64); err != nil {
		return Notified{}, false
	}
	if n.UID, err = strconv.Atoi(f[2]); err != nil || n.UID < 0 {
		return Notified{}, false
	}
	if len(f) == 4 {
		n.Aux = f[3] == "aux"
		return n, n.Aux
	}
	fields := []*int{&n.Chunk, &n.Total, &n.Off, &n.N, &n.Lo, &n.Hi, &n.SpanLo, &n.SpanHi}
	for i, p := range fields[:min(len(f)-3, len(fields))] {
		v, err := strconv.Atoi(f[3+i])
		if err != nil || v < 0 || v > math.MaxInt32 {
			return Notified{}, false
		}
		*p = v
	}
	if len(f) == 13 && !parseDigests(&n, f[11], f[12]) {
		return Notified{}, false
	}
	return n, len(f) == 5 || n.Hi > 0
}

// parseDigests reads a notification's digest fields (docs/PROTOCOL.md
// "Digest"): eight hex digits for each of its N positions, and the units
// of the last position it filled (1 … MaxLastUnits). A digest of another
// length, or positions it names none for, make the notification
// malformed.
func parseDigests(n *Notified, sums, units string) bool {
	if n.N == 0 || n.N > wire.MaxPages || len(sums) != 8*n.N {
		return false
	}
	k, err := strconv.Atoi(units)
	if err != nil || k < 1 || k > MaxLastUnits {
		return false
	}
	n.Digests, n.LastUnits = make([]uint32, n.N), k
	for i := range n.Digests {
		v, err := strconv.ParseUint(sums[8*i:8*i+8], 16, 32)
		if err != nil {
			return false
		}
		n.Digests[i] = uint32(v)
	}
	return true
}

// MaxLastUnits bounds a digest notification's units of its last page (a
// page of at most this many units of the other side's page).
const MaxLastUnits = 1 << 16

// failed aborts a room that failed here on its prefill ranks.
func (c *decodeCore) failed(room uint64, reason string, _ Result) { c.decodeFailed(room, reason) }

// expired aborts a room a deadline failed.
func (c *decodeCore) expired(e Expiry) { c.decodeFailed(e.Room, e.Reason) }

// needs marks the prefill ranks with a live room here or an owed ABORT.
func (c *decodeCore) needs(needed map[string]bool) {
	for _, tg := range c.targets {
		if !tg.resolved {
			continue
		}
		if len(tg.owed) > 0 {
			needed[tg.endpoint] = true
			continue
		}
		for id := range c.roomsOf[tg.t.key()] {
			if rm := c.reg.rooms[id]; rm != nil && !rm.status.Terminal() {
				needed[tg.endpoint] = true
				break
			}
		}
	}
}

// CheckSpec refuses a spec that names a destination page, or an item of
// one state region, twice: two positions of the room would land in the
// same memory.
func CheckSpec(room uint64, spec RequestSpec) error {
	if i, j, ok := firstRepeat(spec.DstPages); ok {
		return fmt.Errorf("room %d: DstPages[%d] and DstPages[%d] both name page %d: %w", room, i, j, spec.DstPages[i], ErrInvalidSpec)
	}
	for r, list := range spec.StateIndices {
		if i, j, ok := firstRepeat(list); ok {
			return fmt.Errorf("room %d: StateIndices[%d][%d] and [%d][%d] both name item %d: %w", room, r, i, r, j, list[i], ErrInvalidSpec)
		}
	}
	return nil
}
