package router

// The OpenAI wires: the router as SGLang's router (and the llm-d sidecar's
// sglang connector), or as the sidecar's nixlv2 (vLLM's serial flow),
// mooncake or offloading connector, drives a pair of instances through
// each instance's front.

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/openai"
)

// track counts an attempt in flight on both instances until the returned
// func runs.
func (rt *Router) track(pre, dec *Instance) func() {
	pre.inflight.Add(1)
	dec.inflight.Add(1)
	rt.inflightG.WithLabelValues("prefill", pre.Name).Inc()
	rt.inflightG.WithLabelValues("decode", dec.Name).Inc()
	return func() {
		pre.inflight.Add(-1)
		dec.inflight.Add(-1)
		rt.inflightG.WithLabelValues("prefill", pre.Name).Dec()
		rt.inflightG.WithLabelValues("decode", dec.Name).Dec()
	}
}

// clientBody is the client's request as the router forwards it (the
// fields the router read, the abort extension only on a first attempt).
func clientBody(cr *CompletionRequest, abort string) map[string]any {
	b := map[string]any{"prompt": cr.Prompt, "max_tokens": cr.MaxTokens, "stream": cr.Stream}
	if cr.Model != "" {
		b["model"] = cr.Model
	}
	if abort != "" {
		b["abort_at"] = abort
	}
	if cr.Fault != "" {
		b["fault"] = cr.Fault
	}
	return b
}

// openaiPost posts an OpenAI body to a front and reads its answer, each
// token to emit (nil: none).
func (rt *Router) openaiPost(ctx context.Context, url string, body map[string]any, reqID string, emit func(int) error) (*openai.Answer, error) {
	return rt.openaiPostHeader(ctx, url, body, reqID, emit, nil)
}

// openaiPostHeader is openaiPost with headers of its own.
func (rt *Router) openaiPostHeader(ctx context.Context, url string, body map[string]any, reqID string, emit func(int) error, header map[string]string) (*openai.Answer, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if rt.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+rt.cfg.Token)
	}
	if reqID != "" {
		req.Header.Set("X-Request-Id", reqID)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := rt.cfg.Client.Do(req)
	if err != nil {
		return nil, err
	}
	a, err := openai.ReadAnswer(resp, emit)
	if err != nil {
		return a, fmt.Errorf("%s: %w", url, err)
	}
	return a, nil
}

// report reads the front's "kvbridge" extension into the router's report.
func report(a *openai.Answer, rep *KVReport) {
	if a == nil || a.Final == nil || len(a.Final.KVBridge) == 0 {
		return
	}
	var e struct {
		Room        uint64 `json:"room,string"`
		PrefixPages int    `json:"prefix_pages"`
	}
	if json.Unmarshal(a.Final.KVBridge, &e) == nil {
		rep.PrefixPages = e.PrefixPages
		if e.Room != 0 {
			rep.Room = e.Room
		}
	}
}

// bootstrapHostPort splits an instance's bootstrap URL into SGLang's
// bootstrap_host and bootstrap_port.
func bootstrapHostPort(boot string) (string, int, error) {
	u, err := url.Parse(boot)
	if err != nil || u.Scheme != "http" {
		return "", 0, fmt.Errorf("the prefill instance's bootstrap %q is not an http:// bootstrap server (SGLang's wire names one by host and port)", boot)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		port = 80
	}
	return u.Hostname(), port, nil
}

// attemptSGLang: the same body, with bootstrap_host, bootstrap_port and
// bootstrap_room, to both fronts at once; the decode front's answer is the
// client's.
func (rt *Router) attemptSGLang(parent context.Context, pre, dec *Instance, room uint64, cr *CompletionRequest, abort string, emit func(int) error, rep *KVReport) error {
	ctx, cancel := context.WithTimeout(parent, rt.cfg.Timeout)
	defer cancel()
	defer rt.track(pre, dec)()
	host, port, err := bootstrapHostPort(pre.Bootstrap)
	if err != nil {
		return err
	}
	body := clientBody(cr, abort)
	body["bootstrap_host"], body["bootstrap_port"], body["bootstrap_room"] = host, port, room
	return rt.bothAtOnce(ctx, cancel, pre, dec, body, nil, body, emit, rep)
}

