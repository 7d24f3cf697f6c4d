package control

import (
	"container/list"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"github.com/kvbridge/kvbridge/internal/curve"
	"github.com/kvbridge/kvbridge/internal/ident"
	"github.com/kvbridge/kvbridge/internal/wire"
	zmq "github.com/pebbe/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Errors of the control loop.
var (
	ErrClosed = errors.New("control: loop closed")
)

// PeerDown reports a peer that heartbeats declared dead. (Restarts are
// not the transport's to decide: the rank's core sees every message's epoch
// and detects them.)
type PeerDown struct {
	Endpoint string
	// Reason is "peer unreachable".
	Reason string
}

// MalformedReport is a REQUEST the codec refused but that still named its
// room and its sender's endpoint, so the rank can answer it.
type MalformedReport struct {
	Room     uint64
	Endpoint string
	Reason   string
}

// LoopConfig configures one rank's control loop.
type LoopConfig struct {
	// Identity is stamped into every message's from (Endpoint is filled in
	// with the bound endpoint; a zero Epoch is replaced by a random one).
	Identity wire.From
	// Bind is the PULL socket's endpoint, e.g. "tcp://127.0.0.1:*" for any
	// free port.
	Bind string
	// Handler receives every well-formed message but PING (answered with a
	// PONG here) on the loop's receive goroutine: it must not block. Each
	// sending rank's messages come in the order they arrived; ranks take
	// turns (inbox.go), so messages of different ranks may not. A PONG
	// reaches it after the heartbeat has counted it.
	Handler func(wire.Message)
	// OnPeerDown is called once per peer heartbeats declared dead.
	OnPeerDown func(PeerDown)
	// OnMalformedRequest is called for a malformed REQUEST that still
	// names its room and sender (the rank decides whether to answer).
	OnMalformedRequest func(MalformedReport)

	HeartbeatInterval time.Duration // default 5 s
	MaxMisses         int           // default 2
	SendHWM           int           // per-peer ZeroMQ high-water mark, default 1000
	Linger            time.Duration // how long Close waits for queued sends, default 1 s
	MaxPeers          int           // PUSH sockets kept, default 1024
	PeerIdle          time.Duration // an unwatched peer's socket is closed after this, default 5 min
	// Auth authenticates every control message with the deployment's
	// shared secret. It is required unless Insecure is set.
	Auth *bootstrap.Auth
	// Insecure runs without message authentication (logged as a warning):
	// anyone who can reach the port can drive the rank.
	Insecure bool
	Security *bootstrap.Security // CURVE encryption and allow-list on top; nil: off
	// RankIdentity turns on per-rank identity (with Auth): this rank's
	// certificate and key, and the CA's public key that vouches for every
	// peer's. A message's from is then proven, not claimed.
	RankIdentity *ident.RankIdentity
	// Tap, if set, sees every message as it came off the wire, before any
	// check (a packet capture, for diagnostics and tests). It runs on the
	// receive goroutine and must not keep or modify frames.
	Tap func(frames [][]byte)

	Logger     *zap.Logger           // default: no logging
	Registerer prometheus.Registerer // default: no metrics registered
}

// DefaultLoopConfig returns the defaults; set Identity, Bind and Handler.
func DefaultLoopConfig() LoopConfig {
	return LoopConfig{HeartbeatInterval: 5 * time.Second, MaxMisses: 2, SendHWM: 1000,
		Linger: time.Second, MaxPeers: 1024, PeerIdle: 5 * time.Minute}
}

// Validate reports the first setting that cannot work.
func (c *LoopConfig) Validate() error {
	switch {
	case c.Identity.Role != wire.RolePrefill && c.Identity.Role != wire.RoleDecode:
		return fmt.Errorf("control: Identity.Role must be %q or %q, got %q", wire.RolePrefill, wire.RoleDecode, c.Identity.Role)
	case c.Identity.Instance == "":
		return errors.New("control: Identity.Instance is empty")
	case c.Identity.Rank < 0:
		return fmt.Errorf("control: Identity.Rank %d is negative", c.Identity.Rank)
	case c.Bind == "":
		return errors.New("control: Bind is empty")
	case c.Handler == nil:
		return errors.New("control: Handler is nil")
	case c.HeartbeatInterval <= 0 || c.MaxMisses < 1:
		return fmt.Errorf("control: heartbeat %v × %d misses is not valid", c.HeartbeatInterval, c.MaxMisses)
	case c.SendHWM < 1 || c.MaxPeers < 1 || c.PeerIdle <= 0 || c.Linger < 0:
		return errors.New("control: SendHWM, MaxPeers and PeerIdle must be positive, Linger not negative")
	case c.Auth == nil && !c.Insecure:
		return fmt.Errorf("control: rank %s: %w", c.Identity.Peer(), bootstrap.ErrNoSecret)
	case c.Auth != nil && c.Insecure:
		return errors.New("control: Auth and Insecure are both set; choose one")
	case c.RankIdentity != nil && c.Auth == nil:
		return errors.New("control: per-rank identity needs the deployment's shared secret too (Auth)")
	case c.RankIdentity != nil && certIdentity(c.RankIdentity.Cert) != (wire.From{Role: c.Identity.Role, Instance: c.Identity.Instance, Rank: c.Identity.Rank}):
		return fmt.Errorf("control: rank %s holds the certificate of %s", c.Identity.Peer(), c.RankIdentity.Cert)
	}
	return nil
}

type outbound struct {
	to   wire.Peer
	body []byte // the message's third frame (the first two are its type's)
	t    wire.MsgType
	// at is when Send encoded it (one clock read serves the envelope's
	// certificate checks, the peer lookup and the send time).
	at time.Time
	// buf holds body's memory for bodyBufs: back there once ZeroMQ has
	// copied the body (release).
	buf *[]byte
	// With Auth (sealed): the envelope (its number and time are stamped
	// when the message is handed to ZeroMQ, under the peer's lock, so the
	// numbers a peer receives grow in the order it receives them; the time
	// is Send's, or the retry's for a message that waited in the backlog)
	// and its tag key.
	sealed bool
	env    Envelope
	tagKey []byte
}

// scratch is where a message's frames are laid out as they go on the
// wire: ZeroMQ copies them at the send, so one per socket (used under
// its lock) serves every message.
type scratch struct {
	frames [4][]byte
	env    []byte
	// body: a sealed message's encrypted body.
	body []byte
}

type watchCmd struct {
	peer  wire.Peer
	watch bool
}

// Loop is a rank's control loop. ZeroMQ sockets are not thread-safe, so
// each has one owner at any moment: the receive goroutine owns the PULL
// socket, and blocks in it (no poll: Close wakes it by terminating the
// context); the ZAP goroutine, with CURVE on, owns the ZAP handler's
// socket; a peer's PUSH socket is used under that peer's lock, by the
// caller of Send itself (no hand-off to another goroutine) or by the
// heartbeat goroutine, which sends PINGs and retries the ordered backlogs
// of peers ZeroMQ would not take more from.
type Loop struct {
	cfg LoopConfig
	// curvePub is the CURVE public key derived from Security's secret key.
	curvePub string
	id       wire.From
	ownFrom  *wire.OwnFrom // id, encoded once (set before the loop starts)
	log      *zap.Logger
	ctx      *zctx
	stat     counters
	coll     *collector

	pull, zap *zsock

	snd  *sender
	auth *sealer     // nil when Insecure
	addr *addressing // nil when Insecure

	inbox *inbox

	closeOnce sync.Once
	closing   chan struct{}
	sendDone  chan struct{}
	recvDone  chan struct{}
	zapDone   chan struct{}
	closeErr  error
}

// NewLoop binds the rank's PULL socket and starts the loop.
func NewLoop(cfg LoopConfig) (l *Loop, err error) {
	def := DefaultLoopConfig()
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = def.HeartbeatInterval
	}
	if cfg.MaxMisses == 0 {
		cfg.MaxMisses = def.MaxMisses
	}
	if cfg.SendHWM == 0 {
		cfg.SendHWM = def.SendHWM
	}
	if cfg.Linger == 0 {
		cfg.Linger = def.Linger
	}
	if cfg.MaxPeers == 0 {
		cfg.MaxPeers = def.MaxPeers
	}
	if cfg.PeerIdle == 0 {
		cfg.PeerIdle = def.PeerIdle
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var auth *sealer
	if cfg.Auth != nil {
		if _, err := bootstrap.NewAuth(cfg.Auth.Secret); err != nil {
			return nil, err
		}
		var err error
		if auth, err = newSealer(cfg.Auth); err != nil {
			return nil, fmt.Errorf("control: rank %s: %w", cfg.Identity.Peer(), err)
		}
	}
	var curvePub string
	if cfg.Security != nil {
		var err error
		if curvePub, err = curve.Check(cfg.Security.SecretKey, "", cfg.Security.AllowedKeys); err != nil {
			return nil, err
		}
	}
	l = &Loop{cfg: cfg, id: cfg.Identity, log: cfg.Logger, auth: auth, curvePub: curvePub,
		closing: make(chan struct{}), sendDone: make(chan struct{}), recvDone: make(chan struct{}),
		zapDone: make(chan struct{}), inbox: newInbox()}
	l.snd = newSender(l)
	if auth != nil {
		l.addr = newAddressing(auth, cfg.RankIdentity, cfg.Identity.Role)
		l.addr.rebindAfter = cfg.HeartbeatInterval * time.Duration(cfg.MaxMisses+1)
	}
	if l.log == nil {
		l.log = zap.NewNop()
	}
	if cfg.Insecure {
		l.log.Warn("control plane WITHOUT authentication (Insecure): anyone who can reach the endpoint can drive this rank",
			zap.String("rank", cfg.Identity.Peer()))
	}
	if l.id.Epoch == 0 {
		l.id.Epoch = NewEpoch()
	}
	if l.ctx, err = newZctx(); err != nil {
		return nil, fmt.Errorf("control: zmq context: %w", err)
	}
	fail := func(what string, err error) (*Loop, error) {
		l.pull.close()
		l.zap.close()
		l.ctx.term()
		return nil, fmt.Errorf("control: %s (rank %s): %w", what, cfg.Identity.Peer(), err)
	}
	if cfg.Security != nil {
		// The ZAP handler must exist before the first connection arrives.
		if l.zap, err = l.ctx.socket(zREP); err != nil {
			return fail("zap socket", err)
		}
		l.zap.setInt(zLinger, 0)
		if err = l.zap.bind("inproc://zeromq.zap.01"); err != nil {
			return fail("zap bind", err)
		}
	}
	if l.pull, err = l.ctx.socket(zPULL); err != nil {
		return fail("pull socket", err)
	}
	l.pull.setInt(zLinger, 0)
	l.pull.setInt(zRcvhwm, cfg.SendHWM*10)
	if err = l.pull.setInt64(zMaxmsgsize, wire.MaxBodySize+4096); err != nil {
		return fail("max message size", err)
	}
	if cfg.Security != nil {
		err = l.pull.setInt(zCurveServer, 1)
		if err == nil {
			err = l.pull.setString(zCurveSecretkey, cfg.Security.SecretKey)
		}
		if err == nil {
			err = l.pull.setString(zZapDomain, "kvbridge")
		}
		if err != nil {
			return fail("curve server", err)
		}
	}
	if err = l.pull.bind(cfg.Bind); err != nil {
		return fail("bind "+cfg.Bind, err)
	}
	if l.id.Endpoint, err = l.pull.lastEndpoint(); err != nil {
		return fail("bound endpoint", err)
	}
	l.coll = newCollector(&l.stat, l.id)
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(l.coll); err != nil {
			return fail("metrics", err)
		}
	}
	l.ownFrom = wire.NewOwnFrom(l.id)
	go l.receive()
	go l.send()
	if l.zap != nil {
		go l.authenticate()
	} else {
		close(l.zapDone)
	}
	return l, nil
}

