package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/openai"
	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bidirectionalFields are the fields of a decode answer's
// kv_transfer_params the llm-d sidecar replays on the next turn's prefill
// leg (pkg/sidecar/proxy/bidirectional_kv.go, bidirectionalKVParamFields);
// it drops every other field.
var bidirectionalFields = []string{"remote_engine_id", "remote_request_id", "remote_host", "remote_port", "remote_block_ids",
	"remote_num_tokens", "remote_blocks_expiry_time", "tp_size", "dcp_size", "pp_size", "transfer_mode"}

// completeKVParams is the sidecar's check before it caches a decode
// answer's kv_transfer_params (completeKVParams there): do_remote_decode
// true, remote_engine_id, remote_request_id and remote_host non-empty
// strings, remote_port a number, remote_block_ids non-empty; it returns the
// replayed subset.
func completeKVParams(kv map[string]any) (map[string]any, bool) {
	if d, _ := kv["do_remote_decode"].(bool); !d {
		return nil, false
	}
	for _, f := range []string{"remote_engine_id", "remote_request_id", "remote_host"} {
		if s, _ := kv[f].(string); s == "" {
			return nil, false
		}
	}
	if _, ok := kv["remote_port"].(float64); !ok {
		return nil, false
	}
	if ids, _ := kv["remote_block_ids"].([]any); len(ids) == 0 {
		return nil, false
	}
	out := map[string]any{}
	for _, f := range bidirectionalFields {
		if v, ok := kv[f]; ok {
			out[f] = v
		}
	}
	return out, true
}

// turn is one request of a conversation as the sidecar's nixlv2
// connector sends it with bidirectional KV transfer on: the prefill leg
// with kv_transfer_params {do_remote_decode: true, do_remote_prefill:
// false, remote_*: null} and, for a later turn, the replayed fields of
// the previous turn's decode answer over them; then the decode leg with
// the prefill answer's kv_transfer_params. It returns the client's answer
// and the decode answer's kv_transfer_params as the sidecar decodes them.
func (p *pdClient) turn(ctx context.Context, path string, client, replay map[string]any) (*openai.Answer, map[string]any, error) {
	var id [16]byte
	rand.Read(id[:])
	reqID := hex.EncodeToString(id[:])
	body := clone(client)
	kv := map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	for f, v := range replay {
		kv[f] = v
	}
	body["kv_transfer_params"] = kv
	capOneToken(body, path)
	b, _ := json.Marshal(body)
	a, err := p.send(ctx, p.prefill+path, b, reqID, nil)
	if err != nil {
		return nil, nil, err
	}
	var pans map[string]any
	if err := json.Unmarshal(a.Raw, &pans); err != nil {
		return nil, nil, err
	}
	p.lastPrefillAnswer = pans
	ans, err := p.vllmDecode(ctx, path, client, pans["kv_transfer_params"], reqID)
	if err != nil {
		return nil, nil, err
	}
	var dans map[string]any
	if err := json.Unmarshal(ans.Raw, &dans); err != nil {
		return nil, nil, err
	}
	dkv, _ := dans["kv_transfer_params"].(map[string]any)
	return ans, dkv, nil
}

// reused is the prompt tokens the last prefill leg took from an earlier
// turn (its answer's kvbridge extension).
func (p *pdClient) reused() int {
	ext, _ := p.lastPrefillAnswer["kvbridge"].(map[string]any)
	n, _ := ext["reused_tokens"].(float64)
	return int(n)
}

