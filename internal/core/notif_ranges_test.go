package core

import (
	"slices"
	"testing"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNotificationRangesRefused (issue 49, item 5): each range check on a
// data-plane notification, one hostile value at a time against its
// in-range twin. The hostile one is refused and counted (BadNotifs), the
// room keeps its status and nothing panics; the twin, one step inside the
// same bound, is recorded. Each check is a mutant in make mutants
// (notif-*), caught here.
func TestNotificationRangesRefused(t *testing.T) {
	ok := Notified{Room: 1, Chunk: 0, Total: 0, Off: 0, N: 1, Lo: 0, Hi: 1, SpanLo: 0, SpanHi: 2}
	with := func(f func(n *Notified)) Notified { n := ok; f(&n); return n }
	for _, tc := range []struct {
		what        string
		bad, inside Notified
		before      []Notified // recorded first (a chunk's or the source's earlier notification)
	}{
		{"chunk past the bound", with(func(n *Notified) { n.Chunk = maxNotifChunks }), with(func(n *Notified) { n.Chunk = maxNotifChunks - 1 }), nil},
		{"total past the bound", with(func(n *Notified) { n.Total = maxNotifChunks + 1 }), with(func(n *Notified) { n.Total = maxNotifChunks }), nil},
		{"span wider than the bound", with(func(n *Notified) { n.SpanHi = maxNotifLayers + 1 }), with(func(n *Notified) { n.SpanHi = maxNotifLayers }), nil},
		{"layers below the span", with(func(n *Notified) { n.SpanLo, n.Lo, n.Hi = 1, 0, 2 }), with(func(n *Notified) { n.SpanLo, n.Lo, n.Hi = 1, 1, 2 }), nil},
		{"layers past the span", with(func(n *Notified) { n.Lo, n.Hi = 1, 3 }), with(func(n *Notified) { n.Lo, n.Hi = 1, 2 }), nil},
		{"an empty layer range", with(func(n *Notified) { n.Lo, n.Hi = 1, 1 }), with(func(n *Notified) { n.Lo, n.Hi = 0, 1 }), nil},
		{"a position before the list", with(func(n *Notified) { n.Off = -2 }), with(func(n *Notified) { n.Off = -1 }), nil},
		{"positions past the bound", with(func(n *Notified) { n.Off, n.N = -1, maxNotifChunks*maxNotifLayers+1 }), with(func(n *Notified) { n.Off, n.N = -1, maxNotifChunks*maxNotifLayers }), nil},
		{"positions past the REQUEST's pages", with(func(n *Notified) { n.N = 2 }), ok, nil},
		{"a position past the REQUEST's pages", with(func(n *Notified) { n.Off = 1 }), with(func(n *Notified) { n.N = 0 }), nil},
		{"a uid that is no source's", with(func(n *Notified) { n.UID = 1 }), ok, nil},
		{"another span than the source's", with(func(n *Notified) { n.Chunk, n.SpanHi = 1, 3 }), with(func(n *Notified) { n.Chunk = 1 }), []Notified{ok}},
		{"another place than the chunk's", with(func(n *Notified) { n.Lo, n.Hi, n.N = 1, 2, 0 }), with(func(n *Notified) { n.Lo, n.Hi = 1, 2 }), []Notified{ok}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			for _, c := range []struct {
				in  Notified
				bad bool
			}{{tc.bad, true}, {tc.inside, false}} {
				core := decodeAsked(t)
				for _, b := range tc.before {
					core.Step(t0, b)
				}
				require.Zero(t, core.Stats().BadNotifs)
				st, _ := core.Status(1)
				require.NotPanics(t, func() { core.Step(t0, c.in) })
				after, _ := core.Status(1)
				if c.bad {
					assert.EqualValues(t, 1, core.Stats().BadNotifs, "%+v not refused", c.in)
					assert.Equal(t, st, after, "a refused notification moved the room")
					continue
				}
				assert.Zero(t, core.Stats().BadNotifs, "%+v, inside the bound, refused", c.in)
			}
		})
	}
}

