package nixl

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	"github.com/kvbridge/kvbridge/internal/cuda"
)

// Errors a Manager's start-up may wrap: the engine asked for does not
// load, or cannot do what the Config asks (VRAM without a CUDA driver).
// The agents' other failures are internal/nixl's.
var (
	ErrEngineUnavailable = errors.New("nixl: engine unavailable")
	ErrUnsupported       = errors.New("nixl: not supported by this engine")
)

// Engines.
const (
	EngineAuto     = ""         // libnixl if it loads, else ucx
	EngineLibNIXL  = "libnixl"  // the NIXL C API, loaded at run time
	EngineUCX      = "ucx"      // libucp directly
	EngineLoopback = "loopback" // in-process copies
)

// NIXLProgress is what progresses a libnixl agent's UCX worker: what
// wires up its endpoints, receives its notifications, acknowledges a
// peer's, and lands writes whose transport emulates them (tcp). On NIXL
// 1.4.0 a write with a notification completes only once the target's
// worker has run after it (the notification's acknowledgement), and a
// GenNotif is sent only when the sender's worker runs again.
type NIXLProgress int

const (
	// NIXLProgressThread: NIXL's progress thread, woken by the worker's
	// events (NIXLProgressDelay bounds its sleep), and NIXL's read-write
	// lock. What an agent that peers write to needs: writes to it complete
	// whatever its caller does, and it costs about nothing when idle.
	// UNSAFE on NIXL <= 1.4.0 for an agent that posts or sends
	// notifications to a peer that may die: the UCX backend's endpoint
	// error callback, run on that thread, frees the endpoint while a
	// concurrent post uses it (SIGSEGV in ucp_put_nbx; fixed in NIXL after
	// 1.4.0, commit 3e3e083c9).
	NIXLProgressThread NIXLProgress = 1 + iota
	// NIXLProgressCaller: no progress thread and NIXL's strict lock; the
	// agent's own calls progress it — the completion watcher's status
	// polls while transfers are in flight, a GenNotif's flusher, Notifs.
	// For an agent that posts (a prefill rank): the error callback then
	// runs only inside a call the lock keeps apart from every post. Writes
	// TO such an agent stall unless its Notifs is called while they are
	// expected.
	NIXLProgressCaller
)

func (p NIXLProgress) String() string {
	switch p {
	case NIXLProgressThread:
		return "thread"
	case NIXLProgressCaller:
		return "caller"
	}
	return fmt.Sprintf("NIXLProgress(%d)", int(p))
}

// ucxLibEnv names the variable FromEnv reads into Config.UCXLib.
const ucxLibEnv = "KVBRIDGE_UCX_LIB"

// Config opens an agent.
type Config struct {
	// Name is the agent's name, unique among the agents that talk to it.
	Name string
	// Engine picks the engine; EngineAuto tries libnixl, then ucx.
	Engine string
	// UCX sets UCX configuration for the ucx engine ("TLS": "posix,cma,self",
	// "NET_DEVICES": "lo", ...), applied with ucp_config_modify.
	UCX map[string]string
	// NIXLLib is the path of libnixl_capi.so; empty: the loader's search
	// path (FromEnv sets it from KVBRIDGE_NIXL_LIB).
	NIXLLib string
	// UCXLib is the path of the libucp the ucx engine loads, once per
	// process (empty: libucp.so.0 from the loader's search path, or the
	// one already in the process; FromEnv sets it from KVBRIDGE_UCX_LIB).
	// A later agent naming another is refused.
	UCXLib string
	// BackendParams are passed to NIXL's UCX backend (libnixl engine).
	BackendParams map[string]string
	// NIXLProgressDelay bounds how long NIXL's progress thread sleeps
	// between passes when no event wakes it (libnixl engine; 0:
	// 1 s). NIXL's own default, 0, spins a core.
	NIXLProgressDelay time.Duration
	// NIXLProgress says what progresses a libnixl agent's UCX worker (0:
	// NIXLProgressThread, NIXL's own default). kvmanager chooses by role:
	// the decode rank's agent, which peers write to, NIXLProgressThread;
	// the prefill rank's, which posts, NIXLProgressCaller.
	NIXLProgress NIXLProgress
	// Device is the CUDA device whose context the ucx engine uses to map
	// peers' VRAM and copy to and from it.
	Device int
	// CUDALib is the path of the CUDA driver the ucx and loopback engines
	// load at their first VRAM region, once per process (empty: the driver
	// already open, else libcuda.so.1; FromEnv sets it from
	// KVBRIDGE_CUDA_LIB). A later agent naming another is refused.
	CUDALib string
	// XferTimeout fails a transfer still in progress this long after its
	// post (0: 60 s). A dead peer never hangs a caller.
	XferTimeout time.Duration
}

// FromEnv fills what c leaves unset from the environment: NIXLLib from
// KVBRIDGE_NIXL_LIB, UCXLib from KVBRIDGE_UCX_LIB, CUDALib
// from KVBRIDGE_CUDA_LIB, and the UCX settings the
// ucx engine decides on — TLS, UNIFIED_MODE, ADAPTIVE_PROGRESS — from
// UCX_TLS, UCX_UNIFIED_MODE and UCX_ADAPTIVE_PROGRESS, each where UCX has
// no such key (into a copy of the map: one a caller shares is not
// written). The example binaries call it (kvmanager.Config.FromEnv does);
// the package itself reads no environment variable of its own.
func (c *Config) FromEnv() {
	if v := os.Getenv("KVBRIDGE_NIXL_LIB"); c.NIXLLib == "" && v != "" {
		c.NIXLLib = v
	}
	if v := os.Getenv(ucxLibEnv); c.UCXLib == "" && v != "" {
		c.UCXLib = v
	}
	if v := cuda.DriverPathFromEnv(); c.CUDALib == "" && v != "" {
		c.CUDALib = v
	}
	copied := false
	for _, k := range []string{"TLS", "UNIFIED_MODE", "ADAPTIVE_PROGRESS"} {
		v := os.Getenv("UCX_" + k)
		if _, set := c.UCX[k]; set || v == "" {
			continue
		}
		if !copied {
			c.UCX, copied = maps.Clone(c.UCX), true
			if c.UCX == nil {
				c.UCX = map[string]string{}
			}
		}
		c.UCX[k] = v
	}
}
