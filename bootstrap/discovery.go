package bootstrap

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// Discovery is where a prefill instance's ranks publish themselves and
// decode ranks find them. Two implementations, one interface: the HTTP
// bootstrap server (*Client, http:// and https:// targets) and etcd
// (*EtcdClient, etcd://host:port[,host:port]/<instance>). The Manager does
// not know which it holds.
type Discovery interface {
	// RegisterRank publishes (or renews) a prefill rank's record and
	// returns the lease TTL it must be renewed within (0: unknown).
	RegisterRank(ctx context.Context, rec RankRecord) (time.Duration, error)
	// DeregisterRank removes a rank's own record at its shutdown.
	DeregisterRank(ctx context.Context, dp, tp, pp int, endpoint string) error
	// Topology waits until every rank of the instance is published.
	Topology(ctx context.Context) (Topology, error)
	// Rank returns one rank's endpoint and key (ErrRankUnknown if none).
	Rank(ctx context.Context, dp, tp, pp int) (RankInfo, error)
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
	Etcd EtcdConfig
}

// EtcdConfig is the etcd client's configuration.
type EtcdConfig struct {
	CACert, Cert, Key  string // PEM files; CACert alone for server-only TLS
	Username, Password string
	// DialTimeout bounds connecting, default 5 s.
	DialTimeout time.Duration
	// LeaseTTL is a rank record's lease, default 15 s: a rank that dies
	// without deregistering vanishes within it.
	LeaseTTL time.Duration
}

// Environment variables read by EtcdConfigFromEnv.
const (
	EnvEtcdCACert   = "KVBRIDGE_ETCD_CACERT"
	EnvEtcdCert     = "KVBRIDGE_ETCD_CERT"
	EnvEtcdKey      = "KVBRIDGE_ETCD_KEY"
	EnvEtcdUsername = "KVBRIDGE_ETCD_USERNAME"
	EnvEtcdPassword = "KVBRIDGE_ETCD_PASSWORD"
	EnvEtcdLeaseTTL = "KVBRIDGE_ETCD_LEASE_TTL"
)

// EtcdConfigFromEnv reads the KVBRIDGE_ETCD_* variables.
func EtcdConfigFromEnv() (EtcdConfig, error) {
	c := EtcdConfig{CACert: os.Getenv(EnvEtcdCACert), Cert: os.Getenv(EnvEtcdCert), Key: os.Getenv(EnvEtcdKey),
		Username: os.Getenv(EnvEtcdUsername), Password: os.Getenv(EnvEtcdPassword)}
	if v := os.Getenv(EnvEtcdLeaseTTL); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return c, fmt.Errorf("bootstrap: %s=%q: want a duration of at least 1s", EnvEtcdLeaseTTL, v)
		}
		c.LeaseTTL = d
	}
	return c, nil
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
