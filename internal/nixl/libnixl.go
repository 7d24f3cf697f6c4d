package nixl

/*
#cgo LDFLAGS: -ldl
#cgo CFLAGS: -I${SRCDIR}/../dl
#include <stdlib.h>
#include <stdint.h>
#include <sys/mman.h>
#include "libnixl_engine.h"

// Trampolines: cgo cannot call C function pointers directly.
static int nx_create_configured_agent(kvb_nixl *l, const char *n, int prog, int sync, uint64_t delay_us, nx_h *a) {
	nx_agent_config c = {0};
	c.enable_prog_thread = prog != 0;
	c.thread_sync = sync;
	c.pthr_delay_us = delay_us;
	c.lthr_delay_us = 100000;
	return l->create_configured_agent(n, &c, a);
}
static void nx_mem_free(kvb_nixl *l, void *p) { if (l->mem_free) l->mem_free(p); else free(p); }

// nx_alloc maps size bytes of zeroed anonymous memory on a 2 MiB boundary
// and asks for transparent huge pages (a hint: where THP is off the pages
// are 4 KiB); nx_unmap gives it back. NIXL's UCX moves such memory between
// processes with cma, whose page pinning and the copies' TLB misses cost
// less over huge pages. Each allocation takes whole 2 MiB pages (kvbench's
// caller memory and its C reference map theirs the same way).
static void *nx_alloc(size_t size, size_t *mapped) {
	const size_t huge = 2u << 20;
	if (size > SIZE_MAX - 2 * huge) return NULL;
	size_t n = size == 0 ? huge : (size + huge - 1) / huge * huge;
	char *p = mmap(NULL, n + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) return NULL;
	char *a = (char *)(((uintptr_t)p + huge - 1) / huge * huge);
	if (a > p) munmap(p, a - p);
	char *end = p + n + huge;
	if (end > a + n) munmap(a + n, end - (a + n));
	madvise(a, n, MADV_HUGEPAGE);
	*mapped = n;
	return a;
}
static void nx_unmap(void *p, size_t n) { munmap(p, n); }
static int nx_destroy_agent(kvb_nixl *l, nx_h a) { return l->destroy_agent(a); }
static int nx_get_local_md(kvb_nixl *l, nx_h a, void **d, size_t *n) { return l->get_local_md(a, d, n); }
static int nx_load_remote_md(kvb_nixl *l, nx_h a, const void *d, size_t n, char **name) { return l->load_remote_md(a, d, n, name); }
static int nx_invalidate_remote_md(kvb_nixl *l, nx_h a, const char *r) { return l->invalidate_remote_md(a, r); }
static int nx_get_plugin_params(kvb_nixl *l, nx_h a, const char *p, nx_h *m, nx_h *pa) { return l->get_plugin_params(a, p, m, pa); }
static int nx_destroy_mem_list(kvb_nixl *l, nx_h m) { return l->destroy_mem_list(m); }
static int nx_destroy_params(kvb_nixl *l, nx_h p) { return l->destroy_params(p); }
static int nx_has_params_add(kvb_nixl *l) { return l->params_add != NULL; }
static int nx_params_add(kvb_nixl *l, nx_h p, const char *k, const char *v) { return l->params_add(p, k, v); }
static int nx_create_backend(kvb_nixl *l, nx_h a, const char *p, nx_h pa, nx_h *b) { return l->create_backend(a, p, pa, b); }
static int nx_destroy_backend(kvb_nixl *l, nx_h b) { return l->destroy_backend(b); }
static int nx_create_opt_args(kvb_nixl *l, nx_h *o) { return l->create_opt_args(o); }
static int nx_destroy_opt_args(kvb_nixl *l, nx_h o) { return l->destroy_opt_args(o); }
static int nx_opt_args_add_backend(kvb_nixl *l, nx_h o, nx_h b) { return l->opt_args_add_backend(o, b); }
static int nx_opt_args_set_notif_msg(kvb_nixl *l, nx_h o, const void *d, size_t n) { return l->opt_args_set_notif_msg(o, d, n); }
static int nx_opt_args_set_has_notif(kvb_nixl *l, nx_h o, int v) { return l->opt_args_set_has_notif(o, v != 0); }
static int nx_create_reg_dlist(kvb_nixl *l, int m, nx_h *d) { return l->create_reg_dlist(m, d); }
static int nx_destroy_reg_dlist(kvb_nixl *l, nx_h d) { return l->destroy_reg_dlist(d); }
static int nx_reg_dlist_add_desc(kvb_nixl *l, nx_h d, uintptr_t a, size_t n, uint64_t dev) { return l->reg_dlist_add_desc(d, a, n, dev, NULL, 0); }
static int nx_register_mem(kvb_nixl *l, nx_h a, nx_h d, nx_h o) { return l->register_mem(a, d, o); }
static int nx_deregister_mem(kvb_nixl *l, nx_h a, nx_h d, nx_h o) { return l->deregister_mem(a, d, o); }
static int nx_create_xfer_dlist(kvb_nixl *l, int m, nx_h *d) { return l->create_xfer_dlist(m, d); }
static int nx_destroy_xfer_dlist(kvb_nixl *l, nx_h d) { return l->destroy_xfer_dlist(d); }
static int nx_xfer_dlist_add_desc(kvb_nixl *l, nx_h d, uintptr_t a, size_t n, uint64_t dev) { return l->xfer_dlist_add_desc(d, a, n, dev); }
static int nx_prep_xfer_dlist(kvb_nixl *l, nx_h a, const char *r, nx_h d, nx_h *h, nx_h o) { return l->prep_xfer_dlist(a, r, d, h, o); }
static int nx_release_xfer_dlist_handle(kvb_nixl *l, nx_h a, nx_h h) { return l->release_xfer_dlist_handle(a, h); }
static int nx_make_xfer_req(kvb_nixl *l, nx_h a, int op, nx_h lh, const int *li, size_t ln, nx_h rh, const int *ri, size_t rn, nx_h *req, nx_h o) { return l->make_xfer_req(a, op, lh, li, ln, rh, ri, rn, req, o); }
static int nx_post_xfer_req(kvb_nixl *l, nx_h a, nx_h r, nx_h o) { return l->post_xfer_req(a, r, o); }
static int nx_get_xfer_status(kvb_nixl *l, nx_h a, nx_h r) { return l->get_xfer_status(a, r); }
static int nx_release_xfer_req(kvb_nixl *l, nx_h a, nx_h r) { return l->release_xfer_req(a, r); }
static int nx_destroy_xfer_req(kvb_nixl *l, nx_h r) { return l->destroy_xfer_req(r); }
static int nx_gen_notif(kvb_nixl *l, nx_h a, const char *r, const void *d, size_t n, nx_h o) { return l->gen_notif(a, r, d, n, o); }
static int nx_create_notif_map(kvb_nixl *l, nx_h *m) { return l->create_notif_map(m); }
static int nx_destroy_notif_map(kvb_nixl *l, nx_h m) { return l->destroy_notif_map(m); }
static int nx_get_notifs(kvb_nixl *l, nx_h a, nx_h m, nx_h o) { return l->get_notifs(a, m, o); }
static int nx_notif_map_size(kvb_nixl *l, nx_h m, size_t *n) { return l->notif_map_size(m, n); }
static int nx_notif_map_get_agent_at(kvb_nixl *l, nx_h m, size_t i, const char **s) { return l->notif_map_get_agent_at(m, i, s); }
static int nx_notif_map_get_notifs_size(kvb_nixl *l, nx_h m, const char *s, size_t *n) { return l->notif_map_get_notifs_size(m, s, n); }
static int nx_notif_map_get_notif(kvb_nixl *l, nx_h m, const char *s, size_t i, const void **d, size_t *n) { return l->notif_map_get_notif(m, s, i, d, n); }
static int nx_notif_map_clear(kvb_nixl *l, nx_h m) { return l->notif_map_clear(m); }
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// NIXLError is a failed NIXL C API call; it unwraps to the kvbridge error
// that matches its status.
type NIXLError struct {
	Call   string
	Status int
}

var nixlStatusNames = map[int]string{-1: "invalid parameter", -2: "backend error", -3: "invalid state",
	-4: "exception", -5: "no telemetry", -6: "not found"}

func (e *NIXLError) Error() string {
	name, ok := nixlStatusNames[e.Status]
	if !ok {
		name = "unknown status"
	}
	return fmt.Sprintf("%s: %s (%d)", e.Call, name, e.Status)
}

// Unwrap maps NIXL's status codes onto the package's errors.
func (e *NIXLError) Unwrap() error {
	switch e.Status {
	case C.NX_ERROR_INVALID_PARAM, C.NX_ERROR_INVALID_STATE:
		return ErrInvalidRequest
	case C.NX_ERROR_NOT_FOUND:
		return ErrRemoteUnknown
	default:
		return ErrTransfer
	}
}

func nxErr(call string, st C.int) error {
	if st == C.NX_SUCCESS || st == C.NX_IN_PROG {
		return nil
	}
	return &NIXLError{Call: call, Status: int(st)}
}

var nixlLib struct {
	sync.Mutex
	path string
	lib  *C.kvb_nixl
	// library is what libnixl agents put in their metadata blobs: the UCX
	// release NIXL's UCX plugin runs, read once, when the first agent's
	// backend has loaded the plugin (NIXL's C API has no version call).
	library string
	ucxVer  UCXVersion
}

// nixlLibrary is the library string of this process's libnixl agents.
func nixlLibrary() (string, UCXVersion) {
	nixlLib.Lock()
	defer nixlLib.Unlock()
	if nixlLib.library == "" {
		var major, minor, release C.uint
		if C.kvb_loaded_ucx_version(&major, &minor, &release) > 0 {
			nixlLib.ucxVer = UCXVersion{uint(major), uint(minor), uint(release)}
			nixlLib.library = "nixl/ucx-" + nixlLib.ucxVer.String()
		} else {
			nixlLib.library = "nixl/ucx-unknown"
		}
	}
	return nixlLib.library, nixlLib.ucxVer
}

// loadNIXL loads the C API once per process, under LockOSThread because
// dlerror is per thread. A second, different path is refused before it is
// opened: one NIXL per process (agents of two builds could not talk anyway).
func loadNIXL(path string) (*C.kvb_nixl, error) {
	nixlLib.Lock()
	defer nixlLib.Unlock()
	if nixlLib.lib != nil {
		if path == nixlLib.path {
			return nixlLib.lib, nil
		}
		if _, err := os.Stat(path); err != nil && strings.Contains(path, "/") {
			return nil, fmt.Errorf("NIXL is not installed or not loadable (%v); set Config.NIXLLib (KVBRIDGE_NIXL_LIB in the example binaries) to libnixl_capi.so: %w", err, ErrEngineUnavailable)
		}
		return nil, fmt.Errorf("libnixl: %s requested but %s is already loaded: %w", path, nixlLib.path, ErrEngineUnavailable)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [1024]C.char
	lib := C.kvb_nixl_load(cpath, &errbuf[0], C.size_t(len(errbuf)))
	if lib == nil {
		return nil, fmt.Errorf("NIXL is not installed or not loadable (%s); set Config.NIXLLib (KVBRIDGE_NIXL_LIB in the example binaries) to libnixl_capi.so: %w",
			C.GoString(&errbuf[0]), ErrEngineUnavailable)
	}
	nixlLib.path, nixlLib.lib = path, lib
	return lib, nil
}

func memType(k MemKind) C.int {
	if k == VRAM {
		return C.NX_MEM_VRAM
	}
	return C.NX_MEM_DRAM
}

// nixlEngineConfig is the UCX settings kvbridge gives NIXL's UCX backend
// (its "engine_config" parameter, KEY=VALUE,...), after the user's own:
// UCX's adaptive progress off, as the ucx engine has it — it deactivates
// interfaces it finds idle, and a worker asleep on its event fd was seen to
// miss events then (a write's notification never woke its target). NIXL leaves a key alone when its UCX_*
// variable is set.
//
// An agent without NIXL's progress thread (caller: strict lock) also gets
// cma's segment at cmaSegSize (UCX's default 512 KiB): NIXL's status call
// (which its post makes too: over cma a write is copied, and its
// notification sent, inside the post) progresses the worker until nothing
// is left to do, so the whole copy of every transfer queued runs in that
// one call, under the strict lock, whatever the segment — a larger one
// only makes it fewer process_vm_writev calls (128 to 1 for 64 MiB). A
// threaded agent keeps
// UCX's segment, between which its thread lets a concurrent post take the
// worker.
func nixlEngineConfig(user string, caller bool) string {
	set := map[string]bool{}
	for _, kv := range strings.Split(user, ",") {
		k, _, _ := strings.Cut(kv, "=")
		set[strings.TrimSpace(k)] = true
	}
	var add []string
	if !set["ADAPTIVE_PROGRESS"] {
		add = append(add, "ADAPTIVE_PROGRESS=n")
	}
	if caller && !set["CMA_SEG_SIZE"] {
		add = append(add, "CMA_SEG_SIZE="+cmaSegSize)
	}
	if user != "" && len(add) > 0 {
		user += ","
	}
	return user + strings.Join(add, ",")
}

// cmaSegSize is the cma segment a caller-progressed agent's UCX copies at
// (nixlEngineConfig).
const cmaSegSize = "64M"

// libnixl is the engine on the NIXL C API. Config.NIXLProgress picks who
// progresses the agent's UCX worker: NIXL's progress thread with NIXL's
// read-write lock (NIXL_THREAD_SYNC_RW), or no thread and NIXL's strict
// lock (NIXL_THREAD_SYNC_STRICT); concurrent calls are NIXL's to order,
// and life orders them against close.
//
// Why the choice: a target needs its worker progressed for
// writes to it to complete (a notification's acknowledgement, an
// endpoint's wire-up), which NIXL's thread does on the worker's events.
// But in NIXL <= 1.4.0 the UCX backend's endpoint error callback, run on
// that thread, closes (frees) the endpoint while a concurrent post has
// checked its state and is about to use it (nixlUcxEp::err_cb,
// nixlUcxEp::write): a peer killed mid-transfer crashes a posting process.
// Without the thread the callback runs only inside a call that touches
// the worker, and the strict lock lets no post run then; the Agent's
// completion watcher (status polls while transfers are in flight), the
// GenNotif flusher and Notifs progress it, and an idle agent makes no
// calls.
type libnixl struct {
	l    *C.kvb_nixl
	name string

	// life: every call into the agent holds it for reading; close holds it
	// for writing, so no call runs on (or after) a destroyed agent.
	life    sync.RWMutex
	agent   C.nx_h // nil once closed
	backend C.nx_h
	opt     C.nx_h // opt args naming the UCX backend

	nmu  sync.Mutex // the notification map is ours: one drain at a time
	nmap C.nx_h
	// stash: notifications the GenNotif flusher drained, for the next
	// notifs call (under nmu).
	stash []Notif

	// The GenNotif flusher (no progress thread only): NIXL's UCX genNotif
	// returns success while its eager message may still be pending, and
	// only a call that progresses this agent's worker sends it, so after
	// each GenNotif a goroutine progresses the agent for genNotifFlush.
	prog       bool
	flushMu    sync.Mutex
	flushUntil time.Time
	flushing   bool
	flushStop  chan struct{}
	flushOnce  sync.Once
	flushWG    sync.WaitGroup

	library string
	// local checks peers' UCX worker addresses when NIXL's blob is its
	// serialized form with a UCX connection (nixlmd.go); nil otherwise.
	local *UCXLocal
	// serdes: this agent's own blob is NIXL's serialization, so peers'
	// blobs are walked to their end before NIXL sees them.
	serdes bool

	mu    sync.Mutex // guards the sets below
	regs  map[*nixlReg]struct{}
	reqs  map[*nixlXfer]struct{} // made and not destroyed
	preps map[C.nx_h]struct{}    // prepared lists not released
	stuck []*nixlXfer            // release refused: retried until NIXL lets go
	// down fences the remotes a transfer failed to: nothing more is posted to one until its metadata is loaded
	// again, since NIXL <= 1.4.0 may still hold (or have freed) its
	// endpoint. conns is each loaded remote's connection info (workaround
	// C: a name that comes back with other connection info is forgotten
	// first).
	down  map[string]error
	conns map[string][]byte
	// fenced counts posts refused because their remote was down.
	fenced atomic.Uint64

	// fmu: post and status hold it for reading, forget for writing, so no
	// request is used while forget releases it.
	fmu sync.RWMutex
}

type nixlReg struct {
	dl    C.nx_h
	owned unsafe.Pointer // memory we mapped for Alloc
	size  C.size_t       // its mapped length
}

type nixlXfer struct {
	req    C.nx_h
	opt    C.nx_h
	remote string
	// dead: forget released the request (its remote's name was reused):
	// nothing reaches NIXL for it again (fmu).
	dead bool
	// stuck: in libnixl.stuck (a release NIXL refused, retried);
	// destroyed: released and destroyed — a later drop is a no-op, so a
	// request both stuck and forgotten is never freed twice (mu).
	stuck, destroyed bool
}

// errAgentClosed is what calls on a closed libnixl agent return.
var errAgentClosed = fmt.Errorf("libnixl: %w", ErrClosed)

func openLibNIXL(cfg Config) (Backend, error) {
	lib, err := loadNIXL(libPath(cfg))
	if err != nil {
		return nil, err
	}
	n := &libnixl{l: lib, name: cfg.Name, regs: map[*nixlReg]struct{}{}, reqs: map[*nixlXfer]struct{}{},
		preps: map[C.nx_h]struct{}{}, down: map[string]error{}, conns: map[string][]byte{}}
	name := C.CString(cfg.Name)
	defer C.free(unsafe.Pointer(name))
	delay := cfg.NIXLProgressDelay
	if delay == 0 {
		delay = DefaultNIXLProgressDelay
	}
	// Out-parameters are Go locals: a pointer into a struct holding Go
	// pointers may not be passed to C.
	var agent C.nx_h
	prog, syncMode := C.int(1), C.int(C.NX_SYNC_RW)
	switch cfg.NIXLProgress {
	case 0, NIXLProgressThread:
	case NIXLProgressCaller: // a posting agent on NIXL <= 1.4.0: its thread's error callback frees endpoints under posts
		prog, syncMode = 0, C.NX_SYNC_STRICT
	default:
		return nil, fmt.Errorf("libnixl agent %q: progress mode %v: %w", cfg.Name, cfg.NIXLProgress, ErrInvalidRequest)
	}
	n.prog, n.flushStop = prog != 0, make(chan struct{})
	st := C.nx_create_configured_agent(lib, name, prog, syncMode, C.uint64_t(delay.Microseconds()), &agent)
	if err := nxErr("nixl_capi_create_configured_agent", st); err != nil {
		return nil, fmt.Errorf("libnixl agent %q: %w", cfg.Name, err)
	}
	n.agent = agent
	fail := func(err error) (Backend, error) {
		n.Close()
		return nil, fmt.Errorf("libnixl agent %q: %w", cfg.Name, err)
	}
	ucxName := C.CString("UCX")
	defer C.free(unsafe.Pointer(ucxName))
	var mems, params C.nx_h
	if err := nxErr("nixl_capi_get_plugin_params(UCX)", C.nx_get_plugin_params(lib, n.agent, ucxName, &mems, &params)); err != nil {
		return fail(err)
	}
	defer C.nx_destroy_mem_list(lib, mems)
	defer C.nx_destroy_params(lib, params)
	if len(cfg.BackendParams) > 0 && C.nx_has_params_add(lib) == 0 {
		return fail(fmt.Errorf("this NIXL has no nixl_capi_params_add (NIXL < 0.9): pass UCX settings as UCX_* environment variables: %w", ErrUnsupported))
	}
	bparams := maps.Clone(cfg.BackendParams)
	if C.nx_has_params_add(lib) != 0 {
		if bparams == nil {
			bparams = map[string]string{}
		}
		bparams["engine_config"] = nixlEngineConfig(bparams["engine_config"], prog == 0)
	}
	for k, v := range bparams {
		ck, cv := C.CString(k), C.CString(v)
		st := C.nx_params_add(lib, params, ck, cv)
		C.free(unsafe.Pointer(ck))
		C.free(unsafe.Pointer(cv))
		if err := nxErr("nixl_capi_params_add("+k+")", st); err != nil {
			return fail(err)
		}
	}
	var be, nmap C.nx_h
	if err := nxErr("nixl_capi_create_backend(UCX)", C.nx_create_backend(lib, n.agent, ucxName, params, &be)); err != nil {
		return fail(err)
	}
	n.backend = be
	if n.opt, err = n.newOpt(); err != nil {
		return fail(err)
	}
	var ver UCXVersion
	n.library, ver = nixlLibrary()
	if err := n.learnLocal(ver); err != nil {
		return fail(err)
	}
	if err := nxErr("nixl_capi_create_notif_map", C.nx_create_notif_map(lib, &nmap)); err != nil {
		return fail(err)
	}
	n.nmap = nmap
	return n, nil
}

// live takes the agent for one call: false (and nothing held) once closed.
func (n *libnixl) live() bool {
	n.life.RLock()
	if n.agent == nil {
		n.life.RUnlock()
		return false
	}
	return true
}

func (n *libnixl) newOpt() (C.nx_h, error) {
	var o C.nx_h
	if err := nxErr("nixl_capi_create_opt_args", C.nx_create_opt_args(n.l, &o)); err != nil {
		return nil, err
	}
	if err := nxErr("nixl_capi_opt_args_add_backend", C.nx_opt_args_add_backend(n.l, o, n.backend)); err != nil {
		C.nx_destroy_opt_args(n.l, o)
		return nil, err
	}
	return o, nil
}

func (n *libnixl) Register(kind MemKind, descs []Desc) (any, error) {
	if !n.live() {
		return nil, errAgentClosed
	}
	defer n.life.RUnlock()
	var dl C.nx_h
	if err := nxErr("nixl_capi_create_reg_dlist", C.nx_create_reg_dlist(n.l, memType(kind), &dl)); err != nil {
		return nil, err
	}
	r := &nixlReg{dl: dl}
	for _, d := range descs {
		if err := nxErr("nixl_capi_reg_dlist_add_desc", C.nx_reg_dlist_add_desc(n.l, r.dl, C.uintptr_t(d.Addr), C.size_t(d.Len), C.uint64_t(d.Dev))); err != nil {
			C.nx_destroy_reg_dlist(n.l, r.dl)
			return nil, err
		}
	}
	if err := nxErr("nixl_capi_register_mem", C.nx_register_mem(n.l, n.agent, r.dl, n.opt)); err != nil {
		C.nx_destroy_reg_dlist(n.l, r.dl)
		return nil, err
	}
	n.mu.Lock()
	n.regs[r] = struct{}{}
	n.mu.Unlock()
	return r, nil
}

func (n *libnixl) Deregister(h any) error {
	r := h.(*nixlReg)
	if !n.live() {
		return nil // close deregistered it
	}
	defer n.life.RUnlock()
	n.mu.Lock()
	delete(n.regs, r)
	n.mu.Unlock()
	return n.dropReg(r)
}

// dropReg deregisters (agent held).
func (n *libnixl) dropReg(r *nixlReg) error {
	err := nxErr("nixl_capi_deregister_mem", C.nx_deregister_mem(n.l, n.agent, r.dl, n.opt))
	C.nx_destroy_reg_dlist(n.l, r.dl)
	if r.owned != nil {
		C.nx_unmap(r.owned, r.size)
	}
	return err
}

func (n *libnixl) Alloc(kind MemKind, size uint64) ([]byte, any, error) {
	var mapped C.size_t
	p := C.nx_alloc(C.size_t(size), &mapped) // NIXL has no allocator: our own memory, registered
	if p == nil {
		return nil, nil, fmt.Errorf("mapping %d bytes failed", size)
	}
	buf := unsafe.Slice((*byte)(p), int(size))
	h, err := n.Register(kind, []Desc{BytesDesc(buf)})
	if err != nil {
		C.nx_unmap(p, mapped)
		return nil, nil, err
	}
	h.(*nixlReg).owned, h.(*nixlReg).size = p, mapped
	return buf, h, nil
}

func (n *libnixl) Metadata(regs []*Registration) ([]byte, error) {
	if !n.live() {
		return nil, errAgentClosed
	}
	defer n.life.RUnlock()
	var data unsafe.Pointer
	var ln C.size_t
	if err := nxErr("nixl_capi_get_local_md", C.nx_get_local_md(n.l, n.agent, &data, &ln)); err != nil {
		return nil, err
	}
	m := MetadataBlob{Engine: EngineLibNIXL, Library: n.library, Agent: n.name, Payload: C.GoBytes(data, C.int(ln))}
	C.nx_mem_free(n.l, data) // NIXL's buffer, ours to free
	for _, r := range regs {
		for _, d := range r.Descs {
			m.Regions = append(m.Regions, MDRegion{RemoteRegion: RemoteRegion{r.Kind, d}})
		}
	}
	return m.Encode(), nil
}

func (n *libnixl) LoadRemote(md []byte) (string, []RemoteRegion, error) {
	m, err := DecodeMetadata(md, EngineLibNIXL, n.library)
	if err != nil {
		return "", nil, err
	}
	if len(m.Payload) == 0 {
		return "", nil, fmt.Errorf("agent %q: empty NIXL metadata: %w", m.Agent, ErrBadMetadata)
	}
	if err := n.checkPeer(m); err != nil {
		return "", nil, fmt.Errorf("agent %q: %w", m.Agent, err)
	}
	conn := nixlConnKey(m.Payload)
	if !n.live() {
		return "", nil, errAgentClosed
	}
	defer n.life.RUnlock()
	n.mu.Lock()
	old, known := n.conns[m.Agent]
	_, fenced := n.down[m.Agent]
	n.mu.Unlock()
	if known && (!bytes.Equal(old, conn) || fenced) {
		// The name comes back with other connection info (a restarted
		// peer), or after a failed transfer (NIXL would keep reusing the
		// failed endpoint): release its requests, then invalidate it in NIXL, before
		// NIXL sees the new blob (workaround C; the Agent holds its load
		// lock for writing, so no post runs meanwhile).
		_ = n.forget(m.Agent)
	}
	p := C.CBytes(m.Payload)
	defer C.free(p)
	var name *C.char
	if err := nxErr("nixl_capi_load_remote_md", C.nx_load_remote_md(n.l, n.agent, p, C.size_t(len(m.Payload)), &name)); err != nil {
		n.mu.Lock()
		delete(n.conns, m.Agent) // NIXL's state for the name is unknown now
		n.mu.Unlock()
		// The name comes back with the error: NIXL <= 1.4.0 may have
		// dropped what it held of the agent (a refused load erases its
		// memory section), so the Agent forgets it too.
		return m.Agent, nil, fmt.Errorf("NIXL refused agent %q's metadata: %w: %w", m.Agent, err, ErrBadMetadata)
	}
	got := C.GoString(name)
	C.nx_mem_free(n.l, unsafe.Pointer(name)) // NIXL's string, ours to free
	if got != m.Agent {
		return "", nil, fmt.Errorf("agent %q: NIXL names the agent %q: %w", m.Agent, got, ErrBadMetadata)
	}
	n.mu.Lock()
	n.conns[got] = conn
	delete(n.down, got) // loaded again: posts may go to it
	n.mu.Unlock()
	return got, m.RemoteRegions(), nil
}

// nixlConnKey is what identifies a NIXL blob's connection: its backends'
// connection info (a restarted peer's UCX worker address differs), or nil
// when kvbridge cannot parse the blob.
func nixlConnKey(payload []byte) []byte {
	md, err := parseNIXLMD(payload)
	if err != nil {
		return nil
	}
	names := make([]string, 0, len(md.conns))
	for t := range md.conns {
		names = append(names, t)
	}
	slices.Sort(names)
	var k []byte
	for _, t := range names {
		k = binary.LittleEndian.AppendUint64(k, uint64(len(t)))
		k = append(k, t...)
		k = binary.LittleEndian.AppendUint64(k, uint64(len(md.conns[t])))
		k = append(k, md.conns[t]...)
	}
	return k
}

func (n *libnixl) Invalidate(name string) error {
	if !n.live() {
		return errAgentClosed
	}
	defer n.life.RUnlock()
	return n.forget(name)
}

// forget releases every request towards name, then invalidates name in
// NIXL (agent held; the Agent's load lock held for writing). Released
// requests are marked dead, so the watcher's status polls and a repost
// never hand them to NIXL again: in NIXL <= 1.4.0 a request that
// completed but was never polled would send its notification through
// whatever connection the name has then (a restarted peer's).
func (n *libnixl) forget(name string) error {
	n.fmu.Lock()
	defer n.fmu.Unlock()
	n.mu.Lock()
	var drop []*nixlXfer
	for nx := range n.reqs {
		if nx.remote == name {
			drop = append(drop, nx)
		}
	}
	delete(n.conns, name)
	n.mu.Unlock()
	for _, nx := range drop {
		_ = n.dropReq(nx) // a refused release is retried later (stuck)
		nx.dead = true
	}
	c := C.CString(name)
	defer C.free(unsafe.Pointer(c))
	return nxErr("nixl_capi_invalidate_remote_md", C.nx_invalidate_remote_md(n.l, n.agent, c))
}

// fence marks remote down after a failed transfer (workaround B).
func (n *libnixl) fence(remote string, err error) {
	n.mu.Lock()
	if _, ok := n.down[remote]; !ok {
		n.down[remote] = err
	}
	n.mu.Unlock()
}

// RemoteUsable: the remote is not fenced.
func (n *libnixl) RemoteUsable(remote string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, down := n.down[remote]
	return !down
}

// The Agent's reports the engine backs.
var (
	_ PostFencer     = (*libnixl)(nil)
	_ RemoteChecker  = (*libnixl)(nil)
	_ ProgressKeeper = (*libnixl)(nil)
)

// PostsFenced counts the posts refused because their remote was down.
func (n *libnixl) PostsFenced() uint64 { return n.fenced.Load() }

func (n *libnixl) Prep(remote string, kind MemKind, descs []Desc) (any, error) {
	if !n.live() {
		return nil, errAgentClosed
	}
	defer n.life.RUnlock()
	var dl, h C.nx_h
	if err := nxErr("nixl_capi_create_xfer_dlist", C.nx_create_xfer_dlist(n.l, memType(kind), &dl)); err != nil {
		return nil, err
	}
	defer C.nx_destroy_xfer_dlist(n.l, dl)
	for _, d := range descs {
		if err := nxErr("nixl_capi_xfer_dlist_add_desc", C.nx_xfer_dlist_add_desc(n.l, dl, C.uintptr_t(d.Addr), C.size_t(d.Len), C.uint64_t(d.Dev))); err != nil {
			return nil, err
		}
	}
	r := C.CString(remote) // "" is NIXL's initiator (local) agent
	defer C.free(unsafe.Pointer(r))
	if err := nxErr("nixl_capi_prep_xfer_dlist", C.nx_prep_xfer_dlist(n.l, n.agent, r, dl, &h, n.opt)); err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.preps[h] = struct{}{}
	n.mu.Unlock()
	return h, nil
}

func (n *libnixl) Unprep(h any) error {
	if !n.live() {
		return nil // close released it
	}
	defer n.life.RUnlock()
	n.mu.Lock()
	delete(n.preps, h.(C.nx_h))
	n.mu.Unlock()
	return nxErr("nixl_capi_release_xfer_dlist_handle", C.nx_release_xfer_dlist_handle(n.l, n.agent, h.(C.nx_h)))
}

func cInts(v []int) unsafe.Pointer {
	p := C.malloc(C.size_t(len(v)) * C.size_t(unsafe.Sizeof(C.int(0))))
	s := unsafe.Slice((*C.int)(p), len(v))
	for i, x := range v {
		s[i] = C.int(x)
	}
	return p
}

func (n *libnixl) Post(x *Xfer) error {
	if !n.live() {
		return errAgentClosed
	}
	// The index pairs go to NIXL as they are; it merges runs adjacent in
	// the dense prepared lists itself (coalesce.go).
	x.SetPieces(len(x.LocalIdx))
	defer n.life.RUnlock()
	n.fmu.RLock()
	defer n.fmu.RUnlock()
	n.mu.Lock()
	why, down := n.down[x.Remote]
	n.mu.Unlock()
	if down {
		// NIXL <= 1.4.0 may be tearing this remote's endpoint down (or
		// have freed it): nothing more goes to it until it is loaded again.
		n.fenced.Add(1)
		return fmt.Errorf("libnixl: remote %q is fenced since a transfer to it failed (%v); it must load its metadata again: %w",
			x.Remote, why, ErrTransfer)
	}
	nx, _ := x.Handle.(*nixlXfer)
	if nx != nil && nx.dead {
		return fmt.Errorf("libnixl: remote %q was invalidated since this transfer was made: %w", x.Remote, ErrRemoteUnknown)
	}
	if nx == nil {
		opt, err := n.newOpt()
		if err != nil {
			return err
		}
		nx = &nixlXfer{opt: opt, remote: x.Remote}
		if x.Notif != nil {
			msg := C.CBytes(x.Notif)
			st := C.nx_opt_args_set_notif_msg(n.l, nx.opt, msg, C.size_t(len(x.Notif)))
			C.free(msg)
			if err := nxErr("nixl_capi_opt_args_set_notif_msg", st); err != nil {
				C.nx_destroy_opt_args(n.l, nx.opt)
				return err
			}
			if err := nxErr("nixl_capi_opt_args_set_has_notif", C.nx_opt_args_set_has_notif(n.l, nx.opt, 1)); err != nil {
				C.nx_destroy_opt_args(n.l, nx.opt)
				return err
			}
		}
		op := C.int(C.NX_OP_WRITE)
		if x.Op == Read {
			op = C.NX_OP_READ
		}
		li, ri := cInts(x.LocalIdx), cInts(x.RemoteIdx)
		var req C.nx_h
		st := C.nx_make_xfer_req(n.l, n.agent, op, x.LocalPrep.Handle.(C.nx_h), (*C.int)(li), C.size_t(len(x.LocalIdx)),
			x.RemotePrep.Handle.(C.nx_h), (*C.int)(ri), C.size_t(len(x.RemoteIdx)), &req, nx.opt)
		nx.req = req
		C.free(li)
		C.free(ri)
		if err := nxErr("nixl_capi_make_xfer_req", st); err != nil {
			C.nx_destroy_opt_args(n.l, nx.opt)
			return err
		}
		n.mu.Lock()
		n.reqs[nx] = struct{}{}
		n.mu.Unlock()
		x.Handle = nx
	}
	err := nxErr("nixl_capi_post_xfer_req", C.nx_post_xfer_req(n.l, n.agent, nx.req, nx.opt))
	if err != nil {
		n.fence(x.Remote, err)
	}
	return err
}

// Status asks NIXL. With NIXL's UCX backend this call is also what sends a
// write's notification once the data has landed, so the Agent's completion
// watcher polls every transfer in flight.
func (n *libnixl) Status(x *Xfer) (XferState, error) {
	nx, ok := x.Handle.(*nixlXfer)
	if !ok {
		return Failed, fmt.Errorf("transfer not posted: %w", ErrInvalidRequest)
	}
	if !n.live() {
		return Failed, errAgentClosed
	}
	defer n.life.RUnlock()
	n.fmu.RLock()
	defer n.fmu.RUnlock()
	if nx.dead {
		return Failed, fmt.Errorf("libnixl: remote %q invalidated in flight: %w", nx.remote, ErrRemoteUnknown)
	}
	st := C.nx_get_xfer_status(n.l, n.agent, nx.req)
	switch st {
	case C.NX_SUCCESS:
		return Done, nil
	case C.NX_IN_PROG:
		return InProgress, nil
	}
	err := nxErr("nixl_capi_get_xfer_status", st)
	n.fence(nx.remote, err)
	return Failed, err
}

func (n *libnixl) Release(x *Xfer) error {
	nx, ok := x.Handle.(*nixlXfer)
	if !ok {
		return nil
	}
	x.Handle = nil
	if !n.live() {
		return nil // close released it
	}
	defer n.life.RUnlock()
	n.fmu.RLock()
	defer n.fmu.RUnlock()
	n.retryStuck()
	if nx.dead {
		return nil // forget released it
	}
	return n.dropReq(nx)
}

// dropReq releases, then destroys, a transfer request (agent held). If
// NIXL refuses the release (it could not cancel a transfer in progress),
// the request is kept and retried later: destroying it unreleased fails
// with INVALID_STATE and would leak it.
func (n *libnixl) dropReq(nx *nixlXfer) error {
	n.mu.Lock()
	gone := nx.destroyed
	n.mu.Unlock()
	if gone {
		return nil // dropped already (forgotten while it was stuck)
	}
	if err := nxErr("nixl_capi_release_xfer_req", C.nx_release_xfer_req(n.l, n.agent, nx.req)); err != nil {
		n.mu.Lock()
		if !nx.stuck {
			nx.stuck = true
			n.stuck = append(n.stuck, nx)
		}
		n.mu.Unlock()
		return err
	}
	err := nxErr("nixl_capi_destroy_xfer_req", C.nx_destroy_xfer_req(n.l, nx.req))
	C.nx_destroy_opt_args(n.l, nx.opt)
	n.mu.Lock()
	nx.destroyed = true
	delete(n.reqs, nx)
	n.mu.Unlock()
	return err
}

// retryStuck retries the releases NIXL refused before (agent held).
func (n *libnixl) retryStuck() {
	n.mu.Lock()
	stuck := n.stuck
	n.stuck = nil
	for _, nx := range stuck {
		nx.stuck = false
	}
	n.mu.Unlock()
	for _, nx := range stuck {
		_ = n.dropReq(nx) // re-queued if refused again
	}
}

func (n *libnixl) GenNotif(remote string, msg []byte) error {
	if !n.live() {
		return errAgentClosed
	}
	defer n.life.RUnlock()
	n.mu.Lock()
	why, down := n.down[remote]
	n.mu.Unlock()
	if down { // the send path has the write's check-then-use gap (workaround B)
		n.fenced.Add(1)
		return fmt.Errorf("libnixl: remote %q is fenced since a transfer to it failed (%v); it must load its metadata again: %w",
			remote, why, ErrTransfer)
	}
	r := C.CString(remote)
	defer C.free(unsafe.Pointer(r))
	var m unsafe.Pointer
	if len(msg) > 0 {
		m = C.CBytes(msg)
		defer C.free(m)
	}
	if err := nxErr("nixl_capi_gen_notif", C.nx_gen_notif(n.l, n.agent, r, m, C.size_t(len(msg)), n.opt)); err != nil {
		return err
	}
	if !n.prog {
		n.kickFlush()
	}
	return nil
}

// genNotifFlush is how long the flusher progresses an agent after its
// last GenNotif; the polls back off from 20 µs to 5 ms.
const genNotifFlush = time.Second

// kickFlush starts the GenNotif flusher, or extends its run.
func (n *libnixl) kickFlush() { n.kickFlushFor(genNotifFlush) }

// KeepProgress: the agent's memory is about to be read by peers (pull):
// without NIXL's progress thread a peer's first read waits for this
// agent's worker to progress (the connection's wire-up), so the flusher
// progresses it for d.
func (n *libnixl) KeepProgress(d time.Duration) {
	if !n.prog {
		n.kickFlushFor(d)
	}
}

func (n *libnixl) kickFlushFor(d time.Duration) {
	n.flushMu.Lock()
	defer n.flushMu.Unlock()
	if until := time.Now().Add(d); until.After(n.flushUntil) {
		n.flushUntil = until
	}
	if n.flushing || n.flushStop == nil {
		return
	}
	select {
	case <-n.flushStop:
		return // closing
	default:
	}
	n.flushing = true
	n.flushWG.Add(1)
	go n.flush()
}

// flush progresses the agent (a notification drain, kept for notifs)
// until genNotifFlush after the last GenNotif, or until close.
func (n *libnixl) flush() {
	defer n.flushWG.Done()
	d := 20 * time.Microsecond
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-n.flushStop:
			return
		case <-t.C:
		}
		if n.live() {
			n.nmu.Lock()
			ns, err := n.drainLocked()
			n.stash = append(n.stash, ns...)
			n.nmu.Unlock()
			n.life.RUnlock()
			if err != nil {
				n.flushMu.Lock()
				n.flushing = false
				n.flushMu.Unlock()
				return
			}
		}
		n.flushMu.Lock()
		if time.Now().After(n.flushUntil) {
			n.flushing = false
			n.flushMu.Unlock()
			return
		}
		n.flushMu.Unlock()
		d = min(2*d, 5*time.Millisecond)
		t.Reset(d)
	}
}

// stopFlush ends the flusher before the agent is destroyed.
func (n *libnixl) stopFlush() {
	if n.flushStop == nil {
		return
	}
	n.flushMu.Lock() // kickFlush checks flushStop and adds to flushWG under it
	n.flushOnce.Do(func() { close(n.flushStop) })
	n.flushMu.Unlock()
	n.flushWG.Wait()
}

func (n *libnixl) Notifs() ([]Notif, error) {
	if !n.live() {
		return nil, errAgentClosed
	}
	defer n.life.RUnlock()
	n.nmu.Lock()
	defer n.nmu.Unlock()
	out := n.stash
	n.stash = nil
	ns, err := n.drainLocked()
	if err != nil {
		n.stash = append(out, ns...) // a caller drops what comes with an error
		return nil, err
	}
	return append(out, ns...), nil
}

// drainLocked reads the notifications NIXL holds (nmu held, and the
// agent live).
func (n *libnixl) drainLocked() ([]Notif, error) {
	if err := nxErr("nixl_capi_get_notifs", C.nx_get_notifs(n.l, n.agent, n.nmap, n.opt)); err != nil {
		return nil, err
	}
	defer C.nx_notif_map_clear(n.l, n.nmap)
	var agents C.size_t
	if err := nxErr("nixl_capi_notif_map_size", C.nx_notif_map_size(n.l, n.nmap, &agents)); err != nil {
		return nil, err
	}
	var out []Notif
	for i := C.size_t(0); i < agents; i++ {
		var name *C.char
		if err := nxErr("nixl_capi_notif_map_get_agent_at", C.nx_notif_map_get_agent_at(n.l, n.nmap, i, &name)); err != nil {
			return out, err
		}
		var cnt C.size_t
		if err := nxErr("nixl_capi_notif_map_get_notifs_size", C.nx_notif_map_get_notifs_size(n.l, n.nmap, name, &cnt)); err != nil {
			return out, err
		}
		remote := C.GoString(name)
		for j := C.size_t(0); j < cnt; j++ {
			var d unsafe.Pointer
			var ln C.size_t
			if err := nxErr("nixl_capi_notif_map_get_notif", C.nx_notif_map_get_notif(n.l, n.nmap, name, j, &d, &ln)); err != nil {
				return out, err
			}
			out = append(out, Notif{Remote: remote, Msg: C.GoBytes(d, C.int(ln))})
		}
	}
	return out, nil
}

// NotifyC: NIXL has no notification callback in its C API; consumers poll.
func (n *libnixl) NotifyC() <-chan struct{} { return nil }

// needsPolling: NIXL moves the data on its progress thread, but reports
// completion (and, with its UCX backend, sends the notification) only when
// asked.
func (n *libnixl) needsPolling() bool { return true }

// Close waits for the calls in progress, then releases every request,
// prepared list and registration and destroys the agent. Calls after it
// return ErrClosed (or nothing, for releases): none reaches NIXL.
func (n *libnixl) Close() error {
	n.stopFlush() // before the life lock: the flusher's drain holds it for reading
	n.life.Lock()
	defer n.life.Unlock()
	if n.agent == nil {
		return nil
	}
	n.mu.Lock()
	regs, reqs, preps := n.regs, n.reqs, n.preps
	n.regs, n.reqs, n.preps, n.stuck = map[*nixlReg]struct{}{}, map[*nixlXfer]struct{}{}, map[C.nx_h]struct{}{}, nil
	n.mu.Unlock()
	var errs []error
	for nx := range reqs {
		if err := n.dropReq(nx); err != nil {
			errs = append(errs, err)
		}
	}
	n.mu.Lock()
	if len(n.stuck) > 0 {
		errs = append(errs, fmt.Errorf("libnixl agent %q: %d transfer requests NIXL would not release at close", n.name, len(n.stuck)))
	}
	n.stuck = nil
	n.mu.Unlock()
	for h := range preps {
		C.nx_release_xfer_dlist_handle(n.l, n.agent, h)
	}
	for r := range regs {
		_ = n.dropReg(r)
	}
	if n.nmap != nil {
		C.nx_destroy_notif_map(n.l, n.nmap)
		n.nmap = nil
	}
	if n.opt != nil {
		C.nx_destroy_opt_args(n.l, n.opt)
		n.opt = nil
	}
	if n.backend != nil {
		C.nx_destroy_backend(n.l, n.backend)
		n.backend = nil
	}
	if err := nxErr("nixl_capi_destroy_agent", C.nx_destroy_agent(n.l, n.agent)); err != nil {
		errs = append(errs, err)
	}
	n.agent = nil
	return errors.Join(errs...)
}
