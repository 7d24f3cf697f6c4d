package kvmanager

import (
	"fmt"
	"unsafe"

	"github.com/kvbridge/kvbridge/internal/core"
)

// PollRooms is a batch scheduler's poll: it writes the status of rooms[i]
// into out[i] under one acquisition of the rank's lock, allocating nothing,
// so a scheduler can poll every request in flight once per iteration
// without a goroutine or a lock round-trip per room. A room with no live
// entry (unknown, cleared, or an early-aborted id: the cases where Status
// answers known false) reads 0, which is not a valid Poll; MinPoll over
// ranks then returns 0 as well. The statuses are one snapshot: no step of
// the core runs between the first room and the last.
//
// out must be at least as long as rooms (PollRooms panics otherwise,
// before it takes the lock); entries past len(rooms) are left untouched.
func (m *Manager) PollRooms(rooms []uint64, out []Poll) {
	if len(out) < len(rooms) {
		panic(fmt.Sprintf("kvmanager: PollRooms: out holds %d statuses for %d rooms", len(out), len(rooms)))
	}
	m.mu.Lock()
	m.core.PollRooms(rooms, corePolls(out))
	m.mu.Unlock()
}

// corePolls is out as the core's statuses: the same memory (Poll and
// core.Poll are both uint8 with the same values, TestPollValuesAreTheCores),
// so PollRooms allocates nothing.
func corePolls(out []Poll) []core.Poll {
	if len(out) == 0 {
		return nil
	}
	return unsafe.Slice((*core.Poll)(unsafe.Pointer(&out[0])), len(out))
}
