package ucx

/*
#cgo LDFLAGS: -ldl
#cgo CFLAGS: -I${SRCDIR}/../../dl
#include <stdlib.h>
#include <string.h>
#include "ucx_engine.h"

static const char *kvbu_status_string(int st) { return kvbu.ucs_status_string(st); }
static void kvbu_rkey_destroy(ucp_rkey_h k) { kvbu.ucp_rkey_destroy(k); }
static void kvbu_version(unsigned *major, unsigned *minor, unsigned *release) { kvbu.ucp_get_version(major, minor, release); }
*/
import "C"

import (
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	_ "github.com/kvbridge/kvbridge/internal/dl" // kvb_dl.h, the one dlopen loader (included by the C files)
	"github.com/kvbridge/kvbridge/internal/nixl"
)

// The ucx engine drives libucp directly. One worker per agent, created and
// used only by its progress goroutine; every UCX call is a closure run
// there. The worker is UCS_THREAD_MODE_SERIALIZED and the goroutine is not
// locked to an OS thread: calls never overlap, Go's scheduler orders memory
// when the goroutine moves between threads, and an unlocked goroutine is
// woken without a thread hand-off (locking it cost 30 µs per small write
// and 20% of 64 MiB bandwidth here; see BENCHMARKS.md). The progress
// goroutine polls while commands, completions or messages keep coming and
// for a short spin window after (a put over tcp, or into memory UCX did
// not allocate, is emulated and needs the target to progress). Then, with
// transfers in flight or no event fd, it sleeps on a timer backing off
// from 20 µs to 1 ms; idle, it sleeps on the worker's event fd (armed),
// with a 5 s backstop, and costs no CPU.

type ucxStatusError struct {
	call   string
	status C.int
}