// bothAtOnce posts pbody (with header) to the prefill front and dbody to
// the decode front at once; the decode front's answer is the client's, and
// its failure cancels the prefill's request.
func (rt *Router) bothAtOnce(ctx context.Context, cancel context.CancelFunc, pre, dec *Instance, pbody map[string]any, header map[string]string,
	dbody map[string]any, emit func(int) error, rep *KVReport) error {
	perr := make(chan error, 1)
	go func() {
		_, err := rt.openaiPostHeader(ctx, pre.Ranks[0].URL+"/v1/completions", pbody, "", nil, header)
		perr <- err
	}()
	a, err := rt.openaiPost(ctx, dec.Ranks[0].URL+"/v1/completions", dbody, "", emit)
	if err != nil {
		cancel()
	}
	pe := <-perr
	report(a, rep)
	if err != nil {
		if pe != nil {
			return fmt.Errorf("decode: %w (prefill: %v)", err, pe)
		}
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}

// randomID is 128 random bits in hex: a request, transfer or KV request
// id.
func randomID() string {
	var id [16]byte
	crand.Read(id[:])
	return hex.EncodeToString(id[:])
}

// retryable is a status the sidecar retries a prefill on.
func retryable(err error) bool {
	var e *openai.Error
	return errors.As(err, &e) && (e.Status == 502 || e.Status == 503 || e.Status == 504)
}

// attemptVLLM: vLLM's serial flow. The prefill front gets the body with
// kv_transfer_params {do_remote_decode: true}, stream false and every
// token limit at 1, and an X-Request-Id (retried on 502, 503, 504); the
// decode front gets the client's body with the answer's
// kv_transfer_params, verbatim.
func (rt *Router) attemptVLLM(parent context.Context, pre, dec *Instance, cr *CompletionRequest, abort string, emit func(int) error, rep *KVReport) error {
	ctx, cancel := context.WithTimeout(parent, rt.cfg.Timeout)
	defer cancel()
	defer rt.track(pre, dec)()
	reqID := randomID()
	pbody := clientBody(cr, abort)
	pkv := map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	rt.replay(cr, pkv, rep)
	pbody["kv_transfer_params"] = pkv
	pbody["stream"] = false
	pbody["max_tokens"], pbody["max_completion_tokens"], pbody["min_tokens"] = 1, 1, 1
	var raw struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	for try := 0; ; try++ {
		a, err := rt.openaiPost(ctx, pre.Ranks[0].URL+"/v1/completions", pbody, reqID, nil)
		if err == nil {
			if err := json.Unmarshal(a.Raw, &raw); err != nil {
				return fmt.Errorf("prefill: %w", err)
			}
			rt.prefillAnswered(pre, a.Raw, rep)
			break
		}
		if !retryable(err) || try >= max(rt.cfg.PrefillRetries, 0) {
			return fmt.Errorf("prefill: %w", err)
		}
		// A prefill retried is a fresh room: an attempt of its own.
		rep.Attempts++
		rep.Failures = append(rep.Failures, "prefill: "+err.Error())
		rt.retries.Inc()
		delete(pbody, "abort_at") // (the test extension fails the first try only)
		// A retried prefill does not replay a kept turn again: the first
		// try may have fetched it (the sidecar drops it too).
		for _, f := range replayFields {
			delete(pkv, f)
		}
		pkv["remote_engine_id"], pkv["remote_block_ids"], pkv["remote_host"], pkv["remote_port"] = nil, nil, nil, nil
		select {
		case <-time.After(rt.cfg.Backoff):
		case <-ctx.Done():
			return fmt.Errorf("prefill: %w", ctx.Err())
		}
	}
	if len(raw.KV) == 0 || string(raw.KV) == "null" {
		return errors.New("prefill: the answer carries no kv_transfer_params")
	}
	dbody := clientBody(cr, abort)
	dbody["kv_transfer_params"] = raw.KV
	a, err := rt.openaiPost(ctx, dec.Ranks[0].URL+"/v1/completions", dbody, reqID, emit)
	report(a, rep)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	rt.keepTurn(cr, a)
	return nil
}

// attemptMooncake: vLLM's MooncakeConnector wire, as the sidecar's
// mooncake connector sends it: GET /query on the prefill instance's
// bootstrap server for its DP groups' engine ids (one picked), a fresh
// transfer_id, then both fronts at once — the prefill front the body
// capped to one token with kv_transfer_params {do_remote_decode: true,
// transfer_id} and X-data-parallel-rank, the decode front the client's
// body with {do_remote_prefill: true, transfer_id, remote_bootstrap_addr,
// remote_engine_id}, whose answer is the client's.
func (rt *Router) attemptMooncake(parent context.Context, pre, dec *Instance, room uint64, cr *CompletionRequest, abort string, emit func(int) error, rep *KVReport) error {
	ctx, cancel := context.WithTimeout(parent, rt.cfg.Timeout)
	defer cancel()
	defer rt.track(pre, dec)()
	engines, err := rt.mooncakeEngines(ctx, pre.Bootstrap)
	if err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	dps := make([]string, 0, len(engines))
	for dp := range engines {
		dps = append(dps, dp)
	}
	slices.Sort(dps)
	dp := dps[room%uint64(len(dps))] // (the sidecar picks one at random)
	xfer := "xfer-" + randomID()
	pbody := clientBody(cr, abort)
	pbody["kv_transfer_params"] = map[string]any{"do_remote_prefill": false, "do_remote_decode": true, "transfer_id": xfer}
	pbody["stream"] = false
	pbody["max_tokens"], pbody["max_completion_tokens"] = 1, 1
	dbody := clientBody(cr, abort)
	dbody["kv_transfer_params"] = map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "transfer_id": xfer,
		"remote_bootstrap_addr": pre.Bootstrap, "remote_engine_id": engines[dp]}
	return rt.bothAtOnce(ctx, cancel, pre, dec, pbody, map[string]string{"X-data-parallel-rank": dp}, dbody, emit, rep)
}

