package gpu

import (
	"bytes"
	"errors"
	"testing"
)

// openStream is a stream on device 0 of d, released at the test's end.
func openStream(t *testing.T, d *Driver) (*Context, *Stream) {
	t.Helper()
	c, err := d.Primary(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Release() })
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
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
		if err != nil {
			t.Fatal(err)
		}
		defer c.Free(a)
		b, _ := c.Alloc(n)
		defer c.Free(b)
		src := bytes.Repeat([]byte("layer-01"), n/8)
		if err := c.CopyHtoD(a, src); err != nil {
			t.Fatal(err)
		}
		if err := s.CopyDtoDAsync(b, a, n); err != nil {
			t.Fatal(err)
		}
		ev, err := s.Record()
		if err != nil {
			t.Fatal(err)
		}
		if err := ev.Sync(); err != nil {
			t.Fatal(err)
		}
		ready := ev.Ready()
		if done, err := ready(); !done || err != nil {
			t.Fatalf("after Sync: ready %v, %v", done, err)
		}
		got := make([]byte, n)
		if err := c.CopyDtoH(got, b); err != nil || !bytes.Equal(got, src) {
			t.Fatalf("the copy before the event is not in place: %v", err)
		}
		if err := ev.Rerecord(); err != nil {
			t.Fatal(err)
		}
		if err := ev.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := ev.Destroy(); err != nil {
			t.Fatal(err)
		}
		if err := ev.Destroy(); err != nil {
			t.Fatalf("second Destroy: %v", err)
		}
		if done, err := ready(); done || !errors.Is(err, ErrEventDestroyed) {
			t.Fatalf("Query after Destroy: %v, %v", done, err)
		}
		if err := ev.Sync(); !errors.Is(err, ErrEventDestroyed) {
			t.Fatalf("Sync after Destroy: %v", err)
		}
	})
}

// TestEventNotReadyThenReady (double): an event whose work is still
// running answers (false, nil) — CUDA_ERROR_NOT_READY is not an error —
// for exactly as many queries as the double was told, then (true, nil);
// Sync completes one early; the count is read at record time.
func TestEventNotReadyThenReady(t *testing.T) {
	d, err := LoadDriver(doubleLib)
	if err != nil {
		t.Fatal(err)
	}
	_, s := openStream(t, d)
	t.Setenv("KVB_FAKE_EVENT_POLLS", "3")
	ev, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	t.Setenv("KVB_FAKE_EVENT_POLLS", "0") // read at record: no effect on ev
	ready := ev.Ready()
	for i := range 3 {
		if done, err := ready(); done || err != nil {
			t.Fatalf("query %d of a running event: %v, %v", i+1, done, err)
		}
	}
	if done, err := ready(); !done || err != nil {
		t.Fatalf("query 4: %v, %v", done, err)
	}
	t.Setenv("KVB_FAKE_EVENT_POLLS", "1000")
	if err := ev.Rerecord(); err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); done || err != nil {
		t.Fatalf("re-recorded: %v, %v", done, err)
	}
	if err := ev.Sync(); err != nil {
		t.Fatal(err)
	}
	if done, err := ev.Query(); !done || err != nil {
		t.Fatalf("after Sync: %v, %v", done, err)
	}
}

// TestEventErrors (double): a failing query is an error naming the call
// and the code, not "not ready"; a failing record returns no event.
func TestEventErrors(t *testing.T) {
	d, err := LoadDriver(doubleLib)
	if err != nil {
		t.Fatal(err)
	}
	_, s := openStream(t, d)
	ev, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	var ce *CUDAError
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "cuEventQuery")
	if done, err := ev.Ready()(); done || !errors.As(err, &ce) || ce.Call != "cuEventQuery" || ce.Name != "CUDA_ERROR_OUT_OF_MEMORY" {
		t.Fatalf("failing query: %v, %v", done, err)
	}
	for _, sym := range []string{"cuEventCreate", "cuEventRecord"} {
		t.Setenv("KVB_CUDA_DOUBLE_FAIL", sym)
		if e, err := s.Record(); e != nil || !errors.As(err, &ce) || ce.Call != "cuEventRecord" {
			t.Fatalf("record with %s failing: %v, %v", sym, e, err)
		}
	}
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "cuEventSynchronize")
	if err := ev.Sync(); !errors.As(err, &ce) || ce.Call != "cuEventSynchronize" {
		t.Fatalf("failing sync: %v", err)
	}
	t.Setenv("KVB_CUDA_DOUBLE_FAIL", "")
	if done, err := ev.Query(); !done || err != nil {
		t.Fatalf("query once the failure is gone: %v, %v", done, err)
	}
}
