// Command agent is the reference agent as a standalone program: run it under
// the supervisor (`supervisor run -- agent [flags]`). See docs/agent.md for
// its flags, or `agent -h`.
package main

import (
	"os"

	"github.com/agent-sidecar/supervisor/examples/refagent"
)

func main() { os.Exit(refagent.Main(os.Args[1:])) }
