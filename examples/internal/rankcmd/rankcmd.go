// Package rankcmd is the shared body of the example prefill and decode
// binaries: flags and KVBRIDGE_* variables, the Manager, an HTTP API to
// drive rooms, /metrics and /healthz, and a clean shutdown on SIGINT or
// SIGTERM that fails every live room.
package rankcmd

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/cli"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/examples/internal/tinyllm"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// Rank is a running prefill or decode rank.
type Rank struct {
	Role kvmanager.Role
	// Mapping and Par place the rank for the rank mapping; Instance names
	// its instance (a prefill rank's pattern seed).
	Mapping  transfer.Model
	Par      transfer.Parallel
	Instance string
	M        *kvmanager.Manager
	P        *kvmanager.Prefill // set on a prefill rank
	D        *kvmanager.Decode  // set on a decode rank
	Model    kvmodel.Model
	pages    *kvmodel.Pages
	kv       [][]byte
	aux      []byte
	log      *zap.Logger
	// layerwise: SendLayers per layerGroup layers instead of one Send.
	layerwise  bool
	layerGroup int
	tiny       *tinyRank // -compute tinyllm
	boot       *bootstrap.Server
	http       *http.Server
	ln         net.Listener
	// compute is -compute: fill or tinyllm.
	compute string
	// token guards POST /v1/room (the bootstrap token of the secret); ""
	// when insecure.
	token string
	npage int
	// bootURL is the rank's discovery URL (-bootstrap, or the bootstrap
	// server it serves).
	bootURL    string
	reg        prometheus.Registerer
	httpClient *http.Client
	started    time.Time
	// wg counts goroutines that outlive a request (held rooms, refusals,
	// the join loop); Main waits for them after the Manager closed.
	wg sync.WaitGroup
	// The OpenAI routes (-compute tinyllm; openai.go, lease.go).
	served     string        // -served-model-name
	reqTimeout time.Duration // -request-timeout
	kvLease    time.Duration // -kv-lease
	pushClaim  time.Duration // -push-claim
	sglangPort int           // -sglang-bootstrap-port
	ticketKey  []byte        // signs and checks kv_transfer_params (nil when insecure)
	reuse      *reusePath    // -reuse-pages (reuse.go)
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// options are a rank's flags.
type options struct {
	model                              string
	layers, heads, dim, dtype, pageTok int
	pages                              int
	engine, tls, bind, boot, serveBoot string
	httpAddr, instance, pageLayout     string
	par                                transfer.Parallel
	publishDP, warm                    bool
	inFlight                           int
	verbose, insecure, printToken      bool
	pprof                              bool
	// Control-plane timing (0: the Manager's default): what the chaos
	// soak shortens so a round of restarts and pauses is quick.
	maxMisses                     int
	sweep, registerRetry, pending time.Duration
	bootLease                     time.Duration
	// -compute: "fill" (the check pattern) or "tinyllm" (a real forward
	// pass, tinyllm.go) and the model's shape beyond the layout flags.
	compute            string
	qHeads, ffn, vocab int
	modelSeed          uint64
	prefixPages        int
	layerwise          bool
	layerGroup         int
	// The OpenAI routes and the instance's front.
	front, served       string
	reqTimeout, kvLease time.Duration
	pushClaim           time.Duration
	sglangPort          int
	// Pull (docs/PROTOCOL.md "Pull"): a decode rank reads every room;
	// a prefill rank's lease on what it publishes (negative: no pull).
	pull      bool
	pullLease time.Duration
	// digest (decode): every room asks for a digest (docs/PROTOCOL.md
	// "Digest").
	digest bool
	// Multi-turn reuse (reuse.go): pages of the second Manager (0: off),
	// the decode rank's bootstrap server for it and lease, the prefill
	// rank's fetch timeout.
	reusePages               int
	reuseBoot                string
	reuseLease, reuseTimeout time.Duration
}

// newFlags defines a rank's flags. The prefill-only ones (-serve-bootstrap,
// -publish-dp, -in-flight) exist only on a prefill rank, so decode -h does
// not list them and decode refuses them.
func newFlags(role kvmanager.Role) (*flag.FlagSet, *options) {
	name := roleName(role)
	o := &options{layerGroup: 1}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&o.model, "model", env("KVBRIDGE_MODEL", "llama3-8b"), "layout preset: "+kvmodel.PresetNames())
	fs.IntVar(&o.layers, "layers", 0, "override: layers")
	fs.IntVar(&o.heads, "kv-heads", 0, "override: KV heads")
	fs.IntVar(&o.dim, "head-dim", 0, "override: head dimension")
	fs.IntVar(&o.dtype, "dtype-bytes", 0, "override: bytes per element")
	fs.IntVar(&o.pageTok, "page-tokens", 0, "override: tokens per page")
	fs.IntVar(&o.pages, "pages", 1024, "pages per layer region")
	fs.StringVar(&o.engine, "engine", env("KVBRIDGE_ENGINE", "ucx"), "engine: ucx, libnixl, loopback (auto: libnixl if installed, else ucx)")
	fs.StringVar(&o.tls, "ucx-tls", env("UCX_TLS", "posix,cma,self"), "UCX transports for the ucx engine")
	fs.StringVar(&o.bind, "bind", env("KVBRIDGE_BIND", "tcp://127.0.0.1:*"), "control endpoint")
	fs.StringVar(&o.boot, "bootstrap", env("KVBRIDGE_BOOTSTRAP_URL", ""), "bootstrap server URL")
	if role == kvmanager.RolePrefill {
		fs.StringVar(&o.serveBoot, "serve-bootstrap", "", "also serve the bootstrap server on this address")
	}
	fs.StringVar(&o.httpAddr, "http", env("KVBRIDGE_HTTP", "127.0.0.1:0"), "HTTP address for /v1 rooms, /metrics and /healthz")
	fs.StringVar(&o.instance, "instance", name, "instance name")
	fs.IntVar(&o.par.TPSize, "tp", 1, "TP size of this rank's instance (within a DP group)")
	fs.IntVar(&o.par.TPRank, "tp-rank", 0, "this rank's TP rank")
	fs.IntVar(&o.par.PPSize, "pp", 1, "PP size of this rank's instance")
	fs.IntVar(&o.par.PPRank, "pp-rank", 0, "this rank's PP stage")
	fs.IntVar(&o.par.DPSize, "dp", 1, "DP size (DP attention groups) of this rank's instance")
	fs.IntVar(&o.par.DPRank, "dp-rank", 0, "this rank's DP group")
	if role == kvmanager.RolePrefill {
		fs.BoolVar(&o.publishDP, "publish-dp", false, "with -dp > 1: publish each room's DP group to the bootstrap server (for decode ranks that look it up)")
	}
	fs.StringVar(&o.pageLayout, "page-layout", env("KVBRIDGE_PAGE_LAYOUT", "NHD"), "order inside a page: NHD (token-major) or HND (head-major)")
	fs.BoolVar(&o.warm, "warm", true, "fault in the rank's memory at start-up, so first-touch page faults stay out of transfer latency")
	if role == kvmanager.RolePrefill {
		fs.IntVar(&o.inFlight, "in-flight", 0, "rooms' writes a transfer worker keeps posted at once (0: the default, 8)")
	}
	fs.IntVar(&o.maxMisses, "max-misses", 0, "heartbeats missed before a peer is declared dead (0: the default, 2; the interval is KVBRIDGE_HEARTBEAT)")
	fs.DurationVar(&o.sweep, "sweep-interval", 0, "how often room deadlines are enforced (0: the default, 1s)")
	fs.DurationVar(&o.registerRetry, "register-retry", 0, "first interval before an unanswered REGISTER is sent again, doubling (0: the default, 500ms)")
	fs.DurationVar(&o.pending, "pending-timeout", 0, "how long a peer's REQUEST waits for its room's sender (0: the default, 300s; must stay below KVBRIDGE_TOMBSTONE_TTL)")
	if role == kvmanager.RolePrefill {
		fs.DurationVar(&o.bootLease, "bootstrap-lease", 0, "with -serve-bootstrap: a rank record's lease (0: the default, 15s)")
	}
	fs.StringVar(&o.compute, "compute", env("KVBRIDGE_COMPUTE", "fill"), "what fills the KV cache: fill (a check pattern, POST /v1/room) or tinyllm (a small Llama-architecture model with seeded weights, POST /v1/prefill and /v1/generate; -model is then ignored and -layers, -kv-heads, -head-dim, -page-tokens shape the model)")
	fs.IntVar(&o.qHeads, "q-heads", 0, "with -compute tinyllm: query heads (0: 8)")
	fs.IntVar(&o.ffn, "ffn", 0, "with -compute tinyllm: the MLP's intermediate size (0: 512)")
	fs.IntVar(&o.vocab, "vocab", 0, "with -compute tinyllm: vocabulary size (0: 2048; ids below 256 are bytes of a text prompt)")
	fs.Uint64Var(&o.modelSeed, "model-seed", 1, "with -compute tinyllm: the weights' seed (every rank of both instances the same)")
	if role == kvmanager.RoleDecode {
		fs.IntVar(&o.prefixPages, "prefix-cache-pages", -1, "with -compute tinyllm on a decode instance of one rank: pages kept for prompt prefixes that later requests reuse (RequestSpec.Prefix: only the rest is transferred); −1: an eighth of -pages, 0: off")
	}
	if role == kvmanager.RolePrefill {
		fs.BoolVar(&o.layerwise, "layerwise", false, "send each room layer group by layer group (sender.SendLayers) as the forward pass (tinyllm) or the fill finishes it, instead of one Send per chunk")
		fs.IntVar(&o.layerGroup, "layer-group", 1, "with -layerwise: layers per SendLayers call")
	}
	fs.StringVar(&o.front, "front", env("KVBRIDGE_FRONT", ""), "with -compute tinyllm, on every rank but the instance's first: that rank's HTTP URL; this rank joins it, and it serves the OpenAI routes for the whole instance (without -bootstrap, this rank also takes its bootstrap server)")
	fs.StringVar(&o.served, "served-model-name", "tinyllm", "with -compute tinyllm: the model name the OpenAI routes serve (GET /v1/models; a request naming another is 404)")
	fs.DurationVar(&o.reqTimeout, "request-timeout", 60*time.Second, "with -compute tinyllm: the OpenAI routes' bound on one request (504 past it)")
	if role == kvmanager.RolePrefill {
		fs.DurationVar(&o.kvLease, "kv-lease", 60*time.Second, "with -compute tinyllm: how long a prefill request in vLLM's flow (kv_transfer_params.do_remote_decode) holds the KV for its decode request")
		fs.DurationVar(&o.pushClaim, "push-claim", 2*time.Second, "with -compute tinyllm: how long a prefill leg of vLLM push's concurrent dispatch (a transfer_id, its decode leg sent at the same time from a cached identity) holds the KV for its decode ranks' REQUESTs once computed, if shorter than -kv-lease: a decode leg refused for a stale identity cannot reach this instance to release it")
	} else {
		fs.IntVar(&o.sglangPort, "sglang-bootstrap-port", 8998, "with -compute tinyllm: the bootstrap port of a request with bootstrap_host and no bootstrap_port (SGLang's default)")
	}
	if role == kvmanager.RoleDecode {
		fs.BoolVar(&o.pull, "pull", env("KVBRIDGE_PULL", "") == "1", "read every room from its prefill ranks once they publish its pages (pull), instead of having them written (push); the prefill ranks must serve pull")
		fs.BoolVar(&o.digest, "digest", false, "every room asks its prefill ranks for a CRC-32C of each page they push and succeeds only once every page matches it (docs/PROTOCOL.md \"Digest\"; pushed or pulled, into host memory)")
	} else {
		fs.DurationVar(&o.pullLease, "pull-lease", 0, "how long a pulled room's published pages wait for the decode rank's reads, renewed while it reads (0: the default, half the stall timeout; negative: do not serve pull)")
	}
	fs.IntVar(&o.reusePages, "reuse-pages", 0, "with -compute tinyllm on an instance of one rank: multi-turn reuse (vLLM's bidirectional KV transfer, the llm-d sidecar's replayed kv_transfer_params) through a second Manager of this many pages running the other way; a decode rank keeps each answered turn's KV there and names it in its answer, a prefill rank fetches a prompt's earlier turn into it and computes only the new tokens (0: off)")
	if role == kvmanager.RoleDecode {
		fs.StringVar(&o.reuseBoot, "reuse-bootstrap", "127.0.0.1:0", "with -reuse-pages: the address of the bootstrap server of this rank's reuse path (answers name its host and port as remote_host and remote_port: a host the prefill ranks reach)")
		fs.DurationVar(&o.reuseLease, "reuse-lease", 60*time.Second, "with -reuse-pages: how long a kept turn waits for the next turn's prefill (remote_blocks_expiry_time); released when fetched or at its end")
	} else {
		fs.DurationVar(&o.reuseTimeout, "reuse-timeout", 2*time.Second, "with -reuse-pages: how long fetching an earlier turn may take before the prefill computes the whole prompt instead")
	}
	fs.BoolVar(&o.pprof, "pprof", false, "serve the Go runtime's profiles at /debug/pprof/ on -http (bearer token required)")
	fs.BoolVar(&o.verbose, "v", false, "log at debug level")
	fs.BoolVar(&o.insecure, "insecure", false, "run without authentication (no shared secret; logged as a warning)")
	fs.BoolVar(&o.printToken, "print-token", false, "print the bearer token of the shared secret (for curl against /v1/room and the bootstrap server) and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s [flags]\n\nA kvbridge %s rank. The deployment's shared secret comes from %s or %s\n"+
			"(the same on every rank and the bootstrap server); -insecure runs without one.\n\nflags:\n",
			name, name, "KVBRIDGE_SECRET", "KVBRIDGE_SECRET_FILE")
		fs.PrintDefaults()
	}
	return fs, o
}

