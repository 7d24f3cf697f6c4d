package kvmanager

// Memory proven to its owner. A REGISTER describes memory by addresses and
// transport keys that are not secrets: a UCX worker address names a
// process by its pid (cma) and its shared-memory segments by id (posix,
// sysv), a tcp address names whatever listens there. A rank holding only its
// own certificate could describe another decode process's memory as its
// own and have a prefill rank write into it. So each rank process draws a
// random seed and writes, into the slot after each region it registers
// (transfer.ProofBytes), a value only the seed's holder can compute for that
// region: HMAC-SHA256(seed, the rank's identity, the region's list, index,
// kind, device, address and length). It sends the seed in its REGISTER,
// sealed to the prefill rank; the prefill rank recomputes each value for
// the REGISTER's own identity and regions, reads every slot back through the
// data plane — through the same registered region, key and process as its
// writes to that region will go — and binds the registration only if each
// holds its value. Another process's memory holds nothing the registering
// rank can match: not its seed's values (which bind the owner's identity
// and the exact region, so neither a slot read back nor bytes already there
// help), nor the owner's (whose seed it never sees). The agent name a
// REGISTER's blob carries must be its own too: a name another decode rank
// registered, or the default name of another rank, would replace or block
// that rank's remote agent here.
//
// The check reads through the network, so it runs off the control loop's
// receive goroutine (one per REGISTER, one at a time per decode rank and per
// agent name, at most maxProofChecks at once; a REGISTER that comes while
// its rank is being checked waits for that check to end, and one put off
// otherwise is left unanswered and counted, and its sender repeats it), so
// a peer that never answers the read delays only its own registration.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/cuda"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/kvbridge/kvbridge/transfer"
	"go.uber.org/zap"
)

// proofLen is the seed's size, and the size of the value at the start of
// each slot.
const proofLen = 32

// proofTimeout bounds the read of a REGISTER's proof slots and an agent
// challenge's echo (the tests' rankhooks.ChallengeTimeout may shorten it:
// Manager.proofTimeout).
const proofTimeout = 5 * time.Second

// proofTimeout is this rank's bound on a challenge's echo and a proof's
// read: proofTimeout unless the test hooks give another.
func (m *Manager) proofTimeout() time.Duration {
	if d := m.cfg.hooks.ChallengeTimeout; d > 0 {
		return d
	}
	return proofTimeout
}

// maxProofChecks bounds the REGISTERs being checked at once.
const maxProofChecks = 16

// proofInfo separates the slot values from any other use of the seed.
const proofInfo = "kvbridge ownership proof v1"

// errNotOwner: a REGISTER's memory is not proven its sender's.
var errNotOwner = errors.New("memory not proven the registering process's (not_owner)")

// proofRegion is one region a REGISTER names, with what its slot's value
// binds.
type proofRegion struct {
	what  string // "kv[3]", "aux[0]", "state[1]"
	list  byte   // 'k', 'a', 's'
	index int
	kind  nixl.MemKind
	desc  nixl.Desc // the region (its slot follows it)
}

// proofRegions lists a layout's regions with their slots' bindings: KV
// regions (of the layout's kind; the device counts only for VRAM), aux and
// state (host memory). Both sides build it: the decode rank from its
// layout, the prefill rank from the REGISTER's regions.
func proofRegions(l transfer.Layout) []proofRegion {
	var out []proofRegion
	for i, r := range l.Regions {
		if l.Kind != nixl.VRAM {
			r.Dev = 0
		}
		out = append(out, proofRegion{fmt.Sprintf("kv[%d]", i), 'k', i, l.Kind, r})
	}
	if l.Aux.Len > 0 {
		out = append(out, proofRegion{"aux[0]", 'a', 0, nixl.DRAM, nixl.Desc{Addr: l.Aux.Addr, Len: l.Aux.Len}})
	}
	for i, st := range l.State {
		out = append(out, proofRegion{fmt.Sprintf("state[%d]", i), 's', i, nixl.DRAM, nixl.Desc{Addr: st.Addr, Len: st.Len}})
	}
	return out
}

