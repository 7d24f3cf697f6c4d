package core

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// decodePeer is a registered decode rank, bound to the epoch of the
// process that registered. Heartbeats do not unbind it: only a REGISTER
// from a new epoch (or a restart report) does.
type decodePeer struct {
	from   wire.From
	remote string // nixl agent name
	layout kvlayout.Layout
	// mapped: the pair maps heads and layers (both have a Model); plan is
	// then what this rank writes into that one (nil: nothing, a dummy).
	mapped bool
	plan   *kvlayout.Slice
	// inUse: the destinations (pages, aux items, state items) that a room
	// of this registration may still write, each to that room — from the
	// REQUEST's acceptance until the registry settles it (no write in
	// flight and none that can still land) or the room's final write to
	// this rank is posted (finalPosted). Bounded by the registered items;
	// it goes with the registration.
	inUse map[dest]uint64
	// md, lay: the hashes of the registration's agent metadata and regions
	// (registrationHash): a process's do not change, and a repeat of them
	// is not proven again (PeerPlan.Repeat).
	md, lay [32]byte
	// pull: its REGISTER asked for this rank's offer.
	pull bool
	// taken: the highest REQUEST number (wire.Request.N) of this process
	// read before Close (a closing rank's notice says it: every REQUEST
	// numbered above was refused or never read).
	taken uint64
}

// registrationHash hashes a REGISTER's agent metadata and its regions.
func registrationHash(msg *wire.Register) (md, lay [32]byte) {
	md = sha256.Sum256(msg.AgentMD)
	h := sha256.New()
	hashRegions(h, msg.KV, msg.Aux, msg.State)
	copy(lay[:], h.Sum(nil))
	return md, lay
}

// hashRegions writes a REGISTER's or an offer's region lists to h.
func hashRegions(h io.Writer, lists ...[]wire.Region) {
	for _, list := range lists {
		fmt.Fprintf(h, "%d;", len(list))
		for _, r := range list {
			fmt.Fprintf(h, "%d,%d,%d,%d,%s;", r.Addr, r.Len, r.ItemLen, r.Dev, r.Mem)
		}
	}
}

// changedRegistration explains why a REGISTER may not replace the
// registration its process holds here ("" if it may): a process's agent
// metadata and regions do not change, so other ones under the same epoch
// are not its own (not_owner).
func (c *prefillCore) changedRegistration(from wire.From, md, lay [32]byte) string {
	p := c.peers[from.Peer()]
	if p == nil || p.from.Epoch != from.Epoch || (p.md == md && p.lay == lay) {
		return ""
	}
	return fmt.Sprintf("memory not proven the registering process's (not_owner): %s (epoch %d) registered here with other agent metadata or regions: a process's do not change", from.Peer(), from.Epoch)
}

// dest is one destination item of a decode rank's memory: a KV page, an
// aux item, or an item of a state region.
type dest uint64

const destAux = 1 << 32 // aux items; state region i's items from (2+i) << 32

func pageDest(pg uint32) dest              { return dest(pg) }
func auxDest(i int) dest                   { return destAux | dest(uint32(i)) }
func stateDest(region int, it uint32) dest { return dest(2+region)<<32 | dest(it) }

func (d dest) String() string {
	switch k, i := d>>32, uint32(d); k {
	case 0:
		return fmt.Sprintf("page %d", i)
	case 1:
		return fmt.Sprintf("aux item %d", i)
	default:
		return fmt.Sprintf("item %d of state region %d", i, k-2)
	}
}

// dests calls f with every destination a REQUEST names, until f returns
// false.
func dests(req *wire.Request, f func(d dest) bool) {
	eachDest(req.DstPages, req.AuxIndex, req.StateIndices, f)
}

// eachDest calls f with each of pages, the aux item (none when aux < 0)
// and the items of each state region, until f returns false.
func eachDest(pages []uint32, aux int, state [][]uint32, f func(d dest) bool) {
	for _, pg := range pages {
		if !f(pageDest(pg)) {
			return
		}
	}
	if aux >= 0 && !f(auxDest(aux)) {
		return
	}
	for r, list := range state {
		for _, it := range list {
			if !f(stateDest(r, it)) {
				return
			}
		}
	}
}

// field is where a REQUEST names d (for a refusal's reason).
func field(req *wire.Request, d dest) string {
	switch k, i := d>>32, uint32(d); k {
	case 0:
		return fmt.Sprintf("dst_pages[%d]", slices.Index(req.DstPages, i))
	case 1:
		return "aux_index"
	default:
		return fmt.Sprintf("state_indices[%d][%d]", k-2, slices.Index(req.StateIndices[k-2], i))
	}
}

// LayoutRefusal is why a REGISTER or REQUEST naming memory that cannot be
// right was refused (CoreStats.LayoutRefused,
// kvbridge_layout_refused_total{reason}).
type LayoutRefusal uint8

const (
	// RefusedOverlap: two regions of a REGISTER share memory.
	RefusedOverlap LayoutRefusal = iota
	// RefusedRepeat: a REQUEST names a destination page, or an item of one
	// state region, twice.
	RefusedRepeat
	// RefusedInUse: a REQUEST names a destination that another room of
	// the same decode process may still write.
	RefusedInUse
	// RefusedNotOwner: a REGISTER whose memory is not proven the
	// registering process's (its proof slots do not hold its proof, or its
	// agent name is another decode rank's).
	RefusedNotOwner
	// LayoutRefusals is one past the last refusal.
	LayoutRefusals
)

func (r LayoutRefusal) String() string {
	return [LayoutRefusals]string{"overlapping_regions", "repeated_page", "page_in_use", "not_owner"}[r]
}

// agentOwner returns the decode rank (peer key, no epoch) registered with
// the agent name, or "".
func (c *prefillCore) agentOwner(name string) string {
	for _, key := range slices.Sorted(maps.Keys(c.peers)) {
		if c.peers[key].remote == name {
			return key
		}
	}
	return ""
}

// PeerPlan is what CheckRegister found of a decode rank: its memory, and
// with a Model the slice this rank writes into it.
type PeerPlan struct {
	Layout kvlayout.Layout
	Mapped bool
	Plan   *kvlayout.Slice
	// Pull: the decode rank asked to read its rooms (its REGISTER's pull);
	// the REGISTER_ACK then offers this rank's memory if it serves pull.
	Pull bool
	// Repeat: the REGISTER repeats its process's registration here (the
	// same agent metadata and regions, proven when it was bound): the shell
	// need not read its proof again while the remote it loaded is usable.
	Repeat bool
	// md, lay: the REGISTER's hashes (registrationHash), kept with the
	// registration Registered binds.
	md, lay [32]byte
}

