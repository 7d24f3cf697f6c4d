package core

// The agent challenge (docs/PROTOCOL.md "The agent challenge"). A
// REGISTER's metadata names an engine agent — for UCX a worker address,
// which names a process by its pid and its endpoints — and nothing in it
// is secret: a decode rank with a valid identity can send another
// process's blob as its own. Anything the prefill rank then does through
// that blob, the ownership proof's read included, runs inside that other
// process (UCX serves an emulated read there: a forged address kills it).
// So before any data-plane operation goes through a REGISTER's blob, the
// prefill rank sends a nonce through the data plane as a notification to
// the agent the blob names — only that process reads it — and binds
// nothing until the REGISTER's sender echoes the nonce back on the control
// plane under its own identity. A notification is a message, not an
// access to the receiver's memory: a process that gets a challenge not
// meant for it (naming another identity) drops it, counted, and is
// otherwise untouched.
//
// The challenge is core state: one per registering decode identity, bound
// to its epoch and to its blob's hash; a new epoch or another blob voids
// it. One that is not echoed within ChallengeTimeout while its sender
// kept registering refuses the registration (not_owner); one whose
// sender fell silent is forgotten. A passed challenge stays while its
// registration does, so a repeated REGISTER of the same process and blob
// is not challenged again.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kvbridge/kvbridge/internal/wire"
)

const (
	// ChallengeBytes is a challenge nonce's size.
	ChallengeBytes = 16
	// MaxEchoes bounds the nonces a decode rank keeps and echoes in each
	// REGISTER (one per prefill rank challenging it at once).
	MaxEchoes = wire.MaxEchoBytes / ChallengeBytes
	// DefaultChallengeTimeout is ChallengeTimeout's default.
	DefaultChallengeTimeout = 5 * time.Second
	// maxChallenges bounds the challenges a prefill rank keeps.
	maxChallenges = 1024
	// challengeProgress is how long the agent keeps progressing after a
	// challenge's notification.
	challengeProgress = 250 * time.Millisecond
	// challengePrefix starts a challenge notification.
	challengePrefix = "kvbc1:"
)

// challenge is one registering decode identity's: the process (epoch) and
// blob it was sent for, its nonce, and whether it was echoed.
type challenge struct {
	from     wire.From
	agent    string // the agent name its REGISTER gave (the blob loaded under it)
	md       [32]byte
	nonce    [ChallengeBytes]byte
	deadline time.Time
	passed   bool
	// repeats counts the sender's REGISTERs without the echo since the
	// challenge went out: a sender that keeps registering but cannot echo
	// is refused at the deadline; one that fell silent (paused, gone, its
	// echo lost) is only forgotten, and challenged afresh when it
	// registers again.
	repeats int
}

// ChallengeNotif is the notification text of a challenge for the decode
// identity peer (From.Peer()) from the prefill rank at endpoint:
// "kvbc1:<nonce, base64url>:<endpoint tag>:<peer>", the endpoint tag the
// first 4 bytes of its SHA-256 (base64url). Short on purpose: with the
// sender's name it stays within UCX's short active message (a longer one
// goes as bcopy, which maps the receiver's descriptor segments, and the
// mappings of a decode process that died stayed: TestDemoChaos).
func ChallengeNotif(nonce []byte, peer, endpoint string) string {
	return challengePrefix + base64.RawURLEncoding.EncodeToString(nonce) + ":" + EndpointTag(endpoint) + ":" + peer
}

// EndpointTag is a challenge's tag of a prefill rank's control endpoint.
func EndpointTag(endpoint string) string {
	h := sha256.Sum256([]byte(endpoint))
	return base64.RawURLEncoding.EncodeToString(h[:4])
}

// ParseChallenge parses ChallengeNotif's text; false for anything else.
func ParseChallenge(s string) (Challenged, bool) {
	rest, ok := strings.CutPrefix(s, challengePrefix)
	if !ok {
		return Challenged{}, false
	}
	f := strings.SplitN(rest, ":", 3)
	if len(f) != 3 || len(f[1]) != 6 || f[2] == "" || len(f[2]) > 3*wire.MaxNameBytes {
		return Challenged{}, false
	}
	nonce, err := base64.RawURLEncoding.DecodeString(f[0])
	if err != nil || len(nonce) != ChallengeBytes {
		return Challenged{}, false
	}
	return Challenged{For: f[2], Nonce: nonce, EndpointTag: f[1]}, true
}

