package core

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// RegistryConfig holds the registry's deadlines and its clock.
type RegistryConfig struct {
	// BootstrapTimeout bounds creation → WaitingForInput.
	BootstrapTimeout time.Duration
	// WaitingTimeout bounds WaitingForInput → first chunk (prefill) or first
	// data (decode).
	WaitingTimeout time.Duration
	// StallTimeout bounds the gap between two progress events while
	// Transferring, and how long a failed room waits for in-flight writes to
	// drain.
	StallTimeout time.Duration
	// PendingTimeout bounds how long peer requests wait for their sender.
	PendingTimeout time.Duration
	// TombstoneTTL is how long a cleared or early-aborted room id is
	// remembered. It must exceed BootstrapTimeout and PendingTimeout so an
	// early abort outlives every deadline that could still create its room.
	TombstoneTTL time.Duration
	// MaxPendingRooms bounds the rooms that hold requests but no sender.
	MaxPendingRooms int
	// MaxTombstones bounds remembered room ids. Past it the oldest
	// tombstone without an owed ABORT_ACK or a write that can still land is
	// forgotten early (counted); the id is then free again sooner. Those
	// that still owe one are kept past the bound until they settle.
	//
	// One rank's early aborts (ABORTs for rooms with no sender yet, and
	// pending rooms of its REQUESTs alone that expired) keep at most
	// MaxTombstones/8 tombstones (at least 1): past its share a rank's
	// oldest is forgotten first (counted), so one rank's flood of ABORTs
	// or REQUESTs forgets its own, not the others'.
	MaxTombstones int
	// MaxPendingPerPeer bounds the rooms one peer may hold pending, so a
	// single peer cannot lock the others out of MaxPendingRooms.
	MaxPendingPerPeer int
	// MaxReasonBytes bounds a failure reason kept in a room or tombstone
	// (longer ones are cut, marked with "…").
	MaxReasonBytes int
}

// DefaultRegistryConfig returns the defaults (docs/ARCHITECTURE.md, "Defaults and configuration").
func DefaultRegistryConfig() RegistryConfig {
	return RegistryConfig{
		BootstrapTimeout:  300 * time.Second,
		WaitingTimeout:    300 * time.Second,
		StallTimeout:      60 * time.Second,
		PendingTimeout:    300 * time.Second,
		TombstoneTTL:      10 * time.Minute,
		MaxPendingRooms:   1 << 16,
		MaxTombstones:     1 << 20,
		MaxPendingPerPeer: 1 << 12,
		MaxReasonBytes:    512,
	}
}

// Validate reports the first setting that cannot work.
func (c RegistryConfig) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"BootstrapTimeout", c.BootstrapTimeout},
		{"WaitingTimeout", c.WaitingTimeout},
		{"StallTimeout", c.StallTimeout},
		{"PendingTimeout", c.PendingTimeout},
		{"TombstoneTTL", c.TombstoneTTL},
	} {
		if d.v <= 0 {
			return fmt.Errorf("kvmanager: %s must be positive, got %v", d.name, d.v)
		}
	}
	if c.TombstoneTTL <= c.BootstrapTimeout || c.TombstoneTTL <= c.PendingTimeout {
		return fmt.Errorf("kvmanager: TombstoneTTL (%v) must exceed BootstrapTimeout (%v) and PendingTimeout (%v)",
			c.TombstoneTTL, c.BootstrapTimeout, c.PendingTimeout)
	}
	if c.MaxPendingRooms < 1 {
		return fmt.Errorf("kvmanager: MaxPendingRooms must be at least 1, got %d", c.MaxPendingRooms)
	}
	if c.MaxTombstones < 1 || c.MaxPendingPerPeer < 1 || c.MaxReasonBytes < 16 {
		return fmt.Errorf("kvmanager: MaxTombstones (%d) and MaxPendingPerPeer (%d) must be at least 1, MaxReasonBytes (%d) at least 16",
			c.MaxTombstones, c.MaxPendingPerPeer, c.MaxReasonBytes)
	}
	return nil
}

// PeerRequest is one decode rank's request for a room, as the prefill rank
// keeps it.
type PeerRequest struct {
	// Peer names the decode rank uniquely across restarts (role, instance,
	// rank); Epoch says which process of it sent the request.
	Peer  string
	Epoch uint64
	// Required is how many distinct peers' requests the room collects
	// before it starts.
	Required int
	// Payload is carried, never read by the registry (the core keeps the
	// decoded REQUEST there; it is never modified).
	Payload *wire.Request
	// At (pull) is the latest stamp of the decode process the prefill
	// rank heard for the room: its REQUEST's, then its RENEWs'.
	At uint64
}

// EventKind names an event.
type EventKind uint8

const (
	// EventCreate creates the room's live entry (sender or receiver New).
	EventCreate EventKind = 1 + iota
	// EventInit: prefill sender initialised; decode request sent.
	EventInit
	// EventRequest: a decode rank's request reached the prefill rank.
	EventRequest
	// EventPosted: prefill is about to post a chunk write. Only an Applied
	// outcome permits the post; this is the gate that makes an applied
	// abort final.
	EventPosted
	// EventWriteDone: a posted write finished (Err set if it failed,
	// Quiesced set if the engine guarantees a failed write can no longer
	// land; Last set on the room's final write).
	EventWriteDone
	// EventProgress: decode saw data arrive for the room.
	EventProgress
	// EventUpdate: an explicit status change to Status (Failed with Reason,
	// Success, or Transferring).
	EventUpdate
	// EventAbort: the room is aborted with Reason; Ack, when set, is owed an
	// ABORT_ACK once no write of the room can land.
	EventAbort
	// EventClear: the caller is done with the room.
	EventClear
)

// Event is one input to the registry.
type Event struct {
	Kind     EventKind
	Room     uint64
	Role     Role        // EventCreate
	Request  PeerRequest // EventRequest
	Status   Poll        // EventUpdate
	Reason   string      // EventUpdate to Failed, EventAbort
	Last     bool        // EventWriteDone
	Err      error       // EventWriteDone
	Quiesced bool        // EventWriteDone
	Ack      *wire.Peer  // EventAbort
	// By names the rank that sent an ABORT (wire.From.Peer: role,
	// instance, rank), "" for a local abort: an early abort's tombstone
	// counts against that rank's share of MaxTombstones.
	By string // EventAbort
}

// Result is what an event did.
type Result struct {
	Outcome Outcome
	// Status is the room's status after the event, 0 when no live room.
	Status Poll
	// Err says why for Rejected, and for Create refusals.
	Err error
	// Peers are requests the caller must answer: pending requests dropped by
	// an abort or clear, or a failed room's requests.
	Peers []PeerRequest
	// Drained is true when the event left the room Failed with no write in
	// flight and none that failed without being quiesced: no write for it
	// can land or will be posted again.
	Drained bool
}

