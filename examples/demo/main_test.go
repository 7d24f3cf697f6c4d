package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvbridge/kvbridge/internal/capture"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var (
	binDir   string
	buildErr error
	buildOne sync.Once
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// binaries builds the prefill, decode and demo binaries once.
func binaries(t *testing.T) string {
	buildOne.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "kvbridge-demo-test-"); buildErr != nil {
			return
		}
		build := exec.Command("go", "build", "-o", binDir+string(filepath.Separator), "../prefill", "../decode", "../router", ".")
		build.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		if out, err := build.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
	return binDir
}

func runDemo(t *testing.T, args ...string) string {
	dir := binaries(t)
	cmd := exec.Command(filepath.Join(dir, "demo"), append(args, "-bin", dir)...)
	out, err := cmd.Output()
	require.NoError(t, err, "demo failed:\n%s%s", out, stderrOf(err))
	s := string(out)
	for _, want := range []string{"rooms pinned               0", "(corrupt 0)", "failed                     0", "OK: every request"} {
		require.Contains(t, s, want, "summary lacks %q:\n%s", want, s)
	}
	t.Logf("\n%s", s)
	return s
}

// stderrOf is what a failed demo printed on stderr (its error, without
// the progress bar), for the failure message: Output keeps it in the
// ExitError.
func stderrOf(err error) string {
	var ee *exec.ExitError
	if !errors.As(err, &ee) || len(ee.Stderr) == 0 {
		return ""
	}
	var keep []string
	for _, l := range strings.Split(string(ee.Stderr), "\n") {
		if i := strings.LastIndex(l, "\r"); i >= 0 {
			l = l[i+1:] // the progress bar redraws with \r
		}
		if strings.HasPrefix(strings.TrimSpace(l), "[#") || strings.TrimSpace(l) == "" {
			continue
		}
		keep = append(keep, l)
	}
	return "stderr:\n" + strings.Join(keep, "\n")
}

// TestDemoShort builds the prefill, decode and demo binaries and runs the
// demo's short workload: separate processes, real transfers, aborts at
// random stages, a summary with zero pinned rooms.
// The summary's lines are README's sample's, in order (the sample must come
// from a real run).
func TestDemoShort(t *testing.T) {
	s := runDemo(t, "-short", "-abort-rate", "0.2")
	got, want := summaryLabels(s), summaryLabels(docSection(t, "README.md", "The two commands"))
	assert.NotEmpty(t, want, "README's sample has no summary lines: run make demo and paste its summary into README.md")
	assert.Equal(t, want, got, "the summary's lines (actual) are not README's sample's (expected): run make demo and paste its summary into README.md")
}

// TestDemoHostile is the short hostile-input soak: the example ranks under
// the demo's real traffic while an attacker sends every class of bad input
// issue 14 listed (see hostile.go). The demo fails unless every real room
// succeeded byte-exact or was aborted as asked, nothing is pinned, both
// ranks are alive, every refusal was counted (unauthenticated, malformed,
// REGISTER_ACK ok=false, each HTTP refusal with its status) and the socket
// and tombstone tables stayed within their bounds.
func TestDemoHostile(t *testing.T) {
	s := runDemo(t, "-short", "-abort-rate", "0.1", "-hostile", "-hostile-rounds", "30")
	require.Contains(t, s, "hostile input: ", "no hostile-input report:\n%s", s)
}

