package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/discovery"
	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"go.uber.org/zap"
)

// Decode is the shell of a decode rank: it resolves prefill ranks through
// their bootstrap service, registers with each once (bound to the epoch
// that acknowledged), sends rooms' REQUESTs, counts notifications per
// prefill rank and keeps aborted rooms' pages quarantined until it is safe
// to reuse them. Package receiver's handles take a *Decode, so a receiver
// cannot be made on a prefill rank.
type Decode struct {
	*Manager

	clientsMu sync.Mutex
	clients   map[string]discovery.Discovery // by bootstrap URL (http:// or etcd://)
	// lookups are the topology lookups in progress, by bootstrap URL (the
	// topologies themselves are the core's: Core.Topology); watched the
	// URLs whose rank changes are watched.
	lookups map[string]*topoLookup
	watched map[string]bool
	// roomsKick wakes a notifier that polls (an engine without a wake-up
	// channel) when a room is created: without live rooms it stops polling.
	roomsKick chan struct{}
	// pull is the rank's pull side (Config.Pull; nil without).
	pull *pullState
	// wcheck checks that what a notification names landed (writecheck.go).
	wcheck *writeCheck
	// digestQ holds notifications with digests for the digest workers,
	// started at the first (digest.go).
	digestQ    chan core.Notified
	digestOnce sync.Once
}

// topoLookup is one instance's topology being looked up by the first room
// that needs it (the others wait for its answer).
type topoLookup struct {
	done chan struct{}
	topo records.Topology
	err  error
}

// instance is the prefill instance a room pulls from: its bootstrap
// service and, with DP attention, its DP group.
type instance struct {
	Bootstrap string // "" means Config.BootstrapURL
	DP        int    // the prefill DP group; AutoDP: room % dp_size
}

// DP group choices for CreateReceiverFor's (and receiver.NewFor's) dp: a
// group's index, or one of these.
const (
	AutoDP   = -1 // room % dp_size
	LookupDP = -2 // asked from the bootstrap server, where the prefill rank that took the room published it (Config.PublishRoomDP)
)

// NewDecode starts a decode rank.
func NewDecode(cfg Config) (*Decode, error) {
	cfg.Role = RoleDecode
	m, err := newManager(cfg)
	if err != nil {
		return nil, err
	}
	d := &Decode{Manager: m, clients: map[string]discovery.Discovery{}, lookups: map[string]*topoLookup{}, watched: map[string]bool{}, roomsKick: make(chan struct{}, 1), wcheck: newWriteCheck()}
	m.discoveries = func() (out []discovery.Discovery) {
		d.clientsMu.Lock()
		defer d.clientsMu.Unlock()
		for _, cl := range d.clients {
			out = append(out, cl)
		}
		return out
	}
	m.onClose = append(m.onClose, func() {
		d.clientsMu.Lock()
		defer d.clientsMu.Unlock()
		for _, cl := range d.clients {
			cl.Close()
		}
		d.clients = nil // none dialled after this (client)
	})
	m.resolver = d.resolve
	if cfg.Pull {
		if err := d.startPull(); err != nil {
			m.Close()
			return nil, err
		}
		m.onOffer, m.onReads, m.onChallengeOffer = d.loadOffer, d.queueReads, d.challengeOffer
	}
	m.start()
	m.wg.Add(1)
	go d.notifier()
	return d, nil
}

// defaultTarget is the prefill rank of Config.BootstrapURL and PrefillRank.
func (d *Decode) defaultTarget() core.Target {
	return core.Target{Bootstrap: d.cfg.BootstrapURL, Rank: d.cfg.PrefillRank}
}

// resolve looks a target up in its bootstrap service in the background
// (bounded by the bootstrap timeout) and steps the answer into the core.
func (d *Decode) resolve(t core.Target) {
	d.spawn(func() {
		ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Registry.BootstrapTimeout)
		defer cancel()
		var info records.RankInfo
		cl, err := d.client(t.Bootstrap)
		if err == nil {
			info, err = cl.Rank(ctx, t.DP, t.Rank, t.PP)
		}
		unknown := errors.Is(err, discovery.ErrRankUnknown) // (the core drops the instance's topology)
		if err == nil && d.cfg.identity() != nil {
			err = d.checkRankCert(t, info)
		}
		if err != nil {
			d.stepIn(core.ResolveFailed{Target: t, Err: err, Unknown: unknown})
			return
		}
		d.stepIn(core.Resolved{Target: t, Endpoint: info.Endpoint, ServerKey: info.PublicKey, Cert: info.CertBytes(), Epoch: info.Epoch})
	})
}

