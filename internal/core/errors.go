package core

import (
	"errors"
	"fmt"
)

// Sentinel errors. Results wrap them with the room id (and peer where one is
// involved); branch on them with errors.Is.
var (
	// ErrRoomInUse: a live sender or receiver already exists for the room.
	ErrRoomInUse = errors.New("kvmanager: room in use")
	// ErrRoomCleared: the room id was cleared less than the tombstone TTL
	// ago. Room ids must be unique within the TTL; seeing this on Create
	// usually means a router handed out a duplicate id.
	ErrRoomCleared = errors.New("kvmanager: room cleared within the tombstone TTL")
	// ErrRoomAborted: the room was aborted before it was created.
	ErrRoomAborted = errors.New("kvmanager: room aborted")
	// ErrRoomFailed: the room is Failed; the wrapped text has the reason.
	ErrRoomFailed = errors.New("kvmanager: room failed")
	// ErrRoomDone: the room has already succeeded.
	ErrRoomDone = errors.New("kvmanager: room already succeeded")
	// ErrUnknownRoom: no live room, pending request or tombstone has this id.
	ErrUnknownRoom = errors.New("kvmanager: unknown room")
	// ErrWrongRole: the event does not apply to the room's role (a peer
	// request on a decode room, a posted chunk on a decode room).
	ErrWrongRole = errors.New("kvmanager: event does not apply to the room's role")
	// ErrUnknownInput: Core.Step was given an input it has no case for
	// (nil, or a type added without one).
	ErrUnknownInput = errors.New("kvmanager: input the core does not handle")
	// ErrInvalidRequest: a peer request without a peer name or with
	// required < 1.
	ErrInvalidRequest = errors.New("kvmanager: invalid peer request")
	// ErrInvalidSpec: a RequestSpec names a destination page, or an item of
	// one state region, more than once.
	ErrInvalidSpec = errors.New("kvmanager: invalid request spec")
	// ErrDuplicateRequest: the same peer requested the same room twice.
	ErrDuplicateRequest = errors.New("kvmanager: duplicate peer request")
	// ErrRequiredMismatch: peers disagree on how many requests the room needs.
	ErrRequiredMismatch = errors.New("kvmanager: peers disagree on required requests")
	// ErrTooManyRequests: more distinct peers requested the room than it
	// requires.
	ErrTooManyRequests = errors.New("kvmanager: more peer requests than required")
	// ErrTooManyPending: the bound on rooms with pending requests is reached.
	ErrTooManyPending = errors.New("kvmanager: too many rooms with pending requests")
	// ErrNotReady: the event needs a later status (a chunk sent before
	// InitSender, or past MaxEarlyChunks before every REQUEST came; a
	// chunk posted before the room is WaitingForInput; Success before any
	// data could move).
	ErrNotReady = errors.New("kvmanager: room not ready for this event")
	// ErrNoWriteInFlight: a write completion without a matching posted write.
	ErrNoWriteInFlight = errors.New("kvmanager: no write in flight")
	// ErrInvalidEvent: an event with an unknown kind, role or status.
	ErrInvalidEvent = errors.New("kvmanager: invalid event")
	// ErrBadChunk: a chunk the room cannot take — ErrLayers,
	// ErrChunkAlign, ErrAfterLast wrap it (kvmanager exports it alone: a
	// caller's send sequence is wrong, whichever of the three).
	ErrBadChunk = errors.New("kvmanager: chunk refused")
	// ErrLayers: a layer-wise send out of order (a chunk's layers go in
	// consecutive ranges from 0 to the rank's layer count) or naming
	// another chunk than the one whose layers are being sent.
	ErrLayers = fmt.Errorf("%w: layer range out of order", ErrBadChunk)
	// ErrChunkAlign: a chunk other than the room's last ends inside a page
	// of a decode rank whose pages hold more tokens than this rank's
	// (docs/PROTOCOL.md "Pages of different sizes"); send whole decode
	// pages per chunk.
	ErrChunkAlign = fmt.Errorf("%w: chunk ends inside a decode page", ErrBadChunk)
	// ErrAfterLast: a chunk sent after the room's last chunk (its final
	// layer range included); the room's final write may already have
	// freed the decode rank's pages.
	ErrAfterLast = fmt.Errorf("%w: chunk after the room's last", ErrBadChunk)
	// ErrRankClosed: the rank was closed (Step Close): it creates no room
	// and takes no REQUEST after it. kvmanager exports it as
	// ErrManagerClosed.
	ErrRankClosed = errors.New("kvmanager: manager closed")
	// ErrIncompatible: a prefill rank refused this rank's registration
	// (REGISTER_ACK ok false: compat, layout or ownership).
	ErrIncompatible = errors.New("kvmanager: peer refused registration")
)
