# kvbridge — see README.md.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
GO ?= go
# go-nvml's cgo prologue trips hundreds of deprecation warnings in nvml.h.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all deps test test-checkers test-packages test-nixl sim bench bench-engine lint generate demo soak-hostile mutants fuzz ptx

all: test

## deps: install the system libraries the tests need (apt-get, only those missing; installed packages are upgraded only where a missing one requires it, listed first; DEPS_NO_UPGRADE=1 stops instead)
deps:
	@./scripts/deps.sh

# The checkers: the model checker, the simulator's exhaustive configurations and swarms. Under the race detector (test-packages) they run a
# bounded share (internal/core/race_on_test.go: about nine times slower there); test-checkers runs them whole without it and asserts their coverage.
CHECKERS := ^(TestInterleavings|TestSimExhaustive|TestSimRandom|TestSimRandomHostile|TestSimDeterministic|TestSimFindsBugs)$$
# The bugs the simulator found (TestSimFindsBugs, TestSimRegressions): make test lays each one's source mutant over the core.
SIM_MUTANTS := ack-on-cleared-tombstone,failed-write-drains,clear-releases,no-early-abort,post-ignores-epoch,no-tomb-trim

## test: lint (formatting, vet, generated code, no tracked binaries), then every test under the race detector
test: deps
	@$(MAKE) --no-print-directory lint
	@# The checkers (CPU-bound, one goroutine each) run beside the other packages' tests (mostly waiting on processes and sockets): 2 cores stay busy.
	@$(MAKE) --no-print-directory -j2 test-checkers test-packages
	@# Rate-dependent: the race detector slows the writes below the rate at which UCX's adaptive progress lost events (see the test).
	$(GO) test -count=1 -timeout 3m -run '^TestUCXNoLostWakeCrossProcess$$' ./internal/nixl

# The model checker and the simulator print what they checked.
# The protocol core (internal/core): the checkers and the package's other tests.
# Every go test has its timeout in sight: a package that runs past it panics, and the panic with the
# tests still running is shown (the whole -v log is kept in CHECKERS_LOG).
CHECKERS_LOG ?= $${TMPDIR:-/tmp}/kvbridge-checkers.log
# 6 m: on a slower 2-core VM (2026-12-07, late) internal/nixl, serial and CPU-starved beside the others, took 241-305 s here and 5 m
# cut it twice (on the usual one it takes 161-167 s); each package still ends well inside go's own 10 minutes.
TEST_TIMEOUT ?= 6m
test-checkers:
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) -v -run '$(CHECKERS)' ./internal/core 2>&1 | tee $(CHECKERS_LOG) | grep --line-buffered -E '^(--- FAIL|--- PASS: Test(Interleavings|Sim)|ok|FAIL|PASS)|^\s+--- FAIL|checked [0-9]|swarm runs|found:|^panic|running tests:|^\s+Test[^ ]* \(|[a-z_]+_test\.go:[0-9]+: .*(FAIL|Error|fail)|^\s+(Error Trace|Error|Messages):' \
		|| { echo "test-checkers failed: the whole -v log is in $(CHECKERS_LOG)"; exit 1; }
	@# The simulator must still find the bugs it found: their source mutants laid over the core, each caught by the checkers (make mutants
	@# runs every mutant). Here, beside the other packages' tests, rather than after them.
	$(GO) run ./scripts/srcmutants -only $(SIM_MUTANTS) -run '^(TestSimFindsBugs|TestSimRegressions)$$'

# Three packages at a time, longest first (beside the checkers on the 2-core VM, 2026-12-07: e2e 206-210 s and demo 130 s,
# mostly waiting on processes; nixl 161-167 s; kvmanager 67-69 s; discovery 19 s, gpucheck 13 s), so no long one starts last; the rest after them.
test-packages:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -p 3 -parallel 4 ./internal/e2e ./examples/demo ./internal/nixl ./kvmanager ./examples/internal/e2e ./internal/core ./examples/kvbench ./internal/control ./internal/discovery ./examples/gpucheck ./internal/nixl/ucx ./examples/internal/rankcmd ./bootstrap ./...