// slot is where a region's proof value sits: right after it.
func (r proofRegion) slot() nixl.Desc {
	return nixl.Desc{Addr: r.desc.Addr + uintptr(r.desc.Len), Len: proofLen, Dev: r.desc.Dev}
}

// value is what the region's slot holds for the rank owner with seed:
// HMAC-SHA256(seed, proofInfo, owner, list, index, kind, device, address,
// length).
func (r proofRegion) value(seed []byte, owner string) []byte {
	h := hmac.New(sha256.New, seed)
	h.Write([]byte(proofInfo))
	h.Write([]byte{0, byte(len(owner))})
	h.Write([]byte(owner))
	var b [1 + 8*5]byte
	b[0] = r.list
	binary.LittleEndian.PutUint64(b[1:], uint64(r.index))
	binary.LittleEndian.PutUint64(b[9:], uint64(r.kind))
	binary.LittleEndian.PutUint64(b[17:], r.desc.Dev)
	binary.LittleEndian.PutUint64(b[25:], uint64(r.desc.Addr))
	binary.LittleEndian.PutUint64(b[33:], r.desc.Len)
	h.Write(b[:])
	return h.Sum(nil)
}

// writeProof writes this process's value into the slot after each region
// (device memory through the CUDA driver); owner is the rank's identity
// (From.Peer()).
func (m *Manager) writeProof(l transfer.Layout, owner string) error {
	var device []proofRegion
	for _, r := range proofRegions(l) {
		if r.kind == nixl.VRAM {
			device = append(device, r)
			continue
		}
		copy(nixl.HostBytes(r.slot()), r.value(m.proof[:], owner))
	}
	if len(device) == 0 {
		return nil
	}
	drv, err := cuda.OpenDriver(m.cfg.Engine.CUDALib)
	if err != nil {
		return fmt.Errorf("kvmanager: writing the ownership proof into device memory (Config.Engine.CUDALib %q): %w", m.cfg.Engine.CUDALib, err)
	}
	ctxs := map[uint64]*cuda.Context{}
	defer func() {
		for _, c := range ctxs {
			c.Release()
		}
	}()
	for _, r := range device {
		d := r.slot()
		c := ctxs[d.Dev]
		if c == nil {
			if c, err = drv.Primary(int(d.Dev)); err != nil {
				return fmt.Errorf("kvmanager: writing the ownership proof into device %d: %w", d.Dev, err)
			}
			ctxs[d.Dev] = c
		}
		if err := c.CopyHtoD(cuda.DevicePtr(d.Addr), r.value(m.proof[:], owner)); err != nil {
			return fmt.Errorf("kvmanager: writing the ownership proof at %#x on device %d: %w", d.Addr, d.Dev, err)
		}
	}
	return nil
}

// checkClaims refuses, before its metadata is loaded, a REGISTER without
// a seed, whose blob names another agent than the REGISTER does, or whose
// agent name is an agent another decode rank registered here (the core
// refused another rank's default name already, and a registered process's
// REGISTER with other metadata or regions: PeerPlan.Repeat says a REGISTER
// repeats its process's registration).
func (m *Manager) checkClaims(msg *wire.Register) error {
	if len(msg.Proof) != proofLen {
		return fmt.Errorf("%w: the REGISTER carries no ownership proof (%d bytes, want %d; a decode rank from before proofs must be upgraded)", errNotOwner, len(msg.Proof), proofLen)
	}
	name, err := nixl.MetadataAgent(msg.AgentMD)
	if err != nil {
		return fmt.Errorf("agent metadata: %w", err)
	}
	if name != msg.Agent {
		return fmt.Errorf("%w: the agent metadata names agent %q, the REGISTER %q", errNotOwner, name, msg.Agent)
	}
	var owner string
	m.read(func(c *core.Core) { owner = c.AgentOwner(name) })
	if owner != "" && owner != msg.From.Peer() {
		return fmt.Errorf("%w: agent %q is registered here by %s", errNotOwner, name, owner)
	}
	return nil
}

