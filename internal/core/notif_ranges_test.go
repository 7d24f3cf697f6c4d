package core

import (
	"testing"

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
		{"positions past the bound", with(func(n *Notified) { n.N = maxNotifChunks*maxNotifLayers + 1 }), with(func(n *Notified) { n.N = maxNotifChunks * maxNotifLayers }), nil},
		{"another span than the source's", with(func(n *Notified) { n.Chunk, n.SpanHi = 1, 3 }), with(func(n *Notified) { n.Chunk = 1 }), []Notified{ok}},
		{"another place than the chunk's", with(func(n *Notified) { n.Lo, n.Hi, n.Off = 1, 2, 5 }), with(func(n *Notified) { n.Lo, n.Hi = 1, 2 }), []Notified{ok}},
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
