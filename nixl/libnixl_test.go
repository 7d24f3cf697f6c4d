package nixl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kvbridge/kvbridge/internal/nixldouble"
)

// These tests drive the real libnixl binding (loading, marshalling, handles,
// error mapping) against the C test double of the NIXL C API; they inject
// failures and read the double's counters, so they skip when the process
// runs a real NIXL (KVBRIDGE_NIXL_LIB) instead.

func needDouble(t *testing.T) {
	t.Helper()
	if s := skipDouble(); s != "" {
		t.Skip(s)
	}
}

// onNIXL runs body on the NIXL this process has — the real one when
// KVBRIDGE_NIXL_LIB names it (make test-nixl), else the double — as a
// subtest named libnixl-real or libnixl-double.
func onNIXL(t *testing.T, body func(t *testing.T, lib string)) {
	name, lib := "libnixl-double", doubleLib()
	if realNIXL() != "" {
		name, lib = "libnixl-real", realNIXL()
	}
	t.Run(name, func(t *testing.T) { body(t, lib) })
}

// nixlPairOn is libnixlPairModes on lib (the double or a real NIXL).
func nixlPairOn(t *testing.T, lib string, timeout time.Duration, ini, tgt NIXLProgress) (pair, []byte, []byte) {
	t.Helper()
	mk := func(role string, mode NIXLProgress) *Agent {
		a, err := Open(Config{Name: fmt.Sprintf("nx-%s-%s-%d", role, t.Name(), agentSeq.Add(1)), Engine: EngineLibNIXL, NIXLLib: lib,
			XferTimeout: timeout, NIXLProgress: mode})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	p := pair{ini: mk("ini", ini), tgt: mk("tgt", tgt)}
	_, src, _ := p.ini.Alloc(1 << 16)
	_, dst, _ := p.tgt.Alloc(1 << 16)
	p.remote = exchange(t, p.ini, p.tgt)
	return p, src, dst
}

func libnixlPair(t *testing.T, timeout time.Duration) (pair, []byte, []byte) {
	t.Helper()
	return libnixlPairModes(t, timeout, NIXLProgressCaller, NIXLProgressThread)
}

// libnixlPairModes is libnixlPair with the agents' progress modes: the
// initiator posts (a prefill rank's mode is NIXLProgressCaller), the
// target is written to (a decode rank's, NIXLProgressThread).
func libnixlPairModes(t *testing.T, timeout time.Duration, ini, tgt NIXLProgress) (pair, []byte, []byte) {
	t.Helper()
	needDouble(t)
	return nixlPairOn(t, doubleLib(), timeout, ini, tgt)
}

func TestLibNIXLInjectedErrors(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_post_xfer_req")
	l, _ := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src)})
	r, _ := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)})
	x, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, []byte("n"))
	if err != nil {
		t.Fatal(err)
	}
	err = p.ini.Post(x)
	var ne *NIXLError
	if !errors.As(err, &ne) || ne.Status != -2 || ne.Call != "nixl_capi_post_xfer_req" || !errors.Is(err, ErrTransfer) {
		t.Fatalf("post with an injected backend error: %v", err)
	}
	// Issue 22: the remote is fenced until its metadata loads again.
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	if err := p.ini.Post(x); !errors.Is(err, ErrTransfer) || errors.As(err, &ne) || !strings.Contains(err.Error(), p.remote) ||
		p.ini.PostsFenced() != 1 {
		t.Fatalf("post after a failed one: %v (%d fenced)", err, p.ini.PostsFenced())
	}
	p.ini.Release(x)
	reload := func() {
		t.Helper()
		md, err := p.tgt.Metadata()
		if err == nil {
			_, err = p.ini.LoadRemote(md)
		}
		if err != nil {
			t.Fatal(err)
		}
		l, _ = p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src)})
		r, _ = p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)})
		if x, err = p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, []byte("n")); err != nil {
			t.Fatal(err)
		}
	}
	reload()
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_get_xfer_status")
	if err := p.ini.Post(x); err != nil {
		t.Fatal(err)
	}
	if st, err := wait(t, p.ini, x, time.Minute); st != Failed || !errors.As(err, &ne) || ne.Call != "nixl_capi_get_xfer_status" {
		t.Fatalf("status with an injected error: %v %v", st, err)
	}
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	if err := p.ini.Post(x); !errors.Is(err, ErrTransfer) || p.ini.PostsFenced() != 2 {
		t.Fatalf("post after a failed status: %v (%d fenced)", err, p.ini.PostsFenced())
	}
	p.ini.Release(x)
	reload()
	p.ini.Release(x)

	for fn, call := range map[string]func() error{
		"nixl_capi_register_mem":    func() error { _, _, err := p.ini.Alloc(64); return err },
		"nixl_capi_get_local_md":    func() error { _, err := p.ini.Metadata(); return err },
		"nixl_capi_prep_xfer_dlist": func() error { _, err := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src)}); return err },
		"nixl_capi_gen_notif":       func() error { return p.ini.GenNotif(p.remote, []byte("x")) },
		"nixl_capi_get_notifs":      func() error { _, err := p.tgt.Notifs(); return err },
		"nixl_capi_make_xfer_req": func() error {
			_, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
			return postNew(p.ini, l, r, err)
		},
		"nixl_capi_create_configured_agent": func() error {
			_, err := Open(Config{Name: "nx-never", Engine: EngineLibNIXL, NIXLLib: doubleLib()})
			return err
		},
		"nixl_capi_create_backend": func() error {
			_, err := Open(Config{Name: "nx-never2", Engine: EngineLibNIXL, NIXLLib: doubleLib()})
			return err
		},
		"nixl_capi_get_plugin_params": func() error {
			_, err := Open(Config{Name: "nx-never3", Engine: EngineLibNIXL, NIXLLib: doubleLib()})
			return err
		},
	} {
		t.Setenv("KVB_NIXL_DOUBLE_FAIL", fn)
		err := call()
		os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
		if !errors.As(err, &ne) || ne.Call[:len(fn)] != fn {
			t.Errorf("%s: want a NIXLError naming the call, got %v", fn, err)
		}
	}
	// Last: a load NIXL refuses drops the remote on kvbridge's side too
	// (issue 22: NIXL may have dropped its section), until a load succeeds.
	md, _ := p.tgt.Metadata()
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_load_remote_md")
	_, err = p.ini.LoadRemote(md)
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	if !errors.As(err, &ne) || ne.Call != "nixl_capi_load_remote_md" || !errors.Is(err, ErrBadMetadata) {
		t.Errorf("nixl_capi_load_remote_md: want a NIXLError naming the call, got %v", err)
	}
	if _, err := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)}); !errors.Is(err, ErrRemoteUnknown) {
		t.Errorf("prep after a refused load: %v, want ErrRemoteUnknown", err)
	}
	if _, err := p.ini.LoadRemote(md); err != nil {
		t.Errorf("the same blob again: %v", err)
	}
}

