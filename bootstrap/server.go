package bootstrap

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/internal/records"
)

type rankKey struct{ dp, tp, pp int }

// ServerConfig configures the bootstrap server.
type ServerConfig struct {
	// Token is the bearer token every write (PUT and DELETE /v1/ranks)
	// must carry: Auth.BootstrapToken() of the deployment's secret.
	// Required unless Insecure is set.
	Token string
	// Insecure accepts writes without a token (logged by the caller).
	Insecure bool
	// LeaseTTL is how long a record stays held by its endpoint after its
	// last PUT: within it only the same endpoint may replace it (a rank
	// renews at a third of it), default 15 s.
	LeaseTTL time.Duration
	// now is the clock, default time.Now (the package's tests set it: not
	// a field a user sets, issue 50).
	now func() time.Time
}

// maxRoomDPs bounds the room → DP group table (oldest forgotten first).
const maxRoomDPs = 1 << 16

type heldRecord struct {
	records.RankRecord
	renewed time.Time
}

// Server is the embedded HTTP bootstrap server: the rank table of one
// prefill deployment. Use it as an http.Handler, or Start it.
type Server struct {
	cfg   ServerConfig
	mu    sync.Mutex
	topo  *records.Topology
	ranks map[rankKey]heldRecord
	// roomDP: which DP group took a room (PUT by the prefill rank that
	// created it, GET by decode ranks), bounded FIFO.
	roomDP    map[uint64]int
	roomOrder []uint64

	httpSrv *http.Server
	ln      net.Listener
	done    chan struct{}
}

// errNoToken: a server without a token must be explicitly insecure (its
// text names ServerConfig.Token and Insecure).
var errNoToken = errors.New("bootstrap server: no write token (set ServerConfig.Token from the shared secret, or Insecure)")

// NewServer returns an empty rank table.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Token == "" && !cfg.Insecure {
		return nil, errNoToken
	}
	if cfg.Token != "" && cfg.Insecure {
		return nil, errors.New("bootstrap server: Token and Insecure are both set; choose one")
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 15 * time.Second
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	return &Server{cfg: cfg, ranks: map[rankKey]heldRecord{}, roomDP: map[uint64]int{}}, nil
}

// ServeHTTP implements the routes of PROTOCOL.md.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/ranks":
		switch r.Method {
		case http.MethodPut:
			if s.authorized(w, r) {
				s.putRank(w, r)
			}
		case http.MethodDelete:
			if s.authorized(w, r) {
				s.deleteRank(w, r)
			}
		case http.MethodGet:
			s.getRank(w, r)
		default:
			methodNotAllowed(w, "GET, PUT, DELETE")
		}
	case "/v1/topology":
		if r.Method != http.MethodGet {
			methodNotAllowed(w, "GET")
			return
		}
		s.getTopology(w)
	case "/v1/rooms":
		switch r.Method {
		case http.MethodPut:
			if s.authorized(w, r) {
				s.putRoomDP(w, r)
			}
		case http.MethodGet:
			s.getRoomDP(w, r)
		default:
			methodNotAllowed(w, "GET, PUT")
		}
	case "/healthz":
		if r.Method != http.MethodGet {
			methodNotAllowed(w, "GET")
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	default:
		writeError(w, http.StatusNotFound, "no route "+r.URL.Path)
	}
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, "method not allowed; use "+allow)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, reason string) {
	writeJSON(w, code, map[string]string{"error": reason})
}

