package core

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// Pull (docs/PROTOCOL.md "Pull"): the decode rank asks for it in its
// REQUEST; the prefill rank publishes each chunk's pages (PAGES) instead of
// writing them, the decode rank reads them and says when its reads are over
// (READ_DONE). The prefill rank holds the pages under a lease the decode
// rank renews (RENEW), and releases them only once no read of them can be
// in progress: on READ_DONE drained from every decode process it
// published to, or at a quarantine deadline past the lease.
//
// The lease is measured, on the decode side, from the decode rank's own
// clock when it sent the message the prefill rank last heard (its REQUEST
// or a RENEW: the "at" PAGES echoes), as a leader lease is: the prefill
// rank's lease starts when it hears that message or later, so the decode
// rank's end comes first on any two clocks that run at the same rate
// (leaseMargin covers a drift). A read is posted only before the decode
// rank's end (the gate, ReadPosting). Every other rule mirrors a write's:
// the prefill rank's room counts each decode process's reads as one lease
// from the first PAGES to its READ_DONE, held as a write that failed
// unquiesced is (it may still read until a drained READ_DONE, or the drain
// deadline; the pull hold's quarantine covers the rest), so ABORT_ACK,
// STATUS and the stall and drain deadlines apply unchanged.

// CodeLeaseExpired: a pull room's lease ended before its reads (STATUS,
// READ_DONE reason, load report).
const CodeLeaseExpired = "lease_expired"

// leaseMargin: the decode rank's lease ends this fraction of the lease
// before the prefill rank's would on the same clock rate (1/16).
const leaseMarginShift = 4

// Read is one pull read: what the prefill rank would have written to this
// decode rank for one PAGES — page runs (prefill page or unit → decode page
// or unit) over Layers of the prefill rank's numbering, and with the final
// one its state runs and aux item — read from the prefill rank instead.
// Remote, Peer and Slice are left to the shell (the prefill rank's agent,
// layout and plan).
type Read struct {
	Source int    // the source's index in the room (its uid)
	Target Target // the prefill rank
	Epoch  uint64 // the prefill process whose pages these are
	Writes []kvlayout.Write
	// Notif is what the read's completion counts as (the notification the
	// write would have carried); Final adds the aux notification.
	Notif Notified
	Final bool
	// Until ends the lease: the read is not posted at or after it.
	Until time.Time
	// Remote and Layout (a rank that pulls through offers): the loaded
	// agent of the accepted offer the read goes through, and the layout
	// its regions make. The gate refuses the read once that offer is
	// replaced (offerAt, offer).
	Remote  string
	Layout  kvlayout.Layout
	offerAt offerKey
	offer   uint64
}

// Pulling reports whether a PAGES published nothing to read (a dummy, or
// pages the decode rank holds).
func (r *Read) empty() bool { return len(r.Writes) == 0 }

// ReadPosting is the gate right before a pull read is posted (decode):
// the output's OK says whether it may be. A refused read is over (it was
// never posted).
type ReadPosting struct {
	Room uint64
	Read *Read
}

// ReadDone reports a pull read's completion (Err nil) or failure (decode);
// Quiesced says a failed read can no longer land.
type ReadDone struct {
	Room     uint64
	Read     *Read
	Err      error
	Quiesced bool
	// NotDelivered: Err is a READ the engine reported complete that did
	// not deliver (its canary still there): the room fails
	// CodeNotDelivered.
	NotDelivered bool
	// LeaseEnded: Err is the shell's refusal to post the read (or its
	// next transfer) because its lease (Read.Until) had ended by then:
	// the room fails CodeLeaseExpired, as at the gate.
	LeaseEnded bool
	// Corrupt (set by the shell's digest check, the read done): what of
	// the pages read does not match the prefill rank's digest
	// (docs/PROTOCOL.md "Digest"). The room fails CodeCorrupt; the read
	// counts for nothing. Checked: every page of it was summed and
	// matched (Notified.Checked).
	Corrupt string
	Checked bool
}

func (ReadPosting) input() {}
func (ReadDone) input()    {}

