// Command router is an example OpenAI-style router in front of example
// prefill and decode ranks run with -compute tinyllm, speaking kvbridge's
// per-rank wire, SGLang's or vLLM's (-wire): POST /v1/completions
// ({"prompt": "text" or [ids], "max_tokens": n, "stream": bool}), GET
// /metrics (TTFT, time per output token), /healthz, /v1/instances. Each
// -prefill and -decode flag is one instance: its ranks' HTTP URLs,
// comma-separated. The ranks' bearer token comes from the deployment's
// shared secret (KVBRIDGE_SECRET or KVBRIDGE_SECRET_FILE), or -insecure.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvbridge/kvbridge/examples/internal/cli"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/examples/internal/router"
)

type list [][]string

func (l *list) String() string { return fmt.Sprint(*l) }
func (l *list) Set(v string) error {
	var urls []string
	for _, u := range strings.Split(v, ",") {
		if u = strings.TrimSpace(u); u != "" {
			if !strings.Contains(u, "://") {
				u = "http://" + u
			}
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		return errors.New("no URL")
	}
	*l = append(*l, urls)
	return nil
}

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	var prefill, decode list
	fs.Var(&prefill, "prefill", "a prefill instance: its ranks' HTTP URLs, comma-separated (repeat per instance)")
	fs.Var(&decode, "decode", "a decode instance: its ranks' HTTP URLs, comma-separated (repeat per instance)")
	listen := fs.String("listen", "127.0.0.1:8000", "HTTP address")
	policy := fs.String("policy", "round-robin", "instance choice per request: round-robin or least-loaded")
	retries := fs.Int("retries", 2, "attempts after the first for a room that failed before its first token (−1: none)")
	timeout := fs.Duration("timeout", 60*time.Second, "one attempt's bound")
	insecure := fs.Bool("insecure", false, "the ranks run without a shared secret")
	wire := fs.String("wire", "kvbridge", "how a pair is driven: kvbridge (every rank's per-rank routes), sglang (SGLang's router: bootstrap_host/port/room to both fronts at once), vllm (vLLM's serial kv_transfer_params flow), push (vLLM push: serial once per prefill instance to learn its identity, then both fronts at once with a transfer_id), mooncake (vLLM's MooncakeConnector wire: GET /query, then both fronts at once with a transfer_id) or offloading (vLLM's OffloadingConnector P2P wire); with the OpenAI wires an instance may be listed by its front alone")
	multiTurn := fs.Bool("multi-turn", false, "with -wire vllm or push: multi-turn reuse — a decode answer's kv_transfer_params kept and replayed onto the prefill leg of the next request whose prompt extends the conversation (the ranks need -reuse-pages)")
	if code, ok := cli.Parse(fs, args); !ok {
		return code
	}
	auth, envInsecure, err := bootstrap.AuthFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		return 2
	}
	cfg := router.Config{Prefill: prefill, Decode: decode, Policy: *policy, Retries: *retries, Timeout: *timeout, Wire: *wire, MultiTurn: *multiTurn}
	if auth != nil {
		cfg.Token = auth.BootstrapToken()
	} else if !*insecure && !envInsecure {
		fmt.Fprintln(os.Stderr, "router:", bootstrap.ErrNoSecret)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	rt, err := router.New(ctx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		return 1
	}
	srv := &http.Server{Handler: rt.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	fmt.Printf("router ready http=%s prefill=%d decode=%d policy=%s wire=%s\n", ln.Addr(), len(rt.Prefills()), len(rt.Decodes()), *policy, *wire)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
	return 0
}
