package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Magic is frame 0 of every message (PROTOCOL.md, version 1).
const Magic = "KVB1"

// Bounds on a message (PROTOCOL.md "Bounds"). Decode refuses a field past
// its bound as out_of_range before allocating for it; Encode refuses to
// write one (a reason is cut to MaxReasonBytes instead).
const (
	// MaxBodySize is the largest body a rank accepts; the socket refuses larger.
	MaxBodySize = 16 << 20
	// MaxNameBytes bounds role, instance, endpoint, compat, agent, status,
	// code and mem.
	MaxNameBytes = 256
	// MaxReasonBytes bounds a reason.
	MaxReasonBytes = 1024
	// MaxAgentMDBytes bounds REGISTER's agent metadata.
	MaxAgentMDBytes = 8 << 20
	// MaxProofBytes bounds REGISTER's ownership proof (32 bytes, sealed).
	MaxProofBytes = 128
	// MaxEchoBytes bounds REGISTER's echo: the agent challenges' nonces
	// (16 bytes each) its sender was sent through the data plane.
	MaxEchoBytes = 64
	// MaxRegions bounds each of REGISTER's region lists.
	MaxRegions = 4096
	// MaxPages bounds dst_pages and each state index list.
	MaxPages = 1 << 20
	// MaxStateLists bounds state_indices.
	MaxStateLists = 256
	// MaxRanks bounds ranks, sizes, layers and heads in topologies.
	MaxRanks = 1 << 16
)

// MsgType is frame 1 of a message.
type MsgType uint8

// The message types of PROTOCOL.md.
const (
	TypeRegister MsgType = 1 + iota
	TypeRegisterAck
	TypeRequest
	TypeAbort
	TypeAbortAck
	TypeStatus
	TypePing
	TypePong
	// Pull (PROTOCOL.md "Pull"): prefill publishes a chunk's pages, decode
	// renews its lease and reports its reads done.
	TypePages
	TypeRenew
	TypeReadDone
)

var typeNames = [...]string{"", "REGISTER", "REGISTER_ACK", "REQUEST", "ABORT", "ABORT_ACK", "STATUS", "PING", "PONG", "PAGES", "RENEW", "READ_DONE"}

