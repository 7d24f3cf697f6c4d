package core

import (
	"errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
)

// pullScript is a pull room's whole path in the simulator: the prefill
// rank publishes its chunk six seconds (one and a half leases) after the
// REQUEST; the decode rank's renewals meanwhile keep the lease it echoes
// current, so the read goes ahead.
var pullScript = []string{"room 7 prefill 0 create", "room 7 prefill 0 init", "room 7 decode 0 create", "resolve at 1", "room 7 decode 0 init",
	"deliver 1→0 REGISTER", "deliver 0→1 REGISTER_ACK", "deliver 1→0 REQUEST",
	"time +3s", "deliver 1→0 RENEW", "time +3s", "deliver 1→0 RENEW",
	"room 7 prefill 0 send chunk 0", "deliver 0→1 PAGES", "post read 1", "read 1 ok", "deliver 1→0 READ_DONE"}

func pullScriptConfig() simConfig {
	c := simBase()
	c.rooms, c.ticks, c.noClear, c.writesOK = []simRoomSpec{simPullRoom(7, []int{0}, []int{0}, 1)}, 2, true, true
	c.jumps = []time.Duration{3 * time.Second}
	return c
}

func TestPullRenewalsKeepTheLease(t *testing.T) {
	w, n := runScript(pullScriptConfig(), pullScript)
	if w.err != nil || n != len(pullScript) {
		t.Fatalf("stopped at %d of %d (%q): %v", n, len(pullScript), pullScript[min(n, len(pullScript)-1)], w.err)
	}
	for s, want := range []Poll{Success, Success} {
		if st, _ := w.procs[s].core.Status(7); st != want {
			f, _ := w.procs[s].core.Failure(7)
			t.Fatalf("%s: room 7 %v (%s), want %v", w.procs[s].from.Peer(), st, f, want)
		}
	}
	if !w.srcReleased(w.procs[0].inc, 7) {
		t.Fatal("the prefill rank did not release its source pages after the READ_DONE")
	}
	if st := w.procs[0].core.Stats(); st.PagesPublished != 1 || st.SourceReleases != 1 {
		t.Fatalf("prefill stats %+v: want 1 PAGES, 1 release", st)
	}
	if st := w.procs[1].core.Stats(); st.LeaseRenewals != 2 {
		t.Fatalf("decode stats %+v: want 2 renewals sent", st)
	}
	if holds := w.procs[1].core.decodeCore.holds; len(holds) != 0 {
		t.Fatalf("decode still holds rooms %v", holds)
	}
}

// TestPullRefusals: a REQUEST for pull at a rank that does not serve it,
// and one whose mode differs from the room's other REQUESTs, are refused
// with STATUS rejected naming the room and the decode rank; a PAGES whose
// lease stamp is no time the decode rank sent fails the room, saying so.
func TestPullRefusals(t *testing.T) {
	c := simBase()
	c.rooms, c.noClear = []simRoomSpec{simPullRoom(7, []int{0}, []int{0}, 1)}, true
	prefix := pullScript[:8]

	// No lease configured: pull is not served. (The decode rank asks for
	// no offer here, so its REQUEST goes and meets the prefill rank's
	// refusal; one that pulls through offers refuses the REGISTER_ACK that
	// offers nothing first: TestOfferChecks.)
	w := startWorld(c)
	cfg := w.procs[0].core.cfg
	cfg.Lease = 0
	core, err := NewCore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.procs[0].core = core
	dcfg := w.procs[1].core.cfg
	dcfg.Register.Pull = false
	if w.procs[1].core, err = NewCore(dcfg); err != nil {
		t.Fatal(err)
	}
	if _, n := runScriptOn(w, prefix); n != len(prefix) {
		t.Fatalf("stopped at %d: %v", n, w.err)
	}
	st := lastStatus(t, w, 0, 1)
	if st.Code != CodeRejected || !strings.Contains(st.Reason, "room 7") || !strings.Contains(st.Reason, "decode/decode/0") || !strings.Contains(st.Reason, "does not serve pull") {
		t.Fatalf("STATUS %+v", st)
	}

	// A PAGES whose stamp is in the decode rank's future.
	w, n := runScript(c, append(prefix, "room 7 prefill 0 send chunk 0"))
	if n != len(prefix)+1 {
		t.Fatalf("stopped at %d: %v", n, w.err)
	}
	m := w.net[0][1][0].msg.(*wire.Pages)
	m.At = uint64(w.now.Add(time.Hour).UnixNano())
	w.deliver(0, 1)
	f, _ := w.procs[1].core.Failure(7)
	if !strings.Contains(f, "room 7: PAGES from prefill prefill/prefill/0") || !strings.Contains(f, "lease counts from") {
		t.Fatalf("failure %q", f)
	}
	if w.procs[1].core.Stats().PullRefused != 1 || len(w.reads) != 0 {
		t.Fatalf("refused %d, reads %v", w.procs[1].core.Stats().PullRefused, w.reads)
	}
}

