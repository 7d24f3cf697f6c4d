package kvmanager

// What an engine sees of a room: its status, the request spec, the load
// report, what a call did, and the sentinel errors. They are defined here
// (go doc shows their fields) and carried to and from the protocol core
// (internal/core), which a Prefill or Decode steps.

import (
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
)

// Landed is a rectangle of a room's KV cache that landed whole: the
// positions [First, First+Count) of the RequestSpec's DstPages (the pages
// after its Prefix), layers [LayerLo, LayerHi) in this rank's numbering.
// From one source it holds that source's heads of those layers.
type Landed struct {
	First, Count     int
	LayerLo, LayerHi int
}

// LoadReport says what of a decode room's KV cache landed, so that an
// engine whose load failed can recompute only the rest (vLLM's
// kv_load_failure_policy). It is given once nothing else can land in the
// room's pages: after Success, or after a failure once every prefill rank
// that got the room's REQUEST answered a drained ABORT_ACK or the
// quarantine released the pages. A notification that arrives later still
// (it was in flight) is recorded too, so a later report may list more,
// never less.
type LoadReport struct {
	Status Poll
	// Code is the failure's code — the STATUS codes (CodeAborted for a
	// local abort, CodeCleared, CodePeerUnreachable, CodePeerRestarted,
	// a prefill rank's STATUS code, CodeNotDelivered for bytes a
	// notification named that did not land, CodeCorrupt for pages that
	// do not match their digest, CodeFailed for a deadline or any other
	// failure) — and Reason its text; both empty on Success.
	Code, Reason string
	Sources      []SourceReport
}

// SourceReport is what one prefill rank of the room (Source: its index
// in the room, the uid of its notifications) delivered.
type SourceReport struct {
	Source int
	Dummy  bool // it writes nothing into this rank
	// Proven: nothing more of it can land (it delivered everything, never
	// got the REQUEST, or acknowledged the abort as drained). A source
	// whose pages only the quarantine released is not proven, and its
	// Landed is empty: what its notifications said cannot be trusted to
	// be all that reached the pages.
	Proven bool
	// LayerLo, LayerHi: the layers it writes, this rank's numbering (as
	// its notifications said; both 0 when none came, or when they were of
	// the earlier revision, which tells no layers: then Whole is empty).
	LayerLo, LayerHi int
	Landed           []Landed
}

// Whole returns the positions and layers that landed from every source
// that writes into this rank: what the engine may load as is.
func (r LoadReport) Whole() []Landed { return landed(r.core().Whole()) }

// reportOf is the core's report as kvmanager's.
func reportOf(r core.LoadReport) LoadReport {
	out := LoadReport{Status: Poll(r.Status), Code: r.Code, Reason: r.Reason}
	for _, s := range r.Sources {
		out.Sources = append(out.Sources, SourceReport{Source: s.Source, Dummy: s.Dummy, Proven: s.Proven,
			LayerLo: s.LayerLo, LayerHi: s.LayerHi, Landed: landed(s.Landed)})
	}
	return out
}

// core is r as the core's report.
func (r LoadReport) core() core.LoadReport {
	out := core.LoadReport{Status: core.Poll(r.Status), Code: r.Code, Reason: r.Reason}
	for _, s := range r.Sources {
		cs := core.SourceReport{Source: s.Source, Dummy: s.Dummy, Proven: s.Proven, LayerLo: s.LayerLo, LayerHi: s.LayerHi}
		for _, l := range s.Landed {
			cs.Landed = append(cs.Landed, core.Landed(l))
		}
		out.Sources = append(out.Sources, cs)
	}
	return out
}

func landed(ls []core.Landed) []Landed {
	if ls == nil {
		return nil
	}
	out := make([]Landed, len(ls))
	for i, l := range ls {
		out[i] = Landed(l)
	}
	return out
}

// Poll is a room's transfer status as seen by one rank. The order matches
// SGLang's KVPoll so that the minimum over ranks is the room's overall
// status: a single failed rank fails the room, and the room has succeeded
// only when every rank has. The zero value is invalid and is never
// stored.
type Poll uint8

func (p Poll) String() string { return core.Poll(p).String() }

// RegistryConfig holds the deadlines and bounds of a rank's rooms
// (docs/ARCHITECTURE.md, "Defaults and configuration").
type RegistryConfig struct {
	// BootstrapTimeout bounds creation → WaitingForInput.
	BootstrapTimeout time.Duration
	// WaitingTimeout bounds WaitingForInput → first chunk (prefill) or
	// first data (decode).
	WaitingTimeout time.Duration
	// StallTimeout bounds the gap between two progress events while
	// Transferring, and how long a failed room waits for in-flight writes
	// to drain.
	StallTimeout time.Duration
	// PendingTimeout bounds how long peer requests wait for their sender.
	PendingTimeout time.Duration
	// TombstoneTTL is how long a cleared or early-aborted room id is
	// remembered. It must exceed BootstrapTimeout and PendingTimeout so an
	// early abort outlives every deadline that could still create its
	// room, and Config.QuarantineTimeout (Config.Validate checks all
	// three).
	TombstoneTTL time.Duration
	// MaxPendingRooms bounds the rooms that hold requests but no sender.
	MaxPendingRooms int
	// MaxTombstones bounds remembered room ids. Past it the oldest
	// tombstone without an owed ABORT_ACK or a write that can still land
	// is forgotten early (counted); the id is then free again sooner.
	// Those that still owe one are kept past the bound until they settle.
	// One rank's early aborts keep at most MaxTombstones/8 of them (at
	// least 1), so one rank's flood forgets its own, not the others'.
	MaxTombstones int
	// MaxPendingPerPeer bounds the rooms one peer may hold pending, so a
	// single peer cannot lock the others out of MaxPendingRooms.
	MaxPendingPerPeer int
	// MaxReasonBytes bounds a failure reason kept in a room or tombstone
	// (longer ones are cut, marked with "…").
	MaxReasonBytes int
}

