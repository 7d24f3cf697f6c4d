package core

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvbridge/kvbridge/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeAskedDigest is decodeAsked with the room asking for a digest: its
// REQUEST says so.
func decodeAskedDigest(t *testing.T, pages ...uint32) *Core {
	t.Helper()
	if len(pages) == 0 {
		pages = []uint32{1}
	}
	c := testCore(t, RoleDecode)
	c.Step(t0, CreateReceiver{Room: 1, Targets: []Target{prefillT}})
	c.Step(t0, Resolved{Target: prefillT, Endpoint: prefillFrom.Endpoint})
	c.Step(t0, InitReceiver{Room: 1, Spec: RequestSpec{DstPages: pages, AuxIndex: -1, Digest: true}})
	c.Step(t0, Received{Msg: &wire.RegisterAck{From: prefillFrom, OK: true}})
	reqs := sent[*wire.Request](c.Effects())
	require.Len(t, reqs, 1, "room 1's REQUEST: %v", reqs)
	require.True(t, reqs[0].Digest, "room 1's REQUEST asks for a digest")
	return c
}

// TestDigestFailsRoom (docs/PROTOCOL.md "Digest"): a room that asked for a
// digest fails with code corrupt — the reason naming the prefill rank,
// chunk and what did not match, the prefill rank told by ABORT, nothing of
// the notification recorded as landed, counted — on a notification whose
// pages did not match (the shell's Corrupt), and on one of pages that
// carries no digest; a matching one with its aux succeeds; a room that did
// not ask ignores a missing digest.
func TestDigestFailsRoom(t *testing.T) {
	n := Notified{Room: 1, Chunk: 0, Total: 1, Off: 0, N: 1, Lo: 0, Hi: 1, SpanLo: 0, SpanHi: 1, Digests: []uint32{7}, LastUnits: 1, Checked: true}
	for _, tc := range []struct {
		name, corrupt, want string
		digests             []uint32
	}{
		{"mismatch", "position 0 (decode page 1), layers 0–1: CRC-32C 00000008, the prefill rank's digest 00000007", "CRC-32C 00000008", []uint32{7}},
		{"no digest", "", "carries none", nil},
		{"an earlier revision's whole chunk (no positions, no digest)", "", "carries none", nil},
		{"not checked", "", "not checked against their digest", []uint32{7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := decodeAskedDigest(t)
			bad := n
			bad.Corrupt, bad.Digests, bad.Checked = tc.corrupt, tc.digests, tc.corrupt != ""
			if strings.HasPrefix(tc.name, "an earlier revision") {
				bad, _ = ParseNotif("kvb1:1:0:0:1")
			}
			c.Step(t0, bad)
			assert.Empty(t, c.reg.rooms[1].dec.sources[0].chunks, "nothing of the notification recorded as landed")
			st, _ := c.Status(1)
			require.Equal(t, Failed, st)
			reason, _ := c.Failure(1)
			assert.Contains(t, reason, prefillFrom.Endpoint, "the failure names the prefill rank")
			assert.Contains(t, reason, "chunk 0")
			assert.Contains(t, reason, tc.want)
			assert.EqualValues(t, 1, c.Stats().DigestMismatches)
			assert.Zero(t, c.Stats().BadNotifs)
			assert.Equal(t, CodeCorrupt, c.reg.rooms[1].dec.code)
			aborts := sent[*wire.Abort](c.Effects())
			require.Len(t, aborts, 1, "the prefill rank is told")
			assert.EqualValues(t, 1, aborts[0].Room)
		})
	}
	c := decodeAskedDigest(t)
	c.Step(t0, n)
	c.Step(t0, Notified{Room: 1, Aux: true})
	st, _ := c.Status(1)
	assert.Equal(t, Success, st, "the notification with its digest matching")

	// A room that failed already: its shell checks no later notification
	// (it checks a live room's only), and what one names is not recorded
	// as landed — its load report vouches for none of it; a checked one
	// would be.
	for _, checked := range []bool{false, true} {
		c = decodeAskedDigest(t, 1, 2)
		first := n
		first.Corrupt = "position 0: CRC-32C 00000008, the prefill rank's digest 00000007"
		c.Step(t0, first)
		st, _ = c.Status(1)
		require.Equal(t, Failed, st)
		late := Notified{Room: 1, Chunk: 1, Total: 2, Off: 1, N: 1, Lo: 0, Hi: 1, SpanLo: 0, SpanHi: 1, Digests: []uint32{7}, LastUnits: 1, Checked: checked}
		c.Step(t0, late)
		assert.Equal(t, checked, len(c.reg.rooms[1].dec.sources[0].chunks) == 1, "a failed room's later notification, checked %v: recorded as landed", checked)
		assert.EqualValues(t, 1, c.Stats().DigestMismatches, "the failed room's later notification counted as a mismatch")
	}

	c = decodeAsked(t) // (no digest asked)
	bare := n
	bare.Digests = nil
	c.Step(t0, bare)
	c.Step(t0, Notified{Room: 1, Aux: true})
	st, _ = c.Status(1)
	assert.Equal(t, Success, st, "a room that asked for no digest, its notification without one")
	assert.Zero(t, c.Stats().DigestMismatches)
}