// Identity returns the rank's identity as stamped on its messages.
func (l *Loop) Identity() wire.From { return l.id }

// Endpoint returns the bound control endpoint (with the real port).
func (l *Loop) Endpoint() string { return l.id.Endpoint }

// PublicKey returns the rank's CURVE public key, or "" with security off.
func (l *Loop) PublicKey() string {
	return l.curvePub
}

// Cert returns this rank's identity certificate (raw bytes, for its
// bootstrap record), or nil without per-rank identity.
func (l *Loop) Cert() []byte {
	if l.cfg.RankIdentity == nil {
		return nil
	}
	return l.cfg.RankIdentity.Cert.Raw()
}

// Stats returns a snapshot of the loop's counters.
func (l *Loop) Stats() Stats { return l.stat.snapshot() }

// Send stamps m with this rank's identity, encodes it and sends it on the
// peer's socket, on the caller's goroutine under the peer's lock. It never
// blocks: a peer ZeroMQ will not take more from gets an ordered backlog
// (retried by the heartbeat goroutine) and, past SendHWM, drops (counted
// as peer_busy), so a dead peer never delays another.
//
// With Auth the message is addressed (PROTOCOL.md "Envelope"): to the
// peer's identity and epoch as this rank knows them, numbered, and a
// REGISTER's agent metadata sealed to the peer. Under per-rank identity a
// peer whose certificate is not known is not sent to (counted as
// no_identity).
func (l *Loop) Send(to wire.Peer, m wire.Message) error {
	select {
	case <-l.closing:
		return ErrClosed
	default:
	}
	wire.SetFrom(m, l.id)
	o, err := l.encode(to, m)
	if errors.Is(err, errNoPeerCert) || errors.Is(err, ident.ErrBadCert) {
		l.snd.dropped(outbound{to: to, t: m.Type()}, DropNoIdentity, err)
		return nil
	}
	if errors.Is(err, errUnaddressed) {
		l.snd.dropped(outbound{to: to, t: m.Type()}, DropUnaddressed, err)
		return nil
	}
	if err != nil {
		return err
	}
	return l.snd.deliver(o)
}

