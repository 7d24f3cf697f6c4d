package kvmanager

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/internal/control"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/nixl"
	_ "github.com/kvbridge/kvbridge/internal/nixl/ucx" // the ucx engine, registered with internal/nixl
	"github.com/kvbridge/kvbridge/internal/pool"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/internal/rawagent"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"go.uber.org/zap"
)

// Errors of the Manager.
var (
	// ErrManagerClosed: the rank was closed. A call after Close that
	// would create a room (CreateSender, CreateReceiver) is refused with
	// it, naming the room; a wait across Close returns it.
	ErrManagerClosed = core.ErrRankClosed
)

// Manager is the shell both roles share: it owns the goroutines, the
// control loop, the agent and (prefill) the transfer pool, feeds every
// input into the rank's Core as a step under one mutex, and carries out the
// core's effects. It keeps no room or peer state of its own. Use it through
// Prefill or Decode, which NewPrefill and NewDecode return.
type Manager struct {
	cfg Config
	// unparsedNotifs counts notifications that did not parse (decode).
	unparsedNotifs atomic.Uint64
	// digestPages counts the pages the digest check summed and found
	// matching (decode).
	digestPages atomic.Uint64
	// digestErrors counts notifications and reads whose pages this rank
	// could not sum for their digest (decode: its own failure).
	digestErrors atomic.Uint64
	// sums bounds the PAGES digests summed at once (prefill, pull: one a
	// CPU; sendWhenReady).
	sums  chan struct{}
	log   *zap.Logger
	agent *nixl.Agent
	loop  *control.Loop
	pool  *pool.Pool
	met   *metrics

	mu   sync.Mutex
	core *core.Core
	// eff orders the carrying out of the core's effects (sends, wakes,
	// watches, lookups): a step takes its ticket before it lets go of mu,
	// so the effects of steps are carried out one step at a time, in the
	// order the core produced them, outside the core's lock, and no one
	// waits for a turn holding mu (efforder.go).
	eff effOrder
	// waits are the callers' channels, closed by the core's wake effects.
	waits waiters
	// afterUnlock, when set (tests), runs after a step with effects took
	// its ticket and let go of mu, before it comes to carry (another
	// carrier may carry its effects meanwhile); onSend as each message is
	// handed to the loop, on whichever goroutine carries. Atomic: tests
	// set them while the rank runs.
	afterUnlock atomic.Pointer[func()]
	onSend      atomic.Pointer[func(wire.Message)]

	kvMem  [][]byte // regions the Manager allocated (nil when the caller's)
	warmUp time.Duration
	// proof is this process's ownership proof seed: its values are in the
	// slot after each of its regions, the seed in its REGISTERs (sealed).
	// Under regMu, a prefill rank's REGISTER checks (proof.go): those in
	// progress by decode rank and agent name, free read-back buffers, and
	// whether Close stopped new checks. (The registrations proven are the
	// core's: PeerPlan.Repeat.)
	proof    [proofLen]byte
	regMu    sync.Mutex
	checking map[string]bool
	// challenged: the blob (its hash) a challenge loaded under each agent
	// name, so the bind that follows the echo does not load it again (a
	// second load replacing the first left the first's shared-memory
	// mappings behind).
	challenged map[string][32]byte
	proofBufs  [][]byte
	// waitingRegs: REGISTERs waiting for a check of their rank or agent
	// to end, by rank (beginCheck).
	waitingRegs map[string]*wire.Register
	regClosed   bool
	proofHook   func(*wire.Register) // tests: runs before a proof's read
	deferHook   func(peer string)    // tests: runs (under regMu) when a REGISTER's check is deferred
	// challengeHook (tests) runs once a challenge's notification went
	// out, before its check ends.
	challengeHook func(*wire.Register)
	// registersReady: a prefill rank's pool exists, REGISTERs are handled.
	registersReady atomic.Bool
	auxMem         []byte
	stateMem       [][]byte

	// onOffer (decode with Pull) loads and proves an offer the core
	// checked; onReads hands reads to its transfer pool. (A prefill rank's pull offer is
	// the core's: CoreConfig.Offer.)
	onOffer func(*core.OfferPlan)
	onReads func([]core.Effect)
	// onChallengeOffer (decode with Pull) loads an offer's agent and sends
	// it the offer challenge; listen (prefill serving pull) has its
	// notifier read the agent's notifications for a while (an offer
	// challenge comes after each REGISTER_ACK with the offer).
	onChallengeOffer func(*core.OfferPlan, string)
	listen           atomic.Pointer[func(time.Duration)] // (set once the prefill's notifier runs; the control loop may step the core before)
	// resolver looks decode targets up (set by NewDecode).
	resolver func(core.Target)
	// deregister deletes the rank's bootstrap record (prefill, set once
	// registered); boot is the client that registered it.
	deregister func()
	boot       discovery.Discovery
	// onClose runs at Close once the goroutines have stopped.
	onClose []func()
	// discoveries lists the rank's discovery clients (for metrics).
	discoveries func() []discovery.Discovery
	// parked, when a test sets it, is called once a Wait holds its channel.
	parked func(room uint64)

	closeOnce sync.Once
	closing   chan struct{}
	cancel    context.CancelFunc
	ctx       context.Context
	wg        sync.WaitGroup
}

