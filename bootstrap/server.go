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
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/internal/curve"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// RankRecord is what a prefill rank registers with PUT /v1/ranks.
type RankRecord struct {
	Instance  string `json:"instance"`
	DPRank    int    `json:"dp_rank"`
	DPSize    int    `json:"dp_size"`
	TPRank    int    `json:"tp_rank"`
	TPSize    int    `json:"tp_size"`
	PPRank    int    `json:"pp_rank"`
	PPSize    int    `json:"pp_size"`
	Endpoint  string `json:"endpoint"`
	PageSize  int    `json:"page_size"`
	DType     string `json:"dtype"`
	Compat    string `json:"compat"`
	PublicKey string `json:"curve_public_key,omitempty"`
	// Cert is the rank's identity certificate (standard base64), under
	// per-rank identity: decode ranks address their first messages to it.
	Cert string `json:"identity_cert,omitempty"`
	// Epoch is the rank process's control-plane epoch (optional): a record
	// re-published with the same endpoint but a new epoch is a restart.
	Epoch uint64 `json:"epoch,omitempty"`
	ModelFacts
}

// ModelFacts are what the rank mapping needs of the model (absent from a
// rank without a model: then one prefill rank feeds one decode rank with
// identical layouts).
type ModelFacts struct {
	Layers     int    `json:"layers,omitempty"`
	KVHeads    int    `json:"kv_heads,omitempty"`
	HeadBytes  int    `json:"head_bytes,omitempty"` // one head of one token in one region
	MLA        bool   `json:"mla,omitempty"`
	PageLayout string `json:"page_layout,omitempty"` // "NHD" or "HND"
}

// Topology is the prefill deployment's shape (GET /v1/topology).
type Topology struct {
	Instance string `json:"instance"`
	DPSize   int    `json:"dp_size"`
	TPSize   int    `json:"tp_size"`
	PPSize   int    `json:"pp_size"`
	PageSize int    `json:"page_size"`
	DType    string `json:"dtype"`
	Compat   string `json:"compat"`
	ModelFacts
}

// RankInfo is where one prefill rank is (GET /v1/ranks?dp=&tp=&pp=).
type RankInfo struct {
	Endpoint  string `json:"endpoint"`
	PublicKey string `json:"curve_public_key,omitempty"`
	Cert      string `json:"identity_cert,omitempty"` // base64, as in the record
	Epoch     uint64 `json:"epoch,omitempty"`         // the record's process, when it says
}

// CertBytes decodes Cert ("" when absent or not base64: a decode rank then
// cannot address the rank under per-rank identity, and says so).
func (r RankInfo) CertBytes() string { return certBytes(r.Cert) }

func certBytes(b64cert string) string {
	b, err := b64.DecodeString(b64cert)
	if err != nil {
		return ""
	}
	return string(b)
}

// Topology is the instance facts the record carries (what GET
// /v1/topology answers once every rank has registered).
func (r RankRecord) Topology() Topology {
	return Topology{Instance: r.Instance, DPSize: r.DPSize, TPSize: r.TPSize, PPSize: r.PPSize,
		PageSize: r.PageSize, DType: r.DType, Compat: r.Compat, ModelFacts: r.ModelFacts}
}

