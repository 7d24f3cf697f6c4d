package rankcmd

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvbridge/kvbridge/examples/internal/tinyllm"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestModelRequestBounds: /v1/prefill and /v1/generate refuse, before
// touching the rank, requests outside the model and the pool.
func TestModelRequestBounds(t *testing.T) {
	m, _ := tinyllm.New(tinyllm.Config{Layers: 1, QHeads: 2, KVHeads: 1, HeadDim: 4, FFN: 4, Vocab: 50, Seed: 1})
	for _, role := range []kvmanager.Role{kvmanager.RolePrefill, kvmanager.RoleDecode} {
		r := &Rank{Role: role, Model: kvmodel.Model{PageTokens: 4}, npage: 4, token: "tok"}
		r.tiny = &tinyRank{r: r, m: m}
		mux := http.NewServeMux()
		r.tiny.routes(mux)
		srv := httptest.NewServer(mux)
		path := map[kvmanager.Role]string{kvmanager.RolePrefill: "/v1/prefill", kvmanager.RoleDecode: "/v1/generate"}[role]
		cases := []struct {
			name, token, body string
			code              int
		}{
			{"no token", "", `{"room":1,"prompt":[1],"max_tokens":1}`, 401},
			{"empty prompt", "tok", `{"room":1,"prompt":[],"max_tokens":1}`, 400},
			{"token outside the vocabulary", "tok", `{"room":1,"prompt":[50],"max_tokens":1}`, 400},
			{"negative token", "tok", `{"room":1,"prompt":[-1],"max_tokens":1}`, 400},
			{"prompt above the pool", "tok", `{"room":1,"prompt":[` + strings.Repeat("1,", 16) + `1],"max_tokens":1}`, 400},
			{"timeout overflows", "tok", `{"room":1,"prompt":[1],"max_tokens":1,"timeout_ms":9223372036854775}`, 400},
			{"bad fault", "tok", `{"room":1,"prompt":[1],"max_tokens":1,"fault":"x"}`, 400},
			{"trailing data", "tok", `{"room":1,"prompt":[1],"max_tokens":1} {}`, 400},
			{"2 MiB body", "tok", `{"room":1,"prompt":[1],"fault":"` + strings.Repeat("x", 2<<20) + `"}`, 413},
		}
		if role == kvmanager.RoleDecode {
			cases = append(cases, struct {
				name, token, body string
				code              int
			}{"no max_tokens", "tok", `{"room":1,"prompt":[1]}`, 400}, struct {
				name, token, body string
				code              int
			}{"prompt and tokens above the pool", "tok", `{"room":1,"prompt":[1],"max_tokens":17}`, 400})
		}
		for _, tc := range cases {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(tc.body))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := srv.Client().Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, tc.code, resp.StatusCode, "%s %s", path, tc.name)
		}
		srv.Close()
	}
}

// TestPrefixCache: the longest whole-page match, never the prompt's last
// page; entries in use are not evicted; the least recently used go first.
func TestPrefixCache(t *testing.T) {
	c := newPrefixCache(4, 2)
	var freed []uint32
	free := func(p []uint32) { freed = append(freed, p...) }
	require.True(t, c.insertFreeing([]int{1, 2, 3, 4}, []uint32{10, 11}, free), "insert refused")
	require.True(t, c.insertFreeing([]int{1, 2, 5, 6}, []uint32{20, 21}, free), "insert refused")
	e, k := c.lookup([]int{1, 2, 3, 4, 9})
	require.Equal(t, 2, k, "lookup: pages of %v", e)
	require.Equal(t, []uint32{10, 11}, e.pages, "lookup")
	_, k = c.lookup([]int{1, 2, 3, 4})
	require.Equal(t, 1, k, "a prompt covered exactly: pages reused, want 1 (its last page is transferred)")
	none, k := c.lookup([]int{7, 7, 7})
	require.Nil(t, none, "no match")
	require.Zero(t, k, "no match")
	// Full; the entry in use (refs 2: two lookups above) stays, the other goes.
	require.True(t, c.insertFreeing([]int{8, 8, 8, 8}, []uint32{30, 31}, free), "eviction: insert refused")
	require.Equal(t, []uint32{20, 21}, freed, "eviction freed")
	c.release(e)
	c.release(e)
	require.False(t, c.insertFreeing([]int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, []uint32{1, 2, 3, 4, 5}, free), "an entry above the capacity was taken")
}

