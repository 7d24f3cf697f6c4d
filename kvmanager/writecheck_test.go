package kvmanager

import (
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/kvbridge/kvbridge/internal/core"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/kvmodel"
	"github.com/kvbridge/kvbridge/internal/nixl"
	"github.com/kvbridge/kvbridge/internal/testauth"
	"github.com/kvbridge/kvbridge/transfer"
	"github.com/stretchr/testify/require"
)

// TestWriteCheckNeedsTheInstanceShape: under a Model, what a prefill rank
// writes into this decode rank follows from its instance's shape; a link
// named without it (CreateReceiver's explicit targets) is left unchecked
// (an error), not planned as a rank of a TP-1 instance, which would put
// tails where another rank writes (a false not_delivered) — while a link
// with its shape is planned: prefill TP 2 → this decode TP 1, each rank
// half the heads of every page.
func TestWriteCheckNeedsTheInstanceShape(t *testing.T) {
	d := tinyModelDecode(t, "wcheck-shape")
	cfg := d.cfg

	for _, rank := range []int{0, 1} {
		_, _, _, write, err := d.slice(core.Link{Target: core.Target{Rank: rank}})
		require.Error(t, err, "rank %d without its instance's shape", rank)
		require.False(t, write)
		s, lo, hi, write, err := d.slice(core.Link{Target: core.Target{Rank: rank, InstTP: 2, InstPP: 1}})
		require.NoError(t, err)
		require.True(t, write)
		require.Equal(t, 1, s.Heads, "rank %d of 2 writes one of the two heads", rank)
		require.Equal(t, rank, s.DstHead)
		require.Equal(t, [2]int{0, len(cfg.Layout.Regions)}, [2]int{lo, hi})
	}
}

// TestWriteCheckFollowsThePrefillPlan: the decode shell's own mapping
// (slice, pageMap, a notification's layers to regions, the last chunk's
// partial page) against what the prefill ranks' plans write, for every
// shape of the rank mapping: heterogeneous TP both ways, PP stages (a
// region offset), pages of different sizes both ways, HND and NHD, each
// chunk sent as two layer groups where a stage has two layers. After
// each group's bytes land (the prefill plan's descriptors, filled), its
// notification as the prefill core builds it passes the check; with one
// of its descriptors left unwritten it fails, naming a piece.
func TestWriteCheckFollowsThePrefillPlan(t *testing.T) {
	m := kvmodel.Presets["tiny"] // 2 layers, 2 KV heads
	type shape struct {
		name             string
		pTP, pPP, dTP    int
		dRank            int
		pTokens, dTokens int
	}
	for _, sh := range []shape{
		{"TP 2 → 1", 2, 1, 1, 0, 16, 16},
		{"TP 1 → 2, rank 1", 1, 1, 2, 1, 16, 16},
		{"PP 2 → 1", 1, 2, 1, 0, 16, 16},
		{"TP 2 → 1, prefill pages of 8 → 16", 2, 1, 1, 0, 8, 16},
		{"prefill pages of 32 → 16", 1, 1, 1, 0, 32, 16},
	} {
		for _, layout := range []transfer.PageLayout{transfer.HND, transfer.NHD} {
			t.Run(sh.name+"/"+layout.String(), func(t *testing.T) {
				writeCheckFollows(t, m, sh.pTP, sh.pPP, sh.dTP, sh.dRank, sh.pTokens, sh.dTokens, layout)
			})
		}
	}
}

