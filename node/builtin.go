package node

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/controlplane/inproc"
	"github.com/bouncekv/bounce/controlplane/nixlnotif"
	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/engines/cudacopy"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/nixl"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/engines/ucx"
	gathercuda "github.com/bouncekv/bounce/stages/gather/cuda"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	"github.com/bouncekv/bounce/stages/gpucopy"
	scattercuda "github.com/bouncekv/bounce/stages/scatter/cuda"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/transfer"
)

// Builtin returns the in-tree implementations. The loopback engine and the
// inproc control plane connect only nodes built from the same table.
func Builtin() Factories {
	lib := &cuda.Lib{}
	f := Factories{
		CUDA: lib,
		Engines: map[string]EngineFactory{
			"loopback": &LoopbackFactory{Fabric: loopback.NewFabric()},
			"tcp":      TCPFactory{Lib: lib},
			"ucx":      UCXFactory{},
			"cudacopy": &CUDACopyFactory{Fabric: cudacopy.NewFabric(lib)},
		},
		Controls: map[string]ControlFactory{
			"zmq":       ZMQFactory{},
			"nixlnotif": NixlNotifFactory{},
			"inproc":    &InprocFactory{Network: inproc.NewNetwork()},
		},
		Gatherers:  map[string]GatherFactory{"host": HostGatherFactory{}, "cuda": CUDAGatherFactory{Lib: lib}},
		Scatterers: map[string]ScatterFactory{"host": HostScatterFactory{}, "cuda": CUDAScatterFactory{Lib: lib}},
	}
	if nixl.Built {
		f.Engines["nixl"] = NIXLFactory{}
	}
	return f
}

// CUDACopyFactory creates single-host GPU engines on one fabric (agents of
// one process; with the ipc option also agents of other processes on the
// host, through CUDA IPC).
type CUDACopyFactory struct{ Fabric *cudacopy.Fabric }

// Type returns "cudacopy".
func (*CUDACopyFactory) Type() string { return "cudacopy" }

// CreateEngine creates an engine on the fabric. Options: device (CUDA
// ordinal, default 0), batch (true: multi-op writes through
// cuMemcpyBatchAsync where the driver has it; default false), ipc (true:
// export registered device memory by CUDA IPC handle and write into
// engines of other processes on this host; default false).
func (f *CUDACopyFactory) CreateEngine(s Settings, cfg config.EngineConfig) (transfer.Engine, error) {
	c := cudacopy.Config{Name: s.Name, Device: s.CUDADevice, OnComplete: s.Notify}
	err := options("engine.options", cfg.Options, map[string]func(string) error{
		"device": func(v string) (err error) {
			c.Device, err = strconv.Atoi(v)
			if err == nil && c.Device < 0 {
				err = fmt.Errorf("want a CUDA ordinal >= 0")
			}
			return err
		},
		"batch": func(v string) (err error) { c.Batch, err = strconv.ParseBool(v); return },
		"ipc":   func(v string) (err error) { c.IPC, err = strconv.ParseBool(v); return },
	})
	if err != nil {
		return nil, err
	}
	return f.Fabric.NewEngine(c)
}

// CUDAGatherFactory creates CUDA gather stages on stages.device from the
// embedded kernels (or PTX, when set).
type CUDAGatherFactory struct {
	Lib *cuda.Lib
	PTX []byte
}

// Type returns "cuda".
func (CUDAGatherFactory) Type() string { return "cuda" }

// CreateGatherer sizes the pool from bounce.copy_contexts and reads the
// piece table zero-copy when bounce.zero_copy_args. Without a GPU the error
// wraps cuda.ErrUnavailable.
func (f CUDAGatherFactory) CreateGatherer(s Settings, cfg config.BounceConfig) (transfer.Gatherer, error) {
	gs, err := cudaStage(f.Lib, f.PTX, s, cfg)
	if err != nil {
		return nil, err
	}
	g, err := gathercuda.New(gs)
	if err != nil {
		_ = gs.OnClose()
		return nil, err
	}
	return g, nil
}