// String returns the wire name.
func (t MsgType) String() string {
	if t >= 1 && int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

func parseType(b []byte) (MsgType, bool) {
	for i := 1; i < len(typeNames); i++ {
		if string(b) == typeNames[i] {
			return MsgType(i), true
		}
	}
	return 0, false
}

// Roles on the wire.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// RoleByte is a role's byte in the binary encodings: an identity
// certificate's and an envelope's receiver (PROTOCOL.md "Envelope",
// "Per-rank identity"): 1 prefill, 2 decode, 0 anything else.
func RoleByte(role string) byte {
	switch role {
	case RolePrefill:
		return 1
	case RoleDecode:
		return 2
	}
	return 0
}

// ByteRole is RoleByte's inverse ("" for a byte that names no role).
func ByteRole(b byte) string {
	switch b {
	case 1:
		return RolePrefill
	case 2:
		return RoleDecode
	}
	return ""
}

// MaxCertBytes bounds an encoded identity certificate (PROTOCOL.md
// "Per-rank identity"): in a bootstrap record and in an envelope.
const MaxCertBytes = 512

// From identifies the sender of every message.
type From struct {
	Role     string // RolePrefill or RoleDecode
	Instance string
	Rank     int
	Endpoint string // the sender's control endpoint: replies go here
	Epoch    uint64 // per process start, growing with each (control.NewEpoch)
}

// Peer returns the stable name of the sender across restarts.
func (f From) Peer() string { return f.Role + "/" + f.Instance + "/" + strconv.Itoa(f.Rank) }

// Memory kinds of a region.
const (
	MemDRAM = "DRAM"
	MemVRAM = "VRAM"
)

// Region is one registered memory region.
type Region struct {
	Addr, Len, ItemLen uint64
	Dev                int
	Mem                string // MemDRAM or MemVRAM
}

// Message is one decoded control message.
type Message interface {
	Type() MsgType
	Sender() From
}

// Register is sent decode → prefill once per peer pair.
type Register struct {
	From           From
	Compat         string
	Agent          string
	AgentMD        []byte
	TPSize, TPRank int
	KV, Aux, State []Region
	// Topo (optional) is the decode rank's place and the model facts the
	// rank mapping needs; nil from a rank without a model (one prefill
	// rank feeds it, identical layouts).
	Topo *Topo
	// Proof (optional on the wire, required by prefill ranks) is the
	// registering process's ownership proof: the value it wrote in the
	// proof slot after each of its regions (PROTOCOL.md "Memory proven to
	// its owner"). It travels sealed to its recipient, as AgentMD does.
	Proof []byte
	// Pull (optional, false when absent): this decode rank reads its
	// rooms; a prefill rank that serves pull answers with its offer.
	Pull bool
	// Echo (optional) holds the nonces of the agent challenges this
	// process was sent through the data plane (PROTOCOL.md "The agent
	// challenge"), end to end: a prefill rank loads nothing of a REGISTER
	// before its sender echoes the nonce sent to the agent its metadata
	// names.
	Echo []byte
}

// Topo is a rank's parallel shape beyond TP and the model facts of the
// rank mapping (PROTOCOL.md "Topologies").
type Topo struct {
	PPSize, PPRank int
	DPSize, DPRank int
	Layers         int
	KVHeads        int
	HeadBytes      int // bytes of one head of one token in one region
	PageTokens     int
	MLA            bool
	PageLayout     string // "NHD" or "HND"
	// PeerTPSize and PeerPPSize (optional, 0: not said) are the prefill
	// instance's sizes this decode rank mapped itself onto; a prefill rank
	// of another shape refuses the REGISTER (the decode rank's view of the
	// instance is stale).
	PeerTPSize, PeerPPSize int
}

// RegisterAck answers Register.
type RegisterAck struct {
	From   From
	OK     bool
	Reason string
	// Pull (optional) is what a prefill rank that serves pull offers with
	// an ok answer: its agent, metadata and memory, for the decode rank to
	// read from (PROTOCOL.md "Pull").
	Pull *PullOffer
	// Echo (optional, with Pull) is the nonce of the offer challenge the
	// answered decode rank sent this process through the data plane
	// (PROTOCOL.md "The agent challenge"): the decode rank reads nothing
	// through an offer before its sender echoes the nonce sent to the
	// agent the offer names.
	Echo []byte
}

// PullOffer is a prefill rank's memory for decode ranks to read: as a
// REGISTER describes a decode rank's (AgentMD and Proof travel sealed).
type PullOffer struct {
	Agent          string
	AgentMD        []byte
	KV, Aux, State []Region
	Proof          []byte
	// LeaseMillis is the lease the rank grants (the decode rank renews a
	// third of it from its REQUEST on).
	LeaseMillis int
}

// Request asks a prefill rank for one room's KV.
type Request struct {
	From         From
	Room         uint64
	DstPages     []uint32
	AuxIndex     int // −1 for none
	StateIndices [][]uint32
	Required     int
	Prefix       int
	Dummy        bool
	// Source (optional, −1 when absent) is the uid the prefill rank puts in
	// this room's notifications, so a decode rank pulling from several
	// instances tells same-numbered ranks apart; absent, it is the prefill
	// rank's own rank.
	Source int
	// Pull (optional, false when absent): the decode rank reads the room's
	// pages itself once the prefill rank publishes them (PAGES), instead
	// of the prefill rank writing them. At is then the decode rank's clock
	// when it sent the REQUEST (Unix nanoseconds): the lease counts from it.
	Pull bool
	At   uint64
	// Digest (optional, false when absent): the prefill rank appends a
	// CRC-32C of each destination page it writes to every chunk
	// notification that writes pages (docs/PROTOCOL.md "Digest").
	Digest bool
	// N (optional, 0 when absent) numbers the decode process's REQUESTs to
	// one prefill rank, from 1, in the order it sends them: a closing
	// prefill process says the highest it took (STATUS closed, Taken), so
	// the decode rank knows which of its REQUESTs nothing will be written
	// for (docs/PROTOCOL.md "A rank that closes").
	N uint64
}

// MaxLeaseMillis bounds PAGES.lease_ms (a day).
const MaxLeaseMillis = 24 * 3600 * 1000

// MaxChunks bounds a room's chunks per prefill rank (PAGES.chunk, total).
const MaxChunks = 1 << 16

// Pages publishes one chunk (or one layer group of it) of a pull room to
// the decode rank that asked for pull: prefill → decode. The decode rank
// pairs Pages with its own REQUEST's pages, reads them, and accounts the
// read as it would the chunk's notification (the same fields).
type Pages struct {
	From         From
	Room         uint64
	Chunk, Total int // Total: 0 but on the last chunk (the chunk count)
	// First is the room position of the chunk's first prefill page (the
	// prefill pages sent before it); Pages are the prefill rank's pages.
	First int
	Pages []uint32
	// Lo, Hi, SpanLo, SpanHi: the layers, in the decode rank's numbering,
	// as a notification names them.
	Lo, Hi, SpanLo, SpanHi int
	// Final: the rank's last message for the room; Aux (−1: none) and
	// State are the prefill rank's aux item and state items to read.
	Final bool
	Aux   int
	State [][]uint32
	// At echoes the latest stamp (REQUEST or RENEW) of the decode process
	// the prefill rank received; the lease runs LeaseMillis from it.
	At          uint64
	LeaseMillis int
	// Digests (optional: a room whose REQUEST asked for a digest, on a
	// PAGES of pages): the CRC-32C of each decode page position it
	// publishes, in order, and Units how many units of the last one it
	// fills (docs/PROTOCOL.md "Digest").
	Digests []uint32
	Units   int
}

// MaxDigestUnits bounds PAGES.units (a page of at most this many units of
// the other side's page).
const MaxDigestUnits = 1 << 16

// Renew asks the prefill rank to extend a pull room's lease: decode →
// prefill. At is the decode rank's clock when it sent it.
type Renew struct {
	From From
	Room uint64
	At   uint64
}

// ReadDone reports a decode rank's reads of a pull room over: decode →
// prefill. OK: every chunk and the final items were read. Drained: no
// read of the room by this process is in flight or can still land.
type ReadDone struct {
	From    From
	Room    uint64
	OK      bool
	Drained bool
	Reason  string
}

// Abort is sent decode → prefill at any time.
type Abort struct {
	From From
	Room uint64
	// Code (optional) says why in a word a program can branch on, e.g.
	// refused (the decode rank refused the room before asking for it).
	Code   string
	Reason string
}

// AbortAck confirms an aborted room has no write in flight.
type AbortAck struct {
	From    From
	Room    uint64
	Drained bool
}

// Status values.
const (
	StatusFailed  = "failed"
	StatusSuccess = "success"
)

// Status reports a room's failure (or success summary) prefill → decode.
type Status struct {
	From   From
	Room   uint64
	Status string
	// Code (protocol v2, optional) says why in a word decode branches on:
	// "not_registered", "out_of_range", "aborted", "cleared", "rejected",
	// "peer_restarted", "closed" or "failed". Empty from a v1 peer.
	Code   string
	Reason string
	// Taken (optional, 0 when absent; with code "closed", room 0): the
	// highest REQUEST number (Request.N) from the receiver's process that
	// the closing sender took before it closed.
	Taken uint64
}

// Ping and Pong are the heartbeat.
type Ping struct {
	From From
	Seq  uint64
}

// Pong answers Ping with the same Seq.
type Pong struct {
	From From
	Seq  uint64
}

func (*Register) Type() MsgType    { return TypeRegister }
func (*RegisterAck) Type() MsgType { return TypeRegisterAck }
func (*Request) Type() MsgType     { return TypeRequest }
func (*Abort) Type() MsgType       { return TypeAbort }
func (*AbortAck) Type() MsgType    { return TypeAbortAck }
func (*Status) Type() MsgType      { return TypeStatus }
func (*Ping) Type() MsgType        { return TypePing }
func (*Pong) Type() MsgType        { return TypePong }
func (*Pages) Type() MsgType       { return TypePages }
func (*Renew) Type() MsgType       { return TypeRenew }
func (*ReadDone) Type() MsgType    { return TypeReadDone }

func (m *Register) Sender() From    { return m.From }
func (m *RegisterAck) Sender() From { return m.From }
func (m *Request) Sender() From     { return m.From }
func (m *Abort) Sender() From       { return m.From }
func (m *AbortAck) Sender() From    { return m.From }
func (m *Status) Sender() From      { return m.From }
func (m *Ping) Sender() From        { return m.From }
func (m *Pong) Sender() From        { return m.From }
func (m *Pages) Sender() From       { return m.From }
func (m *Renew) Sender() From       { return m.From }
func (m *ReadDone) Sender() From    { return m.From }

// SetFrom replaces the sender; the control loop stamps its own identity.
func SetFrom(m Message, f From) {
	switch m := m.(type) {
	case *Register:
		m.From = f
	case *RegisterAck:
		m.From = f
	case *Request:
		m.From = f
	case *Abort:
		m.From = f
	case *AbortAck:
		m.From = f
	case *Status:
		m.From = f
	case *Ping:
		m.From = f
	case *Pong:
		m.From = f
	case *Pages:
		m.From = f
	case *Renew:
		m.From = f
	case *ReadDone:
		m.From = f
	}
}

// Encode returns the three frames of m. Keys are written in a fixed order,
// so the bytes are deterministic (see testdata/golden).
func Encode(m Message) ([][]byte, error) {
	body, err := EncodeBody(m)
	if err != nil {
		return nil, err
	}
	return [][]byte{magicFrame, typeFrames[m.Type()], body}, nil
}

// HeaderFrames returns the two frames that come before a message's body:
// the magic and the type. They are shared: not to be written.
func HeaderFrames(t MsgType) (magic, typ []byte) { return magicFrame, typeFrames[t] }

// EncodeBody encodes a message's body, its third frame, in one
// allocation (a sender that builds the frames itself, as the control loop
// does, allocates nothing more).
func EncodeBody(m Message) ([]byte, error) { return AppendBody(nil, m) }

// AppendBody is EncodeBody into dst's memory (its length ignored): a
// sender that reuses its buffers allocates nothing for most messages. The
// body is dst's memory only when it fits in cap(dst) (returned either
// way).
func AppendBody(dst []byte, m Message) ([]byte, error) { return AppendBodyAs(dst, m, nil) }

// OwnFrom is a rank's own from map, encoded once: a rank sends the same
// from on every message. Immutable, so any number of goroutines may
// encode with it.
type OwnFrom struct {
	from From
	raw  []byte // the "from" key and the map, as the encoder writes them
}

// NewOwnFrom encodes f once (nil if f does not encode: AppendBodyAs then
// encodes it each time, and fails as AppendBody would).
func NewOwnFrom(f From) *OwnFrom {
	e := &encoder{}
	e.from(f)
	if e.e != nil {
		return nil
	}
	return &OwnFrom{from: f, raw: e.b}
}

// AppendBodyAs is AppendBody for a message from the rank own stands for:
// where m's From is own's, its encoding is copied rather than made again
// (the same bytes: TestOwnFromSameBytes). own may be nil.
func AppendBodyAs(dst []byte, m Message, own *OwnFrom) ([]byte, error) {
	if c := encodeCap(m); cap(dst) < c {
		dst = make([]byte, 0, c)
	}
	e := &encoder{b: dst[:0], own: own}
	switch m := m.(type) {
	case *Register:
		n := 9
		if m.Topo != nil {
			n++
		}
		if len(m.Proof) > 0 {
			n++
		}
		if m.Pull {
			n++
		}
		if len(m.Echo) > 0 {
			n++
		}
		e.mapLen(n)
		e.from(m.From)
		e.kstr("compat", m.Compat)
		e.kstr("agent", m.Agent)
		if len(m.AgentMD) > MaxAgentMDBytes {
			e.err(fmt.Errorf("agent_md of %d bytes exceeds %d", len(m.AgentMD), MaxAgentMDBytes))
		}
		e.kbin("agent_md", m.AgentMD)
		e.kint("tp_size", int64(m.TPSize))
		e.kint("tp_rank", int64(m.TPRank))
		e.regions("kv", m.KV)
		e.regions("aux", m.Aux)
		e.regions("state", m.State)
		if len(m.Proof) > MaxProofBytes {
			e.err(fmt.Errorf("proof of %d bytes exceeds %d", len(m.Proof), MaxProofBytes))
		}
		if len(m.Proof) > 0 {
			e.kbin("proof", m.Proof)
		}
		if m.Pull {
			e.kbool("pull", true)
		}
		if len(m.Echo) > MaxEchoBytes {
			e.err(fmt.Errorf("echo of %d bytes exceeds %d", len(m.Echo), MaxEchoBytes))
		}
		if len(m.Echo) > 0 {
			e.kbin("echo", m.Echo)
		}
		if t := m.Topo; t != nil {
			e.key("topo")
			if t.PeerTPSize != 0 || t.PeerPPSize != 0 {
				e.mapLen(12)
				e.kint("peer_tp_size", int64(t.PeerTPSize))
				e.kint("peer_pp_size", int64(t.PeerPPSize))
			} else {
				e.mapLen(10)
			}
			e.kint("pp_size", int64(t.PPSize))
			e.kint("pp_rank", int64(t.PPRank))
			e.kint("dp_size", int64(t.DPSize))
			e.kint("dp_rank", int64(t.DPRank))
			e.kint("layers", int64(t.Layers))
			e.kint("kv_heads", int64(t.KVHeads))
			e.kint("head_bytes", int64(t.HeadBytes))
			e.kint("page_tokens", int64(t.PageTokens))
			e.kbool("mla", t.MLA)
			e.kstr("page_layout", t.PageLayout)
		}
	case *RegisterAck:
		n := 3
		if m.Pull != nil {
			n++
		}
		if len(m.Echo) > 0 {
			n++
		}
		e.mapLen(n)
		e.from(m.From)
		e.kbool("ok", m.OK)
		e.kreason("reason", m.Reason)
		if len(m.Echo) > MaxEchoBytes {
			e.err(fmt.Errorf("echo of %d bytes exceeds %d", len(m.Echo), MaxEchoBytes))
		}
		if len(m.Echo) > 0 {
			e.kbin("echo", m.Echo)
		}
		if o := m.Pull; o != nil {
			e.key("pull")
			e.mapLen(7)
			e.kstr("agent", o.Agent)
			if len(o.AgentMD) > MaxAgentMDBytes {
				e.err(fmt.Errorf("agent_md of %d bytes exceeds %d", len(o.AgentMD), MaxAgentMDBytes))
			}
			e.kbin("agent_md", o.AgentMD)
			e.regions("kv", o.KV)
			e.regions("aux", o.Aux)
			e.regions("state", o.State)
			if len(o.Proof) > MaxProofBytes {
				e.err(fmt.Errorf("proof of %d bytes exceeds %d", len(o.Proof), MaxProofBytes))
			}
			e.kbin("proof", o.Proof)
			e.kint("lease_ms", int64(o.LeaseMillis))
		}
	case *Request:
		n := 8
		if m.Source >= 0 {
			n++
		}
		if m.Pull {
			n += 2
		}
		if m.Digest {
			n++
		}
		if m.N > 0 {
			n++
		}
		e.mapLen(n)
		e.from(m.From)
		e.kuint("room", m.Room)
		e.kbin("dst_pages", pagesToBin(m.DstPages))
		e.kint("aux_index", int64(m.AuxIndex))
		e.key("state_indices")
		e.arrayLen(len(m.StateIndices))
		for _, s := range m.StateIndices {
			e.bytes(pagesToBin(s))
		}
		e.kint("required", int64(m.Required))
		e.kint("prefix", int64(m.Prefix))
		e.kbool("dummy", m.Dummy)
		if m.Source >= 0 {
			e.kint("source", int64(m.Source))
		}
		if m.Pull {
			e.kbool("pull", true)
			e.kuint("at", m.At)
		}
		if m.Digest {
			e.kbool("digest", true)
		}
		if m.N > 0 {
			e.kuint("n", m.N)
		}
	case *Pages:
		n := 15
		if m.Digests != nil {
			n += 2
		}
		e.mapLen(n)
		e.from(m.From)
		e.kuint("room", m.Room)
		e.kint("chunk", int64(m.Chunk))
		e.kint("total", int64(m.Total))
		e.kint("first", int64(m.First))
		if len(m.Pages) > MaxPages {
			e.err(fmt.Errorf("%d pages exceed %d", len(m.Pages), MaxPages))
		}
		e.kbin("pages", pagesToBin(m.Pages))
		e.kint("lo", int64(m.Lo))
		e.kint("hi", int64(m.Hi))
		e.kint("span_lo", int64(m.SpanLo))
		e.kint("span_hi", int64(m.SpanHi))
		e.kbool("final", m.Final)
		e.kint("aux", int64(m.Aux))
		e.key("state")
		e.arrayLen(len(m.State))
		for _, s := range m.State {
			e.bytes(pagesToBin(s))
		}
		e.kuint("at", m.At)
		e.kint("lease_ms", int64(m.LeaseMillis))
		if m.Digests != nil {
			if len(m.Digests) > MaxPages {
				e.err(fmt.Errorf("%d digests exceed %d", len(m.Digests), MaxPages))
			}
			e.kbin("digests", pagesToBin(m.Digests))
			e.kint("units", int64(m.Units))
		}
	case *Renew:
		e.mapLen(3)
		e.from(m.From)
		e.kuint("room", m.Room)
		e.kuint("at", m.At)
	case *ReadDone:
		e.mapLen(5)
		e.from(m.From)
		e.kuint("room", m.Room)
		e.kbool("ok", m.OK)
		e.kbool("drained", m.Drained)
		e.kreason("reason", m.Reason)
	case *Abort:
		if m.Code == "" {
			e.mapLen(3)
		} else {
			e.mapLen(4)
		}
		e.from(m.From)
		e.kuint("room", m.Room)
		if m.Code != "" {
			e.kstr("code", m.Code)
		}
		e.kreason("reason", m.Reason)
	case *AbortAck:
		e.mapLen(3)
		e.from(m.From)
		e.kuint("room", m.Room)
		e.kbool("drained", m.Drained)
	case *Status:
		n := 4
		if m.Code != "" {
			n++
		}
		if m.Taken > 0 {
			n++
		}
		e.mapLen(n)
		e.from(m.From)
		e.kuint("room", m.Room)
		e.kstr("status", m.Status)
		if m.Code != "" {
			e.kstr("code", m.Code)
		}
		e.kreason("reason", m.Reason)
		if m.Taken > 0 {
			e.kuint("taken", m.Taken)
		}
	case *Ping:
		e.mapLen(2)
		e.from(m.From)
		e.kuint("seq", m.Seq)
	case *Pong:
		e.mapLen(2)
		e.from(m.From)
		e.kuint("seq", m.Seq)
	default:
		return nil, fmt.Errorf("bootstrap: cannot encode %T", m)
	}
	if e.e != nil {
		return nil, fmt.Errorf("bootstrap: encode %v: %w", m.Type(), e.e)
	}
	if len(e.b) > MaxBodySize {
		return nil, fmt.Errorf("bootstrap: %v body of %d bytes exceeds %d", m.Type(), len(e.b), MaxBodySize)
	}
	return e.b, nil
}

// encodeCap is the body's size, or near it: one allocation for most.
func encodeCap(m Message) int {
	n := 256
	switch m := m.(type) {
	case *Register:
		n += len(m.AgentMD) + len(m.Proof) + len(m.Echo) + 64*(len(m.KV)+len(m.Aux)+len(m.State))
	case *RegisterAck:
		n += len(m.Echo)
		if o := m.Pull; o != nil {
			n += len(o.AgentMD) + len(o.Proof) + 64*(len(o.KV)+len(o.Aux)+len(o.State))
		}
	case *Request:
		n += 4 * len(m.DstPages)
		for _, s := range m.StateIndices {
			n += 5 + 4*len(s)
		}
	case *Pages:
		n += 128 + 4*len(m.Pages)
		for _, s := range m.State {
			n += 5 + 4*len(s)
		}
	}
	return n
}

var (
	magicFrame = []byte(Magic)
	typeFrames = func() [][]byte {
		f := make([][]byte, len(typeNames))
		for i, n := range typeNames {
			f[i] = []byte(n)
		}
		return f
	}()
)

// encoder appends MessagePack to b, as github.com/vmihailenco/msgpack/v5
// writes it (the smallest form of each length and integer; the golden
// files pin the bytes), without its io.Writer per value.
type encoder struct {
	b   []byte
	e   error
	own *OwnFrom // the sender's own from, encoded (nil: none)
}

func (e *encoder) err(err error) {
	if e.e == nil {
		e.e = err
	}
}

// head writes a length header: the fixed form below fix (code fixCode|n),
// then the 8-, 16- and 32-bit forms (a zero code8: none).
func (e *encoder) head(n, fix int, fixCode, code8, code16, code32 byte) {
	switch {
	case n < fix:
		e.b = append(e.b, fixCode|byte(n))
	case code8 != 0 && n <= math.MaxUint8:
		e.b = append(e.b, code8, byte(n))
	case n <= math.MaxUint16:
		e.b = append(e.b, code16, byte(n>>8), byte(n))
	default:
		e.b = append(e.b, code32, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
}

func (e *encoder) mapLen(n int)   { e.head(n, 16, 0x80, 0, 0xde, 0xdf) }
func (e *encoder) arrayLen(n int) { e.head(n, 16, 0x90, 0, 0xdc, 0xdd) }
func (e *encoder) str(v string) {
	e.head(len(v), 32, 0xa0, 0xd9, 0xda, 0xdb)
	e.b = append(e.b, v...)
}

// bytes writes bin (nil as nil, as msgpack/v5 does).
func (e *encoder) bytes(v []byte) {
	if v == nil {
		e.b = append(e.b, 0xc0)
		return
	}
	e.head(len(v), 0, 0, 0xc4, 0xc5, 0xc6)
	e.b = append(e.b, v...)
}

func (e *encoder) uint(v uint64) {
	switch {
	case v <= math.MaxInt8:
		e.b = append(e.b, byte(v))
	case v <= math.MaxUint8:
		e.b = append(e.b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		e.b = append(e.b, 0xcd, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		e.b = append(e.b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		e.b = append(e.b, 0xcf)
		e.b = binary.BigEndian.AppendUint64(e.b, v)
	}
}

func (e *encoder) int(v int64) {
	switch {
	case v >= 0:
		e.uint(uint64(v))
	case v >= -32:
		e.b = append(e.b, byte(v))
	case v >= math.MinInt8:
		e.b = append(e.b, 0xd0, byte(v))
	case v >= math.MinInt16:
		e.b = append(e.b, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		e.b = append(e.b, 0xd2, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		e.b = append(e.b, 0xd3)
		e.b = binary.BigEndian.AppendUint64(e.b, uint64(v))
	}
}

func (e *encoder) key(k string) { e.str(k) }
func (e *encoder) kstr(k, v string) {
	if len(v) > MaxNameBytes {
		e.err(fmt.Errorf("%s of %d bytes exceeds %d", k, len(v), MaxNameBytes))
	}
	e.key(k)
	e.str(v)
}

// kreason writes a reason cut to MaxReasonBytes (at a rune boundary).
func (e *encoder) kreason(k, v string) {
	e.key(k)
	e.str(CutReason(v, MaxReasonBytes))
}

// CutReason returns s cut to at most n bytes without splitting a UTF-8
// sequence, marked with "…" when cut.
func CutReason(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := max(n-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
func (e *encoder) kuint(k string, v uint64) { e.key(k); e.uint(v) }
func (e *encoder) kint(k string, v int64)   { e.key(k); e.int(v) }
func (e *encoder) kbool(k string, v bool) {
	e.key(k)
	if v {
		e.b = append(e.b, 0xc3)
	} else {
		e.b = append(e.b, 0xc2)
	}
}
func (e *encoder) kbin(k string, v []byte) {
	if v == nil {
		v = []byte{} // nil would be written as nil; the wire wants bin
	}
	e.key(k)
	e.bytes(v)
}

func (e *encoder) from(f From) {
	if e.own != nil && e.own.from == f {
		e.b = append(e.b, e.own.raw...)
		return
	}
	e.key("from")
	e.mapLen(5)
	e.kstr("role", f.Role)
	e.kstr("instance", f.Instance)
	e.kint("rank", int64(f.Rank))
	e.kstr("endpoint", f.Endpoint)
	e.kuint("epoch", f.Epoch)
}

func (e *encoder) regions(k string, rs []Region) {
	e.key(k)
	e.arrayLen(len(rs))
	for _, r := range rs {
		e.mapLen(5)
		e.kuint("addr", r.Addr)
		e.kuint("len", r.Len)
		e.kuint("item_len", r.ItemLen)
		e.kint("dev", int64(r.Dev))
		e.kstr("mem", r.Mem)
	}
}

// Reasons a message is malformed (the label of
// kvbridge_malformed_messages_total).
const (
	ReasonFrames       = "frames"
	ReasonMagic        = "magic"
	ReasonType         = "type"
	ReasonBody         = "body"
	ReasonMissingField = "missing_field"
	ReasonWrongType    = "wrong_type"
	ReasonOutOfRange   = "out_of_range"
)

// MalformedReasons lists every reason, for metrics and tests.
var MalformedReasons = []string{ReasonFrames, ReasonMagic, ReasonType, ReasonBody, ReasonMissingField, ReasonWrongType, ReasonOutOfRange}

// MalformedError says why a message was dropped. Where the body still
// yielded a room and the sender's endpoint, they are set, so a prefill rank
// can answer a malformed REQUEST with STATUS failed.
type MalformedError struct {
	Reason string  // one of the Reason constants
	Type   MsgType // 0 if the type frame was bad
	Field  string  // the offending field, if any
	Detail string
	Room   uint64
	// HasRoom is true when Room was decoded.
	HasRoom  bool
	Endpoint string // the sender's from.endpoint, if decoded
}

func (e *MalformedError) Error() string {
	s := "bootstrap: malformed message: " + e.Reason
	if e.Type != 0 {
		s += " in " + e.Type.String()
	}
	if e.Field != "" {
		s += " field " + e.Field
	}
	if e.HasRoom {
		s += fmt.Sprintf(" room %d", e.Room)
	}
	if e.Endpoint != "" {
		s += " from " + e.Endpoint
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Decode parses the frames of one message. Any error is a *MalformedError;
// Decode never panics.
func Decode(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return nil, &MalformedError{Reason: ReasonFrames, Detail: fmt.Sprintf("%d frames, want 3", len(frames))}
	}
	if string(frames[0]) != Magic {
		return nil, &MalformedError{Reason: ReasonMagic, Detail: fmt.Sprintf("%q", truncate(frames[0]))}
	}
	t, ok := parseType(frames[1])
	if !ok {
		return nil, &MalformedError{Reason: ReasonType, Detail: fmt.Sprintf("%q", truncate(frames[1]))}
	}
	if len(frames[2]) > MaxBodySize {
		return nil, &MalformedError{Reason: ReasonBody, Type: t, Detail: fmt.Sprintf("%d bytes exceeds %d", len(frames[2]), MaxBodySize)}
	}
	b, err := parseMap(frames[2])
	if err != nil {
		return nil, &MalformedError{Reason: ReasonBody, Type: t, Detail: err.Error()}
	}
	defer b.release()
	b.t = t
	var m Message
	switch t {
	case TypeRegister:
		r := &Register{From: b.from(), Compat: b.str("compat"), Agent: b.str("agent"), AgentMD: b.binMax("agent_md", MaxAgentMDBytes),
			TPSize: b.int("tp_size", 1, math.MaxInt32), KV: b.regions("kv"), Aux: b.regions("aux"), State: b.regions("state")}
		r.TPRank = b.int("tp_rank", 0, int64(max(r.TPSize-1, 0)))
		r.Topo = b.topo("topo")
		if _, ok := b.lookup("proof"); ok && b.err == nil {
			r.Proof = b.binMax("proof", MaxProofBytes)
		}
		r.Pull = b.optBool("pull")
		if _, ok := b.lookup("echo"); ok && b.err == nil {
			r.Echo = b.binMax("echo", MaxEchoBytes)
		}
		m = r
	case TypeRegisterAck:
		a := &RegisterAck{From: b.from(), OK: b.boolean("ok"), Reason: b.reason("reason")}
		if raw, ok := b.lookup("pull"); ok && b.err == nil {
			if o := b.nested("pull", -1, raw); o != nil {
				a.Pull = &PullOffer{Agent: o.str("agent"), AgentMD: o.binMax("agent_md", MaxAgentMDBytes),
					KV: o.regions("kv"), Aux: o.regions("aux"), State: o.regions("state"), Proof: o.binMax("proof", MaxProofBytes),
					LeaseMillis: o.int("lease_ms", 1, MaxLeaseMillis)}
				if o.err != nil {
					b.err = o.err
				}
				o.release()
			}
		}
		if _, ok := b.lookup("echo"); ok && b.err == nil {
			a.Echo = b.binMax("echo", MaxEchoBytes)
		}
		m = a
	case TypeRequest:
		m = &Request{From: b.from(), Room: b.uint("room"), DstPages: b.pages("dst_pages"),
			AuxIndex: b.int("aux_index", -1, math.MaxInt32), StateIndices: b.pageLists("state_indices"),
			Required: b.int("required", 1, math.MaxInt32), Prefix: b.int("prefix", 0, math.MaxInt32), Dummy: b.boolean("dummy"),
			Source: b.optInt("source", 0, MaxRanks-1, -1), Pull: b.optBool("pull"), Digest: b.optBool("digest"), N: b.optUint("n")}
		if r := m.(*Request); r.Pull {
			r.At = b.uint("at")
		}
	case TypeAbort:
		m = &Abort{From: b.from(), Room: b.uint("room"), Code: b.optStr("code"), Reason: b.reason("reason")}
	case TypeAbortAck:
		m = &AbortAck{From: b.from(), Room: b.uint("room"), Drained: b.boolean("drained")}
	case TypeStatus:
		s := &Status{From: b.from(), Room: b.uint("room"), Status: b.str("status"), Code: b.optStr("code"), Reason: b.reason("reason"), Taken: b.optUint("taken")}
		if b.err == nil && s.Status != StatusFailed && s.Status != StatusSuccess {
			b.fail(ReasonOutOfRange, "status", fmt.Sprintf("%q", s.Status))
		}
		m = s
	case TypePing:
		m = &Ping{From: b.from(), Seq: b.uint("seq")}
	case TypePong:
		m = &Pong{From: b.from(), Seq: b.uint("seq")}
	case TypePages:
		m = &Pages{From: b.from(), Room: b.uint("room"), Chunk: b.int("chunk", 0, MaxChunks-1), Total: b.int("total", 0, MaxChunks),
			First: b.int("first", 0, math.MaxInt32), Pages: b.pages("pages"),
			Lo: b.int("lo", 0, MaxRanks), Hi: b.int("hi", 0, MaxRanks), SpanLo: b.int("span_lo", 0, MaxRanks), SpanHi: b.int("span_hi", 0, MaxRanks),
			Final: b.boolean("final"), Aux: b.int("aux", -1, math.MaxInt32), State: b.pageLists("state"),
			At: b.uint("at"), LeaseMillis: b.int("lease_ms", 1, MaxLeaseMillis)}
		if _, ok := b.lookup("digests"); ok && b.err == nil {
			p := m.(*Pages)
			p.Digests, p.Units = b.pages("digests"), b.int("units", 1, MaxDigestUnits)
		}
	case TypeRenew:
		m = &Renew{From: b.from(), Room: b.uint("room"), At: b.uint("at")}
	case TypeReadDone:
		m = &ReadDone{From: b.from(), Room: b.uint("room"), OK: b.boolean("ok"), Drained: b.boolean("drained"), Reason: b.reason("reason")}
	}
	if b.err != nil {
		b.err.Type = t
		b.salvage(b.err)
		return nil, b.err
	}
	return m, nil
}

func truncate(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}

// field is one key and its raw value, both slices of the input.
type field struct{ key, val []byte }

// body is a decoded map of raw field values; getters record the first
// problem and return zero values after it. Fields are a small slice searched
// linearly: bodies have at most ten keys, and this avoids a map per message.
type body struct {
	inline [12]field
	t      MsgType
	fields []field
	// parent, key and index locate a nested map ("from", "kv[3]") for
	// error messages; they are turned into a path only on failure.
	parent *body
	key    string
	index  int
	err    *MalformedError
	// memo: the remembered from map this body's "from" value began with
	// (parseMap found its end by it rather than by walking it).
	memo *fromMemo
}

func parseMap(raw []byte) (*body, error) {
	s := &scanner{b: raw}
	n, err := s.expect(mpMap)
	if err != nil {
		return nil, err
	}
	b := bodies.Get().(*body)
	b.fields = b.inline[:0]
	for i := 0; i < n; i++ {
		kn, err := s.expect(mpStr)
		if err != nil {
			b.release()
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		k := s.b[s.off : s.off+kn]
		s.off += kn
		var v []byte
		if string(k) == "from" && b.memo == nil {
			// The from map read last, if the value starts with it, ends
			// where it does (a MessagePack value's encoding is no prefix
			// of another's): not walked again.
			if m := fromMemos[lastFromSlot.Load()].m.Load(); m != nil && bytes.HasPrefix(s.b[s.off:], m.raw) {
				v, b.memo = s.b[s.off:s.off+len(m.raw)], m
				s.off += len(m.raw)
			}
		}
		if v == nil {
			if v, err = s.raw(); err != nil {
				b.release()
				return nil, fmt.Errorf("value of %q: %w", k, err)
			}
		}
		b.fields = append(b.fields, field{k, v}) // a repeated key: the first one wins in lookup
	}
	if s.remaining() != 0 {
		b.release()
		return nil, fmt.Errorf("%d trailing bytes", s.remaining())
	}
	return b, nil
}

// bodies recycles parsed maps: two per message decoded (the body and its
// from), each some 600 bytes of pointers for the collector to scan.
var bodies = sync.Pool{New: func() any { return new(body) }}

// release returns b to the pool; nothing may use it (or the bodies nested
// in it) after. A body with many fields is left to the collector.
func (b *body) release() {
	if cap(b.fields) > len(b.inline) {
		return
	}
	clear(b.fields) // the used entries only (they point into a frame)
	b.fields, b.parent, b.key, b.index, b.err, b.t, b.memo = nil, nil, "", 0, nil, 0, nil
	bodies.Put(b)
}

func (b *body) lookup(k string) ([]byte, bool) {
	for _, f := range b.fields {
		if string(f.key) == k {
			return f.val, true
		}
	}
	return nil, false
}

func (b *body) path() string {
	if b.parent == nil {
		return ""
	}
	p := b.parent.path() + b.key
	if b.index >= 0 {
		p += "[" + strconv.Itoa(b.index) + "]"
	}
	return p + "."
}

func elem(k string, i int) string { return k + "[" + strconv.Itoa(i) + "]" }

func (b *body) fail(reason, field, detail string) {
	if b.err == nil {
		b.err = &MalformedError{Reason: reason, Field: b.path() + field, Detail: detail}
	}
}

// get returns a scanner over field k; ok is false (and why recorded) when
// the field is missing or an earlier field failed.
func (b *body) get(k string) (scanner, bool) {
	if b.err != nil {
		return scanner{}, false
	}
	v, ok := b.lookup(k)
	if !ok {
		b.fail(ReasonMissingField, k, "")
		return scanner{}, false
	}
	return scanner{b: v}, true
}

// check records a scanner error as wrong type or body.
func (b *body) check(k string, err error) bool {
	if err == nil {
		return true
	}
	var te *typeError
	if asTypeError(err, &te) {
		b.fail(ReasonWrongType, k, te.Error())
	} else {
		b.fail(ReasonBody, k, err.Error())
	}
	return false
}

func asTypeError(err error, te **typeError) bool {
	t, ok := err.(*typeError)
	if ok {
		*te = t
	}
	return ok
}

// role reads a role, returning the constant for the two valid ones (no
// allocation per message); anything else is read as a name.
func (b *body) role(k string) string {
	if b.err == nil {
		if v, ok := b.lookup(k); ok {
			switch string(v) {
			case "\xa7" + RolePrefill:
				return RolePrefill
			case "\xa6" + RoleDecode:
				return RoleDecode
			}
		}
	}
	return b.str(k)
}

// name reads a rank's instance or endpoint (at most MaxNameBytes), as an
// interned string: every message carries its sender's, and the same few
// come again and again.
func (b *body) name(k string) string {
	s, ok := b.get(k)
	if !ok {
		return ""
	}
	n, err := s.expect(mpStr)
	if !b.check(k, err) {
		return ""
	}
	if n > MaxNameBytes {
		b.fail(ReasonOutOfRange, k, fmt.Sprintf("string of %d bytes exceeds %d", n, MaxNameBytes))
		return ""
	}
	return names.intern(s.b[s.off : s.off+n])
}

// str reads a name-like string of at most MaxNameBytes.
func (b *body) str(k string) string { return b.strMax(k, MaxNameBytes) }

// reason reads a reason of at most MaxReasonBytes.
func (b *body) reason(k string) string { return b.strMax(k, MaxReasonBytes) }

func (b *body) strMax(k string, limit int) string {
	s, ok := b.get(k)
	if !ok {
		return ""
	}
	n, err := s.expect(mpStr) // one header read (it checks the n bytes are there)
	if !b.check(k, err) {
		return ""
	}
	if n > limit {
		b.fail(ReasonOutOfRange, k, fmt.Sprintf("string of %d bytes exceeds %d", n, limit))
		return ""
	}
	return string(s.b[s.off : s.off+n])
}

// optStr reads an optional string field ("" when absent).
func (b *body) optStr(k string) string {
	if _, ok := b.lookup(k); !ok || b.err != nil {
		return ""
	}
	return b.str(k)
}

func (b *body) binMax(k string, limit int) []byte {
	s, ok := b.get(k)
	if !ok {
		return nil
	}
	n, err := s.peekLen(mpBin)
	if b.check(k, err) && n > limit {
		b.fail(ReasonOutOfRange, k, fmt.Sprintf("%d bytes exceeds %d", n, limit))
		return nil
	}
	v, err := s.bin()
	b.check(k, err)
	return v
}

func (b *body) boolean(k string) bool {
	s, ok := b.get(k)
	if !ok {
		return false
	}
	v, err := s.boolean()
	b.check(k, err)
	return v
}

func (b *body) uint(k string) uint64 {
	s, ok := b.get(k)
	if !ok {
		return 0
	}
	v, neg, err := s.integer()
	if !b.check(k, err) {
		return 0
	}
	if neg {
		b.fail(ReasonOutOfRange, k, fmt.Sprintf("%d is negative", int64(v)))
		return 0
	}
	return v
}

func (b *body) int(k string, lo, hi int64) int {
	s, ok := b.get(k)
	if !ok {
		return 0
	}
	v, neg, err := s.integer()
	if !b.check(k, err) {
		return 0
	}
	if (!neg && v > uint64(hi)) || int64(v) < lo {
		if neg {
			b.fail(ReasonOutOfRange, k, fmt.Sprintf("%d not in [%d, %d]", int64(v), lo, hi))
		} else {
			b.fail(ReasonOutOfRange, k, fmt.Sprintf("%d not in [%d, %d]", v, lo, hi))
		}
		return 0
	}
	return int(int64(v))
}

func (b *body) pages(k string) []uint32 {
	raw := b.binMax(k, 4*MaxPages)
	if b.err != nil {
		return nil
	}
	p, ok := pagesFromBin(raw)
	if !ok {
		b.fail(ReasonOutOfRange, k, fmt.Sprintf("%d bytes is not a whole number of uint32", len(raw)))
	}
	return p
}

// array returns a scanner positioned after field k's array header and the
// element count; ok is false on failure.
// The element count is checked against limit before anything is allocated
// for the elements.
func (b *body) array(k string, limit int) (scanner, int, bool) {
	s, ok := b.get(k)
	if !ok {
		return s, 0, false
	}
	n, err := s.expect(mpArray)
	if !b.check(k, err) {
		return s, 0, false
	}
	if n > limit {
		b.fail(ReasonOutOfRange, k, fmt.Sprintf("%d elements exceed %d", n, limit))
		return s, 0, false
	}
	return s, n, true
}

func (b *body) pageLists(k string) [][]uint32 {
	s, n, ok := b.array(k, MaxStateLists)
	if !ok {
		return nil
	}
	out := make([][]uint32, 0, n)
	for i := 0; i < n; i++ {
		if l, err := s.peekLen(mpBin); err == nil && l > 4*MaxPages {
			b.fail(ReasonOutOfRange, elem(k, i), fmt.Sprintf("%d bytes exceeds %d", l, 4*MaxPages))
			return nil
		}
		raw, err := s.bin()
		if err != nil {
			b.check(elem(k, i), err)
			return nil
		}
		p, ok := pagesFromBin(raw)
		if !ok {
			b.fail(ReasonOutOfRange, elem(k, i), fmt.Sprintf("%d bytes is not a whole number of uint32", len(raw)))
			return nil
		}
		out = append(out, p)
	}
	return out
}

// nested parses field key (element index of it, or −1) as a map.
func (b *body) nested(key string, index int, raw []byte) *body {
	if b.err != nil {
		return nil
	}
	name := func() string {
		if index < 0 {
			return key
		}
		return elem(key, index)
	}
	s := &scanner{b: raw}
	k, err := s.kind()
	if err == nil && k != mpMap {
		b.fail(ReasonWrongType, name(), (&typeError{mpMap, k}).Error())
		return nil
	}
	nb, err := parseMap(raw)
	if err != nil {
		b.fail(ReasonBody, name(), err.Error())
		return nil
	}
	nb.parent, nb.key, nb.index = b, key, index
	return nb
}

func (b *body) regions(k string) []Region {
	s, n, ok := b.array(k, MaxRegions)
	if !ok {
		return nil
	}
	out := make([]Region, 0, n)
	for i := 0; i < n; i++ {
		raw, err := s.raw()
		if err != nil {
			b.check(elem(k, i), err)
			return nil
		}
		r := b.nested(k, i, raw)
		if r == nil {
			return nil
		}
		reg := Region{Addr: r.uint("addr"), Len: r.uint("len"), ItemLen: r.uint("item_len"),
			Dev: r.int("dev", 0, math.MaxInt32), Mem: r.str("mem")}
		if r.err == nil && reg.Mem != MemDRAM && reg.Mem != MemVRAM {
			r.fail(ReasonOutOfRange, "mem", fmt.Sprintf("%q", reg.Mem))
		}
		if r.err == nil && reg.ItemLen == 0 {
			r.fail(ReasonOutOfRange, "item_len", "0")
		}
		if r.err == nil && reg.Addr > math.MaxUint64-reg.Len {
			r.fail(ReasonOutOfRange, "len", "region wraps the address space")
		}
		rerr := r.err
		r.release()
		if rerr != nil {
			b.err = rerr
			return nil
		}
		out = append(out, reg)
	}
	return out
}

// optBool reads an optional boolean field (false when it is missing).
func (b *body) optBool(k string) bool {
	if _, ok := b.lookup(k); !ok || b.err != nil {
		return false
	}
	return b.boolean(k)
}

// optUint reads an optional unsigned integer field (0 when it is missing).
func (b *body) optUint(k string) uint64 {
	if _, ok := b.lookup(k); !ok || b.err != nil {
		return 0
	}
	return b.uint(k)
}

// optInt reads an optional integer field (absent when it is missing).
func (b *body) optInt(k string, lo, hi int64, absent int) int {
	if _, ok := b.lookup(k); !ok || b.err != nil {
		return absent
	}
	return b.int(k, lo, hi)
}

// topo reads the optional topology map of a REGISTER.
func (b *body) topo(k string) *Topo {
	raw, ok := b.lookup(k)
	if !ok || b.err != nil {
		return nil
	}
	t := b.nested(k, -1, raw)
	if t == nil {
		return nil
	}
	v := &Topo{PPSize: t.int("pp_size", 1, MaxRanks), DPSize: t.int("dp_size", 1, MaxRanks),
		Layers: t.int("layers", 1, MaxRanks), KVHeads: t.int("kv_heads", 1, MaxRanks),
		HeadBytes: t.int("head_bytes", 1, 1<<20), PageTokens: t.int("page_tokens", 1, 1<<20),
		MLA: t.boolean("mla"), PageLayout: t.str("page_layout"),
		PeerTPSize: t.optInt("peer_tp_size", 0, MaxRanks, 0), PeerPPSize: t.optInt("peer_pp_size", 0, MaxRanks, 0)}
	v.PPRank = t.int("pp_rank", 0, int64(max(v.PPSize-1, 0)))
	v.DPRank = t.int("dp_rank", 0, int64(max(v.DPSize-1, 0)))
	if t.err == nil && v.PageLayout != "NHD" && v.PageLayout != "HND" {
		t.fail(ReasonOutOfRange, "page_layout", fmt.Sprintf("%q", v.PageLayout))
	}
	err := t.err
	t.release()
	if err != nil {
		b.err = err
		return nil
	}
	return v
}

func (b *body) from() From {
	s, ok := b.get("from")
	if !ok {
		return From{}
	}
	if m := b.memo; m != nil && bytes.Equal(m.raw, s.b) {
		// parseMap's find (its bytes, once more: a body may repeat the key).
		if sl := &fromMemos[m.slot]; sl.misses.Load() != 0 {
			sl.misses.Store(0)
		}
		return m.v
	}
	i := fromSlot(s.b)
	slot := &fromMemos[i]
	m := slot.m.Load()
	if m != nil && bytes.Equal(m.raw, s.b) {
		if slot.misses.Load() != 0 {
			slot.misses.Store(0)
		}
		lastFromSlot.Store(int32(i))
		return m.v // these very bytes read before: the same value
	}
	if v, ok := fastFrom(s.b); ok {
		if m == nil || slot.misses.Add(1) >= fromReplaceAfter {
			slot.m.Store(newFromMemo(s.b, v, i))
			slot.misses.Store(0)
			lastFromSlot.Store(int32(i))
		}
		return v
	}
	return b.slowFrom(s.b)
}

// fromMemos remember from maps read, by fromSlot, with the value each
// read as: a receive loop's messages come in runs from a few sender
// processes, whose from is the same bytes each time (OwnFrom), and a
// remembered one costs a compare instead of a read. Only a well-formed
// map is remembered (fastFrom's), under its exact bytes: a hit is what
// reading them would give (TestFromMemoAgrees). A slot's memo gives way
// to another map only after fromReplaceAfter misses in a row with no hit
// between, so senders that take turns on one slot cost no allocation a
// message (TestFromMemoTurnsAllocateNothing). Any process's decoders
// share them; a stranger's maps only take slots.
var fromMemos [64]fromMemoSlot

type fromMemoSlot struct {
	m      atomic.Pointer[fromMemo]
	misses atomic.Int32 // since the memo last answered
}

// fromReplaceAfter is how many misses in a row replace a slot's memo.
const fromReplaceAfter = 4

// lastFromSlot is the slot of the from map remembered last: parseMap
// tries its memo first.
var lastFromSlot atomic.Int32

type fromMemo struct {
	raw  []byte
	v    From
	slot int
	buf  [96]byte // raw, where it fits
}

func newFromMemo(raw []byte, v From, slot int) *fromMemo {
	m := &fromMemo{v: v, slot: slot}
	m.raw = append(m.buf[:0], raw...)
	return m
}

// fromSlot picks a from map's slot by its last byte: bits 1 to 6 of the
// epoch (NewEpoch's random bits; bit 0 is always set).
func fromSlot(raw []byte) int {
	if len(raw) == 0 {
		return 0
	}
	return int(raw[len(raw)-1]>>1) & (len(fromMemos) - 1)
}

// fastFrom reads a well-formed from map in one pass, as every message
// carries one: each of its five fields once, of its type and in range,
// other keys skipped. Anything else — a field missing or repeated, a wrong
// type, a value out of range, a malformed value — is left to slowFrom,
// which names what is wrong (ok false); where ok, the result is slowFrom's
// (TestFastFromAgrees).
func fastFrom(raw []byte) (v From, ok bool) {
	s := scanner{b: raw}
	if k, err := s.kind(); err != nil || k != mpMap {
		return From{}, false
	}
	_, n, err := s.header()
	if err != nil {
		return From{}, false
	}
	var seen uint8
	for range n {
		kn, err := s.expect(mpStr)
		if err != nil {
			return From{}, false
		}
		key := s.b[s.off : s.off+kn]
		s.off += kn
		var bit uint8
		switch string(key) {
		case "role":
			bit = 1
			sn, err := s.expect(mpStr)
			if err != nil {
				return From{}, false
			}
			switch string(s.b[s.off : s.off+sn]) {
			case RolePrefill:
				v.Role = RolePrefill
			case RoleDecode:
				v.Role = RoleDecode
			default:
				return From{}, false
			}
			s.off += sn
		case "instance", "endpoint":
			sn, err := s.expect(mpStr)
			if err != nil || sn > MaxNameBytes {
				return From{}, false
			}
			name := names.intern(s.b[s.off : s.off+sn])
			s.off += sn
			if key[0] == 'i' {
				bit, v.Instance = 2, name
			} else {
				bit, v.Endpoint = 4, name
			}
		case "rank":
			bit = 8
			r, neg, err := s.integer()
			if err != nil || neg || r > math.MaxInt32 {
				return From{}, false
			}
			v.Rank = int(r)
		case "epoch":
			bit = 16
			e, neg, err := s.integer()
			if err != nil || neg {
				return From{}, false
			}
			v.Epoch = e
		default:
			if err := s.skip(); err != nil {
				return From{}, false
			}
		}
		if seen&bit != 0 {
			return From{}, false // repeated: the first one wins, as slowFrom reads it
		}
		seen |= bit
	}
	if seen != 31 || s.remaining() != 0 || v.Endpoint == "" {
		return From{}, false
	}
	return v, true
}

// slowFrom reads a from map field by field, naming what is wrong.
func (b *body) slowFrom(raw []byte) From {
	f := b.nested("from", -1, raw)
	if f == nil {
		return From{}
	}
	defer f.release()
	v := From{Role: f.role("role"), Instance: f.name("instance"), Rank: f.int("rank", 0, math.MaxInt32),
		Endpoint: f.name("endpoint"), Epoch: f.uint("epoch")}
	if f.err == nil && v.Role != RolePrefill && v.Role != RoleDecode {
		f.fail(ReasonOutOfRange, "role", fmt.Sprintf("%q", v.Role))
	}
	if f.err == nil && v.Endpoint == "" {
		f.fail(ReasonOutOfRange, "endpoint", "empty")
	}
	if f.err != nil {
		b.err = f.err
	}
	return v
}

// salvage fills the room and endpoint of a malformed message where the body
// still yields them.
func (b *body) salvage(e *MalformedError) {
	if raw, ok := b.lookup("room"); ok {
		s := &scanner{b: raw}
		if v, neg, err := s.integer(); err == nil && !neg {
			e.Room, e.HasRoom = v, true
		}
	}
	if raw, ok := b.lookup("from"); ok {
		if f, err := parseMap(raw); err == nil {
			if ep, ok := f.lookup("endpoint"); ok {
				s := &scanner{b: ep}
				if v, err := s.str(); err == nil {
					e.Endpoint = v
				}
			}
			f.release()
		}
	}
}
