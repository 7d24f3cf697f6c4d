package bootstrap

// The control messages and their codec are package wire's (internal,
// cgo-free, shared with the protocol core); bootstrap exports them.

import "github.com/kvbridge/kvbridge/internal/wire"

// Abort is sent decode → prefill at any time.
type Abort = wire.Abort

// AbortAck confirms an aborted room has no write in flight.
type AbortAck = wire.AbortAck

// Pages publishes one chunk of a pull room to the decode rank (prefill →
// decode).
type Pages = wire.Pages

// PullOffer is a prefill rank's memory for decode ranks to read, sent with
// an ok REGISTER_ACK (its metadata and proof seed sealed).
type PullOffer = wire.PullOffer

// Renew asks the prefill rank to extend a pull room's lease (decode →
// prefill).
type Renew = wire.Renew

// ReadDone reports a decode rank's reads of a pull room over (decode →
// prefill).
type ReadDone = wire.ReadDone

// From identifies the sender of every message.
type From = wire.From

// MalformedError says why a message was dropped. Where the body still
// yielded a room and the sender's endpoint, they are set, so a prefill rank
// can answer a malformed REQUEST with STATUS failed.
type MalformedError = wire.MalformedError

// Message is one decoded control message.
type Message = wire.Message

// MsgType is frame 1 of a message.
type MsgType = wire.MsgType

// Ping and Pong are the heartbeat.
type Ping = wire.Ping

// Pong answers Ping with the same Seq.
type Pong = wire.Pong

// Region is one registered memory region.
type Region = wire.Region

// Register is sent decode → prefill once per peer pair.
type Register = wire.Register

// RegisterAck answers Register.
type RegisterAck = wire.RegisterAck

// Request asks a prefill rank for one room's KV.
type Request = wire.Request

// Status reports a room's failure (or success summary) prefill → decode.
type Status = wire.Status

// Topo is a rank's parallel shape beyond TP and the model facts of the
// rank mapping (PROTOCOL.md "Topologies").
type Topo = wire.Topo

// Magic is frame 0 of every message (PROTOCOL.md, version 1).
const Magic = wire.Magic

// MaxAgentMDBytes bounds REGISTER's agent metadata.
const MaxAgentMDBytes = wire.MaxAgentMDBytes

// MaxBodySize is the largest body a rank accepts; the socket refuses larger.
const MaxBodySize = wire.MaxBodySize

// MaxNameBytes bounds role, instance, endpoint, compat, agent, status,
// code and mem.
const MaxNameBytes = wire.MaxNameBytes

// MaxPages bounds dst_pages and each state index list.
const MaxPages = wire.MaxPages

// MaxProofBytes bounds REGISTER's ownership proof (32 bytes, sealed).
const MaxProofBytes = wire.MaxProofBytes

// MaxRanks bounds ranks, sizes, layers and heads in topologies.
const MaxRanks = wire.MaxRanks

// MaxReasonBytes bounds a reason.
const MaxReasonBytes = wire.MaxReasonBytes

// MaxRegions bounds each of REGISTER's region lists.
const MaxRegions = wire.MaxRegions

// MaxStateLists bounds state_indices.
const MaxStateLists = wire.MaxStateLists

const MemDRAM = wire.MemDRAM

const MemVRAM = wire.MemVRAM

const ReasonBody = wire.ReasonBody

const ReasonFrames = wire.ReasonFrames

const ReasonMagic = wire.ReasonMagic

const ReasonMissingField = wire.ReasonMissingField

const ReasonOutOfRange = wire.ReasonOutOfRange

const ReasonType = wire.ReasonType

const ReasonWrongType = wire.ReasonWrongType

const RoleDecode = wire.RoleDecode

const RolePrefill = wire.RolePrefill

const StatusFailed = wire.StatusFailed

const StatusSuccess = wire.StatusSuccess

const TypeAbort = wire.TypeAbort

const TypeAbortAck = wire.TypeAbortAck

const TypePing = wire.TypePing

const TypePong = wire.TypePong

const TypeRegister = wire.TypeRegister

const TypeRegisterAck = wire.TypeRegisterAck

const TypeRequest = wire.TypeRequest

const TypeStatus = wire.TypeStatus

const TypePages = wire.TypePages

const TypeRenew = wire.TypeRenew

const TypeReadDone = wire.TypeReadDone

// MalformedReasons lists every reason, for metrics and tests.
var MalformedReasons = wire.MalformedReasons

// CutReason returns s cut to at most n bytes without splitting a UTF-8
// sequence, marked with "…" when cut.
func CutReason(s string, n int) string { return wire.CutReason(s, n) }

// Decode parses the frames of one message. Any error is a *MalformedError;
// Decode never panics.
func Decode(frames [][]byte) (Message, error) { return wire.Decode(frames) }

// Encode returns the three frames of m. Keys are written in a fixed order,
// so the bytes are deterministic (see testdata/golden).
func Encode(m Message) ([][]byte, error) { return wire.Encode(m) }