// postNew builds and posts a transfer from prepared lists (for injection).
func postNew(a *Agent, l, r *Prepped, err error) error {
	if err != nil {
		return err
	}
	x, err := a.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
	if err != nil {
		return err
	}
	defer a.Release(x)
	return a.Post(x)
}

func TestLibNIXLAsyncAndDeadline(t *testing.T) {
	p, src, dst := libnixlPair(t, 200*time.Millisecond)
	fill(src, 11)
	t.Setenv("KVB_NIXL_DOUBLE_ASYNC", "1")
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, []byte("async"))
	if st, err := wait(t, p.ini, x, time.Minute); st != Done || string(waitNotif(t, p.tgt, time.Minute).Msg) != "async" {
		t.Fatalf("async: %v %v", st, err)
	}
	p.ini.Release(x)

	t.Setenv("KVB_NIXL_DOUBLE_ASYNC", "stuck")
	x = write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	st, err := wait(t, p.ini, x, time.Minute)
	if st != Failed || !errors.Is(err, ErrTimeout) {
		t.Fatalf("a stuck transfer: %v %v, want Failed with ErrTimeout", st, err)
	}
}

// NIXL checks no backend parameter names: an unknown one is accepted (the
// double does the same), so a typo is the user's to find in NIXL's log.
func TestLibNIXLBackendParams(t *testing.T) {
	needDouble(t)
	for i, params := range []map[string]string{
		{"ucx_error_handling_mode": "none", "num_workers": "2"},
		{"bogus_param": "1"},
	} {
		a, err := Open(Config{Name: fmt.Sprintf("nx-params%d", i), Engine: EngineLibNIXL, NIXLLib: doubleLib(), BackendParams: params})
		if err != nil {
			t.Fatalf("%v: %v", params, err)
		}
		a.Close()
	}
}

