package e2e

import (
	"bytes"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kvbridge/kvbridge/kvmanager"
	"github.com/kvbridge/kvbridge/receiver"
	"github.com/kvbridge/kvbridge/sender"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSilentPartialWriteFailsRoom: a pushed write that the engine reports
// complete but that did not land (issue 54: NIXL 1.4.0 over cma reports a
// write whose destination page the kernel refused complete, and sends its
// notification) fails the room not_delivered on the decode rank, naming
// the piece, instead of Success on stale bytes. The decode rank makes one
// page of its destination read-only after Init (its canaries planted), so
// the engine's copy into it fails; an engine that reports that failure
// fails the room anyway, and one that reaches the page through another
// mapping (the ucx engine's shared memory) lands every byte: whatever the
// engine, the room never succeeds with a byte missing. The libnixl engines
// must take the silent path and fail not_delivered.
func TestSilentPartialWriteFailsRoom(t *testing.T) {
	for _, engine := range []string{"libnixl-double", "libnixl-real", "ucx-shm", "ucx-tcp"} {
		t.Run(engine, func(t *testing.T) {
			if _, ok := engines[engine]; !ok {
				t.Skipf("no %s engine here (libnixl-real: KVBRIDGE_NIXL_LIB, make test-nixl)", engine)
			}
			silentWrite(t, engine)
		})
	}
}

func silentWrite(t *testing.T, engine string) {
	// (A write the ucx engine's target refused fails unquiesced: the
	// room's pages wait out the quarantine before Released.)
	c := newCluster(t, engine, func(cfg *kvmanager.Config) {
		cfg.Registry.StallTimeout, cfg.QuarantineTimeout = time.Second, 2*time.Second
	})
	c.roomByteExact(t, 400, 1000, 16) // the check passes a room whose bytes all land

	// Destination pages around one OS page of region 3 (layer 1's V):
	// the pages of the OS page before it, then its own, in one run (a
	// copy that faults after copying some bytes is the one NIXL reports
	// complete; faulting at its first byte, its post fails).
	region := c.dKV[3]
	first, per := aroundOSPage(region)
	dst, src := cutRun(first, per)
	const id = 401
	r, err := receiver.New(c.decode, id)
	require.NoError(t, err)
	defer r.Clear()
	require.NoError(t, r.Init(ctx(t), kvmanager.RequestSpec{DstPages: dst, AuxIndex: 3}))
	gone := region[first*pageBytes : (first+per)*pageBytes]
	require.NoError(t, syscall.Mprotect(gone, syscall.PROT_READ))
	restore := func() { require.NoError(t, syscall.Mprotect(gone, syscall.PROT_READ|syscall.PROT_WRITE)) }
	defer func() { // (idempotent)
		syscall.Mprotect(gone, syscall.PROT_READ|syscall.PROT_WRITE)
	}()
	s, err := sender.New(c.prefill, id)
	require.NoError(t, err)
	defer s.Clear()
	require.NoError(t, s.Init())
	ready(t, s)
	require.NoError(t, s.Send(src, true, 5))
	st, _ := r.Wait(ctx(t))
	restore()
	t.Logf("%s: room %v: %s", engine, st, r.Failure())
	if st == kvmanager.Success {
		for reg := range c.pKV {
			for i := range dst {
				require.Equal(t, c.pKV[reg][int(src[i])*pageBytes:int(src[i]+1)*pageBytes], c.dKV[reg][int(dst[i])*pageBytes:int(dst[i]+1)*pageBytes],
					"room %d succeeded: region %d page %d → %d", id, reg, src[i], dst[i])
			}
		}
		require.NotContains(t, engine, "libnixl", "the libnixl engines' write into the read-only page cannot land")
		return
	}
	require.Equal(t, kvmanager.Failed, st)
	<-r.Released()
	rep, ok := r.Report()
	require.True(t, ok)
	if strings.HasPrefix(engine, "libnixl") {
		assert.Equal(t, kvmanager.CodeNotDelivered, rep.Code, "the engine reported the write done: the check must fail the room")
		assert.Contains(t, r.Failure(), "still ends with the canary", "the failure names the piece")
		assert.Contains(t, r.Failure(), "region 3 (layer 1 V), page", "the failure names the piece")
		assert.Contains(t, r.Failure(), c.prefill.Endpoint(), "the failure names the prefill rank")
		assert.GreaterOrEqual(t, counter(c.decode.Manager, "kvbridge_writes_not_delivered_total"), uint64(1))
	}
	// The ranks serve the next room.
	c.roomByteExact(t, 402, 1000, 16)
}

// TestSilentPartialWriteAcrossProcesses is TestSilentPartialWriteFailsRoom
// with the ranks in two processes, as NIXL's UCX moves host memory between
// processes (cma): on a real NIXL the write into the decode process's
// read-only page is reported complete and its notification sent, and the
// decode rank fails the room not_delivered, naming the piece; on the ucx
// engine the room fails or succeeds with every byte verified.
func TestSilentPartialWriteAcrossProcesses(t *testing.T) {
	t.Parallel() // its own processes and ports
	for _, engine := range []string{"ucx-shm", "ucx-tcp", "libnixl-real"} {
		t.Run(engine, func(t *testing.T) {
			var env []string
			if engine == "libnixl-real" {
				needRealNIXL(t)
			}
			boot := startBoot(t)
			prefill := startChild(t, append(env, "KVBRIDGE_E2E_ROLE=prefill", "KVBRIDGE_E2E_ENGINE="+engine, "KVBRIDGE_E2E_BOOT="+boot, "KVBRIDGE_E2E_QUARANTINE=3s", "KVBRIDGE_E2E_STALL=2s")...)
			decode := startChild(t, append(env, "KVBRIDGE_E2E_ROLE=decode", "KVBRIDGE_E2E_ENGINE="+engine, "KVBRIDGE_E2E_BOOT="+boot, "KVBRIDGE_E2E_QUARANTINE=3s", "KVBRIDGE_E2E_STALL=2s")...)
			pp, dp := newPagePool(pages), newPagePool(pages)
			pdRoomOf(t, prefill, decode, 1, 64, 16, pp, dp) // a room whose bytes all land passes the check
			decode.do("ALIGNED 5 0")
			var first, per int
			_, err := fmt.Sscanf(decode.expect(t, "ALIGNED"), "ALIGNED %d %d", &first, &per)
			require.NoError(t, err)
			dst, src := cutRun(first, per)
			decode.do(fmt.Sprintf("RECV+ 2 %s %s", csv(dst), csv(src)))
			decode.expect(t, "REQUESTED 2")
			decode.do(fmt.Sprintf("PROTECT 5 %d %d", first, per))
			require.Equal(t, "PROTECTED <nil>", decode.expect(t, "PROTECTED"))
			prefill.do(fmt.Sprintf("SEND 2 %s %d", csv(src), len(src)))
			got := decode.expect(t, "DONE 2")
			decode.do(fmt.Sprintf("UNPROTECT 5 %d %d", first, per))
			require.Equal(t, "UNPROTECTED <nil>", decode.expect(t, "UNPROTECTED"))
			t.Logf("%s: decode %s; prefill %s", engine, got, prefill.expect(t, "DONE 2"))
			if engine == "libnixl-real" {
				require.Contains(t, got, "DONE 2 Failed", "the engine reported the write done: the check must fail the room")
				require.Contains(t, got, "still_ends_with_the_canary")
				require.Contains(t, got, "region_5_(layer_2_V),_page_")
			} else if !strings.HasPrefix(got, "DONE 2 Failed") {
				require.Equal(t, "DONE 2 Success verified", got, "a room that succeeds has every byte")
			}
			pdRoomOf(t, prefill, decode, 3, 64, 16, pp, dp) // the ranks serve the next room
		})
	}
}

// TestSilentPartialStateWriteFailsRoom: the aux source's state items are
// checked at its aux notification too. Two state items written as one
// descriptor, the second in a page the decode process made read-only
// after Init: the engine reports the write done, and the room fails
// not_delivered naming the state item.
func TestSilentPartialStateWriteFailsRoom(t *testing.T) {
	for _, engine := range []string{"libnixl-double", "libnixl-real"} {
		t.Run(engine, func(t *testing.T) {
			if _, ok := engines[engine]; !ok {
				t.Skipf("no %s engine here (libnixl-real: KVBRIDGE_NIXL_LIB, make test-nixl)", engine)
			}
			c := newCluster(t, engine, func(cfg *kvmanager.Config) {
				cfg.Registry.StallTimeout, cfg.QuarantineTimeout = time.Second, 2*time.Second
			})
			st := c.decode.StateMemory()[0]
			item := c.decode.Config().Layout.State[0].ItemBytes
			os := syscall.Getpagesize()
			base := uintptr(unsafe.Pointer(&st[0]))
			off := int((base+uintptr(os)-1)&^uintptr(os-1)-base) + os // an OS page inside the region, not its first
			last := uint32(off / int(item))                           // its first item
			r, err := receiver.New(c.decode, 500)
			require.NoError(t, err)
			defer r.Clear()
			require.NoError(t, r.Init(ctx(t), kvmanager.RequestSpec{DstPages: c.dFree.Get(2), AuxIndex: 3, StateIndices: [][]uint32{{last - 1, last}}}))
			gone := st[off : off+os]
			require.NoError(t, syscall.Mprotect(gone, syscall.PROT_READ))
			defer syscall.Mprotect(gone, syscall.PROT_READ|syscall.PROT_WRITE)
			s, err := sender.New(c.prefill, 500)
			require.NoError(t, err)
			defer s.Clear()
			require.NoError(t, s.Init())
			ready(t, s)
			require.NoError(t, s.Send(c.pFree.Get(2), true, 1, []uint32{10, 11}))
			got, _ := r.Wait(ctx(t))
			require.NoError(t, syscall.Mprotect(gone, syscall.PROT_READ|syscall.PROT_WRITE))
			t.Logf("%s: room %v: %s", engine, got, r.Failure())
			require.Equal(t, kvmanager.Failed, got, "a state item did not land")
			<-r.Released()
			rep, ok := r.Report()
			require.True(t, ok)
			if !strings.Contains(r.Failure(), "post") { // (NIXL may fail the post instead: the room fails either way)
				assert.Equal(t, kvmanager.CodeNotDelivered, rep.Code)
				assert.Contains(t, r.Failure(), fmt.Sprintf("state region 0, item %d", last))
			}
		})
	}
}

// TestSecondInitPlantsNothing: the write check plants a room's canaries
// only when its Init applies. A second Init of a room whose REQUEST went
// out (an application's mistake, refused) must not plant over pages a
// write may already have filled: their bytes would turn to canaries that
// no later notification checks.
func TestSecondInitPlantsNothing(t *testing.T) {
	c := newCluster(t, "ucx-shm", nil)
	rm := c.start(t, 600, 64)
	ready(t, rm.s)
	// What a first write would leave: every byte of the room's pages set.
	for region := range c.dKV {
		for _, d := range rm.dst {
			for k := range pageBytes {
				c.dKV[region][int(d)*pageBytes+k] = 0x5a
			}
		}
	}
	err := rm.r.Init(ctx(t), kvmanager.RequestSpec{DstPages: rm.dst, AuxIndex: rm.auxDst})
	require.Error(t, err, "a second Init is refused")
	for region := range c.dKV {
		for _, d := range rm.dst {
			require.Equal(t, bytes.Repeat([]byte{0x5a}, pageBytes), c.dKV[region][int(d)*pageBytes:int(d+1)*pageBytes], "region %d page %d after a second Init", region, d)
		}
	}
	c.sendAll(t, rm, 16)
	waitStatus(t, rm.r, kvmanager.Success)
	c.verify(t, rm)
	c.finish(rm)
}

// TestSilentPartialReadFailsRoom: a pull room whose READ the engine
// reports complete but did not deliver (the prefill process made a page
// of its source unreadable after publishing it) fails not_delivered on
// the decode rank, naming the descriptor, instead of Success on stale
// bytes; the READ is over, so the room's pages are released without the
// quarantine.
func TestSilentPartialReadFailsRoom(t *testing.T) {
	for _, engine := range []string{"libnixl-double", "libnixl-real"} {
		t.Run(engine, func(t *testing.T) {
			if _, ok := engines[engine]; !ok {
				t.Skipf("no %s engine here (libnixl-real: KVBRIDGE_NIXL_LIB, make test-nixl)", engine)
			}
			c := newCluster(t, engine, pulling)
			rm := c.start(t, 700, 1000) // a room whose reads all land passes
			ready(t, rm.s)
			c.sendAll(t, rm, 16)
			waitStatus(t, rm.r, kvmanager.Success)
			c.verify(t, rm)
			c.finish(rm)
			// Source pages around one OS page of region 3, contiguous on
			// both sides: one descriptor a region, which the fault cuts.
			region := c.pKV[3]
			first, per := aroundOSPage(region)
			src, dst := cutRun(first, per)
			const id = 701
			r, err := receiver.New(c.decode, id)
			require.NoError(t, err)
			defer r.Clear()
			// With an aux item and state items: a second transfer of the
			// read (host memory), waited for before the room's pages go.
			require.NoError(t, r.Init(ctx(t), kvmanager.RequestSpec{DstPages: dst, AuxIndex: 2, StateIndices: [][]uint32{{3}}}))
			s, err := sender.New(c.prefill, id)
			require.NoError(t, err)
			defer s.Clear()
			require.NoError(t, s.Init())
			ready(t, s)
			gone := region[first*pageBytes : (first+per)*pageBytes]
			require.NoError(t, syscall.Mprotect(gone, syscall.PROT_NONE))
			defer syscall.Mprotect(gone, syscall.PROT_READ|syscall.PROT_WRITE)
			require.NoError(t, s.Send(src, true, 1, []uint32{4}))
			st, _ := r.Wait(ctx(t))
			t.Logf("%s: room %v: %s", engine, st, r.Failure())
			require.Equal(t, kvmanager.Failed, st, "a page of the read did not land")
			select {
			case <-r.Released():
			case <-time.After(5 * time.Second): // (the quarantine here: 10 s)
				t.Fatal("the room's pages wait (the quarantine?) after a READ the engine reported complete")
			}
			require.NoError(t, syscall.Mprotect(gone, syscall.PROT_READ|syscall.PROT_WRITE))
			rep, ok := r.Report()
			require.True(t, ok)
			assert.Equal(t, kvmanager.CodeNotDelivered, rep.Code)
			assert.Contains(t, r.Failure(), "was not delivered")
			assert.Zero(t, counter(c.decode.Manager, "kvbridge_quarantine_expired_total"))
		})
	}
}

// aroundOSPage is a page of region (pageBytes each) that starts an OS page
// at least 8 OS pages in, and how many pages an OS page holds.
func aroundOSPage(region []byte) (first, per int) {
	os := syscall.Getpagesize()
	base := uintptr(unsafe.Pointer(&region[0]))
	return (int((base+uintptr(os)-1)&^uintptr(os-1)-base) + 8*os) / pageBytes, os / pageBytes
}

// cutRun is a write's two sides contiguous, so one descriptor a region
// that a fault at page first cuts (a partial copy NIXL 1.4.0 reports
// complete): the pages of the OS page before first and of first's own
// (run), and as many at the end of the pool (other).
func cutRun(first, per int) (run, other []uint32) {
	for i := range 2 * per {
		run, other = append(run, uint32(first-per+i)), append(other, uint32(pages-2*per+i))
	}
	return run, other
}
