package core

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=Poll,Role,Outcome,Tombstone,Deadline,EventKind,EffectKind,Wake -output=enums_string.go

// Poll is a room's transfer status as seen by one rank. The order matches
// SGLang's KVPoll so that the minimum over ranks is the room's overall status:
// a single failed rank fails the room, and the room has succeeded only when
// every rank has. The zero value is invalid and is never stored.
type Poll uint8

const (
	// Failed is terminal: the room will not complete. The registry keeps the
	// first reason.
	Failed Poll = 1 + iota
	// Bootstrapping: the room exists but is not ready to move data (prefill:
	// waiting for the sender's Init and the decode ranks' requests; decode:
	// the request has not been sent).
	Bootstrapping
	// WaitingForInput: prefill has every request and is initialised, so it
	// can post chunks; decode has sent its request and waits for data.
	WaitingForInput
	// Transferring: at least one chunk has been posted or has arrived.
	Transferring
	// Success is terminal: every byte is in place.
	Success
)

// Valid reports whether p is one of the defined statuses.
func (p Poll) Valid() bool { return p >= Failed && p <= Success }

// Terminal reports whether p is Failed or Success.
func (p Poll) Terminal() bool { return p == Failed || p == Success }

// MinPoll reduces the statuses of several ranks to the room's status: the
// smallest one. It returns 0 (invalid) for no arguments or when any argument
// is invalid, so a caller that forgot a rank cannot read it as a status.
func MinPoll(polls ...Poll) Poll {
	if len(polls) == 0 {
		return 0
	}
	m := polls[0]
	for _, p := range polls {
		if !p.Valid() {
			return 0
		}
		if p < m {
			m = p
		}
	}
	return m
}

// Role says which side of a transfer a room belongs to.
type Role uint8

const (
	// RolePrefill owns the KV cache and writes it (sender side).
	RolePrefill Role = 1 + iota
	// RoleDecode receives the KV cache (receiver side).
	RoleDecode
)

// Outcome is what an event did to the registry. Every event returns one, so
// logs and metrics can say what happened to each.
type Outcome uint8

const (
	// Applied: the event changed the room as asked.
	Applied Outcome = 1 + iota
	// Pending: a peer request was kept for a room whose sender does not
	// exist yet.
	Pending
	// IgnoredTerminal: the room is already Failed or Success (or was aborted
	// before it existed); the event changed nothing.
	IgnoredTerminal
	// IgnoredCleared: the room was cleared; the late event changed nothing.
	IgnoredCleared
	// IgnoredStale: the event asked for a status the room has already
	// reached or passed (non-terminal statuses never go backwards).
	IgnoredStale
	// Tombstoned: the event left a tombstone for a room that does not exist
	// yet (an early abort) so that its sender starts Failed.
	Tombstoned
	// Rejected: the event is invalid here; the result's Err says why.
	Rejected
)

// Tombstone is what the registry remembers about a room id that has no live
// entry.
type Tombstone uint8

const (
	// Cleared: the room was cleared; late events are ignored and the id may
	// not be reused until the TTL passes.
	Cleared Tombstone = 1 + iota
	// AbortedEarly: an abort arrived, or pending requests expired, before the
	// room was created; the room starts Failed when it is.
	AbortedEarly
)

// Deadline names the deadline that failed a room or expired an entry.
type Deadline uint8

const (
	// DeadlineBootstrap bounds creation → WaitingForInput.
	DeadlineBootstrap Deadline = 1 + iota
	// DeadlineWaiting bounds WaitingForInput → first data.
	DeadlineWaiting
	// DeadlineStall bounds the time between two progress events while
	// Transferring.
	DeadlineStall
	// DeadlinePending bounds how long peer requests wait for a sender.
	DeadlinePending
	// DeadlineTombstone is the TTL after which a tombstone is forgotten.
	DeadlineTombstone
)