// IsChallenge reports whether a notification is a challenge (even a
// malformed one), not a room's.
func IsChallenge(s string) bool { return strings.HasPrefix(s, challengePrefix) }

func (c CoreConfig) challengeTimeout() time.Duration {
	if c.ChallengeTimeout > 0 {
		return c.ChallengeTimeout
	}
	return DefaultChallengeTimeout
}

// admit decides whether a REGISTER that passed CheckRegister may have its
// blob loaded and its memory proven: only once its sender echoed the
// challenge sent to the blob's agent for this process and blob. Otherwise
// the challenge is sent (again: a REGISTER repeated before its echo came
// sends the same nonce) and the REGISTER waits for its sender's next.
func (c *prefillCore) admit(now time.Time, msg *wire.Register) bool {
	key := msg.From.Peer()
	refuse := func(format string, a ...any) bool {
		c.stats.LayoutRefused[RefusedNotOwner]++
		c.registerRefused(now, msg.From, "memory not proven the registering process's (not_owner): "+fmt.Sprintf(format, a...))
		return false
	}
	// Loading a blob under a name replaces the remote agent of that name:
	// a name another rank registered, is being bound under, or holds by
	// default is never challenged.
	if owner := c.agentOwner(msg.Agent); owner != "" && owner != key {
		return refuse("agent %q is registered here by %s", msg.Agent, owner)
	}
	if own := DefaultNameOwner(msg.Agent); own != "" && own != key {
		return refuse("agent %q is the default name of %s, not of %s", msg.Agent, own, key)
	}
	for _, other := range slices.Sorted(maps.Keys(c.challenges)) {
		ch := c.challenges[other]
		if other == key || ch.agent != msg.Agent {
			continue
		}
		if ch.passed {
			return refuse("agent %q is being registered here by %s", msg.Agent, other)
		}
		c.stats.ChallengesDeferred++ // another rank's challenge loaded that name: left for the sender to repeat
		return false
	}
	md := sha256.Sum256(msg.AgentMD)
	ch := c.challenges[key]
	if ch != nil && (ch.from.Epoch != msg.From.Epoch || ch.md != md) {
		delete(c.challenges, key) // another process of the rank, or another blob
		if !ch.passed && ch.agent != msg.Agent {
			c.unload(ch.agent)
		}
		ch = nil
	}
	if ch != nil && ch.passed {
		return true
	}
	if ch != nil && echoes(msg.Echo, ch.nonce) {
		ch.passed = true
		c.stats.ChallengesPassed++
		return true
	}
	if ch != nil {
		ch.repeats++
	}
	if ch == nil {
		if c.openChallenges() >= maxChallenges {
			c.pruneChallenges(now)
		}
		if c.openChallenges() >= maxChallenges {
			c.stats.ChallengesDeferred++ // left for its sender to repeat
			return false
		}
		ch = &challenge{from: msg.From, agent: msg.Agent, md: md, deadline: now.Add(c.cfg.challengeTimeout())}
		c.challengeSeq++
		h := hmac.New(sha256.New, c.cfg.ChallengeKey[:])
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:], c.challengeSeq)
		binary.LittleEndian.PutUint64(b[8:], msg.From.Epoch)
		h.Write(b[:])
		h.Write(md[:])
		h.Write([]byte(key))
		copy(ch.nonce[:], h.Sum(nil))
		c.challenges[key] = ch
		c.stats.Challenges++
	}
	// An engine that sends a notification only while its agent
	// progresses keeps progressing long enough to send it (a REGISTER
	// repeated without the echo sends it again); not the whole timeout:
	// a polling engine's idle rank would poll all that while.
	c.emit(Effect{Kind: EffectKeepProgress, Keep: min(c.cfg.challengeTimeout(), challengeProgress)})
	c.emit(Effect{Kind: EffectChallenge, To: wire.Peer{Endpoint: msg.From.Endpoint}, Msg: msg, Notif: ChallengeNotif(ch.nonce[:], key, c.endpoint)})
	return false
}

// openChallenges counts the challenges not echoed yet (the ones
// maxChallenges bounds: a passed one is a registration's, bound or being
// bound).
func (c *prefillCore) openChallenges() int {
	n := 0
	for _, ch := range c.challenges {
		if !ch.passed {
			n++
		}
	}
	return n
}

