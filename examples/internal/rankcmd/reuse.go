package rankcmd

// Multi-turn reuse (-reuse-pages): vLLM's bidirectional KV transfer as the
// llm-d sidecar drives it. A decode instance answering a conversation's
// turn keeps that turn's KV (its prompt and reply) and names it in its
// answer's kv_transfer_params; the sidecar replays those fields on the
// next turn's prefill leg, whose prefill instance fetches the prefix from
// the decode instance through kvbridge — a room the other way: the decode
// rank runs a second Manager as a prefill (sender) rank with a bootstrap
// server of its own, the prefill rank a second Manager as a decode
// (receiver) rank — and computes only the new tokens. The kept KV is held
// under -reuse-lease and released when it is fetched or the lease ends:
// used once. Instances of one rank only (the example's decode instance
// generates on one rank; a sharded prefix would need one room per rank).

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/examples/internal/openai"
	"github.com/kvbridge/kvbridge/examples/internal/tinyllm"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// reusePath is a rank's second Manager, running the other way.
type reusePath struct {
	m     *kvmanager.Manager
	p     *kvmanager.Prefill // on a decode rank: sends what it kept
	d     *kvmanager.Decode  // on a prefill rank: fetches an earlier turn
	pages *kvmodel.Pages
	cache *tinyllm.Cache
	aux   []byte
	// A decode rank's bootstrap server for its sender: where the prefill
	// rank fetches from (remote_host and remote_port of the answer).
	boot       *http.Server
	host       string
	port       int
	lease      time.Duration // decode: how long a kept turn waits
	timeout    time.Duration // prefill: how long a fetch may take
	held       prometheus.Gauge
	heldPages  prometheus.Gauge
	outcomes   *prometheus.CounterVec
	reusedToks prometheus.Counter
	computed   prometheus.Counter
}

// Outcomes of a kept turn (decode) and of a fetch (prefill), the label of
// kvbridge_example_reuse_total.
const (
	reuseKept     = "kept"     // decode: a turn's KV kept and named in the answer
	reuseNoPages  = "no_pages" // no free reuse pages: not kept, or not fetched
	reuseUsed     = "used"     // decode: fetched by a prefill rank (released)
	reuseExpired  = "expired"  // decode: the lease ended unfetched (released)
	reuseFailed   = "failed"   // the room failed (a peer died, refused, a bad ticket's room)
	reuseReused   = "reused"   // prefill: a prefix fetched and used
	reuseMismatch = "mismatch" // prefill: fetched, but the prompt does not extend the kept tokens
	reuseForged   = "forged"   // prefill: remote_request_id not signed by this deployment
	reuseStale    = "stale"    // prefill: the ticket's lease ended before the request came
	reuseForeign  = "foreign"  // prefill: remote_* fields this deployment did not write
	reuseGone     = "gone"     // prefill: the decode process that kept the turn is not registered (dead, or restarted since)
	reuseUnsent   = "unsent"   // decode: kept, but the answer naming it did not reach the client (released at once)
)