// TestDemoChaos is a short round of the chaos soak (make soak-chaos runs
// it at length; see chaos.go): the example ranks under real traffic while
// one fault of each kind is injected at a random (seeded, printed) moment —
// a rank SIGKILLed and restarted on a new port (prefill, decode, and both
// at once); a rank SIGSTOPped past the heartbeat bound (prefill, decode);
// the bootstrap server restarted (HTTP) or etcd SIGKILLed and restarted
// (etcd). The demo fails
// unless no page is corrupt, no room on any rank outlives its deadline
// plus the bound, every failed room failed inside a fault's window,
// survivors served a new room within the bound after each fault, and every
// rank's memory stayed flat — the prefill rank no fault hits (the spared
// one) within the slack of its steady start after a quiet phase, and with
// no dead peer's shared-memory segments still mapped.
//
// Three runs, each discovery backend's restart at least once: the first
// pushes with prefill pages of 16 tokens and decode pages of 64 (pages
// paired token by token under every fault) over HTTP discovery; the second
// and third pull (the decode ranks read what the prefill ranks publish,
// under a lease: docs/PROTOCOL.md "Pull"), with those pages over HTTP
// discovery and with etcd's restart, and then also every prefill rank
// must have released every page it published within the stall, lease and
// quarantine bounds. (make soak-chaos pushes with both backends at length.)
func TestDemoChaos(t *testing.T) {
	for _, tc := range []struct{ name, discovery, pages string }{
		{"http, pages of 16 tokens to 64", "http", "-prefill-page-tokens 16 -decode-page-tokens 64"},
		{"http, pull, pages of 16 tokens to 64", "http", "-transfer pull -prefill-page-tokens 16 -decode-page-tokens 64"},
		{"etcd, pull", "etcd", "-transfer pull"},
	} {
		discovery := tc.discovery
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each round is its own processes, ports and discovery; mostly waiting out pauses and bounds
			dir := binaries(t)
			args := append([]string{"-chaos", "-chaos-duration", "1s", "-chaos-quiet", "3s", "-discovery", discovery, "-bin", dir}, strings.Fields(tc.pages)...)
			cmd := exec.Command(filepath.Join(dir, "demo"), args...)
			out, err := cmd.Output()
			s := string(out)
			require.NoError(t, err, "demo -chaos failed:\n%s%s", s, stderrOf(err))
			t.Logf("\n%s", s)
			restart := map[string]string{"http": "restart-bootstrap 1", "etcd": "restart-etcd 1"}[discovery]
			if strings.Contains(tc.pages, "page-tokens") {
				assert.Contains(t, s, "16-token prefill and 64-token decode pages", "the summary does not name the page sizes")
			}
			if strings.Contains(tc.pages, "pull") {
				assert.Contains(t, s, "discovery, pull", "the summary does not say the rooms are pulled")
			}
			for _, want := range []string{"(corrupt 0)", "OK: no page corrupt", "kill decode 1", "kill prefill 1", "kill prefill+decode 1", "pause decode 1", "pause prefill 1", restart, "memory (spared rank)"} {
				assert.Contains(t, s, want, "summary lacks %q", want)
			}
		})
	}
}

