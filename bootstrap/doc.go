// Package bootstrap is kvbridge's control plane: the ZeroMQ control loop
// each rank runs, the embedded HTTP bootstrap server (the prefill rank
// table) with its client, and optional CURVE security. The PROTOCOL.md
// messages and their codec are package internal/wire's.
// It reports events; it never decides room state (that is kvmanager's job).
//
// # Control loop
//
//	auth, err := bootstrap.NewAuth(secret) // the deployment's shared secret (KVBRIDGE_SECRET)
//	l, err := bootstrap.NewLoop(bootstrap.LoopConfig{
//		Identity:   wire.From{Role: wire.RoleDecode, Instance: "decode-a", Rank: 0},
//		Bind:       "tcp://0.0.0.0:17100",
//		Handler:    func(m wire.Message) { /* hand to the manager; must not block */ },
//		OnPeerDown: func(p bootstrap.PeerDown) { /* fail rooms shared with p */ },
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
// # Bootstrap server
//
// Server implements PUT /v1/ranks, GET /v1/topology (503 until every prefill
// rank has registered), GET /v1/ranks?dp=&tp=&pp= and GET /healthz. Client
// retries transient failures with jittered backoff until its context ends.
//
// # Security
//
// Set LoopConfig.Security (or build it with SecurityFromEnv from
// KVBRIDGE_CURVE_* variables) to make every PULL socket a CURVE server that
// admits only allow-listed client keys, checked by a ZAP handler the loop
// owns; refused peers are counted and never reach the Handler.
package bootstrap
