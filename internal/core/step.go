package core

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// Input is one input of a rank's core, taken by Core.Step: a local call,
// a received message, a data-plane event, a discovery answer, a fault
// report or time. Each is one of the types below.
type Input interface{ input() }

// Local calls of a prefill rank.
type (
	// CreateSender creates the prefill side of Room.
	CreateSender struct{ Room uint64 }
	// InitSender marks the sender initialised.
	InitSender struct{ Room uint64 }
	// SendChunk hands a chunk of source pages (the room's next ones) to
	// the transfer: one write per decode rank; Last carries aux and state.
	// Layers (zero: all) sends only those layers of the chunk: a chunk is
	// sent by consecutive ranges from 0 to the rank's layer count, each
	// naming the same pages, Last and AuxIndex (the final range's State is
	// written); the chunk's aux and
	// state follow its final range. Ready, if set, gates the posts.
	SendChunk struct {
		Room     uint64
		Pages    []uint32
		Last     bool
		AuxIndex int
		State    [][]uint32
		Layers   kvlayout.Layers
		Ready    kvlayout.Ready
	}
	// AbortSender fails the room from this side.
	AbortSender struct {
		Room   uint64
		Reason string
	}
	// ClearSender forgets the room.
	ClearSender struct{ Room uint64 }
)

// Local calls of a decode rank.
type (
	// CreateReceiver creates the decode side of Room: Links from the rank
	// mapping, or (Links nil) one full link to each of Targets.
	CreateReceiver struct {
		Room    uint64
		Targets []Target
		Links   []Link
	}
	// InitReceiver sends the room's REQUEST to its prefill ranks.
	InitReceiver struct {
		Room uint64
		Spec RequestSpec
	}
	// AbortReceiver fails the room from this side.
	AbortReceiver struct {
		Room   uint64
		Reason string
	}
	// ClearReceiver forgets the room (its pages stay quarantined).
	ClearReceiver struct{ Room uint64 }
	// RefuseRoom tells Targets of a room refused before it was created.
	RefuseRoom struct {
		Room    uint64
		Targets []Target
		Reason  string
	}
)

// Received messages.
type (
	// Received is a control message from a peer: REQUEST, ABORT,
	// ABORT_ACK, REGISTER_ACK, STATUS or PONG (the epoch check runs first;
	// a message of an epoch the peer already left is dropped). A REGISTER
	// goes here first too, for the epoch check alone: OK says the shell
	// may validate it, load its metadata and step Registered.
	Received struct{ Msg wire.Message }
	// Registered binds a REGISTER that passed CheckRegister and whose
	// metadata the engine loaded (prefill).
	Registered struct {
		From   wire.From
		Remote string // the engine's name for the peer's agent
		Plan   PeerPlan
	}
	// RegisterRefused answers a REGISTER with ok false.
	RegisterRefused struct {
		From   wire.From
		Reason string
		// NotOwner: the memory the REGISTER described is not proven the
		// registering process's (counted as layout refusal not_owner).
		NotOwner bool
	}
	// MalformedRequest is a REQUEST the codec refused that named its room
	// and sender.
	MalformedRequest struct {
		Room     uint64
		Endpoint string
		Reason   string
	}
)

