package rankcmd

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRoomRequestBounds: POST /v1/room refuses, before touching the rank,
// every request issue 14 saw misbehave: tokens near 2^63 (a slice-bounds
// panic), tokens above the pool (a wait for the whole timeout), an
// overflowing timeout (expired at once), huge bodies, trailing data, no
// token.
func TestRoomRequestBounds(t *testing.T) {
	m := kvmodel.Presets["tiny"]
	r := &Rank{Model: m, npage: 64, token: "tok"}
	srv := httptest.NewServer(http.HandlerFunc(r.serveRoom))
	defer srv.Close()
	for _, tc := range []struct {
		name, token, body string
		code              int
	}{
		{"no token", "", `{"room":1,"tokens":16}`, 401},
		{"wrong token", "nope", `{"room":1,"tokens":16}`, 401},
		{"tokens near 2^63", "tok", `{"room":1,"tokens":9223372036854775800}`, 400},
		{"tokens above the pool", "tok", `{"room":1,"tokens":100000}`, 400},
		{"tokens 0", "tok", `{"room":1,"tokens":0}`, 400},
		{"timeout overflows", "tok", `{"room":1,"tokens":16,"timeout_ms":9223372036854775}`, 400},
		{"negative chunk", "tok", `{"room":1,"tokens":16,"chunk":-1}`, 400},
		{"bad abort_at", "tok", `{"room":1,"tokens":16,"abort_at":"never"}`, 400},
		{"trailing data", "tok", `{"room":1,"tokens":16} {"room":2}`, 400},
		{"1 MiB body", "tok", `{"room":1,"tokens":16,"abort_at":"` + strings.Repeat("x", 1<<20) + `"}`, 413},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(tc.body))
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.code)
		}
	}
	if p := kvmodel.NewPages(4, 1).Get(math.MinInt); p != nil {
		t.Fatalf("Get of a negative count returned %v", p)
	}
}

// TestRoomStateEndpoint: GET /v1/room?room=N reads a live room's state
// while its POST is still blocked; unknown rooms are 404, the token applies.
func TestRoomStateEndpoint(t *testing.T) {
	cfg := kvmanager.DefaultConfig(kvmanager.RolePrefill)
	cfg.Auth = testauth.Auth()
	cfg.Instance, cfg.Compat = "state-test", "v1:test"
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Layout = transfer.Layout{Kind: nixl.DRAM, PageBytes: 64, Regions: []nixl.Desc{{Len: 8 * 64}, {Len: 8 * 64}}}
	p, err := kvmanager.NewPrefill(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := sender.New(p, 42)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Clear()
	s.Init()
	r := &Rank{M: p.Manager, P: p, token: "tok"}
	srv := httptest.NewServer(http.HandlerFunc(r.serveRoom))
	defer srv.Close()
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/?room=42", "tok"); code != 200 || !strings.Contains(body, `"status":"Bootstrapping"`) {
		t.Fatalf("live room: %d %s", code, body)
	}
	if code, _ := get("/?room=7", "tok"); code != 404 {
		t.Fatalf("unknown room: %d", code)
	}
	if code, _ := get("/?room=42", ""); code != 401 {
		t.Fatalf("without the token: %d", code)
	}
	if code, _ := get("/?room=x", "tok"); code != 400 {
		t.Fatalf("bad room: %d", code)
	}
}
