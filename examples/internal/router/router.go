// Package router is the body of examples/router: an OpenAI-style
// completions endpoint in front of prefill and decode instances of the
// example ranks run with -compute tinyllm. Per request it picks a prefill
// and a decode instance (round robin or least loaded), makes up a room id,
// and hands both sides the room — the decode ranks also the prefill
// instance's bootstrap address — as SGLang's router hands out
// bootstrap_host, bootstrap_port and bootstrap_room; then it streams the
// decode instance's tokens back. A room that fails before its first token
// (an abort, a rank that died) is retried on a fresh room, on the next
// pair the policy picks. /metrics has TTFT and time per output token.
package router

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/openai"
	"github.com/kvbridge/kvbridge/examples/internal/rankcmd"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config is the router's.
type Config struct {
	// Prefill and Decode list the instances, each as its ranks' HTTP URLs
	// (any order: /v1/info tells each rank's place).
	Prefill, Decode [][]string
	// Token is the deployment's bearer token for the ranks' HTTP API.
	Token string
	// Policy: "round-robin" (default) or "least-loaded".
	Policy string
	// Retries: attempts after the first for a request whose room failed
	// before its first token (default 2; −1: none).
	Retries int
	// Timeout bounds one attempt (default 60 s).
	Timeout time.Duration
	// Backoff is the wait before the first retry, doubling (default 100
	// ms): a rank that restarts is back within a few.
	Backoff time.Duration
	// Client is the HTTP client for the ranks (default: a new one).
	Client *http.Client
	// Wire is how the router drives a pair (default "kvbridge"):
	//   - "kvbridge": every rank of both instances over its per-rank
	//     routes (/v1/prefill, /v1/generate), the room id made up here;
	//   - "sglang": the same OpenAI body to both instances' fronts at once,
	//     with bootstrap_host, bootstrap_port (the prefill instance's
	//     bootstrap server) and bootstrap_room, as SGLang's router and the
	//     llm-d sidecar send it;
	//   - "vllm": vLLM's serial flow, as the sidecar's nixlv2 connector
	//     sends it: the prefill front with kv_transfer_params
	//     {do_remote_decode: true}, stream false and the token limits at 1
	//     (retried on 502, 503, 504), then the decode front with the
	//     client's body and the answer's kv_transfer_params.
	//   - "mooncake": vLLM's MooncakeConnector wire, as the sidecar's
	//     mooncake connector sends it (GET /query on the prefill
	//     instance's bootstrap server, then both fronts at once with one
	//     transfer_id);
	//   - "offloading": vLLM's OffloadingConnector P2P wire, as the
	//     sidecar's offloading connector sends it (the prefill front with
	//     remote_decoder, then the decode front with remote_prefiller).
	//   - "push": vLLM push, as the sidecar's nixlv2 connector runs it
	//     with a cached prefill identity: the first request to a prefill
	//     instance as "vllm", caching the identity its answer carries,
	//     later ones both legs at once with one transfer_id.
	// With the OpenAI wires an instance may be listed by its front alone.
	Wire string
	// MultiTurn (wires vllm and push): multi-turn reuse as the sidecar's
	// bidirectional KV transfer runs it — a decode answer's
	// kv_transfer_params kept under the conversation it ends (prompt and
	// reply tokens) and replayed onto the prefill leg of the next request
	// whose prompt extends it, once.
	MultiTurn bool
	// PrefillRetries: vllm's retries of a prefill answered 502/503/504
	// (default 2; −1: none).
	PrefillRetries int
}

// Wires are the values of Config.Wire.
var Wires = []string{"kvbridge", "sglang", "vllm", "push", "mooncake", "offloading"}

// Instance is one prefill or decode instance.
type Instance struct {
	Name, Bootstrap string
	Shape           transfer.Parallel // sizes
	PageTokens      int               // every rank's tokens per page
	Ranks           []Rank            // by global index
	inflight        atomic.Int64
}

// Rank is one rank process of an instance.
type Rank struct {
	URL  string
	Info rankcmd.Info
}

// Router serves the completions API.
type Router struct {
	cfg              Config
	prefill, decode  []*Instance
	vocab            int
	rr               atomic.Uint64
	nextRoom         atomic.Uint64
	reg              *prometheus.Registry
	ttft, tpot, e2e  prometheus.Histogram
	requests         *prometheus.CounterVec
	retries, tokensC prometheus.Counter
	inflightG        *prometheus.GaugeVec
	ranks            *rankcmd.Client
	identities       sync.Map // push: prefill instance name → its cached identity (map[string]any)
	turns            turnCache
}

