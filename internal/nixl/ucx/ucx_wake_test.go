package ucx

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// settle waits until a's progress loop has stopped making passes (it is
// asleep), bounded: every 20 ms it compares the pass count.
func settle(t *testing.T, a *nixl.Agent) *ucx {
	t.Helper()
	u := a.Backend().(*ucx)
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	prev := u.passes.Load()
	for range tick.C {
		now := u.passes.Load()
		if now == prev {
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent %s: its progress loop is still making passes after 10 s idle (%d in the last 20 ms)", a.Name(), now-prev)
		}
		prev = now
	}
	return u
}

// TestUCXIdleSleepsOnEventFD: an idle ucx agent's progress goroutine sleeps
// on the worker's event fd (issue 24: it woke every millisecond, 5 % of a
// core), and traffic still wakes it: a notification sent to a sleeping
// agent is delivered, and a put over tcp — emulated, so the sleeping
// target must progress for it to land — completes.
func TestUCXIdleSleepsOnEventFD(t *testing.T) {
	for _, ec := range engines()[1:3] { // ucx-shm, ucx-tcp
		t.Run(ec.name, func(t *testing.T) {
			p := newPair(t, ec)
			const size = 1 << 20
			_, src, _ := p.ini.Alloc(size)
			_, dst, _ := p.tgt.Alloc(size)
			p.remote = exchange(t, p.ini, p.tgt)
			// Endpoints wired up both ways before the agents go idle.
			require.NoError(t, p.tgt.GenNotif(p.ini.Name(), []byte("hello")))
			waitNotif(t, p.ini, time.Minute)

			for _, a := range []*nixl.Agent{p.ini, p.tgt} {
				u := settle(t, a)
				require.NotNil(t, u.waker, "agent %s has no event fd: its progress goroutine polls", a.Name())
				before := u.passes.Load()
				time.Sleep(100 * time.Millisecond) // observed, not synchronised on
				require.LessOrEqual(t, u.passes.Load()-before, uint64(3), "agent %s idle: progress passes in 100 ms (the 1 ms back-off made ~100)", a.Name())
			}

			// A message to the sleeping target wakes it.
			tu := p.tgt.Backend().(*ucx)
			woke := tu.wakeups.Load()
			require.NoError(t, p.ini.GenNotif(p.remote, []byte("wake")))
			select {
			case <-p.tgt.NotifyC():
			case <-time.After(time.Minute):
				t.Fatal("a notification to a sleeping agent was not delivered within a minute")
			}
			n := waitNotif(t, p.tgt, time.Minute)
			require.Equal(t, "wake", string(n.Msg), "delivered")
			require.NotEqual(t, woke, tu.wakeups.Load(), "the notification was delivered without the event fd waking the target")

			// A write into the sleeping target, notification included.
			settle(t, p.tgt)
			fill(src, 24)
			x := write(t, p, []nixl.Desc{nixl.BytesDesc(src)}, []nixl.Desc{nixl.BytesDesc(dst)}, []byte("data"))
			st, err := wait(t, p.ini, x, time.Minute)
			require.Equal(t, nixl.Done, st, "write into a sleeping target: %v", err)
			n = waitNotif(t, p.tgt, time.Minute)
			require.Equal(t, "data", string(n.Msg), "notification, data equal %v", bytes.Equal(src, dst))
			require.True(t, bytes.Equal(src, dst), "notification %q, data equal", n.Msg)
			p.ini.Release(x)
		})
	}
}

