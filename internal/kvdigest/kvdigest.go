// Package kvdigest computes the end-to-end KV digest (docs/PROTOCOL.md
// "Digest"): a CRC-32C (Castagnoli) of each destination page a write
// moves, over the page's pieces in the order kvlayout.DigestPieces names
// them, read where the KV lives in this process's host memory — one call
// to C for a whole write, with the CPU's CRC32 instruction where it has
// one (SSE 4.2 on amd64, in three streams; on arm64 the CRC extension
// when the build enables it, e.g. CGO_CFLAGS=-march=armv8-a+crc), a table
// otherwise.
// The prefill rank sums its source pieces before the write is posted, the
// decode rank its destination pieces once the notification arrives; the
// addresses are in the rank's own registered memory (computed from its
// layout and clipped to it, as the write check's canaries are).
package kvdigest

/*
#cgo CFLAGS: -O2
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t kvb_crc_table[8][256];

static void kvb_crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++) {
			c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
		}
		kvb_crc_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++) {
		for (int t = 1; t < 8; t++) {
			uint32_t c = kvb_crc_table[t - 1][i];
			kvb_crc_table[t][i] = (c >> 8) ^ kvb_crc_table[0][c & 0xff];
		}
	}
}

// kvb_crc_sw: slicing-by-8, for CPUs without a CRC32 instruction.
static uint32_t kvb_crc_sw(uint32_t crc, const unsigned char *p, size_t n)
{
	while (n >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		v ^= crc;
		crc = kvb_crc_table[7][v & 0xff] ^ kvb_crc_table[6][(v >> 8) & 0xff] ^ kvb_crc_table[5][(v >> 16) & 0xff] ^
		      kvb_crc_table[4][(v >> 24) & 0xff] ^ kvb_crc_table[3][(v >> 32) & 0xff] ^ kvb_crc_table[2][(v >> 40) & 0xff] ^
		      kvb_crc_table[1][(v >> 48) & 0xff] ^ kvb_crc_table[0][v >> 56];
		p += 8;
		n -= 8;
	}
	while (n--) {
		crc = (crc >> 8) ^ kvb_crc_table[0][(crc ^ *p++) & 0xff];
	}
	return crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

// The instruction's latency (3 cycles) is hidden by running three streams
// at once over three consecutive blocks of K bytes and combining them:
// the CRC register is linear, so crc(A‖B‖C) = shift(shift(crc(A), K) ⊕
// crc₀(B), K) ⊕ crc₀(C), where shift(x, K) runs x over K zero bytes — a
// table per byte of x (kvb_crc_shift), built once (as Go's hash/crc32
// does for the same instruction).
enum { KVB_K1 = 168, KVB_K2 = 1344 };
static uint32_t kvb_shift1[4][256], kvb_shift2[4][256];

__attribute__((target("sse4.2"))) static uint32_t kvb_crc_one(uint32_t crc, const unsigned char *p, size_t n)
{
	uint64_t c = crc;
	while (n >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		c = _mm_crc32_u64(c, v);
		p += 8;
		n -= 8;
	}
	uint32_t c32 = (uint32_t)c;
	while (n--) {
		c32 = _mm_crc32_u8(c32, *p++);
	}
	return c32;
}

static uint32_t kvb_crc_shift(uint32_t t[4][256], uint32_t c)
{
	return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

static void kvb_crc_shift_init(uint32_t t[4][256], size_t k)
{
	static const unsigned char zeros[KVB_K2];
	for (uint32_t v = 0; v < 256; v++) {
		for (int b = 0; b < 4; b++) {
			t[b][v] = kvb_crc_one(v << (8 * b), zeros, k);
		}
	}
}

__attribute__((target("sse4.2"))) static uint32_t kvb_crc_triple(uint32_t crc, const unsigned char *p, size_t k)
{
	uint64_t a = crc, b = 0, c = 0;
	for (size_t i = 0; i < k; i += 8) {
		uint64_t x, y, z;
		memcpy(&x, p + i, 8);
		memcpy(&y, p + k + i, 8);
		memcpy(&z, p + 2 * k + i, 8);
		a = _mm_crc32_u64(a, x);
		b = _mm_crc32_u64(b, y);
		c = _mm_crc32_u64(c, z);
	}
	uint32_t (*t)[256] = k == KVB_K2 ? kvb_shift2 : kvb_shift1;
	uint32_t r = kvb_crc_shift(t, (uint32_t)a) ^ (uint32_t)b;
	return kvb_crc_shift(t, r) ^ (uint32_t)c;
}

static uint32_t kvb_crc_hw(uint32_t crc, const unsigned char *p, size_t n)
{
	while (n >= 3 * KVB_K2) {
		crc = kvb_crc_triple(crc, p, KVB_K2);
		p += 3 * KVB_K2;
		n -= 3 * KVB_K2;
	}
	while (n >= 3 * KVB_K1) {
		crc = kvb_crc_triple(crc, p, KVB_K1);
		p += 3 * KVB_K1;
		n -= 3 * KVB_K1;
	}
	return kvb_crc_one(crc, p, n);
}
static int kvb_crc_has_hw(void)
{
	if (!__builtin_cpu_supports("sse4.2")) {
		return 0;
	}
	kvb_crc_shift_init(kvb_shift1, KVB_K1);
	kvb_crc_shift_init(kvb_shift2, KVB_K2);
	return 1;
}
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
static uint32_t kvb_crc_hw(uint32_t crc, const unsigned char *p, size_t n)
{
	while (n >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		crc = __crc32cd(crc, v);
		p += 8;
		n -= 8;
	}
	while (n--) {
		crc = __crc32cb(crc, *p++);
	}
	return crc;
}
static int kvb_crc_has_hw(void) { return 1; }
#else
static uint32_t kvb_crc_hw(uint32_t crc, const unsigned char *p, size_t n) { return kvb_crc_sw(crc, p, n); }
static int kvb_crc_has_hw(void) { return 0; }
#endif

static int kvb_crc_mode = -1; // set once by kvb_crc_setup (Go's sync.Once)

static int kvb_crc_setup(int force_sw)
{
	kvb_crc_init();
	kvb_crc_mode = !force_sw && kvb_crc_has_hw();
	return kvb_crc_mode;
}

// kvb_crc_groups: out[g] is the CRC-32C of the pieces ends[g-1] .. ends[g]-1
// (pieces are address, length pairs), in order.
static void kvb_crc_groups(const uint64_t *pieces, const int64_t *ends, size_t ngroups, uint32_t *out)
{
	size_t i = 0;
	for (size_t g = 0; g < ngroups; g++) {
		uint32_t crc = 0xffffffffu;
		for (; i < (size_t)ends[g]; i++) {
			const unsigned char *p = (const unsigned char *)(uintptr_t)pieces[2 * i];
			size_t n = (size_t)pieces[2 * i + 1];
			crc = kvb_crc_mode ? kvb_crc_hw(crc, p, n) : kvb_crc_sw(crc, p, n);
		}
		out[g] = ~crc;
	}
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

var (
	setupOnce sync.Once
	hardware  bool
)

func setup() { setupOnce.Do(func() { hardware = C.kvb_crc_setup(0) == 1 }) }

// Hardware reports whether the CPU's CRC32 instruction computes the
// digest (else a table does, several times slower).
func Hardware() bool {
	setup()
	return hardware
}

// Sum appends to out one CRC-32C per group of pieces: pieces are address
// and length pairs in this process's memory, ends[g] the pair index where
// group g ends (ascending, the last at most len(pieces)/2). The memory
// must stay mapped for the call.
func Sum(pieces []uint64, ends []int, out []uint32) ([]uint32, error) {
	setup()
	if err := CheckGroups(pieces, ends); err != nil {
		return out, err
	}
	if len(ends) == 0 {
		return out, nil
	}
	e64 := make([]int64, len(ends))
	for i, e := range ends {
		e64[i] = int64(e)
	}
	n := len(out)
	out = append(out, make([]uint32, len(ends))...)
	var p *C.uint64_t
	if len(pieces) > 0 {
		p = (*C.uint64_t)(unsafe.Pointer(&pieces[0]))
	}
	C.kvb_crc_groups(p, (*C.int64_t)(unsafe.Pointer(&e64[0])), C.size_t(len(ends)), (*C.uint32_t)(unsafe.Pointer(&out[n])))
	return out, nil
}

// CheckGroups checks Sum's arguments (and the device kernel's,
// cuda.Context.CRC32CGroups): address and length pairs, groups whose ends
// ascend within them.
func CheckGroups(pieces []uint64, ends []int) error {
	if len(pieces)%2 != 0 {
		return fmt.Errorf("kvdigest: %d words of pieces, want address and length pairs", len(pieces))
	}
	prev := 0
	for g, e := range ends {
		if e < prev || e > len(pieces)/2 {
			return fmt.Errorf("kvdigest: group %d ends at piece %d (after %d, of %d)", g, e, prev, len(pieces)/2)
		}
		prev = e
	}
	return nil
}

// Bytes is the CRC-32C of b, as Sum computes it (tests and references).
func Bytes(b []byte) uint32 {
	if len(b) == 0 {
		s, _ := Sum(nil, []int{0}, nil)
		return s[0]
	}
	s, _ := Sum([]uint64{uint64(uintptr(unsafe.Pointer(&b[0]))), uint64(len(b))}, []int{1}, nil)
	runtime.KeepAlive(b)
	return s[0]
}

// useTable makes Sum use the table even on a CPU with the instruction
// (tests: both paths checked against hash/crc32).
func useTable(table bool) {
	setup()
	force := C.int(0)
	if table {
		force = 1
	}
	C.kvb_crc_setup(force)
}