// TestParseNotifDigest: a notification's digest fields parse into a sum a
// position and the last page's units; sums of another length than 8 hex
// digits a position, non-hex ones, units out of [1, MaxLastUnits], or
// sums on a notification of no positions do not parse.
func TestParseNotifDigest(t *testing.T) {
	base := "kvb1:9:0:1:2:4:2:0:32:0:32"
	n, ok := ParseNotif(base + ":0badbad0deadbeef:3")
	require.True(t, ok)
	assert.Equal(t, []uint32{0x0badbad0, 0xdeadbeef}, n.Digests)
	assert.Equal(t, 3, n.LastUnits)
	assert.Equal(t, 2, n.N)
	n, ok = ParseNotif(base)
	require.True(t, ok)
	assert.Nil(t, n.Digests, "no digest fields")
	for _, bad := range []string{
		base + ":0badbad0:1",                        // one sum for two positions
		base + ":0badbad0deadbeef00:1",              // past two
		base + ":0badbad0deadbeeg:1",                // not hex
		base + ":0badbad0+eadbeef:1",                // a sign
		base + ":0badbad0deadbeef:0",                // no units
		base + ":0badbad0deadbeef:65537",            // too many
		base + ":0badbad0deadbeef:x",                // not a number
		"kvb1:9:0:1:2:4:0:0:32:0:32::1",             // no positions
		"kvb1:9:0:1:2:4:0:0:32:0:32:0badbad0:1",     // sums for none
		base + ":" + strings.Repeat("0", 8*2) + ":", // empty units
	} {
		_, ok := ParseNotif(bad)
		assert.False(t, ok, "%q parsed", bad)
	}
	// Sums for more positions than a REQUEST can name, each 8 digits:
	// refused by the bound, not parsed into a table that large.
	huge := fmt.Sprintf("kvb1:9:0:1:2:0:%d:0:32:0:32:%s:1", wire.MaxPages+1, strings.Repeat("0", 8*(wire.MaxPages+1)))
	_, ok = ParseNotif(huge)
	assert.False(t, ok, "sums for %d positions parsed", wire.MaxPages+1)
}

// TestPullDigestSums (docs/PROTOCOL.md "Digest", pulled): a pull room that
// asked for a digest gets, on each PAGES of pages, a sum a position (the
// prefill shell's, here the simulator's) that its read carries to the
// decode shell's check (a read done unchecked fails the live room); a
// PAGES without them, or with another number of them, fails the room
// corrupt, naming the room and why, no read asked.
func TestPullDigestSums(t *testing.T) {
	c := simBase()
	c.rooms, c.noClear, c.digest = []simRoomSpec{simPullRoom(7, []int{0}, []int{0}, 2)}, true, true
	base, n := runScript(c, append(slices.Clone(pullScript[:8]), "room 7 prefill 0 send chunk 0"))
	require.Equal(t, 9, n, "stopped: %v", base.err)
	require.NoError(t, base.err)
	genuine := *base.net[0][1][0].msg.(*wire.Pages)
	require.Len(t, genuine.Digests, len(genuine.Pages), "the PAGES' sums: one a position")
	require.Equal(t, 1, genuine.Units)
	for _, tc := range []struct {
		name    string
		digests []uint32
		fail    string
	}{
		{"the sums", genuine.Digests, ""},
		{"no sums", nil, "0 sums for its 1 positions"},
		{"a sum too many", append(slices.Clone(genuine.Digests), 0), "2 sums for its 1 positions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := base.clone()
			m := genuine
			m.Digests = tc.digests
			w.net[0][1][0] = simMsg{from: w.net[0][1][0].from, to: w.net[0][1][0].to, msg: &m}
			reads := len(w.reads)
			w.deliver(0, 1)
			require.NoError(t, w.err)
			d := w.procs[1].core
			st, _ := d.Status(7)
			if tc.fail == "" {
				require.NotEqual(t, Failed, st)
				require.Len(t, w.reads, reads+1, "a read asked")
				r := w.reads[len(w.reads)-1]
				require.Equal(t, genuine.Digests, r.rd.Notif.Digests, "the read carries the sums to the check")
				// A read done that the shell did not check (no Checked,
				// no Corrupt) fails the live room, not left to stall.
				d.Step(w.now, ReadDone{Room: 7, Read: r.rd})
				st, _ := d.Status(7)
				require.Equal(t, Failed, st, "a live room's read done unchecked")
				reason, _ := d.Failure(7)
				require.Contains(t, reason, "not checked against their digest")
				return
			}
			require.Equal(t, Failed, st)
			reason, _ := d.Failure(7)
			require.Contains(t, reason, "room 7")
			require.Contains(t, reason, tc.fail)
			require.Equal(t, CodeCorrupt, d.reg.rooms[7].dec.code)
			require.Len(t, w.reads, reads, "no read asked")
		})
	}
}
