package pool

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvbridge/kvbridge/internal/canary"
	"github.com/kvbridge/kvbridge/internal/kvdigest"
	"github.com/kvbridge/kvbridge/internal/kvlayout"
	"github.com/kvbridge/kvbridge/internal/nixl"
)

// Errors of the pool.
var (
	ErrClosed  = errors.New("transfer: pool closed")
	ErrDropped = errors.New("transfer: write dropped: the room is no longer transferring")
	ErrStall   = errors.New("transfer: stalled past its deadline")
)

// ErrNotReady fails a write whose Ready did not answer true within the
// stall timeout.
var ErrNotReady = errors.New("transfer: the write's data was not ready within the stall timeout")

// Job is one chunk of a room: its writes, posted in order by one worker;
// or, with Read set and no Writes, one pull read (read.go), posted like a
// write by the worker it was given to (reads go to the workers in turn).
type Job struct {
	Room   uint64
	Writes []Write
	Read   *Read
	// Gate is called right before each write is posted; false drops it
	// (the room failed or was aborted). It must count the write as in
	// flight when it returns true. A read's w is nil (so for Done and
	// Dropped): its gate comes after its preparation, under its Hold.
	Gate func(w *Write) bool
	// Done is called once per write that Gate let through. quiesced is
	// true when a failed write is known never to land (it failed before
	// anything was posted); a write that failed after its post may still
	// land, as far as the pool can tell.
	Done func(w *Write, err error, quiesced bool)
	// Dropped is called once per write that Gate refused, or that Live
	// said was over while it waited for its data.
	Dropped func(w *Write)
	// Live (optional) is asked while a write waits for its data (Ready
	// said no): false drops it at once (the room ended), instead of
	// asking Ready again until the stall timeout.
	Live func() bool
	// Taken (optional) is called when the room's worker takes the job
	// off its queue, or when Submit takes its first write to post it at
	// once (a latency breakdown's trace point).
	Taken func()
	// First: the job holds the room's first writes (no job of the room
	// was submitted before it; core.Effect.First). Submit then posts
	// them at once, on the calling goroutine, in order as the worker
	// would (up to RoomInFlight, none after a write without a
	// notification), while their data is in place (no Ready, or Ready
	// says true), they move at most FirstBytes together, and fewer than
	// FirstInFlight such writes of its worker are in flight; the worker
	// takes the rest in order. So a room's first write waits neither for
	// the worker to be scheduled nor behind other rooms' writes (issue
	// 52: REQUEST → first post).
	First bool
	// Seq: the job's number among its room's write jobs
	// (core.Effect.Seq). Two goroutines may submit a room's jobs (the
	// control loop those of chunks kept before the REQUEST, the
	// application those it sends after): its worker takes them in Seq
	// order, keeping one that comes early until those before it came. A
	// job of Seq 0 starts the room's count (its first, or a new room
	// under the id): jobs that leave Seq 0 are taken as they come.
	Seq int

	ahead []*flight // its first writes, posted by Submit
}

// Config sizes the pool.
type Config struct {
	Workers int           // default 4
	Queue   int           // jobs queued per worker, default 1024
	Stall   time.Duration // a write in flight longer fails; default 60 s
	// InFlight is how many transfers a worker keeps posted at once (a
	// write is one, a read one per memory kind it reads); default 8. A
	// room's first writes Submit posted (Job.First) count against
	// FirstInFlight instead, even once the worker holds them.
	InFlight int
	// RoomInFlight is how many of them one room may have posted at once
	// (its writes are posted in order; the next may go before the last
	// completed, so a room sent layer by layer keeps the wire busy
	// between layer groups); default 2, 1 for one at a time.
	RoomInFlight int
	// FirstInFlight is how many rooms' first writes Submit may have
	// posted on its callers' goroutines (Job.First) per worker and not
	// yet final; default 1,024 (at 1,000 rooms in flight with 256, the rooms
	// past it waited for a starved worker while fresh ones went ahead:
	// REQUEST → first post p99 0.16–0.34 s). A first write past it waits
	// for the worker.
	FirstInFlight int
	// FirstBytes: first writes moving more bytes than this wait for
	// the worker (its post may copy the bytes inline, as a real NIXL's
	// cma does, and a digest sums them first: neither belongs on the
	// caller's goroutine, which may be the control loop's or an engine's
	// scheduler); default 1 MiB.
	FirstBytes uint64
	// MaxPeers bounds the peers whose descriptor lists stay prepared
	// (least recently used released first); default 256.
	MaxPeers int
	// Now is the clock a read's lease (Read.Until) is checked against;
	// default time.Now.
	Now func() time.Time
}

