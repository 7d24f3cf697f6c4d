package kvmanager

// Pull in the shell (docs/PROTOCOL.md "Pull"; the protocol is the core's,
// internal/core/pull.go).
//
// A prefill rank that serves pull (PullLease ≥ 0) offers, with every
// REGISTER_ACK ok, what a decode rank needs to read from it: its agent's
// metadata, its regions and its ownership proof seed (sealed, as a
// REGISTER's are). A decode rank with Pull accepts the offer before the
// core sees the REGISTER_ACK: it loads the metadata and reads the proof
// slots back, as a prefill rank does with a REGISTER, so it never reads
// memory that is not the prefill process's own; an offer that fails
// turns the REGISTER_ACK into a refusal, naming why. Then each EffectRead
// is turned into descriptor pairs checked against both layouts
// (transfer.ReadPairs) and prepared, gated (ReadPosting) right before its
// posts, posted as one READ per memory kind, waited for (bounded by the
// stall timeout) and stepped back as ReadDone.

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
	"go.uber.org/zap"
)

// pullReaders is how many reads a decode rank keeps in progress at once.
const pullReaders = 8

// pullOffer builds the offer a prefill rank that serves pull sends with
// its REGISTER_ACKs (nil when it does not serve pull).
func (m *Manager) pullOffer() (*bootstrap.PullOffer, error) {
	if m.cfg.Role != core.RolePrefill || m.cfg.PullLease < 0 {
		return nil, nil
	}
	md, err := m.agent.Metadata()
	if err != nil {
		return nil, fmt.Errorf("kvmanager: agent metadata for the pull offer: %w", err)
	}
	kv, aux, state := core.RegionsOf(m.cfg.Layout)
	return &bootstrap.PullOffer{Agent: m.agent.Name(), AgentMD: md, KV: kv, Aux: aux, State: state, Proof: m.proof[:],
		LeaseMillis: max(int(m.cfg.PullLease/time.Millisecond), 1)}, nil
}

// sendWhenReady sends a PAGES once the data it publishes is in place
// (SendLayers' ready), waiting with the transfer pool's readiness poll
// (transfer.WaitReady: its back-off and stall bound); an error, or no
// answer within the stall timeout, fails the room instead.
func (m *Manager) sendWhenReady(e core.Effect) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		switch err := transfer.WaitReady(e.Ready, m.cfg.Registry.StallTimeout, m.closing); {
		case errors.Is(err, transfer.ErrClosed):
		case err != nil:
			m.stepIn(core.Fail{Room: e.Room, Reason: fmt.Sprintf("room %d: the pages published to %s: %v", e.Room, e.To.Endpoint, err)})
		default:
			// The core stamps it (the decode rank's RENEWs went on while
			// the data was not ready) and sends it.
			m.stepIn(core.PagesReady{To: e.To, Msg: e.Msg.(*bootstrap.Pages)})
		}
	}()
}

// Released returns a channel closed once a pull room's published pages
// may be reused: every decode rank it published to reported its reads
// drained, or the quarantine past the lease ran out (counted as forced).
// A room that published nothing for pull (a push room) holds nothing: the
// channel is closed. It stays valid after Clear.
func (p *Prefill) Released(room uint64) <-chan struct{} {
	var ch <-chan struct{} = closedChan
	p.read(func(c *core.Core) {
		if c.PullHold(room) {
			ch = p.waits.on(room, core.WakePull)
		}
	})
	return ch
}

// pullKey names one prefill process a decode rank reads from.
type pullKey struct {
	endpoint string
	epoch    uint64
}

// pullPeer is a prefill process whose offer this decode rank accepted.
type pullPeer struct {
	remote string
	owner  string // the offering rank's identity (From.Peer())
	layout transfer.Layout
	offer  [32]byte // its hash: a repeated REGISTER_ACK with the same offer is not proven again
}

// remoteLocks stripes the locks of reads through a remote by its agent
// name: a read holds its remote's for reading from its lookup to its last
// post; an offer that replaces that remote's metadata holds it for
// writing, so no read is prepared through one remote and posted through
// its successor, and an offer stalls only the reads of its stripe.
const remoteLocks = 64

func (ps *pullState) remoteLock(name string) *sync.RWMutex {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint32(name[i])) * 16777619
	}
	return &ps.locks[h%remoteLocks]
}

// pullState is a decode rank's pull side.
type pullState struct {
	mu    sync.RWMutex // guards the maps below (held briefly)
	locks [remoteLocks]sync.RWMutex
	// peers are the accepted offers; slices the rank mapping's slice per
	// target (nil: identical layouts).
	peers  map[pullKey]*pullPeer
	slices map[core.Target]*transfer.Slice
	// checking serializes the offers of one prefill agent; checks counts
	// the offers being checked (at most maxOfferChecks).
	checking map[string]chan struct{}
	checks   atomic.Int32
	// queue holds the reads asked for and not yet taken by a reader; qsig
	// wakes readers.
	qmu   sync.Mutex
	queue []readJob
	qsig  chan struct{}
}

