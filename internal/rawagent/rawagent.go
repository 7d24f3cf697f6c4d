// Package rawagent hands kvbridge's own tools and tests a rank's NIXL
// agent: the same-run references of the benchmarks post through it, and
// the ownership tests read its metadata to forge a REGISTER. An engine has
// no use for it — writes posted through it would bypass the core's page
// safety — so kvmanager does not export it: its init sets Of.
package rawagent

import "github.com/kvbridge/kvbridge/internal/nixl"

// Of returns the agent of a *kvmanager.Prefill, *kvmanager.Decode or
// *kvmanager.Manager (nil for anything else).
var Of func(rank any) *nixl.Agent