// Pool posts chunks through an agent. Every chunk of a room goes to the
// same worker, which posts the room's writes in order, up to RoomInFlight
// at a time; a worker keeps up to InFlight transfers posted at once,
// taking rooms in turn write by write, so a long room does not hold back
// short ones. A decode rank's reads go to the workers in turn (they need
// no order); a worker keeps up to RoomInFlight of a room's posted.
// Writes are made by index from descriptor lists prepared once per side:
// the pool's own pages (at the first write) and each peer's (PreparePeer,
// at its registration).
type Pool struct {
	agent *nixl.Agent
	local Layout
	cfg   Config
	lists *lists

	queues []chan Job
	// dones: each worker's completions; ahead: each worker's writes
	// posted by Submit (Job.First) and not yet final.
	dones   []chan *nixl.Xfer
	ahead   []atomic.Int32
	wg      sync.WaitGroup
	mu      sync.RWMutex
	closed  bool
	closing chan struct{}
	reads   atomic.Uint64 // the reads submitted (their workers in turn)
}

// NewPool starts the workers.
func NewPool(agent *nixl.Agent, local Layout, cfg Config) (*Pool, error) {
	return newPool(agent, local, cfg, true)
}

// newPool is NewPool; without workers (a test steps a worker's state by
// hand) when start is false.
func newPool(agent *nixl.Agent, local Layout, cfg Config, start bool) (*Pool, error) {
	if err := kvlayout.ValidateLayout(local); err != nil {
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
	if cfg.InFlight <= 0 {
		cfg.InFlight = 8
	}
	if cfg.RoomInFlight <= 0 {
		cfg.RoomInFlight = 2
	}
	if cfg.MaxPeers <= 0 {
		cfg.MaxPeers = 256
	}
	if cfg.FirstInFlight <= 0 {
		cfg.FirstInFlight = 1024
	}
	if cfg.FirstBytes == 0 {
		cfg.FirstBytes = 1 << 20
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Pool{agent: agent, local: local, cfg: cfg, closing: make(chan struct{}),
		lists: &lists{agent: agent, local: local, maxPeers: cfg.MaxPeers, peers: map[string]*peerLists{}}}
	p.ahead = make([]atomic.Int32, cfg.Workers)
	for i := 0; i < cfg.Workers; i++ {
		q := make(chan Job, cfg.Queue)
		p.queues = append(p.queues, q)
		// Room for every transfer posted to it: InFlight by the worker,
		// FirstInFlight more by Submit (Job.First).
		p.dones = append(p.dones, make(chan *nixl.Xfer, cfg.InFlight+cfg.FirstInFlight))
	}
	for i := range cfg.Workers {
		if start {
			p.wg.Add(1)
			go p.worker(i)
		}
	}
	return p, nil
}

// PreparePeer prepares the descriptor lists of a peer whose agent metadata
// was just loaded (replacing lists made from older metadata), so its first
// write costs no preparation.
func (p *Pool) PreparePeer(remote string, peer Layout) error {
	ls := p.lists
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if _, err := ls.localLists(); err != nil {
		return err
	}
	ls.drop(remote)
	pl, err := ls.peer(remote, peer)
	if err != nil {
		return err
	}
	pl.refs--
	return nil
}

// Submit queues a job on its room's worker (a read: on the next worker in
// turn). It blocks while that queue is full and returns ErrClosed once
// the pool is closing.
func (p *Pool) Submit(j Job) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	q := j.Room
	if j.Read != nil {
		// Reads need no order among themselves: a room's go to the
		// workers in turn, so several are prepared at once.
		q = p.reads.Add(1)
	}
	i := int(q % uint64(len(p.queues)))
	if j.First && j.Read == nil && len(j.Writes) > 0 {
		// Even with nothing left, the job goes to its worker: it holds
		// the room's place in the Seq order.
		p.postFirst(&j, i)
	}
	// Close waits for the read lock held here, so closing is not closed
	// yet: a job whose first write is posted always reaches its worker.
	select {
	case p.queues[i] <- j:
		return nil
	case <-p.closing:
		return ErrClosed
	}
}

// postFirst posts a room's first writes on the calling goroutine
// (Job.First), in order, as the worker would: up to RoomInFlight of them,
// none after a write without a notification (only a later completion
// vouches for it), each whose data is in place, while together they move
// at most FirstBytes. It leaves j with the rest, for the worker. Each
// posted write counts, until it is final, against the worker's
// FirstInFlight (ahead), which bounds the writes posted here, never
// against its InFlight. postFirst reports whether it took a write.
func (p *Pool) postFirst(j *Job, i int) bool {
	var bytes uint64
	took := false
	for len(j.Writes) > 0 && len(j.ahead) < p.cfg.RoomInFlight {
		w := &j.Writes[0]
		if bytes += w.Bytes(p.local); bytes > p.cfg.FirstBytes {
			break
		}
		if w.Ready != nil {
			if ok, err := w.Ready(); !ok || err != nil {
				break // the worker asks again, or fails it with err
			}
		}
		if p.ahead[i].Add(1) > int32(p.cfg.FirstInFlight) {
			p.ahead[i].Add(-1)
			break
		}
		if j.Taken != nil {
			j.Taken()
			j.Taken = nil
		}
		j.Writes, took = j.Writes[1:], true
		if !j.Gate(w) {
			p.ahead[i].Add(-1)
			if j.Dropped != nil {
				j.Dropped(w)
			}
			continue
		}
		f, posted, err := p.start(w, p.dones[i])
		if f == nil {
			p.ahead[i].Add(-1)
			j.Done(w, err, err != nil && !posted)
			continue
		}
		f.ahead = true
		j.ahead = append(j.ahead, f)
		if w.Notif == "" {
			break // silent: nothing more of the room until a later completion
		}
	}
	return took
}

// Close stops the workers after the queued jobs; writes in flight finish or
// hit their stall deadline. Reads not yet prepared fail ErrClosed, and
// reads in flight are released at once (they fail ErrClosed). Then the
// prepared lists are released.
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
	p.lists.close()
}