// beginCheck reserves the check of a REGISTER: false (counted) while one
// from the same decode rank or naming the same agent is being checked,
// maxProofChecks are, or the rank is closing. A REGISTER given as park,
// put off by a check of its own rank, waits for that check to end (the
// latest per rank: at most maxProofChecks wait, as many ranks as have a
// check) and is then stepped into the core again, as if it arrived then
// (endCheck, resume): a decode rank echoes its agent challenge as soon as
// the notification lands, before the challenge's check has ended, and
// would otherwise wait for its REGISTER retry. One put off by another
// rank's check of its agent name, or by maxProofChecks checks, is left
// for its sender to repeat; none is stepped again once the rank closes.
func (m *Manager) beginCheck(peer, agent string, park *wire.Register) bool {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	if m.regClosed || m.checking[peer] || m.checking["agent "+agent] || len(m.checking) >= 2*maxProofChecks {
		m.met.deferred.Inc()
		if m.deferHook != nil {
			m.deferHook(peer)
		}
		if park != nil && m.checking[peer] { // (at most maxProofChecks ranks have a check)
			if m.waitingRegs == nil {
				m.waitingRegs = map[string]*wire.Register{}
			}
			m.waitingRegs[peer] = park
		}
		return false
	}
	if m.checking == nil {
		m.checking = map[string]bool{}
	}
	m.checking[peer], m.checking["agent "+agent] = true, true
	m.wg.Add(1)
	return true
}

// unpark takes the REGISTER parked behind peer's check (regMu held): nil
// if none, or once the rank is closing.
func (m *Manager) unpark(peer string) *wire.Register {
	r := m.waitingRegs[peer]
	delete(m.waitingRegs, peer)
	if r == nil || m.regClosed {
		return nil
	}
	return r
}

// resume steps a parked REGISTER (if any) into the core again, as if it
// arrived now: the core checks it against what it knows by then (a repeat
// of a registration just bound is a repeat, a challenge passed is
// passed). The caller has stepped its own check's answer first and still
// holds its count in wg, so Close waits for what this starts.
func (m *Manager) resume(msg *wire.Register) {
	if msg != nil {
		m.receive(msg)
	}
}

// unload carries out EffectUnload on a goroutine of its own, holding the
// agent name's reservation (no load under the name meanwhile): it drops
// the remote unless a challenge or a rank holds the name by then. A load
// running under the name when it comes unloads after itself instead.
func (m *Manager) unload(agent string) {
	m.regMu.Lock()
	if m.regClosed || m.checking["agent "+agent] {
		m.regMu.Unlock()
		return
	}
	if m.checking == nil {
		m.checking = map[string]bool{}
	}
	m.checking["agent "+agent] = true
	m.wg.Add(1)
	m.regMu.Unlock()
	go func() {
		defer func() {
			m.regMu.Lock()
			delete(m.checking, "agent "+agent)
			m.regMu.Unlock()
			m.wg.Done()
		}()
		var held bool
		m.read(func(c *core.Core) { held = c.ChallengeHolds(agent) || c.AgentOwner(agent) != "" })
		if held {
			return
		}
		m.forgetChallenged(agent)
		if err := m.agent.InvalidateRemote(agent); err != nil && !errors.Is(err, nixl.ErrRemoteUnknown) {
			m.log.Warn("unloading a challenged agent", zap.String("agent", agent), zap.Error(err))
		}
	}()
}

// endCheck ends a check beginCheck reserved and returns the REGISTER
// parked behind it (nil: none): the caller resumes it once its own answer
// is stepped, then lets its count in wg go.
func (m *Manager) endCheck(peer, agent string) *wire.Register {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	delete(m.checking, peer)
	delete(m.checking, "agent "+agent)
	return m.unpark(peer)
}