// pullHold is a prefill room's hold on its source pages once it published
// a chunk for pull: until every decode process it published to reported
// its reads drained, or a quarantine deadline past the lease. It outlives
// Clear.
type pullHold struct {
	room    uint64
	peers   []*pullPeer
	pages   int // prefill pages published
	counted int // chunks counted in pages
	first   time.Time
	// published: the last publish, from which the room's stall deadline
	// runs (docs/PROTOCOL.md "RENEW": the hold's bound).
	published time.Time
	// deadline: set once the room settled with a read that may still be
	// in progress (no READ_DONE, or one not drained): forced release then.
	deadline time.Time
}

// pullPeer is one decode process a pull room publishes to.
type pullPeer struct {
	key      string
	epoch    uint64
	open     bool // published, no READ_DONE yet: one write in flight of the room
	closed   bool // READ_DONE came
	drained  bool // ... saying no read can land
	leaseEnd time.Time
}

// servesPull: this prefill rank publishes pages for pull.
func (c *prefillCore) servesPull() bool { return c.cfg.Lease > 0 }

// pullMode checks a REQUEST's mode against this rank and the room's
// other requests ("" when it may be accepted).
func (c *prefillCore) pullMode(msg *wire.Request) string {
	if msg.Pull && !c.servesPull() {
		return fmt.Sprintf("room %d: %s asked for pull; this prefill rank does not serve pull (no lease configured)", msg.Room, msg.From.Peer())
	}
	for _, pr := range c.roomRequests(msg.Room) {
		if pr.Payload != nil && pr.Payload.Pull != msg.Pull {
			return fmt.Sprintf("room %d: %s asked for %s, another decode rank of the room asked for %s (one room, one mode)",
				msg.Room, msg.From.Peer(), modeName(msg.Pull), modeName(pr.Payload.Pull))
		}
	}
	return ""
}

func modeName(pull bool) string {
	if pull {
		return "pull"
	}
	return "push"
}

// roomRequests are the accepted requests of a live or pending room.
func (c *prefillCore) roomRequests(room uint64) []PeerRequest {
	if rm, ok := c.reg.rooms[room]; ok {
		return rm.requests
	}
	if p, ok := c.reg.pending[room]; ok {
		return p.requests
	}
	return nil
}

// publish sends one chunk (or layer range) of a pull room to the decode
// process of pr, opening its reads (one write in flight of the room) on the
// first. A dummy gets the chunk's final range only, with no pages.
func (c *prefillCore) publish(rm *room, in SendChunk, at chunkAt, pr PeerRequest) string {
	req := pr.Payload
	p := c.peers[pr.Peer]
	if req.Dummy && !at.whole {
		return ""
	}
	h := c.pulls[rm.id]
	if h == nil {
		h = &pullHold{room: rm.id, first: c.now}
		c.pulls[rm.id] = h
	}
	var pp *pullPeer
	for _, x := range h.peers {
		if x.key == pr.Peer && x.epoch == pr.Epoch {
			pp = x
		}
	}
	if pp == nil {
		pp = &pullPeer{key: pr.Peer, epoch: pr.Epoch}
		h.peers = append(h.peers, pp)
	}
	if pp.closed {
		return "" // its reads are over (it failed them): nothing more to publish
	}
	if !pp.open {
		if res := c.reg.leaseOpened(rm.id, c.now); res.Outcome != Applied {
			return fmt.Sprintf("publishing to %s: %v", pr.Peer, res.Err)
		}
		pp.open = true
	}
	c.published(h)
	pp.leaseEnd = c.now.Add(c.cfg.Lease)
	shift := 0
	if p.plan != nil {
		shift = p.plan.RegionOffset / 2
	}
	msg := &wire.Pages{Room: rm.id, Chunk: at.chunk, Total: at.total, First: at.first,
		Lo: at.lo + shift, Hi: at.hi + shift, SpanLo: shift, SpanHi: at.layers + shift,
		Final: in.Last && at.whole, Aux: -1, State: [][]uint32{}, At: pr.At, LeaseMillis: int(c.cfg.Lease / time.Millisecond)}
	var digest *kvlayout.Write
	if !req.Dummy {
		msg.Pages = slices.Clone(in.Pages)
		if req.Digest {
			pm := kvlayout.PageMap{Src: 1, Dst: 1}
			if p.plan != nil {
				pm = p.plan.Pages()
			}
			// (A pairing that fails here fails at the decode rank too.)
			if src, dst, _, _, err := pm.Pair(at.first, in.Pages, req.Prefix, req.DstPages); err == nil && len(src) > 0 {
				digest = &kvlayout.Write{Runs: kvlayout.Runs(src, dst), Slice: p.plan, Layers: kvlayout.Layers{Lo: at.lo, Hi: at.hi}, AuxSrc: -1, State: -1, Digest: true}
			}
		}
		if at.lo == 0 && h.counted <= at.chunk {
			// Each page of the room once: not again for another decode
			// rank or layer group.
			h.pages, h.counted = h.pages+len(in.Pages), at.chunk+1
		}
	} else {
		msg.Lo, msg.Hi = shift, at.layers+shift
	}
	if msg.Final && !req.Dummy {
		msg.Aux = in.AuxIndex
		for _, s := range in.State {
			msg.State = append(msg.State, slices.Clone(s))
		}
	}
	c.stats.PagesPublished++
	if in.Ready == nil {
		// Its decode rank reads now: an engine that moves reads only while
		// this rank's agent progresses keeps progressing meanwhile. (A
		// PAGES held back for its data: when it goes, PagesReady.)
		c.emit(Effect{Kind: EffectKeepProgress, Room: rm.id, Keep: c.cfg.Lease})
	}
	c.emit(Effect{Kind: EffectSend, Room: rm.id, To: wire.Peer{Endpoint: req.From.Endpoint}, Msg: msg, Ready: in.Ready, Digest: digest})
	return ""
}