// encode returns m's frames and, when Auth is on, its envelope addressed to
// the peer, with a REGISTER's agent metadata sealed to it.
func (l *Loop) encode(to wire.Peer, m wire.Message) (outbound, error) {
	o := outbound{to: to, t: m.Type(), at: time.Now()}
	var err error
	if l.addr != nil {
		var env Envelope
		if env, o.tagKey, err = l.addr.envelopeAt(to, o.at); err != nil {
			return o, err
		}
		if t := m.Type(); env.To.Epoch == 0 && t != wire.TypePing && t != wire.TypeRegister {
			return o, fmt.Errorf("%w: %s to %s", errUnaddressed, t, to.Endpoint)
		}
		o.sealed, o.env = true, env
		if r, ok := m.(*wire.Register); ok && (len(r.AgentMD) > 0 || len(r.Proof) > 0) {
			c := *r
			if len(r.AgentMD) > 0 {
				if c.AgentMD, err = sealMD(o.tagKey, l.auth.Secret, r.AgentMD, l.id, env.To); err != nil {
					return o, err
				}
			}
			if len(r.Proof) > 0 {
				if c.Proof, err = sealMD(o.tagKey, l.auth.Secret, r.Proof, l.id, env.To); err != nil {
					return o, err
				}
			}
			m = &c
		}
		if a, ok := m.(*wire.RegisterAck); ok && a.Pull != nil {
			c, offer := *a, *a.Pull
			if offer.AgentMD, err = sealMD(o.tagKey, l.auth.Secret, a.Pull.AgentMD, l.id, env.To); err != nil {
				return o, err
			}
			if offer.Proof, err = sealMD(o.tagKey, l.auth.Secret, a.Pull.Proof, l.id, env.To); err != nil {
				return o, err
			}
			c.Pull = &offer
			m = &c
		}
	}
	o.buf = bodyBufs.Get().(*[]byte)
	if o.body, err = wire.AppendBodyAs(*o.buf, m, l.ownFrom); err != nil {
		o.release()
	}
	return o, err
}

// bodyBufs are the memory of message bodies: a body goes out of Go memory
// at the send (zsock.send copies it), after which its buffer serves the
// next message, so a message's encoding allocates nothing. Buffers past
// keptBody bytes (a REGISTER's metadata) are left to the GC.
var bodyBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const keptBody = 4096

// release gives o's body buffer back to bodyBufs: once the body is sent,
// or dropped. o.body must not be used after.
func (o *outbound) release() {
	if o.buf == nil {
		return
	}
	// A body that outgrew its buffer (or failed to encode) leaves the
	// buffer as it was: nothing else refers to it.
	if o.body != nil && cap(o.body) <= keptBody {
		*o.buf = o.body[:0]
	}
	bodyBufs.Put(o.buf)
	o.buf, o.body = nil, nil
}