// newManager starts the parts both roles need: agent and memory, core,
// control loop, metrics and the sweeper.
func newManager(cfg Config) (m *Manager, err error) {
	cfg.fillDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	role := map[Role]string{RolePrefill: wire.RolePrefill, RoleDecode: wire.RoleDecode}[cfg.Role]
	if cfg.Engine.Name == "" {
		cfg.Engine.Name = fmt.Sprintf("%s-%s-%d", cfg.Instance, role, cfg.Rank)
	}
	m = &Manager{log: cfg.Logger, closing: make(chan struct{}), sums: make(chan struct{}, runtime.GOMAXPROCS(0))}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	if m.log == nil {
		m.log = zap.NewNop()
	}
	// The cleanup holds its own reference: a "return nil, err" below sets
	// the named result m to nil before deferred functions run (a failed
	// NewLoop crashed the rank on a nil Manager instead of returning).
	built := m
	defer func() {
		if err != nil {
			built.cancel()
			if built.loop != nil {
				built.loop.Close()
			}
			if built.agent != nil {
				built.agent.Close()
			}
		}
	}()
	if cfg.Role == RolePrefill && cfg.Engine.NIXLProgress == nixl.NIXLProgressThread && cfg.Engine.Engine != nixl.EngineUCX && cfg.Engine.Engine != nixl.EngineLoopback {
		m.log.Warn("a prefill rank's libnixl agent with NIXL's progress thread: on NIXL <= 1.4.0 a decode process that dies mid-transfer can crash this process (NIXL's endpoint error callback frees an endpoint under a post); leave Engine.NIXLProgress unset")
	}
	if cfg.Engine.NIXLProgress == 0 {
		// The decode rank's agent is written to, so NIXL's
		// progress thread runs it; the prefill rank's posts, and on NIXL
		// <= 1.4.0 that thread's endpoint error callback would free an
		// endpoint under a post when a decode process dies, so its own
		// calls progress it (no thread, NIXL's strict lock).
		cfg.Engine.NIXLProgress = nixl.NIXLProgressThread
		if cfg.Role == RolePrefill || cfg.Pull {
			// (A decode rank that pulls posts too: the same hazard.)
			cfg.Engine.NIXLProgress = nixl.NIXLProgressCaller
		}
	}
	if m.agent, err = nixl.Open(cfg.Engine); err != nil {
		return nil, err
	}
	if err = m.registerMemory(&cfg); err != nil {
		return nil, err
	}
	m.cfg = cfg
	ccfg := core.CoreConfig{Role: core.Role(cfg.Role), Rank: cfg.Rank, Compat: cfg.Compat, Layout: cfg.Layout, Registry: core.RegistryConfig(cfg.Registry),
		QuarantineTimeout: cfg.QuarantineTimeout, RegisterRetry: cfg.RegisterRetry, Parallel: cfg.Parallel, Model: cfg.Model,
		MaxEpochs: cfg.MaxEpochs, RecheckIdle: cfg.HeartbeatInterval * time.Duration(cfg.MaxMisses+1),
		ProbeIdle: max(cfg.ProbeIdle, 0), ProbeTimeout: cfg.ProbeTimeout, Lease: max(cfg.PullLease, 0)}
	if cfg.Role == RoleDecode {
		// The metadata blob is taken once, before any peer is contacted: a
		// failure here fails New instead of wedging a registration.
		md, err := m.agent.Metadata()
		if err != nil {
			return nil, fmt.Errorf("kvmanager: agent metadata: %w", err)
		}
		kv, aux, state := core.RegionsOf(cfg.Layout)
		ccfg.Register = wire.Register{Compat: cfg.Compat, Agent: cfg.Engine.Name, AgentMD: md,
			TPSize: cfg.Parallel.TPSize, TPRank: cfg.Parallel.TPRank, KV: kv, Aux: aux, State: state, Proof: m.proof[:], Pull: cfg.Pull}
		if !kvlayout.NoModel(cfg.Model) {
			f := modelFacts(cfg.Model)
			ccfg.Register.Topo = &wire.Topo{PPSize: cfg.Parallel.PPSize, PPRank: cfg.Parallel.PPRank,
				DPSize: cfg.Parallel.DPSize, DPRank: cfg.Parallel.DPRank, Layers: f.Layers, KVHeads: f.KVHeads,
				HeadBytes: f.HeadBytes, PageTokens: cfg.Model.PageTokens, MLA: f.MLA, PageLayout: f.PageLayout}
		}
	}
	if ccfg.Offer, err = m.pullOffer(); err != nil {
		return nil, err
	}
	ccfg.OfferProgress = m.proofTimeout() // the decode rank reads the offer's proof slots back
	ccfg.Identity = wire.From{Role: role, Instance: cfg.Instance, Rank: cfg.Rank}.Peer()
	ccfg.ChallengeTimeout = m.proofTimeout()
	if _, err = rand.Read(ccfg.ChallengeKey[:]); err != nil {
		return nil, fmt.Errorf("kvmanager: drawing the challenge key: %w", err)
	}
	if m.core, err = core.NewCore(ccfg); err != nil {
		return nil, err
	}
	m.met = newMetrics(m)
	if cfg.Registerer != nil {
		if err = cfg.Registerer.Register(m.met); err != nil {
			return nil, fmt.Errorf("kvmanager: metrics: %w", err)
		}
	}
	m.loop, err = control.NewLoop(control.LoopConfig{
		Identity: wire.From{Role: role, Instance: cfg.Instance, Rank: cfg.Rank},
		Bind:     cfg.Bind, Handler: m.handle, OnPeerDown: m.peerDown, OnMalformedRequest: m.malformed,
		HeartbeatInterval: cfg.HeartbeatInterval, MaxMisses: cfg.MaxMisses,
		MaxPeers: cfg.MaxPeers, Auth: cfg.Auth, Insecure: cfg.Insecure, Security: cfg.Security, RankIdentity: cfg.identity(), Tap: cfg.hooks.ControlTap, Logger: m.log, Registerer: cfg.Registerer})
	if err != nil {
		if cfg.Registerer != nil {
			cfg.Registerer.Unregister(m.met)
		}
		return nil, err
	}
	if cfg.Role == RolePrefill {
		// Named in its agent challenges: a decode rank echoes to it.
		ep := m.loop.Endpoint()
		m.stepIn(core.Bound{Endpoint: ep})
	}
	return m, nil
}

