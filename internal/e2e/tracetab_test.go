package e2e

import (
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/internal/rankhooks"
)

// traceTab records rooms' trace points without a lock. The ranks call
// their Trace hook on hot paths (a step's effects carried out, a chunk
// handed to the pool); a mutex there parks them whenever a thousand
// rooms' goroutines trace at once, and so delays the very steps whose
// latency is measured. Rooms come in chunks of 1,024 made on first use
// (ids up to traceRooms; others are not traced), each room's points in
// slots as Unix nanoseconds.
type traceTab struct {
	chunks [traceRooms / 1024]atomic.Pointer[[1024]roomTrace]
}

const traceRooms = 1 << 18

// The slots: rankhooks' events 1 to 8, and the benchmark's appReady.
const traceSlots = 10

type roomTrace [traceSlots]atomic.Int64

func traceSlot(ev rankhooks.Event) int {
	switch {
	case ev >= rankhooks.Request && ev <= rankhooks.Woken:
		return int(ev)
	case ev == appReady:
		return traceSlots - 1
	}
	return -1
}

var traceEvents = []rankhooks.Event{rankhooks.Request, rankhooks.FirstPost, rankhooks.LastNotif, rankhooks.Success,
	rankhooks.Landed, rankhooks.Submitted, rankhooks.Taken, rankhooks.Woken, appReady}

// record sets room's point ev to at (its first only, if first).
func (t *traceTab) record(room uint64, ev rankhooks.Event, at time.Time, first bool) {
	s := traceSlot(ev)
	if room >= traceRooms || s < 0 {
		return
	}
	c := &t.chunks[room/1024]
	p := c.Load()
	if p == nil {
		c.CompareAndSwap(nil, new([1024]roomTrace))
		p = c.Load()
	}
	slot := &p[room%1024][s]
	if first {
		slot.CompareAndSwap(0, at.UnixNano())
	} else {
		slot.Store(at.UnixNano())
	}
}

// reset forgets every point.
func (t *traceTab) reset() {
	for i := range t.chunks {
		t.chunks[i].Store(nil)
	}
}

// snapshot returns every traced room's points (read once the rooms ran).
func (t *traceTab) snapshot() map[uint64]map[rankhooks.Event]time.Time {
	out := map[uint64]map[rankhooks.Event]time.Time{}
	for ci := range t.chunks {
		p := t.chunks[ci].Load()
		if p == nil {
			continue
		}
		for ri := range p {
			var m map[rankhooks.Event]time.Time
			for _, ev := range traceEvents {
				if v := p[ri][traceSlot(ev)].Load(); v != 0 {
					if m == nil {
						m = map[rankhooks.Event]time.Time{}
					}
					m[ev] = time.Unix(0, v)
				}
			}
			if m != nil {
				out[uint64(ci*1024+ri)] = m
			}
		}
	}
	return out
}