// wire returns o's frames as they go on the wire, laid out in sc: sealed,
// numbered and timed now when Auth is on (the owner of sc held: pc.mu).
func (l *Loop) wire(o outbound, sc *scratch, now time.Time) [][]byte {
	magic, typ := wire.HeaderFrames(o.t)
	sc.frames[0], sc.frames[1], sc.frames[2] = magic, typ, o.body
	if !o.sealed {
		return sc.frames[:3]
	}
	env := o.env
	env.Seq, env.Sent = l.addr.nextSeq(), now
	if o.tagKey != nil {
		// Per-rank identity: the body sealed under the pair's key (room
		// ids and page lists are not readable on the wire).
		sc.env, sc.body = l.auth.sealBodyInto(sc.env[:0], sc.body[:0], o.tagKey, sc.frames[:3], env)
		sc.frames[2] = sc.body
	} else {
		sc.env = l.auth.sealInto(sc.env[:0], o.tagKey, sc.frames[:3], env)
	}
	sc.frames[3] = sc.env
	return sc.frames[:4]
}

// Watch starts heartbeats to a peer (a rank this one shares a live room
// with). Watching a watched peer is a no-op.
func (l *Loop) Watch(p wire.Peer) error { return l.watch(watchCmd{peer: p, watch: true}) }

// Unwatch stops heartbeats to the peer at endpoint.
func (l *Loop) Unwatch(endpoint string) error {
	return l.watch(watchCmd{peer: wire.Peer{Endpoint: endpoint}})
}

func (l *Loop) watch(c watchCmd) error { return l.snd.watch(c) }

// Close stops the goroutines, closes every socket (queued sends get at most
// Linger) and terminates the ZeroMQ context. It is idempotent and returns
// the first error.
func (l *Loop) Close() error {
	l.closeOnce.Do(func() {
		close(l.closing)
		<-l.sendDone // every PUSH socket closed; no more are opened
		// Terminating the context wakes the receive and ZAP goroutines
		// (ETERM), which close their sockets; it returns once they have and
		// the PUSH sockets' last messages have lingered.
		if err := l.ctx.term(); err != nil {
			l.closeErr = fmt.Errorf("control: terminating the zmq context: %w", err)
		}
		<-l.recvDone
		<-l.zapDone
		if l.cfg.Registerer != nil {
			l.cfg.Registerer.Unregister(l.coll)
		}
	})
	return l.closeErr
}

// ---- receive goroutine -------------------------------------------------

// receive waits in the PULL socket and takes every message queued, up to
// recvBatch, in one C call. It returns when Close terminates the context.
func (l *Loop) receive() {
	defer close(l.recvDone)
	r := newReceiver()
	defer r.free()
	defer l.pull.close()
	var limiter logLimiter
	var pace recvPace
	for {
		// With messages waiting in the inbox, take only what is queued in
		// the socket (a PING among it is answered), then serve the inbox
		// again; with none, wait.
		wait := !l.inbox.waiting()
		n, err := r.recvWait(l.pull, recvBatch, wait)
		switch {
		case err == nil:
			pace.ok()
		case errors.Is(err, zmq.ETERM):
			return
		case !wait && errors.Is(err, zmq.Errno(syscall.EAGAIN)):
			n = 0 // nothing queued
		default:
			l.log.Warn("control receive", zap.Error(err))
			pace.fail(err)
			continue
		}
		now := time.Now() // one reading for the batch: what arrived together is judged at one instant
		for i := 0; i < n; i++ {
			key, it, ok := l.admit(r.reused(i), now, &limiter) // admit keeps no byte of the frames
			if !ok {
				continue
			}
			if i == n-1 && !l.inbox.waiting() {
				l.handle(it) // nothing waits and nothing was read behind it: no queue
				continue
			}
			l.queue(key, it, &limiter)
		}
		l.serve()
	}
}

