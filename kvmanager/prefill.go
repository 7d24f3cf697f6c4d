package kvmanager

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/pool"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"go.uber.org/zap"
)

// Prefill is the shell of a prefill rank: it serves decode ranks of any
// instance (keyed by their identity, bound to their epoch) and writes
// rooms' pages through its transfer pool. Package sender's handles take a
// *Prefill, so a sender cannot be made on a decode rank.
type Prefill struct {
	*Manager
}

// NewPrefill starts a prefill rank: it opens the agent and registers the
// layout, binds the control endpoint, starts the transfer pool and
// registers the rank with the bootstrap server (when BootstrapURL is set).
func NewPrefill(cfg Config) (*Prefill, error) {
	cfg.Role = RolePrefill
	m, err := newManager(cfg)
	if err != nil {
		return nil, err
	}
	p := &Prefill{m}
	if m.pool, err = pool.NewPool(m.agent, m.cfg.Layout, pool.Config{Workers: m.cfg.Workers, InFlight: m.cfg.InFlight, Stall: m.cfg.Registry.StallTimeout}); err != nil {
		m.Close()
		return nil, err
	}
	m.registersReady.Store(true) // REGISTERs are handled from here on (the pool exists)
	kick := make(chan struct{}, 1)
	var until atomic.Int64
	listen := func(d time.Duration) {
		end := time.Now().Add(d).UnixNano()
		for {
			cur := until.Load()
			if cur >= end || until.CompareAndSwap(cur, end) {
				break
			}
		}
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	m.listen.Store(&listen)
	m.wg.Add(1)
	go p.notifier(kick, &until)
	if m.cfg.BootstrapURL != "" {
		if err := m.registerRank(); err != nil {
			m.Close()
			return nil, err
		}
	}
	m.start()
	return p, nil
}

// notifier reads the agent's notifications: a decode rank that pulls
// sends the agent its offer names a challenge (core.Challenged), which
// this rank echoes in its next REGISTER_ACK, before it reads through the
// offer; anything else is dropped, counted
// (kvbridge_challenges_ignored_total). It blocks on the engine's wake-up
// channel where there is one (no timer: an idle rank costs no CPU).
// Otherwise (libnixl) it polls with a back-off of up to 1 ms only while a
// listen window is open — the core opens one with each REGISTER_ACK that
// carries the offer (EffectKeepProgress) — and waits for the next one
// otherwise.
func (p *Prefill) notifier(kick <-chan struct{}, until *atomic.Int64) {
	defer p.wg.Done()
	wake := p.agent.NotifyC()
	idle := time.Duration(0)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ns, err := p.agent.Notifs()
		if err == nil && len(ns) > 0 {
			idle = 0
			for _, n := range ns {
				x, _ := core.ParseChallenge(string(n.Msg)) // (anything else: a zero challenge, ignored and counted)
				p.stepIn(x)
			}
			continue
		}
		if wake != nil {
			select {
			case <-p.closing:
				return
			case <-wake:
			}
			continue
		}
		left := time.Until(time.Unix(0, until.Load()))
		if left <= 0 {
			select {
			case <-p.closing:
				return
			case <-kick:
				idle = 0
			}
			continue
		}
		idle = min(max(2*idle, 10*time.Microsecond), time.Millisecond, left)
		timer.Reset(idle)
		select {
		case <-p.closing:
			return
		case <-timer.C:
		}
	}
}

// registerAttempt bounds one attempt of the rank's first registration: a
// server that does not answer is named in the log within it (then every
// registerWarnEvery), not only when BootstrapTimeout ends.
const (
	registerAttempt   = 2 * time.Second
	registerWarnEvery = 30 * time.Second
)

