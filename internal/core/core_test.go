package core

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/require"
)

// Unit tests of the core for the review's bugs that are about liveness or
// configuration rather than page safety (the simulator covers those).

var t0 = time.Unix(1_000_000, 0)

func testCore(t *testing.T, role Role) *Core {
	t.Helper()
	return newTestCore(t, role, simRegistryConfig())
}

// newTestCore is a core over simLayout with the given registry settings.
func newTestCore(tb testing.TB, role Role, reg RegistryConfig) *Core {
	tb.Helper()
	cfg := CoreConfig{Role: role, Compat: "sim", Layout: simLayout(), Registry: reg,
		QuarantineTimeout: max(30*time.Second, 2*reg.StallTimeout), RegisterRetry: time.Second}
	if role == RoleDecode {
		kv, aux, state := RegionsOf(simLayout())
		cfg.Register = wire.Register{Compat: "sim", Agent: "decode-agent", KV: kv, Aux: aux, State: state, TPSize: 1}
		cfg.Identity = decodeFrom.Peer()
	}
	c, err := NewCore(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

var (
	decodeFrom  = wire.From{Role: "decode", Instance: "d", Rank: 0, Endpoint: "tcp://d:1", Epoch: 1}
	prefillFrom = wire.From{Role: "prefill", Instance: "p", Rank: 0, Endpoint: "tcp://p:1", Epoch: 10}
	prefillT    = Target{Bootstrap: "http://boot", Rank: 0}
)

// sent returns the messages of type T among effects.
func sent[T wire.Message](effects []Effect) []T {
	var out []T
	for _, e := range effects {
		if m, ok := e.Msg.(T); ok && e.Kind == EffectSend {
			out = append(out, m)
		}
	}
	return out
}

// agentOf is a test decode rank's agent name (each rank its own).
func agentOf(from wire.From) string { return "agent-" + from.Peer() }

// testPeerPages is how many pages register's decode layout holds: request
// names a page of its own for each room (a decode rank never names a page
// another live room of it holds, or the prefill rank refuses the REQUEST).
const testPeerPages = 4096

func register(t *testing.T, c *Core, from wire.From) {
	t.Helper()
	peer := simLayout()
	for i := range peer.Regions {
		peer.Regions[i] = mem.Desc{Addr: uintptr(0x100000 * (i + 1)), Len: testPeerPages * 64}
	}
	registerLayout(t, c, from, peer)
}

// registerLayout registers from at c with the decode layout peer.
func registerLayout(t *testing.T, c *Core, from wire.From, peer kvlayout.Layout) {
	t.Helper()
	kv, aux, state := RegionsOf(peer)
	msg := &wire.Register{From: from, Compat: "sim", Agent: agentOf(from), KV: kv, Aux: aux, State: state}
	lay, err := c.CheckRegister(msg)
	if err != nil {
		t.Fatal(err)
	}
	echoChallenge(t, c, msg, t0)
	c.Step(t0, Registered{From: from, Remote: agentOf(from), Plan: lay})
	if acks := sent[*wire.RegisterAck](c.Effects()); len(acks) != 1 || !acks[0].OK {
		t.Fatalf("REGISTER not acknowledged: %v", acks)
	}
}

func request(room uint64, from wire.From) *wire.Request {
	return &wire.Request{From: from, Room: room, DstPages: []uint32{uint32(room % testPeerPages)}, AuxIndex: -1, Required: 1, StateIndices: [][]uint32{}}
}

// Bug 5: one false "peer dead" must not break the pair for good. The
// prefill rank keeps the registration (bound to the epoch, not to
// heartbeats), so the next REQUEST from the same process is accepted.
func TestFalsePeerDeadKeepsRegistration(t *testing.T) {
	fixedAndMutant(t, "drop-reg-on-peer-down", func(t *testing.T, ok bool) {
		c := testCore(t, RolePrefill)
		register(t, c, decodeFrom)
		c.Step(t0, CreateSender{Room: 1})
		c.Step(t0, Received{Msg: request(1, decodeFrom)})
		c.Effects()
		c.Step(t0, PeerUnreachable{Endpoint: decodeFrom.Endpoint, Reason: wire.ReasonPeerUnreachable})
		if st, _ := c.Status(1); st != Failed {
			t.Fatalf("the room shared with the peer is %v, want Failed", st)
		}
		c.Effects()
		accepted := c.Step(t0, Received{Msg: request(2, decodeFrom)}).OK
		st := sent[*wire.Status](c.Effects())
		if accepted != ok {
			t.Fatalf("next REQUEST accepted %v (statuses %+v), want %v", accepted, st, ok)
		}
		if !ok && (len(st) != 1 || st[0].Code != CodeNotRegistered) {
			t.Fatalf("refusal %+v, want code %s", st, CodeNotRegistered)
		}
	})
}

// Bug 5, decode side: STATUS not_registered makes decode register again and
// resend the room's REQUEST instead of failing the room.
func TestNotRegisteredReregisters(t *testing.T) {
	c := testCore(t, RoleDecode)
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
	c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
	if reqs := sent[*wire.Request](c.Effects()); len(reqs) != 1 {
		t.Fatalf("REQUEST not sent: %v", reqs)
	}
	c.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Room: 1, Status: wire.StatusFailed, Code: CodeNotRegistered, Reason: "x"}})
	if regs := sent[*wire.Register](c.Effects()); len(regs) != 1 {
		t.Fatalf("not registered again: %v", regs)
	}
	c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
	if reqs := sent[*wire.Request](c.Effects()); len(reqs) != 1 || reqs[0].Room != 1 {
		t.Fatalf("REQUEST not resent: %v", reqs)
	}
	if st, _ := c.Status(1); st != WaitingForInput {
		t.Fatalf("room %v, want WaitingForInput", st)
	}
	// A second not_registered for the same room fails it (no loop).
	c.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Room: 1, Status: wire.StatusFailed, Code: CodeNotRegistered, Reason: "again"}})
	if st, _ := c.Status(1); st != Failed {
		t.Fatalf("room %v after a second refusal, want Failed", st)
	}
}

