package core

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// Core is one rank's protocol state machine, modelled on etcd-io/raft's
// RawNode: no goroutines, no locks, no clock and no I/O. Every input is a
// step (a local call, a received message, a write completion, a
// notification, a peer down report, a tick) taken at a time the caller
// gives; every output is an Effect that the caller carries out in order.
// It owns all room and peer state of its role: the room registry (status,
// pending requests, tombstones with owed ABORT_ACKs and writes that can
// still land), decode registrations bound to epochs, per-room send cursors
// (prefill), and per-source accounting and page quarantine (decode).
//
// Because it is pure, several cores compose over a simulated network in one
// test process (sim_test.go) and every invariant of docs/ARCHITECTURE.md is
// checked across ranks, exhaustively for small bounds.
type Core struct {
	*base
	// Exactly one of the two is set: the role's own tables and code. A
	// prefill path is a method of *prefillCore, which has no decode table
	// or method to reach, and the other way round; only this facade
	// dispatches by role.
	*prefillCore
	*decodeCore
}

// base is what both roles share: the room table (registry), the step's
// time and effects, counters, the peer table's epochs and the watches.
type base struct {
	cfg CoreConfig
	now time.Time
	reg *Registry
	out []Effect
	// epochs is the peer table's epoch column, for both roles: the last
	// epoch heard from each peer identity (From.Peer()) on anything but a
	// PING, bounded by MaxEpochs (least recently heard forgotten first: a
	// forgotten peer's next restart is caught by registrations bound to
	// epochs and STATUS codes instead).
	epochs   map[string]*heardPeer
	heardSeq uint64
	// watching are the endpoints the core asked the transport to
	// heartbeat; Tick unwatches those it shares nothing with any more.
	watching map[string]struct{}

	stats CoreStats
	// role is the role's core, for what shared code asks of it.
	role roleCore
}

// roleCore is what shared code asks of the role's core.
type roleCore interface {
	// failed: a room of this rank failed (tell its peers).
	failed(room uint64, reason string, res Result)
	// expired: a deadline failed the room.
	expired(e Expiry)
	// peerDown: heartbeats declared a peer dead, or the epoch check heard
	// it restarted.
	peerDown(endpoint string, from wire.From, restarted bool, reason string)
	// needs marks the endpoints this role still shares something with.
	needs(needed map[string]bool)
	tick(now time.Time)
	// settled: the registry settled these requests of a room (nothing of
	// the room can be written any more; prefill frees their pages).
	settled(room uint64, reqs []PeerRequest)
}

// prefillCore is a prefill rank's own state: registered decode ranks by
// From.Peer(), each bound to one epoch.
type prefillCore struct {
	*base
	peers map[string]*decodePeer
	// pulls are the pull rooms whose published pages are held (pull.go).
	pulls map[uint64]*pullHold
	// challenges are the agent challenges by registering identity
	// (challenge.go); challengeSeq numbers their nonces.
	challenges   map[string]*challenge
	challengeSeq uint64
	// echoes are the offer challenges' nonces this rank was sent, by the
	// challenging decode rank's tag (EndpointTag of its identity): each
	// REGISTER_ACK with an offer to that rank echoes its own.
	echoes map[string]offerEcho
	// endpoint is the rank's control endpoint (Bound), named in its
	// challenges.
	endpoint string
}

// decodeCore is a decode rank's own state: prefill targets by key, their
// holds on our pages, and the index of live rooms by target.
type decodeCore struct {
	*base
	targets map[string]*target
	holds   map[uint64]*hold
	// roomsOf indexes live decode rooms by their sources' target keys.
	roomsOf map[string]map[uint64]struct{}
	// failCode is the failure code of the room being failed (set around
	// failRoom; empty: CodeFailed).
	failCode string
	// echo holds the nonces of the last MaxEchoes agent challenges sent
	// for this rank, echoed in each REGISTER.
	echo []byte
	// offers are the prefill processes' pull offers accepted (offer.go);
	// offerChecks the agents whose offer is being loaded; offerGen numbers
	// acceptances.
	offers      map[offerKey]*acceptedOffer
	offerChecks map[string]bool
	offerGen    uint64
	// offerChallenges are the offer challenges awaiting their echo, by
	// offering process (offer.go); offerSeq numbers their nonces.
	offerChallenges map[offerKey]*offerChallenge
	offerSeq        uint64
	// topos are the prefill instances' topologies, by bootstrap URL
	// (topology.go).
	topos map[string]Topology
}

// heardPeer is what the core last heard from one peer identity.
type heardPeer struct {
	epoch uint64
	seq   uint64 // recency, for eviction
	// retired are the identity's earlier epochs (the last maxRetired): a
	// late message from one is stale, dropped, not a restart back.
	retired []uint64
}

// maxRetired bounds the earlier epochs remembered per peer identity.
const maxRetired = 4