// runScriptOn applies script to a world already started.
func runScriptOn(w *simWorld, script []string) (*simWorld, int) {
	for i, name := range script {
		k := -1
		for j, e := range w.events() {
			if e.name == name {
				k = j
				w.apply(e)
				break
			}
		}
		if k < 0 || w.err != nil {
			return w, i
		}
	}
	return w, len(script)
}

// lastStatus returns the last STATUS queued from slot src to dst.
func lastStatus(t *testing.T, w *simWorld, src, dst int) *wire.Status {
	t.Helper()
	q := w.net[src][dst]
	for i := len(q) - 1; i >= 0; i-- {
		if s, ok := q[i].msg.(*wire.Status); ok {
			return s
		}
	}
	t.Fatalf("no STATUS from %d to %d in %v", src, dst, q)
	return nil
}

// TestPullModeOfARoom: every REQUEST of a room asks the same mode; one
// that differs from a REQUEST the room holds is refused (STATUS rejected,
// naming the room, the decode rank and both modes), both ways, pending or
// live; a RENEW or READ_DONE for a room the rank never published to is
// dropped and counted.
func TestPullModeOfARoom(t *testing.T) {
	for _, first := range []bool{true, false} {
		c := newTestCore(t, RolePrefill, simRegistryConfig())
		c.cfg.Lease = simPullLease
		d1 := decodeFrom
		d2 := wire.From{Role: "decode", Instance: "d", Rank: 1, Endpoint: "tcp://d:2", Epoch: 1}
		register(t, c, d1)
		register(t, c, d2)
		r1, r2 := request(7, d1), request(7, d2)
		r1.Required, r2.Required = 2, 2
		r2.DstPages = []uint32{8}
		r1.Pull, r2.Pull = first, !first
		if !c.Step(t0, Received{r1}).OK {
			t.Fatalf("the first REQUEST refused: %v", sent[*wire.Status](c.Effects()))
		}
		c.Effects()
		if c.Step(t0, Received{r2}).OK {
			t.Fatal("a REQUEST of the other mode accepted")
		}
		st := sent[*wire.Status](c.Effects())
		if len(st) != 1 || st[0].Code != CodeRejected || !strings.Contains(st[0].Reason, "room 7") || !strings.Contains(st[0].Reason, "decode/d/1") ||
			!strings.Contains(st[0].Reason, "one room, one mode") {
			t.Fatalf("first pull %v: STATUS %+v", first, st)
		}
		before := c.Stats().PullRefused
		c.Step(t0, Received{&wire.Renew{From: d2, Room: 7, At: 1}})
		c.Step(t0, Received{&wire.ReadDone{From: d1, Room: 7, OK: true, Drained: true}})
		if got := c.Stats().PullRefused - before; got != 2 {
			t.Fatalf("first pull %v: %d RENEW/READ_DONE refused", first, got)
		}
	}
}

// TestPullReadDoneFreesDestinations: a pull room of two decode ranks; the
// one whose reads are over (READ_DONE) reuses its pages at once for its
// next room, while the other still reads: the prefill rank accepts that
// REQUEST (its pages are no longer the first room's), as it does after a
// push room's final write to a rank (the demo's TP 1 → 2 pull runs had
// such REQUESTs refused, page_in_use).
func TestPullReadDoneFreesDestinations(t *testing.T) {
	c := newTestCore(t, RolePrefill, simRegistryConfig())
	c.cfg.Lease = simPullLease
	d1 := decodeFrom
	d2 := wire.From{Role: "decode", Instance: "d", Rank: 1, Endpoint: "tcp://d:2", Epoch: 1}
	register(t, c, d1)
	register(t, c, d2)
	for _, d := range []wire.From{d1, d2} {
		r := request(7, d)
		r.Required, r.Pull, r.DstPages = 2, true, []uint32{3, 4}
		if !c.Step(t0, Received{r}).OK {
			t.Fatalf("REQUEST of %s refused: %v", d.Peer(), sent[*wire.Status](c.Effects()))
		}
	}
	c.Step(t0, CreateSender{Room: 7})
	c.Step(t0, InitSender{Room: 7})
	if err := c.Step(t0, SendChunk{Room: 7, Pages: []uint32{1, 2}, Last: true, AuxIndex: -1}).Err; err != nil {
		t.Fatal(err)
	}
	if got := len(sent[*wire.Pages](c.Effects())); got != 2 {
		t.Fatalf("%d PAGES, want one per decode rank", got)
	}
	c.Step(t0, Received{&wire.ReadDone{From: d1, Room: 7, OK: true, Drained: true}})
	c.Effects()
	next := request(8, d1)
	next.Pull, next.DstPages = true, []uint32{3, 4}
	if !c.Step(t0, Received{next}).OK {
		t.Fatalf("room 8's REQUEST for the pages room 7's finished reads left: %v", sent[*wire.Status](c.Effects()))
	}
	// The other decode rank still reads room 7: its pages stay held.
	other := request(9, d2)
	other.Pull, other.DstPages = true, []uint32{3}
	if c.Step(t0, Received{other}).OK {
		t.Fatal("a REQUEST for pages a live room still reads into was accepted")
	}
	if st, _ := c.Status(7); st != Transferring {
		t.Fatalf("room 7 %v, want Transferring (one decode rank still reads)", st)
	}
}

