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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
		require.NoError(t, err)
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
	require.NoError(t, err)
	err = p.ini.Post(x)
	var ne *NIXLError
	require.ErrorAs(t, err, &ne, "post with an injected backend error")
	require.EqualValues(t, -2, ne.Status, "post with an injected backend error: %v", err)
	require.Equal(t, "nixl_capi_post_xfer_req", ne.Call, "post with an injected backend error: %v", err)
	require.ErrorIs(t, err, ErrTransfer, "post with an injected backend error")
	// Issue 22: the remote is fenced until its metadata loads again.
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	err = p.ini.Post(x)
	require.ErrorIs(t, err, ErrTransfer, "post after a failed one (%d fenced)", p.ini.PostsFenced())
	require.False(t, errors.As(err, &ne), "post after a failed one: %v (%d fenced)", err, p.ini.PostsFenced())
	require.ErrorContains(t, err, p.remote, "post after a failed one (%d fenced)", p.ini.PostsFenced())
	require.EqualValues(t, 1, p.ini.PostsFenced(), "post after a failed one: %v (fenced)", err)
	p.ini.Release(x)
	reload := func() {
		t.Helper()
		md, err := p.tgt.Metadata()
		if err == nil {
			_, err = p.ini.LoadRemote(md)
		}
		require.NoError(t, err)
		l, _ = p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src)})
		r, _ = p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)})
		x, err = p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, []byte("n"))
		require.NoError(t, err)
	}
	reload()
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_get_xfer_status")
	require.NoError(t, p.ini.Post(x))
	st, err := wait(t, p.ini, x, time.Minute)
	require.Equal(t, Failed, st, "status with an injected error: %v", err)
	require.ErrorAs(t, err, &ne, "status with an injected error: %v", st)
	require.Equal(t, "nixl_capi_get_xfer_status", ne.Call, "status with an injected error: %v %v", st, err)
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	err = p.ini.Post(x)
	require.ErrorIs(t, err, ErrTransfer, "post after a failed status (%d fenced)", p.ini.PostsFenced())
	require.EqualValues(t, 2, p.ini.PostsFenced(), "post after a failed status: %v (fenced)", err)
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
		if assert.ErrorAs(t, err, &ne, "%s: want a NIXLError naming the call", fn) {
			assert.Equal(t, fn, ne.Call[:len(fn)], "%s: want a NIXLError naming the call, got %v", fn, err)
		}
	}
	// Last: a load NIXL refuses drops the remote on kvbridge's side too
	// (issue 22: NIXL may have dropped its section), until a load succeeds.
	md, _ := p.tgt.Metadata()
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_load_remote_md")
	_, err = p.ini.LoadRemote(md)
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	if assert.ErrorAs(t, err, &ne, "nixl_capi_load_remote_md: want a NIXLError naming the call") {
		assert.Equal(t, "nixl_capi_load_remote_md", ne.Call, "nixl_capi_load_remote_md: want a NIXLError naming the call, got %v", err)
	}
	assert.ErrorIs(t, err, ErrBadMetadata, "nixl_capi_load_remote_md: want a NIXLError naming the call")
	_, err = p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst)})
	assert.ErrorIs(t, err, ErrRemoteUnknown, "prep after a refused load")
	_, err = p.ini.LoadRemote(md)
	assert.NoError(t, err, "the same blob again")
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
	st, err := wait(t, p.ini, x, time.Minute)
	require.Equal(t, Done, st, "async: %v", err)
	require.Equal(t, "async", string(waitNotif(t, p.tgt, time.Minute).Msg), "async: %v %v", st, err)
	p.ini.Release(x)

	t.Setenv("KVB_NIXL_DOUBLE_ASYNC", "stuck")
	x = write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	st, err = wait(t, p.ini, x, time.Minute)
	require.Equal(t, Failed, st, "a stuck transfer: %v, want Failed with ErrTimeout", err)
	require.ErrorIs(t, err, ErrTimeout, "a stuck transfer: want Failed with ErrTimeout")
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
		require.NoError(t, err, "%v", params)
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
		require.NoError(t, err)
		sync, delay, err := nixldouble.AgentConfig(doubleLib(), a.Name())
		prog, perr := nixldouble.AgentProgressThread(doubleLib(), a.Name())
		a.Close()
		require.NoError(t, err)
		require.NoError(t, perr)
		msg := fmt.Sprintf("%s: agent made with thread sync %d, progress thread %v, delay %v; want %d, %v, %v", name, sync, prog, delay, c.sync, c.prog, c.want)
		assert.Equal(t, c.sync, sync, msg)
		assert.Equal(t, c.want, delay, msg)
		assert.Equal(t, c.prog, prog, msg)
	}
	_, err := Open(Config{Name: "nx-config-bad", Engine: EngineLibNIXL, NIXLLib: doubleLib(), NIXLProgress: 7})
	assert.ErrorIs(t, err, ErrInvalidRequest, "progress mode 7")
}