// DefaultMaxEpochs bounds the peer epochs a core remembers.
const DefaultMaxEpochs = 4096

// CoreConfig is what a rank's core needs to know.
type CoreConfig struct {
	Role     Role
	Rank     int // the prefill rank uid in notifications
	Compat   string
	Layout   kvlayout.Layout // this rank's memory
	Registry RegistryConfig
	// QuarantineTimeout bounds how long a failed decode room's pages wait
	// for the prefill ranks' ABORT_ACK; past it they are released as forced
	// (counted). It must exceed StallTimeout.
	QuarantineTimeout time.Duration
	// RegisterRetry is the first REGISTER retry interval (doubling up to
	// 32×) while no REGISTER_ACK came.
	RegisterRetry time.Duration
	// Register is decode's REGISTER body (agent, metadata, regions, and
	// its topology when Model is set).
	Register wire.Register
	// Parallel and Model place this rank for the rank mapping (see
	// kvlayout.Links); a zero Model means none: one prefill rank feeds one
	// decode rank with identical layouts.
	Parallel kvlayout.Parallel
	Model    kvlayout.Model
	// MaxEpochs bounds the peer epochs remembered for restart detection
	// (0: DefaultMaxEpochs).
	MaxEpochs int
	// RecheckIdle (decode): a prefill rank not heard from for longer than
	// this is looked up and registered with again before a REQUEST is sent
	// to it — nothing heartbeats a rank no room shares, so it may have died
	// or moved meanwhile (0: never; the shell uses the heartbeat bound).
	RecheckIdle time.Duration
	// ProbeIdle and ProbeTimeout (decode): a REQUEST goes only to a
	// prefill process heard from within ProbeIdle; otherwise it waits for
	// the PONG of a PING sent now, and if none comes within ProbeTimeout
	// the rank is looked up again and registered with wherever its record
	// says — so a room posted just after a prefill rank restarted on a new
	// endpoint is served by the new process instead of going to the dead
	// one and failing at the heartbeat bound (0: no probe).
	ProbeIdle, ProbeTimeout time.Duration
	// Lease (pull, docs/PROTOCOL.md "Pull"): on a prefill rank, how long
	// a room's published pages wait for a decode rank's reads, renewed by
	// its RENEWs (0: this rank does not serve pull); on a decode rank, the
	// lease it renews a third of, until a PAGES says the prefill rank's.
	// At most StallTimeout: the stall deadline would end a longer one.
	Lease time.Duration
	// Offer (prefill, with Lease): the rank's pull offer, sent whole in
	// an ok REGISTER_ACK to a decode rank that asked for pull (nil: an
	// empty offer, for tests); OfferProgress: how long the rank's agent
	// keeps progressing after it (the decode rank reads its proof slots
	// back through it, EffectKeepProgress).
	Offer         *wire.PullOffer
	OfferProgress time.Duration
	// Identity (decode) is this rank's identity as its peers see it
	// (From.Peer()): it echoes only the agent challenges sent for it.
	Identity string
	// ChallengeKey (prefill) keys the agent challenges' nonces: random
	// and secret (a zero key makes them predictable; tests only).
	// ChallengeTimeout is how long a REGISTER's sender has to echo its
	// agent challenge before the registration is refused (prefill), and
	// an offering rank its offer challenge before the offer is (decode,
	// pull) (0: DefaultChallengeTimeout).
	ChallengeKey     [32]byte
	ChallengeTimeout time.Duration
}

// MaxSources bounds the prefill ranks of one decode room.
func (c CoreConfig) MaxSources() int { return 1024 }

// Validate reports the first setting that cannot work.
func (c CoreConfig) Validate() error {
	if c.Role != RolePrefill && c.Role != RoleDecode {
		return fmt.Errorf("kvmanager: role %d: %w", c.Role, ErrInvalidEvent)
	}
	if c.QuarantineTimeout <= c.Registry.StallTimeout || c.QuarantineTimeout >= c.Registry.TombstoneTTL {
		return fmt.Errorf("kvmanager: QuarantineTimeout (%v) must exceed StallTimeout (%v) and stay below TombstoneTTL (%v)",
			c.QuarantineTimeout, c.Registry.StallTimeout, c.Registry.TombstoneTTL)
	}
	if c.RecheckIdle < 0 {
		return fmt.Errorf("kvmanager: RecheckIdle must not be negative, got %v", c.RecheckIdle)
	}
	if c.ProbeIdle < 0 || (c.ProbeIdle > 0 && c.ProbeTimeout <= 0) {
		return fmt.Errorf("kvmanager: ProbeIdle (%v) must not be negative, and ProbeTimeout (%v) positive with it", c.ProbeIdle, c.ProbeTimeout)
	}
	if c.MaxEpochs < 0 {
		return fmt.Errorf("kvmanager: MaxEpochs must not be negative, got %d", c.MaxEpochs)
	}
	if c.Lease < 0 || c.Lease > c.Registry.StallTimeout {
		return fmt.Errorf("kvmanager: Lease (%v) must not be negative nor exceed StallTimeout (%v)", c.Lease, c.Registry.StallTimeout)
	}
	if c.RegisterRetry <= 0 {
		return fmt.Errorf("kvmanager: RegisterRetry must be positive, got %v", c.RegisterRetry)
	}
	return c.Registry.Validate()
}

