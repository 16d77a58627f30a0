// Package node assembles a bounce agent from configuration: it builds the
// engine, the control channel and the stages through factories, wires them
// into a pipeline.Agent and closes them in order.
//
// Factories follow the OpenTelemetry Collector's shape: one factory per
// implementation, an explicit table built from a list (duplicates are an
// error, nothing registers itself), and dependencies injected through
// Settings. Third-party implementations (plugins) join by adding a factory.
package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/telemetry"
	"github.com/bouncekv/bounce/transfer"
)

// Settings are the dependencies every factory receives.
type Settings struct {
	// Name is the agent's name (config agent.name).
	Name string
	// Logger is the node's logger, never nil.
	Logger *slog.Logger
	// Registry is the host memory the stages validate against.
	Registry *mem.Registry
	// Notify wakes the agent's reactor when an op completes; components
	// that can signal completion call it (it never blocks).
	Notify func()
	// TracerProvider, MeterProvider and Propagator are the node's
	// OpenTelemetry providers, never nil (no-op ones when telemetry is off).
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator
	// CUDADevice is the CUDA ordinal of the cuda stages (stages.device).
	CUDADevice int
	// CUDAStages is whether the cuda stages are configured
	// (stages.gather or stages.scatter cuda): the KV may be device memory.
	CUDAStages bool
	// Plugin is the plugin block of the stage being created when its kind
	// is plugin (stages.gather.plugin, ...); zero otherwise. Engines and
	// control planes find theirs in their own section.
	Plugin config.PluginConfig
	// Peers is the agent's identity and admitted-peer set; nil with
	// security.mode off. Engines and control planes that authenticate
	// peers use it.
	Peers *security.Peers
	// HoldWrites, when set, is a test hook an engine that supports it
	// (tcp) runs before it moves a write's bytes, with a channel closed
	// when the write is given up: the conformance suite stalls writes
	// with it (package certify). Nil in production.
	HoldWrites func(abort <-chan struct{})
	// Security is the security section of the configuration.
	Security config.SecurityConfig
	// FenceHold is how long an engine that fences forgotten peers keeps
	// refusing one: the agent's quarantine (bounce.quarantine resolved),
	// the time it trusts a late write to have landed by.
	FenceHold time.Duration
}

// EngineFactory creates a transfer engine of one kind.
type EngineFactory interface {
	Type() string
	CreateEngine(s Settings, cfg config.EngineConfig) (transfer.Engine, error)
}

// ControlFactory creates a control channel of one kind. The engine is
// passed for control planes that ride on it.
type ControlFactory interface {
	Type() string
	CreateControl(s Settings, cfg config.ControlPlaneConfig, engine transfer.Engine) (transfer.ControlChannel, error)
}

// GatherFactory creates a gather stage of one kind.
type GatherFactory interface {
	Type() string
	CreateGatherer(s Settings, cfg config.BounceConfig) (transfer.Gatherer, error)
}

// ScatterFactory creates a scatter stage of one kind.
type ScatterFactory interface {
	Type() string
	CreateScatterer(s Settings, cfg config.BounceConfig) (transfer.Scatterer, error)
}

// WriteFactory creates a write stage (the bulk write) of one kind over the
// node's engine. The built-in "engine" kind (one write on the engine) needs
// no factory.
type WriteFactory interface {
	Type() string
	CreateWriter(s Settings, engine transfer.Engine) (transfer.Writer, error)
}

// Factories is the table of implementations a node can be built from.
type Factories struct {
	Engines    map[string]EngineFactory
	Controls   map[string]ControlFactory
	Gatherers  map[string]GatherFactory
	Scatterers map[string]ScatterFactory
	// CUDA is the driver the cuda components and device or pinned-host
	// arenas share (opened on first use); nil means none in this build.
	CUDA    *cuda.Lib
	Writers map[string]WriteFactory
}