// Bug 6: a REGISTER that got no answer is sent again, backing off, until
// acknowledged; then the waiting room's REQUEST goes out.
func TestRegisterRetried(t *testing.T) {
	c := testCore(t, RoleDecode)
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
	if regs := sent[*wire.Register](c.Effects()); len(regs) != 1 {
		t.Fatalf("first REGISTER: %v", regs)
	}
	now, retries := t0, 0
	for _, d := range []time.Duration{1, 2, 4} { // seconds: 1 s doubling
		c.Step(now.Add(d*time.Second-time.Millisecond), Tick{})
		if n := len(sent[*wire.Register](c.Effects())); n != 0 {
			t.Fatalf("REGISTER resent before its backoff (%v)", d)
		}
		now = now.Add(d*time.Second + time.Millisecond)
		c.Step(now, Tick{})
		retries += len(sent[*wire.Register](c.Effects()))
	}
	if retries != 3 || c.Stats().RegisterRetries != 3 {
		t.Fatalf("%d retries (stats %d), want 3", retries, c.Stats().RegisterRetries)
	}
	c.Step(now, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
	if reqs := sent[*wire.Request](c.Effects()); len(reqs) != 1 {
		t.Fatalf("REQUEST after the late ACK: %v", reqs)
	}
	c.Step(now.Add(time.Minute), Tick{})
	if n := len(sent[*wire.Register](c.Effects())); n != 0 {
		t.Fatal("REGISTER resent after the ACK")
	}
}

// REGISTER retries stop once no room waits for the answer (the room that
// asked was aborted, e.g. its caller's context ended).
func TestRegisterRetriesStopWithoutWaiters(t *testing.T) {
	c := testCore(t, RoleDecode)
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
	c.Step(t0, AbortReceiver{Room: 1, Reason: "context deadline exceeded"})
	c.Effects()
	for i := 1; i <= 5; i++ {
		c.Step(t0.Add(time.Duration(i)*time.Minute), Tick{})
	}
	if n := len(sent[*wire.Register](c.Effects())); n != 0 || c.Stats().RegisterRetries != 0 {
		t.Fatalf("%d REGISTERs sent for nobody", n)
	}
	// The next room registers afresh.
	c.Step(t0.Add(6*time.Minute), CreateReceiver{Room: 2, Targets: []Target{prefillT}})
	c.Step(t0.Add(6*time.Minute), InitReceiver{Room: 2, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
	if n := len(sent[*wire.Register](c.Effects())); n != 1 {
		t.Fatalf("%d REGISTERs for a new room, want 1", n)
	}
}

// Bug 7: requests for rooms whose sender never appears leave nothing
// behind once the pending deadline and the TTL pass, while the peer stays
// registered and alive.
func TestPendingRequestsLeaveNothing(t *testing.T) {
	c := testCore(t, RolePrefill)
	register(t, c, decodeFrom)
	n := c.cfg.Registry.MaxPendingPerPeer
	for room := uint64(1); room <= uint64(n); room++ {
		c.Step(t0, Received{Msg: request(room, decodeFrom)})
	}
	if s := c.Sizes(); s.Pending != n {
		t.Fatalf("sizes %+v", s)
	}
	c.Step(t0.Add(16*time.Second), Tick{})  // pending deadline → tombstones
	c.Step(t0.Add(200*time.Second), Tick{}) // TTL
	if s := c.Sizes(); s.Total() != 0 || s.Peers != 1 {
		t.Fatalf("sizes %+v: want nothing room-bound left, the peer still registered", s)
	}
}

// Bug 9: the REGISTER_ACK of a restarted prefill rank comes from its new
// epoch and the control loop reports the restart first; the registration
// in progress must survive that and complete.
func TestRestartReportKeepsRegistrationInProgress(t *testing.T) {
	fixedAndMutant(t, "restart-drops-pending", func(t *testing.T, ok bool) {
		c := testCore(t, RoleDecode)
		c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
		c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
		c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
		c.Effects()
		restarted := prefillFrom
		restarted.Epoch = 11
		// The old process was heard (a STATUS of a room this rank
		// does not know), then the new epoch's ACK arrives: Step
		// reports the restart first, then takes the ACK.
		c.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Room: 99, Status: wire.StatusFailed, Reason: "x"}})
		c.Step(t0, Received{Msg: &wire.RegisterAck{From: restarted, OK: true}})
		reqs := sent[*wire.Request](c.Effects())
		if (len(reqs) == 1) != ok {
			t.Fatalf("REQUEST sent after the new epoch's ACK: %v, want %v", reqs, ok)
		}
	})
}