func (e *ucxStatusError) Error() string {
	return fmt.Sprintf("%s: %s", e.call, C.GoString(C.kvbu_status_string(C.int(e.status))))
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func ucxErr(call string, st C.int) error {
	if st == 0 {
		return nil
	}
	return &ucxStatusError{call, st}
}

type ucxMem struct {
	memh C.ucp_mem_h // nil for VRAM (exported by CUDA IPC, not UCX)
	addr uintptr
	len  uint64
	rkey []byte // packed rkey, or the VRAM IPC key
	view []byte // DRAM: the whole region as a byte slice
	dev  uint64 // VRAM: the region's device (its metadata says it)
}

type ucxReg struct {
	kind nixl.MemKind
	mems []ucxMem
	// caller: host memory the caller allocated (register, not alloc):
	// peers' puts into it are emulated and move only while this side
	// progresses.
	caller bool
}

type ucxRemote struct {
	name    string
	ep      *C.kvb_ep
	regions []nixl.RemoteRegion
	rkeys   []C.ucp_rkey_h
	// mapped[i] is where region i is mapped in this process (0: not
	// mappable). Shared-memory transports map peer memory allocated by UCX;
	// writes into it are plain copies. VRAM regions are mapped by CUDA IPC.
	mapped  []uintptr
	views   [][]byte       // DRAM regions mapped here, as byte slices (nil if not)
	closers []func() error // CUDA IPC mappings to release
	idx     *nixl.RegionIndex
	dropped bool // set under copyMu when the mappings go
}

type ucxPrep struct {
	remote *ucxRemote
	// views are the descriptors as byte slices: local memory, or remote
	// memory mapped in this process (nil if any remote descriptor is not
	// mapped, or for VRAM). Built once at prep so a post makes no cgo call
	// per piece.
	views [][]byte
	// addrs are the descriptors' addresses in this process, host or device
	// (nil if any remote descriptor is not mapped here).
	addrs []uintptr
	ptrs  []C.uint64_t
	lens  []C.uint64_t
	keys  []C.ucp_rkey_h // remote: the rkey of each descriptor
	memhs []C.ucp_mem_h  // local: the memh of each descriptor
	// spans name the registered piece each descriptor lies in (local: a
	// registration's mapping, remote: the peer's region); coalesced
	// copies never cross from one to another.
	spans []uintptr
}

type ucxXfer struct {
	c      *C.kvb_xfer // C memory; freed once no request is outstanding
	state  atomic.Uint32
	errMsg atomic.Pointer[string]
	hdr    *C.char // notification header (this agent's name) and message, C memory
	msg    unsafe.Pointer
	msgLen C.size_t
	notify bool
}

type ucx struct {
	name   string
	device int // CUDA device whose context maps peers' VRAM and copies
	// cudaLib is the CUDA driver's path (Config.CUDALib).
	cudaLib string
	// peerErrors: the transports can detect a failed peer (tcp, RDMA), so
	// endpoints use UCP_ERR_HANDLING_MODE_PEER.
	peerErrors bool
	ctx        *C.kvb_ctx
	// waker: the worker's event fd in Go's poller (nil: none; the progress
	// goroutine then backs off with a timer). wakeups counts the sleeps it
	// ended (tests).
	waker *ucxWaker
	// adaptiveOn: UCX's adaptive progress is on (the user's choice), so
	// the event fd may miss events: sleep with a back-off timer even idle.
	adaptiveOn bool
	wakeups    atomic.Uint64
	// missed counts the idle backstop's passes that found work: wake-ups
	// the event fd did not give.
	missed atomic.Uint64
	// passes counts the progress loop's passes (tests: an idle agent makes
	// none).
	passes atomic.Uint64

	cmds    chan func()
	closing chan struct{}
	done    chan struct{}

	// Owned by the progress goroutine.
	regs    map[*ucxReg]struct{}
	remotes map[string]*ucxRemote
	active  map[*ucxXfer]struct{}
	all     map[*ucxXfer]struct{} // every unreleased transfer, freed at shutdown
	// localIdx/localMems index DRAM registrations; nil after a change.
	localIdx  *nixl.RegionIndex
	localMems []ucxMem
	orphans   []ucxOrphan
	// callerRegs counts the registrations of caller memory (progress
	// goroutine only): while there are any on an agent whose transports
	// include shared memory (sharedMem), progress that served a peer keeps
	// polling for targetSpinWindow.
	callerRegs int
	sharedMem  bool

	mu    sync.Mutex
	queue []nixl.Notif
	wake  chan struct{}
	// progress is signalled when a transfer reaches a final state.
	progress chan struct{}
	// copies counts postDirect's copies on goroutines of their own;
	// copiesDone (under copiesMu) is set by close before it waits for them.
	copies     sync.WaitGroup
	copiesMu   sync.Mutex
	copiesDone bool
	// copyMu: direct copies hold it for reading, unmapping for writing.
	copyMu sync.RWMutex

	// local describes this agent's own UCX (release, transports, FIFO
	// sizes) for the checks of peers' addresses and keys (addrcheck.go);
	// library is the release in this agent's metadata blobs.
	local   *nixl.UCXLocal
	library string
	// spans are this agent's DRAM registrations with their packed keys, for
	// in-process peers' checks (memMu; written by the progress goroutine).
	memMu sync.Mutex
	spans map[*ucxReg][]ucxMem
	// selfAddrHeader and selfAddrMin: the checks before the full address
	// walk (the header byte and a length), kept for the test that shows them
	// insufficient (CheckAddressesAsBefore).
	selfAddrHeader byte
	selfAddrMin    int
	legacyCheck    atomic.Bool // CheckAddressesAsBefore
}

// ucxProcess holds this process's live ucx agents: a peer whose address
// names this process is checked against the agent it names.
var ucxProcess struct {
	sync.Mutex
	agents map[*ucx]struct{}
}

// setSpans records (mems non-nil) or forgets a registration's memory.
func (u *ucx) setSpans(r *ucxReg, mems []ucxMem) {
	u.memMu.Lock()
	defer u.memMu.Unlock()
	if u.spans == nil {
		u.spans = map[*ucxReg][]ucxMem{}
	}
	if mems == nil {
		delete(u.spans, r)
		return
	}
	u.spans[r] = append([]ucxMem(nil), mems...)
}

// registeredKey returns the packed key this agent made for exactly the
// region d, if it registered it.
func (u *ucx) registeredKey(d nixl.Desc) ([]byte, bool) {
	u.memMu.Lock()
	defer u.memMu.Unlock()
	for _, ms := range u.spans {
		for _, m := range ms {
			if m.addr == d.Addr && m.len == d.Len {
				return m.rkey, true
			}
		}
	}
	return nil, false
}

// inProcessPeer finds the agent of this process a peer's address names
// (UCXAddress.InProcess), nil when the address names another process.
func inProcessPeer(a *nixl.UCXAddress) (*ucx, error) {
	ucxProcess.Lock()
	defer ucxProcess.Unlock()
	agents := make([]*ucx, 0, len(ucxProcess.agents))
	for w := range ucxProcess.agents {
		agents = append(agents, w)
	}
	locals, names := make([]*nixl.UCXLocal, len(agents)), make([]string, len(agents))
	for i, w := range agents {
		locals[i], names[i] = w.local, w.name
	}
	i, err := a.InProcess(locals, names)
	if err != nil || i < 0 {
		return nil, err
	}
	return agents[i], nil
}

// spinWindow is how long the progress thread keeps polling after activity
// before it starts sleeping, targetSpinWindow how long after progress that
// served a peer (work found with no transfer of this agent's own in
// flight: a writer's puts into the caller's memory, which UCX emulates and
// which move only while this side progresses); idleMaxSleep the longest
// it sleeps armed and idle; maxBusyArms how many arms in a row may find
// events pending (with nothing for progress) before it sleeps on the timer
// instead.
const (
	spinWindow       = 200 * time.Microsecond
	targetSpinWindow = 2 * time.Millisecond
	idleMaxSleep     = 5 * time.Second
	maxBusyArms      = 64
)

// transportPrefixes name UCX settings that belong to transports. UCX 1.13's
// ucp_config_modify does not match them by their full name (TCP_TX_SEG_SIZE
// is reported "invalid configuration"); it applies a transport setting given
// without its prefix (TX_SEG_SIZE) to every transport of the agent that has
// it. So each agent gets its own settings and the process environment is
// never written (a setenv races with C threads reading it, and the first
// agent's values would win for all).
var transportPrefixes = []string{"TCP_", "POSIX_", "SYSV_", "CMA_", "MM_", "SELF_", "IB_", "RC_", "UD_", "DC_", "CUDA_", "GDR_", "ROCM_", "KNEM_", "XPMEM_"}

// ucpSettings maps Config.UCX to ucp_config_modify names.
func ucpSettings(in map[string]string) (map[string]string, error) {
	out := map[string]string{}
	from := map[string]string{}
	for k, v := range in {
		name := k
		for _, p := range transportPrefixes {
			if rest, ok := strings.CutPrefix(k, p); ok && rest != "" {
				name = rest
				break
			}
		}
		if prev, dup := from[name]; dup && out[name] != v {
			return nil, fmt.Errorf("UCX settings %s=%s and %s=%s: UCX applies %s to every transport, give it one value: %w",
				prev, out[name], k, v, name, nixl.ErrInvalidRequest)
		}
		out[name], from[name] = v, k
	}
	return out, nil
}

var ucxLib struct {
	sync.Mutex
	loaded bool
	path   string
}

// loadUCX loads libucp (path: Config.UCXLib, empty for libucp.so.0) once
// per process, at the first ucx agent: a process that never opens one maps
// no UCX of ours. An agent naming another path than the one loaded is
// refused.
func loadUCX(path string) error {
	ucxLib.Lock()
	defer ucxLib.Unlock()
	if path == "" {
		path = "libucp.so.0"
	}
	if ucxLib.loaded {
		if path != ucxLib.path && path != "libucp.so.0" {
			return fmt.Errorf("nixl.Config.UCXLib %s: this process already loaded libucp from %s (one UCX per process): %w", path, ucxLib.path, nixl.ErrInvalidRequest)
		}
		return nil
	}
	runtime.LockOSThread() // dlerror is per thread
	defer runtime.UnlockOSThread()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [512]C.char
	if C.kvbu_load(cpath, &errbuf[0], C.size_t(len(errbuf))) != 0 {
		return fmt.Errorf("UCX is not installed or not loadable (%s); install UCX ≥ 1.13 or set nixl.Config.UCXLib (%s in the example binaries) to libucp.so: %w",
			C.GoString(&errbuf[0]), nixl.UCXLibEnv, nixl.ErrEngineUnavailable)
	}
	ucxLib.loaded, ucxLib.path = true, path
	return nil
}

// ucxChoices settles, in the keys given to UCX, the settings the ucx
// engine decides on, and reads them from the keys alone: TLS (which
// transports: whether endpoints can detect a failed peer, whether peers
// put into shared memory) and UNIFIED_MODE (refused) from Config.UCX, and
// ADAPTIVE_PROGRESS. A setting the keys do not name is given UCX
// explicitly — TLS=all (UCX's own default), UNIFIED_MODE=n,
// ADAPTIVE_PROGRESS=n —, so UCX, which reads its UCX_* variables itself,
// runs as the engine decided and not as a variable the engine never read
// says (Config.FromEnv copies UCX_TLS, UCX_UNIFIED_MODE and
// UCX_ADAPTIVE_PROGRESS into Config.UCX, for the binaries).
//
// Adaptive progress takes interfaces UCX finds idle out of the worker's
// progress and arm lists and watches them from its async thread; with it,
// an armed worker here missed events (a sleeping target did not wake for a
// write's notification: the write hung, 1 in ~20,000 writes over shared
// memory). kvbridge turns it off unless the user chose it in Config.UCX,
// and then keeps a back-off timer while idle (adaptive: it is on).
func ucxChoices(ucpKeys map[string]string) (tls string, adaptive bool, err error) {
	tls, ok := ucpKeys["TLS"]
	if !ok {
		tls = "all"
		ucpKeys["TLS"] = tls
	}
	unified, ok := ucpKeys["UNIFIED_MODE"]
	if !ok {
		unified = "n"
		ucpKeys["UNIFIED_MODE"] = unified
	}
	switch strings.ToLower(unified) {
	case "y", "yes", "on", "1", "true":
		return "", false, fmt.Errorf("UCX unified mode (nixl.Config.UCX UNIFIED_MODE=%s) packs worker addresses in a format "+
			"kvbridge does not validate: %w", unified, nixl.ErrUnsupported)
	}
	setting, ok := ucpKeys["ADAPTIVE_PROGRESS"]
	if !ok {
		setting = "n"
		ucpKeys["ADAPTIVE_PROGRESS"] = setting
	}
	switch strings.ToLower(setting) {
	case "n", "no", "off", "0", "false":
		return tls, false, nil
	}
	return tls, true, nil
}

func openUCX(cfg nixl.Config) (nixl.Backend, error) {
	if err := loadUCX(cfg.UCXLib); err != nil {
		return nil, fmt.Errorf("ucx engine: %w", err)
	}
	ucpKeys, err := ucpSettings(cfg.UCX)
	if err != nil {
		return nil, fmt.Errorf("ucx engine: %w", err)
	}
	tls, adaptiveOn, err := ucxChoices(ucpKeys)
	if err != nil {
		return nil, fmt.Errorf("ucx engine: %w", err)
	}
	cfg.UCX = ucpKeys
	u := &ucx{adaptiveOn: adaptiveOn, sharedMem: tlsSharedMemory(tls), device: cfg.Device, cudaLib: cfg.CUDALib, wake: make(chan struct{}, 1), progress: make(chan struct{}, 1), peerErrors: tls == "" || tls == "all" || strings.Contains(tls, "tcp") || strings.Contains(tls, "ib") ||
		strings.Contains(tls, "rc") || strings.Contains(tls, "ud") || strings.Contains(tls, "dc"), name: cfg.Name, cmds: make(chan func(), 64), closing: make(chan struct{}), done: make(chan struct{}),
		regs: map[*ucxReg]struct{}{}, remotes: map[string]*ucxRemote{}, active: map[*ucxXfer]struct{}{},
		all: map[*ucxXfer]struct{}{}}
	keys := make([]string, 0, len(cfg.UCX))
	for k := range cfg.UCX {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	started := make(chan error)
	go u.run(keys, cfg.UCX, started)
	if err := <-started; err != nil {
		return nil, fmt.Errorf("ucx engine: %v: %w", err, nixl.ErrEngineUnavailable)
	}
	return u, nil
}

// run is the agent's progress thread: it starts the UCX context (the
// result goes to started), then runs the loop until Close.
func (u *ucx) run(keys []string, vals map[string]string, started chan<- error) {
	defer close(u.done)
	if err := u.start(keys, vals); err != nil {
		started <- err
		return
	}
	started <- nil
	u.loop()
}

// start creates the UCX context and worker with the given configuration,
// reads the worker's own address (the peers' addresses are checked
// against its version and form) and registers the agent in the process.
func (u *ucx) start(keys []string, vals map[string]string) error {
	ck := make([]*C.char, len(keys))
	cv := make([]*C.char, len(keys))
	for i, k := range keys {
		ck[i], cv[i] = C.CString(k), C.CString(vals[k])
	}
	var errbuf [256]C.char
	var kp, vp **C.char
	if len(keys) > 0 {
		kp = (**C.char)(C.malloc(C.size_t(len(keys)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
		vp = (**C.char)(C.malloc(C.size_t(len(keys)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
		copy(unsafe.Slice(kp, len(keys)), ck)
		copy(unsafe.Slice(vp, len(keys)), cv)
	}
	var ctx *C.kvb_ctx
	st := C.kvb_init(&ctx, kp, vp, C.int(len(keys)), &errbuf[0], C.size_t(len(errbuf)))
	for i := range keys {
		C.free(unsafe.Pointer(ck[i]))
		C.free(unsafe.Pointer(cv[i]))
	}
	C.free(unsafe.Pointer(kp))
	C.free(unsafe.Pointer(vp))
	if st != 0 {
		return fmt.Errorf("%s", C.GoString(&errbuf[0]))
	}
	u.ctx = ctx
	var self unsafe.Pointer
	var n C.size_t
	if err := ucxErr("ucp_worker_get_address", C.kvb_worker_address(ctx, &self, &n)); err != nil || n < 1 {
		C.kvb_destroy(ctx)
		return fmt.Errorf("own worker address: %v", err)
	}
	u.selfAddrHeader = *(*byte)(self)
	// Header (1 byte with UCX 1.13's v1 addresses, 2 with v2) and the
	// 8-byte worker id, when present, come before anything variable.
	u.selfAddrMin = min(int(n), 9)
	own := C.GoBytes(self, C.int(n))
	C.free(self)
	var major, minor, release C.uint
	C.kvbu_version(&major, &minor, &release)
	ver := nixl.UCXVersion{Major: uint(major), Minor: uint(minor), Release: uint(release)}
	u.library = "ucx/" + ver.String()
	local, err := nixl.NewUCXLocal(own, ver)
	if err != nil {
		C.kvb_destroy(ctx)
		return fmt.Errorf("peers' worker addresses could not be validated: %v", err)
	}
	u.local = local
	ucxProcess.Lock()
	if ucxProcess.agents == nil {
		ucxProcess.agents = map[*ucx]struct{}{}
	}
	ucxProcess.agents[u] = struct{}{}
	ucxProcess.Unlock()
	u.waker = u.newWaker() // before Open returns: tests read it
	return nil
}

// pass runs the commands queued, progresses the worker once and settles
// what it completed: n is what progress reported, ran whether a command
// ran. afterBackstop: the loop woke from its idle backstop, so what this
// progress finds no event signalled (counted in missed before anything
// it completed is settled).
func (u *ucx) pass(afterBackstop bool) (n C.uint, ran bool) {
drain:
	for {
		select {
		case f := <-u.cmds:
			f()
			ran = true
		default:
			break drain
		}
	}
	n = C.kvb_progress(u.ctx)
	if afterBackstop && n > 0 {
		u.missed.Add(1) // the idle backstop found what no event signalled
	}
	u.advance()
	u.collectNotifs()
	u.passes.Add(1)
	return n, ran
}

// spinFor is the spin window after a pass: progress that found n events
// with no transfer of this agent's own in flight, on an agent exposing
// caller memory, may have served a peer's puts into it (emulated: a
// writer of the caller's memory streams at this side's polling rate,
// measured 4.7–5.2 GB/s with 200 µs and 7.0–8.0 with 2 ms at 1 MiB, 8 in
// flight, at less CPU per GB). Such an agent takes the long window after
// any peer's event (a notification after a direct copy into its engine
// memory too: the events do not say which). Everything else — this
// agent's own traffic, whose completions the back-off timer covers, and
// an agent exposing only memory UCX allocated, where a longer spin only
// takes a core from a peer's direct copy — gets the short window, and so
// does a pass started by a command.
func spinFor(n uint, own, exposesCaller bool) time.Duration {
	if n > 0 && !own && exposesCaller {
		return targetSpinWindow
	}
	return spinWindow
}

// servesEmulatedPuts: peers' puts into this agent's memory may be UCX's
// emulated ones over shared memory — it exposes caller memory and its
// transports include shared memory (progress goroutine only). Over tcp
// the writes are the engine's own active messages, whose arrival wakes
// the worker's event fd: a longer spin there measured slower on two
// cores (1 MiB, one write at a time: 2.9–3.3 → 2.2–2.8 GB/s), the
// spinning target taking the CPU a same-host writer's sends need.
func (u *ucx) servesEmulatedPuts() bool { return u.callerRegs > 0 && u.sharedMem }

// tlsSharedMemory: a UCX_TLS setting whose transports include shared
// memory — empty or "all", a list naming one ("sm", "shm", "mm", "posix",
// "sysv", "xpmem", "knem", "cma"), or an exclusion list ("^…") that
// leaves one of them ("all", "sm" and "shm" stand for all five, "mm" for posix,
// sysv and xpmem).
func tlsSharedMemory(tls string) bool {
	tls = strings.ToLower(strings.TrimSpace(tls))
	if tls == "" {
		return true
	}
	exclude := strings.HasPrefix(tls, "^")
	left := map[string]bool{"posix": true, "sysv": true, "xpmem": true, "knem": true, "cma": true}
	for _, t := range strings.Split(strings.TrimPrefix(tls, "^"), ",") {
		var names []string
		switch t = strings.TrimSpace(t); t {
		case "all", "sm", "shm":
			names = []string{"posix", "sysv", "xpmem", "knem", "cma"}
		case "mm":
			names = []string{"posix", "sysv", "xpmem"}
		case "posix", "sysv", "xpmem", "knem", "cma":
			names = []string{t}
		}
		if len(names) > 0 && !exclude {
			return true
		}
		for _, n := range names {
			delete(left, n)
		}
	}
	return exclude && len(left) > 0
}

// loop progresses the worker: it spins while recently busy, then sleeps
// on the worker's event fd (armed) or a back-off timer, until Close.
func (u *ucx) loop() {
	w := u.waker
	idle, busy, afterBackstop := time.Duration(0), 0, false
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	last, window := time.Now(), spinWindow
	for {
		own := len(u.active) > 0
		n, ran := u.pass(afterBackstop)
		afterBackstop = false
		select {
		case <-u.closing:
			u.shutdown()
			return
		default:
		}
		if n > 0 || ran {
			idle, busy, last = 0, 0, time.Now()
			window = spinFor(uint(n), own, u.servesEmulatedPuts())
			if n == 0 {
				runtime.Gosched()
			}
			continue
		}
		if time.Since(last) < window {
			// Recently busy: keep polling so the next command, completion
			// or message is picked up without a thread wake-up.
			runtime.Gosched()
			continue
		}
		// Quiet for the spin window: sleep until the worker has an event, a
		// command arrives, or (transfers in flight, or no event fd) a
		// back-off timer fires.
		var ready <-chan struct{}
		if w != nil && busy < maxBusyArms {
			switch st := C.kvb_arm(u.ctx); st {
			case C.UCS_OK:
				ready, busy = w.wait(), 0
			case C.UCS_ERR_BUSY:
				// Events pending: progress them. An arm that stays busy
				// while progress finds nothing falls back to the timer
				// (no spin at 100 %).
				busy++
				runtime.Gosched()
				continue
			}
			// Any other status: ready stays nil, the timer backs off.
		}
		busy = 0
		var tc <-chan time.Time
		backstop := false
		switch {
		case ready == nil || len(u.active) > 0 || u.adaptiveOn:
			// Where an event might not come: without the event fd, and
			// for completions of transports that raise none. Back off
			// from 20 µs to 1 ms.
			idle = min(max(2*idle, 20*time.Microsecond), time.Millisecond)
			timer.Reset(idle)
			tc = timer.C
		default:
			// Idle and armed: a long backstop against a wake-up UCX does
			// not signal (an event its async thread queued for the next
			// progress). One pass in 5 s costs
			// nothing; missed counts the ones whose progress found work.
			timer.Reset(idleMaxSleep)
			tc, backstop = timer.C, true
		}
		select {
		case f := <-u.cmds:
			f()
			last, window = time.Now(), spinWindow
		case <-ready:
			w.woke()
			u.wakeups.Add(1)
		case <-tc:
			afterBackstop = backstop
		case <-u.closing:
		}
		if tc != nil && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// do runs f on the progress thread and waits for it.
func (u *ucx) do(f func() error) error {
	errc := make(chan error, 1)
	select {
	case u.cmds <- func() { errc <- f() }:
	case <-u.done:
		return nixl.ErrClosed
	}
	select {
	case err := <-errc:
		return err
	case <-u.done:
		return nixl.ErrClosed
	}
}

func (u *ucx) advance() {
	for x := range u.active {
		var msg unsafe.Pointer = x.msg
		notify := C.int(0)
		if x.notify {
			notify = 1
		}
		stage := C.kvb_xfer_advance(u.ctx, x.c, unsafe.Pointer(x.hdr), C.strlen(x.hdr), msg, x.msgLen, notify)
		switch stage {
		case C.KVB_XFER_DONE:
			x.state.Store(uint32(nixl.Done))
			delete(u.active, x)
			signal(u.progress)
		case C.KVB_XFER_FAILED:
			s := ucxErr("transfer", C.int(x.c.status)).Error()
			if x.c.am_write != 0 && x.c.status == C.UCS_ERR_INVALID_ADDR {
				op := "write"
				if x.c.am_read != 0 {
					op = "read"
				}
				s = "the target refused the " + op + ": not memory it has registered (deregistered since its metadata was loaded?), or no longer mapped there"
			}
			x.errMsg.Store(&s)
			x.state.Store(uint32(nixl.Failed))
			delete(u.active, x)
			signal(u.progress)
		}
	}
	kept := u.orphans[:0]
	for _, o := range u.orphans {
		if o.c.outstanding == 0 {
			o.free(u.ctx)
		} else {
			kept = append(kept, o)
		}
	}
	u.orphans = kept
}

func (u *ucx) collectNotifs() {
	for {
		n := C.kvb_notif_pop(u.ctx)
		if n == nil {
			return
		}
		nt := nixl.Notif{Remote: C.GoStringN(n.name, C.int(n.name_len)), Msg: C.GoBytes(n.data, C.int(n.data_len))}
		C.kvb_notif_free(n)
		u.mu.Lock()
		u.queue = append(u.queue, nt)
		u.mu.Unlock()
		signal(u.wake)
	}
}

func (u *ucx) NotifyC() <-chan struct{} { return u.wake }

func (u *ucx) ProgressC() <-chan struct{} { return u.progress }

func (u *ucx) Register(kind nixl.MemKind, descs []nixl.Desc) (any, error) {
	r := &ucxReg{kind: kind}
	if kind == nixl.VRAM {
		// Device memory moves by CUDA IPC: peers map it and copy into it.
		for _, d := range descs {
			k, err := nixl.ExportVRAM(u.cudaLib, d)
			if err != nil {
				return nil, err
			}
			r.mems = append(r.mems, ucxMem{addr: d.Addr, len: d.Len, rkey: k.Encode(), dev: d.Dev})
		}
		return r, u.do(func() error { u.regs[r] = struct{}{}; return nil })
	}
	r.caller = true
	err := u.do(func() error {
		for _, d := range descs {
			m, err := u.mapMem(d.Addr, d.Len, false)
			if err != nil {
				u.unmap(r)
				return err
			}
			r.mems = append(r.mems, m)
		}
		u.regs[r] = struct{}{}
		u.callerRegs++
		u.localIdx = nil
		u.setSpans(r, r.mems)
		return nil
	})
	return r, err
}

func (u *ucx) mapMem(addr uintptr, n uint64, allocate bool) (ucxMem, error) {
	var m ucxMem
	var out C.uintptr_t
	var rk unsafe.Pointer
	var rkLen C.size_t
	var memh C.ucp_mem_h
	alloc := C.int(0)
	if allocate {
		alloc = 1
	}
	st := C.kvb_mem_map(u.ctx, C.uintptr_t(addr), C.size_t(n), alloc, &memh, &out, &rk, &rkLen)
	m.memh = memh
	if err := ucxErr("ucp_mem_map", C.int(st)); err != nil {
		return m, err
	}
	m.addr, m.len, m.rkey = uintptr(out), n, C.GoBytes(rk, C.int(rkLen))
	m.view = view(m.addr, n)
	C.free(rk)
	return m, nil
}

func (u *ucx) unmap(r *ucxReg) {
	u.setSpans(r, nil)
	u.copyMu.Lock() // wait for direct copies from or into this memory
	defer u.copyMu.Unlock()
	for _, m := range r.mems {
		if m.memh != nil {
			C.kvb_mem_unmap(u.ctx, m.memh)
		}
	}
	r.mems = nil
}

func (u *ucx) Deregister(h any) error {
	r := h.(*ucxReg)
	return u.do(func() error {
		u.unmap(r)
		if _, ok := u.regs[r]; ok && r.caller {
			u.callerRegs--
		}
		delete(u.regs, r)
		u.localIdx = nil
		return nil
	})
}

func (u *ucx) Alloc(kind nixl.MemKind, size uint64) ([]byte, any, error) {
	r := &ucxReg{kind: kind}
	var buf []byte
	err := u.do(func() error {
		m, err := u.mapMem(0, size, true)
		if err != nil {
			return err
		}
		r.mems = []ucxMem{m}
		u.regs[r] = struct{}{}
		u.localIdx = nil
		u.setSpans(r, r.mems)
		// UCX-mapped memory, outside the Go heap.
		buf = unsafe.Slice((*byte)(unsafe.Pointer(C.kvb_ptr(C.uintptr_t(m.addr)))), int(size))
		return nil
	})
	return buf, r, err
}

func (u *ucx) Metadata(regs []*nixl.Registration) ([]byte, error) {
	m := nixl.MetadataBlob{Engine: nixl.EngineUCX, Library: u.library, Agent: u.name}
	err := u.do(func() error {
		var addr unsafe.Pointer
		var n C.size_t
		if err := ucxErr("ucp_worker_get_address", C.kvb_worker_address(u.ctx, &addr, &n)); err != nil {
			return err
		}
		m.Payload = C.GoBytes(addr, C.int(n))
		C.free(addr)
		for _, r := range regs {
			ur := r.Handle.(*ucxReg)
			for _, mm := range ur.mems {
				m.Regions = append(m.Regions, nixl.MDRegion{RemoteRegion: nixl.RemoteRegion{Kind: r.Kind, Desc: nixl.Desc{Addr: mm.addr, Len: mm.len, Dev: mm.dev}}, Key: mm.rkey})
			}
		}
		return nil
	})
	return m.Encode(), err
}

// checkWorkerAddress was once the whole check: the header byte
// and a plausible length. Only the fuzz test's child runs it now
// (CheckAddressesAsBefore), to show that it lets through addresses that abort the
// process in ucp_ep_create.
func (u *ucx) checkWorkerAddress(addr []byte) error {
	switch {
	case len(addr) < u.selfAddrMin:
		return fmt.Errorf("UCX worker address of %d bytes, want at least %d: %w", len(addr), u.selfAddrMin, nixl.ErrBadMetadata)
	case len(addr) > nixl.MaxWorkerAddress:
		return fmt.Errorf("UCX worker address of %d bytes exceeds %d: %w", len(addr), nixl.MaxWorkerAddress, nixl.ErrBadMetadata)
	case addr[0] != u.selfAddrHeader:
		return fmt.Errorf("UCX worker address header %#02x (version %d), this process writes %#02x (version %d): "+
			"not an address of this UCX build and configuration: %w",
			addr[0], addr[0]&0xf, u.selfAddrHeader, u.selfAddrHeader&0xf, nixl.ErrBadMetadata)
	}
	return nil
}

// checkPeer validates a peer's worker address and the packed rkeys of its
// DRAM regions completely (addrcheck.go) before UCX parses any of them: a
// blob UCX would misread is refused with the reason, never handed on.
func (u *ucx) checkPeer(m *nixl.MetadataBlob) error {
	if u.legacyCheck.Load() {
		return u.checkWorkerAddress(m.Payload)
	}
	if len(m.Payload) > nixl.MaxWorkerAddress {
		return fmt.Errorf("UCX worker address of %d bytes exceeds %d: %w", len(m.Payload), nixl.MaxWorkerAddress, nixl.ErrBadMetadata)
	}
	a, err := u.local.CheckAddress(m.Payload)
	if err != nil {
		return fmt.Errorf("UCX worker address (%d bytes): %v: %w", len(m.Payload), err, nixl.ErrBadMetadata)
	}
	for i, r := range m.Regions {
		if r.Kind != nixl.DRAM {
			continue
		}
		if err := u.local.CheckRkey(a, r.Key, r.Desc); err != nil {
			return fmt.Errorf("region %d's UCX remote key (%d bytes): %v: %w", i, len(r.Key), err, nixl.ErrBadMetadata)
		}
	}
	// A peer in this process: its regions and keys must be exactly what
	// that agent registered (a write through a wrong one lands in this
	// process's own memory).
	w, err := inProcessPeer(a)
	if err != nil {
		return fmt.Errorf("UCX worker address: %v: %w", err, nixl.ErrBadMetadata)
	}
	if w == nil {
		return nil
	}
	for i, r := range m.Regions {
		if r.Kind != nixl.DRAM {
			continue
		}
		key, ok := w.registeredKey(r.Desc)
		if !ok {
			return fmt.Errorf("region %d [%#x, +%d) is not memory agent %q of this process registered: %w",
				i, r.Addr, r.Len, w.name, nixl.ErrBadMetadata)
		}
		if string(key) != string(r.Key) {
			return fmt.Errorf("region %d's UCX remote key is not the one agent %q of this process packed: %w",
				i, w.name, nixl.ErrBadMetadata)
		}
	}
	return nil
}

func (u *ucx) LoadRemote(md []byte) (string, []nixl.RemoteRegion, error) {
	m, err := nixl.DecodeMetadata(md, nixl.EngineUCX, u.library)
	if err != nil {
		return "", nil, err
	}
	if err := u.checkPeer(m); err != nil {
		return "", nil, fmt.Errorf("agent %q: %w", m.Agent, err)
	}
	r := &ucxRemote{name: m.Agent, regions: m.RemoteRegions()}
	err = u.do(func() error {
		addr := C.CBytes(m.Payload)
		defer C.free(addr)
		var ep *C.kvb_ep
		if err := ucxErr("ucp_ep_create", C.kvb_ep_create(u.ctx, addr, cbool(u.peerErrors), &ep)); err != nil {
			return err
		}
		r.ep = ep
		if err := ucxErr("connecting to "+r.name, C.kvb_ep_wireup(u.ctx, ep)); err != nil {
			u.dropRemote(r)
			return fmt.Errorf("%v: %w", err, nixl.ErrRemoteUnknown)
		}
		// Over a connection whose puts UCX would emulate (tcp), writes go
		// as kvbridge's own active messages (ep.emulated, kvb_xfer_start):
		// a target handling an emulated put from a writer that died aborts
		// in UCX.
		C.kvb_ep_detect(ep)
		for i, reg := range m.Regions {
			if reg.Kind == nixl.VRAM {
				k, err := nixl.DecodeVRAMKey(reg.Key)
				if err != nil {
					u.dropRemote(r)
					return err
				}
				addr, closer, err := nixl.ImportVRAM(u.cudaLib, k, reg.Desc, u.device)
				if err != nil {
					u.dropRemote(r)
					return fmt.Errorf("mapping nixl.VRAM region %d of %s: %w", i, r.name, err)
				}
				r.rkeys = append(r.rkeys, nil)
				r.mapped = append(r.mapped, addr)
				r.views = append(r.views, nil)
				r.closers = append(r.closers, closer)
				continue
			}
			key := C.CBytes(reg.Key)
			var rk C.ucp_rkey_h
			st := C.kvb_rkey_unpack(r.ep, key, &rk)
			C.free(key)
			if err := ucxErr(fmt.Sprintf("ucp_ep_rkey_unpack(region %d)", i), st); err != nil {
				u.dropRemote(r)
				return fmt.Errorf("%v: %w", err, nixl.ErrBadMetadata)
			}
			r.rkeys = append(r.rkeys, rk)
			mapped := uintptr(C.kvb_rkey_ptr(rk, C.uint64_t(reg.Addr)))
			r.mapped = append(r.mapped, mapped)
			var v []byte
			if mapped != 0 {
				v = view(mapped, reg.Len)
			}
			r.views = append(r.views, v)
		}
		r.idx = nixl.NewRegionIndex(r.regions)
		if old, ok := u.remotes[r.name]; ok {
			u.dropRemote(old)
		}
		u.remotes[r.name] = r
		return nil
	})
	if err != nil {
		return "", nil, err
	}
	return r.name, r.regions, nil
}

// ucxCloseWait bounds an endpoint's flushing close (kvb_ep_close): the
// writes in flight to a live peer land first; a peer stopped or gone for
// longer is left to UCX.
const ucxCloseWait = 5 * time.Second

// dropRemote fails the remote's transfers and closes its endpoint.
func (u *ucx) dropRemote(r *ucxRemote) {
	u.copyMu.Lock() // wait for direct copies through r's mappings
	r.dropped = true
	u.copyMu.Unlock()
	for x := range u.active {
		if x.c.ep == r.ep {
			C.kvb_xfer_cancel(u.ctx, x.c)
		}
	}
	u.advance()
	for _, rk := range r.rkeys {
		if rk != nil {
			C.kvbu_rkey_destroy(rk)
		}
	}
	r.rkeys = nil
	for _, c := range r.closers {
		_ = c()
	}
	r.closers = nil
	if r.ep != nil {
		C.kvb_ep_close(u.ctx, r.ep, C.uint(ucxCloseWait/time.Millisecond))
		r.ep = nil
	}
}

// WritesRefused reads the write path's bad-input counters (kvb_ctx) on the
// progress thread, which alone writes them.
func (u *ucx) WritesRefused() (refused, strayAcks uint64) {
	_ = u.do(func() error {
		refused, strayAcks = uint64(u.ctx.writes_refused), uint64(u.ctx.acks_unknown)
		return nil
	})
	return refused, strayAcks
}

// readWindow is KVB_READ_WINDOW: a read's chunk requests out ahead of
// their answers, at most.
const readWindow = C.KVB_READ_WINDOW

// ReadAheadMax returns the most chunk requests of one read seen out ahead
// of their answers, and the window that bounds them (the read path over
// tcp; the progress thread writes it). A diagnostic, as MissedWakes.
func (u *ucx) ReadAheadMax() (n, window uint64) {
	_ = u.do(func() error {
		n = uint64(u.ctx.read_ahead_max)
		return nil
	})
	return n, readWindow
}

// Library returns the UCX release this agent's metadata blobs name
// ("ucx/1.13.1").
func (u *ucx) Library() string { return u.library }

// CheckAddressesAsBefore makes the agent check peers' worker addresses as
// kvbridge once did: the header byte and the length. Only internal/nixl's
// metadata fuzz test calls it, in a child process, to show that check lets
// through addresses that abort the process inside UCX.
func (u *ucx) CheckAddressesAsBefore() { u.legacyCheck.Store(true) }

// MissedWakes returns how many of the idle backstop's passes found work
// that no event on the worker's event fd signalled: wake-ups the agent
// slept through.
func (u *ucx) MissedWakes() uint64 { return u.missed.Load() }

// sendRawAM sends remote one active message as given: the engine's tests
// play a hostile or broken peer with it (malformed write headers, writes
// outside registered memory, forged acknowledgements).
func (u *ucx) sendRawAM(remote string, id int, hdr, data []byte, flags uint) error {
	return u.do(func() error {
		r, ok := u.remotes[remote]
		if !ok || r.ep == nil {
			return nixl.ErrRemoteUnknown
		}
		return ucxErr("raw active message", C.kvb_am_raw(u.ctx, r.ep, C.uint(id), bytesPtr(hdr), C.size_t(len(hdr)), bytesPtr(data), C.size_t(len(data)), C.uint(flags)))
	})
}

// answerReadsBadly has the engine answer reads as a broken or hostile
// target would (tests; ucx_engine.h test_bad_answers; 0: as it should).
func (u *ucx) answerReadsBadly(mode int) error {
	return u.do(func() error { u.ctx.test_bad_answers = C.int(mode); return nil })
}

// RemoteUsable: the remote's endpoint exists and has not failed.
func (u *ucx) RemoteUsable(remote string) bool {
	ok := false
	u.do(func() error {
		r := u.remotes[remote]
		ok = r != nil && r.ep != nil && r.ep.failed == 0
		return nil
	})
	return ok
}

// fillReadAnswers has the engine count its read answers' queue as full, or
// empty again (tests: a reader that does not drain its answers).
func (u *ucx) fillReadAnswers(full bool) error {
	return u.do(func() error {
		u.ctx.rdata_pending = 0
		if full {
			u.ctx.rdata_pending = C.KVB_RDATA_PENDING
		}
		return nil
	})
}

// bytesPtr is b's first byte for a C call that copies it before returning
// (nil when empty).
func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

func (u *ucx) Invalidate(name string) error {
	return u.do(func() error {
		if r, ok := u.remotes[name]; ok {
			u.dropRemote(r)
			delete(u.remotes, name)
		}
		return nil
	})
}

func (u *ucx) Prep(remote string, kind nixl.MemKind, descs []nixl.Desc) (any, error) {
	p := &ucxPrep{ptrs: make([]C.uint64_t, len(descs)), lens: make([]C.uint64_t, len(descs))}
	for i, d := range descs {
		p.ptrs[i], p.lens[i] = C.uint64_t(d.Addr), C.uint64_t(d.Len)
	}
	err := u.do(func() error {
		if remote == "" {
			p.memhs = make([]C.ucp_mem_h, len(descs))
			p.addrs = make([]uintptr, len(descs))
			p.spans = make([]uintptr, len(descs))
			if kind == nixl.DRAM {
				p.views = make([][]byte, len(descs))
			}
			idx := u.localIndex()
			for i, d := range descs {
				p.addrs[i] = d.Addr
				if kind == nixl.DRAM {
					j := idx.Lookup(nixl.DRAM, d)
					if j < 0 {
						return fmt.Errorf("local descriptor %d is not in UCX-registered memory: %w", i, nixl.ErrInvalidDescriptor)
					}
					m := u.localMems[j]
					off := uint64(d.Addr - m.addr)
					p.memhs[i], p.views[i], p.spans[i] = m.memh, m.view[off:off+d.Len:off+d.Len], uintptr(j)
				} else {
					p.spans[i] = u.vramSpan(d)
				}
			}
			return nil
		}
		r, ok := u.remotes[remote]
		if !ok {
			return nixl.ErrRemoteUnknown
		}
		p.remote = r
		p.keys = make([]C.ucp_rkey_h, len(descs))
		p.spans = make([]uintptr, len(descs))
		p.addrs = make([]uintptr, len(descs))
		if kind == nixl.DRAM {
			p.views = make([][]byte, len(descs))
		}
		for i, d := range descs {
			j := r.idx.Lookup(kind, d)
			if j < 0 {
				return fmt.Errorf("descriptor %d outside %s's regions: %w", i, remote, nixl.ErrInvalidDescriptor)
			}
			reg := r.regions[j]
			p.keys[i], p.spans[i] = r.rkeys[j], uintptr(j)
			if r.mapped[j] != 0 && p.addrs != nil {
				p.addrs[i] = r.mapped[j] + (d.Addr - reg.Addr)
			}
			if p.addrs != nil && p.addrs[i] == 0 {
				p.addrs = nil
			}
			if p.views != nil && r.views[j] != nil {
				off := uint64(d.Addr - reg.Addr)
				p.views[i] = r.views[j][off : off+d.Len : off+d.Len]
			} else {
				p.views = nil
			}
		}
		return nil
	})
	return p, err
}

// view returns registered memory (C, UCX-mapped, or pinned Go memory) as a
// byte slice; the conversion goes through C so no uintptr becomes a Go
// pointer in Go code.
func view(addr uintptr, n uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(C.kvb_ptr(C.uintptr_t(addr)))), int(n))
}

// localIndex indexes this agent's DRAM registrations (rebuilt after a
// registration changes; progress goroutine only).
func (u *ucx) localIndex() *nixl.RegionIndex {
	if u.localIdx == nil {
		var rs []nixl.RemoteRegion
		u.localMems = u.localMems[:0]
		for r := range u.regs {
			for _, m := range r.mems {
				if m.memh != nil {
					rs = append(rs, nixl.RemoteRegion{Kind: nixl.DRAM, Desc: nixl.Desc{Addr: m.addr, Len: m.len}})
					u.localMems = append(u.localMems, m)
				}
			}
		}
		u.localIdx = nixl.NewRegionIndex(rs)
	}
	return u.localIdx
}

// vramSpan names the local VRAM registration piece holding d (one
// allocation, as nixl.ExportVRAM exported it) by its address in Go memory, an
// identity only; DRAM spans are indices into u.localMems, never
// compared with these (a transfer's local side is one memory kind).
func (u *ucx) vramSpan(d nixl.Desc) uintptr {
	for r := range u.regs {
		if r.kind != nixl.VRAM {
			continue
		}
		for i := range r.mems {
			m := &r.mems[i]
			if d.Addr >= m.addr && d.Addr-m.addr <= uintptr(m.len) && d.Len <= m.len-uint64(d.Addr-m.addr) {
				return uintptr(unsafe.Pointer(m))
			}
		}
	}
	return 0
}

func (u *ucx) Unprep(any) error { return nil }

func (u *ucx) Post(x *nixl.Xfer) error {
	lp, rp := x.LocalPrep.Handle.(*ucxPrep), x.RemotePrep.Handle.(*ucxPrep)
	ux, _ := x.Handle.(*ucxXfer)
	if ux != nil && nixl.XferState(ux.state.Load()) == nixl.InProgress {
		return fmt.Errorf("transfer still in progress: %w", nixl.ErrInvalidRequest)
	}
	n := len(x.LocalIdx)
	if ux == nil {
		ux = &ucxXfer{hdr: C.CString(u.name)}
		if x.Notif != nil {
			ux.notify = true
			ux.msg, ux.msgLen = C.CBytes(x.Notif), C.size_t(len(x.Notif))
		}
		x.Handle = ux
	}
	if x.LocalPrep.Kind == nixl.VRAM || x.RemotePrep.Kind == nixl.VRAM {
		if rp.addrs == nil {
			return fmt.Errorf("%v to %v needs the remote memory mapped in this process (CUDA IPC, shared memory): %w",
				x.LocalPrep.Kind, x.RemotePrep.Kind, nixl.ErrUnsupported)
		}
		return u.postDirect(x, ux, lp, rp)
	}
	if rp.views != nil && lp.views != nil {
		return u.postDirect(x, ux, lp, rp)
	}
	// Gather the pairs into C arrays for one call.
	arr := C.malloc(C.size_t(n) * (3*8 + 2*C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(arr)
	laddr := unsafe.Slice((*C.uint64_t)(arr), n)
	lens := unsafe.Slice((*C.uint64_t)(unsafe.Add(arr, 8*n)), n)
	raddr := unsafe.Slice((*C.uint64_t)(unsafe.Add(arr, 16*n)), n)
	rkeys := unsafe.Slice((*C.ucp_rkey_h)(unsafe.Add(arr, 24*n)), n)
	memhs := unsafe.Slice((*C.ucp_mem_h)(unsafe.Add(arr, 24*n+int(unsafe.Sizeof(uintptr(0)))*n)), n)
	// Pairs adjacent on both sides under the same keys become one put
	// (lists prepared page by page still move a contiguous run at once).
	m := 0
	for k := 0; k < n; k++ {
		li, ri := x.LocalIdx[k], x.RemoteIdx[k]
		if m > 0 && laddr[m-1]+lens[m-1] == lp.ptrs[li] && raddr[m-1]+lens[m-1] == rp.ptrs[ri] &&
			rkeys[m-1] == rp.keys[ri] && memhs[m-1] == lp.memhs[li] {
			lens[m-1] += lp.lens[li]
			continue
		}
		laddr[m], lens[m], raddr[m] = lp.ptrs[li], lp.lens[li], rp.ptrs[ri]
		rkeys[m], memhs[m] = rp.keys[ri], lp.memhs[li]
		m++
	}
	n = m
	x.SetPieces(n)
	read := C.int(0)
	if x.Op == nixl.Read {
		read = 1
	}
	return u.do(func() error {
		if u.remotes[x.Remote] != rp.remote || rp.remote.ep == nil {
			return fmt.Errorf("remote %q was reloaded or invalidated since prep: %w", x.Remote, nixl.ErrRemoteUnknown)
		}
		if ux.c == nil {
			ux.c = (*C.kvb_xfer)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvb_xfer{}))))
		}
		ux.errMsg.Store(nil)
		ux.state.Store(uint32(nixl.InProgress))
		u.active[ux] = struct{}{}
		u.all[ux] = struct{}{}
		C.kvb_xfer_start(u.ctx, ux.c, rp.remote.ep, read, C.int(n), &laddr[0], &lens[0], &raddr[0], &rkeys[0], &memhs[0])
		return nil
	})
}

// directCopyInline is the largest write postDirect copies on the caller's
// goroutine; a larger one is copied on a goroutine of its own, so the
// caller (a transfer worker) goes on posting other rooms' writes instead of
// waiting behind one room's long copy.
const directCopyInline = 1 << 20

// postDirect copies into (or, for READ, out of) peer memory mapped in this
// process, then has the progress thread send the notification. Go's copy
// runs near memcpy speed, faster than UCX's shared memory put (which uses
// non-temporal stores for large sizes), and a small write costs no thread
// hand-off before its data lands. Copies hold u.copyMu for reading:
// unmapping local or peer memory takes it for writing, so no copy runs
// through a mapping being taken away.
func (u *ucx) postDirect(x *nixl.Xfer, ux *ucxXfer, lp, rp *ucxPrep) error {
	ep := rp.remote.ep
	if ux.c == nil {
		ux.c = (*C.kvb_xfer)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvb_xfer{}))))
	}
	ux.errMsg.Store(nil)
	ux.state.Store(uint32(nixl.InProgress))
	var total uint64
	for _, li := range x.LocalIdx {
		total += uint64(lp.lens[li])
	}
	fail := func(s string) {
		ux.errMsg.Store(&s)
		ux.state.Store(uint32(nixl.Failed))
		signal(u.progress)
	}
	copyAndNotify := func() {
		u.copyMu.RLock()
		if rp.remote.dropped {
			u.copyMu.RUnlock()
			fail(fmt.Sprintf("remote %q was invalidated before the copy", x.Remote))
			return
		}
		err := u.copyDirect(x, lp, rp)
		u.copyMu.RUnlock()
		if err != nil {
			fail(err.Error())
			return
		}
		// The channel hand-off orders the copy's stores before the notification.
		select {
		case u.cmds <- func() {
			if ux.c == nil {
				// Released during the copy: its C struct is freed and
				// nobody waits for it (a released transfer is cancelled).
				return
			}
			if u.remotes[x.Remote] != rp.remote || rp.remote.ep == nil {
				s := fmt.Sprintf("remote %q was invalidated during the copy", x.Remote)
				ux.errMsg.Store(&s)
				ux.state.Store(uint32(nixl.Failed))
				signal(u.progress)
				return
			}
			C.kvb_xfer_copied(ux.c, ep, cbool(ux.notify))
			u.active[ux] = struct{}{}
			u.all[ux] = struct{}{}
		}:
		case <-u.done:
			fail("agent closed")
		}
	}
	if total <= directCopyInline {
		copyAndNotify()
		return nil
	}
	u.copiesMu.Lock()
	if u.copiesDone {
		u.copiesMu.Unlock()
		fail("agent closed")
		return nil
	}
	u.copies.Add(1)
	u.copiesMu.Unlock()
	go func() {
		defer u.copies.Done()
		copyAndNotify()
	}()
	return nil
}

// copyDirect does a direct write's copies (u.copyMu held for reading):
// one per run of pairs adjacent on both sides inside one local
// registration and one peer region (coalesce).
func (u *ucx) copyDirect(x *nixl.Xfer, lp, rp *ucxPrep) error {
	vram := x.LocalPrep.Kind == nixl.VRAM || x.RemotePrep.Kind == nixl.VRAM
	addr := func(p *ucxPrep, i int) uint64 {
		if vram {
			return uint64(p.addrs[i])
		}
		return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p.views[i]))))
	}
	var dst, src []uintptr
	var lens []uint64
	runs := nixl.Coalesce(len(x.LocalIdx),
		func(k int) uint64 { return addr(lp, x.LocalIdx[k]) },
		func(k int) uint64 { return addr(rp, x.RemoteIdx[k]) },
		func(k int) uint64 { return uint64(lp.lens[x.LocalIdx[k]]) },
		func(k int) bool {
			return lp.spans[x.LocalIdx[k]] == lp.spans[x.LocalIdx[k-1]] && rp.spans[x.RemoteIdx[k]] == rp.spans[x.RemoteIdx[k-1]]
		},
		func(r nixl.PieceRun) {
			if vram {
				dst, src, lens = append(dst, rp.addrs[x.RemoteIdx[r.First]]), append(src, lp.addrs[x.LocalIdx[r.First]]), append(lens, r.Len)
				return
			}
			// A run lies inside one view's backing (its registration's
			// mapping, its peer region's): the slices over it stay inside
			// one object.
			lv := unsafe.Slice(unsafe.SliceData(lp.views[x.LocalIdx[r.First]]), r.Len)
			rv := unsafe.Slice(unsafe.SliceData(rp.views[x.RemoteIdx[r.First]]), r.Len)
			if x.Op == nixl.Read {
				copy(lv, rv)
			} else {
				copy(rv, lv)
			}
		})
	x.SetPieces(runs)
	if vram {
		// CUDA copies with unified addressing, all queued, one wait: the
		// bytes are in place before the notification is handed on.
		if x.Op == nixl.Read {
			dst, src = src, dst
		}
		return nixl.DeviceCopies(u.cudaLib, u.device, dst, src, lens)
	}
	return nil
}

