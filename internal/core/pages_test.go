package core

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/mem"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/require"
)

// mappedCore is a prefill core (TP 1) holding model m, and a REGISTER of a
// decode rank (TP 1) holding m with pages of decodeTokens tokens.
func mappedCore(t *testing.T, m kvlayout.Model, decodeTokens int) (*Core, *wire.Register) {
	t.Helper()
	lay := func(m kvlayout.Model) kvlayout.Layout {
		pb, _ := m.PageBytes(1)
		l := kvlayout.Layout{Kind: mem.DRAM, PageBytes: pb}
		for i := 0; i < m.Layers*kvlayout.RegionsPerLayer; i++ {
			l.Regions = append(l.Regions, mem.Desc{Addr: uintptr(1<<20 + i*(1<<16)), Len: 64 * pb})
		}
		return l
	}
	c, err := NewCore(CoreConfig{Role: RolePrefill, Compat: "sim", Layout: lay(m), Registry: simRegistryConfig(),
		QuarantineTimeout: 30 * time.Second, RegisterRetry: time.Second, Model: m})
	require.NoError(t, err)
	dm := kvlayout.WithPages(m, decodeTokens)
	peer := lay(dm)
	for i := range peer.Regions {
		peer.Regions[i].Addr += 1 << 30
	}
	kv, aux, state := RegionsOf(peer)
	return c, &wire.Register{From: decodeFrom, Compat: "sim", KV: kv, Aux: aux, State: state, TPSize: 1,
		Topo: &wire.Topo{PPSize: 1, DPSize: 1, Layers: m.Layers, KVHeads: m.KVHeads, HeadBytes: m.HeadBytes, PageTokens: decodeTokens, PageLayout: m.Layout.String()}}
}

// TestPagesOfDifferentSizes: a prefill rank with 2-token pages accepts a
// decode rank with 8-token pages (and refuses 3-token ones), writes its
// chunks in 2-token units into the decode pages the REQUEST named, names
// whole decode pages in each chunk's notification, and refuses — leaving
// the room as it was — a chunk that ends inside a decode page.
func TestPagesOfDifferentSizes(t *testing.T) {
	m := kvlayout.Model{Layers: 1, KVHeads: 2, HeadBytes: 4, PageTokens: 2, Layout: kvlayout.HND}
	c, reg := mappedCore(t, m, 3)
	_, err := c.CheckRegister(reg)
	require.ErrorContains(t, err, "one must divide the other", "3-token decode pages against 2-token prefill pages")
	c, reg = mappedCore(t, m, 8)
	pp, err := c.CheckRegister(reg)
	require.NoError(t, err)
	require.NotNil(t, pp.Plan, "plan")
	require.False(t, pp.Plan.Full, "plan %+v", pp.Plan)
	require.Equal(t, kvlayout.PageMap{Src: 2, Dst: 8}, pp.Plan.Pages(), "plan %+v", pp.Plan)
	echoChallenge(t, c, reg, t0)
	c.Step(t0, Registered{From: decodeFrom, Remote: "agent", Plan: pp})
	c.Step(t0, CreateSender{Room: 1})
	c.Step(t0, InitSender{Room: 1})
	// 14 tokens: decode pages 5 and 6; prefill pages 10 … 16.
	c.Step(t0, Received{Msg: &wire.Request{From: decodeFrom, Room: 1, DstPages: []uint32{5, 6}, AuxIndex: -1, Required: 1, StateIndices: [][]uint32{}}})
	c.Effects()

	res := c.Step(t0, SendChunk{Room: 1, Pages: []uint32{10, 11}, AuxIndex: -1})
	require.ErrorIs(t, res.Err, ErrChunkAlign, "a chunk of 2 of a decode page's 4 prefill pages")
	require.ErrorIs(t, res.Err, ErrBadChunk, "kvmanager's one sentinel for a send sequence gone wrong")
	require.ErrorContains(t, res.Err, decodeFrom.Peer(), "a chunk of 2 of a decode page's 4 prefill pages")
	st, _ := c.Status(1)
	require.Equal(t, WaitingForInput, st, "the refused chunk left the room")
	posted := func() kvlayout.Write {
		t.Helper()
		for _, e := range c.Effects() {
			if e.Kind == EffectPost && len(e.Writes) > 0 {
				return e.Writes[0]
			}
		}
		require.Fail(t, "no writes posted")
		return kvlayout.Write{}
	}
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{10, 11, 12, 13}, AuxIndex: -1}).Err)
	w := posted()
	// Decode page 5 holds units 20 … 23 (4 units of 2 tokens a page).
	require.Equal(t, []kvlayout.Run{{Src: 10, Dst: 20, Len: 4}}, w.Runs, "first chunk: runs")
	require.Equal(t, "kvb1:1:0:0:0:0:1:0:1:0:1", w.Notif, "first chunk: notif, want decode page position 0")
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{14, 15, 16}, AuxIndex: -1, Last: true}).Err)
	w = posted()
	require.Equal(t, []kvlayout.Run{{Src: 14, Dst: 24, Len: 3}}, w.Runs, "last chunk: runs")
	require.Equal(t, "kvb1:1:0:1:2:1:1:0:1:0:1", w.Notif, "last chunk: notif, want decode page position 1")
}

