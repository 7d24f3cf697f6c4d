package e2e

// The example ranks behind the routers people run: each test sends the
// requests the llm-d routing sidecar sends (its sglang and nixlv2
// connectors, as observed on the wire) to real rank processes' OpenAI
// routes, and compares every completion with the same model in this
// process.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/openai"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pdClient sends what the llm-d sidecar sends to a prefill and a decode
// server (their fronts), the way it sends it:
//   - sglang: the client's body plus bootstrap_host (the prefill server's
//     host), bootstrap_port and bootstrap_room (time-based, unique), the
//     same bytes to both at once, the prefill's request not cancelled with
//     the client's; the decode server's answer is the client's;
//   - nixlv2: first the prefill server, with kv_transfer_params
//     {do_remote_decode: true, …: null}, stream false (stream_options
//     dropped), max_tokens, max_completion_tokens and min_tokens at 1 and
//     an X-Request-Id, retried on 502, 503 and 504; then the decode server
//     with the client's body and the answer's kv_transfer_params, decoded
//     into float64s and encoded again as the sidecar does, and the same
//     X-Request-Id. A server it cannot reach answers 502, as its reverse
//     proxy does.
type pdClient struct {
	http              *http.Client
	token             string
	prefill, decode   string // the fronts' URLs
	bootPort          int    // SGLANG_BOOTSTRAP_PORT: the prefill instance's bootstrap port
	retries           int
	prefillStatus     chan int     // sglang: what each prefill request answered (the sidecar discards it)
	prefillAnswer     atomic.Value // mooncake: the last refused prefill leg's answer (string)
	pushes            *pushCache
	lastPrefillAnswer map[string]any
}

func newPDClient(t testing.TB, c *tinyCluster) *pdClient {
	u, err := url.Parse(c.prefill[0].boot)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	return &pdClient{http: c.client, token: testauth.Auth().BootstrapToken(), prefill: c.prefill[0].http, decode: c.decode[0].http,
		bootPort: port, retries: 3, prefillStatus: make(chan int, 64), pushes: &pushCache{}}
}

// send posts a body; a transport failure is a 502, as the sidecar's
// reverse proxy answers it.
func (p *pdClient) send(ctx context.Context, url string, body []byte, reqID string, onToken func(int) error) (*openai.Answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+p.token) // the client's, passed through
	if reqID != "" {
		req.Header.Set("X-Request-Id", reqID)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		e := openai.Errorf(http.StatusBadGateway, "proxy", "%v", err)
		return nil, e
	}
	return openai.ReadAnswer(resp, onToken)
}