// CUDAScatterFactory creates CUDA scatter stages on stages.device from the
// embedded kernels (or PTX, when set).
type CUDAScatterFactory struct {
	Lib *cuda.Lib
	PTX []byte
}

// Type returns "cuda".
func (CUDAScatterFactory) Type() string { return "cuda" }

// CreateScatterer is CreateGatherer's twin.
func (f CUDAScatterFactory) CreateScatterer(s Settings, cfg config.BounceConfig) (transfer.Scatterer, error) {
	gs, err := cudaStage(f.Lib, f.PTX, s, cfg)
	if err != nil {
		return nil, err
	}
	sc, err := scattercuda.New(gs)
	if err != nil {
		_ = gs.OnClose()
		return nil, err
	}
	return sc, nil
}

// cudaStage opens the driver and retains the device's primary context for
// one stage, which releases it on Close.
func cudaStage(lib *cuda.Lib, ptx []byte, s Settings, cfg config.BounceConfig) (gpucopy.Settings, error) {
	if lib == nil {
		return gpucopy.Settings{}, fmt.Errorf("cuda stage: no driver: %w", cuda.ErrUnavailable)
	}
	drv, err := lib.Open()
	if err != nil {
		return gpucopy.Settings{}, err
	}
	c, err := drv.Primary(s.CUDADevice)
	if err != nil {
		return gpucopy.Settings{}, err
	}
	return gpucopy.Settings{Context: c, Registry: s.Registry, Contexts: cfg.CopyContexts, ZeroCopyTable: cfg.ZeroCopyArgs, PTX: ptx, OnClose: c.Release}, nil
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

// TCPFactory creates pure-Go TCP engines. Lib, when set, is the CUDA
// driver the engine stages device memory with (option device_staging).
type TCPFactory struct{ Lib *cuda.Lib }

// Type returns "tcp".
func (TCPFactory) Type() string { return "tcp" }

// CreateEngine creates a TCP engine listening on engine.listen. Options:
// advertise (host:port put in the metadata), stripe_bytes, dial_timeout,
// idle_timeout, fence_timeout, and device_staging: auto (the default: on
// when the cuda stages are configured and the driver opens), on or off.
// With it on the engine carries CUDA memory on the direct path, every
// descriptor staged through page-locked host buffers on each side (the
// per-descriptor baseline; route auto still takes bounce for device KV).
func (f TCPFactory) CreateEngine(s Settings, cfg config.EngineConfig) (transfer.Engine, error) {
	c := tcp.Config{Name: s.Name, Listen: cfg.Listen, Connections: cfg.Connections, Logger: s.Logger, OnComplete: s.Notify,
		Peers: s.Peers, Encrypt: cfg.Encryption == "on", FrameTimeout: cfg.FrameTimeout, MaxPendingConns: cfg.MaxPendingConns,
		FenceHold: s.FenceHold, Hold: s.HoldWrites}
	if c.Encrypt && !s.Peers.Enabled() {
		return nil, fmt.Errorf("engine.encryption on needs security.mode authenticate (the keys come from the handshake)")
	}
	staging := "auto"
	err := options("engine.options", cfg.Options, map[string]func(string) error{
		"advertise":    func(v string) error { c.Advertise = v; return nil },
		"stripe_bytes": func(v string) error { n, err := config.ParseSize(v); c.StripeBytes = int(n); return err },
		"dial_timeout": func(v string) (err error) { c.DialTimeout, err = time.ParseDuration(v); return },
		"idle_timeout": func(v string) (err error) { c.IdleTimeout, err = time.ParseDuration(v); return },
		"fence_timeout": func(v string) (err error) {
			c.FenceTimeout, err = time.ParseDuration(v)
			return
		},
		"device_staging": func(v string) error {
			if v != "auto" && v != "on" && v != "off" {
				return fmt.Errorf("%q: want auto, on or off", v)
			}
			staging = v
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	if staging == "on" || staging == "auto" && s.CUDAStages {
		dm, err := newCUDAStaging(f.Lib, s.CUDADevice)
		switch {
		case err == nil:
			c.Device = dm
		case staging == "on":
			return nil, fmt.Errorf("engine.options device_staging=on: %w", err)
		default:
			s.Logger.Debug("tcp engine without device staging", "reason", err)
		}
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

// NIXLFactory creates NIXL engines (UCX backend). Builtin lists it only in a
// build with -tags nixl; without the tag CheckKinds says the build lacks
// NIXL, and CreateEngine would say the same.
type NIXLFactory struct{}

// Type returns "nixl".
func (NIXLFactory) Type() string { return "nixl" }

// nixlBackendPrefix marks an engine option passed to NIXL's UCX backend
// (createBackend) under the rest of its name.
const nixlBackendPrefix = "backend_"

// CreateEngine creates a NIXL engine. Options: error_mode (peer or none:
// the backend's ucx_error_handling_mode; UCX 1.13's shared-memory
// transports support only none), max_notify_size (a byte size, at most
// 1 MiB), recv_queue, progress_thread (true or false), poll_interval,
// drain_timeout, and backend_<name> for any other UCX backend parameter
// (backend_device_list, backend_num_workers, ...). NIXL finds its UCX
// plugin through NIXL_PLUGIN_DIR.
func (NIXLFactory) CreateEngine(s Settings, cfg config.EngineConfig) (transfer.Engine, error) {
	c := nixl.Config{Name: s.Name, Logger: s.Logger}
	own := make(map[string]string, len(cfg.Options))
	for k, v := range cfg.Options {
		name, ok := strings.CutPrefix(k, nixlBackendPrefix)
		if !ok {
			own[k] = v
			continue
		}
		if name == "" {
			return nil, fmt.Errorf("engine.options.%s: empty backend parameter name; accepted: %s<parameter>", k, nixlBackendPrefix)
		}
		if c.Backend == nil {
			c.Backend = make(map[string]string)
		}
		c.Backend[name] = v
	}
	err := options("engine.options", own, map[string]func(string) error{
		"error_mode": func(v string) error {
			if v != "peer" && v != "none" {
				return fmt.Errorf("accepted: peer, none")
			}
			if c.Backend == nil {
				c.Backend = make(map[string]string)
			}
			c.Backend[nixl.BackendErrorMode] = v
			return nil
		},
		"max_notify_size": func(v string) error { n, err := config.ParseSize(v); c.MaxNotifySize = int(n); return err },
		"recv_queue":      func(v string) (err error) { c.RecvQueue, err = strconv.Atoi(v); return },
		"progress_thread": func(v string) (err error) { c.ProgressThread, err = strconv.ParseBool(v); return },
		"poll_interval":   func(v string) (err error) { c.PollInterval, err = time.ParseDuration(v); return },
		"drain_timeout":   func(v string) (err error) { c.DrainTimeout, err = time.ParseDuration(v); return },
	})
	if err != nil {
		return nil, err
	}
	return nixl.New(c)
}

// ZMQFactory creates ZeroMQ ROUTER/DEALER control channels.
type ZMQFactory struct{}

// Type returns "zmq".
func (ZMQFactory) Type() string { return "zmq" }

// CreateControl binds on control_plane.bind_address or .interface.
func (ZMQFactory) CreateControl(s Settings, cfg config.ControlPlaneConfig, _ transfer.Engine) (transfer.ControlChannel, error) {
	return zmq.New(zmq.Config{Name: s.Name, Interface: cfg.Interface, BindAddress: cfg.BindAddress, SendHWM: cfg.SendHWM, Logger: s.Logger,
		Peers: s.Peers, MaxMessageSize: int64(s.Security.MaxMessageSize),
		MaxConnsPerHost: s.Security.MaxControlConnsPerHost, MaxConns: s.Security.MaxControlConns})
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
