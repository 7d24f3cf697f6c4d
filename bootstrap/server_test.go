package bootstrap

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func record(dp, tp int) records.RankRecord {
	return records.RankRecord{Instance: "prefill-a", DPRank: dp, DPSize: 1, TPRank: tp, TPSize: 2, PPRank: 0, PPSize: 1,
		Endpoint: fmt.Sprintf("tcp://10.0.0.%d:17000", tp+1), PageSize: 16, DType: "bf16", Compat: "v1:abc"}
}

// testToken is the bearer token of the test servers.
var testToken = testAuth().BootstrapToken()

// fakeClock is a settable clock for the server's leases.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTestServer(t *testing.T) (*Server, *fakeClock) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s, err := NewServer(ServerConfig{Token: testToken, LeaseTTL: 15 * time.Second, now: clk.now})
	require.NoError(t, err)
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
	require.NoError(t, err)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	require.NoError(t, json.Unmarshal(data, &out), "%s %s: body %q is not JSON", method, path, data)
	return resp.StatusCode, out
}

func jsonOf(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestServerRoutes(t *testing.T) {
	s, clk := newTestServer(t)
	srv := httptest.NewServer(s)
	defer srv.Close()

	code, _ := call(t, srv, "GET", "/healthz", "")
	require.Equal(t, 200, code, "healthz")
	code, body := call(t, srv, "GET", "/v1/topology", "")
	require.Equal(t, 503, code, "empty table: %v", body)
	require.NotEqual(t, "", body["error"], "empty table: %d %v", code, body)
	code, _ = call(t, srv, "PUT", "/v1/ranks", jsonOf(t, record(0, 0)))
	require.Equal(t, 200, code, "register")
	code, body = call(t, srv, "GET", "/v1/topology", "")
	require.Equal(t, 503, code, "half the ranks: %v", body)
	require.Contains(t, body["error"].(string), "1 of 2", "half the ranks: %d %v", code, body)
	code, _ = call(t, srv, "PUT", "/v1/ranks", jsonOf(t, record(0, 1)))
	require.Equal(t, 200, code)
	code, body = call(t, srv, "GET", "/v1/topology", "")
	require.Equal(t, 200, code, "topology: %v", body)
	require.Equal(t, float64(2), body["tp_size"].(float64), "topology: %d %v", code, body)
	require.Equal(t, "v1:abc", body["compat"], "topology: %d %v", code, body)
	require.Equal(t, float64(16), body["page_size"].(float64), "topology: %d %v", code, body)
	code, body = call(t, srv, "GET", "/v1/ranks?dp=0&tp=1&pp=0", "")
	require.Equal(t, 200, code, "rank: %v", body)
	require.Equal(t, "tcp://10.0.0.2:17000", body["endpoint"], "rank: %d %v", code, body)
	code, _ = call(t, srv, "GET", "/v1/ranks?dp=0&tp=5&pp=0", "")
	require.Equal(t, 404, code, "unknown rank")
	// A live rank's record is held: another endpoint is refused (409 with
	// Retry-After) until the lease lapses; the same endpoint renews it.
	moved := record(0, 1)
	moved.Endpoint = "tcp://10.0.0.9:17001"
	code, body = call(t, srv, "PUT", "/v1/ranks", jsonOf(t, moved))
	require.Equal(t, 409, code, "replacing a live rank: %v", body)
	require.Contains(t, body["error"].(string), "held by tcp://10.0.0.2:17000", "replacing a live rank: %d %v", code, body)
	clk.t = clk.t.Add(10 * time.Second)
	code, body = call(t, srv, "PUT", "/v1/ranks", jsonOf(t, record(0, 1)))
	require.Equal(t, 200, code, "renewal: %v", body)
	require.Equal(t, false, body["replaced"], "renewal: %d %v", code, body)
	clk.t = clk.t.Add(10 * time.Second)
	code, _ = call(t, srv, "PUT", "/v1/ranks", jsonOf(t, moved))
	require.Equal(t, 409, code, "replaced within the renewed lease")
	// A restarted rank re-registers with a new endpoint once the lease lapsed.
	clk.t = clk.t.Add(6 * time.Second)
	code, body = call(t, srv, "PUT", "/v1/ranks", jsonOf(t, moved))
	require.Equal(t, 200, code, "re-register: %v", body)
	require.Equal(t, true, body["replaced"], "re-register: %d %v", code, body)
	_, body = call(t, srv, "GET", "/v1/ranks?dp=0&tp=1&pp=0", "")
	require.Equal(t, moved.Endpoint, body["endpoint"], "after re-register: %v", body)

	bad := func(mut func(*records.RankRecord)) string {
		r := record(0, 0)
		mut(&r)
		return jsonOf(t, r)
	}
	for _, tc := range []struct {
		name, method, path, body string
		code                     int
	}{
		{"not json", "PUT", "/v1/ranks", "{nope", 400},
		{"no instance", "PUT", "/v1/ranks", bad(func(r *records.RankRecord) { r.Instance = "" }), 400},
		{"tp_rank out of range", "PUT", "/v1/ranks", bad(func(r *records.RankRecord) { r.TPRank = 2 }), 400},
		{"zero size", "PUT", "/v1/ranks", bad(func(r *records.RankRecord) { r.DPSize = 0 }), 400},
		{"bad endpoint", "PUT", "/v1/ranks", bad(func(r *records.RankRecord) { r.Endpoint = "10.0.0.1:80" }), 400},
		{"wildcard endpoint", "PUT", "/v1/ranks", bad(func(r *records.RankRecord) { r.Endpoint = "tcp://*:80" }), 400},
		{"no page size", "PUT", "/v1/ranks", bad(func(r *records.RankRecord) { r.PageSize = 0 }), 400},
		{"bad key", "PUT", "/v1/ranks", bad(func(r *records.RankRecord) { r.PublicKey = "xyz" }), 400},
		{"other topology", "PUT", "/v1/ranks", bad(func(r *records.RankRecord) { r.DType = "fp8" }), 409},
		{"rank missing tp", "GET", "/v1/ranks?dp=0&pp=0", "", 400},
		{"rank negative", "GET", "/v1/ranks?dp=-1&tp=0&pp=0", "", 400},
		{"rank not a number", "GET", "/v1/ranks?dp=a&tp=0&pp=0", "", 400},
		{"delete without rank", "DELETE", "/v1/ranks", "", 400},
		{"patch", "PATCH", "/v1/ranks", "", 405},
		{"post topology", "POST", "/v1/topology", "", 405},
		{"unknown route", "GET", "/v2/x", "", 404},
	} {
		code, body := call(t, srv, tc.method, tc.path, tc.body)
		assert.Equal(t, tc.code, code, "%s: %v, want a reason", tc.name, body)
		assert.NotEmpty(t, body["error"], "%s: %d %v, want %d with a reason", tc.name, code, body, tc.code)
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
		{"long instance", testToken, "PUT", "/v1/ranks", jsonOf(t, func() records.RankRecord {
			r := record(0, 0)
			r.Instance = strings.Repeat("i", 1000)
			return r
		}()), 400},
		{"huge size", testToken, "PUT", "/v1/ranks", jsonOf(t, func() records.RankRecord { r := record(0, 0); r.TPSize = 1 << 30; return r }()), 400},
	} {
		code, body := callWith(t, srv, tc.token, tc.method, tc.path, tc.body)
		assert.Equal(t, tc.code, code, "%s: %v, want a reason", tc.name, body)
		assert.NotEqual(t, "", body["error"], "%s: %d %v, want %d with a reason", tc.name, code, body, tc.code)
	}
	code, body := call(t, srv, "GET", "/v1/ranks?dp=0&tp=0&pp=0", "")
	require.Equal(t, 404, code, "a refused write registered a rank: %v", body)
	// 10 MB: answered 413, not reset.
	req, _ := http.NewRequest("PUT", srv.URL+"/v1/ranks", strings.NewReader(`{"instance":"`+strings.Repeat("x", 10<<20)+`"}`))
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err, "10 MB body (want a 413 answer)")
	resp.Body.Close()
	require.Equal(t, 413, resp.StatusCode, "10 MB body")
	// DELETE: only the record's own endpoint.
	code, _ = call(t, srv, "PUT", "/v1/ranks", rec)
	require.Equal(t, 200, code)
	code, _ = call(t, srv, "DELETE", "/v1/ranks?dp=0&tp=0&pp=0&endpoint=tcp://10.6.6.6:1", "")
	require.Equal(t, 409, code, "delete by another endpoint")
	code, _ = call(t, srv, "DELETE", "/v1/ranks?dp=0&tp=0&pp=0&endpoint=tcp://10.0.0.1:17000", "")
	require.Equal(t, 200, code, "delete by the owner")
	// Once deleted, the rank's next process registers at once.
	moved := record(0, 0)
	moved.Endpoint = "tcp://10.0.0.1:17999"
	code, _ = call(t, srv, "PUT", "/v1/ranks", jsonOf(t, moved))
	require.Equal(t, 200, code, "after delete")
	_, err = NewServer(ServerConfig{})
	require.ErrorIs(t, err, errNoToken, "a server without token or Insecure")
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
	code, body := call(t, srv, "PUT", "/v1/ranks", jsonOf(t, rec))
	require.Equal(t, 200, code, "register: %v", body)
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
		code, body := callWith(t, srv, tc.token, tc.method, tc.path, tc.body)
		assert.Equal(t, tc.code, code, "%s: %v", tc.name, body)
	}
	code, body = call(t, srv, "GET", "/v1/rooms?room=7", "")
	require.Equal(t, 200, code, "the published room: %v", body)
	require.EqualValues(t, 1, body["dp_rank"], "the published room: %v", body)
}