NIXL_RUNS ?= 20
NIXL_TESTS := ^(TestContract|TestVRAMContract|TestLibNIXLProcessMapsOneUCX|TestTransfersByteExact|TestChunksHandedOverEarlyByteExact|TestSeparateProcesses|TestSoakRealNIXL|TestFirstRoomAfterPrefillRestartElsewhere|TestAbortReachesPrefillRestartedElsewhere|TestRoomAfterPrefillRestartElsewhere|TestRoomPostedRightAfterPrefillRestartElsewhere|TestPausedDecodeLearnsItsRoomsFailed|TestDecodeKilledRepeatedly|TestNIXLFaultRepro|TestLibNIXLBadThenGenuineMetadata|TestLibNIXLGenNotifFlushed|TestPrefixSkipped|TestForgedMemoryRefusedAcrossProcesses|TestForgedOfferRefusedAcrossProcesses|TestPullByteExact|TestPullRanksKilledMidRead|TestPagesOfDifferentSizesByteExact|TestSilentPartialCompletion|TestSilentPartialWriteFailsRoom|TestSilentPartialWriteAcrossProcesses|TestSilentPartialStateWriteFailsRoom|TestSilentPartialReadFailsRoom|TestDigestFailsAFlippedByte|TestPrefillCloseReleasesDecodePages|TestClearedThenCloseReleasesDecodePages|TestRequestUnreadAtCloseFreesPages|TestRoomAfterPrefillClosedAndRestartedElsewhere|TestPrefillAbortReleasesDecodePages)$$/^libnixl-real$$
## test-nixl: the engine contract and the e2e byte-exact, separate-process, soak and restart tests on a real NIXL, NIXL_RUNS times (KVBRIDGE_NIXL_LIB names its libnixl_capi.so; see DEVELOPERS.md)
# The whole -v log is kept in NIXL_LOG for reading a failure; the summary counts each test's and case's results.
NIXL_LOG ?= $${TMPDIR:-/tmp}/kvbridge-test-nixl.log
test-nixl: deps
	@test -n "$$KVBRIDGE_NIXL_LIB" || { echo "test-nixl: set KVBRIDGE_NIXL_LIB to a real NIXL's libnixl_capi.so (see DEVELOPERS.md)" >&2; exit 2; }
	@echo "test-nixl: full log in $(NIXL_LOG)"
	$(GO) test -race -count=$(NIXL_RUNS) -timeout $$(( $(NIXL_RUNS) * 6 + 10 ))m -v -run '$(NIXL_TESTS)' ./internal/nixl ./internal/e2e | tee $(NIXL_LOG) | grep -E '^(ok|FAIL)|^\s*--- |libucp mapped|VRAM: nothing ran' | sed -E 's/ \([0-9.]+s\)//' | sort | uniq -c

## ptx: regenerate the device kernels' PTX (internal/cuda/kernels/*.ptx) from their LLVM source with LLVM's llc (NVPTX back end); the PTX is committed, so nothing else needs LLVM
PTX_FLAGS := -O2 -march=nvptx64 -mcpu=sm_60 -mattr=+ptx60
ptx:
	llc $(PTX_FLAGS) internal/cuda/kernels/crc32c.ll -o internal/cuda/kernels/crc32c.ptx

## mutants: every source mutant (scripts/srcmutants: a known bug brought back as an edit laid over the code with go test -overlay), each with the tests it names; fails if any survives, or if a test written to show a mutant's effect does not
mutants:
	$(GO) run ./scripts/srcmutants

