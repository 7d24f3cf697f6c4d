package kvmanager

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/nixl"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Config configures one rank's Manager.
type Config struct {
	Role     Role
	Instance string // this rank's deployment name
	// Rank is this rank's index in its instance; with Parallel set it is
	// Parallel.Global() (0 is read as that).
	Rank int
	// Bind is the control endpoint to bind (default tcp://127.0.0.1:*).
	Bind string
	// BootstrapURL is the discovery service: the HTTP bootstrap server
	// (http://host:port) or etcd (etcd://host:port[,host:port]/<instance>).
	// Prefill ranks register there (skipped when empty), decode ranks look
	// prefill ranks up. A decode rank with a Model may leave it empty when
	// every room names its prefill instance (receiver.NewFor).
	BootstrapURL string
	// Etcd configures etcd targets (TLS, auth, lease TTL; FromEnv reads
	// KVBRIDGE_ETCD_*).
	Etcd bootstrap.EtcdConfig
	// PrefillRank is the prefill rank of BootstrapURL that a decode rank
	// without a Model pulls from when a room names no target (0 is rank 0,
	// not "unset").
	PrefillRank int
	// Parallel is this rank's place in its instance: TP within its DP
	// group, PP stage, DP group (zero sizes mean 1). It goes in the rank
	// table (prefill) and in REGISTER (decode).
	Parallel transfer.Parallel
	// Model is what the rank mapping needs (layers, KV heads, bytes per
	// head per token per region, page tokens, MLA, NHD or HND). Set it on
	// both instances to pair different TP, PP and DP shapes; left zero,
	// one prefill rank feeds one decode rank with identical layouts.
	Model transfer.Model
	// PublishRoomDP (prefill, DP attention): the first rank of each DP
	// group (TP 0, PP 0) publishes every room it creates to the bootstrap
	// server, for decode ranks that look the group up (LookupDP).
	PublishRoomDP bool
	// Compat must match between prefill and decode: protocol version, model
	// layout, dtype and page size.
	Compat string
	// PageTokens and DType describe the layout for the rank table.
	PageTokens int
	DType      string

	Engine   nixl.Config     // Name defaults to instance-role-rank
	Layout   transfer.Layout // KV (and aux) memory of this rank, registered by the Manager
	Registry RegistryConfig  // the rooms' deadlines (bootstrap, waiting, stall, pending) and bounds
	Workers  int             // transfer workers (prefill; decode with Pull: its reads), default 4
	// InFlight is how many writes (reads: a decode rank with Pull) a
	// worker keeps posted at once, default 8.
	InFlight int
	// WarmMemory faults in the rank's host memory (KV regions in DRAM, aux
	// and state items) when the Manager registers it (nixl.Populate), so a
	// fresh machine's first-touch page faults are paid at start-up, not
	// inside the first transfers (Manager.WarmUp says how long it took).
	// The example binaries turn it on.
	WarmMemory bool

	// Digest (decode): every room asks its prefill ranks for a CRC-32C of
	// each page they write and checks it before Success
	// (RequestSpec.Digest; docs/PROTOCOL.md "Digest"). Pushed or pulled;
	// KV in host memory, or in VRAM (summed on the device by the digest
	// kernel, through Config.Engine.CUDALib's driver).
	Digest bool

	// Pull (decode): every room reads its pages from the prefill ranks
	// once they publish them, instead of having them written
	// (docs/PROTOCOL.md "Pull"); the prefill ranks must serve pull.
	Pull bool
	// PullLease (prefill): how long a pull room's published pages wait
	// for a decode rank's reads, renewed by the decode rank while it
	// reads; at most StallTimeout (default StallTimeout / 2). Negative:
	// this rank does not serve pull (its REGISTER_ACKs offer nothing to
	// read, and pull REQUESTs are refused). On a decode rank it is the
	// lease it renews a third of until a prefill rank says its own.
	PullLease time.Duration

	// QuarantineTimeout bounds how long a failed decode room's pages wait
	// for the prefill ranks' ABORT_ACK (default 2 × StallTimeout); past it
	// they are released as forced, logged and counted.
	QuarantineTimeout time.Duration
	// RegisterRetry is the first interval before a REGISTER without answer
	// is sent again (doubling up to 32×), default 500 ms.
	RegisterRetry time.Duration

	HeartbeatInterval time.Duration // default 5 s
	MaxMisses         int           // default 2
	SweepInterval     time.Duration // default 1 s
	// ProbeIdle and ProbeTimeout (decode): a REQUEST goes only to a
	// prefill process heard from within ProbeIdle (default 1 s); else a
	// PING goes first and, without a PONG within ProbeTimeout (default
	// 250 ms), the rank is looked up again and registered with wherever its
	// record says — a room posted just after a prefill rank restarted
	// elsewhere is served by the new process. ProbeIdle < 0: no probe.
	ProbeIdle, ProbeTimeout time.Duration
	// Auth is the deployment's shared secret: every control message is
	// authenticated with it and bootstrap writes carry its token. Required
	// unless Insecure is set (FromEnv reads KVBRIDGE_SECRET,
	// KVBRIDGE_SECRET_FILE, KVBRIDGE_INSECURE).
	Auth *bootstrap.Auth
	// Insecure runs without authentication, logged as a warning.
	Insecure bool
	// RankIdentity turns on per-rank identity (with Auth): this rank's
	// certificate and key and the deployment CA's public key (FromEnv reads
	// KVBRIDGE_CA_FILE and KVBRIDGE_IDENTITY_FILE; bootstrap.LoadIdentity
	// reads the files, bootstrap.CA.Issue makes one). A peer's from is then
	// proven: a holder of the shared secret alone can speak as no rank.
	RankIdentity bootstrap.RankIdentity
	// MaxPeers bounds the control plane's PUSH sockets (default 1024; a
	// new peer evicts the least recently used unwatched one, and is refused
	// when all are watched); MaxEpochs the peer epochs remembered for
	// restart detection by the core (default 4,096).
	MaxPeers, MaxEpochs int
	// Security adds CURVE encryption and a key allow-list (optional).
	Security *bootstrap.Security

	// Logger receives the rank's logs (nil: none); Registerer its metrics
	// (docs/METRICS.md; nil: none registered).
	Logger     *zap.Logger
	Registerer prometheus.Registerer

	// hooks are kvbridge's own tests' (the clock, the control tap, the
	// trace points): set through internal/rankhooks.
	hooks rankhooks.Hooks
}

