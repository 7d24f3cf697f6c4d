package ucx

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/leakcheck"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/stretchr/testify/require"
)

// The engine's tests drive it through internal/nixl's agents (this
// package imports nixl, so its tests may) and reach its state through
// Agent.Backend. These helpers are the few of nixl's contract tests they
// need: internal/nixl's own are in its internal test package, which cannot
// import this one.

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }

// engineCase is one engine configuration; engines() lists them in the
// order of internal/nixl's contract (loopback, ucx over shared memory,
// ucx over tcp).
type engineCase struct {
	name string
	cfg  func(name string) nixl.Config
}

var shmUCX = map[string]string{"TLS": "posix,cma,self"}
var tcpUCX = map[string]string{"TLS": "tcp", "NET_DEVICES": "lo", "TCP_TX_SEG_SIZE": "1M", "TCP_RX_SEG_SIZE": "1M"}

func engines() []engineCase {
	return []engineCase{
		{"loopback", func(n string) nixl.Config { return nixl.Config{Name: n, Engine: nixl.EngineLoopback} }},
		{"ucx-shm", func(n string) nixl.Config { return nixl.Config{Name: n, Engine: nixl.EngineUCX, UCX: shmUCX} }},
		{"ucx-tcp", func(n string) nixl.Config { return nixl.Config{Name: n, Engine: nixl.EngineUCX, UCX: tcpUCX} }},
	}
}

var agentSeq atomic.Int64

// pair is an initiator and a target agent; remote is the target's name in
// the initiator once exchange loaded it.
type pair struct {
	ini, tgt *nixl.Agent
	remote   string
}

func open(t testing.TB, ec engineCase, role string) *nixl.Agent {
	t.Helper()
	a, err := nixl.Open(ec.cfg(fmt.Sprintf("%s-%s-%d", ec.name, role, agentSeq.Add(1))))
	require.NoError(t, err, "%s: open", ec.name)
	t.Cleanup(func() { a.Close() })
	return a
}

func newPair(t *testing.T, ec engineCase) pair {
	return pair{ini: open(t, ec, "ini"), tgt: open(t, ec, "tgt")}
}

// exchange loads each agent's metadata into the other.
func exchange(t testing.TB, ini, tgt *nixl.Agent) string {
	t.Helper()
	md, err := tgt.Metadata()
	require.NoError(t, err)
	name, err := ini.LoadRemote(md)
	require.NoError(t, err)
	require.Equal(t, tgt.Name(), name, "LoadRemote returned")
	back, err := ini.Metadata()
	require.NoError(t, err)
	_, err = tgt.LoadRemote(back)
	require.NoError(t, err)
	return name
}

// wait waits for a transfer to reach a final state, bounded by d.
func wait(t testing.TB, a *nixl.Agent, x *nixl.Xfer, d time.Duration) (nixl.XferState, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	st, err := a.Wait(ctx, x)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("transfer still in progress after %v", d)
	}
	return st, err
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
}

// write posts a WRITE of src to the remote's dst (pairwise).
func write(t testing.TB, p pair, src, dst []nixl.Desc, notif []byte) *nixl.Xfer {
	return post(t, p, nixl.Write, src, dst, notif)
}

// read posts a READ into the initiator's registered local from the
// remote's remote (pairwise).
func read(t testing.TB, p pair, local, remote []nixl.Desc) *nixl.Xfer {
	return post(t, p, nixl.Read, local, remote, nil)
}

func post(t testing.TB, p pair, op nixl.Op, local, remote []nixl.Desc, notif []byte) *nixl.Xfer {
	t.Helper()
	l, err := p.ini.PrepLocal(nixl.DRAM, local)
	require.NoError(t, err)
	r, err := p.ini.PrepRemote(p.remote, nixl.DRAM, remote)
	require.NoError(t, err)
	idx := make([]int, len(local))
	for i := range idx {
		idx[i] = i
	}
	x, err := p.ini.NewXfer(op, l, idx, r, idx, notif)
	require.NoError(t, err)
	require.NoError(t, p.ini.Post(x))
	return x
}

// waitNotif polls for one notification, bounded by d.
func waitNotif(t testing.TB, a *nixl.Agent, d time.Duration) nixl.Notif {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ns, err := a.Notifs()
		require.NoError(t, err)
		require.LessOrEqual(t, len(ns), 1, "got notifications, want one: %q", ns)
		if len(ns) == 1 {
			return ns[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no notification within %v", d)
		}
		time.Sleep(20 * time.Microsecond)
	}
}
