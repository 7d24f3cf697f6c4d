package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
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
}

// RankInfo is where one prefill rank is (GET /v1/ranks?dp=&tp=&pp=).
type RankInfo struct {
	Endpoint  string `json:"endpoint"`
	PublicKey string `json:"curve_public_key,omitempty"`
}

func (r RankRecord) topology() Topology {
	return Topology{Instance: r.Instance, DPSize: r.DPSize, TPSize: r.TPSize, PPSize: r.PPSize,
		PageSize: r.PageSize, DType: r.DType, Compat: r.Compat}
}

// Validate checks a record on its own.
func (r RankRecord) Validate() error {
	switch {
	case r.Instance == "":
		return errors.New("instance is empty")
	case r.DPSize < 1 || r.TPSize < 1 || r.PPSize < 1:
		return fmt.Errorf("sizes dp=%d tp=%d pp=%d must be at least 1", r.DPSize, r.TPSize, r.PPSize)
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
	case r.PublicKey != "" && !validKey(r.PublicKey):
		return errors.New("curve_public_key is not a 40-character Z85 key")
	}
	u, err := url.Parse(r.Endpoint)
	if err != nil || u.Scheme != "tcp" || u.Port() == "" || u.Hostname() == "" || u.Hostname() == "*" {
		return fmt.Errorf("endpoint %q is not tcp://HOST:PORT", r.Endpoint)
	}
	return nil
}

type rankKey struct{ dp, tp, pp int }

// Server is the embedded HTTP bootstrap server: the rank table of one
// prefill deployment. Use it as an http.Handler, or Start it.
type Server struct {
	mu    sync.Mutex
	topo  *Topology
	ranks map[rankKey]RankRecord

	httpSrv *http.Server
	ln      net.Listener
	done    chan struct{}
}

// NewServer returns an empty rank table.
func NewServer() *Server { return &Server{ranks: map[rankKey]RankRecord{}} }

// maxRecordBytes bounds a PUT body.
const maxRecordBytes = 64 << 10

// ServeHTTP implements the routes of PROTOCOL.md.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/ranks":
		switch r.Method {
		case http.MethodPut:
			s.putRank(w, r)
		case http.MethodGet:
			s.getRank(w, r)
		default:
			methodNotAllowed(w, "GET, PUT")
		}
	case "/v1/topology":
		if r.Method != http.MethodGet {
			methodNotAllowed(w, "GET")
			return
		}
		s.getTopology(w)
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

func (s *Server) putRank(w http.ResponseWriter, r *http.Request) {
	var rec RankRecord
	dec := json.NewDecoder(io.LimitReader(r.Body, maxRecordBytes))
	if err := dec.Decode(&rec); err != nil {
		writeError(w, http.StatusBadRequest, "body is not a rank record: "+err.Error())
		return
	}
	if err := rec.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.topo != nil && *s.topo != rec.topology() {
		writeError(w, http.StatusConflict, fmt.Sprintf("rank dp=%d tp=%d pp=%d declares %+v but the table holds %+v",
			rec.DPRank, rec.TPRank, rec.PPRank, rec.topology(), *s.topo))
		return
	}
	t := rec.topology()
	s.topo = &t
	k := rankKey{rec.DPRank, rec.TPRank, rec.PPRank}
	_, replaced := s.ranks[k]
	s.ranks[k] = rec // a restarted rank re-registers with its new endpoint
	writeJSON(w, http.StatusOK, map[string]any{"status": "registered", "replaced": replaced})
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

func (s *Server) getRank(w http.ResponseWriter, r *http.Request) {
	var k rankKey
	q := r.URL.Query()
	for _, p := range []struct {
		name string
		dst  *int
	}{{"dp", &k.dp}, {"tp", &k.tp}, {"pp", &k.pp}} {
		v, err := strconv.Atoi(q.Get(p.name))
		if err != nil || v < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("query parameter %s=%q must be a rank (integer ≥ 0)", p.name, q.Get(p.name)))
			return
		}
		*p.dst = v
	}
	s.mu.Lock()
	rec, ok := s.ranks[k]
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no prefill rank dp=%d tp=%d pp=%d", k.dp, k.tp, k.pp))
		return
	}
	writeJSON(w, http.StatusOK, RankInfo{Endpoint: rec.Endpoint, PublicKey: rec.PublicKey})
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

