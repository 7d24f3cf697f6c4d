package core

import (
	"testing"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// layeredPrefill is a prefill core (simLayout: 2 layers) with room 1
// requested by a decode rank of the same layout, ready to send.
func layeredPrefill(t *testing.T) *Core {
	t.Helper()
	c := testCore(t, RolePrefill)
	peer := simLayout()
	for i := range peer.Regions {
		peer.Regions[i] = mem.Desc{Addr: uintptr(0x100000 * (i + 1)), Len: testPeerPages * 64}
	}
	registerLayout(t, c, decodeFrom, peer)
	c.Step(t0, CreateSender{Room: 1})
	c.Step(t0, InitSender{Room: 1})
	c.Step(t0, Received{Msg: request(1, decodeFrom)})
	c.Effects()
	return c
}

func postedWrites(c *Core) []kvlayout.Write {
	var out []kvlayout.Write
	for _, e := range c.Effects() {
		if e.Kind == EffectPost {
			out = append(out, e.Writes...)
		}
	}
	return out
}

// A chunk's layers go in consecutive ranges from 0, each naming the same
// pages, last and aux; each range is one write with its own notification,
// and the aux write follows the final range.
func TestSendLayersInOrder(t *testing.T) {
	fixedAndMutant(t, "layer-order-unchecked", func(t *testing.T, fixed bool) {
		c := layeredPrefill(t)
		send := func(lo, hi int, pages ...uint32) error {
			return c.Step(t0, SendChunk{Room: 1, Pages: pages, Last: true, AuxIndex: -1, Layers: kvlayout.Layers{Lo: lo, Hi: hi}}).Err
		}
		err := send(1, 2, 0)
		if !fixed {
			require.NoError(t, err, "with the mutant, layer 1 first")
			return // the mutant took layer 1 before layer 0
		}
		require.ErrorIs(t, err, ErrLayers, "layer 1 before layer 0")
		require.ErrorIs(t, err, ErrBadChunk, "kvmanager's one sentinel for a send sequence gone wrong")
		require.NoError(t, send(0, 1, 0))
		ws := postedWrites(c)
		require.Len(t, ws, 1, "layer 0's writes: %+v", ws)
		require.Equal(t, kvlayout.Layers{Lo: 0, Hi: 1}, ws[0].Layers, "layer 0's writes: %+v", ws)
		require.Equal(t, "kvb1:1:0:0:1:0:1:0:1:0:2", ws[0].Notif, "layer 0's writes: %+v", ws)
		require.False(t, ws[0].Last, "layer 0's writes: %+v", ws)
		for _, bad := range []func() error{
			func() error { return send(0, 1, 0) }, // again
			func() error { return send(1, 3, 0) }, // past the layers
			func() error { return send(1, 2, 5) }, // other pages
			func() error { return send(1, 1, 0) }, // empty
		} {
			require.ErrorIs(t, bad(), ErrLayers, "out of order")
		}
		require.NoError(t, send(1, 2, 0))
		ws = postedWrites(c)
		require.Len(t, ws, 2, "layer 1's writes: %+v", ws)
		require.Equal(t, kvlayout.Layers{Lo: 1, Hi: 2}, ws[0].Layers, "layer 1's writes: %+v", ws)
		require.Equal(t, "kvb1:1:0:0:1:0:1:1:2:0:2", ws[0].Notif, "layer 1's writes: %+v", ws)
		require.Equal(t, "kvb1:1:0:aux", ws[1].Notif, "layer 1's writes: %+v", ws)
		require.True(t, ws[1].Last, "layer 1's writes: %+v", ws)
	})
}

// Notifications: the layered form and the earlier revision's parse into
// the same input; numbers out of range are refused.
func TestParseNotif(t *testing.T) {
	for _, tc := range []struct {
		s    string
		want Notified
		ok   bool
	}{
		{chunkNotif(7, 1, 2, 3, 4, 5, 6, 8, 6, 10), Notified{Room: 7, UID: 1, Chunk: 2, Total: 3, Off: 4, N: 5, Lo: 6, Hi: 8, SpanLo: 6, SpanHi: 10}, true},
		{"kvb1:7:1:2:3", Notified{Room: 7, UID: 1, Chunk: 2, Total: 3}, true},
		{"kvb1:7:1:aux", Notified{Room: 7, UID: 1, Aux: true}, true},
		{"kvb1:7:1:2:3:4:5:6:0:6:10", Notified{}, false}, // hi 0
		{"kvb1:7:1:2:3:4:5:-6:8:6:10", Notified{}, false},
		{"kvb1:7:1:2:3:4:5:6:99999999999:6:10", Notified{}, false},
		{"kvb1:7:1:2:3:4:5:6:8:6", Notified{}, false},
		{"kvb2:7:1:2:3", Notified{}, false},
	} {
		got, ok := ParseNotif(tc.s)
		if assert.Equal(t, tc.ok, ok, "ParseNotif(%q) = %+v %v", tc.s, got, ok) && ok {
			assert.Equal(t, tc.want, got, "ParseNotif(%q)", tc.s)
		}
	}
}

// layeredDecode is a decode core whose room 1 (one page) asked one prefill
// rank, which writes layers [0, 2).
func layeredDecode(t *testing.T) *Core { return decodeAsked(t) }

func layerNotif(chunk, total, lo, hi, spanHi int) Notified {
	return Notified{Room: 1, Chunk: chunk, Total: total, Off: 0, N: 1, Lo: lo, Hi: hi, SpanLo: 0, SpanHi: spanHi}
}

// A room succeeds only once every layer of its chunk landed; a
// notification that contradicts its chunk's earlier ones is refused and
// counted, not taken as the missing layer.
func TestNotifContradictionRefused(t *testing.T) {
	fixedAndMutant(t, "notif-unchecked", func(t *testing.T, fixed bool) {
		c := layeredDecode(t)
		c.Step(t0, layerNotif(0, 1, 0, 1, 2))
		c.Step(t0, Notified{Room: 1, Aux: true})
		st, _ := c.Status(1)
		require.Equal(t, Transferring, st, "after layer 0 of 2 and the aux")
		c.Step(t0, layerNotif(0, 1, 1, 2, 3)) // says the source writes 3 layers
		st, _ = c.Status(1)
		if !fixed {
			require.Equal(t, Success, st, "with the mutant the contradicting notification should complete the room")
			return
		}
		require.Equal(t, Transferring, st, "after a contradicting notification (%d counted)", c.Stats().BadNotifs)
		require.EqualValues(t, 1, c.Stats().BadNotifs, "after a contradicting notification: counted")
		c.Step(t0, layerNotif(0, 1, 1, 2, 2))
		st, _ = c.Status(1)
		require.Equal(t, Success, st, "after both layers and the aux")
	})
}

// A failed room's load report comes only once nothing more can land (the
// drained ABORT_ACK), names the failure's code, and lists what landed;
// pages only the quarantine released are not vouched for.
func TestLoadReport(t *testing.T) {
	fixedAndMutant(t, "report-unproven", func(t *testing.T, fixed bool) {
		c := layeredDecode(t)
		c.Step(t0, layerNotif(0, 1, 0, 1, 2))
		c.Step(t0, AbortReceiver{Room: 1, Reason: "engine gave up"})
		_, ok := c.Report(1)
		require.Equal(t, !fixed, ok, "report given while the prefill rank may still write: %v", ok)
		if !fixed {
			return
		}
		c.Step(t0, layerNotif(0, 1, 1, 2, 2)) // landed after the abort: still recorded
		c.Step(t0, Received{Msg: &wire.AbortAck{From: prefillFrom, Room: 1, Drained: true}})
		r, ok := c.Report(1)
		want := []Landed{{First: 0, Count: 1, LayerLo: 0, LayerHi: 2}}
		require.True(t, ok, "report %+v ok %v, want Failed, aborted, landed %v", r, ok, want)
		require.Equal(t, Failed, r.Status, "report %+v", r)
		require.Equal(t, CodeAborted, r.Code, "report %+v", r)
		require.Len(t, r.Sources, 1, "report %+v", r)
		require.True(t, r.Sources[0].Proven, "report %+v", r)
		require.Equal(t, want, r.Sources[0].Landed, "report %+v: landed", r)
		require.Equal(t, want, r.Whole(), "report %+v: whole", r)
	})
	t.Run("quarantine", func(t *testing.T) {
		c := layeredDecode(t)
		c.Step(t0, layerNotif(0, 1, 0, 1, 2))
		c.Step(t0, Received{Msg: &wire.Status{From: prefillFrom, Room: 1, Status: wire.StatusFailed, Code: CodeOutOfRange, Reason: "page 9"}})
		c.Step(t0.Add(c.cfg.QuarantineTimeout+1), Tick{})
		r, ok := c.Report(1)
		require.True(t, ok, "after a forced release: %+v %v, want code out_of_range, nothing vouched for", r, ok)
		require.Equal(t, CodeOutOfRange, r.Code, "after a forced release: %+v", r)
		require.False(t, r.Sources[0].Proven, "after a forced release: %+v, want nothing vouched for", r)
		require.Empty(t, r.Sources[0].Landed, "after a forced release: %+v, want nothing vouched for", r)
		require.Nil(t, r.Whole(), "after a forced release: %+v, want nothing vouched for", r)
	})
}

// A source of the earlier revision tells no positions or layers: its
// report vouches for nothing and names no layers, so Whole claims nothing
// for layers it may write (it would claim another source's layers whole
// while the old source's heads there never landed).
func TestLoadReportEarlierRevision(t *testing.T) {
	c := layeredDecode(t)
	c.Step(t0, Notified{Room: 1, Chunk: 0, Total: 1}) // kvb1:1:0:0:1
	c.Step(t0, Notified{Room: 1, Aux: true})
	r, ok := c.Report(1)
	require.True(t, ok, "report %+v %v", r, ok)
	require.Equal(t, Success, r.Status, "report %+v", r)
	require.Len(t, r.Sources, 1, "report %+v", r)
	s := r.Sources[0]
	require.Zero(t, s.LayerLo, "an earlier-revision source reports layers [%d, %d) and %v", s.LayerLo, s.LayerHi, s.Landed)
	require.Zero(t, s.LayerHi, "an earlier-revision source reports layers [%d, %d) and %v", s.LayerLo, s.LayerHi, s.Landed)
	require.Empty(t, s.Landed, "an earlier-revision source reports layers [%d, %d) and %v", s.LayerLo, s.LayerHi, s.Landed)
	mixed := LoadReport{Sources: []SourceReport{
		{Source: 0, Proven: true, LayerLo: 0, LayerHi: 4, Landed: []Landed{{0, 2, 0, 4}}},
		r.Sources[0],
	}}
	require.Nil(t, mixed.Whole(), "with an earlier-revision source: Whole, want nothing")
}

// Whole: with several sources per page (prefill TP larger) a page layer is
// whole only where each source writing that layer landed it; with PP
// sources (disjoint layers) each layer needs only its own.
func TestReportWhole(t *testing.T) {
	tp := LoadReport{Sources: []SourceReport{
		{Source: 0, Proven: true, LayerLo: 0, LayerHi: 2, Landed: []Landed{{0, 2, 0, 2}}},
		{Source: 1, Proven: true, LayerLo: 0, LayerHi: 2, Landed: []Landed{{0, 2, 0, 1}, {0, 1, 1, 2}}},
		{Source: 2, Dummy: true},
	}}
	assert.Equal(t, []Landed{{0, 2, 0, 1}, {0, 1, 1, 2}}, tp.Whole(), "TP")
	pp := LoadReport{Sources: []SourceReport{
		{Source: 0, Proven: true, LayerLo: 0, LayerHi: 2, Landed: []Landed{{0, 3, 0, 2}}},
		{Source: 1, Proven: true, LayerLo: 2, LayerHi: 4, Landed: []Landed{{0, 3, 2, 4}}},
	}}
	assert.Equal(t, []Landed{{0, 3, 0, 4}}, pp.Whole(), "PP")
	pp.Sources[1].Proven = false
	assert.Nil(t, pp.Whole(), "an unproven source: want nothing")
}
