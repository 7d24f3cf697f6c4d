// Command demo is what `make demo` runs: it starts an example prefill rank
// (serving the bootstrap server) and a decode rank as separate processes on
// loopback, drives a workload of requests of mixed lengths with a few aborts
// at random stages, shows progress, and ends with a summary. It exits
// non-zero if any room failed without an abort, any page differs, or any
// room is left pinned.
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
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/examples/internal/rankcmd"
	"github.com/kvbridge/kvbridge/transfer"
)

type proc struct {
	name     string
	log      string // its stderr (zap's JSON log)
	cmd      *exec.Cmd
	http     string
	boot     string
	endpoint string // control endpoint
	epoch    uint64 // its control-plane epoch
	warmup   time.Duration
	args     []string // its flags (a restart starts it with them again)
}

// secretFile is the demo deployment's shared secret, made at start (unless
// KVBRIDGE_SECRET or KVBRIDGE_SECRET_FILE is set) and handed to every
// process; token is its bootstrap token, for POST /v1/room.
var (
	secretFile, token string
	auth              *bootstrap.Auth
	// logs are the rank processes' log files: removed after a clean run,
	// named in the summary otherwise.
	logs []string
	// logsMu guards logs: the ranks of an instance start in parallel.
	logsMu sync.Mutex
)

func makeSecret() (cleanup func(), err error) {
	auth, _, err = bootstrap.AuthFromEnv()
	if err != nil {
		return nil, err
	}
	cleanup = func() {}
	if auth == nil {
		var b [32]byte
		if _, err := crand.Read(b[:]); err != nil {
			return nil, err
		}
		f, err := os.CreateTemp("", "kvbridge-demo-secret-*")
		if err != nil {
			return nil, err
		}
		secret := hex.EncodeToString(b[:])
		if _, err := f.WriteString(secret); err != nil {
			return nil, err
		}
		f.Close()
		secretFile, cleanup = f.Name(), func() { os.Remove(f.Name()) }
		if auth, err = bootstrap.NewAuth([]byte(secret)); err != nil {
			return nil, err
		}
	}
	token = auth.BootstrapToken()
	return cleanup, nil
}

func start(bin, name string, args ...string) (*proc, error) {
	cmd := exec.Command(filepath.Join(bin, name), args...)
	cmd.Env = os.Environ()
	if secretFile != "" {
		cmd.Env = append(cmd.Env, "KVBRIDGE_SECRET_FILE"+"="+secretFile)
	}
	if ca != nil && (name == "prefill" || name == "decode") {
		env, err := identityEnv(name, args)
		if err != nil {
			return nil, err
		}
		cmd.Env = append(cmd.Env, env...)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	logf, err := os.CreateTemp("", "kvbridge-demo-"+name+"-*.log")
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w (build it: make demo)", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logf.Name(), args: args}
	logsMu.Lock()
	logs = append(logs, logf.Name())
	logsMu.Unlock()
	line := make(chan string, 1)
	eof := make(chan struct{}) // stdout closed: the process exited
	go func() {
		defer close(eof)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case line <- sc.Text():
			default:
			}
		}
	}()
	select {
	case <-eof:
		err := cmd.Wait()
		select {
		case l := <-line: // printed its line, then exited at once
			return nil, fmt.Errorf("%s exited right after starting (%q): %v (log: %s)%s", name, l, err, logf.Name(), logTail(logf.Name()))
		default:
		}
		return nil, fmt.Errorf("%s did not start: %v (log: %s)%s", name, err, logf.Name(), logTail(logf.Name()))
	case l := <-line:
		for _, f := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(f, "http="); ok {
				p.http = "http://" + v
			}
			if v, ok := strings.CutPrefix(f, "bootstrap="); ok {
				p.boot = v
			}
			if v, ok := strings.CutPrefix(f, "endpoint="); ok {
				p.endpoint = v
			}
			if v, ok := strings.CutPrefix(f, "epoch="); ok {
				p.epoch, _ = strconv.ParseUint(v, 10, 64)
			}
			if v, ok := strings.CutPrefix(f, "warmup="); ok {
				p.warmup, _ = time.ParseDuration(v)
			}
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		return nil, fmt.Errorf("%s did not start in 60 s (log: %s)%s", name, logf.Name(), logTail(logf.Name()))
	}
	return p, nil
}