// Data plane (prefill: writes; decode: notifications).
type (
	// Posting is the gate right before a write of Room is posted; the
	// output's OK says whether it may be.
	Posting struct {
		Room  uint64
		Write *kvlayout.Write
	}
	// WriteDone reports a write's completion (Err nil) or failure;
	// Quiesced says a failed write can no longer land.
	WriteDone struct {
		Room     uint64
		Write    *kvlayout.Write
		Err      error
		Quiesced bool
	}
	// Notified is a data-plane notification: chunk Chunk of Total (0
	// except on the last) or the aux item of source UID.
	Notified struct {
		Room         uint64
		UID          int
		Chunk, Total int
		Aux          bool
		// Off, N: the positions [Off, Off+N) of the REQUEST's dst_pages
		// the write filled; Lo, Hi: its layers, of the source's layers
		// [SpanLo, SpanHi), in this rank's numbering. Hi 0: a whole chunk
		// of an earlier revision's notification (positions not told).
		Off, N, Lo, Hi, SpanLo, SpanHi int
		// Undelivered (set by the shell's write check, docs/PROTOCOL.md
		// "Writes checked before they count"): what the notification
		// names did not all land — a piece of its pages still ends with
		// the canary planted before the REQUEST went out. The room fails
		// (CodeNotDelivered); the notification counts for nothing.
		Undelivered string
		// Digests (a write whose REQUEST asked for a digest, parsed from
		// the notification; nil when it carries none): the CRC-32C of
		// each of the N positions' pages, and LastUnits how many units of
		// the last it filled (docs/PROTOCOL.md "Digest").
		Digests   []uint32
		LastUnits int
		// Corrupt (set by the shell's digest check): what of the
		// notification's pages does not match its digest, or why it could
		// not be checked for a room that asked for one. The room fails
		// (CodeCorrupt); the notification counts for nothing.
		Corrupt string
		// Unsummed (set by the shell's digest check): the decode rank
		// could not sum its own pieces of the notification's pages (its
		// CUDA driver failed, say) — its own failure, not the prefill
		// rank's bytes. The room fails (CodeFailed, not CodeCorrupt);
		// the notification counts for nothing.
		Unsummed string
		// Checked (set by the shell's digest check): every page the
		// notification names was summed and matched its digest. A room
		// that asked for a digest records a notification of pages as
		// landed only when it is (a failed room's late notifications,
		// which the shell does not check, are not vouched for in its load
		// report).
		Checked bool
	}
	// Challenged is an agent challenge's notification (ParseChallenge).
	// On a decode rank: a prefill rank got a REGISTER whose blob names
	// this rank's agent and asks the registering identity For to echo
	// Nonce. On a prefill rank: a decode rank got an offer naming this
	// rank's agent and asks the offering identity For to echo Nonce.
	Challenged struct {
		For   string
		Nonce []byte
		// EndpointTag names the challenger (EndpointTag): a prefill rank's
		// control endpoint, a decode rank's identity. Its echo goes there.
		EndpointTag string
	}
	// Bound (prefill) tells the core the control endpoint its rank's
	// loop bound (named in its challenges, so a decode rank answers
	// the one that asked).
	Bound struct{ Endpoint string }
)

// Discovery, faults and time.
type (
	// Resolved says where a prefill target lives.
	Resolved struct {
		Target              Target
		Endpoint, ServerKey string
		// Cert (raw bytes) and Epoch are the record's identity certificate
		// and process, when it has them: the first messages are addressed
		// to them.
		Cert  string
		Epoch uint64
	}
	// ResolveFailed says a lookup of Target failed.
	ResolveFailed struct {
		Target Target
		Err    error
		// Unknown: the bootstrap service has no record of the rank (the
		// instance changed shape, or went away): its topology is dropped.
		Unknown bool
	}
	// TargetChanged is a discovery watch's news of a prefill rank: its
	// record vanished (Gone) or names another endpoint or epoch.
	TargetChanged struct {
		Target              Target
		Endpoint, ServerKey string
		Cert                string // the record's identity certificate (raw), if any
		Epoch               uint64
		Gone                bool
	}
	// PeerUnreachable: heartbeats declared the peer at Endpoint dead.
	PeerUnreachable struct {
		Endpoint string
		Reason   string
	}
	// Fail fails a live room for a reason the shell found (its writes
	// could not be handed to the transfer pool: the rank is closing); the
	// room's peers are told as for any failure.
	Fail struct {
		Room   uint64
		Reason string
	}
	// Tick enforces every deadline passed at the step's time.
	Tick struct{}
	// Close fails every live room with Reason and drops every pending
	// request (telling its decode ranks); from then on the rank creates
	// no room and takes no REQUEST (ErrRankClosed). The shell then stops.
	Close struct{ Reason string }
	// AgentClosed: the rank's engine agent is closed, so nothing reads
	// its memory any more: a prefill rank releases every pull room's
	// published pages (forced, counted), waking their waiters.
	AgentClosed struct{}
)

func (CreateSender) input()     {}
func (InitSender) input()       {}
func (SendChunk) input()        {}
func (AbortSender) input()      {}
func (ClearSender) input()      {}
func (CreateReceiver) input()   {}
func (InitReceiver) input()     {}
func (AbortReceiver) input()    {}
func (ClearReceiver) input()    {}
func (RefuseRoom) input()       {}
func (Received) input()         {}
func (Registered) input()       {}
func (RegisterRefused) input()  {}
func (MalformedRequest) input() {}
func (Posting) input()          {}
func (WriteDone) input()        {}
func (Notified) input()         {}
func (Challenged) input()       {}
func (Bound) input()            {}
func (Resolved) input()         {}
func (ResolveFailed) input()    {}
func (TargetChanged) input()    {}
func (PeerUnreachable) input()  {}
func (Tick) input()             {}
func (Close) input()            {}
func (Fail) input()             {}
func (AgentClosed) input()      {}

