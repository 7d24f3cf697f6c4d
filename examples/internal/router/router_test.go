package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/rankcmd"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRank answers /v1/info and the model endpoints: prefill succeeds
// (or fails once, failPrefill), decode streams tokens prompt[0]+i.
type fakeRank struct {
	info        rankcmd.Info
	mu          sync.Mutex
	rooms       []uint64
	failPrefill int
	bodies      []string
}

func (f *fakeRank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/info":
		json.NewEncoder(w).Encode(f.info)
	case "/v1/prefill":
		var p rankcmd.PrefillRequest
		json.NewDecoder(r.Body).Decode(&p)
		f.mu.Lock()
		f.rooms = append(f.rooms, p.Room)
		fail := f.failPrefill > 0
		f.failPrefill--
		f.mu.Unlock()
		if fail {
			json.NewEncoder(w).Encode(rankcmd.PrefillResult{Room: p.Room, Status: "Failed", Reason: "test"})
			return
		}
		json.NewEncoder(w).Encode(rankcmd.PrefillResult{Room: p.Room, Status: "Success"})
	case "/v1/generate":
		var g rankcmd.GenerateRequest
		b, _ := io.ReadAll(r.Body)
		json.Unmarshal(b, &g)
		f.mu.Lock()
		f.rooms = append(f.rooms, g.Room)
		f.bodies = append(f.bodies, string(b))
		f.mu.Unlock()
		enc := json.NewEncoder(w)
		if g.AbortAt != "" {
			enc.Encode(rankcmd.GenerateEvent{Done: true, Status: "Failed", Reason: "aborted: " + g.AbortAt})
			return
		}
		if g.Peers != nil || f.info.Parallel.Global() == 0 {
			for i := 0; i < g.MaxTokens; i++ {
				tok := (g.Prompt[0] + i) % 256
				enc.Encode(rankcmd.GenerateEvent{Token: &tok, Index: i})
			}
		}
		enc.Encode(rankcmd.GenerateEvent{Done: true, Status: "Success", Tokens: map[bool]int{true: g.MaxTokens}[f.info.Parallel.Global() == 0]})
	}
}

func startFake(t *testing.T, role, instance string, par transfer.Parallel) (*fakeRank, string) {
	f := &fakeRank{info: rankcmd.Info{Role: role, Instance: instance, Parallel: par, Compute: "tinyllm", Fingerprint: "fp", Vocab: 300,
		Model: kvmodel.Model{Name: "tinyllm", Layers: 2, KVHeads: 2, HeadDim: 4, DTypeBytes: 4, PageTokens: 4}, Bootstrap: "http://boot-" + instance}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func newRouter(t *testing.T, cfg Config) (*Router, string) {
	rt, err := New(context.Background(), cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	return rt, srv.URL
}

func post(t *testing.T, url, body string) (int, string) {
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestCompletions: a text prompt and token ids, JSON and SSE; the room
// and bootstrap address handed to both sides; round robin over two
// prefill instances; /metrics counts TTFT and TPOT.
func TestCompletions(t *testing.T) {
	p0, u0 := startFake(t, "prefill", "p0", transfer.Parallel{})
	p1, u1 := startFake(t, "prefill", "p1", transfer.Parallel{})
	d, ud := startFake(t, "decode", "d0", transfer.Parallel{})
	_, url := newRouter(t, Config{Prefill: [][]string{{u0}, {u1}}, Decode: [][]string{{ud}}})
	code, body := post(t, url, `{"prompt":"AB","max_tokens":3}`)
	var c Completion
	require.Equal(t, 200, code, body)
	require.NoError(t, json.Unmarshal([]byte(body), &c), body)
	require.Equal(t, "[65 66 67]", fmt.Sprint(c.Choices[0].TokenIDs), "answer %+v (%s)", c, body)
	require.Equal(t, "ABC", c.Choices[0].Text, "answer %+v (%s)", c, body)
	require.EqualValues(t, 2, c.Usage.PromptTokens, "answer %+v (%s)", c, body)
	require.Equal(t, "p0", c.KV.Prefill, "answer %+v (%s)", c, body)
	code, body = post(t, url, `{"prompt":[10,11],"max_tokens":2,"stream":true}`)
	var ids []int
	final := false
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c Completion
		require.NoError(t, json.Unmarshal([]byte(data), &c), "%q", data)
		ids = append(ids, c.Choices[0].TokenIDs...)
		if c.KV != nil {
			final = c.KV.Prefill == "p1" && *c.Choices[0].FinishReason == "length"
		}
	}
	require.Equal(t, 200, code, "stream:\n%s", body)
	require.Equal(t, "[10 11]", fmt.Sprint(ids), "stream:\n%s", body)
	require.True(t, final, "stream: no final chunk:\n%s", body)
	require.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), "stream:\n%s", body)
	// The decode rank got the prefill instance's bootstrap address and the
	// room the prefill instance got.
	require.Contains(t, d.bodies[0], `"prefill":"http://boot-p0"`, "decode bodies %q", d.bodies)
	require.Equal(t, p0.rooms[0], d.rooms[0], "decode rooms %v, prefill rooms %v %v", d.rooms, p0.rooms, p1.rooms)
	require.Equal(t, p1.rooms[0], d.rooms[1], "decode rooms %v, prefill rooms %v %v", d.rooms, p0.rooms, p1.rooms)
	require.NotEqual(t, d.rooms[0], d.rooms[1], "decode rooms %v, prefill rooms %v %v", d.rooms, p0.rooms, p1.rooms)
	resp, _ := http.Get(url + "/metrics")
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"kvbridge_router_ttft_seconds_count 2", "kvbridge_router_tpot_seconds_count 2", `kvbridge_router_requests_total{outcome="ok"} 2`} {
		assert.Contains(t, string(m), want, "metrics lack %q", want)
	}
}