// challengeRefused drops the challenge of a registration the shell
// refused (its claims, its blob's load or its proof): the next REGISTER
// starts afresh, and a name it held is free again.
func (c *prefillCore) challengeRefused(from wire.From) {
	key := from.Peer()
	ch := c.challenges[key]
	if ch == nil || ch.from.Epoch != from.Epoch {
		return
	}
	delete(c.challenges, key)
	c.unload(ch.agent)
}

// ChallengeHolds reports whether a challenge (open or passed) holds the
// agent name — on a decode rank, an offer challenge, an offer being
// loaded or an accepted offer —: the shell keeps a remote it loaded for
// one only then.
func (c *Core) ChallengeHolds(agent string) bool {
	if d := c.decodeCore; d != nil {
		if d.offerChecks[agent] {
			return true
		}
		for _, o := range d.offers {
			if o.remote == agent {
				return true
			}
		}
		for _, ch := range d.offerChallenges {
			if ch.agent == agent {
				return true
			}
		}
		return false
	}
	for _, ch := range c.prefillCore.challenges {
		if ch.agent == agent {
			return true
		}
	}
	return false
}

// defaultNameRE matches the agent names kvbridge gives ranks by default:
// "<instance>-<role>-<rank>".
var defaultNameRE = regexp.MustCompile(`^(.+)-(decode|prefill)-(0|[1-9][0-9]{0,8})$`)

// DefaultNameOwner returns the rank (role/instance/rank) whose default
// agent name name is, or "".
func DefaultNameOwner(name string) string {
	g := defaultNameRE.FindStringSubmatch(name)
	if g == nil {
		return ""
	}
	return g[2] + "/" + g[1] + "/" + g[3]
}

// echoes reports whether echo (nonces end to end) holds nonce.
func echoes(echo []byte, nonce [ChallengeBytes]byte) bool {
	for i := 0; i+ChallengeBytes <= len(echo); i += ChallengeBytes {
		if hmac.Equal(echo[i:i+ChallengeBytes], nonce[:]) {
			return true
		}
	}
	return false
}

// passedChallenge reports whether from's challenge was echoed: a bind
// needs it.
func (c *prefillCore) passedChallenge(from wire.From) bool {
	ch := c.challenges[from.Peer()]
	return ch != nil && ch.passed && ch.from.Epoch == from.Epoch
}

// challengeTick ends each challenge unechoed past its deadline: the
// registration is refused (not_owner, counted) if its sender registered
// again meanwhile without the echo, else only forgotten.
func (c *prefillCore) challengeTick(now time.Time) {
	for _, key := range slices.Sorted(maps.Keys(c.challenges)) {
		ch := c.challenges[key]
		if ch.passed || !now.After(ch.deadline) {
			continue
		}
		delete(c.challenges, key)
		c.stats.ChallengesExpired++
		c.unload(ch.agent)
		if ch.repeats == 0 {
			continue
		}
		c.stats.LayoutRefused[RefusedNotOwner]++
		c.registerRefused(now, ch.from, fmt.Sprintf("memory not proven the registering process's (not_owner): %s (epoch %d) did not echo, within %v, the challenge sent through the data plane to the agent its metadata names: that agent is another process's, or the data plane cannot reach it",
			key, ch.from.Epoch, c.cfg.challengeTimeout()))
	}
}

// unload asks the shell to drop the remote agent an unechoed challenge
// loaded, unless a registration or another challenge uses its name: a
// peer sending blob after blob loads nothing that stays.
func (c *prefillCore) unload(agent string) {
	if agent == "" || c.agentOwner(agent) != "" {
		return
	}
	for _, ch := range c.challenges {
		if ch.agent == agent {
			return
		}
	}
	c.emit(Effect{Kind: EffectUnload, Remote: agent})
}

// pruneChallenges forgets expired challenges (unloading their agents)
// and passed ones whose rank registered another process since.
func (c *prefillCore) pruneChallenges(now time.Time) {
	var gone []string
	maps.DeleteFunc(c.challenges, func(key string, ch *challenge) bool {
		if !ch.passed {
			if now.After(ch.deadline) {
				gone = append(gone, ch.agent)
				return true
			}
			return false
		}
		// A passed one is a registration's, bound or being bound (the
		// shell's refusal drops it): kept until the rank's registration
		// is another process's.
		p := c.peers[key]
		return p != nil && p.from.Epoch != ch.from.Epoch
	})
	slices.Sort(gone)
	for _, agent := range gone {
		c.unload(agent)
	}
}

