package core

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The scenario transcripts (testdata/scenarios/*.txt): the races kvbridge
// exists for, as a reader follows them event by event (etcd-io/raft's
// testdata style). A transcript names a simulator configuration, then
// lists events in the simulator's own names ("> deliver 1→0 REQUEST"),
// each followed by what it changed: each process's rooms (status and
// reason), pages under a pull lease, the messages on each link, the writes
// and reads in flight. Comments (#) are kept. TestScenarios replays every
// transcript on the real core, checking every invariant after every event,
// and fails where the core now does something else; -rewrite writes the
// run's output into the files (then read the diff).

var rewrite = flag.Bool("rewrite", false, "TestScenarios: write each transcript's output from this run")

// scenarioConfigs are the configurations a transcript's "config:" line
// may name: the exhaustive ones by name, and bug 8's.
func scenarioConfigs() map[string]simConfig {
	cfgs := map[string]simConfig{"bug 8: a decode rank restarts before the sender exists": restartScriptConfig()}
	for name, sc := range simExhaustiveConfigs() {
		cfgs[name] = sc.cfg
	}
	// The hostile renewer with time enough to see the quarantine end.
	h := cfgs["1→1 pull: the decode rank renews forever and never reads (hostile); liveness while it renews"]
	h.ticks, h.jumps = 0, append(slices.Clone(h.jumps), h.quarantine)
	cfgs["1→1 pull: the decode rank renews forever and never reads (hostile), time unbounded"] = h
	return cfgs
}

func TestScenarios(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "scenarios", "*.txt"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no transcripts in testdata/scenarios")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			got, err := runTranscript(string(b))
			require.NoError(t, err, f)
			if *rewrite {
				require.NoError(t, os.WriteFile(f, []byte(got), 0o644))
				return
			}
			if got != string(b) {
				t.Errorf("%s: the core now does something else (go test -run TestScenarios ./internal/core -rewrite rewrites it; read the diff):\n%s", f, firstDiff(string(b), got))
			}
		})
	}
}

// runTranscript replays a transcript and returns it with each event's
// output as this run makes it.
func runTranscript(in string) (string, error) {
	var out strings.Builder
	var w *simWorld
	var prev []string
	for i, line := range strings.Split(strings.TrimRight(in, "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "  "): // an event's output: made anew below
		case strings.HasPrefix(line, "config: "):
			name := strings.TrimPrefix(line, "config: ")
			cfg, ok := scenarioConfigs()[name]
			if !ok {
				return "", fmt.Errorf("line %d: no configuration %q", i+1, name)
			}
			w = startWorld(cfg)
			if w.err != nil {
				return "", fmt.Errorf("line %d: %v", i+1, w.err)
			}
			prev = w.describe()
			fmt.Fprintln(&out, line)
			for _, l := range prev {
				fmt.Fprintln(&out, "  "+l)
			}
		case strings.HasPrefix(line, "> "):
			if w == nil {
				return "", fmt.Errorf("line %d: an event before the config line", i+1)
			}
			name := strings.TrimPrefix(line, "> ")
			evs := w.events()
			k := slices.IndexFunc(evs, func(e simEvent) bool { return e.name == name })
			if k < 0 {
				var can []string
				for _, e := range evs {
					can = append(can, e.name)
				}
				return "", fmt.Errorf("line %d: %q cannot happen here; what can: %q", i+1, name, can)
			}
			w.apply(evs[k])
			fmt.Fprintln(&out, line)
			if w.err != nil {
				fmt.Fprintln(&out, "  VIOLATION: "+w.err.Error())
				w.err = nil
			}
			cur := w.describe()
			for _, l := range cur {
				if !slices.Contains(prev, l) {
					fmt.Fprintln(&out, "  "+l)
				}
			}
			for _, l := range prev {
				if subject, _, _ := strings.Cut(l, ":"); !slices.Contains(cur, l) && !replaced(subject, cur) {
					fmt.Fprintln(&out, "  "+subject+": none")
				}
			}
			prev = cur
		default: // comments and blank lines
			fmt.Fprintln(&out, line)
		}
	}
	return out.String(), nil
}

// replaced: a line of the subject (before its colon) is in cur.
func replaced(subject string, cur []string) bool {
	return slices.ContainsFunc(cur, func(c string) bool { s, _, _ := strings.Cut(c, ":"); return s == subject })
}

// describe is the world as a transcript shows it, one line per subject.
func (w *simWorld) describe() []string {
	var out []string
	name := func(slot int) string {
		if w.isPrefill(slot) {
			return fmt.Sprintf("prefill %d", slot)
		}
		return fmt.Sprintf("decode %d", slot-w.cfg.prefills)
	}
	for slot, p := range w.procs {
		switch {
		case p == nil || p.dead:
			out = append(out, name(slot)+": down")
			continue
		case p.paused:
			out = append(out, name(slot)+": paused")
		}
		for _, r := range w.rooms {
			st, ok := p.core.Status(r.id)
			if !ok {
				continue
			}
			l := fmt.Sprintf("%s room %d: %v", name(slot), r.id, st)
			if why, _ := p.core.Failure(r.id); why != "" {
				l += " (" + why + ")"
			}
			out = append(out, l)
		}
		if sz := p.core.Sizes(); sz.Pending+sz.Tombstones+sz.Draining+sz.PullHolds > 0 {
			out = append(out, fmt.Sprintf("%s holds: %d pending REQUESTs, %d tombstones (%d draining), %d pull holds",
				name(slot), sz.Pending, sz.Tombstones, sz.Draining, sz.PullHolds))
		}
		if n := p.core.PagesUnderLease(); n > 0 {
			out = append(out, fmt.Sprintf("%s pages under lease: %d", name(slot), n))
		}
	}
	for src := range w.net {
		for dst, q := range w.net[src] {
			if len(q) == 0 {
				continue
			}
			var types []string
			for _, m := range q {
				types = append(types, m.msg.Type().String())
			}
			out = append(out, fmt.Sprintf("link %d→%d: %s", src, dst, strings.Join(types, ", ")))
		}
	}
	if n := len(w.writes); n > 0 {
		out = append(out, fmt.Sprintf("writes in flight: %d", n))
	}
	if n := len(w.reads); n > 0 {
		out = append(out, fmt.Sprintf("reads asked for: %d", n))
	}
	return out
}

// firstDiff shows where two transcripts part.
func firstDiff(want, got string) string {
	a, b := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(a), len(b)); i++ {
		x, y := at(a, i), at(b, i)
		if x != y {
			return fmt.Sprintf("line %d:\n  file: %q\n  run:  %q", i+1, x, y)
		}
	}
	return ""
}