// MakeFactories builds the table from lists; a kind listed twice is an error.
func MakeFactories(engines []EngineFactory, controls []ControlFactory, gatherers []GatherFactory, scatterers []ScatterFactory) (Factories, error) {
	var f Factories
	var err error
	if f.Engines, err = index("engine", engines); err != nil {
		return Factories{}, err
	}
	if f.Controls, err = index("control plane", controls); err != nil {
		return Factories{}, err
	}
	if f.Gatherers, err = index("gather stage", gatherers); err != nil {
		return Factories{}, err
	}
	if f.Scatterers, err = index("scatter stage", scatterers); err != nil {
		return Factories{}, err
	}
	return f, nil
}

func index[F interface{ Type() string }](what string, list []F) (map[string]F, error) {
	m := make(map[string]F, len(list))
	for _, f := range list {
		t := f.Type()
		if _, dup := m[t]; dup {
			return nil, fmt.Errorf("node: duplicate %s factory %q", what, t)
		}
		m[t] = f
	}
	return m, nil
}

// Node is an agent with the components it was built from. The node owns
// them: Close shuts the agent down and then closes the stages, the control
// channel and the engine.
type Node struct {
	Agent     *pipeline.Agent
	Engine    transfer.Engine
	Control   transfer.ControlChannel
	Gatherer  transfer.Gatherer
	Scatterer transfer.Scatterer
	// Writer is the write stage; nil means one bulk write on Engine.
	Writer   transfer.Writer
	Registry *mem.Registry
	Config   config.Config
	// Telemetry are the providers the node's components use. When the
	// node built them from Config.Telemetry, Close flushes and stops them.
	Telemetry *telemetry.Providers
	// ArenaMemory is the arena memory chosen (host, pinned-host or device;
	// empty while the bounce path is off).
	ArenaMemory string

	ownTelemetry bool
	arenaCtx     *cuda.Context // retained for a device or pinned-host arena
	newArena     func(name string, size uint64) (pipeline.Arena, error)
	closeOnce    sync.Once
	closeErr     error
}

// Options are Build's optional dependencies.
type Options struct {
	// Logger is the node's logger; nil discards. Build wraps its handler so
	// records logged with a span's context carry trace_id and span_id.
	Logger *slog.Logger
	// Telemetry are the providers to use; nil means Build makes them from
	// cfg.Telemetry (telemetry.New) and Close shuts them down.
	Telemetry *telemetry.Providers
	// Received, if set, receives the agent's receiver-side completion
	// events (pipeline.Settings.Received: never blocked on; an event that
	// finds it full is dropped and counted).
	Received chan<- pipeline.Received
	// StrictBounce fails Build when the configuration enables the bounce
	// path but it cannot be built (a bad control-plane interface, say) or
	// started (an arena that cannot be mapped: the error wraps
	// pipeline.ErrBounceUnavailable), instead of serving the direct path;
	// bounce serve sets it. Build is always strict when bounce.route is
	// bounce.
	StrictBounce bool
	// HoldWrites is Settings.HoldWrites for the engine Build makes: a test
	// hook that stalls its writes on purpose (a write in flight for as
	// long as a test needs it). Nil in production.
	HoldWrites func(abort <-chan struct{})
}

// Build is BuildWith with only a logger: the node's telemetry comes from
// cfg.Telemetry.
func Build(cfg config.Config, f Factories, logger *slog.Logger) (*Node, error) {
	return BuildWith(cfg, f, Options{Logger: logger})
}

