package core

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
)

// Pull rooms in the simulator (docs/PROTOCOL.md "Pull"). A decode process
// reads what a prefill process published (EffectRead): each read is posted
// through its gate (ReadPosting), then completes (ok; failed and quiesced;
// failed but still able to read and land, as a ghost; stalled past the
// stall deadline), or fails quiesced when the prefill process is gone. A
// read takes its data from the prefill process's source pages while it is
// posted and unfinished, and puts it into the decode process's pages.
//
// Checked after every event, against the simulator's own record (srel:
// when each prefill process released each room's source pages):
//
//	P1 a prefill process releases a room's source pages only when no read
//	   of them is posted and unfinished, and none waiting for its gate could
//	   still pass it (its lease not ended, its room live);
//	P2 no read is posted, and none completes or lands, after its source
//	   pages were released;
//	P3 a decode process releases a room's pages only when no read into
//	   them is posted and unfinished (noWriteCanLand);
//	P4 a source is released twice never;
//	P5 a read is posted only before the lease its prefill process holds
//	   for the decode process ended (the simulator has one clock).

// simPullLease is every core's lease (prefill: the lease it grants;
// decode: the renewal basis), below the stall deadline.
const simPullLease = 4 * time.Second

type simRead struct {
	id       int
	dSlot    int
	dInc     int
	pInc     int
	room     uint64
	rd       *Read
	posted   bool
	postedAt time.Time
	ghost    bool // its completion was reported failed, but it may still read and land
	landed   bool
}

// addRead records a read a decode process asked for.
func (w *simWorld) addRead(slot int, p *simProc, e Effect) {
	w.nextRead++
	w.reads = append(w.reads, simRead{id: w.nextRead, dSlot: slot, dInc: p.inc, pInc: incOf(e.Read.Epoch), room: e.Room, rd: e.Read})
	w.cov.hit("read asked")
}

func (w *simWorld) removeRead(id int) simRead {
	for i, r := range w.reads {
		if r.id == id {
			w.reads = append(w.reads[:i], w.reads[i+1:]...)
			return r
		}
	}
	panic("no such read")
}

// srcReleased: the prefill process pInc released room's source pages.
func (w *simWorld) srcReleased(pInc int, room uint64) bool {
	_, ok := w.srel[[2]int{pInc, int(room)}]
	return ok
}

// landRead puts a read's data into its decode process's pages (P2: the
// source must still be held).
func (w *simWorld) landRead(r simRead) {
	if w.srcReleased(r.pInc, r.room) {
		w.fail("room %d: read %d of prefill process %d's pages landed after that process released them", r.room, r.id, r.pInc)
		return
	}
	if rel, ok := w.rel[[2]int{r.dInc, int(r.room)}]; ok {
		w.fail("room %d: read %d landed in decode process %d's pages after they were released (forced %v)", r.room, r.id, r.dInc, rel.forced)
		return
	}
	w.got = maps.Clone(w.got)
	if w.got == nil {
		w.got = map[simCell]bool{}
	}
	src := w.incSlot[r.pInc]
	for _, wr := range r.rd.Writes {
		if wr.AuxSrc >= 0 || wr.State >= 0 {
			continue
		}
		lo, hi := wr.Layers.Lo, wr.Layers.Hi
		if hi == 0 {
			lo, hi = 0, simLayers
		}
		for _, run := range wr.Runs {
			for i := uint32(0); i < run.Len; i++ {
				for l := lo; l < hi; l++ {
					w.got[simCell{dInc: r.dInc, src: src, room: r.room, page: run.Dst + i, layer: l}] = true
				}
			}
		}
	}
}

// markBadRead records the pages and layers of a read that landed
// corrupted.
func (w *simWorld) markBadRead(r simRead) {
	for _, wr := range r.rd.Writes {
		if wr.AuxSrc >= 0 || wr.State >= 0 {
			continue
		}
		w.markBad(simWrite{dstInc: r.dInc, srcInc: r.pInc, room: r.room, pages: unitsOf(wr.Runs), layers: wr.Layers})
	}
}

// unitsOf lists the destination units of runs.
func unitsOf(runs []kvlayout.Run) []uint32 {
	var out []uint32
	for _, run := range runs {
		for i := uint32(0); i < run.Len; i++ {
			out = append(out, run.Dst+i)
		}
	}
	return out
}

// readDone reports a read's end to its decode process, if it still runs.
func (w *simWorld) readDone(r simRead, err error, quiesced bool) {
	w.readDoneCorrupt(r, err, quiesced, "")
}