// logTail is the first lines of a rank's log that say why it stopped (a
// Go crash's own lines, not its goroutine dump), indented, for an error.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(l, "goroutine ") && len(keep) > 0 {
			break // the rest is the goroutine dump
		}
		keep = append(keep, "\n    "+l)
	}
	if len(keep) > 20 {
		keep = keep[len(keep)-20:]
	}
	return strings.Join(keep, "")
}

func (p *proc) stop() error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		return fmt.Errorf("%s did not stop on SIGTERM", p.name)
	}
}

func post(url string, body any) (rankcmd.RoomResult, error) {
	var res rankcmd.RoomResult
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, url+"/v1/room", bytes.NewReader(b))
	if err != nil {
		return res, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := httpClient.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return res, fmt.Errorf("%s: %s", resp.Status, data)
	}
	return res, json.Unmarshal(data, &res)
}

var metricLine = regexp.MustCompile(`^(kvbridge_rooms|kvbridge_rooms_past_deadline|kvbridge_pull_pages_under_lease)(\{[^}]*\})? ([0-9.e+-]+)$`)

// pinned reads a rank's /metrics: live non-terminal rooms and rooms past
// their deadline.
// pinnedAll sums the rooms every rank of insts holds live or past their
// deadline, adding to problems what could not be read and any pinned room.
func pinnedAll(insts []*instance, problems []string) (float64, []string) {
	n := 0.0
	for _, in := range insts {
		for _, p := range in.ranks {
			live, over, err := pinned(p.http)
			if err != nil {
				problems = append(problems, "reading metrics: "+err.Error())
			}
			n += live + over
		}
	}
	if n != 0 {
		problems = append(problems, fmt.Sprintf("%v rooms left live or past their deadline", n))
	}
	return n, problems
}

// instanceURLs lists the HTTP URLs of every rank of insts.
func instanceURLs(insts []*instance) []string {
	var out []string
	for _, in := range insts {
		for _, p := range in.ranks {
			out = append(out, p.http)
		}
	}
	return out
}

// demoLeaseBound bounds how long after the last request a prefill rank may
// still hold pulled pages: the defaults' stall deadline, lease (half the
// stall) and quarantine (twice the stall), and a second.
const demoLeaseBound = 60*time.Second + 30*time.Second + 120*time.Second + time.Second