// registerMemory allocates the regions given without an address (UCX-mapped
// memory with the ucx engine, so shared-memory writes are one-sided) and
// registers the caller's — each with its ownership proof slot
// (transfer.ProofBytes) right after it, which it fills with this process's
// proof (m.proof).
func (m *Manager) registerMemory(cfg *Config) error {
	if _, err := rand.Read(m.proof[:]); err != nil {
		return fmt.Errorf("kvmanager: ownership proof: %w", err)
	}
	const slot = transfer.ProofBytes
	withSlot := func(d nixl.Desc) nixl.Desc { d.Len += slot; return d }
	if err := callerSlotsFree(cfg.Layout); err != nil {
		return err
	}
	cfg.Layout.Regions = append([]nixl.Desc(nil), cfg.Layout.Regions...)
	var own []nixl.Desc
	for i, r := range cfg.Layout.Regions {
		if r.Addr != 0 {
			own = append(own, withSlot(r))
			continue
		}
		_, buf, err := m.agent.Alloc(r.Len + slot)
		if err != nil {
			return fmt.Errorf("kvmanager: allocating KV region %d: %w", i, err)
		}
		m.kvMem = append(m.kvMem, buf[:r.Len:r.Len])
		cfg.Layout.Regions[i] = nixl.BytesDesc(buf[:r.Len])
	}
	if cfg.Layout.Aux.Len > 0 && cfg.Layout.Aux.Addr == 0 {
		_, buf, err := m.agent.Alloc(cfg.Layout.Aux.Len + slot)
		if err != nil {
			return fmt.Errorf("kvmanager: allocating aux memory: %w", err)
		}
		m.auxMem = buf[:cfg.Layout.Aux.Len:cfg.Layout.Aux.Len]
		cfg.Layout.Aux = nixl.BytesDesc(m.auxMem)
	} else if cfg.Layout.Aux.Len > 0 {
		if _, err := m.agent.Register(nixl.DRAM, []nixl.Desc{withSlot(cfg.Layout.Aux)}); err != nil {
			return fmt.Errorf("kvmanager: registering aux memory: %w", err)
		}
	}
	cfg.Layout.State = append([]transfer.StateRegion(nil), cfg.Layout.State...)
	for i, st := range cfg.Layout.State {
		if st.Addr != 0 {
			if _, err := m.agent.Register(nixl.DRAM, []nixl.Desc{withSlot(st.Desc)}); err != nil {
				return fmt.Errorf("kvmanager: registering state region %d: %w", i, err)
			}
			continue
		}
		_, buf, err := m.agent.Alloc(st.Len + slot)
		if err != nil {
			return fmt.Errorf("kvmanager: allocating state region %d: %w", i, err)
		}
		m.stateMem = append(m.stateMem, buf[:st.Len:st.Len])
		cfg.Layout.State[i].Desc = nixl.BytesDesc(buf[:st.Len])
	}
	if len(own) > 0 {
		if _, err := m.agent.Register(cfg.Layout.Kind, own); err != nil {
			return fmt.Errorf("kvmanager: registering KV memory: %w", err)
		}
	}
	role := map[Role]string{RolePrefill: wire.RolePrefill, RoleDecode: wire.RoleDecode}[cfg.Role]
	if err := m.writeProof(cfg.Layout, wire.From{Role: role, Instance: cfg.Instance, Rank: cfg.Rank}.Peer()); err != nil {
		return err
	}
	if cfg.WarmMemory {
		start := time.Now()
		host := []nixl.Desc{cfg.Layout.Aux}
		if cfg.Layout.Kind == nixl.DRAM {
			host = append(host, cfg.Layout.Regions...)
		}
		for _, st := range cfg.Layout.State {
			host = append(host, st.Desc)
		}
		if err := nixl.Populate(host...); err != nil {
			return fmt.Errorf("kvmanager: warming memory: %w", err)
		}
		m.warmUp = time.Since(start)
	}
	return nil
}