// BuildWith normalizes and validates cfg (logging any adjustment, such as
// the max chunk clamped to the arena) and builds a started node. On error
// everything built so far is closed.
func BuildWith(cfg config.Config, f Factories, o Options) (*Node, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = slog.New(telemetry.LogHandler(logger.Handler()))
	for _, notice := range cfg.Normalize() {
		logger.Info(notice)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if err := CheckKinds(cfg, f); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if why := loopbackMismatch(cfg); why != "" {
		logger.Warn(why)
	}
	// An auto arena with a CUDA stage may land in device memory, which is
	// not the host's budget (CheckMemory skips a device arena itself).
	hostArena := cfg.Bounce.ArenaMemory != "auto" || cfg.Stages.Gather.Kind == "host" && cfg.Stages.Scatter.Kind == "host"
	if budget, err := mem.ReadBudget(os.DirFS("/")); err != nil {
		logger.Warn("memory budget unknown; arena size not checked", "err", err)
	} else if err := cfg.Bounce.CheckMemory(budget); hostArena && err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}

	n := &Node{Registry: &mem.Registry{}, Config: cfg, Telemetry: o.Telemetry}
	if n.Telemetry == nil {
		tel, err := telemetry.New(context.Background(), cfg.Telemetry, telemetry.Options{Instance: cfg.Agent.Name, Log: logger})
		if err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
		n.Telemetry, n.ownTelemetry = tel, true
	}
	peers, err := Trust(cfg.Security, logger)
	if err != nil {
		n.closeTelemetry()
		return nil, fmt.Errorf("node: %w", err)
	}
	wake := make(chan struct{}, 1)
	s := Settings{
		Peers:      peers,
		Security:   cfg.Security,
		Name:       cfg.Agent.Name,
		HoldWrites: o.HoldWrites,
		Logger:     logger,
		Registry:   n.Registry,
		Notify: func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		},
		TracerProvider: n.Telemetry.TracerProvider,
		MeterProvider:  n.Telemetry.MeterProvider,
		Propagator:     n.Telemetry.Propagator,
		CUDADevice:     cfg.Stages.Device,
		CUDAStages:     cfg.Stages.Gather.Kind == "cuda" || cfg.Stages.Scatter.Kind == "cuda",
		FenceHold:      PipelineConfig(cfg.Bounce, cfg.Security).EffectiveQuarantine(),
	}
	fail := func(err error) (*Node, error) {
		n.closeParts()
		n.closeTelemetry()
		return nil, err
	}
	ef, ok := f.Engines[cfg.Engine.Kind]
	if !ok {
		n.closeTelemetry()
		return nil, fmt.Errorf("node: engine.kind %q: no such engine in this build (have %v)", cfg.Engine.Kind, keys(f.Engines))
	}
	eng, err := ef.CreateEngine(s, cfg.Engine)
	if err != nil {
		return fail(fmt.Errorf("node: create %s engine: %w", cfg.Engine.Kind, err))
	}
	n.Engine = eng
	if cfg.Bounce.Enabled {
		// A control plane or stage that cannot be built only disables the
		// bounce path (degrade, never break): the agent serves every
		// transfer on the direct path and says why.
		if err := n.buildBounce(s, cfg, f, logger); err != nil {
			if o.StrictBounce || cfg.Bounce.Route == "bounce" {
				return fail(fmt.Errorf("node: bounce path (bounce.enabled is true; set it false to serve the direct path only): %w", err))
			}
			logger.Warn("bounce path unavailable; serving the direct path", "reason", err)
			n.closeBounceParts()
		}
	}
	pc := runtimeConfig(cfg, n.ArenaMemory)
	kinds := pipeline.Kinds{Engine: cfg.Engine.Kind}
	if n.Control != nil {
		kinds.Control, kinds.Gather, kinds.Scatter = cfg.ControlPlane.Kind, cfg.Stages.Gather.Kind, cfg.Stages.Scatter.Kind
	}
	n.Agent, err = pipeline.New(pipeline.Settings{
		Peers:          peers,
		Name:           cfg.Agent.Name,
		Engine:         n.Engine,
		Control:        n.Control,
		Gatherer:       n.Gatherer,
		Scatterer:      n.Scatterer,
		Writer:         n.Writer,
		Registry:       s.Registry,
		NewArena:       n.newArena,
		Wake:           wake,
		Logger:         logger,
		TracerProvider: s.TracerProvider,
		MeterProvider:  s.MeterProvider,
		Propagator:     s.Propagator,
		Kinds:          kinds,
		Received:       o.Received,
		// Strict: an arena that cannot be mapped fails the build too.
		RequireBounce: cfg.Bounce.Enabled && (o.StrictBounce || cfg.Bounce.Route == "bounce"),
	}, pc)
	if err != nil {
		return fail(fmt.Errorf("node: %w", err))
	}
	return n, nil
}

