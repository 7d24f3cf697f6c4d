package transfer

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/nixl"
)

// Errors of the pool.
var (
	ErrClosed  = errors.New("transfer: pool closed")
	ErrDropped = errors.New("transfer: write dropped: the room is no longer transferring")
	ErrStall   = errors.New("transfer: write stalled past its deadline")
)

// Write is one WRITE to one peer: page runs over every KV region (or the
// aux item), with a notification.
type Write struct {
	Remote string // the peer's nixl agent name
	Peer   Layout // the peer's registered memory
	Runs   []Run  // KV pages; empty with AuxSrc ≥ 0 for the aux write
	// AuxSrc/AuxDst copy one aux item instead of pages (−1: not an aux write).
	AuxSrc, AuxDst int
	// State ≥ 0 makes Runs item runs of that state region instead of pages.
	State int
	// Slice (optional) writes a head slice into the peer's pages (the rank
	// mapping): heads and a region offset instead of whole pages.
	Slice *Slice
	Notif string // "" for a write without a notification
	Last  bool   // the room's final write to this peer
	// PeerKey and Epoch name the decode process whose REQUEST gave the
	// destination; the pool carries them for the gate, never reads them.
	PeerKey string
	Epoch   uint64
}

// Job is one chunk of a room: its writes, posted in order by one worker.
type Job struct {
	Room   uint64
	Writes []Write
	// Gate is called right before each write is posted; false drops it
	// (the room failed or was aborted). It must count the write as in
	// flight when it returns true.
	Gate func(w *Write) bool
	// Done is called once per write that Gate let through. quiesced is
	// true when a failed write is known never to land (it failed before
	// anything was posted); a write that failed after its post may still
	// land, as far as the pool can tell.
	Done func(w *Write, err error, quiesced bool)
	// Dropped is called once per write that Gate refused.
	Dropped func(w *Write)
}

// Config sizes the pool.
type Config struct {
	Workers  int           // default 4
	Queue    int           // jobs queued per worker, default 1024
	Stall    time.Duration // a write in flight longer fails; default 60 s
	PollWait time.Duration // sleep between status polls, default 10 µs
}

// Pool posts chunks through an agent: every chunk of a room goes to the
// same worker, so a room's writes are posted in order.
type Pool struct {
	agent *nixl.Agent
	local Layout
	cfg   Config

	queues  []chan Job
	wg      sync.WaitGroup
	mu      sync.RWMutex
	closed  bool
	closing chan struct{}
}

// NewPool starts the workers.
func NewPool(agent *nixl.Agent, local Layout, cfg Config) (*Pool, error) {
	if err := local.Validate(); err != nil {
		return nil, err
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 1024
	}
	if cfg.Stall <= 0 {
		cfg.Stall = 60 * time.Second
	}
	if cfg.PollWait <= 0 {
		cfg.PollWait = 10 * time.Microsecond
	}
	p := &Pool{agent: agent, local: local, cfg: cfg, closing: make(chan struct{})}
	for i := 0; i < cfg.Workers; i++ {
		q := make(chan Job, cfg.Queue)
		p.queues = append(p.queues, q)
		p.wg.Add(1)
		go p.worker(q)
	}
	return p, nil
}

// Submit queues a job on its room's worker. It blocks while that queue is
// full and returns ErrClosed once the pool is closing.
func (p *Pool) Submit(j Job) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	select {
	case p.queues[j.Room%uint64(len(p.queues))] <- j:
		return nil
	case <-p.closing:
		return ErrClosed
	}
}

// Close stops the workers after the queued jobs; writes in flight finish or
// hit their stall deadline.
func (p *Pool) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.closing)
		for _, q := range p.queues {
			close(q)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Pool) worker(q chan Job) {
	defer p.wg.Done()
	for j := range q {
		for i := range j.Writes {
			w := &j.Writes[i]
			if !j.Gate(w) {
				if j.Dropped != nil {
					j.Dropped(w)
				}
				continue
			}
			posted, err := p.write(w)
			j.Done(w, err, err != nil && !posted)
		}
	}
}