// authorized checks the bearer token of a write (constant time).
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.cfg.Insecure {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.Token)) == 1 {
		return true
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="kvbridge"`)
	writeError(w, http.StatusUnauthorized, "writes need the deployment's bearer token (Authorization: Bearer …)")
	return false
}

// maxBody bounds a request body (docs/PROTOCOL.md: 64 KiB); larger is
// answered 413.
const maxBody = 64 << 10

// decodeOne reads exactly one JSON value of at most maxBody bytes.
func (s *Server) decodeOne(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON value")
			var mbe *http.MaxBytesError
			if errors.As(terr, &mbe) {
				err = terr
			}
		}
	}
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return true
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body exceeds %d bytes", maxBody))
	default:
		writeError(w, http.StatusBadRequest, "body is not one rank record: "+err.Error())
	}
	return false
}

func (s *Server) putRank(w http.ResponseWriter, r *http.Request) {
	var rec records.RankRecord
	if !s.decodeOne(w, r, &rec) {
		return
	}
	if err := rec.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.now()
	k := rankKey{rec.DPRank, rec.TPRank, rec.PPRank}
	old, held := s.ranks[k]
	if held && old.Endpoint != rec.Endpoint {
		if left := s.cfg.LeaseTTL - now.Sub(old.renewed); left > 0 {
			// A live rank's record is replaced only by itself: a restarted
			// rank on another endpoint waits for the lease (or the old
			// process's DELETE at shutdown).
			w.Header().Set("Retry-After", strconv.Itoa(int(left/time.Second)+1))
			writeError(w, http.StatusConflict, fmt.Sprintf("rank dp=%d tp=%d pp=%d is held by %s for %v more (lease %v)",
				k.dp, k.tp, k.pp, old.Endpoint, left.Round(time.Millisecond), s.cfg.LeaseTTL))
			return
		}
	}
	if s.topo != nil && *s.topo != rec.Topology() {
		writeError(w, http.StatusConflict, fmt.Sprintf("rank dp=%d tp=%d pp=%d declares %+v but the table holds %+v",
			rec.DPRank, rec.TPRank, rec.PPRank, rec.Topology(), *s.topo))
		return
	}
	t := rec.Topology()
	s.topo = &t
	s.ranks[k] = heldRecord{rec, now}
	writeJSON(w, http.StatusOK, map[string]any{"status": "registered", "replaced": held && old.Endpoint != rec.Endpoint,
		"lease_ttl_ms": s.cfg.LeaseTTL.Milliseconds()})
}

// deleteRank removes a record at its rank's shutdown; the query names the
// rank and its endpoint, which must be the record's.
func (s *Server) deleteRank(w http.ResponseWriter, r *http.Request) {
	k, ok := rankQuery(w, r)
	if !ok {
		return
	}
	ep := r.URL.Query().Get("endpoint")
	s.mu.Lock()
	defer s.mu.Unlock()
	old, held := s.ranks[k]
	switch {
	case !held:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no prefill rank dp=%d tp=%d pp=%d", k.dp, k.tp, k.pp))
	case old.Endpoint != ep:
		writeError(w, http.StatusConflict, fmt.Sprintf("rank dp=%d tp=%d pp=%d is held by %s, not %q", k.dp, k.tp, k.pp, old.Endpoint, ep))
	default:
		delete(s.ranks, k)
		if len(s.ranks) == 0 {
			s.topo = nil
		}
		writeJSON(w, http.StatusOK, map[string]any{"status": "deleted"})
	}
}

// roomDP is a room's prefill DP group (PUT and GET /v1/rooms?room=).
type roomDP struct {
	Room   uint64 `json:"room"`
	DPRank int    `json:"dp_rank"`
}

func (s *Server) putRoomDP(w http.ResponseWriter, r *http.Request) {
	var rd roomDP
	if !s.decodeOne(w, r, &rd) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.topo == nil || rd.DPRank < 0 || rd.DPRank >= s.topo.DPSize {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("dp_rank %d outside the instance's DP groups", rd.DPRank))
		return
	}
	if _, ok := s.roomDP[rd.Room]; !ok {
		s.roomOrder = append(s.roomOrder, rd.Room)
		if len(s.roomOrder) > maxRoomDPs {
			delete(s.roomDP, s.roomOrder[0])
			s.roomOrder = s.roomOrder[1:]
		}
	}
	s.roomDP[rd.Room] = rd.DPRank
	writeJSON(w, http.StatusOK, rd)
}

func (s *Server) getRoomDP(w http.ResponseWriter, r *http.Request) {
	room, err := strconv.ParseUint(r.URL.Query().Get("room"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter room=%.32q must be a room id", r.URL.Query().Get("room")))
		return
	}
	s.mu.Lock()
	dp, ok := s.roomDP[room]
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("room %d has no DP group yet", room))
		return
	}
	writeJSON(w, http.StatusOK, roomDP{Room: room, DPRank: dp})
}

func (s *Server) getTopology(w http.ResponseWriter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.topo == nil {
		writeError(w, http.StatusServiceUnavailable, "no prefill rank has registered yet")
		return
	}
	if want := s.topo.DPSize * s.topo.TPSize * s.topo.PPSize; len(s.ranks) < want {
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%d of %d prefill ranks registered", len(s.ranks), want))
		return
	}
	writeJSON(w, http.StatusOK, s.topo)
}

func rankQuery(w http.ResponseWriter, r *http.Request) (k rankKey, ok bool) {
	q := r.URL.Query()
	for _, p := range []struct {
		name string
		dst  *int
	}{{"dp", &k.dp}, {"tp", &k.tp}, {"pp", &k.pp}} {
		v, err := strconv.Atoi(q.Get(p.name))
		if err != nil || v < 0 || v > records.MaxRankIndex {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter %s=%.32q must be a rank (integer in [0, %d])", p.name, q.Get(p.name), records.MaxRankIndex))
			return k, false
		}
		*p.dst = v
	}
	return k, true
}

func (s *Server) getRank(w http.ResponseWriter, r *http.Request) {
	k, ok := rankQuery(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	rec, ok := s.ranks[k]
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no prefill rank dp=%d tp=%d pp=%d", k.dp, k.tp, k.pp))
		return
	}
	writeJSON(w, http.StatusOK, records.RankInfo{Endpoint: rec.Endpoint, PublicKey: rec.PublicKey, Cert: rec.Cert, Epoch: rec.Epoch})
}

// Start serves on addr ("127.0.0.1:0" picks a port) until Close.
func (s *Server) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("bootstrap: http server: %w", err)
	}
	s.ln = ln
	s.httpSrv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.httpSrv.Serve(ln)
	}()
	return nil
}

// URL is the base URL of a started server.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops a started server, waiting for requests in progress up to ctx.
func (s *Server) Close(ctx context.Context) error {
	if s.httpSrv == nil {
		return nil
	}
	err := s.httpSrv.Shutdown(ctx)
	<-s.done
	return err
}