// CoreStats counts what the core did, for metrics.
type CoreStats struct {
	Events          [EventClear + 1][Rejected + 1]uint64 // by EventKind and Outcome
	Deadlines       [DeadlineTombstone + 1]uint64
	StatusSent      uint64
	ForcedReleases  uint64 // decode pages released by the quarantine deadline
	StaleEpoch      uint64 // messages or writes refused for naming another epoch
	RegisterRetries uint64
	AbortsDropped   uint64 // owed ABORTs over the bound of one target
	AbortsResent    uint64 // owed ABORTs sent again, unacknowledged after a retry interval
	Relookups       uint64 // ranks looked up again after unanswered REGISTERs
	PeersRestarted  uint64 // peers heard with a new epoch
	Rechecks        uint64 // idle registrations looked up and registered again before a REQUEST
	Probes          uint64 // PINGs sent before a REQUEST to a prefill process not heard from within ProbeIdle
	ProbesLost      uint64 // ... that got no PONG within ProbeTimeout: the rank was looked up again
	Refused         uint64 // messages of a type this role never accepts
	// ClosedRegisters (prefill): REGISTERs dropped unanswered because the
	// rank is closed, or loaded while it closed, and offer challenges
	// (pull) it did not echo because it is closed.
	ClosedRegisters uint64
	// ClosedNotices (prefill): closing notices sent (STATUS closed, one
	// per bound decode rank); ClosedHeard (decode): those taken from the
	// process a registration names; ClosedUntaken (decode): REQUESTs such
	// a notice showed never taken, their rooms failed and pages freed.
	ClosedNotices, ClosedHeard, ClosedUntaken uint64
	// ClosedRecords (decode): lookups whose record still named a process
	// that said it closed (the rooms waiting for the rank failed).
	ClosedRecords uint64
	BadNotifs     uint64 // notifications out of range or contradicting their chunk's earlier ones
	// NotDelivered (decode): notifications the write check found naming
	// bytes that did not land (Notified.Undelivered).
	NotDelivered uint64
	// DigestMismatches (decode): notifications whose pages did not match
	// their digest, or carried none for a room that asked for one
	// (Notified.Corrupt).
	DigestMismatches uint64
	// LayoutRefused counts REGISTERs and REQUESTs refused for naming
	// memory that cannot be right, by LayoutRefusal.
	LayoutRefused [LayoutRefusals]uint64
	// Pull (docs/PROTOCOL.md "Pull").
	PagesPublished uint64 // PAGES sent (prefill)
	LeaseRenewals  uint64 // RENEWs sent (decode) or applied (prefill)
	LeaseExpiries  uint64 // pull rooms failed by their lease (prefill)
	ReadsRefused   uint64 // pull reads their gate refused (decode)
	SourceReleases uint64 // pull rooms' source pages released (prefill; forced ones in ForcedReleases too)
	PullRefused    uint64 // PAGES, RENEW or READ_DONE ignored: stale, unknown room or peer, a duplicate, or refused
	OffersRefused  uint64 // (decode) pull offers refused: none, another's agent, bad regions, or not proven
	OffersDeferred uint64 // (decode) REGISTER_ACKs left unanswered: their agent's offer being loaded, or too many
	// Tombstones forgotten before their TTL (prefill): settled ones past
	// MaxTombstones (TombstonesEvicted), and early aborts past their
	// rank's share, MaxTombstones/8 (EarlyAbortsForgotten).
	TombstonesEvicted, EarlyAbortsForgotten uint64
	// ForeignRefused (prefill): REQUESTs and ABORTs refused for naming a
	// room that another decode instance asked for first.
	ForeignRefused uint64
	// Agent challenges (prefill): sent (one per registering process and
	// blob), echoed, expired unechoed (a not_owner refusal where the
	// sender registered again meanwhile), and REGISTERs left unanswered
	// while maxChallenges were open.
	Challenges, ChallengesPassed, ChallengesExpired, ChallengesDeferred uint64
	// ChallengesIgnored: challenge notifications for another identity (a
	// REGISTER or an offer elsewhere named this rank's agent) or
	// malformed, or (prefill) to a rank that offers nothing.
	ChallengesIgnored uint64
	// Offer challenges (decode, pull): sent (one per offering process and
	// offer), echoed, and expired unechoed (the offer refused not_owner
	// where its sender answered again meanwhile). OfferEchoes (prefill):
	// offer challenges kept to echo.
	OfferChallenges, OfferChallengesPassed, OfferChallengesExpired, OfferEchoes uint64
}