// TestPullReadDoneBeforeTheLastChunk: a READ_DONE ok before the room's
// last chunk was published is no success: the room fails, naming the
// room and the decode rank, and the pages stay held until they drain.
func TestPullReadDoneBeforeTheLastChunk(t *testing.T) {
	c := newTestCore(t, RolePrefill, simRegistryConfig())
	c.cfg.Lease = simPullLease
	register(t, c, decodeFrom)
	r := request(7, decodeFrom)
	r.Pull, r.DstPages = true, []uint32{3, 4}
	if !c.Step(t0, Received{r}).OK {
		t.Fatalf("REQUEST refused: %v", sent[*wire.Status](c.Effects()))
	}
	c.Step(t0, CreateSender{Room: 7})
	c.Step(t0, InitSender{Room: 7})
	if err := c.Step(t0, SendChunk{Room: 7, Pages: []uint32{1}, AuxIndex: -1}).Err; err != nil {
		t.Fatal(err)
	}
	c.Effects()
	c.Step(t0, Received{&wire.ReadDone{From: decodeFrom, Room: 7, OK: true, Drained: true}})
	st, _ := c.Status(7)
	reason, _ := c.Failure(7)
	if st != Failed || !strings.Contains(reason, "room 7") || !strings.Contains(reason, "decode/d/0") || !strings.Contains(reason, "before the room's last chunk was published") {
		t.Fatalf("room 7 %v (%q), want Failed naming the early READ_DONE", st, reason)
	}
	if held := c.PullHold(7); held {
		t.Fatal("the pages are still held after the drained READ_DONE of the room's only decode rank")
	}
}

// TestPullSuccessWaitsForEveryRead: a decode room succeeds only with no
// read of it in flight. A prefill rank that publishes a chunk's layers
// twice over (a whole chunk, then a layer range of it again: not a
// duplicate, another PAGES) has two reads of one page in flight; the
// first completes the room's count, yet the room waits for the second —
// its pages would otherwise be released, and reused, under it.
func TestPullSuccessWaitsForEveryRead(t *testing.T) {
	c := simBase()
	c.rooms, c.noClear, c.writesOK = []simRoomSpec{simPullRoom(7, []int{0}, []int{0}, 1)}, true, true
	w, n := runScript(c, append(slices.Clone(pullScript[:8]), "room 7 prefill 0 send chunk 0"))
	if n != 9 || w.err != nil {
		t.Fatalf("stopped at %d: %v", n, w.err)
	}
	first := *w.net[0][1][0].msg.(*wire.Pages)
	again := first
	again.Lo, again.Hi = first.Lo, first.Lo+1 // one layer of the chunk, published again
	w.net[0][1] = append(w.net[0][1], simMsg{from: w.net[0][1][0].from, to: w.net[0][1][0].to, msg: &again})
	for _, ev := range []string{"deliver 0→1 PAGES", "deliver 0→1 PAGES", "post read 1", "post read 2", "read 1 ok"} {
		if _, k := runScriptOn(w, []string{ev}); k != 1 {
			t.Fatalf("%q not enabled: %v", ev, w.err)
		}
	}
	if st, _ := w.procs[1].core.Status(7); st == Success {
		t.Fatal("the room succeeded with read 2 still in flight")
	}
	if _, k := runScriptOn(w, []string{"read 2 ok"}); k != 1 || w.err != nil {
		t.Fatalf("read 2: %v", w.err)
	}
	if st, _ := w.procs[1].core.Status(7); st != Success {
		t.Fatalf("room 7 %v once both reads landed, want Success", st)
	}
}

