package cuda

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// openStream is a stream on device 0 of d, released at the test's end.
func openStream(t *testing.T, d *Driver) (*Context, *Stream) {
	t.Helper()
	c, err := d.Primary(0)
	require.NoError(t, err)
	t.Cleanup(func() { c.Release() })
	s, err := c.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { s.Destroy() })
	return c, s
}

// TestEventGatesOnTheStream: an event recorded after a copy completes once
// the copy has (Sync, then Query true; the copied bytes are in place), its
// Ready hook answers as Query does, and Destroy is final.
func TestEventGatesOnTheStream(t *testing.T) {
	driverCases(t, func(t *testing.T, d *Driver, _ bool) {
		c, s := openStream(t, d)
		const n = 1 << 20
		a, err := c.Alloc(n)
		require.NoError(t, err)
		defer c.Free(a)
		b, _ := c.Alloc(n)
		defer c.Free(b)
		src := bytes.Repeat([]byte("layer-01"), n/8)
		require.NoError(t, c.CopyHtoD(a, src))
		require.NoError(t, s.CopyDtoDAsync(b, a, n))
		ev, err := s.Record()
		require.NoError(t, err)
		require.NoError(t, ev.Sync())
		ready := ev.Ready()
		done, err := ready()
		require.NoError(t, err, "after Sync")
		require.True(t, done, "after Sync: ready")
		got := make([]byte, n)
		require.NoError(t, c.CopyDtoH(got, b), "the copy before the event is not in place")
		require.Equal(t, src, got, "the copy before the event is not in place")
		require.NoError(t, ev.Rerecord())
		require.NoError(t, ev.Sync())
		require.NoError(t, ev.Destroy())
		require.NoError(t, ev.Destroy(), "second Destroy")
		done, err = ready()
		require.ErrorIs(t, err, ErrEventDestroyed, "Query after Destroy")
		require.False(t, done, "Query after Destroy")
		require.ErrorIs(t, ev.Sync(), ErrEventDestroyed, "Sync after Destroy")
	})
}

// TestEventNotReadyThenReady (double): an event whose work is still
// running answers (false, nil) — CUDA_ERROR_NOT_READY is not an error —
// for exactly as many queries as the double was told, then (true, nil);
// Sync completes one early; the count is read at record time.
func TestEventNotReadyThenReady(t *testing.T) {
	d, err := LoadDriver(doubleLib)
	require.NoError(t, err)
	_, s := openStream(t, d)
	t.Setenv("KVB_FAKE_EVENT_POLLS", "3")
	ev, err := s.Record()
	require.NoError(t, err)
	defer ev.Destroy()
	t.Setenv("KVB_FAKE_EVENT_POLLS", "0") // read at record: no effect on ev
	ready := ev.Ready()
	for i := range 3 {
		done, err := ready()
		require.NoError(t, err, "query %d of a running event", i+1)
		require.False(t, done, "query %d of a running event", i+1)
	}
	done, err := ready()
	require.NoError(t, err, "query 4")
	require.True(t, done, "query 4")
	t.Setenv("KVB_FAKE_EVENT_POLLS", "1000")
	require.NoError(t, ev.Rerecord())
	done, err = ev.Query()
	require.NoError(t, err, "re-recorded")
	require.False(t, done, "re-recorded")
	require.NoError(t, ev.Sync())
	done, err = ev.Query()
	require.NoError(t, err, "after Sync")
	require.True(t, done, "after Sync")
}

// TestEventErrors (double): a failing query is an error naming the call
// and the code, not "not ready"; a failing record returns no event.
func TestEventErrors(t *testing.T) {
	d, err := LoadDriver(doubleLib)
	require.NoError(t, err)
	_, s := openStream(t, d)
	ev, err := s.Record()
	require.NoError(t, err)
	defer ev.Destroy()
	var ce *CUDAError
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "cuEventQuery")
	done, err := ev.Ready()()
	require.False(t, done, "failing query")
	require.ErrorAs(t, err, &ce, "failing query")
	require.Equal(t, "cuEventQuery", ce.Call, "failing query: %v", err)
	require.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ce.Name, "failing query: %v", err)
	for _, sym := range []string{"cuEventCreate", "cuEventRecord"} {
		t.Setenv("KVB_CUDA_DOUBLE_FAIL", sym)
		e, err := s.Record()
		require.Nil(t, e, "record with %s failing", sym)
		require.ErrorAs(t, err, &ce, "record with %s failing", sym)
		require.Equal(t, "cuEventRecord", ce.Call, "record with %s failing: %v", sym, err)
	}
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "cuEventSynchronize")
	require.ErrorAs(t, ev.Sync(), &ce, "failing sync")
	require.Equal(t, "cuEventSynchronize", ce.Call, "failing sync")
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "")
	done, err = ev.Query()
	require.NoError(t, err, "query once the failure is gone")
	require.True(t, done, "query once the failure is gone")
}
