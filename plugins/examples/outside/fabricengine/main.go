// Command fabricengine is an example third-party engine plugin. A real one
// wraps its author's NIC or fabric library; this one wraps bounce's pure-Go
// TCP engine as that stand-in, so it runs anywhere. What it shows is the
// plugin around the library: option parsing that refuses what it does not
// know, and optional capabilities (transfer.Notifier) forwarded
// explicitly — embedding a transfer.Engine interface in a wrapper struct
// would hide them, and `bounce conformance` reports them as absent.
package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

func main() { plugins.Serve(plugins.ServeOpts{Engine: newEngine}) }

// newEngine gets the agent's name and the options the host passes:
// engine.options and engine.plugin.options, plus "listen" and
// "connections" from engine.listen and engine.connections.
func newEngine(name string, opts map[string]string) (transfer.Engine, error) {
	c := tcp.Config{Name: name}
	for k, v := range opts {
		var err error
		switch k {
		case "listen":
			c.Listen = v
		case "connections":
			c.Connections, err = strconv.Atoi(v)
		case "dial_timeout":
			c.DialTimeout, err = time.ParseDuration(v)
		default:
			return nil, fmt.Errorf("fabricengine: unknown option %q; accepted: listen, connections, dial_timeout", k)
		}
		if err != nil {
			return nil, fmt.Errorf("fabricengine: option %s=%q: %w", k, v, err)
		}
	}
	e, err := tcp.New(c)
	if err != nil {
		return nil, err
	}
	return &engine{Engine: e}, nil
}

// engine is the author's wrapper. It embeds the concrete *tcp.Engine, so
// every method — Notify and RecvNotification included — is promoted.
type engine struct {
	*tcp.Engine
}

var (
	_ transfer.Engine   = (*engine)(nil)
	_ transfer.Notifier = (*engine)(nil)
)