// Notifications drained on one goroutine while others prepare, post, wait
// and release: no two calls may overlap on an agent NIXL does not lock.
func TestLibNIXLConcurrentCallsAreLocked(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	before, err := nixldouble.Violations(doubleLib())
	require.NoError(t, err)
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
			if _, err := p.ini.Notifs(); !assert.NoError(t, err) {
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
				if !assert.NoError(t, err) {
					return
				}
				r, err := p.ini.PrepRemote(p.remote, DRAM, []Desc{BytesDesc(dst[off : off+1024])})
				if !assert.NoError(t, err) {
					return
				}
				x, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
				if err == nil {
					err = p.ini.Post(x)
				}
				if err == nil {
					_, err = wait(t, p.ini, x, time.Minute)
				}
				assert.NoError(t, err)
				p.ini.Release(x)
				l.Release()
				r.Release()
			}
		}()
	}
	wg.Wait()
	close(stop)
	drained.Wait()
	after, _ := nixldouble.Violations(doubleLib())
	require.Equal(t, before, after, "%d calls overlapped on an agent without thread sync", after-before)
}

// A release NIXL refuses (it could not cancel the transfer) is retried, and
// the request is destroyed once NIXL lets go: nothing leaks.
func TestLibNIXLRefusedReleaseIsRetried(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	live := func() int64 { return liveRequests(t) }
	base := live()
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	_, err := wait(t, p.ini, x, time.Minute)
	require.NoError(t, err)
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_release_xfer_req")
	var ne *NIXLError
	err = p.ini.Release(x)
	require.ErrorAs(t, err, &ne, "refused release")
	require.Equal(t, "nixl_capi_release_xfer_req", ne.Call, "refused release: %v", err)
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	require.Equal(t, base+1, live(), "live requests after a refused release (kept for retry)")
	y := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, nil)
	wait(t, p.ini, y, time.Minute)
	require.NoError(t, p.ini.Release(y)) // also retries x's
	require.Equal(t, base, live(), "live requests after the retry")
}

// Close with transfers in flight releases them before the agent goes; the
// calls that come after never reach NIXL (the double aborts the process on
// a call to a destroyed agent, as real NIXL crashed with SIGSEGV).
func TestLibNIXLCallsAfterClose(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	t.Setenv("KVB_NIXL_DOUBLE_ASYNC", "stuck")
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, []byte("never"))
	base, _ := nixldouble.LiveRequests(doubleLib())
	require.NoError(t, p.ini.Close())
	n, _ := nixldouble.LiveRequests(doubleLib())
	require.Equal(t, base-1, n, "live requests after Close")
	st, err := p.ini.Status(x)
	require.Equal(t, Failed, st, "status after Close: %v", err)
	require.ErrorIs(t, err, ErrClosed, "status after Close: %v", st)
	st, err = wait(t, p.ini, x, time.Minute)
	require.Equal(t, Failed, st, "wait after Close: %v", err)
	require.ErrorIs(t, err, ErrClosed, "wait after Close: %v", st)
	require.NoError(t, p.ini.Release(x), "release after Close")
	_, err = p.ini.Notifs()
	require.ErrorIs(t, err, ErrClosed, "notifs after Close")
	require.ErrorIs(t, p.ini.GenNotif(p.remote, []byte("x")), ErrClosed, "notify after Close")
}

// NIXL's UCX backend sends a write's notification when the initiator polls
// the transfer: the agent's watcher polls, so a target that waits for the
// notification before anyone looks at the initiator still gets it.
func TestLibNIXLNotificationNeedsNoCallerPoll(t *testing.T) {
	p, src, dst := libnixlPair(t, time.Minute)
	fill(src, 12)
	x := write(t, p, []Desc{BytesDesc(src)}, []Desc{BytesDesc(dst)}, []byte("unpolled"))
	n := waitNotif(t, p.tgt, time.Minute)
	require.Equal(t, "unpolled", string(n.Msg), "notification")
	require.True(t, bytes.Equal(src, dst), "notification %q", n.Msg)
	p.ini.Release(x)
}

