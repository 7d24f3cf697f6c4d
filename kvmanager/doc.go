// Package kvmanager owns the room registry of a rank: the per-room status,
// the decode ranks' pending requests, tombstones, failure reasons, deadlines
// and waiters. The Manager that wires the registry to the control plane and
// the data plane joins it in a later step.
//
// The Registry is a core in the etcd raft style: one struct behind one
// mutex, events in and explicit outcomes out, time from an injected clock
// and from Sweep's argument. It makes the Python connectors' lost-request
// bugs impossible by construction:
//
//   - an abort that arrives before the sender exists leaves an AbortedEarly
//     tombstone, and the sender created later starts Failed with the abort's
//     reason;
//   - a late event never resurrects a cleared room (a Cleared tombstone), and
//     a room id reused within the tombstone TTL is refused with
//     ErrRoomCleared;
//   - Failed and Success are absorbing until Clear, other statuses never go
//     backwards, and the first failure reason wins;
//   - every live room and every pending request has a deadline that Sweep
//     enforces, and tombstones expire, so nothing is pinned and the registry
//     empties.
//
// # Usage
//
// The prefill side, with decode's request arriving first:
//
//	reg, _ := kvmanager.NewRegistry(kvmanager.DefaultRegistryConfig())
//	reg.Request(room, kvmanager.PeerRequest{Peer: "decode-0", Required: 1}) // Pending
//	reg.Create(room, kvmanager.RolePrefill)                                 // Bootstrapping
//	reg.Init(room)                                                          // WaitingForInput
//	if reg.Posted(room).Outcome == kvmanager.Applied {                      // gate every write
//		// post the chunk, then:
//		reg.WriteDone(room, true, nil) // Success
//	}
//	reg.Clear(room)
//
// Call Sweep(time.Now()) periodically (the Manager does it once a second);
// it returns the rooms it failed and the pending requests it dropped, so the
// caller can tell their peers.
package kvmanager
