package core

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseNotif: a write's notification string (a peer's bytes, parsed
// before the core checks its ranges) never panics, and what it accepts
// has no negative field and formats back to a string that parses to the
// same input.
func FuzzParseNotif(f *testing.F) {
	f.Add(chunkNotif(7, 1, 0, 2, 0, 4, 0, 32, 0, 32))
	f.Add(chunkNotif(1<<63, 0, 1, 2, 4, 4, 3, 4, 0, 8))
	f.Add(fmt.Sprintf("kvb1:%d:%d%s", 7, 1, auxNotifSuffix))
	f.Add("kvb1:7:1:0:2")
	f.Add("kvb1:7:1:0:2:0:4:0:0:0:32")
	f.Add("kvb1:-1:1:aux")
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := ParseNotif(s)
		if !ok {
			return
		}
		require.False(t, n.UID < 0 || n.Chunk < 0 || n.Total < 0 || n.Off < 0 || n.N < 0 || n.Lo < 0 || n.Hi < 0 || n.SpanLo < 0 || n.SpanHi < 0,
			"%q: negative field %+v", s, n)
		var again string
		switch {
		case n.Aux:
			again = fmt.Sprintf("kvb1:%d:%d%s", n.Room, n.UID, auxNotifSuffix)
		case n.Hi == 0:
			again = fmt.Sprintf("kvb1:%d:%d:%d:%d", n.Room, n.UID, n.Chunk, n.Total)
		default:
			again = chunkNotif(n.Room, n.UID, n.Chunk, n.Total, n.Off, n.N, n.Lo, n.Hi, n.SpanLo, n.SpanHi)
		}
		m, ok := ParseNotif(again)
		require.True(t, ok, "%q parsed to %+v; formatted back %q does not parse", s, n, again)
		require.Equal(t, n, m, "%q parsed to %+v; formatted back %q parses to %+v", s, n, again, m)
	})
}
