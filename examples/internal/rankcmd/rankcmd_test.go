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
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		require.NoError(t, err, "%s", tc.name)
		resp.Body.Close()
		assert.Equal(t, tc.code, resp.StatusCode, "%s", tc.name)
	}
	require.Nil(t, kvmodel.NewPages(4, 1).Get(math.MinInt), "Get of a negative count")
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
	require.NoError(t, err)
	defer p.Close()
	s, err := sender.New(p, 42)
	require.NoError(t, err)
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
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/?room=42", "tok")
	require.Equal(t, 200, code, "live room: %s", body)
	require.Contains(t, body, `"status":"Bootstrapping"`, "live room")
	code, _ = get("/?room=7", "tok")
	require.Equal(t, 404, code, "unknown room")
	code, _ = get("/?room=42", "")
	require.Equal(t, 401, code, "without the token")
	code, _ = get("/?room=x", "tok")
	require.Equal(t, 400, code, "bad room")
}

// startRank builds a rank from command-line flags, as Main does, with the
// tests' secret and the loopback engine; it is closed when the test ends.
func startRank(t *testing.T, role kvmanager.Role, args ...string) (*Rank, *httptest.Server) {
	t.Helper()
	fs, o := newFlags(role)
	require.NoError(t, fs.Parse(append([]string{"-engine", "loopback", "-warm=false"}, args...)))
	r, _, err := newRank(role, o, testauth.Auth(), zap.NewNop(), prometheus.NewRegistry())
	require.NoError(t, err)
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
	if !assert.NoError(t, err, "room %d", rr.Room) { // (on the caller's goroutine or not: assert, not require)
		return RoomResult{}
	}
	defer resp.Body.Close()
	var res RoomResult
	assert.NoError(t, json.NewDecoder(resp.Body).Decode(&res), "room %d: %d", rr.Room, resp.StatusCode)
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
			require.NoError(t, boot.Start("127.0.0.1:0"))
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
				require.Equal(t, "Success", dres.Status, "room %d: decode %+v", room, dres)
				require.Zero(t, dres.Corrupt, "room %d: decode %+v", room, dres)
				require.NotZero(t, dres.PagesVerified, "room %d: decode %+v", room, dres)
				var sum uint64
				for j, p := range pres {
					require.Equal(t, "Success", p.Status, "room %d: prefill rank %d %+v", room, j, p)
					sum += p.Bytes
				}
				assert.Equal(t, want, dres.Bytes, "room %d (%d tokens): decode bytes", room, tokens)
				assert.Equal(t, want, sum, "room %d (%d tokens): prefill ranks' bytes (each %v)", room, tokens, bytesOf(pres))
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
	require.NoError(t, err)
	_, list, ok := strings.Cut(string(readme), "The example binaries take `")
	list, _, _ = strings.Cut(list, "`")
	require.True(t, ok, "docs/TOPOLOGIES.md's list of the example binaries' flags not found")
	require.Contains(t, list, "-tp-rank", "docs/TOPOLOGIES.md's list of the example binaries' flags not found")
	shared = append(shared, strings.Fields(list)...)
	for _, tc := range []struct {
		role kvmanager.Role
		name string
	}{{kvmanager.RolePrefill, "prefill"}, {kvmanager.RoleDecode, "decode"}} {
		var code int
		out := capture.Stderr(t, func() { code = Main(tc.role, []string{"-h"}) })
		assert.Zero(t, code, "%s -h: exit", tc.name)
		want := "usage: " + tc.name + " [flags]\n\nA kvbridge " + tc.name + " rank."
		assert.True(t, strings.HasPrefix(out, want), "%s -h does not start with %q:\n%s", tc.name, want, out)
		listed := func(f string) bool {
			return strings.Contains(out, "\n  "+f+" ") || strings.Contains(out, "\n  "+f+"\n")
		}
		for _, f := range shared {
			assert.True(t, listed(f), "%s -h does not list %s:\n%s", tc.name, f, out)
		}
		for _, f := range prefillOnly {
			assert.Equal(t, tc.role == kvmanager.RolePrefill, listed(f), "%s -h: %s listed:\n%s", tc.name, f, out)
			if tc.role == kvmanager.RoleDecode {
				fs, _ := newFlags(tc.role)
				fs.SetOutput(io.Discard)
				assert.Error(t, fs.Parse([]string{f + "=1"}), "decode takes %s", f)
			}
		}
	}
}

