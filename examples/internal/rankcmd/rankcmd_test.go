package rankcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/capture"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/zap"
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

// startRank builds a rank from command-line flags, as Main does, with the
// tests' secret and the loopback engine; it is closed when the test ends.
func startRank(t *testing.T, role kvmanager.Role, args ...string) (*Rank, *httptest.Server) {
	t.Helper()
	fs, o := newFlags(role)
	if err := fs.Parse(append([]string{"-engine", "loopback", "-warm=false"}, args...)); err != nil {
		t.Fatal(err)
	}
	r, _, err := newRank(role, o, testauth.Auth(), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(r.serveRoom))
	t.Cleanup(func() {
		srv.Close()
		r.M.Close()
	})
	return r, srv
}

// postRoom runs one room on a rank through POST /v1/room.
func postRoom(t *testing.T, srv *httptest.Server, rr RoomRequest) RoomResult {
	body, _ := json.Marshal(rr)
	req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testauth.Auth().BootstrapToken())
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Error(err)
		return RoomResult{}
	}
	defer resp.Body.Close()
	var res RoomResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		t.Errorf("room %d: %d: %v", rr.Room, resp.StatusCode, err)
	}
	return res
}

// TestRoomBytesBothSides: the bytes POST /v1/room reports for a room add up
// to the same on both sides (the prefill ranks' shares, the decode rank's
// whole), and to the room's tokens × the model's bytes per token. Issue 27:
// the prefill side reported heads × page × regions (32,768 for a 4,096-token
// tiny room, decode 4,194,304).
func TestRoomBytesBothSides(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefills [][]string
	}{
		{"TP 1 to 1", [][]string{{"-instance", "p11"}}},
		{"TP 2 to 1", [][]string{{"-instance", "p21", "-tp", "2", "-tp-rank", "0"}, {"-instance", "p21", "-tp", "2", "-tp-rank", "1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			boot := testauth.Server()
			if err := boot.Start("127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
			defer boot.Close(context.Background())
			common := []string{"-model", "tiny", "-pages", "512", "-page-layout", "HND", "-bootstrap", boot.URL()}
			var prefills []*httptest.Server
			for _, args := range tc.prefills {
				_, srv := startRank(t, kvmanager.RolePrefill, append(common, args...)...)
				prefills = append(prefills, srv)
			}
			d, dsrv := startRank(t, kvmanager.RoleDecode, append(common, "-instance", "d-"+tc.prefills[0][1])...)
			for i, tokens := range []int{1024, 4096} {
				room := uint64(100 + i)
				rr := RoomRequest{Room: room, Tokens: tokens, TimeoutMS: 30000, PrefillInstance: tc.prefills[0][1]}
				var wg sync.WaitGroup
				pres := make([]RoomResult, len(prefills))
				for j, srv := range prefills {
					wg.Go(func() { pres[j] = postRoom(t, srv, rr) })
				}
				dres := postRoom(t, dsrv, rr)
				wg.Wait()
				want := uint64(tokens) * d.Model.BytesPerToken()
				if dres.Status != "Success" || dres.Corrupt != 0 || dres.PagesVerified == 0 {
					t.Fatalf("room %d: decode %+v", room, dres)
				}
				var sum uint64
				for j, p := range pres {
					if p.Status != "Success" {
						t.Fatalf("room %d: prefill rank %d %+v", room, j, p)
					}
					sum += p.Bytes
				}
				if dres.Bytes != want || sum != want {
					t.Errorf("room %d (%d tokens): decode bytes %d, prefill ranks' bytes %d (each %v); want both %d",
						room, tokens, dres.Bytes, sum, bytesOf(pres), want)
				}
			}
		})
	}
}

func bytesOf(rs []RoomResult) []uint64 {
	var b []uint64
	for _, r := range rs {
		b = append(b, r.Bytes)
	}
	return b
}

// TestHelp: prefill -h and decode -h exit 0 with a usage that says what the
// binary is; the prefill-only flags are listed by prefill -h only, and
// decode refuses them (issue 27: decode -h listed -in-flight, -publish-dp
// and -serve-bootstrap).
func TestHelp(t *testing.T) {
	prefillOnly := []string{"-serve-bootstrap", "-publish-dp", "-in-flight", "-bootstrap-lease"}
	shared := []string{"-model", "-pages", "-bootstrap", "-tp", "-pp", "-dp", "-page-layout", "-insecure", "-max-misses", "-sweep-interval", "-register-retry", "-pending-timeout"}
	// and the flags docs/TOPOLOGIES.md says both binaries take
	readme, err := os.ReadFile("../../../docs/TOPOLOGIES.md")
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(readme), "The example binaries take `")
	list, _, _ = strings.Cut(list, "`")
	if !ok || !strings.Contains(list, "-tp-rank") {
		t.Fatalf("docs/TOPOLOGIES.md's list of the example binaries' flags not found: %q", list)
	}
	shared = append(shared, strings.Fields(list)...)
	for _, tc := range []struct {
		role kvmanager.Role
		name string
	}{{kvmanager.RolePrefill, "prefill"}, {kvmanager.RoleDecode, "decode"}} {
		var code int
		out := capture.Stderr(t, func() { code = Main(tc.role, []string{"-h"}) })
		if code != 0 {
			t.Errorf("%s -h: exit %d, want 0", tc.name, code)
		}
		if want := "usage: " + tc.name + " [flags]\n\nA kvbridge " + tc.name + " rank."; !strings.HasPrefix(out, want) {
			t.Errorf("%s -h does not start with %q:\n%s", tc.name, want, out)
		}
		listed := func(f string) bool {
			return strings.Contains(out, "\n  "+f+" ") || strings.Contains(out, "\n  "+f+"\n")
		}
		for _, f := range shared {
			if !listed(f) {
				t.Errorf("%s -h does not list %s:\n%s", tc.name, f, out)
			}
		}
		for _, f := range prefillOnly {
			if listed(f) != (tc.role == kvmanager.RolePrefill) {
				t.Errorf("%s -h: %s listed %v:\n%s", tc.name, f, listed(f), out)
			}
			if tc.role == kvmanager.RoleDecode {
				fs, _ := newFlags(tc.role)
				fs.SetOutput(io.Discard)
				if err := fs.Parse([]string{f + "=1"}); err == nil {
					t.Errorf("decode takes %s", f)
				}
			}
		}
	}
}

// TestTimingFlags: the control-plane timing flags the chaos soak shortens
// parse, and a negative one is refused before anything starts.
func TestTimingFlags(t *testing.T) {
	fs, o := newFlags(kvmanager.RolePrefill)
	fs.SetOutput(io.Discard)
	if err := fs.Parse([]string{"-max-misses", "3", "-sweep-interval", "50ms", "-register-retry", "20ms",
		"-pending-timeout", "4s", "-bootstrap-lease", "2s"}); err != nil {
		t.Fatal(err)
	}
	if o.maxMisses != 3 || o.sweep != 50*time.Millisecond || o.registerRetry != 20*time.Millisecond ||
		o.pending != 4*time.Second || o.bootLease != 2*time.Second {
		t.Fatalf("parsed %+v", o)
	}
	o.sweep = -time.Second
	if _, code, err := newRank(kvmanager.RolePrefill, o, testauth.Auth(), zap.NewNop(), prometheus.NewRegistry()); code != 2 || err == nil {
		t.Fatalf("a negative -sweep-interval: code %d, err %v; want 2 and an error", code, err)
	}
}
