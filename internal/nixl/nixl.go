package nixl

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/internal/canary"
	"github.com/kvbridge/kvbridge/internal/cuda"
	"github.com/kvbridge/kvbridge/internal/mem"
	pub "github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
)

// The public package nixl's configuration, engines, progress modes and
// errors, as this package names them.
type (
	Config       = pub.Config
	NIXLProgress = pub.NIXLProgress
)

const (
	EngineAuto         = pub.EngineAuto
	EngineLibNIXL      = pub.EngineLibNIXL
	EngineUCX          = pub.EngineUCX
	EngineLoopback     = pub.EngineLoopback
	NIXLProgressThread = pub.NIXLProgressThread
	NIXLProgressCaller = pub.NIXLProgressCaller
)

// DefaultNIXLProgressDelay is how long NIXL's UCX progress thread sleeps in
// poll() between unconditional passes when no event wakes it: a backstop,
// since the worker's events wake it. NIXL's default, 0, makes the thread
// spin: an idle rank burns a core; each pass costs an idle agent about
// 70 µs here (NIXL 1.4.0: 0.10 % of a core at 100 ms, 0.03 % at 1 s).
const DefaultNIXLProgressDelay = time.Second

// UCXLibEnv names the variable nixl.Config.FromEnv reads into UCXLib.
const UCXLibEnv = "KVBRIDGE_UCX_LIB"

// The agents' errors. The two a Manager's start-up may return are the
// public nixl's; the others stay inside kvbridge (a room fails with a code).
var (
	ErrEngineUnavailable = pub.ErrEngineUnavailable
	ErrUnsupported       = pub.ErrUnsupported
	ErrRemoteUnknown     = errors.New("nixl: remote agent unknown")
	ErrInvalidDescriptor = errors.New("nixl: invalid descriptor")
	ErrInvalidRequest    = errors.New("nixl: invalid transfer request")
	ErrBadMetadata       = errors.New("nixl: bad metadata")
	ErrTransfer          = errors.New("nixl: transfer failed")
	ErrTimeout           = errors.New("nixl: transfer deadline passed")
	ErrClosed            = errors.New("nixl: agent closed")
	// ErrStalePrep: a remote list prepared before its remote's metadata was
	// loaded again (or invalidated) cannot be posted; prepare it again.
	ErrStalePrep = errors.New("nixl: prepared list is stale (its remote was reloaded or invalidated since)")
)

// MemKind is the kind of memory a descriptor points at (transfer's).
type MemKind = transfer.MemKind

const (
	// DRAM is host memory.
	DRAM = transfer.DRAM
	// VRAM is GPU memory (Dev is the GPU index).
	VRAM = transfer.VRAM
)

// Desc is one contiguous piece of memory (transfer's: go doc
// transfer.Desc shows its fields).
type Desc = transfer.Desc

// BytesDesc describes a Go byte slice (which must stay pinned while
// registered: use Agent.RegisterBytes).
func BytesDesc(b []byte) Desc { return mem.BytesDesc(b) }

// Op is a transfer's direction.
type Op uint8

const (
	// Write copies local descriptors into remote ones.
	Write Op = 1 + iota
	// Read copies remote descriptors into local ones.
	Read
)