func (n *Node) buildBounce(s Settings, cfg config.Config, f Factories, logger *slog.Logger) error {
	cf, ok := f.Controls[cfg.ControlPlane.Kind]
	if !ok {
		return fmt.Errorf("control_plane.kind %q: no such control plane in this build (have %v)", cfg.ControlPlane.Kind, keys(f.Controls))
	}
	gf, ok := f.Gatherers[cfg.Stages.Gather.Kind]
	if !ok {
		return fmt.Errorf("stages.gather %q: no such stage in this build (have %v)", cfg.Stages.Gather.Kind, keys(f.Gatherers))
	}
	sf, ok := f.Scatterers[cfg.Stages.Scatter.Kind]
	if !ok {
		return fmt.Errorf("stages.scatter %q: no such stage in this build (have %v)", cfg.Stages.Scatter.Kind, keys(f.Scatterers))
	}
	var wf WriteFactory
	if k := cfg.Stages.Write.Kind; k != "engine" && k != "" {
		if wf, ok = f.Writers[k]; !ok {
			return fmt.Errorf("stages.write %q: no such stage in this build (have engine %v)", k, keys(f.Writers))
		}
	}
	stage := func(c config.StageConfig) Settings {
		st := s
		if c.Kind == "plugin" {
			st.Plugin = c.Plugin
		}
		return st
	}
	// Assign only on success: a failed factory may return a typed nil.
	ctrl, err := cf.CreateControl(s, cfg.ControlPlane, n.Engine)
	if err != nil {
		return fmt.Errorf("create %s control plane: %w", cfg.ControlPlane.Kind, err)
	}
	n.Control = ctrl
	g, err := gf.CreateGatherer(stage(cfg.Stages.Gather), cfg.Bounce)
	if fb, ok := f.Gatherers["host"]; ok && cfg.Stages.Gather.Kind == "cuda" && cfg.Stages.Fallback == "host" && errors.Is(err, cuda.ErrUnavailable) {
		logger.Warn("cuda gather stage unavailable; using the host gather stage (stages.fallback=host)", "reason", err)
		g, err = fb.CreateGatherer(s, cfg.Bounce)
	}
	if err != nil {
		return fmt.Errorf("create %s gather stage: %w", cfg.Stages.Gather.Kind, err)
	}
	n.Gatherer = g
	sc, err := sf.CreateScatterer(stage(cfg.Stages.Scatter), cfg.Bounce)
	if fb, ok := f.Scatterers["host"]; ok && cfg.Stages.Scatter.Kind == "cuda" && cfg.Stages.Fallback == "host" && errors.Is(err, cuda.ErrUnavailable) {
		logger.Warn("cuda scatter stage unavailable; using the host scatter stage (stages.fallback=host)", "reason", err)
		sc, err = fb.CreateScatterer(s, cfg.Bounce)
	}
	if err != nil {
		return fmt.Errorf("create %s scatter stage: %w", cfg.Stages.Scatter.Kind, err)
	}
	n.Scatterer = sc
	if wf != nil {
		w, err := wf.CreateWriter(stage(cfg.Stages.Write), n.Engine)
		if err != nil {
			return fmt.Errorf("create %s write stage: %w", cfg.Stages.Write.Kind, err)
		}
		n.Writer = w
	}
	return n.chooseArena(cfg, f, logger)
}

// chooseArena resolves bounce.arena_memory against what the engine and the
// stages handle and prepares the arena's allocator.
func (n *Node) chooseArena(cfg config.Config, f Factories, logger *slog.Logger) error {
	kind := cfg.Bounce.ArenaMemory
	if kind == "auto" || kind == "" {
		stagesCUDA := transfer.Handles(n.Gatherer, transfer.CUDA) && transfer.Handles(n.Scatterer, transfer.CUDA)
		switch {
		case stagesCUDA && transfer.Handles(n.Engine, transfer.CUDA):
			kind = "device"
		case stagesCUDA:
			kind = "pinned-host"
		default:
			kind = "host"
		}
	}
	n.ArenaMemory = kind
	if kind == "host" {
		return nil
	}
	if f.CUDA == nil {
		return fmt.Errorf("bounce.arena_memory %s: no CUDA driver in this build", kind)
	}
	drv, err := f.CUDA.Open()
	if err != nil {
		return fmt.Errorf("bounce.arena_memory %s: %w", kind, err)
	}
	c, err := drv.Primary(cfg.Stages.Device)
	if err != nil {
		return fmt.Errorf("bounce.arena_memory %s: %w", kind, err)
	}
	n.arenaCtx = c
	switch {
	case kind == "device":
		n.newArena = func(_ string, size uint64) (pipeline.Arena, error) { return c.NewDeviceArena(size) }
	case cfg.Engine.Kind == "plugin":
		// A plugin engine maps the host memory it is given by memfd: the
		// pinned arena is a memfd arena page-locked for the device.
		n.newArena = func(name string, size uint64) (pipeline.Arena, error) { return c.NewSharedPinnedArena(name, size) }
	default:
		n.newArena = func(_ string, size uint64) (pipeline.Arena, error) { return c.NewPinnedArena(size) }
	}
	logger.Info("bounce arena memory", "bounce.arena_memory", kind, "stages.device", cfg.Stages.Device)
	return nil
}

