// Command testplugin serves all five bounce components from in-tree
// implementations, for the plugin tests: the TCP engine, the ZeroMQ control
// channel, the host gather and scatter stages and the engine-backed
// writer. At start it writes one line to stderr naming the environment
// variables it got (so tests can check what the host passed) and whether
// the host asked for mTLS. The "delay" option (a Go duration) makes every
// stage op stay pending at least that long, so a test can kill the process
// while a copy is in flight; "hide_notify=true" wraps the engine the wrong
// way (embedding the transfer.Engine interface, which hides Notify).
//
// After plugins.Serve has started it writes to stderr too, for the tests
// of its log lines: every constructor writes "testplugin: open <kind>" (to
// os.Stderr) and "testplugin: log from open <kind>" (through the log
// package); a stage with "chatty=true" writes "testplugin: <kind> op" per
// op and "testplugin: close <kind>" when closed; "crash=true" makes its
// first op write "testplugin: crashing" and panic.
package main

import (
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/stages/write"
	"github.com/bouncekv/bounce/transfer"
)

// said writes the constructor's two stderr lines.
func said(kind string) {
	fmt.Fprintf(os.Stderr, "testplugin: open %s\n", kind)
	log.Printf("testplugin: log from open %s", kind)
}

func main() {
	var names []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		names = append(names, k)
	}
	slices.Sort(names)
	_, mtls := os.LookupEnv("PLUGIN_CLIENT_CERT")
	fmt.Fprintf(os.Stderr, "testplugin: started pid=%d mtls=%v args=%q env=%s\n", os.Getpid(), mtls, os.Args[1:], strings.Join(names, ","))
	plugins.Serve(plugins.ServeOpts{
		Engine: newEngine,
		Control: func(name string, opts map[string]string) (transfer.ControlChannel, error) {
			c := zmq.Config{Name: name, BindAddress: opts["bind_address"], Interface: opts["interface"]}
			if v := opts["send_hwm"]; v != "" {
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("testplugin: send_hwm %q: %w", v, err)
				}
				c.SendHWM = n
			}
			return zmq.New(c)
		},
		Gatherer: func(_ string, opts map[string]string, reg *mem.Registry) (transfer.Gatherer, error) {
			s, d, err := stageSettings(opts, reg)
			if err != nil {
				return nil, err
			}
			g, err := gatherhost.New(s)
			if err != nil {
				return nil, err
			}
			said("gather")
			return delayedGatherer{g, d}, nil
		},
		Scatterer: func(_ string, opts map[string]string, reg *mem.Registry) (transfer.Scatterer, error) {
			s, d, err := stageSettings(opts, reg)
			if err != nil {
				return nil, err
			}
			sc, err := scatterhost.New(s)
			if err != nil {
				return nil, err
			}
			said("scatter")
			return delayedScatterer{sc, d}, nil
		},
		Writer: func(_ string, _ map[string]string, e transfer.Engine) (transfer.Writer, error) {
			return write.New(e), nil
		},
	})
}

func newEngine(name string, opts map[string]string) (transfer.Engine, error) {
	c := tcp.Config{Name: name}
	var delay time.Duration
	hide := false
	for k, v := range opts {
		var err error
		switch k {
		case "hide_notify":
			hide, err = strconv.ParseBool(v)
		case "listen":
			c.Listen = v
		case "connections":
			c.Connections, err = strconv.Atoi(v)
		case "delay":
			delay, err = time.ParseDuration(v)
		default:
			return nil, fmt.Errorf("testplugin: unknown engine option %q; accepted: listen, connections, delay, hide_notify", k)
		}
		if err != nil {
			return nil, fmt.Errorf("testplugin: option %s=%q: %w", k, v, err)
		}
	}
	e, err := tcp.New(c)
	if err == nil {
		said("engine")
	}
	switch {
	case err != nil:
		return nil, err
	case hide:
		// The outside author's mistake: embedding the interface hides
		// the engine's Notify.
		return struct{ transfer.Engine }{e}, nil
	case delay != 0:
		return delayedEngine{e, delay}, nil
	}
	return e, nil
}

// delayedEngine holds every write Pending at least d.
type delayedEngine struct {
	*tcp.Engine
	d time.Duration
}

func (e delayedEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	return delayed(e.Engine.PostWrite(peer, ops))(e.d)
}

// stageOpts are a stage's test behaviours.
type stageOpts struct {
	delay  time.Duration
	chatty bool // a stderr line per op and at Close
	crash  bool // the first op writes a line and panics
}

func stageSettings(opts map[string]string, reg *mem.Registry) (gatherhost.Settings, stageOpts, error) {
	s := gatherhost.Settings{Registry: reg, Contexts: 8}
	var o stageOpts
	for k, v := range opts {
		var err error
		switch k {
		case "copy_contexts":
			s.Contexts, err = strconv.Atoi(v)
		case "copy_workers":
			s.Workers, err = strconv.Atoi(v)
		case "delay":
			o.delay, err = time.ParseDuration(v)
		case "chatty":
			o.chatty, err = strconv.ParseBool(v)
		case "crash":
			o.crash, err = strconv.ParseBool(v)
		default:
			return s, o, fmt.Errorf("testplugin: unknown stage option %q; accepted: copy_contexts, copy_workers, delay, chatty, crash", k)
		}
		if err != nil {
			return s, o, fmt.Errorf("testplugin: option %s=%q: %w", k, v, err)
		}
	}
	return s, o, nil
}

// op is what a stage does around each op: talk, crash.
func (o stageOpts) op(kind string) {
	if o.crash {
		fmt.Fprintf(os.Stderr, "testplugin: crashing\n")
		panic("testplugin: " + kind + " crashes on purpose")
	}
	if o.chatty {
		fmt.Fprintf(os.Stderr, "testplugin: %s op\n", kind)
	}
}

func (o stageOpts) close(kind string) {
	if o.chatty {
		fmt.Fprintf(os.Stderr, "testplugin: close %s\n", kind)
	}
}

type delayedGatherer struct {
	transfer.Gatherer
	o stageOpts
}

func (g delayedGatherer) Gather(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	g.o.op("gather")
	return delayed(g.Gatherer.Gather(region, runs))(g.o.delay)
}

func (g delayedGatherer) Close() error {
	g.o.close("gather")
	return g.Gatherer.Close()
}

type delayedScatterer struct {
	transfer.Scatterer
	o stageOpts
}

func (s delayedScatterer) Scatter(region transfer.Desc, runs []transfer.Run) (transfer.Op, error) {
	s.o.op("scatter")
	return delayed(s.Scatterer.Scatter(region, runs))(s.o.delay)
}

func (s delayedScatterer) Close() error {
	s.o.close("scatter")
	return s.Scatterer.Close()
}

func delayed(op transfer.Op, err error) func(time.Duration) (transfer.Op, error) {
	return func(d time.Duration) (transfer.Op, error) {
		if err != nil || d == 0 {
			return op, err
		}
		return &delayOp{Op: op, until: time.Now().Add(d)}, nil
	}
}

// delayOp reports Pending until its time has come, then the real status.
type delayOp struct {
	transfer.Op
	until time.Time
}

func (o *delayOp) Poll() (transfer.Status, error) {
	st, err := o.Op.Poll()
	if st.Terminal() && time.Now().Before(o.until) {
		return transfer.Pending, nil
	}
	return st, err
}
