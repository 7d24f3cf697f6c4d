package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/kvbridge/kvbridge/internal/rankhooks"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/stretchr/testify/require"
)

// The test binary re-executes itself as a prefill or a decode rank process
// (KVBRIDGE_E2E_ROLE), driven by lines on stdin and answering on stdout:
//
//	prefill: SEND <room> <src pages> <chunk>   → DONE <room> <status> <reason>
//	         HOLD <room> <src pages> <chunk>   (first chunk only) → HELD <room>, then DONE ...
//	decode:  RECV <room> <dst pages> <src pages> → DONE <room> <status> <verified | reason>
//	         ABORT <room>                        (the RECV's DONE follows)
//
// Pages are comma-separated. Prefill memory holds the deterministic pattern
// of fillPage, so the decode process verifies every page on its own.

func init() {
	if role := os.Getenv("KVBRIDGE_E2E_ROLE"); role != "" {
		os.Exit(runRank(role))
	}
}

func rankConfig(role kvmanager.Role, engine, boot string) kvmanager.Config {
	cfg := kvmanager.DefaultConfig(role)
	cfg.Auth = testauth.Auth()
	cfg.Instance = "proc"
	if v := os.Getenv("KVBRIDGE_E2E_INSTANCE"); v != "" {
		cfg.Instance = v // another decode instance (its certificate names it)
	}
	cfg.Compat = "v1:test-layout"
	cfg.BootstrapURL = boot
	cfg.Engine = engines[engine]
	cfg.Layout = layout()
	cfg.HeartbeatInterval = 200 * time.Millisecond
	cfg.MaxMisses = 2
	cfg.SweepInterval = 50 * time.Millisecond
	cfg.Registry.StallTimeout = 10 * time.Second
	// Per-rank identity when the test hands the process a certificate
	// (KVBRIDGE_CA_FILE, KVBRIDGE_IDENTITY_FILE), and a fixed endpoint for
	// a restart in place.
	if id, err := bootstrap.IdentityFromEnv(); err != nil {
		panic(err)
	} else if id != nil {
		cfg.RankIdentity = id
	}
	if v := os.Getenv("KVBRIDGE_E2E_BIND"); v != "" {
		cfg.Bind = v
	}
	if v, err := strconv.Atoi(os.Getenv("KVBRIDGE_E2E_MAX_TOMBSTONES")); err == nil {
		cfg.Registry.MaxTombstones = v // a bound a test's flood reaches
	}
	if v := os.Getenv("KVBRIDGE_E2E_AGENT"); v != "" {
		cfg.Engine.Name = v // a custom agent name (first come, first served)
	}
	// A test may give a rank the default heartbeat (5 s), or turn its
	// REQUEST probes off (ProbeIdle -1) to show what they prevent.
	for _, d := range []struct {
		env string
		dst *time.Duration
	}{{"KVBRIDGE_E2E_HEARTBEAT", &cfg.HeartbeatInterval}, {"KVBRIDGE_E2E_PROBE_IDLE", &cfg.ProbeIdle},
		{"KVBRIDGE_E2E_STALL", &cfg.Registry.StallTimeout}, {"KVBRIDGE_E2E_QUARANTINE", &cfg.QuarantineTimeout}, {"KVBRIDGE_E2E_PULL_LEASE", &cfg.PullLease}} {
		if v := os.Getenv(d.env); v != "" {
			if x, err := time.ParseDuration(v); err == nil {
				*d.dst = x
			}
		}
	}
	if strings.HasPrefix(boot, "etcd://") {
		cfg.Etcd.LeaseTTL = 2 * time.Second
	}
	// KVBRIDGE_E2E_PULL=1: a decode rank reads its rooms (pull), and each
	// rank says RELEASED <room> <forced releases so far> once a room's
	// pages may be reused.
	cfg.Pull = role == kvmanager.RoleDecode && os.Getenv("KVBRIDGE_E2E_PULL") == "1"
	return cfg
}

