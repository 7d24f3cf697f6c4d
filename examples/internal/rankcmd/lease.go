package rankcmd

// vLLM's serial flow on the example ranks: a prefill request with
// kv_transfer_params.do_remote_decode computes the prompt's KV, keeps it
// under a lease and answers with kv_transfer_params naming the room (a
// ticket, signed with a key derived from the deployment's secret); the
// decode request that carries them starts the room, whose REQUESTs make
// the prefill ranks push as in every other room. A lease that ends before
// the decode ranks asked aborts the room (its pages go back; counted).

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/openai"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/prometheus/client_golang/prometheus"
)

// leaseMetrics count the rooms a prefill rank holds for a decode request
// that comes later.
type leaseMetrics struct {
	rooms, pages prometheus.Gauge
	expired      prometheus.Counter
	held         prometheus.Histogram
	// refused counts the requests a front refused or failed after it read
	// their room (the room's other side told at once), by code.
	refused *prometheus.CounterVec
}

func newLeaseMetrics(reg prometheus.Registerer) (*leaseMetrics, error) {
	m := &leaseMetrics{
		rooms: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvbridge_example_kv_held_rooms",
			Help: "Rooms computed and held for a decode request that has not come yet (vLLM's flow)."}),
		pages: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvbridge_example_kv_held_pages",
			Help: "Source pages of the held rooms."}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_example_kv_lease_expired_total",
			Help: "Held rooms aborted because no decode rank asked for them within the lease."}),
		held: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvbridge_example_kv_held_seconds",
			Help: "From a held room's forward pass to its decode ranks' REQUESTs (or the lease's end).", Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvbridge_example_rooms_refused_total",
			Help: "Requests a front refused or failed after it read their room, by code; the room's other side is told at once (its held KV or its room released)."}, []string{"code"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.rooms, m.pages, m.expired, m.held, m.refused} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *leaseMetrics) hold(pages int) {
	m.rooms.Inc()
	m.pages.Add(float64(pages))
}

func (m *leaseMetrics) release(pages int, d time.Duration) {
	m.rooms.Dec()
	m.pages.Sub(float64(pages))
	m.held.Observe(d.Seconds())
}

// ticketKey is the key tickets are signed with: derived from the
// deployment's secret (nil when insecure: tickets go unsigned).
func ticketKey(secret []byte) []byte {
	if secret == nil {
		return nil
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("kvbridge example kv_transfer_params key v1"))
	return m.Sum(nil)
}

