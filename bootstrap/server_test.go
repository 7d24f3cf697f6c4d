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

func call(t *testing.T, srv *httptest.Server, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
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
	srv := httptest.NewServer(NewServer())
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
	// A restarted rank re-registers with a new endpoint.
	moved := record(0, 1)
	moved.Endpoint = "tcp://10.0.0.9:17001"
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
		{"delete", "DELETE", "/v1/ranks", "", 405},
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
	srv := NewServer()
	if err := srv.Start(addr); err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	reg := NewClient(srv.URL())
	for tp := 0; tp < 2; tp++ {
		if err := reg.RegisterRank(ctx, record(0, tp)); err != nil {
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
	if err := c.RegisterRank(ctx, bad); !errors.As(err, &he) || he.Code != 409 {
		t.Fatalf("conflict must be final, got %v", err)
	}
}

func TestClientGivesUpWithContext(t *testing.T) {
	srv := httptest.NewServer(NewServer()) // topology never completes
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