// firstRegistration puts the rank's record, in attempts of registerAttempt
// and then twice as long each (each retrying inside, with back-off), until
// Registry.BootstrapTimeout:
// a server that refuses connections or does not answer is logged after
// the first attempt, with the error behind it, and retried. An answer
// that is final (a 4xx: refused token, bad record) ends it at once.
func (m *Manager) firstRegistration(cl discovery.Discovery, rec records.RankRecord) (time.Duration, error) {
	deadline := time.Now().Add(m.cfg.Registry.BootstrapTimeout)
	var warned time.Time
	for attempt := registerAttempt; ; attempt = min(2*attempt, registerWarnEvery) {
		end := time.Now().Add(attempt) // (longer each time: a slow server gets its time)
		if end.After(deadline) {
			end = deadline
		}
		ctx, cancel := context.WithDeadline(m.ctx, end)
		ttl, err := cl.RegisterRank(ctx, rec)
		cancel()
		var he *discovery.HTTPError
		switch {
		case err == nil:
			return ttl, nil
		case m.ctx.Err() != nil, !time.Now().Before(deadline), errors.As(err, &he) && he.Code < 500:
			return 0, err
		}
		if time.Since(warned) >= registerWarnEvery {
			warned = time.Now()
			m.log.Warn("the bootstrap server does not answer; retrying until the bootstrap timeout",
				zap.String("bootstrap", m.cfg.BootstrapURL), zap.Duration("bootstrap_timeout", m.cfg.Registry.BootstrapTimeout), zap.Error(err))
		}
	}
}

// registerRank puts the rank's record on the bootstrap server, keeps its
// lease renewed at a third of the server's TTL, and deletes it at Close.
func (m *Manager) registerRank() error {
	cl, err := discovery.Dial(m.cfg.BootstrapURL, m.dialOptions())
	if err != nil {
		return fmt.Errorf("kvmanager: %w", err)
	}
	par := m.cfg.Parallel
	rec := records.RankRecord{Instance: m.cfg.Instance, DPRank: par.DPRank, DPSize: par.DPSize, TPRank: par.TPRank,
		TPSize: par.TPSize, PPRank: par.PPRank, PPSize: par.PPSize, Endpoint: m.loop.Endpoint(), PageSize: m.cfg.PageTokens,
		DType: m.cfg.DType, Compat: m.cfg.Compat, PublicKey: m.loop.PublicKey(), Epoch: m.loop.Identity().Epoch,
		Cert:       base64.StdEncoding.EncodeToString(m.loop.Cert()),
		ModelFacts: modelFacts(m.cfg.Model)}
	ttl, err := m.firstRegistration(cl, rec)
	if err != nil {
		cl.Close()
		return fmt.Errorf("kvmanager: rank %s registering with the bootstrap server %s: %w", rec.Endpoint, m.cfg.BootstrapURL, err)
	}
	period := ttl / 3
	if period <= 0 {
		period = 5 * time.Second
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-m.ctx.Done():
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(m.ctx, period)
				if _, err := cl.RegisterRank(ctx, rec); err != nil && m.ctx.Err() == nil {
					m.log.Warn("renewing the bootstrap record", zap.String("bootstrap", m.cfg.BootstrapURL), zap.Error(err))
				}
				cancel()
			}
		}
	}()
	m.boot = cl
	m.deregister = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := cl.DeregisterRank(ctx, rec.DPRank, rec.TPRank, rec.PPRank, rec.Endpoint); err != nil {
			m.log.Warn("deleting the bootstrap record", zap.String("bootstrap", m.cfg.BootstrapURL), zap.Error(err))
		}
		cl.Close()
	}
	return nil
}

// onRegister steps a REGISTER into the core: its epoch check and
// CheckRegister run there, and a REGISTER that passes comes back as
// EffectLoadMetadata (loadMetadata), carried out after the step.
func (m *Manager) onRegister(msg *wire.Register) {
	m.receive(msg)
}

// loadMetadata carries out EffectLoadMetadata: it checks the REGISTER's
// claims, then checks and binds it on a goroutine of its own (proof.go):
// loading the peer's agent metadata and reading its ownership proofs back
// are engine I/O, and a peer that never answers must not hold the control
// loop.
func (m *Manager) loadMetadata(msg *wire.Register, lay core.PeerPlan) {
	if !m.registersReady.Load() {
		m.met.deferred.Inc() // NewPrefill has not finished: the sender repeats it
		return
	}
	if err := m.checkClaims(msg); err != nil { // early; again once the rank and name are reserved
		m.refuseRegister(msg, err)
		return
	}
	if !m.beginCheck(msg.From.Peer(), msg.Agent, msg) {
		m.log.Debug("REGISTER put off: stepped again once its rank's check under way ends; behind another rank's check of its agent name, or 16 checks, left for its sender to repeat", zap.String("peer", msg.From.Peer()))
		return
	}
	go m.bindRegister(msg, lay)
}

