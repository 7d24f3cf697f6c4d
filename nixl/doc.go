// Package nixl is the Go face of NIXL: agents, memory registration,
// metadata blobs, prepared descriptor lists, transfer requests by index, and
// notifications. It knows nothing about rooms or requests.
//
// # Engines
//
//   - libnixl: the NIXL C API (libnixl_capi.so), declared in this package
//     and loaded at run time from Config.NIXLLib, $KVBRIDGE_NIXL_LIB or the
//     loader's path (libnixl.so beside it is loaded first, RTLD_GLOBAL). The
//     production path on GPU nodes. Tested against a C test double of the
//     API (testdata/nixl_double) that the tests build with gcc.
//   - ucx: libucp directly (Debian's libucx). DRAM over shared memory and
//     tcp here, RDMA where the hardware is. Writes into peer memory that a
//     shared-memory transport maps into this process are plain copies;
//     otherwise one put per descriptor, a flush, then the notification as an
//     active message, so it never overtakes the data.
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
//	for st, err := a.Status(x); st == nixl.InProgress; st, err = a.Status(x) { ... }
//
// Every descriptor is checked against registered memory (this agent's, or
// the remote's from its metadata) before an engine sees it: a descriptor
// outside is ErrInvalidDescriptor, never a wild write. A transfer still in
// progress after Config.XferTimeout fails with ErrTimeout, so a dead peer
// never hangs a caller.
package nixl
