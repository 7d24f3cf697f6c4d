// Package wire is kvbridge's control protocol on the wire: the messages
// (REGISTER, REGISTER_ACK, REQUEST, ABORT, ABORT_ACK, STATUS, PING, PONG),
// their msgpack codec with its bounds, and where a message goes (Peer).
// It is plain Go (no cgo, no ZeroMQ), shared by the protocol core and the
// control loop; package bootstrap exports it.
package wire