// underLease reads a prefill rank's /metrics: its pages published for pull
// and not released yet.
func underLease(cl *http.Client, url string) (float64, error) {
	resp, err := cl.Get(url + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	n := 0.0
	for sc.Scan() {
		if m := metricLine.FindStringSubmatch(sc.Text()); m != nil && m[1] == "kvbridge_pull_pages_under_lease" {
			v, _ := strconv.ParseFloat(m[3], 64)
			n += v
		}
	}
	return n, sc.Err()
}

// leasesReleased waits up to bound for every rank of insts to have
// released the pages it published for pull (a room's decode ranks report
// their reads drained, or the quarantine past its lease runs out), adding
// to problems the pages still held then.
func leasesReleased(urls []string, bound time.Duration, problems []string) []string {
	cl := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(bound)
	for _, u := range urls {
		for {
			n, err := underLease(cl, u)
			if err != nil {
				problems = append(problems, "reading metrics: "+err.Error())
				break
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				problems = append(problems, fmt.Sprintf("%s: %v pulled pages still under lease %v after the last request (bound: stall, lease and quarantine)", u, n, bound))
				break
			}
			time.Sleep(100 * time.Millisecond) // a check's poll of the metric (its bound is above), not synchronisation
		}
	}
	return problems
}

// digestCounts sums the decode ranks' kvbridge_digest_pages_checked_total
// and kvbridge_digest_mismatches_total (docs/PROTOCOL.md "Digest").
func digestCounts(insts []*instance) (checked, mismatches float64, err error) {
	for _, in := range insts {
		for _, p := range in.ranks {
			resp, gerr := http.Get(p.http + "/metrics")
			if gerr != nil {
				return checked, mismatches, gerr
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				name, v, ok := strings.Cut(sc.Text(), " ")
				name, _, _ = strings.Cut(name, "{")
				f, perr := strconv.ParseFloat(v, 64)
				switch {
				case !ok || perr != nil:
				case name == "kvbridge_digest_pages_checked_total":
					checked += f
				case name == "kvbridge_digest_mismatches_total":
					mismatches += f
				}
			}
			resp.Body.Close()
			if err = sc.Err(); err != nil {
				return checked, mismatches, err
			}
		}
	}
	return checked, mismatches, nil
}

func pinned(url string) (live, overdue float64, err error) {
	return pinnedWith(http.DefaultClient, url)
}

// pinnedWith is pinned through a given client (one with a timeout, for a
// rank that may be stopped).
func pinnedWith(cl *http.Client, url string) (live, overdue float64, err error) {
	resp, err := cl.Get(url + "/metrics")
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		m := metricLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		switch {
		case m[1] == "kvbridge_rooms_past_deadline":
			overdue += v
		case m[1] == "kvbridge_pull_pages_under_lease":
		case !strings.Contains(m[2], `status="Failed"`) && !strings.Contains(m[2], `status="Success"`):
			live += v
		}
	}
	return live, overdue, sc.Err()
}

type outcome struct {
	tokens   int
	abort    string
	dec, pre []rankcmd.RoomResult // every decode rank, every prefill rank of the room's DP group
	err      error
}

// instance is a group of rank processes started together.
type instance struct {
	name  string
	boot  string
	ranks []*proc // by global rank index: ((dp × PP) + pp) × TP + tp
	par   []transfer.Parallel
}

func (in *instance) stop() {
	for _, p := range in.ranks {
		p.stop()
	}
}

// group returns the ranks of one DP group.
func (in *instance) group(dp int) []*proc {
	var out []*proc
	for i, p := range in.ranks {
		if in.par[i].DPRank == dp {
			out = append(out, p)
		}
	}
	return out
}

// startInstance starts every rank of an instance (rank 0 first; a prefill
// rank 0 serves the bootstrap server unless boot is given).
func startInstance(bin, role, name, boot string, shape transfer.Parallel, common []string) (*instance, error) {
	shape = shape.Norm()
	in := &instance{name: name, boot: boot}
	for dp := 0; dp < shape.DPSize; dp++ {
		for pp := 0; pp < shape.PPSize; pp++ {
			for tp := 0; tp < shape.TPSize; tp++ {
				in.par = append(in.par, transfer.Parallel{TPSize: shape.TPSize, TPRank: tp, PPSize: shape.PPSize, PPRank: pp, DPSize: shape.DPSize, DPRank: dp})
			}
		}
	}
	base := func(i int) []string {
		p := in.par[i]
		a := append(append([]string{}, common...), "-instance", name,
			"-tp", strconv.Itoa(p.TPSize), "-tp-rank", strconv.Itoa(p.TPRank), "-pp", strconv.Itoa(p.PPSize),
			"-pp-rank", strconv.Itoa(p.PPRank), "-dp", strconv.Itoa(p.DPSize), "-dp-rank", strconv.Itoa(p.DPRank))
		if in.boot == "" {
			return append(a, "-serve-bootstrap", "127.0.0.1:0")
		}
		return append(a, "-bootstrap", in.boot)
	}
	args := base
	in.ranks = make([]*proc, len(in.par))
	first, err := start(bin, role, args(0)...)
	if err != nil {
		return nil, err
	}
	in.ranks[0] = first
	if in.boot == "" {
		in.boot = first.boot
	}
	if slices.Contains(common, "tinyllm") {
		// The OpenAI routes are the first rank's: the others join it.
		args = func(i int) []string { return append(base(i), "-front", first.http) }
	}
	// The other ranks in parallel (a prefill rank's start waits for nothing
	// but its own registration).
	errs := make([]error, len(in.par))
	var wg sync.WaitGroup
	for i := 1; i < len(in.par); i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			in.ranks[i], errs[i] = start(bin, role, args(i)...)
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range in.ranks {
			if p != nil {
				p.stop()
			}
		}
		return nil, err
	}
	return in, nil
}

