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
	envEtcdCACert   = "KVBRIDGE_ETCD_CACERT"
	envEtcdCert     = "KVBRIDGE_ETCD_CERT"
	envEtcdKey      = "KVBRIDGE_ETCD_KEY"
	envEtcdUsername = "KVBRIDGE_ETCD_USERNAME"
	envEtcdPassword = "KVBRIDGE_ETCD_PASSWORD"
	envEtcdLeaseTTL = "KVBRIDGE_ETCD_LEASE_TTL"
)

// EtcdConfigFromEnv reads the KVBRIDGE_ETCD_* variables.
func EtcdConfigFromEnv() (EtcdConfig, error) {
	c := EtcdConfig{CACert: os.Getenv(envEtcdCACert), Cert: os.Getenv(envEtcdCert), Key: os.Getenv(envEtcdKey),
		Username: os.Getenv(envEtcdUsername), Password: os.Getenv(envEtcdPassword)}
	if v := os.Getenv(envEtcdLeaseTTL); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return c, fmt.Errorf("bootstrap: %s=%q: want a duration of at least 1s", envEtcdLeaseTTL, v)
		}
		c.LeaseTTL = d
	}
	return c, nil
}