func roleName(role kvmanager.Role) string {
	return map[kvmanager.Role]string{kvmanager.RolePrefill: "prefill", kvmanager.RoleDecode: "decode"}[role]
}

// Main parses flags, runs the rank until a signal and returns the exit code.
func Main(role kvmanager.Role, args []string) int {
	name := roleName(role)
	fs, o := newFlags(role)
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	auth, envInsecure, err := bootstrap.AuthFromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	if o.insecure && auth != nil {
		fmt.Fprintf(os.Stderr, "%s: -insecure with a shared secret set; choose one\n", name)
		return 2
	}
	if o.printToken {
		if auth == nil {
			fmt.Fprintf(os.Stderr, "%s: -print-token: %v\n", name, bootstrap.ErrNoSecret)
			return 2
		}
		fmt.Println(auth.BootstrapToken())
		return 0
	}
	o.insecure = o.insecure || envInsecure
	if auth == nil && !o.insecure {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, bootstrap.ErrNoSecret)
		return 2
	}
	if err := frontOptions(role, o, auth); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	zcfg := zap.NewProductionConfig()
	if o.verbose {
		zcfg.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	}
	log, _ := zcfg.Build()
	defer log.Sync()
	log = log.With(zap.String("role", name), zap.String("instance", o.instance), zap.Stringer("rank", o.par.Norm()))

	var bootSrv *bootstrap.Server
	var queryRank atomic.Pointer[Rank] // answers GET /query once up
	if role == kvmanager.RolePrefill && o.serveBoot != "" {
		scfg := bootstrap.ServerConfig{Insecure: o.insecure, LeaseTTL: o.bootLease}
		if auth != nil {
			scfg.Token = auth.BootstrapToken()
		}
		if bootSrv, err = bootstrap.NewServer(scfg); err != nil {
			return cli.Fail(name, "-serve-bootstrap "+o.serveBoot, err)
		}
		// The bootstrap server, and GET /query as vLLM's MooncakeConnector
		// bootstrap server answers it (the llm-d sidecar's "mooncake"
		// connector asks the prefill host's port 8998), once the rank is up.
		ln, err := net.Listen("tcp", o.serveBoot)
		if err != nil {
			return cli.Fail(name, "-serve-bootstrap "+o.serveBoot, err)
		}
		bmux := http.NewServeMux()
		bmux.Handle("/", bootSrv)
		bmux.HandleFunc("/query", func(w http.ResponseWriter, req *http.Request) {
			if r := queryRank.Load(); r != nil {
				r.serveMooncakeQuery(w, req)
				return
			}
			http.Error(w, "the rank is starting", http.StatusServiceUnavailable)
		})
		hs := &http.Server{Handler: bmux, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln) //nolint:errcheck // ErrServerClosed at Shutdown
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(ctx)
		}()
		o.boot = "http://" + ln.Addr().String()
		log.Info("bootstrap server", zap.String("url", o.boot))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	r, code, err := newRank(role, o, auth, log, reg)
	if err != nil {
		if code == 2 {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			return code
		}
		return cli.Fail(name, "starting the rank", err)
	}
	r.boot = bootSrv
	queryRank.Store(r)
	defer queryRank.CompareAndSwap(r, nil)
	mgr := r.M
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	if o.pprof {
		// The Go runtime's profiles, behind the bearer token (they show
		// the process's internals).
		mux.Handle("/debug/pprof/", r.guard(http.HandlerFunc(pprof.Index)))
		for name, h := range map[string]http.HandlerFunc{"cmdline": pprof.Cmdline, "profile": pprof.Profile, "symbol": pprof.Symbol, "trace": pprof.Trace} {
			mux.Handle("/debug/pprof/"+name, r.guard(h))
		}
	}
	mux.HandleFunc("/v1/info", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, r.info()) })
	mux.HandleFunc("/v1/room", r.serveRoom)
	if r.tiny != nil {
		r.tiny.routes(mux)
	}
	r.ln, err = net.Listen("tcp", o.httpAddr)
	if err != nil {
		r.closeManagers()
		return cli.Fail(name, "-http "+o.httpAddr, err)
	}
	r.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go r.http.Serve(r.ln)
	joinCtx, stopJoin := context.WithCancel(context.Background())
	defer stopJoin()
	if o.front != "" {
		// Ready means joined: the front serves the instance from then on.
		if err := r.join(o.front, time.Minute); err != nil {
			r.http.Close()
			r.closeManagers()
			return cli.Fail(name, "-front "+o.front+": joining the instance's front", err)
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.joinLoop(joinCtx, o.front)
		}()
	}
	// One line for whoever started us (the demo reads it).
	fmt.Printf("%s ready http=%s endpoint=%s epoch=%d bootstrap=%s engine=%s warmup=%s identity=%t\n", name, r.ln.Addr(), mgr.Endpoint(),
		mgr.Epoch(), o.boot, mgr.Engine(), mgr.WarmUp(), cfgIdentity(mgr))
	log.Info("ready", zap.String("http", r.ln.Addr().String()), zap.String("endpoint", mgr.Endpoint()))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	log.Info("shutting down: failing live rooms", zap.Stringer("signal", s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stopJoin()
	r.http.Shutdown(ctx)
	if err := r.closeManagers(); err != nil {
		log.Warn("close", zap.Error(err))
	}
	r.wg.Wait() // held rooms end with the Manager
	return 0
}

// closeManagers closes the reuse path's Manager (its kept turns'
// goroutines end with it) and the rank's.
func (r *Rank) closeManagers() error {
	if r.reuse != nil {
		r.reuse.close()
	}
	return r.M.Close()
}

// info is GET /v1/info.
func (r *Rank) info() Info {
	return Info{Role: roleName(r.Role), Model: r.Model, Endpoint: r.M.Endpoint(), Bootstrap: r.bootURL, Engine: r.M.Engine(),
		Pages: r.npage, BytesPerToken: r.Model.BytesPerToken(), Instance: r.Instance, Parallel: r.Par, Compute: r.compute,
		Fingerprint: r.fingerprint(), Layout: r.Mapping.Layout, Vocab: r.vocab(), Epoch: r.epoch()}
}

// epoch is the rank's process's control-plane epoch (0 before its Manager
// exists).
func (r *Rank) epoch() uint64 {
	if r.M == nil {
		return 0
	}
	return r.M.Epoch()
}

// frontOptions checks -front and the OpenAI flags, and fills what they
// imply: a rank with -front and no -bootstrap takes its front's bootstrap
// server; an instance's first prefill rank with -compute tinyllm and
// neither -bootstrap nor -serve-bootstrap serves one on its -http host at
// port 8998, where SGLang's routers look for it (bootstrap_port).
func frontOptions(role kvmanager.Role, o *options, auth *bootstrap.Auth) error {
	first := o.par.Norm().Global() == 0
	switch {
	case o.front != "" && o.compute != "tinyllm":
		return errors.New("-front is for -compute tinyllm (the instance's front serves the OpenAI routes)")
	case o.front != "" && first:
		return errors.New("-front is for the instance's other ranks: this is its first (TP 0, PP 0, DP 0), the front itself")
	case o.reqTimeout <= 0 || o.reqTimeout > maxRoomTimeout:
		return fmt.Errorf("-request-timeout %s not in (0, %s]", o.reqTimeout, maxRoomTimeout)
	case role == kvmanager.RolePrefill && (o.kvLease <= 0 || o.kvLease > maxRoomTimeout):
		return fmt.Errorf("-kv-lease %s not in (0, %s]", o.kvLease, maxRoomTimeout)
	case role == kvmanager.RolePrefill && (o.pushClaim <= 0 || o.pushClaim > maxRoomTimeout):
		return fmt.Errorf("-push-claim %s not in (0, %s]", o.pushClaim, maxRoomTimeout)
	case role == kvmanager.RoleDecode && (o.sglangPort < 1 || o.sglangPort > 65535):
		return fmt.Errorf("-sglang-bootstrap-port %d not in [1, 65535]", o.sglangPort)
	case o.reusePages < 0:
		return fmt.Errorf("-reuse-pages %d: want ≥ 0", o.reusePages)
	case o.reusePages > 0 && o.compute != "tinyllm":
		return errors.New("-reuse-pages is for -compute tinyllm (it keeps and fetches conversation turns)")
	case role == kvmanager.RoleDecode && (o.reuseLease <= 0 || o.reuseLease > maxRoomTimeout):
		return fmt.Errorf("-reuse-lease %s not in (0, %s]", o.reuseLease, maxRoomTimeout)
	case role == kvmanager.RolePrefill && (o.reuseTimeout <= 0 || o.reuseTimeout > maxRoomTimeout):
		return fmt.Errorf("-reuse-timeout %s not in (0, %s]", o.reuseTimeout, maxRoomTimeout)
	}
	if o.front != "" {
		if !strings.Contains(o.front, "://") {
			o.front = "http://" + o.front
		}
		o.front = strings.TrimRight(o.front, "/")
		if o.boot == "" {
			token := ""
			if auth != nil {
				token = auth.BootstrapToken()
			}
			in, err := frontInfo(o.front, token)
			if err != nil {
				return err
			}
			o.boot = reachable(in.Bootstrap, o.front)
		}
	}
	if o.compute == "tinyllm" && role == kvmanager.RolePrefill && first && o.boot == "" && o.serveBoot == "" {
		host, _, err := net.SplitHostPort(o.httpAddr)
		if err != nil {
			return fmt.Errorf("-http %q: %w", o.httpAddr, err)
		}
		o.serveBoot = net.JoinHostPort(host, "8998")
	}
	return nil
}

// reachable replaces an unspecified host in url (a server bound to
// 0.0.0.0) with the host of via.
func reachable(u, via string) string {
	pu, err := url.Parse(u)
	vu, verr := url.Parse(via)
	if err != nil || verr != nil {
		return u
	}
	if ip := net.ParseIP(pu.Hostname()); ip != nil && ip.IsUnspecified() {
		pu.Host = net.JoinHostPort(vu.Hostname(), pu.Port())
	}
	return pu.String()
}

// newRank builds a rank's Manager from its options (what Main does before
// it serves HTTP). On an error, code is the exit code: 2 for a bad flag, 1
// for a rank that did not start.
func newRank(role kvmanager.Role, o *options, auth *bootstrap.Auth, log *zap.Logger, reg prometheus.Registerer) (r *Rank, code int, err error) {
	m, ok := kvmodel.Presets[o.model]
	var tl *tinyllm.Model
	switch o.compute {
	case "fill":
		if !ok {
			return nil, 2, fmt.Errorf("-model %q: want one of %s", o.model, kvmodel.PresetNames())
		}
	case "tinyllm":
		var err error
		if m, tl, err = tinyModel(o); err != nil {
			return nil, 2, err
		}
	default:
		return nil, 2, fmt.Errorf("-compute %q: want fill or tinyllm", o.compute)
	}
	if o.layerwise && !layerwiseAvailable {
		return nil, 2, errors.New("-layerwise needs sender.SendLayers, not in this build")
	}
	if o.layerGroup < 1 {
		return nil, 2, fmt.Errorf("-layer-group %d: want ≥ 1", o.layerGroup)
	}
	for _, ov := range []struct{ v, dst *int }{{&o.layers, &m.Layers}, {&o.heads, &m.KVHeads}, {&o.dim, &m.HeadDim}, {&o.dtype, &m.DTypeBytes}} {
		if *ov.v > 0 && tl == nil { // (tinyllm: tinyModel applied them)
			*ov.dst = *ov.v
			m.Name = "custom"
		}
	}
	if o.pageTok > 0 && tl == nil {
		m.PageTokens = o.pageTok // the same model in other pages: its compat string stays
	}
	r = &Rank{Role: role, Model: m, log: log, npage: o.pages, bootURL: o.boot, reg: reg, compute: o.compute, started: time.Now(),
		httpClient: &http.Client{}, served: o.served, reqTimeout: o.reqTimeout, kvLease: o.kvLease, pushClaim: o.pushClaim, sglangPort: o.sglangPort}
	if auth != nil {
		r.token = auth.BootstrapToken()
		r.ticketKey = ticketKey(auth.Secret)
	} else {
		log.Warn("running WITHOUT authentication (-insecure): anyone who can reach this rank's ports can drive it")
	}
	cfg := kvmanager.DefaultConfig(role)
	pl, err := transfer.ParsePageLayout(o.pageLayout)
	if err != nil {
		return nil, 2, fmt.Errorf("-page-layout: %w", err)
	}
	if err := cli.OneOf("engine", o.engine, "ucx", "libnixl", "loopback", "auto"); err != nil {
		return nil, 2, err
	}
	if err := o.par.Validate(); err != nil {
		return nil, 2, err
	}
	r.Mapping, r.Par, r.Instance = m.Mapping(pl), o.par.Norm(), o.instance
	cfg.Instance, cfg.Compat, cfg.BootstrapURL, cfg.Bind = o.instance, m.Compat(), o.boot, o.bind
	if tl != nil {
		cfg.Compat += ":" + tl.Fingerprint() // a rank of another model is refused at REGISTER
	}
	cfg.Parallel, cfg.Model, cfg.PublishRoomDP = r.Par, r.Mapping, o.publishDP
	cfg.PageTokens, cfg.DType = m.PageTokens, fmt.Sprintf("%dB", m.DTypeBytes)
	cfg.Engine = nixl.Config{Engine: o.engine, UCX: map[string]string{"TLS": o.tls}}
	if o.engine == "auto" {
		cfg.Engine.Engine = nixl.EngineAuto
	}
	if cfg.Layout, err = m.RankLayout(nixl.DRAM, pl, o.par, o.pages, 4096); err != nil {
		return nil, 2, fmt.Errorf("layout: %w", err)
	}
	cfg.Logger = log
	cfg.WarmMemory, cfg.InFlight = o.warm, o.inFlight
	cfg.Auth, cfg.Insecure = auth, o.insecure
	cfg.Registerer = reg
	cfg.MaxMisses, cfg.SweepInterval, cfg.RegisterRetry = o.maxMisses, o.sweep, o.registerRetry
	cfg.Registry.PendingTimeout = o.pending
	cfg.Pull, cfg.PullLease, cfg.Digest = o.pull, o.pullLease, o.digest
	if o.maxMisses < 0 || o.sweep < 0 || o.registerRetry < 0 || o.pending < 0 || o.bootLease < 0 {
		return nil, 2, errors.New("-max-misses, -sweep-interval, -register-retry, -pending-timeout and -bootstrap-lease must not be negative")
	}
	if err := cfg.FromEnv(); err != nil {
		return nil, 2, fmt.Errorf("configuration: %w", err)
	}
	if role == kvmanager.RolePrefill {
		if r.P, err = kvmanager.NewPrefill(cfg); err == nil {
			r.M = r.P.Manager
		}
	} else if r.D, err = kvmanager.NewDecode(cfg); err == nil {
		r.M = r.D.Manager
	}
	if err != nil {
		return nil, 1, err
	}
	r.kv, r.aux = r.M.Memory()
	r.pages = kvmodel.NewPages(o.pages, uint64(time.Now().UnixNano()))
	r.layerwise, r.layerGroup = o.layerwise, o.layerGroup
	if tl != nil {
		if err := r.initTiny(tl, o); err != nil {
			r.M.Close()
			return nil, 1, err
		}
	}
	if o.reusePages > 0 {
		if r.reuse, err = newReusePath(r, cfg, o, reg); err != nil {
			r.M.Close()
			return nil, 1, err
		}
	}
	return r, 0, nil
}

// roomState answers GET /v1/room?room=N: the room's status in this rank's
// core (a POST blocks until its room ends; this reads it meanwhile).
func (r *Rank) roomState(w http.ResponseWriter, req *http.Request) {
	room, err := strconv.ParseUint(req.URL.Query().Get("room"), 10, 64)
	if err != nil {
		http.Error(w, "query parameter room must be a room id", http.StatusBadRequest)
		return
	}
	st, known := r.M.Status(room)
	if !known {
		http.Error(w, fmt.Sprintf("room %d is not live on this rank (never created, or cleared)", room), http.StatusNotFound)
		return
	}
	writeJSON(w, RoomState{Room: room, Status: st.String(), Reason: r.M.Failure(room), InFlight: r.M.InFlight(room)})
}

// pageBytes is one page of one region on this rank.
func (r *Rank) pageBytes() uint64 {
	pb, _ := r.Mapping.PageBytes(r.Par.TPSize)
	return pb
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// RoomRequest drives one room (POST /v1/room).
type RoomRequest struct {
	Room   uint64 `json:"room"`
	Tokens int    `json:"tokens"`
	// Chunk is the pages per Send (prefill), default 128.
	Chunk int `json:"chunk"`
	// AbortAt (decode): "", "before" (right after the request), "mid" (at
	// the first data) or "after" (after success). AbortAfterChunks
	// (prefill): abort after that many chunks (0: never).
	AbortAt          string `json:"abort_at"`
	AbortAfterChunks int    `json:"abort_after_chunks"`
	TimeoutMS        int    `json:"timeout_ms"`
	// Prefill (decode) is the prefill instance the router chose: its
	// bootstrap URL ("" = the rank's -bootstrap), its DP group (nil = room %
	// dp_size, −2 = look it up) and its name (the pattern seed; "" =
	// "prefill").
	Prefill         string `json:"prefill,omitempty"`
	PrefillDP       *int   `json:"prefill_dp,omitempty"`
	PrefillInstance string `json:"prefill_instance,omitempty"`
}

// RoomResult is the outcome of a room.
type RoomResult struct {
	Room      uint64  `json:"room"`
	Status    string  `json:"status"`
	Reason    string  `json:"reason,omitempty"`
	Bytes     uint64  `json:"bytes"`
	LatencyMS float64 `json:"latency_ms"` // from the POST to the room's end, verification excluded
	// PhasesMS splits the latency: decode "pages" (creating the room, then
	// waiting for free pages),
	// "transfer" (REQUEST sent → Success); prefill "pages", "fill" (writing
	// the check pattern), "ready" (waiting for the decode ranks' REQUEST),
	// "data" (first chunk handed over → the room's end); both "verify" or
	// nothing (outside the latency).
	PhasesMS      map[string]float64 `json:"phases_ms,omitempty"`
	PagesVerified int                `json:"pages_verified"`
	Corrupt       int                `json:"pages_corrupt"`
	Error         string             `json:"error,omitempty"`
}

// Bounds of POST /v1/room.
const (
	maxRoomBody    = 16 << 10
	maxRoomTimeout = time.Hour
)

// checkRoom validates a room request against this rank; the error is the
// 400 answer.
func (r *Rank) checkRoom(rr *RoomRequest) error {
	maxTokens := r.npage * r.Model.PageTokens
	switch {
	case rr.Tokens < 1 || rr.Tokens > maxTokens:
		return fmt.Errorf("tokens %d not in [1, %d] (the rank's %d pages × %d tokens)", rr.Tokens, maxTokens, r.npage, r.Model.PageTokens)
	case rr.Chunk < 0 || rr.Chunk > r.npage:
		return fmt.Errorf("chunk %d not in [0, %d] (0: 128)", rr.Chunk, r.npage)
	case rr.TimeoutMS < 0 || int64(rr.TimeoutMS) > maxRoomTimeout.Milliseconds():
		return fmt.Errorf("timeout_ms %d not in [0, %d] (0: 60000)", rr.TimeoutMS, maxRoomTimeout.Milliseconds())
	case rr.AbortAfterChunks < 0:
		return fmt.Errorf("abort_after_chunks %d is negative", rr.AbortAfterChunks)
	case rr.AbortAt != "" && rr.AbortAt != "before" && rr.AbortAt != "mid" && rr.AbortAt != "after":
		return fmt.Errorf("abort_at %.32q is not one of \"\", before, mid, after", rr.AbortAt)
	}
	if rr.Chunk == 0 {
		rr.Chunk = 128
	}
	if rr.TimeoutMS == 0 {
		rr.TimeoutMS = 60000
	}
	return nil
}

// RoomState is a room's state on this rank (GET /v1/room?room=N).
type RoomState struct {
	Room     uint64 `json:"room"`
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	InFlight int    `json:"inflight_writes"`
}

func (r *Rank) serveRoom(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost && req.Method != http.MethodGet {
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "POST a room, or GET /v1/room?room=N for its state", http.StatusMethodNotAllowed)
		return
	}
	if r.token != "" {
		got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(r.token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvbridge"`)
			http.Error(w, "POST /v1/room needs the deployment's bearer token", http.StatusUnauthorized)
			return
		}
	}
	if req.Method == http.MethodGet {
		r.roomState(w, req)
		return
	}
	var rr RoomRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, maxRoomBody))
	err := dec.Decode(&rr)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON value")
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			http.Error(w, fmt.Sprintf("body exceeds %d bytes", maxRoomBody), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "body must be one JSON object {room, tokens, ...}: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := r.checkRoom(&rr); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), time.Duration(rr.TimeoutMS)*time.Millisecond)
	defer cancel()
	var res RoomResult
	if r.Role == kvmanager.RolePrefill {
		res = r.send(ctx, rr)
	} else {
		res = r.recv(ctx, rr)
	}
	writeJSON(w, res)
}