// TestFrontJoin: an instance's front takes its other ranks' joins only
// when they are of its instance, role, model and shape, and reports the
// instance whole (GET /health) only once every rank has joined and its
// bootstrap server names each rank's process; a rank
// that is not a front refuses the OpenAI routes, naming the front's place.
func TestFrontJoin(t *testing.T) {
	m, _ := tinyllm.New(tinyllm.Config{Layers: 1, QHeads: 2, KVHeads: 2, HeadDim: 4, FFN: 4, Vocab: 50, Seed: 1})
	par := transfer.Parallel{TPSize: 2, PPSize: 1, DPSize: 1}
	// A bootstrap server's GET /v1/ranks: the records registered so far,
	// by TP rank.
	var bmu sync.Mutex
	ranks := map[int]uint64{0: 0} // the front's (its epoch: 0, no Manager here)
	boot := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		tp, _ := strconv.Atoi(req.URL.Query().Get("tp"))
		bmu.Lock()
		epoch, ok := ranks[tp]
		bmu.Unlock()
		if !ok {
			http.Error(w, `{"error":"no such rank"}`, http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(records.RankInfo{Endpoint: "tcp://x", Epoch: epoch})
	}))
	defer boot.Close()
	r := &Rank{Role: kvmanager.RolePrefill, Model: kvmodel.Model{PageTokens: 4}, npage: 4, token: "tok", Par: par, Instance: "p",
		log: zap.NewNop(), bootURL: boot.URL, httpClient: boot.Client()}
	r.tiny = &tinyRank{r: r, m: m, view: instanceView{members: map[int]member{}}}
	mux := http.NewServeMux()
	r.tiny.routes(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(path string, body any) int {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	health := func() int {
		resp, err := srv.Client().Get(srv.URL + "/health")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, 503, health(), "/health with rank 1 missing")
	peer := Info{Role: "prefill", Instance: "p", Parallel: transfer.Parallel{TPSize: 2, TPRank: 1}, Fingerprint: m.Fingerprint(), Epoch: 7}
	for _, tc := range []struct {
		name string
		mut  func(*JoinRequest)
	}{
		{"another instance", func(j *JoinRequest) { j.Info.Instance = "q" }},
		{"the other role", func(j *JoinRequest) { j.Info.Role = "decode" }},
		{"another model", func(j *JoinRequest) { j.Info.Fingerprint = "tinyllm:other" }},
		{"another shape", func(j *JoinRequest) { j.Info.Parallel.TPSize = 4 }},
		{"the front's place", func(j *JoinRequest) { j.Info.Parallel.TPRank = 0 }},
		{"no port", func(j *JoinRequest) { j.HTTP = "127.0.0.1:0" }},
	} {
		j := JoinRequest{Info: peer, HTTP: "127.0.0.1:9"}
		tc.mut(&j)
		assert.Equal(t, http.StatusConflict, post("/v1/instance/join", j), "join of %s", tc.name)
	}
	assert.Equal(t, 503, health(), "/health after refused joins")
	require.Equal(t, 200, post("/v1/instance/join", JoinRequest{Info: peer, HTTP: "0.0.0.0:9"}), "join")
	// Joined, but the bootstrap server has no record of rank 1 yet, then
	// a record of another process (issue 51: /health said ok while the
	// bootstrap server had 1 of 2 ranks): not whole.
	assert.Equal(t, 503, health(), "/health with every rank joined, rank 1 not registered")
	bmu.Lock()
	ranks[1] = 6
	bmu.Unlock()
	assert.Equal(t, 503, health(), "/health with rank 1's record naming another process")
	bmu.Lock()
	ranks[1] = 7
	bmu.Unlock()
	assert.Equal(t, 200, health(), "/health with every rank joined and registered")
	ms, err := r.tiny.members(0)
	if assert.NoError(t, err, "members") && assert.Len(t, ms, 2, "members %+v", ms) {
		assert.Equal(t, "http://127.0.0.1:9", ms[1].url, "members %+v (an unspecified host is the joiner's address)", ms)
	}
	// A rank that is not the front.
	r.Par.TPRank = 1
	assert.Equal(t, http.StatusMisdirectedRequest, post("/v1/completions", map[string]any{"prompt": []int{1}}), "/v1/completions on a rank that is not the front")
}
