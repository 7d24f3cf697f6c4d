// Command srcmutants is the second half of make mutants: bugs brought back
// into packages that have no built-in mutant switch (kvmanager's are in
// kvmanager/mutants.go), as source edits laid over the real files with
// go test -overlay (the working tree is never touched). Each must make the
// package's tests fail; one that survives fails the command.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// mutant replaces old (which must occur exactly once) with new in file;
// pkg and run, when set, name the package whose tests must catch it and
// the tests to run (default: every test of the file's package).
type mutant struct {
	name, file, old, new string
	pkg, run             string
}

// The envelope's checks (bootstrap/address.go, auth.go): issue 23.
var mutants = []mutant{
	{"no-replay-window", "bootstrap/address.go", "	if !w.accept(env.Seq) {", "	if !w.accept(env.Seq) && false {", "", ""},
	{"other-epoch-accepted", "bootstrap/address.go", "	case to.Epoch != 0 && to.Epoch != self.Epoch && t != TypePing:", "	case to.Epoch != 0 && to.Epoch != self.Epoch && t != TypePing && false:", "", ""},
	{"unknown-epoch-accepted", "bootstrap/address.go", "	case to.Epoch == 0 && !opener:", "	case to.Epoch == 0 && !opener && false:", "", ""},
	{"other-rank-accepted", "bootstrap/address.go", "	case to.Role != \"\" && (to.Role != self.Role || to.Instance != self.Instance || to.Rank != self.Rank):", "	case to.Role != \"\" && false:", "", ""},
	{"from-not-the-certificate", "bootstrap/address.go", "		if pc == nil || pc.cert.Identity() != (From{Role: from.Role, Instance: from.Instance, Rank: from.Rank}) {", "		if pc == nil {", "", ""},
	{"same-role-certificate", "bootstrap/address.go", "	if len(raw) > 4 && byteRole(raw[4]) == a.role {", "	if false {", "", ""},
	{"secret-alone-speaks", "bootstrap/address.go", "		if raw == nil {\n			return nil, AuthNoIdentity\n		}", "		if raw == nil {\n			return nil, \"\"\n		}", "", ""},
	{"seal-not-bound-to-owner", "bootstrap/address.go", "	b := []byte(from.Peer())", "	b := []byte(\"\")", "", ""},
	{"endpoint-not-bound", "bootstrap/address.go", "	if e != nil && keyOf(e.id) != keyOf(from) && (e.hinted || now.Sub(e.heard) < a.rebindAfter) {", "	if false {", "", ""},
	{"windows-evicted-when-full", "bootstrap/address.go", "		if now.Sub(a.windows[old].last) < a.auth.MaxSkew {", "		if false {", "", ""},
	{"no-skew-check", "bootstrap/auth.go", "	if d := now.Sub(env.Sent); d > a.MaxSkew || d < -a.MaxSkew {", "	if false {", "", ""},
	// The receive batch's byte cap (issue 24's review).
	{name: "batch-bytes-uncapped", file: "bootstrap/zsock.go", old: "	for (int m = 0; m < maxm && held < KVB_BATCH_BYTES; m++) {", new: "	for (int m = 0; m < maxm; m++) {",
		pkg: "bootstrap", run: "^TestReceiveBatchBytesCapped$"},
	// A signal on the binding thread (Go's preemption) fails a bind with
	// EINTR unless it is retried (CI: the demo's decode rank did not start).
	{name: "bind-not-retried-after-eintr", file: "bootstrap/zsock.go", old: "		rc = zmq_bind(sock, ep);\n\t} while (rc < 0 && errno == EINTR);", new: "		rc = zmq_bind(sock, ep);\n\t} while (0);",
		pkg: "bootstrap", run: "^TestSocketCallsRetryAfterSignal$"},
	{name: "lost-lease-reused", file: "bootstrap/etcd.go", old: "\t\t\tif errors.Is(err, rpctypes.ErrLeaseNotFound) {\n\t\t\t\t// Our lease", new: "\t\t\tif false && errors.Is(err, rpctypes.ErrLeaseNotFound) {\n\t\t\t\t// Our lease",
		pkg: "bootstrap", run: "^TestEtcdLeaseLostUnderAWrite$"},
	{name: "unknown-input-silent", file: "kvmanager/step.go", old: "\tdefault:\n\t\treturn unknownInput(in)", new: "\tdefault:\n\t\treturn Output{}",
		pkg: "kvmanager", run: "^TestStepHandlesEveryInput$"},
	{name: "phase-entry-overwritten", file: "kvmanager/registry.go", old: "\tif rm.entered[st].IsZero() {\n\t\trm.entered[st] = now", new: "\tif true {\n\t\trm.entered[st] = now",
		pkg: "kvmanager", run: "^TestRoomPhases$"},
	{name: "effects-out-of-step-order", file: "kvmanager/shell.go", old: "\tm.effMu.Lock()\n\tbuf := append(m.effBuf[:0], effects...)\n\tm.mu.Unlock()\n\tif m.afterUnlock != nil {\n\t\tm.afterUnlock()\n\t}", new: "\tbuf := append([]Effect(nil), effects...)\n\tm.mu.Unlock()\n\tif m.afterUnlock != nil {\n\t\tm.afterUnlock()\n\t}\n\tm.effMu.Lock()",
		pkg: "kvmanager", run: "^TestEffectsCarriedOutInStepOrder$"},
	{name: "register-loaded-unchecked", file: "kvmanager/core_prefill.go", old: "\tpp, err := c.checkRegister(msg)\n\tif err != nil {", new: "\tpp, err := c.checkRegister(msg)\n\tif err != nil && false {",
		pkg: "kvmanager", run: "^TestRegisterAsLoadEffect$"},
	// No CPU when idle (issue 24): the ucx engine's sleep on its event fd,
	// UCX's adaptive progress off, the decode notifier's stop and kick.
	{name: "ucx-idle-timer", file: "nixl/ucx.go", old: "		case ready == nil || len(u.active) > 0 || u.adaptiveOn:", new: "		case true:",
		pkg: "nixl", run: "^TestUCXIdleSleepsOnEventFD$"},
	{name: "ucx-adaptive-progress", file: "nixl/ucx.go", old: "		ucpKeys[\"ADAPTIVE_PROGRESS\"] = adaptive", new: "		ucpKeys[\"ADAPTIVE_PROGRESS\"] = \"y\"",
		pkg: "nixl", run: "^TestUCXNoLostWakeCrossProcess$"},
	{name: "notifier-never-stops", file: "kvmanager/decode.go", old: "			case live == 0 && tombs == 0:", new: "			case live < 0 && tombs == 0:",
		pkg: "internal/e2e", run: "^TestNotifierStopsPollingWithoutRooms$"},
	{name: "notifier-ignores-tombstones", file: "kvmanager/decode.go", old: "			case live == 0 && tombs == 0:", new: "			case live == 0 && tombs >= 0:",
		pkg: "internal/e2e", run: "^TestNotifierStopsPollingWithoutRooms$"},
	{name: "notifier-not-kicked", file: "kvmanager/decode.go", old: "				case <-d.roomsKick:\n", new: "				case <-(chan struct{})(nil):\n",
		pkg: "internal/e2e", run: "^TestNotifierStopsPollingWithoutRooms$"},
	// A transfer released while its direct copy runs on a goroutine of its
	// own: the copy's end wrote into its freed C struct (SIGSEGV).
	{name: "released-copy-notified", file: "nixl/ucx.go", old: "			if ux.c == nil {\n", new: "			if ux.c == nil && false {\n",
		pkg: "nixl", run: "^TestUCXReleaseDuringDirectCopy$"},
	// Issue 25: the pool posts a write before its data is ready; a write
	// restricted to some layers writes them all.
	{name: "ready-ignored", file: "transfer/pool.go", old: "	if w.Ready == nil {\n", new: "	if w.Ready == nil || true {\n",
		pkg: "internal/e2e", run: "^TestLayerwiseByteExact$"},
	{name: "layers-ignored", file: "transfer/pool.go", old: "	if l.Hi == 0 {\n", new: "	if l.Hi >= 0 {\n",
		pkg: "transfer", run: "^TestPoolWritesOnlyItsLayers$"},
	// Issue 22 on a real NIXL: the progress mode a rank gives its agent,
	// UCX's adaptive progress off in NIXL's UCX, huge pages for libnixl's
	// memory, and the address check's per-device tcp priority and UCX 1.22
	// namespace size.
	{name: "prefill-agent-threaded", file: "kvmanager/shell.go", old: "		if cfg.Role == RolePrefill {\n", new: "		if false {\n",
		pkg: "internal/e2e", run: "^TestRankAgentProgressModes$"},
	{name: "nixl-adaptive-progress", file: "nixl/libnixl.go", old: "	return user + \"ADAPTIVE_PROGRESS=n\"", new: "	return user",
		pkg: "nixl", run: "^TestLibNIXLEngineConfig$"},
	// The ucx engine over tcp (its own acknowledged write messages, the
	// flushing close).
	{name: "tcp-writes-as-puts", file: "nixl/ucx.go", old: "		C.kvb_ep_detect(ep)\n", new: "\n",
		pkg: "nixl", run: "^TestUCXTCPWritesAsMessages$"},
	{name: "am-write-no-range-check", file: "nixl/ucx_engine.c", old: "	} else if (!kvb_region_covers(c, h.addr, length)) {", new: "	} else if (!kvb_region_covers(c, h.addr, 0)) {",
		pkg: "nixl", run: "^TestUCXHostileWriteMessages$"},
	{name: "ep-close-not-waited", file: "nixl/ucx_engine.c", old: "	e->close_deadline_ms = kvb_now_ms() + wait_ms;", new: "	e->close_deadline_ms = kvb_now_ms();",
		pkg: "nixl", run: "^TestUCXCloseInFlightTargetStalled$"},
	{name: "nixl-alloc-no-huge-pages", file: "nixl/libnixl.go", old: "	madvise(a, n, MADV_HUGEPAGE);\n", new: "\n",
		pkg: "nixl", run: "^TestLibNIXLAllocHugePages$"},
	{name: "tcp-priority-of-first-device", file: "nixl/addrcheck.go", old: "	if tlName(t.csum) != \"tcp\" {\n", new: "	if true {\n",
		pkg: "nixl", run: "^TestUCXTCPPriorityPerDevice$"},
	{name: "namespace-always-ino", file: "nixl/addrcheck.go", old: "	if v.major > 1 || (v.major == 1 && v.minor >= 22) {\n		return 4\n	}\n", new: "",
		pkg: "nixl", run: "^TestUCXNamespaceSizes$"},
	// Memory proven to its owner, no room lost to a restart: an early
	// ABORT's tombstone not extended by a later ABORT for the room (the id
	// could be reused while the second abort should still hold it).
	{name: "early-abort-ttl-not-extended", file: "kvmanager/registry.go",
		old: "		if t.kind == AbortedEarly && t.expires.Before(now.Add(r.cfg.TombstoneTTL)) {",
		new: "		if t.kind == AbortedEarly && t.expires.Before(now.Add(r.cfg.TombstoneTTL)) && false {",
		pkg: "kvmanager", run: "^TestSimExhaustive$/abort_before_the_sender_exists"},
	// A REQUEST to a prefill process not heard from lately without its
	// probe, and a lost probe not followed by a lookup: the first room
	// after a restart elsewhere goes to the dead process.
	{name: "request-without-probe", file: "kvmanager/core_decode.go",
		old: "		if c.cfg.ProbeIdle > 0 && c.now.Sub(tg.heard) > c.cfg.ProbeIdle {", new: "		if false {",
		pkg: "kvmanager", run: "^TestSimExhaustive$/prefill_killed_and_started_elsewhere"},
	{name: "lost-probe-not-looked-up", file: "kvmanager/core_decode.go",
		old: "				tg.probeLost = true\n				c.relookup(tg)", new: "				tg.probeLost = true",
		pkg: "kvmanager", run: "^TestSimExhaustive$/prefill_killed_and_started_elsewhere"},
	{name: "moved-after-lost-probe-not-failed", file: "kvmanager/core_decode.go",
		old: "	if tg.probeLost && tg.resolved && tg.endpoint != endpoint {", new: "	if false {",
		pkg: "kvmanager", run: "^TestSimExhaustive$/killed_just_after"},
	// Shared-memory endpoints pinged at wire-up: the reply endpoint keeps
	// a dead peer's segments mapped for good.
	{name: "shm-endpoints-pinged", file: "nixl/ucx_engine.c", old: "	if (rma) {\n		return e->failed ? e->status : UCS_OK;", new: "	if (0) {\n		return e->failed ? e->status : UCS_OK;",
		pkg: "nixl", run: "^TestReplacedPeerReleasesItsMemory$"},
	// Reads over tcp through UCX's get emulation: the target copies from
	// whatever address the reader names.
	{name: "tcp-reads-emulated", file: "nixl/ucx_engine.c", old: "	if (read && e->emulated) {", new: "	if (0 && read && e->emulated) {",
		pkg: "nixl", run: "^TestUCXTCPReadsAsMessages$"},
	{name: "read-answer-any-endpoint", file: "nixl/ucx_engine.c", old: "	    param->reply_ep != x->ep->ep || a.index >= x->rchunks", new: "	    a.index >= x->rchunks",
		pkg: "nixl", run: "^TestUCXTCPReadsAsMessages$"},
	{name: "read-answer-length-unchecked", file: "nixl/ucx_engine.c", old: "	} else if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length != x->rhdrs[a.index].len) {", new: "	} else if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > x->rhdrs[a.index].len) {",
		pkg: "nixl", run: "^TestUCXTCPReadsAsMessages$"},
	{name: "read-answer-twice", file: "nixl/ucx_engine.c", old: "a.index >= x->rchunks || x->rgot[a.index]) {", new: "a.index >= x->rchunks) {",
		pkg: "nixl", run: "^TestUCXTCPReadsAsMessages$"},
	{name: "vram-region-outside-allocation", file: "nixl/vram.go", old: "	if uint64(region.Addr) < k.base || uint64(region.Addr)-k.base > size || region.Len > size-(uint64(region.Addr)-k.base) {", new: "	if false {",
		pkg: "nixl", run: "^TestVRAMRegionOutsideItsAllocationRefused$"},
	{name: "read-answers-unbounded", file: "nixl/ucx_engine.c", old: "	} else if (c->rdata_pending + h.len > KVB_RDATA_PENDING) {", new: "	} else if (0) {",
		pkg: "nixl", run: "^TestUCXTCPReadsAsMessages$"},
	// Memory proven to its owner (issue 41, 1): a REGISTER's proof slots
	// read back but not compared; an agent name another decode rank
	// registered taken over (its remote dropped by the refusal).
	{name: "proof-not-compared", file: "kvmanager/proof.go", old: "		if !hmac.Equal(buf[i*proofLen:(i+1)*proofLen], ck.value(msg.Proof, owner)) {", new: "		if false && !hmac.Equal(buf[i*proofLen:(i+1)*proofLen], ck.value(msg.Proof, owner)) {",
		pkg: "kvmanager", run: "^TestRegisterForeignMemoryRefused$"},
	// The slot's value not keyed by the seed: bytes already in another
	// process's memory match a seed of the attacker's choice.
	{name: "proof-not-keyed", file: "kvmanager/proof.go", old: "	h := hmac.New(sha256.New, seed)", new: "	h := hmac.New(sha256.New, nil)",
		pkg: "kvmanager", run: "^TestRegisterForeignMemoryRefused$"},
	{name: "default-name-not-reserved", file: "kvmanager/proof.go", old: "		if own := g[2] + \"/\" + g[1] + \"/\" + g[3]; own != msg.From.Peer() {", new: "		if own := g[2] + \"/\" + g[1] + \"/\" + g[3]; false && own != msg.From.Peer() {",
		pkg: "kvmanager", run: "^TestRegisterForeignMemoryRefused$"},
	{name: "proof-check-on-control-loop", file: "kvmanager/prefill.go", old: "	go m.bindRegister(msg, lay)", new: "	m.bindRegister(msg, lay)",
		pkg: "kvmanager", run: "^TestRegisterCheckOffTheControlLoop$"},
	{name: "repeat-with-other-blob-loaded", file: "kvmanager/proof.go", old: "		if p.md != md || p.lay != lay {", new: "		if false && (p.md != md || p.lay != lay) {",
		pkg: "kvmanager", run: "^TestRegisterForeignMemoryRefused$"},
	{name: "claims-not-checked-again", file: "kvmanager/proof.go", old: "	repeat, err := m.checkClaims(msg)\n	if err != nil {\n		return \"\", err\n	}", new: "	repeat, _ := m.checkClaims(msg)\n	var err error",
		pkg: "kvmanager", run: "^TestRegisterClaimsCheckedAgainOnceReserved$"},
	{name: "repeat-not-proven-after-reload", file: "kvmanager/proof.go", old: "	if err = m.checkProof(name, msg, lay.Layout); err != nil {", new: "	if err = m.checkProof(name, msg, lay.Layout); err != nil && !repeat {",
		pkg: "kvmanager", run: "^TestRepeatProvenAgainWhenReloaded$"},
	{name: "agent-name-not-owned", file: "kvmanager/proof.go", old: "	if owner != \"\" && owner != msg.From.Peer() {", new: "	if false && owner != \"\" && owner != msg.From.Peer() {",
		pkg: "kvmanager", run: "^TestRegisterForeignMemoryRefused$"},
}