// admit checks one received message, arrived at now (authentication,
// decoding, the identity and replay checks) and answers a PING at once; it returns what
// is left for the Handler (ok) and the sending rank's inbox key (inbox.go).
func (l *Loop) admit(frames [][]byte, now time.Time, limiter *logLimiter) (key inboxKey, it inboxItem, ok bool) {
	if l.cfg.Tap != nil {
		l.cfg.Tap(frames)
	}
	var env Envelope
	refuse := func(why string, replay bool, detail string) {
		if replay {
			l.stat.replayInc(why)
		} else {
			l.stat.refusedInc(why)
		}
		if n, ok := limiter.allow(now); ok {
			l.log.Warn("control message dropped", zap.String("rank", l.id.Peer()), zap.String("reason", why),
				zap.String("detail", detail), zap.Int("suppressed", n))
		}
	}
	if l.addr != nil {
		var keyFor func([]byte) ([]byte, string)
		if l.cfg.RankIdentity != nil {
			keyFor = l.addr.keyFor(now)
		}
		opened, e, why := l.auth.open(frames, now, keyFor)
		if why != "" {
			refuse(why, false, "unauthenticated")
			return inboxKey{}, inboxItem{}, false
		}
		frames, env = opened, e
	} else if len(frames) == 4 {
		frames = frames[:3] // from a rank with a secret; not checked (Insecure)
	}
	m, err := wire.Decode(frames)
	if err != nil {
		var me *wire.MalformedError
		errors.As(err, &me)
		l.stat.malformedInc(me.Reason)
		if n, ok := limiter.allow(time.Now()); ok {
			l.log.Warn("malformed control message dropped", zap.String("rank", l.id.Peer()),
				zap.String("reason", me.Reason), zap.Error(err), zap.Int("suppressed", n))
		}
		// Answered only where the envelope names this process and, under
		// per-rank identity, the endpoint is its certificate's rank's: the
		// body's from could not be checked.
		if me.Type == wire.TypeRequest && me.HasRoom && me.Endpoint != "" && l.cfg.OnMalformedRequest != nil &&
			(l.addr == nil || l.addr.vouch(l.id, me.Endpoint, env)) {
			return inboxKey{instance: me.Endpoint}, inboxItem{mr: &MalformedReport{Room: me.Room, Endpoint: me.Endpoint, Reason: err.Error()}, size: framesSize(frames)}, true
		}
		return inboxKey{}, inboxItem{}, false
	}
	from := m.Sender()
	if l.addr != nil {
		if why, replay := l.addr.check(l.id, m, env, now); why != "" {
			refuse(why, replay, fmt.Sprintf("%s from %s (epoch %d, message %d) addressed to %s epoch %d", m.Type(), from.Peer(),
				from.Epoch, env.Seq, env.To.Peer(), env.To.Epoch))
			if why == ReplayOtherEpoch && l.addr.nudge(from, now, l.cfg.HeartbeatInterval) {
				// An authentic message for this rank's predecessor: its
				// sender does not know this process yet. A PING tells it
				// (the sender's loop learns the epoch from it and addresses
				// what follows here), at most once per heartbeat interval
				// per sender process, so a replay costs one PING at most.
				_ = l.Send(wire.Peer{Endpoint: from.Endpoint, Epoch: from.Epoch, Cert: string(env.Cert)}, &wire.Ping{})
			}
			return inboxKey{}, inboxItem{}, false
		}
		if r, ok := m.(*wire.Register); ok {
			var key []byte
			if pc := l.addr.peerKey(env.Cert); pc != nil {
				key = pc.key
			}
			md, err := openMD(key, l.auth.Secret, r.AgentMD, from, env.To)
			if err != nil {
				refuse(AuthBadTag, false, fmt.Sprintf("REGISTER from %s: agent metadata: %v", from.Peer(), err))
				return inboxKey{}, inboxItem{}, false
			}
			r.AgentMD = md
			if len(r.Proof) > 0 {
				if r.Proof, err = openMD(key, l.auth.Secret, r.Proof, from, env.To); err != nil {
					refuse(AuthBadTag, false, fmt.Sprintf("REGISTER from %s: ownership proof: %v", from.Peer(), err))
					return inboxKey{}, inboxItem{}, false
				}
			}
		}
		if a, ok := m.(*wire.RegisterAck); ok && a.Pull != nil {
			var key []byte
			if pc := l.addr.peerKey(env.Cert); pc != nil {
				key = pc.key
			}
			var err error
			if a.Pull.AgentMD, err = openMD(key, l.auth.Secret, a.Pull.AgentMD, from, env.To); err == nil {
				a.Pull.Proof, err = openMD(key, l.auth.Secret, a.Pull.Proof, from, env.To)
			}
			if err != nil {
				refuse(AuthBadTag, false, fmt.Sprintf("REGISTER_ACK from %s: pull offer: %v", from.Peer(), err))
				return inboxKey{}, inboxItem{}, false
			}
		}
	}
	l.stat.received.Add(1)
	switch m := m.(type) {
	case *wire.Ping:
		_ = l.Send(wire.Peer{Endpoint: from.Endpoint}, &wire.Pong{Seq: m.Seq})
		return inboxKey{}, inboxItem{}, false
	case *wire.Pong:
		l.snd.pong(from.Endpoint)
	}
	return inboxKey{from.Role, from.Instance, from.Rank}, inboxItem{m: m, size: framesSize(frames)}, true
}

// framesSize is a received message's bytes, as the inbox counts them.
func framesSize(frames [][]byte) int {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	return n
}

// queue puts a message in its sending rank's inbox queue, or drops and
// counts it when the rank's backlog (or the whole inbox) is full.
func (l *Loop) queue(key inboxKey, it inboxItem, limiter *logLimiter) {
	if l.inbox.push(key, it) {
		return
	}
	l.stat.backlogged.Add(1)
	if n, ok := limiter.allow(time.Now()); ok {
		l.log.Warn("control message dropped: its sender's backlog is full", zap.String("rank", l.id.Peer()),
			zap.String("from", key.role+"/"+key.instance+"/"+strconv.Itoa(key.rank)), zap.Int("per_rank_bound", maxPeerBacklog), zap.Int("suppressed", n))
	}
}

// recvPace paces a receive loop through errors other than ETERM: EINTR
// retries at once; anything else waits 1 ms, doubling to 100 ms, so a
// socket that keeps failing is never a silent loop at 100 % of a core; a
// message received resets it.
type recvPace struct{ d time.Duration }

func (p *recvPace) fail(err error) {
	if err == zmq.Errno(syscall.EINTR) {
		return
	}
	p.d = min(max(2*p.d, time.Millisecond), 100*time.Millisecond)
	time.Sleep(p.d) // an error back-off, not synchronisation
}

func (p *recvPace) ok() { p.d = 0 }

// authenticate is the ZAP goroutine: it answers ZAP requests (RFC 27):
// CURVE clients whose public key is on the allow-list pass, everyone else
// is refused and counted. It returns when Close terminates the context.
func (l *Loop) authenticate() {
	defer close(l.zapDone)
	r := newReceiver()
	defer r.free()
	defer l.zap.close()
	var pace recvPace
	for {
		n, err := r.recv(l.zap, 1, 0)
		if err != nil {
			if errors.Is(err, zmq.ETERM) {
				return
			}
			l.log.Warn("ZAP receive", zap.Error(err))
			pace.fail(err)
			continue
		}
		pace.ok()
		if n == 1 {
			l.answerZAP(r.frames(0))
		}
	}
}

