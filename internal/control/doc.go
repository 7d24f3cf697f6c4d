// Package control is a rank's control loop: the ZeroMQ sockets that carry
// the PROTOCOL.md messages (encoded by internal/wire) between ranks, their
// envelopes — authenticated with the deployment's shared secret
// (bootstrap.Auth), addressed to one process of one rank, numbered against
// replays, and under per-rank identity (ident.RankIdentity) keyed and
// sealed per pair of ranks —, heartbeats, optional CURVE encryption
// (bootstrap.Security) and the loop's counters and metrics. It reports
// events; it never decides room state (that is the protocol core's and
// kvmanager's job). It sits above package bootstrap, whose credentials it
// uses, and below kvmanager, which runs one Loop per rank.
//
// # Control loop
//
//	auth, err := bootstrap.NewAuth(secret) // the deployment's shared secret (KVBRIDGE_SECRET)
//	l, err := control.NewLoop(control.LoopConfig{
//		Identity:   wire.From{Role: wire.RoleDecode, Instance: "decode-a", Rank: 0},
//		Bind:       "tcp://0.0.0.0:17100",
//		Handler:    func(m wire.Message) { /* hand to the manager; must not block */ },
//		OnPeerDown: func(p control.PeerDown) { /* fail rooms shared with p */ },
//		Auth:       auth, // heartbeats and queues: DefaultLoopConfig's where left zero
//	})
//	defer l.Close()
//	// The peer's epoch comes with its bootstrap record (RankInfo.Epoch).
//	prefill := wire.Peer{Endpoint: info.Endpoint, Epoch: info.Epoch}
//	l.Send(prefill, &wire.Abort{Room: 7, Reason: "client left"})
//	l.Watch(prefill) // heartbeats while rooms are shared
//
// Example_controlLoop runs the same between two loops.
//
// Send runs on the caller's goroutine, on the peer's socket under the peer's
// lock (no hand-off), and never blocks: a peer that cannot take more gets a
// bounded, ordered backlog, retried by the heartbeat goroutine, and then
// drops (counted), so a dead peer never delays another.
//
// # Envelopes
//
// auth.go writes and checks a message's envelope (tagged with the secret,
// or under per-rank identity sealed with the pair's key); address.go holds
// the receiver's tables: where each peer is, the pair keys of certified
// peers, and the windows of message numbers received. Seal, Open, SealAs,
// OpenAs and SealAgentMD speak the protocol without a Loop, for tools and
// tests.
//
// # Security
//
// Set LoopConfig.Security (bootstrap.SecurityFromEnv reads it from the
// KVBRIDGE_CURVE_* variables) to make every PULL socket a CURVE server that
// admits only allow-listed client keys, checked by a ZAP handler the loop
// owns; refused peers are counted and never reach the Handler.
package control
