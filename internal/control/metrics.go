package control

import (
	"strconv"
	"sync/atomic"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// Send drop reasons.
const (
	DropQueueFull = "queue_full" // the hand-off queue to the send goroutine was full
	DropPeerBusy  = "peer_busy"  // the peer's socket reached its high-water mark
	DropNoKey     = "no_key"     // security is on and the peer's server key is unknown
	DropError     = "error"      // ZeroMQ refused the send for another reason
	// DropUnknownPeer: a PONG to an endpoint this rank never addressed
	// (answering would open a socket to whatever a PING claims).
	DropUnknownPeer = "unknown_peer"
	// DropTooManyPeers: MaxPeers sockets are open and all are watched.
	DropTooManyPeers = "too_many_peers"
	// DropNoIdentity: per-rank identity is on and the peer's certificate
	// is not known (or not valid), so the message cannot be addressed.
	DropNoIdentity = "no_identity"
	// DropUnaddressed: the peer's process (epoch) is not known, and only
	// a PING or a REGISTER may go to a process not known yet (PROTOCOL.md
	// "Envelope"); pass Peer.Epoch, or send one of those first.
	DropUnaddressed = "unaddressed"
)

var dropReasons = []string{DropQueueFull, DropPeerBusy, DropNoKey, DropError, DropUnknownPeer, DropTooManyPeers, DropNoIdentity, DropUnaddressed}

// Stats is a snapshot of a loop's counters.
type Stats struct {
	Received        uint64            // well-formed messages delivered (PING/PONG included)
	Sent            uint64            // messages handed to ZeroMQ
	Malformed       map[string]uint64 // by reason
	Dropped         map[string]uint64 // sends dropped, by reason
	Unauthenticated uint64            // connections the ZAP handler refused
	Refused         map[string]uint64 // messages dropped by authentication, by reason (Auth*)
	Replayed        map[string]uint64 // authentic messages dropped as replays, by reason (Replay*)
	PeersDead       uint64            // peers declared dead by heartbeats
	Backlogged      uint64            // received messages dropped: their sending rank's backlog (or the inbox) was full
	Sockets         uint64            // PUSH sockets open now (≤ MaxPeers)
}

// MalformedTotal sums Malformed over reasons.
func (s Stats) MalformedTotal() uint64 {
	var n uint64
	for _, v := range s.Malformed {
		n += v
	}
	return n
}

type counters struct {
	received, sent, unauth, dead atomic.Uint64
	backlogged                   atomic.Uint64
	sockets                      atomic.Uint64    // gauge
	malformed                    [7]atomic.Uint64 // indexed like MalformedReasons
	dropped                      [8]atomic.Uint64 // indexed like dropReasons
	refused                      [7]atomic.Uint64 // indexed like AuthReasons
	replayed                     [3]atomic.Uint64 // indexed like ReplayReasons
}

func (c *counters) replayInc(reason string) {
	if i := indexOf(ReplayReasons, reason); i >= 0 {
		c.replayed[i].Add(1)
	}
}

func (c *counters) refusedInc(reason string) {
	if i := indexOf(AuthReasons, reason); i >= 0 {
		c.refused[i].Add(1)
	}
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

func (c *counters) malformedInc(reason string) {
	if i := indexOf(wire.MalformedReasons, reason); i >= 0 {
		c.malformed[i].Add(1)
	}
}

func (c *counters) dropInc(reason string) {
	if i := indexOf(dropReasons, reason); i >= 0 {
		c.dropped[i].Add(1)
	}
}

func (c *counters) snapshot() Stats {
	s := Stats{Received: c.received.Load(), Sent: c.sent.Load(), Unauthenticated: c.unauth.Load(),
		PeersDead: c.dead.Load(), Sockets: c.sockets.Load(), Backlogged: c.backlogged.Load(),
		Malformed: map[string]uint64{}, Dropped: map[string]uint64{}, Refused: map[string]uint64{},
		Replayed: map[string]uint64{}}
	for i, r := range ReplayReasons {
		s.Replayed[r] = c.replayed[i].Load()
	}
	for i, r := range AuthReasons {
		s.Refused[r] = c.refused[i].Load()
	}
	for i, r := range wire.MalformedReasons {
		s.Malformed[r] = c.malformed[i].Load()
	}
	for i, r := range dropReasons {
		s.Dropped[r] = c.dropped[i].Load()
	}
	return s
}

// collector exposes a loop's counters to Prometheus, labelled with the
// rank's identity so several ranks can share one registry.
type collector struct {
	c                                                         *counters
	malformed, dropped, received, sent, unauth, dead, refused *prometheus.Desc
	replayed                                                  *prometheus.Desc
	sockets, backlogged                                       *prometheus.Desc
}

func newCollector(c *counters, id wire.From) *collector {
	labels := prometheus.Labels{"role": id.Role, "instance": id.Instance, "rank": strconv.Itoa(id.Rank)}
	d := func(name, help string, vars ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, vars, labels)
	}
	return &collector{c: c,
		malformed: d("kvbridge_malformed_messages_total", "Control messages dropped as malformed, by reason.", "reason"),
		dropped:   d("kvbridge_control_send_dropped_total", "Control messages not sent, by reason.", "reason"),
		received:  d("kvbridge_control_messages_received_total", "Well-formed control messages received."),
		sent:      d("kvbridge_control_messages_sent_total", "Control messages handed to ZeroMQ."),
		unauth:    d("kvbridge_unauthenticated_connections_total", "Connections refused by the CURVE allow-list."),
		dead:      d("kvbridge_peers_dead_total", "Peers declared dead after missed heartbeats."),
		sockets:   d("kvbridge_control_sockets", "PUSH sockets open to peers (bounded by MaxPeers)."),
		backlogged: d("kvbridge_control_backlog_dropped_total",
			"Received control messages dropped because their sending rank's backlog (8,192 messages or 64 MiB waiting to be handled) or the inbox (65,536 messages or 256 MiB) was full."),
		refused: d("kvbridge_unauthenticated_messages_total", "Control messages dropped by authentication, by reason.", "reason"),
		replayed: d("kvbridge_replayed_messages_total",
			"Authentic control messages dropped as replays: addressed to another process of this rank, or a message number already received.", "reason"),
	}
}

func (k *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{k.malformed, k.dropped, k.received, k.sent, k.unauth, k.dead, k.refused, k.replayed, k.sockets, k.backlogged} {
		ch <- d
	}
}

func (k *collector) Collect(ch chan<- prometheus.Metric) {
	s := k.c.snapshot()
	for r, v := range s.Malformed {
		ch <- prometheus.MustNewConstMetric(k.malformed, prometheus.CounterValue, float64(v), r)
	}
	for r, v := range s.Dropped {
		ch <- prometheus.MustNewConstMetric(k.dropped, prometheus.CounterValue, float64(v), r)
	}
	for r, v := range s.Refused {
		ch <- prometheus.MustNewConstMetric(k.refused, prometheus.CounterValue, float64(v), r)
	}
	for r, v := range s.Replayed {
		ch <- prometheus.MustNewConstMetric(k.replayed, prometheus.CounterValue, float64(v), r)
	}
	ch <- prometheus.MustNewConstMetric(k.sockets, prometheus.GaugeValue, float64(s.Sockets))
	ch <- prometheus.MustNewConstMetric(k.backlogged, prometheus.CounterValue, float64(s.Backlogged))
	ch <- prometheus.MustNewConstMetric(k.received, prometheus.CounterValue, float64(s.Received))
	ch <- prometheus.MustNewConstMetric(k.sent, prometheus.CounterValue, float64(s.Sent))
	ch <- prometheus.MustNewConstMetric(k.unauth, prometheus.CounterValue, float64(s.Unauthenticated))
	ch <- prometheus.MustNewConstMetric(k.dead, prometheus.CounterValue, float64(s.PeersDead))
}