func status(err error) int {
	var e *openai.Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func clone(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	json.Unmarshal(b, &out)
	return out
}

// sglangRoom is how the sidecar makes bootstrap_room.
func sglangRoom() uint64 { return uint64(time.Now().UnixNano()) + uint64(mrand.IntN(1000)) }

// sglang sends a request in SGLang's wire with a given room.
func (p *pdClient) sglangRoom(ctx context.Context, path string, client map[string]any, room uint64, onToken func(int) error) (*openai.Answer, error) {
	u, _ := url.Parse(p.prefill)
	body := clone(client)
	body["bootstrap_host"], body["bootstrap_port"] = u.Hostname(), p.bootPort
	b, _ := json.Marshal(body)
	// bootstrap_room goes in as the sidecar's int64 does: exact.
	b = append(b[:len(b)-1], fmt.Sprintf(`,"bootstrap_room":%d}`, room)...)
	go func() {
		_, err := p.send(context.WithoutCancel(ctx), p.prefill+path, b, "", nil)
		code := 200
		if err != nil {
			code = max(status(err), 1)
		}
		p.prefillStatus <- code
	}()
	return p.send(ctx, p.decode+path, b, "", onToken)
}

func (p *pdClient) sglang(ctx context.Context, path string, client map[string]any) (*openai.Answer, error) {
	return p.sglangRoom(ctx, path, client, sglangRoom(), nil)
}

// vllm sends a request in vLLM's serial wire.
func (p *pdClient) vllm(ctx context.Context, path string, client map[string]any) (*openai.Answer, error) {
	var id [16]byte
	rand.Read(id[:])
	reqID := hex.EncodeToString(id[:])
	kv, err := p.vllmPrefill(ctx, path, client, reqID)
	if err != nil {
		return nil, err
	}
	return p.vllmDecode(ctx, path, client, kv, reqID)
}

func (p *pdClient) vllmPrefill(ctx context.Context, path string, client map[string]any, reqID string) (any, error) {
	body := clone(client)
	body["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	body["stream"] = false
	delete(body, "stream_options")
	body["max_tokens"], body["max_completion_tokens"], body["min_tokens"] = 1, 1, 1
	b, _ := json.Marshal(body)
	for try := 0; ; try++ {
		a, err := p.send(ctx, p.prefill+path, b, reqID, nil)
		if err == nil {
			var ans map[string]any
			if err := json.Unmarshal(a.Raw, &ans); err != nil {
				return nil, err
			}
			p.lastPrefillAnswer = ans
			return ans["kv_transfer_params"], nil
		}
		if s := status(err); (s != 502 && s != 503 && s != 504) || try >= p.retries {
			return nil, err
		}
		select {
		case <-time.After(200 * time.Millisecond): // the sidecar's retry back-off
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (p *pdClient) vllmDecode(ctx context.Context, path string, client map[string]any, kv any, reqID string) (*openai.Answer, error) {
	body := clone(client)
	body["kv_transfer_params"] = kv
	b, _ := json.Marshal(body)
	return p.send(ctx, p.decode+path, b, reqID, nil)
}

// openaiCluster starts a pair whose decode ranks have no default
// bootstrap (each room names its prefill instance) and waits for both
// fronts to report their instance whole.
func openaiCluster(t *testing.T, layout string, pShape, dShape transfer.Parallel, prefill ...string) (*tinyCluster, *pdClient) {
	t.Helper()
	c := startTinyClusterWith(t, tinyE2E, layout, pShape, dShape, tinyOpts{prefill: append([]string{"-request-timeout", "20s"}, prefill...),
		decode: []string{"-request-timeout", "20s"}, decodeNoBootstrap: true})
	for _, front := range []string{c.prefill[0].http, c.decode[0].http} {
		resp, err := c.client.Get(front + "/health")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s/health: %v %v", front, err, resp)
		}
		resp.Body.Close()
	}
	return c, newPDClient(t, c)
}

// body is a client's request: a text prompt (a string) or token ids, or
// chat messages (path /v1/chat/completions).
func body(prompt any, maxTokens int, stream bool) map[string]any {
	b := map[string]any{"model": "tinyllm", "max_tokens": maxTokens, "stream": stream}
	if msgs, ok := prompt.([]map[string]any); ok {
		b["messages"] = msgs
	} else {
		b["prompt"] = prompt
	}
	return b
}

// want is the single-process run's tokens for a body.
func (c *tinyCluster) want(t *testing.T, b map[string]any) []int {
	t.Helper()
	var ids []int
	switch p := b["prompt"].(type) {
	case string:
		ids = openai.Tokenize(p)
	case []int:
		ids = p
	case nil:
		raw, _ := json.Marshal(b["messages"])
		var msgs []openai.Message
		json.Unmarshal(raw, &msgs)
		text, err := openai.ChatTemplate(msgs)
		if err != nil {
			t.Fatal(err)
		}
		ids = openai.Tokenize(text)
	}
	w, err := c.m.Generate(ids, b["max_tokens"].(int))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

var roomsLine = regexp.MustCompile(`^(kvbridge_rooms|kvbridge_example_kv_held_rooms)(\{[^}]*\})? ([0-9.e+-]+)$`)

// rooms counts the rooms a rank holds: live in its core, and held for a
// decode request (vLLM's flow).
func rooms(cl *http.Client, rank string) (float64, error) {
	resp, err := cl.Get(rank + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	n := 0.0
	for _, l := range strings.Split(b.String(), "\n") {
		if m := roomsLine.FindStringSubmatch(l); m != nil {
			v, _ := strconv.ParseFloat(m[3], 64)
			n += v
		}
	}
	return n, nil
}

// nothingPinned waits (up to 15 s: the rooms' other sides hear of a
// failure within a heartbeat bound) until no rank holds a room.
func (c *tinyCluster) nothingPinned(t *testing.T) {
	t.Helper()
	c.nothingPinnedWithin(t, 15*time.Second)
}

// nothingPinnedWithin: no rank holds a room within d (a bound shorter
// than a lease shows that a refusal released the room, not its lease).
func (c *tinyCluster) nothingPinnedWithin(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var held []string
		for _, p := range append(slices.Clone(c.prefill), c.decode...) {
			n, err := rooms(c.client, p.http)
			if err != nil || n != 0 {
				held = append(held, fmt.Sprintf("%s %s: %v rooms %v", p.role, p.http, n, err))
			}
		}
		if len(held) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rooms still held %v after the requests ended: %s", d, strings.Join(held, "; "))
		}
		time.Sleep(20 * time.Millisecond) // polling the ranks' metrics
	}
}

func (p *pdClient) mode(m string) func(context.Context, string, map[string]any) (*openai.Answer, error) {
	switch m {
	case "sglang":
		return p.sglang
	case "mooncake":
		return p.mooncake
	case "offloading":
		return p.offloading
	case "push":
		return p.push
	}
	return p.vllm
}

// capOneToken makes a prefill leg's body as the sidecar's CapSingleToken
// does: one output token (max_tokens, and max_completion_tokens for chat),
// no min_tokens, not streamed.
func capOneToken(b map[string]any, path string) {
	b["max_tokens"] = 1
	if path == "/v1/chat/completions" {
		b["max_completion_tokens"] = 1
	}
	delete(b, "min_tokens")
	b["stream"] = false
	delete(b, "stream_options")
}

// pushCache is a pdClient's vLLM push state: the prefill server's cached
// identity (map[string]any), and the requests sent serially and at once.
type pushCache struct {
	identity                       atomic.Value
	serialPushes, concurrentPushes atomic.Int64
}

// pushIdentityFields are the fields of a prefill answer's
// kv_transfer_params the sidecar caches as a prefill endpoint's vLLM push
// identity (required ones true).
var pushIdentityFields = map[string]bool{"remote_engine_id": true, "remote_host": true, "remote_port": true, "tp_size": true,
	"transfer_mode": true, "pp_size": false, "dcp_size": false}

// pushIdentity is the identity in a prefill answer's kv_transfer_params
// (false: none, as the sidecar reads it: transfer_mode push and every
// required field a string or a number).
func pushIdentity(kv any) (map[string]any, bool) {
	m, ok := kv.(map[string]any)
	if !ok || m["transfer_mode"] != "push" {
		return nil, false
	}
	id := map[string]any{}
	for f, req := range pushIdentityFields {
		v, present := m[f]
		if !present && !req {
			continue
		}
		switch v.(type) {
		case string, float64:
			id[f] = v
		default:
			return nil, false
		}
	}
	return id, true
}

// push sends a request as the sidecar's nixlv2 connector in vLLM push
// mode does: with no identity cached for the prefill server, the serial
// flow (vllm), caching the identity its answer carries; with one, both
// legs at once — the prefill server the nixlv2 prefill body with a fresh
// transfer_id and X-Request-Id, the decode server the client's body with
// the identity, do_remote_prefill, remote_request_id and the same
// transfer_id —, the decode's answer the client's once the prefill
// answered with the same identity (else the decode leg is sent again with
// the prefill's kv_transfer_params, serially).
func (p *pdClient) push(ctx context.Context, path string, client map[string]any) (*openai.Answer, error) {
	var id [16]byte
	rand.Read(id[:])
	reqID := hex.EncodeToString(id[:])
	identity, _ := p.pushes.identity.Load().(map[string]any)
	if identity == nil {
		kv, err := p.vllmPrefill(ctx, path, client, reqID)
		if err != nil {
			return nil, err
		}
		if idn, ok := pushIdentity(kv); ok {
			p.pushes.identity.Store(idn)
		}
		p.pushes.serialPushes.Add(1)
		return p.vllmDecode(ctx, path, client, kv, reqID)
	}
	pb, db := pushLegs(path, client, identity, reqID)
	type res struct {
		a   *openai.Answer
		err error
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pc := make(chan res, 1)
	go func() {
		a, err := p.send(pctx, p.prefill+path, pb, reqID, nil)
		pc <- res{a, err}
	}()
	a, err := p.send(ctx, p.decode+path, db, reqID, nil)
	p.pushes.concurrentPushes.Add(1)
	if err != nil {
		// The sidecar: decode failed first — the prefill is cancelled
		// (it could write into blocks decode freed), decode's error is the
		// client's, and the identity is dropped (the next request goes
		// serially and learns it again).
		cancel()
		<-pc
		p.pushes.identity.Store(map[string]any(nil))
		return nil, err
	}
	pr := <-pc
	if pr.err != nil {
		return nil, pr.err // the prefill's error is the client's
	}
	var ans map[string]any
	if e := json.Unmarshal(pr.a.Raw, &ans); e != nil {
		return nil, e
	}
	if idn, ok := pushIdentity(ans["kv_transfer_params"]); !ok || !maps.Equal(idn, identity) {
		p.pushes.identity.Store(idn)
		return p.vllmDecode(ctx, path, client, ans["kv_transfer_params"], reqID)
	}
	return a, err
}

// pushLegs are the two legs of vLLM push's concurrent dispatch from a
// cached identity: a fresh transfer_id; the prefill leg the client's body
// capped to one token with the nixlv2 fields (null) and the transfer id,
// the decode leg the client's body with the identity, the request id and
// the transfer id.
func pushLegs(path string, client, identity map[string]any, reqID string) (pre, dec []byte) {
	var id [16]byte
	rand.Read(id[:])
	xfer := "tx" + hex.EncodeToString(id[:])
	pb := clone(client)
	pb["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil, "transfer_id": xfer}
	capOneToken(pb, path)
	dkv := clone(identity)
	dkv["do_remote_prefill"], dkv["do_remote_decode"], dkv["remote_request_id"], dkv["transfer_id"] = true, false, reqID, xfer
	db := clone(client)
	db["kv_transfer_params"] = dkv
	pre, _ = json.Marshal(pb)
	dec, _ = json.Marshal(db)
	return pre, dec
}

// offloading sends a request as the sidecar's "offloading" connector does
// (vLLM's OffloadingConnector P2P wire): a fresh kv_request_id; first the
// prefill server, the client's body capped to one token with
// kv_transfer_params {remote_decoder: {kv_request_id}}, its answer
// discarded — a failed one is the client's answer and no decode leg goes
// —; then the decode server, the client's body with {remote_prefiller:
// {kv_request_id, remote_host: the prefill host, remote_port: its P2P
// port, here the prefill instance's bootstrap port}}.
func (p *pdClient) offloading(ctx context.Context, path string, client map[string]any) (*openai.Answer, error) {
	return p.offloadingWith(ctx, path, client, nil)
}

func (p *pdClient) offloadingWith(ctx context.Context, path string, client map[string]any, edit func(pre, dec map[string]any)) (*openai.Answer, error) {
	var id [16]byte
	rand.Read(id[:])
	kvID := hex.EncodeToString(id[:])
	u, _ := url.Parse(p.prefill)
	pre := clone(client)
	pre["kv_transfer_params"] = map[string]any{"remote_decoder": map[string]any{"kv_request_id": kvID}}
	capOneToken(pre, path)
	dec := clone(client)
	dec["kv_transfer_params"] = map[string]any{"remote_prefiller": map[string]any{"kv_request_id": kvID, "remote_host": u.Hostname(), "remote_port": p.bootPort}}
	if edit != nil {
		edit(pre, dec)
	}
	pb, _ := json.Marshal(pre)
	db, _ := json.Marshal(dec)
	if _, err := p.send(ctx, p.prefill+path, pb, "", nil); err != nil {
		return nil, err
	}
	return p.send(ctx, p.decode+path, db, "", nil)
}

// mooncakeQuery is what the sidecar's "mooncake" connector asks first:
// GET /query on the prefill host's bootstrap port (8998 by default, here
// the instance's bootstrap port), dp rank → engine id.
func (p *pdClient) mooncakeQuery(ctx context.Context) (map[string]string, error) {
	u, _ := url.Parse(p.prefill)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/query", net.JoinHostPort(u.Hostname(), strconv.Itoa(p.bootPort))), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		return nil, fmt.Errorf("GET /query: %s", resp.Status)
	}
	var data map[string]map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&data); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for dp, e := range data {
		if id, ok := e["engine_id"].(string); ok {
			out[dp] = id
		}
	}
	return out, nil
}

// mooncake sends a request as the sidecar's "mooncake" connector does:
// GET /query for the prefill instance's engine ids, one DP rank picked,
// a fresh transfer_id; then both legs at once — to the prefill server the
// client's body capped to one token (stream false, stream_options and
// min_tokens dropped) with kv_transfer_params {do_remote_prefill: false,
// do_remote_decode: true, transfer_id} and the header
// X-data-parallel-rank, not cancelled with the client's; to the decode
// server the client's body with {do_remote_prefill: true,
// do_remote_decode: false, transfer_id, remote_bootstrap_addr,
// remote_engine_id}, whose answer is the client's.
func (p *pdClient) mooncake(ctx context.Context, path string, client map[string]any) (*openai.Answer, error) {
	return p.mooncakeWith(ctx, path, client, "", nil)
}

// mooncakeWith is mooncake with a given transfer id ("": a fresh one) and
// an edit of both legs before they are sent (a malformed request).
func (p *pdClient) mooncakeWith(ctx context.Context, path string, client map[string]any, xfer string, edit func(pre, dec map[string]any, dpHeader *string)) (*openai.Answer, error) {
	engines, err := p.mooncakeQuery(ctx)
	if err != nil {
		return nil, openai.Errorf(http.StatusBadGateway, "proxy", "%v", err)
	}
	var dp, engine string
	for dp, engine = range engines {
		break
	}
	if xfer == "" {
		var id [16]byte
		rand.Read(id[:])
		xfer = "xfer-" + hex.EncodeToString(id[:])
	}
	u, _ := url.Parse(p.prefill)
	pre := clone(client)
	pre["kv_transfer_params"] = map[string]any{"do_remote_prefill": false, "do_remote_decode": true, "transfer_id": xfer}
	capOneToken(pre, path)
	dec := clone(client)
	dec["kv_transfer_params"] = map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "transfer_id": xfer,
		"remote_bootstrap_addr": "http://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(p.bootPort)), "remote_engine_id": engine}
	if edit != nil {
		edit(pre, dec, &dp)
	}
	pb, _ := json.Marshal(pre)
	db, _ := json.Marshal(dec)
	go func() {
		code := 200
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, p.prefill+path, bytes.NewReader(pb))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+p.token)
			req.Header.Set("X-data-parallel-rank", dp)
			var resp *http.Response
			if resp, err = p.http.Do(req); err == nil {
				code = resp.StatusCode
				msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				if code != 200 {
					p.prefillAnswer.Store(string(msg))
				}
			}
		}
		if err != nil {
			code = 502
		}
		p.prefillStatus <- code
	}()
	return p.send(ctx, p.decode+path, db, "", nil)
}

// TestOpenAIWires: both wires over prefill TP 2 → decode TP 1 (NHD) and
// TP 1 → 2 (HND, layer-wise), completions and chat, streamed and not,
// text and token-id prompts: every answer token-identical to one process,
// with its usage; a request without P/D fields served by the decode front
// alone; nothing left held on any rank.
func TestOpenAIWires(t *testing.T) {
	t.Parallel() // its own processes and ports
	for _, tc := range []struct {
		name           string
		layout         string
		pShape, dShape transfer.Parallel
		prefill        []string
	}{
		{"TP2to1", "NHD", transfer.Parallel{TPSize: 2}, transfer.Parallel{TPSize: 1}, nil},
		{"TP1to2", "HND", transfer.Parallel{TPSize: 1}, transfer.Parallel{TPSize: 2}, []string{"-layerwise"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, pd := openaiCluster(t, tc.layout, tc.pShape, tc.dShape, tc.prefill...)
			rng := mrand.New(mrand.NewPCG(7, 7))
			chat := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": []map[string]any{{"type": "text", "text": "where does the KV go?"}}}}
			for _, mode := range []string{"sglang", "vllm", "mooncake", "offloading", "push"} {
				send := pd.mode(mode)
				for i, req := range []struct {
					path string
					b    map[string]any
				}{
					{"/v1/completions", body(tinyPrompt(rng, 9), 6, false)},
					{"/v1/completions", body("the KV cache moves from prefill to decode", 5, true)},
					{"/v1/chat/completions", body(chat, 4, false)},
					{"/v1/chat/completions", body(chat, 5, true)},
				} {
					if i == 1 {
						req.b["stream_options"] = map[string]any{"include_usage": true}
					}
					a, err := send(context.Background(), req.path, req.b)
					if err != nil {
						t.Fatalf("%s %s %v: %v", mode, req.path, req.b["prompt"], err)
					}
					if want := c.want(t, req.b); !slices.Equal(a.Tokens, want) {
						t.Fatalf("%s %s: tokens %v, the single-process run's %v", mode, req.path, a.Tokens, want)
					}
					if st := req.b["stream"].(bool); a.Usage == nil && (!st || i == 1) {
						t.Errorf("%s %s: no usage", mode, req.path)
					} else if a.Usage != nil && a.Usage.CompletionTokens != len(a.Tokens) {
						t.Errorf("%s %s: usage %+v for %d tokens", mode, req.path, a.Usage, len(a.Tokens))
					}
					if obj := a.Final.Object; req.path == "/v1/chat/completions" && !strings.HasPrefix(obj, "chat.completion") {
						t.Errorf("%s: a chat answer of object %q", mode, obj)
					}
				}
			}
			// No P/D fields: the decode front serves it alone.
			b := body(tinyPrompt(rng, 7), 5, false)
			raw, _ := json.Marshal(b)
			a, err := pd.send(context.Background(), pd.decode+"/v1/completions", raw, "", nil)
			if err != nil || !slices.Equal(a.Tokens, c.want(t, b)) {
				t.Fatalf("local: %v %v", a, err)
			}
			c.nothingPinned(t)
		})
	}
}

// TestOpenAIRouterWires: the example router's -wire sglang, vllm,
// mooncake and offloading in front of the fronts (instances listed by every rank): token identity,
// a request aborted on purpose on each side retried on a fresh room, and
// nothing held.
func TestOpenAIRouterWires(t *testing.T) {
	t.Parallel() // its own processes and ports
	for _, wire := range []string{"sglang", "vllm", "push", "mooncake", "offloading"} {
		t.Run(wire, func(t *testing.T) {
			c := startTinyClusterWith(t, tinyE2E, "NHD", transfer.Parallel{TPSize: 2}, transfer.Parallel{TPSize: 1}, tinyOpts{wire: wire})
			rng := mrand.New(mrand.NewPCG(8, 8))
			c.expect(t, tinyReq{prompt: tinyPrompt(rng, 11), gen: 5})
			c.expect(t, tinyReq{text: "a router in front", gen: 4, stream: true})
			for _, at := range []string{"prefill", "decode-before", "decode-mid"} {
				a := c.expect(t, tinyReq{prompt: tinyPrompt(rng, 14), gen: 5, abortAt: at})
				if a.rep.Attempts < 2 {
					t.Errorf("abort %s: %d attempts, failures %q; want the aborted room and its retry", at, a.rep.Attempts, a.rep.Failures)
				}
			}
			c.nothingPinned(t)
		})
	}
}

// TestOpenAIBadRequests: each malformed or misdirected request gets its
// OpenAI error, and none leaves a room held: bad JSON, a negative
// max_tokens, another model, a reused bootstrap_room (409 on both
// servers), a bootstrap_port nobody serves (503 at once; the prefill's
// side ends at its deadline), kv_transfer_params with no kvbridge ticket,
// altered, of another prompt, used twice (409) or past their lease (503,
// the lease's expiry counted), and a decode request for a room whose
// prefill server aborted or refused it first.
func TestOpenAIBadRequests(t *testing.T) {
	t.Parallel() // its own processes, ports and discovery: mostly waiting (kills, restarts, leases)
	c, pd := openaiCluster(t, "NHD", transfer.Parallel{}, transfer.Parallel{}, "-kv-lease", "3s", "-request-timeout", "4s", "-pages", "64")
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(9, 9))
	raw := func(url, s string) error {
		_, err := pd.send(ctx, url, []byte(s), "", nil)
		return err
	}
	for _, tc := range []struct {
		name, body string
		want       int
		code       string
	}{
		{"bad JSON", `{"prompt": "x", `, 400, "invalid_json"},
		{"negative max_tokens", `{"prompt": "x", "max_tokens": -3}`, 400, "invalid_max_tokens"},
		{"zero max_tokens", `{"prompt": "x", "max_tokens": 0}`, 400, "invalid_max_tokens"},
		{"another model", `{"prompt": "x", "model": "gpt-9"}`, 404, "model_not_found"},
		{"a room that is not an integer", `{"prompt": "x", "bootstrap_host": "127.0.0.1", "bootstrap_room": 1.5}`, 400, "invalid_bootstrap_room"},
		{"a negative room", `{"prompt": "x", "bootstrap_host": "127.0.0.1", "bootstrap_room": -1}`, 400, "invalid_bootstrap_room"},
		{"a token outside the vocabulary", `{"prompt": [1, 999999]}`, 400, "invalid_prompt"},
		{"a prompt longer than the pages", `{"prompt": [` + strings.Repeat("1,", 600) + `1]}`, 400, "context_length_exceeded"},
		{"two prompts", `{"prompt": ["a", "b"]}`, 400, "invalid_prompt"},
		{"do_remote_decode to a decode server", `{"prompt": "x", "kv_transfer_params": {"do_remote_decode": true}}`, 400, "wrong_server"},
	} {
		err := raw(pd.decode+"/v1/completions", tc.body)
		var e *openai.Error
		if !errors.As(err, &e) || e.Status != tc.want || e.Body.Code != tc.code {
			t.Errorf("%s: %v (%+v), want %d %s", tc.name, err, e, tc.want, tc.code)
		}
	}

	// A reused bootstrap_room: the second request is refused on both sides.
	room := sglangRoom()
	b := body(tinyPrompt(rng, 6), 3, false)
	if _, err := pd.sglangRoom(ctx, "/v1/completions", b, room, nil); err != nil {
		t.Fatal(err)
	}
	if s := <-pd.prefillStatus; s != 200 {
		t.Fatalf("the prefill side answered %d", s)
	}
	_, err := pd.sglangRoom(ctx, "/v1/completions", body(tinyPrompt(rng, 6), 3, false), room, nil)
	if status(err) != 409 || !strings.Contains(err.Error(), "room") {
		t.Errorf("room %d reused: decode answered %v, want 409", room, err)
	}
	if s := <-pd.prefillStatus; s != 409 {
		t.Errorf("room %d reused: prefill answered %d, want 409", room, s)
	}

	// A bootstrap_port nobody serves: the decode server answers 503 at
	// once, naming it.
	bad := *pd
	bad.bootPort, _ = strconv.Atoi(freePort(t))
	start := time.Now()
	_, err = bad.sglang(ctx, "/v1/completions", body(tinyPrompt(rng, 6), 3, false))
	if status(err) != 503 || !strings.Contains(err.Error(), strconv.Itoa(bad.bootPort)) || time.Since(start) > 10*time.Second {
		t.Errorf("bootstrap_port %d: %v after %s, want 503 naming it at once", bad.bootPort, err, time.Since(start))
	}
	if s := <-pd.prefillStatus; s != 504 {
		t.Errorf("the prefill side of a room its decode never asked for answered %d, want 504 (its deadline)", s)
	}

	// kv_transfer_params: none of ours, altered, of another prompt.
	pb := body(tinyPrompt(rng, 10), 4, false)
	kv, err := pd.vllmPrefill(ctx, "/v1/completions", pb, "req-1")
	if err != nil {
		t.Fatal(err)
	}
	kvm := kv.(map[string]any)
	tk := kvm["kvbridge"].(map[string]any)
	if _, ok := kvm["remote_blocks_expiry_time"].(float64); !ok || kvm["do_remote_prefill"] != true || kvm["remote_engine_id"] != "prefill-0" {
		t.Errorf("kv_transfer_params %v", kvm)
	}
	foreign := map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "vllm-x", "remote_block_ids": []int{1, 2}}
	altered := clone(kvm)
	at := altered["kvbridge"].(map[string]any)
	r, _ := strconv.ParseUint(tk["room"].(string), 10, 64)
	at["room"] = strconv.FormatUint(r+1, 10)
	for _, tc := range []struct {
		name string
		kv   any
		b    map[string]any
		code string
	}{
		{"from a server that is not kvbridge", foreign, pb, "invalid_kv_transfer_params"},
		{"altered", altered, pb, "kv_transfer_params_forged"},
		{"for another prompt", kv, body(tinyPrompt(rng, 10), 4, false), "kv_transfer_params_mismatch"},
	} {
		_, err := pd.vllmDecode(ctx, "/v1/completions", tc.b, tc.kv, "req-1")
		var e *openai.Error
		if !errors.As(err, &e) || e.Status != 400 || e.Body.Code != tc.code {
			t.Errorf("kv_transfer_params %s: %v, want 400 %s", tc.name, err, tc.code)
		}
	}
	// The genuine ones still work (the held room was untouched), once.
	a, err := pd.vllmDecode(ctx, "/v1/completions", pb, kv, "req-1")
	if err != nil || !slices.Equal(a.Tokens, c.want(t, pb)) {
		t.Fatalf("the genuine kv_transfer_params after the bad ones: %v %v", a, err)
	}
	_, err = pd.vllmDecode(ctx, "/v1/completions", pb, kv, "req-1")
	if status(err) != 409 {
		t.Errorf("the same kv_transfer_params a second time: %v, want 409", err)
	}

	// A decode request that never comes: the lease ends, the room is
	// aborted and counted; the params, late, are refused.
	before := metric(t, c.client, c.prefill[0].http, "kvbridge_example_kv_lease_expired_total")
	kv, err = pd.vllmPrefill(ctx, "/v1/completions", pb, "req-2")
	if err != nil {
		t.Fatal(err)
	}
	if held := metric(t, c.client, c.prefill[0].http, "kvbridge_example_kv_held_rooms"); held != 1 {
		t.Errorf("%v rooms held after a vLLM prefill, want 1", held)
	}
	waitMetric(t, c.client, c.prefill[0].http, "kvbridge_example_kv_lease_expired_total", before+1, 15*time.Second)
	_, err = pd.vllmDecode(ctx, "/v1/completions", pb, kv, "req-2")
	if e := (*openai.Error)(nil); !errors.As(err, &e) || e.Status != 503 || e.Body.Code != "kv_transfer_params_expired" {
		t.Errorf("expired kv_transfer_params: %v, want 503 kv_transfer_params_expired", err)
	}

	// A decode leg refused for a field of its own (issue 51: the sidecar
	// sends the prefill leg with max_tokens 1, so only the decode leg
	// carries the client's fields) releases the KV its prefill leg holds
	// at once, not at the lease's end: the request is read whole, so its
	// ticket's prompt still matches.
	for _, tc := range []struct {
		name string
		edit func(b map[string]any)
		code string
	}{
		{"max_tokens -1", func(b map[string]any) { b["max_tokens"] = -1 }, "invalid_max_tokens"},
		{"max_tokens 0", func(b map[string]any) { b["max_tokens"] = 0 }, "invalid_max_tokens"},
		{"max_tokens 1e9", func(b map[string]any) { b["max_tokens"] = 1e9 }, "invalid_max_tokens"},
		{"max_tokens 1.5", func(b map[string]any) { b["max_tokens"] = 1.5 }, "invalid_max_tokens"},
		{`max_tokens "8"`, func(b map[string]any) { b["max_tokens"] = "8" }, "invalid_max_tokens"},
		{`stream "yes"`, func(b map[string]any) { b["stream"] = "yes" }, "invalid_stream"},
		{"min_tokens above max_tokens", func(b map[string]any) { b["min_tokens"] = 9 }, "invalid_min_tokens"},
	} {
		id := "req-refused-" + strings.ReplaceAll(tc.name, " ", "-")
		kv, err := pd.vllmPrefill(ctx, "/v1/completions", pb, id)
		if err != nil {
			t.Fatal(err)
		}
		db := clone(pb)
		tc.edit(db)
		refused := fmt.Sprintf("kvbridge_example_rooms_refused_total{code=%q}", tc.code)
		before := metric(t, c.client, c.decode[0].http, refused)
		_, err = pd.vllmDecode(ctx, "/v1/completions", db, kv, id)
		var e *openai.Error
		if !errors.As(err, &e) || e.Status != 400 || e.Body.Code != tc.code {
			t.Errorf("decode leg with %s: %v, want 400 %s", tc.name, err, tc.code)
		}
		assert.Equal(t, before+1, metric(t, c.client, c.decode[0].http, refused), "decode leg with %s: the refusal counted by its code", tc.name)
		expired := metric(t, c.client, c.prefill[0].http, "kvbridge_example_kv_lease_expired_total")
		waitMetricAtMost(t, c.client, c.prefill[0].http, "kvbridge_example_kv_held_rooms", 0, 30*time.Second)
		if got := metric(t, c.client, c.prefill[0].http, "kvbridge_example_kv_lease_expired_total"); got != expired {
			t.Errorf("decode leg with %s: its prefill leg's KV was released by the lease's end (%v → %v expiries), not by the refusal", tc.name, expired, got)
		}
	}

	// The prefill side refuses first (its abort extension): the decode
	// side hears it from kvbridge and answers 503 without waiting.
	ab := body(tinyPrompt(rng, 8), 3, false)
	ab["abort_at"] = "prefill"
	start = time.Now()
	_, err = pd.sglang(ctx, "/v1/completions", ab)
	if status(err) != 503 || time.Since(start) > 10*time.Second {
		t.Errorf("a room its prefill side aborted: decode answered %v after %s, want 503", err, time.Since(start))
	}
	if s := <-pd.prefillStatus; s != 503 {
		t.Errorf("the aborted room's prefill side answered %d, want 503", s)
	}

	// The prefill server refuses a prompt its pages cannot hold (the
	// decode server's can): it tells the decode side through kvbridge (the
	// room created and aborted), which answers 503 at once instead of at
	// its deadline.
	long := body(tinyPrompt(rng, 300), 3, false)
	start = time.Now()
	_, err = pd.sglang(ctx, "/v1/completions", long)
	if status(err) != 503 || time.Since(start) > 10*time.Second {
		t.Errorf("a room its prefill server refused: decode answered %v after %s, want 503 at once", err, time.Since(start))
	}
	if s := <-pd.prefillStatus; s != 400 {
		t.Errorf("the prefill server answered a prompt longer than its pages with %d, want 400", s)
	}
	c.nothingPinned(t)
}

