// Command tcpplugin is a deliberately broken engine plugin, for the tests
// that show the conformance suite rejects a broken engine through the
// plugin path: the tcp engine served out of process, broken as its
// "fault" option says (a broken.Fault name; "none" or absent: unbroken).
// Only broken.TCPEngine's faults are offered. Never use it for anything
// else.
package main

import (
	"fmt"
	"strconv"

	"github.com/bouncekv/bounce/conformance/broken"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

func main() { plugins.Serve(plugins.ServeOpts{Engine: newEngine}) }

// newEngine builds the broken tcp engine from the options fault, listen
// and connections.
func newEngine(name string, opts map[string]string) (transfer.Engine, error) {
	c := tcp.Config{Name: name}
	var f broken.Fault
	for k, v := range opts {
		var err error
		switch k {
		case "fault":
			f, err = broken.ParseFault(v)
		case "listen":
			c.Listen = v
		case "connections":
			c.Connections, err = strconv.Atoi(v)
		default:
			return nil, fmt.Errorf("tcpplugin: unknown option %q; accepted: fault, listen, connections", k)
		}
		if err != nil {
			return nil, fmt.Errorf("tcpplugin: option %s=%q: %w", k, v, err)
		}
	}
	return broken.TCPEngine(f, c)
}
