// Package kvmanager runs a rank's protocol: Prefill and Decode, the two
// shells around the pure protocol core (internal/core) that owns every
// piece of room and peer state of the rank.
//
// The core is modelled on etcd-io/raft's RawNode: no goroutines, no locks, no
// clock, no I/O. Inputs are steps taken at a given time — local calls
// (create, init, send a chunk, abort, clear), received control messages,
// the gate before each write and its completion (with whether a failed
// write can still land), notifications, target lookups, peer down or
// restart reports, ticks — and outputs are Effects: send this message, post
// these writes, wake this waiter, look this target up, watch this peer,
// these pages may be reused. Its room table, the Registry, keeps per room a
// live entry, pending requests, or a tombstone (which also carries the
// writes a cleared room may still have in flight and the ABORT_ACKs it
// owes). The rest of the core binds registrations to peer epochs and keeps
// decode's per-source accounting and page holds. Because it is pure,
// several cores compose over a simulated network in one test process
// (internal/core's sim_test.go): every interleaving of small configurations and many
// seeded random runs are checked against the invariants of
// docs/ARCHITECTURE.md.
//
// The shells own the goroutines, the control loop, the agent and the
// transfer pool; they serialise steps into the core under one mutex and
// carry out its effects. The role is part of the type: package sender takes
// a *Prefill, package receiver a *Decode.
//
// # Usage
//
//	prefill, _ := kvmanager.NewPrefill(cfg) // cfg from DefaultConfig(RolePrefill)
//	decode, _ := kvmanager.NewDecode(dcfg)  // dcfg.BootstrapURL: where prefill ranks are listed
//	defer prefill.Close()
//	defer decode.Close()
//
// then one sender.Sender and one receiver.Receiver per room (the README's
// "A prefill and a decode rank in one program"). The statuses, request
// spec, load reports and errors an engine sees are defined here and
// carried to and
// from the protocol core (internal/core); a rank's counters are its
// metrics (Config.Registerer, docs/METRICS.md).
package kvmanager
