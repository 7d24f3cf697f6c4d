package nixl

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// These tests drive the real libnixl binding (loading, marshalling, handles,
// error mapping) against the C test double of the NIXL C API.

func libnixlPair(t *testing.T, timeout time.Duration) (pair, []byte, []byte) {
	t.Helper()
	mk := func(role string) *Agent {
		a, err := Open(Config{Name: "nx-" + role + "-" + t.Name(), Engine: EngineLibNIXL, NIXLLib: doubleLib(), XferTimeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	p := pair{ini: mk("ini"), tgt: mk("tgt")}
	_, src, _ := p.ini.Alloc(1 << 16)
	_, dst, _ := p.tgt.Alloc(1 << 16)
	p.remote = exchange(t, p.ini, p.tgt)
	return p, src, dst
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
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_get_xfer_status")
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	if err := p.ini.Post(x); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVB_NIXL_DOUBLE_FAIL", "nixl_capi_get_xfer_status")
	if st, err := p.ini.Status(x); st != Failed || !errors.As(err, &ne) {
		t.Fatalf("status with an injected error: %v %v", st, err)
	}
	os.Unsetenv("KVB_NIXL_DOUBLE_FAIL")
	p.ini.Release(x)

	for fn, call := range map[string]func() error{
		"nixl_capi_register_mem":    func() error { _, _, err := p.ini.Alloc(64); return err },
		"nixl_capi_get_local_md":    func() error { _, err := p.ini.Metadata(); return err },
		"nixl_capi_prep_xfer_dlist": func() error { _, err := p.ini.PrepLocal(DRAM, []Desc{BytesDesc(src)}); return err },
		"nixl_capi_gen_notif":       func() error { return p.ini.GenNotif(p.remote, []byte("x")) },
		"nixl_capi_get_notifs":      func() error { _, err := p.tgt.Notifs(); return err },
		"nixl_capi_load_remote_md":  func() error { md, _ := p.tgt.Metadata(); _, err := p.ini.LoadRemote(md); return err },
		"nixl_capi_make_xfer_req": func() error {
			_, err := p.ini.NewXfer(Write, l, []int{0}, r, []int{0}, nil)
			return postNew(p.ini, l, r, err)
		},
		"nixl_capi_create_agent": func() error {
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
	if st, _ := p.ini.Status(x); st != InProgress {
		t.Fatalf("first status %v, want InProgress", st)
	}
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

func TestLibNIXLBackendParams(t *testing.T) {
	a, err := Open(Config{Name: "nx-params", Engine: EngineLibNIXL, NIXLLib: doubleLib(),
		BackendParams: map[string]string{"ucx_error_handling_mode": "none", "num_workers": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	_, err = Open(Config{Name: "nx-params2", Engine: EngineLibNIXL, NIXLLib: doubleLib(),
		BackendParams: map[string]string{"bogus_param": "1"}})
	var ne *NIXLError
	if !errors.As(err, &ne) || !strings.Contains(ne.Call, "bogus_param") || !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("a parameter the backend refuses: %v", err)
	}
}

// The C API library has no run path: without libnixl.so beside it (loaded
// first with RTLD_GLOBAL) it cannot load, and Open says so.
func TestLibNIXLNeedsCoreLibrary(t *testing.T) {
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

func TestAutoEngine(t *testing.T) {
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
