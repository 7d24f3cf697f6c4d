// Command decode is an example decode rank: on POST /v1/room {room,
// tokens} it allocates destination pages, asks the prefill rank (found
// through the bootstrap server) for the room, waits, and verifies every page
// against the pattern the prefill rank wrote. With -compute tinyllm, POST
// /v1/generate {room, prompt, max_tokens, prefill} receives the prompt's KV
// (only what a cached prefix does not cover) and streams greedily generated
// tokens; examples/router drives it. The instance's first rank also serves
// OpenAI routes (/v1/completions, /v1/chat/completions) in SGLang's and
// vLLM's P/D wires for the whole instance (the other ranks join it with
// -front; docs/ROUTERS.md). GET /metrics and
// /healthz are served on the same -http address.
package main

import (
	"os"

	"github.com/kvbridge/kvbridge/examples/internal/rankcmd"
	"github.com/kvbridge/kvbridge/kvmanager"
)

func main() { os.Exit(rankcmd.Main(kvmanager.RoleDecode, os.Args[1:])) }