// EffectKind names an effect.
type EffectKind uint8

// Effects.
const (
	// EffectSend: send Msg to To.
	EffectSend EffectKind = 1 + iota
	// EffectPost: submit Writes (one chunk of Room) to the transfer pool;
	// each write is gated by Core.Posting right before it is posted.
	EffectPost
	// EffectWake: release the shell's waiters of Room's Wake (the core
	// makes no channel: waiters are the shell's, woken by this effect).
	EffectWake
	// EffectResolve: look up Target's prefill rank (endpoint and key), then
	// step Resolved or ResolveFailed.
	EffectResolve
	// EffectWatch: heartbeat To while rooms are shared with it.
	EffectWatch
	// EffectReleased: decode pages of Room may be reused; Forced when the
	// quarantine deadline, not an ABORT_ACK, released them.
	EffectReleased
	// EffectUnwatch: stop heartbeating To: nothing is shared with it any
	// more (no live room, pending request or owed ABORT).
	EffectUnwatch
	// EffectLoadMetadata: a REGISTER (Msg) passed the epoch check and
	// CheckRegister (its plan in Plan): load the peer's agent metadata and
	// prove its memory (engine I/O, off the core), then step Registered,
	// or RegisterRefused when that fails.
	EffectLoadMetadata
	// EffectRead (decode, pull): read Read from the prefill rank To, each
	// read gated by ReadPosting right before it is posted, then step
	// ReadDone.
	EffectRead
	// EffectKeepProgress (prefill, pull): a peer is about to read this
	// rank's memory (a PAGES published, a pull offer's proof slots): an
	// engine that moves reads only while its agent progresses keeps
	// progressing for Keep.
	EffectKeepProgress
	// EffectChallenge (prefill): load the agent metadata of the REGISTER
	// Msg and send its agent the notification Notif through the data
	// plane — nothing else goes through that agent until the REGISTER's
	// sender echoes it (PROTOCOL.md "The agent challenge").
	EffectChallenge
	// EffectUnload (prefill): drop the remote agent Remote, loaded for a
	// challenge that was never echoed.
	EffectUnload
	// EffectLoadOffer (decode, pull): load the agent metadata of Offer's
	// REGISTER_ACK and prove its memory the offering process's (engine
	// I/O, off the core), then step OfferLoaded.
	EffectLoadOffer
	// EffectTimer: step Tick at At (or soon after): a deadline the core
	// set that is shorter than the shell's sweep — a probe's PONG is
	// awaited for ProbeTimeout, not until the next sweep.
	EffectTimer
	// EffectChallengeOffer (decode, pull): load the agent metadata of
	// Offer's REGISTER_ACK and send its agent Notif, the offer challenge
	// (a message, never an access to that process's memory), then step
	// OfferChallenged.
	EffectChallengeOffer
)

// Effect is one output of the core.
type Effect struct {
	Kind   EffectKind
	Room   uint64
	To     wire.Peer
	Msg    wire.Message
	Writes []kvlayout.Write
	// First (EffectPost): these are the room's first writes — no write
	// of the room was handed to the shell before them — so the shell may
	// post the first of them at once, on the goroutine that stepped,
	// before handing the rest to its worker (docs/ARCHITECTURE.md "The
	// first post").
	First bool
	// Seq (EffectPost): the room's post number, 0 for its first. Two
	// goroutines may carry out a room's posts (the control loop those of
	// chunks kept before the REQUEST, the application those it sends
	// after); the pool takes a room's jobs in this order, whichever
	// comes first.
	Seq    int
	Wake   Wake // EffectWake
	Target Target
	Forced bool
	Plan   *PeerPlan // EffectLoadMetadata
	Read   *Read     // EffectRead
	// Ready (EffectSend of a PAGES) gates the send: the published data is
	// in place once it says true (SendChunk.Ready).
	Ready kvlayout.Ready
	// Digest (EffectSend of a PAGES for a room whose REQUEST asked for a
	// digest): the write the decode rank's read of it will make, as the
	// prefill rank's pool would post it (runs, slice, layers); the shell
	// sums its source pieces into the PAGES' Digests and Units once the
	// data is in place, before it is sent (docs/PROTOCOL.md "Digest").
	Digest *kvlayout.Write
	// Pages and Held (EffectReleased on a prefill rank: its pull pages):
	// the pages the room published and how long since the first.
	Pages int
	Held  time.Duration
	// Keep (EffectKeepProgress): how long the agent keeps progressing.
	Keep time.Duration
	// Notif (EffectChallenge): the notification to send.
	Notif string
	// Remote (EffectUnload): the remote agent's name.
	Remote string
	// At (EffectTimer): when to step Tick.
	At time.Time
	// Offer (EffectLoadOffer, EffectChallengeOffer): the offer to load and
	// prove, or to challenge.
	Offer *OfferPlan
}