// Trust builds the agent's identity and admitted-peer set from the security
// section: the key pair from security.key_file (generated there on first
// start) or a fresh one, and the allowed_peers policy. With security.mode
// off it returns nil after a loud warning.
func Trust(c config.SecurityConfig, logger *slog.Logger) (*security.Peers, error) {
	mode, err := security.ParseMode(c.Mode)
	if err != nil {
		return nil, err
	}
	if mode == security.Off {
		logger.Warn("SECURITY IS OFF (security.mode: off): any host that can reach this agent's ports may send control messages " +
			"and write into its registered memory; use only on a closed test network")
		return nil, nil
	}
	var id security.Identity
	if c.KeyFile == "" {
		id, err = security.Generate(nil)
	} else {
		var created bool
		id, created, err = security.LoadOrCreate(c.KeyFile)
		if created {
			logger.Info("generated this agent's key pair", "security.key_file", c.KeyFile, "public_key", id.Public.String())
		}
	}
	if err != nil {
		return nil, fmt.Errorf("security.key_file %q: %w", c.KeyFile, err)
	}
	policy, err := security.ParsePolicy(c.AllowedPeers, os.ReadFile)
	if err != nil {
		return nil, fmt.Errorf("security.allowed_peers: %w", err)
	}
	return security.NewPeers(mode, id, policy), nil
}

// runtimeConfig is PipelineConfig for an arena of memory arenaMemory:
// device arenas take bounce.device_max_inflight as W.
func runtimeConfig(cfg config.Config, arenaMemory string) pipeline.Config {
	pc := PipelineConfig(cfg.Bounce, cfg.Security)
	if arenaMemory == "device" {
		pc.MaxInflight = cfg.Bounce.DeviceMaxInflight
	}
	return pc
}

// PipelineConfig maps the bounce section of the configuration to the
// runtime's knobs.
func PipelineConfig(b config.BounceConfig, sec config.SecurityConfig) pipeline.Config {
	return pipeline.Config{
		Enabled:          b.Enabled,
		ArenaSize:        uint64(b.ArenaSize),
		Granularity:      uint64(b.Granularity),
		MaxChunk:         uint64(b.MaxChunk),
		MinChunk:         uint64(b.MinChunk),
		MaxInflight:      b.MaxInflight,
		ScatterWorkers:   b.ScatterWorkers,
		MinDescriptors:   b.MinDescriptors,
		MaxAvgDescriptor: uint64(b.MaxAvgDescriptor),
		RequestTimeout:   b.RequestTimeout,
		Quarantine:       b.Quarantine, // 0: pipeline.Config's default, 1 × RequestTimeout
		QuiesceTimeout:   min(b.RequestTimeout, pipeline.DefaultConfig().QuiesceTimeout),
		EagerGather:      b.EagerGather,
		DisableMerging:   b.DisableMerging,
		Route:            routeOf(b.Route),
		PullRead:         pullReadOf(b.PullRead),
		MaxFlowsPerPeer:  sec.MaxFlowsPerPeer,
		WantRate:         float64(sec.WantRate),
		WantBurst:        sec.WantBurst,
		MaxControlPeers:  sec.MaxControlPeers,
		MaxArenaShare:    sec.MaxArenaShare,
		CostModel:        b.CostModel,
	}
}