// roomWork is a worker's queue of one room's jobs.
type roomWork struct {
	room uint64
	jobs []Job
	next int // next write of jobs[0]
	// inflight: its writes posted and not final (at most RoomInFlight);
	// silent: those of them without a notification (a state write),
	// which only a later write's completion can vouch for, so nothing
	// more of the room is posted while one is in flight; queued: it is in
	// the worker's turn or waiting list.
	inflight, silent int
	queued           bool
	// posted: the room has had a write posted (before: its first write
	// goes ahead of other rooms' later ones).
	posted bool
	// seq: the Seq of the room's next write job; later: jobs that came
	// before it (Job.Seq); ended: it took a job with a final write (no
	// job of the room follows).
	seq   int
	later []Job
	ended bool
	// wait: the next write's wait for its data (ready.go).
	wait readiness
}

// flight is a write (or a read) posted and not yet final: final once
// every transfer it posted has ended.
type flight struct {
	rw   *roomWork
	job  Job
	w    *Write // nil: a read
	xs   []*nixl.Xfer
	left int // its transfers not yet ended
	// err: the first failure; landable: a failure after which something
	// may still land (a read is quiesced without one).
	err      error
	landable bool
	done     func() // releases what the write holds
	deadline time.Time
	stalled  bool
	atClose  bool // a read in flight when the pool began to close (released then)
	ahead    bool // posted by Submit (Job.First)
}

// fail records a failure of the flight.
func (f *flight) fail(err error) {
	if f.err == nil {
		f.err = err
	}
	if !errors.Is(err, canary.ErrNotDelivered) {
		f.landable = true
	}
}

// worker is one worker's loop: it posts the rooms' writes in turn, at
// most InFlight at once, and settles their completions, the writes that
// outlive the stall deadline and the rooms whose data is not ready yet.
func (p *Pool) worker(i int) {
	defer p.wg.Done()
	q := p.queues[i]
	wk := &workerState{p: p, ahead: &p.ahead[i], rooms: map[uint64]*roomWork{}, flights: map[*nixl.Xfer]*flight{}, seqs: map[uint64]seqRecord{},
		early: map[*nixl.Xfer]bool{}, done: p.dones[i], timer: time.NewTimer(time.Hour),
		readyTimer: time.NewTimer(time.Hour), readyPoll: readyPollMin}
	defer wk.timer.Stop()
	defer wk.readyTimer.Stop()
	for q != nil || len(wk.rooms) > 0 {
		if !wk.closing && p.isClosing() {
			// Closing: no read is prepared any more, and the reads in
			// flight end now (released), not at their stall deadline —
			// the rank's agent closes next, and the core has failed
			// their rooms.
			wk.closing = true
			now := time.Now()
			for _, f := range wk.flights {
				if f.w == nil {
					f.deadline, f.atClose = now, true
				}
			}
		}
		wk.post(q == nil)
		if q == nil && len(wk.rooms) == 0 {
			return // closed, and the posting above finished the last room
		}
		select {
		case <-wk.readyC():
			for _, rw := range wk.waiting { // back in turn (a room that posted nothing yet: ahead)
				if rw.posted {
					wk.turn = append(wk.turn, rw)
				} else {
					wk.fresh = append(wk.fresh, rw)
				}
			}
			wk.waiting, wk.nextPoll = nil, time.Time{}
			wk.readyPoll = min(2*wk.readyPoll, readyPollMax)
		case x := <-wk.done:
			wk.complete(x)
		case j, ok := <-q:
			if !ok {
				q = nil
				wk.takeLater()
				continue
			}
			wk.submit(j)
		case <-wk.stallC():
			wk.expire()
		}
	}
}

