// Package canary plants and finds 8-byte canaries in this process's own
// memory: the decode rank's write check (docs/PROTOCOL.md "Writes checked
// before they count") plants one at the end of every piece a room's
// writes will fill and, once a notification names the piece written,
// finds whether it is still there. The addresses are the rank's own
// registered memory, computed from its own layout (never a peer's
// numbers), which stays mapped and writable for the rank's life, as its
// engine's KV cache does.
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
*/
import "C"

import "unsafe"

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