func (r *Rank) sign(t *openai.Ticket) {
	if r.ticketKey == nil {
		return
	}
	m := hmac.New(sha256.New, r.ticketKey)
	m.Write(t.Signed())
	t.Sig = base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkTicket verifies a decode request's kv_transfer_params against this
// deployment and the request's prompt: the room and its bootstrap URL, or
// an OpenAI error (400: not a kvbridge ticket of this deployment, or for
// another prompt; 503: its lease ended).
func (r *Rank) checkTicket(kv *openai.KVTransferParams, prompt []int, now time.Time) (uint64, *openai.Ticket, *openai.Error) {
	t := kv.KVBridge
	if t == nil {
		return 0, nil, openai.BadRequest("invalid_kv_transfer_params", "kv_transfer_params carry no kvbridge ticket: they come from a prefill server that is not a kvbridge example rank")
	}
	if t.Version != ticketVersion {
		return 0, nil, openai.BadRequest("invalid_kv_transfer_params", "kv_transfer_params.kvbridge version %d: this server reads %d", t.Version, ticketVersion)
	}
	if r.ticketKey != nil {
		m := hmac.New(sha256.New, r.ticketKey)
		m.Write(t.Signed())
		sig, err := base64.RawURLEncoding.DecodeString(t.Sig)
		if err != nil || !hmac.Equal(sig, m.Sum(nil)) {
			return 0, nil, openai.BadRequest("kv_transfer_params_forged", "kv_transfer_params.kvbridge is not signed by this deployment (another deployment's prefill server, or altered on the way)")
		}
	}
	room, err := t.RoomID()
	if err != nil {
		return 0, nil, openai.BadRequest("invalid_kv_transfer_params", "%v", err)
	}
	if t.Tokens != len(prompt) || t.Prompt != promptHashHex(prompt) {
		return 0, nil, openai.BadRequest("kv_transfer_params_mismatch", "kv_transfer_params of room %d hold the KV of another prompt (%d tokens, hash %s), not this request's %d tokens", room, t.Tokens, t.Prompt, len(prompt))
	}
	if exp := time.UnixMilli(t.ExpiresMS); !now.Before(exp) {
		return 0, nil, openai.Errorf(503, "kv_transfer_params_expired", "kv_transfer_params of room %d expired %s ago (the prefill instance %q released its KV at the lease's end): send the request again",
			room, now.Sub(exp).Round(time.Millisecond), t.Instance)
	}
	return room, t, nil
}

// ticketVersion: 2 names the prefill processes holding the KV (Ranks).
const ticketVersion = 2

// ticketRanks is a ticket's Ranks: the processes of the room's DP group.
func ticketRanks(ms []member, self Info) string {
	var out []string
	for _, m := range ms {
		in := m.info
		if m.url == "" {
			in = self
		}
		out = append(out, fmt.Sprintf("%d.%d@%d", in.Parallel.TPRank, in.Parallel.PPRank, in.Epoch))
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// ticketHolders checks that the prefill processes a ticket names still
// hold its KV: each is the process its bootstrap server's record names
// now (GET /v1/ranks, bounded by 2 s). One that restarted since, or
// whose record is gone, answers 503 kv_transfer_params_stale — at once,
// not when the room's REQUEST times out on a process that never held it.
func (r *Rank) ticketHolders(ctx context.Context, room uint64, t *openai.Ticket) *openai.Error {
	if !strings.HasPrefix(t.Bootstrap, "http://") && !strings.HasPrefix(t.Bootstrap, "https://") {
		return nil // etcd discovery: the room's REQUEST finds the ranks
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for _, f := range strings.Split(t.Ranks, ",") {
		var tp, pp int
		var epoch uint64
		if _, err := fmt.Sscanf(f, "%d.%d@%d", &tp, &pp, &epoch); err != nil {
			return openai.BadRequest("invalid_kv_transfer_params", "kv_transfer_params.kvbridge.ranks %.64q: %v", t.Ranks, err)
		}
		var ri records.RankInfo
		err := getJSON(ctx, r.httpClient, fmt.Sprintf("%s/v1/ranks?dp=%d&tp=%d&pp=%d", t.Bootstrap, t.DP, tp, pp), &ri)
		switch {
		case err != nil:
			return openai.Errorf(503, "kv_transfer_params_stale", "room %d: prefill rank tp %d pp %d of %q, which holds its KV, is not registered at %s now (%v): send the request again",
				room, tp, pp, t.Instance, t.Bootstrap, err)
		case ri.Epoch != epoch:
			return openai.Errorf(503, "kv_transfer_params_stale", "room %d: prefill rank tp %d pp %d of %q restarted since it computed the KV (epoch %d, now %d): send the request again",
				room, tp, pp, t.Instance, epoch, ri.Epoch)
		}
	}
	return nil
}

// getJSON GETs url into out: an error for anything but a 200.
func getJSON(ctx context.Context, cl *http.Client, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s answered %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, out)
}

// usedTickets remembers the rooms a decode front started from
// kv_transfer_params, until their lease ends: a second decode request
// with the same params is refused.
type usedTickets struct {
	mu    sync.Mutex
	rooms map[uint64]time.Time // room → its lease's end
}

// maxUsedTickets bounds the set (a lease is at most an hour).
const maxUsedTickets = 1 << 16

func newUsedTickets() *usedTickets { return &usedTickets{rooms: map[uint64]time.Time{}} }

// claim marks a room used; false if it already was (or the set is full of
// live leases).
func (u *usedTickets) claim(room uint64, until, now time.Time) (bool, *openai.Error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.rooms[room]; ok {
		return false, openai.Errorf(409, "kv_transfer_params_used", "kv_transfer_params of room %d were already served by this decode server", room)
	}
	if len(u.rooms) >= maxUsedTickets {
		for r, t := range u.rooms {
			if now.After(t) {
				delete(u.rooms, r)
			}
		}
		if len(u.rooms) >= maxUsedTickets {
			return false, openai.Errorf(503, "overloaded", "%d kv_transfer_params within their lease already served: try again later", len(u.rooms))
		}
	}
	u.rooms[room] = until
	return true, nil
}

// promptHashHex is a ticket's prompt_hash.
func promptHashHex(p []int) string { return fmt.Sprintf("%016x", promptHash(p)) }