// metric reads one metric of a rank (a labelled series that does not
// exist yet is 0).
func metric(t *testing.T, cl *http.Client, rank, name string) float64 {
	t.Helper()
	resp, err := cl.Get(rank + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	for _, l := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	if strings.Contains(name, "{") {
		return 0 // a labelled series not created yet: no event counted
	}
	t.Fatalf("%s has no metric %s", rank, name)
	return 0
}

// waitPending waits until a prefill rank holds a REQUEST pending (its
// kvbridge_core_entries{table="pending"}).
func waitPending(t *testing.T, cl *http.Client, rank string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := cl.Get(rank + "/metrics")
		if err == nil {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			for _, l := range strings.Split(b.String(), "\n") {
				if strings.HasPrefix(l, "kvbridge_core_entries{") && strings.Contains(l, `table="pending"`) && !strings.HasSuffix(l, " 0") {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds no pending REQUEST after 15 s", rank)
		}
		time.Sleep(20 * time.Millisecond) // polling the rank's metrics
	}
}

// waitLive waits until a rank holds a room.
func waitLive(t *testing.T, cl *http.Client, rank string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if n, err := rooms(cl, rank); err == nil && n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds no room after 15 s", rank)
		}
		time.Sleep(20 * time.Millisecond) // polling the rank's metrics
	}
}

