package wire

import "errors"

// Peer is where a message goes: a rank's control endpoint and, with
// security on, its CURVE server public key.
type Peer struct {
	Endpoint  string
	ServerKey string
	// Cert is the peer's identity certificate (raw bytes) where the caller
	// knows it from a bootstrap record: required under per-rank identity
	// for a peer that has not sent this rank anything yet.
	Cert string
	// Epoch is the peer process's epoch where the caller knows it (a
	// bootstrap record, a REGISTER_ACK): the message is addressed to it,
	// or to a newer one this rank heard at the endpoint.
	Epoch uint64
}

// Reasons: a peer heartbeats declared dead, and the core's for a peer
// heard with a new epoch.
const (
	ReasonPeerUnreachable = "peer unreachable"
	ReasonPeerRestarted   = "peer restarted"
)

// ErrRankUnknown: the server has no rank at those coordinates (404).
var ErrRankUnknown = errors.New("bootstrap: prefill rank unknown")