// DefaultConfig returns a config with the defaults for role (docs/ARCHITECTURE.md, "Defaults and configuration").
func DefaultConfig(role Role) Config {
	return Config{Role: role, Bind: "tcp://127.0.0.1:*", PageTokens: 16, DType: "bf16",
		Registry: RegistryConfig(core.DefaultRegistryConfig()), Workers: 4, HeartbeatInterval: 5 * time.Second, MaxMisses: 2,
		SweepInterval: time.Second, QuarantineTimeout: 2 * core.DefaultRegistryConfig().StallTimeout,
		RegisterRetry: 500 * time.Millisecond, ProbeIdle: time.Second, ProbeTimeout: 250 * time.Millisecond}
}

// fillDefaults replaces each zero setting for which zero is not a valid
// value by its default, one field at a time. Settings where zero is valid
// (ranks, PrefillRank) are never touched.
func (c *Config) fillDefaults() {
	def := DefaultConfig(c.Role)
	setDur := func(dst *time.Duration, v time.Duration) {
		if *dst == 0 {
			*dst = v
		}
	}
	if c.Bind == "" {
		c.Bind = def.Bind
	}
	c.Parallel = c.Parallel.Norm()
	if c.Rank == 0 {
		c.Rank = c.Parallel.Global()
	}
	if !kvlayout.NoModel(c.Model) {
		c.PageTokens = c.Model.PageTokens
	}
	if c.Workers == 0 {
		c.Workers = def.Workers
	}
	if c.MaxMisses == 0 {
		c.MaxMisses = def.MaxMisses
	}
	if c.hooks.Now == nil {
		c.hooks.Now = time.Now
	}
	setDur(&c.HeartbeatInterval, def.HeartbeatInterval)
	setDur(&c.SweepInterval, def.SweepInterval)
	setDur(&c.RegisterRetry, def.RegisterRetry)
	setDur(&c.ProbeIdle, def.ProbeIdle)
	setDur(&c.ProbeTimeout, def.ProbeTimeout)
	r, d := &c.Registry, def.Registry
	setDur(&r.BootstrapTimeout, d.BootstrapTimeout)
	setDur(&r.WaitingTimeout, d.WaitingTimeout)
	setDur(&r.StallTimeout, d.StallTimeout)
	setDur(&r.PendingTimeout, d.PendingTimeout)
	setDur(&r.TombstoneTTL, d.TombstoneTTL)
	setDur(&c.QuarantineTimeout, 2*r.StallTimeout)
	setDur(&c.PullLease, r.StallTimeout/2)
	if r.MaxPendingRooms == 0 {
		r.MaxPendingRooms = d.MaxPendingRooms
	}
	if r.MaxTombstones == 0 {
		r.MaxTombstones = d.MaxTombstones
	}
	if r.MaxPendingPerPeer == 0 {
		r.MaxPendingPerPeer = d.MaxPendingPerPeer
	}
	if r.MaxReasonBytes == 0 {
		r.MaxReasonBytes = d.MaxReasonBytes
	}
}

