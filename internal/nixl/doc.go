// Package nixl (internal: kvbridge's own; the public package nixl holds its
// Config and errors) is the Go face of NIXL: agents, memory registration,
// metadata blobs, prepared descriptor lists, transfer requests by index, and
// notifications. It knows nothing about rooms or requests.
//
// # Engines
//
//   - libnixl: the NIXL C API (libnixl_capi.so), declared in this package
//     and loaded at run time from Config.NIXLLib (Config.FromEnv sets it
//     from $KVBRIDGE_NIXL_LIB) or the loader's path (libnixl.so beside it is loaded first, RTLD_GLOBAL). The
//     production path on GPU nodes. Agents are created configured, in the
//     progress mode Config.NIXLProgress names: NIXL's progress thread,
//     which sleeps on the worker's events (Config.NIXLProgressDelay), and
//     NIXL's read-write lock — what an agent that is written to needs — or
//     no thread and NIXL's strict lock, progressed by the agent's own
//     calls — what an agent that posts needs on NIXL <= 1.4.0, whose
//     thread crashes a poster whose peer dies. Tested against a C test double of the API
//     (internal/nixldouble) and, with make test-nixl, a real NIXL.
//   - ucx: libucp directly, in a package of its own (internal/nixl/ucx),
//     which registers it with this package when imported (kvmanager
//     does); its package documentation has its settings and behaviour.
//   - loopback: agents in one process, a write is a copy.
//
// Open with EngineAuto picks libnixl when it loads, else ucx; the error says
// when NIXL is not installed.
//
// # Usage
//
//	a, _ := nixl.Open(nixl.Config{Name: "prefill-0", Engine: nixl.EngineUCX})
//	defer a.Close()
//	reg, kv, _ := a.Alloc(1 << 30)                  // or RegisterBytes / Register
//	peer, _ := a.LoadRemote(decodeMetadata)          // from the peer's Metadata()
//	local, _ := a.PrepLocal(nixl.DRAM, []nixl.Desc{nixl.BytesDesc(kv[:32768])})
//	remote, _ := a.PrepRemote(peer, nixl.DRAM, decodePages)
//	x, _ := a.NewXfer(nixl.Write, local, []int{0}, remote, []int{0}, []byte("kvb1:7:0:0:1"))
//	a.Post(x)
//	st, err := a.Wait(ctx, x) // or select on x.Done(); a.Status(x) does not block
//
// Each agent runs a completion watcher: it polls the engine for the
// transfers in flight (woken by the engine where it can signal), settles
// them, and so also drives NIXL's UCX backend, which sends a write's
// notification only when the initiator asks for the transfer's status. A
// notification is therefore delivered whether or not anyone waits.
//
// A peer's metadata blob is checked before an engine parses any of it
// (ErrBadMetadata with the reason, naming the peer; Agent.MetadataRefused
// counts them): the blob's version and the peer's engine library release
// ("ucx/1.13.1": the same major and minor release as this agent's), then,
// for the ucx engine, the whole packed UCX worker address and every region's
// packed rkey, walked as UCX's own parsers walk them and checked field by
// field for the transports this process runs (addrcheck.go), and for the
// libnixl engine the UCX worker address in NIXL's own blob (nixlmd.go). A
// blob UCX would misread, or that would make it map or write memory other
// than the peer's, is refused instead of aborting the process.
//
// Every descriptor is checked against registered memory (this agent's, or
// the remote's from its metadata) before an engine sees it: a descriptor
// outside is ErrInvalidDescriptor, never a wild write. A transfer still in
// progress after Config.XferTimeout fails with ErrTimeout, so a dead peer
// never hangs a caller.
package nixl