// workerState is what a worker's loop holds: its rooms, their turn order,
// the writes in flight and the timers of the stall deadline and the
// ready poll.
type workerState struct {
	p     *Pool
	rooms map[uint64]*roomWork
	// fresh and turn: the rooms with a write to post and room for it, in
	// turn order — fresh those that have posted nothing yet, served first,
	// so a room's first write does not wait behind the later writes of
	// every room ahead of it (issue 52: REQUEST → first post).
	fresh   []*roomWork
	turn    []*roomWork
	waiting []*roomWork // rooms whose next write's data is not ready
	closing bool        // the pool is closing (seen by this worker)
	flights map[*nixl.Xfer]*flight
	// early: completions of writes Submit posted (Job.First) that came
	// before the worker took their job; ahead: its count of such writes
	// not yet final.
	early map[*nixl.Xfer]bool
	ahead *atomic.Int32
	// seqs: the next Seq of rooms forgotten between two jobs (settle),
	// so a job that comes after keeps its place; seqOrder: the oldest
	// first. A record lasts 2 × Stall: a live room posts within Stall
	// of its last post or fails (the core's stall deadline).
	seqs     map[uint64]seqRecord
	seqOrder []seqRecord
	// held: the flights Submit posted that this worker took over and
	// that are not yet final; they count against FirstInFlight, not
	// InFlight, so the worker's own writes never wait behind them.
	held int
	done chan *nixl.Xfer

	timer      *time.Timer // the first stall deadline
	readyTimer *time.Timer // the next ask of the waiting rooms
	readyPoll  time.Duration
	nextPoll   time.Time // when the waiting rooms are asked again
}

// enqueue gives a room a turn if it has a write to post and room for one
// more in flight.
func (wk *workerState) enqueue(rw *roomWork) {
	if !rw.queued && rw.inflight < wk.p.cfg.RoomInFlight && rw.silent == 0 && rw.more() {
		rw.queued = true
		if !rw.posted {
			wk.fresh = append(wk.fresh, rw)
			return
		}
		wk.turn = append(wk.turn, rw)
	}
}

// seqRecord is a forgotten room's next Seq (workerState.seqs).
type seqRecord struct {
	room uint64
	next int
	at   time.Time
}

// maxSeqs bounds the records of rooms forgotten between two jobs.
const maxSeqs = 1 << 16

// settle forgets a room with nothing left, keeping its next Seq unless it
// took its final write.
func (wk *workerState) settle(rw *roomWork) {
	if !rw.queued && rw.inflight == 0 && !rw.more() && len(rw.later) == 0 {
		if rw.seq > 0 && !rw.ended {
			now := time.Now()
			for len(wk.seqOrder) > 0 && (len(wk.seqOrder) >= maxSeqs || now.Sub(wk.seqOrder[0].at) > 2*wk.p.cfg.Stall) {
				if old := wk.seqOrder[0]; wk.seqs[old.room] == old {
					delete(wk.seqs, old.room)
				}
				wk.seqOrder = wk.seqOrder[1:]
			}
			r := seqRecord{room: rw.room, next: rw.seq, at: now}
			wk.seqs[rw.room] = r
			wk.seqOrder = append(wk.seqOrder, r)
		}
		delete(wk.rooms, rw.room)
	}
}

