package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
	"go.uber.org/zap"
)

// Errors of the Manager.
var (
	ErrIncompatible  = errors.New("kvmanager: peer refused registration")
	ErrNotRegistered = errors.New("kvmanager: peer not registered")
	ErrManagerClosed = errors.New("kvmanager: manager closed")
)

// Manager wires one rank's registry, control loop, agent and (prefill)
// transfer pool, and implements the flows of PROTOCOL.md. The sender and
// receiver packages are thin handles over it.
type Manager struct {
	cfg   Config
	log   *zap.Logger
	reg   *Registry
	loop  *bootstrap.Loop
	agent *nixl.Agent
	pool  *transfer.Pool
	boot  *bootstrap.Client
	met   *metrics

	mu sync.Mutex
	// prefill state
	peers     map[string]*decodePeer         // by From.Peer()
	peerRooms map[string]map[uint64]struct{} // peer key → rooms it requested
	sends     map[uint64]*sendState
	ackTo     map[uint64][]bootstrap.Peer // ABORT_ACKs owed once the room drains
	draining  map[uint64]int              // cleared rooms with writes still in flight
	// decode state
	prefills map[string]*prefillPeer // by endpoint
	recvs    map[uint64]*recvState
	resolved bootstrap.RankInfo // the prefill rank, from the bootstrap server

	kvMem    [][]byte // regions the Manager allocated (nil when the caller's)
	auxMem   []byte
	stateMem [][]byte

	closeOnce sync.Once
	closing   chan struct{}
	wg        sync.WaitGroup
}

// decodePeer is a registered decode rank, on the prefill side.
type decodePeer struct {
	from   bootstrap.From
	remote string // nixl agent name
	layout transfer.Layout
}

type sendState struct {
	sent    int // pages handed to Send so far (positions in the request)
	chunk   int
	started time.Time
}

// prefillPeer is a prefill rank a decode rank registered with.
type prefillPeer struct {
	endpoint string
	key      string // server key
	from     bootstrap.From
	done     chan struct{} // closed when REGISTER_ACK arrives
	err      error
}

type recvState struct {
	peer     *prefillPeer
	chunks   map[int]bool
	total    int // 0 until the last chunk's notification
	aux      bool
	released chan struct{} // closed on ABORT_ACK (or when no write can come)
	once     sync.Once
	aborted  bool
	started  time.Time
}