// CheckTopology says whether every decode rank of a decode shape can pull
// from a prefill shape (kvlayout.Links), nil if so.
func CheckTopology(m transfer.Model, prefill, decode transfer.Parallel) error {
	decode = decode.Norm()
	for pp := 0; pp < decode.PPSize; pp++ {
		for tp := 0; tp < decode.TPSize; tp++ {
			d := decode
			d.TPRank, d.PPRank, d.DPRank = tp, pp, 0
			if _, err := kvlayout.Links(m, prefill, d); err != nil {
				return err
			}
			if _, _, err := m.Heads(decode.TPSize, tp); err != nil {
				return err
			}
		}
	}
	for tp := 0; tp < prefill.Norm().TPSize; tp++ {
		if _, _, err := m.Heads(prefill.Norm().TPSize, tp); err != nil {
			return err
		}
	}
	return nil
}

// New reads every rank's /v1/info and checks the instances serve one
// model in shapes the rank mapping supports.
func New(ctx context.Context, cfg Config) (*Router, error) {
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.Policy == "" {
		cfg.Policy = "round-robin"
	}
	if cfg.Policy != "round-robin" && cfg.Policy != "least-loaded" {
		return nil, fmt.Errorf("router: policy %q: want round-robin or least-loaded", cfg.Policy)
	}
	if cfg.Retries == 0 {
		cfg.Retries = 2
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 60 * time.Second
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 100 * time.Millisecond
	}
	if cfg.Wire == "" {
		cfg.Wire = "kvbridge"
	}
	if !slices.Contains(Wires, cfg.Wire) {
		return nil, fmt.Errorf("router: wire %q: want %s", cfg.Wire, strings.Join(Wires, ", "))
	}
	if cfg.MultiTurn && cfg.Wire != "vllm" && cfg.Wire != "push" {
		return nil, fmt.Errorf("router: multi-turn reuse rides vLLM's kv_transfer_params: wire vllm or push, not %s", cfg.Wire)
	}
	if cfg.PrefillRetries == 0 {
		cfg.PrefillRetries = 2
	}
	if len(cfg.Prefill) == 0 || len(cfg.Decode) == 0 {
		return nil, errors.New("router: needs at least one prefill and one decode instance")
	}
	rt := &Router{cfg: cfg, ranks: &rankcmd.Client{HTTP: cfg.Client, Token: cfg.Token},
		turns: turnCache{turns: map[[32]byte]turn{}, lens: map[int]int{}}}
	var fp string
	var mapping transfer.Model
	for _, side := range []struct {
		role string
		urls [][]string
		dst  *[]*Instance
	}{{"prefill", cfg.Prefill, &rt.prefill}, {"decode", cfg.Decode, &rt.decode}} {
		for _, urls := range side.urls {
			in := &Instance{}
			for _, u := range urls {
				u = strings.TrimRight(u, "/")
				var info rankcmd.Info
				if err := rt.getJSON(ctx, u+"/v1/info", &info); err != nil {
					return nil, fmt.Errorf("router: %s rank %s: %w", side.role, u, err)
				}
				switch {
				case info.Role != side.role:
					return nil, fmt.Errorf("router: %s is a %s rank, listed as %s", u, info.Role, side.role)
				case info.Compute != "tinyllm":
					return nil, fmt.Errorf("router: %s computes %q: the router serves ranks run with -compute tinyllm", u, info.Compute)
				case fp == "":
					fp, rt.vocab, mapping = info.Fingerprint, info.Vocab, info.Model.Mapping(info.Layout)
				case info.Fingerprint != fp || kvlayout.WithPages(info.Model.Mapping(info.Layout), 0) != kvlayout.WithPages(mapping, 0):
					return nil, fmt.Errorf("router: %s serves %s (%v), another rank %s (%v)", u, info.Fingerprint, info.Model.Mapping(info.Layout), fp, mapping)
				}
				if in.Name == "" {
					in.Name, in.Shape, in.PageTokens = info.Instance, info.Parallel.Norm(), info.Model.PageTokens
				} else if info.Model.PageTokens != in.PageTokens {
					return nil, fmt.Errorf("router: %s (%s) keeps %d-token pages, its instance's other ranks %d-token ones", u, info.Instance, info.Model.PageTokens, in.PageTokens)
				} else if info.Instance != in.Name || info.Parallel.Norm().TPSize != in.Shape.TPSize ||
					info.Parallel.Norm().PPSize != in.Shape.PPSize || info.Parallel.Norm().DPSize != in.Shape.DPSize {
					return nil, fmt.Errorf("router: %s (%s, %v) is listed with %s (%v)", u, info.Instance, info.Parallel, in.Name, in.Shape)
				}
				if side.role == "prefill" && info.Parallel.Global() == 0 {
					in.Bootstrap = info.Bootstrap
				}
				in.Ranks = append(in.Ranks, Rank{URL: u, Info: info})
			}
			sort.Slice(in.Ranks, func(i, j int) bool { return in.Ranks[i].Info.Parallel.Global() < in.Ranks[j].Info.Parallel.Global() })
			sh := in.Shape
			frontOnly := cfg.Wire != "kvbridge" && len(in.Ranks) == 1 && in.Ranks[0].Info.Parallel.Global() == 0
			if len(in.Ranks) != sh.TPSize*sh.PPSize*sh.DPSize && !frontOnly {
				return nil, fmt.Errorf("router: %s instance %s has %d ranks listed, its shape %v has %d", side.role, in.Name, len(in.Ranks), sh, sh.TPSize*sh.PPSize*sh.DPSize)
			}
			for i, r := range in.Ranks {
				if r.Info.Parallel.Global() != i {
					return nil, fmt.Errorf("router: %s instance %s lists rank %v twice or misses one", side.role, in.Name, r.Info.Parallel)
				}
			}
			if side.role == "decode" && sh.DPSize != 1 {
				return nil, fmt.Errorf("router: decode instance %s has DP %d: the example generates on DP 1", in.Name, sh.DPSize)
			}
			*side.dst = append(*side.dst, in)
		}
	}
	for _, p := range rt.prefill {
		for _, d := range rt.decode {
			if err := CheckTopology(mapping, p.Shape, d.Shape); err != nil {
				return nil, fmt.Errorf("router: %s → %s: %w", p.Name, d.Name, err)
			}
			// Pages may differ in size (the ranks pair them by tokens)
			// when one size divides the other.
			if err := kvlayout.PageRatio(p.PageTokens, d.PageTokens); err != nil {
				return nil, fmt.Errorf("router: %s → %s: %w", p.Name, d.Name, err)
			}
		}
	}
	var b [8]byte
	crand.Read(b[:])
	rt.nextRoom.Store(binary.LittleEndian.Uint64(b[:]) >> 2) // room ids unique across router restarts
	rt.metrics()
	return rt, nil
}

