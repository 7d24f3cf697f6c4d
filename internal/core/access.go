package core

import (
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// What the shell reads of the core besides Step's results: each is a
// read under the shell's lock, none changes what the core decides.

// Pending says whether a live room's done and ready waiters are still to
// be woken (by an EffectWake of WakeDone and WakeReady); ok is false for a
// room that is not live.
func (c *Core) Pending(room uint64) (done, ready, ok bool) { return c.pending(room) }

// Tombstone returns the kind and reason of a room's tombstone, if one is
// kept at now (an expired one is dropped).
func (c *Core) Tombstone(room uint64, now time.Time) (kind Tombstone, reason string, ok bool) {
	t, ok := c.reg.tomb(room, now)
	if !ok {
		return 0, "", false
	}
	return t.kind, t.reason, true
}

// RoomSizes counts the room table's rooms, pending requests and
// tombstones.
func (c *Core) RoomSizes() Sizes { return c.reg.Sizes() }

// Tables returns the live rooms per status, the writes in flight and the
// tombstone and pending tables' lengths.
func (c *Core) Tables() (counts map[Poll]int, inflight, tombs, pending int) {
	return c.reg.Counts(), c.reg.InFlightTotal(), len(c.reg.tombs), len(c.reg.pending)
}

// Overdue counts live rooms past their deadline at now.
func (c *Core) Overdue(now time.Time) int { return c.reg.Overdue(now) }

// InFlight returns a room's posted writes not yet completed.
func (c *Core) InFlight(room uint64) int { return c.reg.InFlight(room) }

// RoomTimes returns when a live room started (its sender's or receiver's
// first step) and when it first entered each status.
func (c *Core) RoomTimes(room uint64) (started time.Time, entered [Success + 1]time.Time, ok bool) {
	rm := c.reg.rooms[room]
	switch {
	case rm == nil:
		return started, entered, false
	case rm.dec != nil:
		started = rm.dec.started
	default:
		started = rm.pre.started
	}
	return started, rm.entered, true
}

// RegionsOf is a layout's regions as a REGISTER names them.
func RegionsOf(l kvlayout.Layout) (kv, aux, state []wire.Region) {
	kind := wire.MemDRAM
	if l.Kind == mem.VRAM {
		kind = wire.MemVRAM
	}
	for _, r := range l.Regions {
		kv = append(kv, wire.Region{Addr: uint64(r.Addr), Len: r.Len, ItemLen: l.PageBytes, Dev: int(r.Dev), Mem: kind})
	}
	if l.Aux.Len > 0 {
		aux = append(aux, wire.Region{Addr: uint64(l.Aux.Addr), Len: l.Aux.Len, ItemLen: l.AuxItemBytes, Mem: wire.MemDRAM})
	}
	state = []wire.Region{}
	for _, st := range l.State {
		state = append(state, wire.Region{Addr: uint64(st.Addr), Len: st.Len, ItemLen: st.ItemBytes, Mem: wire.MemDRAM})
	}
	return kv, aux, state
}

// Config returns the configuration the core was made with (a decode
// core's holds the REGISTER it sends).
func (c *Core) Config() CoreConfig { return c.cfg }

// Initable reports whether room is a live decode room whose REQUEST has
// not been asked for yet (InitReceiver would apply).
func (c *Core) Initable(room uint64) bool { return c.decodeCore != nil && c.decodeCore.initable(room) }

// WriteSource returns a live decode room's request and the link of its
// source uid (what the shell's write check computes the pieces of a
// notification from); ok false when there is no such room or source.
func (c *Core) WriteSource(room uint64, uid int) (spec RequestSpec, l Link, ok bool) {
	if c.decodeCore == nil {
		return spec, l, false
	}
	return c.decodeCore.writeSource(room, uid)
}
