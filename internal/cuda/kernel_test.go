package cuda

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// llc is LLVM's compiler (make ptx generates the kernels' PTX with it).
// Without it the kernel tests below are skipped: the PTX is committed, so
// nothing else needs LLVM (Debian: apt-get install llvm).
func llc(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("llc")
	if err != nil {
		t.Skip("no llc (LLVM) here: the committed PTX is not regenerated or checked on the CPU")
	}
	return p
}

// TestKernelPTXCurrent: the committed crc32c.ptx is what make ptx makes of
// crc32c.ll (a kernel edited without its PTX would not run on a GPU).
func TestKernelPTXCurrent(t *testing.T) {
	bin := llc(t)
	out := filepath.Join(t.TempDir(), "crc32c.ptx")
	mk, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	_, flags, ok := strings.Cut(string(mk), "\nPTX_FLAGS := ")
	require.True(t, ok, "the Makefile's PTX_FLAGS")
	flags, _, _ = strings.Cut(flags, "\n")
	cmd := exec.Command(bin, strings.Fields(flags)...)
	cmd.Args = append(cmd.Args, "kernels/crc32c.ll", "-o", out)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	want, err := os.ReadFile(out)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, []byte(crc32cPTX)), "kernels/crc32c.ptx is stale: run make ptx")
}

// TestKernelOnCPU: the kernel's sum of a group (crc_group, what each GPU
// thread runs) compiled for this CPU from the same LLVM source, against a
// bitwise CRC-32C: the check value, and random groups of pieces (none,
// empty ones, up to 3,000 bytes each). The CUDA double runs its own C of
// the kernel; this checks the kernel's own code.
func TestKernelOnCPU(t *testing.T) {
	bin := llc(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc here")
	}
	src, err := os.ReadFile("kernels/crc32c.ll")
	require.NoError(t, err)
	ir := string(src)
	i := strings.Index(ir, "; (kernel)")
	require.Positive(t, i, "crc32c.ll: the kernel's entry after crc_group, marked ; (kernel)")
	ir = strings.NewReplacer(`target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"`, "",
		`target triple = "nvptx64-nvidia-cuda"`, "").Replace(ir[:i])
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "crc.ll"), []byte(ir), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "check.c"), []byte(cpuCheck), 0o644))
	for _, c := range [][]string{
		{bin, "-O2", "-filetype=obj", filepath.Join(dir, "crc.ll"), "-o", filepath.Join(dir, "crc.o")},
		{"gcc", "-O2", "-o", filepath.Join(dir, "check"), filepath.Join(dir, "check.c"), filepath.Join(dir, "crc.o")},
		{filepath.Join(dir, "check")},
	} {
		b, err := exec.Command(c[0], c[1:]...).CombinedOutput()
		require.NoError(t, err, "%v: %s", c, b)
	}
}

const cpuCheck = `#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
uint32_t crc_group(uint64_t *pieces, uint64_t start, uint64_t end);
static uint32_t ref(uint32_t crc, const unsigned char *p, size_t n) {
	while (n--) { crc ^= *p++; for (int k = 0; k < 8; k++) crc = crc & 1 ? (crc >> 1) ^ 0x82f63b78u : crc >> 1; }
	return crc;
}
int main(void) {
	const char *s = "123456789";
	uint64_t one[2] = {(uint64_t)(uintptr_t)s, 9};
	if (crc_group(one, 0, 1) != 0xe3069283u) { printf("check value %08x, want e3069283\n", crc_group(one, 0, 1)); return 1; }
	srand(7);
	unsigned char *buf = malloc(1 << 20);
	for (int i = 0; i < (1 << 20); i++) buf[i] = rand();
	for (int trial = 0; trial < 2000; trial++) {
		uint64_t pieces[64]; int n = rand() % 32;
		uint32_t want = 0xffffffffu;
		for (int i = 0; i < n; i++) {
			size_t off = rand() % (1 << 19), len = rand() % 3000;
			if (rand() % 5 == 0) len = 0;
			pieces[2 * i] = (uint64_t)(uintptr_t)(buf + off); pieces[2 * i + 1] = len;
			want = ref(want, buf + off, len);
		}
		uint32_t got = crc_group(pieces, 0, n);
		if (got != ~want) { printf("group %d of %d pieces: %08x, want %08x\n", trial, n, got, ~want); return 1; }
	}
	return 0;
}
`
