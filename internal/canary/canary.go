// Package canary plants and finds 8-byte canaries in this process's own
// memory through the kernel (process_vm_writev and process_vm_readv on
// itself), so that memory which became inaccessible is reported, not a
// fault: the decode rank's write check (docs/PROTOCOL.md "Writes checked
// before they count") runs it on memory a peer's engine writes.
package canary

/*
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

enum { BATCH = 512 };

// kvb_canary_plant writes v at each address of tails; an address the
// kernel refuses is skipped. Returns how many were written, or -1 when
// the kernel has no process_vm_writev for it (ENOSYS, EPERM).
static long kvb_canary_plant(const uint64_t *tails, size_t n, uint64_t v)
{
	struct iovec lv[BATCH], rv[BATCH];
	pid_t self = getpid();
	size_t done = 0, i = 0;
	while (i < n) {
		size_t k = n - i < BATCH ? n - i : BATCH;
		for (size_t j = 0; j < k; j++) {
			lv[j].iov_base = &v;
			lv[j].iov_len = sizeof v;
			rv[j].iov_base = (void *)(uintptr_t)tails[i + j];
			rv[j].iov_len = sizeof v;
		}
		ssize_t got = process_vm_writev(self, lv, k, rv, k, 0);
		if (got < 0 && errno == EINTR) continue;
		if (got < 0 && (errno == ENOSYS || errno == EPERM)) return -1;
		size_t whole = got < 0 ? 0 : (size_t)got / sizeof v;
		done += whole;
		i += whole;
		if (whole < k) i++; // refused: skipped
	}
	return (long)done;
}

// kvb_canary_find returns the first i whose address holds v or cannot be
// read (*unreadable then set), or -1.
static long kvb_canary_find(const uint64_t *tails, size_t n, uint64_t v, int *unreadable)
{
	struct iovec rv[BATCH];
	uint64_t buf[BATCH];
	pid_t self = getpid();
	size_t i = 0;
	*unreadable = 0;
	while (i < n) {
		size_t k = n - i < BATCH ? n - i : BATCH;
		for (size_t j = 0; j < k; j++) {
			rv[j].iov_base = (void *)(uintptr_t)tails[i + j];
			rv[j].iov_len = sizeof v;
		}
		struct iovec lv = {buf, k * sizeof v};
		ssize_t got = process_vm_readv(self, &lv, 1, rv, k, 0);
		if (got < 0 && errno == EINTR) continue;
		size_t whole = got < 0 ? 0 : (size_t)got / sizeof v;
		for (size_t j = 0; j < whole; j++)
			if (buf[j] == v) return (long)(i + j);
		if (whole < k) {
			*unreadable = 1;
			return (long)(i + whole);
		}
		i += k;
	}
	return -1;
}
*/
import "C"

import (
	"errors"
	"unsafe"
)

// ErrUnsupported: the kernel does not let this process copy into its own
// memory through process_vm_writev (no cross-memory attach, or a
// seccomp policy): nothing can be checked.
var ErrUnsupported = errors.New("canary: process_vm_writev refused by the kernel (ENOSYS or EPERM)")

// Plant writes v at each address of tails (8 bytes each, in this process)
// and returns how many it wrote: an address the kernel refuses (not
// mapped, not writable) is skipped, not a fault.
func Plant(tails []uint64, v uint64) (int, error) {
	if len(tails) == 0 {
		return 0, nil
	}
	n := int(C.kvb_canary_plant((*C.uint64_t)(unsafe.Pointer(&tails[0])), C.size_t(len(tails)), C.uint64_t(v)))
	if n < 0 {
		return 0, ErrUnsupported
	}
	return n, nil
}

// Find returns the first i whose 8 bytes at tails[i] still hold v, or
// that cannot be read (unreadable then true); −1 when every one was
// overwritten.
func Find(tails []uint64, v uint64) (i int, unreadable bool) {
	if len(tails) == 0 {
		return -1, false
	}
	var u C.int
	i = int(C.kvb_canary_find((*C.uint64_t)(unsafe.Pointer(&tails[0])), C.size_t(len(tails)), C.uint64_t(v), &u))
	return i, u != 0
}