// An agent's progress mode (issue 22): by default NIXL's progress thread
// and read-write lock (what an agent that is written to needs); with
// NIXLProgressCaller no thread and NIXL's strict lock (a posting agent on
// NIXL <= 1.4.0, whose thread frees an endpoint under a concurrent post
// when a peer dies); the thread's delay set either way
// (nixl_capi_create_agent gives no locking and a thread that spins a
// core); an unknown mode refused.
func TestLibNIXLAgentConfig(t *testing.T) {
	needDouble(t)
	for _, c := range []struct {
		delay, want time.Duration
		mode        NIXLProgress
		prog        bool
		sync        int
	}{
		{0, DefaultNIXLProgressDelay, 0, true, nixldouble.SyncRW},
		{0, DefaultNIXLProgressDelay, NIXLProgressThread, true, nixldouble.SyncRW},
		{5 * time.Millisecond, 5 * time.Millisecond, NIXLProgressCaller, false, nixldouble.SyncStrict},
		{0, DefaultNIXLProgressDelay, NIXLProgressCaller, false, nixldouble.SyncStrict},
	} {
		name := fmt.Sprintf("nx-config-%v-%v", c.delay, c.mode)
		a, err := Open(Config{Name: name, Engine: EngineLibNIXL, NIXLLib: doubleLib(), NIXLProgressDelay: c.delay, NIXLProgress: c.mode})
		if err != nil {
			t.Fatal(err)
		}
		sync, delay, err := nixldouble.AgentConfig(doubleLib(), a.Name())
		prog, perr := nixldouble.AgentProgressThread(doubleLib(), a.Name())
		a.Close()
		if err != nil || perr != nil {
			t.Fatal(err, perr)
		}
		if sync != c.sync || delay != c.want || prog != c.prog {
			t.Errorf("%s: agent made with thread sync %d, progress thread %v, delay %v; want %d, %v, %v", name, sync, prog, delay, c.sync, c.prog, c.want)
		}
	}
	if _, err := Open(Config{Name: "nx-config-bad", Engine: EngineLibNIXL, NIXLLib: doubleLib(), NIXLProgress: 7}); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("progress mode 7: %v, want ErrInvalidRequest", err)
	}
}

// Notifications drained on one goroutine while others prepare, post, wait
// and release: no two calls may overlap on an agent NIXL does not lock.
func TestLibNIXLConcurrentCallsAreLocked(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	before, err := nixldouble.Violations(doubleLib())
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var drained sync.WaitGroup
	drained.Add(1)
	go func() {
		defer drained.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := p.ini.Notifs(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				off := (g*200 + i) % 64 * 1024
				l, err := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src[off : off+1024])})
				if err != nil {
					t.Error(err)
					return
				}
				r, err := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst[off : off+1024])})
				if err != nil {
					t.Error(err)
					return
				}
				x, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
				if err == nil {
					err = p.ini.Post(x)
				}
				if err == nil {
					_, err = wait(t, p.ini, x, time.Minute)
				}
				if err != nil {
					t.Error(err)
				}
				p.ini.Release(x)
				l.Release()
				r.Release()
			}
		}()
	}
	wg.Wait()
	close(stop)
	drained.Wait()
	if after, _ := nixldouble.Violations(doubleLib()); after != before {
		t.Fatalf("%d calls overlapped on an agent without thread sync", after-before)
	}
}