func (u *ucx) Status(x *nixl.Xfer) (nixl.XferState, error) {
	ux, ok := x.Handle.(*ucxXfer)
	if !ok {
		return nixl.Failed, fmt.Errorf("transfer not posted: %w", nixl.ErrInvalidRequest)
	}
	st := nixl.XferState(ux.state.Load())
	if st == nixl.Failed {
		msg := "failed"
		if p := ux.errMsg.Load(); p != nil {
			msg = *p
		}
		return nixl.Failed, fmt.Errorf("%s: %w", msg, nixl.ErrTransfer)
	}
	return st, nil
}

func (u *ucx) Release(x *nixl.Xfer) error {
	ux, ok := x.Handle.(*ucxXfer)
	if !ok {
		return nil
	}
	x.Handle = nil
	return u.do(func() error {
		delete(u.all, ux)
		u.freeXfer(ux)
		return nil
	})
}

// ucxOrphan is a released transfer whose sends are still queued in UCX:
// its C struct, and the notification's header and message those sends
// read, are freed once every callback ran.
type ucxOrphan struct {
	c   *C.kvb_xfer
	hdr *C.char
	msg unsafe.Pointer
}

func (o ucxOrphan) free(ctx *C.kvb_ctx) {
	if o.c != nil {
		C.kvb_xfer_free(ctx, o.c)
	}
	C.free(unsafe.Pointer(o.hdr))
	if o.msg != nil {
		C.free(o.msg)
	}
}