// checkRankCert checks, under per-rank identity, that a prefill rank's
// record carries that rank's certificate: a prefill rank's of the
// deployment's CA for the instance and the global rank of the record's
// coordinates. A record rewritten (by a holder of the bootstrap token) with
// another rank's endpoint and certificate would otherwise send this rank to
// that rank, which would serve it as itself: its heads, its layers.
func (d *Decode) checkRankCert(t core.Target, info records.RankInfo) error {
	where := fmt.Sprintf("prefill rank dp=%d tp=%d pp=%d of %s", t.DP, t.Rank, t.PP, t.Bootstrap)
	raw := info.CertBytes()
	if raw == "" {
		return fmt.Errorf("%s: its record carries no identity certificate (per-rank identity is on here): %w", where, ident.ErrBadCert)
	}
	topo, err := d.topology(t.Bootstrap)
	if err != nil {
		return err
	}
	c, err := ident.ParseCert([]byte(raw), d.cfg.identity().CA, time.Now())
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	want := wire.From{Role: wire.RolePrefill, Instance: topo.Instance,
		Rank: transfer.Parallel{TPSize: topo.TPSize, TPRank: t.Rank, PPSize: topo.PPSize, PPRank: t.PP, DPSize: topo.DPSize, DPRank: t.DP}.Global()}
	if (wire.From{Role: c.Role, Instance: c.Instance, Rank: c.Rank}) != want {
		return fmt.Errorf("%s: its record carries the certificate of %s, want %s: %w", where, c, want.Peer(), ident.ErrBadCert)
	}
	return nil
}

// CreateReceiver creates the decode side of a room that receives from the
// given prefill ranks, each writing every page (the default instance when
// none is given: see CreateReceiverFor). Once the rank is closed every
// room is refused (ErrManagerClosed).
func (d *Decode) CreateReceiver(room uint64, targets ...Target) error {
	return refusal(d.createReceiver(room, targets...))
}

func (d *Decode) createReceiver(room uint64, targets ...Target) core.Result {
	if len(targets) == 0 {
		return d.createReceiverFor(room, instance{DP: AutoDP})
	}
	ts := make([]core.Target, len(targets))
	for i, t := range targets {
		ts[i] = core.Target{Bootstrap: t.Bootstrap, Rank: t.Rank, DP: t.DP, PP: t.PP}
	}
	res := d.stepIn(core.CreateReceiver{Room: room, Targets: ts}).Result
	d.kickNotifier()
	return res
}

// kickNotifier wakes a polling notifier that stopped for want of rooms.
func (d *Decode) kickNotifier() {
	select {
	case d.roomsKick <- struct{}{}:
	default:
	}
}

// client returns the discovery client of url (HTTP server or etcd).
func (d *Decode) client(url string) (discovery.Discovery, error) {
	d.clientsMu.Lock()
	defer d.clientsMu.Unlock()
	if cl := d.clients[url]; cl != nil {
		return cl, nil
	}
	if d.clients == nil {
		return nil, ErrManagerClosed // its clients are closed: a new one would leak
	}
	cl, err := discovery.Dial(url, d.dialOptions())
	if err != nil {
		return nil, err
	}
	d.clients[url] = cl
	return cl, nil
}

// watch carries a discovery backend's rank changes into the core: a rank
// whose record vanished, or moved to another endpoint, fails the rooms
// bound to it at once (heartbeats would, later) and is looked up again.
func (d *Decode) watch(url string, ch <-chan discovery.RankEvent) {
	defer func() { // ended: the next lookup of the instance watches it again
		d.clientsMu.Lock()
		delete(d.watched, url)
		d.clientsMu.Unlock()
	}()
	for ev := range ch {
		t := core.Target{Bootstrap: url, DP: ev.DP, Rank: ev.TP, PP: ev.PP}
		cert := records.RankInfo{Cert: ev.Cert}.CertBytes()
		if d.cfg.identity() != nil && !ev.Deleted && d.checkRankCert(t, records.RankInfo{Cert: ev.Cert}) != nil {
			// Not the rank's certificate: nothing is addressed with it; the
			// REGISTER that goes unanswered looks the rank up, and the
			// lookup fails the rooms naming the certificate (resolve).
			cert = ""
		}
		// (Gone: the core drops the instance's topology too.)
		d.stepIn(core.TargetChanged{Target: t, Endpoint: ev.Endpoint, ServerKey: ev.PublicKey, Cert: cert, Epoch: ev.Epoch, Gone: ev.Deleted})
	}
}

