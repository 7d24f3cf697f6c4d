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
	items []inboxItem
	bytes int
}

func (q *peerQueue) len() int { return len(q.items) }

// inbox is the receive goroutine's alone: no lock.
type inbox struct {
	queues map[inboxKey]*peerQueue
	ring   []inboxKey // ranks with messages waiting, in serving order
	total  int
	bytes  int
	// last: the queue the last push went to (a batch is mostly one
	// rank's: no map look-up then).
	lastKey inboxKey
	last    *peerQueue
}

func newInbox() *inbox {
	return &inbox{queues: map[inboxKey]*peerQueue{}}
}

// push queues it for key's rank; false when a bound is reached (dropped).
func (b *inbox) push(key inboxKey, it inboxItem) bool {
	q := b.last
	if q == nil || key != b.lastKey {
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
		q = &peerQueue{}
		b.queues[key] = q
		b.ring = append(b.ring, key)
	}
	q.items = append(q.items, it)
	q.bytes += it.size
	b.total++
	b.bytes += it.size
	b.lastKey, b.last = key, q
	return true
}

// waiting reports whether any message waits.
func (b *inbox) waiting() bool { return b.total > 0 }

// pop takes the next rank's first message and puts the rank at the back
// of the ring if it has more; false when nothing waits.
func (b *inbox) pop() (inboxItem, bool) {
	if len(b.ring) == 0 {
		return inboxItem{}, false
	}
	key := b.ring[0]
	b.ring = b.ring[1:]
	q := b.queues[key]
	it := q.items[0]
	q.items[0] = inboxItem{}
	q.items = q.items[1:] // (an append copies only what still waits: no array grows for good)
	q.bytes -= it.size
	b.total--
	b.bytes -= it.size
	if q.len() > 0 {
		b.ring = append(b.ring, key)
	} else {
		delete(b.queues, key)
		if b.last == q {
			b.last = nil
		}
	}
	if len(b.ring) == 0 {
		b.ring = nil // let a long ring's array go
	}
	return it, true
}

// serve hands waiting messages to the Handler, one rank at a time in
// turn, until none waits or the budget is spent (receive goroutine).
func (l *Loop) serve() {
	deadline := time.Now().Add(serveBudget)
	for {
		it, ok := l.inbox.pop()
		if !ok {
			return
		}
		l.handle(it)
		if !time.Now().Before(deadline) {
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