// identity is the rank's identity as the control plane uses it (nil
// without per-rank identity, or for a value bootstrap did not make, which
// Validate refuses).
func (c *Config) identity() *ident.RankIdentity {
	id, _ := c.RankIdentity.(*ident.RankIdentity)
	return id
}

// Validate reports the first setting that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.Role != RolePrefill && c.Role != RoleDecode:
		return fmt.Errorf("kvmanager: Config.Role must be RolePrefill or RoleDecode, got %d", c.Role)
	case c.RankIdentity != nil && c.identity() == nil:
		return errors.New("kvmanager: Config.RankIdentity is not an identity bootstrap made (only bootstrap.LoadIdentity, IdentityFromEnv and CA.Issue make one; leave it nil for none)")
	case c.Instance == "":
		return errors.New("kvmanager: Config.Instance is empty (the instance's name, the same on every rank of it)")
	case c.Rank < 0 || c.PrefillRank < 0:
		return fmt.Errorf("kvmanager: Config.Rank (%d) and Config.PrefillRank (%d) must not be negative", c.Rank, c.PrefillRank)
	case c.Parallel.Validate() != nil:
		return fmt.Errorf("kvmanager: Config.Parallel: %w", c.Parallel.Validate())
	case c.Rank != c.Parallel.Global() && c.Parallel != (transfer.Parallel{}).Norm():
		return fmt.Errorf("kvmanager: Config.Rank %d is not the rank's index %d in its instance (Config.Parallel %v)", c.Rank, c.Parallel.Global(), c.Parallel)
	case c.Compat == "":
		return errors.New("kvmanager: Config.Compat is empty (hash of protocol, model layout, dtype, page size)")
	case c.Role == RoleDecode && c.BootstrapURL == "" && kvlayout.NoModel(c.Model):
		// (With a Model, each room may name its prefill instance instead:
		// receiver.NewFor's bootstrap.)
		return errors.New("kvmanager: a decode rank without a Config.Model needs Config.BootstrapURL to find prefill ranks")
	case c.HeartbeatInterval <= 0 || c.MaxMisses < 1 || c.SweepInterval <= 0:
		return fmt.Errorf("kvmanager: Config.HeartbeatInterval (%v), Config.MaxMisses (%d) and Config.SweepInterval (%v) must be positive", c.HeartbeatInterval, c.MaxMisses, c.SweepInterval)
	case c.QuarantineTimeout <= c.Registry.StallTimeout || c.QuarantineTimeout >= c.Registry.TombstoneTTL:
		return fmt.Errorf("kvmanager: Config.QuarantineTimeout (%v) must exceed Config.Registry.StallTimeout (%v) and stay below Config.Registry.TombstoneTTL (%v)",
			c.QuarantineTimeout, c.Registry.StallTimeout, c.Registry.TombstoneTTL)
	case c.Auth == nil && !c.Insecure:
		return fmt.Errorf("kvmanager: Config.Auth is nil and Config.Insecure is false: set Auth (bootstrap.NewAuth with the deployment's shared secret, or Config.FromEnv), or Insecure on a trusted network: %w", bootstrap.ErrNoSecret)
	case c.RegisterRetry <= 0:
		return fmt.Errorf("kvmanager: Config.RegisterRetry must be positive, got %v", c.RegisterRetry)
	case c.PullLease > c.Registry.StallTimeout:
		return fmt.Errorf("kvmanager: Config.PullLease (%v) must not exceed Config.Registry.StallTimeout (%v): the stall deadline would end a longer lease", c.PullLease, c.Registry.StallTimeout)
	case c.Digest && c.Role != RoleDecode:
		return fmt.Errorf("kvmanager: Config.Digest is a decode rank's (its rooms ask their prefill ranks for digests; this rank: %v)", c.Role)
	case c.Pull && c.Role == RoleDecode && c.PullLease < 0:
		return fmt.Errorf("kvmanager: a decode rank with Config.Pull needs a positive Config.PullLease (its renewal basis), got %v", c.PullLease)
	}
	if err := kvlayout.ValidateLayout(c.Layout); err != nil {
		return fmt.Errorf("kvmanager: Config.Layout: %w", err)
	}
	if !kvlayout.NoModel(c.Model) {
		if err := kvlayout.ValidateModel(c.Model); err != nil {
			return fmt.Errorf("kvmanager: Config.Model: %w", err)
		}
		_, layers := c.Model.StageLayers(c.Parallel.PPSize, c.Parallel.PPRank)
		pb, err := c.Model.PageBytes(c.Parallel.TPSize)
		if err != nil {
			return fmt.Errorf("kvmanager: Config.Model at Config.Parallel %v: %w", c.Parallel, err)
		}
		if len(c.Layout.Regions) != layers*transfer.RegionsPerLayer || c.Layout.PageBytes != pb {
			return fmt.Errorf("kvmanager: Config.Layout of %d regions × %d-byte pages does not fit Config.Model at %v (%d layers × %d regions, %d-byte pages)",
				len(c.Layout.Regions), c.Layout.PageBytes, c.Parallel, layers, transfer.RegionsPerLayer, pb)
		}
	}
	if err := c.Registry.validate(); err != nil {
		return fmt.Errorf("kvmanager: Config.Registry: %w", err)
	}
	return nil
}

