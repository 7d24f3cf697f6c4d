package discovery

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/records"
)

// Discovery is where a prefill instance's ranks publish themselves and
// decode ranks find them. Two implementations, one interface: the HTTP
// bootstrap server (*Client, http:// and https:// targets) and etcd
// (*EtcdClient, etcd://host:port[,host:port]/<instance>). The Manager does
// not know which it holds.
type Discovery interface {
	// RegisterRank publishes (or renews) a prefill rank's record and
	// returns the lease TTL it must be renewed within (0: unknown).
	RegisterRank(ctx context.Context, rec records.RankRecord) (time.Duration, error)
	// DeregisterRank removes a rank's own record at its shutdown.
	DeregisterRank(ctx context.Context, dp, tp, pp int, endpoint string) error
	// records.Topology waits until every rank of the instance is published.
	Topology(ctx context.Context) (records.Topology, error)
	// Rank returns one rank's endpoint and key (ErrRankUnknown if none).
	Rank(ctx context.Context, dp, tp, pp int) (records.RankInfo, error)
	// PublishRoomDP and RoomDP record and read a room's DP group.
	PublishRoomDP(ctx context.Context, room uint64, dp int) error
	RoomDP(ctx context.Context, room uint64) (int, error)
	// Watch reports changes to the instance's rank records until ctx
	// ends; nil where the backend cannot push them (HTTP).
	Watch(ctx context.Context) <-chan RankEvent
	// Malformed counts records the backend ignored as malformed.
	Malformed() uint64
	// Close releases the connection (and an etcd rank's lease).
	Close() error
}

// RankEvent is a change to a rank record: a new or changed record, or its
// deletion (the rank deregistered, or its lease lapsed).
type RankEvent struct {
	DP, TP, PP int
	Endpoint   string // the new endpoint ("" when Deleted)
	PublicKey  string
	Cert       string // the rank's identity certificate (base64), under per-rank identity
	Epoch      uint64 // the rank process's epoch, when its record has one
	Deleted    bool
}

// DialOptions configure Dial.
type DialOptions struct {
	// Token is the HTTP bootstrap server's bearer token for writes.
	Token string
	// Etcd holds the etcd client's TLS, auth and lease settings.
	Etcd bootstrap.EtcdConfig
}

// Dial returns the discovery client of a target URL: http:// or https://
// (the HTTP bootstrap server) or etcd://host:port[,host:port]/<instance>.
func Dial(target string, o DialOptions) (Discovery, error) {
	switch {
	case strings.HasPrefix(target, "http://"), strings.HasPrefix(target, "https://"):
		c := NewClient(target)
		c.Token = o.Token
		return c, nil
	case strings.HasPrefix(target, "etcd://"):
		return DialEtcd(target, o.Etcd)
	}
	return nil, fmt.Errorf("bootstrap: target %.64q: want http://host:port or etcd://host:port[,host:port]/instance", target)
}

// Watch is nil for the HTTP server: it cannot push changes.
func (c *Client) Watch(context.Context) <-chan RankEvent { return nil }

// Malformed is 0: the HTTP server validates every record it stores.
func (c *Client) Malformed() uint64 { return 0 }

// Close releases nothing.
func (c *Client) Close() error { return nil }