// post posts the next write of each room in turn while fewer than
// InFlight are in flight; a room whose data is not ready waits, a room
// that is over drops its writes. closed: the pool is closing.
func (wk *workerState) post(closed bool) {
	p := wk.p
	for len(wk.flights)-wk.held < p.cfg.InFlight && len(wk.fresh)+len(wk.turn) > 0 {
		var rw *roomWork
		if len(wk.fresh) > 0 {
			rw, wk.fresh = wk.fresh[0], wk.fresh[1:]
		} else {
			rw, wk.turn = wk.turn[0], wk.turn[1:]
		}
		readyErr := p.ready(rw, closed)
		if readyErr == errWait {
			wk.waiting = append(wk.waiting, rw)
			continue
		}
		if readyErr == errOver {
			rw.queued = false
			j, w := rw.take()
			if j.Dropped != nil {
				j.Dropped(w)
			}
			wk.enqueue(rw)
			wk.settle(rw)
			continue
		}
		if readyErr == nil {
			wk.readyPoll = readyPollMin // something became ready: poll the rest soon
		}
		rw.queued = false
		j, w := rw.take()
		if j.Read != nil && wk.closing {
			j.Done(nil, ErrClosed, true) // never prepared: the pool is closing
		} else if j.Read != nil {
			if f, posted, err := p.startRead(j, wk.done); f != nil {
				f.rw = rw
				rw.inflight++
				rw.posted = true
				for _, x := range f.xs {
					wk.flights[x] = f
				}
			} else if err == errGated {
				if j.Dropped != nil {
					j.Dropped(nil)
				}
			} else {
				j.Done(nil, err, !posted)
			}
		} else if !j.Gate(w) {
			if j.Dropped != nil {
				j.Dropped(w)
			}
		} else if readyErr != nil {
			j.Done(w, readyErr, true) // never posted
		} else if f, posted, err := p.start(w, wk.done); f != nil {
			f.rw, f.job = rw, j
			rw.inflight++
			rw.posted = true
			if w.Notif == "" {
				rw.silent++
			}
			wk.flights[f.xs[0]] = f
		} else {
			j.Done(w, err, err != nil && !posted)
		}
		wk.enqueue(rw)
		wk.settle(rw)
	}
}

// stallC fires at the first stall deadline of the writes in flight (nil:
// none to wait for).
func (wk *workerState) stallC() <-chan time.Time {
	var first time.Time
	for _, f := range wk.flights {
		if !f.stalled && (first.IsZero() || f.deadline.Before(first)) {
			first = f.deadline
		}
	}
	if first.IsZero() {
		return nil
	}
	resetTimer(wk.timer, time.Until(first))
	return wk.timer.C
}

// readyC fires when the waiting rooms are asked again (nil: none waits).
func (wk *workerState) readyC() <-chan time.Time {
	if len(wk.waiting) == 0 {
		return nil
	}
	// An absolute time: other events (submissions, completions) must not
	// push the next ask back.
	if wk.nextPoll.IsZero() {
		wk.nextPoll = time.Now().Add(wk.readyPoll)
	}
	resetTimer(wk.readyTimer, time.Until(wk.nextPoll))
	return wk.readyTimer.C
}

// isClosing reports whether Close has begun.
func (p *Pool) isClosing() bool {
	select {
	case <-p.closing:
		return true
	default:
		return false
	}
}

// resetTimer resets t to d, draining a fire not yet received.
func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}

// complete settles a transfer that ended; once its flight's last has,
// its job hears how (a stalled one fails with ErrStall) and its room gets
// its turn back.
func (wk *workerState) complete(x *nixl.Xfer) {
	p := wk.p
	f := wk.flights[x]
	if f == nil {
		wk.early[x] = true // posted by Submit, its job not yet taken
		return
	}
	delete(wk.flights, x)
	st, err := p.agent.Status(x)
	if f.stalled && f.atClose {
		err = fmt.Errorf("%w: released in flight", ErrClosed)
	} else if f.stalled {
		err = fmt.Errorf("%w (%v)", ErrStall, p.cfg.Stall)
	} else if st != nixl.Done && err == nil {
		err = fmt.Errorf("transfer: %s ended %v", f.what(), st)
	}
	if err != nil {
		f.fail(err)
	}
	if f.left--; f.left > 0 {
		return
	}
	f.done()
	if f.ahead {
		wk.ahead.Add(-1)
		wk.held--
	}
	if f.w == nil {
		// A read is quiesced unless a failure may still land.
		f.job.Done(nil, f.err, !f.landable)
	} else {
		f.job.Done(f.w, f.err, false) // posted: a failed write may still land
	}
	rw := f.rw
	rw.inflight--
	if f.w != nil && f.w.Notif == "" {
		rw.silent--
	}
	wk.enqueue(rw)
	wk.settle(rw)
}

func (f *flight) what() string {
	if f.w == nil {
		return "read"
	}
	return "write"
}

