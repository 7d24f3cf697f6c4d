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
// goes to the transfer pool (the decode rank's, as a prefill rank's posts
// its writes): a worker (reads go to them in turn) turns it into
// descriptor pairs checked against both layouts (pool.ReadPairs),
// prepares them, gates the read (ReadPosting) right before its posts,
// posts one READ per memory kind, learns of their completions as of a
// write's (bounded by the stall timeout), and the read is stepped back as
// ReadDone.

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/internal/canary"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/pool"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"go.uber.org/zap"
)

// pullRoomReads is how many reads of one room a decode rank's pool keeps
// posted at once (a room's reads need no order among themselves).
const pullRoomReads = 8

// pullOffer builds the offer a prefill rank that serves pull sends with
// its REGISTER_ACKs (nil when it does not serve pull).
func (m *Manager) pullOffer() (*wire.PullOffer, error) {
	if m.cfg.Role != RolePrefill || m.cfg.PullLease < 0 {
		return nil, nil
	}
	md, err := m.agent.Metadata()
	if err != nil {
		return nil, fmt.Errorf("kvmanager: agent metadata for the pull offer: %w", err)
	}
	kv, aux, state := core.RegionsOf(m.cfg.Layout)
	return &wire.PullOffer{Agent: m.agent.Name(), AgentMD: md, KV: kv, Aux: aux, State: state, Proof: m.proof[:],
		LeaseMillis: max(int(m.cfg.PullLease/time.Millisecond), 1)}, nil
}

// sumPages puts a PAGES' digest in it (a room whose REQUEST asked for
// one: the core's Effect.Digest), summed from this rank's source pieces
// once the data is in place (docs/PROTOCOL.md "Digest"), where it is (on
// the device by the digest kernel for VRAM).
func (m *Manager) sumPages(e core.Effect) {
	msg, ok := e.Msg.(*wire.Pages)
	if !ok || e.Digest == nil {
		return
	}
	sums, units, err := pool.Sums(m.agent, m.cfg.Layout, e.Digest)
	if err != nil {
		m.log.Warn("digest of published pages", zap.Uint64("room", e.Room), zap.Error(err))
		return
	}
	msg.Digests, msg.Units = sums, units
}