// New starts a Manager: it opens the agent and registers the layout, binds
// the control endpoint, starts the transfer pool (prefill) and registers the
// rank with the bootstrap server (prefill, when BootstrapURL is set).
func New(cfg Config) (m *Manager, err error) {
	def := DefaultConfig(cfg.Role)
	if cfg.Bind == "" {
		cfg.Bind = def.Bind
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = def.HeartbeatInterval
	}
	if cfg.MaxMisses == 0 {
		cfg.MaxMisses = def.MaxMisses
	}
	if cfg.SweepInterval == 0 {
		cfg.SweepInterval = def.SweepInterval
	}
	if cfg.Registry.BootstrapTimeout == 0 {
		now := cfg.Registry.Now
		cfg.Registry = def.Registry
		if now != nil {
			cfg.Registry.Now = now
		}
	}
	if cfg.Workers == 0 {
		cfg.Workers = def.Workers
	}
	if cfg.TPSize == 0 {
		cfg.TPSize = 1
	}
	if cfg.Role == RoleDecode && cfg.PrefillRank == 0 {
		cfg.PrefillRank = cfg.Rank
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	role := map[Role]string{RolePrefill: bootstrap.RolePrefill, RoleDecode: bootstrap.RoleDecode}[cfg.Role]
	if cfg.Engine.Name == "" {
		cfg.Engine.Name = fmt.Sprintf("%s-%s-%d", cfg.Instance, role, cfg.Rank)
	}
	m = &Manager{cfg: cfg, log: cfg.Logger, peers: map[string]*decodePeer{}, peerRooms: map[string]map[uint64]struct{}{},
		sends: map[uint64]*sendState{}, ackTo: map[uint64][]bootstrap.Peer{}, draining: map[uint64]int{}, prefills: map[string]*prefillPeer{},
		recvs: map[uint64]*recvState{}, closing: make(chan struct{})}
	if m.log == nil {
		m.log = zap.NewNop()
	}
	cleanup := func() {
		if m.pool != nil {
			m.pool.Close()
		}
		if m.loop != nil {
			m.loop.Close()
		}
		if m.agent != nil {
			m.agent.Close()
		}
	}
	if m.reg, err = NewRegistry(cfg.Registry); err != nil {
		return nil, err
	}
	if m.agent, err = nixl.Open(cfg.Engine); err != nil {
		return nil, err
	}
	// Regions with no address are allocated by the agent (UCX-mapped
	// memory with the ucx engine, so shared-memory writes are one-sided).
	cfg.Layout.Regions = append([]nixl.Desc(nil), cfg.Layout.Regions...)
	var own []nixl.Desc // caller-owned regions to register
	for i, r := range cfg.Layout.Regions {
		if r.Addr != 0 {
			own = append(own, r)
			continue
		}
		_, buf, err := m.agent.Alloc(r.Len)
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("kvmanager: allocating KV region %d: %w", i, err)
		}
		m.kvMem = append(m.kvMem, buf)
		cfg.Layout.Regions[i] = nixl.BytesDesc(buf)
	}
	if cfg.Layout.Aux.Len > 0 && cfg.Layout.Aux.Addr == 0 {
		_, buf, err := m.agent.Alloc(cfg.Layout.Aux.Len)
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("kvmanager: allocating aux memory: %w", err)
		}
		m.auxMem = buf
		cfg.Layout.Aux = nixl.BytesDesc(buf)
	}
	cfg.Layout.State = append([]transfer.StateRegion(nil), cfg.Layout.State...)
	for i, st := range cfg.Layout.State {
		if st.Addr != 0 {
			if _, err = m.agent.Register(nixl.DRAM, []nixl.Desc{st.Desc}); err != nil {
				cleanup()
				return nil, fmt.Errorf("kvmanager: registering state region %d: %w", i, err)
			}
			continue
		}
		_, buf, err := m.agent.Alloc(st.Len)
		if err != nil {
			cleanup()
			return nil, fmt.Errorf("kvmanager: allocating state region %d: %w", i, err)
		}
		m.stateMem = append(m.stateMem, buf)
		cfg.Layout.State[i].Desc = nixl.BytesDesc(buf)
	}
	m.cfg = cfg
	if len(own) > 0 {
		if _, err = m.agent.Register(cfg.Layout.Kind, own); err != nil {
			cleanup()
			return nil, fmt.Errorf("kvmanager: registering KV memory: %w", err)
		}
	}
	if cfg.Layout.Aux.Len > 0 && m.auxMem == nil {
		if _, err = m.agent.Register(nixl.DRAM, []nixl.Desc{cfg.Layout.Aux}); err != nil {
			cleanup()
			return nil, fmt.Errorf("kvmanager: registering aux memory: %w", err)
		}
	}
	m.met = newMetrics(m)
	if cfg.Registerer != nil {
		if err = cfg.Registerer.Register(m.met); err != nil {
			cleanup()
			return nil, fmt.Errorf("kvmanager: metrics: %w", err)
		}
	}
	m.loop, err = bootstrap.NewLoop(bootstrap.LoopConfig{
		Identity: bootstrap.From{Role: role, Instance: cfg.Instance, Rank: cfg.Rank},
		Bind:     cfg.Bind, Handler: m.handle, OnPeerDown: m.peerDown,
		HeartbeatInterval: cfg.HeartbeatInterval, MaxMisses: cfg.MaxMisses,
		Security: cfg.Security, Logger: m.log})
	if err != nil {
		cleanup()
		return nil, err
	}
	if cfg.Role == RolePrefill {
		if m.pool, err = transfer.NewPool(m.agent, cfg.Layout, transfer.Config{Workers: cfg.Workers, Stall: cfg.Registry.StallTimeout}); err != nil {
			cleanup()
			return nil, err
		}
	}
	if cfg.BootstrapURL != "" {
		m.boot = bootstrap.NewClient(cfg.BootstrapURL)
		if cfg.Role == RolePrefill {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err = m.boot.RegisterRank(ctx, bootstrap.RankRecord{Instance: cfg.Instance, DPSize: 1, TPRank: cfg.Rank,
				TPSize: cfg.TPSize, PPSize: 1, Endpoint: m.loop.Endpoint(), PageSize: cfg.PageTokens, DType: cfg.DType,
				Compat: cfg.Compat, PublicKey: m.loop.PublicKey()})
			cancel()
			if err != nil {
				cleanup()
				return nil, fmt.Errorf("kvmanager: registering with the bootstrap server: %w", err)
			}
		}
	}
	m.wg.Add(1)
	go m.sweeper()
	if cfg.Role == RoleDecode {
		m.wg.Add(1)
		go m.notifier()
	}
	return m, nil
}

// Memory returns the KV regions and aux memory the Manager allocated (for
// layouts given without addresses).
func (m *Manager) Memory() (kv [][]byte, aux []byte) { return m.kvMem, m.auxMem }

// StateMemory returns the state regions the Manager allocated.
func (m *Manager) StateMemory() [][]byte { return m.stateMem }

// Registry returns the rank's room registry (read-only use).
func (m *Manager) Registry() *Registry { return m.reg }

// Endpoint returns the rank's control endpoint.
func (m *Manager) Endpoint() string { return m.loop.Endpoint() }

// Agent returns the rank's nixl agent.
func (m *Manager) Agent() *nixl.Agent { return m.agent }

// Config returns the configuration in use.
func (m *Manager) Config() Config { return m.cfg }

func (m *Manager) send(to bootstrap.Peer, msg bootstrap.Message) {
	if err := m.loop.Send(to, msg); err != nil && !errors.Is(err, bootstrap.ErrClosed) {
		m.log.Warn("control message not sent", zap.Stringer("type", msg.Type()), zap.String("peer", to.Endpoint), zap.Error(err))
	}
}

func (m *Manager) statusFailed(to bootstrap.Peer, room uint64, reason string) {
	m.met.statusSent.Inc()
	m.send(to, &bootstrap.Status{Room: room, Status: bootstrap.StatusFailed, Reason: reason})
}