// newRank starts a prefill or a decode Manager; m is its Manager, p or d
// its shell.
func newRank(r kvmanager.Role, cfg kvmanager.Config) (m *kvmanager.Manager, p *kvmanager.Prefill, d *kvmanager.Decode, err error) {
	metered(&cfg)
	if r == kvmanager.RolePrefill {
		if p, err = kvmanager.NewPrefill(cfg); err == nil {
			m = p.Manager
		}
		return m, p, d, err
	}
	if d, err = kvmanager.NewDecode(cfg); err == nil {
		m = d.Manager
	}
	return m, p, d, err
}

// challengeTimeoutEnv is KVBRIDGE_E2E_CHALLENGE_TIMEOUT: a forged-identity
// test's ranks bound a challenge's echo by it (rankhooks.ChallengeTimeout)
// rather than wait the 5 s out once per forgery. Unset: the default.
func challengeTimeoutEnv() time.Duration {
	d, _ := time.ParseDuration(os.Getenv("KVBRIDGE_E2E_CHALLENGE_TIMEOUT"))
	return d
}

func pageList(s string) []uint32 {
	var out []uint32
	for _, f := range strings.Split(s, ",") {
		v, _ := strconv.ParseUint(f, 10, 32)
		out = append(out, uint32(v))
	}
	return out
}