func waitMetric(t *testing.T, cl *http.Client, rank, name string, want float64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for metric(t, cl, rank, name) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s did not reach %v within %s", rank, name, want, d)
		}
		time.Sleep(20 * time.Millisecond) // polling the rank's metrics
	}
}

// waitMetricAtMost waits until a rank's metric is at most want.
func waitMetricAtMost(t *testing.T, cl *http.Client, rank, name string, want float64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for got := metric(t, cl, rank, name); got > want; got = metric(t, cl, rank, name) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s still %v after %s, want at most %v", rank, name, got, d, want)
		}
		time.Sleep(20 * time.Millisecond) // polling the rank's metrics
	}
}

// TestOpenAIFaults: a client that goes away before its KV came aborts the
// room on both sides; a prefill server killed mid-request gives the
// client an error in SGLang's wire and the sidecar a 5xx it retries in
// vLLM's, and the restarted server serves — in the MooncakeConnector and
// OffloadingConnector wires too —; nothing stays held.
func TestOpenAIFaults(t *testing.T) {
	t.Parallel() // its own processes and ports
	c, pd := openaiCluster(t, "NHD", transfer.Parallel{}, transfer.Parallel{})
	rng := mrand.New(mrand.NewPCG(10, 10))
	u, _ := url.Parse(pd.prefill)

	// The client disconnects while the decode server waits for the room's
	// prefill (whose request has not been sent): the decode side aborts
	// the room, and the prefill request that comes later finds it aborted.
	room := sglangRoom()
	b := body(tinyPrompt(rng, 9), 4, false)
	b["bootstrap_host"], b["bootstrap_port"] = u.Hostname(), pd.bootPort
	raw, _ := json.Marshal(b)
	raw = append(raw[:len(raw)-1], fmt.Sprintf(`,"bootstrap_room":%d}`, room)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := pd.send(ctx, pd.decode+"/v1/completions", raw, "", nil)
		done <- err
	}()
	waitLive(t, c.client, c.decode[0].http)
	cancel()
	<-done
	start := time.Now()
	_, err := pd.send(context.Background(), pd.prefill+"/v1/completions", raw, "", nil)
	if status(err) != 503 || !strings.Contains(err.Error(), "abort") || time.Since(start) > 10*time.Second {
		t.Errorf("the prefill request of a room its client left: %v after %s, want 503 (aborted)", err, time.Since(start))
	}
	c.nothingPinned(t)

	// SGLang: the prefill server dies while the decode server waits for
	// the room: the client gets an error (the heartbeat bound), not a hang.
	room = sglangRoom()
	raw, _ = json.Marshal(b)
	raw = append(raw[:len(raw)-1], fmt.Sprintf(`,"bootstrap_room":%d}`, room)...)
	go func() {
		_, err := pd.send(context.Background(), pd.decode+"/v1/completions", raw, "", nil)
		done <- err
	}()
	waitLive(t, c.client, c.decode[0].http)
	// ... with its REQUEST out: the prefill rank holds it pending (before
	// that, the decode rank may still wait for the REGISTER_ACK, an
	// endpoint it does not watch yet: the request would end at its own
	// deadline, 504, as one make test run here saw).
	waitPending(t, c.client, c.prefill[0].http)
	c.prefill[0].kill()
	if err := <-done; status(err) != 503 {
		t.Errorf("decode with its prefill server killed: %v, want 503", err)
	}
	c.prefill[0] = startTinyRank(t, "prefill", c.prefill[0].args...)
	if a, err := pd.sglang(context.Background(), "/v1/completions", b); err != nil || !slices.Equal(a.Tokens, c.want(t, b)) {
		t.Fatalf("after the prefill server's restart: %v %v", a, err)
	}
	<-pd.prefillStatus

	// vLLM: the prefill server is killed with the prefill request in it
	// (stopped first, so the request is surely inside): the sidecar gets a
	// 502 and retries; the restarted server answers and the decode serves.
	pd.http.CloseIdleConnections()
	pd.retries = 50 // (the restart takes a while; the sidecar's --prefill-max-retries)
	conns := established(t, c.prefill[0])
	if err := c.prefill[0].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	vb := body(tinyPrompt(rng, 12), 5, true)
	res := make(chan struct {
		a   *openai.Answer
		err error
	}, 1)
	go func() {
		a, err := pd.vllm(context.Background(), "/v1/completions", vb)
		res <- struct {
			a   *openai.Answer
			err error
		}{a, err}
	}()
	waitConnected(t, c.prefill[0], conns)
	c.prefill[0].kill()
	c.prefill[0] = startTinyRank(t, "prefill", c.prefill[0].args...)
	r := <-res
	if r.err != nil && status(r.err) == 503 && (strings.Contains(r.err.Error(), "unreachable") || strings.Contains(r.err.Error(), "after a probe went unanswered")) {
		// The prefill leg was retried and served by the new process; the
		// decode rank had heard the killed process within ProbeIdle (the
		// previous room, less than a second before), so the REQUEST went
		// to it: the PING after it is lost and the lookup finds the new
		// process, failing the room at once (a room bound to a dead
		// process fails; the router sends it again).
		t.Logf("the decode leg after the restart: %v; sending the request again", r.err)
		r.a, r.err = pd.vllm(context.Background(), "/v1/completions", vb)
	}
	if r.err != nil || !slices.Equal(r.a.Tokens, c.want(t, vb)) {
		t.Fatalf("vLLM's flow across the prefill server's kill: %v %v", r.a, r.err)
	}

	// vLLM: the prefill server answers (its KV held for the decode
	// request), is killed and restarted; the decode request with the old
	// kv_transfer_params is refused 503 kv_transfer_params_stale at once —
	// the ticket names the process that held the KV, and the bootstrap
	// server now names another (issue 51: it waited for its 60 s deadline,
	// 504). The request sent again is served.
	kv, err := pd.vllmPrefill(context.Background(), "/v1/completions", vb, "req-restart")
	require.NoError(t, err)
	c.prefill[0].kill()
	c.prefill[0] = startTinyRank(t, "prefill", c.prefill[0].args...)
	start = time.Now()
	_, err = pd.vllmDecode(context.Background(), "/v1/completions", vb, kv, "req-restart")
	var e *openai.Error
	if assert.ErrorAs(t, err, &e, "the decode request with kv_transfer_params from before the restart") {
		assert.Equal(t, 503, e.Status, "%v", err)
		assert.Equal(t, "kv_transfer_params_stale", e.Body.Code, "%v", err)
	}
	t.Logf("kv_transfer_params from before the prefill server's restart: %v after %v", err, time.Since(start).Round(time.Millisecond))
	// Sent again (as the router does): the first try can still fail 503 if
	// the decode rank held the killed process's endpoint (docs/ROUTERS.md).
	var a *openai.Answer
	for try := 0; try < 5; try++ {
		if a, err = pd.vllm(context.Background(), "/v1/completions", vb); status(err) != 503 {
			break
		}
		t.Logf("the request sent again after the restart: %v; once more", err)
	}
	if err != nil || !slices.Equal(a.Tokens, c.want(t, vb)) {
		t.Fatalf("the request sent again after the restart: %v %v", a, err)
	}
	c.nothingPinned(t)

	// The MooncakeConnector and OffloadingConnector wires across a prefill
	// server's kill and restart (a new process on the same ports, the same
	// engine ids): the next request is served, or refused 503 — retryable
	// — where the decode rank still held the killed process's endpoint,
	// and served when sent again; nothing stays held.
	for _, mode := range []string{"mooncake", "offloading"} {
		c.restartPrefillFront(t)
		for len(pd.prefillStatus) > 0 {
			<-pd.prefillStatus
		}
		mb := body(tinyPrompt(rng, 8), 4, false)
		a, err := pd.mode(mode)(context.Background(), "/v1/completions", mb)
		for try := 0; try < 3 && status(err) == 503; try++ {
			t.Logf("%s after the prefill server's restart: %v; once more", mode, err)
			a, err = pd.mode(mode)(context.Background(), "/v1/completions", mb)
		}
		require.NoError(t, err, "%s after the prefill server's restart", mode)
		assert.Equal(t, c.want(t, mb), a.Tokens, "%s after the prefill server's restart", mode)
		c.nothingPinned(t)
	}
}

