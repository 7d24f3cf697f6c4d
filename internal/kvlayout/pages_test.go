package kvlayout

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPageMapPair is the page pairing's table: units of the smaller page,
// a prefix decode holds, the room's last prefill page cut where decode's
// pages end, and a prefill page past them refused.
func TestPageMapPair(t *testing.T) {
	u := func(v ...uint32) []uint32 { return v }
	for _, tc := range []struct {
		name   string
		pm     PageMap
		first  int
		src    []uint32
		prefix int
		dst    []uint32
		s, d   []uint32
		off, n int
		err    string
	}{
		{"same", PageMap{4, 4}, 0, u(7, 8), 0, u(1, 2, 3), u(7, 8), u(1, 2), 0, 2, ""},
		{"same, second chunk", PageMap{4, 4}, 2, u(9), 0, u(1, 2, 3), u(9), u(3), 2, 1, ""},
		{"same, prefix", PageMap{4, 4}, 0, u(7, 8, 9), 2, u(5), u(9), u(5), 0, 1, ""},
		{"same, prefix covers the chunk", PageMap{4, 4}, 0, u(7, 8), 2, u(5), nil, nil, -1, 0, ""},
		{"same, sent more", PageMap{4, 4}, 0, u(7, 8), 0, u(1), nil, nil, 0, 0, "prefill sent more"},
		// Prefill 2-token pages into 8-token pages: unit 2 tokens, 4 a decode page.
		{"smaller prefill", PageMap{2, 8}, 0, u(5, 6, 7, 8, 9), 0, u(3, 1), u(5, 6, 7, 8, 9), u(12, 13, 14, 15, 4), 0, 2, ""},
		{"smaller prefill, prefix 1", PageMap{2, 8}, 0, u(5, 6, 7, 8, 9), 1, u(3), u(9), u(12), 0, 1, ""},
		{"smaller prefill, sent more", PageMap{2, 8}, 4, u(5), 0, u(3), nil, nil, 0, 0, "prefill sent more"},
		// Prefill 8-token pages into 2-token pages: one prefill page is 4 units.
		{"larger prefill", PageMap{8, 2}, 0, u(3), 0, u(9, 1, 2, 4), u(12, 13, 14, 15), u(9, 1, 2, 4), 0, 4, ""},
		{"larger prefill, cut at the end", PageMap{8, 2}, 1, u(3), 0, u(0, 1, 2, 3, 9, 8), u(12, 13), u(9, 8), 4, 2, ""},
		{"larger prefill, prefix 1", PageMap{8, 2}, 0, u(3), 1, u(9, 1), u(13, 14), u(9, 1), 0, 2, ""},
		{"larger prefill, page past the end", PageMap{8, 2}, 1, u(3), 0, u(0, 1, 2, 3), nil, nil, 0, 0, "prefill sent more"},
		{"larger prefill, a page after a cut one", PageMap{8, 2}, 0, u(3, 4), 0, u(0, 1, 2), nil, nil, 0, 0, "prefill sent more"},
		{"larger prefill, a unit number past uint32", PageMap{8, 2}, 0, u(1 << 30), 0, u(0, 1, 2, 3), nil, nil, 0, 0, "past the largest unit number"},
		{"smaller prefill, a unit number past uint32", PageMap{2, 8}, 0, u(1), 0, u(1 << 30), nil, nil, 0, 0, "past the largest unit number"},
		{"not dividing", PageMap{4, 6}, 0, u(1), 0, u(1), nil, nil, 0, 0, "one must divide the other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, d, off, n, err := tc.pm.Pair(tc.first, tc.src, tc.prefix, tc.dst)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.s, s, "source units")
			assert.Equal(t, tc.d, d, "destination units")
			assert.Equal(t, tc.off, off, "offset")
			assert.Equal(t, tc.n, n, "count")
		})
	}
}

func TestPageMapAligned(t *testing.T) {
	for _, tc := range []struct {
		pm   PageMap
		end  int
		want bool
	}{{PageMap{4, 4}, 3, true}, {PageMap{8, 2}, 1, true}, {PageMap{2, 8}, 4, true}, {PageMap{2, 8}, 6, false}, {PageMap{2, 8}, 0, true}} {
		assert.Equal(t, tc.want, tc.pm.Aligned(tc.end), "%+v.Aligned(%d)", tc.pm, tc.end)
	}
	// 2-token pages into 8-token ones: 6 pages end inside decode page 1,
	// which a prefix of 2 holds (and one of 1 does not).
	pm := PageMap{2, 8}
	assert.True(t, pm.InPrefix(6, 2), "InPrefix(6, 2)")
	assert.False(t, pm.InPrefix(6, 1), "InPrefix(6, 1)")
	assert.True(t, pm.InPrefix(4, 1), "InPrefix(4, 1)")
}

// TestPlanPageSizes: a plan between different page sizes carries both and
// is never Full; sizes that do not divide, or models that differ beyond
// their pages, are refused.
func TestPlanPageSizes(t *testing.T) {
	ms, md := llama(NHD), llama(NHD)
	md.PageTokens = 16
	sl, err := Plan(ms, md, Parallel{}, Parallel{})
	require.NoError(t, err)
	require.False(t, sl.Full, "plan %+v", sl)
	require.False(t, sl.Paged(), "plan %+v", sl)
	require.Equal(t, 4, sl.Unit(), "plan %+v", sl)
	require.Equal(t, 16, sl.DstPageTokens, "plan %+v", sl)
	sl, err = Plan(ms, ms, Parallel{}, Parallel{})
	require.NoError(t, err, "same pages")
	require.True(t, sl.Full, "same pages: plan %+v", sl)
	require.True(t, sl.Paged(), "same pages: plan %+v", sl)
	md.PageTokens = 6
	_, err = Plan(ms, md, Parallel{}, Parallel{})
	require.ErrorIs(t, err, ErrTopology, "4- and 6-token pages")
	md = llama(HND)
	md.PageTokens = 8
	_, err = Plan(ms, md, Parallel{}, Parallel{})
	require.ErrorIs(t, err, ErrTopology, "NHD → HND")
	require.ErrorContains(t, err, "beyond their page tokens", "NHD → HND")
}