func (l *Loop) answerZAP(req [][]byte) {
	if len(req) < 6 {
		// A REP socket must answer before it can receive again.
		l.zap.send([][]byte{[]byte("1.0"), nil, []byte("500"), []byte("bad request"), nil, nil}, 0)
		return
	}
	version, id, mechanism := req[0], req[1], string(req[5])
	ok := mechanism == "CURVE" && len(req) >= 7 && len(req[6]) == 32 &&
		slices.Contains(l.cfg.Security.AllowedKeys, zmq.Z85encode(string(req[6])))
	if ok {
		l.zap.send([][]byte{version, id, []byte("200"), []byte("OK"), nil, nil}, 0)
		return
	}
	l.stat.unauth.Add(1)
	l.log.Warn("unauthenticated peer refused", zap.String("rank", l.id.Peer()), zap.ByteString("address", req[3]))
	l.zap.send([][]byte{version, id, []byte("400"), []byte("NO ACCESS"), nil, nil}, 0)
}

// ---- sending ------------------------------------------------------------

type peerConn struct {
	endpoint string
	lastUsed time.Time     // under sender.mu
	elem     *list.Element // in the LRU list, under sender.mu

	// mu is the socket's owner: every use of sock and every field below.
	mu       sync.Mutex
	sock     *zsock
	closed   bool // evicted or shut down: look the peer up again
	watched  bool
	hint     wire.Peer // the watch's Peer (its certificate and epoch address the PINGs)
	awaiting bool      // a PING was handed to ZeroMQ and no PONG came since
	misses   int
	moved    bool // the backlog shrank since the last heartbeat

	// backlog holds messages ZeroMQ would not take yet, in order. It is
	// bounded by SendHWM; beyond it messages are dropped as peer_busy.
	backlog []outbound
	scratch scratch // the frames of the message being sent
}

// sender is the table of PUSH sockets. Lock order: sender.mu, then a
// peerConn's mu; never the other way round.
type sender struct {
	l *Loop

	mu    sync.Mutex
	peers map[string]*peerConn
	lru   *list.List // front: most recently used
	// known are the endpoints this rank addressed itself (a message other
	// than PONG, or a watch), most recent first, bounded by 4 × MaxPeers:
	// a PONG, the only message sent because of what someone else sent,
	// opens no socket to an endpoint outside it.
	known    map[string]*list.Element
	knownLRU *list.List
	keys     map[string]string
	closed   bool

	pending atomic.Int64  // messages in all backlogs
	kick    chan struct{} // a backlog got its first message

	limitMu sync.Mutex
	limit   logLimiter

	// Owned by the heartbeat goroutine.
	seq     uint64
	retry   *time.Timer   // armed while pending > 0
	armed   bool          // retry is running
	backoff time.Duration // grows while retries make no progress (a dead peer)
}

// Backlogs are retried after retryInterval, backing off to maxRetryInterval
// while nothing moves.
const (
	retryInterval    = time.Millisecond
	maxRetryInterval = 100 * time.Millisecond
)

func newSender(l *Loop) *sender {
	s := &sender{l: l, peers: map[string]*peerConn{}, lru: list.New(), keys: map[string]string{},
		known: map[string]*list.Element{}, knownLRU: list.New(), kick: make(chan struct{}, 1),
		retry: time.NewTimer(time.Hour)}
	s.retry.Stop()
	return s
}

// send is the heartbeat goroutine: PINGs, backlog retries, and at Close
// the last flush and the sockets.
func (l *Loop) send() {
	defer close(l.sendDone)
	s := l.snd
	defer s.retry.Stop()
	ticker := time.NewTicker(l.cfg.HeartbeatInterval)
	defer ticker.Stop()
	for {
		var retryC <-chan time.Time
		if s.armed {
			retryC = s.retry.C
		}
		select {
		case <-retryC:
			s.armed = false
			s.flush()
		case <-s.kick:
			if !s.armed && s.pending.Load() > 0 {
				s.backoff = retryInterval
				s.retry.Reset(s.backoff)
				s.armed = true
			}
		case now := <-ticker.C:
			s.heartbeat(now)
		case <-l.closing:
			s.shutdown()
			return
		}
	}
}

// shutdown refuses further sends, flushes what is queued and closes every
// socket (each lingering up to Linger).
func (s *sender) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, pc := range s.peers {
		pc.mu.Lock()
		n := 0
		now := time.Now()
		for n < len(pc.backlog) && s.try(pc, pc.backlog[n], now) {
			n++
		}
		clear(pc.backlog[:n]) // sent: their buffers are the pool's again
		pc.sock.setInt(zLinger, int(s.l.cfg.Linger/time.Millisecond))
		pc.sock.close()
		pc.closed = true
		pc.mu.Unlock()
	}
}

// remember marks an endpoint as one this rank addressed itself (s.mu held).
func (s *sender) remember(endpoint string) {
	if e, ok := s.known[endpoint]; ok {
		s.knownLRU.MoveToFront(e)
		return
	}
	s.known[endpoint] = s.knownLRU.PushFront(endpoint)
	for s.knownLRU.Len() > 4*s.l.cfg.MaxPeers {
		e := s.knownLRU.Back()
		delete(s.known, e.Value.(string))
		s.knownLRU.Remove(e)
	}
}