// TestOpenAIMultiTurn: multi-turn reuse with requests shaped as the llm-d
// sidecar sends them (bidirectional KV transfer): a decode answer names
// the turn's kept KV in kv_transfer_params the sidecar accepts; the next
// turn's prefill leg with those fields replayed fetches the prefix from
// the decode instance (a room the other way) and computes only the new
// tokens, token-identical to one process, chat and completions, streamed
// and not; the kept KV is released at use and at the lease's end, used
// once; a replay used twice, altered, expired or foreign is computed in
// full and answered all the same; nothing stays held.
func TestOpenAIMultiTurn(t *testing.T) {
	t.Parallel() // its own processes and ports
	c, pd := multiTurnCluster(t, "30s", 64)
	ctx := context.Background()
	pre, dec := c.prefill[0].http, c.decode[0].http
	outcome := func(rank, o string) float64 {
		return metric(t, c.client, rank, `kvbridge_example_reuse_total{outcome="`+o+`"}`)
	}
	rng := mrand.New(mrand.NewPCG(21, 21))

	// Completions with token ids: the second turn's prompt is the first's,
	// its reply and new tokens — the whole kept turn is reused.
	prompt1 := tinyPrompt(rng, 10)
	b1 := body(prompt1, 5, false)
	a1, kv1, err := pd.turn(ctx, "/v1/completions", b1, nil)
	require.NoError(t, err, "turn 1")
	require.Equal(t, c.want(t, b1), a1.Tokens, "turn 1")
	assert.Zero(t, pd.reused(), "a first turn reuses nothing")
	replay, ok := completeKVParams(kv1)
	require.True(t, ok, "the decode answer's kv_transfer_params are not what the sidecar caches: %v", kv1)
	assert.EqualValues(t, len(prompt1)+len(a1.Tokens)-1, replay["remote_num_tokens"], "the kept turn: prompt and reply but the last token")
	assert.EqualValues(t, 1, metric(t, c.client, dec, "kvbridge_example_reuse_held_rooms"), "the turn kept on the decode rank")
	b2 := body(append(append(slices.Clone(prompt1), a1.Tokens...), tinyPrompt(rng, 6)...), 5, false)
	a2, kv2, err := pd.turn(ctx, "/v1/completions", b2, replay)
	require.NoError(t, err, "turn 2")
	assert.Equal(t, c.want(t, b2), a2.Tokens, "turn 2, its prefix fetched from the decode")
	assert.Equal(t, len(prompt1)+len(a1.Tokens)-1, pd.reused(), "turn 2's prefill reused the whole kept turn")
	computeReused := pd.lastPrefillAnswer["kvbridge"].(map[string]any)["phases_ms"].(map[string]any)["compute"]
	waitMetricAtMost(t, c.client, dec, "kvbridge_example_reuse_held_rooms", 1, 5*time.Second) // (turn 2's own kept)
	assert.EqualValues(t, 1, outcome(dec, "used"), "the kept turn released at use")

	// The same replay again: used once — the prefill computes it all.
	a2b, _, err := pd.turn(ctx, "/v1/completions", b2, replay)
	require.NoError(t, err, "turn 2 replayed twice")
	assert.Equal(t, c.want(t, b2), a2b.Tokens, "turn 2 replayed twice")
	assert.Zero(t, pd.reused(), "a kept turn fetched twice")
	assert.EqualValues(t, 1, outcome(pre, "failed"), "the second fetch failed")
	computeFull := pd.lastPrefillAnswer["kvbridge"].(map[string]any)["phases_ms"].(map[string]any)["compute"]
	t.Logf("turn 2's prefill (%d-token prompt): %.2f ms computing %d tokens with the turn reused, %.2f ms computing all",
		len(b2["prompt"].([]int)), computeReused, len(b2["prompt"].([]int))-len(prompt1)-len(a1.Tokens)+1, computeFull)

	// A third turn from turn 2's answer: conversations go on.
	replay2, ok := completeKVParams(kv2)
	require.True(t, ok, "turn 2's answer: %v", kv2)
	b3 := body(append(append(slices.Clone(b2["prompt"].([]int)), a2.Tokens...), tinyPrompt(rng, 3)...), 4, false)
	a3, _, err := pd.turn(ctx, "/v1/completions", b3, replay2)
	require.NoError(t, err, "turn 3")
	assert.Equal(t, c.want(t, b3), a3.Tokens, "turn 3")
	assert.Equal(t, len(b2["prompt"].([]int))+len(a2.Tokens)-1, pd.reused(), "turn 3's prefill reused turn 2")

	// Chat, streamed, as the sidecar replays it: turn 2's messages are
	// turn 1's, the reply as the client got it, and a new message. The
	// reply's text is the tokens detokenized: where a token is not
	// printable it comes back as other bytes, and only turn 1's prompt
	// is reused.
	msgs := []map[string]any{{"role": "user", "content": "What is the capital of France?"}}
	c1 := body(msgs, 6, true)
	ca1, ckv1, err := pd.turn(ctx, "/v1/chat/completions", c1, nil)
	require.NoError(t, err, "chat turn 1")
	require.Equal(t, c.want(t, c1), ca1.Tokens, "chat turn 1")
	creplay, ok := completeKVParams(ckv1)
	require.True(t, ok, "a streamed answer's final chunk: kv_transfer_params %v", ckv1)
	msgs2 := append(slices.Clone(msgs), map[string]any{"role": "assistant", "content": openai.DetokAll(ca1.Tokens)},
		map[string]any{"role": "user", "content": "And of Italy?"})
	c2 := body(msgs2, 6, true)
	ca2, _, err := pd.turn(ctx, "/v1/chat/completions", c2, creplay)
	require.NoError(t, err, "chat turn 2")
	assert.Equal(t, c.want(t, c2), ca2.Tokens, "chat turn 2")
	p1 := chatPrompt(t, msgs)
	kept := append(slices.Clone(p1), ca1.Tokens[:len(ca1.Tokens)-1]...)
	want := len(p1)
	if p2 := chatPrompt(t, msgs2); slices.Equal(p2[:len(kept)], kept) {
		want = len(kept)
	}
	assert.Equal(t, want, pd.reused(), "chat turn 2's reused prefix")

	// Altered on the way (remote_port; the ticket is signed over it), or
	// not a kvbridge ticket: computed in full, nothing fetched.
	_, kv4, err := pd.turn(ctx, "/v1/completions", b1, nil)
	require.NoError(t, err)
	r4, _ := completeKVParams(kv4)
	forged := clone(r4)
	forged["remote_port"] = r4["remote_port"].(float64) + 1
	a, _, err := pd.turn(ctx, "/v1/completions", b2, forged)
	require.NoError(t, err, "a forged replay")
	assert.Equal(t, c.want(t, b2), a.Tokens, "a forged replay")
	assert.Zero(t, pd.reused(), "a forged replay")
	assert.EqualValues(t, 1, outcome(pre, "forged"))
	foreign := clone(r4)
	foreign["remote_request_id"] = "chatcmpl-1"
	a, _, err = pd.turn(ctx, "/v1/completions", b2, foreign)
	require.NoError(t, err, "a foreign replay")
	assert.Equal(t, c.want(t, b2), a.Tokens, "a foreign replay")
	assert.EqualValues(t, 1, outcome(pre, "foreign"))
	assert.Equal(t, 3.0, outcome(pre, "reused"), "turns 2, 3 and chat turn 2")
	// A replay whose prompt does not extend the kept turn: not fetched,
	// released with a dummy request (its pages go back now, not at the
	// lease's end).
	usedBefore := outcome(dec, "used")
	other := body(tinyPrompt(rng, 20), 3, false)
	a, _, err = pd.turn(ctx, "/v1/completions", other, r4)
	require.NoError(t, err, "a replay on another conversation")
	assert.Equal(t, c.want(t, other), a.Tokens, "a replay on another conversation")
	assert.Zero(t, pd.reused(), "a replay on another conversation")
	assert.EqualValues(t, 1, outcome(pre, "mismatch"))
	assert.Equal(t, usedBefore+1, outcome(dec, "used"), "the kept turn a mismatched replay named released at once")
	assert.Equal(t, outcome(dec, "kept")-outcome(dec, "used")-outcome(dec, "expired")-outcome(dec, "failed"),
		metric(t, c.client, dec, "kvbridge_example_reuse_held_rooms"), "held = kept − released")

	// A turn too long for the decode's reuse pages (64 of 4 tokens): not
	// kept, answered all the same.
	long := body(tinyPrompt(rng, 300), 4, false)
	a, kvl, err := pd.turn(ctx, "/v1/completions", long, nil)
	require.NoError(t, err, "a turn too long to keep")
	assert.Equal(t, c.want(t, long), a.Tokens, "a turn too long to keep")
	_, named := completeKVParams(kvl)
	assert.False(t, named, "a turn too long to keep named in the answer: %v", kvl)
	assert.EqualValues(t, 1, outcome(dec, "no_pages"))
	c.nothingPinned(t)
	c.reuseSettled(t, 64, 64)
}