// published notes a publish (a PAGES made, or a held-back one sent): this
// rank's own progress, from which the room's stall deadline runs; nothing
// a decode process sends moves it (a RENEW keeps a lease, not the room,
// alive).
func (c *prefillCore) published(h *pullHold) {
	h.published = c.now
	if rm, live := c.reg.rooms[h.room]; live {
		c.reg.progressed(rm, c.now)
	}
}

// onRenew extends a pull room's lease for the decode process that sent
// it (its REQUEST's epoch): the stamp is kept for the next PAGES to echo,
// and a published, live room's lease runs Lease from now. A RENEW is not
// progress: the room's stall deadline runs from its last publish, so a
// decode process that renews without reading holds the pages at most
// until then, plus the drain deadline and the quarantine (docs/PROTOCOL.md
// "RENEW").
func (c *prefillCore) onRenew(msg *wire.Renew) {
	key := msg.From.Peer()
	reqs, found := c.roomRequests(msg.Room), false
	for i, pr := range reqs {
		if pr.Peer == key && pr.Epoch == msg.From.Epoch && pr.Payload != nil && pr.Payload.Pull {
			reqs[i].At, found = max(pr.At, msg.At), true
		}
	}
	if !found {
		c.stats.PullRefused++
		return
	}
	rm := c.reg.rooms[msg.Room]
	h := c.pulls[msg.Room]
	if rm == nil || rm.status.Terminal() || h == nil {
		// Its stamp is kept (a late PAGES of the room still pairs), but a
		// RENEW extends nothing of a room that ended: refused, counted (a
		// decode rank that keeps renewing one is seen in
		// kvbridge_pull_messages_refused_total).
		c.stats.PullRefused++
		return
	}
	for _, pp := range h.peers {
		if pp.key == key && pp.epoch == msg.From.Epoch && pp.open {
			pp.leaseEnd = c.now.Add(c.cfg.Lease)
			c.stats.LeaseRenewals++
		}
	}
}

// onReadDone closes a decode process's reads of a pull room: the room's
// write in flight for it completes (a failure when the reads failed, or
// when they claim success before the room's last chunk was published;
// quiesced when drained), and the source pages are released once nothing
// can read them.
func (c *prefillCore) onReadDone(msg *wire.ReadDone) {
	h := c.pulls[msg.Room]
	var pp *pullPeer
	if h != nil {
		for _, x := range h.peers {
			if x.key == msg.From.Peer() && x.epoch == msg.From.Epoch && x.open {
				pp = x
			}
		}
	}
	if pp == nil {
		c.stats.PullRefused++ // never published to it, or already closed (a duplicate)
		return
	}
	pp.open, pp.closed, pp.drained = false, true, msg.Drained
	// Its reads are over: that decode process reuses the room's pages as
	// soon as its own room ended (it never waits for the other decode
	// ranks of the room), so they are no longer this room's — the mirror
	// of a push room's final write (finalPosted). A later REQUEST of it
	// naming them is another room's, not a conflict.
	for _, pr := range c.reg.Requests(msg.Room) {
		if pr.Peer == pp.key && pr.Epoch == pp.epoch {
			c.freeDests(msg.Room, []PeerRequest{pr})
		}
	}
	var err error
	switch rm, live := c.reg.rooms[msg.Room]; {
	case !msg.OK:
		err = fmt.Errorf("room %d: decode %s: reads failed: %s", msg.Room, pp.key, cmp.Or(msg.Reason, "no reason given"))
	case live && !rm.pre.done:
		err = fmt.Errorf("room %d: decode %s reported its reads done before the room's last chunk was published", msg.Room, pp.key)
	}
	if res := c.reg.leaseClosed(msg.Room, err, msg.Drained, c.now); err != nil && res.Outcome == Applied && res.Status == Failed {
		c.statusFailed(msg.Room, c.reg.Requests(msg.Room), CodeFailed, err.Error(), "")
	}
	c.maybeReleasePull(h)
}