// WarmUp is how long faulting in the rank's memory took at start-up
// (Config.WarmMemory; 0 without).
func (m *Manager) WarmUp() time.Duration { return m.warmUp }

// start launches the goroutines common to both roles.
func (m *Manager) start() {
	m.wg.Add(1)
	go m.sweeper()
}

// Memory returns the KV regions and aux memory the Manager allocated (for
// layouts given without addresses).
func (m *Manager) Memory() (kv [][]byte, aux []byte) { return m.kvMem, m.auxMem }

// StateMemory returns the state regions the Manager allocated.
func (m *Manager) StateMemory() [][]byte { return m.stateMem }

// Endpoint returns the rank's control endpoint.
func (m *Manager) Endpoint() string { return m.loop.Endpoint() }

// Epoch returns this process's control-plane epoch (its messages' from).
func (m *Manager) Epoch() uint64 { return m.loop.Identity().Epoch }

// Engine names the NIXL engine the rank's agent runs (loopback, ucx,
// libnixl).
func (m *Manager) Engine() string { return m.agent.Engine() }

// The raw agent is not exported (writes through it would bypass the
// core): kvbridge's benchmarks and tests reach it through rawagent.
func init() {
	rawagent.Of = func(rank any) *nixl.Agent {
		switch r := rank.(type) {
		case *Prefill:
			return r.agent
		case *Decode:
			return r.agent
		case *Manager:
			return r.agent
		}
		return nil
	}
}

// Config returns the configuration in use.
func (m *Manager) Config() Config { return m.cfg }

// step runs one step of the core under the lock and carries out its
// effects after it, in order: the step takes a ticket before it releases
// mu and queues its sends, wake-ups, watches and lookups with it; they are
// carried out in step order, one step's at a time, by one carrier at a
// time (efforder.go: one writer, as grpc's loopyWriter keeps a stream's
// frames in order), while the core's lock is free for its work — an
// encode, a seal and a cgo call per send are not paid under it, and no
// one waits for the order holding it. The step's posts go to the transfer
// pool once its turn is over (Submit may block while a worker's gate
// needs the lock and a turn).
// stepIn steps one input into the core at the shell's clock and carries
// out its effects: the shell's one way into the core. What a caller needs
// to know of the room besides (its status before, its times when it
// succeeded) comes in the Output.
func (m *Manager) stepIn(in core.Input) core.Output {
	m.mu.Lock()
	out := m.core.Step(m.cfg.hooks.Now(), in)
	m.carryOut()
	return out
}