// topology returns a prefill instance's topology: the one the core keeps,
// else looked up in its bootstrap service — once at a time per instance,
// the other rooms waiting for its answer — and stepped into the core. Its
// rank changes are watched from the first lookup on.
func (d *Decode) topology(url string) (records.Topology, error) {
	var kept core.Topology
	ok := false
	d.read(func(c *core.Core) { kept, ok = c.Topology(url) })
	if ok {
		return fromCoreTopology(kept), nil
	}
	d.clientsMu.Lock()
	e := d.lookups[url]
	first := e == nil
	if first {
		e = &topoLookup{done: make(chan struct{})}
		d.lookups[url] = e
	}
	d.clientsMu.Unlock()
	if first {
		ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Registry.BootstrapTimeout)
		var cl discovery.Discovery
		if cl, e.err = d.client(url); e.err == nil {
			e.topo, e.err = cl.Topology(ctx)
		}
		cancel()
		if e.err == nil {
			d.stepIn(core.TopologyLearned{URL: url, Topo: toCoreTopology(e.topo)})
			d.clientsMu.Lock()
			watch := !d.watched[url]
			d.watched[url] = true
			d.clientsMu.Unlock()
			if watch {
				if ch := cl.Watch(d.ctx); ch != nil {
					d.spawn(func() { d.watch(url, ch) })
				}
			}
		}
		d.clientsMu.Lock()
		delete(d.lookups, url)
		d.clientsMu.Unlock()
		close(e.done)
	}
	select {
	case <-e.done:
	case <-d.closing:
		return records.Topology{}, ErrManagerClosed
	}
	return e.topo, e.err
}

// toCoreTopology and fromCoreTopology convert a bootstrap service's answer
// to the core's copy and back.
func toCoreTopology(t records.Topology) core.Topology {
	return core.Topology{Instance: t.Instance, DPSize: t.DPSize, TPSize: t.TPSize, PPSize: t.PPSize, PageSize: t.PageSize,
		DType: t.DType, Compat: t.Compat, Layers: t.Layers, KVHeads: t.KVHeads, HeadBytes: t.HeadBytes, MLA: t.MLA, PageLayout: t.PageLayout}
}

func fromCoreTopology(t core.Topology) records.Topology {
	return records.Topology{Instance: t.Instance, DPSize: t.DPSize, TPSize: t.TPSize, PPSize: t.PPSize, PageSize: t.PageSize,
		DType: t.DType, Compat: t.Compat, ModelFacts: records.ModelFacts{Layers: t.Layers, KVHeads: t.KVHeads, HeadBytes: t.HeadBytes, MLA: t.MLA, PageLayout: t.PageLayout}}
}