// newReusePath starts a rank's reuse path from its Manager's
// configuration (after FromEnv): the same model, layout and engine, the
// other role, reuse pages of memory, its metrics prefixed "reuse_".
func newReusePath(r *Rank, base kvmanager.Config, o *options, reg prometheus.Registerer) (*reusePath, error) {
	if r.Par.TPSize*r.Par.PPSize*r.Par.DPSize != 1 {
		return nil, fmt.Errorf("-reuse-pages needs an instance of one rank (this one is TP %d, PP %d, DP %d)", r.Par.TPSize, r.Par.PPSize, r.Par.DPSize)
	}
	if r.Role == kvmanager.RoleDecode && o.reuseLease >= base.Registry.TombstoneTTL {
		// A used room is remembered (its replay refused at once) for the
		// tombstone TTL only: past it a replay would wait for a sender.
		return nil, fmt.Errorf("-reuse-lease %s must stay below the tombstone TTL (%s, KVBRIDGE_TOMBSTONE_TTL)", o.reuseLease, base.Registry.TombstoneTTL)
	}
	other := kvmanager.RolePrefill
	if r.Role == kvmanager.RolePrefill {
		other = kvmanager.RoleDecode
	}
	cfg := kvmanager.DefaultConfig(other)
	cfg.Instance, cfg.Compat, cfg.Bind = base.Instance+"-reuse", base.Compat, base.Bind
	cfg.Parallel, cfg.Model, cfg.PageTokens, cfg.DType = base.Parallel, base.Model, base.PageTokens, base.DType
	cfg.Engine, cfg.Auth, cfg.Insecure, cfg.WarmMemory = base.Engine, base.Auth, base.Insecure, base.WarmMemory
	cfg.MaxMisses, cfg.SweepInterval, cfg.RegisterRetry, cfg.Registry.PendingTimeout = base.MaxMisses, base.SweepInterval, base.RegisterRetry, base.Registry.PendingTimeout
	cfg.Logger = base.Logger.With(zap.String("path", "reuse"))
	if reg != nil {
		cfg.Registerer = prometheus.WrapRegistererWithPrefix("reuse_", reg)
	}
	var err error
	if cfg.Layout, err = r.Model.RankLayout(base.Layout.Kind, r.Mapping.Layout, r.Par, o.reusePages, 4096); err != nil {
		return nil, fmt.Errorf("reuse layout: %w", err)
	}
	rp := &reusePath{pages: kvmodel.NewPages(o.reusePages, uint64(time.Now().UnixNano())), lease: o.reuseLease, timeout: o.reuseTimeout,
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvbridge_example_reuse_held_rooms",
			Help: "Decode: conversation turns kept for the next turn's prefill (multi-turn reuse), not yet fetched or expired."}),
		heldPages: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvbridge_example_reuse_held_pages",
			Help: "Decode: the reuse pages of the kept turns (back in the pool once their room ended)."}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvbridge_example_reuse_total",
			Help: "Multi-turn reuse by outcome: kept, used, expired, unsent, failed, no_pages (decode); reused, mismatch, forged, stale, foreign, gone, failed, no_pages (prefill)."}, []string{"outcome"}),
		reusedToks: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_example_prefill_tokens_reused_total",
			Help: "Prefill: prompt tokens whose KV came from an earlier turn's decode instance instead of the forward pass."}),
		computed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_example_prefill_tokens_computed_total",
			Help: "Prefill: prompt tokens the forward pass computed (every prefill request of a rank with -reuse-pages)."}),
	}
	free := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvbridge_example_reuse_free_pages",
		Help: "The reuse path's free pages (of -reuse-pages)."}, func() float64 { return float64(rp.pages.Free()) })
	if r.Role == kvmanager.RoleDecode {
		// The sender's bootstrap server, served here.
		scfg := bootstrap.ServerConfig{Insecure: base.Insecure}
		if base.Auth != nil {
			scfg.Token = base.Auth.BootstrapToken()
		}
		bs, err := bootstrap.NewServer(scfg)
		if err != nil {
			return nil, fmt.Errorf("-reuse-bootstrap: %w", err)
		}
		ln, err := net.Listen("tcp", o.reuseBoot)
		if err != nil {
			return nil, fmt.Errorf("-reuse-bootstrap %s: %w", o.reuseBoot, err)
		}
		rp.boot = &http.Server{Handler: bs, ReadHeaderTimeout: 10 * time.Second}
		go rp.boot.Serve(ln) //nolint:errcheck // ErrServerClosed at Shutdown
		a := ln.Addr().(*net.TCPAddr)
		rp.host, rp.port = a.IP.String(), a.Port
		if a.IP.IsUnspecified() {
			ln.Close()
			return nil, fmt.Errorf("-reuse-bootstrap %s: give a host the prefill ranks reach (an answer names it as remote_host), not an unspecified address", o.reuseBoot)
		}
		if h, _, err := net.SplitHostPort(o.httpAddr); err == nil && a.IP.IsLoopback() {
			if ip := net.ParseIP(h); ip == nil || !ip.IsLoopback() {
				base.Logger.Warn("-reuse-bootstrap is on loopback while -http is not: a prefill rank on another host cannot fetch a kept turn (every replay counted gone); give -reuse-bootstrap a host it reaches",
					zap.String("reuse_bootstrap", ln.Addr().String()), zap.String("http", o.httpAddr))
			}
		}
		cfg.BootstrapURL = "http://" + ln.Addr().String()
		if rp.p, err = kvmanager.NewPrefill(cfg); err == nil {
			rp.m = rp.p.Manager
		}
	} else if rp.d, err = kvmanager.NewDecode(cfg); err == nil {
		rp.m = rp.d.Manager
	}
	if err == nil {
		for _, c := range []prometheus.Collector{rp.held, rp.heldPages, free, rp.outcomes, rp.reusedToks, rp.computed} {
			if reg != nil && err == nil {
				err = reg.Register(c)
			}
		}
	}
	if err != nil {
		rp.close()
		return nil, fmt.Errorf("the reuse path's %s Manager: %w", roleName(other), err)
	}
	mem, aux := rp.m.Memory()
	first, heads, _ := r.Mapping.Heads(r.Par.TPSize, r.Par.TPRank)
	l0, _ := r.Mapping.StageLayers(r.Par.PPSize, r.Par.PPRank)
	if rp.cache, err = tinyllm.NewCache(mem, l0, first, heads, r.Model.HeadDim, r.Model.PageTokens, r.Mapping.Layout); err != nil {
		rp.close()
		return nil, err
	}
	rp.aux = aux
	return rp, nil
}

