package nixl

/*
#include <stdint.h>
#include <string.h>
static void kvb_copy(uintptr_t dst, uintptr_t src, size_t n) { memmove((void *)dst, (const void *)src, n); }
*/
import "C"

import (
	"fmt"
	"sync"

	"github.com/kvbridge/kvbridge/internal/mem"
)

// The loopback engine: agents in one process find each other by name and a
// write is a copy. For unit tests and single-process serving. Every copy is
// checked against the target's current registrations under its lock, so a
// peer that deregistered or closed is never written.

var loopbackAgents = struct {
	sync.Mutex
	m map[string]*loopback
}{m: map[string]*loopback{}}

type loopback struct {
	name    string
	cudaLib string // Config.CUDALib

	mu     sync.Mutex
	regs   map[*[]remoteRegion]struct{}
	known  map[string]bool
	queue  []Notif
	wake   chan struct{}
	closed bool
}

func openLoopback(cfg Config) (backend, error) {
	loopbackAgents.Lock()
	defer loopbackAgents.Unlock()
	if _, ok := loopbackAgents.m[cfg.Name]; ok {
		return nil, fmt.Errorf("nixl: loopback agent %q already exists in this process", cfg.Name)
	}
	l := &loopback{name: cfg.Name, cudaLib: cfg.CUDALib, regs: map[*[]remoteRegion]struct{}{}, known: map[string]bool{}, wake: make(chan struct{}, 1)}
	loopbackAgents.m[cfg.Name] = l
	return l, nil
}

func lookupLoopback(name string) *loopback {
	loopbackAgents.Lock()
	defer loopbackAgents.Unlock()
	return loopbackAgents.m[name]
}

func (l *loopback) register(kind MemKind, descs []Desc) (any, error) {
	if kind == VRAM {
		if _, err := cudaContext(l.cudaLib, int(descs[0].Dev)); err != nil {
			return nil, err
		}
	}
	rs := make([]remoteRegion, len(descs))
	for i, d := range descs {
		rs[i] = remoteRegion{kind, d}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.regs[&rs] = struct{}{}
	return &rs, nil
}

func (l *loopback) deregister(h any) error {
	rs, ok := h.(*[]remoteRegion)
	if a, isAlloc := h.(*loopbackAlloc); isAlloc {
		rs, ok = a.regions, true
	}
	if !ok {
		return fmt.Errorf("loopback: foreign registration handle: %w", ErrInvalidDescriptor)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.regs, rs)
	return nil
}

type loopbackAlloc struct {
	regions *[]remoteRegion
	buf     []byte // keeps the Go memory alive while registered
}

func (l *loopback) alloc(kind MemKind, size uint64) ([]byte, any, error) {
	buf := make([]byte, size)
	h, err := l.register(kind, []Desc{BytesDesc(buf)})
	if err != nil {
		return nil, nil, err
	}
	return buf, &loopbackAlloc{regions: h.(*[]remoteRegion), buf: buf}, nil
}

// loopbackLibrary is the loopback engine's library in metadata blobs.
const loopbackLibrary = "loopback"

func (l *loopback) metadata(regs []*Registration) ([]byte, error) {
	m := metadataBlob{engine: EngineLoopback, library: loopbackLibrary, agent: l.name}
	for _, r := range regs {
		for _, d := range r.Descs {
			m.regions = append(m.regions, mdRegion{remoteRegion: remoteRegion{r.Kind, d}})
		}
	}
	return m.encode(), nil
}

func (l *loopback) loadRemote(md []byte) (string, []remoteRegion, error) {
	m, err := decodeMetadata(md, EngineLoopback, loopbackLibrary)
	if err != nil {
		return "", nil, err
	}
	if lookupLoopback(m.agent) == nil {
		return "", nil, fmt.Errorf("loopback agent %q is not in this process: %w", m.agent, ErrRemoteUnknown)
	}
	l.mu.Lock()
	l.known[m.agent] = true
	l.mu.Unlock()
	return m.agent, m.remoteRegions(), nil
}

func (l *loopback) invalidate(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.known, name)
	return nil
}

func (l *loopback) prep(string, MemKind, []Desc) (any, error) { return struct{}{}, nil }
func (l *loopback) unprep(any) error                          { return nil }

// loopRegion names one registered region: its registration and index.
type loopRegion struct {
	reg *[]remoteRegion
	i   int
}

// regionOf returns the region of kind l has registered now that d lies
// in (ok false: none).
func (l *loopback) regionOf(kind MemKind, d Desc) (loopRegion, bool) {
	for rs := range l.regs {
		for i, r := range *rs {
			if r.Kind == kind && mem.Contains(r.Desc, d) {
				return loopRegion{rs, i}, true
			}
		}
	}
	return loopRegion{}, false
}

