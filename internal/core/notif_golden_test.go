package core

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNotifGolden pins the data-plane notifications' wire form
// (docs/PROTOCOL.md, "Data plane: notifications"): what a prefill rank
// writes for a whole chunk, a layer group and the aux item, and how the
// earlier revision's chunk notification still parses, and a chunk
// notification with its digest (docs/PROTOCOL.md "Digest"). KVB_UPDATE_GOLDEN=1
// rewrites the file.
func TestNotifGolden(t *testing.T) {
	var b strings.Builder
	line := func(what, s string) {
		n, ok := ParseNotif(s)
		fmt.Fprintf(&b, "%s\t%s\t%+v %v\n", what, s, n, ok)
	}
	line("whole chunk 0 of 3 (positions 0+16, layers 0..32 of 0..32)", chunkNotif(42, 0, 0, 0, 0, 16, 0, 32, 0, 32))
	line("last chunk, layer group 8..12, PP stage 1 (layers 16..32 of decode)", chunkNotif(42, 1, 2, 3, 32, 8, 24, 28, 16, 32))
	line("a dummy source's chunk (no pages)", chunkNotif(42, 2, 1, 0, 0, 0, 0, 32, 0, 32))
	line("aux", fmt.Sprintf("kvb1:%d:%d%s", 42, 0, auxNotifSuffix))
	line("earlier revision: whole chunk", "kvb1:42:0:2:3")
	line("parses; the core refuses it (an empty layer range)", "kvb1:42:0:2:3:0:8:5:5:0:32")
	line("with a digest: 2 positions, the last page's first 3 units", chunkNotif(42, 0, 1, 0, 4, 2, 0, 32, 0, 32)+":0badbad0deadbeef:3")
	path := filepath.Join("testdata", "golden", "notifications.txt")
	if os.Getenv("KVB_UPDATE_GOLDEN") != "" {
		require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, string(want), b.String(), "notifications changed (KVB_UPDATE_GOLDEN=1 rewrites %s)", path)
}