// restartPrefillFront SIGKILLs the prefill instance's front and starts it
// again on the same ports (a new process), then waits until its /health
// says the instance is whole.
func (c *tinyCluster) restartPrefillFront(t *testing.T) {
	t.Helper()
	c.prefill[0].kill()
	c.prefill[0] = startTinyRank(t, "prefill", c.prefill[0].args...)
	require.Eventually(t, func() bool {
		resp, err := c.client.Get(c.prefill[0].http + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 30*time.Second, 20*time.Millisecond, "the restarted prefill instance never whole")
}

// waitConnected waits until a stopped process's HTTP port has more
// established TCP connections than before (a request in its accept queue).
func waitConnected(t *testing.T, p *tinyProc, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for established(t, p) <= before {
		if time.Now().After(deadline) {
			t.Fatalf("no new connection to %s", p.http)
		}
		time.Sleep(10 * time.Millisecond) // polling /proc/net/tcp
	}
}

// established counts the established TCP connections to a rank's HTTP
// port (/proc/net/tcp: local address, state 01).
func established(t *testing.T, p *tinyProc) int {
	t.Helper()
	port, err := strconv.Atoi(strings.TrimPrefix(p.http, "http://127.0.0.1:"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	n := 0
	local := fmt.Sprintf(":%04X", port)
	for _, l := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) > 3 && strings.HasSuffix(f[1], local) && f[3] == "01" {
			n++
		}
	}
	return n
}

// TestOpenAIRoomCollision (issue 51): a bootstrap_room asked for twice at
// once at the SGLang fronts — a router that reuses ids — over prefill
// TP 2 → decode TP 1 (the prefill front hands the room to its other rank)
// and TP 1 → 2. Each front lets one of the two requests have the room and
// refuses the other 409 room_reused before any rank creates it; the legs
// may pair crosswise (SGLang's wire cannot tell the requests apart), and
// then the decode front refuses 409 too, seeing another prompt's KV, and
// the prefill leg whose KV it was fails 503. No answer is a 500, none carries another prompt's tokens, at most one is
// served on each side, and nothing stays held. Before, a collision split
// the prefill instance's ranks between the two requests (both refused) and
// the decode front answered 500 "the aux item is not this prompt's".
func TestOpenAIRoomCollision(t *testing.T) {
	t.Parallel() // its own processes and ports
	for _, tc := range []struct {
		name           string
		pShape, dShape transfer.Parallel
	}{{"TP2to1", transfer.Parallel{TPSize: 2}, transfer.Parallel{TPSize: 1}}, {"TP1to2", transfer.Parallel{TPSize: 1}, transfer.Parallel{TPSize: 2}}} {
		t.Run(tc.name, func(t *testing.T) {
			c, pd := openaiCluster(t, "NHD", tc.pShape, tc.dShape)
			rng := mrand.New(mrand.NewPCG(5, 5))
			ctx := context.Background()
			for round := range 4 {
				room := sglangRoom()
				type res struct {
					b   map[string]any
					a   *openai.Answer
					err error
				}
				both := make(chan res, 2)
				for range 2 {
					b := body(tinyPrompt(rng, 6), 24, false)
					go func() {
						a, err := pd.sglangRoom(ctx, "/v1/completions", b, room, nil)
						both <- res{b, a, err}
					}()
				}
				served, prefillServed := 0, 0
				for range 2 {
					r := <-both
					var e *openai.Error
					switch {
					case r.err == nil:
						served++
						assert.Equal(t, c.want(t, r.b), r.a.Tokens, "round %d: a served request's tokens", round)
					case errors.As(r.err, &e):
						assert.Equal(t, 409, e.Status, "round %d: %v", round, r.err)
						assert.Equal(t, "room_reused", e.Body.Code, "round %d: %v", round, r.err)
					default:
						t.Errorf("round %d: %v", round, r.err)
					}
					switch code := <-pd.prefillStatus; code {
					case 200:
						prefillServed++
					case 409, 503: // refused; or its KV went to the other request's decode leg, which refused it
					default:
						t.Errorf("round %d: room %d asked for twice at once: the prefill front answered %d", round, room, code)
					}
				}
				assert.LessOrEqual(t, served, 1, "round %d: both decode requests of room %d served", round, room)
				assert.LessOrEqual(t, prefillServed, 1, "round %d: room %d asked for twice at once: the prefill front served both", round, room)
			}
			c.nothingPinned(t)
		})
	}
}

// TestOpenAIMooncakeBadRequests: the MooncakeConnector wire's malformed
// legs, sent as the sidecar sends both at once. A refused leg whose room
// is known (its transfer id) tells the other side, which answers 503 at
// once rather than 504 at its deadline: a decode leg naming an engine id
// that is not the instance's (every DP group of the prefill instance is
// told), a prefill leg naming a DP group the instance does not have. A
// decode leg without a usable bootstrap address cannot name its prefill
// instance: that prefill leg ends at its deadline (504). A transfer id
// with a line break is refused on both; one reused is refused (409) on
// both. Nothing stays held on any rank.
func TestOpenAIMooncakeBadRequests(t *testing.T) {
	t.Parallel() // its own processes and ports
	c, pd := openaiCluster(t, "NHD", transfer.Parallel{}, transfer.Parallel{}, "-request-timeout", "4s")
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(5, 5))
	for _, tc := range []struct {
		name               string
		edit               func(pre, dec map[string]any, dp *string)
		decode, prefill    int
		decodeCode, reason string
	}{
		{"an engine id not the instance's", func(_, dec map[string]any, _ *string) {
			dec["kv_transfer_params"].(map[string]any)["remote_engine_id"] = "vllm-engine-0"
		}, 400, 503, "invalid_remote_engine_id", "the prefill leg told"},
		{"a DP group the instance lacks", func(_, _ map[string]any, dp *string) { *dp = "7" }, 503, 400, "", "the decode leg told"},
		{"no usable bootstrap address", func(_, dec map[string]any, _ *string) {
			dec["kv_transfer_params"].(map[string]any)["remote_bootstrap_addr"] = "ftp://nowhere"
		}, 400, 504, "invalid_remote_bootstrap_addr", "nobody to tell: the prefill leg ends at its deadline"},
		{"a transfer id with a line break", func(pre, dec map[string]any, _ *string) {
			pre["kv_transfer_params"].(map[string]any)["transfer_id"] = "xfer-\nx"
			dec["kv_transfer_params"].(map[string]any)["transfer_id"] = "xfer-\nx"
		}, 400, 400, "invalid_transfer_id", "refused on both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pd.mooncakeWith(ctx, "/v1/completions", body(tinyPrompt(rng, 6), 3, false), "", tc.edit)
			var e *openai.Error
			require.ErrorAs(t, err, &e, "the decode leg answered")
			assert.Equal(t, tc.decode, e.Status, "decode leg: %v", err)
			if tc.decodeCode != "" {
				assert.Equal(t, tc.decodeCode, e.Body.Code, "decode leg: %v", err)
			}
			assert.Equal(t, tc.prefill, <-pd.prefillStatus, "prefill leg (%s)", tc.reason)
			c.nothingPinned(t)
		})
	}
	t.Run("an engine id not the instance's, prefill DP 2", func(t *testing.T) {
		// The prefill leg on DP group 1, its room's own group (room % 2)
		// 0: only a decode front that tells every group reaches it.
		c2, pd2 := openaiCluster(t, "NHD", transfer.Parallel{DPSize: 2}, transfer.Parallel{}, "-request-timeout", "4s")
		xfer := ""
		for i := 0; xfer == "" || openai.MooncakeRoom(xfer)%2 != 0; i++ {
			xfer = fmt.Sprintf("xfer-dp-%d", i)
		}
		_, err := pd2.mooncakeWith(ctx, "/v1/completions", body(tinyPrompt(rng, 6), 3, false), xfer, func(_, dec map[string]any, dp *string) {
			*dp = "1"
			dec["kv_transfer_params"].(map[string]any)["remote_engine_id"] = "vllm-engine-0"
		})
		assert.Equal(t, 400, status(err), "decode leg: %v", err)
		assert.Equal(t, 503, <-pd2.prefillStatus, "the prefill leg on DP group 1 was not told: %v", pd2.prefillAnswer.Load())
		c2.nothingPinned(t)

		// X-data-parallel-rank honoured: each DP group serves the rooms
		// whose engine id names it, whatever the room's own group.
		engines, err := pd2.mooncakeQuery(ctx)
		require.NoError(t, err)
		require.Len(t, engines, 2, "GET /query: %v", engines)
		for g, dp := range []string{"0", "1"} {
			id := "" // a room whose own group (room % 2) is the other one
			for i := 0; id == "" || openai.MooncakeRoom(id)%2 == uint64(g); i++ {
				id = fmt.Sprintf("xfer-ok-%s-%d", dp, i)
			}
			b := body(tinyPrompt(rng, 7), 4, false)
			a, err := pd2.mooncakeWith(ctx, "/v1/completions", b, id, func(_, dec map[string]any, h *string) {
				*h = dp
				dec["kv_transfer_params"].(map[string]any)["remote_engine_id"] = engines[dp]
			})
			require.NoError(t, err, "DP group %s", dp)
			assert.Equal(t, c2.want(t, b), a.Tokens, "DP group %s", dp)
			assert.Equal(t, 200, <-pd2.prefillStatus, "DP group %s: the prefill leg", dp)
		}
		c2.nothingPinned(t)
	})
	t.Run("a reused transfer id", func(t *testing.T) {
		xfer := "xfer-reused"
		b := body(tinyPrompt(rng, 6), 3, false)
		a, err := pd.mooncakeWith(ctx, "/v1/completions", b, xfer, nil)
		require.NoError(t, err)
		assert.Equal(t, c.want(t, b), a.Tokens)
		require.Equal(t, 200, <-pd.prefillStatus)
		_, err = pd.mooncakeWith(ctx, "/v1/completions", body(tinyPrompt(rng, 6), 3, false), xfer, nil)
		assert.Equal(t, 409, status(err), "decode leg: %v", err)
		assert.Equal(t, 409, <-pd.prefillStatus, "prefill leg")
		c.nothingPinned(t)
	})
}