// TestPullHostileMessages: PAGES, RENEW and READ_DONE with hostile values
// — a stale or foreign sender, numbers past every bound, a chunk that
// contradicts an earlier one, pages past the room, a stamp never sent,
// lease times at their extremes — never crash a core, never make a read
// outside the room's own pages, and are refused and counted (the room that
// asked failed, naming why, where one is at stake).
func TestPullHostileMessages(t *testing.T) {
	c := simBase()
	c.rooms, c.noClear = []simRoomSpec{simPullRoom(7, []int{0}, []int{0}, 2)}, true
	base, n := runScript(c, append(slices.Clone(pullScript[:8]), "room 7 prefill 0 send chunk 0"))
	if n != 9 || base.err != nil {
		t.Fatalf("stopped at %d: %v", n, base.err)
	}
	genuine := *base.net[0][1][0].msg.(*wire.Pages)
	prefill := base.net[0][1][0].from
	for _, tc := range []struct {
		name    string
		edit    func(p *wire.Pages, from *wire.From)
		fail    bool          // the room fails (else the PAGES is only dropped)
		advance time.Duration // time passes before it arrives
	}{
		{"from another epoch of the prefill rank (stale)", func(p *wire.Pages, f *wire.From) { f.Epoch-- }, false, 0},
		{"for a room it never asked for", func(p *wire.Pages, f *wire.From) { p.Room = 99 }, false, 0},
		{"pages past the room's (prefill sent more)", func(p *wire.Pages, f *wire.From) { p.First = 1 << 30 }, true, 0},
		{"a chunk number at the bound", func(p *wire.Pages, f *wire.From) { p.Chunk = wire.MaxChunks }, true, 0},
		{"layers outside their span", func(p *wire.Pages, f *wire.From) { p.Lo, p.Hi = 5, 9 }, true, 0},
		{"layers past its offer's (a span it never registered)", func(p *wire.Pages, f *wire.From) {
			p.SpanHi, p.Lo, p.Hi = p.SpanLo+6, p.SpanLo+4, p.SpanLo+5
		}, true, 0},
		{"an empty layer range", func(p *wire.Pages, f *wire.From) { p.Hi = p.Lo }, true, 0},
		{"a stamp this rank never sent", func(p *wire.Pages, f *wire.From) { p.At++ }, true, 0},
		{"a lease that ended before it arrived", func(p *wire.Pages, f *wire.From) { p.LeaseMillis = 1 }, true, 2 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := base.clone()
			m := genuine
			from := prefill
			tc.edit(&m, &from)
			m.Pages = slices.Clone(genuine.Pages)
			w.net[0][1][0] = simMsg{from: from, to: w.net[0][1][0].to, msg: &m}
			w.now = w.now.Add(tc.advance)
			d := w.procs[1].core
			refused := d.Stats().PullRefused + d.Stats().StaleEpoch
			w.deliver(0, 1)
			if w.err != nil {
				t.Fatal(w.err)
			}
			if got := d.Stats().PullRefused + d.Stats().StaleEpoch; got != refused+1 {
				t.Fatalf("refusals counted %d → %d", refused, got)
			}
			st, _ := d.Status(7)
			reason, _ := d.Failure(7)
			if tc.fail != (st == Failed) || (tc.fail && !strings.Contains(reason, "room 7")) {
				t.Fatalf("room 7 %v (%q), want failed %v naming the room", st, reason, tc.fail)
			}
			for _, r := range w.reads {
				for _, wr := range r.rd.Writes {
					for _, run := range wr.Runs {
						if wr.State < 0 && wr.AuxSrc < 0 && run.Dst+run.Len > simPages {
							t.Fatalf("a read into decode page %d+%d, past the room's", run.Dst, run.Len)
						}
					}
				}
			}
		})
	}
	// The lease's end is exclusive: a PAGES arriving exactly as its lease
	// (less the margin) ends fails the room; a nanosecond earlier it is
	// read. (Each check here is a mutant: pages-lease-boundary.)
	for _, early := range []time.Duration{0, time.Nanosecond} {
		w := base.clone()
		d := w.procs[1].core
		sentAt, ok := d.reg.rooms[7].dec.sources[0].stampAt(genuine.At)
		require.True(t, ok)
		lease := time.Duration(genuine.LeaseMillis) * time.Millisecond
		w.now = sentAt.Add(lease - lease>>leaseMarginShift - early)
		w.deliver(0, 1)
		require.NoError(t, w.err)
		st, _ := d.Status(7)
		assert.Equal(t, early == 0, st == Failed, "a PAGES %v before its lease's end: room %v", early, st)
	}
	// A duplicate PAGES (a replay, a resend) is read once: the second is
	// dropped and counted, no second read asked.
	{
		w := base.clone()
		d := w.procs[1].core
		dup := genuine
		w.net[0][1] = append(w.net[0][1], simMsg{from: prefill, to: w.net[0][1][0].to, msg: &dup})
		w.deliver(0, 1)
		reads, refused := len(w.reads), d.Stats().PullRefused
		w.deliver(0, 1)
		require.NoError(t, w.err)
		assert.Equal(t, reads, len(w.reads), "a duplicate PAGES read again")
		assert.Equal(t, refused+1, d.Stats().PullRefused)
	}
	// A decode rank asks at most maxAsked chunks and layer groups of one
	// source: one more fails the room instead of growing its table.
	{
		w := base.clone()
		d := w.procs[1].core
		src := d.reg.rooms[7].dec.sources[0]
		for i := 0; len(src.asked) < maxAsked; i++ {
			m := genuine
			m.Chunk, m.Lo, m.Hi, m.From = i/2, i%2, i%2+1, prefill
			d.Step(w.now, Received{&m})
			require.Equal(t, i+1, len(src.asked), "PAGES %d not asked", i)
		}
		m := genuine
		m.Chunk, m.Lo, m.Hi, m.From = maxAsked/2, 0, 1, prefill // a chunk not asked yet
		d.Step(w.now, Received{&m})
		st, _ := d.Status(7)
		reason, _ := d.Failure(7)
		assert.Equal(t, Failed, st)
		assert.Contains(t, reason, "more than")
		assert.Len(t, src.asked, maxAsked)
	}
	// RENEW and READ_DONE from a process that asked nothing, or for a room
	// it does not share, are dropped and counted by the prefill rank.
	w := base.clone()
	p := w.procs[0].core
	before := p.Stats().PullRefused
	stranger := wire.From{Role: "decode", Instance: "x", Rank: 5, Endpoint: "tcp://x:1", Epoch: 3}
	p.Step(w.now, Received{&wire.Renew{From: stranger, Room: 7, At: 1}})
	p.Step(w.now, Received{&wire.ReadDone{From: stranger, Room: 7, OK: true, Drained: true}})
	p.Step(w.now, Received{&wire.ReadDone{From: w.procs[1].from, Room: 1 << 60, OK: true, Drained: true}})
	if got := p.Stats().PullRefused - before; got != 3 {
		t.Fatalf("%d of 3 hostile RENEW/READ_DONE counted", got)
	}
	if st, _ := p.Status(7); st.Terminal() {
		t.Fatalf("room 7 %v after messages from strangers", st)
	}
}

