// Package nixl configures the transfer engine under kvbridge: which engine
// moves the bytes — libnixl (the NIXL C API, libnixl_capi.so, loaded at
// run time: the production path on GPU nodes), ucx (libucp directly), or
// loopback (in-process copies, for tests) —, where their libraries are,
// what progresses a libnixl agent, and the two errors a Manager's
// start-up wraps when the engine does not load or cannot do what the
// Config asks. kvmanager.Config.Engine is a Config; the agents themselves are
// kvbridge's own (internal/nixl), opened by the Manager.
//
// The library reads no environment variable: Config.FromEnv, which the
// example binaries call, fills a Config's library paths and the UCX
// settings the ucx engine decides on from the environment.
// docs/ENGINES.md has each engine's behaviour and limits.
package nixl