// handle runs on the control loop's receive goroutine; it never blocks for
// long (sends are non-blocking hand-offs).
func (m *Manager) handle(msg bootstrap.Message) {
	switch msg := msg.(type) {
	case *bootstrap.Register:
		m.onRegister(msg)
	case *bootstrap.Request:
		m.onRequest(msg)
	case *bootstrap.Abort:
		m.onAbort(msg)
	case *bootstrap.RegisterAck:
		m.onRegisterAck(msg)
	case *bootstrap.Status:
		m.onStatus(msg)
	case *bootstrap.AbortAck:
		m.onAbortAck(msg)
	}
}

// ---- prefill side ------------------------------------------------------

func layoutFrom(kv, aux, state []bootstrap.Region) (transfer.Layout, error) {
	l := transfer.Layout{Kind: nixl.DRAM}
	for i, r := range kv {
		if r.Mem == bootstrap.MemVRAM {
			l.Kind = nixl.VRAM
		}
		if i == 0 {
			l.PageBytes = r.ItemLen
		}
		l.Regions = append(l.Regions, nixl.Desc{Addr: uintptr(r.Addr), Len: r.Len, Dev: uint64(r.Dev)})
	}
	if len(aux) > 0 {
		l.Aux = nixl.Desc{Addr: uintptr(aux[0].Addr), Len: aux[0].Len, Dev: uint64(aux[0].Dev)}
		l.AuxItemBytes = aux[0].ItemLen
	}
	for _, r := range state {
		l.State = append(l.State, transfer.StateRegion{Desc: nixl.Desc{Addr: uintptr(r.Addr), Len: r.Len, Dev: uint64(r.Dev)}, ItemBytes: r.ItemLen})
	}
	return l, l.Validate()
}

func (m *Manager) onRegister(msg *bootstrap.Register) {
	to := bootstrap.Peer{Endpoint: msg.From.Endpoint}
	refuse := func(reason string) {
		m.log.Warn("registration refused", zap.String("peer", msg.From.Peer()), zap.String("reason", reason))
		m.send(to, &bootstrap.RegisterAck{OK: false, Reason: reason})
	}
	if m.cfg.Role != RolePrefill {
		refuse("this rank is a decode rank")
		return
	}
	if msg.Compat != m.cfg.Compat {
		refuse(fmt.Sprintf("compat mismatch: prefill %q, decode %q", m.cfg.Compat, msg.Compat))
		return
	}
	lay, err := layoutFrom(msg.KV, msg.Aux, msg.State)
	if err != nil {
		refuse("layout: " + err.Error())
		return
	}
	local := m.cfg.Layout
	stateOK := len(lay.State) == len(local.State)
	for i := 0; stateOK && i < len(lay.State); i++ {
		stateOK = lay.State[i].ItemBytes == local.State[i].ItemBytes
	}
	if !stateOK {
		refuse(fmt.Sprintf("state layout mismatch: prefill %d state regions, decode %d (or item sizes differ)", len(local.State), len(lay.State)))
		return
	}
	if len(lay.Regions) != len(local.Regions) || lay.PageBytes != local.PageBytes || lay.AuxItemBytes != local.AuxItemBytes {
		refuse(fmt.Sprintf("layout mismatch: prefill %d regions × %d-byte pages (aux %d), decode %d × %d (aux %d)",
			len(local.Regions), local.PageBytes, local.AuxItemBytes, len(lay.Regions), lay.PageBytes, lay.AuxItemBytes))
		return
	}
	name, err := m.agent.LoadRemote(msg.AgentMD)
	if err != nil {
		refuse("agent metadata: " + err.Error())
		return
	}
	key := msg.From.Peer()
	m.mu.Lock()
	if old, ok := m.peers[key]; ok && old.from.Epoch != msg.From.Epoch {
		m.failPeerRoomsLocked(key, "peer restarted: "+key)
	}
	m.peers[key] = &decodePeer{from: msg.From, remote: name, layout: lay}
	m.mu.Unlock()
	m.send(to, &bootstrap.RegisterAck{OK: true})
}