func (o Op) String() string {
	if o == Write {
		return "WRITE"
	}
	if o == Read {
		return "READ"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// XferState is a transfer's status.
type XferState uint8

const (
	// InProgress: posted, not finished.
	InProgress XferState = 1 + iota
	// Done: the data is in place and any notification was sent after it.
	Done
	// Failed: the transfer did not complete; Status returns why.
	Failed
)

func (s XferState) String() string {
	return [...]string{"XferState(0)", "InProgress", "Done", "Failed"}[min(int(s), 3)]
}

// Notif is a notification received from a remote agent.
type Notif struct {
	Remote string
	Msg    []byte
}

// Backend is what an engine implements: the libnixl and loopback engines
// here, the ucx engine in internal/nixl/ucx (registered with
// RegisterEngine). The Agent validates every argument first (descriptors
// inside registered memory, indices in range, lengths equal), so engines
// see only well-formed requests. The handles an engine returns (from
// Register, Alloc, Prep) come back to it in Registration.Handle and
// Prepped.Handle; a transfer's own is Xfer.Handle, which Post sets and
// Release clears.
type Backend interface {
	Register(kind MemKind, descs []Desc) (any, error)
	Deregister(h any) error
	// Alloc returns engine-allocated, registered memory (nil if the engine
	// has no allocator of its own).
	Alloc(kind MemKind, size uint64) ([]byte, any, error)
	Metadata(regs []*Registration) ([]byte, error)
	// LoadRemote returns the remote's name and registered regions.
	LoadRemote(md []byte) (name string, regions []RemoteRegion, err error)
	Invalidate(name string) error
	Prep(remote string, kind MemKind, descs []Desc) (any, error)
	Unprep(h any) error
	Post(x *Xfer) error
	Status(x *Xfer) (XferState, error)
	Release(x *Xfer) error
	GenNotif(remote string, msg []byte) error
	Notifs() ([]Notif, error)
	// NotifyC is signalled when notifications arrive (nil: poll Notifs).
	NotifyC() <-chan struct{}
	Close() error
}

// The methods an engine may have besides Backend's, which the Agent's
// methods of the same name report (nothing, 0 or true on an engine
// without them). An engine in a package of its own asserts the ones it
// has at compile time.
type (
	PostFencer   interface{ PostsFenced() uint64 }
	WriteRefuser interface {
		WritesRefused() (refused, strayAcks uint64)
	}
	RemoteChecker  interface{ RemoteUsable(remote string) bool }
	ProgressKeeper interface{ KeepProgress(d time.Duration) }
)

// ProgressSignaller is a backend that signals when a transfer may have
// reached a final state, so the completion watcher need not poll it.
type ProgressSignaller interface {
	ProgressC() <-chan struct{}
}

// RemoteRegion is a region a remote agent registered, as its metadata
// names it.
type RemoteRegion struct {
	Kind MemKind
	Desc
}

// Registration is registered memory; Deregister it when done.
type Registration struct {
	Kind   MemKind
	Descs  []Desc
	Handle any // the engine's, from its Register or Alloc
	pinner *runtime.Pinner
	owned  bool // engine-allocated
}

// Prepped is a prepared descriptor list, local or for one remote agent.
type Prepped struct {
	Remote string // "" for local
	Kind   MemKind
	Descs  []Desc
	Handle any // the engine's, from its Prep
	agent  *Agent
	deregs uint64 // the agent's deregistration count when last checked
	gen    uint64 // remote lists: the remote's metadata generation at prep
}

// Xfer is a transfer request built from prepared lists by index. Its
// exported fields are what an engine posts: the lists, the indices into
// them (pairwise), and the engine's own handle of the transfer.
type Xfer struct {
	Op     Op
	Remote string
	Local  []Desc
	Dst    []Desc // remote descriptors, pairwise with Local
	Notif  []byte // nil: no notification

	LocalPrep, RemotePrep *Prepped
	LocalIdx, RemoteIdx   []int
	Handle                any // the engine's, set by its Post

	posted time.Time
	pieces atomic.Int64 // operations of the last post after coalescing (Pieces)

	// Set by the agent's completion watcher (under Agent.wmu) and
	// published by closing done.
	done   chan struct{} // closed when the current post is final; nil before the first
	state  XferState     // the final state, once done is closed
	err    error
	notify chan<- *Xfer // PostTo's channel, sent x when final
	// canary: a READ into DRAM planted it in the last bytes of each local
	// descriptor of at least canaryBytes before its post (while in
	// Agent.canaried).
	canary uint64
	// planted: the local descriptors whose tails (addresses in tails)
	// this post planted; saved: their 8 bytes before the canary.
	planted      []int
	tails, saved []uint64
	// cancelled: settled by Release or Close while the engine may still
	// write its memory (its canaries are left where they are).
	cancelled bool
}

// canaryBytes: a READ's destination descriptors of at least this many
// bytes end, before the READ is posted, with a random value of this size;
// a READ reported complete whose destination still ends with it did not
// deliver that descriptor (NIXL 1.4.0 on UCX 1.22 over cma reports such a
// READ complete: TestSilentPartialCompletion). A descriptor whose
// source really ends with those bytes is refused too: 2^-64 a descriptor.
const canaryBytes = 8

// CorruptWrites is a fault for tests, on any engine: each of the next n
// WRITEs posted from host or device memory through a with a notification has one
// bit of its source flipped right before the engine gets it — in the
// middle of its middle descriptor, after the transfer pool took the
// write's digest — so the bytes that land differ from the digest, as a
// bad link's or NIC's would (docs/PROTOCOL.md "Digest"). The flipped
// byte stays flipped in the source.
func (a *Agent) CorruptWrites(n int) { a.corruptWrites.Store(int64(n)) }

// CorruptReads is CorruptWrites for READs into host or device memory: each of the
// next n READs that complete through a with a descriptor of at least min
// bytes (KV pages, not an aux or state item) has one bit of what landed
// flipped — in the middle of its largest descriptor — before its
// completion is reported, as a bad link's would (tests, any engine).
func (a *Agent) CorruptReads(n int, min uint64) {
	a.corruptMin.Store(min)
	a.corruptReads.Store(int64(n))
}

// corruptRead is CorruptReads' flip, at a READ's completion (under wmu).
func (a *Agent) corruptRead(x *Xfer) {
	if x.Op != Read || x.LocalPrep == nil || a.corruptReads.Load() <= 0 {
		return
	}
	var d Desc
	for _, i := range x.LocalIdx {
		if l := x.LocalPrep.Descs[i]; l.Len > d.Len {
			d = l
		}
	}
	if d.Len == 0 || d.Len < a.corruptMin.Load() || a.corruptReads.Add(-1) < 0 {
		return
	}
	a.flip(x.LocalPrep.Kind, d)
}

// corrupt is CorruptWrites' flip, at post (under wmu).
func (a *Agent) corrupt(x *Xfer) {
	if x.Op != Write || x.Notif == nil || x.LocalPrep == nil || len(x.LocalIdx) == 0 || a.corruptWrites.Load() <= 0 {
		return
	}
	d := x.LocalPrep.Descs[x.LocalIdx[len(x.LocalIdx)/2]]
	if d.Len == 0 || a.corruptWrites.Add(-1) < 0 {
		return
	}
	a.flip(x.LocalPrep.Kind, d)
}

// flip flips a bit of the byte in the middle of d (CorruptWrites' and
// CorruptReads' fault): in host memory in place, in device memory through
// the agent's CUDA driver (a byte read back, flipped and written; a
// failure leaves it as it was — the test then sees no corruption).
func (a *Agent) flip(kind MemKind, d Desc) {
	at := uint64(d.Addr) + d.Len/2
	if kind != VRAM {
		canary.Flip(at)
		return
	}
	c, err := cudaContext(a.cudaLib, int(d.Dev))
	if err != nil {
		return
	}
	var b [1]byte
	if c.CopyDtoH(b[:], cuda.DevicePtr(at)) == nil {
		b[0] ^= 1
		_ = c.CopyHtoD(cuda.DevicePtr(at), b[:])
	}
}

// canariesOff turns the READ canaries off: BenchmarkReadCanary's reference
// (the same reads, unchecked). Nothing else sets it.
var canariesOff atomic.Bool

// plantCanaries (PostTo, a.wmu held, before the engine sees x): a READ
// into DRAM gets a fresh random canary at the end of each local descriptor
// of at least canaryBytes, all in one call to C. (A tail another READ in
// flight planted is planted over: settleCanaries treats such a tail as one
// it cannot vouch for.)
func (a *Agent) plantCanaries(x *Xfer) {
	x.cancelled = false
	x.planted, x.tails = x.planted[:0], x.tails[:0]
	if x.Op != Read || x.LocalPrep.Kind != DRAM || canariesOff.Load() {
		return
	}
	for k, d := range x.Local {
		if d.Len >= canaryBytes {
			x.planted = append(x.planted, k)
			x.tails = append(x.tails, uint64(d.Addr+uintptr(d.Len-canaryBytes)))
		}
	}
	if len(x.tails) == 0 {
		return
	}
	x.canary = rand.Uint64()
	x.saved = slices.Grow(x.saved[:0], len(x.tails))[:len(x.tails)]
	plantTails(x.tails, x.canary, x.saved)
	a.canaried[x] = struct{}{}
}

// settleCanaries (settle, a.wmu held): the first planted descriptor (-1 if
// none) that a READ reported complete did not deliver — its tail still
// holds this READ's canary — or cannot vouch for: its tail holds the
// canary of another READ in flight that planted over it (overlapping
// reads). A tail still holding this READ's canary gets back the bytes it
// replaced, unless the READ was cancelled while the engine may still
// write there.
func (a *Agent) settleCanaries(x *Xfer, st XferState) int {
	if _, ok := a.canaried[x]; !ok {
		return -1
	}
	delete(a.canaried, x)
	if x.cancelled {
		return -1
	}
	others := a.others[:0]
	for y := range a.canaried {
		others = append(others, y.canary)
	}
	a.others = others
	i := settleTails(x.tails, x.canary, x.saved, others, true)
	if i < 0 || st != Done {
		return -1
	}
	return x.planted[i]
}

// Done returns a channel closed when the transfer's current post reaches a
// final state (nil before the first post).
func (x *Xfer) Done() <-chan struct{} { return x.done }

// Agent is the Go face of a NIXL agent on one engine. It is safe for
// concurrent use.
type Agent struct {
	// corruptWrites, corruptReads: the WRITEs CorruptWrites and the
	// READs CorruptReads still corrupt (tests).
	corruptWrites, corruptReads atomic.Int64
	corruptMin                  atomic.Uint64
	name                        string
	engine                      string
	b                           Backend
	timeout                     time.Duration
	cudaLib                     string // Config.CUDALib (DeviceSums)

	// loadMu orders remote (re)loads against posts: a post holds it for
	// reading from its checks to the engine's post (a write the engine
	// copies itself into mapped peer memory happens inside), LoadRemote
	// and InvalidateRemote for writing, so no post ever writes through a
	// mapping a reload has just taken away.
	loadMu sync.RWMutex

	mu      sync.Mutex
	regs    map[*Registration]struct{}
	remotes map[string]*RegionIndex
	gens    map[string]uint64 // each remote's metadata generation
	// localIdx indexes registered memory; nil after a (de)registration.
	localIdx *RegionIndex
	// deregs counts deregistrations: a local list prepared before one is
	// checked again at its next post.
	deregs uint64
	closed bool
	// refusedMD counts peers' metadata blobs refused as ErrBadMetadata.
	refusedMD atomic.Uint64
	// notDelivered counts READs the engine reported complete whose
	// destination still held the canary the agent planted (plantCanaries).
	notDelivered atomic.Uint64

	// The completion watcher: one goroutine per agent polls the engine for
	// the transfers in flight (waking on the engine's progress signal where
	// it has one) and closes each one's done channel when it is final.
	// Polling is also what makes NIXL's UCX backend send a write's
	// notification, so it runs whether or not anyone waits.
	wmu         sync.Mutex
	wclosed     bool // Close has settled everything in flight
	inflight    map[*Xfer]struct{}
	canaried    map[*Xfer]struct{} // READs in flight with canaries planted (plantCanaries)
	others      []uint64           // settleCanaries' scratch: the other READs' canaries
	kick        chan struct{}
	stop        chan struct{}
	watcherDone chan struct{}
}

// registered holds the engines that live in packages of their own (the ucx
// engine, internal/nixl/ucx): each registers its opener at init, so the
// package that imports it — kvmanager does — makes it available to Open,
// and this package depends on none of them.
var registered struct {
	sync.Mutex
	open map[string]func(Config) (Backend, error)
}

// RegisterEngine makes the engine name (EngineUCX) openable: called by
// the engine's package at init. A second registration of a name panics.
func RegisterEngine(name string, open func(Config) (Backend, error)) {
	registered.Lock()
	defer registered.Unlock()
	if registered.open == nil {
		registered.open = map[string]func(Config) (Backend, error){}
	}
	if _, dup := registered.open[name]; dup {
		panic("nixl: engine " + name + " registered twice")
	}
	registered.open[name] = open
}

func openEngine(name string, cfg Config) (Backend, error) {
	registered.Lock()
	open := registered.open[name]
	registered.Unlock()
	if open == nil {
		return nil, fmt.Errorf("nixl: engine %q is not linked into this program (import internal/nixl/ucx): %w", name, ErrEngineUnavailable)
	}
	return open(cfg)
}

// Open creates an agent on the configured engine.
func Open(cfg Config) (*Agent, error) {
	if cfg.Name == "" {
		return nil, errors.New("nixl: Config.Name is empty")
	}
	if cfg.XferTimeout == 0 {
		cfg.XferTimeout = 60 * time.Second
	}
	a := &Agent{name: cfg.Name, timeout: cfg.XferTimeout, cudaLib: cfg.CUDALib, regs: map[*Registration]struct{}{},
		remotes: map[string]*RegionIndex{}, gens: map[string]uint64{}}
	var err error
	switch cfg.Engine {
	case EngineAuto:
		if a.b, err = openLibNIXL(cfg); err == nil {
			a.engine = EngineLibNIXL
			break
		}
		libErr := err
		if a.b, err = openEngine(EngineUCX, cfg); err != nil {
			return nil, fmt.Errorf("nixl: no engine: libnixl: %v; ucx: %w", libErr, err)
		}
		a.engine = EngineUCX
	case EngineLibNIXL:
		a.b, err = openLibNIXL(cfg)
	case EngineUCX:
		a.b, err = openEngine(EngineUCX, cfg)
	case EngineLoopback:
		a.b, err = openLoopback(cfg)
	default:
		return nil, fmt.Errorf("nixl: engine %q: %w", cfg.Engine, ErrEngineUnavailable)
	}
	if err != nil {
		return nil, err
	}
	if a.engine == "" {
		a.engine = cfg.Engine
	}
	a.inflight = map[*Xfer]struct{}{}
	a.canaried = map[*Xfer]struct{}{}
	a.kick, a.stop, a.watcherDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go a.watch()
	return a, nil
}

// Watcher back-off while transfers are in flight and nothing finishes, for
// engines that do not signal progress (libnixl): a few passes that only
// yield, then sleeps growing to watchMaxSleep. An engine that signals
// (ucx) is waited for, with watchBackstop as the longest sleep (the
// transfers' timeouts are checked then).
const (
	watchSpins    = 64
	watchMaxSleep = 50 * time.Microsecond
	watchBackstop = 10 * time.Millisecond
)

func (a *Agent) watch() {
	defer close(a.watcherDone)
	var progress <-chan struct{}
	if ps, ok := a.b.(ProgressSignaller); ok {
		progress = ps.ProgressC()
	}
	idle, sleep := 0, time.Duration(0)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		a.wmu.Lock()
		finished := 0
		for x := range a.inflight {
			if a.poll(x) {
				delete(a.inflight, x)
				finished++
			}
		}
		left := len(a.inflight)
		a.wmu.Unlock()
		if left == 0 {
			idle, sleep = 0, 0
			select {
			case <-a.kick:
			case <-a.stop:
				return
			}
			continue
		}
		if finished > 0 {
			idle, sleep = 0, 0
		}
		if progress != nil {
			// The engine signals every final state: sleep until it does,
			// with a backstop for the transfers' timeouts. No spinning
			// (the spins cost CPU the signal makes useless).
			sleep = watchBackstop
		} else if idle++; idle < watchSpins {
			select {
			case <-a.stop:
				return
			default:
			}
			runtime.Gosched()
			continue
		} else {
			sleep = min(max(2*sleep, 5*time.Microsecond), watchMaxSleep)
		}
		timer.Reset(sleep)
		select {
		case <-timer.C:
		case <-progress:
			idle, sleep = 0, 0
		case <-a.kick:
		case <-a.stop:
			return
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// poll asks the engine for x's state and settles it when final, or when it
// has been in progress past the agent's XferTimeout (a.wmu held).
func (a *Agent) poll(x *Xfer) bool {
	st, err, ok := a.outcome(x)
	if ok {
		a.settle(x, st, err)
	}
	return ok
}

// outcome asks the engine for x's state: ok when it is final (or timed
// out, and then released).
func (a *Agent) outcome(x *Xfer) (XferState, error, bool) {
	st, err := a.b.Status(x)
	switch {
	case st == InProgress && time.Since(x.posted) > a.timeout:
		_ = a.b.Release(x)
		return Failed, fmt.Errorf("agent %s: %v to %s in progress after %v: %w", a.name, x.Op, x.Remote, a.timeout, ErrTimeout), true
	case st == InProgress:
		return st, nil, false
	case st == Failed:
		if err == nil {
			err = ErrTransfer
		}
		return Failed, fmt.Errorf("agent %s: %v to %s: %w", a.name, x.Op, x.Remote, err), true
	}
	return st, nil, true
}

// settle records x's final state and wakes its waiters (a.wmu held).
func (a *Agent) settle(x *Xfer, st XferState, err error) {
	if k := a.settleCanaries(x, st); k >= 0 {
		a.notDelivered.Add(1)
		st, err = Failed, fmt.Errorf("agent %s: READ from %s reported complete, but its descriptor %d of %d (%d bytes at %#x, from %#x) was not delivered (it still ends with a canary planted before the read, its own or an overlapping read's): %w: %w",
			a.name, x.Remote, k, len(x.Local), x.Local[k].Len, x.Local[k].Addr, x.Dst[k].Addr, canary.ErrNotDelivered, ErrTransfer)
	}
	if st == Done {
		a.corruptRead(x)
	}
	x.state, x.err = st, err
	close(x.done)
	if c := x.notify; c != nil {
		select {
		case c <- x:
		default:
			go func() { c <- x }() // never block the watcher, never drop
		}
	}
}

// final reports whether x's current post is final (a.wmu held).
func final(x *Xfer) bool {
	if x.done == nil {
		return false
	}
	select {
	case <-x.done:
		return true
	default:
		return false
	}
}

// Name returns the agent's name.
func (a *Agent) Name() string { return a.name }

// Engine returns the engine in use.
func (a *Agent) Engine() string { return a.engine }

// Backend returns the engine under the agent: its package's own tests
// reach their engine's state through it.
func (a *Agent) Backend() Backend { return a.b }

func (a *Agent) check() error {
	if a.closed {
		return fmt.Errorf("agent %s: %w", a.name, ErrClosed)
	}
	return nil
}

func validKind(k MemKind) bool { return k == DRAM || k == VRAM }

// Register registers memory the caller owns (C or device memory, or Go
// memory the caller keeps pinned).
func (a *Agent) Register(kind MemKind, descs []Desc) (*Registration, error) {
	return a.register(kind, descs, nil)
}

// RegisterBytes registers Go byte slices, pinning them until Deregister.
func (a *Agent) RegisterBytes(bufs ...[]byte) (*Registration, error) {
	p := new(runtime.Pinner)
	descs := make([]Desc, 0, len(bufs))
	for _, b := range bufs {
		if len(b) == 0 {
			p.Unpin()
			return nil, fmt.Errorf("agent %s: empty buffer: %w", a.name, ErrInvalidDescriptor)
		}
		p.Pin(&b[0])
		descs = append(descs, BytesDesc(b))
	}
	r, err := a.register(DRAM, descs, p)
	if err != nil {
		p.Unpin()
	}
	return r, err
}

func (a *Agent) register(kind MemKind, descs []Desc, p *runtime.Pinner) (*Registration, error) {
	if !validKind(kind) {
		return nil, fmt.Errorf("agent %s: memory kind %v: %w", a.name, kind, ErrInvalidDescriptor)
	}
	if len(descs) == 0 {
		return nil, fmt.Errorf("agent %s: no descriptors: %w", a.name, ErrInvalidDescriptor)
	}
	for i, d := range descs {
		if d.Addr == 0 || d.Len == 0 || mem.End(d) < uint64(d.Addr) {
			return nil, fmt.Errorf("agent %s: descriptor %d %+v: %w", a.name, i, d, ErrInvalidDescriptor)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(); err != nil {
		return nil, err
	}
	h, err := a.b.Register(kind, descs)
	if err != nil {
		return nil, fmt.Errorf("agent %s: register: %w", a.name, err)
	}
	r := &Registration{Kind: kind, Descs: append([]Desc(nil), descs...), Handle: h, pinner: p}
	a.regs[r] = struct{}{}
	a.localIdx = nil
	return r, nil
}

// Alloc returns size bytes of engine-allocated, registered DRAM. With the
// ucx engine this memory is mapped by UCX, so shared-memory writes into it
// are one-sided. Free it with Deregister.
func (a *Agent) Alloc(size uint64) (*Registration, []byte, error) {
	if size == 0 {
		return nil, nil, fmt.Errorf("agent %s: alloc of 0 bytes: %w", a.name, ErrInvalidDescriptor)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(); err != nil {
		return nil, nil, err
	}
	buf, h, err := a.b.Alloc(DRAM, size)
	if err != nil {
		return nil, nil, fmt.Errorf("agent %s: alloc %d bytes: %w", a.name, size, err)
	}
	r := &Registration{Kind: DRAM, Descs: []Desc{BytesDesc(buf)}, Handle: h, owned: true}
	a.regs[r] = struct{}{}
	a.localIdx = nil
	return r, buf, nil
}

// Deregister releases a registration (and engine-allocated memory).
func (a *Agent) Deregister(r *Registration) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.regs[r]; !ok {
		return fmt.Errorf("agent %s: deregister: registration unknown: %w", a.name, ErrInvalidDescriptor)
	}
	delete(a.regs, r)
	a.localIdx = nil
	a.deregs++
	err := a.b.Deregister(r.Handle)
	if r.pinner != nil {
		r.pinner.Unpin()
	}
	return err
}

func (a *Agent) sortedRegs() []*Registration {
	regs := make([]*Registration, 0, len(a.regs))
	for r := range a.regs {
		regs = append(regs, r)
	}
	sort.Slice(regs, func(i, j int) bool { return regs[i].Descs[0].Addr < regs[j].Descs[0].Addr })
	return regs
}

// Metadata returns this agent's metadata blob, for a peer's LoadRemote.
// It covers the memory registered so far.
func (a *Agent) Metadata() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(); err != nil {
		return nil, err
	}
	md, err := a.b.Metadata(a.sortedRegs())
	if err != nil {
		return nil, fmt.Errorf("agent %s: metadata: %w", a.name, err)
	}
	return md, nil
}

// LoadRemote loads a peer's metadata and returns the peer agent's name.
// Loading a newer blob of a known agent replaces the old one.
func (a *Agent) LoadRemote(md []byte) (string, error) {
	a.loadMu.Lock()
	defer a.loadMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(); err != nil {
		return "", err
	}
	name, regions, err := a.b.LoadRemote(md)
	if err != nil {
		if errors.Is(err, ErrBadMetadata) {
			a.refusedMD.Add(1)
		}
		if _, ok := a.remotes[name]; ok && name != "" {
			// The engine refused the blob after handing it to its library
			// (libnixl: NIXL may have dropped the agent's section): the
			// remote is gone until a blob loads, and lists prepared for it
			// are stale.
			delete(a.remotes, name)
			a.gens[name]++
		}
		return "", fmt.Errorf("agent %s: load remote metadata: %w", a.name, err)
	}
	a.remotes[name] = NewRegionIndex(regions)
	a.gens[name]++
	return name, nil
}

// PostsFenced counts the posts the engine refused because an earlier
// transfer to the same remote failed and its metadata was not loaded again
// since (libnixl: NIXL <= 1.4.0 may still hold, or have freed, the
// failed remote's endpoint; 0 on other engines).
func (a *Agent) PostsFenced() uint64 {
	if f, ok := a.b.(PostFencer); ok {
		return f.PostsFenced()
	}
	return 0
}

// WritesRefused counts the writes peers sent this agent as active messages
// (the ucx engine over tcp) that it refused — malformed, not eager, or
// outside the memory it registered — and the acknowledgements it got for
// no write of its own in flight (0 on other engines). A refused write is
// not copied; its sender's transfer fails.
func (a *Agent) WritesRefused() (refused, strayAcks uint64) {
	if f, ok := a.b.(WriteRefuser); ok {
		return f.WritesRefused()
	}
	return 0, 0
}

// MetadataRefused counts the peers' metadata blobs LoadRemote refused as
// malformed or incompatible (ErrBadMetadata) since the agent opened.
func (a *Agent) MetadataRefused() uint64 { return a.refusedMD.Load() }

// NotDelivered counts READs the engine reported complete that did not
// deliver a destination descriptor (its canary still there): each failed
// instead, naming the descriptor.
func (a *Agent) NotDelivered() uint64 { return a.notDelivered.Load() }

// RemoteContains reports whether one region of kind that the loaded
// remote agent registered contains all of d.
func (a *Agent) RemoteContains(remote string, kind MemKind, d Desc) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	idx, ok := a.remotes[remote]
	return ok && d.Len > 0 && idx.find(kind, d) >= 0
}

// RemoteUsable reports whether a remote agent is loaded and its engine
// can still post to it: not fenced after a failed transfer (libnixl), its
// endpoint not failed (ucx). A remote that is not must load its metadata
// again.
func (a *Agent) RemoteUsable(remote string) bool {
	a.mu.Lock()
	_, ok := a.remotes[remote]
	a.mu.Unlock()
	if !ok {
		return false
	}
	if u, isU := a.b.(RemoteChecker); isU {
		return u.RemoteUsable(remote)
	}
	return true
}

// HostBytes is the host memory d describes, as a byte slice. d must be
// memory this process owns and keeps mapped while the slice is used (memory
// registered or allocated through an agent).
func HostBytes(d Desc) []byte { return view(d.Addr, d.Len) }

// InvalidateRemote forgets a peer; its transfers in flight fail.
func (a *Agent) InvalidateRemote(name string) error {
	a.loadMu.Lock()
	defer a.loadMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.remotes[name]; !ok {
		return fmt.Errorf("agent %s: invalidate %q: %w", a.name, name, ErrRemoteUnknown)
	}
	delete(a.remotes, name)
	a.gens[name]++
	return a.b.Invalidate(name)
}

// PrepLocal prepares local descriptors; each must lie inside memory this
// agent registered with the same kind.
func (a *Agent) PrepLocal(kind MemKind, descs []Desc) (*Prepped, error) {
	return a.prep("", kind, descs)
}

// PrepRemote prepares descriptors of a loaded remote agent; each must lie
// inside memory that agent registered.
func (a *Agent) PrepRemote(remote string, kind MemKind, descs []Desc) (*Prepped, error) {
	if remote == "" {
		return nil, fmt.Errorf("agent %s: empty remote name: %w", a.name, ErrRemoteUnknown)
	}
	return a.prep(remote, kind, descs)
}

func (a *Agent) prep(remote string, kind MemKind, descs []Desc) (*Prepped, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.check(); err != nil {
		return nil, err
	}
	var regions *RegionIndex
	if remote == "" {
		regions = a.localIndex()
	} else {
		var ok bool
		if regions, ok = a.remotes[remote]; !ok {
			return nil, fmt.Errorf("agent %s: prep for %q: %w", a.name, remote, ErrRemoteUnknown)
		}
	}
	where := "local"
	if remote != "" {
		where = "remote " + remote
	}
	for i, d := range descs {
		if d.Len == 0 || regions.find(kind, d) < 0 {
			return nil, fmt.Errorf("agent %s: %s descriptor %d (%v addr %#x len %d dev %d) is outside registered memory: %w",
				a.name, where, i, kind, d.Addr, d.Len, d.Dev, ErrInvalidDescriptor)
		}
	}
	h, err := a.b.Prep(remote, kind, descs)
	if err != nil {
		return nil, fmt.Errorf("agent %s: prep %s: %w", a.name, where, err)
	}
	return &Prepped{Remote: remote, Kind: kind, Descs: append([]Desc(nil), descs...), Handle: h, agent: a, deregs: a.deregs,
		gen: a.gens[remote]}, nil
}

// localIndex indexes the registered memory (a.mu held).
func (a *Agent) localIndex() *RegionIndex {
	if a.localIdx == nil {
		var all []RemoteRegion
		for r := range a.regs {
			for _, d := range r.Descs {
				all = append(all, RemoteRegion{Kind: r.Kind, Desc: d})
			}
		}
		a.localIdx = NewRegionIndex(all)
	}
	return a.localIdx
}

// stillRegistered checks, after a deregistration since it was last
// checked, that every local descriptor of x still lies in registered
// memory (a.mu held): a post must never read or write memory that was
// given back.
func (a *Agent) stillRegistered(x *Xfer) error {
	p := x.LocalPrep
	if p.deregs == a.deregs {
		return nil
	}
	idx := a.localIndex()
	for i, d := range p.Descs {
		if idx.find(p.Kind, d) < 0 {
			return fmt.Errorf("agent %s: local descriptor %d (%v addr %#x len %d) was deregistered after prep: %w",
				a.name, i, p.Kind, d.Addr, d.Len, ErrInvalidDescriptor)
		}
	}
	p.deregs = a.deregs
	return nil
}

// RegionIndex is a set of regions sorted by address, for O(log n) lookups
// of the region that holds a descriptor.
type RegionIndex struct {
	r      []RemoteRegion
	pos    []int    // pos[i]: r[i]'s position in the list given to newRegionIndex
	maxEnd []uint64 // maxEnd[i]: the largest end of r[0..i]
}

// NewRegionIndex indexes rs (positions are rs's).
func NewRegionIndex(rs []RemoteRegion) *RegionIndex {
	idx := &RegionIndex{pos: make([]int, len(rs))}
	for i := range idx.pos {
		idx.pos[i] = i
	}
	sort.Slice(idx.pos, func(i, j int) bool { return rs[idx.pos[i]].Addr < rs[idx.pos[j]].Addr })
	var m uint64
	for _, p := range idx.pos {
		idx.r = append(idx.r, rs[p])
		m = max(m, mem.End(rs[p].Desc))
		idx.maxEnd = append(idx.maxEnd, m)
	}
	return idx
}

// Lookup returns the original position of a region of kind containing d,
// or −1.
func (idx *RegionIndex) Lookup(kind MemKind, d Desc) int {
	if i := idx.find(kind, d); i >= 0 {
		return idx.pos[i]
	}
	return -1
}

// find returns the sorted position of a region of kind that contains d, or −1.
// It scans left from the last region starting at or below d only while some
// region that far left could still reach d's end (regions of different
// kinds may overlap numerically), so disjoint regions cost one step.
func (idx *RegionIndex) find(kind MemKind, d Desc) int {
	for i := sort.Search(len(idx.r), func(i int) bool { return idx.r[i].Addr > d.Addr }) - 1; i >= 0 && idx.maxEnd[i] >= mem.End(d); i-- {
		if idx.r[i].Kind == kind && mem.Contains(idx.r[i].Desc, d) {
			return i
		}
	}
	return -1
}

// Release frees a prepared list.
func (p *Prepped) Release() error {
	if p.Handle == nil {
		return nil
	}
	h := p.Handle
	p.Handle = nil
	return p.agent.b.Unprep(h)
}

// NewXfer builds a transfer: local descriptors li of local, remote
// descriptors ri of remote, pairwise, with equal lengths. notif, if not nil,
// is delivered to the remote agent after the data is in place.
func (a *Agent) NewXfer(op Op, local *Prepped, li []int, remote *Prepped, ri []int, notif []byte) (*Xfer, error) {
	bad := func(format string, args ...any) (*Xfer, error) {
		return nil, fmt.Errorf("agent %s: %s: %w", a.name, fmt.Sprintf(format, args...), ErrInvalidRequest)
	}
	switch {
	case op != Write && op != Read:
		return bad("operation %v", op)
	case local == nil || remote == nil || local.agent != a || remote.agent != a:
		return bad("prepared lists must come from this agent")
	case local.Remote != "" || remote.Remote == "":
		return bad("need a local and a remote prepared list")
	case local.Handle == nil || remote.Handle == nil:
		return bad("prepared list released")
	case len(li) != len(ri) || len(li) == 0:
		return bad("%d local and %d remote indices", len(li), len(ri))
	}
	x := &Xfer{Op: op, Remote: remote.Remote, Local: make([]Desc, len(li)), Dst: make([]Desc, len(ri)),
		LocalPrep: local, RemotePrep: remote, LocalIdx: li, RemoteIdx: ri}
	if notif != nil {
		x.Notif = append([]byte{}, notif...)
	}
	for k := range li {
		if li[k] < 0 || li[k] >= len(local.Descs) || ri[k] < 0 || ri[k] >= len(remote.Descs) {
			return nil, fmt.Errorf("agent %s: pair %d: index %d/%d out of range %d/%d: %w",
				a.name, k, li[k], ri[k], len(local.Descs), len(remote.Descs), ErrInvalidDescriptor)
		}
		x.Local[k], x.Dst[k] = local.Descs[li[k]], remote.Descs[ri[k]]
		if x.Local[k].Len != x.Dst[k].Len {
			return bad("pair %d: local length %d, remote length %d", k, x.Local[k].Len, x.Dst[k].Len)
		}
	}
	return x, nil
}

// Post starts (or restarts, once finished) a transfer. The agent watches
// it from then on: Wait or Done tell when it is final.
func (a *Agent) Post(x *Xfer) error { return a.PostTo(x, nil) }

// PostTo is Post, and when the transfer is final (however it ends) the
// agent sends it on done, so one goroutine can keep many transfers in
// flight and learn of each completion from one channel. When PostTo
// returns an error nothing is sent. Give done room for every transfer
// posted to it and not yet received, or the sends queue on goroutines.
func (a *Agent) PostTo(x *Xfer, done chan<- *Xfer) error {
	a.loadMu.RLock()
	defer a.loadMu.RUnlock()
	a.mu.Lock()
	if err := a.check(); err != nil {
		a.mu.Unlock()
		return err
	}
	_, ok := a.remotes[x.Remote]
	stale := a.gens[x.Remote] != x.RemotePrep.gen
	regErr := a.stillRegistered(x)
	a.mu.Unlock()
	if !ok {
		return fmt.Errorf("agent %s: post to %q: %w", a.name, x.Remote, ErrRemoteUnknown)
	}
	if stale {
		return fmt.Errorf("agent %s: post to %q: %w", a.name, x.Remote, ErrStalePrep)
	}
	if regErr != nil {
		return regErr
	}
	a.wmu.Lock()
	if x.done != nil && !final(x) {
		a.wmu.Unlock()
		return fmt.Errorf("agent %s: post %v to %s: still in progress: %w", a.name, x.Op, x.Remote, ErrInvalidRequest)
	}
	x.posted, x.err, x.state, x.done, x.notify = time.Now(), nil, InProgress, make(chan struct{}), done
	a.corrupt(x)
	a.plantCanaries(x)
	a.wmu.Unlock()
	// The engine call runs unlocked (posts on several goroutines proceed
	// together); x is in no set meanwhile, so the watcher leaves it alone.
	err := a.b.Post(x)
	var st XferState
	var serr error
	finished := false
	if err != nil {
		err = fmt.Errorf("agent %s: post %v to %s: %w", a.name, x.Op, x.Remote, err)
	} else {
		st, serr, finished = a.outcome(x) // engines that complete at once settle here
	}
	a.wmu.Lock()
	defer a.wmu.Unlock()
	switch {
	case err != nil:
		x.notify = nil // the caller has the error
		a.settle(x, Failed, err)
		return err
	case a.wclosed && !finished:
		a.settle(x, Failed, fmt.Errorf("agent %s: %v to %s: %w", a.name, x.Op, x.Remote, ErrClosed))
	case finished:
		a.settle(x, st, serr)
	default:
		a.inflight[x] = struct{}{}
		signal(a.kick)
	}
	return nil
}

// Status returns the transfer's state without waiting; Failed comes with
// the reason. A transfer in progress past the agent's XferTimeout fails
// with ErrTimeout.
func (a *Agent) Status(x *Xfer) (XferState, error) {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	if x.done == nil {
		return Failed, fmt.Errorf("agent %s: transfer not posted: %w", a.name, ErrInvalidRequest)
	}
	if !final(x) {
		return InProgress, nil
	}
	return x.state, x.err
}

// Wait blocks until the transfer's current post is final, or ctx ends
// (then it returns InProgress and ctx's error; the transfer goes on).
func (a *Agent) Wait(ctx context.Context, x *Xfer) (XferState, error) {
	a.wmu.Lock()
	done := x.done
	a.wmu.Unlock()
	if done == nil {
		return Failed, fmt.Errorf("agent %s: transfer not posted: %w", a.name, ErrInvalidRequest)
	}
	select {
	case <-done:
		return a.Status(x)
	case <-ctx.Done():
		return InProgress, ctx.Err()
	}
}

// Release frees a transfer (cancelling it if still in progress: its
// waiters see Failed).
func (a *Agent) Release(x *Xfer) error {
	a.wmu.Lock()
	if _, ok := a.inflight[x]; ok {
		delete(a.inflight, x)
		x.cancelled = true // the engine may still write its memory
		a.settle(x, Failed, fmt.Errorf("agent %s: %v to %s released in flight: %w", a.name, x.Op, x.Remote, ErrInvalidRequest))
	}
	a.wmu.Unlock()
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return nil // Close freed the engine's side
	}
	return a.b.Release(x)
}

// GenNotif sends a notification with no data.
func (a *Agent) GenNotif(remote string, msg []byte) error {
	a.mu.Lock()
	_, ok := a.remotes[remote]
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return fmt.Errorf("agent %s: %w", a.name, ErrClosed)
	}
	if !ok {
		return fmt.Errorf("agent %s: notify %q: %w", a.name, remote, ErrRemoteUnknown)
	}
	return a.b.GenNotif(remote, msg)
}

// KeepProgress makes the agent progress its engine for d although it
// posts nothing: peers are about to read its memory (pull). Only an
// engine without its own progress needs it (libnixl without NIXL's
// progress thread, whose peers' first read waits for this side's
// wire-up); elsewhere it does nothing.
func (a *Agent) KeepProgress(d time.Duration) {
	if k, ok := a.b.(ProgressKeeper); ok {
		k.KeepProgress(d)
	}
}

// Notifs drains the notifications received since the last call, in
// arrival order.
func (a *Agent) Notifs() ([]Notif, error) { return a.b.Notifs() }

// NotifyC returns a channel that receives a value when notifications may be
// waiting, so a consumer can block instead of polling Notifs; nil for
// engines that cannot signal (poll then). Several arrivals may share one
// signal: drain Notifs after each.
func (a *Agent) NotifyC() <-chan struct{} { return a.b.NotifyC() }

// Close releases everything; transfers in flight fail. Idempotent.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	regs := a.sortedRegs()
	a.regs = map[*Registration]struct{}{}
	a.mu.Unlock()
	close(a.stop)
	<-a.watcherDone
	a.wmu.Lock()
	a.wclosed = true
	for x := range a.inflight {
		x.cancelled = true // the engine may still write its memory
		a.settle(x, Failed, fmt.Errorf("agent %s: %v to %s: %w", a.name, x.Op, x.Remote, ErrClosed))
	}
	a.inflight = map[*Xfer]struct{}{}
	err := a.b.Close()
	a.wmu.Unlock()
	for _, r := range regs {
		if r.pinner != nil {
			r.pinner.Unpin()
		}
	}
	return err
}

// signal makes a non-blocking wake-up on a capacity-1 channel.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// libPath resolves the NIXL C API library path.
func libPath(cfg Config) string {
	if cfg.NIXLLib != "" {
		return cfg.NIXLLib
	}
	return "libnixl_capi.so"
}
