package rankcmd

// The instance's front. A router sends one request to one server per
// instance (the llm-d sidecar and SGLang's router name one prefill server
// and one decode server), so with -compute tinyllm an instance's first rank
// (TP 0, PP 0, DP 0) serves the OpenAI routes for the whole instance and
// fans each request out to its other ranks over their per-rank routes
// (/v1/prefill, /v1/generate, /v1/abort), as SGLang's HTTP server hands a
// request to its TP workers. The other ranks learn where the front is from
// -front (as SGLang's --dist-init-addr) and join it: POST
// /v1/instance/join every second with their place and HTTP port, so a
// front that restarts, or a rank that restarts on a new port, is whole
// again within a second. A request that needs a rank that has not joined
// (or has not re-joined for 15 s) is answered 503 naming it.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"go.uber.org/zap"
)

// joinInterval is how often a rank re-joins its front; a member not heard
// for memberStale is taken as gone.
const (
	joinInterval = time.Second
	memberStale  = 15 * time.Second
)

// JoinRequest is POST /v1/instance/join: a rank of the instance says where
// it serves (its HTTP port; the host is its own when it bound one, else
// the address the join came from).
type JoinRequest struct {
	Info Info   `json:"info"`
	HTTP string `json:"http"` // host:port the rank listens on
}

// JoinAnswer is the front's answer.
type JoinAnswer struct {
	Instance  string `json:"instance"`
	Bootstrap string `json:"bootstrap"`
}

type member struct {
	url  string
	info Info
	seen time.Time
}

// instanceView is the front's view of its instance's other ranks.
type instanceView struct {
	mu      sync.Mutex
	members map[int]member // by global rank
}

func (r *Rank) instanceSize() int {
	p := r.Par.Norm()
	return p.TPSize * p.PPSize * p.DPSize
}

func (r *Rank) isFront() bool { return r.Par.Global() == 0 }

// serveJoin is the front's side of /v1/instance/join.
func (t *tinyRank) serveJoin(w http.ResponseWriter, req *http.Request) {
	if !t.r.authorized(w, req) {
		return
	}
	var jr JoinRequest
	if !decodeBody(w, req, &jr) {
		return
	}
	r, in := t.r, jr.Info
	g := in.Parallel.Global()
	var why string
	switch {
	case !r.isFront():
		why = fmt.Sprintf("this rank (%v) is not its instance's front; join the rank at TP 0, PP 0, DP 0", r.Par)
	case in.Role != roleName(r.Role) || in.Instance != r.Instance:
		why = fmt.Sprintf("a %s rank of instance %q cannot join %s instance %q", in.Role, in.Instance, roleName(r.Role), r.Instance)
	case in.Fingerprint != r.fingerprint() || in.Layout != r.Mapping.Layout:
		why = fmt.Sprintf("the rank serves %s (%v pages), this instance %s (%v)", in.Fingerprint, in.Layout, r.fingerprint(), r.Mapping.Layout)
	case in.Parallel.Norm().TPSize != r.Par.TPSize || in.Parallel.Norm().PPSize != r.Par.PPSize || in.Parallel.Norm().DPSize != r.Par.DPSize:
		why = fmt.Sprintf("the rank's instance shape (%v) is not this one's (%v)", in.Parallel, r.Par)
	case in.Parallel.Validate() != nil || g <= 0 || g >= r.instanceSize():
		why = fmt.Sprintf("rank %v cannot join as a member other than the front", in.Parallel)
	}
	host, port, err := net.SplitHostPort(jr.HTTP)
	if why == "" && (err != nil || port == "" || port == "0") {
		why = fmt.Sprintf("http %.64q is not the host:port the rank listens on", jr.HTTP)
	}
	if why != "" {
		http.Error(w, "join refused: "+why, http.StatusConflict)
		return
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host, _, _ = net.SplitHostPort(req.RemoteAddr)
	}
	url := "http://" + net.JoinHostPort(host, port)
	t.view.mu.Lock()
	old, had := t.view.members[g]
	t.view.members[g] = member{url: url, info: in, seen: time.Now()}
	t.view.mu.Unlock()
	if !had || old.url != url {
		r.log.Info("instance member joined", zap.Stringer("rank", in.Parallel), zap.String("http", url))
	}
	writeJSON(w, JoinAnswer{Instance: r.Instance, Bootstrap: r.bootURL})
}