func (m *Manager) onRequest(msg *bootstrap.Request) {
	to := bootstrap.Peer{Endpoint: msg.From.Endpoint}
	key := msg.From.Peer()
	m.mu.Lock()
	p, ok := m.peers[key]
	m.mu.Unlock()
	if !ok || p.from.Epoch != msg.From.Epoch {
		m.statusFailed(to, msg.Room, fmt.Sprintf("room %d: %s has not registered (send REGISTER first)", msg.Room, key))
		return
	}
	pages := uint32(p.layout.Pages())
	for i, pg := range msg.DstPages {
		if pg >= pages {
			m.statusFailed(to, msg.Room, fmt.Sprintf("room %d: dst_pages[%d]=%d outside the %d pages %s registered", msg.Room, i, pg, pages, key))
			return
		}
	}
	if msg.AuxIndex >= p.layout.AuxItems() {
		m.statusFailed(to, msg.Room, fmt.Sprintf("room %d: aux_index %d outside the %d aux items %s registered", msg.Room, msg.AuxIndex, p.layout.AuxItems(), key))
		return
	}
	if len(msg.StateIndices) > len(p.layout.State) {
		m.statusFailed(to, msg.Room, fmt.Sprintf("room %d: %d state index lists for %d state regions", msg.Room, len(msg.StateIndices), len(p.layout.State)))
		return
	}
	for i, list := range msg.StateIndices {
		for _, it := range list {
			if int(it) >= p.layout.State[i].Items() {
				m.statusFailed(to, msg.Room, fmt.Sprintf("room %d: state_indices[%d] item %d outside the %d items %s registered", msg.Room, i, it, p.layout.State[i].Items(), key))
				return
			}
		}
	}
	res := m.reg.Request(msg.Room, PeerRequest{Peer: key, Required: msg.Required, Payload: msg})
	m.met.event(EventRequest, res)
	if res.Outcome == Rejected {
		m.statusFailed(to, msg.Room, res.Err.Error())
		return
	}
	m.trace(msg.Room, TraceRequest)
	m.mu.Lock()
	if m.peerRooms[key] == nil {
		m.peerRooms[key] = map[uint64]struct{}{}
	}
	m.peerRooms[key][msg.Room] = struct{}{}
	m.mu.Unlock()
	_ = m.loop.Watch(to)
}

func (m *Manager) onAbort(msg *bootstrap.Abort) {
	to := bootstrap.Peer{Endpoint: msg.From.Endpoint}
	st, _ := m.reg.Status(msg.Room)
	// Owe the ABORT_ACK before applying the abort: a write finishing right
	// after the abort then finds it and acknowledges.
	m.mu.Lock()
	m.ackTo[msg.Room] = append(m.ackTo[msg.Room], to)
	m.mu.Unlock()
	res := m.reg.Abort(msg.Room, fmt.Sprintf("%s by %s", msg.Reason, msg.From.Peer()))
	m.met.event(EventAbort, res)
	m.met.abort(st)
	if res.Status != Failed || res.Drained {
		// Tombstoned (no sender yet), drained, cleared or succeeded:
		// nothing is or will be in flight for this room.
		m.drained(msg.Room, true)
	} // else the last write in flight acknowledges (or the stall deadline)
	if res.Outcome == Applied {
		m.notifyFailed(msg.Room, res.Peers, "aborted by "+msg.From.Peer(), msg.From.Peer())
	}
	for _, pr := range res.Peers { // pending requests dropped by an early abort
		if res.Outcome == Tombstoned && pr.Peer != msg.From.Peer() {
			m.statusFailedTo(pr, msg.Room, "room aborted before its sender existed")
		}
	}
}

// notifyFailed pushes STATUS failed to the room's decode peers (except
// skip, the peer that caused it).
func (m *Manager) notifyFailed(room uint64, peers []PeerRequest, reason, skip string) {
	for _, pr := range peers {
		if pr.Peer != skip {
			m.statusFailedTo(pr, room, reason)
		}
	}
}

func (m *Manager) statusFailedTo(pr PeerRequest, room uint64, reason string) {
	if req, ok := pr.Payload.(*bootstrap.Request); ok {
		m.statusFailed(bootstrap.Peer{Endpoint: req.From.Endpoint}, room, reason)
	}
}

// drained sends the ABORT_ACKs owed for a room that has no write in flight.
func (m *Manager) drained(room uint64, ok bool) {
	m.mu.Lock()
	to := m.ackTo[room]
	delete(m.ackTo, room)
	m.mu.Unlock()
	for _, p := range to {
		m.send(p, &bootstrap.AbortAck{Room: room, Drained: ok})
	}
}

// failPeerRoomsLocked fails every room a (dead or restarted) decode peer
// shares with this rank.
func (m *Manager) failPeerRoomsLocked(key, reason string) {
	rooms := m.peerRooms[key]
	delete(m.peerRooms, key)
	delete(m.peers, key)
	for room := range rooms {
		res := m.reg.Update(room, Failed, reason)
		m.met.event(EventUpdate, res)
		if res.Outcome == Applied {
			m.notifyFailed(room, res.Peers, reason, key) // non-blocking sends
		}
	}
}

// CreateSender creates the prefill side of a room (see package sender).
func (m *Manager) CreateSender(room uint64) Result {
	res := m.reg.Create(room, RolePrefill)
	m.met.event(EventCreate, res)
	if res.Outcome == Applied {
		m.mu.Lock()
		m.sends[room] = &sendState{started: time.Now()}
		m.mu.Unlock()
	}
	if res.Outcome == Applied && len(res.Peers) > 0 {
		m.notifyFailed(room, res.Peers, "room created on a decode rank", "")
	}
	return res
}

// InitSender marks the sender initialised.
func (m *Manager) InitSender(room uint64) Result {
	res := m.reg.Init(room)
	m.met.event(EventInit, res)
	return res
}