// TestDemoTopologies runs the demo's short workload (real processes, one
// per rank, ucx over shared memory, aborts at random stages) over every
// mapping of the rank-mapping issue; each decode rank checks that every
// head of every token of every page came from the right instance at the
// right offset, and the summary must show no failure, no corrupt page and
// nothing pinned; every room with a digest (docs/PROTOCOL.md "Digest"),
// no mismatch.
func TestDemoTopologies(t *testing.T) {
	for _, tc := range []struct{ name, args string }{
		{"TP 2 to 1", "-prefill-tp 2 -decode-tp 1"},
		{"TP 1 to 2", "-prefill-tp 1 -decode-tp 2"},
		{"TP 4 to 2", "-prefill-tp 4 -decode-tp 2"},
		{"TP 2 to 4", "-prefill-tp 2 -decode-tp 4"},
		{"2 KV heads TP 1 to 4 (replicated)", "-prefill-tp 1 -decode-tp 4"},
		{"MLA TP 2 to 1 (a dummy rank)", "-mla -prefill-tp 2 -decode-tp 1"},
		{"MLA TP 1 to 2", "-mla -prefill-tp 1 -decode-tp 2"},
		{"PP 2 to 1", "-prefill-tp 1 -prefill-pp 2"},
		{"PP 2 to 2", "-prefill-tp 1 -prefill-pp 2 -decode-pp 2"},
		{"DP 2, room mod dp", "-prefill-tp 1 -dp 2"},
		{"DP 2, explicit", "-prefill-tp 1 -dp 2 -dp-pick explicit"},
		{"DP 2, looked up", "-prefill-tp 1 -dp 2 -dp-pick lookup"},
		{"two prefill instances", "-prefill-tp 1 -prefill-instances 2"},
		{"etcd: two prefill and two decode instances", "-discovery etcd"},
		{"TP 2 to 1, NHD", "-prefill-tp 2 -page-layout NHD"},
		{"TP 2 to 1, layer-wise in groups of 2", "-prefill-tp 2 -layerwise -layer-group 2 -requests 12"},
		{"pages of 4 tokens to 16", "-prefill-tp 2 -prefill-page-tokens 4 -decode-page-tokens 16"},
		{"pages of 64 tokens to 16, NHD, TP 1 to 2", "-prefill-tp 1 -decode-tp 2 -prefill-page-tokens 64 -decode-page-tokens 16 -page-layout NHD"},
		{"pages of 8 tokens to 32, PP 2 to 1, layer-wise", "-prefill-tp 1 -prefill-pp 2 -prefill-page-tokens 8 -decode-page-tokens 32 -layerwise -requests 12"},
		// Pulled (docs/PROTOCOL.md "Pull"): TP fan-out, where one decode
		// rank's reads end before the other's and its pages go to its next
		// room at once; and PP with pages of different sizes, layer group
		// by layer group.
		{"pull, TP 1 to 2, NHD", "-transfer pull -prefill-tp 1 -decode-tp 2 -page-layout NHD"},
		{"pull, pages of 8 tokens to 32, PP 2 to 1, layer-wise", "-transfer pull -prefill-tp 1 -prefill-pp 2 -prefill-page-tokens 8 -decode-page-tokens 32 -layerwise -requests 12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each demo is its own processes and ports
			args := append([]string{"-short", "-requests", "24", "-abort-rate", "0.1"}, strings.Fields(tc.args)...)
			args = append(args, "-digest") // every page checked by its digest too
			s := runDemo(t, args...)
			require.Contains(t, s, "topology ", "no topology line:\n%s", s)
			require.Regexp(t, `digest \(CRC-32C\) +[1-9][0-9]* pages checked, 0 mismatches`, s, "the digest line:\n%s", s)
			if strings.Contains(tc.args, "-transfer pull") {
				require.Contains(t, s, "discovery, pull", "the topology line does not say the rooms are pulled:\n%s", s)
			}
			if f := strings.Fields(tc.args); slices.Contains(f, "-decode-page-tokens") {
				p, d := f[slices.Index(f, "-prefill-page-tokens")+1], f[slices.Index(f, "-decode-page-tokens")+1]
				want := p + "-token prefill and " + d + "-token decode"
				require.Contains(t, s, want, "the topology line does not say %q:\n%s", want, s)
			}
		})
	}
}

// TestHelp: demo -h exits 0 and starts with a line saying what the demo
// does (it started with a bare "Usage of demo:", issue 27).
func TestHelp(t *testing.T) {
	var code int
	out := capture.Stderr(t, func() { code = run([]string{"-h"}) })
	assert.Zero(t, code, "demo -h: exit, want 0")
	first, _, _ := strings.Cut(out, "\n")
	assert.True(t, strings.HasPrefix(first, "demo: what make demo runs. It starts example prefill and decode ranks"), "demo -h starts with %q:\n%s", first, out)
	// docs/TOPOLOGIES.md lists the demo's shape flags.
	_, list, ok := strings.Cut(readDoc(t, "docs/TOPOLOGIES.md"), "`bin/demo` starts one process per rank: `")
	list, _, _ = strings.Cut(list, "`")
	require.True(t, ok, "docs/TOPOLOGIES.md's demo flag list not found: %q", list)
	require.Contains(t, list, "-decode-instances", "docs/TOPOLOGIES.md's demo flag list without -decode-instances")
	for _, f := range strings.Fields(list) {
		if strings.HasPrefix(f, "-") {
			assert.True(t, strings.Contains(out, "\n  "+f+" ") || strings.Contains(out, "\n  "+f+"\n"), "docs/TOPOLOGIES.md lists %s, which demo -h does not", f)
		}
	}
}

// readDoc is a file of the repository's documentation (README.md, docs/…).
func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	require.NoError(t, err)
	return string(b)
}

