package kvmanager

import (
	"strconv"
	"time"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Manager's Prometheus metrics, labelled with the rank's
// role, instance and rank so several ranks can share a registry.
type metrics struct {
	m *Manager

	rooms    *prometheus.Desc // gauge by status, read from the registry
	inflight *prometheus.Desc
	tables   *prometheus.Desc // gauge by table: tombstones, pending requests

	// Read from the core's counters at collection time.
	events, deadlines, statusSent, forced, stale, retries *prometheus.Desc
	discoveryBad, restored, relookups, owed, restarted    *prometheus.Desc
	rechecks, layoutRefused, badNotifs                    *prometheus.Desc
	probes, leasesLost                                    *prometheus.Desc
	// Pull (docs/PROTOCOL.md "Pull").
	underLease, leaseRenewals, leaseExpiries, readsRefused, pullRefused *prometheus.Desc
	published, released                                                 *prometheus.Desc
	offers                                                              *prometheus.Desc
	foreignRefused, tombsForgotten, notDelivered, writesNotDelivered    *prometheus.Desc
	challenges, challengesIgnored, offerChallenges                      *prometheus.Desc
	abortsOwed, wrongType, digestMismatches, digestPages, digestErrors  *prometheus.Desc
	closedRegisters                                                     *prometheus.Desc
	closedNotices                                                       *prometheus.Desc
	pageSeconds                                                         prometheus.Histogram

	transfers prometheus.Counter
	bytes     prometheus.Counter
	latency   prometheus.Histogram
	phases    *prometheus.HistogramVec // by status: the time a room that succeeded spent in it
	aborts    *prometheus.CounterVec   // by stage (status at abort)
	overdue   prometheus.Gauge
	deferred  prometheus.Counter // REGISTERs whose check was put off (proof.go: beginCheck)
	// challengeSendFailed: agent challenges whose notification the engine
	// refused to send (the sender's repeat sends it again).
	challengeSendFailed prometheus.Counter
}

func newMetrics(m *Manager) *metrics {
	role := map[Role]string{RolePrefill: "prefill", RoleDecode: "decode"}[m.cfg.Role]
	labels := prometheus.Labels{"role": role, "instance": m.cfg.Instance, "rank": strconv.Itoa(m.cfg.Rank)}
	return &metrics{m: m,
		rooms:    prometheus.NewDesc("kvbridge_rooms", "Live rooms by status.", []string{"status"}, labels),
		inflight: prometheus.NewDesc("kvbridge_inflight_writes", "Posted writes not yet completed.", nil, labels),
		tables: prometheus.NewDesc("kvbridge_core_entries", "Entries of the core's bounded tables (tombstones, pending requests, live and draining rooms, held pages, owed ABORTs, ...): every one 0 once the rank is idle past the tombstone TTL, but epochs, peers and targets.",
			[]string{"table"}, labels),
		events: prometheus.NewDesc("kvbridge_registry_events_total", "Core events by kind and outcome.",
			[]string{"event", "outcome"}, labels),
		deadlines: prometheus.NewDesc("kvbridge_rooms_failed_by_deadline_total",
			"Rooms failed (or pending requests dropped) by deadline kind.", []string{"deadline"}, labels),
		statusSent: prometheus.NewDesc("kvbridge_status_failed_sent_total", "STATUS failed messages pushed to decode ranks.", nil, labels),
		forced: prometheus.NewDesc("kvbridge_quarantine_expired_total",
			"Decode rooms whose pages were released by the quarantine deadline, without a drained ABORT_ACK.", nil, labels),
		stale: prometheus.NewDesc("kvbridge_stale_epoch_total",
			"Messages or writes refused because they named another epoch of a peer.", nil, labels),
		retries: prometheus.NewDesc("kvbridge_register_retries_total", "REGISTER messages sent again for lack of an answer.", nil, labels),
		discoveryBad: prometheus.NewDesc("kvbridge_discovery_malformed_records_total",
			"Discovery records (etcd) ignored as malformed.", nil, labels),
		restored: prometheus.NewDesc("kvbridge_discovery_records_restored_total",
			"This rank's own discovery record (etcd) put back after it was found deleted, garbled or naming another endpoint.", nil, labels),
		leasesLost: prometheus.NewDesc("kvbridge_discovery_leases_lost_total",
			"This rank's discovery leases (etcd) found expired on a write and replaced by a new lease.", nil, labels),
		relookups: prometheus.NewDesc("kvbridge_relookups_total",
			"Prefill ranks looked up again because REGISTERs to their endpoint went unanswered.", nil, labels),
		rechecks: prometheus.NewDesc("kvbridge_registration_rechecks_total",
			"Prefill ranks looked up and registered with again before a REQUEST, not heard from for longer than the heartbeat bound.", nil, labels),
		layoutRefused: prometheus.NewDesc("kvbridge_layout_refused_total",
			"REGISTERs and REQUESTs refused for naming memory that cannot be right: overlapping regions, a destination named twice, a destination another live room of the decode process may still write.",
			[]string{"reason"}, labels),
		challenges: prometheus.NewDesc("kvbridge_challenges_total",
			"Agent challenges of REGISTERs (docs/PROTOCOL.md \"The agent challenge\"), by outcome: sent, echoed, expired (unechoed past the deadline; refused as not_owner where the sender kept registering), deferred (too many open).",
			[]string{"outcome"}, labels),
		abortsOwed: prometheus.NewDesc("kvbridge_owed_aborts_total",
			"Owed ABORTs (to a decode rank that may not have heard a room failed) by outcome: resent (unacknowledged after a retry interval) and dropped (over the bound of one target: sent once, not kept).",
			[]string{"outcome"}, labels),
		closedRegisters: prometheus.NewDesc("kvbridge_registers_closed_total",
			"REGISTERs this prefill rank dropped unanswered because it was closed (or whose metadata load or proof read ended after Close), and pull offer challenges it did not echo once closed (readable while Close runs): the decode rank's retries and lookups find the rank's next process.", nil, labels),
		closedNotices: prometheus.NewDesc("kvbridge_closed_notices_total",
			"Closing notices (STATUS closed, docs/PROTOCOL.md \"A rank that closes\"), by outcome: sent (prefill: one to each bound decode rank at Close), heard (decode: from the process its registration names), untaken (decode: REQUESTs such a notice showed never taken, their rooms failed and pages freed at once) and stale_record (decode: lookups whose record still named the closed process, the rooms waiting for the rank failed).",
			[]string{"outcome"}, labels),
		wrongType: prometheus.NewDesc("kvbridge_messages_wrong_role_total",
			"Control messages of a type this rank's role never accepts (a REQUEST at a decode rank, PAGES at a prefill rank, ...): dropped.", nil, labels),
		offerChallenges: prometheus.NewDesc("kvbridge_offer_challenges_total",
			"Pull offers' challenges (docs/PROTOCOL.md \"Pull\"), by outcome: sent, echoed, expired (decode: the offer's agent never echoed) and kept (prefill: offer challenges kept to echo).",
			[]string{"outcome"}, labels),
		challengesIgnored: prometheus.NewDesc("kvbridge_challenges_ignored_total",
			"Agent challenges this decode rank's agent got for another identity (a REGISTER elsewhere named this rank's agent), or malformed: dropped.", nil, labels),
		foreignRefused: prometheus.NewDesc("kvbridge_foreign_room_refused_total",
			"REQUESTs and ABORTs refused for naming a room another decode instance asked for first (a room is one decode instance's).", nil, labels),
		notDelivered: prometheus.NewDesc("kvbridge_reads_not_delivered_total",
			"READs the engine reported complete that did not deliver a destination descriptor (the canary planted at its end still there; seen on NIXL 1.4.0 over cma): failed instead, naming the descriptor.", nil, labels),
		digestMismatches: prometheus.NewDesc("kvbridge_digest_mismatches_total",
			"Notifications of pushed writes and pull reads (decode) whose pages do not match the prefill rank's digest, or carry none for a room that asked for one (docs/PROTOCOL.md \"Digest\"): the room failed corrupt, naming the page, layers and prefill rank.", nil, labels),
		digestPages: prometheus.NewDesc("kvbridge_digest_pages_checked_total",
			"Page positions whose bytes matched the prefill rank's digest, one count a position of each notification or pull read (a layer group's, when a room is sent layer by layer) (decode, rooms with a digest).", nil, labels),
		digestErrors: prometheus.NewDesc("kvbridge_digest_errors_total",
			"Notifications of pushed writes and pull reads (decode) whose pages this rank could not sum for their digest (its own failure: its CUDA driver's, for KV in VRAM): the room failed failed, not corrupt, naming the error.", nil, labels),
		writesNotDelivered: prometheus.NewDesc("kvbridge_writes_not_delivered_total",
			"Notifications of pushed writes (decode) whose pages did not all land (a piece still ends with the canary planted before the REQUEST): the room failed not_delivered instead, naming the piece.", nil, labels),
		tombsForgotten: prometheus.NewDesc("kvbridge_tombstones_forgotten_total",
			"Room tombstones forgotten before their TTL, by reason: bound (past MaxTombstones, the oldest settled), rank_share (a rank's early aborts past MaxTombstones/8, its oldest: one rank's ABORT flood forgets its own).",
			[]string{"reason"}, labels),
		probes: prometheus.NewDesc("kvbridge_request_probes_total",
			"PINGs sent before a REQUEST to a prefill process not heard from within ProbeIdle, by outcome (lost: no PONG within ProbeTimeout, the rank looked up again).",
			[]string{"outcome"}, labels),
		badNotifs: prometheus.NewDesc("kvbridge_bad_notifications_total",
			"Data-plane notifications refused: unparseable, numbers out of range, or contradicting their chunk's earlier notifications.", nil, labels),
		restarted: prometheus.NewDesc("kvbridge_peers_restarted_total", "Peers heard with a new epoch (their old epoch's rooms failed).", nil, labels),
		published: prometheus.NewDesc("kvbridge_pull_pages_published_total",
			"PAGES messages this prefill rank sent (pull: the chunks it offered to be read).", nil, labels),
		released: prometheus.NewDesc("kvbridge_pull_sources_released_total",
			"Pulled rooms whose source pages this prefill rank released (those the quarantine forced also in kvbridge_quarantine_expired_total).", nil, labels),
		underLease: prometheus.NewDesc("kvbridge_pull_pages_under_lease",
			"Prefill pages published for pull whose decode ranks may still read them (not released yet).", nil, labels),
		leaseRenewals: prometheus.NewDesc("kvbridge_pull_lease_renewals_total",
			"Pull leases renewed: RENEWs applied (prefill) or sent (decode).", nil, labels),
		leaseExpiries: prometheus.NewDesc("kvbridge_pull_lease_expiries_total",
			"Pull rooms failed because a decode rank's lease ended before its reads were reported (prefill).", nil, labels),
		readsRefused: prometheus.NewDesc("kvbridge_pull_reads_refused_total",
			"Pull reads not posted: the room had ended or the lease had run out before the read's turn (decode).", nil, labels),
		offers: prometheus.NewDesc("kvbridge_pull_offers_total",
			"Pull offers a decode rank did not take: refused (none, another process's agent, regions that make no layout, or not proven: the pair is not registered) or deferred (its agent's offer being checked, or 16 checks at once: the REGISTER's repeat brings it again).", []string{"outcome"}, labels),
		pullRefused: prometheus.NewDesc("kvbridge_pull_messages_refused_total",
			"PAGES, RENEW and READ_DONE ignored or refused: stale epoch, unknown room or peer, a duplicate, a lease that had ended, a malformed publication, or a REQUEST for a mode the room or rank does not take.", nil, labels),
		pageSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvbridge_pull_page_seconds",
			Help: "Per pull room: prefill pages published × seconds from the first publication to their release.", ConstLabels: labels,
			Buckets: prometheus.ExponentialBuckets(1e-3, 4, 14)}),
		owed: prometheus.NewDesc("kvbridge_owed_aborts",
			"ABORTs sent to prefill ranks and not yet acknowledged (re-sent to a restarted rank's new process).", nil, labels),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_registers_deferred_total",
			Help: "REGISTER checks put off: one of the same decode rank was under way (the REGISTER is stepped again when it ends, and counted again if put off again), or one naming the same agent, or 16 were (left for the sender to repeat).", ConstLabels: labels}),
		challengeSendFailed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_challenge_send_failed_total",
			Help: "Agent challenges whose notification the engine refused to send: left for the REGISTER's repeat, which sends it again.", ConstLabels: labels}),
		transfers: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_transfers_total",
			Help: "Transfers completed: writes (a prefill rank, push) and reads (a decode rank, pull).", ConstLabels: labels}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_transfer_bytes_total",
			Help: "Bytes moved: written by a prefill rank (push) or read by a decode rank (pull).", ConstLabels: labels}),
		phases: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvbridge_room_phase_seconds",
			Help: "Time a room that succeeded spent in each status (prefill: bootstrapping = until Init and every REQUEST were in, " +
				"waiting_for_input = until its first write was posted, transferring = until its last write completed; " +
				"decode: bootstrapping = until Init, waiting_for_input = until its first data arrived, transferring = until all of it landed).",
			ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(1e-4, 4, 11)}, []string{"status"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvbridge_transfer_latency_seconds",
			Help: "Room creation (prefill) or request (decode) to Success.", ConstLabels: labels,
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 20)}),
		aborts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvbridge_aborts_total",
			Help: "Aborts by the room's status when they arrived.", ConstLabels: labels}, []string{"stage"}),
		overdue: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvbridge_rooms_past_deadline",
			Help: "Live rooms past their deadline at the last sweep (must stay 0).", ConstLabels: labels}),
	}
}