// SendChunk queues a chunk of the room's pages (positions continue where
// the previous chunk ended). On the last chunk the state items (state[i]:
// this rank's items of state region i, paired with the decode rank's
// state_indices[i]) and then the aux item at auxIndex (−1 for none) follow.
// The room must be WaitingForInput or Transferring.
func (m *Manager) SendChunk(room uint64, pages []uint32, last bool, auxIndex int, state [][]uint32) error {
	st, known := m.reg.Status(room)
	switch {
	case !known:
		return fmt.Errorf("room %d: %w", room, ErrUnknownRoom)
	case st == Failed:
		reason, _ := m.reg.Failure(room)
		return fmt.Errorf("room %d: %w: %s", room, ErrRoomFailed, reason)
	case st < WaitingForInput || st == Success:
		return fmt.Errorf("room %d: send in %v: %w", room, st, ErrNotReady)
	}
	reqs := m.reg.Requests(room)
	m.mu.Lock()
	ss := m.sends[room]
	if ss == nil {
		m.mu.Unlock()
		return fmt.Errorf("room %d: %w", room, ErrUnknownRoom)
	}
	first, chunk := ss.sent, ss.chunk
	ss.sent += len(pages)
	ss.chunk++
	var writes []transfer.Write
	total := 0
	if last {
		total = chunk + 1
	}
	uid := m.cfg.Rank
	for _, pr := range reqs {
		req := pr.Payload.(*bootstrap.Request)
		p := m.peers[pr.Peer]
		if p == nil {
			m.mu.Unlock()
			m.failRoom(room, "peer "+pr.Peer+" is gone")
			return fmt.Errorf("room %d: peer %s: %w", room, pr.Peer, ErrNotRegistered)
		}
		var src, dst []uint32
		if !req.Dummy {
			for i, pg := range pages {
				pos := first + i - req.Prefix
				if pos < 0 {
					continue // decode already holds this prefix page
				}
				if pos >= len(req.DstPages) {
					m.mu.Unlock()
					reason := fmt.Sprintf("%s gave %d destination pages, prefill sent more", pr.Peer, len(req.DstPages))
					m.failRoom(room, reason)
					return fmt.Errorf("room %d: %s", room, reason)
				}
				src, dst = append(src, pg), append(dst, req.DstPages[pos])
			}
		}
		writes = append(writes, transfer.Write{Remote: p.remote, Peer: p.layout, Runs: transfer.Runs(src, dst), AuxSrc: -1, State: -1,
			Notif: fmt.Sprintf("kvb1:%d:%d:%d:%d", room, uid, chunk, total), Last: last})
		if last {
			for i, dstItems := range req.StateIndices {
				if req.Dummy || len(dstItems) == 0 {
					continue
				}
				if i >= len(state) || len(state[i]) != len(dstItems) {
					m.mu.Unlock()
					reason := fmt.Sprintf("%s wants %d items of state region %d, prefill gave %d", pr.Peer, len(dstItems), i, len(stateAt(state, i)))
					m.failRoom(room, reason)
					return fmt.Errorf("room %d: %s", room, reason)
				}
				writes = append(writes, transfer.Write{Remote: p.remote, Peer: p.layout, Runs: transfer.Runs(state[i], dstItems),
					AuxSrc: -1, State: i})
			}
			aux := transfer.Write{Remote: p.remote, Peer: p.layout, AuxSrc: -1, State: -1, Notif: fmt.Sprintf("kvb1:%d:%d:aux", room, uid), Last: true}
			if auxIndex >= 0 && req.AuxIndex >= 0 && !req.Dummy {
				aux.AuxSrc, aux.AuxDst = auxIndex, req.AuxIndex
			}
			writes = append(writes, aux)
		}
	}
	m.mu.Unlock()
	// The worker posts these in order, one at a time: only the room's very
	// final write may complete it (the registry succeeds a room when its
	// last write is done and nothing is in flight).
	for i := range writes {
		writes[i].Last = last && i == len(writes)-1
	}
	job := transfer.Job{Room: room, Writes: writes,
		Gate: func(w *transfer.Write) bool {
			res := m.reg.Posted(room)
			m.met.event(EventPosted, res)
			if res.Outcome == Applied && first == 0 && w == &writes[0] {
				m.trace(room, TraceFirstPost)
			}
			return res.Outcome == Applied
		},
		Done: func(w *transfer.Write, err error) {
			m.writeDone(room, w, err)
		},
	}
	if err := m.pool.Submit(job); err != nil {
		return fmt.Errorf("room %d: %w", room, err)
	}
	return nil
}

func (m *Manager) writeDone(room uint64, w *transfer.Write, err error) {
	if err == nil {
		m.met.transfers.Inc()
		m.met.bytes.Add(float64(writeBytes(w, m.cfg.Layout)))
	}
	res := m.reg.WriteDone(room, w.Last, err)
	m.met.event(EventWriteDone, res)
	if res.Outcome == IgnoredCleared {
		// The room was cleared with this write in flight: the ABORT_ACK it
		// may owe goes out once its last write is done.
		m.mu.Lock()
		n, ok := m.draining[room]
		if ok {
			n--
			m.draining[room] = n
			if n <= 0 {
				delete(m.draining, room)
			}
		}
		m.mu.Unlock()
		if ok && n <= 0 {
			m.drained(room, true)
		}
		return
	}
	if res.Status == Success && res.Outcome == Applied {
		m.mu.Lock()
		if ss := m.sends[room]; ss != nil {
			m.met.latency.Observe(time.Since(ss.started).Seconds())
		}
		m.mu.Unlock()
	}
	if res.Drained {
		m.drained(room, true)
		if err != nil && res.Outcome == Applied {
			m.notifyFailed(room, res.Peers, fmt.Sprintf("write to %s failed: %v", w.Remote, err), "")
		}
	}
}