// Target names one prefill rank a decode room pulls from: the bootstrap
// service that lists its instance, and its DP group, TP rank (Rank) and PP
// stage there.
type Target struct {
	Bootstrap string
	Rank      int // TP rank
	DP, PP    int
	// InstTP, InstPP are the instance's sizes the mapping used (0: no
	// mapping). They go in the target's REGISTER, so a rank of an instance
	// that changed shape refuses it; a room mapped onto other sizes than
	// the target's makes it register again.
	InstTP, InstPP int
}

func (t Target) key() string { return fmt.Sprintf("%s#%d/%d/%d", t.Bootstrap, t.DP, t.Rank, t.PP) }

// Link is one prefill rank's part in a decode room: the rank, and what
// the mapping gives it (kvlayout.Link).
type Link struct {
	Target
	// Dummy: it writes nothing into this rank (its REQUEST says so).
	Dummy bool
	// Aux: it writes the aux item and the state items.
	Aux bool
	// Required overrides RequestSpec.Required for this rank (0: keep).
	Required int
	// Pages maps the prefill rank's pages onto this rank's (pull reads
	// pair them here; zero: pages of the same size).
	Pages kvlayout.PageMap
}

// STATUS codes (protocol v2): decode branches on them.
const (
	CodeNotRegistered = "not_registered"
	CodeOutOfRange    = "out_of_range"
	CodeAborted       = "aborted"
	CodeCleared       = "cleared"
	CodeRejected      = "rejected"
	CodePeerRestarted = "peer_restarted"
	// CodeRefused (ABORT): the decode rank refused the room before asking
	// for it (an unsupported mapping, another model).
	CodeRefused = "refused"
	// CodePeerUnreachable: heartbeats declared the receiving decode rank
	// dead here; it is sent in case it was only paused.
	CodePeerUnreachable = "peer_unreachable"
	CodeFailed          = "failed"
	// CodeClosed: a closing prefill rank's notice to each decode rank it
	// binds (room 0, with the highest REQUEST number it took: Taken); on
	// a decode room, the fail of a REQUEST that notice says was never
	// taken (docs/PROTOCOL.md "A rank that closes").
	CodeClosed = "closed"
	// CodeNotDelivered (decode): a prefill rank's notification named
	// pages whose bytes did not land (the engine reported the write
	// done; the decode rank's write check found its canary still there).
	CodeNotDelivered = "not_delivered"
	// CodeCorrupt (decode): a room that asked for a digest got pages
	// whose bytes do not match the prefill rank's digest of them, or a
	// notification without one (docs/PROTOCOL.md "Digest").
	CodeCorrupt = "corrupt"
)

// NewCore returns an empty core.
func NewCore(cfg CoreConfig) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxEpochs == 0 {
		cfg.MaxEpochs = DefaultMaxEpochs
	}
	b := &base{cfg: cfg, epochs: map[string]*heardPeer{}, watching: map[string]struct{}{}}
	var err error
	if b.reg, err = NewRegistry(cfg.Registry, &b.out); err != nil {
		return nil, err
	}
	c := &Core{base: b}
	if cfg.Role == RolePrefill {
		c.prefillCore = &prefillCore{base: b, peers: map[string]*decodePeer{}, pulls: map[uint64]*pullHold{}, challenges: map[string]*challenge{}, echoes: map[string]offerEcho{}}
		b.role = c.prefillCore
	} else {
		c.decodeCore = &decodeCore{base: b, targets: map[string]*target{}, holds: map[uint64]*hold{},
			roomsOf: map[string]map[uint64]struct{}{}, offers: map[offerKey]*acceptedOffer{}, offerChecks: map[string]bool{}, topos: map[string]Topology{},
			offerChallenges: map[offerKey]*offerChallenge{}}
		b.role = c.decodeCore
	}
	b.reg.settler = b.role
	return c, nil
}

// settled: decode rooms hold no peer requests (a REQUEST that reached a
// decode rank was refused), so nothing is held for them here.
func (*decodeCore) settled(uint64, []PeerRequest) {}

// step starts a step at now.
func (c *base) step(now time.Time) {
	c.now = now
	c.reg.SetNow(now)
	c.reg.settler = c.role // set at every step: a cloned core (sim) gets its own
}

// Effects returns the effects of the steps taken since the last call, in
// order, and forgets them. The slice is valid until the next step: the core
// reuses its memory (the shell copies a step's effects before it lets go
// of the lock that orders steps).
func (c *Core) Effects() []Effect {
	out := c.out
	clear(c.out[len(c.out):cap(c.out)]) // drop references kept from earlier steps
	c.out = c.out[:0]
	return out
}

func (c *base) emit(e Effect) { c.out = append(c.out, e) }

