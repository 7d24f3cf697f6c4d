// Command prefill is an example prefill rank: it registers with the
// bootstrap server (or serves one with -serve-bootstrap), and on POST
// /v1/room {room, tokens} fills the room's pages with a deterministic
// pattern and sends them to the decode rank that asked for the room.
// With -compute tinyllm it serves a small Llama-architecture model instead:
// POST /v1/prefill {room, prompt} runs the forward pass into the room's
// pages (this rank's KV heads and layers) and sends them (-layerwise: layer
// group by layer group as the pass finishes them); examples/router drives it.
// The instance's first rank also serves OpenAI routes (/v1/completions,
// /v1/chat/completions) in SGLang's and vLLM's P/D wires for the whole
// instance, and by default the bootstrap server on its host's port 8998
// (the other ranks join it with -front; docs/ROUTERS.md). GET /metrics and /healthz are served on the same -http address.
package main

import (
	"os"

	"github.com/kvbridge/kvbridge/examples/internal/rankcmd"
	"github.com/kvbridge/kvbridge/kvmanager"
)

func main() { os.Exit(rankcmd.Main(kvmanager.RolePrefill, os.Args[1:])) }