func stateAt(state [][]uint32, i int) []uint32 {
	if i < len(state) {
		return state[i]
	}
	return nil
}

func writeBytes(w *transfer.Write, l transfer.Layout) uint64 {
	if w.AuxSrc >= 0 {
		return l.AuxItemBytes
	}
	if w.State >= 0 {
		var n uint64
		for _, r := range w.Runs {
			n += uint64(r.Len) * l.State[w.State].ItemBytes
		}
		return n
	}
	var n uint64
	for _, r := range w.Runs {
		n += uint64(r.Len) * l.PageBytes * uint64(len(l.Regions))
	}
	return n
}

// failRoom fails a room on this rank and tells its peers.
func (m *Manager) failRoom(room uint64, reason string) {
	res := m.reg.Update(room, Failed, reason)
	m.met.event(EventUpdate, res)
	if res.Outcome == Applied {
		m.notifyFailed(room, res.Peers, reason, "")
		if m.cfg.Role == RoleDecode {
			m.abortPrefill(room, reason)
		}
	}
}

// AbortRoom aborts a room from this side.
func (m *Manager) AbortRoom(room uint64, reason string) Result {
	st, _ := m.reg.Status(room)
	res := m.reg.Abort(room, reason)
	m.met.event(EventAbort, res)
	m.met.abort(st)
	if res.Outcome == Applied && m.cfg.Role == RolePrefill {
		m.notifyFailed(room, res.Peers, "aborted by prefill: "+reason, "")
	}
	// Decode tells the prefill rank only when the abort changed something:
	// after Success there is nothing to stop.
	if m.cfg.Role == RoleDecode && (res.Outcome == Applied || res.Outcome == Tombstoned) {
		m.abortPrefill(room, reason)
	}
	return res
}

// ClearRoom forgets a room (after Success or Failed).
func (m *Manager) ClearRoom(room uint64) Result {
	inflight := m.reg.InFlight(room)
	if inflight > 0 {
		m.mu.Lock()
		m.draining[room] = inflight
		m.mu.Unlock()
	}
	res := m.reg.Clear(room)
	m.met.event(EventClear, res)
	m.mu.Lock()
	delete(m.sends, room)
	if rs := m.recvs[room]; rs != nil {
		delete(m.recvs, room)
		rs.release()
	}
	for _, rooms := range m.peerRooms {
		delete(rooms, room)
	}
	m.mu.Unlock()
	if res.Outcome == Applied && res.Status.Terminal() == false && len(res.Peers) > 0 {
		m.notifyFailed(room, res.Peers, "room cleared before it finished", "")
	}
	return res
}

// ---- decode side -------------------------------------------------------

func regionsOf(l transfer.Layout) (kv, aux, state []bootstrap.Region) {
	mem := bootstrap.MemDRAM
	if l.Kind == nixl.VRAM {
		mem = bootstrap.MemVRAM
	}
	for _, r := range l.Regions {
		kv = append(kv, bootstrap.Region{Addr: uint64(r.Addr), Len: r.Len, ItemLen: l.PageBytes, Dev: int(r.Dev), Mem: mem})
	}
	if l.Aux.Len > 0 {
		aux = append(aux, bootstrap.Region{Addr: uint64(l.Aux.Addr), Len: l.Aux.Len, ItemLen: l.AuxItemBytes, Mem: bootstrap.MemDRAM})
	}
	state = []bootstrap.Region{}
	for _, st := range l.State {
		state = append(state, bootstrap.Region{Addr: uint64(st.Addr), Len: st.Len, ItemLen: st.ItemBytes, Mem: bootstrap.MemDRAM})
	}
	return kv, aux, state
}

// prefillPeerFor resolves and registers with the configured prefill rank
// (once; later callers wait for the same registration).
func (m *Manager) prefillPeerFor(ctx context.Context) (*prefillPeer, error) {
	// The rank table is read once per prefill rank: afterwards only a dead
	// or restarted peer (which drops the cache) sends us back to it.
	m.mu.Lock()
	info, cached := m.resolved, m.resolved.Endpoint != ""
	m.mu.Unlock()
	if !cached {
		var err error
		if info, err = m.boot.Rank(ctx, 0, m.cfg.PrefillRank, 0); err != nil {
			return nil, fmt.Errorf("resolving prefill rank %d: %w", m.cfg.PrefillRank, err)
		}
		m.mu.Lock()
		m.resolved = info
		m.mu.Unlock()
	}
	m.mu.Lock()
	pp := m.prefills[info.Endpoint]
	fresh := pp == nil
	if fresh {
		pp = &prefillPeer{endpoint: info.Endpoint, key: info.PublicKey, done: make(chan struct{})}
		m.prefills[info.Endpoint] = pp
	}
	m.mu.Unlock()
	if fresh {
		md, err := m.agent.Metadata()
		if err != nil {
			return nil, err
		}
		kv, aux, state := regionsOf(m.cfg.Layout)
		m.send(bootstrap.Peer{Endpoint: pp.endpoint, ServerKey: pp.key}, &bootstrap.Register{Compat: m.cfg.Compat,
			Agent: m.cfg.Engine.Name, AgentMD: md, TPSize: 1, KV: kv, Aux: aux, State: state})
	}
	select {
	case <-pp.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for REGISTER_ACK from %s: %w", pp.endpoint, ctx.Err())
	case <-m.closing:
		return nil, ErrManagerClosed
	}
	if pp.err != nil {
		return nil, pp.err
	}
	return pp, nil
}