// stepAfter is stepIn with before run first under the same hold of the
// core's lock (nothing can step between them).
func (m *Manager) stepAfter(before func(c *core.Core), in core.Input) core.Output {
	m.mu.Lock()
	before(m.core)
	out := m.core.Step(m.cfg.hooks.Now(), in)
	m.carryOut()
	return out
}

// carryOut takes the core's effects, lets m.mu go (the caller holds it)
// and carries them out, in step order.
func (m *Manager) carryOut() {
	effects := m.core.Effects()
	if len(effects) == 0 {
		m.mu.Unlock()
		return
	}
	var posts, reads []core.Effect
	for _, e := range effects {
		switch {
		case e.Kind == core.EffectRead:
			reads = append(reads, e)
		case !ordered(e.Kind):
			posts = append(posts, e) // each may step: after the turn
		}
	}
	t := m.eff.take(effects)
	m.mu.Unlock()
	if f := m.afterUnlock.Load(); f != nil {
		(*f)()
	}
	m.eff.carry(t, m.carryOutOrdered)
	if len(reads) > 0 {
		if m.onReads != nil {
			m.onReads(reads)
		} else {
			// A rank without readers (no Config.Pull) never drops a read:
			// it is over, unposted.
			for _, e := range reads {
				m.stepIn(core.ReadDone{Room: e.Room, Read: e.Read, Quiesced: true, Err: fmt.Errorf("room %d: this decode rank does not pull (Config.Pull)", e.Room)})
			}
		}
	}
	m.carryOutPosts(posts)
}

// carryOutOrdered carries out one step's ordered effects (effOrder), on
// whichever goroutine carries the queue: each is a hand-off that does not
// block (a send to the control loop, a channel closed, a lookup or an
// unload started on a goroutine of its own).
func (m *Manager) carryOutOrdered(effects []core.Effect) {
	for _, e := range effects {
		switch e.Kind {
		case core.EffectSend:
			if a, ok := e.Msg.(*wire.RegisterAck); ok && !a.OK {
				m.log.Warn("registration refused", zap.String("peer", e.To.Endpoint), zap.String("reason", a.Reason))
			}
			if e.Ready != nil || e.Digest != nil {
				// A PAGES whose data is not known to be in place yet, or
				// that its digest's sums go into: off the queue, which
				// every later step's effects wait for.
				m.sendWhenReady(e)
				continue
			}
			m.send(e.To, e.Msg)
		case core.EffectTimer:
			// A deadline shorter than the sweep (a probe's): enforced at
			// once, not at the next sweep.
			time.AfterFunc(max(e.At.Sub(m.cfg.hooks.Now()), 0)+time.Millisecond, func() {
				select {
				case <-m.closing:
				default:
					m.tick()
				}
			})
		case core.EffectWake:
			if e.Wake == core.WakeReady && m.cfg.Role == RolePrefill {
				m.trace(e.Room, rankhooks.Woken)
			}
			m.waits.wake(e.Room, e.Wake)
		case core.EffectWatch:
			_ = m.loop.Watch(e.To)
		case core.EffectUnwatch:
			_ = m.loop.Unwatch(e.To.Endpoint)
		case core.EffectResolve:
			if m.resolver != nil {
				m.resolver(e.Target)
			}
		case core.EffectReleased:
			if m.cfg.Role == RolePrefill {
				m.met.pageSeconds.Observe(float64(e.Pages) * e.Held.Seconds())
				if e.Forced {
					m.log.Warn("pull room's pages released by the quarantine past the lease, without a drained READ_DONE",
						zap.Uint64("room", e.Room), zap.Duration("quarantine", m.cfg.QuarantineTimeout))
				}
				continue
			}
			if e.Forced {
				m.log.Warn("quarantine deadline passed: pages released without ABORT_ACK",
					zap.Uint64("room", e.Room), zap.Duration("quarantine", m.cfg.QuarantineTimeout))
			}
		case core.EffectKeepProgress:
			m.agent.KeepProgress(e.Keep)
			if listen := m.listen.Load(); listen != nil {
				(*listen)(e.Keep) // (prefill) an offer's challenge may come
			}
		case core.EffectUnload:
			// Off the effects: closing an endpoint to a dead peer waits
			// (up to the engine's close bound), and every step would wait
			// behind it.
			m.unload(e.Remote)
		}
	}
}