// TestPullReadLeaseEndedCode: a read the shell did not post because its
// lease had ended by then (after the gate let it through) fails its room
// lease_expired, as the gate would have; any other failed read, failed.
func TestPullReadLeaseEndedCode(t *testing.T) {
	c := simBase()
	c.rooms, c.noClear = []simRoomSpec{simPullRoom(7, []int{0}, []int{0}, 2)}, true
	base, n := runScript(c, append(slices.Clone(pullScript[:8]), "room 7 prefill 0 send chunk 0"))
	require.NoError(t, base.err, "stopped at %d", n)
	for _, tc := range []struct {
		leaseEnded bool
		code       string
	}{{true, CodeLeaseExpired}, {false, CodeFailed}} {
		w := base.clone()
		reads := len(w.reads)
		w.deliver(0, 1) // the PAGES: a read asked
		require.NoError(t, w.err)
		require.Len(t, w.reads, reads+1, "a read asked")
		d := w.procs[1].core
		rd := w.reads[len(w.reads)-1].rd
		require.True(t, d.Step(w.now, ReadPosting{Room: 7, Read: rd}).OK, "the read's gate")
		d.Step(w.now, ReadDone{Room: 7, Read: rd, Err: errors.New("not posted: its lease ended"), Quiesced: true, LeaseEnded: tc.leaseEnded})
		st, _ := d.Status(7)
		require.Equal(t, Failed, st, "lease ended %v: the room", tc.leaseEnded)
		require.Equal(t, tc.code, d.reg.rooms[7].dec.code, "lease ended %v: the room's code", tc.leaseEnded)
	}
}
