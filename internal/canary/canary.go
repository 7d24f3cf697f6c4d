// Package canary plants and finds 8-byte canaries in this process's own
// memory, one call to C for a whole list: the decode rank's write check
// (docs/PROTOCOL.md "Writes checked before they count") plants one at the
// end of every piece a room's writes will fill and, once a notification
// names the piece written, finds whether it is still there (Plant, Find);
// an agent's READ plants one at the end of each destination descriptor,
// keeping the bytes it replaced, and settles them once the READ is done
// (PlantSaving, Settle: docs/ENGINES.md). The addresses are in the rank's
// own registered memory (its callers compute them from its layout and
// clip them to it), which stays mapped and writable for the rank's life,
// as its engine's KV cache does.
package canary

/*
#include <stdint.h>
#include <string.h>

// (Prefetched a few ahead: the tails are in distinct pages, each a miss.)
enum { AHEAD = 16 };

static void kvb_canary_plant(const uint64_t *tails, size_t n, uint64_t v)
{
	for (size_t i = 0; i < n; i++) {
		if (i + AHEAD < n) __builtin_prefetch((const void *)(uintptr_t)tails[i + AHEAD], 1);
		memcpy((void *)(uintptr_t)tails[i], &v, sizeof v);
	}
}

static long kvb_canary_find(const uint64_t *tails, size_t n, uint64_t v)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t x;
		if (i + AHEAD < n) __builtin_prefetch((const void *)(uintptr_t)tails[i + AHEAD], 0);
		memcpy(&x, (const void *)(uintptr_t)tails[i], sizeof x);
		if (x == v) return (long)i;
	}
	return -1;
}

static void kvb_canary_plant_saving(const uint64_t *tails, size_t n, uint64_t canary, uint64_t *saved)
{
	for (size_t i = 0; i < n; i++) {
		memcpy(&saved[i], (void *)(uintptr_t)tails[i], 8);
		memcpy((void *)(uintptr_t)tails[i], &canary, 8);
	}
}

static long kvb_canary_settle(const uint64_t *tails, size_t n, uint64_t canary, const uint64_t *saved, const uint64_t *others,
			      size_t nothers, int restore)
{
	long first = -1;
	for (size_t i = 0; i < n; i++) {
		uint64_t v;
		memcpy(&v, (void *)(uintptr_t)tails[i], 8);
		if (v == canary) {
			if (first < 0) {
				first = (long)i;
			}
			if (restore) {
				memcpy((void *)(uintptr_t)tails[i], &saved[i], 8);
			}
			continue;
		}
		for (size_t j = 0; j < nothers && first < 0; j++) {
			if (v == others[j]) {
				first = (long)i; // another READ in flight planted over it: not vouched for
			}
		}
	}
	return first;
}
// kvb_flip flips the lowest bit of the byte at a (a fault for tests).
static void kvb_flip(uint64_t a) { *(volatile unsigned char *)(uintptr_t)a ^= 1; }
*/
import "C"

import (
	"errors"
	"unsafe"
)

// ErrNotDelivered is wrapped by a transfer's error when the engine
// reported it complete but a canary planted before it is still there (a
// READ's, nixl.Agent; docs/ENGINES.md). Internal: a room's code says it to
// users (not_delivered).
var ErrNotDelivered = errors.New("reported complete, not delivered")

// Plant writes v at each address of tails (8 bytes each, in this
// process's memory, any alignment), in one call to C.
func Plant(tails []uint64, v uint64) {
	if len(tails) > 0 {
		C.kvb_canary_plant((*C.uint64_t)(unsafe.Pointer(&tails[0])), C.size_t(len(tails)), C.uint64_t(v))
	}
}

// Find returns the first i whose 8 bytes at tails[i] still hold v, or −1
// when every one was overwritten.
func Find(tails []uint64, v uint64) int {
	if len(tails) == 0 {
		return -1
	}
	return int(C.kvb_canary_find((*C.uint64_t)(unsafe.Pointer(&tails[0])), C.size_t(len(tails)), C.uint64_t(v)))
}

// PlantSaving saves the 8 bytes at each address of tails into saved (as
// long as tails) and writes canary there (a READ's canaries).
func PlantSaving(tails []uint64, canary uint64, saved []uint64) {
	if len(tails) > 0 {
		C.kvb_canary_plant_saving((*C.uint64_t)(unsafe.Pointer(&tails[0])), C.size_t(len(tails)), C.uint64_t(canary), (*C.uint64_t)(unsafe.Pointer(&saved[0])))
	}
}

// Settle returns the first i whose tail still holds canary or holds one
// of others (another READ in flight planted over it: −1 if none), and
// with restore puts saved[i] back at every tail still holding canary.
func Settle(tails []uint64, canary uint64, saved, others []uint64, restore bool) int {
	if len(tails) == 0 {
		return -1
	}
	r := C.int(0)
	if restore {
		r = 1
	}
	var op *C.uint64_t
	if len(others) > 0 {
		op = (*C.uint64_t)(unsafe.Pointer(&others[0]))
	}
	return int(C.kvb_canary_settle((*C.uint64_t)(unsafe.Pointer(&tails[0])), C.size_t(len(tails)), C.uint64_t(canary),
		(*C.uint64_t)(unsafe.Pointer(&saved[0])), op, C.size_t(len(others)), r))
}

// Flip flips one bit of the byte at address a of this process's memory:
// the agent's fault for tests (nixl Agent.CorruptWrites), in memory the
// rank registered.
func Flip(a uint64) { C.kvb_flip(C.uint64_t(a)) }