func runRank(role string) int {
	r := kvmanager.RolePrefill
	if role == "decode" {
		r = kvmanager.RoleDecode
	}
	cfg := rankConfig(r, os.Getenv("KVBRIDGE_E2E_ENGINE"), os.Getenv("KVBRIDGE_E2E_BOOT"))
	// The first message of each type, as it came off the wire (CAPTURE).
	// A test's marker ("MARK", nonce) tells it that every message before
	// it on its connection has been handled (MARKED): the tap runs before
	// each message's handling, one message after the other.
	var tapMu sync.Mutex
	tapped := map[string][][]byte{}
	marks := map[string]chan struct{}{}
	mark := func(nonce string) chan struct{} {
		if marks[nonce] == nil {
			marks[nonce] = make(chan struct{})
		}
		return marks[nonce]
	}
	rankhooks.Set(&cfg, rankhooks.Hooks{ControlTap: func(frames [][]byte) {
		if len(frames) < 2 {
			return
		}
		tapMu.Lock()
		if string(frames[0]) == "MARK" {
			close(mark(string(frames[1])))
		}
		if _, ok := tapped[string(frames[1])]; !ok {
			c := make([][]byte, len(frames))
			for i, f := range frames {
				c[i] = append([]byte(nil), f...)
			}
			tapped[string(frames[1])] = c
		}
		tapMu.Unlock()
	}, ChallengeTimeout: challengeTimeoutEnv()})
	m, p, d, err := newRank(r, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer m.Close()
	kv, _ := m.Memory()
	if r == kvmanager.RolePrefill {
		for region := range kv {
			for p := 0; p < pages; p++ {
				fillPage(kv[region][p*pageBytes:(p+1)*pageBytes], uint64(region)<<32|uint64(p))
			}
		}
	}
	out := make(chan string, 64)
	go func() {
		for l := range out {
			fmt.Println(l)
		}
	}()
	fmt.Printf("READY %s %d\n", m.Endpoint(), m.Epoch())
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		f := strings.Fields(in.Text())
		room, _ := strconv.ParseUint(f[1], 10, 64) // (CAPTURE: a type)
		switch f[0] {
		case "SEND", "HOLD", "SEND+": // SEND+: also SENDING <room> once the room is past Bootstrapping (its REQUEST is in)
			src := pageList(f[2])
			chunk, _ := strconv.Atoi(f[3])
			announce := f[0] == "SEND+"
			go func(hold bool) {
				s, err := sender.New(p, room)
				if err != nil {
					out <- fmt.Sprintf("DONE %d error %v", room, err)
					return
				}
				s.Init()
				for s.Poll() == kvmanager.Bootstrapping {
					time.Sleep(100 * time.Microsecond)
				}
				if announce {
					out <- fmt.Sprintf("SENDING %d", room)
				}
				for i := 0; i < len(src); i += chunk {
					end := min(i+chunk, len(src))
					if err := s.Send(src[i:end], end == len(src), -1); err != nil {
						break
					}
					if hold {
						// Held once the first chunk has landed: the room
						// is Transferring with nothing in flight.
						for s.Poll() != kvmanager.Transferring || m.InFlight(room) != 0 {
							time.Sleep(100 * time.Microsecond)
						}
						out <- fmt.Sprintf("HELD %d", room)
						break
					}
				}
				st, _ := s.Wait(context.Background())
				out <- fmt.Sprintf("DONE %d %v %s", room, st, strings.ReplaceAll(s.Failure(), " ", "_"))
				if os.Getenv("KVBRIDGE_E2E_PULL") == "1" {
					<-s.Released()
					out <- fmt.Sprintf("RELEASED %d %d", room, counter(m, "kvbridge_quarantine_expired_total"))
				}
			}(f[0] == "HOLD")
		case "ABORT":
			d.Abort(room, "aborted by the test")
		case "ALIGNED": // ALIGNED <region> → ALIGNED <a page ≥ 8 of it that starts an OS page> <pages an OS page>
			first, per := aroundOSPage(kv[room])
			out <- fmt.Sprintf("ALIGNED %d %d", first, per)
		case "PROTECT", "UNPROTECT": // PROTECT <region> <page> <n> → PROTECTED <err>: pages [page, page+n) read-only (UNPROTECT: writable again)
			first, _ := strconv.Atoi(f[2])
			n, _ := strconv.Atoi(f[3])
			prot := syscall.PROT_READ
			if f[0] == "UNPROTECT" {
				prot |= syscall.PROT_WRITE
			}
			out <- fmt.Sprintf("%sED %v", f[0], syscall.Mprotect(kv[room][first*pageBytes:(first+n)*pageBytes], prot))
		case "CAPTURE": // CAPTURE <type> → CAPTURED <the first such message received, frames as JSON>
			tapMu.Lock()
			b, _ := json.Marshal(tapped[f[1]])
			tapMu.Unlock()
			out <- "CAPTURED " + string(b)
		case "MARKED": // MARKED <nonce> → MARKED <nonce> once the marker came in
			tapMu.Lock()
			c := mark(f[1])
			tapMu.Unlock()
			go func(nonce string) {
				select {
				case <-c:
					out <- "MARKED " + nonce
				case <-time.After(30 * time.Second):
					out <- "NOMARK " + nonce
				}
			}(f[1])
		case "MEMORY": // MEMORY 0 → MEMORY <what an attacker on this host learns of this rank's memory, as JSON>
			b, _ := json.Marshal(memoryOf(m))
			out <- "MEMORY " + string(b)
		case "SUM": // SUM 0 → SUM <SHA-256 of every byte of this rank's KV, aux and state memory>
			h := sha256.New()
			kv, aux := m.Memory()
			for _, r := range append(append(kv, aux), m.StateMemory()...) {
				h.Write(r)
			}
			out <- fmt.Sprintf("SUM %x", h.Sum(nil))
		case "COUNTER": // COUNTER 0 <metric> [<label> <value>]... → COUNTER <its value, summed over the series those labels select>
			out <- fmt.Sprintf("COUNTER %d", counter(m, f[2], f[3:]...))
		case "STATS": // STATS 0 → STATS <control-plane counters as JSON>
			b, _ := json.Marshal(controlStats(m))
			out <- "STATS " + string(b)
		case "CLOSE": // CLOSE 0: the application closes its rank (as on SIGTERM) and the process goes on, until stdin closes
			out <- fmt.Sprintf("CLOSED %v", m.Close())
		case "RECV", "RECV+": // RECV+: also REQUESTED <room> once Init returned (the room's REQUEST is out)
			dst, src := pageList(f[2]), pageList(f[3])
			announce := f[0] == "RECV+"
			go func() {
				rc, err := receiver.New(d, room)
				if err == nil {
					err = rc.Init(context.Background(), kvmanager.RequestSpec{DstPages: dst, AuxIndex: -1})
					if err == nil && announce {
						out <- fmt.Sprintf("REQUESTED %d", room)
					}
					if errors.Is(err, kvmanager.ErrRoomFailed) {
						err = nil // the room failed before or during Init (an ABORT came first): Wait reports it
					}
				}
				if err != nil {
					out <- fmt.Sprintf("DONE %d error %v", room, err)
					return
				}
				st, _ := rc.Wait(context.Background())
				note := strings.ReplaceAll(rc.Failure(), " ", "_")
				if st == kvmanager.Success {
					note = "verified"
					want := make([]byte, pageBytes)
					for region := range kv {
						for i := range dst {
							fillPage(want, uint64(region)<<32|uint64(src[i]))
							if string(kv[region][dst[i]*pageBytes:(dst[i]+1)*pageBytes]) != string(want) {
								note = fmt.Sprintf("page_%d_of_region_%d_differs", i, region)
							}
						}
					}
				}
				out <- fmt.Sprintf("DONE %d %v %s", room, st, note)
				if os.Getenv("KVBRIDGE_E2E_PULL") == "1" {
					<-rc.Released()
					out <- fmt.Sprintf("RELEASED %d %d", room, counter(m, "kvbridge_quarantine_expired_total"))
				}
			}()
		}
	}
	return 0
}

