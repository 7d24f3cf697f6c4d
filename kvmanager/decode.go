package kvmanager

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kvbridge/kvbridge/bootstrap"
	"go.uber.org/zap"
)

// Decode is the shell of a decode rank: it resolves prefill ranks through
// their bootstrap service, registers with each once (bound to the epoch
// that acknowledged), sends rooms' REQUESTs, counts notifications per
// prefill rank and keeps aborted rooms' pages quarantined until it is safe
// to reuse them. Package receiver's handles take a *Decode, so a receiver
// cannot be made on a prefill rank.
type Decode struct {
	*Manager

	clientsMu sync.Mutex
	clients   map[string]*bootstrap.Client // by bootstrap URL
}

// NewDecode starts a decode rank.
func NewDecode(cfg Config) (*Decode, error) {
	cfg.Role = RoleDecode
	m, err := newManager(cfg)
	if err != nil {
		return nil, err
	}
	d := &Decode{Manager: m, clients: map[string]*bootstrap.Client{}}
	m.resolver = d.resolve
	m.start()
	m.wg.Add(1)
	go d.notifier()
	return d, nil
}

// DefaultTarget is the prefill rank of Config.BootstrapURL and PrefillRank.
func (d *Decode) DefaultTarget() Target {
	return Target{Bootstrap: d.cfg.BootstrapURL, Rank: d.cfg.PrefillRank}
}

// resolve looks a target up in its bootstrap service in the background
// (bounded by the bootstrap timeout) and steps the answer into the core.
func (d *Decode) resolve(t Target) {
	d.clientsMu.Lock()
	cl := d.clients[t.Bootstrap]
	if cl == nil {
		cl = bootstrap.NewClient(t.Bootstrap)
		d.clients[t.Bootstrap] = cl
	}
	d.clientsMu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Registry.BootstrapTimeout)
		defer cancel()
		info, err := cl.Rank(ctx, 0, t.Rank, 0)
		d.step(func(c *Core, now time.Time) {
			if err != nil {
				c.ResolveFailed(now, t, err)
				return
			}
			c.Resolved(now, t, info.Endpoint, info.PublicKey)
		})
	}()
}

// CreateReceiver creates the decode side of a room that pulls from the
// given prefill ranks (the default target when none is given).
func (d *Decode) CreateReceiver(room uint64, targets ...Target) (res Result) {
	if len(targets) == 0 {
		targets = []Target{d.DefaultTarget()}
	}
	d.step(func(c *Core, now time.Time) { res = c.CreateReceiver(now, room, targets) })
	return res
}

// InitReceiver sends the room's REQUEST to its prefill ranks, registering
// first where needed, and returns once every REQUEST is out or the room
// failed (a refused registration returns an error wrapping
// ErrIncompatible). If ctx ends first the room fails.
func (d *Decode) InitReceiver(ctx context.Context, room uint64, spec RequestSpec) error {
	var res Result
	var ready chan struct{}
	d.step(func(c *Core, now time.Time) {
		res = c.InitReceiver(now, room, spec)
		_, ready, _ = c.waiters(room)
	})
	switch res.Outcome {
	case Applied:
	case Rejected:
		return res.Err
	default:
		return fmt.Errorf("room %d: request in %v: %w", room, res.Status, ErrNotReady)
	}
	select {
	case <-ready:
	case <-ctx.Done():
		d.AbortReceiver(room, "no REGISTER_ACK: "+ctx.Err().Error())
		return fmt.Errorf("room %d: waiting for the prefill ranks' REGISTER_ACK: %w", room, ctx.Err())
	case <-d.closing:
		return fmt.Errorf("room %d: %w", room, ErrManagerClosed)
	}
	st, known := d.Status(room)
	switch {
	case !known:
		return fmt.Errorf("room %d: %w", room, ErrRoomCleared)
	case st == Failed:
		reason := d.Failure(room)
		if strings.Contains(reason, ErrIncompatible.Error()) {
			return fmt.Errorf("room %d: %w%s", room, ErrIncompatible, strings.TrimPrefix(reason, ErrIncompatible.Error()))
		}
		return fmt.Errorf("room %d: %w: %s", room, ErrRoomFailed, reason)
	}
	return nil
}

// AbortReceiver fails the room and tells its prefill ranks (also before
// its REQUEST went out); the pages stay quarantined until Released.
func (d *Decode) AbortReceiver(room uint64, reason string) (res Result) {
	var stage Poll
	d.step(func(c *Core, now time.Time) {
		stage, _ = c.Status(room)
		res = c.AbortReceiver(now, room, reason)
	})
	d.met.abort(stage)
	return res
}

// ClearReceiver forgets the room. An unfinished room is aborted first; its
// pages stay quarantined past Clear until Released.
func (d *Decode) ClearReceiver(room uint64) (res Result) {
	d.step(func(c *Core, now time.Time) { res = c.ClearReceiver(now, room) })
	return res
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Released returns a channel closed once the room's destination pages may
// be reused: the room succeeded, or every prefill rank that got its
// REQUEST acknowledged the abort as drained, or the quarantine deadline
// passed (counted as forced). It stays valid after Clear.
func (d *Decode) Released(room uint64) <-chan struct{} {
	var ch chan struct{}
	var ok bool
	d.read(func(c *Core) { ch, ok = c.Hold(room) })
	if !ok {
		return closedChan
	}
	return ch
}

// notifier drains the agent's notifications and steps them into the core.
// It blocks on the engine's wake-up channel where there is one, else polls
// with a backoff of up to 1 ms.
func (d *Decode) notifier() {
	defer d.wg.Done()
	wake := d.agent.NotifyC()
	idle := time.Duration(0)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ns, err := d.agent.Notifs()
		if err == nil && len(ns) > 0 {
			idle = 0
			for _, n := range ns {
				d.onNotif(string(n.Msg))
			}
			continue
		}
		idle = min(max(2*idle, 10*time.Microsecond), time.Millisecond)
		if wake != nil {
			idle = 100 * time.Millisecond // a safety net only
		}
		timer.Reset(idle)
		select {
		case <-d.closing:
			return
		case <-wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// onNotif steps one notification into the core.
func (d *Decode) onNotif(s string) {
	n, ok := parseNotif(s)
	if !ok {
		d.log.Warn("unknown notification", zap.String("notif", s))
		return
	}
	room := n.room
	var before, after Poll
	var started, at time.Time
	d.step(func(c *Core, now time.Time) {
		before, _ = c.Status(room)
		c.Notification(now, n.room, n.uid, n.chunk, n.total, n.aux)
		after, _ = c.Status(room)
		if rm := c.reg.rooms[room]; rm != nil && rm.dec != nil {
			started, at = rm.dec.started, now
		}
	})
	if before != Success && after == Success {
		d.trace(room, TraceLastNotif)
		d.trace(room, TraceSuccess)
		d.met.latency.Observe(at.Sub(started).Seconds())
	}
}