// The C API library has no run path: without libnixl.so beside it (loaded
// first with RTLD_GLOBAL) it cannot load, and Open says so.
func TestLibNIXLNeedsCoreLibrary(t *testing.T) {
	needDouble(t)
	dir := t.TempDir()
	lone := filepath.Join(dir, "libnixl_capi.so")
	out, err := exec.Command("cp", doubleLib(), lone).CombinedOutput()
	require.NoError(t, err, "%s", out)
	// In a fresh process: this one has the double's libnixl.so loaded.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KVBRIDGE_NIXL_CHILD=lone", "KVBRIDGE_NIXL_LONE="+lone)
	out, err = cmd.Output()
	require.NoError(t, err)
	require.Contains(t, string(out), "NIXL is not installed or not loadable", "want an unresolved-symbol load failure")
	require.Contains(t, string(out), "nixl_double_core_version", "want an unresolved-symbol load failure")
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
		require.NoError(t, err)
		assert.Contains(t, string(out), c.want, "%s: want it to say", c.env)
	}
	a, err := Open(Config{Name: "nx-first", Engine: EngineLibNIXL, NIXLLib: doubleLib()})
	require.NoError(t, err)
	defer a.Close()
	other := filepath.Join(t.TempDir(), "libnixl_capi.so")
	out, err := exec.Command("cp", doubleLib(), other).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = Open(Config{Name: "nx-second", Engine: EngineLibNIXL, NIXLLib: other})
	require.ErrorIs(t, err, ErrEngineUnavailable, "a second NIXL")
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	require.False(t, strings.Contains(string(maps), other), "the refused second NIXL was loaded (and its handle leaked)")
}

func TestAutoEngine(t *testing.T) {
	needDouble(t)
	// With a loadable NIXL the automatic choice is libnixl; without, ucx.
	a, err := Open(Config{Name: "auto-nixl", NIXLLib: doubleLib()})
	require.NoError(t, err)
	require.Equal(t, EngineLibNIXL, a.Engine(), "engine, want libnixl")
	a.Close()
	b, err := Open(Config{Name: "auto-ucx", NIXLLib: "/nonexistent/libnixl_capi.so", UCX: shmUCX})
	require.NoError(t, err)
	require.Equal(t, EngineUCX, b.Engine(), "engine, want ucx")
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
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "OK", "child: %v\n%s", err, out)
	var ucps []string
	for _, line := range strings.Split(string(out), "\n") {
		if p, ok := strings.CutPrefix(line, "LIBUCP "); ok {
			ucps = append(ucps, p)
		}
	}
	require.Len(t, ucps, want, "a libnixl-only process (%s) maps libucp %q, want %d file(s)", lib, ucps, want)
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
	require.NoError(t, p.tgt.GenNotif(back, []byte("to the initiator")))
	require.NoError(t, p.ini.GenNotif(p.remote, []byte("dummy chunk")))
	require.Equal(t, "dummy chunk", string(waitNotif(t, p.tgt, 10*time.Second).Msg), "notification")
	// The initiator's flusher drained the target's GenNotif (sent by the
	// target's own flusher): Notifs still returns it.
	require.Equal(t, "to the initiator", string(waitNotif(t, p.ini, 10*time.Second).Msg), "the initiator's notification")
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
	_, err := wait(t, p.ini, x, time.Minute)
	require.NoError(t, err)
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_release_xfer_req")
	require.Error(t, p.ini.Release(x), "release not refused")
	_ = p.ini.InvalidateRemote(p.remote) // forget: its release refused again
	nb := p.ini.b.(*libnixl)
	nb.mu.Lock()
	stuck := len(nb.stuck)
	nb.mu.Unlock()
	require.Equal(t, 1, stuck, "the refused request is queued times for retry, want once")
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	_ = p.ini.InvalidateRemote(p.remote) // released and destroyed now
	nb.retryStuck()                      // finds it destroyed: no second release
	require.Equal(t, base, live(), "live requests")
	v, _ := nixldouble.Violations(doubleLib())
	require.Zero(t, v, "calls the double refused as misuse")
}

