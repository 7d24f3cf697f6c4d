// Package ucx is kvbridge's ucx engine: it drives libucp directly, under the
// agents of internal/nixl, without NIXL. Importing it registers the engine
// (nixl.EngineUCX) with internal/nixl, which depends on no engine package;
// kvmanager imports it, so every Manager can open it.
//
// libucp is loaded at run time at the first ucx agent (Config.UCXLib —
// FromEnv: KVBRIDGE_UCX_LIB —, default libucp.so.0) through this package's
// own declaration of the UCP ABI it uses (ucx_abi.h, checked against
// installed headers by its test): building needs no UCX, and a process
// that only uses libnixl maps only NIXL's UCX. The UCX settings it decides
// on, TLS, UNIFIED_MODE and ADAPTIVE_PROGRESS, come from Config.UCX alone
// (FromEnv: UCX_TLS, UCX_UNIFIED_MODE, UCX_ADAPTIVE_PROGRESS); VRAM goes
// through the CUDA driver Config.CUDALib names (FromEnv:
// KVBRIDGE_CUDA_LIB). DRAM over shared memory and tcp here, RDMA where the
// hardware is. Writes into peer memory that a shared-memory transport maps
// into this process are plain copies; otherwise one put per descriptor, a
// flush, then the notification as an active message, so it never
// overtakes the data. Over tcp, writes and reads are the engine's own
// acknowledged active messages (ucx_engine.c).
//
// A peer's metadata is checked before UCX parses any of it: its packed
// worker address and every region's packed rkey, walked as UCX's own
// parsers walk them (internal/nixl's addrcheck.go, which the libnixl engine
// uses too), and a peer in this process against the agent it names.
package ucx

import "github.com/kvbridge/kvbridge/internal/nixl"

func init() { nixl.RegisterEngine(nixl.EngineUCX, openUCX) }

// The Agent's reports the engine backs (nixl.Agent.WritesRefused,
// RemoteUsable), checked here: a method renamed would silently report
// nothing.
var (
	_ nixl.WriteRefuser      = (*ucx)(nil)
	_ nixl.RemoteChecker     = (*ucx)(nil)
	_ nixl.Backend           = (*ucx)(nil)
	_ nixl.ProgressSignaller = (*ucx)(nil)
)