// links computes a room's prefill ranks in an instance: the rank mapping
// of this rank's Parallel and Model onto the instance's topology (one
// target, PrefillRank, when the rank has no Model). When it refuses the
// room after reading the instance's topology, told lists the instance's
// ranks that may hold the room (its DP group's, or every group's when the
// group is not known), so they can be told.
func (d *Decode) links(room uint64, inst instance) (links []core.Link, told []core.Target, err error) {
	if inst.Bootstrap == "" {
		inst.Bootstrap = d.cfg.BootstrapURL
	}
	if inst.Bootstrap == "" {
		return nil, nil, fmt.Errorf("room %d names no prefill instance (receiver.NewFor's bootstrap) and this decode rank has no default (Config.BootstrapURL)", room)
	}
	if kvlayout.NoModel(d.cfg.Model) {
		return []core.Link{{Target: core.Target{Bootstrap: inst.Bootstrap, Rank: d.cfg.PrefillRank, DP: max(inst.DP, 0)}, Aux: true}}, nil, nil
	}
	topo, err := d.topology(inst.Bootstrap)
	if err != nil {
		return nil, nil, fmt.Errorf("prefill instance at %s: topology: %w", inst.Bootstrap, err)
	}
	dp := inst.DP
	if dp == AutoDP {
		dp = int(room % uint64(max(topo.DPSize, 1)))
	}
	refuse := func(err error) ([]core.Link, []core.Target, error) {
		return nil, instanceRanks(inst.Bootstrap, topo, dp), err
	}
	facts := modelFacts(d.cfg.Model)
	if topo.ModelFacts != facts || kvlayout.PageRatio(topo.PageSize, d.cfg.Model.PageTokens) != nil {
		return refuse(fmt.Errorf("%w: prefill instance %q at %s has model %+v with %d-token pages, this decode rank %+v with %d (the models must match; the page sizes may differ when one divides the other)",
			transfer.ErrTopology, topo.Instance, inst.Bootstrap, topo.ModelFacts, topo.PageSize, facts, d.cfg.Model.PageTokens))
	}
	if dp == LookupDP {
		ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Registry.BootstrapTimeout)
		var cl discovery.Discovery
		if cl, err = d.client(inst.Bootstrap); err == nil {
			dp, err = cl.RoomDP(ctx, room)
		}
		cancel()
		if err != nil {
			return refuse(fmt.Errorf("prefill instance %q at %s: DP group of room %d: %w", topo.Instance, inst.Bootstrap, room, err))
		}
	}
	if dp < 0 || dp >= max(topo.DPSize, 1) {
		return refuse(fmt.Errorf("prefill instance %q at %s: DP group %d outside [0, %d)", topo.Instance, inst.Bootstrap, dp, topo.DPSize))
	}
	tl, err := kvlayout.Links(d.cfg.Model, transfer.Parallel{TPSize: topo.TPSize, PPSize: topo.PPSize, DPSize: topo.DPSize}, d.cfg.Parallel)
	if err != nil {
		return refuse(fmt.Errorf("prefill instance %q at %s: %w", topo.Instance, inst.Bootstrap, err))
	}
	links = make([]core.Link, len(tl))
	for i, l := range tl {
		links[i] = core.Link{Target: core.Target{Bootstrap: inst.Bootstrap, Rank: l.TPRank, DP: dp, PP: l.PPRank,
			InstTP: max(topo.TPSize, 1), InstPP: max(topo.PPSize, 1)},
			Dummy: l.Dummy, Aux: l.Aux, Required: l.Required, Pages: kvlayout.PageMap{Src: topo.PageSize, Dst: d.cfg.Model.PageTokens}}
	}
	return links, nil, nil
}

// maxToldRanks bounds the ranks a refusal tells (a room has at most
// MaxSources; an instance larger than this is not told, and its rooms wait
// for their bootstrap deadline).
const maxToldRanks = 1024

// instanceRanks lists an instance's ranks in DP group dp (every group's
// when dp is outside the instance).
func instanceRanks(url string, topo records.Topology, dp int) []core.Target {
	tp, pp, dps := max(topo.TPSize, 1), max(topo.PPSize, 1), max(topo.DPSize, 1)
	groups := []int{dp}
	if dp < 0 || dp >= dps {
		groups = nil
		for g := range dps {
			groups = append(groups, g)
		}
	}
	if len(groups)*tp*pp > maxToldRanks {
		return nil
	}
	var out []core.Target
	for _, g := range groups {
		for s := range pp {
			for r := range tp {
				out = append(out, core.Target{Bootstrap: url, Rank: r, DP: g, PP: s, InstTP: tp, InstPP: pp})
			}
		}
	}
	return out
}

// CreateReceiverFor creates the decode side of a room that receives from a
// prefill instance: its topology is looked up once per instance (cached),
// the rank mapping gives the room's prefill ranks, and their endpoints are
// resolved now, so an abort before Init reaches them.
//
// bootstrap is the instance's bootstrap service ("" means
// Config.BootstrapURL); dp its DP group under DP attention: a group's
// index, AutoDP (room % dp_size) or LookupDP.
func (d *Decode) CreateReceiverFor(room uint64, bootstrap string, dp int) error {
	return refusal(d.createReceiverFor(room, instance{Bootstrap: bootstrap, DP: dp}))
}

func (d *Decode) createReceiverFor(room uint64, inst instance) core.Result {
	links, told, err := d.links(room, inst)
	if err != nil {
		err = fmt.Errorf("room %d: %w", room, err)
		if len(told) > 0 {
			// The prefill ranks may already hold the room: tell them, or
			// each waits for its bootstrap deadline.
			d.stepIn(core.RefuseRoom{Room: room, Targets: told, Reason: err.Error()})
		}
		return core.Result{Outcome: core.Rejected, Err: err}
	}
	res := d.stepIn(core.CreateReceiver{Room: room, Links: links}).Result
	d.kickNotifier()
	return res
}