// members lists the ranks a request needs, this rank's url "": a prefill
// instance's ranks in DP group dp (dp < 0: every rank), a decode
// instance's every rank; an error names the ranks that have not joined.
func (t *tinyRank) members(dp int) ([]member, error) {
	r := t.r
	p := r.Par.Norm()
	now := time.Now()
	t.view.mu.Lock()
	defer t.view.mu.Unlock()
	var out []member
	var missing []string
	for g := range r.instanceSize() {
		par := p
		par.TPRank, par.PPRank, par.DPRank = g%p.TPSize, (g/p.TPSize)%p.PPSize, g/(p.TPSize*p.PPSize)
		if dp >= 0 && par.DPRank != dp {
			continue
		}
		if g == 0 {
			out = append(out, member{info: Info{Parallel: r.Par}})
			continue
		}
		m, ok := t.view.members[g]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprintf("%v (never joined)", par))
		case now.Sub(m.seen) > memberStale:
			missing = append(missing, fmt.Sprintf("%v (last joined %s ago from %s)", par, now.Sub(m.seen).Round(time.Millisecond), m.url))
		default:
			out = append(out, m)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s instance %q is not whole: rank %s (each rank but the front runs with -front pointing at this one)",
			roleName(r.Role), r.Instance, strings.Join(missing, ", rank "))
	}
	return out, nil
}

// join joins the front once, retrying for up to d while it starts.
func (r *Rank) join(front string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		jr := JoinRequest{Info: r.info(), HTTP: r.ln.Addr().String()}
		err := r.client().postJSON(ctx, front+"/v1/instance/join", jr, nil)
		var se *StatusError
		if err == nil || errors.As(err, &se) && se.Code == http.StatusConflict {
			return err // joined, or refused for good
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond): // retrying a server that is starting, not synchronisation
		}
	}
}

