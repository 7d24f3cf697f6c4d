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
// crc32c.ll (a kernel edited without its PTX would not run on a GPU), with
// the llc the source names (another LLVM may write other PTX: skipped).
func TestKernelPTXCurrent(t *testing.T) {
	bin := llc(t)
	src, err := os.ReadFile("kernels/crc32c.ll")
	require.NoError(t, err)
	_, want, ok := strings.Cut(string(src), "; llc: ")
	require.True(t, ok, "crc32c.ll names the llc its PTX was made with")
	want, _, _ = strings.Cut(want, " (")
	version, err := exec.Command(bin, "--version").CombinedOutput()
	require.NoError(t, err)
	if !strings.Contains(string(version), want) {
		t.Skipf("this llc is not %s (the PTX's): %s", want, strings.TrimSpace(string(version)))
	}
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
	made, err := os.ReadFile(out)
	require.NoError(t, err)
	require.True(t, bytes.Equal(made, []byte(crc32cPTX)), "kernels/crc32c.ptx is stale: run make ptx")
}

// TestKernelOnCPU: the kernel compiled for this CPU from the same LLVM
// source, its thread registers (%ctaid, %ntid, %tid) read from the harness
// instead: its sum of a group (crc_group, what each GPU thread runs)
// against a bitwise CRC-32C — the check value, random groups of pieces
// (none, empty ones, up to 3,000 bytes each) —, and the whole kernel run
// thread by thread over a grid of blocks of 128 for 300 groups: every
// group's sum in its place, nothing written past the last. The CUDA
// double runs its own C of the kernel; this checks the kernel's own code.
func TestKernelOnCPU(t *testing.T) {
	bin := llc(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc here")
	}
	src, err := os.ReadFile("kernels/crc32c.ll")
	require.NoError(t, err)
	ir := string(src)
	ir = strings.NewReplacer(`target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"`, "",
		`target triple = "nvptx64-nvidia-cuda"`, "",
		"@llvm.nvvm.read.ptx.sreg.ctaid.x", "@host_ctaid", "@llvm.nvvm.read.ptx.sreg.ntid.x", "@host_ntid",
		"@llvm.nvvm.read.ptx.sreg.tid.x", "@host_tid").Replace(ir)
	i := strings.Index(ir, "!nvvm.annotations")
	require.Positive(t, i, "crc32c.ll: the kernel's annotation")
	ir = ir[:i]
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
void kvb_crc32c_groups(uint64_t *pieces, uint64_t *ends, uint64_t ngroups, uint32_t *out);
static unsigned host_ctaid_v, host_tid_v;
unsigned host_ctaid(void) { return host_ctaid_v; }
unsigned host_ntid(void) { return 128; }
unsigned host_tid(void) { return host_tid_v; }
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
	/* The kernel, thread by thread: 300 groups, blocks of 128 (3 blocks, the last part idle). */
	enum { G = 300, B = 128 };
	static uint64_t gp[2 * 4 * G], ends[G];
	static uint32_t out[3 * B], want[G];
	int np = 0;
	for (int g = 0; g < G; g++) {
		uint32_t w = 0xffffffffu;
		for (int k = rand() % 4; k > 0; k--) {
			size_t off = rand() % (1 << 19), len = rand() % 500;
			gp[2 * np] = (uint64_t)(uintptr_t)(buf + off); gp[2 * np + 1] = len; np++;
			w = ref(w, buf + off, len);
		}
		ends[g] = np; want[g] = ~w;
	}
	for (int i = 0; i < 3 * B; i++) out[i] = 0x5a5a5a5au;
	for (host_ctaid_v = 0; host_ctaid_v < (G + B - 1) / B; host_ctaid_v++)
		for (host_tid_v = 0; host_tid_v < B; host_tid_v++)
			kvb_crc32c_groups(gp, ends, G, out);
	for (int g = 0; g < G; g++)
		if (out[g] != want[g]) { printf("kernel: group %d %08x, want %08x\n", g, out[g], want[g]); return 1; }
	for (int g = G; g < 3 * B; g++)
		if (out[g] != 0x5a5a5a5au) { printf("kernel: thread %d past the groups wrote %08x\n", g, out[g]); return 1; }
	return 0;
}
`