// submit queues a job behind its room's earlier ones.
func (wk *workerState) submit(j Job) {
	if j.Taken != nil {
		j.Taken()
	}
	rw := wk.rooms[j.Room]
	if rw == nil {
		rw = &roomWork{room: j.Room}
		if r, ok := wk.seqs[j.Room]; ok {
			rw.seq = r.next // forgotten between two of its jobs
			delete(wk.seqs, j.Room)
		}
		wk.rooms[j.Room] = rw
	}
	if j.Read != nil {
		wk.take(rw, j)
		return
	}
	if j.Seq == 0 {
		rw.seq, rw.ended = 0, false // the room's first (or a new room under its id)
	}
	if j.Seq != rw.seq {
		rw.later = append(rw.later, j) // a job before it has not come yet
		return
	}
	// The count moves before each take: taking may settle the room, and
	// settling keeps its next Seq.
	rw.seq++
	wk.take(rw, j)
	for {
		i := slices.IndexFunc(rw.later, func(l Job) bool { return l.Seq == rw.seq })
		if i < 0 {
			return
		}
		l := rw.later[i]
		rw.later = slices.Delete(rw.later, i, i+1)
		rw.seq++
		wk.take(rw, l)
	}
}

// takeLater takes, once the queue is closed, the jobs still waiting for
// an earlier one of their room (its Submit failed: the pool was
// closing), in Seq order: their writes meet their gates as any other.
func (wk *workerState) takeLater() {
	for _, rw := range wk.rooms {
		later := rw.later
		rw.later = nil
		slices.SortFunc(later, func(a, b Job) int { return cmp.Compare(a.Seq, b.Seq) })
		for _, j := range later {
			wk.take(rw, j)
		}
	}
}

// take queues a job behind the room's earlier ones, its writes that
// Submit posted (Job.First) in flight from now on.
func (wk *workerState) take(rw *roomWork, j Job) {
	if slices.ContainsFunc(j.Writes, func(w Write) bool { return w.Last }) || slices.ContainsFunc(j.ahead, func(f *flight) bool { return f.w.Last }) {
		rw.ended = true
	}
	ahead := j.ahead
	j.ahead = nil
	for _, f := range ahead {
		// Its first writes, posted by Submit: in flight from now on as
		// if this worker had posted them (their completions may be here
		// already).
		f.rw, f.job = rw, j
		rw.inflight++
		rw.posted = true
		if f.w.Notif == "" {
			rw.silent++
		}
		wk.flights[f.xs[0]] = f
		wk.held++
	}
	if len(j.Writes) > 0 || j.Read != nil {
		rw.jobs = append(rw.jobs, j)
	}
	// Completions that came before the job: settled now that the room
	// holds its rest (settling first could forget the room under it).
	for _, f := range ahead {
		if x := f.xs[0]; wk.early[x] {
			delete(wk.early, x)
			wk.complete(x)
		}
	}
	wk.enqueue(rw)
	wk.settle(rw) // a job without writes
}

// expire releases the transfers past their stall deadline: each then
// completes on done, as stalled.
func (wk *workerState) expire() {
	now := time.Now()
	for _, f := range wk.flights {
		if !f.stalled && !now.Before(f.deadline) {
			f.stalled = true
			for _, x := range f.xs {
				if _, ok := wk.flights[x]; ok {
					wk.p.agent.Release(x) // settles it: its completion comes on done
				}
			}
		}
	}
}

// errWait: the room's next write waits for its data (Ready said no);
// errOver: it waited, and Live says its room is over.
var (
	errWait = errors.New("transfer: waiting for data")
	errOver = errors.New("transfer: the room is over")
)

// ready asks the room's next write whether its data is in place: nil
// (post it), errWait (ask again later), or the error that fails it
// unposted — Ready's own, ErrNotReady past the stall timeout, ErrClosed
// when the pool is closing.
func (p *Pool) ready(rw *roomWork, closing bool) error {
	if rw.jobs[0].Read != nil {
		return nil
	}
	w := &rw.jobs[0].Writes[rw.next]
	if w.Ready == nil {
		return nil
	}
	ok, err := w.Ready()
	if err == nil && !ok { // not ready: the room over, or the pool closing, ends the wait
		if live := rw.jobs[0].Live; live != nil && !live() {
			rw.wait = readiness{}
			return errOver
		}
		if closing {
			rw.wait = readiness{}
			return ErrClosed
		}
	}
	if err = rw.wait.check(ok, err, p.cfg.Stall, time.Now()); errors.Is(err, errWaitReady) {
		return errWait
	}
	return err
}