// sendWhenReady sends a PAGES once the data it publishes is in place
// (SendLayers' ready), waiting with the transfer pool's readiness poll
// (pool.WaitReady: its back-off and stall bound); an error, or no
// answer within the stall timeout, fails the room instead. A PAGES whose
// room asked for a digest gets its sums here, once the data is in place
// (a pass over it: not on the loop that carries out the core's effects).
func (m *Manager) sendWhenReady(e core.Effect) {
	m.spawn(func() {
		var err error
		if e.Ready != nil {
			err = pool.WaitReady(e.Ready, m.cfg.Registry.StallTimeout, m.closing)
		}
		if err == nil && e.Digest != nil {
			// At most a sum a CPU at once (each is a pass over the
			// chunk's pages); none once the rank closes.
			select {
			case m.sums <- struct{}{}:
				defer func() { <-m.sums }()
			case <-m.closing:
				err = pool.ErrClosed
			}
		}
		switch {
		case errors.Is(err, pool.ErrClosed):
		case err != nil:
			m.stepIn(core.Fail{Room: e.Room, Reason: fmt.Sprintf("room %d: the pages published to %s: %v", e.Room, e.To.Endpoint, err)})
		default:
			// The core stamps it (the decode rank's RENEWs went on while
			// the data was not ready) and sends it, with its sums.
			m.sumPages(e)
			m.stepIn(core.PagesReady{To: e.To, Msg: e.Msg.(*wire.Pages)})
		}
	})
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

// pullState is a decode rank's pull side. (The accepted offers are the
// core's: each read carries its offer's remote and layout.)
type pullState struct {
	mu    sync.RWMutex // guards slices (held briefly)
	locks [remoteLocks]sync.RWMutex
	// slices is the rank mapping's slice per target (nil: identical
	// layouts).
	slices map[core.Target]*kvlayout.Slice
}

// startPull starts a decode rank's transfer pool, which carries out its
// reads.
func (d *Decode) startPull() error {
	d.pull = &pullState{slices: map[core.Target]*kvlayout.Slice{}}
	var err error
	d.pool, err = pool.NewPool(d.agent, d.cfg.Layout, pool.Config{Workers: d.cfg.Workers, InFlight: d.cfg.InFlight,
		RoomInFlight: pullRoomReads, Stall: d.cfg.Registry.StallTimeout, Now: d.cfg.hooks.Now})
	if err != nil {
		return fmt.Errorf("kvmanager: the pull reads' transfer pool: %w", err)
	}
	return nil
}

// loadOffer carries out EffectLoadOffer on a goroutine of its own (engine
// I/O): it loads the offer's agent metadata and proves its memory the
// offering process's, then steps OfferLoaded.
func (d *Decode) loadOffer(p *core.OfferPlan) {
	d.offerIO(func() {
		err := d.proveOffer(p)
		if err != nil {
			d.log.Warn("pull offer refused", zap.String("peer", p.Ack.From.Peer()), zap.Error(err))
		} else if !p.Repeat {
			d.pull.mu.Lock()
			clear(d.pull.slices) // an instance may have changed shape or page size: computed again
			d.pull.mu.Unlock()
		}
		d.stepIn(core.OfferLoaded{Plan: p, Err: err})
	})
}

// challengeOffer carries out EffectChallengeOffer on a goroutine of its
// own (engine I/O): it loads the offer's agent metadata — the agent the
// blob names checked to be the offer's first — and sends that agent the
// challenge notification, a message, never an access to that process's
// memory; then steps OfferChallenged. Nothing is read through the agent
// until the offering rank echoes the nonce (the core then asks for the
// proof, EffectLoadOffer).
func (d *Decode) challengeOffer(p *core.OfferPlan, notif string) {
	d.offerIO(func() {
		err := d.sendOfferChallenge(p, notif)
		if err != nil {
			d.log.Warn("pull offer refused", zap.String("peer", p.Ack.From.Peer()), zap.Error(err))
		}
		d.stepIn(core.OfferChallenged{Plan: p, Err: err})
	})
}

// offerIO runs f (an offer's engine I/O, then its step) on a goroutine of
// its own, unless the rank is closing (Close sets regClosed under regMu
// before it waits for the goroutines).
func (d *Decode) offerIO(f func()) { d.spawn(f) }

func (d *Decode) sendOfferChallenge(p *core.OfferPlan, notif string) error {
	o := p.Ack.Pull
	// (The core dropped every accepted offer through this name first: no
	// read goes through the remote it replaces.)
	if err := d.loadOfferAgent(o); err != nil {
		return fmt.Errorf("challenging the agent it names: %w", err)
	}
	if err := d.agent.GenNotif(o.Agent, []byte(notif)); err != nil {
		// Maybe transient: the offer's next REGISTER_ACK sends it again.
		d.met.challengeSendFailed.Inc()
		d.log.Warn("offer challenge not sent", zap.String("peer", p.Ack.From.Peer()), zap.String("agent", o.Agent), zap.Error(err))
	}
	return nil
}

// loadOfferAgent loads an offer's agent metadata, its agent name checked
// first to be the one the blob itself names. No read goes through the
// agent's remote while its metadata is replaced: a read holds its stripe
// from before its gate to its last post (the core dropped the offers it
// replaces, so no read passes the gate through them any more).
func (d *Decode) loadOfferAgent(o *wire.PullOffer) error {
	if named, err := nixl.MetadataAgent(o.AgentMD); err != nil {
		return fmt.Errorf("agent metadata: %w", err)
	} else if named != o.Agent {
		return fmt.Errorf("%w: its metadata names agent %q, its offer %q", errNotOwner, named, o.Agent)
	}
	rl := d.pull.remoteLock(o.Agent)
	rl.Lock()
	_, err := d.agent.LoadRemote(o.AgentMD)
	rl.Unlock()
	if err != nil {
		return fmt.Errorf("agent metadata: %w", err)
	}
	return nil
}

// proveOffer loads an offer's agent metadata — its agent name the one the
// blob itself names, checked before the blob is loaded — and proves its
// memory its own by reading every proof slot back through it. A repeat of
// the accepted offer whose remote is still usable is left as it is.
func (d *Decode) proveOffer(p *core.OfferPlan) error {
	o := p.Ack.Pull
	if p.Repeat {
		if d.agent.RemoteUsable(o.Agent) {
			return nil
		}
		// Reads go through the accepted offer until the core hears
		// otherwise: its remote is not loaded again under it. Refused,
		// the offer is dropped, and the next REGISTER_ACK loads and
		// proves it anew.
		return fmt.Errorf("agent %q: the accepted offer's remote is no longer usable", o.Agent)
	}
	if !p.Loaded || !d.agent.RemoteUsable(o.Agent) {
		if err := d.loadOfferAgent(o); err != nil {
			return err
		}
	}
	// Nothing refers to the new remote until the core accepts it, so no
	// read goes through it before it is proven.
	reg := &wire.Register{From: p.Ack.From, Proof: o.Proof}
	if err := d.checkProof(o.Agent, reg, p.Layout); err != nil {
		d.agent.InvalidateRemote(o.Agent)
		return err
	}
	return nil
}

// pullSlice is the rank mapping's slice of what prefill rank t holds for
// this rank (nil without a Model: identical layouts), computed once;
// lookup says whether the prefill instance's topology may be looked up
// (I/O) — without, ok is false when the core does not hold it.
func (d *Decode) pullSlice(t core.Target, lookup bool) (s *kvlayout.Slice, ok bool, err error) {
	if kvlayout.NoModel(d.cfg.Model) {
		return nil, true, nil
	}
	ps := d.pull
	ps.mu.RLock()
	s, ok = ps.slices[t]
	ps.mu.RUnlock()
	if ok {
		return s, true, nil
	}
	var topo records.Topology
	if lookup {
		if topo, err = d.topology(t.Bootstrap); err != nil {
			return nil, true, err
		}
	} else {
		var kept core.Topology
		d.read(func(c *core.Core) { kept, ok = c.Topology(t.Bootstrap) })
		if !ok {
			return nil, false, nil
		}
		topo = fromCoreTopology(kept)
	}
	pm := kvlayout.WithPages(d.cfg.Model, topo.PageSize)
	pp := transfer.Parallel{TPSize: topo.TPSize, TPRank: t.Rank, PPSize: topo.PPSize, PPRank: t.PP, DPSize: topo.DPSize, DPRank: t.DP}
	if s, err = kvlayout.Plan(pm, d.cfg.Model, pp, d.cfg.Parallel); err != nil {
		return nil, true, fmt.Errorf("prefill %v → decode %v: %w", pp.Norm(), d.cfg.Parallel.Norm(), err)
	}
	ps.mu.Lock()
	ps.slices[t] = s
	ps.mu.Unlock()
	return s, true, nil
}

// readJob is a read's job for the pool: its gate steps ReadPosting, its
// completion is checked against its digest and stepped as ReadDone.
func (d *Decode) readJob(room uint64, to wire.Peer, rd *core.Read, slice *kvlayout.Slice) pool.Job {
	where := fmt.Sprintf("room %d: read from prefill at %s (epoch %d)", room, to.Endpoint, rd.Epoch)
	prd := &pool.Read{Remote: rd.Remote, Source: rd.Layout, Writes: rd.Writes, Slice: slice, Until: rd.Until,
		Hold: d.pull.remoteLock(rd.Remote)}
	return pool.Job{Room: room, Read: prd,
		Gate: func(*kvlayout.Write) bool { return d.stepIn(core.ReadPosting{Room: room, Read: rd}).OK },
		// Dropped: the gate refused it (the core counted it over).
		Done: func(_ *kvlayout.Write, err error, quiesced bool) {
			var corrupt string
			var checked bool
			if err != nil {
				err = fmt.Errorf("%s: %w", where, err)
			} else {
				d.met.transfers.Add(float64(prd.Transfers))
				d.met.bytes.Add(float64(prd.Bytes))
				if rd.Notif.Digests != nil {
					var sumErr error
					if corrupt, checked, sumErr = d.digestOf(rd.Notif); sumErr != nil {
						err = fmt.Errorf("%s: it landed, but %w", where, sumErr) // this rank's failure: the read fails, not corrupt
					} else if corrupt != "" {
						d.log.Warn("a read's pages do not match their digest: the room fails", zap.Uint64("room", room), zap.Int("source", rd.Source), zap.String("what", corrupt))
					}
				}
			}
			d.stepIn(core.ReadDone{Room: room, Read: rd, Err: err, Quiesced: quiesced, NotDelivered: errors.Is(err, canary.ErrNotDelivered),
				LeaseEnded: errors.Is(err, pool.ErrLeaseEnded), Corrupt: corrupt, Checked: checked})
		},
	}
}

// submitRead hands a read to the pool (failed, never posted, when its
// slice cannot be made, it has no accepted offer, or the pool is closed).
func (d *Decode) submitRead(room uint64, to wire.Peer, rd *core.Read, slice *kvlayout.Slice, err error) {
	where := fmt.Sprintf("room %d: read from prefill at %s (epoch %d)", room, to.Endpoint, rd.Epoch)
	if err == nil && rd.Remote == "" {
		err = errors.New("that process has no accepted pull offer here")
	}
	if err == nil {
		err = d.pool.Submit(d.readJob(room, to, rd, slice))
	}
	if err != nil {
		d.stepIn(core.ReadDone{Room: room, Read: rd, Err: fmt.Errorf("%s: %w", where, err), Quiesced: true})
	}
}

// queueReads hands a step's reads to the pool (it runs on whatever
// goroutine stepped the core: the control loop's receive goroutine, which
// a PAGES steps). Submit waits only while the worker it goes to has a full
// queue (pool.Config.Queue jobs); the core asks for at most one read per
// chunk and layer group of each live room's source. A read whose slice
// needs the prefill instance's topology looked up (the core no longer
// holds it) is handed over from a goroutine of its own once it is known.
func (d *Decode) queueReads(reads []core.Effect) {
	for _, e := range reads {
		slice, ok, err := d.pullSlice(e.Read.Target, false)
		if ok {
			d.submitRead(e.Room, e.To, e.Read, slice, err)
			continue
		}
		d.offerIO(func() {
			slice, _, err := d.pullSlice(e.Read.Target, true)
			d.submitRead(e.Room, e.To, e.Read, slice, err)
		})
	}
}