// docSection is a documentation file's section under "## heading", up to the next.
func docSection(t *testing.T, path, heading string) string {
	t.Helper()
	_, sec, ok := strings.Cut(readDoc(t, path), "\n## "+heading+"\n")
	require.True(t, ok, "%s has no section %q", path, heading)
	sec, _, _ = strings.Cut(sec, "\n## ")
	return sec
}

// summaryLabels are the labels of a demo summary's lines, from its
// "topology" line to its "OK:" line, in order (a label ends at two spaces).
func summaryLabels(text string) []string {
	var labels []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "topology  ") {
			in, labels = true, nil
		}
		if !in || l == "" {
			continue
		}
		label, _, _ := strings.Cut(l, "  ")
		if strings.HasPrefix(l, "OK:") {
			label = "OK:"
		}
		labels = append(labels, label)
		if label == "OK:" {
			in = false
		}
	}
	return labels
}

// TestDemoTinyllm is `make demo DEMO_FLAGS="-compute tinyllm -layerwise"`,
// short: the model behind the router (prefill TP 2 → decode TP 1), a quarter of
// the requests aborted on purpose and retried; every completion must be
// token-identical to the single-process run. -fault swap-heads-decode (a
// wrong head mapping) must make the same run fail.
func TestDemoTinyllm(t *testing.T) {
	dir := binaries(t)
	args := []string{"-compute", "tinyllm", "-short", "-requests", "8", "-gen", "8", "-abort-rate", "0.25", "-seed", "3", "-layerwise", "-bin", dir}
	out, err := exec.Command(filepath.Join(dir, "demo"), args...).Output()
	s := string(out)
	require.NoError(t, err, "demo -compute tinyllm failed:\n%s", s)
	for _, want := range []string{"token-identical            8", "failed                     0", "rooms pinned               0", "TTFT p50 / p99", "TPOT p50 / p99", "OK: every completion"} {
		assert.Contains(t, s, want, "summary lacks %q:\n%s", want, s)
	}
	t.Logf("\n%s", s)
	// docs/EMBEDDING.md's sample of this mode comes from a real run: the same lines.
	got, want := summaryLabels(s), summaryLabels(docSection(t, "docs/EMBEDDING.md", "The example server"))
	assert.NotEmpty(t, want, "docs/EMBEDDING.md's tinyllm sample has no summary lines")
	assert.Equal(t, want, got, "the summary's lines (actual) are not docs/EMBEDDING.md's tinyllm sample's (expected)")
	out, err = exec.Command(filepath.Join(dir, "demo"), append(args, "-fault", "swap-heads-decode", "-requests", "2", "-abort-rate", "0")...).Output()
	s = string(out)
	require.Error(t, err, "a wrong head mapping was not caught:\n%s", s)
	require.Contains(t, s, "the single-process run's", "a wrong head mapping was not caught (err %v)", err)
	removeKeptLogs(t, string(out))
}

// TestDemoTinyllmWires is `make demo DEMO_FLAGS="-compute tinyllm -wire
// sglang"` (and vllm, push, mooncake, offloading, and vllm and push with
// -multi-turn), short: the router drives each instance's front in SGLang's
// wire, vLLM's serial kv_transfer_params flow, vLLM push from a cached
// identity and the sidecar's mooncake and offloading connectors' wires, a
// quarter of the requests aborted on purpose and retried; with
// -multi-turn every request has a second turn prefilled from the first
// turn's KV fetched from the decode instance. Every completion must be
// token-identical to the single-process run, nothing pinned (held rooms
// of vLLM's flow included).
func TestDemoTinyllmWires(t *testing.T) {
	dir := binaries(t)
	for _, mode := range []string{"sglang", "vllm", "push", "mooncake", "offloading", "vllm -multi-turn", "push -multi-turn"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // each demo is its own processes and ports
			wire := strings.Fields(mode)[0]
			args := append([]string{"-compute", "tinyllm", "-short", "-requests", "8", "-gen", "6", "-abort-rate", "0.25", "-seed", "4", "-bin", dir, "-wire"}, strings.Fields(mode)...)
			out, err := exec.Command(filepath.Join(dir, "demo"), args...).Output()
			s := string(out)
			require.NoError(t, err, "demo -wire %s failed:\n%s", mode, s)
			want := []string{"token-identical            8", "failed                     0", "rooms pinned               0", wire + " wire", "OK: every completion"}
			if strings.Contains(mode, "-multi-turn") {
				want = append(want, "second turns               8 of 8 token-identical; 8 of 8 prefilled from the first turn's whole KV")
			}
			for _, w := range want {
				assert.Contains(t, s, w, "summary lacks %q:\n%s", w, s)
			}
		})
	}
}

