// Command sockengine is an example third-party engine plugin built on the
// bounce SDK alone (packages transfer, mem and plugins): a
// transfer.Engine over its own TCP sockets, one connection per peer, with
// its own metadata and frame format (wire.go). A real engine would drive
// its author's NIC or fabric library the same way; what it shows is what
// every engine owes the agent — bounds checked before a byte moves, Done
// only once the bytes are visible at the target, ForgetPeer as a fence on
// both sides (transfer.Fencer), sentinel errors, a non-blocking Poll — and
// the plugin around it: options refused by name, and nothing on stdout.
//
// It has no notifications (transfer.Notifier): `bounce conformance engine
// --plugin ./sockengine` lists that capability as absent and skips its
// rules. It does not authenticate peers: a real engine must (see bounce's
// docs/SECURITY.md).
package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

func main() { plugins.Serve(plugins.ServeOpts{Engine: open}) }

// Accepted options, with their defaults.
const (
	defaultListen      = "127.0.0.1:0"
	defaultSegment     = 1 << 20
	defaultDialTimeout = 5 * time.Second
	defaultFence       = 2 * time.Second
)

// open gets the agent's name and the host's options: engine.options and
// engine.plugin.options, plus "listen" and "connections" (engine.listen,
// engine.connections) from the host.
func open(name string, opts map[string]string) (transfer.Engine, error) {
	c := config{name: name, listen: defaultListen, segment: defaultSegment, dialTimeout: defaultDialTimeout, fence: defaultFence}
	if name == "" || len(name) > maxName {
		return nil, fmt.Errorf("sockengine: engine name %q: want 1..%d bytes", name, maxName)
	}
	for k, v := range opts {
		var err error
		switch k {
		case "listen":
			if v != "" {
				c.listen = v
			}
		case "connections":
			// One connection per peer whatever the host's
			// engine.connections says; a number is still required.
			_, err = strconv.Atoi(v)
		case "segment_bytes":
			c.segment, err = strconv.Atoi(v)
			if err == nil && (c.segment < 4096 || c.segment > 16<<20) {
				err = fmt.Errorf("want 4096..%d", 16<<20)
			}
		case "dial_timeout":
			c.dialTimeout, err = positive(v)
		case "fence_timeout":
			c.fence, err = positive(v)
		default:
			return nil, fmt.Errorf("sockengine: unknown option %q; accepted: listen, connections, segment_bytes, dial_timeout, fence_timeout", k)
		}
		if err != nil {
			return nil, fmt.Errorf("sockengine: option %s=%q: %w", k, v, err)
		}
	}
	return newEngine(c)
}

func positive(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err == nil && d <= 0 {
		err = fmt.Errorf("want a positive duration")
	}
	return d, err
}