// reuseSettled checks the reuse paths once their transfers ended: the
// prefill rank's holds no room and all its pages; every live room of the
// decode rank's is a kept turn, and its pages are free or a kept turn's.
func (c *tinyCluster) reuseSettled(t *testing.T, prefillPages, decodePages float64) {
	t.Helper()
	pre, dec := c.prefill[0].http, c.decode[0].http
	require.Eventually(t, func() bool {
		return reuseRooms(t, c.client, pre) == 0 && metric(t, c.client, pre, "kvbridge_example_reuse_free_pages") == prefillPages
	}, 10*time.Second, 20*time.Millisecond, "the prefill's reuse path: rooms %v, free pages %v of %v", reuseRooms(t, c.client, pre),
		metric(t, c.client, pre, "kvbridge_example_reuse_free_pages"), prefillPages)
	held := metric(t, c.client, dec, "kvbridge_example_reuse_held_rooms")
	require.Eventually(t, func() bool {
		return reuseRooms(t, c.client, dec) == held &&
			metric(t, c.client, dec, "kvbridge_example_reuse_free_pages")+metric(t, c.client, dec, "kvbridge_example_reuse_held_pages") == decodePages
	}, 10*time.Second, 20*time.Millisecond, "the decode's reuse path: rooms %v (%v kept turns), free pages %v and kept %v of %v",
		reuseRooms(t, c.client, dec), held, metric(t, c.client, dec, "kvbridge_example_reuse_free_pages"),
		metric(t, c.client, dec, "kvbridge_example_reuse_held_pages"), decodePages)
}