// FromEnv overrides fields from KVBRIDGE_* variables (call it on
// DefaultConfig's result, then set in code what the program decides): KVBRIDGE_BIND,
// KVBRIDGE_BOOTSTRAP_URL, KVBRIDGE_ENGINE, KVBRIDGE_WORKERS and the
// timeouts KVBRIDGE_BOOTSTRAP_TIMEOUT, KVBRIDGE_WAITING_TIMEOUT,
// KVBRIDGE_STALL_TIMEOUT, KVBRIDGE_TOMBSTONE_TTL, KVBRIDGE_QUARANTINE,
// KVBRIDGE_HEARTBEAT, KVBRIDGE_PULL_LEASE
// (Go durations, e.g. 300s), KVBRIDGE_PULL=1 (decode: read every room),
// the shared secret (KVBRIDGE_SECRET or
// KVBRIDGE_SECRET_FILE) or KVBRIDGE_INSECURE=1, and the engine's
// (nixl.Config.FromEnv: KVBRIDGE_NIXL_LIB, KVBRIDGE_UCX_LIB,
// KVBRIDGE_CUDA_LIB, and UCX_TLS, UCX_UNIFIED_MODE, UCX_ADAPTIVE_PROGRESS
// where Engine.UCX names no such key).
func (c *Config) FromEnv() error {
	auth, insecure, err := bootstrap.AuthFromEnv()
	if err != nil {
		return fmt.Errorf("kvmanager: %w", err)
	}
	if c.Etcd, err = bootstrap.EtcdConfigFromEnv(); err != nil {
		return fmt.Errorf("kvmanager: %w", err)
	}
	if auth != nil {
		c.Auth, c.Insecure = auth, false
	} else if insecure {
		c.Auth, c.Insecure = nil, true
	}
	id, err := bootstrap.IdentityFromEnv()
	if err != nil {
		return fmt.Errorf("kvmanager: %w", err)
	}
	if id != nil {
		c.RankIdentity = id
	}
	if v := os.Getenv("KVBRIDGE_BIND"); v != "" {
		c.Bind = v
	}
	if v := os.Getenv("KVBRIDGE_BOOTSTRAP_URL"); v != "" {
		c.BootstrapURL = v
	}
	if v := os.Getenv("KVBRIDGE_ENGINE"); v != "" {
		c.Engine.Engine = v
	}
	c.Engine.FromEnv()
	if v := os.Getenv("KVBRIDGE_PULL"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("kvmanager: KVBRIDGE_PULL=%q: %w", v, err)
		}
		c.Pull = b
	}
	if v := os.Getenv("KVBRIDGE_WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("kvmanager: KVBRIDGE_WORKERS=%q: %w", v, err)
		}
		c.Workers = n
	}
	for name, dst := range map[string]*time.Duration{
		"KVBRIDGE_BOOTSTRAP_TIMEOUT": &c.Registry.BootstrapTimeout,
		"KVBRIDGE_WAITING_TIMEOUT":   &c.Registry.WaitingTimeout,
		"KVBRIDGE_STALL_TIMEOUT":     &c.Registry.StallTimeout,
		"KVBRIDGE_TOMBSTONE_TTL":     &c.Registry.TombstoneTTL,
		"KVBRIDGE_QUARANTINE":        &c.QuarantineTimeout,
		"KVBRIDGE_HEARTBEAT":         &c.HeartbeatInterval,
		"KVBRIDGE_PULL_LEASE":        &c.PullLease,
	} {
		if v := os.Getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("kvmanager: %s=%q: %w", name, v, err)
			}
			*dst = d
		}
	}
	return nil
}

// kvbridge's tests and benchmarks give a Config its hooks through
// rankhooks.Set; an engine has no use for them.
func init() {
	rankhooks.Set = func(cfg any, h rankhooks.Hooks) { cfg.(*Config).hooks = h }
}