// Output is what a step returns besides its effects (Effects): the
// outcome of a room event, whether a message or a write was accepted, or
// the error of a refused call.
type Output struct {
	Result Result
	OK     bool // Received: a REQUEST was accepted, a REGISTER may be bound; Posting: the write may be posted
	Err    error
	// Prior is the status of the input's room (its Room field, or the
	// room a received message names) before the step; 0: the core had no
	// live room of that id, or the input names none.
	Prior Poll
	// Succeeded: the step took the room to Success; Started and Entered
	// are then its times (RoomTimes), for the shell's latency metrics.
	Succeeded bool
	Started   time.Time
	Entered   [Success + 1]time.Time
	// PeerRestarted: the step heard a peer with a new epoch.
	PeerRestarted bool
}

// roomOf is the room an input is about, if any.
func roomOf(in Input) (uint64, bool) {
	switch in := in.(type) {
	case CreateSender:
		return in.Room, true
	case InitSender:
		return in.Room, true
	case SendChunk:
		return in.Room, true
	case AbortSender:
		return in.Room, true
	case ClearSender:
		return in.Room, true
	case CreateReceiver:
		return in.Room, true
	case InitReceiver:
		return in.Room, true
	case AbortReceiver:
		return in.Room, true
	case ClearReceiver:
		return in.Room, true
	case RefuseRoom:
		return in.Room, true
	case Posting:
		return in.Room, true
	case WriteDone:
		return in.Room, true
	case Notified:
		return in.Room, true
	case Fail:
		return in.Room, true
	case Received:
		switch m := in.Msg.(type) {
		case *wire.Request:
			return m.Room, true
		case *wire.Abort:
			return m.Room, true
		case *wire.AbortAck:
			return m.Room, true
		case *wire.Status:
			return m.Room, true
		case *wire.Pages:
			return m.Room, true
		case *wire.Renew:
			return m.Room, true
		case *wire.ReadDone:
			return m.Room, true
		}
	}
	return 0, false
}

// Step takes one input at now: the core's one entry point, used by the
// shells and the simulator alike (etcd-io/raft's RawNode.Step). Its
// effects accumulate until Effects is called, in the order the core
// produced them. A role's input on the other role's core (a sender call
// on a decode rank) is refused with ErrWrongRole, and an input it has no
// case for (nil) with ErrUnknownInput; neither changes a room. The
// clock steps once, at the top: every handler runs at now.
func (c *Core) Step(now time.Time, in Input) Output {
	if in == nil {
		return unknownInput(in)
	}
	room, hasRoom := roomOf(in)
	var prior Poll
	if hasRoom {
		prior, _ = c.reg.Status(room)
	}
	restarts := c.stats.PeersRestarted
	out := c.stepInput(now, in)
	out.Prior, out.PeerRestarted = prior, c.stats.PeersRestarted > restarts
	if hasRoom && prior != Success {
		if after, _ := c.reg.Status(room); after == Success {
			out.Succeeded = true
			out.Started, out.Entered, _ = c.RoomTimes(room)
		}
	}
	return out
}