FUZZTIME ?= 60s
FUZZ_TARGETS := internal/wire:FuzzDecode internal/control:FuzzOpen internal/control:FuzzOpenMD internal/nixl:FuzzParseUCXAddress internal/nixl:FuzzParseNIXLMD internal/nixl:FuzzDecodeMetadata internal/core:FuzzParseNotif
## fuzz: each native fuzz target for FUZZTIME (make test runs their seed corpora only): the wire decoder, the authentication frame and sealed metadata, the UCX worker address and NIXL blob walks, kvbridge's metadata envelope, the notification parser
fuzz: deps
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t#*:}; echo "== $$pkg $$fn"; $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) ./$$pkg; done

SEEDS ?= 100000
## sim: the protocol simulator at depth: the exhaustive configurations with one more time jump, decode aborts and clears, two rooms with a restart, and SEEDS random runs (SIM_SEED_BASE moves them)
sim:
	@# --line-buffered: each line as the test prints it (a deep configuration's line when it is done), not all at the end.
	SIM_DEEP=1 SIM_SEEDS=$(SEEDS) $(GO) test -count=1 -timeout 0 -v -run '^(TestSimDeep|TestSimRandom)$$' ./internal/core | grep --line-buffered -E '^(=== RUN|--- |ok|FAIL|PASS)|checked|swarm runs|seed'

## bench: every benchmark, with allocations
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

## bench-engine: nixl engine bandwidth next to ucx_perftest (engine memory), scripts/ucxput (caller memory) and memcpy, interleaved rounds, as ratios
bench-engine: deps
	./scripts/bench-engine.sh

PURE := ./internal/core ./internal/wire ./internal/kvlayout ./internal/mem

## lint: no tracked binaries or files over 1 MiB outside testdata/, formatting, vet, and generated code up to date
lint:
	@./scripts/check-tracked.sh
	$(GO) generate ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@# The protocol core and the types it uses build and vet without cgo (no ZeroMQ, no engine).
	CGO_ENABLED=0 $(GO) build $(PURE)
	CGO_ENABLED=0 $(GO) vet $(PURE)
	@git diff --exit-code -- '*_string.go' || { echo "generated code was stale: commit the regenerated files"; exit 1; }

## generate: regenerate String() methods (stringer, run by go:generate as `go run golang.org/x/tools/cmd/stringer@<pinned version>`: fetched through the module proxy the first time, no install step)
generate:
	$(GO) generate ./...

## demo: bootstrap server, a prefill and a decode process on loopback, real transfers, a summary (DEMO_FLAGS="-compute tinyllm": a real model behind the example router, every completion compared with one process)
demo: deps
	$(GO) build -o bin/ ./examples/prefill ./examples/decode ./examples/router ./examples/demo
	./bin/demo $(DEMO_FLAGS)

SOAK_REQUESTS ?= 2000
## soak-hostile: the demo's workload (SOAK_REQUESTS requests) while an attacker sends every class of bad input at both ranks (make test runs a short one)
soak-hostile: deps
	$(GO) build -o bin/ ./examples/prefill ./examples/decode ./examples/demo
	./bin/demo -hostile -hostile-rounds 200 -requests $(SOAK_REQUESTS) -abort-rate 0.1 $(DEMO_FLAGS)

SOAK_DURATION ?= 5m
SOAK_DISCOVERY ?= http etcd
SOAK_SEED ?=
.PHONY: soak-chaos
## soak-chaos: the chaos soak for SOAK_DURATION per discovery backend in SOAK_DISCOVERY: real traffic while ranks are SIGKILLed and restarted on new ports, SIGSTOPped past the heartbeat bound, and the bootstrap server or etcd restarts; SOAK_SEED replays a fault schedule (make test runs a short round: TestDemoChaos)
soak-chaos: deps
	$(GO) build -o bin/ ./examples/prefill ./examples/decode ./examples/demo
	for d in $(SOAK_DISCOVERY); do ./bin/demo -chaos -chaos-duration $(SOAK_DURATION) -discovery $$d $(if $(SOAK_SEED),-seed $(SOAK_SEED)) $(DEMO_FLAGS) || exit 1; done