func (m *Manager) onRegisterAck(msg *bootstrap.RegisterAck) {
	m.mu.Lock()
	pp := m.prefills[msg.From.Endpoint]
	m.mu.Unlock()
	if pp == nil {
		return
	}
	select {
	case <-pp.done:
		return
	default:
	}
	pp.from = msg.From
	if !msg.OK {
		pp.err = fmt.Errorf("%w: prefill %s: %s", ErrIncompatible, msg.From.Peer(), msg.Reason)
		m.mu.Lock()
		delete(m.prefills, msg.From.Endpoint) // a later attempt registers again
		m.resolved = bootstrap.RankInfo{}
		m.mu.Unlock()
	}
	close(pp.done)
}

// CreateReceiver creates the decode side of a room (see package receiver).
func (m *Manager) CreateReceiver(room uint64) Result {
	res := m.reg.Create(room, RoleDecode)
	m.met.event(EventCreate, res)
	return res
}

// RequestSpec is what a decode rank asks of the prefill rank for a room.
type RequestSpec struct {
	DstPages []uint32 // destination pages for positions Prefix.. of the request
	AuxIndex int      // −1 for none
	// StateIndices[i] are the items of state region i the state goes to.
	StateIndices [][]uint32
	Required     int // decode ranks' requests the prefill rank waits for (default 1)
	Prefix       int // leading pages decode already holds
	Dummy        bool
}

// SendRequest registers with the prefill rank if needed and sends the
// room's REQUEST; the room then waits for data.
func (m *Manager) SendRequest(ctx context.Context, room uint64, spec RequestSpec) error {
	if spec.Required == 0 {
		spec.Required = 1
	}
	pp, err := m.prefillPeerFor(ctx)
	if err != nil {
		m.failRoom(room, err.Error())
		return fmt.Errorf("room %d: %w", room, err)
	}
	rs := &recvState{peer: pp, chunks: map[int]bool{}, released: make(chan struct{}), started: time.Now()}
	m.mu.Lock()
	if st, known := m.reg.Status(room); !known || st.Terminal() {
		m.mu.Unlock()
		return fmt.Errorf("room %d: request in %v: %w", room, st, ErrNotReady)
	}
	m.recvs[room] = rs
	m.mu.Unlock()
	res := m.reg.Init(room)
	m.met.event(EventInit, res)
	if res.Outcome != Applied {
		return fmt.Errorf("room %d: %v (%v)", room, res.Outcome, res.Err)
	}
	to := bootstrap.Peer{Endpoint: pp.endpoint, ServerKey: pp.key}
	stateIdx := spec.StateIndices
	if stateIdx == nil {
		stateIdx = [][]uint32{}
	}
	m.send(to, &bootstrap.Request{Room: room, DstPages: spec.DstPages, AuxIndex: spec.AuxIndex,
		StateIndices: stateIdx, Required: spec.Required, Prefix: spec.Prefix, Dummy: spec.Dummy})
	_ = m.loop.Watch(to)
	return nil
}

func (m *Manager) abortPrefill(room uint64, reason string) {
	m.mu.Lock()
	rs := m.recvs[room]
	if rs != nil {
		rs.aborted = true
	}
	m.mu.Unlock()
	if rs != nil {
		m.send(bootstrap.Peer{Endpoint: rs.peer.endpoint, ServerKey: rs.peer.key}, &bootstrap.Abort{Room: room, Reason: reason})
	}
}

func (m *Manager) onStatus(msg *bootstrap.Status) {
	if msg.Status != bootstrap.StatusFailed {
		return
	}
	res := m.reg.Update(msg.Room, Failed, fmt.Sprintf("prefill %s: %s", msg.From.Peer(), msg.Reason))
	m.met.event(EventUpdate, res)
	if res.Outcome == Applied {
		// Ask for the ABORT_ACK: it tells when no write for the room is in
		// flight any more, so the destination pages can be reused.
		m.abortPrefill(msg.Room, "acknowledging: "+msg.Reason)
	}
}

func (m *Manager) onAbortAck(msg *bootstrap.AbortAck) {
	m.mu.Lock()
	rs := m.recvs[msg.Room]
	m.mu.Unlock()
	if rs != nil {
		rs.release()
	}
}

// release ends the room's quarantine; several goroutines may race to it.
func (rs *recvState) release() { rs.once.Do(func() { close(rs.released) }) }

// Released returns a channel closed once an aborted room's pages may be
// reused: the prefill rank acknowledged that nothing is in flight (or the
// room ended another way). Nil for rooms this rank does not receive.
func (m *Manager) Released(room uint64) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rs := m.recvs[room]; rs != nil {
		return rs.released
	}
	return nil
}