// take returns the room's next write (one is pending; nil: a read).
func (rw *roomWork) take() (Job, *Write) {
	j := rw.jobs[0]
	var w *Write
	if j.Read == nil {
		w = &j.Writes[rw.next]
	}
	if rw.next++; rw.next == j.units() {
		rw.jobs, rw.next = rw.jobs[1:], 0
	}
	return j, w
}

// units is how many things the job posts: its writes, or its read.
func (j *Job) units() int {
	if j.Read != nil {
		return 1
	}
	return len(j.Writes)
}

// more reports whether the room has a write to post.
func (rw *roomWork) more() bool {
	for len(rw.jobs) > 0 && rw.next >= rw.jobs[0].units() {
		rw.jobs, rw.next = rw.jobs[1:], 0
	}
	return len(rw.jobs) > 0
}

// start posts one write by index into the prepared lists, with done told
// when it is final. A nil flight means the write is already over (nothing
// to move, a notification alone, or an error); posted says whether
// anything reached the engine's post (after which a failed write may still
// land).
func (p *Pool) start(w *Write, done chan<- *nixl.Xfer) (f *flight, posted bool, err error) {
	var notif []byte
	if w.Notif != "" {
		notif = []byte(w.Notif)
		if w.Digest {
			var err error
			if notif, err = p.digest(w, notif); err != nil {
				return nil, false, err
			}
		}
	}
	if w.AuxSrc < 0 && len(w.Runs) == 0 {
		// Nothing to move (a dummy peer or pages it already holds): the
		// notification alone completes its count.
		if notif == nil {
			return nil, false, nil
		}
		return nil, false, p.agent.GenNotif(w.Remote, notif)
	}
	f, posted, err = p.startOnce(w, notif, done)
	if errors.Is(err, nixl.ErrStalePrep) {
		// The peer's metadata was loaded again since its lists were made
		// (a REGISTER raced this write, or the caller reloaded it): the
		// stale lists are dropped and the write made again, once.
		p.lists.dropStale(w.Remote)
		f, posted, err = p.startOnce(w, notif, done)
	}
	return f, posted, err
}

func (p *Pool) startOnce(w *Write, notif []byte, done chan<- *nixl.Xfer) (f *flight, posted bool, err error) {
	l, r, li, ri, ref, ok, err := p.lists.indices(w)
	if err != nil {
		return nil, false, err
	}
	release := func() {}
	if ref != nil {
		release = func() { p.lists.unref(ref) }
	}
	if !ok {
		if l, r, li, err = p.prepOwn(w); err != nil {
			return nil, false, err
		}
		ri = li
		release = func() { l.Release(); r.Release() }
	}
	x, err := p.agent.NewXfer(nixl.Write, l, li, r, ri, notif)
	if err != nil {
		release()
		return nil, false, err
	}
	f = &flight{w: w, xs: []*nixl.Xfer{x}, left: 1, deadline: time.Now().Add(p.cfg.Stall),
		done: func() { p.agent.Release(x); release() }}
	if err := p.agent.PostTo(x, done); err != nil {
		f.done()
		if errors.Is(err, nixl.ErrStalePrep) {
			return nil, false, err // refused before the engine saw it
		}
		return nil, true, err // a partial failure may have started puts
	}
	return f, true, nil
}

// prepOwn prepares a write's own lists (a head slice whose pieces are too
// many to keep prepared).
func (p *Pool) prepOwn(w *Write) (l, r *nixl.Prepped, idx []int, err error) {
	loc, sl := p.local, *w.Slice
	rlo, rhi := w.Layers.Regions(len(loc.Regions))
	loc.Regions, sl.RegionOffset = loc.Regions[rlo:rhi], sl.RegionOffset+rlo
	if err := kvlayout.CheckRuns(w.Runs, loc, w.Peer, &sl); err != nil {
		return nil, nil, nil, err
	}
	local, remote := kvlayout.ExpandSlice(w.Runs, loc, w.Peer, &sl)
	if l, err = p.agent.PrepLocal(p.local.Kind, local); err != nil {
		return nil, nil, nil, err
	}
	if r, err = p.agent.PrepRemote(w.Remote, w.Peer.Kind, remote); err != nil {
		l.Release()
		return nil, nil, nil, err
	}
	idx = make([]int, len(local))
	for i := range idx {
		idx[i] = i
	}
	return l, r, idx, nil
}