func (rt *Router) metrics() {
	rt.reg = prometheus.NewRegistry()
	rt.reg.MustRegister(collectors.NewGoCollector())
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 16)
	rt.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvbridge_router_ttft_seconds", Help: "Time to first token: the request's arrival to its first token leaving the router.", Buckets: buckets})
	rt.tpot = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvbridge_router_tpot_seconds", Help: "Time per output token after the first (request mean).", Buckets: buckets})
	rt.e2e = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvbridge_router_request_seconds", Help: "The whole request.", Buckets: buckets})
	rt.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvbridge_router_requests_total", Help: "Completions by outcome (ok, failed, bad_request)."}, []string{"outcome"})
	rt.retries = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_router_retries_total", Help: "Rooms retried after failing before their first token."})
	rt.tokensC = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvbridge_router_output_tokens_total", Help: "Tokens streamed back."})
	rt.inflightG = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvbridge_router_inflight", Help: "Requests in flight per instance."}, []string{"role", "instance"})
	rt.reg.MustRegister(rt.ttft, rt.tpot, rt.e2e, rt.requests, rt.retries, rt.tokensC, rt.inflightG)
}

// Prefills and Decodes are the instances, as /v1/info described them.
func (rt *Router) Prefills() []*Instance { return rt.prefill }

// Decodes: see Prefills.
func (rt *Router) Decodes() []*Instance { return rt.decode }

func (rt *Router) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := rt.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}