// watch asks the transport to heartbeat to.
func (c *base) watch(room uint64, to wire.Peer) {
	c.watching[to.Endpoint] = struct{}{}
	c.emit(Effect{Kind: EffectWatch, Room: room, To: to})
}

// unwatchIdle stops heartbeating every watched endpoint this rank shares
// nothing with any more: a decode rank's prefill ranks without a live room
// whose REQUEST went to them or an owed ABORT, a prefill rank's decode
// ranks without a live room or pending request of theirs.
func (c *base) unwatchIdle() {
	if len(c.watching) == 0 {
		return
	}
	needed := map[string]bool{}
	c.role.needs(needed)
	for _, ep := range slices.Sorted(maps.Keys(c.watching)) {
		if !needed[ep] {
			delete(c.watching, ep)
			c.emit(Effect{Kind: EffectUnwatch, To: wire.Peer{Endpoint: ep}})
		}
	}
}

func (c *base) send(to wire.Peer, room uint64, m wire.Message) {
	c.emit(Effect{Kind: EffectSend, Room: room, To: to, Msg: m})
}

func (c *base) count(kind EventKind, r Result) Result {
	if kind <= EventClear && r.Outcome <= Rejected {
		c.stats.Events[kind][r.Outcome]++
	}
	return r
}

// Stats returns the core's counters.
func (c *Core) Stats() CoreStats {
	s := c.stats
	s.TombstonesEvicted, s.EarlyAbortsForgotten = uint64(c.reg.evicted), uint64(c.reg.forgotten)
	return s
}

// Status returns a room's status (known false without a live room).
func (c *Core) Status(room uint64) (Poll, bool) { return c.reg.Status(room) }

// Failure returns a failed room's first reason.
func (c *Core) Failure(room uint64) (string, bool) { return c.reg.Failure(room) }

// Sizes counts every table the core keeps.
func (c *Core) Sizes() CoreSizes {
	s := CoreSizes{Sizes: c.reg.Sizes(), Epochs: len(c.epochs)}
	if p := c.prefillCore; p != nil {
		s.Peers, s.PullHolds = len(p.peers), len(p.pulls)
		for _, dp := range p.peers {
			s.InUse += len(dp.inUse)
		}
	}
	if d := c.decodeCore; d != nil {
		s.Targets, s.Holds, s.Offers, s.OfferChecks = len(d.targets), len(d.holds), len(d.offers), len(d.offerChecks)
		for _, tg := range d.targets {
			s.OwedAborts += len(tg.owed)
		}
	}
	return s
}

// CoreSizes counts the core's tables.
type CoreSizes struct {
	Sizes
	Peers, Targets, Holds int
	// Offers (decode, pull) counts the prefill processes' pull offers
	// accepted (bounded by the deployment, as peers and targets are).
	Offers int
	// OfferChecks (decode, pull) counts the offers whose agent is being
	// loaded (challenged or proven) by the shell right now.
	OfferChecks int
	OwedAborts  int // ABORTs not yet acknowledged, over every target
	Epochs      int // peer epochs remembered (≤ MaxEpochs)
	// InUse (prefill) counts the decode destinations (pages, aux and state
	// items) rooms may still write, over every registration.
	InUse int
	// PullHolds (prefill) counts pull rooms whose published pages are not
	// released yet.
	PullHolds int
	// Waiters counts the shell's waiters' channels (set by the shell: the
	// core makes none), each woken by an EffectWake.
	Waiters int
}

// Total is the number of room-bound entries (peers and targets are
// bounded by the deployment, not by rooms).
func (s CoreSizes) Total() int {
	return s.Sizes.Total() + s.Holds + s.OwedAborts + s.InUse + s.PullHolds + s.Waiters
}

// Wake names what an EffectWake releases.
type Wake uint8

const (
	// WakeDone: the room is terminal (or gone).
	WakeDone Wake = 1 + iota
	// WakeReady: the room can move data (WaitingForInput or later), or is
	// terminal.
	WakeReady
	// WakeHold (decode): the room's destination pages may be reused.
	WakeHold
	// WakePull (prefill): the pages the room published for pull may be
	// reused.
	WakePull
)

// pending says whether a live room's done and ready waiters are still to
// be woken.
func (c *Core) pending(room uint64) (done, ready, ok bool) {
	rm, ok := c.reg.rooms[room]
	if !ok {
		return false, false, false
	}
	return !rm.doneWoken, !rm.readyWoken, true
}

// tickAll enforces every deadline passed at now: registry deadlines (STATUS
// failed to the decode ranks of failed prefill rooms, ABORT to the prefill
// ranks of failed decode rooms), owed ABORT_ACKs of undrained rooms,
// decode quarantine deadlines and REGISTER retries.
func (c *Core) tickAll(now time.Time) {
	for _, e := range c.reg.Sweep(now) {
		if e.DrainOnly {
			continue // failed earlier; its owed ABORT_ACKs went out as drained false
		}
		c.stats.Deadlines[e.Deadline]++
		c.role.expired(e)
	}
	c.role.tick(now)
	c.unwatchIdle()
}