type loopbackXfer struct {
	state XferState
	err   error
}

func (l *loopback) post(x *Xfer) error {
	st := &loopbackXfer{state: Done}
	x.handle = st
	l.mu.Lock()
	known := l.known[x.Remote]
	l.mu.Unlock()
	peer := lookupLoopback(x.Remote)
	if !known || peer == nil {
		st.state, st.err = Failed, fmt.Errorf("loopback peer %q: %w", x.Remote, ErrRemoteUnknown)
		return nil
	}
	if peer == l {
		l.mu.Lock()
		defer l.mu.Unlock()
	} else {
		// Lock both agents in name order so concurrent opposite writes
		// cannot deadlock.
		first, second := l, peer
		if second.name < first.name {
			first, second = second, first
		}
		first.mu.Lock()
		defer first.mu.Unlock()
		second.mu.Lock()
		defer second.mu.Unlock()
	}
	if peer.closed {
		st.state, st.err = Failed, fmt.Errorf("loopback peer %q closed: %w", x.Remote, ErrTransfer)
		return nil
	}
	srcAgent, dstAgent := l, peer
	srcKind, dstKind := x.local.Kind, x.remote.Kind
	srcs, dsts := x.Local, x.Dst
	if x.Op == Read {
		srcAgent, dstAgent = peer, l
		srcKind, dstKind = dstKind, srcKind
		srcs, dsts = dsts, srcs
	}
	srcRegs, dstRegs := make([]loopRegion, len(srcs)), make([]loopRegion, len(srcs))
	for k := range srcs {
		var sok, dok bool
		srcRegs[k], sok = srcAgent.regionOf(srcKind, srcs[k])
		dstRegs[k], dok = dstAgent.regionOf(dstKind, dsts[k])
		if !sok || !dok {
			st.state, st.err = Failed, fmt.Errorf("pair %d: memory no longer registered: %w", k, ErrInvalidDescriptor)
			return nil
		}
	}
	// Every pair is registered memory; a run of pairs adjacent on both
	// sides and inside one registered region on each (one allocation: a
	// device copy must not span two that happen to be adjacent) is one
	// copy.
	var failed error
	runs := coalesce(len(srcs),
		func(k int) uint64 { return uint64(srcs[k].Addr) },
		func(k int) uint64 { return uint64(dsts[k].Addr) },
		func(k int) uint64 { return srcs[k].Len },
		func(k int) bool { return srcRegs[k] == srcRegs[k-1] && dstRegs[k] == dstRegs[k-1] },
		func(r pieceRun) {
			if failed != nil {
				return
			}
			src, dst := srcs[r.first], dsts[r.first]
			if srcKind == VRAM || dstKind == VRAM {
				dev := src.Dev
				if dstKind == VRAM {
					dev = dst.Dev
				}
				if err := deviceCopy(l.cudaLib, int(dev), dst.Addr, src.Addr, r.len); err != nil {
					failed = fmt.Errorf("pair %d: %w", r.first, err)
				}
				return
			}
			// A C copy: the addresses are registered memory (Go memory pinned by
			// RegisterBytes, or C memory), never converted to Go pointers.
			C.kvb_copy(C.uintptr_t(dst.Addr), C.uintptr_t(src.Addr), C.size_t(r.len))
		})
	x.pieces.Store(int64(runs))
	if failed != nil {
		st.state, st.err = Failed, failed
		return nil
	}
	if x.Notif != nil {
		peer.queue = append(peer.queue, Notif{Remote: l.name, Msg: append([]byte{}, x.Notif...)})
		signal(peer.wake)
	}
	return nil
}

func (l *loopback) status(x *Xfer) (XferState, error) {
	st, ok := x.handle.(*loopbackXfer)
	if !ok {
		return Failed, fmt.Errorf("transfer not posted: %w", ErrInvalidRequest)
	}
	return st.state, st.err
}

func (l *loopback) release(*Xfer) error { return nil }

func (l *loopback) genNotif(remote string, msg []byte) error {
	peer := lookupLoopback(remote)
	if peer == nil {
		return fmt.Errorf("loopback peer %q: %w", remote, ErrRemoteUnknown)
	}
	peer.mu.Lock()
	defer peer.mu.Unlock()
	peer.queue = append(peer.queue, Notif{Remote: l.name, Msg: append([]byte{}, msg...)})
	signal(peer.wake)
	return nil
}

func (l *loopback) notifyC() <-chan struct{} { return l.wake }

func (l *loopback) notifs() ([]Notif, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queue
	l.queue = nil
	return q, nil
}

func (l *loopback) close() error {
	loopbackAgents.Lock()
	delete(loopbackAgents.m, l.name)
	loopbackAgents.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.regs = map[*[]remoteRegion]struct{}{}
	return nil
}