// InitReceiver sends the room's REQUEST to its prefill ranks, registering
// first where needed, and returns once every REQUEST is out or the room
// failed (a refused registration returns an error wrapping
// ErrIncompatible). If ctx ends first the room fails.
//
// A spec naming a destination page, or an item of one state region, twice
// is refused at the call (ErrInvalidSpec; the room is left as it was): every
// prefill rank would refuse its REQUEST.
func (d *Decode) InitReceiver(ctx context.Context, room uint64, rs RequestSpec) error {
	spec := core.RequestSpec(rs)
	if err := core.CheckSpec(room, spec); err != nil {
		return err
	}
	if spec.Pull && !d.cfg.Pull {
		return fmt.Errorf("room %d: RequestSpec.Pull on a decode rank without Config.Pull (it has no pool for reads, and its prefill ranks are not asked for offers): %w", room, core.ErrInvalidSpec)
	}
	spec.Pull = d.cfg.Pull
	spec.Digest = spec.Digest || d.cfg.Digest
	if spec.Digest {
		if err := d.digestable(room); err != nil {
			return fmt.Errorf("room %d: a digest (RequestSpec.Digest or Config.Digest) cannot be checked: %v: %w", room, err, core.ErrInvalidSpec)
		}
	}
	tails := d.writeTails(room, spec)
	var ready <-chan struct{}
	d.read(func(c *core.Core) {
		// (Asked before the step: the room's ready wake may be its own.)
		if _, pending, ok := c.Pending(room); ok && pending {
			ready = d.waits.on(room, core.WakeReady)
		}
	})
	res := d.stepAfter(d.plant(room, tails), core.InitReceiver{Room: room, Spec: spec}).Result
	var reason string
	if res.Status == core.Failed {
		d.read(func(c *core.Core) { reason, _ = c.Failure(room) }) // (a room keeps its first reason)
	}
	switch {
	case res.Outcome == core.Applied:
	case res.Outcome == core.Rejected:
		return res.Err
	case res.Status == core.Failed:
		// The room failed first (aborted, refused, or its prefill rank
		// declared dead): no later status can make it ready.
		return d.failedErr(room, reason)
	default:
		return fmt.Errorf("room %d: request in %v: %w", room, res.Status, core.ErrNotReady)
	}
	if ready == nil { // woken already (its effect may still be on its way)
		ready = d.woken()
	}
	select {
	case <-ready:
	case <-ctx.Done():
		d.Abort(room, "no REGISTER_ACK: "+ctx.Err().Error())
		return fmt.Errorf("room %d: waiting for the prefill ranks' REGISTER_ACK: %w", room, ctx.Err())
	case <-d.closing:
		return fmt.Errorf("room %d: %w", room, ErrManagerClosed)
	}
	st, known := d.Status(room)
	switch {
	case !known:
		return fmt.Errorf("room %d: %w", room, core.ErrRoomCleared)
	case st == Failed:
		return d.failedErr(room, d.Failure(room))
	}
	return nil
}

// failedErr is Init's error for a Failed room: ErrIncompatible where a
// prefill rank refused our registration, ErrRoomFailed otherwise, with the
// reason.
func (d *Decode) failedErr(room uint64, reason string) error {
	if strings.Contains(reason, core.ErrIncompatible.Error()) {
		// A prefill rank refused us (the core dropped the topologies:
		// an instance may have changed shape under one).
		return fmt.Errorf("room %d: %w%s", room, core.ErrIncompatible, strings.TrimPrefix(reason, core.ErrIncompatible.Error()))
	}
	return fmt.Errorf("room %d: %w: %s", room, core.ErrRoomFailed, reason)
}

// Report returns a room's load report (which pages and layers landed, the
// failure's code and reason) once nothing more can land: after Success, or
// after a failure once Released is closed; ok is false before, and once
// the room is cleared.
func (d *Decode) Report(room uint64) (LoadReport, bool) {
	var r core.LoadReport
	var ok bool
	d.read(func(c *core.Core) { r, ok = c.Report(room) })
	return reportOf(r), ok
}