// carryOutPosts hands chunks to the transfer pool and starts metadata
// loads, REGISTER and offer challenges, after the step's turn (each may
// step the core).
func (m *Manager) carryOutPosts(posts []core.Effect) {
	for _, e := range posts {
		switch e.Kind {
		case core.EffectLoadMetadata:
			m.loadMetadata(e.Msg.(*wire.Register), *e.Plan)
			continue
		case core.EffectChallenge:
			m.challenge(e.Msg.(*wire.Register), e.Notif)
			continue
		case core.EffectChallengeOffer:
			if m.onChallengeOffer != nil {
				m.onChallengeOffer(e.Offer, e.Notif)
			} else {
				m.stepIn(core.OfferChallenged{Plan: e.Offer, Err: errors.New("this decode rank does not pull (Config.Pull)")})
			}
			continue
		case core.EffectLoadOffer:
			if m.onOffer != nil {
				m.onOffer(e.Offer)
			} else {
				m.stepIn(core.OfferLoaded{Plan: e.Offer, Err: errors.New("this decode rank does not pull (Config.Pull)")})
			}
			continue
		case core.EffectPost:
			m.post(e)
			continue
		}
		// A kind no carrier knows (TestEveryEffectKindCarried: none today).
		m.log.Error("effect not carried out: its kind is unknown to this shell", zap.Stringer("kind", e.Kind), zap.Uint64("room", e.Room))
	}
}

// read runs f on the core under the lock.
func (m *Manager) read(f func(c *core.Core)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m.core)
}

func (m *Manager) send(to wire.Peer, msg wire.Message) {
	if f := m.onSend.Load(); f != nil {
		(*f)(msg)
	}
	if err := m.loop.Send(to, msg); err != nil && !errors.Is(err, control.ErrClosed) {
		m.log.Warn("control message not sent", zap.Stringer("type", msg.Type()), zap.String("peer", to.Endpoint), zap.Error(err))
	}
}

// handle runs on the control loop's receive goroutine; it never blocks for
// long (sends are non-blocking hand-offs), except that a REQUEST's step
// may post the chunks its room kept (docs/PROTOCOL.md "Chunks handed over
// early"): their first writes, at most 1 MiB a room, are posted here, and
// handing the rest to the pool waits while its worker's queue is full.
func (m *Manager) handle(msg wire.Message) {
	if m.cfg.hooks.Drop != nil && m.cfg.hooks.Drop(msg) {
		return
	}
	switch msg := msg.(type) {
	case *wire.Register:
		m.onRegister(msg)
	case *wire.Request:
		at := time.Now() // its arrival: the step may post the room's first write (chunks handed over early)
		if m.receive(msg).OK && m.cfg.hooks.Trace != nil {
			m.cfg.hooks.Trace(msg.Room, rankhooks.Request, at)
		}
	case *wire.Abort:
		m.met.abort(m.receive(msg).Prior) // the room's status when the abort came (0: no sender yet)
	default:
		m.receive(msg)
	}
}

// receive steps a received message into the core (peek, if set, reads the
// core first, in the same step) and logs a restart the epoch check found.
func (m *Manager) receive(msg wire.Message) core.Output {
	out := m.stepIn(core.Received{Msg: msg})
	if out.PeerRestarted {
		m.log.Warn("peer restarted", zap.String("peer", msg.Sender().Peer()), zap.String("endpoint", msg.Sender().Endpoint))
	}
	return out
}

// malformed answers a REQUEST the codec refused but that named its room and
// sender (the core decides: only a prefill rank answers).
func (m *Manager) malformed(r control.MalformedReport) {
	m.stepIn(core.MalformedRequest{Room: r.Room, Endpoint: r.Endpoint, Reason: r.Reason})
}

func (m *Manager) peerDown(p control.PeerDown) {
	m.log.Warn("peer down", zap.String("endpoint", p.Endpoint), zap.String("reason", p.Reason))
	m.stepIn(core.PeerUnreachable{Endpoint: p.Endpoint, Reason: p.Reason})
}

func (m *Manager) sweeper() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
			m.tick()
		}
	}
}

