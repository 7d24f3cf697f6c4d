package nixl

/*
#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// kvb_populate faults in [addr, addr+len) writable without changing it:
// MADV_POPULATE_WRITE (Linux 5.14), else a read and write-back per page.
static int kvb_populate(uintptr_t addr, size_t len) {
	long ps = sysconf(_SC_PAGESIZE);
	uintptr_t start = addr & ~(uintptr_t)(ps - 1);
	if (madvise((void *)start, addr + len - start, MADV_POPULATE_WRITE) == 0) {
		return 0;
	}
	if (errno != EINVAL) {
		return errno;
	}
	for (uintptr_t p = start; p < addr + len; p += ps) {
		volatile char *c = (volatile char *)(p < addr ? addr : p);
		*c = *c;
	}
	return 0;
}

static char *kvb_host_ptr(uintptr_t addr) { return (char *)addr; }
*/
import "C"

import (
	"fmt"
	"syscall"
	"unsafe"

	"github.com/kvbridge/kvbridge/internal/canary"
)

// Populate faults in the pages of host memory ahead of use, so that the
// first-touch page faults of a fresh machine do not land inside the first
// transfers' latency. Contents are unchanged. Call it before the memory is
// shared with other threads or peers (the fallback for kernels without
// MADV_POPULATE_WRITE reads and writes back one byte per page).
func Populate(descs ...Desc) error {
	for _, d := range descs {
		if d.Addr == 0 || d.Len == 0 {
			continue
		}
		if e := C.kvb_populate(C.uintptr_t(d.Addr), C.size_t(d.Len)); e != 0 {
			return fmt.Errorf("nixl: populating %d bytes at %#x: %w", d.Len, d.Addr, syscall.Errno(e))
		}
	}
	return nil
}

// view returns registered memory (C, engine-mapped, or pinned Go memory) as
// a byte slice; the conversion goes through C so no uintptr becomes a Go
// pointer in Go code.
func view(addr uintptr, n uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(C.kvb_host_ptr(C.uintptr_t(addr)))), int(n))
}

// plantTails saves the 8 bytes at each address of tails into saved and
// writes canary there (READ canaries: one cgo call a READ).
func plantTails(tails []uint64, v uint64, saved []uint64) { canary.PlantSaving(tails, v, saved) }

// settleTails returns the first i whose tail still holds canary or holds
// one of others (-1 if none), and with restore puts saved[i] back at every
// tail still holding canary.
func settleTails(tails []uint64, v uint64, saved, others []uint64, restore bool) int {
	return canary.Settle(tails, v, saved, others, restore)
}
