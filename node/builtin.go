package node

import (
	"fmt"
	"strconv"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/controlplane/nixlnotif"
	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/engines/ucx"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/transfer"
)

// Builtin returns the in-tree implementations. The loopback engine and the
// inproc control plane connect only nodes built from the same table.
func Builtin() Factories {
	return Factories{
		Engines: map[string]EngineFactory{
			"loopback": &LoopbackFactory{Fabric: loopback.NewFabric()},
			"tcp":      TCPFactory{},
			"ucx":      UCXFactory{},
		},
		Controls: map[string]ControlFactory{
			"zmq":       ZMQFactory{},
			"nixlnotif": NixlNotifFactory{},
			"inproc":    &InprocFactory{Network: inproc.NewNetwork()},
		},
		Gatherers:  map[string]GatherFactory{"host": HostGatherFactory{}},
		Scatterers: map[string]ScatterFactory{"host": HostScatterFactory{}},
	}
}

// LoopbackFactory creates in-process engines on one fabric.
type LoopbackFactory struct{ Fabric *loopback.Fabric }

// Type returns "loopback".
func (*LoopbackFactory) Type() string { return "loopback" }

// CreateEngine creates an engine on the factory's fabric.
func (f *LoopbackFactory) CreateEngine(s Settings, cfg config.EngineConfig) (transfer.Engine, error) {
	if err := options("engine.options", cfg.Options, nil); err != nil {
		return nil, err
	}
	return f.Fabric.NewEngine(s.Name, loopback.Options{OnComplete: s.Notify})
}

// TCPFactory creates pure-Go TCP engines.
type TCPFactory struct{}

// Type returns "tcp".
func (TCPFactory) Type() string { return "tcp" }

// CreateEngine creates a TCP engine listening on engine.listen. Options:
// advertise (host:port put in the metadata), stripe_bytes, dial_timeout,
// idle_timeout.
func (TCPFactory) CreateEngine(s Settings, cfg config.EngineConfig) (transfer.Engine, error) {
	c := tcp.Config{Name: s.Name, Listen: cfg.Listen, Connections: cfg.Connections, Logger: s.Logger}
	err := options("engine.options", cfg.Options, map[string]func(string) error{
		"advertise":    func(v string) error { c.Advertise = v; return nil },
		"stripe_bytes": func(v string) error { n, err := config.ParseSize(v); c.StripeBytes = int(n); return err },
		"dial_timeout": func(v string) (err error) { c.DialTimeout, err = time.ParseDuration(v); return },
		"idle_timeout": func(v string) (err error) { c.IdleTimeout, err = time.ParseDuration(v); return },
	})
	if err != nil {
		return nil, err
	}
	return tcp.New(c)
}

// UCXFactory creates UCX engines. Transports are chosen through UCX's own
// environment (UCX_TLS, UCX_NET_DEVICES).
type UCXFactory struct{}

// Type returns "ucx".
func (UCXFactory) Type() string { return "ucx" }

// CreateEngine creates a UCX engine. Options: fragment_size (a byte size),
// error_mode (peer or none).
func (UCXFactory) CreateEngine(s Settings, cfg config.EngineConfig) (transfer.Engine, error) {
	c := ucx.Config{Name: s.Name, Logger: s.Logger}
	err := options("engine.options", cfg.Options, map[string]func(string) error{
		"fragment_size": func(v string) error { n, err := config.ParseSize(v); c.FragmentSize = uint64(n); return err },
		"error_mode": func(v string) error {
			switch v {
			case "peer":
				c.ErrMode = ucx.PeerErrors
			case "none":
				c.ErrMode = ucx.NoPeerErrors
			default:
				return fmt.Errorf("accepted: peer, none")
			}
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	return ucx.New(c)
}

// ZMQFactory creates ZeroMQ ROUTER/DEALER control channels.
type ZMQFactory struct{}

// Type returns "zmq".
func (ZMQFactory) Type() string { return "zmq" }

// CreateControl binds on control_plane.bind_address or .interface.
func (ZMQFactory) CreateControl(s Settings, cfg config.ControlPlaneConfig, _ transfer.Engine) (transfer.ControlChannel, error) {
	return zmq.New(zmq.Config{Name: s.Name, Interface: cfg.Interface, BindAddress: cfg.BindAddress, SendHWM: cfg.SendHWM, Logger: s.Logger})
}

// NixlNotifFactory carries control messages as engine notifications.
type NixlNotifFactory struct{}

// Type returns "nixlnotif".
func (NixlNotifFactory) Type() string { return "nixlnotif" }

// CreateControl needs an engine with notifications.
func (NixlNotifFactory) CreateControl(_ Settings, _ config.ControlPlaneConfig, e transfer.Engine) (transfer.ControlChannel, error) {
	return nixlnotif.New(e)
}

// InprocFactory creates in-process control channels on one network.
type InprocFactory struct{ Network *inproc.Network }

// NewInprocFactory returns a factory with a network of its own.
func NewInprocFactory() *InprocFactory { return &InprocFactory{Network: inproc.NewNetwork()} }

// Type returns "inproc".
func (*InprocFactory) Type() string { return "inproc" }

// CreateControl creates a channel named after the agent.
func (f *InprocFactory) CreateControl(s Settings, cfg config.ControlPlaneConfig, _ transfer.Engine) (transfer.ControlChannel, error) {
	return f.Network.NewChannel(s.Name, inproc.Options{QueueSize: cfg.SendHWM})
}

// HostGatherFactory creates host gather stages.
type HostGatherFactory struct{}

// Type returns "host".
func (HostGatherFactory) Type() string { return "host" }

// CreateGatherer sizes the copy pool from bounce.copy_contexts and
// bounce.copy_workers.
func (HostGatherFactory) CreateGatherer(s Settings, cfg config.BounceConfig) (transfer.Gatherer, error) {
	return gatherhost.New(gatherhost.Settings{Registry: s.Registry, Contexts: cfg.CopyContexts, Workers: cfg.CopyWorkers, Notify: s.Notify})
}

// HostScatterFactory creates host scatter stages.
type HostScatterFactory struct{}

// Type returns "host".
func (HostScatterFactory) Type() string { return "host" }

// CreateScatterer sizes the copy pool from bounce.copy_contexts and
// bounce.copy_workers.
func (HostScatterFactory) CreateScatterer(s Settings, cfg config.BounceConfig) (transfer.Scatterer, error) {
	return scatterhost.New(scatterhost.Settings{Registry: s.Registry, Contexts: cfg.CopyContexts, Workers: cfg.CopyWorkers})
}

// options applies engine-specific options strictly: an unknown name or a
// bad value is an error naming the key, the value and what is accepted.
func options(key string, opts map[string]string, known map[string]func(string) error) error {
	for _, k := range keys(opts) {
		apply, ok := known[k]
		if !ok {
			accepted := keys(known)
			if len(accepted) == 0 {
				return fmt.Errorf("%s.%s: unknown option (this engine takes none)", key, k)
			}
			return fmt.Errorf("%s.%s: unknown option; accepted: %v", key, k, accepted)
		}
		if err := apply(opts[k]); err != nil {
			return fmt.Errorf("%s.%s = %s: %w", key, k, strconv.Quote(opts[k]), err)
		}
	}
	return nil
}