// TestRetries: a room that fails before its first token is retried on a
// fresh room; with retries off the request fails.
func TestRetries(t *testing.T) {
	_, up := startFake(t, "prefill", "p0", transfer.Parallel{})
	d, ud := startFake(t, "decode", "d0", transfer.Parallel{})
	_, url := newRouter(t, Config{Prefill: [][]string{{up}}, Decode: [][]string{{ud}}, Backoff: time.Millisecond})
	code, body := post(t, url, `{"prompt":[5],"max_tokens":2,"abort_at":"decode-mid"}`)
	var c Completion
	json.Unmarshal([]byte(body), &c)
	require.Equal(t, 200, code, "%s (rooms %v)", body, d.rooms)
	require.EqualValues(t, 2, c.KV.Attempts, "%s (rooms %v)", body, d.rooms)
	require.Len(t, d.rooms, 2, "%s", body)
	require.NotEqual(t, d.rooms[0], d.rooms[1], "%s (rooms %v)", body, d.rooms)
	_, url = newRouter(t, Config{Prefill: [][]string{{up}}, Decode: [][]string{{ud}}, Retries: -1})
	code, body = post(t, url, `{"prompt":[5],"max_tokens":2,"abort_at":"decode-before"}`)
	require.Equal(t, http.StatusBadGateway, code, "without retries: %s", body)
}

// TestLeastLoaded picks the instance with fewer requests in flight.
func TestLeastLoaded(t *testing.T) {
	_, u0 := startFake(t, "prefill", "p0", transfer.Parallel{})
	_, u1 := startFake(t, "prefill", "p1", transfer.Parallel{})
	_, ud := startFake(t, "decode", "d0", transfer.Parallel{})
	rt, _ := newRouter(t, Config{Prefill: [][]string{{u0}, {u1}}, Decode: [][]string{{ud}}, Policy: "least-loaded"})
	rt.prefill[0].inflight.Add(3)
	require.Equal(t, "p1", rt.pick(rt.prefill, 0).Name, "picked")
	rt.prefill[1].inflight.Add(5)
	require.Equal(t, "p0", rt.pick(rt.prefill, 1).Name, "picked")
}

// TestMultiRankDecode: the first decode rank gets the others as peers
// and streams; the others get none.
func TestMultiRankDecode(t *testing.T) {
	_, up := startFake(t, "prefill", "p0", transfer.Parallel{})
	d0, u0 := startFake(t, "decode", "d", transfer.Parallel{TPSize: 2})
	d1, u1 := startFake(t, "decode", "d", transfer.Parallel{TPSize: 2, TPRank: 1})
	_, url := newRouter(t, Config{Prefill: [][]string{{up}}, Decode: [][]string{{u1, u0}}}) // any order
	code, body := post(t, url, `{"prompt":[7],"max_tokens":2}`)
	require.Equal(t, 200, code, body)
	require.Contains(t, d0.bodies[0], `"peers":["`+u1+`"]`, "rank 0")
	require.NotContains(t, d1.bodies[0], "peers", "rank 1")
}