// TestOpenAIOffloadingBadRequests: the OffloadingConnector wire's
// malformed legs, each answered with its status and code: a kv_request_id
// with a line break (refused on the prefill leg, so no decode leg goes); a
// remote_port out of range (the decode front cannot name the prefill
// instance, so the room the prefill leg holds ends with its -kv-lease); a
// decode leg naming an id no prefill leg held (it ends at its deadline,
// 504); a decode leg refused with a usable address (another model): the
// held room is released at once; each leg to the other role's server, and
// both role keys at once. Nothing stays held.
func TestOpenAIOffloadingBadRequests(t *testing.T) {
	t.Parallel() // its own processes and ports
	c := startTinyClusterWith(t, tinyE2E, "NHD", transfer.Parallel{}, transfer.Parallel{}, tinyOpts{prefill: []string{"-request-timeout", "3s", "-kv-lease", "3s"},
		decode: []string{"-request-timeout", "3s"}, decodeNoBootstrap: true})
	pd := newPDClient(t, c)
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(3, 3))
	kvp := func(m map[string]any, role string) map[string]any {
		return m["kv_transfer_params"].(map[string]any)[role].(map[string]any)
	}
	for _, tc := range []struct {
		name   string
		edit   func(pre, dec map[string]any)
		status int
		code   string
		within time.Duration // nothing held within (0: at most 15 s)
	}{
		{"a kv_request_id with a line break", func(pre, _ map[string]any) { kvp(pre, "remote_decoder")["kv_request_id"] = "a\nb" }, 400, "invalid_kv_request_id", 0},
		{"a remote_port out of range", func(_, dec map[string]any) { kvp(dec, "remote_prefiller")["remote_port"] = 70000 }, 400, "invalid_remote_port", 0},
		{"an id no prefill leg held", func(_, dec map[string]any) { kvp(dec, "remote_prefiller")["kv_request_id"] = "never-held" }, 504, "deadline", 0},
		{"another model on the decode leg: the held room told at once", func(_, dec map[string]any) { dec["model"] = "gpt-9" }, 404, "model_not_found", 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pd.offloadingWith(ctx, "/v1/completions", body(tinyPrompt(rng, 6), 3, false), tc.edit)
			var e *openai.Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, tc.status, e.Status, "%v", err)
			assert.Equal(t, tc.code, e.Body.Code, "%v", err)
			if tc.within > 0 {
				c.nothingPinnedWithin(t, tc.within) // the lease is 3 s
			}
			c.nothingPinned(t)
		})
	}
	for _, tc := range []struct{ name, url, body, code string }{
		{"remote_decoder to a decode server", pd.decode, `{"prompt": "x", "kv_transfer_params": {"remote_decoder": {"kv_request_id": "a"}}}`, "wrong_server"},
		{"remote_prefiller to a prefill server", pd.prefill, `{"prompt": "x", "kv_transfer_params": {"remote_prefiller": {"kv_request_id": "a", "remote_host": "h", "remote_port": 1}}}`, "wrong_server"},
		{"both role keys", pd.prefill, `{"prompt": "x", "kv_transfer_params": {"remote_decoder": {"kv_request_id": "a"}, "remote_prefiller": {"kv_request_id": "a", "remote_host": "h", "remote_port": 1}}}`, "invalid_kv_transfer_params"},
	} {
		_, err := pd.send(ctx, tc.url+"/v1/completions", []byte(tc.body), "", nil)
		var e *openai.Error
		if assert.ErrorAs(t, err, &e, tc.name) {
			assert.Equal(t, 400, e.Status, tc.name)
			assert.Equal(t, tc.code, e.Body.Code, tc.name)
		}
	}
	c.nothingPinned(t)
}