// challenge carries out EffectChallenge: it checks the REGISTER's claims
// (the blob names the REGISTER's agent, a name not another rank's), then,
// on a goroutine of its own (engine I/O), loads the blob and sends its
// agent the challenge notification — a message, never an access to that
// process's memory. Nothing else goes through that agent until the
// sender echoes the challenge (the core admits the REGISTER that does).
func (m *Manager) challenge(msg *wire.Register, notif string) {
	if !m.registersReady.Load() {
		m.met.deferred.Inc() // NewPrefill has not finished: the sender repeats it
		return
	}
	if err := m.checkClaims(msg); err != nil {
		m.refuseRegister(msg, err)
		return
	}
	if !m.beginCheck(msg.From.Peer(), msg.Agent, nil) {
		// Dropped, for the sender's repeat: most often a repeat while its
		// own challenge is under way, which sends the notification.
		return
	}
	go func() {
		defer m.wg.Done()
		defer func() { m.resume(m.endCheck(msg.From.Peer(), msg.Agent)) }()
		name := msg.Agent
		if h := sha256.Sum256(msg.AgentMD); m.challengedWith(name) != h || !m.agent.RemoteUsable(name) {
			var err error
			if name, err = m.agent.LoadRemote(msg.AgentMD); err != nil {
				m.forgetChallenged(msg.Agent)
				m.refuseRegister(msg, fmt.Errorf("agent metadata: challenging the agent it names: %w", err))
				return
			}
			m.setChallenged(name, h)
		}
		if err := m.agent.GenNotif(name, []byte(notif)); err != nil {
			// Maybe transient: the sender's repeat sends it again.
			m.met.challengeSendFailed.Inc()
			m.log.Warn("agent challenge not sent", zap.String("peer", msg.From.Peer()), zap.String("agent", name), zap.Error(err))
		}
		m.regMu.Lock()
		hook := m.challengeHook
		m.regMu.Unlock()
		if hook != nil {
			hook(msg)
		}
		// An unload the core asked for while this load ran found nothing
		// to drop: drop it here, unless a challenge or a rank holds the
		// name now.
		var held bool
		m.read(func(c *core.Core) { held = c.ChallengeHolds(name) || c.AgentOwner(name) != "" })
		if !held {
			m.forgetChallenged(name)
			_ = m.agent.InvalidateRemote(name)
		}
	}()
}

// challengedWith returns the hash of the blob a challenge loaded under the
// agent name (zero: none).
func (m *Manager) challengedWith(name string) [32]byte {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	return m.challenged[name]
}

func (m *Manager) setChallenged(name string, h [32]byte) {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	if m.challenged == nil {
		m.challenged = map[string][32]byte{}
	}
	m.challenged[name] = h
}

func (m *Manager) forgetChallenged(name string) {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	delete(m.challenged, name)
}

// post hands a chunk's writes to the pool; every write passes the core's
// gate right before it is posted, and reports its completion back.
func (m *Manager) post(e core.Effect) {
	room := e.Room
	job := pool.Job{Room: room, Writes: e.Writes, First: e.First, Seq: e.Seq,
		Gate: func(w *kvlayout.Write) (ok bool) {
			out := m.stepIn(core.Posting{Room: room, Write: w})
			ok = out.OK
			if ok && out.Prior != 0 && out.Prior < core.Transferring { // the room's first post
				m.trace(room, rankhooks.FirstPost)
			}
			return ok
		},
		Live: func() bool {
			var st core.Poll
			m.read(func(c *core.Core) { st, _ = c.Status(room) })
			return st == core.WaitingForInput || st == core.Transferring
		},
		Done: func(w *kvlayout.Write, err error, quiesced bool) {
			if err == nil {
				m.met.transfers.Inc()
				m.met.bytes.Add(float64(w.Bytes(m.cfg.Layout)))
			}
			if out := m.stepIn(core.WriteDone{Room: room, Write: w, Err: err, Quiesced: quiesced}); out.Succeeded {
				m.met.latency.Observe(out.Entered[core.Success].Sub(out.Started).Seconds())
				m.met.observePhases(out.Entered)
			}
		},
	}
	if m.cfg.hooks.Trace != nil {
		job.Taken = func() { m.trace(room, rankhooks.Taken) }
		m.trace(room, rankhooks.Submitted)
	}
	if err := m.pool.Submit(job); err != nil {
		m.stepIn(core.Fail{Room: room, Reason: fmt.Sprintf("room %d: %v", room, err)})
	}
}

