// Command prefill is an example prefill rank: it registers with the
// bootstrap server (or serves one with -serve-bootstrap), and on POST
// /v1/room {room, tokens} fills the room's pages with a deterministic
// pattern and sends them to the decode rank that asked for the room.
// GET /metrics and /healthz are served on the same -http address.
package main

import (
	"os"

	"github.com/kvbridge/kvbridge/internal/rankcmd"
	"github.com/kvbridge/kvbridge/kvmanager"
)

func main() { os.Exit(rankcmd.Main(kvmanager.RolePrefill, os.Args[1:])) }