// tick enforces every deadline passed at the Manager's clock now (the
// sweeper calls it every SweepInterval, a core's timer at its deadline).
// The rooms past their deadline are counted in the sweep's own hold of
// the lock, at the sweep's clock: counted after the step returned (it
// waits for its effects' turn), a deadline that passed meanwhile — the
// next sweep's to enforce — read as one the sweep missed.
func (m *Manager) tick() {
	m.mu.Lock()
	now := m.cfg.hooks.Now()
	m.core.Step(now, core.Tick{})
	over := m.core.Overdue(now)
	m.carryOut()
	m.met.overdue.Set(float64(over))
}

// Abort fails the room on this rank and tells its peers: a prefill rank's
// decode ranks, a decode rank's prefill ranks (also before its REQUEST
// went out). An unknown room is remembered as aborted, for a REQUEST (or
// a sender) still on its way. A decode room's pages stay quarantined
// until Released.
func (m *Manager) Abort(room uint64, reason string) {
	var in core.Input = core.AbortReceiver{Room: room, Reason: reason}
	if m.cfg.Role == RolePrefill {
		in = core.AbortSender{Room: room, Reason: reason}
	}
	m.met.abort(m.stepIn(in).Prior)
}

// Clear forgets the room. An unfinished room is aborted first; a decode
// room's pages stay quarantined past Clear until Released.
func (m *Manager) Clear(room uint64) {
	if m.cfg.Role == RolePrefill {
		m.stepIn(core.ClearSender{Room: room})
		return
	}
	m.stepIn(core.ClearReceiver{Room: room})
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Released returns a channel closed once the room's pages may be reused.
// Decode: its destination pages — the room succeeded, or every prefill
// rank that got its REQUEST acknowledged the abort as drained, or the
// quarantine deadline passed (counted as forced). Prefill: a pull room's
// published pages — every decode rank it published to reported its reads
// drained, or the quarantine past the lease ran out (counted as forced);
// a push room holds nothing, and the channel is closed. It stays valid
// after Clear.
func (m *Manager) Released(room uint64) <-chan struct{} {
	var ch <-chan struct{} = closedChan
	m.read(func(c *core.Core) {
		switch {
		case m.cfg.Role == RolePrefill && c.PullHold(room):
			ch = m.waits.on(room, core.WakePull)
		case m.cfg.Role == RoleDecode && c.Hold(room):
			ch = m.waits.on(room, core.WakeHold)
		}
	})
	return ch
}

// Status returns a room's status (known false without a live room).
func (m *Manager) Status(room uint64) (Poll, bool) {
	var st core.Poll
	var known bool
	m.read(func(c *core.Core) { st, known = c.Status(room) })
	return Poll(st), known
}

// Failure returns a failed room's first reason.
func (m *Manager) Failure(room uint64) (reason string) {
	m.read(func(c *core.Core) { reason, _ = c.Failure(room) })
	return reason
}

// sizes counts what the rank's core holds.
func (m *Manager) sizes() (s core.CoreSizes) {
	m.read(func(c *core.Core) { s = c.Sizes() })
	s.Waiters = m.waits.size()
	return s
}

// discoveryMalformed sums the malformed records the rank's discovery
// clients ignored.
func (m *Manager) discoveryMalformed() uint64 {
	var n uint64
	if m.discoveries != nil {
		for _, d := range m.discoveries() {
			n += d.Malformed()
		}
	}
	return n
}

// recordsRestored counts the times the rank put its own discovery record
// back (etcd; the HTTP server's leases keep others from writing it).
func (m *Manager) recordsRestored() uint64 {
	if r, ok := m.boot.(interface{ Restored() uint64 }); ok {
		return r.Restored()
	}
	return 0
}

// leasesLost counts the rank's discovery leases found expired on a write
// (etcd) and replaced.
func (m *Manager) leasesLost() uint64 {
	if r, ok := m.boot.(interface{ LeasesLost() uint64 }); ok {
		return r.LeasesLost()
	}
	return 0
}

// dialOptions are the discovery clients' options: the bootstrap token and
// the etcd settings.
func (m *Manager) dialOptions() discovery.DialOptions {
	o := discovery.DialOptions{Etcd: m.cfg.Etcd}
	if m.cfg.Auth != nil {
		o.Token = m.cfg.Auth.BootstrapToken()
	}
	return o
}

// stats returns what the rank's core counted (the source of its metrics).
func (m *Manager) stats() (s core.CoreStats) {
	m.read(func(c *core.Core) { s = c.Stats() })
	return s
}

// InFlight returns a room's posted writes not yet completed.
func (m *Manager) InFlight(room uint64) (n int) {
	m.read(func(c *core.Core) { n = c.InFlight(room) })
	return n
}

// Wait blocks until the room is terminal, the room is cleared, ctx ends or
// the Manager closes, and returns its status then.
func (m *Manager) Wait(ctx context.Context, room uint64) (Poll, error) {
	return m.wait(ctx, room, "wait", core.WakeDone)
}

// WaitReady blocks until the room can move data (WaitingForInput or
// later), is terminal or cleared, ctx ends or the Manager closes.
func (m *Manager) WaitReady(ctx context.Context, room uint64) (Poll, error) {
	return m.wait(ctx, room, "wait ready", core.WakeReady)
}

func (m *Manager) wait(ctx context.Context, room uint64, what string, wake core.Wake) (Poll, error) {
	var ch <-chan struct{}
	var err error
	woken := false
	m.read(func(c *core.Core) {
		done, ready, ok := c.Pending(room)
		if ok {
			if (wake == core.WakeDone && done) || (wake == core.WakeReady && ready) {
				ch = m.waits.on(room, wake)
			} else {
				woken = true
			}
			return
		}
		kind, reason, ok := c.Tombstone(room, m.cfg.hooks.Now())
		switch {
		case !ok:
			err = fmt.Errorf("room %d: %s: %w", room, what, core.ErrUnknownRoom)
		case kind == core.Cleared:
			err = fmt.Errorf("room %d: %s: %w", room, what, core.ErrRoomCleared)
		default:
			err = fmt.Errorf("room %d: %s: no sender yet: %w: %s", room, what, core.ErrRoomAborted, reason)
		}
	})
	if err != nil {
		return 0, err
	}
	if woken {
		ch = m.woken()
	}
	if m.parked != nil {
		m.parked(room)
	}
	select {
	case <-ch:
	case <-ctx.Done():
		st, _ := m.Status(room)
		return st, fmt.Errorf("room %d: %s: %w", room, what, ctx.Err())
	case <-m.closing:
		st, _ := m.Status(room)
		return st, fmt.Errorf("room %d: %s: %w", room, what, ErrManagerClosed)
	}
	st, known := m.Status(room)
	if !known {
		return 0, fmt.Errorf("room %d: cleared: %w", room, core.ErrRoomCleared)
	}
	return st, nil
}

// spawn runs f on a goroutine of its own, counted in wg, unless the rank
// is closing: Close sets regClosed under regMu before it waits for wg, so
// no goroutine is added once that wait began (a step taken while Close
// runs, or a caller's, may still emit an effect that would start one: a
// lookup, a PAGES waiting for its data, a watch). It reports whether f runs.
func (m *Manager) spawn(f func()) bool {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	if m.regClosed {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
	return true
}

// Close fails every live room (telling peers), stops the transfer pool,
// the control loop and the agent, and waits for its goroutines.
func (m *Manager) Close() error {
	var err error
	m.closeOnce.Do(func() {
		m.stepIn(core.Close{Reason: "manager closed"})
		// A step that took the core's lock before Close's may still be
		// carrying out its effects (a lookup among them adds to a wait
		// group): they end before anything below stops.
		<-m.eff.barrier()
		close(m.closing)
		m.cancel()
		m.regMu.Lock()
		m.regClosed = true // no REGISTER check starts after this
		m.regMu.Unlock()
		m.wg.Wait()
		if m.deregister != nil {
			m.deregister()
		}
		for _, f := range m.onClose {
			f()
		}
		if m.pool != nil {
			m.pool.Close()
		}
		err = errors.Join(m.loop.Close(), m.agent.Close())
		// Nothing reads this rank's memory now: pull rooms' pages are
		// released (their waiters, sender.Released, wake only now).
		m.stepIn(core.AgentClosed{})
		if m.cfg.Registerer != nil {
			m.cfg.Registerer.Unregister(m.met)
		}
	})
	return err
}

// modelFacts is the rank table's form of a model.
func modelFacts(m transfer.Model) records.ModelFacts {
	if kvlayout.NoModel(m) {
		return records.ModelFacts{}
	}
	return records.ModelFacts{Layers: m.Layers, KVHeads: m.KVHeads, HeadBytes: m.HeadBytes, MLA: m.MLA, PageLayout: m.Layout.String()}
}