// notifier drains the agent's notifications and counts them per room. It
// blocks on the engine's wake-up channel where there is one, else polls
// with a backoff of up to 1 ms.
func (m *Manager) notifier() {
	defer m.wg.Done()
	wake := m.agent.NotifyC()
	idle := time.Duration(0)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ns, err := m.agent.Notifs()
		if err == nil && len(ns) > 0 {
			idle = 0
			for _, n := range ns {
				m.onNotif(string(n.Msg))
			}
			continue
		}
		idle = min(max(2*idle, 10*time.Microsecond), time.Millisecond)
		if wake != nil {
			idle = 100 * time.Millisecond // a safety net only
		}
		timer.Reset(idle)
		select {
		case <-m.closing:
			return
		case <-wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// onNotif handles "kvb1:<room>:<uid>:<chunk>:<total>" and "kvb1:<room>:<uid>:aux".
func (m *Manager) onNotif(s string) {
	f := strings.Split(s, ":")
	if len(f) < 4 || f[0] != "kvb1" {
		m.log.Warn("unknown notification", zap.String("notif", s))
		return
	}
	room, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return
	}
	m.mu.Lock()
	rs := m.recvs[room]
	if rs == nil {
		m.mu.Unlock()
		return // cleared or never ours: late data is ignored
	}
	switch {
	case len(f) == 4 && f[3] == "aux":
		rs.aux = true
	case len(f) == 5:
		chunk, err1 := strconv.Atoi(f[3])
		total, err2 := strconv.Atoi(f[4])
		if err1 != nil || err2 != nil {
			m.mu.Unlock()
			return
		}
		rs.chunks[chunk] = true
		if total > 0 {
			rs.total = total
		}
	}
	complete := rs.aux && rs.total > 0 && len(rs.chunks) >= rs.total
	started := rs.started
	m.mu.Unlock()
	res := m.reg.Progress(room)
	m.met.event(EventProgress, res)
	if complete {
		m.trace(room, TraceLastNotif)
		res = m.reg.Update(room, Success, "")
		m.met.event(EventUpdate, res)
		if res.Outcome == Applied {
			m.trace(room, TraceSuccess)
			m.met.latency.Observe(time.Since(started).Seconds())
			rs.release()
		}
	}
}

// ---- both sides --------------------------------------------------------

func (m *Manager) trace(room uint64, ev TraceEvent) {
	if m.cfg.Trace != nil {
		m.cfg.Trace(room, ev, time.Now())
	}
}

func (m *Manager) peerDown(p bootstrap.PeerDown) {
	reason := fmt.Sprintf("%s: %s", p.Reason, p.Endpoint)
	m.log.Warn("peer down", zap.String("endpoint", p.Endpoint), zap.String("reason", p.Reason))
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.Role == RolePrefill {
		for key, pe := range m.peers {
			if pe.from.Endpoint == p.Endpoint {
				m.failPeerRoomsLocked(key, reason)
			}
		}
		return
	}
	delete(m.prefills, p.Endpoint) // register again with its successor
	if m.resolved.Endpoint == p.Endpoint {
		m.resolved = bootstrap.RankInfo{} // and look it up again
	}
	for room, rs := range m.recvs {
		if rs.peer.endpoint == p.Endpoint {
			res := m.reg.Update(room, Failed, "prefill "+reason)
			m.met.event(EventUpdate, res)
			rs.release() // a dead peer writes nothing more
		}
	}
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
			m.sweep(m.cfg.Registry.Now())
		}
	}
}

func (m *Manager) sweep(now time.Time) {
	for _, e := range m.reg.Sweep(now) {
		m.met.deadline(e.Deadline)
		if m.cfg.Role == RolePrefill {
			m.notifyFailed(e.Room, e.Peers, e.Reason, "")
			if e.Drained || e.Deadline == DeadlineStall {
				m.drained(e.Room, e.Drained)
			}
			continue
		}
		m.abortPrefill(e.Room, e.Reason)
		m.mu.Lock()
		if rs := m.recvs[e.Room]; rs != nil && e.Deadline == DeadlineStall {
			rs.release() // quarantine ends at the stall deadline
		}
		m.mu.Unlock()
	}
	m.met.overdue.Set(float64(m.reg.Overdue(now)))
}

// Close fails every live room (telling peers), stops the transfer pool,
// the control loop and the agent, and waits for its goroutines.
func (m *Manager) Close() error {
	var err error
	m.closeOnce.Do(func() {
		for room := range m.liveRooms() {
			m.failRoom(room, "manager closed")
		}
		close(m.closing)
		m.wg.Wait()
		if m.pool != nil {
			m.pool.Close()
		}
		m.reg.Close()
		err = errors.Join(m.loop.Close(), m.agent.Close())
		if m.cfg.Registerer != nil {
			m.cfg.Registerer.Unregister(m.met)
		}
	})
	return err
}

func (m *Manager) liveRooms() map[uint64]struct{} {
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	out := map[uint64]struct{}{}
	for id, rm := range m.reg.rooms {
		if !rm.status.Terminal() {
			out[id] = struct{}{}
		}
	}
	return out
}
