package cuda

/*
#include "cuda.h"

static int cu_event_record(kvb_cuda *c, cu_stream s, cu_event *e) {
	int r = c->event_create(e, KVB_CU_EVENT_DISABLE_TIMING);
	if (r) return r;
	r = c->event_record(*e, s);
	if (r) { c->event_destroy(*e); *e = NULL; }
	return r;
}
static int cu_event_rerecord(kvb_cuda *c, cu_event e, cu_stream s) { return c->event_record(e, s); }
static int cu_event_query(kvb_cuda *c, cu_event e) { return c->event_query(e); }
static int cu_event_sync(kvb_cuda *c, cu_event e) { return c->event_sync(e); }
static int cu_event_destroy(kvb_cuda *c, cu_event e) { return c->event_destroy(e); }
*/
import "C"

import (
	"errors"
	"sync"
)

// ErrEventDestroyed: the event was used after Destroy.
var ErrEventDestroyed = errors.New("cuda: event destroyed")

// Event is a CUDA event recorded on a stream: it completes when everything
// queued on the stream before it has finished. It is what a layer-wise
// sender waits on before posting a layer a kernel wrote: Ready returns a
// readiness hook that queries it without blocking. An Event is safe for
// concurrent use; Destroy waits for a Query in progress.
type Event struct {
	s  *Stream
	mu sync.Mutex
	ev C.cu_event // nil once destroyed
}

// Record creates an event (timing disabled, the cheapest kind) and records
// it on the stream: it completes once the work queued so far has.
func (s *Stream) Record() (*Event, error) {
	var ev C.cu_event
	err := s.c.on(func() error { return s.c.d.check("cuEventRecord", C.cu_event_record(s.c.d.lib, s.s, &ev)) })
	if err != nil {
		return nil, err
	}
	return &Event{s: s, ev: ev}, nil
}

// Rerecord records the event again on its stream (reusing it for the next
// layer saves a create and a destroy).
func (e *Event) Rerecord() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ev == nil {
		return ErrEventDestroyed
	}
	c := e.s.c
	return c.on(func() error { return c.d.check("cuEventRecord", C.cu_event_rerecord(c.d.lib, e.ev, e.s.s)) })
}

// Query reports whether the work before the event has finished, without
// blocking: CUDA_ERROR_NOT_READY is (false, nil); any other failure is an
// error (a failed kernel before the event shows up here).
func (e *Event) Query() (done bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ev == nil {
		return false, ErrEventDestroyed
	}
	c := e.s.c
	var r C.int
	err = c.on(func() error {
		r = C.cu_event_query(c.d.lib, e.ev)
		if r == C.KVB_CU_ERROR_NOT_READY {
			return nil
		}
		return c.d.check("cuEventQuery", r)
	})
	return err == nil && r == 0, err
}

// Sync blocks until the event has completed.
func (e *Event) Sync() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ev == nil {
		return ErrEventDestroyed
	}
	c := e.s.c
	return c.on(func() error { return c.d.check("cuEventSynchronize", C.cu_event_sync(c.d.lib, e.ev)) })
}

// Ready is the event as a readiness hook: each call is a Query. Its type
// is transfer.Ready's, so it can gate a layer's post directly (package cuda
// does not import transfer).
func (e *Event) Ready() func() (bool, error) { return e.Query }

// Destroy releases the event; a second Destroy does nothing, and Query,
// Sync and Rerecord after it return ErrEventDestroyed.
func (e *Event) Destroy() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ev == nil {
		return nil
	}
	c := e.s.c
	err := c.on(func() error { return c.d.check("cuEventDestroy", C.cu_event_destroy(c.d.lib, e.ev)) })
	e.ev = nil
	return err
}