// prefillRoom is a prefill room's send cursor.
type prefillRoom struct {
	sent    int // pages handed to SendChunk so far
	chunk   int
	posts   int  // EffectPosts emitted for the room (Effect.Seq)
	done    bool // the room's last chunk was sent, every range of it
	started time.Time
	// open is the chunk whose layers are being sent (nil between chunks).
	open *openChunk
	// early: the chunks handed over before the room was WaitingForInput
	// (after InitSender, before every REQUEST came), in order, checked
	// for their place in the room; they are planned and posted in the
	// step that makes the room WaitingForInput (handOver).
	early []earlyChunk
}

// earlyChunk is a chunk handed over before the room's REQUESTs: the
// caller's SendChunk (its slices copied) and its place in the room.
type earlyChunk struct {
	in SendChunk
	at chunkAt
}

// MaxEarlyChunks bounds the chunks (or layer ranges) a room holds handed
// over before every REQUEST came; another is refused ErrNotReady.
const MaxEarlyChunks = 1024

// openChunk is a chunk sent layer by layer: what its next range must
// repeat, and the layers sent so far.
type openChunk struct {
	pages    []uint32
	last     bool
	auxIndex int
	next     int
}

func (c *prefillCore) statusFailed(room uint64, peers []PeerRequest, code, reason, skip string) {
	var told []PeerRequest
	for _, pr := range peers {
		if pr.Peer != skip && pr.Payload != nil {
			c.statusTo(wire.Peer{Endpoint: pr.Payload.From.Endpoint}, room, code, reason)
			told = append(told, pr)
		}
	}
	if rm, ok := c.reg.rooms[room]; ok && len(told) > 0 && rm.status == Failed && rm.drained() {
		// Nothing of the room can land: its drained ACK goes with the
		// STATUS, unasked. The decode rank's ABORT, a round trip later,
		// may find this process gone (killed, or closed and exited), and
		// the pages would wait out the quarantine.
		c.reg.sendAcks(room, ackPeers(nil, told), true)
	}
}

func (c *prefillCore) statusTo(to wire.Peer, room uint64, code, reason string) {
	c.stats.StatusSent++
	c.send(to, room, &wire.Status{Room: room, Status: wire.StatusFailed, Code: code, Reason: reason})
}

// LayoutFrom turns REGISTER regions into a peer layout.
func LayoutFrom(kv, aux, state []wire.Region) (kvlayout.Layout, error) {
	l := kvlayout.Layout{Kind: mem.DRAM}
	for i, r := range kv {
		if r.Mem == wire.MemVRAM {
			l.Kind = mem.VRAM
		}
		if i == 0 {
			l.PageBytes = r.ItemLen
		}
		l.Regions = append(l.Regions, mem.Desc{Addr: uintptr(r.Addr), Len: r.Len, Dev: uint64(r.Dev)})
	}
	if len(aux) > 0 {
		l.Aux = mem.Desc{Addr: uintptr(aux[0].Addr), Len: aux[0].Len, Dev: uint64(aux[0].Dev)}
		l.AuxItemBytes = aux[0].ItemLen
	}
	for _, r := range state {
		l.State = append(l.State, kvlayout.StateRegion{Desc: mem.Desc{Addr: uintptr(r.Addr), Len: r.Len, Dev: uint64(r.Dev)}, ItemBytes: r.ItemLen})
	}
	return l, kvlayout.ValidateLayout(l)
}

// overlap names two regions of a REGISTER that share memory (the same
// memory kind, for VRAM the same device, and intersecting address
// ranges), "" when none do: the prefill rank would write one room's data
// over another's, or over its aux and state items.
func overlap(msg *wire.Register) string {
	type named struct {
		list string
		i    int
	}
	var spans []kvlayout.Span
	var names []named
	for _, l := range []struct {
		name    string
		regions []wire.Region
	}{{"kv", msg.KV}, {"aux", msg.Aux}, {"state", msg.State}} {
		for i, r := range l.regions {
			kind := mem.DRAM
			if r.Mem == wire.MemVRAM {
				kind = mem.VRAM
			}
			spans = append(spans, kvlayout.Span{Kind: kind, Dev: uint64(r.Dev), Addr: r.Addr, Len: r.Len})
			names = append(names, named{l.name, i})
		}
	}
	i, j, ok := kvlayout.Overlap(spans)
	if !ok {
		return ""
	}
	at := func(k int) string {
		r := spans[k]
		where := "DRAM"
		if r.Kind == mem.VRAM {
			where = fmt.Sprintf("VRAM of device %d", r.Dev)
		}
		return fmt.Sprintf("%s[%d] [%#x, %#x) in %s", names[k].list, names[k].i, r.Addr, r.End(), where)
	}
	return fmt.Sprintf("overlapping regions from %s: %s and %s share memory", msg.From.Peer(), at(i), at(j))
}

// CheckRegister validates a REGISTER against this rank (compat, role and
// layout) without touching any state but the counters. The shell loads the
// agent metadata only after it passes, then steps Registered (or
// RegisterRefused).
func (c *prefillCore) checkRegister(msg *wire.Register) (PeerPlan, error) {
	pp, err := c.checkLayout(msg)
	if err == nil {
		pp.md, pp.lay = registrationHash(msg)
	}
	return pp, err
}

