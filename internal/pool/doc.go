// Package pool is the prefill rank's worker pool. Every chunk of a room
// goes to the same worker, which posts the room's writes in order, one at a
// time, and keeps writes of up to Config.InFlight rooms posted at once,
// taking rooms in turn chunk by chunk (a long room does not hold short ones
// back) and learning of completions from the agent (nixl.Agent.PostTo), not
// by polling. Writes are made by index from descriptor lists prepared once
// per side (prepared.go): every page of every layer's K and V region, the
// aux items and the state items, and head-slice pieces per slice shape; the
// local lists at the first write, a peer's when it registers
// (Pool.PreparePeer). A chunk's pages, grouped into runs contiguous on both
// sides (Runs), become index pairs over every region, with the chunk's
// PROTOCOL.md notification; the aux item is a write of its own. A Gate
// called before every post lets the room registry drop the writes of a
// failed room, and a stall deadline bounds each write in flight. A
// decode rank's pull reads (Read) go through a pool of their own the same
// way, given to the workers in turn (they need no order): a worker
// prepares, gates and posts each, and learns of its
// completions as of a write's.
//
//	p, _ := pool.NewPool(agent, localLayout, pool.Config{Workers: 4})
//	p.PreparePeer(remoteAgent, peerLayout)
//	p.Submit(pool.Job{Room: 7, Writes: writes, Gate: gate, Done: done})
//	p.Close()
package pool
