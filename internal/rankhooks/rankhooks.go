// Package rankhooks hands kvbridge's own tests and benchmarks the hooks of
// a rank's shell that no engine or operator needs (issue 50: test hooks
// out of the public Config): the shell's clock, a tap on the control
// messages as they come off the wire, the points of a room's life a
// latency breakdown reads (an operator has kvbridge_room_phase_seconds),
// a shorter bound on the ownership challenges for tests that wait
// them out, and a drop of received messages.
// kvmanager.Config keeps them in an unexported field; kvmanager's init
// sets Set, which gives a Config its hooks.
package rankhooks

import "time"

// Hooks are a rank's test hooks; a nil one is unused (Now: time.Now).
type Hooks struct {
	// Now is the clock of the shell (steps and sweeps).
	Now func() time.Time
	// ControlTap sees every control message as it came off the wire,
	// before any check (the control loop's tap). It runs on the receive
	// goroutine and must not keep or modify frames: the slice is refilled
	// for the next message (copy what you keep).
	ControlTap func(frames [][]byte)
	// Trace is called at points of a room's life (Event). It runs on hot
	// paths and must be fast.
	Trace func(room uint64, event Event, at time.Time)
	// ChallengeTimeout, when positive, replaces the 5 s that bound an
	// agent challenge's echo (prefill), an offer challenge's (decode, pull),
	// the read of a proof's slots, and the progress kept for them (a test
	// whose forger never echoes waits it out once per forgery).
	ChallengeTimeout time.Duration
	// Drop, when it returns true, drops a control message (a
	// wire.Message: this package sits below the codec) that passed the
	// control loop's checks before the shell steps it (a test stands in
	// for a message that is never read: one a closing rank's process
	// exits before reading). It runs on the receive goroutine.
	Drop func(msg any) bool
}

// Event names a traced point of a room's life.
type Event uint8

// The traced points.
const (
	Request   Event = 1 + iota // prefill: REQUEST accepted
	FirstPost                  // prefill: the room's first write posted
	LastNotif                  // decode: the final notification arrived
	Success                    // decode: Success applied
	// Landed: decode: a notification of the room's arrived, its bytes
	// landed (the room's first is its first bytes landed).
	Landed
	// Submitted: prefill: a chunk's writes handed to the transfer pool's
	// queue; Taken: the pool's worker took them off it. (REQUEST → first
	// post, broken down: the benchmarks read each room's first.)
	Submitted
	Taken
	// Woken: prefill: the room's ready waiters released (WaitReady
	// returns once its goroutine runs): REQUEST → Woken is kvbridge's
	// part of an application's reaction, Woken → its Send the Go
	// scheduler's and the application's.
	Woken
)

// Set gives cfg, a *kvmanager.Config, the hooks h (replacing any it had).
// kvmanager's init sets it: the field is kvmanager's own.
var Set func(cfg any, h Hooks)