// write posts one write and waits for it, bounded by the stall deadline.
// posted says whether anything reached the engine's post (after which a
// failed write may still land).
func (p *Pool) write(w *Write) (posted bool, err error) {
	var local, remote []nixl.Desc
	switch {
	case w.State >= 0:
		if w.State >= len(p.local.State) || w.State >= len(w.Peer.State) || p.local.State[w.State].ItemBytes != w.Peer.State[w.State].ItemBytes {
			return false, fmt.Errorf("transfer: state region %d does not match on both sides", w.State)
		}
		ls, rs := p.local.State[w.State], w.Peer.State[w.State]
		for _, run := range w.Runs {
			n := uint64(run.Len) * ls.ItemBytes
			local = append(local, nixl.Desc{Addr: ls.Addr + uintptr(uint64(run.Src)*ls.ItemBytes), Len: n, Dev: ls.Dev})
			remote = append(remote, nixl.Desc{Addr: rs.Addr + uintptr(uint64(run.Dst)*rs.ItemBytes), Len: n, Dev: rs.Dev})
		}
	case w.AuxSrc >= 0:
		n := p.local.AuxItemBytes
		if n == 0 || n != w.Peer.AuxItemBytes {
			return false, fmt.Errorf("transfer: aux items of %d and %d bytes", n, w.Peer.AuxItemBytes)
		}
		local = []nixl.Desc{{Addr: p.local.Aux.Addr + uintptr(uint64(w.AuxSrc)*n), Len: n, Dev: p.local.Aux.Dev}}
		remote = []nixl.Desc{{Addr: w.Peer.Aux.Addr + uintptr(uint64(w.AuxDst)*n), Len: n, Dev: w.Peer.Aux.Dev}}
	case w.Slice != nil:
		if n := len(p.local.Regions) + w.Slice.RegionOffset; w.Slice.RegionOffset < 0 || n > len(w.Peer.Regions) {
			return false, fmt.Errorf("transfer: %d regions at offset %d do not fit the peer's %d", len(p.local.Regions), w.Slice.RegionOffset, len(w.Peer.Regions))
		}
		local, remote = ExpandSlice(w.Runs, p.local, w.Peer, w.Slice)
	default:
		local, remote = Expand(w.Runs, p.local, w.Peer)
	}
	var notif []byte
	if w.Notif != "" {
		notif = []byte(w.Notif)
	}
	if len(local) == 0 {
		// Nothing to move (a dummy peer or pages it already holds): the
		// notification alone completes its count.
		if notif == nil {
			return false, nil
		}
		return false, p.agent.GenNotif(w.Remote, notif)
	}
	lkind, rkind := p.local.Kind, w.Peer.Kind
	if w.AuxSrc >= 0 || w.State >= 0 {
		lkind, rkind = nixl.DRAM, nixl.DRAM // aux and state items live in host memory
	}
	l, err := p.agent.PrepLocal(lkind, local)
	if err != nil {
		return false, err
	}
	defer l.Release()
	r, err := p.agent.PrepRemote(w.Remote, rkind, remote)
	if err != nil {
		return false, err
	}
	defer r.Release()
	idx := make([]int, len(local))
	for i := range idx {
		idx[i] = i
	}
	x, err := p.agent.NewXfer(nixl.Write, l, idx, r, idx, notif)
	if err != nil {
		return false, err
	}
	defer p.agent.Release(x)
	if err := p.agent.Post(x); err != nil {
		return true, err // a partial failure may have started puts
	}
	deadline := time.Now().Add(p.cfg.Stall)
	for {
		st, err := p.agent.Status(x)
		switch st {
		case nixl.Done:
			return true, nil
		case nixl.Failed:
			return true, err
		}
		if time.Now().After(deadline) {
			return true, fmt.Errorf("%w (%v)", ErrStall, p.cfg.Stall)
		}
		time.Sleep(p.cfg.PollWait)
	}
}