// TestOpenAIPush: vLLM push with a cached identity, as the sidecar's nixlv2
// connector in push mode sends it: the first request goes serially and
// the identity in the prefill's answer (remote_engine_id, remote_host and
// remote_port — the instance's bootstrap server —, tp_size, pp_size,
// transfer_mode push) is cached; later ones go to both servers at once
// with one transfer_id, the decode leg built from the identity before the
// prefill answered: token-identical. The prefill process killed and
// started again in place (a new process, the same identity): the next
// request at once is served (its room meets the new process at the
// bootstrap server) or refused 503, retryable, where the decode rank
// still held the dead process's endpoint, nothing held; the requests
// after it are served. An identity naming a bootstrap server that is
// gone (the instance moved): the decode leg answers 503 at once
// (retryable) and the prefill leg is cancelled — a prefill leg cancelled
// while it computes releases its room at once, one that had answered
// keeps its KV until -kv-lease (3 s here: nobody can name the room to
// it) —, nothing stays held, and the next request, serial, learns the new
// identity.
func TestOpenAIPush(t *testing.T) {
	t.Parallel() // its own processes and ports
	// A lease far past every bound below: a push leg's KV is released by
	// its claim (-push-claim), a refused leg's at once.
	c, pd := openaiCluster(t, "NHD", transfer.Parallel{}, transfer.Parallel{}, "-kv-lease", "60s", "-push-claim", "2s")
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(11, 11))
	expect := func(what string) {
		t.Helper()
		b := body(tinyPrompt(rng, 8), 4, false)
		a, err := pd.push(ctx, "/v1/completions", b)
		require.NoError(t, err, what)
		assert.Equal(t, c.want(t, b), a.Tokens, what)
	}
	expect("the first request (serial)")
	id, _ := pd.pushes.identity.Load().(map[string]any)
	require.NotNil(t, id, "no identity in the prefill's answer")
	assert.Equal(t, "push", id["transfer_mode"])
	for i := range 3 {
		expect(fmt.Sprintf("request %d at once", i))
	}
	assert.EqualValues(t, 1, pd.pushes.serialPushes.Load())
	assert.EqualValues(t, 3, pd.pushes.concurrentPushes.Load())

	c.restartPrefillFront(t)
	// The first request at once after the restart: served (its room met
	// the new process), or refused 503 — retryable — where the decode
	// rank still held the dead process's endpoint; then the identity is
	// dropped and the next request, serial, is served.
	b := body(tinyPrompt(rng, 8), 4, false)
	a, err := pd.push(ctx, "/v1/completions", b)
	if err != nil {
		assert.Equal(t, 503, status(err), "after the restart: %v", err)
		t.Logf("the first request at once after the restart: %v (retryable)", err)
		c.nothingPinned(t)
		expect("serial, after the refused one")
	} else {
		assert.Equal(t, c.want(t, b), a.Tokens, "after the restart")
	}
	expect("after the prefill's restart in place")

	stale := maps.Clone(id)
	port, _ := strconv.Atoi(freePort(t))
	stale["remote_port"] = float64(port)
	pd.pushes.identity.Store(stale)
	start := time.Now()
	_, err = pd.push(ctx, "/v1/completions", body(tinyPrompt(rng, 8), 4, false))
	assert.Equal(t, 503, status(err), "a stale identity: %v", err)
	assert.Less(t, time.Since(start), 10*time.Second, "a stale identity refused at its deadline, not at once")
	c.nothingPinned(t)
	expect("serial again after the stale identity")
	assert.Equal(t, id, pd.pushes.identity.Load(), "the identity learnt again")

	// The prefill leg answered before its decode leg, from a stale
	// identity (an instance that moved: its bootstrap server gone), was
	// refused: nobody can reach this instance to release the KV, so its
	// claim does, long before the lease.
	pb, db := pushLegs("/v1/completions", body(tinyPrompt(rng, 8), 4, false), stale, "stale-after-prefill")
	_, err = pd.send(ctx, pd.prefill+"/v1/completions", pb, "stale-after-prefill", nil)
	require.NoError(t, err, "the push prefill leg")
	assert.EqualValues(t, 1, metric(t, c.client, c.prefill[0].http, "kvbridge_example_kv_held_rooms"), "the push prefill leg's room not held once it answered")
	_, err = pd.send(ctx, pd.decode+"/v1/completions", db, "stale-after-prefill", nil)
	assert.Equal(t, 503, status(err), "a stale identity after its prefill leg answered: %v", err)
	start = time.Now()
	c.nothingPinnedWithin(t, 5*time.Second)
	t.Logf("the push prefill leg's KV released %v after its decode leg was refused (claim 2 s, lease 60 s)", time.Since(start).Round(time.Millisecond))
}