// reuseRooms is the live rooms of a rank's reuse Manager (its metrics
// prefixed reuse_).
func reuseRooms(t *testing.T, cl *http.Client, rank string) float64 {
	n := 0.0
	for _, l := range strings.Split(metricsText(cl, rank, "reuse_kvbridge_rooms"), "; ") {
		if f := strings.Fields(l); len(f) == 2 {
			v, err := strconv.ParseFloat(f[1], 64)
			require.NoError(t, err, l)
			n += v
		}
	}
	return n
}

// TestOpenAIMultiTurnLease: a kept turn nobody fetches is released at its
// lease's end; a replay after it is stale, and one naming a decode process
// killed since, computed in full.
func TestOpenAIMultiTurnLease(t *testing.T) {
	t.Parallel() // its own processes and ports
	c, pd := multiTurnCluster(t, "2s", 8)
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(22, 22))
	b1 := body(tinyPrompt(rng, 10), 4, false)
	a1, kv1, err := pd.turn(ctx, "/v1/completions", b1, nil)
	require.NoError(t, err)
	replay, ok := completeKVParams(kv1)
	require.True(t, ok, "%v", kv1)
	dec := c.decode[0].http
	start := time.Now()
	waitMetricAtMost(t, c.client, dec, "kvbridge_example_reuse_held_rooms", 0, 10*time.Second)
	t.Logf("an unfetched turn released %v after its answer (lease 2 s)", time.Since(start).Round(time.Millisecond))
	assert.EqualValues(t, 1, metric(t, c.client, dec, `kvbridge_example_reuse_total{outcome="expired"}`))
	b2 := body(append(append(slices.Clone(b1["prompt"].([]int)), a1.Tokens...), tinyPrompt(rng, 4)...), 4, false)
	a, _, err := pd.turn(ctx, "/v1/completions", b2, replay)
	require.NoError(t, err, "a stale replay")
	assert.Equal(t, c.want(t, b2), a.Tokens, "a stale replay")
	assert.Zero(t, pd.reused(), "a stale replay")
	assert.EqualValues(t, 1, metric(t, c.client, c.prefill[0].http, `kvbridge_example_reuse_total{outcome="stale"}`))

	// A kept turn too long for the prefill's reuse pages (8 of 4 tokens):
	// computed in full; released at once with a dummy request.
	bl := body(tinyPrompt(rng, 40), 4, false)
	al, kvl, err := pd.turn(ctx, "/v1/completions", bl, nil)
	require.NoError(t, err)
	rl, ok := completeKVParams(kvl)
	require.True(t, ok, "%v", kvl)
	bl2 := body(append(append(slices.Clone(bl["prompt"].([]int)), al.Tokens...), tinyPrompt(rng, 4)...), 4, false)
	a, _, err = pd.turn(ctx, "/v1/completions", bl2, rl)
	require.NoError(t, err, "a kept turn too long for the prefill's reuse pages")
	assert.Equal(t, c.want(t, bl2), a.Tokens, "a kept turn too long for the prefill's reuse pages")
	assert.Zero(t, pd.reused())
	assert.EqualValues(t, 1, metric(t, c.client, c.prefill[0].http, `kvbridge_example_reuse_total{outcome="no_pages"}`))
	assert.EqualValues(t, 1, metric(t, c.client, dec, `kvbridge_example_reuse_total{outcome="used"}`),
		"the kept turn the prefill had no pages for released at once (a dummy request), not at the lease")
	waitMetricAtMost(t, c.client, dec, "kvbridge_example_reuse_held_rooms", 0, 10*time.Second)
	c.reuseSettled(t, 8, 64)

	// The decode process that kept a turn killed (kill -9) and started
	// again on the same reuse bootstrap port: a replay naming it is
	// computed in full at once (its epoch is not the registered one), not
	// after -reuse-timeout.
	_, kv3, err := pd.turn(ctx, "/v1/completions", b1, nil)
	require.NoError(t, err)
	r3, ok := completeKVParams(kv3)
	require.True(t, ok, "%v", kv3)
	c.decode[0].kill()
	c.decode[0] = startTinyRank(t, "decode", c.decode[0].args...)
	pd.decode = c.decode[0].http
	start = time.Now()
	a, _, err = pd.turn(ctx, "/v1/completions", b2, r3)
	require.NoError(t, err, "a replay naming a killed decode process")
	assert.Equal(t, c.want(t, b2), a.Tokens, "a replay naming a killed decode process")
	assert.Zero(t, pd.reused())
	assert.EqualValues(t, 1, metric(t, c.client, c.prefill[0].http, `kvbridge_example_reuse_total{outcome="gone"}`))
	t.Logf("a replay naming a killed decode process answered in %v (-reuse-timeout 2 s)", time.Since(start).Round(time.Millisecond))
	c.nothingPinned(t)
}