// bindRegister proves a REGISTER whose check beginCheck reserved
// (proveRegister), releases the reservation, then steps Registered or
// RegisterRefused — released first, so the sender's next REGISTER, sent
// once it has the answer, is not put off behind it — and last steps again
// the REGISTER that waited for the check, if one did (resume: after the
// answer, so a repeat of this registration is taken for one).
func (m *Manager) bindRegister(msg *wire.Register, lay core.PeerPlan) {
	defer m.wg.Done()
	name, err := m.proveRegister(msg, lay)
	next := m.endCheck(msg.From.Peer(), msg.Agent)
	if err != nil {
		m.refuseRegister(msg, err)
	} else {
		m.stepIn(core.Registered{From: msg.From, Remote: name, Plan: lay})
	}
	m.resume(next)
}

// proveRegister checks a REGISTER's claims again now that its rank and
// agent name are reserved (the name's owner may have changed since the
// control loop looked), loads its agent metadata and proves its memory —
// unless it repeats a proven registration whose remote is still loaded and
// usable, which is left as it is — and prepares its lists; it returns the
// remote's name.
func (m *Manager) proveRegister(msg *wire.Register, lay core.PeerPlan) (string, error) {
	err := m.checkClaims(msg)
	if err != nil {
		return "", err
	}
	name := msg.Agent
	if lay.Repeat && m.agent.RemoteUsable(name) {
		return name, nil
	}
	// The blob its challenge loaded is this very blob: not loaded again.
	if h := sha256.Sum256(msg.AgentMD); m.challengedWith(name) != h || !m.agent.RemoteUsable(name) {
		if name, err = m.agent.LoadRemote(msg.AgentMD); err != nil {
			return "", fmt.Errorf("agent metadata: %w", err)
		}
	}
	m.forgetChallenged(name) // bound or refused next: no longer a challenge's
	if err = m.checkProof(name, msg, lay.Layout); err != nil {
		// Nothing is written through a remote whose memory is not proven
		// the sender's. (A repeat's blob is the proven one: what a reload
		// maps is proven again all the same — a pid or a descriptor may
		// name another process by now.)
		m.agent.InvalidateRemote(name)
		return "", err
	}
	if err = m.pool.PreparePeer(name, lay.Layout); err != nil {
		// The peer's memory as its REGISTER describes it does not lie
		// inside what its metadata registered.
		return "", fmt.Errorf("preparing the peer's descriptor lists: %w", err)
	}
	return name, nil
}

// refuseRegister answers a REGISTER with its refusal.
func (m *Manager) refuseRegister(msg *wire.Register, err error) {
	notOwner := errors.Is(err, errNotOwner)
	m.stepIn(core.RegisterRefused{From: msg.From, Reason: err.Error(), NotOwner: notOwner})
}

// checkProof reads back the proof slots of the memory a REGISTER describes
// through the loaded remote agent and compares each with the value the
// REGISTER's seed gives for its sender and that region.
func (m *Manager) checkProof(remote string, msg *wire.Register, lay transfer.Layout) error {
	checks := proofRegions(lay)
	buf, err := m.proofBuffer(proofLen * len(checks))
	if err != nil {
		return fmt.Errorf("reading the ownership proofs: %w", err)
	}
	defer m.putProofBuffer(buf)
	clear(buf)
	m.regMu.Lock()
	hook := m.proofHook
	m.regMu.Unlock()
	if hook != nil {
		hook(msg)
	}
	for _, kind := range []nixl.MemKind{nixl.DRAM, nixl.VRAM} {
		var local, remoteSlots []nixl.Desc
		var idx []int
		for i, ck := range checks {
			if ck.kind != kind || ck.desc.Len == 0 {
				continue
			}
			// The slot must be in the region's own registration: read
			// through the same key and process as the writes.
			whole := ck.desc
			whole.Len += proofLen
			if !m.agent.RemoteContains(remote, kind, whole) {
				return fmt.Errorf("%w: %s (%v %#x, %d bytes) and its proof slot are not in one region the agent registered", errNotOwner, ck.what, kind, ck.desc.Addr, ck.desc.Len)
			}
			local = append(local, nixl.BytesDesc(buf[i*proofLen:(i+1)*proofLen]))
			remoteSlots = append(remoteSlots, ck.slot())
			idx = append(idx, len(idx))
		}
		if len(local) == 0 {
			continue
		}
		if err := m.readSlots(remote, kind, local, remoteSlots, idx); err != nil {
			return fmt.Errorf("%w: reading the proof slots (%v): %v", errNotOwner, kind, err)
		}
	}
	owner := msg.From.Peer()
	for i, ck := range checks {
		if ck.desc.Len == 0 {
			continue
		}
		if !hmac.Equal(buf[i*proofLen:(i+1)*proofLen], ck.value(msg.Proof, owner)) {
			return fmt.Errorf("%w: the proof slot after %s (%v %#x, %d bytes) does not hold %s's value for it: that memory is another process's",
				errNotOwner, ck.what, ck.kind, ck.desc.Addr, ck.desc.Len, owner)
		}
	}
	return nil
}

