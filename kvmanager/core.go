package kvmanager

// What an engine sees of the protocol core (internal/core): room
// statuses, the request spec, load reports, results, the counters and
// the sentinel errors. The core itself, its inputs and effects stay
// internal: a Prefill or Decode steps it.

import "github.com/kvbridge/kvbridge/internal/core"

// Landed is a rectangle of a room's KV cache that landed whole: the
// positions [First, First+Count) of the RequestSpec's DstPages (the pages
// after its Prefix), layers [LayerLo, LayerHi) in this rank's numbering.
// From one source it holds that source's heads of those layers.
type Landed = core.Landed

// LoadReport says what of a decode room's KV cache landed, so that an
// engine whose load failed can recompute only the rest (vLLM's
// kv_load_failure_policy). It is given once nothing else can land in the
// room's pages: after Success, or after a failure once every prefill rank
// that got the room's REQUEST answered a drained ABORT_ACK or the
// quarantine released the pages. A notification that arrives later still
// (it was in flight) is recorded too, so a later report may list more,
// never less.
type LoadReport = core.LoadReport

// Outcome is what an event did to the registry. Every event returns one, so
// logs and metrics can say what happened to each.
type Outcome = core.Outcome

// Poll is a room's transfer status as seen by one rank. The order matches
// SGLang's KVPoll so that the minimum over ranks is the room's overall status:
// a single failed rank fails the room, and the room has succeeded only when
// every rank has. The zero value is invalid and is never stored.
type Poll = core.Poll

// RegistryConfig holds the registry's deadlines and its clock.
type RegistryConfig = core.RegistryConfig

// RequestSpec is what a decode rank asks of its prefill ranks for a room.
type RequestSpec = core.RequestSpec

// Result is what an event did.
type Result = core.Result

// Role says which side of a transfer a room belongs to.
type Role = core.Role

// SourceReport is what one prefill rank of the room (Source: its index
// in the room, the uid of its notifications) delivered.
type SourceReport = core.SourceReport

// Target names one prefill rank a decode room pulls from: the bootstrap
// service that lists its instance, and its DP group, TP rank (Rank) and PP
// stage there.
type Target = core.Target

// Applied: the event changed the room as asked.
const Applied = core.Applied

// Bootstrapping: the room exists but is not ready to move data (prefill:
// waiting for the sender's Init and the decode ranks' requests; decode:
// the request has not been sent).
const Bootstrapping = core.Bootstrapping

const CodeAborted = core.CodeAborted

const CodeCleared = core.CodeCleared

const CodeFailed = core.CodeFailed

// CodeNotDelivered: a notification named bytes that did not land (the
// decode rank's write check; docs/PROTOCOL.md "Writes checked before they
// count").
const CodeNotDelivered = core.CodeNotDelivered

const CodeNotRegistered = core.CodeNotRegistered

const CodeOutOfRange = core.CodeOutOfRange

const CodePeerRestarted = core.CodePeerRestarted

// CodePeerUnreachable: heartbeats declared the receiving decode rank
// dead here; it is sent in case it was only paused.
const CodePeerUnreachable = core.CodePeerUnreachable

// CodeRefused (ABORT): the decode rank refused the room before asking
// for it (an unsupported mapping, another model).
const CodeRefused = core.CodeRefused

const CodeRejected = core.CodeRejected

// Failed is terminal: the room will not complete. The registry keeps the
// first reason.
const Failed = core.Failed

// IgnoredCleared: the room was cleared; the late event changed nothing.
const IgnoredCleared = core.IgnoredCleared

// IgnoredStale: the event asked for a status the room has already
// reached or passed (non-terminal statuses never go backwards).
const IgnoredStale = core.IgnoredStale

// IgnoredTerminal: the room is already Failed or Success (or was aborted
// before it existed); the event changed nothing.
const IgnoredTerminal = core.IgnoredTerminal

// Rejected: the event is invalid here; the result's Err says why.
const Rejected = core.Rejected

