package control

import (
	"crypto/rand"
	"encoding/binary"
	"time"
)

// NewEpoch is a process's epoch: its start time in milliseconds in the
// high 48 bits and 16 random bits below (odd, never 0). Epochs of one rank
// grow with each start, so a receiver tells a late message from a process
// that died (an older epoch, dropped as stale) from a restart (a newer
// one) even when it never heard from the process in between. The ordering
// assumes a restarted process's clock is not behind its predecessor's by
// more than the time the restart took; two starts within one millisecond
// are told apart only by the random bits.
func NewEpoch() uint64 {
	var b [2]byte
	_, _ = rand.Read(b[:])
	ms := uint64(time.Now().UnixMilli())
	return ms<<16 | uint64(binary.LittleEndian.Uint16(b[:])) | 1
}
