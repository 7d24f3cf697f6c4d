package discovery

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/records"
	"github.com/stretchr/testify/require"
)

// testToken is the bearer token of the test servers.
const testToken = "kvbridge-discovery-test-token"

func record(dp, tp int) records.RankRecord {
	return records.RankRecord{Instance: "prefill-a", DPRank: dp, DPSize: 1, TPRank: tp, TPSize: 2, PPRank: 0, PPSize: 1,
		Endpoint: fmt.Sprintf("tcp://10.0.0.%d:17000", tp+1), PageSize: 16, DType: "bf16", Compat: "v1:abc"}
}

func newTestServer(t *testing.T) (*bootstrap.Server, struct{}) {
	s, err := bootstrap.NewServer(bootstrap.ServerConfig{Token: testToken, LeaseTTL: 15 * time.Second})
	require.NoError(t, err)
	return s, struct{}{}
}

func TestClientRetriesUntilTopologyComplete(t *testing.T) {
	// The server is not even listening when the client starts.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	c := NewClient("http://" + addr)
	c.MinBackoff, c.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan error, 1)
	var topo records.Topology
	go func() {
		var err error
		topo, err = c.Topology(ctx)
		got <- err
	}()
	srv, _ := newTestServer(t)
	require.NoError(t, srv.Start(addr))
	defer srv.Close(context.Background())
	reg := NewClient(srv.URL())
	reg.Token = testToken
	for tp := 0; tp < 2; tp++ {
		_, err := reg.RegisterRank(ctx, record(0, tp))
		require.NoError(t, err)
	}
	require.NoError(t, <-got)
	require.Equal(t, 2, topo.TPSize, "topology %+v", topo)
	require.Equal(t, "prefill-a", topo.Instance, "topology %+v", topo)
	ri, err := c.Rank(ctx, 0, 1, 0)
	require.NoError(t, err, "rank %+v", ri)
	require.Equal(t, "tcp://10.0.0.2:17000", ri.Endpoint, "rank %+v", ri)
	_, err = c.Rank(ctx, 0, 7, 0)
	require.ErrorIs(t, err, ErrRankUnknown, "unknown rank")
	bad := record(0, 0)
	bad.Compat = "other"
	var he *HTTPError
	_, err = reg.RegisterRank(ctx, bad)
	require.ErrorAs(t, err, &he, "conflict must be final")
	require.Equal(t, 409, he.Code, "conflict must be final, got %v", err)
}

func TestClientGivesUpWithContext(t *testing.T) {
	s, _ := newTestServer(t)
	srv := httptest.NewServer(s) // topology never completes
	defer srv.Close()
	c := NewClient(srv.URL)
	c.MinBackoff = time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.Topology(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "want deadline with the last reason")
	require.ErrorContains(t, err, "no prefill rank", "want deadline with the last reason")
}

// TestClientRoomDP: a room's DP group as the client reads it back.
func TestClientRoomDP(t *testing.T) {
	s, _ := newTestServer(t)
	srv := httptest.NewServer(s)
	defer srv.Close()
	rec := record(0, 0)
	rec.DPSize, rec.TPSize = 2, 1
	c := NewClient(srv.URL)
	c.Token = testToken
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.RegisterRank(ctx, rec)
	require.NoError(t, err)
	require.NoError(t, c.PublishRoomDP(ctx, 7, 1))
	dp, err := c.RoomDP(ctx, 7)
	require.NoError(t, err, "RoomDP: %d", dp)
	require.Equal(t, 1, dp, "RoomDP")
}