// proofBuffer returns a registered host buffer of at least n bytes for a
// read-back, from the free list or newly allocated: at most maxProofChecks
// are in use at once, so the list holds at most that many (each returned,
// none freed before Close).
func (m *Manager) proofBuffer(n int) ([]byte, error) {
	m.regMu.Lock()
	for i, b := range m.proofBufs {
		if cap(b) >= n {
			m.proofBufs = append(m.proofBufs[:i], m.proofBufs[i+1:]...)
			m.regMu.Unlock()
			return b[:n], nil
		}
	}
	m.regMu.Unlock()
	size := uint64(4096)
	for size < uint64(n) {
		size *= 2 // a few sizes, so the free list stays short
	}
	_, buf, err := m.agent.Alloc(size)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func (m *Manager) putProofBuffer(b []byte) {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	m.proofBufs = append(m.proofBufs, b[:cap(b)])
}

// readSlots reads remote proof slots into local host memory, one transfer.
func (m *Manager) readSlots(remote string, kind nixl.MemKind, local, slots []nixl.Desc, idx []int) error {
	lp, err := m.agent.PrepLocal(nixl.DRAM, local)
	if err != nil {
		return err
	}
	defer lp.Release()
	rp, err := m.agent.PrepRemote(remote, kind, slots)
	if err != nil {
		return err
	}
	defer rp.Release()
	x, err := m.agent.NewXfer(nixl.Read, lp, idx, rp, idx, nil)
	if err != nil {
		return err
	}
	defer m.agent.Release(x)
	if err := m.agent.Post(x); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.proofTimeout())
	defer cancel()
	st, err := m.agent.Wait(ctx, x)
	if st != nixl.Done {
		return fmt.Errorf("read %v: %v", st, err)
	}
	return nil
}

// callerSlotsFree refuses caller-given regions (those with an address)
// whose proof slot is not free: a region and the transfer.ProofBytes after
// it must share no byte with another such region and its slot — kvbridge
// writes the proof there, and the slot must still hold it when the rank
// registers again (a prefill rank's restart), after pages were written.
func callerSlotsFree(l transfer.Layout) error {
	var spans []kvlayout.Span
	var names []string
	add := func(name string, kind nixl.MemKind, d nixl.Desc) {
		if d.Addr == 0 || d.Len == 0 {
			return
		}
		spans = append(spans, kvlayout.Span{Kind: kind, Dev: d.Dev, Addr: uint64(d.Addr), Len: d.Len + transfer.ProofBytes})
		names = append(names, name)
	}
	for i, r := range l.Regions {
		add(fmt.Sprintf("KV region %d", i), l.Kind, r)
	}
	add("the aux region", nixl.DRAM, l.Aux)
	for i, st := range l.State {
		add(fmt.Sprintf("state region %d", i), nixl.DRAM, st.Desc)
	}
	if i, j, ok := kvlayout.Overlap(spans); ok {
		return fmt.Errorf("kvmanager: %s [%#x, +%d) and %s [%#x, +%d) overlap, counting the %d-byte ownership proof slot after each (transfer.ProofBytes): leave that much unused memory after every region",
			names[i], spans[i].Addr, spans[i].Len-transfer.ProofBytes, names[j], spans[j].Addr, spans[j].Len-transfer.ProofBytes, transfer.ProofBytes)
	}
	return nil
}