// Handler serves POST /v1/completions, GET /metrics, GET /healthz and GET
// /v1/instances.
func (rt *Router) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", rt.serveCompletions)
	mux.Handle("/metrics", promhttp.HandlerFor(rt.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/v1/instances", func(w http.ResponseWriter, _ *http.Request) {
		type inst struct {
			Name      string   `json:"name"`
			Role      string   `json:"role"`
			Bootstrap string   `json:"bootstrap,omitempty"`
			Ranks     []string `json:"ranks"`
			InFlight  int64    `json:"inflight"`
		}
		var out []inst
		for _, s := range []struct {
			role string
			ins  []*Instance
		}{{"prefill", rt.prefill}, {"decode", rt.decode}} {
			for _, in := range s.ins {
				var urls []string
				for _, r := range in.Ranks {
					urls = append(urls, r.URL)
				}
				out = append(out, inst{in.Name, s.role, in.Bootstrap, urls, in.inflight.Load()})
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	})
	return mux
}

// CompletionRequest is the OpenAI completions request (the fields the
// router reads) with kvbridge's test extensions.
type CompletionRequest struct {
	Model     string          `json:"model,omitempty"`
	Prompt    json.RawMessage `json:"prompt"` // a string, or an array of token ids
	MaxTokens int             `json:"max_tokens"`
	Stream    bool            `json:"stream"`
	// AbortAt fails the first attempt's room on purpose: "prefill" (the
	// prefill ranks abort after the forward pass), "decode-before" or
	// "decode-mid"; the router retries it.
	AbortAt string `json:"abort_at,omitempty"`
	// Fault "swap-heads-prefill" or "swap-heads-decode": a deliberately
	// wrong head mapping on that side (every attempt), for tests.
	Fault  string `json:"fault,omitempty"`
	tokens []int  // the prompt's
}

// Choice is one completion choice.
type Choice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	TokenIDs     []int   `json:"token_ids"`
	FinishReason *string `json:"finish_reason"`
}

// Completion is the answer (and, streamed, each chunk).
type Completion struct {
	ID      string    `json:"id"`
	Object  string    `json:"object"`
	Created int64     `json:"created"`
	Model   string    `json:"model"`
	Choices []Choice  `json:"choices"`
	Usage   *Usage    `json:"usage,omitempty"`
	KV      *KVReport `json:"kvbridge,omitempty"`
}

// Usage counts tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// KVReport is what the router saw of the request's rooms.
type KVReport struct {
	Room        uint64   `json:"room"`
	Attempts    int      `json:"attempts"`
	Failures    []string `json:"failures,omitempty"` // why earlier attempts failed
	Prefill     string   `json:"prefill"`
	Decode      string   `json:"decode"`
	PrefixPages int      `json:"prefix_pages"`
	// Replayed: a kept turn's kv_transfer_params went on the prefill leg
	// (MultiTurn); ReusedTokens: the prompt tokens the prefill took from it.
	Replayed     bool    `json:"replayed,omitempty"`
	ReusedTokens int     `json:"reused_tokens,omitempty"`
	TTFTMS       float64 `json:"ttft_ms"`
	TPOTMS       float64 `json:"tpot_ms"`
}

// Text is the example's byte-level tokenizer (openai.Tokenize).
func Text(s string) []int { return openai.Tokenize(s) }

type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func (rt *Router) parse(req *http.Request) (*CompletionRequest, []int, error) {
	if req.Method != http.MethodPost {
		return nil, nil, &httpError{http.StatusMethodNotAllowed, "POST a completion request"}
	}
	var cr CompletionRequest
	if err := json.NewDecoder(io.LimitReader(req.Body, 4<<20)).Decode(&cr); err != nil {
		return nil, nil, &httpError{http.StatusBadRequest, "body must be a JSON completion request: " + err.Error()}
	}
	var prompt []int
	var text string
	if err := json.Unmarshal(cr.Prompt, &text); err == nil {
		if rt.vocab < 256 {
			return nil, nil, &httpError{http.StatusBadRequest, fmt.Sprintf("a text prompt needs a vocabulary of ≥ 256 (bytes), the model's is %d: send token ids", rt.vocab)}
		}
		prompt = Text(text)
	} else if err := json.Unmarshal(cr.Prompt, &prompt); err != nil {
		return nil, nil, &httpError{http.StatusBadRequest, "prompt must be a string or an array of token ids"}
	}
	switch {
	case len(prompt) == 0:
		return nil, nil, &httpError{http.StatusBadRequest, "empty prompt"}
	case cr.MaxTokens == 0:
		cr.MaxTokens = 16
	case cr.MaxTokens < 0 || cr.MaxTokens > 1<<16:
		return nil, nil, &httpError{http.StatusBadRequest, fmt.Sprintf("max_tokens %d not in [1, 65536]", cr.MaxTokens)}
	}
	for _, t := range prompt {
		if t < 0 || t >= rt.vocab {
			return nil, nil, &httpError{http.StatusBadRequest, fmt.Sprintf("token %d outside the vocabulary [0, %d)", t, rt.vocab)}
		}
	}
	switch cr.AbortAt {
	case "", "prefill", "decode-before", "decode-mid":
	default:
		return nil, nil, &httpError{http.StatusBadRequest, fmt.Sprintf("abort_at %.32q: want prefill, decode-before or decode-mid", cr.AbortAt)}
	}
	switch cr.Fault {
	case "", "swap-heads-prefill", "swap-heads-decode":
	default:
		return nil, nil, &httpError{http.StatusBadRequest, fmt.Sprintf("fault %.32q: want swap-heads-prefill or swap-heads-decode", cr.Fault)}
	}
	cr.tokens = prompt
	return &cr, prompt, nil
}