// TestNotificationOfAPullSourceRefused: a pull room's source lands what
// its reads land; a data-plane notification naming it (its uid, in range,
// for the chunk its PAGES announced) is refused and counted, and counts
// nothing: the room cannot succeed on chunks nothing read.
func TestNotificationOfAPullSourceRefused(t *testing.T) {
	cfg := simBase()
	cfg.rooms, cfg.noClear = []simRoomSpec{simPullRoom(7, []int{0}, []int{0}, 1)}, true
	w, n := runScript(cfg, append(slices.Clone(pullScript[:8]), "room 7 prefill 0 send chunk 0"))
	require.Equal(t, 9, n, "the script stopped early: %v", w.err)
	require.NoError(t, w.err)
	c := w.procs[1].core
	require.True(t, c.reg.rooms[7].dec.sources[0].sent, "room 7's REQUEST went to its source")
	before := sourcesData(c, 7)
	for _, n := range []Notified{
		{Room: 7, UID: 0, Chunk: 0, Total: 1, Off: 0, N: 1, Lo: 0, Hi: simLayers, SpanLo: 0, SpanHi: simLayers},
		{Room: 7, UID: 0, Aux: true},
	} {
		c.Step(w.now, n)
	}
	assert.EqualValues(t, 2, c.Stats().BadNotifs, "a pull source's notifications refused and counted")
	assert.Equal(t, before, sourcesData(c, 7), "a pull source's notifications counted as data")
	st, _ := c.Status(7)
	assert.NotEqual(t, Success, st, "room 7 succeeded on notifications nothing read")
}

// TestUndeliveredNotificationFailsRoom: a notification the shell's write
// check found naming bytes that did not land (Notified.Undelivered) fails
// the room not_delivered, naming the prefill rank and what did not land,
// is counted, is not recorded as landed (the load report), and owes the
// prefill rank an ABORT; the same notification without it is recorded. One that is
// refused anyway (out of range) is counted bad, not undelivered.
func TestUndeliveredNotificationFailsRoom(t *testing.T) {
	n := Notified{Room: 1, Chunk: 0, Total: 1, Off: 0, N: 1, Lo: 0, Hi: 1, SpanLo: 0, SpanHi: 1}
	c := decodeAsked(t)
	bad := n
	bad.Undelivered = "the piece ending at 0x1000 (region 0 (layer 0 K), page 1) still ends with the canary"
	c.Step(t0, bad)
	assert.Empty(t, c.reg.rooms[1].dec.sources[0].chunks, "nothing of the undelivered notification recorded as landed")
	st, _ := c.Status(1)
	require.Equal(t, Failed, st)
	reason, _ := c.Failure(1)
	assert.Contains(t, reason, prefillFrom.Endpoint, "the failure names the prefill rank")
	assert.Contains(t, reason, bad.Undelivered)
	assert.Contains(t, reason, "chunk 0 (positions 0+1, layers 0–1)")
	assert.EqualValues(t, 1, c.Stats().NotDelivered)
	assert.Zero(t, c.Stats().BadNotifs)
	assert.Equal(t, CodeNotDelivered, c.reg.rooms[1].dec.code)
	aborts := sent[*wire.Abort](c.Effects())
	require.Len(t, aborts, 1, "the prefill rank is told")
	assert.EqualValues(t, 1, aborts[0].Room)

	c = decodeAsked(t)
	c.Step(t0, n)
	c.Step(t0, Notified{Room: 1, Aux: true})
	st, _ = c.Status(1)
	assert.Equal(t, Success, st, "the same notification, delivered")

	c = decodeAsked(t)
	bad.N = 2 // past the REQUEST's pages
	c.Step(t0, bad)
	st, _ = c.Status(1)
	assert.NotEqual(t, Failed, st, "a notification refused as out of range changes nothing")
	assert.EqualValues(t, 1, c.Stats().BadNotifs)
	assert.Zero(t, c.Stats().NotDelivered)
}