// TestTimingFlags: the control-plane timing flags the chaos soak shortens
// parse, and a negative one is refused before anything starts.
func TestTimingFlags(t *testing.T) {
	fs, o := newFlags(kvmanager.RolePrefill)
	fs.SetOutput(io.Discard)
	require.NoError(t, fs.Parse([]string{"-max-misses", "3", "-sweep-interval", "50ms", "-register-retry", "20ms",
		"-pending-timeout", "4s", "-bootstrap-lease", "2s"}))
	require.EqualValues(t, 3, o.maxMisses, "parsed %+v", o)
	require.Equal(t, 50*time.Millisecond, o.sweep, "parsed %+v", o)
	require.Equal(t, 20*time.Millisecond, o.registerRetry, "parsed %+v", o)
	require.Equal(t, 4*time.Second, o.pending, "parsed %+v", o)
	require.Equal(t, 2*time.Second, o.bootLease, "parsed %+v", o)
	o.sweep = -time.Second
	_, code, err := newRank(kvmanager.RolePrefill, o, testauth.Auth(), zap.NewNop(), prometheus.NewRegistry())
	require.Equal(t, 2, code, "a negative -sweep-interval: code (err %v)", err)
	require.Error(t, err, "a negative -sweep-interval: want an error")
}

// TestReuseFlagsRefused: multi-turn reuse's flags are checked before a
// rank serves: -reuse-pages off tinyllm or negative, on an instance of
// several ranks, and a decode rank's -reuse-lease not below the tombstone
// TTL (a used room's replay would then wait for a sender, not be refused)
// are each refused naming the flag; a valid decode rank starts its reuse
// path.
func TestReuseFlagsRefused(t *testing.T) {
	tiny := []string{"-compute", "tinyllm", "-engine", "loopback", "-pages", "16", "-warm=false", "-layers", "2", "-kv-heads", "2",
		"-head-dim", "8", "-q-heads", "2", "-ffn", "16", "-vocab", "300"}
	for _, tc := range []struct {
		name string
		args []string
		want string // "" : starts
	}{
		{"without tinyllm", []string{"-model", "tiny", "-engine", "loopback", "-pages", "8", "-warm=false", "-reuse-pages", "8"}, "-reuse-pages is for -compute tinyllm"},
		{"negative", append([]string{"-reuse-pages", "-1"}, tiny...), "-reuse-pages -1"},
		{"an instance of two ranks", append([]string{"-reuse-pages", "8", "-tp", "2"}, tiny...), "-reuse-pages needs an instance of one rank"},
		{"a lease not below the tombstone TTL", append([]string{"-reuse-pages", "8", "-reuse-lease", "10m"}, tiny...), "-reuse-lease 10m0s must stay below the tombstone TTL"},
		{"valid", append([]string{"-reuse-pages", "8", "-reuse-lease", "9m"}, tiny...), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, o := newFlags(kvmanager.RoleDecode)
			fs.SetOutput(io.Discard)
			require.NoError(t, fs.Parse(tc.args))
			err := frontOptions(kvmanager.RoleDecode, o, testauth.Auth())
			var r *Rank
			if err == nil {
				r, _, err = newRank(kvmanager.RoleDecode, o, testauth.Auth(), zap.NewNop(), prometheus.NewRegistry())
			}
			if tc.want == "" {
				require.NoError(t, err)
				require.NotNil(t, r.reuse, "the reuse path")
				require.NoError(t, r.closeManagers())
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestDecodeTakesPagesOnceTheRoomExists: a decode room whose prefill
// instance has no record yet (killed, or closed before its successor
// registered) waits for the instance's topology holding none of the rank's
// pages; before, it took them first and held them for that wait (up to the
// bootstrap deadline), starving the rooms after it (found by a fault hunt).
func TestDecodeTakesPagesOnceTheRoomExists(t *testing.T) {
	// The bootstrap service holds the topology lookup's answer until the
	// test has looked at the pages: the room is inside its lookup then.
	asked, answer := make(chan struct{}, 1), make(chan struct{})
	boot := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.Contains(req.URL.Path, "topology") {
			select {
			case asked <- struct{}{}:
			default:
			}
			select {
			case <-answer:
			case <-req.Context().Done():
			}
		}
		http.Error(w, "no rank of the instance is registered", http.StatusServiceUnavailable)
	}))
	defer boot.Close()
	d, dsrv := startRank(t, kvmanager.RoleDecode, "-model", "tiny", "-pages", "64", "-page-layout", "HND", "-bootstrap", boot.URL, "-instance", "d")
	free := d.pages.Free()
	done := make(chan RoomResult, 1)
	go func() {
		done <- postRoom(t, dsrv, RoomRequest{Room: 5, Tokens: 1024, TimeoutMS: 30000, PrefillInstance: "p"})
	}()
	select {
	case <-asked:
	case <-time.After(30 * time.Second):
		t.Fatal("the room never looked its prefill instance up")
	}
	assert.Equal(t, free, d.pages.Free(), "pages taken while the room's prefill instance is looked up")
	close(answer)
	require.NoError(t, d.M.Close()) // ends the lookup's retries
	res := <-done
	assert.NotEmpty(t, res.Error, "the room ended without an error: %+v", res)
	assert.Equal(t, free, d.pages.Free(), "pages not given back")
}