func main() {
	root, _ := os.Getwd()
	tmp, err := os.MkdirTemp("", "srcmutants")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	survived := 0
	for i, m := range mutants {
		src, err := os.ReadFile(filepath.Join(root, m.file))
		if err != nil {
			fail(err)
		}
		if n := strings.Count(string(src), m.old); n != 1 {
			fail(fmt.Errorf("mutant %s: %q occurs %d times in %s (the code moved: update scripts/srcmutants)", m.name, m.old, n, m.file))
		}
		mutated := filepath.Join(tmp, fmt.Sprintf("m%d.go", i))
		if err := os.WriteFile(mutated, []byte(strings.Replace(string(src), m.old, m.new, 1)), 0o644); err != nil {
			fail(err)
		}
		ov, _ := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(root, m.file): mutated}})
		ovf := filepath.Join(tmp, fmt.Sprintf("m%d.json", i))
		if err := os.WriteFile(ovf, ov, 0o644); err != nil {
			fail(err)
		}
		start := time.Now()
		pkg, args := filepath.Dir(m.file), []string{"test", "-count=1", "-failfast", "-overlay", ovf}
		if m.pkg != "" {
			pkg = m.pkg
		}
		if m.run != "" {
			args = append(args, "-run", m.run)
		}
		cmd := exec.Command("go", append(args, "./"+pkg)...)
		out, err := cmd.CombinedOutput()
		secs := int(time.Since(start).Seconds())
		switch {
		case err == nil:
			fmt.Printf("mutant %-26s SURVIVED every test (%ds)\n", m.name, secs)
			survived++
		case strings.Contains(string(out), "[build failed]") || strings.Contains(string(out), "setup failed"):
			fail(fmt.Errorf("mutant %s does not compile:\n%s", m.name, out))
		default:
			by := "a failing run"
			for _, l := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(l, "--- FAIL: ") {
					by = strings.Fields(l)[2]
					break
				}
			}
			fmt.Printf("mutant %-26s caught by %s (%ds)\n", m.name, by, secs)
		}
	}
	fmt.Printf("%d source mutants, %d survived\n", len(mutants), survived)
	if survived > 0 {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "srcmutants:", err)
	os.Exit(1)
}