func (x *metrics) abort(stage core.Poll) {
	s := "unknown_room"
	if stage.Valid() {
		s = stage.String()
	}
	x.aborts.WithLabelValues(s).Inc()
}

func (x *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{x.transfers, x.bytes, x.latency, x.phases, x.aborts, x.overdue, x.deferred, x.challengeSendFailed, x.pageSeconds}
}

func (x *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- x.rooms
	ch <- x.inflight
	ch <- x.tables
	for _, d := range []*prometheus.Desc{x.events, x.deadlines, x.statusSent, x.forced, x.stale, x.retries, x.discoveryBad, x.restored, x.leasesLost, x.relookups, x.owed, x.restarted, x.rechecks, x.layoutRefused, x.badNotifs, x.probes,
		x.underLease, x.published, x.released, x.leaseRenewals, x.leaseExpiries, x.readsRefused, x.pullRefused, x.offers, x.foreignRefused, x.tombsForgotten, x.notDelivered, x.writesNotDelivered, x.challenges, x.challengesIgnored, x.offerChallenges, x.abortsOwed, x.wrongType, x.closedRegisters, x.closedNotices, x.digestMismatches, x.digestPages, x.digestErrors} {
		ch <- d
	}
	for _, c := range x.collectors() {
		c.Describe(ch)
	}
}