// checkLayout is checkRegister's check of compat, layout and topology.
func (c *prefillCore) checkLayout(msg *wire.Register) (PeerPlan, error) {
	if msg.Compat != c.cfg.Compat {
		return PeerPlan{}, fmt.Errorf("compat mismatch: prefill %q, decode %q", c.cfg.Compat, msg.Compat)
	}
	if reason := overlap(msg); reason != "" {
		c.stats.LayoutRefused[RefusedOverlap]++
		return PeerPlan{}, errors.New(reason)
	}
	lay, err := LayoutFrom(msg.KV, msg.Aux, msg.State)
	if err != nil {
		return PeerPlan{}, fmt.Errorf("layout: %w", err)
	}
	local := c.cfg.Layout
	stateOK := len(lay.State) == len(local.State)
	for i := 0; stateOK && i < len(lay.State); i++ {
		stateOK = lay.State[i].ItemBytes == local.State[i].ItemBytes
	}
	if !stateOK {
		return PeerPlan{}, fmt.Errorf("state layout mismatch: prefill %d state regions, decode %d (or item sizes differ)", len(local.State), len(lay.State))
	}
	if lay.AuxItemBytes != local.AuxItemBytes {
		return PeerPlan{}, fmt.Errorf("aux items of %d bytes at prefill, %d at decode", local.AuxItemBytes, lay.AuxItemBytes)
	}
	if kvlayout.NoModel(c.cfg.Model) {
		if msg.Topo != nil {
			return PeerPlan{}, fmt.Errorf("decode %s maps ranks (it sent its topology) but this prefill rank has no Model: set it on both", msg.From.Peer())
		}
		if len(lay.Regions) != len(local.Regions) || lay.PageBytes != local.PageBytes {
			return PeerPlan{}, fmt.Errorf("layout mismatch: prefill %d regions × %d-byte pages (aux %d), decode %d × %d (aux %d)",
				len(local.Regions), local.PageBytes, local.AuxItemBytes, len(lay.Regions), lay.PageBytes, lay.AuxItemBytes)
		}
		return PeerPlan{Layout: lay}, nil
	}
	t := msg.Topo
	if t == nil {
		return PeerPlan{}, fmt.Errorf("decode %s sent no topology but this prefill rank maps heads and layers (Model set): set Model on both", msg.From.Peer())
	}
	pl, err := kvlayout.ParsePageLayout(t.PageLayout)
	if err != nil {
		return PeerPlan{}, err
	}
	dm := kvlayout.Model{Layers: t.Layers, KVHeads: t.KVHeads, HeadBytes: t.HeadBytes, PageTokens: t.PageTokens, MLA: t.MLA, Layout: pl}
	if kvlayout.WithPages(dm, c.cfg.Model.PageTokens) != c.cfg.Model {
		return PeerPlan{}, fmt.Errorf("model mismatch: prefill %+v, decode %+v", c.cfg.Model, dm)
	}
	if err := kvlayout.PageRatio(c.cfg.Model.PageTokens, dm.PageTokens); err != nil {
		return PeerPlan{}, fmt.Errorf("decode %s: %w", msg.From.Peer(), err)
	}
	if own := c.cfg.Parallel.Norm(); t.PeerTPSize != 0 && (t.PeerTPSize != own.TPSize || t.PeerPPSize != own.PPSize) {
		return PeerPlan{}, fmt.Errorf("decode %s mapped itself onto a prefill instance of TP %d × PP %d, this one is TP %d × PP %d: its view of the instance is stale",
			msg.From.Peer(), t.PeerTPSize, t.PeerPPSize, own.TPSize, own.PPSize)
	}
	dp := kvlayout.Parallel{TPSize: msg.TPSize, TPRank: msg.TPRank, PPSize: t.PPSize, PPRank: t.PPRank, DPSize: t.DPSize, DPRank: t.DPRank}
	plan, err := kvlayout.Plan(c.cfg.Model, dm, c.cfg.Parallel, dp)
	if err != nil {
		return PeerPlan{}, fmt.Errorf("prefill %v → decode %v: %w", c.cfg.Parallel.Norm(), dp.Norm(), err)
	}
	if err := kvlayout.CheckLayouts(c.cfg.Model, c.cfg.Parallel, local, dm, dp, lay); err != nil {
		return PeerPlan{}, err
	}
	return PeerPlan{Layout: lay, Mapped: true, Plan: plan}, nil
}

// refuseRegister answers a REGISTER with ok false.
func (c *prefillCore) registerRefused(now time.Time, from wire.From, reason string) {
	if !c.hear(from) {
		return // a late REGISTER of an epoch the peer already left
	}
	c.send(wire.Peer{Endpoint: from.Endpoint}, 0, &wire.RegisterAck{OK: false, Reason: reason})
}

// droppedClosed drops, counted, a REGISTER reaching a closed rank: at its
// arrival, or at the end of a load or proof read under way at Close
// (succeeded, or failed: Close cancels the read, no fault of the peer's).
// A closed rank binds no one (no room of its will use the registration),
// loads or challenges nothing and answers nothing: the sender's retries
// and lookups find the rank's next process (a refusal would fail its
// waiting rooms as incompatible).
func (c *prefillCore) droppedClosed() bool {
	if c.reg.closed == "" {
		return false
	}
	c.stats.ClosedRegisters++
	return true
}

// checkToLoad validates a REGISTER whose epoch check passed: refused at
// once (REGISTER_ACK ok false) when CheckRegister finds it wrong, else the
// shell is asked to load the peer's metadata (EffectLoadMetadata). It
// reports whether the load was asked for.
func (c *prefillCore) checkToLoad(now time.Time, msg *wire.Register) bool {
	if c.droppedClosed() {
		return false
	}
	pp, err := c.checkRegister(msg)
	if err != nil {
		c.registerRefused(now, msg.From, err.Error())
		return false
	}
	pp.Pull = msg.Pull
	if reason := c.changedRegistration(msg.From, pp.md, pp.lay); reason != "" {
		c.stats.LayoutRefused[RefusedNotOwner]++
		c.registerRefused(now, msg.From, reason)
		return false
	}
	if p := c.peers[msg.From.Peer()]; p != nil && p.from.Epoch == msg.From.Epoch {
		pp.Repeat = true
	}
	if !c.admit(now, msg) {
		return false // its agent challenged: the sender's next REGISTER echoes it
	}
	c.emit(Effect{Kind: EffectLoadMetadata, To: wire.Peer{Endpoint: msg.From.Endpoint}, Msg: msg, Plan: &pp})
	return true
}

// registered binds a decode rank's registration to its epoch and
// acknowledges it. A new epoch of a known rank means that rank restarted:
// every room and pending request bound to the old epoch fails first.
func (c *prefillCore) registered(now time.Time, from wire.From, remote string, pp PeerPlan) {
	if !c.hear(from) {
		return // a late REGISTER of an epoch the peer already left
	}
	if c.droppedClosed() { // loaded while the rank closed
		return
	}
	if !c.passedChallenge(from) {
		// Nothing is bound to a blob whose agent was not shown the
		// sender's (a challenge voided meanwhile by a newer REGISTER).
		c.stats.LayoutRefused[RefusedNotOwner]++
		c.registerRefused(now, from, fmt.Sprintf("memory not proven the registering process's (not_owner): %s (epoch %d) has not echoed its agent challenge", from.Peer(), from.Epoch))
		return
	}
	if reason := c.changedRegistration(from, pp.md, pp.lay); reason != "" {
		// Another REGISTER of the process, with other metadata or
		// regions, was bound while this one was being loaded.
		c.stats.LayoutRefused[RefusedNotOwner]++
		c.registerRefused(now, from, reason)
		return
	}
	key := from.Peer()
	if old := c.peers[key]; old != nil && old.from.Epoch != from.Epoch {
		c.peerGone(key, old.from.Epoch, true, CodePeerRestarted, fmt.Sprintf("peer restarted: %s (epoch %d → %d)", key, old.from.Epoch, from.Epoch))
	}
	np := &decodePeer{from: from, remote: remote, layout: pp.Layout, mapped: pp.Mapped, plan: pp.Plan, inUse: map[dest]uint64{}, md: pp.md, lay: pp.lay}
	if old := c.peers[key]; old != nil && old.from.Epoch == from.Epoch {
		np.inUse = old.inUse // a repeated REGISTER of the same process: its rooms keep their pages
		np.taken = old.taken // and the REQUESTs it read stay read
	}
	np.pull = pp.Pull
	c.peers[key] = np
	c.ackRegister(np)
}