// BenchmarkPushTTFT: time to first token of vLLM push dispatched at once
// from a cached identity against nixlv2's serial flow, interleaved on the
// same pair (prefill TP 1 → decode TP 1, the tests' model, a 96-token
// prompt, ucx over shared memory): each request asks for one token, so
// its latency is its time to first token through both fronts. Reports
// each way's p50 and p99 and their ratio (concurrent / serial).
func BenchmarkPushTTFT(b *testing.B) {
	c := startTinyClusterWith(b, tinyE2E, "NHD", transfer.Parallel{}, transfer.Parallel{}, tinyOpts{decodeNoBootstrap: true})
	pd := newPDClient(b, c)
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(1, 2))
	one := func(send func(context.Context, string, map[string]any) (*openai.Answer, error)) time.Duration {
		start := time.Now()
		if _, err := send(ctx, "/v1/completions", body(tinyPrompt(rng, 96), 1, false)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	one(pd.push) // (serial: learns the identity)
	var serial, concurrent []time.Duration
	for b.Loop() {
		serial = append(serial, one(pd.vllm))
		concurrent = append(concurrent, one(pd.push))
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(quantileMS(serial, 0.5), "serial-p50-ms")
	b.ReportMetric(quantileMS(serial, 0.99), "serial-p99-ms")
	b.ReportMetric(quantileMS(concurrent, 0.5), "push-p50-ms")
	b.ReportMetric(quantileMS(concurrent, 0.99), "push-p99-ms")
	b.ReportMetric(quantileMS(concurrent, 0.5)/quantileMS(serial, 0.5), "p50-ratio")
}