// Bug 9: after a restart on the same endpoint, the decode room bound to
// the old epoch fails and the new process gets an ABORT, so a sender it
// creates for that room id starts Failed instead of waiting its deadline.
func TestRestartFailsRoomAndAbortsNewProcess(t *testing.T) {
	c := testCore(t, RoleDecode)
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
	c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
	c.Effects()
	restarted := prefillFrom
	restarted.Epoch = 11
	// The new process's first message (a STATUS of a room this rank does
	// not know) reports the restart.
	c.Step(t0, Received{Msg: &wire.Status{From: restarted, Room: 99, Status: wire.StatusFailed, Reason: "x"}})
	if st, _ := c.Status(1); st != Failed {
		t.Fatalf("room %v, want Failed", st)
	}
	if r, _ := c.Failure(1); !strings.Contains(r, wire.ReasonPeerRestarted) {
		t.Fatalf("reason %q", r)
	}
	eff := c.Effects()
	if ab := sent[*wire.Abort](eff); len(ab) != 1 || ab[0].Room != 1 {
		t.Fatalf("ABORT to the restarted endpoint: %v", ab)
	}
	// An ABORT_ACK from the new process does not release the pages: only
	// the process the REQUEST went to can say nothing of it will land.
	c.Step(t0, Received{Msg: &wire.AbortAck{From: restarted, Room: 1, Drained: true}})
	if held := c.Hold(1); !held {
		t.Fatal("pages released by an ABORT_ACK from another epoch")
	}
	c.Step(t0, Received{Msg: &wire.AbortAck{From: prefillFrom, Room: 1, Drained: true}})
	if held := c.Hold(1); held {
		t.Fatal("pages still held after the old epoch's drained ABORT_ACK")
	}
	// The release wakes the hold's waiters (the shell's Released): the
	// effect names the room and the hold.
	var wakes []Effect
	for _, e := range c.Effects() {
		if e.Kind == EffectWake {
			wakes = append(wakes, Effect{Kind: e.Kind, Room: e.Room, Wake: e.Wake})
		}
	}
	require.Equal(t, []Effect{{Kind: EffectWake, Room: 1, Wake: WakeHold}}, wakes, "wakes at the release")
}