type rankProc struct {
	ready string // "READY <endpoint> <epoch>" (the topology ranks: "READY")
	cmd   *exec.Cmd
	in    *bufio.Writer
	lines chan string
}

func startRank(t *testing.T, role, engine, boot string) *rankProc {
	t.Helper()
	return startChild(t, "KVBRIDGE_E2E_ROLE="+role, "KVBRIDGE_E2E_ENGINE="+engine, "KVBRIDGE_E2E_BOOT="+boot)
}

// startChild runs the test binary as a rank process with env added, and
// waits for its READY.
func startChild(t *testing.T, env ...string) *rankProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "GOTRACEBACK=all"), env...)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	require.NoError(t, cmd.Start())
	p := &rankProc{cmd: cmd, in: bufio.NewWriter(stdin), lines: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	p.ready = p.expect(t, "READY")
	return p
}

func (p *rankProc) do(cmd string) {
	fmt.Fprintln(p.in, cmd)
	p.in.Flush()
}

func (p *rankProc) expect(t *testing.T, prefix string) string {
	t.Helper()
	l, ok, timedOut := p.next(30 * time.Second)
	if timedOut {
		t.Fatalf("no %s within 30 s; %s", prefix, p.dump())
	}
	require.True(t, ok, "got %q, want %s... (the process's stdout closed)", l, prefix)
	require.True(t, strings.HasPrefix(l, prefix), "got %q, want %s...", l, prefix)
	return l
}

// next is the process's next line; ok is false once its stdout closed,
// timedOut when nothing came within d.
func (p *rankProc) next(d time.Duration) (l string, ok, timedOut bool) {
	select {
	case l, ok = <-p.lines:
		return l, ok, false
	case <-time.After(d):
		return "", false, true
	}
}

// dump ends a process that did not answer in time with SIGQUIT: its
// goroutines' stacks (GOTRACEBACK=all) go to the test's log, where the
// cause of a rare hang can be read. It returns the lines the process
// printed meanwhile.
func (p *rankProc) dump() string {
	if err := p.cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		return "SIGQUIT: " + err.Error()
	}
	var late []string
	deadline := time.After(10 * time.Second)
	for {
		select {
		case l, ok := <-p.lines: // stdout closes once the process is gone
			if !ok {
				return fmt.Sprintf("SIGQUIT sent (its goroutines are in the log above); it printed meanwhile: %q", late)
			}
			late = append(late, l)
		case <-deadline:
			return fmt.Sprintf("SIGQUIT sent, the process had not exited 10 s later; it printed meanwhile: %q", late)
		}
	}
}