// close ends the path: its Manager fails every live room (a kept turn's
// goroutine then ends), its bootstrap server stops.
func (rp *reusePath) close() {
	if rp.m != nil {
		rp.m.Close()
	}
	if rp.boot != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = rp.boot.Shutdown(ctx)
	}
}

func (rp *reusePath) auxIndex(room uint64) int {
	return int(room % uint64(len(rp.aux)/kvmodel.AuxItemBytes))
}

// reuseTicket is what a decode answer's remote_request_id carries: the
// room that holds the kept KV and the epoch of the process that keeps it,
// the tokens it holds (a hash of all Tokens, and of the turn's prompt,
// its first Prompt), the lease's end, and a MAC
// over them and the bootstrap server (remote_host, remote_port) with the
// deployment's ticket key. The sidecar replays remote_request_id verbatim
// and drops fields it does not know, so the ticket lives in it.
type reuseTicket struct {
	Room       uint64
	Tokens     int
	Hash       uint64
	Prompt     int
	PromptHash uint64
	ExpiresMS  int64
	Epoch      uint64
}

const reusePrefix = "kvbridge-reuse-v1."

func (r *Rank) reuseMAC(fields, host string, port int) string {
	if r.ticketKey == nil {
		return "-"
	}
	m := hmac.New(sha256.New, r.ticketKey)
	fmt.Fprintf(m, "reuse\n%s\n%s\n%d", fields, host, port)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (r *Rank) encodeReuse(t reuseTicket, host string, port int) string {
	f := fmt.Sprintf("%d.%d.%016x.%d.%016x.%d.%d", t.Room, t.Tokens, t.Hash, t.Prompt, t.PromptHash, t.ExpiresMS, t.Epoch)
	return reusePrefix + f + "." + r.reuseMAC(f, host, port)
}

var (
	errNotReuse    = errors.New("remote_request_id is not a kvbridge reuse ticket")
	errReuseForged = errors.New("the reuse ticket is not signed by this deployment for that remote_host and remote_port")
)

// parseReuse reads a prefill leg's replayed kv_transfer_params: the
// ticket and the bootstrap URL of the decode rank that keeps the KV.
func (r *Rank) parseReuse(kv *openai.KVTransferParams) (reuseTicket, string, error) {
	var t reuseTicket
	rest, ok := strings.CutPrefix(kv.RemoteRequestID, reusePrefix)
	if !ok || kv.RemoteHost == nil || kv.RemotePort == nil {
		return t, "", errNotReuse
	}
	host, port := *kv.RemoteHost, *kv.RemotePort
	if host == "" || len(host) > 253 || strings.ContainsAny(host, "/?#@ ") || port < 1 || port > 65535 {
		return t, "", errNotReuse
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 {
		return t, "", errNotReuse
	}
	f, mac := rest[:i], rest[i+1:]
	if !hmac.Equal([]byte(mac), []byte(r.reuseMAC(f, host, port))) {
		return t, "", errReuseForged
	}
	p := strings.Split(f, ".")
	if len(p) != 7 {
		return t, "", errNotReuse
	}
	var errs [7]error
	t.Room, errs[0] = strconv.ParseUint(p[0], 10, 63)
	t.Tokens, errs[1] = strconv.Atoi(p[1])
	t.Hash, errs[2] = strconv.ParseUint(p[2], 16, 64)
	t.Prompt, errs[3] = strconv.Atoi(p[3])
	t.PromptHash, errs[4] = strconv.ParseUint(p[4], 16, 64)
	t.ExpiresMS, errs[5] = strconv.ParseInt(p[5], 10, 64)
	t.Epoch, errs[6] = strconv.ParseUint(p[6], 10, 64)
	if errors.Join(errs[:]...) != nil || t.Tokens < 1 || t.Prompt < 1 || t.Prompt > t.Tokens {
		return t, "", errNotReuse
	}
	return t, "http://" + net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// keep holds hist's KV (positions 0..len(hist)−1 of kv; its first plen
// the turn's prompt) for the next turn and returns the kv_transfer_params
// that name it and its room, or nil (counted) when it cannot.
func (t *tinyRank) keep(kv tinyllm.KV, hist []int, plen int) (*openai.KVTransferParams, uint64) {
	r, rp := t.r, t.r.reuse
	n, pt := len(hist), r.Model.PageTokens
	pages := rp.pages.Get((n + pt - 1) / pt)
	if pages == nil {
		rp.outcomes.WithLabelValues(reuseNoPages).Inc()
		return nil, 0
	}
	copyInto(&tinyllm.Seq{C: rp.cache, Pages: pages}, kv, t.layer0, t.nlayers, t.first, t.heads, n)
	room := randomRoom()
	s, err := sender.New(rp.p, room)
	if err != nil {
		rp.pages.Put(pages)
		rp.outcomes.WithLabelValues(reuseFailed).Inc()
		return nil, 0
	}
	s.Init()
	exp := time.Now().Add(rp.lease)
	tk := reuseTicket{Room: room, Tokens: n, Hash: promptHash(hist), Prompt: plen, PromptHash: promptHash(hist[:plen]), ExpiresMS: exp.UnixMilli(), Epoch: rp.m.Epoch()}
	rp.held.Inc()
	rp.heldPages.Add(float64(len(pages)))
	rp.outcomes.WithLabelValues(reuseKept).Inc()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		outcome := t.sendKept(s, pages, rp.auxIndex(room))
		if outcome != "" {
			rp.outcomes.WithLabelValues(outcome).Inc()
		}
		rp.held.Dec() // (after the outcome: a reader of the gauge sees the count too)
		ch := s.Released()
		s.Clear()
		<-ch // (no read of a pushed room's pages is left once it ended)
		rp.pages.Put(pages)
		rp.heldPages.Sub(float64(len(pages)))
	}()
	engine := r.Instance + "-reuse"
	kvp := &openai.KVTransferParams{DoRemoteDecode: true, RemoteEngineID: &engine, RemoteRequestID: r.encodeReuse(tk, rp.host, rp.port),
		RemoteHost: &rp.host, RemotePort: &rp.port, RemoteNumTokens: n, TPSize: 1, PPSize: 1, RemoteBlocksExpiryTime: float64(exp.UnixMilli()) / 1e3}
	for _, p := range pages {
		kvp.RemoteBlockIDs = append(kvp.RemoteBlockIDs, int(p))
	}
	return kvp, room
}

// unsent releases a kept turn whose answer did not reach the client (so
// nobody can name it): at once, not at the lease's end.
func (t *tinyRank) unsent(room uint64, why string) {
	rp := t.r.reuse
	if rp == nil || rp.p == nil || room == 0 {
		return
	}
	if st, ok := rp.m.Status(room); ok && st != kvmanager.Failed && st != kvmanager.Success {
		rp.outcomes.WithLabelValues(reuseUnsent).Inc()
		rp.p.Abort(room, reuseUnsentReason+why)
	}
}

// reuseUnsentReason begins the abort reason of a kept turn released
// unsent (sendKept counts it as such, not as failed).
const reuseUnsentReason = "example: reuse: the answer naming the kept turn did not reach its client: "

// sendKept waits for a kept turn's fetch up to the lease, sends it, and
// returns its outcome.
func (t *tinyRank) sendKept(s *sender.Sender, pages []uint32, aux int) string {
	rp := t.r.reuse
	ctx, cancel := context.WithTimeout(context.Background(), rp.lease)
	defer cancel()
	st, _ := s.WaitReady(ctx)
	if st != kvmanager.WaitingForInput && st != kvmanager.Transferring {
		if st != kvmanager.Failed {
			s.Abort(fmt.Sprintf("example: the reuse lease (%s) of room %d ended: no prefill rank fetched the kept turn", rp.lease, s.Room()))
			return reuseExpired
		}
		if strings.HasPrefix(s.Failure(), reuseUnsentReason) {
			return "" // (counted unsent)
		}
		return reuseFailed
	}
	dctx, dcancel := context.WithTimeout(context.Background(), t.r.reqTimeout)
	defer dcancel()
	if err := s.Send(pages, true, aux); err != nil {
		s.Abort("example: reuse: " + err.Error())
	}
	if st, _ := s.Wait(dctx); st != kvmanager.Success {
		if st != kvmanager.Failed {
			s.Abort("example: reuse: the kept turn's transfer did not end within the request timeout")
		}
		return reuseFailed
	}
	return reuseUsed
}

// reusedPrefix is an earlier turn's KV fetched for a prefill: positions
// 0..n−1 of kv.
type reusedPrefix struct {
	kv *tinyllm.Dense
	n  int
}

// fetchReuse fetches the earlier turn a prefill leg's replayed
// kv_transfer_params name, when the prompt extends it: nil (counted) when
// there is none, it cannot be used, or it did not come within
// -reuse-timeout — the prefill then computes the whole prompt. A kept
// turn this deployment signed that it will not use (the prompt does not
// extend it, no reuse pages are free) is ended with a dummy REQUEST, so
// the decode rank's kept pages go back now, not at the lease's end.
func (t *tinyRank) fetchReuse(ctx context.Context, kv *openai.KVTransferParams, prompt []int) *reusedPrefix {
	r, rp := t.r, t.r.reuse
	if kv == nil || kv.RemoteEngineID == nil || kv.RemoteRequestID == "" {
		return nil // (a first turn: nothing replayed)
	}
	if rp == nil || rp.d == nil {
		// (no reuse metrics without -reuse-pages: logged only)
		t.reuseRefused("", "this prefill rank has no reuse path (-reuse-pages 0)", kv)
		return nil
	}
	tk, boot, err := r.parseReuse(kv)
	switch {
	case errors.Is(err, errReuseForged):
		t.reuseRefused(reuseForged, err.Error(), kv)
		return nil
	case err != nil:
		t.reuseRefused(reuseForeign, err.Error(), kv)
		return nil
	case !time.Now().Before(time.UnixMilli(tk.ExpiresMS)):
		t.reuseRefused(reuseStale, fmt.Sprintf("the reuse ticket of room %d expired at %s", tk.Room, time.UnixMilli(tk.ExpiresMS).Format(time.RFC3339Nano)), kv)
		return nil
	}
	// The process that kept the turn, registered now: a dead or
	// restarted one is skipped at once, not after -reuse-timeout.
	fctx, cancel := context.WithTimeout(ctx, rp.timeout)
	defer cancel()
	var ri records.RankInfo
	if err := getJSON(fctx, r.httpClient, boot+"/v1/ranks?dp=0&tp=0&pp=0", &ri); err != nil || ri.Epoch != tk.Epoch {
		why := fmt.Sprintf("the decode process that kept room %d (epoch %d) is not registered at %s", tk.Room, tk.Epoch, boot)
		if err != nil {
			why += ": " + err.Error()
		} else {
			why += fmt.Sprintf(": epoch %d is (restarted since)", ri.Epoch)
		}
		t.reuseRefused(reuseGone, why, kv)
		return nil
	}
	use := 0
	switch {
	case tk.Tokens < len(prompt) && promptHash(prompt[:tk.Tokens]) == tk.Hash:
		use = tk.Tokens
	case tk.Prompt < len(prompt) && promptHash(prompt[:tk.Prompt]) == tk.PromptHash:
		use = tk.Prompt // (the reply came back other than generated: the turn's prompt still holds)
	}
	if use == 0 {
		t.reuseRefused(reuseMismatch, fmt.Sprintf("the prompt (%d tokens) does not extend the kept turn of room %d (%d tokens)", len(prompt), tk.Room, tk.Tokens), kv)
		t.releaseKept(fctx, tk.Room, boot)
		return nil
	}
	pt := r.Model.PageTokens
	pages := rp.pages.Get((tk.Tokens + pt - 1) / pt)
	if pages == nil {
		rp.outcomes.WithLabelValues(reuseNoPages).Inc()
		t.releaseKept(fctx, tk.Room, boot)
		return nil
	}
	keepPages := false
	defer func() {
		if !keepPages {
			rp.pages.Put(pages)
		}
	}()
	fail := func(rc *receiver.Receiver, why string) *reusedPrefix {
		rp.outcomes.WithLabelValues(reuseFailed).Inc()
		r.log.Info("multi-turn reuse: fetching the earlier turn failed; computing the whole prompt",
			zap.Uint64("room", tk.Room), zap.String("decode", boot), zap.String("reason", why))
		if rc != nil {
			if rc.Poll() != kvmanager.Failed {
				rc.Abort("example: reuse: " + why)
			}
			ch := rc.Released()
			keepPages = true
			go func() { <-ch; rp.pages.Put(pages) }() // (a write may still land until Released)
		}
		return nil
	}
	rc, err := receiver.NewFor(rp.d, tk.Room, boot, kvmanager.AutoDP)
	if err != nil {
		return fail(nil, err.Error())
	}
	defer rc.Clear()
	if err := rc.Init(fctx, kvmanager.RequestSpec{DstPages: pages, AuxIndex: rp.auxIndex(tk.Room)}); err != nil {
		return fail(rc, err.Error())
	}
	if st, err := rc.Wait(fctx); st != kvmanager.Success {
		return fail(rc, fmt.Sprintf("%s %s %v", st, rc.Failure(), err))
	}
	dense := tinyllm.NewDense(t.m.Layers, t.m.KVHeads, t.m.HeadDim, len(prompt))
	copyInto(dense, &tinyllm.Seq{C: rp.cache, Pages: pages}, t.layer0, t.nlayers, t.first, t.heads, use)
	rp.outcomes.WithLabelValues(reuseReused).Inc()
	return &reusedPrefix{kv: dense, n: use}
}

// releaseKept ends a kept turn this rank will not use with a dummy
// REQUEST (nothing is written): its room on the decode rank ends now and
// its pages go back there, not at the lease's end.
func (t *tinyRank) releaseKept(ctx context.Context, room uint64, boot string) {
	rc, err := receiver.NewFor(t.r.reuse.d, room, boot, kvmanager.AutoDP)
	if err != nil {
		return
	}
	defer rc.Clear()
	if rc.Init(ctx, kvmanager.RequestSpec{Dummy: true, AuxIndex: -1}) == nil {
		rc.Wait(ctx) //nolint:errcheck // (the decode rank's lease ends it otherwise)
	}
	if rc.Poll() != kvmanager.Success && rc.Poll() != kvmanager.Failed {
		rc.Abort("example: reuse: releasing a kept turn not used")
	}
}

// reuseRefused counts and logs replayed kv_transfer_params not used.
func (t *tinyRank) reuseRefused(outcome, why string, kv *openai.KVTransferParams) {
	if rp := t.r.reuse; rp != nil && outcome != "" {
		rp.outcomes.WithLabelValues(outcome).Inc()
	}
	t.r.log.Info("multi-turn reuse: replayed kv_transfer_params not used; computing the whole prompt",
		zap.String("outcome", outcome), zap.String("reason", why), zap.String("remote_request_id", truncate(kv.RemoteRequestID, 128)))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