// closeAll closes the rank (Close): it fails every live room with reason,
// drops every pending request, and refuses rooms and requests from then
// on (Registry.closed); the shell then stops.
func (c *Core) closeAll(now time.Time, reason string) {
	if c.reg.closed == "" {
		c.reg.closed = reason
	}
	for _, id := range slices.Sorted(maps.Keys(c.reg.rooms)) {
		if !c.reg.rooms[id].status.Terminal() {
			c.failRoom(id, reason)
		}
	}
	if p := c.prefillCore; p != nil {
		// Requests waiting for a sender that will never be created: their
		// decode ranks are told now (each id becomes an AbortedEarly
		// tombstone), not when the rank's heartbeats stop.
		for _, id := range slices.Sorted(maps.Keys(c.reg.pending)) {
			res := c.count(EventAbort, c.reg.Abort(id, reason, nil))
			p.statusFailed(id, res.Peers, CodeAborted, fmt.Sprintf("room %d: prefill rank closed: %s", id, reason), "")
			c.reg.sendAcks(id, ackPeers(nil, res.Peers), true) // nothing was written for them (no sender)
		}
		// The decode ranks of every failed room are owed their drained
		// ABORT_ACKs now, asked or not (docs/PROTOCOL.md "A rank that
		// closes").
		c.reg.OweClosed()
		// Last, after every STATUS above on the same link: each bound
		// decode rank learns that nothing it sends here from now on is
		// taken, and which of its REQUESTs were.
		p.closedNotices(reason)
	}
}

// failRoom fails a live room on this rank and tells its peers.
func (c *base) failRoom(room uint64, reason string) Result {
	res := c.count(EventUpdate, c.reg.Update(room, Failed, reason))
	if res.Outcome != Applied {
		return res
	}
	c.role.failed(room, reason, res)
	return res
}

// receive steps one control message from a peer into the core: every
// message type but PING (the transport answers it; anyone can send one). A
// REGISTER is checked here (the epoch, then CheckRegister) and, when it
// passes, handed to the shell to load as EffectLoadMetadata; its bind is
// a later step (Registered or RegisterRefused). A PONG only tells the core
// its sender's epoch. It reports whether a REQUEST was accepted or a
// REGISTER passed on to be loaded.
//
// The epoch check sits here, once, before any role code runs (as
// etcd-io/raft checks the term at the top of Step): a new epoch of a peer
// it has heard from means that peer restarted, and everything bound to the
// old epoch fails first.
func (c *Core) receive(now time.Time, msg wire.Message) (accepted bool) {
	if _, ping := msg.(*wire.Ping); ping {
		return false
	}
	if !c.hear(msg.Sender()) {
		// From an epoch the peer already left: no restart back. Only a
		// decode rank's ABORT_ACK and STATUS go on — their handlers match
		// the epoch the REQUEST went to, and the old process's drained
		// ACK is what releases that room's pages.
		switch msg.(type) {
		case *wire.AbortAck, *wire.Status:
			if c.decodeCore == nil {
				return false
			}
		default:
			return false
		}
	}
	if p := c.prefillCore; p != nil {
		switch m := msg.(type) {
		case *wire.Request:
			return p.onRequest(m)
		case *wire.Abort:
			p.onAbort(m)
		case *wire.Register:
			// The epoch check ran above, before the peer's metadata is
			// loaded: a restarted decode rank's old registration and rooms
			// are gone before anything of the new one is known, so no
			// write of the old process passes the gate meanwhile. Then
			// CheckRegister; the load is the shell's (EffectLoadMetadata),
			// the bind another step (Registered or RegisterRefused).
			return p.checkToLoad(now, m)
		case *wire.Renew:
			p.onRenew(m)
		case *wire.ReadDone:
			p.onReadDone(m)
		case *wire.Pong:
		default: // the rest go to decode ranks
			c.stats.Refused++
		}
		return false
	}
	d := c.decodeCore
	if tg := d.targetAt(msg.Sender().Endpoint); tg != nil {
		d.heardFrom(tg, now)
	}
	switch m := msg.(type) {
	case *wire.AbortAck:
		d.onAbortAck(m)
	case *wire.RegisterAck:
		if m.OK && d.pullsOffers() {
			d.onOfferAck(m) // its offer loaded and proven first
			break
		}
		d.onRegisterAck(m)
	case *wire.Status:
		d.onStatus(m)
	case *wire.Pages:
		d.onPages(m)
	case *wire.Pong:
	default:
		// ABORT goes decode → prefill only: on a decode rank it could only
		// tombstone a room id a later receiver needs. REQUEST and
		// REGISTER are prefill's too.
		c.stats.Refused++
	}
	return false
}

