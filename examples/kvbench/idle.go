package main

import (
	"bufio"
	"bytes"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/examples/internal/rankcmd"
	"github.com/kvbridge/kvbridge/internal/cpustat"
	"github.com/kvbridge/kvbridge/internal/nixl"
)

// idleGoal is the bound for an idle rank: 0.1 % of one core.
const idleGoal = 0.1

// idleMode measures what an idle rank costs. Per engine, a prefill and a
// decode rank are started as the example binaries (examples/prefill,
// examples/decode; the prefill rank serves the bootstrap server), one room
// goes through them so each has registered with the other, and then
// nothing happens for -idle-for while each process's CPU is read from
// /proc/<pid>/stat; start-up and the room are outside the window. The
// loopback engine works within one process only, so its pair is a prefill
// and a decode Manager in this process, measured with getrusage; libnixl
// runs when KVBRIDGE_NIXL_LIB names a real NIXL.
func (b *bench) idleMode() error {
	dir, err := os.MkdirTemp("", "kvbench-idle")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := b.bin
	if bin == "" {
		progress("idle", 0, 1)
		// Built fresh from this module: binaries left in bin/ may predate
		// the code being measured.
		out, err := exec.Command("go", "build", "-o", dir+"/", "github.com/kvbridge/kvbridge/examples/prefill",
			"github.com/kvbridge/kvbridge/examples/decode").CombinedOutput()
		if err != nil {
			return fmt.Errorf("building the rank binaries (or give -bin): %v: %s", err, out)
		}
		bin = dir
	}
	secret := filepath.Join(dir, "secret")
	var key [32]byte
	if _, err := crand.Read(key[:]); err != nil {
		return err
	}
	if err := os.WriteFile(secret, []byte(hex.EncodeToString(key[:])), 0o600); err != nil {
		return err
	}
	engines := []string{nixl.EngineUCX}
	if os.Getenv("KVBRIDGE_NIXL_LIB") != "" {
		engines = append(engines, nixl.EngineLibNIXL)
	}
	steps := len(engines) + 1
	var worst float64
	for i, engine := range engines {
		progress("idle", i, steps)
		cores, err := b.idleProcesses(bin, secret, engine)
		if err != nil {
			return fmt.Errorf("%s: %w", engine, err)
		}
		for _, role := range []string{"prefill", "decode"} {
			b.add(Row{Mode: "idle", Name: fmt.Sprintf("%s %s rank process", engine, role), Value: 100 * cores[role],
				Unit: "% of a core", References: map[string]float64{"goal": idleGoal}})
			worst = max(worst, 100*cores[role])
		}
	}
	progress("idle", len(engines), steps)
	v, err := b.idleInProcess(nixl.EngineLoopback)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	b.add(Row{Mode: "idle", Name: "loopback prefill + decode, one process", Value: 100 * v, Unit: "% of a core",
		References: map[string]float64{"goal": idleGoal}})
	worst = max(worst, 100*v)
	progress("idle", steps, steps)
	verdict := "met"
	if worst > idleGoal {
		verdict = "NOT met"
	}
	b.notes = append(b.notes, fmt.Sprintf("idle goal ≤ %.1f %% of a core per rank over %v: %s (worst %.3f %%)", idleGoal, b.idleFor, verdict, worst))
	return nil
}

// rankProc is a started rank process and what its ready line said.
type rankProc struct {
	cmd        *exec.Cmd
	http, boot string
	exited     chan struct{}
}

// startRank starts one example rank and waits for its ready line.
func startRank(bin, role, secret string, args ...string) (*rankProc, error) {
	cmd := exec.Command(filepath.Join(bin, role), args...)
	cmd.Env = append(os.Environ(), "KVBRIDGE_SECRET_FILE"+"="+secret)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", role, err)
	}
	p := &rankProc{cmd: cmd, exited: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			ready <- sc.Text()
		}
		io.Copy(io.Discard, out)
		cmd.Wait()
		close(p.exited)
	}()
	select {
	case l := <-ready:
		for _, f := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(f, "http="); ok {
				p.http = "http://" + v
			}
			if v, ok := strings.CutPrefix(f, "bootstrap="); ok {
				p.boot = v
			}
		}
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("%s exited before it was ready: %s", role, logs.String())
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-p.exited
		return nil, fmt.Errorf("%s not ready within 2 minutes", role)
	}
}