// Expiry reports one deadline that Sweep enforced.
type Expiry struct {
	Room     uint64
	Deadline Deadline
	// Reason is the failure reason recorded for the room.
	Reason string
	// Peers are the requests to answer (the failed room's, or the dropped
	// pending ones).
	Peers []PeerRequest
	// Drained is false when a failed room's writes did not drain within
	// the stall deadline (reported once).
	Drained bool
	// DrainOnly: the room had failed before; only its drain deadline
	// passed (its peers were told when it failed).
	DrainOnly bool
}

// Sizes counts what the registry holds.
type Sizes struct {
	Live, Pending, Tombstones int
	// Draining counts cleared rooms whose writes may still land (each also
	// a tombstone); PendingPeers the peers with pending requests (each with
	// at least one pending room).
	Draining, PendingPeers int
}

// Total is the sum of all entries.
func (s Sizes) Total() int {
	return s.Live + s.Pending + s.Tombstones + s.Draining + s.PendingPeers
}

type room struct {
	id       uint64
	role     Role
	status   Poll
	reason   string
	created  time.Time
	deadline time.Time
	kind     Deadline // which deadline `deadline` is

	initialised bool
	required    int
	requests    []PeerRequest

	// Writes: posted and not completed, and failed without the engine
	// quiescing them (they may still land until the stall deadline).
	inflight, unsettled int
	lastDone            bool
	drainExpired        bool
	// settled: its requests were settled (see Registry.settle).
	settled bool
	// acks are the ABORT_ACKs owed once no write of the room can land.
	acks []wire.Peer

	// Whether the room's wake effects (WakeDone, WakeReady) went out.
	doneWoken, readyWoken bool

	pre prefillRoom // role-specific state the core keeps
	dec *decodeRoom

	// entered is when the room first entered each status, on the core's
	// clock (zero for one it never entered): the phase histograms.
	entered [Success + 1]time.Time
}

// enter moves the room to st at now, recording the first time it did.
func (rm *room) enter(st Poll, now time.Time) {
	rm.status = st
	if rm.entered[st].IsZero() {
		rm.entered[st] = now
	}
}

func (rm *room) drained() bool { return rm.inflight == 0 && rm.unsettled == 0 }

// writing: a write of the room is in flight, or failed without the engine
// quiescing it and its drain deadline has not passed (until then a
// drained ABORT_ACK is still withheld for it; past it the decode rank's
// quarantine bounds it).
func writing(inflight, unsettled int, drainExpired bool) bool {
	return inflight > 0 || (unsettled > 0 && !drainExpired)
}

type pendingRoom struct {
	required int
	requests []PeerRequest
	deadline time.Time
}

type tomb struct {
	kind    Tombstone
	reason  string
	expires time.Time
	// by: the rank whose ABORT (or REQUESTs, expired pending) made this
	// early-abort tombstone ("" for a local abort, several ranks' or a
	// clear); it counts in that rank's share (earlyBy).
	by string
	// A room cleared with writes that can still land keeps counting them
	// here, with the ABORT_ACKs it owes, until they drain or drainBy.
	inflight, unsettled int
	acks                []wire.Peer
	drainBy             time.Time
	drainExpired        bool
	// reqs are the requests of a room cleared while it was still writing,
	// until they settle.
	reqs []PeerRequest
}

func (t *tomb) holds() bool { return t.inflight > 0 || t.unsettled > 0 }

type tombRef struct {
	id      uint64
	expires time.Time
}

// Registry is the room table of one rank's core: no lock, no clock, no
// goroutine. Every event goes through Apply at the time set by SetNow and
// returns an explicit Outcome; what must happen outside (wake a waiter, send
// an ABORT_ACK) is appended to the core's effects.
type Registry struct {
	cfg     RegistryConfig
	now     time.Time
	rooms   map[uint64]*room
	pending map[uint64]*pendingRoom
	tombs   map[uint64]*tomb
	// tombQ lists tombstones in creation order (also expiry order: the TTL
	// is fixed); entries whose tombstone was replaced or dropped are stale.
	tombQ []tombRef
	// draining holds the cleared rooms whose writes may still land.
	draining map[uint64]struct{}
	// evicted counts tombstones forgotten early by MaxTombstones.
	evicted int
	// earlyBy counts each rank's early-abort tombstones, and earlyQ lists
	// them in the order of their last ABORT (an entry whose tombstone is
	// gone, another's or renewed since is stale): past the rank's share
	// (MaxTombstones/8) its oldest is forgotten.
	earlyBy map[string]int
	earlyQ  map[string][]tombRef
	// forgotten counts early aborts forgotten for their rank's share.
	forgotten int
	// pendingBy counts each peer's pending requests (MaxPendingPerPeer).
	pendingBy map[string]int
	// closed is the reason the rank was closed (Core's Close), "" while
	// it is open: no room is created and no request taken after it.
	closed string

	out *[]Effect
	// settler, when set, is told when accepted peer requests settle:
	// nothing of their room can be written any more (see settle).
	settler interface {
		settled(room uint64, reqs []PeerRequest)
	}
}

// NewRegistry returns an empty registry that appends its effects to out.
func NewRegistry(cfg RegistryConfig, out *[]Effect) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if out == nil {
		out = new([]Effect)
	}
	return &Registry{
		cfg:       cfg,
		rooms:     make(map[uint64]*room),
		pending:   make(map[uint64]*pendingRoom),
		tombs:     make(map[uint64]*tomb),
		earlyBy:   make(map[string]int),
		earlyQ:    make(map[string][]tombRef),
		draining:  make(map[uint64]struct{}),
		pendingBy: make(map[string]int),
		out:       out,
	}, nil
}

// SetNow sets the time the next events happen at.
func (r *Registry) SetNow(t time.Time) { r.now = t }

func (r *Registry) emit(e Effect) { *r.out = append(*r.out, e) }

func (r *Registry) wakeDone(rm *room) {
	if !rm.doneWoken {
		rm.doneWoken = true
		r.emit(Effect{Kind: EffectWake, Room: rm.id, Wake: WakeDone})
	}
	r.wakeReady(rm)
}

func (r *Registry) wakeReady(rm *room) {
	if !rm.readyWoken {
		rm.readyWoken = true
		r.emit(Effect{Kind: EffectWake, Room: rm.id, Wake: WakeReady})
	}
}

// sendAcks sends the owed ABORT_ACKs of a room.
func (r *Registry) sendAcks(id uint64, acks []wire.Peer, drained bool) {
	for _, p := range acks {
		r.emit(Effect{Kind: EffectSend, Room: id, To: p, Msg: &wire.AbortAck{Room: id, Drained: drained}})
	}
}