// Bug 4 at the core's surface: an abort before Init is sent to the
// target as soon as it is known.
func TestAbortBeforeInitIsSent(t *testing.T) {
	c := testCore(t, RoleDecode)
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, AbortReceiver{Room: 1, Reason: "client went away"})
	if ab := sent[*wire.Abort](c.Effects()); len(ab) != 0 {
		t.Fatalf("ABORT sent before the target is known: %v", ab)
	}
	c.Step(t0, ClearReceiver{Room: 1}) // even a Clear before the lookup answers keeps it owed
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	if ab := sent[*wire.Abort](c.Effects()); len(ab) != 1 || ab[0].Room != 1 {
		t.Fatalf("owed ABORT not sent once the target resolved: %v", ab)
	}
}

// Hostile input the core bounds itself (more in issue 14's tests).
func TestCoreBoundsHostileInput(t *testing.T) {
	t.Run("stray ABORT on a decode rank", func(t *testing.T) {
		c := testCore(t, RoleDecode)
		c.Step(t0, Received{Msg: &wire.Abort{From: prefillFrom, Room: 9, Reason: "forged"}})
		if s := c.Sizes(); s.Total() != 0 || c.Stats().Refused != 1 {
			t.Fatalf("an ABORT on a decode rank left %+v (refused %d)", s, c.Stats().Refused)
		}
		if res := c.Step(t0, CreateReceiver{Room: 9, Targets: []Target{prefillT}}).Result; res.Status != Bootstrapping {
			t.Fatalf("the room after a stray ABORT: %v", res.Status)
		}
	})
	t.Run("reasons are cut", func(t *testing.T) {
		c := testCore(t, RolePrefill)
		huge := strings.Repeat("x", 1<<20)
		c.Step(t0, Received{Msg: &wire.Abort{From: decodeFrom, Room: 1, Reason: huge}})
		c.Step(t0, CreateSender{Room: 1})
		r, _ := c.Failure(1)
		if len(r) > c.cfg.Registry.MaxReasonBytes || !strings.HasSuffix(r, "…") {
			t.Fatalf("reason of %d bytes kept (bound %d)", len(r), c.cfg.Registry.MaxReasonBytes)
		}
	})
	t.Run("one peer cannot fill the pending table", func(t *testing.T) {
		c := testCore(t, RolePrefill)
		registerBoth(t, c)
		other := otherDecode
		limit := c.cfg.Registry.MaxPendingPerPeer
		for room := uint64(1); room <= uint64(limit)+5; room++ {
			c.Step(t0, Received{Msg: request(room, decodeFrom)})
		}
		st := sent[*wire.Status](c.Effects())
		if s := c.Sizes(); s.Pending != limit || len(st) != 5 {
			t.Fatalf("pending %d (limit %d), %d refusals", s.Pending, limit, len(st))
		}
		if !c.Step(t0, Received{Msg: request(1000, other)}).OK {
			t.Fatal("another peer was locked out")
		}
		c.Step(t0, CreateSender{Room: 1}) // takes room 1's request out of pending
		c.Effects()
		if !c.Step(t0, Received{Msg: request(2000, decodeFrom)}).OK {
			t.Fatal("the peer's count did not go down when its room left pending")
		}
	})
	t.Run("required and prefix in range", func(t *testing.T) {
		c := testCore(t, RolePrefill)
		register(t, c, decodeFrom)
		for _, mut := range []func(r *wire.Request){
			func(r *wire.Request) { r.Required = MaxRequired + 1 },
			func(r *wire.Request) { r.Prefix = 1 << 30 },
		} {
			r := request(5, decodeFrom)
			mut(r)
			if c.Step(t0, Received{Msg: r}).OK {
				t.Fatalf("accepted %+v", r)
			}
			if st := sent[*wire.Status](c.Effects()); len(st) != 1 || st[0].Code != CodeOutOfRange {
				t.Fatalf("refusal %+v", st)
			}
		}
	})
}