// Validate checks the deadlines and bounds.
func (c RegistryConfig) validate() error { return core.RegistryConfig(c).Validate() }

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

// refusal is the error of a call the core refused (its Outcome
// Rejected), nil otherwise: a room created after an early abort starts
// Failed and is no error, as a late call on an ended room is not.
func refusal(r core.Result) error {
	if r.Outcome == core.Rejected {
		return r.Err
	}
	return nil
}

// Role says which side of a transfer a rank is.
type Role uint8

func (r Role) String() string { return core.Role(r).String() }

// Target names one prefill rank a decode room pulls from: the bootstrap
// service that lists its instance, and its DP group, TP rank (Rank) and PP
// stage there.
type Target struct {
	Bootstrap string
	Rank      int // TP rank
	DP, PP    int
}

// Bootstrapping: the room exists but is not ready to move data (prefill:
// waiting for the sender's Init and the decode ranks' requests; decode:
// the request has not been sent).
const Bootstrapping = Poll(core.Bootstrapping)

// CodeAborted: the room was aborted on this rank (Manager.Abort, or a handle's Abort).
const CodeAborted = "aborted"

// CodeCleared: the room was cleared before it ended.
const CodeCleared = "cleared"

// CodeFailed: a deadline or any other failure without a code of its own.
const CodeFailed = "failed"

// CodeNotDelivered: a notification named bytes that did not land (the
// decode rank's write check; docs/PROTOCOL.md "Writes checked before they
// count").
const CodeNotDelivered = "not_delivered"

// CodeCorrupt: a room that asked for a digest got pages whose bytes do
// not match the prefill rank's digest of them (docs/PROTOCOL.md "Digest").
const CodeCorrupt = core.CodeCorrupt

// CodeNotRegistered (STATUS): the prefill rank had no registration of
// this decode rank.
const CodeNotRegistered = "not_registered"

// CodeOutOfRange (STATUS): the REQUEST named pages or items outside the
// registered memory.
const CodeOutOfRange = "out_of_range"

// CodePeerRestarted: the peer process restarted (a new epoch) while the
// room was in flight.
const CodePeerRestarted = "peer_restarted"

// CodePeerUnreachable: heartbeats declared the receiving decode rank
// dead here; it is sent in case it was only paused.
const CodePeerUnreachable = "peer_unreachable"

// CodeRefused (ABORT): the decode rank refused the room before asking
// for it (an unsupported mapping, another model).
const CodeRefused = "refused"

// CodeRejected (STATUS): the prefill rank refused the REQUEST.
const CodeRejected = "rejected"

// Failed is terminal: the room will not complete. The registry keeps the
// first reason.
const Failed = Poll(core.Failed)

// MinPoll reduces the statuses of several ranks to the room's status: the
// smallest one. It returns 0 (invalid) for no arguments or when any
// argument is invalid, so a caller that forgot a rank cannot read it as a
// status.
func MinPoll(polls ...Poll) Poll { return Poll(core.MinPoll(corePolls(polls)...)) }

// RoleDecode receives the KV cache (receiver side).
const RoleDecode = Role(core.RoleDecode)

// RolePrefill owns the KV cache and writes it (sender side).
const RolePrefill = Role(core.RolePrefill)

// Success is terminal: every byte is in place.
const Success = Poll(core.Success)

// Transferring: at least one chunk has been posted or has arrived.
const Transferring = Poll(core.Transferring)

// WaitingForInput: prefill has every request and is initialised, so it
// can post chunks; decode has sent its request and waits for data.
const WaitingForInput = Poll(core.WaitingForInput)

// ErrIncompatible: a prefill rank refused this rank's registration
// (REGISTER_ACK ok false: compat, layout or ownership).
var ErrIncompatible = core.ErrIncompatible

// ErrInvalidSpec: a RequestSpec names a destination page, or an item of
// one state region, more than once.
var ErrInvalidSpec = core.ErrInvalidSpec

// ErrBadChunk: a chunk (or layer range) the room cannot take, the
// caller's send sequence being wrong: a layer range out of order (a
// chunk's ranges go from 0 to Layers() in order, each naming the same
// pages), a chunk other than the last ending inside a page of a decode
// rank whose pages hold more tokens (send whole decode pages per chunk),
// or a chunk after the room's last (its final write may already have
// freed the decode rank's pages). The room is left as it was; the error's
// text says which.
var ErrBadChunk = core.ErrBadChunk

// ErrNotReady: the event needs a later status (a chunk sent before the
// sender's Init, or past 1,024 chunks handed over before every REQUEST
// came; Success before any data could move).
var ErrNotReady = core.ErrNotReady

// ErrRoomAborted: the room was aborted before it was created.
var ErrRoomAborted = core.ErrRoomAborted

// ErrRoomCleared: the room id was cleared less than the tombstone TTL
// ago. Room ids must be unique within the TTL; seeing this on Create
// usually means a router handed out a duplicate id.
var ErrRoomCleared = core.ErrRoomCleared

// ErrRoomFailed: the room is Failed; the wrapped text has the reason.
var ErrRoomFailed = core.ErrRoomFailed

// ErrRoomInUse: a live sender or receiver already exists for the room.
var ErrRoomInUse = core.ErrRoomInUse

// ErrUnknownRoom: no live room, pending request or tombstone has this id.
var ErrUnknownRoom = core.ErrUnknownRoom