func (m *Manager) trace(room uint64, ev rankhooks.Event) {
	if m.cfg.hooks.Trace != nil {
		m.cfg.hooks.Trace(room, ev, time.Now())
	}
}

// CreateSender creates the prefill side of a room (see package sender).
// A room aborted before it starts Failed; a live or recently cleared
// duplicate id is refused, and so is every id once the rank is closed
// (ErrManagerClosed).
func (p *Prefill) CreateSender(room uint64) error { return refusal(p.createSender(room)) }

func (p *Prefill) createSender(room uint64) core.Result {
	res := p.stepIn(core.CreateSender{Room: room}).Result
	par := p.cfg.Parallel
	if res.Outcome == core.Applied && p.cfg.PublishRoomDP && p.boot != nil && par.DPSize > 1 && par.TPRank == 0 && par.PPRank == 0 {
		p.spawn(func() {
			ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Registry.BootstrapTimeout)
			defer cancel()
			if err := p.boot.PublishRoomDP(ctx, room, par.DPRank); err != nil && p.ctx.Err() == nil {
				p.log.Warn("publishing the room's DP group", zap.Uint64("room", room), zap.Error(err))
			}
		})
	}
	return res
}

// InitSender marks the sender initialised.
func (p *Prefill) InitSender(room uint64) error {
	return refusal(p.stepIn(core.InitSender{Room: room}).Result)
}

// SendChunk queues a chunk of the room's pages (positions continue where
// the previous chunk ended). On the last chunk the state items (state[i]:
// this rank's items of state region i, paired with the decode rank's
// state_indices[i]) and then the aux item at auxIndex (−1 for none) follow.
// The room must be WaitingForInput or Transferring.
func (p *Prefill) SendChunk(room uint64, pages []uint32, last bool, auxIndex int, state [][]uint32) (err error) {
	err = p.stepIn(core.SendChunk{Room: room, Pages: pages, Last: last, AuxIndex: auxIndex, State: state}).Err
	return err
}

// SendLayers queues layers [lo, hi) of a chunk of the room's pages: this
// rank's own layers, 0 … Layers()−1. A chunk is sent by calls with
// consecutive ranges from 0 to Layers(), each naming the same pages, last
// and auxIndex (ErrBadChunk otherwise); the state items given with its final
// range and then its aux item
// follow its final range, and the next chunk's pages continue after it.
// Each call is one write per decode rank with one notification, so the
// ranges are the layer groups. ready (nil: the data is in place) is asked
// before each of the call's writes is posted, for example the CUDA event
// recorded after the kernel that wrote the layers (cuEventQuery): the
// pool posts other rooms' writes meanwhile, and fails the room's write,
// unposted, on ready's error or when it has not said true within the
// stall timeout. SendChunk is SendLayers over every layer.
func (p *Prefill) SendLayers(room uint64, pages []uint32, lo, hi int, last bool, auxIndex int, ready transfer.Ready, state [][]uint32) (err error) {
	err = p.stepIn(core.SendChunk{Room: room, Pages: pages, Last: last, AuxIndex: auxIndex, State: state, Layers: kvlayout.Layers{Lo: lo, Hi: hi}, Ready: ready}).Err
	return err
}

// Layers is how many layers this rank holds (its PP stage's): the range
// SendLayers numbers.
func (p *Prefill) Layers() int { return max(len(p.cfg.Layout.Regions)/2, 1) }
