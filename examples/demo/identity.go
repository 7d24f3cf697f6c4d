package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/transfer"
)

// Per-rank identity in the demo: it plays the operator, making a CA at
// start and issuing each rank process its own certificate and key (a file
// per process, 0600) for the identity its flags give it. The CA's private
// key stays in this process.
var (
	ca                 *bootstrap.CA
	caFile, identities string
	// issued numbers the identity files: the ranks of an instance start in
	// parallel (a plain int here gave two of them one file, and a rank
	// another's certificate: TestDemoTopologies/TP_4_to_2 in CI).
	issued atomic.Int64
)

func makeCA() (cleanup func(), err error) {
	if ca, err = bootstrap.NewCA(); err != nil {
		return nil, err
	}
	if identities, err = os.MkdirTemp("", "kvbridge-demo-identity-*"); err != nil {
		return nil, err
	}
	caFile = filepath.Join(identities, "ca")
	if err := os.WriteFile(caFile, ca.Marshal(false), 0o644); err != nil {
		return nil, err
	}
	return func() { os.RemoveAll(identities) }, nil
}

// identityEnv issues the certificate of the rank a prefill or decode
// process's flags describe and returns the environment that hands it over.
func identityEnv(role string, args []string) ([]string, error) {
	id, err := issueFor(role, args)
	if err != nil {
		return nil, err
	}
	f := filepath.Join(identities, fmt.Sprintf("%s-%d", role, issued.Add(1)))
	if err := os.WriteFile(f, id.Marshal(), 0o600); err != nil {
		return nil, err
	}
	return []string{"KVBRIDGE_CA_FILE" + "=" + caFile, "KVBRIDGE_IDENTITY_FILE" + "=" + f}, nil
}

// issueFor reads -instance, -tp, -tp-rank, -pp, -pp-rank, -dp, -dp-rank
// from a rank's flags (rankcmd's defaults otherwise) and issues its
// certificate for a day.
func issueFor(role string, args []string) (bootstrap.RankIdentity, error) {
	vals := map[string]string{}
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		switch name {
		case "instance", "tp", "tp-rank", "pp", "pp-rank", "dp", "dp-rank":
			if !hasVal && i+1 < len(args) {
				val, i = args[i+1], i+1
			}
			vals[name] = val
		}
	}
	num := func(k string, def int) int {
		if v, ok := vals[k]; ok {
			n, err := strconv.Atoi(v)
			if err == nil {
				return n
			}
		}
		return def
	}
	instance := role
	if v, ok := vals["instance"]; ok {
		instance = v
	}
	par := transfer.Parallel{TPSize: num("tp", 1), TPRank: num("tp-rank", 0), PPSize: num("pp", 1), PPRank: num("pp-rank", 0),
		DPSize: num("dp", 1), DPRank: num("dp-rank", 0)}
	return ca.Issue(role, instance, par.Global(), time.Now().Add(24*time.Hour))
}
