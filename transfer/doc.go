// Package transfer is the prefill rank's worker pool. Every chunk of a room
// goes to the same worker, so a room's writes are posted in order; a chunk's
// pages are grouped into runs contiguous on both sides (Runs) and expanded
// over every layer's K and V region (Expand) into one WRITE per peer with
// its PROTOCOL.md notification; the aux item is a write of its own. A Gate
// called before every post lets the room registry drop the writes of a
// failed room, and a stall deadline bounds each write in flight.
//
//	pool, _ := transfer.NewPool(agent, localLayout, transfer.Config{Workers: 4})
//	pool.Submit(transfer.Job{Room: 7, Writes: writes, Gate: gate, Done: done})
//	pool.Close()
package transfer