// Client talks to a bootstrap server, retrying transient failures with
// jittered exponential backoff until its context ends.
type Client struct {
	Base       string // e.g. http://127.0.0.1:8998
	HTTP       *http.Client
	MinBackoff time.Duration // default 50 ms
	MaxBackoff time.Duration // default 2 s
}

// ErrRankUnknown: the server has no rank at those coordinates (404).
var ErrRankUnknown = errors.New("bootstrap: prefill rank unknown")

// HTTPError is a non-retryable answer from the server.
type HTTPError struct {
	Code   int
	Reason string
}

func (e *HTTPError) Error() string { return fmt.Sprintf("bootstrap server: %d: %s", e.Code, e.Reason) }

// NewClient returns a client for the server at base.
func NewClient(base string) *Client {
	return &Client{Base: strings.TrimRight(base, "/"), HTTP: &http.Client{Timeout: 10 * time.Second},
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 2 * time.Second}
}

// RegisterRank registers (or re-registers) a prefill rank.
func (c *Client) RegisterRank(ctx context.Context, rec RankRecord) error {
	body, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, "/v1/ranks", body, nil)
}

// Topology waits until every prefill rank has registered and returns the
// deployment's shape.
func (c *Client) Topology(ctx context.Context) (Topology, error) {
	var t Topology
	err := c.do(ctx, http.MethodGet, "/v1/topology", nil, &t)
	return t, err
}

// Rank returns the endpoint and key of one prefill rank.
func (c *Client) Rank(ctx context.Context, dp, tp, pp int) (RankInfo, error) {
	var ri RankInfo
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/ranks?dp=%d&tp=%d&pp=%d", dp, tp, pp), nil, &ri)
	var he *HTTPError
	if errors.As(err, &he) && he.Code == http.StatusNotFound {
		return ri, fmt.Errorf("%w: dp=%d tp=%d pp=%d: %s", ErrRankUnknown, dp, tp, pp, he.Reason)
	}
	return ri, err
}

// do retries network errors, 503 and other 5xx; 4xx answers are final.
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	backoff := c.MinBackoff
	if backoff <= 0 {
		backoff = 50 * time.Millisecond
	}
	maxBackoff := max(c.MaxBackoff, backoff)
	var last error
	for {
		var rd io.Reader
		if body != nil {
			rd = strings.NewReader(string(body))
		}
		req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.HTTP.Do(req)
		if err == nil {
			data, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			switch {
			case rerr != nil:
				err = rerr
			case resp.StatusCode == http.StatusOK:
				if out == nil {
					return nil
				}
				if err := json.Unmarshal(data, out); err != nil {
					return fmt.Errorf("bootstrap server: %s %s: bad JSON: %w", method, path, err)
				}
				return nil
			default:
				var e struct {
					Error string `json:"error"`
				}
				_ = json.Unmarshal(data, &e)
				he := &HTTPError{Code: resp.StatusCode, Reason: e.Error}
				if resp.StatusCode < 500 {
					return he
				}
				err = he
			}
		}
		if last == nil || ctx.Err() == nil {
			// Keep the server's last answer, not the interruption of the
			// attempt the deadline cut short.
			last = err
		}
		// Full jitter: sleep a random time up to the current backoff.
		wait := time.Duration(rand.Int64N(int64(backoff)) + 1)
		select {
		case <-ctx.Done():
			return fmt.Errorf("bootstrap server: %s %s: %w (last error: %v)", method, path, ctx.Err(), last)
		case <-time.After(wait):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}
