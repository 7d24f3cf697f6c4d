package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/kvbridge/kvbridge/internal/wire"
)

// Client talks to a bootstrap server, retrying transient failures with
// jittered exponential backoff until its context ends.
type Client struct {
	Base       string // e.g. http://127.0.0.1:8998
	Token      string // bearer token for writes (bootstrap.Auth.BootstrapToken)
	HTTP       *http.Client
	MinBackoff time.Duration // default 50 ms
	MaxBackoff time.Duration // default 2 s
}

// ErrRankUnknown: the server has no rank at those coordinates (404).
var ErrRankUnknown = wire.ErrRankUnknown

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

// RegisterRank registers, or renews, a prefill rank's record. A record
// still held by another endpoint (409: a previous process of the rank whose
// lease has not lapsed) is retried until ctx ends. It returns the server's
// lease TTL (0 from a server that does not say).
func (c *Client) RegisterRank(ctx context.Context, rec records.RankRecord) (time.Duration, error) {
	body, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	var out struct {
		LeaseTTLMS int64 `json:"lease_ttl_ms"`
	}
	err = c.do(ctx, http.MethodPut, "/v1/ranks", body, &out)
	return time.Duration(out.LeaseTTLMS) * time.Millisecond, err
}

// PublishRoomDP records which DP group of the instance took a room.
func (c *Client) PublishRoomDP(ctx context.Context, room uint64, dp int) error {
	body, err := json.Marshal(roomDP{Room: room, DPRank: dp})
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, "/v1/rooms", body, nil)
}

// RoomDP returns the DP group that took a room, waiting (until ctx ends)
// for the prefill rank to publish it.
func (c *Client) RoomDP(ctx context.Context, room uint64) (int, error) {
	var rd roomDP
	err := c.do(ctx, http.MethodGet, fmt.Sprintf("/v1/rooms?room=%d", room), nil, &rd)
	return rd.DPRank, err
}

// DeregisterRank deletes a rank's record at shutdown, so its next process
// need not wait for the lease.
func (c *Client) DeregisterRank(ctx context.Context, dp, tp, pp int, endpoint string) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("/v1/ranks?dp=%d&tp=%d&pp=%d&endpoint=%s", dp, tp, pp,
		url.QueryEscape(endpoint)), nil, nil)
}

// records.Topology waits until every prefill rank has registered and returns the
// deployment's shape.
func (c *Client) Topology(ctx context.Context) (records.Topology, error) {
	var t records.Topology
	err := c.do(ctx, http.MethodGet, "/v1/topology", nil, &t)
	return t, err
}

// Rank returns the endpoint and key of one prefill rank.
func (c *Client) Rank(ctx context.Context, dp, tp, pp int) (records.RankInfo, error) {
	var ri records.RankInfo
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
		if c.Token != "" && method != http.MethodGet {
			req.Header.Set("Authorization", "Bearer "+c.Token)
		}
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
				// A 409 with Retry-After is a lease still held (transient);
				// other 4xx answers are final.
				held := resp.StatusCode == http.StatusConflict && resp.Header.Get("Retry-After") != ""
				// A room's DP group not published yet: the prefill rank
				// may still be creating it.
				notYet := resp.StatusCode == http.StatusNotFound && strings.HasPrefix(path, "/v1/rooms?")
				if resp.StatusCode < 500 && !held && !notYet {
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

// roomDP is the body of PUT /v1/rooms/dp and the answer of GET (the
// bootstrap server's own type, bootstrap/server.go).
type roomDP struct {
	Room   uint64 `json:"room"`
	DPRank int    `json:"dp_rank"`
}