// TestRefusals: bad requests are 400s; an unsupported topology, a
// mismatched model or a listed rank of the wrong role stop New.
func TestRefusals(t *testing.T) {
	_, up := startFake(t, "prefill", "p0", transfer.Parallel{})
	_, ud := startFake(t, "decode", "d0", transfer.Parallel{})
	_, url := newRouter(t, Config{Prefill: [][]string{{up}}, Decode: [][]string{{ud}}})
	for _, body := range []string{`{"prompt":[],"max_tokens":2}`, `{"prompt":[300]}`, `{"prompt":[-1]}`, `{"prompt":{}}`, `{"prompt":"x","max_tokens":-1}`,
		`{"prompt":"x","abort_at":"never"}`, `{"prompt":"x","fault":"x"}`, `not json`} {
		code, msg := post(t, url, body)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", body, msg)
	}
	ctx := context.Background()
	_, err := New(ctx, Config{Prefill: [][]string{{ud}}, Decode: [][]string{{ud}}})
	assert.ErrorContains(t, err, "is a decode rank", "a decode rank listed as prefill")
	_, upp := startFake(t, "prefill", "p1", transfer.Parallel{})
	_, ud2 := startFake(t, "decode", "d2", transfer.Parallel{PPSize: 2})
	_, ud3 := startFake(t, "decode", "d2", transfer.Parallel{PPSize: 2, PPRank: 1})
	_, err = New(ctx, Config{Prefill: [][]string{{upp}}, Decode: [][]string{{ud2, ud3}}})
	assert.ErrorContains(t, err, "unsupported topology", "prefill PP 1 → decode PP 2")
	_, err = New(ctx, Config{Prefill: [][]string{{upp}}, Decode: [][]string{{ud2}}})
	assert.Error(t, err, "an instance listed without all its ranks was accepted")
	f, uf := startFake(t, "decode", "d4", transfer.Parallel{})
	f.info.Fingerprint = "other"
	_, err = New(ctx, Config{Prefill: [][]string{{upp}}, Decode: [][]string{{uf}}})
	assert.Error(t, err, "a rank serving another model was accepted")
	// Pages of another size: accepted when one size divides the other.
	f16, u16 := startFake(t, "decode", "d5", transfer.Parallel{})
	f16.info.Model.PageTokens = 16
	_, err = New(ctx, Config{Prefill: [][]string{{upp}}, Decode: [][]string{{u16}}})
	assert.NoError(t, err, "4-token prefill pages, 16-token decode pages")
	f6, u6 := startFake(t, "decode", "d6", transfer.Parallel{})
	f6.info.Model.PageTokens = 6
	_, err = New(ctx, Config{Prefill: [][]string{{upp}}, Decode: [][]string{{u6}}})
	assert.ErrorContains(t, err, "one must divide the other", "4-token prefill pages, 6-token decode pages")
	// Every prefill × decode pair is checked, not each rank against the
	// first: 4 divides 8 and 12, 8 and 12 do not divide.
	f8, u8 := startFake(t, "prefill", "p8", transfer.Parallel{})
	f8.info.Model.PageTokens = 8
	f12, u12 := startFake(t, "decode", "d12", transfer.Parallel{})
	f12.info.Model.PageTokens = 12
	_, err = New(ctx, Config{Prefill: [][]string{{upp}, {u8}}, Decode: [][]string{{u12}}})
	assert.ErrorContains(t, err, "p8 → d12", "prefill pages of 4 and 8 tokens, decode pages of 12")
	// Ranks of one instance keep one page size.
	_, ua := startFake(t, "decode", "d7", transfer.Parallel{TPSize: 2})
	fb, ub := startFake(t, "decode", "d7", transfer.Parallel{TPSize: 2, TPRank: 1})
	fb.info.Model.PageTokens = 16
	_, err = New(ctx, Config{Prefill: [][]string{{upp}}, Decode: [][]string{{ua, ub}}})
	assert.ErrorContains(t, err, "its instance's other ranks", "ranks of one instance with 4- and 16-token pages")
}

// TestTurnCache: a kept turn is taken by the longest conversation a prompt
// extends (never by the conversation itself, which has nothing new to
// compute), once; an expired one is not; the cache holds at most
// maxTurns.
func TestTurnCache(t *testing.T) {
	c := turnCache{turns: map[[32]byte]turn{}, lens: map[int]int{}}
	now := time.Now()
	later := now.Add(time.Minute)
	c.put([]int{1, 2, 3}, map[string]any{"id": "short"}, later)
	c.put([]int{1, 2, 3, 4, 5}, map[string]any{"id": "long"}, later)
	c.put([]int{9, 9}, map[string]any{"id": "expired"}, now)
	assert.Nil(t, c.take([]int{1, 2, 3}, now), "the conversation itself")
	assert.Equal(t, "long", c.take([]int{1, 2, 3, 4, 5, 6}, now)["id"], "the longest it extends")
	assert.Equal(t, "short", c.take([]int{1, 2, 3, 4, 5, 6}, now)["id"], "the long one was taken: the next longest")
	assert.Nil(t, c.take([]int{1, 2, 3, 4, 5, 6}, now), "each taken once")
	assert.Nil(t, c.take([]int{9, 9, 1}, now), "expired")
	assert.Empty(t, c.turns)
	assert.Empty(t, c.lens)
	for i := range maxTurns + 10 {
		c.put([]int{i, 1}, map[string]any{}, later)
	}
	assert.Len(t, c.turns, maxTurns, "bounded")
	// Taken and replaced entries leave stale slots behind: eviction skips
	// them and pushes out only the oldest live entry.
	// (the oldest live entry is [10 1]: put again, its first slot is stale)
	c.put([]int{10, 1}, map[string]any{"id": "again"}, later)
	c.put([]int{-1, 1}, map[string]any{}, later)
	assert.Equal(t, "again", c.take([]int{10, 1, 7}, now)["id"], "a replaced entry outlives its stale slot")
	assert.Nil(t, c.take([]int{11, 1, 7}, now), "the oldest live entry pushed out instead")
	assert.NotNil(t, c.take([]int{12, 1, 7}, now), "and only it")
	assert.Nil(t, c.take([]int{0, 1, 7}, now), "the oldest pushed out")
}