// maxOfferChecks bounds the offers a decode rank checks at once: a
// REGISTER_ACK past it is left unanswered (its REGISTER is sent again).
const maxOfferChecks = 16

type readJob struct {
	room uint64
	to   bootstrap.Peer
	rd   *core.Read
}

// startPull starts a decode rank's readers.
func (d *Decode) startPull() {
	d.pull = &pullState{peers: map[pullKey]*pullPeer{}, slices: map[core.Target]*transfer.Slice{},
		checking: map[string]chan struct{}{}, qsig: make(chan struct{}, pullReaders)}
	for range pullReaders {
		d.wg.Add(1)
		go d.reader()
	}
}

// onRegisterAck accepts a REGISTER_ACK's pull offer, off the receive
// goroutine, then steps the REGISTER_ACK — as a refusal naming why when
// the offer is missing or fails.
func (d *Decode) onRegisterAck(msg *bootstrap.RegisterAck) {
	if !msg.OK {
		d.receive(msg)
		return
	}
	awaited := false
	d.read(func(c *core.Core) { awaited = c.AwaitsRegisterAck(msg.From.Endpoint) })
	if !awaited {
		d.receive(msg) // no REGISTER of ours waits there: the core drops it, nothing is loaded
		return
	}
	if d.pull.checks.Add(1) > maxOfferChecks {
		d.pull.checks.Add(-1)
		d.log.Warn("pull offer left unanswered: too many being checked (its REGISTER is sent again)", zap.String("peer", msg.From.Peer()))
		return
	}
	d.regMu.Lock() // (Close sets regClosed under it before it waits for the goroutines)
	if d.regClosed {
		d.regMu.Unlock()
		d.pull.checks.Add(-1)
		return
	}
	d.wg.Add(1)
	d.regMu.Unlock()
	go func() {
		defer d.wg.Done()
		defer d.pull.checks.Add(-1)
		if err := d.acceptOffer(msg); err != nil {
			refused := *msg
			refused.OK, refused.Pull = false, nil
			refused.Reason = fmt.Sprintf("pull from prefill %s (%s): %v", msg.From.Peer(), msg.From.Endpoint, err)
			d.log.Warn("pull offer refused", zap.String("peer", msg.From.Peer()), zap.Error(err))
			d.receive(&refused)
			return
		}
		d.receive(msg)
	}()
}

// errNoOffer: a prefill rank that does not serve pull.
var errNoOffer = errors.New("its REGISTER_ACK offers nothing to read: it does not serve pull (PullLease < 0 there)")

// acceptOffer checks a prefill process's offer and loads it: its agent
// name is its own (of its default form, the sender's; the one the blob
// itself names, checked before the blob is loaded; not another rank's
// accepted one), its regions make a layout, and its memory is proven its
// own by reading every proof slot back through the loaded metadata.
func (d *Decode) acceptOffer(msg *bootstrap.RegisterAck) error {
	o := msg.Pull
	if o == nil {
		return errNoOffer
	}
	from := msg.From
	if core.DefaultNameOwner(o.Agent) != "" {
		if want := fmt.Sprintf("%s-prefill-%d", from.Instance, from.Rank); o.Agent != want {
			return fmt.Errorf("%w: agent %q has the form of another rank's default name (want %q)", errNotOwner, o.Agent, want)
		}
	}
	if named, err := nixl.MetadataAgent(o.AgentMD); err != nil {
		return fmt.Errorf("agent metadata: %w", err)
	} else if named != o.Agent {
		return fmt.Errorf("%w: its metadata names agent %q, its offer %q", errNotOwner, named, o.Agent)
	}
	lay, err := core.LayoutFrom(o.KV, o.Aux, o.State)
	if err != nil {
		return fmt.Errorf("its regions: %w", err)
	}
	hash := offerHash(o)
	key := pullKey{from.Endpoint, from.Epoch}
	owner := from.Peer()
	ps := d.pull
	// One offer of an agent at a time.
	for {
		ps.mu.Lock()
		if p := ps.peers[key]; p != nil && p.offer == hash && d.agent.RemoteUsable(p.remote) {
			ps.mu.Unlock()
			return nil // a repeat of the offer already proven
		}
		for _, p := range ps.peers {
			if p.remote == o.Agent && p.owner != owner {
				ps.mu.Unlock()
				return fmt.Errorf("%w: agent %q is %s's, whose offer was accepted here", errNotOwner, o.Agent, p.owner)
			}
		}
		busy, ok := ps.checking[o.Agent]
		if !ok {
			ps.checking[o.Agent] = make(chan struct{})
			ps.mu.Unlock()
			break
		}
		ps.mu.Unlock()
		select {
		case <-busy:
		case <-d.closing:
			return ErrManagerClosed
		}
	}
	defer func() {
		ps.mu.Lock()
		close(ps.checking[o.Agent])
		delete(ps.checking, o.Agent)
		ps.mu.Unlock()
	}()
	// No read goes through the agent's remote while its metadata is
	// replaced: that rank's earlier entries, and this endpoint's other
	// processes', go first.
	rl := ps.remoteLock(o.Agent)
	rl.Lock()
	ps.mu.Lock()
	for k, p := range ps.peers {
		if p.remote == o.Agent || k.endpoint == from.Endpoint {
			delete(ps.peers, k)
		}
	}
	ps.mu.Unlock()
	_, err = d.agent.LoadRemote(o.AgentMD)
	rl.Unlock()
	if err != nil {
		return fmt.Errorf("agent metadata: %w", err)
	}
	// Nothing refers to the new remote until it is proven (no entry names
	// it), so no read goes through it before.
	reg := &bootstrap.Register{From: from, Proof: o.Proof}
	if err := d.checkProof(o.Agent, reg, lay); err != nil {
		d.agent.InvalidateRemote(o.Agent)
		return err
	}
	ps.mu.Lock()
	ps.peers[key] = &pullPeer{remote: o.Agent, owner: owner, layout: lay, offer: hash}
	clear(ps.slices) // an instance may have changed shape or page size: computed again
	ps.mu.Unlock()
	return nil
}