func csv(p []uint32) string {
	s := make([]string, len(p))
	for i, v := range p {
		s[i] = strconv.FormatUint(uint64(v), 10)
	}
	return strings.Join(s, ",")
}

func startBoot(t *testing.T) string {
	srv := testauth.Server()
	require.NoError(t, srv.Start("127.0.0.1:0"))
	t.Cleanup(func() { srv.Close(context.Background()) })
	return srv.URL()
}

func TestSeparateProcesses(t *testing.T) {
	t.Parallel() // its own processes and ports
	for _, engine := range []string{"ucx-shm", "ucx-tcp", "libnixl-real"} {
		t.Run(engine, func(t *testing.T) {
			if engine == "libnixl-real" {
				needRealNIXL(t)
			}
			boot := startBoot(t)
			prefill := startRank(t, "prefill", engine, boot)
			decode := startRank(t, "decode", engine, boot)
			pp, dp := newPagePool(pages), newPagePool(pages)
			for i, tokens := range []int{1, 128, 2048, 8192} {
				pdRoomOf(t, prefill, decode, uint64(i+1), (tokens+pageToks-1)/pageToks, 64, pp, dp)
			}
		})
	}
}

// bound is how long a killed peer may take to be noticed: the heartbeat
// bound interval × (misses + 1) plus a sweep and scheduling slack.
const bound = 200*time.Millisecond*3 + 2*time.Second

func TestDecodeKilledMidTransfer(t *testing.T) {
	t.Parallel() // its own processes and ports
	boot := startBoot(t)
	prefill := startRank(t, "prefill", "ucx-tcp", boot)
	decode := startRank(t, "decode", "ucx-tcp", boot)
	src, dst := newPagePool(pages).Get(256), newPagePool(pages).Get(256)
	decode.do(fmt.Sprintf("RECV 7 %s %s", csv(dst), csv(src)))
	prefill.do(fmt.Sprintf("HOLD 7 %s 16", csv(src)))
	prefill.expect(t, "HELD 7")
	killed := time.Now()
	decode.cmd.Process.Signal(syscall.SIGKILL)
	got := prefill.expect(t, "DONE 7")
	took := time.Since(killed)
	t.Logf("prefill failed the room %v after the decode process was killed: %s", took, got)
	// Heartbeats report the dead peer; a write racing the kill may fail
	// first, naming the peer.
	require.True(t, strings.HasPrefix(got, "DONE 7 Failed"), "prefill: %s", got)
	require.True(t, strings.Contains(got, "peer_unreachable") || strings.Contains(got, "proc-decode-0"), "prefill: %s", got)
	require.LessOrEqual(t, took, bound, "took, bound")
}

func TestPrefillKilledMidTransfer(t *testing.T) {
	t.Parallel() // its own processes and ports
	boot := startBoot(t)
	prefill := startRank(t, "prefill", "ucx-tcp", boot)
	decode := startRank(t, "decode", "ucx-tcp", boot)
	src, dst := newPagePool(pages).Get(256), newPagePool(pages).Get(256)
	decode.do(fmt.Sprintf("RECV 8 %s %s", csv(dst), csv(src)))
	prefill.do(fmt.Sprintf("HOLD 8 %s 16", csv(src)))
	prefill.expect(t, "HELD 8")
	killed := time.Now()
	prefill.cmd.Process.Signal(syscall.SIGKILL)
	got := decode.expect(t, "DONE 8")
	took := time.Since(killed)
	t.Logf("decode failed the room %v after the prefill process was killed: %s", took, got)
	require.True(t, strings.HasPrefix(got, "DONE 8 Failed prefill_peer_unreachable"), "decode: %s", got)
	require.LessOrEqual(t, took, bound, "took, bound")
}