// TestCheckRegisterTopology: with a Model, a prefill rank accepts a decode
// rank's REGISTER only for a pair the rank mapping supports and a layout
// that fits it, and computes the head slice it will write; every refusal
// names what does not fit (the decode side refuses the same pairs before
// registering: TestCreateReceiverForRefusesUnsupportedTopology).
func TestCheckRegisterTopology(t *testing.T) {
	m := kvlayout.Model{Layers: 2, KVHeads: 4, HeadBytes: 8, PageTokens: 2}
	prefillPar := kvlayout.Parallel{TPSize: 2, TPRank: 1}
	lay := func(par kvlayout.Parallel) kvlayout.Layout {
		par = par.Norm()
		pb, _ := m.PageBytes(par.TPSize)
		_, layers := m.StageLayers(par.PPSize, par.PPRank)
		l := kvlayout.Layout{Kind: mem.DRAM, PageBytes: pb}
		for i := 0; i < layers*kvlayout.RegionsPerLayer; i++ {
			l.Regions = append(l.Regions, mem.Desc{Addr: uintptr(1<<20 + i*4096), Len: 8 * pb})
		}
		return l
	}
	c, err := NewCore(CoreConfig{Role: RolePrefill, Compat: "sim", Layout: lay(prefillPar), Registry: simRegistryConfig(),
		QuarantineTimeout: 30 * time.Second, RegisterRetry: time.Second, Parallel: prefillPar, Model: m})
	if err != nil {
		t.Fatal(err)
	}
	reg := func(par kvlayout.Parallel, mod func(*wire.Register)) *wire.Register {
		kv, aux, state := RegionsOf(lay(par))
		r := &wire.Register{From: decodeFrom, Compat: "sim", KV: kv, Aux: aux, State: state, TPSize: par.Norm().TPSize, TPRank: par.TPRank,
			Topo: &wire.Topo{PPSize: par.Norm().PPSize, PPRank: par.PPRank, DPSize: 1, Layers: 2, KVHeads: 4, HeadBytes: 8, PageTokens: 2, PageLayout: "NHD"}}
		if mod != nil {
			mod(r)
		}
		return r
	}
	pp, err := c.CheckRegister(reg(kvlayout.Parallel{TPSize: 1}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !pp.Mapped || pp.Plan == nil || pp.Plan.SrcHead != 0 || pp.Plan.DstHead != 2 || pp.Plan.Heads != 2 || pp.Plan.Full {
		t.Fatalf("TP 2 rank 1 → TP 1: plan %+v", pp.Plan)
	}
	for _, tc := range []struct {
		name string
		r    *wire.Register
		want string
	}{
		{"decode PP 2 from prefill PP 1", reg(kvlayout.Parallel{PPSize: 2}, nil), "decode PP must equal prefill PP, or be 1"},
		{"TP 3", reg(kvlayout.Parallel{TPSize: 1}, func(r *wire.Register) { r.TPSize = 3 }), "one must divide the other"},
		{"not among the decode rank's prefill ranks", reg(kvlayout.Parallel{TPSize: 2, TPRank: 0}, nil), "is not among decode TP rank 0's prefill ranks"},
		{"another model", reg(kvlayout.Parallel{TPSize: 1}, func(r *wire.Register) { r.Topo.KVHeads = 8 }), "model mismatch"},
		{"no topology", reg(kvlayout.Parallel{TPSize: 1}, func(r *wire.Register) { r.Topo = nil }), "sent no topology"},
		{"a stale view of the instance", reg(kvlayout.Parallel{TPSize: 1}, func(r *wire.Register) { r.Topo.PeerTPSize, r.Topo.PeerPPSize = 1, 1 }),
			"its view of the instance is stale"},
		{"wrong page bytes", reg(kvlayout.Parallel{TPSize: 1}, func(r *wire.Register) {
			for i := range r.KV {
				r.KV[i].ItemLen *= 2
				r.KV[i].Len *= 2
			}
		}), "byte pages"},
	} {
		if _, err := c.CheckRegister(tc.r); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestTargetChangedByDiscovery: a discovery backend's watch reports a
// prefill rank's record moved (a restart elsewhere) or vanished. The room
// bound to the old process fails at once with an ABORT to it; a moved
// target takes its new endpoint without a lookup, a vanished one is looked
// up again by the next room; an unchanged record changes nothing.
func TestTargetChangedByDiscovery(t *testing.T) {
	setup := func() *Core {
		c := testCore(t, RoleDecode)
		c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
		c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
		c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: []uint32{1}, AuxIndex: -1}})
		c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
		c.Effects()
		return c
	}
	c := setup()
	c.Step(t0, TargetChanged{Target: prefillT, Endpoint: prefillFrom.Endpoint, ServerKey: "", Epoch: prefillFrom.Epoch, Gone: false})
	if st, _ := c.Status(1); st.Terminal() {
		t.Fatalf("an unchanged record failed the room: %v", st)
	}
	c.Step(t0, TargetChanged{Target: prefillT, Endpoint: "tcp://p:2", ServerKey: "", Epoch: 0, Gone: false})
	if r, _ := c.Failure(1); !strings.Contains(r, "discovery record moved to tcp://p:2") {
		t.Fatalf("room after a move: %q", r)
	}
	// The ABORT goes to the old process and, since it has not answered, to
	// the new one: either may hold the room.
	var to []string
	for _, e := range c.Effects() {
		if _, ok := e.Msg.(*wire.Abort); ok && e.Kind == EffectSend {
			to = append(to, e.To.Endpoint)
		}
	}
	if !slices.Equal(to, []string{prefillFrom.Endpoint, "tcp://p:2"}) {
		t.Fatalf("ABORTs went to %v, want the old process then the new one", to)
	}
	if tg := c.targets[prefillT.key()]; !tg.resolved || tg.endpoint != "tcp://p:2" || tg.reg != regNone {
		t.Fatalf("target after a move: %+v", tg)
	}

	// Restarted in place: same endpoint, another epoch.
	c = setup()
	c.Step(t0, TargetChanged{Target: prefillT, Endpoint: prefillFrom.Endpoint, ServerKey: "", Epoch: prefillFrom.Epoch + 1, Gone: false})
	if r, _ := c.Failure(1); !strings.Contains(r, "names a new process") {
		t.Fatalf("room after a restart in place: %q", r)
	}
	if tg := c.targets[prefillT.key()]; tg.reg != regNone || !tg.resolved {
		t.Fatalf("target after a restart in place: %+v (want resolved, registration to redo)", tg)
	}

	c = setup()
	c.Step(t0, TargetChanged{Target: prefillT, Endpoint: "", ServerKey: "", Epoch: 0, Gone: true})
	if r, _ := c.Failure(1); !strings.Contains(r, "discovery record vanished") {
		t.Fatalf("room after the record vanished: %q", r)
	}
	if tg := c.targets[prefillT.key()]; tg.resolved {
		t.Fatalf("a vanished target still resolved: %+v", tg)
	}
	// The ABORT it owes makes the rank be looked up again at once; the
	// next room waits for that lookup.
	c.Step(t0, CreateReceiver{Room: 2, Targets: []Target{prefillT}})
	resolves := 0
	for _, e := range c.Effects() {
		if e.Kind == EffectResolve {
			resolves++
		}
	}
	if resolves != 1 {
		t.Fatalf("the vanished target was looked up %d times, want 1", resolves)
	}
}