// Validate checks a record on its own.
func (r RankRecord) Validate() error {
	switch {
	case r.Instance == "":
		return errors.New("instance is empty")
	case len(r.Instance) > wire.MaxNameBytes || len(r.Endpoint) > wire.MaxNameBytes || len(r.DType) > wire.MaxNameBytes || len(r.Compat) > wire.MaxNameBytes:
		return fmt.Errorf("instance, endpoint, dtype and compat are limited to %d bytes", wire.MaxNameBytes)
	case r.DPSize < 1 || r.TPSize < 1 || r.PPSize < 1 || r.DPSize > maxRankIndex || r.TPSize > maxRankIndex || r.PPSize > maxRankIndex:
		return fmt.Errorf("sizes dp=%d tp=%d pp=%d must be in [1, %d]", r.DPSize, r.TPSize, r.PPSize, maxRankIndex)
	case r.DPRank < 0 || r.DPRank >= r.DPSize:
		return fmt.Errorf("dp_rank %d outside [0, %d)", r.DPRank, r.DPSize)
	case r.TPRank < 0 || r.TPRank >= r.TPSize:
		return fmt.Errorf("tp_rank %d outside [0, %d)", r.TPRank, r.TPSize)
	case r.PPRank < 0 || r.PPRank >= r.PPSize:
		return fmt.Errorf("pp_rank %d outside [0, %d)", r.PPRank, r.PPSize)
	case r.PageSize < 1:
		return fmt.Errorf("page_size %d must be at least 1", r.PageSize)
	case r.DType == "":
		return errors.New("dtype is empty")
	case r.Compat == "":
		return errors.New("compat is empty")
	case r.PublicKey != "" && !curve.ValidKey(r.PublicKey):
		return errors.New("curve_public_key is not a 40-character Z85 key")
	case len(r.Cert) > 2*wire.MaxCertBytes || (r.Cert != "" && certBytes(r.Cert) == ""):
		return fmt.Errorf("identity_cert is not a base64 certificate of at most %d bytes", wire.MaxCertBytes)
	case r.Layers < 0 || r.KVHeads < 0 || r.HeadBytes < 0 || r.Layers > maxRankIndex || r.KVHeads > maxRankIndex || r.HeadBytes > 1<<20:
		return fmt.Errorf("layers %d, kv_heads %d, head_bytes %d out of range", r.Layers, r.KVHeads, r.HeadBytes)
	case r.PageLayout != "" && r.PageLayout != "NHD" && r.PageLayout != "HND":
		return fmt.Errorf("page_layout %.16q is not NHD or HND", r.PageLayout)
	case (r.Layers == 0) != (r.KVHeads == 0) || (r.Layers == 0) != (r.HeadBytes == 0):
		return errors.New("layers, kv_heads and head_bytes come together (or none)")
	}
	u, err := url.Parse(r.Endpoint)
	if err != nil || u.Scheme != "tcp" || u.Port() == "" || u.Hostname() == "" || u.Hostname() == "*" {
		return fmt.Errorf("endpoint %q is not tcp://HOST:PORT", r.Endpoint)
	}
	return nil
}

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
	// MaxBody bounds a request body, default 64 KiB; larger is answered
	// 413.
	MaxBody int64
	// now is the clock, default time.Now (the package's tests set it: not
	// a field a user sets, issue 50).
	now func() time.Time
}

// maxRoomDPs bounds the room → DP group table (oldest forgotten first).
const maxRoomDPs = 1 << 16

type heldRecord struct {
	RankRecord
	renewed time.Time
}

// Server is the embedded HTTP bootstrap server: the rank table of one
// prefill deployment. Use it as an http.Handler, or Start it.
type Server struct {
	cfg   ServerConfig
	mu    sync.Mutex
	topo  *Topology
	ranks map[rankKey]heldRecord
	// roomDP: which DP group took a room (PUT by the prefill rank that
	// created it, GET by decode ranks), bounded FIFO.
	roomDP    map[uint64]int
	roomOrder []uint64

	httpSrv *http.Server
	ln      net.Listener
	done    chan struct{}
}

// ErrNoToken: a server without a token must be explicitly insecure.
var ErrNoToken = errors.New("bootstrap server: no write token (set ServerConfig.Token from the shared secret, or Insecure)")

// NewServer returns an empty rank table.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Token == "" && !cfg.Insecure {
		return nil, ErrNoToken
	}
	if cfg.Token != "" && cfg.Insecure {
		return nil, errors.New("bootstrap server: Token and Insecure are both set; choose one")
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 15 * time.Second
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 64 << 10
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	return &Server{cfg: cfg, ranks: map[rankKey]heldRecord{}, roomDP: map[uint64]int{}}, nil
}

// LeaseTTL is how long a record is held after its last renewal.
func (s *Server) LeaseTTL() time.Duration { return s.cfg.LeaseTTL }

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

// decodeOne reads exactly one JSON value of at most MaxBody bytes.
func (s *Server) decodeOne(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.MaxBody))
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
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body exceeds %d bytes", s.cfg.MaxBody))
	default:
		writeError(w, http.StatusBadRequest, "body is not one rank record: "+err.Error())
	}
	return false
}

func (s *Server) putRank(w http.ResponseWriter, r *http.Request) {
	var rec RankRecord
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
		if err != nil || v < 0 || v > maxRankIndex {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter %s=%.32q must be a rank (integer in [0, %d])", p.name, q.Get(p.name), maxRankIndex))
			return k, false
		}
		*p.dst = v
	}
	return k, true
}

// maxRankIndex bounds dp, tp and pp ranks and sizes.
const maxRankIndex = 1 << 16

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
	writeJSON(w, http.StatusOK, RankInfo{Endpoint: rec.Endpoint, PublicKey: rec.PublicKey, Cert: rec.Cert, Epoch: rec.Epoch})
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