// TestDemoTinyllmPageSizes is `make demo DEMO_FLAGS="-compute tinyllm
// -prefill-page-tokens 4 -decode-page-tokens 16"` (and larger prefill
// pages than decode's, NHD, TP 2 → 1), short: every completion must be
// token-identical to the single-process run — the KV cache a decode rank
// generates from was paired token by token between pages of different
// sizes, prefix reuse included; the third pulls, in vLLM's serial flow.
func TestDemoTinyllmPageSizes(t *testing.T) {
	dir := binaries(t)
	for _, tc := range []struct{ name, args string }{
		{"4 to 16", "-prefill-page-tokens 4 -decode-page-tokens 16"},
		{"32 to 8, NHD", "-prefill-page-tokens 32 -decode-page-tokens 8 -page-layout NHD"},
		// vLLM's serial flow, the decode ranks pulling (its connector's
		// default), over pages of different sizes.
		{"4 to 16, vllm wire, pull", "-prefill-page-tokens 4 -decode-page-tokens 16 -wire vllm -transfer pull"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-compute", "tinyllm", "-short", "-requests", "8", "-gen", "6", "-abort-rate", "0.25", "-seed", "5", "-bin", dir}, strings.Fields(tc.args)...)
			out, err := exec.Command(filepath.Join(dir, "demo"), args...).Output()
			s := string(out)
			require.NoError(t, err, "demo %s failed:\n%s", tc.args, s)
			for _, want := range []string{"token-identical            8", "failed                     0", "rooms pinned               0", "-token decode pages", "OK: every completion"} {
				assert.Contains(t, s, want, "summary lacks %q:\n%s", want, s)
			}
		})
	}
}

// removeKeptLogs removes the rank logs a failed demo run kept (a failure
// this test wanted).
func removeKeptLogs(t *testing.T, out string) {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.TrimSpace(l); strings.HasPrefix(f, os.TempDir()) && strings.HasSuffix(f, ".log") {
			os.Remove(f)
		}
	}
}

// TestDemoRefusesTopology: a pair the rank mapping does not support is
// refused in one line before any process starts (it used to start four
// and fail every request over minutes).
func TestDemoRefusesTopology(t *testing.T) {
	for _, args := range [][]string{
		{"-prefill-tp", "1", "-decode-pp", "2"},
		{"-compute", "tinyllm", "-prefill-tp", "1", "-decode-pp", "2"},
		{"-compute", "tinyllm", "-prefill-tp", "3"},
		{"-prefill-page-tokens", "12", "-decode-page-tokens", "16"},
		{"-prefill-page-tokens", "4"},                               // 8,192-token requests need 2,048 pages of 4 tokens; a rank holds 1,024
		{"-prefill-page-tokens", "16", "-decode-page-tokens", "48"}, // 3 prefill pages a decode page: chunks of 128 pages end inside one
	} {
		var code int
		// (-requests 1 -gen 1: were the check missing, the run would fail
		// fast at starting the ranks, after a one-request reference.)
		out := capture.Stderr(t, func() { code = run(append(args, "-bin", "/nonexistent", "-requests", "1", "-gen", "1")) })
		assert.Equal(t, 2, code, "%v: exit, stderr %q; want 2 and one line", args, out)
		assert.Zero(t, strings.Count(strings.TrimSpace(out), "\n"), "%v: stderr %q; want one line", args, out)
		assert.Contains(t, out, "refused before starting any process", "%v: exit %d; want 2 and one line", args, code)
	}
}