// freeXfer releases a transfer's C memory (on the progress thread).
func (u *ucx) freeXfer(ux *ucxXfer) {
	o := ucxOrphan{c: ux.c, hdr: ux.hdr, msg: ux.msg}
	ux.c, ux.hdr, ux.msg = nil, nil, nil
	if o.c != nil {
		if _, live := u.active[ux]; live {
			C.kvb_xfer_cancel(u.ctx, o.c)
			delete(u.active, ux)
		}
		if o.c.outstanding > 0 {
			u.orphans = append(u.orphans, o) // freed when its callbacks have run
			return
		}
	}
	o.free(u.ctx)
}

func (u *ucx) GenNotif(remote string, msg []byte) error {
	return u.do(func() error {
		r, ok := u.remotes[remote]
		if !ok {
			return nixl.ErrRemoteUnknown
		}
		// kvb_send_notif copies both before it returns: Go memory is passed.
		hdr := []byte(u.name)
		return ucxErr("ucp_am_send_nbx", C.kvb_send_notif(u.ctx, r.ep, bytesPtr(hdr), C.size_t(len(hdr)), bytesPtr(msg), C.size_t(len(msg))))
	})
}

func (u *ucx) Notifs() ([]nixl.Notif, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	q := u.queue
	u.queue = nil
	return q, nil
}