// readDoneCorrupt is readDone with the decode shell's digest check's
// finding (corrupt: what did not match).
func (w *simWorld) readDoneCorrupt(r simRead, err error, quiesced bool, corrupt string) {
	d := w.procs[r.dSlot]
	if d.inc != r.dInc || d.dead {
		return
	}
	st, live := d.core.Status(r.room)
	checked := false
	if err == nil && corrupt == "" && live && !st.Terminal() {
		corrupt, checked = w.digestCheck(r.rd.Notif) // (the shell checks a live room's only)
	}
	d.core.Step(w.now, ReadDone{Room: r.room, Read: r.rd, Err: err, Quiesced: quiesced, Corrupt: corrupt, Checked: checked})
	if corrupt != "" && !st.Terminal() {
		if now, live := d.core.Status(r.room); live && now != Failed {
			w.fail("room %d: %s took a read whose pages do not match their digest (%s) and is %v", r.room, d.from.Peer(), corrupt, now)
		}
		w.cov.hit("digest mismatch failed its room (read)")
	}
	w.effects(r.dSlot)
}

// readEvents: the pull data plane's events.
func (w *simWorld) readEvents(add func(string, func(*simWorld))) {
	for _, r := range w.reads {
		id := r.id
		if r.ghost {
			add(fmt.Sprintf("late read %d", id), func(w *simWorld) {
				w.cov.hit("failed read landed")
				w.landRead(w.removeRead(id))
			})
			continue
		}
		if !w.active(r.dSlot) {
			continue // its pool is paused (a dead one's reads are ghosts)
		}
		if !r.posted {
			add(fmt.Sprintf("post read %d", id), func(w *simWorld) { w.postRead(id) })
			continue
		}
		if p := w.procs[w.incSlot[r.pInc]]; (p.inc != r.pInc || p.dead) && !r.landed {
			add(fmt.Sprintf("read %d fails quiesced (prefill gone)", id), func(w *simWorld) {
				w.cov.hit("read from a gone process failed")
				w.readDone(w.removeRead(id), errors.New("remote agent gone"), true)
			})
			continue
		}
		if !w.calm && !r.landed && r.rd.Notif.Digests != nil && w.corrupts < w.cfg.corruptWrites {
			add(fmt.Sprintf("read %d lands corrupted", id), func(w *simWorld) {
				w.corrupts++
				r := w.removeRead(id)
				w.landRead(r)
				w.markBadRead(r)
				w.cov.hit("read landed corrupted")
				w.readDoneCorrupt(r, nil, true, "position 0: CRC-32C 0badbad0, the prefill rank's digest 00000000")
			})
		}
		add(fmt.Sprintf("read %d ok", id), func(w *simWorld) {
			r := w.removeRead(id)
			if !r.landed {
				w.landRead(r)
			}
			w.cov.hit("read ok")
			w.readDone(r, nil, true)
		})
		if w.calm || r.landed || w.cfg.writesOK {
			continue
		}
		add(fmt.Sprintf("read %d fails quiesced", id), func(w *simWorld) {
			w.cov.hit("read failed")
			w.readDone(w.removeRead(id), errors.New("refused by the engine"), true)
		})
		if w.cfg.mayLand {
			add(fmt.Sprintf("read %d fails but may land", id), func(w *simWorld) {
				for i := range w.reads {
					if w.reads[i].id == id {
						w.reads[i].ghost = true
						w.cov.hit("read failed, may land")
						w.readDone(w.reads[i], errors.New("transport error"), false)
						return
					}
				}
			})
		}
	}
}

// postRead gates and posts a read (P2: its source still held).
func (w *simWorld) postRead(id int) {
	i := slices.IndexFunc(w.reads, func(r simRead) bool { return r.id == id })
	r := w.reads[i]
	d := w.procs[r.dSlot]
	ok := d.core.Step(w.now, ReadPosting{Room: r.room, Read: r.rd}).OK
	w.effects(r.dSlot)
	if !ok {
		w.cov.hit("read refused at its gate")
		w.removeRead(id)
		return
	}
	if w.srcReleased(r.pInc, r.room) {
		w.fail("room %d: read %d posted after prefill process %d released its pages", r.room, id, r.pInc)
	}
	if st, _ := d.core.Status(r.room); st.Terminal() {
		w.fail("room %d: %s posted a read in %v", r.room, d.from.Peer(), st)
	}
	// P5: within the lease the prefill process holds for this decode
	// process (one clock here: the margin is not needed, the order is).
	if p := w.procs[w.incSlot[r.pInc]]; p.inc == r.pInc && !p.dead {
		if h := p.core.pulls[r.room]; h != nil {
			for _, pp := range h.peers {
				if pp.epoch == epochOf(r.dInc) && w.now.After(pp.leaseEnd) {
					w.fail("room %d: read %d posted at %v, after prefill process %d's lease for it ended (%v)", r.room, id, w.now, r.pInc, pp.leaseEnd)
				}
			}
		}
	}
	i = slices.IndexFunc(w.reads, func(r simRead) bool { return r.id == id })
	w.reads[i].posted, w.reads[i].postedAt = true, w.now
	w.cov.hit("read posted")
}