// TestChunkRules: with 2-token prefill pages into 8-token decode pages, a
// chunk that ends inside the decode rank's prefix may end anywhere; a
// layer range naming other pages than its chunk's first is ErrLayers
// (not a misalignment); and on any pages, a chunk after the room's last —
// whose final write freed the destinations — is refused (ErrAfterLast)
// with nothing posted.
func TestChunkRules(t *testing.T) {
	m := kvlayout.Model{Layers: 2, KVHeads: 2, HeadBytes: 4, PageTokens: 2, Layout: kvlayout.NHD}
	c, reg := mappedCore(t, m, 8)
	pp, err := c.CheckRegister(reg)
	require.NoError(t, err)
	echoChallenge(t, c, reg, t0)
	c.Step(t0, Registered{From: decodeFrom, Remote: "agent", Plan: pp})
	c.Step(t0, CreateSender{Room: 1})
	c.Step(t0, InitSender{Room: 1})
	// Decode holds the first 2 decode pages (16 tokens); 24 tokens more.
	c.Step(t0, Received{Msg: &wire.Request{From: decodeFrom, Room: 1, DstPages: []uint32{5, 6, 7}, Prefix: 2, AuxIndex: -1, Required: 1, StateIndices: [][]uint32{}}})
	c.Effects()
	var posted []kvlayout.Write
	drain := func() {
		for _, e := range c.Effects() {
			if e.Kind == EffectPost {
				posted = append(posted, e.Writes...)
			}
		}
	}
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{0, 1, 2, 3, 4, 5}, AuxIndex: -1}).Err, "a chunk ending inside the prefix")
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{6, 7}, AuxIndex: -1, Layers: kvlayout.Layers{Lo: 0, Hi: 1}}).Err, "the next chunk's first layer")
	require.ErrorIs(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{6, 7, 8}, AuxIndex: -1, Layers: kvlayout.Layers{Lo: 1, Hi: 2}}).Err, ErrLayers, "a layer range naming other pages")
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{6, 7}, AuxIndex: -1, Layers: kvlayout.Layers{Lo: 1, Hi: 2}}).Err)
	drain()
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{8, 9, 10, 11}, AuxIndex: -1, Last: true}).Err)
	drain()
	res := c.Step(t0, SendChunk{Room: 1, Pages: []uint32{12, 13, 14, 15}, AuxIndex: -1})
	require.ErrorIs(t, res.Err, ErrAfterLast, "a chunk after the last")
	require.ErrorIs(t, res.Err, ErrBadChunk, "kvmanager's one sentinel for a send sequence gone wrong")
	for _, e := range c.Effects() {
		require.NotEqual(t, EffectPost, e.Kind, "a chunk after the last posted %+v", e.Writes)
	}
	// Once the room succeeded too.
	for i := range posted {
		c.Step(t0, Posting{Room: 1, Write: &posted[i]})
		c.Step(t0, WriteDone{Room: 1, Write: &posted[i]})
	}
	st, _ := c.Status(1)
	require.Equal(t, Success, st, "room after its writes")
	require.ErrorIs(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{12, 13, 14, 15}, AuxIndex: -1}).Err, ErrAfterLast, "a chunk after the last, the room succeeded")
}
