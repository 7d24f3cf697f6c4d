package bootstrap

import (
	"fmt"
	"os"
	"time"
)

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