func (r *Rank) getPages(ctx context.Context, n int) ([]uint32, error) {
	for {
		if p := r.pages.Get(n); p != nil {
			return p, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no %d free pages: %w", n, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

func (r *Rank) send(ctx context.Context, rr RoomRequest) RoomResult {
	res := RoomResult{Room: rr.Room, PhasesMS: map[string]float64{}}
	start := time.Now()
	mark := phases(res.PhasesMS, start)
	n := (rr.Tokens + r.Model.PageTokens - 1) / r.Model.PageTokens
	src, err := r.getPages(ctx, n)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	var s *sender.Sender
	defer func() { r.putSource(s, src) }()
	mark("pages")
	s, err = sender.New(r.P, rr.Room)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer s.Clear()
	// The pattern a decode rank will check: per instance, room, position,
	// global region, head and token.
	seed := kvmodel.InstanceSeed(r.Instance)
	// (heads, not n: n is the room's page count, which res.Bytes needs.)
	first, heads, _ := r.Mapping.Heads(r.Par.TPSize, r.Par.TPRank)
	layer0, _ := r.Mapping.StageLayers(r.Par.PPSize, r.Par.PPRank)
	pb := int(r.pageBytes())
	for region, mem := range r.kv {
		for pos, pg := range src {
			kvmodel.FillHeads(mem[int(pg)*pb:(int(pg)+1)*pb], r.Mapping, first, heads, seed, rr.Room, pos, layer0*transfer.RegionsPerLayer+region)
		}
	}
	mark("fill")
	s.Init()
	st, err := s.WaitReady(ctx)
	mark("ready")
	if st != kvmanager.WaitingForInput {
		res.Status, res.Reason = st.String(), s.Failure()
		if err != nil && res.Reason == "" {
			res.Reason = err.Error()
		}
		return res
	}
	chunks := 0
	for i := 0; i < len(src); i += rr.Chunk {
		if rr.AbortAfterChunks > 0 && chunks == rr.AbortAfterChunks {
			s.Abort("demo: prefill abort")
			break
		}
		end := min(i+rr.Chunk, len(src))
		if err := r.sendChunk(s, src[i:end], end == len(src), int(rr.Room%4096)); err != nil {
			// A send the room refuses (a chunk the decode pages do not
			// fit, for one) ends the room now, not at its deadline.
			s.Abort("prefill: " + err.Error())
			break
		}
		chunks++
	}
	st, err = s.Wait(ctx)
	mark("data")
	res.Status, res.Reason = st.String(), s.Failure()
	if err != nil && res.Reason == "" {
		res.Reason = err.Error()
	}
	if st == kvmanager.Success {
		res.Bytes = uint64(n) * r.pageBytes() * uint64(len(r.kv))
	}
	res.LatencyMS = float64(time.Since(start).Microseconds()) / 1e3
	return res
}

// putSource gives a room's source pages back once no decode rank can read
// them any more: at once for a pushed room, once Released for a pulled one
// (its decode ranks reported their reads, or the quarantine past its lease
// ran out; the request's answer does not wait for that).
func (r *Rank) putSource(s *sender.Sender, src []uint32) {
	if s == nil {
		r.pages.Put(src)
		return
	}
	ch := s.Released()
	select {
	case <-ch:
		r.pages.Put(src)
	default:
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			<-ch // (closed at the latest when the Manager closes)
			r.pages.Put(src)
		}()
	}
}

// phases returns a function that records, under each name, the time since
// the previous mark (the first since start).
func phases(into map[string]float64, start time.Time) func(string) {
	last := start
	return func(name string) {
		now := time.Now()
		into[name] += float64(now.Sub(last).Microseconds()) / 1e3
		last = now
	}
}

// abortAt aborts a decode room on purpose where a request asked: "before"
// (right after its REQUEST) or "mid" (once data started to arrive).
func abortAt(ctx context.Context, rc *receiver.Receiver, at, why string) {
	switch at {
	case "before":
		rc.Abort(why + " right after the request")
	case "mid":
		for rc.Poll() == kvmanager.WaitingForInput && ctx.Err() == nil {
			time.Sleep(50 * time.Microsecond) // polls the room: the example's abort point, not synchronisation
		}
		rc.Abort(why + " mid-transfer")
	}
}

// newReceiver creates a room's receiver pulling from the prefill instance
// a request named (its DP group, or AutoDP).
func (r *Rank) newReceiver(room uint64, prefill string, dp *int) (*receiver.Receiver, error) {
	group := kvmanager.AutoDP
	if dp != nil {
		group = *dp
	}
	return receiver.NewFor(r.D, room, prefill, group)
}

func (r *Rank) recv(ctx context.Context, rr RoomRequest) RoomResult {
	res := RoomResult{Room: rr.Room, PhasesMS: map[string]float64{}}
	start := time.Now()
	mark := phases(res.PhasesMS, start)
	n := (rr.Tokens + r.Model.PageTokens - 1) / r.Model.PageTokens
	// The room first, then its pages: creating it may wait for its prefill
	// instance's topology (up to the bootstrap deadline, while the instance
	// has no record: after a kill, or a close before its successor is
	// registered), holding no pages meanwhile (a fault hunt found rooms
	// posted after a prefill rank closed starving the others of pages).
	rc, err := r.newReceiver(rr.Room, rr.Prefill, rr.PrefillDP)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	dst, err := r.getPages(ctx, n)
	if err != nil {
		rc.Clear() // never initialised: nothing was asked for
		res.Error = err.Error()
		return res
	}
	mark("pages")
	quarantined := false
	defer func() {
		if !quarantined {
			r.pages.Put(dst)
		}
	}()
	defer rc.Clear()
	if err := rc.Init(ctx, kvmanager.RequestSpec{DstPages: dst, AuxIndex: int(rr.Room % 4096)}); err != nil {
		res.Status, res.Reason = kvmanager.Failed.String(), err.Error()
		// A REQUEST may be out to some prefill ranks: the pages wait for
		// Released as any failed room's do.
		if rc.Poll() != kvmanager.Failed {
			rc.Abort("demo: " + err.Error())
		}
		quarantined = r.quarantine(ctx, rc, dst, &res)
		return res
	}
	abortAt(ctx, rc, rr.AbortAt, "demo: abort")
	st, err := rc.Wait(ctx)
	mark("transfer")
	res.LatencyMS = float64(time.Since(start).Microseconds()) / 1e3
	res.Status, res.Reason = st.String(), rc.Failure()
	if err != nil && res.Reason == "" {
		res.Reason = err.Error()
	}
	if rr.AbortAt == "after" {
		rc.Abort("demo: abort after success") // must change nothing
		if p := rc.Poll(); p != st {
			res.Error = fmt.Sprintf("abort after %v changed the room to %v", st, p)
		}
	}
	if st == kvmanager.Success {
		pb := int(r.pageBytes())
		instance := rr.PrefillInstance
		if instance == "" {
			instance = "prefill"
		}
		seed := kvmodel.InstanceSeed(instance)
		first, heads, _ := r.Mapping.Heads(r.Par.TPSize, r.Par.TPRank)
		layer0, _ := r.Mapping.StageLayers(r.Par.PPSize, r.Par.PPRank)
		for region, mem := range r.kv {
			for pos, pg := range dst {
				if kvmodel.CheckHeads(mem[int(pg)*pb:(int(pg)+1)*pb], r.Mapping, first, heads, seed, rr.Room, pos, layer0*transfer.RegionsPerLayer+region, rr.Tokens) {
					res.PagesVerified++
				} else {
					res.Corrupt++
				}
			}
		}
		res.Bytes = uint64(n) * r.pageBytes() * uint64(len(r.kv))
		mark("verify")
	} else {
		quarantined = r.quarantine(ctx, rc, dst, &res)
	}
	return res
}

// quarantine waits until no write of a failed room can land, so its pages
// are reused only then. Past the request's deadline they go back to the
// pool when the rank releases them (bounded by its quarantine deadline),
// and it reports true: the caller must not put them back.
func (r *Rank) quarantine(ctx context.Context, rc *receiver.Receiver, dst []uint32, res *RoomResult) bool {
	ch := rc.Released()
	select {
	case <-ch:
		return false
	case <-ctx.Done():
		res.Error = "pages still quarantined at the request's deadline"
		go func() {
			<-ch
			r.pages.Put(dst)
		}()
		return true
	}
}

func cfgIdentity(m *kvmanager.Manager) bool { return m.Config().RankIdentity != nil }
