package control

import (
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// The inbox: received messages wait here, one queue per sending rank
// (role, instance and rank: under per-rank identity its certificate's, so
// a rank gets one turn and one backlog however many endpoints it uses),
// and the receive goroutine hands them to the Handler round-robin over the
// ranks that have some, between its reads (issue 49 item 3). Every message
// read is checked and admitted first — a PING answered at once, a PONG's
// peer noted alive —, then the inbox is served for at most serveBudget
// before the next read, which does not wait while messages remain. So a
// heartbeat waits behind at most one budget of handling, one rank's flood
// delays another rank's message by at most one message of its own per
// round, and with no backlog a message is handled right after it is read,
// on the same goroutine (no hand-off: the round trip stays as it was).
//
// Bounds: maxPeerBacklog messages and maxPeerBytes of them per sending
// rank, and maxBacklog messages and maxBytes in all, past which only a
// rank with fewer than fairBacklog messages waiting gets in (so ranks that
// fill the inbox cannot lock out one that sends a few; at most
// 2 × maxBacklog messages and 2 × maxBytes wait). A message counts its
// frames' bytes (at most MaxBodySize and its envelope): bounded by count
// alone, 8,192 messages of 16 MiB from one rank could hold 128 GiB. A
// message past the bounds is dropped and counted
// (Stats.Backlogged, kvbridge_control_backlog_dropped_total): the protocol
// survives a lost control message (retries, deadlines), and it is the
// flooding rank's. Messages still waiting when the loop closes are dropped
// with it (their rooms fail as the rank closes).
const (
	maxPeerBacklog = 1 << 13
	maxBacklog     = 1 << 16
	fairBacklog    = 64
	maxPeerBytes   = 64 << 20  // four messages of MaxBodySize
	maxBytes       = 256 << 20 // (a rank's fair share past it: fairBacklog messages, up to 2 × maxBytes in all)
	// serveBudget: how long the receive goroutine hands messages to the
	// Handler before it reads again (a handler call in progress finishes).
	serveBudget = time.Millisecond
)

// inboxItem is one message for the Handler, or a malformed REQUEST's
// report for OnMalformedRequest.
type inboxItem struct {
	m    wire.Message
	mr   *MalformedReport
	size int // the message's frames' bytes (the inbox's byte bounds)
}

// inboxKey names a sending rank (a malformed REQUEST's report: its
// endpoint, in instance, with no role).
type inboxKey struct {
	role, instance string
	rank           int
}

// peerQueue is one sending rank's messages, in the order they came.
type peerQueue struct {
	key    inboxKey
	items  fifo[inboxItem]
	bytes  int
	queued bool // in the inbox's ring
}

func (q *peerQueue) len() int { return q.items.len() }

// inbox is the receive goroutine's alone: no lock.
type inbox struct {
	queues map[inboxKey]*peerQueue // the ranks with messages waiting, and last
	ring   fifo[*peerQueue]        // the ranks with messages waiting, in serving order
	total  int
	bytes  int
	// last: the queue the last push went to (a batch is mostly one
	// rank's: no map look-up then), kept while it empties and fills
	// again, and forgotten when a push names another rank.
	lastKey inboxKey
	last    *peerQueue
	// spare: queues emptied and forgotten, with their arrays, for the
	// next ranks that send (at most keptQueues).
	spare []*peerQueue
}

const keptQueues = 16

func newInbox() *inbox {
	return &inbox{queues: map[inboxKey]*peerQueue{}}
}

// push queues it for key's rank; false when a bound is reached (dropped).
func (b *inbox) push(key inboxKey, it inboxItem) bool {
	q := b.last
	if q == nil || key != b.lastKey {
		b.forgetLast()
		q = b.queues[key]
	}
	n, nb := 0, 0
	if q != nil {
		n, nb = q.len(), q.bytes
	}
	full := b.total >= maxBacklog || b.bytes+it.size > maxBytes
	if n >= maxPeerBacklog || nb+it.size > maxPeerBytes ||
		(full && (n >= fairBacklog || b.total >= 2*maxBacklog || b.bytes+it.size > 2*maxBytes)) {
		return false
	}
	if q == nil {
		if k := len(b.spare); k > 0 {
			q, b.spare = b.spare[k-1], b.spare[:k-1]
			q.key = key
		} else {
			q = &peerQueue{key: key}
		}
		b.queues[key] = q
	}
	if !q.queued {
		q.queued = true
		b.ring.push(q)
	}
	q.items.push(it)
	q.bytes += it.size
	b.total++
	b.bytes += it.size
	b.lastKey, b.last = key, q
	return true
}

// forgetLast drops the memo of the last push's queue, and the queue with
// it when nothing of its rank waits.
func (b *inbox) forgetLast() {
	if b.last != nil && !b.last.queued {
		b.drop(b.last)
	}
	b.last = nil
}

// drop forgets q, whose rank has nothing waiting, keeping it spare.
func (b *inbox) drop(q *peerQueue) {
	delete(b.queues, q.key)
	if len(b.spare) < keptQueues {
		q.key = inboxKey{}
		b.spare = append(b.spare, q)
	}
}

// waiting reports whether any message waits.
func (b *inbox) waiting() bool { return b.total > 0 }

// pop takes the next rank's first message and puts the rank at the back
// of the ring if it has more; false when nothing waits.
func (b *inbox) pop() (inboxItem, bool) {
	if b.ring.len() == 0 {
		return inboxItem{}, false
	}
	q := b.ring.pop()
	it := q.items.pop()
	q.bytes -= it.size
	b.total--
	b.bytes -= it.size
	if q.len() > 0 {
		b.ring.push(q)
	} else {
		q.queued = false
		if q != b.last {
			b.drop(q)
		}
	}
	return it, true
}

// fifo is a queue on one array, so a steady stream through it allocates
// nothing: a slot is cleared as it is taken, and a push into a full array
// whose first half was taken moves what waits to the front instead of
// growing it. The array holds what waits, not what passed: at most
// keptFIFO slots or 8 × what waits (a take that leaves less than an
// eighth of a larger array waiting moves it to one of twice that, or
// keptFIFO slots), and once empty it is let go past keptFIFO slots.
type fifo[T any] struct {
	s    []T
	head int
}

const keptFIFO = 1024

func (f *fifo[T]) len() int { return len(f.s) - f.head }

func (f *fifo[T]) push(v T) {
	if len(f.s) == cap(f.s) && f.head > 0 && 2*f.head >= len(f.s) {
		n := copy(f.s, f.s[f.head:])
		clear(f.s[n:])
		f.s, f.head = f.s[:n], 0
	}
	f.s = append(f.s, v)
}

// pop takes the first; the fifo must not be empty.
func (f *fifo[T]) pop() T {
	var zero T
	v := f.s[f.head]
	f.s[f.head] = zero
	if f.head++; f.head == len(f.s) {
		f.s, f.head = f.s[:0], 0
		if cap(f.s) > keptFIFO {
			f.s = nil
		}
	} else if n := len(f.s) - f.head; cap(f.s) > keptFIFO && 8*n < cap(f.s) {
		s := make([]T, n, max(2*n, keptFIFO))
		copy(s, f.s[f.head:])
		f.s, f.head = s, 0
	}
	return v
}

// serve hands waiting messages to the Handler, one rank at a time in
// turn, until none waits or the budget is spent (receive goroutine).
func (l *Loop) serve() {
	start := time.Now()
	for {
		it, ok := l.inbox.pop()
		if !ok {
			return
		}
		l.handle(it)
		if time.Since(start) >= serveBudget { // the monotonic clock alone: one reading, not two
			return
		}
	}
}

// handle hands one item to the Handler (or OnMalformedRequest).
func (l *Loop) handle(it inboxItem) {
	if it.mr != nil {
		l.cfg.OnMalformedRequest(*it.mr)
		return
	}
	l.cfg.Handler(it.m)
}