// TestUCXAdaptiveProgressOff: the ucx engine gives UCX adaptive progress
// off unless the user chose it in Config.UCX (UCX_ADAPTIVE_PROGRESS only
// through Config.FromEnv: TestUCXSettingsOnlyThroughFromEnv), and keeps
// its idle back-off timer only when it is on. (The behaviour it prevents,
// a sleeping target missing an event, is TestUCXNoLostWakeCrossProcess: 1
// in ~20,000 writes, so that test alone does not catch its return on every
// run.)
func TestUCXAdaptiveProgressOff(t *testing.T) {
	for _, tc := range []struct {
		keys, env string // env "": unset
		want      string // the key given to UCX
		on        bool
	}{
		{"", "", "n", false},
		{"ADAPTIVE_PROGRESS=y", "", "y", true},
		{"ADAPTIVE_PROGRESS=off", "y", "off", false},
		{"", "y", "n", false}, // the environment is FromEnv's to read
		{"ADAPTIVE_PROGRESS=no", "", "no", false},
	} {
		keys := map[string]string{}
		if k, v, ok := strings.Cut(tc.keys, "="); ok {
			keys[k] = v
		}
		t.Setenv("UCX_ADAPTIVE_PROGRESS", tc.env)
		_, on, err := ucxChoices(keys)
		require.NoError(t, err)
		assert.Equal(t, tc.want, keys["ADAPTIVE_PROGRESS"], "keys %q, UCX_ADAPTIVE_PROGRESS %q: UCX gets (on %v, want on %v)", tc.keys, tc.env, on, tc.on)
		assert.Equal(t, tc.on, on, "keys %q, UCX_ADAPTIVE_PROGRESS %q: UCX gets %q, on", tc.keys, tc.env, keys["ADAPTIVE_PROGRESS"])
	}
}

// TestSpinWindowAfterServingAPeer: progress that found work while none
// of the agent's own transfers was in flight, on an agent exposing caller
// memory, served a peer's puts into it (emulated, moving only while this
// side polls): the progress goroutine keeps polling for the longer target
// window; after its own traffic, after nothing, or with only memory UCX
// allocated (peers copy into it directly), for the short one.
func TestSpinWindowAfterServingAPeer(t *testing.T) {
	for _, c := range []struct {
		events      uint
		own, caller bool
		want        time.Duration
	}{
		{3, false, true, targetSpinWindow},
		{3, true, true, spinWindow},
		{0, false, true, spinWindow},
		{3, false, false, spinWindow},
		{0, true, false, spinWindow},
	} {
		assert.Equal(t, c.want, spinFor(c.events, c.own, c.caller), "spinFor(%d events, own transfers %v, caller memory %v)", c.events, c.own, c.caller)
	}
	assert.Greater(t, targetSpinWindow, spinWindow, "the target window is no longer than the initiator's")
	for tls, want := range map[string]bool{"": true, "all": true, "posix,cma,self": true, "sm,self": true, "tcp": false,
		"tcp,self": false, "^tcp": true, "^sm": false, "^shm,tcp": false, "rc,ud,self": false, "sysv": true,
		"^posix,sysv,xpmem,knem,cma": false, "^mm,knem,cma": false, "^mm": true, "^posix": true, "^all": false, "cma,tcp": true} {
		assert.Equal(t, want, tlsSharedMemory(tls), "tlsSharedMemory(%q)", tls)
	}
	// Over tcp the engine's own write messages wake the target: no long
	// spin, caller memory or not.
	tcp := open(t, engines()[2], "spin-tcp")
	_, err := tcp.RegisterBytes(make([]byte, 1<<16))
	require.NoError(t, err)
	tu := tcp.Backend().(*ucx)
	var served bool
	require.NoError(t, tu.do(func() error { served = tu.servesEmulatedPuts(); return nil }))
	assert.False(t, served, "an agent on tcp alone takes the long spin window")
	// The agent knows whether it exposes caller memory.
	a := open(t, engines()[1], "spin")
	u := a.Backend().(*ucx)
	count := func() int {
		var n int
		require.NoError(t, u.do(func() error { n = u.callerRegs; return nil }))
		return n
	}
	_, _, err = a.Alloc(1 << 16)
	require.NoError(t, err)
	require.Zero(t, count(), "caller registrations after an Alloc")
	r, err := a.RegisterBytes(make([]byte, 1<<16))
	require.NoError(t, err)
	require.Equal(t, 1, count(), "caller registrations after RegisterBytes")
	served = false
	require.NoError(t, u.do(func() error { served = u.servesEmulatedPuts(); return nil }))
	assert.True(t, served, "an agent on shared memory exposing caller memory does not take the long spin window")
	require.NoError(t, a.Deregister(r))
	require.Zero(t, count(), "caller registrations after Deregister")
}