func (u *ucx) Close() error {
	select {
	case <-u.closing:
	default:
		close(u.closing)
	}
	<-u.done
	// A copy still running fails its transfer at u.done; none starts after
	// (a post racing Close finds copiesDone).
	u.copiesMu.Lock()
	u.copiesDone = true
	u.copiesMu.Unlock()
	u.copies.Wait()
	return nil
}

// shutdown runs on the progress thread: fail what is in flight, let the
// cancellations run, then release every UCX object.
func (u *ucx) shutdown() {
	ucxProcess.Lock()
	delete(ucxProcess.agents, u)
	ucxProcess.Unlock()
	for x := range u.active {
		s := "agent closed"
		x.errMsg.Store(&s)
		x.state.Store(uint32(nixl.Failed))
	}
	for x := range u.all {
		u.freeXfer(x) // cancels what is in flight
	}
	for _, r := range u.remotes {
		u.dropRemote(r)
	}
	// The endpoints' closes end before the worker does (each within
	// ucxCloseWait): a worker destroyed under a flush cuts the writes in
	// flight, and over tcp the peer then aborts in UCX (see kvb_ep_close).
	for i := 0; (i < 100000 && len(u.orphans) > 0) || C.kvb_closing(u.ctx) > 0; i++ {
		C.kvb_progress(u.ctx)
		u.advance()
	}
	for r := range u.regs {
		u.unmap(r)
	}
	if u.waker != nil {
		u.waker.close()
	}
	C.kvb_destroy(u.ctx)
	for {
		select {
		case f := <-u.cmds:
			_ = f // callers waiting in do() see done closed
		default:
			return
		}
	}
}