// A release NIXL refuses (it could not cancel the transfer) is retried, and
// the request is destroyed once NIXL lets go: nothing leaks.
func TestLibNIXLRefusedReleaseIsRetried(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	live := func() int64 { return liveRequests(t) }
	base := live()
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	if _, err := wait(t, p.ini, x, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_release_xfer_req")
	var ne *NIXLError
	if err := p.ini.Release(x); !errors.As(err, &ne) || ne.Call != "nixl_capi_release_xfer_req" {
		t.Fatalf("refused release: %v", err)
	}
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	if n := live(); n != base+1 {
		t.Fatalf("%d live requests after a refused release, want %d (kept for retry)", n, base+1)
	}
	y := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	wait(t, p.ini, y, time.Minute)
	if err := p.ini.Release(y); err != nil { // also retries x's
		t.Fatal(err)
	}
	if n := live(); n != base {
		t.Fatalf("%d live requests after the retry, want %d", n, base)
	}
}

// Close with transfers in flight releases them before the agent goes; the
// calls that come after never reach NIXL (the double aborts the process on
// a call to a destroyed agent, as real NIXL crashed with SIGSEGV).
func TestLibNIXLCallsAfterClose(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	t.Setenv("KVB_NIXL_DOUBLE_ASYNC", "stuck")
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, []byte("never"))
	base, _ := nixldouble.LiveRequests(doubleLib())
	if err := p.ini.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _ := nixldouble.LiveRequests(doubleLib()); n != base-1 {
		t.Fatalf("%d live requests after Close, want %d", n, base-1)
	}
	if st, err := p.ini.Status(x); st != Failed || !errors.Is(err, ErrClosed) {
		t.Fatalf("status after Close: %v %v", st, err)
	}
	if st, err := wait(t, p.ini, x, time.Minute); st != Failed || !errors.Is(err, ErrClosed) {
		t.Fatalf("wait after Close: %v %v", st, err)
	}
	if err := p.ini.Release(x); err != nil {
		t.Fatalf("release after Close: %v", err)
	}
	if _, err := p.ini.Notifs(); !errors.Is(err, ErrClosed) {
		t.Fatalf("notifs after Close: %v", err)
	}
	if err := p.ini.GenNotif(p.remote, []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("notify after Close: %v", err)
	}
}

// NIXL's UCX backend sends a write's notification when the initiator polls
// the transfer: the agent's watcher polls, so a target that waits for the
// notification before anyone looks at the initiator still gets it.
func TestLibNIXLNotificationNeedsNoCallerPoll(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	fill(src, 12)
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, []byte("unpolled"))
	if n := waitNotif(t, p.tgt, time.Minute); string(n.Msg) != "unpolled" || !bytes.Equal(src, dst) {
		t.Fatalf("notification %q", n.Msg)
	}
	p.ini.Release(x)
}

// The C API library has no run path: without libnixl.so beside it (loaded
// first with RTLD_GLOBAL) it cannot load, and Open says so.
func TestLibNIXLNeedsCoreLibrary(t *testing.T) {
	needDouble(t)
	dir := t.TempDir()
	lone := filepath.Join(dir, "libnixl_capi.so")
	if out, err := exec.Command("cp", doubleLib(), lone).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	// In a fresh process: this one has the double's libnixl.so loaded.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KVBRIDGE_NIXL_CHILD=lone", "KVBRIDGE_NIXL_LONE="+lone)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if s := string(out); !strings.Contains(s, "NIXL is not installed or not loadable") || !strings.Contains(s, "nixl_double_core_version") {
		t.Fatalf("want an unresolved-symbol load failure, got %q", s)
	}
}

