package kvmanager

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Manager's Prometheus metrics, labelled with the rank's
// role, instance and rank so several ranks can share a registry.
type metrics struct {
	m *Manager

	rooms     *prometheus.Desc // gauge by status, read from the registry
	inflight  *prometheus.Desc
	malformed *prometheus.Desc

	events     *prometheus.CounterVec // by event and outcome
	transfers  prometheus.Counter
	bytes      prometheus.Counter
	latency    prometheus.Histogram
	aborts     *prometheus.CounterVec // by stage (status at abort)
	deadlines  *prometheus.CounterVec // rooms failed by deadline kind
	statusSent prometheus.Counter
	overdue    prometheus.Gauge
}

func newMetrics(m *Manager) *metrics {
	role := map[Role]string{RolePrefill: "prefill", RoleDecode: "decode"}[m.cfg.Role]
	labels := prometheus.Labels{"role": role, "instance": m.cfg.Instance, "rank": strconv.Itoa(m.cfg.Rank)}
	return &metrics{m: m,
		rooms:     prometheus.NewDesc("kvbridge_rooms", "Live rooms by status.", []string{"status"}, labels),
		inflight:  prometheus.NewDesc("kvbridge_inflight_writes", "Posted writes not yet completed.", nil, labels),
		malformed: prometheus.NewDesc("kvbridge_manager_malformed_messages_total", "Malformed control messages, by reason.", []string{"reason"}, labels),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvbridge_registry_events_total",
			Help: "Registry events by kind and outcome.", ConstLabels: labels}, []string{"event", "outcome"}),
		transfers: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_transfers_total",
			Help: "Writes completed.", ConstLabels: labels}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_transfer_bytes_total",
			Help: "Bytes written.", ConstLabels: labels}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvbridge_transfer_latency_seconds",
			Help: "Room creation (prefill) or request (decode) to Success.", ConstLabels: labels,
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 20)}),
		aborts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvbridge_aborts_total",
			Help: "Aborts by the room's status when they arrived.", ConstLabels: labels}, []string{"stage"}),
		deadlines: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvbridge_rooms_failed_by_deadline_total",
			Help: "Rooms failed (or pending requests dropped) by deadline kind.", ConstLabels: labels}, []string{"deadline"}),
		statusSent: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_status_failed_sent_total",
			Help: "STATUS failed messages pushed to decode ranks.", ConstLabels: labels}),
		overdue: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvbridge_rooms_past_deadline",
			Help: "Live rooms past their deadline at the last sweep (must stay 0).", ConstLabels: labels}),
	}
}

func (x *metrics) event(kind EventKind, r Result) {
	x.events.WithLabelValues(kind.String(), r.Outcome.String()).Inc()
}

func (x *metrics) abort(stage Poll) {
	s := "unknown_room"
	if stage.Valid() {
		s = stage.String()
	}
	x.aborts.WithLabelValues(s).Inc()
}

func (x *metrics) deadline(d Deadline) { x.deadlines.WithLabelValues(d.String()).Inc() }

func (x *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{x.events, x.transfers, x.bytes, x.latency, x.aborts, x.deadlines, x.statusSent, x.overdue}
}

func (x *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- x.rooms
	ch <- x.inflight
	ch <- x.malformed
	for _, c := range x.collectors() {
		c.Describe(ch)
	}
}

func (x *metrics) Collect(ch chan<- prometheus.Metric) {
	counts := x.m.reg.Counts()
	for p := Failed; p <= Success; p++ {
		ch <- prometheus.MustNewConstMetric(x.rooms, prometheus.GaugeValue, float64(counts[p]), p.String())
	}
	ch <- prometheus.MustNewConstMetric(x.inflight, prometheus.GaugeValue, float64(x.m.reg.InFlightTotal()))
	if x.m.loop != nil {
		for reason, n := range x.m.loop.Stats().Malformed {
			ch <- prometheus.MustNewConstMetric(x.malformed, prometheus.CounterValue, float64(n), reason)
		}
	}
	for _, c := range x.collectors() {
		c.Collect(ch)
	}
}