// AgentOwner returns the decode rank (peer key, no epoch) registered here
// with the agent name, or "" (and always on a decode rank).
func (c *Core) AgentOwner(name string) string {
	if c.prefillCore == nil {
		return ""
	}
	return c.prefillCore.agentOwner(name)
}

// Registered reports whether a prefill rank holds a registration of the
// decode rank peer (From.Peer()) from epoch.
func (c *Core) Registered(peer string, epoch uint64) bool {
	if c.prefillCore == nil {
		return false
	}
	p := c.prefillCore.peers[peer]
	return p != nil && p.from.Epoch == epoch
}

// reportDown reports a peer that heartbeats declared dead (restarted false)
// or that showed a new epoch (restarted true, from names it).
func (c *Core) reportDown(now time.Time, endpoint string, from wire.From, restarted bool, reason string) {
	c.role.peerDown(endpoint, from, restarted, fmt.Sprintf("%s: %s", reason, endpoint))
}

// Report is a decode room's load report: what landed of it, and why it
// failed. ok is false until nothing more can land (the room is terminal
// and its pages released), for a cleared room and on a prefill core.
func (c *Core) Report(room uint64) (LoadReport, bool) {
	if c.decodeCore == nil {
		return LoadReport{}, false
	}
	return c.decodeCore.loadReport(room)
}

// Hold says whether a decode room still holds its destination pages
// (false on a prefill rank): their release is an EffectWake of WakeHold.
func (c *Core) Hold(room uint64) bool {
	if c.decodeCore == nil {
		return false
	}
	_, ok := c.decodeCore.holds[room]
	return ok
}

// CheckRegister validates a REGISTER against this rank (compat, role and
// layout: regions that share memory are refused, and counted) without
// touching any other state: only a prefill rank takes one. Received runs
// it on every REGISTER; it is exported for tools and tests that check a
// REGISTER without stepping one.
func (c *Core) CheckRegister(msg *wire.Register) (PeerPlan, error) {
	if c.prefillCore == nil {
		return PeerPlan{}, fmt.Errorf("this rank is a decode rank")
	}
	return c.prefillCore.checkRegister(msg)
}

// refuseRegister answers a REGISTER with ok false (prefill).
func (c *Core) refuseRegister(now time.Time, from wire.From, reason string) {
	if c.prefillCore == nil {
		c.stats.Refused++
		return
	}
	c.prefillCore.registerRefused(now, from, reason)
}

// malformedRequest answers a REQUEST the codec refused but that still named
// its room and sender: STATUS failed (code rejected), so the decode rank
// does not wait for a deadline. Only a prefill rank answers.
func (c *Core) malformedRequest(now time.Time, room uint64, endpoint, reason string) {
	if c.prefillCore == nil || endpoint == "" {
		return
	}
	c.prefillCore.statusTo(wire.Peer{Endpoint: endpoint}, room, CodeRejected, "malformed REQUEST: "+reason)
}

// hear is the epoch check: it records from's epoch and, when a known peer
// shows a new one, handles the restart (everything bound to the old epoch
// fails) before the message that showed it. A message from an epoch the
// peer already left (a late one of the old process) is stale: hear
// reports false and the caller drops it (counted as StaleEpoch).
func (c *base) hear(from wire.From) (current bool) {
	key := from.Peer()
	c.heardSeq++
	if h, ok := c.epochs[key]; ok {
		h.seq = c.heardSeq
		if h.epoch == from.Epoch {
			return true
		}
		if slices.Contains(h.retired, from.Epoch) || from.Epoch < h.epoch {
			// An epoch the peer left, or one older than the process we
			// hear now (epochs grow with each start: a delayed message
			// from a process that died before we heard of it must not
			// retire the live one).
			c.stats.StaleEpoch++
			return false
		}
		h.retired = append(h.retired, h.epoch)
		if len(h.retired) > maxRetired {
			h.retired = h.retired[1:]
		}
		h.epoch = from.Epoch
		c.stats.PeersRestarted++
		c.role.peerDown(from.Endpoint, from, true, fmt.Sprintf("%s: %s", wire.ReasonPeerRestarted, from.Endpoint))
		return true
	}
	c.epochs[key] = &heardPeer{epoch: from.Epoch, seq: c.heardSeq}
	if len(c.epochs) > c.cfg.MaxEpochs {
		oldest, min := "", uint64(0)
		for k, h := range c.epochs {
			if oldest == "" || h.seq < min {
				oldest, min = k, h.seq
			}
		}
		delete(c.epochs, oldest)
	}
	return true
}

// errCode maps a registry refusal to a STATUS code.
func errCode(err error) string {
	switch {
	case errors.Is(err, ErrRoomCleared):
		return CodeCleared
	case errors.Is(err, ErrRoomAborted), errors.Is(err, ErrRoomFailed):
		return CodeAborted
	default:
		return CodeRejected
	}
}