// A library that is not a supported NIXL is refused with the reason, and
// a second NIXL in a process is refused before it is even opened.
func TestLibNIXLRefusals(t *testing.T) {
	needDouble(t)
	for _, c := range []struct{ env, want string }{
		{"KVB_NIXL_DOUBLE_STUB=1", "stub C API"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "KVBRIDGE_NIXL_CHILD=lone", "KVBRIDGE_NIXL_LONE="+doubleLib(), c.env)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("%s: got %q, want it to say %q", c.env, out, c.want)
		}
	}
	a, err := Open(Config{Name: "nx-first", Engine: EngineLibNIXL, NIXLLib: doubleLib()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	other := filepath.Join(t.TempDir(), "libnixl_capi.so")
	if out, err := exec.Command("cp", doubleLib(), other).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	if _, err := Open(Config{Name: "nx-second", Engine: EngineLibNIXL, NIXLLib: other}); !errors.Is(err, ErrEngineUnavailable) {
		t.Fatalf("a second NIXL: %v", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(maps), other) {
		t.Fatal("the refused second NIXL was loaded (and its handle leaked)")
	}
}

func TestAutoEngine(t *testing.T) {
	needDouble(t)
	// With a loadable NIXL the automatic choice is libnixl; without, ucx.
	t.Setenv("KVBRIDGE_NIXL_LIB", doubleLib())
	a, err := Open(Config{Name: "auto-nixl"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Engine() != EngineLibNIXL {
		t.Fatalf("engine %s, want libnixl", a.Engine())
	}
	a.Close()
	b, err := Open(Config{Name: "auto-ucx", NIXLLib: "/nonexistent/libnixl_capi.so", UCX: shmUCX})
	if err != nil {
		t.Fatal(err)
	}
	if b.Engine() != EngineUCX {
		t.Fatalf("engine %s, want ucx", b.Engine())
	}
	b.Close()
}

// nixlOnlyChild moves a write between two libnixl agents (the NIXL in
// KVBRIDGE_NIXL_LONE) and prints the libucp files mapped in the process.
func nixlOnlyChild() int {
	lib := os.Getenv("KVBRIDGE_NIXL_LONE")
	var agents []*Agent
	defer func() {
		for _, a := range agents {
			a.Close()
		}
	}()
	for _, role := range []string{"ini", "tgt"} {
		a, err := Open(Config{Name: "nixl-only-" + role, Engine: EngineLibNIXL, NIXLLib: lib})
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		agents = append(agents, a)
	}
	ini, tgt := agents[0], agents[1]
	_, src, err1 := ini.Alloc(1 << 20)
	_, dst, err2 := tgt.Alloc(1 << 20)
	md, err3 := tgt.Metadata()
	if err := errors.Join(err1, err2, err3); err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	remote, err := ini.LoadRemote(md)
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	fill(src, 9)
	l, _ := ini.PrepLocal(DRAM, []Desc{BytesDesc(src)})
	r, _ := ini.PrepRemote(remote, DRAM, []Desc{BytesDesc(dst)})
	x, err := ini.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
	if err == nil {
		err = ini.Post(x)
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err = ini.Wait(ctx, x)
		cancel()
	}
	if err != nil || !bytes.Equal(src, dst) {
		fmt.Println("ERR write:", err)
		return 1
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(maps), "\n") {
		if f := strings.Fields(line); len(f) >= 6 && strings.Contains(filepath.Base(f[5]), "libucp.so") && !seen[f[5]] {
			seen[f[5]] = true
			fmt.Println("LIBUCP", f[5])
		}
	}
	fmt.Println("OK")
	return 0
}

// A process that uses only the libnixl engine maps no UCX of kvbridge's:
// with the double none at all, with a real NIXL only the one NIXL's UCX
// plugin loaded. (The ucx engine loads libucp at run time, at its first
// agent; before, the binary linked Debian's UCX at start-up and NIXL's
// plugin silently ran on it, ~10× slower.)
func TestLibNIXLProcessMapsOneUCX(t *testing.T) {
	lib, want := doubleLib(), 0
	if realNIXL() != "" {
		lib, want = realNIXL(), 1
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KVBRIDGE_NIXL_CHILD=nixl-only", "KVBRIDGE_NIXL_LONE="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var ucps []string
	for _, line := range strings.Split(string(out), "\n") {
		if p, ok := strings.CutPrefix(line, "LIBUCP "); ok {
			ucps = append(ucps, p)
		}
	}
	if len(ucps) != want {
		t.Fatalf("a libnixl-only process (%s) maps libucp %q, want %d file(s)", lib, ucps, want)
	}
	t.Logf("libucp mapped: %q", ucps)
}

// NIXL 1.4.0's UCX genNotif returns success while its eager message may
// still be pending, and without a progress thread only a later call that
// progresses the sending agent sends it (seen on NIXL 1.4.0; the double
// models it unless KVB_NIXL_DOUBLE_PENDING_NOTIF=0). A notification with no transfer — a dummy
// source's chunks and aux, chunks inside a prefix — must still arrive
// while its sender makes no other call: the agent progresses itself for a
// while after each GenNotif. Its own notifications drained meanwhile are
// kept for Notifs.
func TestLibNIXLGenNotifFlushed(t *testing.T) {
	onNIXL(t, func(t *testing.T, lib string) { genNotifFlushed(t, lib) })
}

func genNotifFlushed(t *testing.T, lib string) {
	p, _, _ := nixlPairOn(t, lib, time.Minute, NIXLProgressCaller, NIXLProgressCaller)
	back := exchange(t, p.tgt, p.ini)
	if err := p.tgt.GenNotif(back, []byte("to the initiator")); err != nil {
		t.Fatal(err)
	}
	if err := p.ini.GenNotif(p.remote, []byte("dummy chunk")); err != nil {
		t.Fatal(err)
	}
	if n := waitNotif(t, p.tgt, 10*time.Second); string(n.Msg) != "dummy chunk" {
		t.Fatalf("notification %q", n.Msg)
	}
	// The initiator's flusher drained the target's GenNotif (sent by the
	// target's own flusher): Notifs still returns it.
	if n := waitNotif(t, p.ini, 10*time.Second); string(n.Msg) != "to the initiator" {
		t.Fatalf("the initiator's notification %q", n.Msg)
	}
}

// A request whose release NIXL refused (kept to retry) and whose remote is
// then forgotten (invalidated, or back with other connection info) is
// released once and destroyed once: forgetting it does not queue it twice,
// and the retry finds it gone (a destroyed request released again is a
// use-after-free in NIXL).
func TestLibNIXLStuckRequestForgottenOnce(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	live := func() int64 { return liveRequests(t) }
	base := live()
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	if _, err := wait(t, p.ini, x, time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_release_xfer_req")
	if err := p.ini.Release(x); err == nil {
		t.Fatal("release not refused")
	}
	_ = p.ini.InvalidateRemote(p.remote) // forget: its release refused again
	nb := p.ini.b.(*libnixl)
	nb.mu.Lock()
	stuck := len(nb.stuck)
	nb.mu.Unlock()
	if stuck != 1 {
		t.Fatalf("the refused request is queued %d times for retry, want once", stuck)
	}
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	_ = p.ini.InvalidateRemote(p.remote) // released and destroyed now
	nb.retryStuck()                      // finds it destroyed: no second release
	if n := live(); n != base {
		t.Fatalf("%d live requests, want %d", n, base)
	}
	if v, _ := nixldouble.Violations(doubleLib()); v != 0 {
		t.Fatalf("%d calls the double refused as misuse", v)
	}
}

// Review of issue 22's workarounds: a GenNotif to a fenced remote is
// refused like a post (NIXL's send path has the write's check-then-use
// gap), and notifications the GenNotif flusher kept are not lost when a
// drain fails (the decode notifier drops what comes with an error).
func TestLibNIXLFenceAndStashEdges(t *testing.T) {
	p, _, _ := libnixlPair(t, time.Minute)
	nb := p.ini.b.(*libnixl)
	nb.fence(p.remote, errors.New("injected"))
	if err := p.ini.GenNotif(p.remote, []byte("x")); !errors.Is(err, ErrTransfer) {
		t.Fatalf("GenNotif to a fenced remote: %v, want ErrTransfer", err)
	}
	tb := p.tgt.b.(*libnixl)
	tb.nmu.Lock()
	tb.stash = []Notif{{Remote: "someone", Msg: []byte("kept")}}
	tb.nmu.Unlock()
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_get_notifs")
	if ns, err := p.tgt.Notifs(); err == nil || len(ns) != 0 {
		t.Fatalf("a failed drain returned %d notifications, err %v", len(ns), err)
	}
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	if ns, err := p.tgt.Notifs(); err != nil || len(ns) != 1 || string(ns[0].Msg) != "kept" {
		t.Fatalf("after the failed drain: %q %v, want the kept notification", ns, err)
	}
}

// liveRequests is how many transfer requests the NIXL double holds.
func liveRequests(t *testing.T) int64 {
	t.Helper()
	n, err := nixldouble.LiveRequests(doubleLib())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A libnixl agent's UCX backend gets UCX's adaptive progress turned off
// (a worker asleep on its event fd was seen to miss events with it, issue
// 24), after the user's own engine_config settings, and never over a
// user's own ADAPTIVE_PROGRESS.
func TestLibNIXLEngineConfig(t *testing.T) {
	for _, c := range []struct{ user, want string }{
		{"", "ADAPTIVE_PROGRESS=n"},
		{"TLS=tcp", "TLS=tcp,ADAPTIVE_PROGRESS=n"},
		{"TLS=tcp, ADAPTIVE_PROGRESS=y", "TLS=tcp, ADAPTIVE_PROGRESS=y"},
	} {
		if got := nixlEngineConfig(c.user); got != c.want {
			t.Errorf("nixlEngineConfig(%q) = %q, want %q", c.user, got, c.want)
		}
	}
	needDouble(t)
	for i, user := range []map[string]string{nil, {"engine_config": "MAX_RMA_RAILS=1"}} {
		a, err := Open(Config{Name: fmt.Sprintf("nx-engine-config-%d", i), Engine: EngineLibNIXL, NIXLLib: doubleLib(), BackendParams: user})
		if err != nil {
			t.Fatal(err)
		}
		got, err := nixldouble.EngineConfig(doubleLib(), a.Name())
		a.Close()
		if want := nixlEngineConfig(user["engine_config"]); err != nil || got != want {
			t.Errorf("the backend was created with engine_config %q (%v), want %q", got, err, want)
		}
	}
}

// The libnixl engine's Alloc maps its memory on a 2 MiB boundary with
// transparent huge pages asked for (issue 22: NIXL's UCX moves caller
// memory with cma, and over huge pages the 4,096-token benchmark's pages
// moved 1.1 to 1.5 times as fast): the mapping's VmFlags carry "hg"
// (MADV_HUGEPAGE), and the memory is zeroed and usable to its last byte.
func TestLibNIXLAllocHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage"); err != nil {
		t.Skipf("this kernel has no transparent huge pages (%v): MADV_HUGEPAGE is refused, and the hint is all Alloc gives", err)
	}
	p, _, _ := libnixlPair(t, time.Minute)
	for _, size := range []uint64{1, 3 << 20} {
		_, buf, err := p.ini.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		addr := uintptr(unsafe.Pointer(&buf[0]))
		if addr%(2<<20) != 0 || uint64(len(buf)) != size || buf[0] != 0 || buf[size-1] != 0 {
			t.Fatalf("Alloc(%d): %d bytes at %#x (want 2 MiB-aligned, zeroed)", size, len(buf), addr)
		}
		buf[size-1] = 1
		if flags := vmFlags(t, addr); !strings.Contains(" "+flags+" ", " hg ") {
			t.Errorf("Alloc(%d) at %#x: VmFlags %q, no hg (MADV_HUGEPAGE)", size, addr, flags)
		}
	}
}

// vmFlags is the VmFlags line of this process's mapping holding addr.
func vmFlags(t *testing.T, addr uintptr) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(l, "%x-%x", &lo, &hi); n == 2 && strings.Contains(l, " ") {
			in = addr >= lo && addr < hi
			continue
		}
		if v, ok := strings.CutPrefix(l, "VmFlags:"); ok && in {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no mapping holds %#x", addr)
	return ""
}
