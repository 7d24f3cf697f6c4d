package kvmanager

// Memory proven to its owner. A REGISTER describes memory by addresses and
// transport keys that are not secrets: a UCX worker address names a
// process by its pid (cma) and its shared-memory segments by id (posix,
// sysv), a tcp address names whatever listens there. A rank holding only its
// own certificate could describe another decode process's memory as its
// own and have a prefill rank write into it. So each rank writes a random
// proof (32 bytes, one per process) into the slot after each region it
// registers (transfer.ProofBytes), and sends the proof in its REGISTER,
// sealed to the prefill rank; the prefill rank reads every slot back through
// the data plane — through the same registered region, key and process as
// its writes to that region will go — and binds the registration only if
// each holds that proof. Memory of another process holds that process's
// proof (or nothing the registering rank chose): refused, not_owner. The
// agent name a REGISTER's blob carries must be its own too: a name another
// decode rank registered would replace that rank's remote agent here.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/gpu"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
)

// proofLen is the proof's size (it sits at the start of its slot).
const proofLen = 32

// proofTimeout bounds the read of a REGISTER's proof slots.
const proofTimeout = 5 * time.Second

// errNotOwner: a REGISTER's memory is not proven its sender's.
var errNotOwner = errors.New("memory not proven the registering process's (not_owner)")

// slotsOf lists the proof slots after a layout's regions: KV regions (of
// the layout's kind), aux and state (host memory).
func slotsOf(l transfer.Layout) (host, device []nixl.Desc) {
	slot := func(d nixl.Desc) nixl.Desc {
		return nixl.Desc{Addr: d.Addr + uintptr(d.Len), Len: proofLen, Dev: d.Dev}
	}
	for _, r := range l.Regions {
		if l.Kind == nixl.VRAM {
			device = append(device, slot(r))
		} else {
			host = append(host, slot(r))
		}
	}
	if l.Aux.Len > 0 {
		host = append(host, slot(l.Aux))
	}
	for _, st := range l.State {
		host = append(host, slot(st.Desc))
	}
	return host, device
}

// writeProof writes this process's proof into the slot after each region
// (device memory through the CUDA driver).
func (m *Manager) writeProof(l transfer.Layout) error {
	host, device := slotsOf(l)
	for _, d := range host {
		copy(nixl.HostBytes(d), m.proof[:])
	}
	if len(device) == 0 {
		return nil
	}
	drv, err := gpu.OpenDriver()
	if err != nil {
		return fmt.Errorf("kvmanager: writing the ownership proof into device memory: %w", err)
	}
	ctxs := map[uint64]*gpu.Context{}
	defer func() {
		for _, c := range ctxs {
			c.Release()
		}
	}()
	for _, d := range device {
		c := ctxs[d.Dev]
		if c == nil {
			if c, err = drv.Primary(int(d.Dev)); err != nil {
				return fmt.Errorf("kvmanager: writing the ownership proof into device %d: %w", d.Dev, err)
			}
			ctxs[d.Dev] = c
		}
		if err := c.CopyHtoD(gpu.DevicePtr(d.Addr), m.proof[:]); err != nil {
			return fmt.Errorf("kvmanager: writing the ownership proof at %#x on device %d: %w", d.Addr, d.Dev, err)
		}
	}
	return nil
}

// proofBuffer returns a registered host buffer of at least n bytes for the
// read-back (m.proofMu held).
func (m *Manager) proofBuffer(n int) ([]byte, error) {
	if len(m.proofBuf) < n {
		_, buf, err := m.agent.Alloc(uint64(max(n, 4096)))
		if err != nil {
			return nil, err
		}
		m.proofBuf = buf
	}
	return m.proofBuf[:n], nil
}

// checkClaims refuses, before its metadata is loaded, a REGISTER without
// a proof, whose blob names another agent than the REGISTER does, or an
// agent another decode rank registered here.
func (m *Manager) checkClaims(msg *bootstrap.Register) error {
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
	m.read(func(c *Core) { owner = c.AgentOwner(name) })
	if owner != "" && owner != msg.From.Peer() {
		return fmt.Errorf("%w: agent %q is registered here by %s", errNotOwner, name, owner)
	}
	return nil
}

// checkProof reads back the proof slots of the memory a REGISTER describes
// through the loaded remote agent and compares each with the REGISTER's
// proof.
func (m *Manager) checkProof(remote string, msg *bootstrap.Register, lay transfer.Layout) error {
	type check struct {
		what string
		kind nixl.MemKind
		desc nixl.Desc // the region
	}
	var checks []check
	for i, r := range lay.Regions {
		checks = append(checks, check{fmt.Sprintf("kv[%d]", i), lay.Kind, r})
	}
	if lay.Aux.Len > 0 {
		checks = append(checks, check{"aux[0]", nixl.DRAM, lay.Aux})
	}
	for i, st := range lay.State {
		checks = append(checks, check{fmt.Sprintf("state[%d]", i), nixl.DRAM, st.Desc})
	}
	m.proofMu.Lock()
	defer m.proofMu.Unlock()
	buf, err := m.proofBuffer(proofLen * len(checks))
	if err != nil {
		return fmt.Errorf("reading the ownership proofs: %w", err)
	}
	clear(buf)
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
			remoteSlots = append(remoteSlots, nixl.Desc{Addr: whole.Addr + uintptr(ck.desc.Len), Len: proofLen, Dev: ck.desc.Dev})
			idx = append(idx, len(idx))
		}
		if len(local) == 0 {
			continue
		}
		if err := m.readSlots(remote, kind, local, remoteSlots, idx); err != nil {
			return fmt.Errorf("%w: reading the proof slots (%v): %v", errNotOwner, kind, err)
		}
	}
	for i, ck := range checks {
		if ck.desc.Len == 0 {
			continue
		}
		if !bytes.Equal(buf[i*proofLen:(i+1)*proofLen], msg.Proof) {
			return fmt.Errorf("%w: the proof slot after %s (%v %#x, %d bytes) does not hold the REGISTER's proof: that memory is another process's",
				errNotOwner, ck.what, ck.kind, ck.desc.Addr, ck.desc.Len)
		}
	}
	return nil
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
	ctx, cancel := context.WithTimeout(m.ctx, proofTimeout)
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
	var spans []transfer.Span
	var names []string
	add := func(name string, kind nixl.MemKind, d nixl.Desc) {
		if d.Addr == 0 || d.Len == 0 {
			return
		}
		spans = append(spans, transfer.Span{Kind: kind, Dev: d.Dev, Addr: uint64(d.Addr), Len: d.Len + transfer.ProofBytes})
		names = append(names, name)
	}
	for i, r := range l.Regions {
		add(fmt.Sprintf("KV region %d", i), l.Kind, r)
	}
	add("the aux region", nixl.DRAM, l.Aux)
	for i, st := range l.State {
		add(fmt.Sprintf("state region %d", i), nixl.DRAM, st.Desc)
	}
	if i, j, ok := transfer.Overlap(spans); ok {
		return fmt.Errorf("kvmanager: %s [%#x, +%d) and %s [%#x, +%d) overlap, counting the %d-byte ownership proof slot after each (transfer.ProofBytes): leave that much unused memory after every region",
			names[i], spans[i].Addr, spans[i].Len-transfer.ProofBytes, names[j], spans[j].Addr, spans[j].Len-transfer.ProofBytes, transfer.ProofBytes)
	}
	return nil
}