func writeCheckFollows(t *testing.T, m kvmodel.Model, pTP, pPP, dTP, dRank, pTokens, dTokens int, layout transfer.PageLayout) {
	const pages, tokens = 16, 88 // a room of 88 tokens: the last decode page partly filled
	dm := m
	dm.PageTokens = dTokens
	dpar := transfer.Parallel{TPSize: dTP, TPRank: dRank}
	cfg := DefaultConfig(RoleDecode)
	cfg.Auth, cfg.Instance, cfg.Compat, cfg.BootstrapURL = testauth.Auth(), "wcheck-plan", m.Compat(), "http://127.0.0.1:1"
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Model, cfg.Parallel = dm.Mapping(layout), dpar
	var err error
	cfg.Layout, err = dm.RankLayout(nixl.DRAM, layout, dpar, pages, 4)
	require.NoError(t, err)
	d, err := NewDecode(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	d.resolver = func(core.Target) {} // nothing is sent anywhere
	kv, _ := d.Memory()
	lay := d.cfg.Layout
	// at returns the decode memory a descriptor names.
	at := func(x nixl.Desc) []byte {
		for r, reg := range lay.Regions {
			if x.Addr >= reg.Addr && x.Addr+uintptr(x.Len) <= reg.Addr+uintptr(reg.Len) {
				off := x.Addr - reg.Addr
				return kv[r][off : off+uintptr(x.Len)]
			}
		}
		t.Fatalf("descriptor %+v outside the decode rank's regions", x)
		return nil
	}
	regionOf := func(x nixl.Desc) int {
		for r, reg := range lay.Regions {
			if x.Addr >= reg.Addr && x.Addr < reg.Addr+uintptr(reg.Len) {
				return r
			}
		}
		return -1
	}

	pm := transfer.Model(dm.Mapping(layout))
	pm.PageTokens = pTokens
	ppar := transfer.Parallel{TPSize: pTP, PPSize: pPP}
	tl, err := kvlayout.Links(cfg.Model, ppar, dpar)
	require.NoError(t, err)
	var links []core.Link
	for _, l := range tl {
		links = append(links, core.Link{Target: core.Target{Bootstrap: cfg.BootstrapURL, Rank: l.TPRank, PP: l.PPRank, InstTP: pTP, InstPP: pPP},
			Dummy: l.Dummy, Aux: l.Aux, Required: l.Required, Pages: kvlayout.PageMap{Src: pTokens, Dst: dTokens}})
	}
	const room = 1
	dst := []uint32{9, 2, 14, 5, 11, 0} // ⌈88/16⌉ decode pages of 16 tokens
	if dTokens != 16 {
		t.Fatalf("test case: decode pages of %d tokens", dTokens)
	}
	spec := core.RequestSpec{DstPages: dst, AuxIndex: -1, Digest: true}
	require.Equal(t, core.Applied, d.stepIn(core.CreateReceiver{Room: room, Links: links}).Result.Outcome)
	tails := d.writeTails(room, spec)
	require.NotEmpty(t, tails)
	require.Equal(t, core.Applied, d.stepAfter(d.plant(room, tails), core.InitReceiver{Room: room, Spec: spec}).Result.Outcome)

	nsrc := (tokens + pTokens - 1) / pTokens
	src := make([]uint32, nsrc)
	for i := range src {
		src[i] = uint32(nsrc - 1 - i) // descending: one run a page
	}
	split := nsrc / 2
	for split*pTokens%dTokens != 0 {
		split++
	}
	checked := 0
	for uid, l := range tl {
		p := transfer.Parallel{TPSize: pTP, TPRank: l.TPRank, PPSize: pPP, PPRank: l.PPRank}
		plan, err := kvlayout.Plan(pm, cfg.Model, p, dpar)
		require.NoError(t, err)
		if plan == nil {
			continue // a dummy: writes nothing
		}
		_, stage := pm.StageLayers(pPP, l.PPRank)
		pb, err := pm.PageBytes(pTP)
		require.NoError(t, err)
		local := transfer.Layout{Kind: nixl.DRAM, PageBytes: pb}
		for i := range stage * transfer.RegionsPerLayer {
			local.Regions = append(local.Regions, nixl.Desc{Addr: uintptr(1<<40 + i<<30), Len: uint64(nsrc) * pb})
		}
		shift := plan.RegionOffset / transfer.RegionsPerLayer
		groups := [][2]int{{0, stage}}
		if stage > 1 {
			groups = [][2]int{{0, 1}, {1, stage}}
		}
		for ci, c := range [][2]int{{0, split}, {split, nsrc}} {
			s, dd, off, n, err := kvlayout.PageMap{Src: pTokens, Dst: dTokens}.Pair(c[0], src[c[0]:c[1]], 0, dst)
			require.NoError(t, err)
			runs := kvlayout.Runs(s, dd)
			ld, rd := kvlayout.ExpandSlice(runs, local, lay, plan)
			for _, g := range groups {
				var mine []nixl.Desc // this layer group's
				for _, x := range rd {
					if r := regionOf(x); r >= 2*(g[0]+shift) && r < 2*(g[1]+shift) {
						mine = append(mine, x)
					}
				}
				require.NotEmpty(t, mine)
				n := core.Notified{Room: room, UID: uid, Chunk: ci, Off: off, N: n, Lo: g[0] + shift, Hi: g[1] + shift, SpanLo: shift, SpanHi: stage + shift}
				if ci == 1 {
					n.Total = 2
				}
				skip := len(mine) / 2
				for i, x := range mine {
					if i != skip {
						fill(at(x))
					}
				}
				got := d.checkWrite(n)
				require.Contains(t, got, "still ends with the canary", "source %d chunk %d layers %v: one descriptor (%+v) not written", uid, ci, g, mine[skip])
				fill(at(mine[skip]))
				require.Empty(t, d.checkWrite(n), "source %d chunk %d layers %v: every descriptor written", uid, ci, g)
				checkDigestFollows(t, d, n, local, plan, runs, g, ld, rd, dst, at)
				checked++
			}
		}
	}
	require.NotZero(t, checked)
}

// fill writes what a prefill rank's write brings (anything but a canary,
// never the same bytes twice in a row, so a digest over pieces in another
// order differs).
func fill(b []byte) {
	for i := range b {
		fillSeq++
		b[i] = byte(fillSeq*131 + fillSeq>>8)
	}
}

var fillSeq uint64

// checkDigestFollows: the digest the prefill pool sums for the layer group
// g of a chunk (kvlayout.DigestPieces of its runs over its own regions, as
// Pool.digest takes them), here summed over where each source piece lands
// (the plan's descriptors ld → rd), passes the decode shell's check of
// notification n; one byte flipped in a landed piece fails it, naming that
// piece's position and decode page.
func checkDigestFollows(t *testing.T, d *Decode, n core.Notified, local transfer.Layout, plan *kvlayout.Slice, runs []kvlayout.Run, g [2]int,
	ld, rd []nixl.Desc, dst []uint32, at func(nixl.Desc) []byte) {
	t.Helper()
	sp, se := kvlayout.DigestPieces(local, plan, true, 2*g[0], 2*g[1], runs, nil, nil)
	require.Len(t, se, n.N, "digest groups: one a position")
	landed := func(i int) nixl.Desc { // source piece i, where it lands
		for k := range ld {
			if sp[2*i] >= uint64(ld[k].Addr) && sp[2*i]+sp[2*i+1] <= uint64(ld[k].Addr)+ld[k].Len {
				return nixl.Desc{Addr: rd[k].Addr + uintptr(sp[2*i]-uint64(ld[k].Addr)), Len: sp[2*i+1]}
			}
		}
		t.Fatalf("source piece %d: no descriptor moves it", i)
		return nixl.Desc{}
	}
	i := 0
	for _, e := range se {
		crc := uint32(0)
		for ; i < e; i++ {
			crc = crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), at(landed(i)))
		}
		n.Digests = append(n.Digests, crc)
	}
	n.LastUnits = kvlayout.LastUnits(plan, runs)
	require.Empty(t, d.checkDigest(n), "the digest of what landed")
	mid := len(sp) / 4
	pos := 0
	for pos < len(se) && se[pos] <= mid {
		pos++
	}
	b := at(landed(mid))
	b[len(b)/2] ^= 0x20
	require.Contains(t, d.checkDigest(n), fmt.Sprintf("position %d (decode page %d)", n.Off+pos, dst[n.Off+pos]), "a byte flipped in piece %d", mid)
	b[len(b)/2] ^= 0x20
	require.Empty(t, d.checkDigest(n), "the byte flipped back")
}

// tinyModelDecode is a decode rank of the tiny model's Mapping (HND, one
// rank, 8 pages of 4 tokens a region) on the loopback engine, its
// bootstrap service never asked.
func tinyModelDecode(t *testing.T, instance string) *Decode {
	t.Helper()
	m := kvmodel.Presets["tiny"]
	cfg := DefaultConfig(RoleDecode)
	cfg.Auth, cfg.Instance, cfg.Compat, cfg.BootstrapURL = testauth.Auth(), instance, m.Compat(), "http://127.0.0.1:1"
	cfg.Engine = nixl.Config{Engine: nixl.EngineLoopback}
	cfg.Model = m.Mapping(transfer.HND)
	var err error
	cfg.Layout, err = m.RankLayout(nixl.DRAM, transfer.HND, transfer.Parallel{}, 8, 4)
	require.NoError(t, err)
	d, err := NewDecode(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}