// Review of issue 22's workarounds: a GenNotif to a fenced remote is
// refused like a post (NIXL's send path has the write's check-then-use
// gap), and notifications the GenNotif flusher kept are not lost when a
// drain fails (the decode notifier drops what comes with an error).
func TestLibNIXLFenceAndStashEdges(t *testing.T) {
	p, _, _ := libnixlPair(t, time.Minute)
	nb := p.ini.b.(*libnixl)
	nb.fence(p.remote, errors.New("injected"))
	require.ErrorIs(t, p.ini.GenNotif(p.remote, []byte("x")), ErrTransfer, "GenNotif to a fenced remote")
	tb := p.tgt.b.(*libnixl)
	tb.nmu.Lock()
	tb.stash = []Notif{{Remote: "someone", Msg: []byte("kept")}}
	tb.nmu.Unlock()
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_get_notifs")
	ns, err := p.tgt.Notifs()
	require.Error(t, err, "a failed drain returned %d notifications", len(ns))
	require.Empty(t, ns, "a failed drain returned notifications, err %v", err)
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	ns, err = p.tgt.Notifs()
	require.NoError(t, err, "after the failed drain: %q, want the kept notification", ns)
	require.Len(t, ns, 1, "after the failed drain: %q, want the kept notification", ns)
	require.Equal(t, "kept", string(ns[0].Msg), "after the failed drain, want the kept notification")
}

// liveRequests is how many transfer requests the NIXL double holds.
func liveRequests(t *testing.T) int64 {
	t.Helper()
	n, err := nixldouble.LiveRequests(doubleLib())
	require.NoError(t, err)
	return n
}

// A libnixl agent's UCX backend gets UCX's adaptive progress turned off
// (a worker asleep on its event fd was seen to miss events with it, issue
// 24), after the user's own engine_config settings, and never over a
// user's own ADAPTIVE_PROGRESS; an agent without NIXL's progress thread
// (caller) also gets cma's segment at cmaSegSize (issue 54: its status
// call copies everything queued anyway; fewer process_vm_writev calls),
// never over the user's own, and a threaded agent keeps UCX's.
func TestLibNIXLEngineConfig(t *testing.T) {
	seg := "CMA_SEG_SIZE=" + cmaSegSize
	for _, c := range []struct {
		user   string
		caller bool
		want   string
	}{
		{"", false, "ADAPTIVE_PROGRESS=n"},
		{"TLS=tcp", false, "TLS=tcp,ADAPTIVE_PROGRESS=n"},
		{"TLS=tcp, ADAPTIVE_PROGRESS=y", false, "TLS=tcp, ADAPTIVE_PROGRESS=y"},
		{"", true, "ADAPTIVE_PROGRESS=n," + seg},
		{"TLS=tcp", true, "TLS=tcp,ADAPTIVE_PROGRESS=n," + seg},
		{"CMA_SEG_SIZE=1M", true, "CMA_SEG_SIZE=1M,ADAPTIVE_PROGRESS=n"},
		{"ADAPTIVE_PROGRESS=y,CMA_SEG_SIZE=1M", true, "ADAPTIVE_PROGRESS=y,CMA_SEG_SIZE=1M"},
		{"ADAPTIVE_PROGRESS=y", true, "ADAPTIVE_PROGRESS=y," + seg},
	} {
		assert.Equal(t, c.want, nixlEngineConfig(c.user, c.caller), "nixlEngineConfig(%q, caller %v)", c.user, c.caller)
	}
	needDouble(t)
	for i, user := range []map[string]string{nil, {"engine_config": "MAX_RMA_RAILS=1"}} {
		for _, mode := range []NIXLProgress{NIXLProgressThread, NIXLProgressCaller} {
			a, err := Open(Config{Name: fmt.Sprintf("nx-engine-config-%d-%v", i, mode), Engine: EngineLibNIXL, NIXLLib: doubleLib(),
				BackendParams: user, NIXLProgress: mode})
			require.NoError(t, err)
			got, err := nixldouble.EngineConfig(doubleLib(), a.Name())
			a.Close()
			if assert.NoError(t, err, "the backend was created with engine_config %q", got) {
				assert.Equal(t, nixlEngineConfig(user["engine_config"], mode == NIXLProgressCaller), got, "the backend (%v) was created with engine_config", mode)
			}
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
		require.NoError(t, err)
		addr := uintptr(unsafe.Pointer(&buf[0]))
		msg := fmt.Sprintf("Alloc(%d): %d bytes at %#x (want 2 MiB-aligned, zeroed)", size, len(buf), addr)
		require.Zero(t, addr%(2<<20), msg)
		require.Equal(t, size, uint64(len(buf)), msg)
		require.Zero(t, buf[0], msg)
		require.Zero(t, buf[size-1], msg)
		buf[size-1] = 1
		flags := vmFlags(t, addr)
		assert.Contains(t, " "+flags+" ", " hg ", "Alloc(%d) at %#x: VmFlags %q, no hg (MADV_HUGEPAGE)", size, addr, flags)
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