// notifier drains the agent's notifications and steps them into the core.
// It blocks on the engine's wake-up channel where there is one (no timer:
// an idle rank costs no CPU). Otherwise
// (libnixl) it polls with a back-off of up to 1 ms while rooms are live,
// every second while only cleared rooms' tombstones remain (their late
// notifications are read and dropped while the tombstone can tell them
// from a later room with the same id), and stops polling when there are
// neither (an idle rank costs no CPU) until a room is created.
func (d *Decode) notifier() {
	defer d.wg.Done()
	wake := d.agent.NotifyC()
	idle := time.Duration(0)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ns, err := d.agent.Notifs()
		if err == nil && len(ns) > 0 {
			idle = 0
			for _, n := range ns {
				d.onNotif(string(n.Msg))
			}
			continue
		}
		idle = min(max(2*idle, 10*time.Microsecond), time.Millisecond)
		var kick chan struct{} // nil while polling for live rooms: a new room changes nothing
		switch {
		case wake != nil:
			// The engine signals every notification it queues (a signal
			// after the drain above stays in the channel): no timer.
			select {
			case <-d.closing:
				return
			case <-wake:
			}
			continue
		case idle == time.Millisecond:
			switch live, tombs := d.roomCounts(); {
			case live == 0 && tombs == 0:
				// Every room is created through kickNotifier: wait for it.
				select {
				case <-d.closing:
					return
				case <-d.roomsKick:
					idle = 0
				}
				continue
			case live == 0:
				// Only cleared rooms' tombstones: their late notifications
				// are still read (and dropped) while the tombstones live,
				// so none waits in the engine's queue for a room that
				// reuses the id later; no hurry.
				idle, kick = notifierTombstonePoll, d.roomsKick
			}
		}
		timer.Reset(idle)
		select {
		case <-d.closing:
			return
		case <-kick:
			idle = 0
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

// notifierTombstonePoll is how often a polling notifier reads the engine's
// notifications while only tombstones remain: a late one must be read
// before its tombstone's TTL (minutes) ends, and each poll wakes an idle
// rank (at 100 ms the polls were most of an idle libnixl decode rank's
// CPU).
const notifierTombstonePoll = time.Second

// roomCounts counts the rooms still live (pending or not final) and the
// cleared rooms' tombstones.
func (d *Decode) roomCounts() (live, tombs int) {
	d.read(func(c *core.Core) { s := c.RoomSizes(); live, tombs = s.Live+s.Pending, s.Tombstones+s.Draining })
	return live, tombs
}

// onNotif steps one notification into the core.
func (d *Decode) onNotif(s string) {
	if core.IsChallenge(s) {
		// A prefill rank asks this rank to echo the nonce (the core
		// drops one for another identity, or malformed, counted).
		x, _ := core.ParseChallenge(s)
		d.stepIn(x)
		return
	}
	n, ok := core.ParseNotif(s)
	if !ok {
		d.unparsedNotifs.Add(1)
		d.log.Warn("unknown notification", zap.String("notif", s))
		return
	}
	if n.Digests != nil {
		d.checkAside(n) // its pages summed off the notifier
		return
	}
	d.notified(n)
}

// notified checks what notification n names landed (and its digest),
// then steps it into the core.
func (d *Decode) notified(n core.Notified) {
	room := n.Room
	d.trace(room, rankhooks.Landed)
	var sumErr error
	if n.Undelivered = d.checkWrite(n); n.Undelivered != "" {
		d.log.Warn("a notification names bytes that did not land: the room fails", zap.Uint64("room", room), zap.Int("source", n.UID), zap.String("what", n.Undelivered))
	} else if n.Corrupt, n.Checked, sumErr = d.digestOf(n); sumErr != nil {
		// This rank's failure, not the prefill rank's bytes: the core
		// fails the room failed, not corrupt (Notified.Unsummed).
		n.Unsummed = sumErr.Error()
		d.log.Warn("a notification's pages could not be summed for their digest: the room fails", zap.Uint64("room", room), zap.Int("source", n.UID), zap.Error(sumErr))
	} else if n.Corrupt != "" {
		d.log.Warn("a notification's pages do not match their digest: the room fails", zap.Uint64("room", room), zap.Int("source", n.UID), zap.String("what", n.Corrupt))
	}
	if out := d.stepIn(n); out.Succeeded {
		d.trace(room, rankhooks.LastNotif)
		d.trace(room, rankhooks.Success)
		d.met.latency.Observe(out.Entered[core.Success].Sub(out.Started).Seconds())
		d.met.observePhases(out.Entered)
	}
}