// digest appends the write's digest to its notification (docs/PROTOCOL.md
// "Digest"): ":" and the CRC-32C of each destination page it fills, eight
// hex digits each, in the order its runs name the pages, then ":" and how
// many units of the last page it fills (kvlayout.LastUnits). Summed from
// the source pieces (kvlayout.DigestPieces) right before the post, where
// they are (SumPieces: on the CPU, or on the device by the digest kernel):
// what lands must match what the source held when the write went out. A
// write of no pages carries none.
func (p *Pool) digest(w *Write, notif []byte) ([]byte, error) {
	sums, units, err := Sums(p.agent, p.local, w)
	if err != nil || sums == nil {
		return notif, err
	}
	notif = append(notif, ':')
	for _, s := range sums {
		notif = fmt.Appendf(notif, "%08x", s)
	}
	return fmt.Appendf(notif, ":%d", units), nil
}

// Sums is write w's digest from local, this rank's memory (docs/PROTOCOL.md
// "Digest"): the CRC-32C of each destination page it fills, summed over
// its source pieces (kvlayout.DigestPieces) in the regions of its layers,
// and how many units of the last page it fills (kvlayout.LastUnits), read
// through agent where the KV is in VRAM (SumPieces). Nil for a write of no
// pages, an aux or state write. A pulled room's PAGES carries the same
// sums of the write its decode rank's read makes.
func Sums(agent *nixl.Agent, local Layout, w *Write) (sums []uint32, units int, err error) {
	if len(w.Runs) == 0 || w.AuxSrc >= 0 || w.State >= 0 {
		return nil, 0, nil
	}
	rlo, rhi := w.Layers.Regions(len(local.Regions))
	pieces, ends := kvlayout.DigestPieces(local, w.Slice, true, rlo, rhi, w.Runs, nil, nil)
	if sums, err = SumPieces(agent, local, rlo, rhi, pieces, ends); err != nil {
		return nil, 0, err
	}
	return sums, kvlayout.LastUnits(w.Slice, w.Runs), nil
}

// SumPieces is the digest of groups of pieces of this rank's KV, regions
// [rlo, rhi) of local (kvlayout.DigestPieces): summed on the CPU where the
// KV is in host memory (kvdigest.Sum), by the device's digest kernel where
// it is in VRAM (agent.DeviceSums: the agent's CUDA driver, the regions'
// device — one, or an error).
func SumPieces(agent *nixl.Agent, local Layout, rlo, rhi int, pieces []uint64, ends []int) ([]uint32, error) {
	if local.Kind != nixl.VRAM {
		return kvdigest.Sum(pieces, ends, nil)
	}
	rlo, rhi = max(rlo, 0), min(rhi, len(local.Regions))
	dev := -1
	for i := rlo; i < rhi; i++ {
		d := int(local.Regions[i].Dev)
		if dev >= 0 && d != dev {
			return nil, fmt.Errorf("transfer: a digest over regions of devices %d and %d (region %d): one device's at a time", dev, d, i)
		}
		dev = d
	}
	if dev < 0 {
		return kvdigest.Sum(nil, ends, nil) // no region, no piece
	}
	if err := piecesInside(local.Regions[rlo:rhi], pieces); err != nil {
		return nil, err
	}
	return agent.DeviceSums(dev, pieces, ends, nil)
}

// piecesInside checks that every piece (address, length pairs) lies in
// one of the regions: the digest kernel reads them on the device, where a
// read outside its memory faults — and on a GPU a fault leaves the
// process's CUDA context unusable, the serving engine's included.
func piecesInside(regions []nixl.Desc, pieces []uint64) error {
	sorted := slices.SortedFunc(slices.Values(regions), func(a, b nixl.Desc) int { return cmp.Compare(a.Addr, b.Addr) })
	sorted = slices.DeleteFunc(sorted, func(r nixl.Desc) bool { return r.Len == 0 }) // (no piece lies in one)
	for i := 0; i+1 < len(pieces); i += 2 {
		a, n := pieces[i], pieces[i+1]
		if n == 0 {
			continue
		}
		// The last region starting at or before a.
		k, _ := slices.BinarySearchFunc(sorted, a, func(r nixl.Desc, a uint64) int { return cmp.Compare(uint64(r.Addr), a) })
		if k < len(sorted) && uint64(sorted[k].Addr) == a {
			k++
		}
		if k == 0 || a-uint64(sorted[k-1].Addr) > sorted[k-1].Len || n > sorted[k-1].Len-(a-uint64(sorted[k-1].Addr)) {
			return fmt.Errorf("transfer: a digest's piece %d (%#x, %d bytes) lies outside the regions summed", i/2, a, n)
		}
	}
	return nil
}