func (x *metrics) Collect(ch chan<- prometheus.Metric) {
	var counts map[core.Poll]int
	var inflight int
	var st core.CoreStats
	var tombs, pending, leased int
	x.m.read(func(c *core.Core) {
		counts, inflight, tombs, pending = c.Tables()
		st = c.Stats()
		leased = c.PagesUnderLease()
	})
	ch <- prometheus.MustNewConstMetric(x.underLease, prometheus.GaugeValue, float64(leased))
	ch <- prometheus.MustNewConstMetric(x.leaseRenewals, prometheus.CounterValue, float64(st.LeaseRenewals))
	ch <- prometheus.MustNewConstMetric(x.leaseExpiries, prometheus.CounterValue, float64(st.LeaseExpiries))
	ch <- prometheus.MustNewConstMetric(x.readsRefused, prometheus.CounterValue, float64(st.ReadsRefused))
	ch <- prometheus.MustNewConstMetric(x.pullRefused, prometheus.CounterValue, float64(st.PullRefused))
	ch <- prometheus.MustNewConstMetric(x.offers, prometheus.CounterValue, float64(st.OffersRefused), "refused")
	ch <- prometheus.MustNewConstMetric(x.offers, prometheus.CounterValue, float64(st.OffersDeferred), "deferred")
	ch <- prometheus.MustNewConstMetric(x.foreignRefused, prometheus.CounterValue, float64(st.ForeignRefused))
	var notDelivered uint64
	if a := x.m.agent; a != nil {
		notDelivered = a.NotDelivered()
	}
	ch <- prometheus.MustNewConstMetric(x.notDelivered, prometheus.CounterValue, float64(notDelivered))
	ch <- prometheus.MustNewConstMetric(x.writesNotDelivered, prometheus.CounterValue, float64(st.NotDelivered))
	ch <- prometheus.MustNewConstMetric(x.digestMismatches, prometheus.CounterValue, float64(st.DigestMismatches))
	ch <- prometheus.MustNewConstMetric(x.digestPages, prometheus.CounterValue, float64(x.m.digestPages.Load()))
	ch <- prometheus.MustNewConstMetric(x.digestErrors, prometheus.CounterValue, float64(x.m.digestErrors.Load()))
	ch <- prometheus.MustNewConstMetric(x.tombsForgotten, prometheus.CounterValue, float64(st.TombstonesEvicted), "bound")
	ch <- prometheus.MustNewConstMetric(x.tombsForgotten, prometheus.CounterValue, float64(st.EarlyAbortsForgotten), "rank_share")
	for _, c := range []struct {
		outcome string
		n       uint64
	}{{"sent", st.Challenges}, {"echoed", st.ChallengesPassed}, {"expired", st.ChallengesExpired}, {"deferred", st.ChallengesDeferred}} {
		ch <- prometheus.MustNewConstMetric(x.challenges, prometheus.CounterValue, float64(c.n), c.outcome)
	}
	ch <- prometheus.MustNewConstMetric(x.challengesIgnored, prometheus.CounterValue, float64(st.ChallengesIgnored))
	ch <- prometheus.MustNewConstMetric(x.abortsOwed, prometheus.CounterValue, float64(st.AbortsResent), "resent")
	ch <- prometheus.MustNewConstMetric(x.abortsOwed, prometheus.CounterValue, float64(st.AbortsDropped), "dropped")
	ch <- prometheus.MustNewConstMetric(x.wrongType, prometheus.CounterValue, float64(st.Refused))
	ch <- prometheus.MustNewConstMetric(x.closedRegisters, prometheus.CounterValue, float64(st.ClosedRegisters))
	ch <- prometheus.MustNewConstMetric(x.closedNotices, prometheus.CounterValue, float64(st.ClosedNotices), "sent")
	ch <- prometheus.MustNewConstMetric(x.closedNotices, prometheus.CounterValue, float64(st.ClosedHeard), "heard")
	ch <- prometheus.MustNewConstMetric(x.closedNotices, prometheus.CounterValue, float64(st.ClosedUntaken), "untaken")
	ch <- prometheus.MustNewConstMetric(x.closedNotices, prometheus.CounterValue, float64(st.ClosedRecords), "stale_record")
	for _, c := range []struct {
		outcome string
		n       uint64
	}{{"sent", st.OfferChallenges}, {"echoed", st.OfferChallengesPassed}, {"expired", st.OfferChallengesExpired}, {"kept", st.OfferEchoes}} {
		ch <- prometheus.MustNewConstMetric(x.offerChallenges, prometheus.CounterValue, float64(c.n), c.outcome)
	}
	ch <- prometheus.MustNewConstMetric(x.tables, prometheus.GaugeValue, float64(tombs), "tombstones")
	ch <- prometheus.MustNewConstMetric(x.tables, prometheus.GaugeValue, float64(pending), "pending")
	sz := x.m.sizes()
	for _, t := range []struct {
		table string
		n     int
	}{{"live", sz.Live}, {"draining", sz.Draining}, {"pending_peers", sz.PendingPeers}, {"holds", sz.Holds},
		{"owed_aborts", sz.OwedAborts}, {"in_use", sz.InUse}, {"pull_holds", sz.PullHolds}, {"waiters", sz.Waiters},
		{"epochs", sz.Epochs}, {"peers", sz.Peers}, {"targets", sz.Targets}, {"offers", sz.Offers}, {"offer_checks", sz.OfferChecks}} {
		ch <- prometheus.MustNewConstMetric(x.tables, prometheus.GaugeValue, float64(t.n), t.table)
	}
	ch <- prometheus.MustNewConstMetric(x.published, prometheus.CounterValue, float64(st.PagesPublished))
	ch <- prometheus.MustNewConstMetric(x.released, prometheus.CounterValue, float64(st.SourceReleases))
	for p := core.Failed; p <= core.Success; p++ {
		ch <- prometheus.MustNewConstMetric(x.rooms, prometheus.GaugeValue, float64(counts[p]), p.String())
	}
	ch <- prometheus.MustNewConstMetric(x.inflight, prometheus.GaugeValue, float64(inflight))
	for k := core.EventCreate; k <= core.EventClear; k++ {
		for o := core.Applied; o <= core.Rejected; o++ {
			if n := st.Events[k][o]; n > 0 {
				ch <- prometheus.MustNewConstMetric(x.events, prometheus.CounterValue, float64(n), k.String(), o.String())
			}
		}
	}
	for d := core.DeadlineBootstrap; d <= core.DeadlineTombstone; d++ {
		ch <- prometheus.MustNewConstMetric(x.deadlines, prometheus.CounterValue, float64(st.Deadlines[d]), d.String())
	}
	ch <- prometheus.MustNewConstMetric(x.statusSent, prometheus.CounterValue, float64(st.StatusSent))
	ch <- prometheus.MustNewConstMetric(x.forced, prometheus.CounterValue, float64(st.ForcedReleases))
	ch <- prometheus.MustNewConstMetric(x.stale, prometheus.CounterValue, float64(st.StaleEpoch))
	ch <- prometheus.MustNewConstMetric(x.retries, prometheus.CounterValue, float64(st.RegisterRetries))
	ch <- prometheus.MustNewConstMetric(x.discoveryBad, prometheus.CounterValue, float64(x.m.discoveryMalformed()))
	ch <- prometheus.MustNewConstMetric(x.restored, prometheus.CounterValue, float64(x.m.recordsRestored()))
	ch <- prometheus.MustNewConstMetric(x.leasesLost, prometheus.CounterValue, float64(x.m.leasesLost()))
	ch <- prometheus.MustNewConstMetric(x.relookups, prometheus.CounterValue, float64(st.Relookups))
	ch <- prometheus.MustNewConstMetric(x.restarted, prometheus.CounterValue, float64(st.PeersRestarted))
	ch <- prometheus.MustNewConstMetric(x.rechecks, prometheus.CounterValue, float64(st.Rechecks))
	ch <- prometheus.MustNewConstMetric(x.probes, prometheus.CounterValue, float64(st.Probes), "sent")
	ch <- prometheus.MustNewConstMetric(x.probes, prometheus.CounterValue, float64(st.ProbesLost), "lost")
	ch <- prometheus.MustNewConstMetric(x.badNotifs, prometheus.CounterValue, float64(st.BadNotifs+x.m.unparsedNotifs.Load()))
	for r := core.LayoutRefusal(0); r < core.LayoutRefusals; r++ {
		ch <- prometheus.MustNewConstMetric(x.layoutRefused, prometheus.CounterValue, float64(st.LayoutRefused[r]), r.String())
	}
	ch <- prometheus.MustNewConstMetric(x.owed, prometheus.GaugeValue, float64(sz.OwedAborts))
	for _, c := range x.collectors() {
		c.Collect(ch)
	}
}

// phaseLabels are the statuses a room passes through before Success, in
// order, with their label.
var phaseLabels = [...]struct {
	st    core.Poll
	label string
}{{core.Bootstrapping, "bootstrapping"}, {core.WaitingForInput, "waiting_for_input"}, {core.Transferring, "transferring"}}

// observePhases records how long a room that just succeeded spent in each
// status, from the times it entered them (a status it skipped — a decode
// room whose only data arrived with its last notification never
// transfers — is left out, its time counted in the one before).
func (x *metrics) observePhases(entered [core.Success + 1]time.Time) {
	for i, p := range phaseLabels {
		from := entered[p.st]
		if from.IsZero() {
			continue
		}
		to := entered[core.Success]
		for _, q := range phaseLabels[i+1:] {
			if !entered[q.st].IsZero() {
				to = entered[q.st]
				break
			}
		}
		if !to.IsZero() && !to.Before(from) {
			x.phases.WithLabelValues(p.label).Observe(to.Sub(from).Seconds())
		}
	}
}
