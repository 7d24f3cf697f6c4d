package core

import (
	"testing"

	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/require"
)

// registeredCore is a prefill core (one layer, 2-token pages) with a
// decode rank of decodeTokens-token pages registered.
func registeredCore(t *testing.T, decodeTokens int) *Core {
	t.Helper()
	m := kvlayout.Model{Layers: 1, KVHeads: 2, HeadBytes: 4, PageTokens: 2, Layout: kvlayout.HND}
	c, reg := mappedCore(t, m, decodeTokens)
	pp, err := c.CheckRegister(reg)
	require.NoError(t, err)
	echoChallenge(t, c, reg, t0)
	c.Step(t0, Registered{From: decodeFrom, Remote: "agent", Plan: pp})
	return c
}

// TestChunksHandedOverEarly: chunks sent after InitSender but before the
// REQUEST are kept (the room stays Bootstrapping, nothing posted), their
// place in the room checked at once; the REQUEST's own step plans them
// in order, the first marked First, so the room's first write goes as the
// REQUEST arrives (issue 52: REQUEST → first post). The kept chunk is the
// caller's no more: its page slice reused after Send changes nothing.
// Before InitSender a send is refused, and a room holds at most
// MaxEarlyChunks.
func TestChunksHandedOverEarly(t *testing.T) {
	c := registeredCore(t, 2)
	c.Step(t0, CreateSender{Room: 1})
	require.ErrorIs(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{10}, AuxIndex: -1}).Err, ErrNotReady, "before InitSender")
	c.Step(t0, InitSender{Room: 1})
	c.Effects()

	pages := []uint32{10, 11}
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: pages, AuxIndex: -1}).Err)
	pages[0], pages[1] = 40, 41 // the caller's buffer, reused
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{12}, Last: true, AuxIndex: -1}).Err)
	require.ErrorIs(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{13}, AuxIndex: -1}).Err, ErrAfterLast, "a chunk after the last, handed over early")
	st, _ := c.Status(1)
	require.Equal(t, Bootstrapping, st, "kept: no REQUEST yet")
	for _, e := range c.Effects() {
		require.NotEqual(t, EffectPost, e.Kind, "posted before the REQUEST: %+v", e)
	}

	c.Step(t0, Received{Msg: &wire.Request{From: decodeFrom, Room: 1, DstPages: []uint32{5, 6, 7}, AuxIndex: -1, Required: 1, StateIndices: [][]uint32{}}})
	var posts []Effect
	for _, e := range c.Effects() {
		if e.Kind == EffectPost {
			posts = append(posts, e)
		}
	}
	require.Len(t, posts, 2, "both kept chunks planned in the REQUEST's step")
	require.True(t, posts[0].First, "the room's first writes")
	require.False(t, posts[1].First, "the second chunk's")
	require.Equal(t, [2]int{0, 1}, [2]int{posts[0].Seq, posts[1].Seq}, "the room's post numbers, the pool's order")
	require.Equal(t, []kvlayout.Run{{Src: 10, Dst: 5, Len: 2}}, posts[0].Writes[0].Runs, "chunk 0: the pages handed over, into the REQUEST's first pages")
	require.Equal(t, []kvlayout.Run{{Src: 12, Dst: 7, Len: 1}}, posts[1].Writes[0].Runs, "chunk 1 after it")
	require.True(t, posts[1].Writes[len(posts[1].Writes)-1].Last, "the room's last write")
	st, _ = c.Status(1)
	require.Equal(t, WaitingForInput, st)

	// The bound.
	c.Step(t0, CreateSender{Room: 2})
	c.Step(t0, InitSender{Room: 2})
	for i := range MaxEarlyChunks {
		require.NoError(t, c.Step(t0, SendChunk{Room: 2, Pages: []uint32{uint32(i % 64)}, AuxIndex: -1}).Err, "chunk %d", i)
	}
	err := c.Step(t0, SendChunk{Room: 2, Pages: []uint32{0}, AuxIndex: -1}).Err
	require.ErrorIs(t, err, ErrNotReady, "past MaxEarlyChunks")
	require.ErrorContains(t, err, "room 2: 1024 chunks handed over before every REQUEST came")
}

// TestChunkHandedOverEarlyFailsAtTheRequest: a kept chunk the REQUEST
// cannot take — it ends inside a decode page of more tokens, which only
// the REQUEST's rank tells — fails the room in the REQUEST's step, naming
// the chunk, and nothing is posted (SendChunk, which returned, cannot say
// so; a chunk sent after the REQUEST is refused ErrChunkAlign instead).
func TestChunkHandedOverEarlyFailsAtTheRequest(t *testing.T) {
	c := registeredCore(t, 8)
	c.Step(t0, CreateSender{Room: 1})
	c.Step(t0, InitSender{Room: 1})
	require.NoError(t, c.Step(t0, SendChunk{Room: 1, Pages: []uint32{10, 11}, AuxIndex: -1}).Err, "2 of a decode page's 4 prefill pages: not known yet")
	c.Effects()
	c.Step(t0, Received{Msg: &wire.Request{From: decodeFrom, Room: 1, DstPages: []uint32{5, 6}, AuxIndex: -1, Required: 1, StateIndices: [][]uint32{}}})
	for _, e := range c.Effects() {
		require.NotEqual(t, EffectPost, e.Kind, "a misaligned kept chunk posted: %+v", e)
	}
	st, _ := c.Status(1)
	require.Equal(t, Failed, st)
	why, _ := c.Failure(1)
	require.Contains(t, why, "chunk 0, handed over before the REQUEST")
	require.Contains(t, why, "ends inside a 8-token page")
}