// conn returns the peer's socket, opening it if needed (s.mu held).
func (s *sender) conn(p wire.Peer, now time.Time, reply bool) (*peerConn, error) {
	if !reply {
		s.remember(p.Endpoint)
	}
	if pc, ok := s.peers[p.Endpoint]; ok {
		if p.ServerKey != "" {
			s.keys[p.Endpoint] = p.ServerKey
		}
		pc.lastUsed = now
		s.lru.MoveToFront(pc.elem)
		return pc, nil
	}
	if _, ok := s.known[p.Endpoint]; reply && !ok {
		return nil, errUnknownPeer
	}
	cfg := s.l.cfg
	// Make room first: the socket count never exceeds MaxPeers, and when
	// every socket is watched the new one is refused, not created.
	s.evict(cfg.MaxPeers - 1)
	if len(s.peers) >= cfg.MaxPeers {
		return nil, errTooManyPeers
	}
	if p.ServerKey != "" {
		s.keys[p.Endpoint] = p.ServerKey
	}
	key := s.keys[p.Endpoint]
	if cfg.Security != nil && key == "" {
		return nil, errNoKey
	}
	sock, err := s.l.ctx.socket(zPUSH)
	if err != nil {
		return nil, err
	}
	sock.setInt(zSndhwm, cfg.SendHWM)
	sock.setInt(zLinger, int(cfg.Linger/time.Millisecond))
	sock.setInt(zReconnectIvl, 100)
	sock.setInt(zReconnectIvlMax, 2000)
	if cfg.Security != nil {
		if err := setClientCurve(sock, key, s.l.curvePub, cfg.Security); err != nil {
			sock.close()
			return nil, err
		}
	}
	if err := sock.connect(p.Endpoint); err != nil {
		sock.close()
		return nil, err
	}
	pc := &peerConn{endpoint: p.Endpoint, sock: sock, lastUsed: now, hint: wire.Peer{Endpoint: p.Endpoint}}
	pc.elem = s.lru.PushFront(pc)
	s.peers[p.Endpoint] = pc
	s.l.stat.sockets.Store(uint64(len(s.peers)))
	return pc, nil
}

var (
	errUnaddressed  = errors.New("the peer's process (epoch) is not known: only a PING or a REGISTER may go to it (pass Peer.Epoch, or send one of those first)")
	errNoKey        = errors.New("no CURVE server key known for the peer")
	errUnknownPeer  = errors.New("PONG to an endpoint this rank never addressed")
	errTooManyPeers = errors.New("MaxPeers sockets open and every one watched")
)

func setClientCurve(sock *zsock, serverKey, public string, sec *bootstrap.Security) error {
	if err := sock.setString(zCurveServerkey, serverKey); err != nil {
		return err
	}
	if err := sock.setString(zCurvePublickey, public); err != nil {
		return err
	}
	return sock.setString(zCurveSecretkey, sec.SecretKey)
}

// evict closes the least recently used unwatched sockets until at most
// limit are open (or only watched ones are left). The keys of peers no
// longer open or addressed are forgotten with them (s.mu held).
func (s *sender) evict(limit int) {
	for e := s.lru.Back(); e != nil && len(s.peers) > limit; {
		prev := e.Prev()
		pc := e.Value.(*peerConn)
		pc.mu.Lock()
		watched := pc.watched
		pc.mu.Unlock()
		if !watched {
			s.drop(pc)
		}
		e = prev
	}
}

// drop closes a peer's socket and forgets it (s.mu held).
func (s *sender) drop(pc *peerConn) {
	pc.mu.Lock()
	s.pending.Add(-int64(len(pc.backlog)))
	pc.backlog = nil
	pc.sock.close()
	pc.closed = true
	pc.mu.Unlock()
	s.lru.Remove(pc.elem)
	delete(s.peers, pc.endpoint)
	s.l.stat.sockets.Store(uint64(len(s.peers)))
	if _, ok := s.known[pc.endpoint]; !ok {
		delete(s.keys, pc.endpoint)
	}
}

// deliver sends o on its peer's socket, on the caller's goroutine.
func (s *sender) deliver(o outbound) error {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return ErrClosed
		}
		pc, err := s.conn(o.to, o.at, o.t == wire.TypePong)
		s.mu.Unlock()
		if err != nil {
			reason := DropError
			switch {
			case errors.Is(err, errNoKey):
				reason = DropNoKey
			case errors.Is(err, errUnknownPeer):
				reason = DropUnknownPeer
			case errors.Is(err, errTooManyPeers):
				reason = DropTooManyPeers
			}
			s.dropped(o, reason, err)
			return nil
		}
		pc.mu.Lock()
		if pc.closed { // evicted between the lookup and the lock
			pc.mu.Unlock()
			continue
		}
		if len(pc.backlog) > 0 || !s.try(pc, o, o.at) {
			if len(pc.backlog) >= s.l.cfg.SendHWM {
				pc.mu.Unlock()
				s.dropped(o, DropPeerBusy, errors.New("peer queue and backlog full"))
				return nil
			}
			pc.backlog = append(pc.backlog, o)
			if s.pending.Add(1) == 1 {
				signalKick(s.kick)
			}
		}
		pc.mu.Unlock()
		return nil
	}
}

func signalKick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// try sends o without blocking (pc.mu held), all its frames in one C call
// (which retries an EAGAIN once after reading ZMQ_EVENTS: libzmq throttles
// the processing of its pipe credit commands during bursts of non-blocking
// sends). It returns false if ZeroMQ would block (the message is still the
// caller's); any other failure is counted and the message consumed.
func (s *sender) try(pc *peerConn, o outbound, now time.Time) bool {
	err := pc.sock.send(s.l.wire(o, &pc.scratch, now), zDontwait)
	pc.scratch.frames[2] = nil // the body is ZeroMQ's copy now: not kept alive here
	if cap(pc.scratch.body) > keptBody {
		pc.scratch.body = nil // a large sealed body (a REGISTER's metadata): not kept per peer
	}
	if err == nil {
		s.l.stat.sent.Add(1)
		o.release()
		return true
	}
	if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
		s.dropped(o, DropError, err)
		return true
	}
	return false
}