// pick chooses an instance.
func (rt *Router) pick(ins []*Instance, n uint64) *Instance {
	if rt.cfg.Policy == "least-loaded" {
		best := ins[0]
		for _, in := range ins[1:] {
			if in.inflight.Load() < best.inflight.Load() {
				best = in
			}
		}
		return best
	}
	return ins[n%uint64(len(ins))]
}

func (rt *Router) serveCompletions(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	cr, prompt, err := rt.parse(req)
	if err != nil {
		rt.requests.WithLabelValues("bad_request").Inc()
		var he *httpError
		errors.As(err, &he)
		http.Error(w, he.msg, he.code)
		return
	}
	fl, _ := w.(http.Flusher)
	model := cr.Model
	if model == "" {
		model = "tinyllm"
	}
	var tokens []int
	var first time.Time
	rep := &KVReport{}
	id := ""
	chunk := func(tok int) error {
		if len(tokens) == 0 {
			first = time.Now()
			rt.ttft.Observe(first.Sub(start).Seconds())
		}
		tokens = append(tokens, tok)
		rt.tokensC.Inc()
		if !cr.Stream {
			return nil
		}
		if len(tokens) == 1 {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
		}
		c := Completion{ID: id, Object: "text_completion", Created: start.Unix(), Model: model,
			Choices: []Choice{{Text: openai.Detok(tok), TokenIDs: []int{tok}}}}
		if err := sse(w, c); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		return nil
	}
	n := rt.rr.Add(1) - 1
	var failErr error
	for attempt := 0; attempt <= max(rt.cfg.Retries, 0); attempt++ {
		pre, dec := rt.pick(rt.prefill, n+uint64(attempt)), rt.pick(rt.decode, n+uint64(attempt))
		room := rt.nextRoom.Add(1)
		if attempt == 0 {
			id = fmt.Sprintf("cmpl-%d", room)
		} else {
			rt.retries.Inc()
			select {
			case <-time.After(rt.cfg.Backoff << (attempt - 1)):
			case <-req.Context().Done():
			}
		}
		rep.Room, rep.Prefill, rep.Decode = room, pre.Name, dec.Name
		rep.Attempts++
		abort := ""
		if attempt == 0 {
			abort = cr.AbortAt
		}
		switch rt.cfg.Wire {
		case "sglang":
			failErr = rt.attemptSGLang(req.Context(), pre, dec, room, cr, abort, chunk, rep)
		case "vllm":
			failErr = rt.attemptVLLM(req.Context(), pre, dec, cr, abort, chunk, rep)
		case "push":
			failErr = rt.attemptPush(req.Context(), pre, dec, cr, abort, chunk, rep)
		case "mooncake":
			failErr = rt.attemptMooncake(req.Context(), pre, dec, room, cr, abort, chunk, rep)
		case "offloading":
			failErr = rt.attemptOffloading(req.Context(), pre, dec, cr, abort, chunk, rep)
		default:
			failErr = rt.attempt(req.Context(), pre, dec, room, prompt, cr.MaxTokens, abort, cr.Fault, chunk, rep)
		}
		if failErr == nil || len(tokens) > 0 || req.Context().Err() != nil {
			break
		}
		rep.Failures = append(rep.Failures, failErr.Error())
	}
	done := time.Now()
	rt.e2e.Observe(done.Sub(start).Seconds())
	if len(tokens) > 0 {
		rep.TTFTMS = float64(first.Sub(start).Microseconds()) / 1e3
	}
	if len(tokens) > 1 {
		tpot := done.Sub(first).Seconds() / float64(len(tokens)-1)
		rt.tpot.Observe(tpot)
		rep.TPOTMS = tpot * 1e3
	}
	if failErr != nil {
		rt.requests.WithLabelValues("failed").Inc()
		msg := fmt.Sprintf("completion failed after %d attempts: %v", rep.Attempts, failErr)
		if cr.Stream && len(tokens) > 0 {
			sse(w, map[string]any{"error": map[string]string{"message": msg}})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "failures": rep.Failures}})
		return
	}
	rt.requests.WithLabelValues("ok").Inc()
	finish := "length"
	usage := &Usage{PromptTokens: len(prompt), CompletionTokens: len(tokens), TotalTokens: len(prompt) + len(tokens)}
	if cr.Stream {
		sse(w, Completion{ID: id, Object: "text_completion", Created: start.Unix(), Model: model,
			Choices: []Choice{{TokenIDs: []int{}, FinishReason: &finish}}, Usage: usage, KV: rep})
		io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	var text strings.Builder
	for _, t := range tokens {
		text.WriteString(openai.Detok(t))
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(Completion{ID: id, Object: "text_completion", Created: start.Unix(), Model: model,
		Choices: []Choice{{Text: text.String(), TokenIDs: tokens, FinishReason: &finish}}, Usage: usage, KV: rep})
}

func sse(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	_, err := fmt.Fprintf(w, "data: %s\n", b.Bytes())
	return err
}

// attempt runs one room: every decode rank's /v1/generate (the first
// streams), every prefill rank of the room's DP group's /v1/prefill.
func (rt *Router) attempt(parent context.Context, pre, dec *Instance, room uint64, prompt []int, maxTokens int, abort, fault string, emit func(int) error, rep *KVReport) error {
	ctx, cancel := context.WithTimeout(parent, rt.cfg.Timeout)
	defer cancel()
	defer rt.track(pre, dec)()
	timeoutMS := int(rt.cfg.Timeout.Milliseconds())
	var peers []string
	for _, r := range dec.Ranks[1:] {
		peers = append(peers, r.URL)
	}
	g := rankcmd.GenerateRequest{Room: room, Prompt: prompt, MaxTokens: maxTokens, Prefill: pre.Bootstrap, TimeoutMS: timeoutMS}
	p := rankcmd.PrefillRequest{Room: room, Prompt: prompt, TimeoutMS: timeoutMS}
	switch abort {
	case "prefill":
		p.AbortAt = "compute"
	case "decode-before":
		g.AbortAt = "before"
	case "decode-mid":
		g.AbortAt = "mid"
	}
	switch fault {
	case "swap-heads-prefill":
		p.Fault = "swap-heads"
	case "swap-heads-decode":
		g.Fault = "swap-heads"
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	// The other decode ranks and the prefill ranks: their answers only
	// matter if something failed.
	gr := g // (the other ranks gather nothing)
	for _, r := range dec.Ranks[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ev, err := rt.ranks.Generate(ctx, r.URL, gr, nil); err != nil {
				fail(fmt.Errorf("decode %s: %w", r.URL, err))
			} else if ev.Status != "Success" || ev.Error != "" {
				fail(fmt.Errorf("decode %s: room %d %s %s%s", r.URL, room, ev.Status, ev.Reason, ev.Error))
			}
		}()
	}
	group := int(room % uint64(pre.Shape.DPSize))
	for _, r := range pre.Ranks {
		if r.Info.Parallel.DPRank != group {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := rt.ranks.Prefill(ctx, r.URL, p)
			if err != nil {
				// A prefill rank that cannot take the room (down,
				// restarting, refusing it) fails the attempt now rather
				// than at the decode side's deadline.
				fail(fmt.Errorf("prefill %s: %w", r.URL, err))
				cancel()
				return
			}
			if res.Status != "Success" || res.Error != "" {
				fail(fmt.Errorf("prefill %s: room %d %s %s%s", r.URL, room, res.Status, res.Reason, res.Error))
			}
		}()
	}
	g.Peers = peers
	ev, err := rt.ranks.Generate(ctx, dec.Ranks[0].URL, g, emit)
	if err == nil && (ev.Status != "Success" || ev.Error != "") {
		err = fmt.Errorf("decode %s: room %d %s %s%s", dec.Ranks[0].URL, room, ev.Status, ev.Reason, ev.Error)
	}
	if err == nil && ev.Tokens != maxTokens {
		err = fmt.Errorf("decode %s: %d tokens of %d", dec.Ranks[0].URL, ev.Tokens, maxTokens)
	}
	if err != nil {
		cancel() // the other ranks' rooms fail (their handlers abort)
	}
	wg.Wait()
	rep.PrefixPages = ev.PrefixPages
	if err != nil {
		mu.Lock()
		defer mu.Unlock()
		return errors.Join(append([]error{err}, errs...)...)
	}
	return nil
}