// offerHash hashes an offer's metadata, regions and seed.
func offerHash(o *bootstrap.PullOffer) [32]byte {
	h := sha256.New()
	fmt.Fprintf(h, "%d;%s;%d;%s;%d;%s;", len(o.Agent), o.Agent, len(o.AgentMD), o.AgentMD, len(o.Proof), o.Proof)
	for _, list := range [][]bootstrap.Region{o.KV, o.Aux, o.State} {
		fmt.Fprintf(h, "%d;", len(list))
		for _, r := range list {
			fmt.Fprintf(h, "%d,%d,%d,%d,%s;", r.Addr, r.Len, r.ItemLen, r.Dev, r.Mem)
		}
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// pullSlice is the rank mapping's slice of what prefill rank t holds for
// this rank (nil without a Model: identical layouts), computed once.
func (d *Decode) pullSlice(t core.Target) (*transfer.Slice, error) {
	if d.cfg.Model.Zero() {
		return nil, nil
	}
	ps := d.pull
	ps.mu.RLock()
	s, ok := ps.slices[t]
	ps.mu.RUnlock()
	if ok {
		return s, nil
	}
	topo, err := d.topology(t.Bootstrap)
	if err != nil {
		return nil, err
	}
	pm := d.cfg.Model.WithPages(topo.PageSize)
	pp := transfer.Parallel{TPSize: topo.TPSize, TPRank: t.Rank, PPSize: topo.PPSize, PPRank: t.PP, DPSize: topo.DPSize, DPRank: t.DP}
	if s, err = transfer.Plan(pm, d.cfg.Model, pp, d.cfg.Parallel); err != nil {
		return nil, fmt.Errorf("prefill %v → decode %v: %w", pp.Norm(), d.cfg.Parallel.Norm(), err)
	}
	ps.mu.Lock()
	ps.slices[t] = s
	ps.mu.Unlock()
	return s, nil
}

// reader carries out reads, one at a time.
func (d *Decode) reader() {
	defer d.wg.Done()
	ps := d.pull
	for {
		ps.qmu.Lock()
		if len(ps.queue) == 0 {
			ps.qmu.Unlock()
			select {
			case <-d.closing:
				return
			case <-ps.qsig:
			}
			continue
		}
		j := ps.queue[0]
		ps.queue[0] = readJob{}
		ps.queue = ps.queue[1:]
		ps.qmu.Unlock()
		err, quiesced := d.doRead(j)
		if err == errGated {
			continue
		}
		d.stepIn(core.ReadDone{Room: j.room, Read: j.rd, Err: err, Quiesced: quiesced})
	}
}

// errGated: the read's gate refused it (the core counted it over).
var errGated = errors.New("kvmanager: read gated")

// doRead prepares one read, gates it right before its posts (the lease
// and the room checked then), posts it and waits for it. quiesced: a
// failure that can no longer land (nothing of it reached the engine).
func (d *Decode) doRead(j readJob) (err error, quiesced bool) {
	where := fmt.Sprintf("room %d: read from prefill at %s (epoch %d)", j.room, j.to.Endpoint, j.rd.Epoch)
	slice, err := d.pullSlice(j.rd.Target)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err), true
	}
	ps := d.pull
	key := pullKey{j.to.Endpoint, j.rd.Epoch}
	ps.mu.RLock()
	p := ps.peers[key]
	ps.mu.RUnlock()
	if p == nil {
		return fmt.Errorf("%s: that process has no accepted pull offer here", where), true
	}
	// Held from here to the last post: an offer that replaces this
	// remote's metadata waits (acceptOffer), so nothing is prepared
	// through one remote and posted through its successor.
	rl := ps.remoteLock(p.remote)
	rl.RLock()
	locked := true
	unlock := func() {
		if locked {
			rl.RUnlock()
			locked = false
		}
	}
	defer unlock()
	ps.mu.RLock()
	still := ps.peers[key] == p
	ps.mu.RUnlock()
	if !still {
		return fmt.Errorf("%s: that process's offer was replaced", where), true
	}
	own := d.cfg.Layout
	var kvSrc, kvDst, hostSrc, hostDst []nixl.Desc
	for i := range j.rd.Writes {
		w := &j.rd.Writes[i]
		s, t, err := transfer.ReadPairs(w, p.layout, own, slice)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err), true
		}
		if w.AuxSrc >= 0 || w.State >= 0 {
			hostSrc, hostDst = append(hostSrc, s...), append(hostDst, t...)
		} else {
			kvSrc, kvDst = append(kvSrc, s...), append(kvDst, t...)
		}
	}
	var xs []*nixl.Xfer
	var releases []func()
	defer func() {
		for _, f := range releases {
			f()
		}
	}()
	prep := func(srcKind, dstKind nixl.MemKind, src, dst []nixl.Desc) error {
		if len(src) == 0 {
			return nil
		}
		lp, err := d.agent.PrepLocal(dstKind, dst)
		if err != nil {
			return err
		}
		releases = append(releases, func() { lp.Release() })
		rp, err := d.agent.PrepRemote(p.remote, srcKind, src)
		if err != nil {
			return err
		}
		releases = append(releases, func() { rp.Release() })
		idx := make([]int, len(src))
		for i := range idx {
			idx[i] = i
		}
		x, err := d.agent.NewXfer(nixl.Read, lp, idx, rp, idx, nil)
		if err != nil {
			return err
		}
		releases = append(releases, func() { d.agent.Release(x) })
		xs = append(xs, x)
		return nil
	}
	err = prep(p.layout.Kind, own.Kind, kvSrc, kvDst)
	if err == nil {
		err = prep(nixl.DRAM, nixl.DRAM, hostSrc, hostDst)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", where, err), true
	}
	// The gate, right before the posts.
	if !d.stepIn(core.ReadPosting{Room: j.room, Read: j.rd}).OK {
		return errGated, true
	}
	for i, x := range xs {
		if i > 0 && !d.cfg.Now().Before(j.rd.Until) {
			// The lease ended between the posts: the rest is not posted;
			// what was may still land.
			return fmt.Errorf("%s: the lease ended (%v) between the read's posts", where, j.rd.Until), false
		}
		if err := d.agent.Post(x); err != nil {
			// Refused before the engine saw it (its lists are stale) only
			// then: any other failed post may have started.
			return fmt.Errorf("%s: %w", where, err), i == 0 && errors.Is(err, nixl.ErrStalePrep)
		}
	}
	unlock()
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Registry.StallTimeout)
	defer cancel()
	for _, x := range xs {
		st, werr := d.agent.Wait(ctx, x)
		if st != nixl.Done {
			if werr == nil {
				werr = fmt.Errorf("read ended %v", st)
			}
			return fmt.Errorf("%s: %w", where, werr), false
		}
	}
	var n uint64
	for _, dd := range kvDst {
		n += dd.Len
	}
	for _, dd := range hostDst {
		n += dd.Len
	}
	d.met.transfers.Add(float64(len(xs)))
	d.met.bytes.Add(float64(n))
	return nil, true
}

// queueReads hands a step's reads to the readers without waiting (it runs
// on whatever goroutine stepped the core, the control loop's receive
// goroutine included). The queue holds what PAGES the core accepted: at
// most one read per chunk and layer group of each live room's source.
func (d *Decode) queueReads(reads []core.Effect) {
	ps := d.pull
	ps.qmu.Lock()
	for _, e := range reads {
		ps.queue = append(ps.queue, readJob{room: e.Room, to: e.To, rd: e.Read})
	}
	ps.qmu.Unlock()
	for range min(len(reads), pullReaders) {
		select {
		case ps.qsig <- struct{}{}:
		default:
		}
	}
}