// tickReads: the pool reports a read unfinished past the stall deadline as
// failed (it may still land); a paused pool's reads land all the same by
// simWriteLife; no read lands later than that after its post.
func (w *simWorld) tickReads() {
	for i := range w.reads {
		if r := w.reads[i]; r.posted && !r.ghost && !r.landed && w.now.Sub(r.postedAt) > w.cfg.reg.StallTimeout && w.active(r.dSlot) {
			w.reads[i].ghost = true
			w.cov.hit("read stalled")
			w.readDone(w.reads[i], errors.New("stalled"), false)
		}
	}
	for i := range w.reads {
		if r, p := w.reads[i], w.procs[w.incSlot[w.reads[i].pInc]]; r.posted && !r.ghost && !r.landed && w.now.Sub(r.postedAt) > simWriteLife && p.inc == r.pInc && !p.dead {
			w.reads[i].landed = true
			w.cov.hit("read landed while its pool was paused")
			w.landRead(r)
		}
	}
	w.reads = slices.DeleteFunc(w.reads, func(r simRead) bool {
		return r.ghost && r.posted && w.now.Sub(r.postedAt) > simWriteLife
	})
}

// killReads: a killed decode process's posted reads may still land (the
// NIC finishes them); those it had not posted are gone.
func (w *simWorld) killReads(inc int) {
	w.reads = slices.DeleteFunc(w.reads, func(r simRead) bool { return r.dInc == inc && !r.posted })
	for i := range w.reads {
		if w.reads[i].dInc == inc {
			w.reads[i].ghost = true
		}
	}
}

// sourceReleased checks a prefill process's release of a pull room's
// source pages (P1, P4).
func (w *simWorld) sourceReleased(p *simProc, e Effect) {
	key := [2]int{p.inc, int(e.Room)}
	if _, again := w.srel[key]; again {
		w.fail("room %d: %s released its source pages twice", e.Room, p.from.Peer())
	}
	for _, r := range w.reads {
		if r.pInc != p.inc || r.room != e.Room {
			continue
		}
		d := w.procs[r.dSlot]
		switch {
		case r.posted && !r.landed:
			w.fail("room %d: %s released its source pages (forced %v) while read %d of them is in flight (ghost %v)", e.Room, p.from.Peer(), e.Forced, r.id, r.ghost)
		case !r.posted && w.now.Before(r.rd.Until) && d.inc == r.dInc && !d.dead:
			if st, live := d.core.Status(e.Room); live && !st.Terminal() {
				w.fail("room %d: %s released its source pages (forced %v) while read %d may still pass its gate (lease until %v)", e.Room, p.from.Peer(), e.Forced, r.id, r.rd.Until)
			}
		}
	}
	if e.Forced {
		w.cov.hit("source released forced")
	} else {
		w.cov.hit("source released")
	}
	w.srel = maps.Clone(w.srel)
	if w.srel == nil {
		w.srel = map[[2]int]time.Time{}
	}
	w.srel[key] = w.now
}

// noReadCanLand: P3, no decode page released while a read into it can
// land.
func (w *simWorld) noReadCanLand(p *simProc, room uint64) {
	for _, r := range w.reads {
		if r.dInc == p.inc && r.room == room && r.posted && !r.landed {
			w.fail("room %d: %s released its pages while read %d can still land", room, p.from.Peer(), r.id)
		}
	}
}

// isPull reports whether room is a pull room of the configuration.
func (w *simWorld) isPull(room uint64) bool {
	for _, r := range w.rooms {
		if r.id == room {
			return r.pull
		}
	}
	return false
}

// simPullRoom is a pull room.
func simPullRoom(id uint64, decodes, prefills []int, chunks int) simRoomSpec {
	r := simRoom(id, decodes, prefills, chunks)
	r.pull = true
	return r
}