// mooncakeEngines asks a prefill instance's bootstrap server GET /query:
// DP group → engine id.
func (rt *Router) mooncakeEngines(ctx context.Context, boot string) (map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(boot, "/")+"/query", nil)
	if err != nil {
		return nil, err
	}
	resp, err := rt.cfg.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/query: %s", boot, resp.Status)
	}
	var data map[string]map[string]any
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&data); err != nil {
		return nil, fmt.Errorf("GET %s/query: %w", boot, err)
	}
	out := map[string]string{}
	for dp, e := range data {
		if id, ok := e["engine_id"].(string); ok {
			out[dp] = id
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("GET %s/query: no engine_id", boot)
	}
	return out, nil
}

// attemptOffloading: vLLM's OffloadingConnector P2P wire, as the
// sidecar's offloading connector sends it: a fresh kv_request_id; the
// prefill front first, the body capped to one token with
// kv_transfer_params {remote_decoder: {kv_request_id}}; then, once it
// answered, the decode front with the client's body and {remote_prefiller:
// {kv_request_id, remote_host, remote_port}} naming the prefill
// instance's bootstrap server.
func (rt *Router) attemptOffloading(parent context.Context, pre, dec *Instance, cr *CompletionRequest, abort string, emit func(int) error, rep *KVReport) error {
	ctx, cancel := context.WithTimeout(parent, rt.cfg.Timeout)
	defer cancel()
	defer rt.track(pre, dec)()
	host, port, err := bootstrapHostPort(pre.Bootstrap)
	if err != nil {
		return err
	}
	kvID := randomID()
	pbody := clientBody(cr, abort)
	pbody["kv_transfer_params"] = map[string]any{"remote_decoder": map[string]any{"kv_request_id": kvID}}
	pbody["stream"] = false
	pbody["max_tokens"], pbody["max_completion_tokens"] = 1, 1
	if _, err := rt.openaiPost(ctx, pre.Ranks[0].URL+"/v1/completions", pbody, "", nil); err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	dbody := clientBody(cr, abort)
	dbody["kv_transfer_params"] = map[string]any{"remote_prefiller": map[string]any{"kv_request_id": kvID, "remote_host": host, "remote_port": port}}
	a, err := rt.openaiPost(ctx, dec.Ranks[0].URL+"/v1/completions", dbody, "", emit)
	report(a, rep)
	if err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}
