// Command tcpengine is an example bounce plugin: the in-tree pure-Go TCP
// engine served out of process over go-plugin. Certify it with
//
//	go build -o tcpengine ./plugins/examples/tcpengine
//	bounce conformance engine --plugin ./tcpengine
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

// newEngine builds a TCP engine from the host's engine options: listen,
// connections, advertise, stripe_bytes, dial_timeout, idle_timeout.
func newEngine(name string, opts map[string]string) (transfer.Engine, error) {
	c := tcp.Config{Name: name}
	for k, v := range opts {
		var err error
		switch k {
		case "listen":
			c.Listen = v
		case "advertise":
			c.Advertise = v
		case "connections":
			c.Connections, err = strconv.Atoi(v)
		case "stripe_bytes":
			c.StripeBytes, err = strconv.Atoi(v)
		case "dial_timeout":
			c.DialTimeout, err = time.ParseDuration(v)
		case "idle_timeout":
			c.IdleTimeout, err = time.ParseDuration(v)
		default:
			return nil, fmt.Errorf("tcpengine: unknown option %q; accepted: listen, advertise, connections, stripe_bytes, dial_timeout, idle_timeout", k)
		}
		if err != nil {
			return nil, fmt.Errorf("tcpengine: option %s=%q: %w", k, v, err)
		}
	}
	return tcp.New(c)
}