// stepInput is Step's one case per input.
func (c *Core) stepInput(now time.Time, in Input) Output {
	c.step(now) // the one clock step: every handler runs at now
	switch in := in.(type) {
	case Received:
		return Output{OK: c.receive(now, in.Msg)}
	case OfferLoaded:
		if c.decodeCore == nil {
			return wrongRole(in)
		}
		c.decodeCore.offerLoaded(in)
		return Output{}
	case OfferChallenged:
		if c.decodeCore == nil {
			return wrongRole(in)
		}
		c.decodeCore.offerChallenged(in)
		return Output{}
	case Challenged:
		if c.prefillCore != nil {
			c.prefillCore.challenged(now, in)
		} else {
			c.decodeCore.challenged(in)
		}
		return Output{}
	case Registered:
		if c.prefillCore == nil {
			return wrongRole(in)
		}
		c.prefillCore.registered(now, in.From, in.Remote, in.Plan)
		return Output{}
	case RegisterRefused:
		if c.prefillCore != nil && c.prefillCore.droppedClosed() {
			return Output{}
		}
		if in.NotOwner && c.prefillCore != nil {
			c.stats.LayoutRefused[RefusedNotOwner]++
		}
		if c.prefillCore != nil && c.hear(in.From) {
			c.prefillCore.challengeRefused(in.From)
		}
		c.refuseRegister(now, in.From, in.Reason)
		return Output{}
	case MalformedRequest:
		c.malformedRequest(now, in.Room, in.Endpoint, in.Reason)
		return Output{}
	case PeerUnreachable:
		c.reportDown(now, in.Endpoint, wire.From{}, false, in.Reason)
		return Output{}
	case Fail:
		return Output{Result: c.failRoom(in.Room, in.Reason)}
	case Tick:
		c.tickAll(now)
		return Output{}
	case Close:
		c.closeAll(now, in.Reason)
		return Output{}
	case AgentClosed:
		if p := c.prefillCore; p != nil {
			for _, id := range slices.Sorted(maps.Keys(p.pulls)) {
				p.releasePull(p.pulls[id], true)
			}
		}
		return Output{}
	}
	if p := c.prefillCore; p != nil {
		switch in := in.(type) {
		case CreateSender:
			return Output{Result: p.createSender(now, in.Room)}
		case InitSender:
			return Output{Result: p.initSender(now, in.Room)}
		case SendChunk:
			return Output{Err: p.sendChunk(now, in)}
		case AbortSender:
			return Output{Result: p.abortSender(now, in.Room, in.Reason)}
		case ClearSender:
			return Output{Result: p.clearSender(now, in.Room)}
		case Posting:
			return Output{OK: p.posting(now, in.Room, in.Write)}
		case WriteDone:
			return Output{Result: p.writeDone(now, in.Room, in.Write, in.Err, in.Quiesced)}
		case PagesReady:
			p.pagesReady(in)
			return Output{}
		case Bound:
			p.endpoint = in.Endpoint
			return Output{}
		case CreateReceiver, InitReceiver, AbortReceiver, ClearReceiver, RefuseRoom, Notified, Resolved, ResolveFailed, TargetChanged, ReadPosting, ReadDone, TopologyLearned:
			return wrongRole(in)
		}
		return unknownInput(in)
	}
	d := c.decodeCore
	switch in := in.(type) {
	case CreateReceiver:
		if in.Links == nil {
			return Output{Result: d.createReceiver(now, in.Room, in.Targets)}
		}
		return Output{Result: d.createReceiverLinks(now, in.Room, in.Links)}
	case InitReceiver:
		return Output{Result: d.initReceiver(now, in.Room, in.Spec)}
	case AbortReceiver:
		return Output{Result: d.abortReceiver(now, in.Room, in.Reason)}
	case ClearReceiver:
		return Output{Result: d.clearReceiver(now, in.Room)}
	case RefuseRoom:
		d.refuseRoom(now, in.Room, in.Targets, in.Reason)
	case Notified:
		d.notified(now, in)
	case ReadPosting:
		return Output{OK: d.readPosting(in.Room, in.Read)}
	case ReadDone:
		d.readDone(in)
	case Resolved:
		d.resolvedRecord(now, in.Target, in.Endpoint, in.ServerKey, in.Cert, in.Epoch)
	case ResolveFailed:
		if in.Unknown {
			d.forgetTopology(in.Target.Bootstrap) // the instance changed shape, or went away
		}
		d.resolveFailed(now, in.Target, in.Err)
	case TargetChanged:
		if in.Gone {
			d.forgetTopology(in.Target.Bootstrap) // the instance may come back in another shape
		}
		d.targetChangedRecord(now, in.Target, in.Endpoint, in.ServerKey, in.Cert, in.Epoch, in.Gone)
	case TopologyLearned:
		d.learnTopology(in.URL, in.Topo)
	case CreateSender, InitSender, SendChunk, AbortSender, ClearSender, Posting, WriteDone, PagesReady, Bound:
		return wrongRole(in)
	default:
		return unknownInput(in)
	}
	return Output{}
}

func unknownInput(in Input) Output {
	err := fmt.Errorf("%T: %w", in, ErrUnknownInput)
	return Output{Result: rejected(err), Err: err}
}

func wrongRole(in Input) Output {
	err := fmt.Errorf("%T on a rank of the other role: %w", in, ErrWrongRole)
	return Output{Result: rejected(err), Err: err}
}