// challenged (decode) keeps a challenge meant for this rank's identity and
// sends a REGISTER echoing it to every prefill rank still waiting for one
// (the challenge does not say which sent it; a nonce is worth nothing to
// another rank: it binds this identity). A challenge for another identity
// — a REGISTER elsewhere named this rank's agent — is dropped, counted.
func (c *decodeCore) challenged(in Challenged) {
	if in.For != c.cfg.Identity || len(in.Nonce) != ChallengeBytes {
		c.stats.ChallengesIgnored++
		return
	}
	for i := 0; i+ChallengeBytes <= len(c.echo); i += ChallengeBytes {
		if string(c.echo[i:i+ChallengeBytes]) == string(in.Nonce) {
			return // a repeat: the REGISTER that echoes it went out
		}
	}
	c.echo = append(c.echo, in.Nonce...)
	if n := len(c.echo); n > MaxEchoes*ChallengeBytes {
		c.echo = append([]byte(nil), c.echo[n-MaxEchoes*ChallengeBytes:]...)
	}
	// To the prefill rank at the challenge's endpoint if it waits for an
	// answer here; else (an endpoint this rank knows by another name) to
	// every one that waits.
	var waiting, at []*target
	for _, key := range slices.Sorted(maps.Keys(c.targets)) {
		if tg := c.targets[key]; tg.resolved && !tg.resolving && tg.reg == regSent {
			waiting = append(waiting, tg)
			if EndpointTag(tg.endpoint) == in.EndpointTag {
				at = append(at, tg)
			}
		}
	}
	if len(at) == 0 {
		at = waiting
	}
	for _, tg := range at {
		c.sendRegister(tg)
	}
}

// offerEcho is an offer challenge's nonce kept to echo, and when it came.
type offerEcho struct {
	nonce [ChallengeBytes]byte
	at    time.Time
}

// challenged (prefill) keeps an offer challenge meant for this rank's
// identity — a decode rank that got this rank's offer sent it to the
// agent the offer names, which is this one — and answers at once every
// registration of the challenging rank that asked for the offer, its
// REGISTER_ACK echoing the nonce (later ones echo it too). One for
// another identity (an offer elsewhere named this rank's agent), or to a
// rank that offers nothing, is dropped, counted.
func (c *prefillCore) challenged(now time.Time, in Challenged) {
	if in.For != c.cfg.Identity || len(in.Nonce) != ChallengeBytes || !c.servesPull() {
		c.stats.ChallengesIgnored++
		return
	}
	if c.reg.closed != "" {
		// A closed rank binds no one: its echo would complete a
		// registration whose REQUESTs it then refuses (the decode rank's
		// retries and lookups find the rank's next process).
		c.stats.ClosedRegisters++
		return
	}
	var n [ChallengeBytes]byte
	copy(n[:], in.Nonce)
	if e, ok := c.echoes[in.EndpointTag]; ok && e.nonce == n {
		return // a repeat: the REGISTER_ACK that echoes it went out
	}
	if _, ok := c.echoes[in.EndpointTag]; !ok && len(c.echoes) >= maxChallenges {
		// The oldest goes (its rank's challenge is sent again with its
		// next REGISTER_ACK).
		oldest := ""
		for _, tag := range slices.Sorted(maps.Keys(c.echoes)) {
			if oldest == "" || c.echoes[tag].at.Before(c.echoes[oldest].at) {
				oldest = tag
			}
		}
		delete(c.echoes, oldest)
	}
	c.echoes[in.EndpointTag] = offerEcho{nonce: n, at: now}
	c.stats.OfferEchoes++
	for _, key := range slices.Sorted(maps.Keys(c.peers)) {
		if p := c.peers[key]; p.pull && EndpointTag(key) == in.EndpointTag {
			c.ackRegister(p)
		}
	}
}

// Echo (prefill) returns the offer challenge's nonce this rank echoes to
// the decode identity peer (From.Peer()) in its REGISTER_ACKs; nil when
// it keeps none.
func (c *Core) Echo(peer string) []byte {
	if c.prefillCore == nil {
		return nil
	}
	if e, ok := c.prefillCore.echoes[EndpointTag(peer)]; ok {
		return slices.Clone(e.nonce[:])
	}
	return nil
}

// echoTick forgets the echoes kept past twice the challenge timeout (the
// challenge they answer has expired at its sender).
func (c *prefillCore) echoTick(now time.Time) {
	maps.DeleteFunc(c.echoes, func(_ string, e offerEcho) bool {
		return now.Sub(e.at) > 2*c.cfg.challengeTimeout()
	})
}