// pullSettled: the registry settled a pull room (nothing in flight, or the
// drain deadline passed): its pages are released now if every decode
// process said its reads drained, else at the quarantine deadline past
// the latest lease.
func (c *prefillCore) pullSettled(room uint64) {
	h := c.pulls[room]
	if h == nil || !h.deadline.IsZero() {
		return
	}
	if c.maybeReleasePull(h) {
		return
	}
	end := c.now
	for _, pp := range h.peers {
		end = later(end, pp.leaseEnd)
	}
	h.deadline = end.Add(c.cfg.QuarantineTimeout)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// maybeReleasePull releases a pull room's source pages once it ended and
// every decode process it published to said its reads drained.
func (c *prefillCore) maybeReleasePull(h *pullHold) bool {
	if c.pulls[h.room] != h {
		return true // released already
	}
	if rm, live := c.reg.rooms[h.room]; live && !rm.status.Terminal() {
		return false
	}
	for _, pp := range h.peers {
		if pp.open || !pp.drained {
			return false
		}
	}
	c.releasePull(h, false)
	return true
}

func (c *prefillCore) releasePull(h *pullHold, forced bool) {
	delete(c.pulls, h.room)
	if forced {
		c.stats.ForcedReleases++
	}
	c.stats.SourceReleases++
	c.emit(Effect{Kind: EffectWake, Room: h.room, Wake: WakePull})
	c.emit(Effect{Kind: EffectReleased, Room: h.room, Forced: forced, Pages: h.pages, Held: c.now.Sub(h.first)})
}

// pullTick fails live pull rooms whose lease ended with reads open, and
// releases those past their quarantine deadline.
func (c *prefillCore) pullTick(now time.Time) {
	for _, room := range slices.Sorted(maps.Keys(c.pulls)) {
		h := c.pulls[room]
		if !h.deadline.IsZero() {
			if now.After(h.deadline) {
				c.releasePull(h, true)
			}
			continue
		}
		rm, live := c.reg.rooms[room]
		if !live || rm.status.Terminal() {
			continue
		}
		for _, pp := range h.peers {
			if pp.open && now.After(pp.leaseEnd) {
				c.stats.LeaseExpiries++
				reason := fmt.Sprintf("lease expired: decode %s (epoch %d) did not report its reads of room %d within the lease (%v)", pp.key, pp.epoch, room, c.cfg.Lease)
				if c.count(EventUpdate, c.reg.Update(room, Failed, reason)).Outcome == Applied {
					c.statusFailed(room, rm.requests, CodeLeaseExpired, reason, "")
				}
				break
			}
		}
	}
}

// PullHold says whether a prefill room still holds the pages it published
// for pull (false on a decode rank, and for a room that published nothing
// for pull): their release is an EffectWake of WakePull.
func (c *Core) PullHold(room uint64) bool {
	if c.prefillCore == nil {
		return false
	}
	_, ok := c.prefillCore.pulls[room]
	return ok
}

// PagesReady is a PAGES that was held back for its data (its EffectSend
// carried SendChunk.Ready) or for its digest's sums (Effect.Digest) and
// may go now (prefill): the core stamps it
// with the latest stamp heard from its decode process (its RENEWs went on
// meanwhile) and sends it; its going is this rank's progress, as a
// publish is (the stall deadline and the hold's bound run from it), and
// the agent keeps progressing for the lease.
type PagesReady struct {
	To  wire.Peer
	Msg *wire.Pages
}

func (PagesReady) input() {}

func (c *prefillCore) pagesReady(in PagesReady) {
	msg := *in.Msg
	for _, pr := range c.roomRequests(msg.Room) {
		if pr.Payload != nil && pr.Payload.Pull && pr.Payload.From.Endpoint == in.To.Endpoint {
			msg.At = pr.At
		}
	}
	if h := c.pulls[msg.Room]; h != nil {
		c.published(h)
	}
	c.emit(Effect{Kind: EffectKeepProgress, Room: msg.Room, Keep: c.cfg.Lease})
	c.emit(Effect{Kind: EffectSend, Room: msg.Room, To: in.To, Msg: &msg})
}

// PagesUnderLease counts the prefill pages published for pull and not yet
// released (prefill; the lease gauge).
func (c *Core) PagesUnderLease() int {
	if c.prefillCore == nil {
		return 0
	}
	n := 0
	for _, h := range c.prefillCore.pulls {
		n += h.pages
	}
	return n
}

// --- decode side ---

// maxAsked bounds the PAGES one source of a room may have read (chunks ×
// layer groups).
const maxAsked = 1 << 16

// maxStamps is how many of its last stamps a pull source remembers: a
// PAGES must echo one of them (renewals go every third of the lease, so
// these cover five leases).
const maxStamps = 16

// stamp is one stamp a decode rank sent a pull source: its value on the
// wire (the wall clock in ns, made to grow) and the local time it stands
// for, which keeps the clock's monotonic reading — the lease is measured
// on that, so a wall clock stepped back does not lengthen it.
type stamp struct {
	wire uint64
	at   time.Time
}

// stamp records and returns a new stamp sent at now.
func (s *source) stamp(now time.Time) uint64 {
	w := uint64(max(now.UnixNano(), 0))
	if s.nstamps > 0 {
		if last := s.stamps[(s.nstamps-1)%maxStamps].wire; w <= last {
			w = last + 1
		}
	}
	s.stamps[s.nstamps%maxStamps] = stamp{wire: w, at: now}
	s.nstamps++
	return w
}

// stampAt is the local time of one of the source's last stamps.
func (s *source) stampAt(w uint64) (time.Time, bool) {
	for i := range min(s.nstamps, maxStamps) {
		if s.stamps[i].wire == w {
			return s.stamps[i].at, true
		}
	}
	return time.Time{}, false
}

// renewEvery is a pull source's renewal interval: a third of its lease —
// the one its PAGES said, else the one its REGISTER_ACK offered (a
// prefill rank's lease may be shorter than this rank's), else this rank's.
func (c *decodeCore) renewEvery(s *source) time.Duration {
	if s.leaseMillis > 0 {
		return time.Duration(s.leaseMillis) * time.Millisecond / 3
	}
	if tg := c.targets[s.target]; tg != nil && tg.leaseMillis > 0 {
		return time.Duration(tg.leaseMillis) * time.Millisecond / 3
	}
	return c.cfg.Lease / 3
}

// resendReadDone answers a prefill rank whose lease of a room ended
// (STATUS lease_expired) with the room's READ_DONE again, when this rank's
// reads of it are over and it was sent once (it may have been lost): the
// prefill rank then releases the pages at once instead of at the
// quarantine. A room this rank has cleared, and whose pages it released,
// is not known any more: that lost READ_DONE costs the quarantine.
func (c *decodeCore) resendReadDone(msg *wire.Status) {
	var srcs []*source
	if rm, ok := c.reg.rooms[msg.Room]; ok && rm.dec != nil {
		srcs = rm.dec.sources
	} else if h, ok := c.holds[msg.Room]; ok {
		srcs = h.srcs
	}
	s, tg := c.sourceFrom(srcs, msg.From.Endpoint)
	if s == nil || !s.pull || !s.readDoneSent || s.reads > 0 || s.epoch != msg.From.Epoch {
		return
	}
	st, _ := c.reg.Status(msg.Room)
	c.sendReadDone(msg.Room, s, tg, st)
}

// onPages pairs a published chunk with the room's own pages and asks the
// shell to read it (EffectRead), or counts it at once when there is
// nothing to read. A PAGES must come from the process the REQUEST went to,
// for a live pull room, within the lease it echoes; a malformed one fails
// the room.
func (c *decodeCore) onPages(msg *wire.Pages) {
	rm, ok := c.reg.rooms[msg.Room]
	var s *source
	var tg *target
	if ok && rm.dec != nil {
		s, tg = c.sourceFrom(rm.dec.sources, msg.From.Endpoint)
	} else if h, held := c.holds[msg.Room]; held {
		// Cleared, its pages still held: its reads may be over, and the
		// prefill rank still publishes (the READ_DONE may have been lost).
		c.stats.PullRefused++
		if s, tg = c.sourceFrom(h.srcs, msg.From.Endpoint); s != nil && s.pull && s.readDoneSent && s.reads == 0 && s.epoch == msg.From.Epoch {
			c.sendReadDone(msg.Room, s, tg, Failed)
		}
		return
	}
	if s == nil || !s.sent || s.epoch != msg.From.Epoch || !rm.dec.spec.Pull {
		c.stats.PullRefused++
		return
	}
	if rm.status.Terminal() {
		// Its reads may be over: say so again (the first READ_DONE may
		// have been lost, and the prefill rank still publishes).
		c.stats.PullRefused++
		if s.readDoneSent && s.reads == 0 {
			c.sendReadDone(rm.id, s, tg, rm.status)
		}
		return
	}
	if s.readDoneSent {
		// Its reads are over and it was told so: it may have released
		// the pages (a duplicate, or a late copy of one already read).
		c.stats.PullRefused++
		return
	}
	fail := func(code, format string, a ...any) {
		c.stats.PullRefused++
		c.failWith(rm.id, code, fmt.Sprintf("room %d: PAGES from prefill %s: ", rm.id, msg.From.Peer())+fmt.Sprintf(format, a...))
	}
	if msg.Hi <= msg.Lo || msg.SpanHi <= msg.SpanLo {
		// (A notification's Hi 0 means an earlier revision's whole chunk;
		// a PAGES always names its layers.)
		fail(CodeFailed, "layers [%d, %d) of [%d, %d): an empty range", msg.Lo, msg.Hi, msg.SpanLo, msg.SpanHi)
		return
	}
	sentAt, ok := s.stampAt(msg.At)
	if !ok {
		fail(CodeFailed, "its lease counts from stamp %d, not one of the last %d this rank sent it (REQUEST, RENEW)", msg.At, maxStamps)
		return
	}
	lease := time.Duration(msg.LeaseMillis) * time.Millisecond
	until := sentAt.Add(lease - lease>>leaseMarginShift)
	if !c.now.Before(until) {
		fail(CodeLeaseExpired, "its lease (%v from this rank's send at %v) ended before it arrived", lease, sentAt)
		return
	}
	s.leaseMillis = msg.LeaseMillis
	spec := rm.dec.spec
	dummy := spec.Dummy || s.link.Dummy
	in := Notified{Room: rm.id, UID: s.uid, Chunk: msg.Chunk, Total: msg.Total, Lo: msg.Lo, Hi: msg.Hi, SpanLo: msg.SpanLo, SpanHi: msg.SpanHi}
	rd := &Read{Source: s.uid, Target: tg.t, Epoch: s.epoch, Final: msg.Final, Until: until}
	if !dummy {
		pm := s.link.Pages
		if pm.Src == 0 {
			pm = kvlayout.PageMap{Src: 1, Dst: 1}
		}
		src, dst, off, n, err := pm.Pair(msg.First, msg.Pages, spec.Prefix, spec.DstPages)
		if err != nil {
			fail(CodeFailed, "%v", err)
			return
		}
		in.Off, in.N = max(off, 0), n
		if spec.Digest && n > 0 {
			if len(msg.Digests) != n {
				fail(CodeCorrupt, "the room asked for a digest; %d sums for its %d positions (a prefill rank of an earlier revision sends none)", len(msg.Digests), n)
				return
			}
			in.Digests, in.LastUnits = slices.Clone(msg.Digests), msg.Units
		}
		if len(src) > 0 {
			rd.Writes = append(rd.Writes, kvlayout.Write{Runs: kvlayout.Runs(src, dst), Layers: kvlayout.Layers{Lo: msg.Lo - msg.SpanLo, Hi: msg.Hi - msg.SpanLo}, AuxSrc: -1, State: -1})
		}
	}
	if !s.valid(in) {
		fail(CodeFailed, "chunk %d of %d, layers [%d, %d) of [%d, %d) out of range or contradicting its earlier PAGES", msg.Chunk, msg.Total, msg.Lo, msg.Hi, msg.SpanLo, msg.SpanHi)
		return
	}
	ask := [3]int{msg.Chunk, msg.Lo, msg.Hi}
	if _, dup := s.asked[ask]; dup {
		c.stats.PullRefused++ // a duplicate: read once already, or being read
		return
	}
	if len(s.asked) >= maxAsked {
		fail(CodeFailed, "more than %d chunks and layer groups published", maxAsked)
		return
	}
	if s.asked == nil {
		s.asked = map[[3]int]struct{}{}
	}
	s.asked[ask] = struct{}{}
	if msg.Final && !dummy && s.link.Aux {
		for i, dst := range spec.StateIndices {
			if len(dst) == 0 {
				continue
			}
			if i >= len(msg.State) || len(msg.State[i]) != len(dst) {
				fail(CodeFailed, "state region %d: %d items published, the room wants %d", i, len(stateAt(msg.State, i)), len(dst))
				return
			}
			rd.Writes = append(rd.Writes, kvlayout.Write{Runs: kvlayout.Runs(msg.State[i], dst), AuxSrc: -1, State: i})
		}
		if spec.AuxIndex >= 0 && msg.Aux >= 0 {
			rd.Writes = append(rd.Writes, kvlayout.Write{AuxSrc: msg.Aux, AuxDst: spec.AuxIndex, State: -1})
		}
	}
	rd.Notif = in
	if rd.empty() {
		c.readLanded(rm.id, s, rd)
		return
	}
	if !c.readOffer(rd, tg.endpoint) {
		fail(CodeFailed, "prefill at %s (epoch %d) has no accepted pull offer here", tg.endpoint, s.epoch)
		return
	}
	if c.pullsOffers() && 2*(msg.Hi-msg.SpanLo) > len(rd.Layout.Regions) {
		// Layers its offer did not register: nothing to read there (the
		// span is the prefill rank's own word; its offer's regions are
		// what it proved).
		fail(CodeFailed, "layers [%d, %d) of [%d, %d): past the %d layers its pull offer registered", msg.Lo, msg.Hi, msg.SpanLo, msg.SpanHi, len(rd.Layout.Regions)/2)
		return
	}
	s.reads++
	c.emit(Effect{Kind: EffectRead, Room: rm.id, To: tg.peer(), Read: rd})
}

// readSource finds the source a read of room came from, in the live room
// or, once cleared, in its hold.
func (c *decodeCore) readSource(room uint64, rd *Read) *source {
	var srcs []*source
	if rm, ok := c.reg.rooms[room]; ok && rm.dec != nil {
		srcs = rm.dec.sources
	} else if h, ok := c.holds[room]; ok {
		srcs = h.srcs
	}
	for _, s := range srcs {
		if s.uid == rd.Source {
			return s // (its epoch may have changed since: readPosting and readDone check)
		}
	}
	return nil
}

// readPosting is the gate right before a pull read is posted: the room is
// live and the lease has not ended. A refused read is over, unposted.
func (c *decodeCore) readPosting(room uint64, rd *Read) bool {
	s := c.readSource(room, rd)
	if s == nil {
		return false
	}
	rm, live := c.reg.rooms[room]
	if live && !rm.status.Terminal() && c.now.Before(rd.Until) && s.sent && s.epoch == rd.Epoch && c.offerCurrent(rd) {
		return true
	}
	s.reads--
	c.stats.ReadsRefused++
	switch {
	case !live || rm.status.Terminal():
	case !s.sent || s.epoch != rd.Epoch:
		c.failWith(room, CodeFailed, fmt.Sprintf("room %d: a read from prefill %s (epoch %d), which the room no longer asks", room, s.target, rd.Epoch))
	case !c.offerCurrent(rd):
		c.failWith(room, CodeFailed, fmt.Sprintf("room %d: prefill %s's (epoch %d) pull offer was replaced before this read was posted", room, s.target, rd.Epoch))
	default:
		c.failWith(room, CodeLeaseExpired, fmt.Sprintf("room %d: the lease of prefill %s's pages ended (%v) before this rank could read them", room, s.target, rd.Until))
	}
	c.maybeReadDone(room, s)
	return false
}

// readDone counts a pull read's completion as the write's notification
// would have counted; a failed one fails the room (unsettled: it may still
// land, so its pages wait for the quarantine).
func (c *decodeCore) readDone(in ReadDone) {
	room, rd, err, quiesced := in.Room, in.Read, in.Err, in.Quiesced
	s := c.readSource(room, rd)
	if s == nil || s.reads == 0 {
		return
	}
	s.reads--
	if err == nil && (!s.sent || s.epoch != rd.Epoch) {
		// Read from a process this room no longer asks (it asked again,
		// elsewhere): what it brought is not counted.
		err, quiesced = fmt.Errorf("room %d: a read from prefill %s (epoch %d), which the room no longer asks", room, s.target, rd.Epoch), true
	}
	if rm, live := c.reg.rooms[room]; err == nil && in.Corrupt == "" && !in.Checked && rd.Notif.N > 0 && live && rm.dec != nil && rm.dec.spec.Digest && !rm.status.Terminal() {
		in.Corrupt = "its pages were not checked against their digest"
	}
	if err == nil && in.Corrupt != "" {
		// Its bytes are in (nothing more of the read can land), and not
		// the ones the prefill rank published.
		c.stats.DigestMismatches++
		if rm, live := c.reg.rooms[room]; live && !rm.status.Terminal() {
			c.failWith(room, CodeCorrupt, fmt.Sprintf("room %d: prefill rank %s (source %d), chunk %d: %s", room, c.sourcePeer(s), s.uid, rd.Notif.Chunk, in.Corrupt))
		}
		c.maybeReadDone(room, s)
		return
	}
	if err != nil {
		if !quiesced {
			s.unsettled++
		}
		if rm, live := c.reg.rooms[room]; live && !rm.status.Terminal() {
			code := CodeFailed
			if in.NotDelivered {
				code = CodeNotDelivered
			} else if in.LeaseEnded {
				code = CodeLeaseExpired
			}
			c.failWith(room, code, fmt.Sprintf("room %d: a read from prefill %s failed: %v", room, s.target, err))
		}
		c.maybeReadDone(room, s)
		return
	}
	rd.Notif.Checked = in.Checked
	c.readLanded(room, s, rd)
}

// readLanded counts what a read (or an empty PAGES) delivered, then sees
// whether the room succeeded and whether its reads from s are over.
func (c *decodeCore) readLanded(room uint64, s *source, rd *Read) {
	c.notification(c.now, rd.Notif)
	if rd.Final {
		c.notification(c.now, Notified{Room: room, UID: s.uid, Aux: true})
	}
	c.maybeSucceed(room)
	c.maybeReadDone(room, s)
}

// maybeReadDone tells a pull source that this process's reads of the room
// are over — every chunk read (ok), or the room ended — once none is in
// flight.
func (c *decodeCore) maybeReadDone(room uint64, s *source) {
	if !s.pull || !s.sent || s.readDoneSent || s.reads > 0 {
		return
	}
	st, live := c.reg.Status(room)
	if !s.complete() && live && !st.Terminal() {
		return
	}
	s.readDoneSent = true
	c.sendReadDone(room, s, c.targets[s.target], st)
}

func (c *decodeCore) sendReadDone(room uint64, s *source, tg *target, st Poll) {
	if tg == nil || !tg.resolved || tg.epoch != s.epoch {
		return // that process is gone: it cannot be told
	}
	m := &wire.ReadDone{Room: room, OK: s.complete(), Drained: s.unsettled == 0}
	if !m.OK {
		m.Reason = fmt.Sprintf("room %d ended %v before every chunk was read", room, st)
	}
	c.send(tg.peer(), room, m)
}

// pullTick renews the lease of every live pull room's sources not done
// reading, a third of the lease after the last stamp.
func (c *decodeCore) pullTick(now time.Time) {
	for _, room := range slices.Sorted(maps.Keys(c.holds)) {
		rm, live := c.reg.rooms[room]
		if !live || rm.dec == nil || rm.status.Terminal() || !rm.dec.spec.Pull {
			continue
		}
		for _, s := range rm.dec.sources {
			tg := c.targets[s.target]
			if !s.sent || (s.complete() && s.reads == 0) || tg == nil || tg.epoch != s.epoch || now.Before(s.lastStamp.Add(c.renewEvery(s))) {
				continue
			}
			s.lastStamp = now
			c.stats.LeaseRenewals++
			c.send(tg.peer(), room, &wire.Renew{Room: room, At: s.stamp(now)})
		}
	}
}