func (p *rankProc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// postRoom drives one room on a rank (POST /v1/room).
func postRoom(url, token string, rr rankcmd.RoomRequest) (rankcmd.RoomResult, error) {
	var res rankcmd.RoomResult
	body, _ := json.Marshal(rr)
	req, err := http.NewRequest(http.MethodPost, url+"/v1/room", bytes.NewReader(body))
	if err != nil {
		return res, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return res, fmt.Errorf("%s: %s", resp.Status, data)
	}
	return res, json.Unmarshal(data, &res)
}

// idleProcesses starts a prefill and a decode rank of engine, runs one room
// through them, then measures each process's share of a core over
// b.idleFor.
func (b *bench) idleProcesses(bin, secret, engine string) (map[string]float64, error) {
	common := []string{"-model", b.model.Name, "-pages", "64", "-engine", engine, "-ucx-tls", b.tls}
	pre, err := startRank(bin, "prefill", secret, append(common, "-instance", "kvbench-idle-p", "-serve-bootstrap", "127.0.0.1:0")...)
	if err != nil {
		return nil, err
	}
	defer pre.stop()
	dec, err := startRank(bin, "decode", secret, append(common, "-instance", "kvbench-idle-d", "-bootstrap", pre.boot)...)
	if err != nil {
		return nil, err
	}
	defer dec.stop()
	key, err := os.ReadFile(secret)
	if err != nil {
		return nil, err
	}
	auth, err := bootstrap.NewAuth(key)
	if err != nil {
		return nil, err
	}
	// One room, so each rank has registered with the other.
	tokens := 4 * b.model.PageTokens
	var wg sync.WaitGroup
	res, errs := make([]rankcmd.RoomResult, 2), make([]error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		res[0], errs[0] = postRoom(dec.http, auth.BootstrapToken(), rankcmd.RoomRequest{Room: 1, Tokens: tokens,
			Prefill: pre.boot, PrefillInstance: "kvbench-idle-p"})
	}()
	go func() {
		defer wg.Done()
		res[1], errs[1] = postRoom(pre.http, auth.BootstrapToken(), rankcmd.RoomRequest{Room: 1, Tokens: tokens})
	}()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, r := range res {
		if r.Status != "Success" {
			return nil, fmt.Errorf("the room on the %s rank: %s %s %s", []string{"decode", "prefill"}[i], r.Status, r.Reason, r.Error)
		}
	}
	time.Sleep(b.settle()) // the room's own aftermath stays out of the window
	m, err := cpustat.Start(pre.cmd.Process.Pid, dec.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	time.Sleep(b.idleFor)
	r, err := m.Read()
	if err != nil {
		return nil, err
	}
	return map[string]float64{"prefill": r.Cores(0), "decode": r.Cores(1)}, nil
}

// idleInProcess: a prefill and a decode Manager of engine in this
// process, one room, then this process's share of a core over b.idleFor.
func (b *bench) idleInProcess(engine string) (float64, error) {
	saved := b.engine
	b.engine = engine
	c, err := b.cluster(64)
	b.engine = saved
	if err != nil {
		return 0, err
	}
	defer c.close()
	if err := c.room([]uint32{0, 1, 2, 3}, []uint32{4, 5, 6, 7}); err != nil {
		return 0, err
	}
	time.Sleep(b.settle())
	m, err := cpustat.Start(0)
	if err != nil {
		return 0, err
	}
	time.Sleep(b.idleFor)
	r, err := m.Read()
	return r.Cores(0), err
}

// settle is the pause between the room and the window.
func (b *bench) settle() time.Duration {
	if b.quick {
		return 100 * time.Millisecond
	}
	return time.Second
}
