package ucx

import (
	"testing"
	"time"

	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// allUCX: UCX's default transports (here self, tcp, posix, sysv, cma), tcp
// on loopback only.
var allUCX = map[string]string{"NET_DEVICES": "lo"}

// TestRunsStayInOnePeerMapping: the ucx engine copies into peer memory UCX
// allocated through its own mapping of each peer region; two regions
// whose mappings happen to be adjacent in the initiator (the kernel
// places successive mappings side by side) are two copies, never one
// slice across two mappings.
func TestRunsStayInOnePeerMapping(t *testing.T) {
	const page = 4096
	p := newPair(t, engines()[1]) // ucx-shm: direct copies
	_, src, err := p.ini.Alloc(4 * page)
	require.NoError(t, err)
	for i := 0; i < 8; i++ {
		_, _, err := p.tgt.Alloc(2 * page)
		require.NoError(t, err)
	}
	p.remote = exchange(t, p.ini, p.tgt)
	u := p.ini.Backend().(*ucx)
	var mapped []uintptr
	var regions []nixl.Desc
	require.NoError(t, u.do(func() error {
		r := u.remotes[p.remote]
		mapped = append(mapped, r.mapped...)
		for _, rg := range r.regions {
			regions = append(regions, rg.Desc)
		}
		return nil
	}))
	a, b := -1, -1
	for i := range mapped {
		for j := range mapped {
			if i != j && mapped[i] != 0 && mapped[i]+uintptr(regions[i].Len) == mapped[j] {
				a, b = i, j
			}
		}
	}
	if a < 0 {
		t.Skipf("no two of the 8 peer regions are mapped side by side here (%x)", mapped)
	}
	// The last page of one region and the first of the next, from two
	// adjacent source pages: adjacent on both sides as the copy sees them.
	dst := []nixl.Desc{{Addr: regions[a].Addr + uintptr(regions[a].Len) - page, Len: page}, {Addr: regions[b].Addr, Len: page}}
	fill(src, 7)
	l, err := p.ini.PrepLocal(nixl.DRAM, pageDescs(src[:2*page], page))
	require.NoError(t, err)
	r, err := p.ini.PrepRemote(p.remote, nixl.DRAM, dst)
	require.NoError(t, err)
	assert.Equal(t, 2, writePieces(t, p, l, []int{0, 1}, r, []int{0, 1}), "a run joined across two peer regions: operations")
}

// TestUCXSettingsOnlyThroughFromEnv: the ucx engine decides on TLS,
// UNIFIED_MODE and ADAPTIVE_PROGRESS from Config.UCX alone (issue 50), and
// gives UCX — which reads its UCX_* variables itself — the value it
// decided on, so the variables, set here, change nothing until FromEnv
// copies them into a Config, where the Config names no such key, never
// into the map a caller passed.
func TestUCXSettingsOnlyThroughFromEnv(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	t.Setenv("UCX_UNIFIED_MODE", "y")
	t.Setenv("UCX_ADAPTIVE_PROGRESS", "y")
	keys := map[string]string{}
	tls, adaptive, err := ucxChoices(keys)
	require.NoError(t, err, "UCX_UNIFIED_MODE=y, no UNIFIED_MODE in Config.UCX: refused")
	assert.Equal(t, "all", tls, "TLS without Config.UCX's TLS")
	assert.False(t, adaptive, "adaptive progress without Config.UCX's ADAPTIVE_PROGRESS")
	assert.Equal(t, map[string]string{"TLS": "all", "UNIFIED_MODE": "n", "ADAPTIVE_PROGRESS": "n"}, keys, "what UCX is given")

	// UCX itself sees the variables; the settings given override them.
	a, err := nixl.Open(nixl.Config{Name: "ucx-env-ignored", Engine: nixl.EngineUCX, UCX: allUCX})
	require.NoError(t, err, "with UCX_UNIFIED_MODE=y and UCX_TLS=tcp in the environment")
	u := a.Backend().(*ucx)
	assert.True(t, u.sharedMem && u.peerErrors && !u.adaptiveOn, "sharedMem %v, peerErrors %v, adaptiveOn %v: not UCX's defaults", u.sharedMem, u.peerErrors, u.adaptiveOn)
	require.NoError(t, a.Close())

	shared := map[string]string{"NET_DEVICES": "lo"}
	c := nixl.Config{UCX: shared}
	c.FromEnv()
	assert.Equal(t, map[string]string{"NET_DEVICES": "lo", "TLS": "tcp", "UNIFIED_MODE": "y", "ADAPTIVE_PROGRESS": "y"}, c.UCX, "FromEnv")
	assert.Equal(t, map[string]string{"NET_DEVICES": "lo"}, shared, "FromEnv wrote into the caller's map")
	c = nixl.Config{UCX: map[string]string{"TLS": "posix,cma,self", "UNIFIED_MODE": "n", "ADAPTIVE_PROGRESS": "n"}}
	c.FromEnv()
	assert.Equal(t, map[string]string{"TLS": "posix,cma,self", "UNIFIED_MODE": "n", "ADAPTIVE_PROGRESS": "n"}, c.UCX, "FromEnv replaced settings the Config gave")
	c = nixl.Config{Name: "ucx-env-unified", Engine: nixl.EngineUCX}
	c.FromEnv()
	_, err = nixl.Open(c)
	require.ErrorIs(t, err, nixl.ErrUnsupported, "UNIFIED_MODE=y through FromEnv")
	require.ErrorContains(t, err, "Config.UCX UNIFIED_MODE=y", "UNIFIED_MODE=y through FromEnv")
}

// TestOneUCXPerProcess: libucp is loaded once per process; an agent that
// names another one than the process loaded is refused, naming both.
func TestOneUCXPerProcess(t *testing.T) {
	a, err := nixl.Open(nixl.Config{Name: "one-ucx-a", Engine: nixl.EngineUCX, UCX: shmUCX})
	require.NoError(t, err)
	defer a.Close()
	_, err = nixl.Open(nixl.Config{Name: "one-ucx-b", Engine: nixl.EngineUCX, UCX: shmUCX, UCXLib: "/another/libucp.so.0"})
	require.ErrorIs(t, err, nixl.ErrInvalidRequest)
	require.ErrorContains(t, err, "Config.UCXLib /another/libucp.so.0")
	c, err := nixl.Open(nixl.Config{Name: "one-ucx-c", Engine: nixl.EngineUCX, UCX: shmUCX, UCXLib: ucxLib.path})
	require.NoError(t, err, "the path the process loaded")
	c.Close()
}

func pageDescs(b []byte, page int) []nixl.Desc {
	var d []nixl.Desc
	for off := 0; off < len(b); off += page {
		d = append(d, nixl.BytesDesc(b[off:off+page]))
	}
	return d
}

// writePieces writes pairs li → ri from p's initiator, waits for it to be
// done, and returns how many operations the engine made of it.
func writePieces(t *testing.T, p pair, l *nixl.Prepped, li []int, r *nixl.Prepped, ri []int) int {
	t.Helper()
	x, err := p.ini.NewXfer(nixl.Write, l, li, r, ri, nil)
	require.NoError(t, err)
	require.NoError(t, p.ini.Post(x))
	st, err := wait(t, p.ini, x, time.Minute)
	require.Equal(t, nixl.Done, st, err)
	return x.Pieces()
}