// pullReadOf maps bounce.pull_read (validated) to the pipeline's mode.
func pullReadOf(s string) pipeline.PullRead {
	if s == "off" {
		return pipeline.PullReadOff
	}
	return pipeline.PullReadAuto
}

// routeOf maps bounce.route (validated) to the pipeline's route.
func routeOf(s string) pipeline.Route {
	switch s {
	case "bounce":
		return pipeline.RouteBounce
	case "direct":
		return pipeline.RouteDirect
	}
	return pipeline.RouteAuto
}

// Close shuts the agent down (bounded by ctx), closes every component and
// then flushes and stops the telemetry the node built. It is idempotent.
func (n *Node) Close(ctx context.Context) error {
	n.closeOnce.Do(func() {
		var errs []error
		if n.Agent != nil {
			errs = append(errs, n.Agent.Shutdown(ctx))
		}
		errs = append(errs, n.closeParts())
		if n.ownTelemetry {
			errs = append(errs, n.Telemetry.Shutdown(ctx))
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// closeTelemetry stops telemetry the node built, on a failed Build.
func (n *Node) closeTelemetry() {
	if n.ownTelemetry {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = n.Telemetry.Shutdown(ctx)
	}
}

func (n *Node) closeBounceParts() error {
	var errs []error
	if c, ok := n.Writer.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	n.Writer = nil
	if n.Gatherer != nil {
		errs = append(errs, n.Gatherer.Close())
		n.Gatherer = nil
	}
	if n.Scatterer != nil {
		errs = append(errs, n.Scatterer.Close())
		n.Scatterer = nil
	}
	if n.Control != nil {
		errs = append(errs, n.Control.Close())
		n.Control = nil
	}
	n.newArena, n.ArenaMemory = nil, ""
	return errors.Join(errs...)
}

func (n *Node) closeParts() error {
	errs := []error{n.closeBounceParts()}
	if n.Engine != nil {
		errs = append(errs, n.Engine.Close())
	}
	if n.arenaCtx != nil {
		errs = append(errs, n.arenaCtx.Release())
		n.arenaCtx = nil
	}
	return errors.Join(errs...)
}

func keys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// interfaceAddr is ifc's first IPv4 address (else its first address), or "".
func interfaceAddr(ifc *net.Interface) string {
	addrs, err := ifc.Addrs()
	if err != nil {
		return ""
	}
	first := ""
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if n.IP.To4() != nil {
			return n.IP.String()
		}
		if first == "" && !n.IP.IsLinkLocalUnicast() {
			first = n.IP.String()
		}
	}
	return first
}

// loopbackMismatch says why cfg cannot work across hosts when the tcp
// engine listens on loopback while the control plane binds a routable
// interface or address (peers elsewhere would reach one and not the
// other), or "".
func loopbackMismatch(cfg config.Config) string {
	if cfg.Engine.Kind != "tcp" || cfg.ControlPlane.Kind != "zmq" {
		return ""
	}
	host, _, err := net.SplitHostPort(cfg.Engine.Listen)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		return ""
	}
	cp := cfg.ControlPlane
	switch ip := net.ParseIP(cp.BindAddress); {
	case cp.Interface != "":
		ifc, err := net.InterfaceByName(cp.Interface)
		if err == nil && ifc.Flags&net.FlagLoopback != 0 {
			return "" // lo: both on loopback
		}
		hint := "this host's address on " + cp.Interface
		if err == nil {
			if a := interfaceAddr(ifc); a != "" {
				hint = net.JoinHostPort(a, "<port>") + " (" + cp.Interface + "'s address)"
			}
		}
		return fmt.Sprintf("engine.listen %s is a loopback address while control_plane.interface %s is routable: peers on other hosts reach the control plane but not the engine; set engine.listen to %s", cfg.Engine.Listen, cp.Interface, hint)
	case ip != nil && !ip.IsLoopback():
		return fmt.Sprintf("engine.listen %s is a loopback address while control_plane.bind_address %s is routable: peers on other hosts reach the control plane but not the engine; set engine.listen to %s:<port>", cfg.Engine.Listen, cp.BindAddress, cp.BindAddress)
	}
	return ""
}
