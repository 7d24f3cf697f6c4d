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
	regs   map[*[]RemoteRegion]struct{}
	known  map[string]bool
	queue  []Notif
	wake   chan struct{}
	closed bool
}

func openLoopback(cfg Config) (Backend, error) {
	loopbackAgents.Lock()
	defer loopbackAgents.Unlock()
	if _, ok := loopbackAgents.m[cfg.Name]; ok {
		return nil, fmt.Errorf("nixl: loopback agent %q already exists in this process", cfg.Name)
	}
	l := &loopback{name: cfg.Name, cudaLib: cfg.CUDALib, regs: map[*[]RemoteRegion]struct{}{}, known: map[string]bool{}, wake: make(chan struct{}, 1)}
	loopbackAgents.m[cfg.Name] = l
	return l, nil
}

func lookupLoopback(name string) *loopback {
	loopbackAgents.Lock()
	defer loopbackAgents.Unlock()
	return loopbackAgents.m[name]
}

func (l *loopback) Register(kind MemKind, descs []Desc) (any, error) {
	if kind == VRAM {
		if _, err := cudaContext(l.cudaLib, int(descs[0].Dev)); err != nil {
			return nil, err
		}
	}
	rs := make([]RemoteRegion, len(descs))
	for i, d := range descs {
		rs[i] = RemoteRegion{kind, d}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.regs[&rs] = struct{}{}
	return &rs, nil
}

func (l *loopback) Deregister(h any) error {
	rs, ok := h.(*[]RemoteRegion)
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
	regions *[]RemoteRegion
	buf     []byte // keeps the Go memory alive while registered
}

func (l *loopback) Alloc(kind MemKind, size uint64) ([]byte, any, error) {
	buf := make([]byte, size)
	h, err := l.Register(kind, []Desc{BytesDesc(buf)})
	if err != nil {
		return nil, nil, err
	}
	return buf, &loopbackAlloc{regions: h.(*[]RemoteRegion), buf: buf}, nil
}

// loopbackLibrary is the loopback engine's library in metadata blobs.
const loopbackLibrary = "loopback"

func (l *loopback) Metadata(regs []*Registration) ([]byte, error) {
	m := MetadataBlob{Engine: EngineLoopback, Library: loopbackLibrary, Agent: l.name}
	for _, r := range regs {
		for _, d := range r.Descs {
			m.Regions = append(m.Regions, MDRegion{RemoteRegion: RemoteRegion{r.Kind, d}})
		}
	}
	return m.Encode(), nil
}

func (l *loopback) LoadRemote(md []byte) (string, []RemoteRegion, error) {
	m, err := DecodeMetadata(md, EngineLoopback, loopbackLibrary)
	if err != nil {
		return "", nil, err
	}
	if lookupLoopback(m.Agent) == nil {
		return "", nil, fmt.Errorf("loopback agent %q is not in this process: %w", m.Agent, ErrRemoteUnknown)
	}
	l.mu.Lock()
	l.known[m.Agent] = true
	l.mu.Unlock()
	return m.Agent, m.RemoteRegions(), nil
}

func (l *loopback) Invalidate(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.known, name)
	return nil
}

func (l *loopback) Prep(string, MemKind, []Desc) (any, error) { return struct{}{}, nil }
func (l *loopback) Unprep(any) error                          { return nil }

// loopRegion names one registered region: its registration and index.
type loopRegion struct {
	reg *[]RemoteRegion
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

func (l *loopback) Post(x *Xfer) error {
	st := &loopbackXfer{state: Done}
	x.Handle = st
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
	srcKind, dstKind := x.LocalPrep.Kind, x.RemotePrep.Kind
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
	runs := Coalesce(len(srcs),
		func(k int) uint64 { return uint64(srcs[k].Addr) },
		func(k int) uint64 { return uint64(dsts[k].Addr) },
		func(k int) uint64 { return srcs[k].Len },
		func(k int) bool { return srcRegs[k] == srcRegs[k-1] && dstRegs[k] == dstRegs[k-1] },
		func(r PieceRun) {
			if failed != nil {
				return
			}
			src, dst := srcs[r.First], dsts[r.First]
			if srcKind == VRAM || dstKind == VRAM {
				dev := src.Dev
				if dstKind == VRAM {
					dev = dst.Dev
				}
				if err := deviceCopy(l.cudaLib, int(dev), dst.Addr, src.Addr, r.Len); err != nil {
					failed = fmt.Errorf("pair %d: %w", r.First, err)
				}
				return
			}
			// A C copy: the addresses are registered memory (Go memory pinned by
			// RegisterBytes, or C memory), never converted to Go pointers.
			C.kvb_copy(C.uintptr_t(dst.Addr), C.uintptr_t(src.Addr), C.size_t(r.Len))
		})
	x.SetPieces(runs)
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

func (l *loopback) Status(x *Xfer) (XferState, error) {
	st, ok := x.Handle.(*loopbackXfer)
	if !ok {
		return Failed, fmt.Errorf("transfer not posted: %w", ErrInvalidRequest)
	}
	return st.state, st.err
}

func (l *loopback) Release(*Xfer) error { return nil }

func (l *loopback) GenNotif(remote string, msg []byte) error {
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

func (l *loopback) NotifyC() <-chan struct{} { return l.wake }

func (l *loopback) Notifs() ([]Notif, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queue
	l.queue = nil
	return q, nil
}

func (l *loopback) Close() error {
	loopbackAgents.Lock()
	delete(loopbackAgents.m, l.name)
	loopbackAgents.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.regs = map[*[]RemoteRegion]struct{}{}
	return nil
}