// ackRegister sends a bound registration its REGISTER_ACK: with this
// rank's offer if it asked for one and this rank serves pull, and the echo
// of the offer challenge its rank sent here, if any.
func (c *prefillCore) ackRegister(p *decodePeer) {
	ack := &wire.RegisterAck{OK: true}
	if p.pull && c.servesPull() {
		ack.Pull = c.cfg.Offer
		if ack.Pull == nil {
			ack.Pull = &wire.PullOffer{}
		}
		if e, ok := c.echoes[EndpointTag(p.from.Peer())]; ok {
			ack.Echo = slices.Clone(e.nonce[:])
		}
	}
	if ack.Pull != nil && c.cfg.OfferProgress > 0 {
		// The decode rank challenges the offer's agent (a notification
		// this agent receives), then reads the offer's proof slots back.
		c.emit(Effect{Kind: EffectKeepProgress, Keep: c.cfg.OfferProgress})
	}
	c.send(wire.Peer{Endpoint: p.from.Endpoint}, 0, ack)
}

// peerGone fails every live room and drops every pending request that a
// decode rank shares with this rank (only those bound to epoch when
// exact): a pending room becomes an AbortedEarly tombstone, so its sender
// starts Failed and nothing is ever written for it.
//
// A peer declared dead is told too (code peer_unreachable): heartbeats
// cannot tell a dead process from a paused one, and a paused decode rank
// that resumes must learn that its rooms failed here rather than wait for
// their deadlines. A restarted peer is not: its new process holds none of
// the old one's rooms.
func (c *prefillCore) peerGone(key string, epoch uint64, exact bool, code, reason string) {
	skip := key
	if code == CodePeerUnreachable {
		skip = ""
	}
	match := func(reqs []PeerRequest) bool {
		for _, pr := range reqs {
			if pr.Peer == key && (!exact || pr.Epoch == epoch) {
				return true
			}
		}
		return false
	}
	for _, id := range slices.Sorted(maps.Keys(c.reg.rooms)) {
		if rm := c.reg.rooms[id]; rm.role == RolePrefill && !rm.status.Terminal() && match(rm.requests) {
			res := c.count(EventUpdate, c.reg.Update(id, Failed, reason))
			if res.Outcome == Applied {
				c.statusFailed(id, rm.requests, code, reason, skip)
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(c.reg.pending)) {
		if p := c.reg.pending[id]; match(p.requests) {
			res := c.count(EventAbort, c.reg.Abort(id, reason, nil))
			c.statusFailed(id, res.Peers, code, reason, skip)
		}
	}
}

// onRequest handles a decode rank's REQUEST: it must come from the epoch
// that registered, name only registered pages, and find the room neither
// aborted nor cleared; otherwise it gets STATUS failed with a code. It
// reports whether the request was accepted.
func (c *prefillCore) onRequest(msg *wire.Request) bool {
	to := wire.Peer{Endpoint: msg.From.Endpoint}
	key := msg.From.Peer()
	p, ok := c.peers[key]
	if !ok || p.from.Epoch != msg.From.Epoch {
		if ok {
			c.stats.StaleEpoch++
		}
		c.statusTo(to, msg.Room, CodeNotRegistered, fmt.Sprintf("room %d: %s (epoch %d) has not registered (send REGISTER first)", msg.Room, key, msg.From.Epoch))
		return false
	}
	// Read: whatever its outcome, a closing notice names it taken (one
	// read after Close is refused: nothing of it is written either way).
	p.taken = max(p.taken, msg.N)
	if reason := c.foreign(msg.From, msg.Room); reason != "" {
		c.stats.ForeignRefused++
		c.statusTo(to, msg.Room, CodeRejected, reason)
		return false
	}
	if reason := checkRequest(msg, p); reason != "" {
		c.statusTo(to, msg.Room, CodeOutOfRange, reason)
		return false
	}
	if reason := c.pullMode(msg); reason != "" {
		c.stats.PullRefused++
		c.statusTo(to, msg.Room, CodeRejected, reason)
		return false
	}
	if reason := repeated(msg, key); reason != "" {
		c.stats.LayoutRefused[RefusedRepeat]++
		c.statusTo(to, msg.Room, CodeRejected, reason)
		return false
	}
	if reason := p.held(msg, func(room uint64) bool { return c.reg.Live(room) }); reason != "" {
		c.stats.LayoutRefused[RefusedInUse]++
		c.statusTo(to, msg.Room, CodeRejected, reason)
		return false
	}
	res := c.count(EventRequest, c.reg.Request(msg.Room, PeerRequest{Peer: key, Epoch: msg.From.Epoch, Required: msg.Required, Payload: msg, At: msg.At}))
	if res.Outcome == Rejected {
		c.statusTo(to, msg.Room, errCode(res.Err), res.Err.Error())
		return false
	}
	p.claim(msg)
	c.watch(msg.Room, to)
	c.handOver(msg.Room) // the last REQUEST: chunks handed over before it go now
	return true
}

// closedNotices tells every bound decode rank that this rank closed
// (STATUS closed, room 0), with the highest REQUEST number it took from
// that process: a REQUEST numbered above it was refused after Close or
// never read, so nothing of it will be written and its room's pages are
// the decode rank's again at once, and no REQUEST goes here any more.
// Sent last in Close, after every STATUS and ABORT_ACK of its rooms.
func (c *prefillCore) closedNotices(reason string) {
	for _, key := range slices.Sorted(maps.Keys(c.peers)) {
		p := c.peers[key]
		c.stats.ClosedNotices++
		c.send(wire.Peer{Endpoint: p.from.Endpoint}, 0, &wire.Status{Status: wire.StatusFailed, Code: CodeClosed, Taken: p.taken,
			Reason: fmt.Sprintf("prefill rank closed: %s (it took %s's REQUESTs up to number %d)", reason, key, p.taken)})
	}
}

// foreign explains why a REQUEST or ABORT from `from` may not touch room
// ("" if it may): the room holds REQUESTs of another decode instance,
// which asked for it first. A room belongs to the instance whose REQUEST
// created it (live or pending) until it is cleared; its id alone, which
// travels on the control wire, gives no other instance a say in it.
func (c *prefillCore) foreign(from wire.From, room uint64) string {
	for _, pr := range c.roomRequests(room) {
		if pr.Payload != nil && pr.Payload.From.Instance != from.Instance {
			return fmt.Sprintf("room %d: decode instance %q asked for it first; %s is of instance %q (a room is one decode instance's)",
				room, pr.Payload.From.Instance, from.Peer(), from.Instance)
		}
	}
	return ""
}

// repeated names a destination page, or an item of one state region, that
// a REQUEST names twice ("" if none): two positions of the room would be
// written into the same memory. A dummy REQUEST is held to it too: it
// carries the room's pages for the other prefill ranks.
func repeated(msg *wire.Request, peer string) string {
	if i, j, ok := firstRepeat(msg.DstPages); ok {
		return fmt.Sprintf("room %d: dst_pages[%d] and dst_pages[%d] of %s both name page %d", msg.Room, i, j, peer, msg.DstPages[i])
	}
	for r, list := range msg.StateIndices {
		if i, j, ok := firstRepeat(list); ok {
			return fmt.Sprintf("room %d: state_indices[%d][%d] and [%d][%d] of %s both name item %d", msg.Room, r, i, r, j, peer, list[i])
		}
	}
	return ""
}

// firstRepeat returns two positions i < j of list holding the same value;
// ok false when its values are distinct. O(n log n), on a copy.
func firstRepeat(list []uint32) (i, j int, ok bool) {
	if len(list) < 2 {
		return 0, 0, false
	}
	sorted := slices.Clone(list)
	slices.Sort(sorted)
	for k := 1; k < len(sorted); k++ {
		if v := sorted[k]; v == sorted[k-1] {
			i = slices.Index(list, v)
			return i, i + 1 + slices.Index(list[i+1:], v), true
		}
	}
	return 0, 0, false
}

// held names a destination of a REQUEST that another room of the same
// decode process may still write ("" if none). A dummy REQUEST names
// nothing this rank writes, and prefix pages are not in dst_pages. The
// room's own earlier REQUEST (a duplicate) is the registry's to refuse.
//
// Only a live holder refuses (pending, or live and not terminal): a room
// that ended may still have a write in flight, but its decode rank failed
// it and reuses its pages once its quarantine expires, as the protocol
// allows (the exposure the quarantine bounds) — the chaos soak's paused
// prefill rank met its decode rank's reused pages that way. The new room
// then holds the destination (claim).
func (p *decodePeer) held(msg *wire.Request, live func(room uint64) bool) string {
	if msg.Dummy {
		return ""
	}
	reason := ""
	dests(msg, func(d dest) bool {
		if other, ok := p.inUse[d]; ok && other != msg.Room && live(other) {
			reason = fmt.Sprintf("room %d: %s (%s) is in use by room %d of %s (epoch %d), which is live and may still write it",
				msg.Room, d, field(msg, d), other, p.from.Peer(), p.from.Epoch)
			return false
		}
		return true
	})
	return reason
}

// claim marks an accepted REQUEST's destinations in use by its room.
func (p *decodePeer) claim(msg *wire.Request) {
	if msg.Dummy {
		return
	}
	dests(msg, func(d dest) bool {
		p.inUse[d] = msg.Room // a held destination here is an ended room's (held)
		return true
	})
}

// settled frees the destinations of a room's requests once the registry
// says nothing of the room can be written any more (it ended with no write
// in flight or able to land, or its pending requests were dropped). Only
// the registration of the epoch that sent a request holds its pages.
func (c *prefillCore) settled(room uint64, reqs []PeerRequest) {
	c.pullSettled(room)
	c.freeDests(room, reqs)
}

// freeDests frees what reqs' rooms hold of their decode ranks' pages.
func (c *prefillCore) freeDests(room uint64, reqs []PeerRequest) {
	for _, pr := range reqs {
		p := c.peers[pr.Peer]
		if p == nil || p.from.Epoch != pr.Epoch || pr.Payload == nil || pr.Payload.Dummy {
			continue
		}
		dests(pr.Payload, func(d dest) bool {
			if p.inUse[d] == room {
				delete(p.inUse, d)
			}
			return true
		})
	}
}

// MaxRequired bounds REQUEST.required: how many decode ranks one room may
// wait for (a TP group, times DP).
const MaxRequired = 1024

func checkRequest(msg *wire.Request, p *decodePeer) string {
	key := p.from.Peer()
	pages := uint32(kvlayout.Pages(p.layout))
	if msg.Required > MaxRequired {
		return fmt.Sprintf("room %d: required %d exceeds %d", msg.Room, msg.Required, MaxRequired)
	}
	if msg.Prefix > int(pages) {
		return fmt.Sprintf("room %d: prefix %d exceeds the %d pages %s registered", msg.Room, msg.Prefix, pages, key)
	}
	for i, pg := range msg.DstPages {
		if pg >= pages {
			return fmt.Sprintf("room %d: dst_pages[%d]=%d outside the %d pages %s registered", msg.Room, i, pg, pages, key)
		}
	}
	if msg.AuxIndex >= kvlayout.AuxItems(p.layout) {
		return fmt.Sprintf("room %d: aux_index %d outside the %d aux items %s registered", msg.Room, msg.AuxIndex, kvlayout.AuxItems(p.layout), key)
	}
	if len(msg.StateIndices) > len(p.layout.State) {
		return fmt.Sprintf("room %d: %d state index lists for %d state regions", msg.Room, len(msg.StateIndices), len(p.layout.State))
	}
	for i, list := range msg.StateIndices {
		for _, it := range list {
			if int(it) >= kvlayout.Items(p.layout.State[i]) {
				return fmt.Sprintf("room %d: state_indices[%d] item %d outside the %d items %s registered", msg.Room, i, it, kvlayout.Items(p.layout.State[i]), key)
			}
		}
	}
	return ""
}

// onAbort handles a decode rank's ABORT: the ABORT_ACK is owed first, then
// the abort applies (tombstoning a room that has no sender yet); the ACK
// goes out once no write of the room can land, whether the room is live or
// already cleared.
func (c *prefillCore) onAbort(msg *wire.Abort) {
	ack := wire.Peer{Endpoint: msg.From.Endpoint}
	if c.foreign(msg.From, msg.Room) != "" {
		// Not its room: nothing of the sender's can be written under this
		// id (none of its REQUESTs is the room's), which is what a drained
		// ABORT_ACK says; the room is left as it is.
		c.stats.ForeignRefused++
		c.send(ack, msg.Room, &wire.AbortAck{Room: msg.Room, Drained: true})
		return
	}
	reason := msg.Reason
	if msg.Code != "" {
		reason = msg.Code + ": " + reason
	}
	res := c.count(EventAbort, c.reg.Apply(Event{Kind: EventAbort, Room: msg.Room, Reason: fmt.Sprintf("%s by %s", reason, msg.From.Peer()), Ack: &ack, By: msg.From.Peer()}))
	switch res.Outcome {
	case Applied:
		c.statusFailed(msg.Room, c.reg.Requests(msg.Room), CodeAborted, "aborted by "+msg.From.Peer(), msg.From.Peer())
	case Tombstoned:
		c.statusFailed(msg.Room, res.Peers, CodeAborted, "room aborted before its sender existed", msg.From.Peer())
	}
}

// createSender creates the prefill side of a room.
func (c *prefillCore) createSender(now time.Time, room uint64) Result {
	res := c.count(EventCreate, c.reg.Create(room, RolePrefill))
	if res.Outcome == Applied {
		c.reg.rooms[room].pre.started = now
	}
	return res
}

// initSender marks the sender initialised.
func (c *prefillCore) initSender(now time.Time, room uint64) Result {
	return c.count(EventInit, c.reg.Init(room))
}

// abortSender fails a prefill room from this side and tells its decode
// ranks.
func (c *prefillCore) abortSender(now time.Time, room uint64, reason string) Result {
	res := c.count(EventAbort, c.reg.Abort(room, reason, nil))
	if res.Outcome == Applied {
		c.statusFailed(room, c.reg.Requests(room), CodeAborted, "aborted by prefill: "+reason, "")
	}
	return res
}

// clearSender forgets a prefill room; decode ranks of an unfinished room
// are told. Writes still in flight keep counting in its tombstone.
func (c *prefillCore) clearSender(now time.Time, room uint64) Result {
	res := c.count(EventClear, c.reg.Clear(room))
	if res.Outcome == Applied && !res.Status.Terminal() {
		c.statusFailed(room, res.Peers, CodeCleared, "room cleared before it finished", "")
		if t, ok := c.reg.tombs[room]; ok && !t.holds() {
			// Nothing of it can land: the ACK goes with the STATUS,
			// unasked, so the decode rank's pages need not wait for its
			// ABORT's answer (a Close right after would leave that
			// ABORT unread, and the pages to the quarantine).
			c.reg.sendAcks(room, ackPeers(nil, res.Peers), true)
		}
	}
	return res
}

// sendChunk plans a chunk of the room's pages (positions continue where
// the previous chunk ended), or one range of its layers, as one write per
// decode rank, plus, after the last chunk's final range, the state items
// and the aux item; it emits them as one EffectPost. Each write names the
// epoch of the REQUEST whose pages it targets.
//
// A chunk handed over after InitSender but before every REQUEST came is
// kept, its place in the room checked (advance); it is planned in the
// step that makes the room WaitingForInput, so its first write is posted
// as the last REQUEST arrives (handOver; issue 52: REQUEST → first post).
func (c *prefillCore) sendChunk(now time.Time, in SendChunk) error {
	rm, early, err := c.sendable(in.Room)
	if err != nil {
		return err
	}
	if early {
		if len(rm.pre.early) >= MaxEarlyChunks {
			return fmt.Errorf("room %d: %d chunks handed over before every REQUEST came (the bound): %w", in.Room, len(rm.pre.early), ErrNotReady)
		}
		at, err := c.advance(rm, in)
		if err != nil {
			return err
		}
		in.Pages = slices.Clone(in.Pages)
		in.State = slices.Clone(in.State)
		for i := range in.State {
			in.State[i] = slices.Clone(in.State[i])
		}
		rm.pre.early = append(rm.pre.early, earlyChunk{in: in, at: at})
		return nil
	}
	if err := c.aligned(rm, in); err != nil {
		return err
	}
	at, err := c.advance(rm, in)
	if err != nil {
		return err
	}
	return c.planChunk(rm, in, at)
}

// handOver plans the chunks handed over before the room was
// WaitingForInput, now that it is, in order, as SendChunk would have: a
// chunk that cannot be written where the REQUESTs ask (a chunk ending
// inside a decode rank's larger page, pages the decode rank cannot hold)
// fails the room, naming it, and the chunks after it are dropped.
func (c *prefillCore) handOver(id uint64) {
	rm, ok := c.reg.rooms[id]
	if !ok || rm.role != RolePrefill || rm.status != WaitingForInput || len(rm.pre.early) == 0 {
		return
	}
	early := rm.pre.early
	rm.pre.early = nil
	for _, e := range early {
		if !e.in.Last && e.at.lo == 0 {
			if err := c.alignedEnd(e.in.Room, e.at.first+len(e.in.Pages)); err != nil {
				c.failRoom(id, fmt.Sprintf("chunk %d, handed over before the REQUEST: %v", e.at.chunk, err))
				return
			}
		}
		if err := c.planChunk(rm, e.in, e.at); err != nil {
			return // planChunk failed the room
		}
	}
}

// planChunk plans a chunk at its place in the room: one write per decode
// rank (or its publication, pulled), emitted as one EffectPost.
func (c *prefillCore) planChunk(rm *room, in SendChunk, at chunkAt) error {
	var writes []kvlayout.Write
	for _, pr := range rm.requests {
		w, reason := c.peerWrites(in, at, pr)
		if reason == "" && pr.Payload != nil && pr.Payload.Pull {
			// Pull: the chunk is published, not written (its writes are
			// planned all the same, for what they refuse).
			reason, w = c.publish(rm, in, at, pr), nil
		}
		if reason != "" {
			c.failRoom(in.Room, reason)
			return fmt.Errorf("room %d: %s", in.Room, reason)
		}
		writes = append(writes, w...)
	}
	if len(writes) == 0 && len(rm.requests) > 0 && rm.requests[0].Payload != nil && rm.requests[0].Payload.Pull {
		return nil
	}
	// The worker posts these in order (up to two at once, never past a
	// write without a notification): the room succeeds here once its very
	// final write completed and none is in flight.
	for i := range writes {
		writes[i].Last = in.Last && at.whole && i == len(writes)-1
	}
	seq := rm.pre.posts
	rm.pre.posts++
	c.emit(Effect{Kind: EffectPost, Room: in.Room, Writes: writes, First: seq == 0, Seq: seq})
	return nil
}

// aligned checks that a chunk other than the room's last ends on a page
// boundary of every decode rank that requested the room with larger pages
// than this rank's: a decode page is then written by one chunk, and each
// chunk's notification names whole decode pages (ErrChunkAlign; the room
// is left as it was, for a chunk that does).
//
// A chunk that ends inside the decode rank's prefix writes nothing there
// and may end anywhere; a layer range after a chunk's first is checked by
// advance (it names the first's pages).
func (c *prefillCore) aligned(rm *room, in SendChunk) error {
	if in.Last || rm.pre.open != nil {
		return nil
	}
	return c.alignedEnd(in.Room, rm.pre.sent+len(in.Pages))
}

// alignedEnd checks that a chunk ending after page end (not the room's
// last) ends on a page boundary of every decode rank that requested the
// room with larger pages (aligned).
func (c *prefillCore) alignedEnd(id uint64, end int) error {
	rm := c.reg.rooms[id]
	for _, pr := range rm.requests {
		p := c.peers[pr.Peer]
		if p == nil || p.plan == nil || pr.Payload == nil || pr.Payload.Dummy {
			continue
		}
		if pm := p.plan.Pages(); !pm.Aligned(end) && !pm.InPrefix(end, pr.Payload.Prefix) {
			return fmt.Errorf("room %d: a chunk ending after page %d of %d tokens ends inside a %d-token page of decode %s: %w",
				id, end, pm.Src, pm.Dst, pr.Peer, ErrChunkAlign)
		}
	}
	return nil
}

// sendable returns the prefill room a chunk is sent for, or why it cannot
// be: unknown, failed, not yet initialised, or already done; early says
// the room is initialised but not yet WaitingForInput (the chunk is kept
// until it is).
func (c *prefillCore) sendable(id uint64) (rm *room, early bool, err error) {
	rm, ok := c.reg.rooms[id]
	switch {
	case !ok || rm.role != RolePrefill:
		return nil, false, fmt.Errorf("room %d: %w", id, ErrUnknownRoom)
	case rm.status == Failed:
		return nil, false, fmt.Errorf("room %d: %w: %s", id, ErrRoomFailed, rm.reason)
	case rm.pre.done:
		// Its writes would follow the final (aux) write, whose posting
		// freed the destinations: the decode rank may reuse them.
		return nil, false, fmt.Errorf("room %d: %w", id, ErrAfterLast)
	case rm.status == Bootstrapping && rm.initialised:
		return rm, true, nil
	case rm.status == Bootstrapping:
		return nil, false, fmt.Errorf("room %d: send before InitSender: %w", id, ErrNotReady)
	case rm.status < WaitingForInput || rm.status == Success:
		return nil, false, fmt.Errorf("room %d: send in %v: %w", id, rm.status, ErrNotReady)
	}
	return rm, false, nil
}

// chunkAt is where a SendChunk falls in its room: the layers [lo, hi) of
// the chunk numbered chunk, whose first page is the room's page first.
type chunkAt struct {
	lo, hi, layers int
	whole          bool // the chunk's final range
	first, chunk   int
	total          int // chunks in the room, once the last is sent; else 0
}

// advance checks that a SendChunk continues the room's chunks (a layer
// range starts where the open chunk's previous range ended, and names the
// same pages, last and aux) and moves the room past it.
func (c *prefillCore) advance(rm *room, in SendChunk) (chunkAt, error) {
	room, pages, last, auxIndex := in.Room, in.Pages, in.Last, in.AuxIndex
	layers := max(len(c.cfg.Layout.Regions)/2, 1)
	lo, hi := in.Layers.Lo, in.Layers.Hi
	if hi == 0 && lo == 0 {
		hi = layers
	}
	next, op := 0, rm.pre.open
	if op != nil {
		next = op.next
	}
	switch {
	case lo != next || hi <= lo || hi > layers:
		return chunkAt{}, fmt.Errorf("room %d: layers [%d, %d) of a chunk of %d layers, %d sent: %w", room, lo, hi, layers, next, ErrLayers)
	case op != nil && (op.last != last || op.auxIndex != auxIndex || !slices.Equal(op.pages, pages)):
		return chunkAt{}, fmt.Errorf("room %d: layers [%d, %d) name other pages, last or aux than the chunk's first %d layers: %w", room, lo, hi, next, ErrLayers)
	}
	at := chunkAt{lo: lo, hi: hi, layers: layers, whole: hi == layers, first: rm.pre.sent, chunk: rm.pre.chunk}
	switch {
	case at.whole:
		rm.pre.sent += len(pages)
		rm.pre.chunk++
		rm.pre.open = nil
		rm.pre.done = last
	case op == nil:
		rm.pre.open = &openChunk{pages: slices.Clone(pages), last: last, auxIndex: auxIndex, next: hi}
	default:
		op.next = hi
	}
	if last {
		at.total = at.chunk + 1
	}
	return at, nil
}

// peerWrites plans the writes of a chunk to the decode rank of one
// REQUEST: its pages, and after the last chunk's final range its state
// items and its aux item (whose notification ends the rank's transfer).
// A reason is returned when the chunk cannot be written there: the room
// then fails.
func (c *prefillCore) peerWrites(in SendChunk, at chunkAt, pr PeerRequest) ([]kvlayout.Write, string) {
	room, pages, state := in.Room, in.Pages, in.State
	req := pr.Payload
	p := c.peers[pr.Peer]
	if p == nil || p.from.Epoch != pr.Epoch {
		c.stats.StaleEpoch++
		return nil, fmt.Sprintf("peer %s (epoch %d) that requested the room is gone", pr.Peer, pr.Epoch)
	}
	base := kvlayout.Write{Remote: p.remote, Peer: p.layout, AuxSrc: -1, State: -1, PeerKey: pr.Peer, Epoch: pr.Epoch, Slice: p.plan, Ready: in.Ready}
	if p.mapped && !req.Dummy && p.plan == nil {
		return nil, fmt.Sprintf("%s asked for data, but the rank mapping gives its heads to another prefill rank (REQUEST should be dummy)", pr.Peer)
	}
	uid := c.cfg.Rank
	if req.Source >= 0 {
		uid = req.Source
	}
	var src, dst []uint32
	off, count := -1, 0 // the positions [off, off+count) of the REQUEST's dst_pages the chunk writes
	if !req.Dummy {
		pm := kvlayout.PageMap{Src: 1, Dst: 1}
		if p.plan != nil {
			pm = p.plan.Pages()
		}
		var err error
		if src, dst, off, count, err = pm.Pair(at.first, pages, req.Prefix, req.DstPages); err != nil {
			return nil, fmt.Sprintf("%s: %v", pr.Peer, err)
		}
	}
	// Layers in the decode rank's numbering: this PP stage's layers start
	// at the plan's region offset there.
	shift := 0
	if p.plan != nil {
		shift = p.plan.RegionOffset / 2
	}
	n := max(off, 0)
	var writes []kvlayout.Write
	switch {
	case len(src) > 0:
		w := base
		w.Runs, w.Layers = kvlayout.Runs(src, dst), kvlayout.Layers{Lo: at.lo, Hi: at.hi}
		w.Digest = req.Digest
		w.Notif = chunkNotif(room, uid, at.chunk, at.total, n, count, at.lo+shift, at.hi+shift, shift, at.layers+shift)
		writes = append(writes, w)
	case at.whole:
		// Nothing to write here (a dummy, or pages decode holds): the
		// chunk's one notification completes its count.
		w := base
		w.Notif = chunkNotif(room, uid, at.chunk, at.total, n, 0, shift, at.layers+shift, shift, at.layers+shift)
		writes = append(writes, w)
	}
	if !in.Last || !at.whole {
		return writes, ""
	}
	for i, dstItems := range req.StateIndices {
		if req.Dummy || len(dstItems) == 0 {
			continue
		}
		if i >= len(state) || len(state[i]) != len(dstItems) {
			return nil, fmt.Sprintf("%s wants %d items of state region %d, prefill gave %d", pr.Peer, len(dstItems), i, len(stateAt(state, i)))
		}
		w := base
		w.Runs, w.State = kvlayout.Runs(state[i], dstItems), i
		writes = append(writes, w)
	}
	aux := base
	aux.Notif = fmt.Sprintf("kvb1:%d:%d%s", room, uid, auxNotifSuffix)
	if in.AuxIndex >= 0 && req.AuxIndex >= 0 && !req.Dummy {
		aux.AuxSrc, aux.AuxDst = in.AuxIndex, req.AuxIndex
	}
	return append(writes, aux), ""
}

// chunkNotif is a chunk write's notification (docs/PROTOCOL.md, "Data
// plane: notifications"): the chunk, the positions [off, off+n) of the
// REQUEST's dst_pages it wrote, the layers [lo, hi) it wrote and the
// layers [spanLo, spanHi) this prefill rank writes at all, in the decode
// rank's numbering.
func chunkNotif(room uint64, uid, chunk, total, off, n, lo, hi, spanLo, spanHi int) string {
	return fmt.Sprintf("kvb1:%d:%d:%d:%d:%d:%d:%d:%d:%d:%d", room, uid, chunk, total, off, n, lo, hi, spanLo, spanHi)
}

func stateAt(state [][]uint32, i int) []uint32 {
	if i < len(state) {
		return state[i]
	}
	return nil
}

// posting is the gate right before a write is posted: it counts the write
// in flight and returns true only if the room is still live on this rank
// and the write's peer is still the process (epoch) that named its pages.
func (c *prefillCore) posting(now time.Time, room uint64, w *kvlayout.Write) bool {
	p := c.peers[w.PeerKey]
	if p == nil || p.from.Epoch != w.Epoch {
		c.stats.StaleEpoch++
		c.failRoom(room, fmt.Sprintf("peer %s (epoch %d) that requested the room is gone", w.PeerKey, w.Epoch))
		return false
	}
	if c.count(EventPosted, c.reg.Posted(room)).Outcome != Applied {
		return false
	}
	if strings.HasSuffix(w.Notif, auxNotifSuffix) {
		c.finalPosted(room, w)
	}
	return true
}

// auxNotifSuffix ends the notification of a room's final write to one
// decode rank (the aux write of its last chunk, also without an aux item).
const auxNotifSuffix = ":aux"

// finalPosted frees the destinations of w's decode rank in room once its
// final write of the room passed the gate: every write to it is posted (a
// room's writes are posted in order), and that rank reuses the pages as
// soon as it sees the room succeed — from the notifications, which follow
// the data, possibly before this rank hears the write complete. Held
// until the completion, a correct REQUEST for them would be refused in
// that window. If the write fails from here, the decode rank's quarantine
// covers it: it does not reuse the pages of a failed room before then.
func (c *prefillCore) finalPosted(room uint64, w *kvlayout.Write) {
	for _, pr := range c.reg.Requests(room) {
		if pr.Peer == w.PeerKey && pr.Epoch == w.Epoch {
			c.settled(room, []PeerRequest{pr})
		}
	}
}

// writeDone reports a posted write's completion. quiesced says the engine
// guarantees a failed write can no longer land; a failed write that is not
// quiesced keeps the room undrained until the stall deadline.
func (c *prefillCore) writeDone(now time.Time, room uint64, w *kvlayout.Write, err error, quiesced bool) Result {
	res := c.count(EventWriteDone, c.reg.WriteDone(room, w.Last, err, quiesced))
	if err != nil && res.Outcome == Applied && res.Status == Failed {
		c.statusFailed(room, c.reg.Requests(room), CodeFailed, fmt.Sprintf("write to %s failed: %v", w.Remote, err), "")
	}
	return res
}

// prefillPeerDown fails every room shared with a dead or restarted decode
// rank. A dead rank keeps its registration (bound to its epoch, not to
// heartbeats: a false "dead" must not break the pair for good); a
// restarted one loses it.
func (c *prefillCore) peerDown(endpoint string, from wire.From, restarted bool, reason string) {
	for _, key := range slices.Sorted(maps.Keys(c.peers)) {
		p := c.peers[key]
		if p.from.Endpoint != endpoint && key != from.Peer() {
			continue
		}
		if restarted && p.from.Epoch == from.Epoch {
			continue // the report names the epoch we are bound to: nothing changed
		}
		code := CodePeerUnreachable
		if restarted {
			code = CodePeerRestarted
		}
		c.peerGone(key, p.from.Epoch, true, code, reason)
		if restarted {
			delete(c.peers, key)
		}
	}
}

// failed tells the decode ranks of a room that failed here, at once,
// whether or not its writes drained (as an abort does): a decode rank
// releases its pages only once its ABORT is acknowledged drained.
func (c *prefillCore) failed(room uint64, reason string, res Result) {
	c.statusFailed(room, c.reg.Requests(room), CodeFailed, reason, "")
}

// expired tells the decode ranks of a room a deadline failed.
func (c *prefillCore) expired(e Expiry) { c.statusFailed(e.Room, e.Peers, CodeFailed, e.Reason, "") }

func (c *prefillCore) tick(now time.Time) {
	c.pullTick(now)
	c.challengeTick(now)
	c.echoTick(now)
}

// needs marks the decode ranks with a live room or pending request here.
func (c *prefillCore) needs(needed map[string]bool) {
	mark := func(reqs []PeerRequest) {
		for _, pr := range reqs {
			if pr.Payload != nil {
				needed[pr.Payload.From.Endpoint] = true
			}
		}
	}
	for _, rm := range c.reg.rooms {
		if !rm.status.Terminal() {
			mark(rm.requests)
		}
	}
	for _, p := range c.reg.pending {
		mark(p.requests)
	}
}