// snapshot lists the open peers.
func (s *sender) snapshot() []*peerConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*peerConn, 0, len(s.peers))
	for _, pc := range s.peers {
		out = append(out, pc)
	}
	return out
}

// flush retries every backlog in order; the timer stays armed while any
// message is left (heartbeat goroutine).
func (s *sender) flush() {
	moved := false
	now := time.Now()
	for _, pc := range s.snapshot() {
		pc.mu.Lock()
		n := 0
		for !pc.closed && n < len(pc.backlog) && s.try(pc, pc.backlog[n], now) {
			n++
		}
		if n > 0 {
			old := len(pc.backlog)
			pc.backlog = append(pc.backlog[:0], pc.backlog[n:]...)
			clear(pc.backlog[len(pc.backlog):old]) // the sent messages' bodies, not kept alive
			s.pending.Add(-int64(n))
			moved = true
			pc.moved = true
		}
		pc.mu.Unlock()
	}
	if s.pending.Load() > 0 {
		if moved {
			s.backoff = retryInterval
		} else {
			s.backoff = min(2*s.backoff, maxRetryInterval)
		}
		s.retry.Reset(s.backoff)
		s.armed = true
	}
}

func (s *sender) dropped(o outbound, reason string, err error) {
	o.release()
	s.l.stat.dropInc(reason)
	s.limitMu.Lock()
	n, ok := s.limit.allow(time.Now())
	s.limitMu.Unlock()
	if ok {
		s.l.log.Warn("control message not sent", zap.String("rank", s.l.id.Peer()), zap.Stringer("type", o.t),
			zap.String("peer", o.to.Endpoint), zap.String("reason", reason), zap.Error(err), zap.Int("suppressed", n))
	}
}

func (s *sender) watch(c watchCmd) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if !c.watch {
		if pc, ok := s.peers[c.peer.Endpoint]; ok {
			pc.mu.Lock()
			pc.watched, pc.awaiting, pc.misses = false, false, 0
			pc.mu.Unlock()
		}
		return nil
	}
	pc, err := s.conn(c.peer, time.Now(), false)
	if err != nil {
		s.l.log.Warn("cannot watch peer", zap.String("peer", c.peer.Endpoint), zap.Error(err))
		return nil
	}
	pc.mu.Lock()
	if !pc.watched {
		pc.watched, pc.awaiting, pc.misses = true, false, 0
	}
	pc.hint = c.peer
	pc.mu.Unlock()
	return nil
}

// pong records a PONG from endpoint (receive goroutine).
func (s *sender) pong(endpoint string) {
	s.mu.Lock()
	pc, ok := s.peers[endpoint]
	s.mu.Unlock()
	if ok {
		pc.mu.Lock()
		pc.awaiting, pc.misses = false, 0
		pc.mu.Unlock()
	}
}

// heartbeat runs once per interval: a watched peer that has not answered
// the previous PING misses one; at MaxMisses it is declared dead (within
// interval × (MaxMisses+1) of its last PONG) and no longer watched. While a
// peer's backlog is not empty no PING can be sent: then the backlog is the
// probe (it moving proves the peer alive, it standing still is a miss), so
// a miss is never counted for a PING that was not sent.
func (s *sender) heartbeat(now time.Time) {
	s.mu.Lock()
	var watched []*peerConn
	for _, pc := range s.peers {
		pc.mu.Lock()
		w := pc.watched
		pc.mu.Unlock()
		switch {
		case w:
			watched = append(watched, pc)
		case now.Sub(pc.lastUsed) > s.l.cfg.PeerIdle:
			s.drop(pc)
		}
	}
	s.mu.Unlock()
	var down []string
	for _, pc := range watched {
		pc.mu.Lock()
		if pc.closed || !pc.watched {
			pc.mu.Unlock()
			continue
		}
		switch {
		case len(pc.backlog) > 0 && pc.moved:
			pc.misses = 0
		case len(pc.backlog) > 0, pc.awaiting:
			pc.misses++
		}
		pc.moved, pc.awaiting = false, false
		if pc.misses >= s.l.cfg.MaxMisses {
			pc.watched = false
			s.l.stat.dead.Add(1)
			s.l.log.Warn("peer unreachable", zap.String("rank", s.l.id.Peer()), zap.String("peer", pc.endpoint),
				zap.Int("missed", pc.misses))
			down = append(down, pc.endpoint)
			pc.mu.Unlock()
			continue
		}
		if len(pc.backlog) == 0 {
			s.seq++
			if o, err := s.l.encode(pc.hint, &wire.Ping{From: s.l.id, Seq: s.seq}); err == nil {
				// A PING ZeroMQ would not take is not backlogged (the next
				// interval sends another); its body buffer goes to the GC.
				pc.awaiting = s.try(pc, o, o.at)
			} else {
				// A peer this rank cannot address is not heard from: a miss.
				s.dropped(outbound{to: pc.hint, t: wire.TypePing}, DropNoIdentity, err)
				pc.awaiting = true
			}
		}
		pc.mu.Unlock()
	}
	if s.l.cfg.OnPeerDown != nil {
		for _, ep := range down {
			s.l.cfg.OnPeerDown(PeerDown{Endpoint: ep, Reason: wire.ReasonPeerUnreachable})
		}
	}
}

// logLimiter allows one log line per second and counts what it suppressed.
type logLimiter struct {
	last       time.Time
	suppressed int
}

func (r *logLimiter) allow(now time.Time) (suppressed int, ok bool) {
	if now.Sub(r.last) < time.Second {
		r.suppressed++
		return 0, false
	}
	n := r.suppressed
	r.last, r.suppressed = now, 0
	return n, true
}