// ackPeers adds to acks, once per endpoint, the decode ranks that sent reqs.
func ackPeers(acks []wire.Peer, reqs []PeerRequest) []wire.Peer {
	for _, pr := range reqs {
		if pr.Payload == nil {
			continue
		}
		if p := (wire.Peer{Endpoint: pr.Payload.From.Endpoint}); !slices.Contains(acks, p) {
			acks = append(acks, p)
		}
	}
	return acks
}

// OweClosed owes, unasked, a drained ABORT_ACK to every decode rank whose
// REQUEST a failed prefill room, or a cleared one still writing, took: the
// rank closed (Close), so no ABORT of theirs may be read before it exits,
// and without the ACK their pages wait out the quarantine. Each goes out
// as the ABORTs' ACKs do: at once where no write of the room can land, else
// when the last one drains; none where the drain deadline passed (the
// quarantine bounds those).
func (r *Registry) OweClosed() {
	for _, id := range slices.Sorted(maps.Keys(r.rooms)) {
		if rm := r.rooms[id]; rm.role == RolePrefill && rm.status == Failed && !rm.drainExpired {
			rm.acks = ackPeers(rm.acks, rm.requests)
			r.drainResult(rm, IgnoredTerminal)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(r.tombs)) {
		if t := r.tombs[id]; len(t.reqs) > 0 && t.holds() && !t.drainExpired {
			t.acks = ackPeers(t.acks, t.reqs)
		}
	}
}

// Create adds a live room for a sender (RolePrefill) or receiver
// (RoleDecode). See EventCreate.
func (r *Registry) Create(id uint64, role Role) Result {
	return r.Apply(Event{Kind: EventCreate, Room: id, Role: role})
}

// Init marks the prefill sender initialised, or the decode request sent.
func (r *Registry) Init(id uint64) Result { return r.Apply(Event{Kind: EventInit, Room: id}) }

// Request records a decode rank's request on the prefill rank.
func (r *Registry) Request(id uint64, req PeerRequest) Result {
	return r.Apply(Event{Kind: EventRequest, Room: id, Request: req})
}

// Posted asks to post a chunk write; post only if the outcome is Applied.
func (r *Registry) Posted(id uint64) Result { return r.Apply(Event{Kind: EventPosted, Room: id}) }

// WriteDone reports a posted write's completion. A failed write that the
// engine did not quiesce may still land: the room is not drained until the
// stall deadline passes.
func (r *Registry) WriteDone(id uint64, last bool, err error, quiesced bool) Result {
	return r.Apply(Event{Kind: EventWriteDone, Room: id, Last: last, Err: err, Quiesced: quiesced})
}

// Progress reports data arriving on the decode side.
func (r *Registry) Progress(id uint64) Result { return r.Apply(Event{Kind: EventProgress, Room: id}) }

// Update moves the room to status (Failed with reason, Success, Transferring).
func (r *Registry) Update(id uint64, status Poll, reason string) Result {
	return r.Apply(Event{Kind: EventUpdate, Room: id, Status: status, Reason: reason})
}

// Abort fails the room, or tombstones it if it does not exist yet. ack,
// when not nil, gets an ABORT_ACK once no write of the room can land.
func (r *Registry) Abort(id uint64, reason string, ack *wire.Peer) Result {
	return r.Apply(Event{Kind: EventAbort, Room: id, Reason: reason, Ack: ack})
}

// Clear removes the room and leaves a Cleared tombstone.
func (r *Registry) Clear(id uint64) Result { return r.Apply(Event{Kind: EventClear, Room: id}) }

// Apply is the single entry point for events.
func (r *Registry) Apply(ev Event) Result {
	now := r.now
	switch ev.Kind {
	case EventCreate, EventRequest:
		if r.closed != "" {
			return rejected(fmt.Errorf("room %d: %w", ev.Room, ErrRankClosed))
		}
	}
	switch ev.Kind {
	case EventCreate:
		return r.create(ev.Room, ev.Role, now)
	case EventRequest:
		return r.request(ev.Room, ev.Request, now)
	case EventAbort:
		return r.abort(ev.Room, ev.Reason, ev.Ack, ev.By, now)
	case EventClear:
		return r.clear(ev.Room, now)
	case EventWriteDone:
		if t, ok := r.tombs[ev.Room]; ok && t.kind == Cleared && t.holds() {
			return r.tombWriteDone(ev.Room, t, ev.Err, ev.Quiesced)
		}
	case EventInit, EventPosted, EventProgress, EventUpdate:
	default:
		return rejected(fmt.Errorf("room %d: event kind %d: %w", ev.Room, ev.Kind, ErrInvalidEvent))
	}
	rm, res, ok := r.live(ev.Room, now)
	if !ok {
		return res
	}
	switch ev.Kind {
	case EventInit:
		return r.init(rm, now)
	case EventPosted:
		return r.posted(rm, now)
	case EventWriteDone:
		return r.writeDone(rm, ev.Last, ev.Err, ev.Quiesced, now)
	case EventProgress:
		return r.progress(rm, now)
	default: // EventUpdate
		return r.update(rm, ev.Status, ev.Reason, now)
	}
}

func rejected(err error) Result { return Result{Outcome: Rejected, Err: err} }

// takePending removes a room's pending requests and returns them.
func (r *Registry) takePending(id uint64) (*pendingRoom, bool) {
	p, ok := r.pending[id]
	if !ok {
		return nil, false
	}
	delete(r.pending, id)
	for _, q := range p.requests {
		if r.pendingBy[q.Peer]--; r.pendingBy[q.Peer] <= 0 {
			delete(r.pendingBy, q.Peer)
		}
	}
	return p, true
}

// cut bounds a reason kept in the registry.
func (r *Registry) cut(reason string) string {
	if len(reason) <= r.cfg.MaxReasonBytes {
		return reason
	}
	return reason[:r.cfg.MaxReasonBytes-len("…")] + "…"
}

// live finds the live room for an event that needs one. For any other room
// id it returns the result the event gets: late events on cleared rooms and
// on early-aborted rooms are ignored, and no event but Create makes a room.
func (r *Registry) live(id uint64, now time.Time) (*room, Result, bool) {
	if rm, ok := r.rooms[id]; ok {
		return rm, Result{}, true
	}
	if t, ok := r.tomb(id, now); ok {
		if t.kind == Cleared {
			return nil, Result{Outcome: IgnoredCleared}, false
		}
		return nil, Result{Outcome: IgnoredTerminal}, false
	}
	return nil, rejected(fmt.Errorf("room %d: %w", id, ErrUnknownRoom)), false
}

// tomb returns the room's tombstone unless its TTL has passed (an expired
// tombstone is dropped here so the id is free before the next Sweep).
func (r *Registry) tomb(id uint64, now time.Time) (*tomb, bool) {
	t, ok := r.tombs[id]
	if !ok {
		return nil, false
	}
	if now.Before(t.expires) {
		return t, true
	}
	r.dropTomb(id)
	return nil, false
}

func (r *Registry) dropTomb(id uint64) {
	if t := r.tombs[id]; t != nil {
		if len(t.reqs) > 0 {
			r.settle(id, t.reqs) // forgotten: nothing can count its writes any more
		}
		if len(t.acks) > 0 {
			// Forgotten while it still owes ABORT_ACKs (found past its TTL
			// by an event before the tick that enforces its drain
			// deadline): answer them as that tick would, not drained if a
			// write may still land.
			r.sendAcks(id, t.acks, !t.holds())
			t.acks = nil
		}
		if t.by != "" {
			r.uncount(t.by)
		}
	}
	delete(r.tombs, id)
	delete(r.draining, id)
}

// onePeer is the rank of every request, "" if they are of several.
func onePeer(reqs []PeerRequest) string {
	if len(reqs) == 0 {
		return ""
	}
	for _, q := range reqs[1:] {
		if q.Peer != reqs[0].Peer {
			return ""
		}
	}
	return reqs[0].Peer
}

// uncount takes one early abort off rank by's share.
func (r *Registry) uncount(by string) {
	if r.earlyBy[by]--; r.earlyBy[by] <= 0 {
		delete(r.earlyBy, by)
		delete(r.earlyQ, by)
	}
}

// earlyShare is how many early-abort tombstones one rank keeps.
func (r *Registry) earlyShare() int { return max(1, r.cfg.MaxTombstones/8) }

// addEarly records an early-abort tombstone; one of a rank (t.by) first
// forgets that rank's oldest ones past its share (oldest by their last
// ABORT: a renewal queues a tombstone again). Early aborts hold and owe
// nothing (an early abort's ABORT_ACK is sent at once).
func (r *Registry) addEarly(id uint64, t *tomb) {
	by := t.by
	if by == "" {
		r.addTomb(id, t) // no one rank's
		return
	}
	for r.earlyBy[by] >= r.earlyShare() && len(r.earlyQ[by]) > 0 {
		ref := r.earlyQ[by][0]
		r.earlyQ[by] = r.earlyQ[by][1:]
		if o, ok := r.tombs[ref.id]; ok && o.by == by && o.expires.Equal(ref.expires) {
			r.dropTomb(ref.id)
			r.forgotten++
		}
	}
	r.addTomb(id, t)
	r.earlyBy[by]++
	r.queueEarly(by, tombRef{id, t.expires})
}

// queueEarly queues rank by's early abort (a new one, or one whose TTL an
// ABORT renewed: its earlier entry goes stale), compacting the stale
// entries past 2×the rank's count+16.
func (r *Registry) queueEarly(by string, ref tombRef) {
	q := append(r.earlyQ[by], ref)
	if len(q) > 2*r.earlyBy[by]+16 {
		q = slices.DeleteFunc(q, func(x tombRef) bool {
			o, ok := r.tombs[x.id]
			return !ok || o.by != by || !o.expires.Equal(x.expires)
		})
	}
	r.earlyQ[by] = q
}

// settle tells the settler that reqs, accepted for room id, can no longer
// be written into: their room is terminal (or cleared) with no write in
// flight and none that failed unquiesced within its drain deadline, or
// they were pending and dropped. Each accepted request settles once.
func (r *Registry) settle(id uint64, reqs []PeerRequest) {
	if r.settler != nil && len(reqs) > 0 {
		r.settler.settled(id, reqs)
	}
}

// maybeSettle settles a live room's requests once it is terminal and no
// write of it can land any more.
func (r *Registry) maybeSettle(rm *room) {
	if rm.settled || !rm.status.Terminal() || writing(rm.inflight, rm.unsettled, rm.drainExpired) {
		return
	}
	rm.settled = true
	r.settle(rm.id, rm.requests)
}

// maybeSettleTomb settles the requests of a room cleared while it was
// writing, once it no longer is.
func (r *Registry) maybeSettleTomb(id uint64, t *tomb) {
	if len(t.reqs) == 0 || writing(t.inflight, t.unsettled, t.drainExpired) {
		return
	}
	reqs := t.reqs
	t.reqs = nil
	r.settle(id, reqs)
}

// addTomb records a tombstone, first forgetting the oldest ones that hold
// nothing if the count bound is reached.
func (r *Registry) addTomb(id uint64, t *tomb) {
	r.evictTombs(r.cfg.MaxTombstones - 1)
	r.tombs[id] = t
	r.tombQ = append(r.tombQ, tombRef{id, t.expires})
	if t.holds() {
		r.draining[id] = struct{}{}
	}
}

// evictTombs forgets the oldest tombstones that hold nothing and owe
// nothing while more than limit are kept. Those that still hold a write or
// owe an ABORT_ACK stay past the bound; each is trimmed once it settles
// (tombWriteDone), so MaxTombstones bounds the settled ones after every
// step.
func (r *Registry) evictTombs(limit int) {
	for tries := len(r.tombQ); len(r.tombs) > limit && tries > 0 && len(r.tombQ) > 0; tries-- {
		ref := r.tombQ[0]
		r.tombQ = r.tombQ[1:]
		old, ok := r.tombs[ref.id]
		switch {
		case !ok || !old.expires.Equal(ref.expires):
			tries++ // stale entry: costs nothing
		case old.holds() || len(old.acks) > 0:
			r.tombQ = append(r.tombQ, ref) // still owes something: keep
		default:
			r.dropTomb(ref.id)
			r.evicted++
		}
	}
}

func (r *Registry) create(id uint64, role Role, now time.Time) Result {
	if role != RolePrefill && role != RoleDecode {
		return rejected(fmt.Errorf("room %d: role %d: %w", id, role, ErrInvalidEvent))
	}
	if rm, ok := r.rooms[id]; ok {
		return Result{Outcome: Rejected, Status: rm.status,
			Err: fmt.Errorf("room %d: a %v handle exists (%v): %w", id, rm.role, rm.status, ErrRoomInUse)}
	}
	rm := &room{id: id, role: role, created: now}
	if t, ok := r.tomb(id, now); ok {
		if t.kind == Cleared {
			return rejected(fmt.Errorf("room %d: cleared %v ago, ids must be unique for %v: %w",
				id, r.cfg.TombstoneTTL-t.expires.Sub(now), r.cfg.TombstoneTTL, ErrRoomCleared))
		}
		// AbortedEarly: the abort came first; the room is born failed.
		r.dropTomb(id)
		rm.status, rm.reason = Failed, t.reason
		rm.setDeadline(DeadlineStall, now.Add(r.cfg.StallTimeout))
		r.rooms[id] = rm
		r.wakeDone(rm)
		return Result{Outcome: Applied, Status: Failed, Drained: true}
	}
	rm.enter(Bootstrapping, now)
	rm.setDeadline(DeadlineBootstrap, now.Add(r.cfg.BootstrapTimeout))
	r.rooms[id] = rm
	res := Result{Outcome: Applied, Status: Bootstrapping}
	if p, ok := r.takePending(id); ok {
		if role == RolePrefill {
			rm.required, rm.requests = p.required, p.requests
		} else {
			// Requests are a prefill concept: refuse them to their peers.
			res.Peers = p.requests
			r.settle(id, p.requests)
		}
	}
	return res
}

func (r *Registry) request(id uint64, req PeerRequest, now time.Time) Result {
	if req.Peer == "" || req.Required < 1 {
		return rejected(fmt.Errorf("room %d: peer %q required %d: %w", id, req.Peer, req.Required, ErrInvalidRequest))
	}
	if rm, ok := r.rooms[id]; ok {
		switch {
		case rm.role != RolePrefill:
			return Result{Outcome: Rejected, Status: rm.status,
				Err: fmt.Errorf("room %d: request from %s on a %v room: %w", id, req.Peer, rm.role, ErrWrongRole)}
		case rm.status == Failed:
			return Result{Outcome: Rejected, Status: rm.status,
				Err: fmt.Errorf("room %d: request from %s: %w: %s", id, req.Peer, ErrRoomFailed, rm.reason)}
		case rm.status == Success:
			return Result{Outcome: Rejected, Status: rm.status,
				Err: fmt.Errorf("room %d: request from %s: %w", id, req.Peer, ErrRoomDone)}
		}
		if err := r.addRequest(id, &rm.required, &rm.requests, req); err != nil {
			return Result{Outcome: Rejected, Status: rm.status, Err: err}
		}
		r.maybeReady(rm, now)
		return Result{Outcome: Applied, Status: rm.status}
	}
	if t, ok := r.tomb(id, now); ok {
		if t.kind == Cleared {
			return rejected(fmt.Errorf("room %d: request from %s: %w", id, req.Peer, ErrRoomCleared))
		}
		return rejected(fmt.Errorf("room %d: request from %s: %w: %s", id, req.Peer, ErrRoomAborted, t.reason))
	}
	p, ok := r.pending[id]
	if !ok {
		if len(r.pending) >= r.cfg.MaxPendingRooms {
			return rejected(fmt.Errorf("room %d: request from %s: %d rooms pending: %w",
				id, req.Peer, len(r.pending), ErrTooManyPending))
		}
		p = &pendingRoom{deadline: now.Add(r.cfg.PendingTimeout)}
	}
	if n := r.pendingBy[req.Peer]; n >= r.cfg.MaxPendingPerPeer {
		return rejected(fmt.Errorf("room %d: request from %s: it holds %d rooms pending: %w",
			id, req.Peer, n, ErrTooManyPending))
	}
	if err := r.addRequest(id, &p.required, &p.requests, req); err != nil {
		return rejected(err)
	}
	r.pending[id] = p
	r.pendingBy[req.Peer]++
	return Result{Outcome: Pending}
}

// addRequest appends req to a room's (or pending room's) requests if it is
// consistent with them.
func (r *Registry) addRequest(id uint64, required *int, reqs *[]PeerRequest, req PeerRequest) error {
	if *required != 0 && *required != req.Required {
		return fmt.Errorf("room %d: peer %s says %d required, earlier peers %d: %w",
			id, req.Peer, req.Required, *required, ErrRequiredMismatch)
	}
	for _, q := range *reqs {
		if q.Peer == req.Peer {
			return fmt.Errorf("room %d: peer %s: %w", id, req.Peer, ErrDuplicateRequest)
		}
	}
	if len(*reqs) >= req.Required {
		return fmt.Errorf("room %d: peer %s is request %d of %d: %w",
			id, req.Peer, len(*reqs)+1, req.Required, ErrTooManyRequests)
	}
	*required = req.Required
	*reqs = append(*reqs, req)
	return nil
}

// maybeReady moves a prefill room to WaitingForInput exactly when it is
// initialised and holds every required request.
func (r *Registry) maybeReady(rm *room, now time.Time) {
	if rm.status == Bootstrapping && rm.initialised && rm.required > 0 && len(rm.requests) == rm.required {
		rm.enter(WaitingForInput, now)
		rm.setDeadline(DeadlineWaiting, now.Add(r.cfg.WaitingTimeout))
		r.wakeReady(rm)
	}
}

func (r *Registry) init(rm *room, now time.Time) Result {
	switch {
	case rm.status.Terminal():
		return Result{Outcome: IgnoredTerminal, Status: rm.status}
	case rm.initialised:
		return Result{Outcome: IgnoredStale, Status: rm.status}
	}
	rm.initialised = true
	if rm.role == RoleDecode {
		rm.enter(WaitingForInput, now)
		rm.setDeadline(DeadlineWaiting, now.Add(r.cfg.WaitingTimeout))
		r.wakeReady(rm)
	} else {
		r.maybeReady(rm, now)
	}
	return Result{Outcome: Applied, Status: rm.status}
}

func (r *Registry) posted(rm *room, now time.Time) Result {
	switch {
	case rm.role != RolePrefill:
		return Result{Outcome: Rejected, Status: rm.status,
			Err: fmt.Errorf("room %d: chunk posted on a %v room: %w", rm.id, rm.role, ErrWrongRole)}
	case rm.status.Terminal():
		return Result{Outcome: IgnoredTerminal, Status: rm.status}
	case rm.status < WaitingForInput:
		return Result{Outcome: Rejected, Status: rm.status,
			Err: fmt.Errorf("room %d: chunk posted in %v: %w", rm.id, rm.status, ErrNotReady)}
	case rm.lastDone:
		return Result{Outcome: Rejected, Status: rm.status,
			Err: fmt.Errorf("room %d: chunk posted after the last chunk completed: %w", rm.id, ErrInvalidEvent)}
	}
	rm.inflight++
	rm.enter(Transferring, now)
	rm.setDeadline(DeadlineStall, now.Add(r.cfg.StallTimeout))
	return Result{Outcome: Applied, Status: rm.status}
}

func (r *Registry) writeDone(rm *room, last bool, werr error, quiesced bool, now time.Time) Result {
	if rm.inflight == 0 {
		return Result{Outcome: Rejected, Status: rm.status,
			Err: fmt.Errorf("room %d: write completion: %w", rm.id, ErrNoWriteInFlight)}
	}
	rm.inflight--
	if werr != nil && !quiesced {
		rm.unsettled++
	}
	if rm.status.Terminal() {
		r.maybeSettle(rm)
		return r.drainResult(rm, IgnoredTerminal)
	}
	if werr != nil {
		r.fail(rm, fmt.Sprintf("write failed: %v", werr), now)
		return r.drainResult(rm, Applied)
	}
	rm.setDeadline(DeadlineStall, now.Add(r.cfg.StallTimeout))
	if last {
		rm.lastDone = true
	}
	if rm.lastDone && rm.inflight == 0 && rm.unsettled == 0 {
		r.succeed(rm)
	}
	return Result{Outcome: Applied, Status: rm.status}
}

// tombWriteDone counts down the writes of a room cleared while they were
// in flight; the ABORT_ACKs it owes go out once nothing can land.
func (r *Registry) tombWriteDone(id uint64, t *tomb, werr error, quiesced bool) Result {
	if t.inflight == 0 {
		return Result{Outcome: IgnoredCleared}
	}
	t.inflight--
	if werr != nil && !quiesced {
		t.unsettled++
	}
	r.maybeSettleTomb(id, t)
	if !t.holds() {
		delete(r.draining, id)
		if !t.drainExpired {
			r.sendAcks(id, t.acks, true)
			t.acks = nil
		}
		r.evictTombs(r.cfg.MaxTombstones) // it settled: the bound holds again
	}
	return Result{Outcome: IgnoredCleared}
}

func (r *Registry) progress(rm *room, now time.Time) Result {
	switch {
	case rm.status.Terminal():
		return Result{Outcome: IgnoredTerminal, Status: rm.status}
	case rm.status < WaitingForInput:
		return Result{Outcome: Rejected, Status: rm.status,
			Err: fmt.Errorf("room %d: data in %v: %w", rm.id, rm.status, ErrNotReady)}
	}
	rm.enter(Transferring, now)
	rm.setDeadline(DeadlineStall, now.Add(r.cfg.StallTimeout))
	return Result{Outcome: Applied, Status: rm.status}
}

func (r *Registry) update(rm *room, to Poll, reason string, now time.Time) Result {
	switch {
	case !to.Valid():
		return Result{Outcome: Rejected, Status: rm.status,
			Err: fmt.Errorf("room %d: update to %v: %w", rm.id, to, ErrInvalidEvent)}
	case rm.status.Terminal():
		return Result{Outcome: IgnoredTerminal, Status: rm.status}
	case to == Failed:
		if reason == "" {
			reason = "failed"
		}
		r.fail(rm, reason, now)
		return r.drainResult(rm, Applied)
	case to < rm.status || (to == rm.status && to != Transferring):
		return Result{Outcome: IgnoredStale, Status: rm.status}
	case to == Transferring:
		return r.progress(rm, now)
	case to == Success:
		if rm.status < WaitingForInput || rm.inflight > 0 {
			return Result{Outcome: Rejected, Status: rm.status,
				Err: fmt.Errorf("room %d: success in %v with %d writes in flight: %w", rm.id, rm.status, rm.inflight, ErrNotReady)}
		}
		r.succeed(rm)
		return Result{Outcome: Applied, Status: rm.status}
	default: // Bootstrapping → WaitingForInput goes through Init and Request.
		return Result{Outcome: Rejected, Status: rm.status,
			Err: fmt.Errorf("room %d: update %v → %v: use Init: %w", rm.id, rm.status, to, ErrInvalidEvent)}
	}
}

func (r *Registry) abort(id uint64, reason string, ack *wire.Peer, by string, now time.Time) Result {
	if reason == "" {
		reason = "aborted"
	} else {
		reason = "aborted: " + reason
	}
	acks := func(drained bool) {
		if ack != nil {
			r.sendAcks(id, []wire.Peer{*ack}, drained)
		}
	}
	if rm, ok := r.rooms[id]; ok {
		// Owe the ABORT_ACK before anything else: a write finishing after
		// this event finds it.
		if ack != nil {
			rm.acks = append(rm.acks, *ack)
		}
		if rm.status.Terminal() {
			if rm.status == Failed {
				res := r.drainResult(rm, IgnoredTerminal)
				if !res.Drained && rm.drainExpired {
					r.sendAcks(id, rm.acks, false)
					rm.acks = nil
				}
				return res
			}
			r.sendAcks(id, rm.acks, true) // Success: every write completed
			rm.acks = nil
			return Result{Outcome: IgnoredTerminal, Status: rm.status}
		}
		r.fail(rm, reason, now)
		return r.drainResult(rm, Applied)
	}
	if t, ok := r.tomb(id, now); ok {
		if t.by != "" && t.by != by {
			// Another rank aborted it too: no one rank's share any more
			// (a flooder cannot forget a room another rank aborted).
			r.uncount(t.by)
			t.by = ""
		}
		if t.kind == AbortedEarly && t.expires.Before(now.Add(r.cfg.TombstoneTTL)) {
			// Every abort is remembered for a whole TTL from its arrival
			// (another decode rank's abort may come long after the first).
			t.expires = now.Add(r.cfg.TombstoneTTL)
			r.tombQ = append(r.tombQ, tombRef{id, t.expires})
			r.compactTombQ()
			if t.by != "" {
				r.queueEarly(t.by, tombRef{id, t.expires})
			}
		}
		switch {
		case t.holds() && !t.drainExpired:
			if ack != nil {
				t.acks = append(t.acks, *ack)
			}
		default:
			acks(!t.holds())
		}
		if t.kind == Cleared {
			return Result{Outcome: IgnoredCleared}
		}
		return Result{Outcome: IgnoredTerminal}
	}
	var dropped []PeerRequest
	if p, ok := r.takePending(id); ok {
		dropped = p.requests
		r.settle(id, dropped)
	}
	r.addEarly(id, &tomb{kind: AbortedEarly, reason: r.cut(reason), expires: now.Add(r.cfg.TombstoneTTL), by: by})
	acks(true)
	return Result{Outcome: Tombstoned, Peers: dropped}
}

func (r *Registry) clear(id uint64, now time.Time) Result {
	if rm, ok := r.rooms[id]; ok {
		res := Result{Outcome: Applied, Status: rm.status}
		if !rm.status.Terminal() {
			// Cleared before it finished: its peers must be told.
			res.Peers = rm.requests
		}
		r.wakeDone(rm)
		delete(r.rooms, id)
		t := &tomb{kind: Cleared, expires: now.Add(r.cfg.TombstoneTTL), inflight: rm.inflight, unsettled: rm.unsettled,
			drainExpired: rm.drainExpired, drainBy: now.Add(r.cfg.StallTimeout)}
		if rm.status == Failed && rm.kind == DeadlineStall {
			t.drainBy = rm.deadline
		}
		if t.holds() && !t.drainExpired {
			t.acks = rm.acks
		} else if len(rm.acks) > 0 {
			r.sendAcks(id, rm.acks, !t.holds())
		}
		if !rm.settled {
			// Cleared: nothing more is posted for it, but writes in flight
			// may still land; the tombstone keeps its requests until then.
			if writing(t.inflight, t.unsettled, t.drainExpired) {
				t.reqs = rm.requests
			} else {
				r.settle(id, rm.requests)
			}
		}
		r.addTomb(id, t)
		return res
	}
	if t, ok := r.tomb(id, now); ok {
		if t.kind == Cleared {
			return Result{Outcome: IgnoredCleared}
		}
		return Result{Outcome: IgnoredTerminal}
	}
	if p, ok := r.takePending(id); ok {
		r.settle(id, p.requests)
		r.addTomb(id, &tomb{kind: Cleared, expires: now.Add(r.cfg.TombstoneTTL)})
		return Result{Outcome: Applied, Peers: p.requests}
	}
	return rejected(fmt.Errorf("room %d: clear: %w", id, ErrUnknownRoom))
}

func (rm *room) setDeadline(kind Deadline, at time.Time) { rm.kind, rm.deadline = kind, at }

// fail makes a live non-terminal room Failed; the first reason wins because
// terminal rooms never reach here. Writes still in flight must drain within
// the stall deadline.
// Pull leases (pull.go). A decode process's reads of a pull room are one
// lease of the room from its first PAGES to its READ_DONE, counted with
// the writes that failed unquiesced (unsettled): they may still read the
// pages until the READ_DONE says drained, and past the room's drain
// deadline the prefill rank's pull hold (a quarantine past the lease)
// covers them, as the decode rank's covers such writes. So a room whose
// decode process never answers settles at its drain deadline, not never.

// leaseOpened opens a lease of a live room (its first PAGES to a decode
// process).
func (r *Registry) leaseOpened(id uint64, now time.Time) Result {
	rm, ok := r.rooms[id]
	switch {
	case !ok || rm.role != RolePrefill:
		return rejected(fmt.Errorf("room %d: lease on no prefill room: %w", id, ErrUnknownRoom))
	case rm.status.Terminal():
		return Result{Outcome: IgnoredTerminal, Status: rm.status}
	case rm.status < WaitingForInput:
		return Result{Outcome: Rejected, Status: rm.status, Err: fmt.Errorf("room %d: published in %v: %w", id, rm.status, ErrNotReady)}
	case rm.lastDone:
		return Result{Outcome: Rejected, Status: rm.status, Err: fmt.Errorf("room %d: published after a decode rank's reads of the whole room completed: %w", id, ErrInvalidEvent)}
	}
	rm.unsettled++
	rm.enter(Transferring, now)
	rm.setDeadline(DeadlineStall, now.Add(r.cfg.StallTimeout))
	return Result{Outcome: Applied, Status: rm.status}
}

// leaseClosed closes a lease on its READ_DONE: drained, it no longer
// holds the room's drain; err fails the room; otherwise (ok) the room
// succeeds once every lease and write of it completed.
func (r *Registry) leaseClosed(id uint64, err error, drained bool, now time.Time) Result {
	if t, ok := r.tombs[id]; ok && t.kind == Cleared {
		if !drained || t.unsettled == 0 {
			return Result{Outcome: IgnoredCleared}
		}
		t.unsettled--
		r.maybeSettleTomb(id, t)
		if !t.holds() {
			delete(r.draining, id)
			if !t.drainExpired {
				r.sendAcks(id, t.acks, true)
				t.acks = nil
			}
			r.evictTombs(r.cfg.MaxTombstones)
		}
		return Result{Outcome: IgnoredCleared}
	}
	rm, ok := r.rooms[id]
	if !ok || rm.role != RolePrefill {
		return rejected(fmt.Errorf("room %d: lease closed on no prefill room: %w", id, ErrUnknownRoom))
	}
	if drained && rm.unsettled > 0 {
		rm.unsettled--
	}
	switch {
	case rm.status.Terminal():
		r.maybeSettle(rm)
		return r.drainResult(rm, IgnoredTerminal)
	case err != nil:
		r.fail(rm, err.Error(), now)
		return r.drainResult(rm, Applied)
	}
	// (The stall deadline stays where the last publish put it: a
	// READ_DONE is not progress either, or each of a room's decode
	// processes could push it out once more.)
	rm.lastDone = true
	if rm.inflight == 0 && rm.unsettled == 0 {
		r.succeed(rm)
	}
	return Result{Outcome: Applied, Status: rm.status}
}

// progressed restarts a transferring room's stall deadline: a prefill
// rank published a pull room's chunk (its own progress).
func (r *Registry) progressed(rm *room, now time.Time) {
	if rm.status == Transferring {
		rm.setDeadline(DeadlineStall, now.Add(r.cfg.StallTimeout))
	}
}

func (r *Registry) fail(rm *room, reason string, now time.Time) {
	rm.status, rm.reason = Failed, r.cut(reason)
	rm.setDeadline(DeadlineStall, now.Add(r.cfg.StallTimeout))
	r.wakeDone(rm)
	r.maybeSettle(rm)
}

func (r *Registry) succeed(rm *room) {
	rm.enter(Success, r.now)
	r.wakeDone(rm)
	r.maybeSettle(rm)
}

// drainResult is the result for an event that leaves rm Failed: drained (and
// its peers to tell) when no write can land any more; the owed ABORT_ACKs go
// out then.
func (r *Registry) drainResult(rm *room, o Outcome) Result {
	res := Result{Outcome: o, Status: rm.status}
	if rm.drained() {
		res.Drained = true
		res.Peers = rm.requests
		if len(rm.acks) > 0 && !rm.drainExpired {
			r.sendAcks(rm.id, rm.acks, true)
			rm.acks = nil
		}
	}
	return res
}

// Sweep enforces every deadline that has passed at now: overdue rooms fail
// with a reason naming the deadline, expired pending requests are dropped and
// leave an AbortedEarly tombstone, failed or cleared rooms whose writes did
// not drain within the stall deadline answer their ABORTs with drained
// false (once), and expired tombstones are forgotten.
func (r *Registry) Sweep(now time.Time) []Expiry {
	r.now = now
	var out []Expiry
	// Each table is walked for what is due, then acted on in id order, so
	// the effects never depend on map order (the same inputs replay the
	// same trace).
	var due []uint64
	for id, rm := range r.rooms {
		if now.After(rm.deadline) {
			due = append(due, id)
		}
	}
	slices.Sort(due)
	for _, id := range due {
		rm := r.rooms[id]
		switch {
		case !rm.status.Terminal():
			reason := fmt.Sprintf("%s deadline (%v) passed in %v", deadlineName(rm.kind), r.timeout(rm.kind), rm.status)
			kind := rm.kind
			r.fail(rm, reason, now)
			e := Expiry{Room: id, Deadline: kind, Reason: reason, Peers: rm.requests}
			if rm.drained() {
				e.Drained = true
				r.sendAcks(id, rm.acks, true)
				rm.acks = nil
			}
			out = append(out, e)
		case rm.status == Failed && !rm.drained() && !rm.drainExpired:
			rm.drainExpired = true
			r.maybeSettle(rm)
			r.sendAcks(id, rm.acks, false)
			rm.acks = nil
			out = append(out, Expiry{Room: id, Deadline: DeadlineStall, Reason: rm.reason, Peers: rm.requests, DrainOnly: true})
		}
	}
	due = due[:0]
	for id, p := range r.pending {
		if now.After(p.deadline) {
			due = append(due, id)
		}
	}
	slices.Sort(due)
	for _, id := range due {
		p := r.pending[id]
		reason := fmt.Sprintf("pending deadline (%v) passed: no sender for the room", r.cfg.PendingTimeout)
		r.takePending(id)
		r.settle(id, p.requests)
		// The tombstone counts in the share of the rank whose REQUESTs
		// alone made the pending room (a REQUEST flood is that rank's too).
		r.addEarly(id, &tomb{kind: AbortedEarly, reason: reason, expires: now.Add(r.cfg.TombstoneTTL), by: onePeer(p.requests)})
		out = append(out, Expiry{Room: id, Deadline: DeadlinePending, Reason: reason, Peers: p.requests, Drained: true})
	}
	due = due[:0]
	for id := range r.draining {
		if now.After(r.tombs[id].drainBy) {
			due = append(due, id)
		}
	}
	slices.Sort(due)
	for _, id := range due {
		t := r.tombs[id]
		delete(r.draining, id)
		t.drainExpired = true
		r.maybeSettleTomb(id, t)
		r.sendAcks(id, t.acks, false)
		t.acks = nil
	}
	for len(r.tombQ) > 0 && !now.Before(r.tombQ[0].expires) {
		ref := r.tombQ[0]
		r.tombQ = r.tombQ[1:]
		if t, ok := r.tombs[ref.id]; ok && t.expires.Equal(ref.expires) {
			r.dropTomb(ref.id)
		}
	}
	r.compactTombQ()
	return out
}

// compactTombQ drops the stale entries of tombQ once they outnumber the
// live ones (past 2×tombs+64): at every tick, and after each ABORT that
// renews a tombstone's TTL (each adds an entry: a peer repeating one
// ABORT must not grow the queue until the next tick).
func (r *Registry) compactTombQ() {
	if len(r.tombQ) > 2*len(r.tombs)+64 {
		q := r.tombQ[:0]
		for _, ref := range r.tombQ {
			if t, ok := r.tombs[ref.id]; ok && t.expires.Equal(ref.expires) {
				q = append(q, ref)
			}
		}
		r.tombQ = q
	}
}

func deadlineName(d Deadline) string {
	switch d {
	case DeadlineBootstrap:
		return "bootstrap"
	case DeadlineWaiting:
		return "waiting"
	case DeadlineStall:
		return "transfer stall"
	case DeadlinePending:
		return "pending"
	default:
		return "tombstone"
	}
}

func (r *Registry) timeout(d Deadline) time.Duration {
	switch d {
	case DeadlineBootstrap:
		return r.cfg.BootstrapTimeout
	case DeadlineWaiting:
		return r.cfg.WaitingTimeout
	case DeadlineStall:
		return r.cfg.StallTimeout
	case DeadlinePending:
		return r.cfg.PendingTimeout
	default:
		return r.cfg.TombstoneTTL
	}
}

// Status returns the room's status. It never invents one: known is false for
// a room with no live entry (pending requests and tombstones included).
func (r *Registry) Status(id uint64) (status Poll, known bool) {
	if rm, ok := r.rooms[id]; ok {
		return rm.status, true
	}
	return 0, false
}

// Failure returns the first failure reason of a Failed room.
func (r *Registry) Failure(id uint64) (reason string, ok bool) {
	if rm, live := r.rooms[id]; live && rm.status == Failed {
		return rm.reason, true
	}
	return "", false
}

// InFlight returns the number of posted writes of the room not yet completed.
func (r *Registry) InFlight(id uint64) int {
	if rm, ok := r.rooms[id]; ok {
		return rm.inflight
	}
	if t, ok := r.tombs[id]; ok {
		return t.inflight
	}
	return 0
}

// Sizes returns how many live rooms, pending rooms and tombstones the
// registry holds.
func (r *Registry) Sizes() Sizes {
	return Sizes{Live: len(r.rooms), Pending: len(r.pending), Tombstones: len(r.tombs), Draining: len(r.draining), PendingPeers: len(r.pendingBy)}
}

// Overdue counts live non-terminal rooms whose deadline has passed at now:
// rooms a Sweep would fail. It stays 0 while sweeps run on time.
func (r *Registry) Overdue(now time.Time) int {
	n := 0
	for _, rm := range r.rooms {
		if !rm.status.Terminal() && now.After(rm.deadline) {
			n++
		}
	}
	return n
}

// Live says whether a room may still be written for a reason its decode
// rank wants: pending (REQUESTs waiting for the sender) or live and not
// terminal. A room that ended — failed, aborted, cleared, succeeded — is
// not, even while a write of it may still land (that exposure is the
// decode rank's quarantine's).
func (r *Registry) Live(id uint64) bool {
	if rm, ok := r.rooms[id]; ok {
		return !rm.status.Terminal()
	}
	_, pending := r.pending[id]
	return pending
}

// Requests returns a copy of a live room's peer requests.
func (r *Registry) Requests(id uint64) []PeerRequest {
	if rm, ok := r.rooms[id]; ok {
		return append([]PeerRequest(nil), rm.requests...)
	}
	return nil
}

// Counts returns how many live rooms are in each status.
func (r *Registry) Counts() map[Poll]int {
	out := map[Poll]int{}
	for _, rm := range r.rooms {
		out[rm.status]++
	}
	return out
}

// InFlightTotal counts posted writes not yet completed, over all rooms.
func (r *Registry) InFlightTotal() int {
	n := 0
	for _, rm := range r.rooms {
		n += rm.inflight
	}
	for id := range r.draining {
		n += r.tombs[id].inflight
	}
	return n
}
