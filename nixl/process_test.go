package nixl

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// child is a peer process (this test binary re-executed, see runChild).
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	md    []byte
	addr  uintptr
}

func startChild(t testing.TB, transport string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "KVBRIDGE_NIXL_CHILD="+transport), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	f := strings.Fields(c.line(t, "MD"))
	if c.md, err = hex.DecodeString(f[1]); err != nil {
		t.Fatal(err)
	}
	a, _ := strconv.ParseUint(f[2], 16, 64)
	c.addr = uintptr(a)
	return c
}

func (c *child) line(t testing.TB, prefix string) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok || !strings.HasPrefix(l, prefix+" ") {
			t.Fatalf("child said %q, want %s ...", l, prefix)
		}
		return l
	case <-time.After(time.Minute):
		t.Fatalf("child silent, waiting for %s", prefix)
		return ""
	}
}

func TestCrossProcess(t *testing.T) {
	for _, tc := range []struct {
		transport string
		ucx       map[string]string
	}{{"shm", shmUCX}, {"tcp", tcpUCX}} {
		t.Run(tc.transport, func(t *testing.T) {
			c := startChild(t, tc.transport)
			a, err := Open(Config{Name: "parent-" + tc.transport, Engine: EngineUCX, UCX: tc.ucx, XferTimeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			remote, err := a.LoadRemote(c.md)
			if err != nil {
				t.Fatal(err)
			}
			const size = 256 << 20
			_, src, err := a.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			fill(src, 9)
			p := pair{ini: a, remote: remote}
			dst := Desc{Addr: c.addr, Len: size}
			x := write(t, p, []Desc{BytesDesc(src)}, []Desc{dst}, []byte(fmt.Sprintf("verify:%d", size)))
			if st, err := wait(t, a, x, time.Minute); st != Done {
				t.Fatalf("state %v: %v", st, err)
			}
			want := fmt.Sprintf("CRC %08x", crc32.ChecksumIEEE(src))
			if got := c.line(t, "CRC"); got != want {
				t.Fatalf("the child's buffer: %s, want %s", got, want)
			}
			a.Release(x)

			// The peer is killed with a write in flight: the transfer ends
			// (done or failed) within the agent's deadline, never hangs.
			x = write(t, p, []Desc{BytesDesc(src)}, []Desc{dst}, []byte("late"))
			c.cmd.Process.Signal(syscall.SIGKILL)
			st, err := wait(t, a, x, time.Minute)
			t.Logf("write to a killed peer over %s: %v %v", tc.transport, st, err)
			a.Release(x)
			// A new write to the dead peer also ends.
			x = write(t, p, []Desc{BytesDesc(src[:4096])}, []Desc{{Addr: c.addr, Len: 4096}}, nil)
			st, err = wait(t, a, x, time.Minute)
			t.Logf("next write to the dead peer: %v %v", st, err)
			a.Release(x)
		})
	}
}