// multiTurnCluster is a pair of one rank each with multi-turn reuse on,
// the decode rank's reuse bootstrap server on a port of its own (a
// restarted process takes it again, as a pod's does).
func multiTurnCluster(t *testing.T, lease string, prefillPages int) (*tinyCluster, *pdClient) {
	c := startTinyClusterWith(t, tinyE2E, "NHD", transfer.Parallel{}, transfer.Parallel{}, tinyOpts{
		prefill: []string{"-request-timeout", "20s", "-reuse-pages", strconv.Itoa(prefillPages), "-reuse-timeout", "2s"},
		decode: []string{"-request-timeout", "20s", "-reuse-pages", "64", "-reuse-lease", lease,
			"-reuse-bootstrap", "127.0.0.1:" + freePort(t)}, decodeNoBootstrap: true})
	return c, newPDClient(t, c)
}

// chatPrompt is the prompt tokens of chat messages.
func chatPrompt(t *testing.T, msgs []map[string]any) []int {
	raw, _ := json.Marshal(msgs)
	var m []openai.Message
	require.NoError(t, json.Unmarshal(raw, &m))
	text, err := openai.ChatTemplate(m)
	require.NoError(t, err)
	return openai.Tokenize(text)
}

// BenchmarkMultiTurnTTFT: a conversation's second turn with its first
// turn's KV fetched from the decode instance (multi-turn reuse) against the
// same second turn computed in full, interleaved on the same pair (one
// rank each, the tests' model, ucx over shared memory): a 96-token first
// turn answered with 16 tokens, then a second turn of those, the reply
// and 32 new tokens (144), asking for one token, so its latency is its
// time to first token through both fronts. Both second turns are sent
// as the sidecar sends them; the reference's replay is left off. Reports
// each way's p50 and p99, their ratio, the prefill's forward pass
// (phases_ms.compute) p50 each way, and both ranks' CPU per second turn. One second turn with reuse goes
// first, unmeasured: the reuse paths' REGISTER, as the main pair's
// happened in a first turn.
func BenchmarkMultiTurnTTFT(b *testing.B) {
	c := startTinyClusterWith(b, tinyE2E, "NHD", transfer.Parallel{}, transfer.Parallel{}, tinyOpts{
		prefill: []string{"-reuse-pages", "64"}, decode: []string{"-reuse-pages", "16384", "-reuse-lease", "3s"}, decodeNoBootstrap: true})
	pd := newPDClient(b, c)
	ctx := context.Background()
	rng := mrand.New(mrand.NewPCG(3, 4))
	compute := func() float64 {
		v, _ := pd.lastPrefillAnswer["kvbridge"].(map[string]any)["phases_ms"].(map[string]any)["compute"].(float64)
		return v
	}
	// Both ranks' CPU (clock-tick resolution: summed over a run) across
	// each second turn.
	ranksCPU := func() time.Duration {
		var sum time.Duration
		for _, p := range []*tinyProc{c.prefill[0], c.decode[0]} {
			t, err := cpustat.Process(p.cmd.Process.Pid)
			if err != nil {
				b.Fatal(err)
			}
			sum += t.Total()
		}
		return sum
	}
	var cpuWith, cpuWithout time.Duration
	second := func(reuse bool) (time.Duration, float64) {
		p1 := tinyPrompt(rng, 96)
		a1, kv, err := pd.turn(ctx, "/v1/completions", body(p1, 16, false), nil)
		if err != nil {
			b.Fatal(err)
		}
		replay, ok := completeKVParams(kv)
		if !ok {
			b.Fatalf("no kept turn: %v (decode %s)", kv, metricsText(c.client, c.decode[0].http, "kvbridge_example_reuse"))
		}
		if !reuse {
			replay = nil
		}
		b2 := body(append(append(p1, a1.Tokens...), tinyPrompt(rng, 32)...), 1, false)
		cpu0, start := ranksCPU(), time.Now()
		if _, _, err := pd.turn(ctx, "/v1/completions", b2, replay); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if cpu := ranksCPU() - cpu0; reuse {
			cpuWith += cpu
		} else {
			cpuWithout += cpu
		}
		if got := pd.reused() > 0; got != reuse {
			b.Fatalf("reused %d tokens with reuse %t", pd.reused(), reuse)
		}
		return d, compute()
	}
	second(true) // (the reuse paths' first REGISTER, as turn 1's was the main pair's)
	cpuWith = 0
	var with, without []time.Duration
	var cWith, cWithout []float64
	for b.Loop() {
		d, c := second(true)
		with, cWith = append(with, d), append(cWith, c)
		d, c = second(false)
		without, cWithout = append(without, d), append(cWithout, c)
	}
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(quantileMS(without, 0.5), "full-p50-ms")
	b.ReportMetric(quantileMS(without, 0.99), "full-p99-ms")
	b.ReportMetric(quantileMS(with, 0.5), "reuse-p50-ms")
	b.ReportMetric(quantileMS(with, 0.99), "reuse-p99-ms")
	b.ReportMetric(quantileMS(with, 0.5)/quantileMS(without, 0.5), "p50-ratio")
	b.ReportMetric(med(cWithout), "full-compute-ms")
	b.ReportMetric(med(cWith), "reuse-compute-ms")
	b.ReportMetric(float64(cpuWithout.Microseconds())/1e3/float64(len(without)), "full-cpu-ms/turn")
	b.ReportMetric(float64(cpuWith.Microseconds())/1e3/float64(len(with)), "reuse-cpu-ms/turn")
}

// metricsText is a rank's metric lines that start with prefix (for a
// failure's message).
func metricsText(cl *http.Client, rank, prefix string) string {
	resp, err := cl.Get(rank + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}

// quantileMS is the p quantile of durations, in milliseconds.
func quantileMS(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(int(p*float64(len(s))), len(s)-1)].Seconds() * 1e3
}