// joinLoop keeps this rank joined to its front until ctx ends.
func (r *Rank) joinLoop(ctx context.Context, front string) {
	cl := r.client()
	tick := time.NewTicker(joinInterval)
	defer tick.Stop()
	failing := false
	for {
		jr := JoinRequest{Info: r.info(), HTTP: r.ln.Addr().String()}
		var ans JoinAnswer
		err := cl.postJSON(ctx, front+"/v1/instance/join", jr, &ans)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			r.log.Warn("joining the instance's front (retrying every second)", zap.String("front", front), zap.Error(err))
			failing = true
		case err == nil && failing:
			r.log.Info("joined the instance's front", zap.String("front", front))
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// frontInfo reads the front's /v1/info (retrying while it starts, up to
// a minute): a rank started with -front and no -bootstrap takes the
// front's bootstrap server.
func frontInfo(front, token string) (Info, error) {
	cl := &Client{HTTP: &http.Client{Timeout: 5 * time.Second}, Token: token}
	deadline := time.Now().Add(time.Minute)
	for {
		var in Info
		err := cl.getJSON(context.Background(), front+"/v1/info", &in)
		if err == nil {
			return in, nil
		}
		if time.Now().After(deadline) {
			return in, fmt.Errorf("-front %s: %w", front, err)
		}
		time.Sleep(200 * time.Millisecond) // retrying a server that is starting, not synchronisation
	}
}

// Client calls ranks' per-rank routes (the kvbridge wire): the example
// router's and the fronts'.
type Client struct {
	HTTP  *http.Client
	Token string
}

func (c *Client) do(ctx context.Context, method, url string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, &StatusError{URL: url, Code: resp.StatusCode, Msg: strings.TrimSpace(string(msg))}
	}
	return resp, nil
}

// StatusError is a rank's non-200 answer.
type StatusError struct {
	URL  string
	Code int
	Msg  string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: %d %s: %s", e.URL, e.Code, http.StatusText(e.Code), e.Msg)
}

func (c *Client) postJSON(ctx context.Context, url string, body, out any) error {
	resp, err := c.do(ctx, http.MethodPost, url, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out)
}

func (c *Client) getJSON(ctx context.Context, url string, out any) error {
	resp, err := c.do(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out)
}

// Prefill runs POST /v1/prefill on a rank.
func (c *Client) Prefill(ctx context.Context, url string, p PrefillRequest) (PrefillResult, error) {
	var res PrefillResult
	err := c.postJSON(ctx, url+"/v1/prefill", p, &res)
	return res, err
}

// Abort runs POST /v1/abort on a rank.
func (c *Client) Abort(ctx context.Context, url string, a AbortRequest) error {
	return c.postJSON(ctx, url+"/v1/abort", a, nil)
}

// Generate runs POST /v1/generate on a rank and reads its NDJSON events;
// emit gets each token (nil: none expected), and the final event is
// returned.
func (c *Client) Generate(ctx context.Context, url string, g GenerateRequest, emit func(int) error) (GenerateEvent, error) {
	var last GenerateEvent
	resp, err := c.do(ctx, http.MethodPost, url+"/v1/generate", g)
	if err != nil {
		return last, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev GenerateEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return last, fmt.Errorf("event %.64q: %w", sc.Text(), err)
		}
		if ev.Done {
			return ev, nil
		}
		if ev.Token != nil && emit != nil {
			if err := emit(*ev.Token); err != nil {
				return last, fmt.Errorf("client: %w", err)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return last, err
	}
	return last, errors.New("the stream ended without its final event")
}

func (r *Rank) client() *Client {
	return &Client{HTTP: r.httpClient, Token: r.token}
}

// AbortRequest is POST /v1/abort: end a room on this rank. A room this
// rank runs is aborted; one it does not know yet is created and aborted at
// once, so its peers hear of it (a prefill rank answers the decode ranks'
// REQUESTs for it with STATUS failed; a decode rank's ABORT reaches the
// prefill ranks named by Prefill and PrefillDP).
type AbortRequest struct {
	Room      uint64 `json:"room"`
	Reason    string `json:"reason"`
	Prefill   string `json:"prefill,omitempty"`
	PrefillDP *int   `json:"prefill_dp,omitempty"`
	// PrefillAll: every rank of the prefill instance at Prefill is told
	// (a decode leg that named no DP group the instance has).
	PrefillAll bool `json:"prefill_all,omitempty"`
}

func (t *tinyRank) serveAbort(w http.ResponseWriter, req *http.Request) {
	if !t.r.authorized(w, req) {
		return
	}
	var a AbortRequest
	if !decodeBody(w, req, &a) {
		return
	}
	if len(a.Reason) > 512 {
		a.Reason = a.Reason[:512]
	}
	t.abortRoom(a)
	writeJSON(w, struct{}{})
}

// abortRoom ends a room on this rank (AbortRequest).
func (t *tinyRank) abortRoom(a AbortRequest) {
	reason := "example: " + a.Reason
	t.mu.Lock()
	abort := t.live[a.Room]
	t.mu.Unlock()
	if abort != nil {
		abort(reason)
		return
	}
	if a.PrefillAll && a.Prefill != "" && t.r.D != nil {
		t.refuseAll(a.Room, reason, a.Prefill)
		return
	}
	t.refuse(a.Room, reason, a.Prefill, a.PrefillDP)
}

// refuseAll tells every rank of the prefill instance at prefill (each DP
// group, TP rank and PP stage its bootstrap server's topology lists) that
// this decode instance will not serve room: one room of this rank with
// each of them as a source, created and aborted.
func (t *tinyRank) refuseAll(room uint64, reason, prefill string) {
	topo, ok := t.prefillTopology(prefill)
	if !ok {
		t.refuse(room, reason, prefill, nil)
		return
	}
	var targets []kvmanager.Target
	for dp := range max(topo.DPSize, 1) {
		for pp := range max(topo.PPSize, 1) {
			for tp := range max(topo.TPSize, 1) {
				targets = append(targets, kvmanager.Target{Bootstrap: prefill, DP: dp, Rank: tp, PP: pp})
			}
		}
	}
	rc, err := receiver.NewFrom(t.r.D, room, targets...)
	if err != nil {
		return
	}
	rc.Abort(reason)
	rc.Clear()
}

// refuse tells a room's peers that this rank will not serve it: the room
// is created, aborted and cleared (a room id already in use here is left
// alone: it is another request's).
func (t *tinyRank) refuse(room uint64, reason, prefill string, dp *int) {
	r := t.r
	if r.P != nil {
		s, err := sender.New(r.P, room)
		if err != nil {
			return
		}
		s.Abort(reason)
		s.Clear()
		return
	}
	if prefill == "" && r.bootURL == "" {
		return
	}
	rc, err := r.newReceiver(room, prefill, dp)
	if err != nil {
		return
	}
	rc.Abort(reason)
	rc.Clear()
}

// setLive records how to abort a room this rank runs; the returned func
// forgets it.
func (t *tinyRank) setLive(room uint64, abort func(string)) func() {
	t.mu.Lock()
	t.live[room] = abort
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		delete(t.live, room)
		t.mu.Unlock()
	}
}

// fanOut runs f for every member at once and waits; the errors, joined
// with each member's place.
func fanOut(ms []member, f func(i int, m member) error) error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i, m); err != nil {
				errs[i] = fmt.Errorf("rank %v: %w", m.info.Parallel, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