// RoleDecode receives the KV cache (receiver side).
const RoleDecode = core.RoleDecode

// RolePrefill owns the KV cache and writes it (sender side).
const RolePrefill = core.RolePrefill

// Success is terminal: every byte is in place.
const Success = core.Success

// Transferring: at least one chunk has been posted or has arrived.
const Transferring = core.Transferring

// WaitingForInput: prefill has every request and is initialised, so it
// can post chunks; decode has sent its request and waits for data.
const WaitingForInput = core.WaitingForInput

// ErrDuplicateRequest: the same peer requested the same room twice.
var ErrDuplicateRequest = core.ErrDuplicateRequest

// ErrIncompatible: a prefill rank refused this rank's registration
// (REGISTER_ACK ok false: compat, layout or ownership).
var ErrIncompatible = core.ErrIncompatible

// ErrInvalidEvent: an event with an unknown kind, role or status.
var ErrInvalidEvent = core.ErrInvalidEvent

// ErrInvalidRequest: a peer request without a peer name or with
// required < 1.
var ErrInvalidRequest = core.ErrInvalidRequest

// ErrInvalidSpec: a RequestSpec names a destination page, or an item of
// one state region, more than once.
var ErrInvalidSpec = core.ErrInvalidSpec

// ErrLayers: a layer-wise send out of order (a chunk's layers go in
// consecutive ranges from 0 to the rank's layer count) or naming
// another chunk than the one whose layers are being sent.
var ErrLayers = core.ErrLayers

// ErrChunkAlign: a chunk other than the room's last ends inside a page of
// a decode rank whose pages hold more tokens than this rank's; a chunk
// must carry whole decode pages (docs/PROTOCOL.md "Pages of different
// sizes").
var ErrChunkAlign = core.ErrChunkAlign

// ErrAfterLast: a chunk sent after the room's last chunk (its final layer
// range included); the room's final write may already have freed the
// decode rank's pages.
var ErrAfterLast = core.ErrAfterLast

// ErrNoWriteInFlight: a write completion without a matching posted write.
var ErrNoWriteInFlight = core.ErrNoWriteInFlight

// ErrNotReady: the event needs a later status (a chunk posted before the
// room is WaitingForInput, Success before any data could move).
var ErrNotReady = core.ErrNotReady

// ErrRequiredMismatch: peers disagree on how many requests the room needs.
var ErrRequiredMismatch = core.ErrRequiredMismatch

// ErrRoomAborted: the room was aborted before it was created.
var ErrRoomAborted = core.ErrRoomAborted

// ErrRoomCleared: the room id was cleared less than the tombstone TTL
// ago. Room ids must be unique within the TTL; seeing this on Create
// usually means a router handed out a duplicate id.
var ErrRoomCleared = core.ErrRoomCleared

// ErrRoomDone: the room has already succeeded.
var ErrRoomDone = core.ErrRoomDone

// ErrRoomFailed: the room is Failed; the wrapped text has the reason.
var ErrRoomFailed = core.ErrRoomFailed

// ErrRoomInUse: a live sender or receiver already exists for the room.
var ErrRoomInUse = core.ErrRoomInUse

// ErrTooManyPending: the bound on rooms with pending requests is reached.
var ErrTooManyPending = core.ErrTooManyPending

// ErrTooManyRequests: more distinct peers requested the room than it
// requires.
var ErrTooManyRequests = core.ErrTooManyRequests

// ErrUnknownInput: Core.Step was given an input it has no case for
// (nil, or a type added without one).
var ErrUnknownInput = core.ErrUnknownInput

// ErrUnknownRoom: no live room, pending request or tombstone has this id.
var ErrUnknownRoom = core.ErrUnknownRoom

// ErrWrongRole: the event does not apply to the room's role (a peer
// request on a decode room, a posted chunk on a decode room).
var ErrWrongRole = core.ErrWrongRole