func main() { os.Exit(run(os.Args[1:])) }

// verdict ends a run's summary: its problems (the first max of them, 0:
// all), then note and the ranks' logs, kept, and exit status 1; or, with
// none, the logs removed, ok and 0.
func verdict(problems []string, max int, note string, logs []string, ok string) int {
	if len(problems) > 0 {
		fmt.Println("\nPROBLEMS:")
		for i, p := range problems {
			if i == max && max > 0 {
				fmt.Printf("  … and %d more\n", len(problems)-max)
				break
			}
			fmt.Println("  " + p)
		}
		fmt.Printf("\n%sthe ranks' logs (kept):\n", note)
		for _, l := range logs {
			fmt.Println("  " + l)
		}
		return 1
	}
	for _, l := range logs {
		os.Remove(l)
	}
	fmt.Println("\n" + ok)
	return 0
}

func allSucceeded(rs []rankcmd.RoomResult) bool {
	for _, r := range rs {
		if r.Status != "Success" {
			return false
		}
	}
	return len(rs) > 0
}

// budget is a counting semaphore of pages.
type budget struct {
	mu   sync.Mutex
	cond *sync.Cond
	free int
}

func newBudget(n int) *budget {
	b := &budget{free: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *budget) take(n int) {
	b.mu.Lock()
	for b.free < n {
		b.cond.Wait()
	}
	b.free -= n
	b.mu.Unlock()
}

func (b *budget) give(n int) {
	b.mu.Lock()
	b.free += n
	b.mu.Unlock()
	b.cond.Broadcast()
}

// judge says what is wrong with an outcome ("" if nothing): errors,
// corrupt pages, a decode rank that succeeded while a prefill rank of the
// room did not, or any rank not succeeding in a room without an abort.
func judge(w *outcome) string {
	if w.err != nil {
		return w.err.Error()
	}
	for i, d := range w.dec {
		switch {
		case d.Error != "":
			return fmt.Sprintf("decode rank %d: %s", i, d.Error)
		case d.Corrupt > 0:
			return fmt.Sprintf("decode rank %d: %d pages corrupt", i, d.Corrupt)
		case d.Status != "Success" && d.Status != "Failed":
			return fmt.Sprintf("decode rank %d ended %s", i, d.Status)
		case w.abort == "" && d.Status != "Success":
			return fmt.Sprintf("failed without an abort: decode rank %d %s (%s)", i, d.Status, d.Reason)
		}
	}
	for i, p := range w.pre {
		switch {
		case p.Error != "":
			return fmt.Sprintf("prefill rank %d: %s", i, p.Error)
		case w.abort == "" && p.Status != "Success":
			return fmt.Sprintf("failed without an abort: prefill rank %d %s (%s)", i, p.Status, p.Reason)
		case allSucceeded(w.dec) && p.Status != "Success":
			return fmt.Sprintf("every decode rank succeeded, prefill rank %d %s: %s", i, p.Status, p.Reason)
		}
	}
	return ""
}

func bar(done, total int) string {
	const w = 30
	n := done * w / max(total, 1)
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", w-n) + "]"
}

func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[min(len(v)-1, int(p*float64(len(v))))]
}
