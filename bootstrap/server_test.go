package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func record(dp, tp int) RankRecord {
	return RankRecord{Instance: "prefill-a", DPRank: dp, DPSize: 1, TPRank: tp, TPSize: 2, PPRank: 0, PPSize: 1,
		Endpoint: fmt.Sprintf("tcp://10.0.0.%d:17000", tp+1), PageSize: 16, DType: "bf16", Compat: "v1:abc"}
}

// testToken is the bearer token of the test servers.
var testToken = testAuth().BootstrapToken()

// fakeClock is a settable clock for the server's leases.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTestServer(t *testing.T) (*Server, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s, err := NewServer(ServerConfig{Token: testToken, LeaseTTL: 15 * time.Second, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

// call sends a request; writes carry the test token.
func call(t *testing.T, srv *httptest.Server, method, path, body string) (int, map[string]any) {
	t.Helper()
	tok := ""
	if method == "PUT" || method == "DELETE" {
		tok = testToken
	}
	return callWith(t, srv, tok, method, path, body)
}

func callWith(t *testing.T, srv *httptest.Server, token, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s %s: body %q is not JSON", method, path, data)
	}
	return resp.StatusCode, out
}

func jsonOf(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestServerRoutes(t *testing.T) {
	s, clk := newTestServer(t)
	srv := httptest.NewServer(s)
	defer srv.Close()

	if code, _ := call(t, srv, "GET", "/healthz", ""); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	if code, body := call(t, srv, "GET", "/v1/topology", ""); code != 503 || body["error"] == "" {
		t.Fatalf("empty table: %d %v", code, body)
	}
	if code, _ := call(t, srv, "PUT", "/v1/ranks", jsonOf(t, record(0, 0))); code != 200 {
		t.Fatalf("register: %d", code)
	}
	code, body := call(t, srv, "GET", "/v1/topology", "")
	if code != 503 || !strings.Contains(body["error"].(string), "1 of 2") {
		t.Fatalf("half the ranks: %d %v", code, body)
	}
	if code, _ := call(t, srv, "PUT", "/v1/ranks", jsonOf(t, record(0, 1))); code != 200 {
		t.Fatal(code)
	}
	code, body = call(t, srv, "GET", "/v1/topology", "")
	if code != 200 || body["tp_size"].(float64) != 2 || body["compat"] != "v1:abc" || body["page_size"].(float64) != 16 {
		t.Fatalf("topology: %d %v", code, body)
	}
	code, body = call(t, srv, "GET", "/v1/ranks?dp=0&tp=1&pp=0", "")
	if code != 200 || body["endpoint"] != "tcp://10.0.0.2:17000" {
		t.Fatalf("rank: %d %v", code, body)
	}
	if code, _ := call(t, srv, "GET", "/v1/ranks?dp=0&tp=5&pp=0", ""); code != 404 {
		t.Fatalf("unknown rank: %d", code)
	}
	// A live rank's record is held: another endpoint is refused (409 with
	// Retry-After) until the lease lapses; the same endpoint renews it.
	moved := record(0, 1)
	moved.Endpoint = "tcp://10.0.0.9:17001"
	if code, body := call(t, srv, "PUT", "/v1/ranks", jsonOf(t, moved)); code != 409 || !strings.Contains(body["error"].(string), "held by tcp://10.0.0.2:17000") {
		t.Fatalf("replacing a live rank: %d %v", code, body)
	}
	clk.t = clk.t.Add(10 * time.Second)
	if code, body := call(t, srv, "PUT", "/v1/ranks", jsonOf(t, record(0, 1))); code != 200 || body["replaced"] != false {
		t.Fatalf("renewal: %d %v", code, body)
	}
	clk.t = clk.t.Add(10 * time.Second)
	if code, _ := call(t, srv, "PUT", "/v1/ranks", jsonOf(t, moved)); code != 409 {
		t.Fatalf("replaced within the renewed lease: %d", code)
	}
	// A restarted rank re-registers with a new endpoint once the lease lapsed.
	clk.t = clk.t.Add(6 * time.Second)
	if code, body := call(t, srv, "PUT", "/v1/ranks", jsonOf(t, moved)); code != 200 || body["replaced"] != true {
		t.Fatalf("re-register: %d %v", code, body)
	}
	if _, body := call(t, srv, "GET", "/v1/ranks?dp=0&tp=1&pp=0", ""); body["endpoint"] != moved.Endpoint {
		t.Fatalf("after re-register: %v", body)
	}

	bad := func(mut func(*RankRecord)) string {
		r := record(0, 0)
		mut(&r)
		return jsonOf(t, r)
	}
	for _, tc := range []struct {
		name, method, path, body string
		code                     int
	}{
		{"not json", "PUT", "/v1/ranks", "{nope", 400},
		{"no instance", "PUT", "/v1/ranks", bad(func(r *RankRecord) { r.Instance = "" }), 400},
		{"tp_rank out of range", "PUT", "/v1/ranks", bad(func(r *RankRecord) { r.TPRank = 2 }), 400},
		{"zero size", "PUT", "/v1/ranks", bad(func(r *RankRecord) { r.DPSize = 0 }), 400},
		{"bad endpoint", "PUT", "/v1/ranks", bad(func(r *RankRecord) { r.Endpoint = "10.0.0.1:80" }), 400},
		{"wildcard endpoint", "PUT", "/v1/ranks", bad(func(r *RankRecord) { r.Endpoint = "tcp://*:80" }), 400},
		{"no page size", "PUT", "/v1/ranks", bad(func(r *RankRecord) { r.PageSize = 0 }), 400},
		{"bad key", "PUT", "/v1/ranks", bad(func(r *RankRecord) { r.PublicKey = "xyz" }), 400},
		{"other topology", "PUT", "/v1/ranks", bad(func(r *RankRecord) { r.DType = "fp8" }), 409},
		{"rank missing tp", "GET", "/v1/ranks?dp=0&pp=0", "", 400},
		{"rank negative", "GET", "/v1/ranks?dp=-1&tp=0&pp=0", "", 400},
		{"rank not a number", "GET", "/v1/ranks?dp=a&tp=0&pp=0", "", 400},
		{"delete without rank", "DELETE", "/v1/ranks", "", 400},
		{"patch", "PATCH", "/v1/ranks", "", 405},
		{"post topology", "POST", "/v1/topology", "", 405},
		{"unknown route", "GET", "/v2/x", "", 404},
	} {
		code, body := call(t, srv, tc.method, tc.path, tc.body)
		if code != tc.code || body["error"] == nil || body["error"] == "" {
			t.Errorf("%s: %d %v, want %d with a reason", tc.name, code, body, tc.code)
		}
	}
}

func TestClientRetriesUntilTopologyComplete(t *testing.T) {
	// The server is not even listening when the client starts.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := NewClient("http://" + addr)
	c.MinBackoff, c.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan error, 1)
	var topo Topology
	go func() {
		var err error
		topo, err = c.Topology(ctx)
		got <- err
	}()
	srv, _ := newTestServer(t)
	if err := srv.Start(addr); err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	reg := NewClient(srv.URL())
	reg.Token = testToken
	for tp := 0; tp < 2; tp++ {
		if _, err := reg.RegisterRank(ctx, record(0, tp)); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if topo.TPSize != 2 || topo.Instance != "prefill-a" {
		t.Fatalf("topology %+v", topo)
	}
	ri, err := c.Rank(ctx, 0, 1, 0)
	if err != nil || ri.Endpoint != "tcp://10.0.0.2:17000" {
		t.Fatalf("rank %+v %v", ri, err)
	}
	if _, err := c.Rank(ctx, 0, 7, 0); !errors.Is(err, ErrRankUnknown) {
		t.Fatalf("unknown rank: %v", err)
	}
	bad := record(0, 0)
	bad.Compat = "other"
	var he *HTTPError
	if _, err := reg.RegisterRank(ctx, bad); !errors.As(err, &he) || he.Code != 409 {
		t.Fatalf("conflict must be final, got %v", err)
	}
}

func TestClientGivesUpWithContext(t *testing.T) {
	s, _ := newTestServer(t)
	srv := httptest.NewServer(s) // topology never completes
	defer srv.Close()
	c := NewClient(srv.URL)
	c.MinBackoff = time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Topology(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no prefill rank") {
		t.Fatalf("want deadline with the last reason, got %v", err)
	}
}

// TestServerHostileWrites: writes need the token; bodies are capped and
// must be exactly one JSON value; a record is deleted only by its own
// endpoint (issue 14: a forged PUT replaced a live rank, trailing garbage
// was accepted, a 10 MB body got a connection reset).
func TestServerHostileWrites(t *testing.T) {
	s, _ := newTestServer(t)
	srv := httptest.NewServer(s)
	defer srv.Close()
	rec := jsonOf(t, record(0, 0))
	for _, tc := range []struct {
		name, token, method, path, body string
		code                            int
	}{
		{"PUT without token", "", "PUT", "/v1/ranks", rec, 401},
		{"PUT with another token", "not-the-token", "PUT", "/v1/ranks", rec, 401},
		{"DELETE without token", "", "DELETE", "/v1/ranks?dp=0&tp=0&pp=0&endpoint=x", "", 401},
		{"trailing garbage", testToken, "PUT", "/v1/ranks", rec + "garbage", 400},
		{"two values", testToken, "PUT", "/v1/ranks", rec + rec, 400},
		{"huge rank", testToken, "GET", "/v1/ranks?dp=0&tp=99999999999999999999&pp=0", "", 400},
		{"long instance", testToken, "PUT", "/v1/ranks", jsonOf(t, func() RankRecord {
			r := record(0, 0)
			r.Instance = strings.Repeat("i", 1000)
			return r
		}()), 400},
		{"huge size", testToken, "PUT", "/v1/ranks", jsonOf(t, func() RankRecord { r := record(0, 0); r.TPSize = 1 << 30; return r }()), 400},
	} {
		code, body := callWith(t, srv, tc.token, tc.method, tc.path, tc.body)
		if code != tc.code || body["error"] == "" {
			t.Errorf("%s: %d %v, want %d with a reason", tc.name, code, body, tc.code)
		}
	}
	if code, body := call(t, srv, "GET", "/v1/ranks?dp=0&tp=0&pp=0", ""); code != 404 {
		t.Fatalf("a refused write registered a rank: %d %v", code, body)
	}
	// 10 MB: answered 413, not reset.
	req, _ := http.NewRequest("PUT", srv.URL+"/v1/ranks", strings.NewReader(`{"instance":"`+strings.Repeat("x", 10<<20)+`"}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("10 MB body: %v (want a 413 answer)", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("10 MB body: %d, want 413", resp.StatusCode)
	}
	// DELETE: only the record's own endpoint.
	if code, _ := call(t, srv, "PUT", "/v1/ranks", rec); code != 200 {
		t.Fatal(code)
	}
	if code, _ := call(t, srv, "DELETE", "/v1/ranks?dp=0&tp=0&pp=0&endpoint=tcp://10.6.6.6:1", ""); code != 409 {
		t.Fatalf("delete by another endpoint: %d", code)
	}
	if code, _ := call(t, srv, "DELETE", "/v1/ranks?dp=0&tp=0&pp=0&endpoint=tcp://10.0.0.1:17000", ""); code != 200 {
		t.Fatalf("delete by the owner: %d", code)
	}
	// Once deleted, the rank's next process registers at once.
	moved := record(0, 0)
	moved.Endpoint = "tcp://10.0.0.1:17999"
	if code, _ := call(t, srv, "PUT", "/v1/ranks", jsonOf(t, moved)); code != 200 {
		t.Fatalf("after delete: %d", code)
	}
	if _, err := NewServer(ServerConfig{}); !errors.Is(err, ErrNoToken) {
		t.Fatalf("a server without token or Insecure: %v", err)
	}
}

// TestServerRoomDP: a room's DP group is published with the token, within
// the instance's DP groups, and read back; unknown rooms are 404 (which the
// client waits out).
func TestServerRoomDP(t *testing.T) {
	s, _ := newTestServer(t)
	srv := httptest.NewServer(s)
	defer srv.Close()
	rec := record(0, 0)
	rec.DPSize, rec.TPSize = 2, 1
	if code, body := call(t, srv, "PUT", "/v1/ranks", jsonOf(t, rec)); code != 200 {
		t.Fatalf("register: %d %v", code, body)
	}
	for _, tc := range []struct {
		name, token, method, path, body string
		code                            int
	}{
		{"publish without token", "", "PUT", "/v1/rooms", `{"room":7,"dp_rank":1}`, 401},
		{"dp outside the groups", testToken, "PUT", "/v1/rooms", `{"room":7,"dp_rank":2}`, 400},
		{"unknown room", "", "GET", "/v1/rooms?room=7", "", 404},
		{"bad room", "", "GET", "/v1/rooms?room=x", "", 400},
		{"publish", testToken, "PUT", "/v1/rooms", `{"room":7,"dp_rank":1}`, 200},
	} {
		if code, body := callWith(t, srv, tc.token, tc.method, tc.path, tc.body); code != tc.code {
			t.Errorf("%s: %d %v, want %d", tc.name, code, body, tc.code)
		}
	}
	c := NewClient(srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if dp, err := c.RoomDP(ctx, 7); err != nil || dp != 1 {
		t.Fatalf("RoomDP: %d %v", dp, err)
	}
}
