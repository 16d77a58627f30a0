package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/security"
)

// Sentinel errors. Every *KeyError wraps one of them.
var (
	// ErrUnknownKey means a file key or BOUNCE_ variable names no setting.
	ErrUnknownKey = errors.New("unknown key")
	// ErrBadValue means a value cannot be parsed as the setting's type.
	ErrBadValue = errors.New("bad value")
	// ErrOutOfRange means a value parses but is not accepted for the setting.
	ErrOutOfRange = errors.New("value out of range")
)

// KeyError is one problem with one setting.
type KeyError struct {
	// Key is the dotted key ("bounce.max_inflight"); for an unknown key it
	// is the key as written, for an unknown environment variable empty.
	Key string
	// Value is the offending value as written (empty when there is none).
	Value string
	// Source is where the value came from; empty when Validate was called on
	// a Config built in code.
	Source Source
	// Reason says what is wrong and what is accepted.
	Reason string
	// Err is ErrUnknownKey, ErrBadValue or ErrOutOfRange.
	Err error
}

// Error formats the problem as `config: key="value" (source): reason`.
func (e *KeyError) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	switch {
	case e.Key != "":
		b.WriteString(e.Key)
		b.WriteString("=")
		b.WriteString(strconv.Quote(e.Value))
	case e.Source != "":
		b.WriteString(string(e.Source))
		b.WriteString("=")
		b.WriteString(strconv.Quote(e.Value))
	}
	if e.Source != "" && e.Key != "" {
		b.WriteString(" (")
		b.WriteString(string(e.Source))
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	return b.String()
}

// Unwrap returns the sentinel.
func (e *KeyError) Unwrap() error { return e.Err }

func outOfRange(key string, value any, format string, args ...any) *KeyError {
	return &KeyError{Key: key, Value: fmt.Sprint(value), Reason: fmt.Sprintf(format, args...), Err: ErrOutOfRange}
}

// joinKeyErrors joins errs, or returns nil when there are none.
// fieldErrors collects validation failures; add ignores nil.
type fieldErrors []*KeyError

func (e *fieldErrors) add(k *KeyError) {
	if k != nil {
		*e = append(*e, k)
	}
}

func joinKeyErrors(errs []*KeyError) error {
	if len(errs) == 0 {
		return nil
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return errors.Join(out...)
}

// Config is the whole bounce configuration. Keys in files are the snake_case
// names listed in the package documentation.
type Config struct {
	Agent        AgentConfig
	Bounce       BounceConfig
	Engine       EngineConfig
	ControlPlane ControlPlaneConfig
	Stages       StagesConfig
	Telemetry    TelemetryConfig
	Log          LogConfig
	Security     SecurityConfig
	Discovery    DiscoveryConfig
}

// LogConfig configures the process's log on stderr.
type LogConfig struct {
	// Level is debug, info, warn or error (log.level, default warn).
	Level string
	// Format is text (key=value) or json, one object per line (log.format,
	// default text).
	Format string
}

// Validate checks log.level and log.format.
func (l *LogConfig) Validate() error { return joinKeyErrors(l.validate()) }

func (l *LogConfig) validate() []*KeyError {
	var errs fieldErrors
	errs.add(oneOf("log.level", l.Level, "debug", "info", "warn", "error"))
	errs.add(oneOf("log.format", l.Format, "text", "json"))
	return errs
}

// SecurityConfig is the trust policy and the per-peer limits
// (docs/SECURITY.md).
type SecurityConfig struct {
	// Mode is authenticate or off (security.mode, default authenticate).
	// Off trusts the network and is logged as a warning at start.
	Mode string
	// KeyFile holds this agent's key pair (security.key_file); it is
	// generated there on first start (mode 0600) and refused when group or
	// others may read it. Empty: a fresh key pair per process, so peers
	// must load this agent's current descriptor.
	KeyFile string
	// AllowedPeers says who may connect (security.allowed_peers, default
	// "loaded"): comma-separated "loaded" (any peer whose descriptor was
	// loaded), "NAME=KEY" entries and "@FILE" files of such lines.
	AllowedPeers string
	// MaxFlowsPerPeer caps one peer's open flows on a receiver
	// (security.max_flows_per_peer, default 256, 1..1048576).
	MaxFlowsPerPeer int
	// WantRate and WantBurst bound the WANTs per second one peer may send
	// (security.want_rate, default 5000; security.want_burst, default
	// 1024; 1..10^9 each).
	WantRate  int
	WantBurst int
	// MaxControlPeers caps the reverse control paths a receiver keeps
	// (security.max_control_peers, default 1024, 1..1048576).
	MaxControlPeers int
	// MaxControlConnsPerHost and MaxControlConns cap the incoming
	// control connections (ZeroMQ) from one host and from all hosts, in
	// every security mode (security.max_control_conns_per_host, default
	// 64, 1..65536; security.max_control_conns, default 1024,
	// 1..1048576); a connection past either is refused at its handshake.
	MaxControlConnsPerHost int
	MaxControlConns        int
	// MaxMessageSize is the largest control message accepted
	// (security.max_message_size, default 4MiB, 64KiB..1GiB).
	MaxMessageSize Size
	// MaxArenaShare is the fraction of a receiver's arena one peer may hold
	// even when no other peer waits (security.max_arena_share, default
	// 0.5, above 0 and at most 1); while others wait, peers share it equally.
	MaxArenaShare float64
}

// AgentConfig identifies this agent among its peers.
type AgentConfig struct {
	// Name is unique among peers (agent.name). Default: "<hostname>-<pid>".
	Name string
}

// BounceConfig tunes the bounce-buffer pipeline.
type BounceConfig struct {
	// Enabled turns the bounce path on (bounce.enabled, default true).
	Enabled bool
	// ArenaSize is the shared region arena (bounce.arena_size, default 256MiB).
	ArenaSize Size
	// Granularity is the buddy allocator's smallest block (bounce.granularity,
	// default 1MiB): a power of two no larger than ArenaSize.
	Granularity Size
	// MaxChunk caps one chunk (bounce.max_chunk, default 8MiB). Load clamps
	// it to UsableCapacity with a notice; peers must agree on it.
	MaxChunk Size
	// MinChunk, when set (at least MinMinChunk), is where a request's chunk
	// sizes start and end: they ramp up from it to MaxChunk and taper off
	// toward the end, so a single request's gather, write and scatter
	// overlap sooner — about 10%
	// lower latency for one 16 MiB request, but a wider tail under sustained
	// load (docs/BENCHMARKS.md). bounce.min_chunk, default 0 (off: every
	// chunk MaxChunk); more than MaxChunk is an error. Only the sender uses
	// it; peers need not agree.
	MinChunk Size
	// MaxInflight is W, the regions one request may hold at once
	// (bounce.max_inflight, default 8, 1..1024), on host and pinned-host
	// arenas.
	MaxInflight int
	// DeviceMaxInflight is W when the arena is device memory
	// (bounce.device_max_inflight, default DefaultDeviceMaxInflight,
	// 1..1024): a region's round trip there is host latency, not bytes,
	// and a wider window hides it (docs/BENCHMARKS.md: W32 1.23x and
	// 1.37x W8 on the H200).
	DeviceMaxInflight int
	// CopyContexts sizes the gather/scatter copy pool (bounce.copy_contexts,
	// default 8, 1..1024).
	CopyContexts int
	// CopyWorkers is the number of copy goroutines of each host stage;
	// one large gather or scatter is shared among them
	// (bounce.copy_workers, default 0: the CPU count, at least 2, at most 8;
	// 0..256).
	CopyWorkers int
	// ScatterWorkers is the receiver's scatter worker count
	// (bounce.scatter_workers, default 4, 1..1024).
	ScatterWorkers int
	// MinDescriptors is the routing gate's minimum descriptor count
	// (bounce.min_descriptors, default 1024, >= 0).
	MinDescriptors int
	// MaxAvgDescriptor is the routing gate's largest average descriptor
	// (bounce.max_avg_descriptor, default 16KiB, > 0).
	MaxAvgDescriptor Size
	// RequestTimeout fails a request that makes no progress for this long
	// (bounce.request_timeout, default 30s, 1ms..24h).
	RequestTimeout time.Duration
	// Quarantine keeps a region reclaimed from a flow whose sender may
	// still write it (an expired flow, a forgotten peer whose engine does
	// not fence forgotten peers) out of use for this long before it is
	// granted again (bounce.quarantine, default 0: 1 × request_timeout, as
	// the reference design; 0 or 1ms..24h). It cannot be turned off; see
	// pipeline.Config.Quarantine.
	Quarantine time.Duration
	// EagerGather gathers before the GRANT arrives (bounce.eager_gather,
	// default true).
	EagerGather bool
	// ZeroCopyArgs lets GPU stages read their plan (the piece table) from
	// pinned host memory (bounce.zero_copy_args, default false: staged to
	// the device before each launch, which measured faster at every block
	// size on the H200; docs/BENCHMARKS.md).
	ZeroCopyArgs bool
	// ArenaMemory is where the arena lives (bounce.arena_memory): device
	// (cuMemAlloc on stages.device), pinned-host (page-locked and mapped for
	// the device), host (mmap'd), or auto (default): device when the engine
	// and the gather stage both handle CUDA memory, pinned-host when only
	// the stages do, else host.
	ArenaMemory string
	// CostModel lets route auto pick bounce or direct per request from
	// the engine-aware cost model (bounce.cost_model, default true); false
	// leaves the decision to the descriptor gates alone.
	CostModel bool
	// DisableMerging sends one run per descriptor; debugging only
	// (bounce.disable_merging, default false).
	DisableMerging bool
	// Route is the route of requests that do not choose one (bounce.route,
	// default auto): auto (bounce when eligible, else direct, each fallback
	// warned once per peer and counted), bounce (required: a request that
	// cannot take it fails with the reason, and a bounce path that cannot
	// be built fails the node) or direct.
	Route string
	// PullRead is whether pulls into host memory read the holder's staged
	// regions where both ends' engines read and serve reads
	// (bounce.pull_read: auto, the default, pipeline.DefaultPullRead; or
	// off: the holder writes every pull).
	PullRead string
}

// UsableCapacity is the largest block the arena's buddy allocator can hand
// out: the largest power-of-two multiple of Granularity that fits in
// ArenaSize. It is 0 when Granularity is not a power of two or exceeds
// ArenaSize.
func (b BounceConfig) UsableCapacity() Size {
	return Size(credit.UsableCapacity(uint64(b.ArenaSize), uint64(b.Granularity)))
}

// EngineConfig selects and tunes the data-plane engine.
type EngineConfig struct {
	// Kind is loopback, tcp, ucx, nixl, cudacopy or plugin (engine.kind,
	// default tcp).
	Kind string
	// Plugin starts the engine plugin, required when Kind is plugin and
	// refused otherwise (engine.plugin: a path, or a plugin block; see
	// PluginConfig). The plugin gets Options and the block's options.
	Plugin PluginConfig
	// Listen is the tcp engine's host:port (engine.listen, default
	// 127.0.0.1:0: loopback, ephemeral port; set a routable address for
	// multi-node use).
	Listen string
	// Connections is the tcp connections per peer (engine.connections,
	// default 4, 1..256).
	Connections int
	// Options are engine-specific settings passed through unchanged
	// (engine.options). Layers merge them per option name.
	Options map[string]string
	// Encryption is off or on (engine.encryption, default off): whether
	// the tcp engine encrypts the bytes it moves after its authenticated
	// handshake (authentication is always on with security.mode
	// authenticate). docs/SECURITY.md says what off leaves open.
	Encryption string
	// FrameTimeout bounds receiving one frame once its first byte arrived,
	// and a connection's handshake (engine.frame_timeout, default 15s,
	// 1ms..1h): a peer that trickles bytes is cut off.
	FrameTimeout time.Duration
	// MaxPendingConns caps the incoming tcp connections still in their
	// handshake (engine.max_pending_conns, default 64, 1..65536); more are
	// closed at once.
	MaxPendingConns int
}

// ControlPlaneConfig selects and tunes the control channel.
type ControlPlaneConfig struct {
	// Kind is zmq, nixlnotif, inproc or plugin (control_plane.kind,
	// default zmq). Peers must use the same kind.
	Kind string
	// Interface is the NIC whose address the channel binds
	// (control_plane.interface); empty picks one automatically.
	Interface string
	// BindAddress is an explicit IP to bind (control_plane.bind_address),
	// e.g. 127.0.0.1 in tests. At most one of Interface and BindAddress.
	BindAddress string
	// SendHWM bounds each peer's send queue (control_plane.send_hwm,
	// default 1000, 1..1048576).
	SendHWM int
	// Plugin starts the control channel plugin, required when Kind is
	// plugin and refused otherwise (control_plane.plugin: a path, or a
	// plugin block; see PluginConfig).
	Plugin PluginConfig
}

// StagesConfig selects the gather, scatter and write stages. Each is a
// built-in kind or {plugin: {path: ...}} (see StageConfig, PluginConfig).
type StagesConfig struct {
	// Gather is host, cuda or a plugin (stages.gather, default host).
	Gather StageConfig
	// Scatter is host, cuda or a plugin (stages.scatter, default host).
	Scatter StageConfig
	// Write is engine (one bulk write on the engine) or a plugin
	// (stages.write, default engine).
	Write StageConfig
	// Device is the CUDA ordinal the cuda stages and a device arena use
	// (stages.device, default 0, 0..1023).
	Device int
	// Fallback says what a cuda stage does where CUDA is unavailable
	// (stages.fallback): host (default) builds the host stage instead, with
	// one log line; refuse fails the stage (the node serves the direct
	// path).
	Fallback string
}

// TelemetryConfig configures tracing and metrics (package telemetry builds
// the providers from it).
type TelemetryConfig struct {
	// Traces is none, otlp or stdout (telemetry.traces, default none).
	Traces string
	// OTLPEndpoint is the OTLP/gRPC collector's host:port, spoken in
	// plaintext (telemetry.otlp_endpoint). Empty (the default) leaves the
	// endpoint to the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
	// OTEL_EXPORTER_OTLP_ENDPOINT variables, else 127.0.0.1:4317.
	OTLPEndpoint string
	// ServiceName names this process in traces and metrics
	// (telemetry.service_name). Empty (the default) means OTEL_SERVICE_NAME,
	// else "bounce".
	ServiceName string
	// SampleRatio is the fraction of new traces sampled; a span whose
	// parent is sampled is always sampled (telemetry.sample_ratio, default
	// 1, 0..1). OTEL_TRACES_SAMPLER, when set, replaces this sampler.
	SampleRatio float64
	// MetricsListen is the host:port of the Prometheus endpoint (/metrics)
	// (telemetry.metrics.listen); empty (the default) serves none.
	MetricsListen string
}

// DefaultDeviceMaxInflight is bounce.device_max_inflight's default.
const DefaultDeviceMaxInflight = 32

// MinMinChunk is the smallest bounce.min_chunk other than 0: below it the
// ramp would only add control round trips.
const MinMinChunk = 64 * KiB

// Default returns the defaults. Agent.Name is "<hostname>-<pid>" (with
// characters other than letters, digits, '.', '-' and '_' replaced by '-'),
// or "bounce-<pid>" when the hostname is unavailable.
//
// The bounce section's runtime values and the security section's per-peer
// limits come from pipeline.DefaultConfig, the one place they are set; only
// the keys the runtime does not have (the
// stages' copy contexts, zero-copy arguments, the route's name) are set
// here.
func Default() Config {
	p := pipeline.DefaultConfig()
	return Config{
		Agent: AgentConfig{Name: defaultAgentName()},
		Bounce: BounceConfig{
			Enabled:           p.Enabled,
			ArenaSize:         Size(p.ArenaSize),
			Granularity:       Size(p.Granularity),
			MaxChunk:          Size(p.MaxChunk),
			MinChunk:          Size(p.MinChunk),
			MaxInflight:       p.MaxInflight,
			DeviceMaxInflight: DefaultDeviceMaxInflight,
			CopyContexts:      8,
			ScatterWorkers:    p.ScatterWorkers,
			MinDescriptors:    p.MinDescriptors,
			MaxAvgDescriptor:  Size(p.MaxAvgDescriptor),
			RequestTimeout:    p.RequestTimeout,
			EagerGather:       p.EagerGather,
			DisableMerging:    p.DisableMerging,
			ZeroCopyArgs:      false,
			ArenaMemory:       "auto",
			Route:             p.Route.String(),
			CostModel:         p.CostModel,
			PullRead:          p.PullRead.String(),
		},
		Engine: EngineConfig{Kind: "tcp", Listen: "127.0.0.1:0", Connections: 4, Plugin: DefaultPlugin(), Encryption: "off", FrameTimeout: 15 * time.Second, MaxPendingConns: 64},
		ControlPlane: ControlPlaneConfig{
			Kind:    "zmq",
			SendHWM: 1000,
			Plugin:  DefaultPlugin(),
		},
		Stages: StagesConfig{
			Gather:   StageConfig{Kind: "host", Plugin: DefaultPlugin()},
			Scatter:  StageConfig{Kind: "host", Plugin: DefaultPlugin()},
			Write:    StageConfig{Kind: "engine", Plugin: DefaultPlugin()},
			Fallback: "host",
		},
		Log: LogConfig{Level: "warn", Format: "text"},
		Security: SecurityConfig{
			Mode:                   "authenticate",
			AllowedPeers:           "loaded",
			MaxFlowsPerPeer:        p.MaxFlowsPerPeer,
			WantRate:               int(p.WantRate),
			WantBurst:              p.WantBurst,
			MaxControlPeers:        p.MaxControlPeers,
			MaxControlConnsPerHost: security.DefaultMaxControlConnsPerHost,
			MaxControlConns:        security.DefaultMaxControlConns,
			MaxMessageSize:         security.DefaultMaxMessageSize,
			MaxArenaShare:          p.MaxArenaShare,
		},
		Telemetry: TelemetryConfig{
			Traces:      "none",
			SampleRatio: 1,
		},
		Discovery: defaultDiscovery(),
	}
}

func defaultAgentName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "bounce"
	}
	host = strings.Map(func(r rune) rune {
		if r < 0x80 && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '.' || r == '-' || r == '_') {
			return r
		}
		return '-'
	}, host)
	if len(host) > 200 {
		host = host[:200]
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// Normalize applies the adjustments Load makes before validating and
// returns one notice per change: today, a MaxChunk above the arena's
// UsableCapacity is clamped to it.
func (c *Config) Normalize() []string {
	b := &c.Bounce
	capacity := b.UsableCapacity()
	if capacity == 0 || b.MaxChunk <= capacity {
		return nil
	}
	n := fmt.Sprintf("bounce.max_chunk %v exceeds the arena's usable capacity %v (bounce.arena_size %v, bounce.granularity %v); clamped to %v",
		b.MaxChunk, capacity, b.ArenaSize, b.Granularity, capacity)
	b.MaxChunk = capacity
	return []string{n}
}

// Validate checks every setting and reports all problems at once, each a
// *KeyError naming the key, the value and what is accepted.
func (c *Config) Validate() error { return joinKeyErrors(c.validate()) }

func (c *Config) validate() []*KeyError {
	var errs []*KeyError
	errs = append(errs, c.Agent.validate()...)
	errs = append(errs, c.Bounce.validate()...)
	errs = append(errs, c.Engine.validate()...)
	errs = append(errs, c.ControlPlane.validate()...)
	errs = append(errs, c.Stages.validate()...)
	errs = append(errs, c.Telemetry.validate()...)
	errs = append(errs, c.Log.validate()...)
	errs = append(errs, c.Security.validate()...)
	errs = append(errs, c.Discovery.validate()...)
	return errs
}

// Validate checks the security settings.
func (s *SecurityConfig) Validate() error { return joinKeyErrors(s.validate()) }

func (s *SecurityConfig) validate() []*KeyError {
	var errs fieldErrors
	add := errs.add
	add(oneOf("security.mode", s.Mode, "authenticate", "off"))
	intRange := func(key string, v, lo, hi int) {
		if v < lo || v > hi {
			add(outOfRange(key, v, "must be between %d and %d", lo, hi))
		}
	}
	intRange("security.max_flows_per_peer", s.MaxFlowsPerPeer, 1, 1<<20)
	intRange("security.want_rate", s.WantRate, 1, 1e9)
	intRange("security.want_burst", s.WantBurst, 1, 1e9)
	intRange("security.max_control_peers", s.MaxControlPeers, 1, 1<<20)
	intRange("security.max_control_conns_per_host", s.MaxControlConnsPerHost, 1, 1<<16)
	intRange("security.max_control_conns", s.MaxControlConns, 1, 1<<20)
	if s.MaxMessageSize < 64*KiB || s.MaxMessageSize > GiB {
		add(outOfRange("security.max_message_size", s.MaxMessageSize, "must be between 64KiB and 1GiB"))
	}
	if !(s.MaxArenaShare > 0 && s.MaxArenaShare <= 1) {
		add(outOfRange("security.max_arena_share", strconv.FormatFloat(s.MaxArenaShare, 'g', -1, 64), "must be above 0 and at most 1"))
	}
	return errs
}

// Validate checks agent.name: 1..255 bytes without spaces or control
// characters.
func (a *AgentConfig) Validate() error { return joinKeyErrors(a.validate()) }

func (a *AgentConfig) validate() []*KeyError {
	const key = "agent.name"
	switch {
	case a.Name == "":
		return []*KeyError{outOfRange(key, a.Name, "must not be empty")}
	case len(a.Name) > 255:
		return []*KeyError{outOfRange(key, a.Name, "is %d bytes, at most 255 accepted", len(a.Name))}
	case strings.IndexFunc(a.Name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar }) >= 0:
		return []*KeyError{outOfRange(key, a.Name, "must be valid UTF-8 without spaces or control characters")}
	}
	return nil
}

// CheckMemory checks that the arena (its usable capacity, the bytes the
// agent maps and faults in at start) fits in budget with mem.Reserve to
// spare, so that a too-large bounce.arena_size is an error naming the key
// instead of an OOM kill. An unknown budget passes.
// A device arena (bounce.arena_memory device, or auto with a stage other
// than host, which may resolve to device) is not host memory and is not
// checked here.
func (b BounceConfig) CheckMemory(budget mem.Budget) error {
	if !b.Enabled || b.ArenaMemory == "device" {
		return nil
	}
	size := uint64(b.UsableCapacity())
	if err := budget.Fits(size, mem.Reserve); err != nil {
		return &KeyError{Key: "bounce.arena_size", Value: b.ArenaSize.String(), Err: ErrOutOfRange,
			Reason: fmt.Sprintf("the arena does not fit in memory: %v; lower bounce.arena_size or raise the memory limit", err)}
	}
	return nil
}

// Validate checks the bounce settings against the ranges documented on
// BounceConfig. A MaxChunk above UsableCapacity is an error here; Load
// clamps it first (see Normalize).
func (b *BounceConfig) Validate() error { return joinKeyErrors(b.validate()) }

func (b *BounceConfig) validate() []*KeyError {
	var errs fieldErrors
	add := errs.add
	if b.ArenaSize == 0 {
		add(outOfRange("bounce.arena_size", b.ArenaSize, "must be positive"))
	}
	switch {
	case !b.Granularity.isPow2():
		add(outOfRange("bounce.granularity", b.Granularity, "must be a power of two (e.g. 64KiB, 1MiB)"))
	case b.ArenaSize != 0 && b.Granularity > b.ArenaSize:
		add(outOfRange("bounce.granularity", b.Granularity, "must not exceed bounce.arena_size %v", b.ArenaSize))
	}
	switch capacity := b.UsableCapacity(); {
	case b.MaxChunk == 0:
		add(outOfRange("bounce.max_chunk", b.MaxChunk, "must be positive"))
	case capacity != 0 && b.MaxChunk > capacity:
		add(outOfRange("bounce.max_chunk", b.MaxChunk, "exceeds the arena's usable capacity %v (Load clamps it; call Normalize)", capacity))
	}
	intRange := func(key string, v, lo, hi int) {
		if v < lo || v > hi {
			add(outOfRange(key, v, "must be between %d and %d", lo, hi))
		}
	}
	intRange("bounce.max_inflight", b.MaxInflight, 1, 1024)
	intRange("bounce.device_max_inflight", b.DeviceMaxInflight, 1, 1024)
	intRange("bounce.copy_contexts", b.CopyContexts, 1, 1024)
	intRange("bounce.copy_workers", b.CopyWorkers, 0, 256)
	switch {
	case b.MinChunk != 0 && b.MinChunk < MinMinChunk:
		add(outOfRange("bounce.min_chunk", b.MinChunk, "must be 0 (off) or at least %v", Size(MinMinChunk)))
	case b.MaxChunk != 0 && b.MinChunk > b.MaxChunk:
		add(outOfRange("bounce.min_chunk", b.MinChunk, "must not exceed bounce.max_chunk %v", b.MaxChunk))
	}
	add(oneOf("bounce.route", b.Route, "auto", "bounce", "direct"))
	add(oneOf("bounce.pull_read", b.PullRead, "auto", "off"))
	intRange("bounce.scatter_workers", b.ScatterWorkers, 1, 1024)
	if b.MinDescriptors < 0 {
		add(outOfRange("bounce.min_descriptors", b.MinDescriptors, "must not be negative"))
	}
	if b.MaxAvgDescriptor == 0 {
		add(outOfRange("bounce.max_avg_descriptor", b.MaxAvgDescriptor, "must be positive"))
	}
	if b.RequestTimeout < time.Millisecond || b.RequestTimeout > 24*time.Hour {
		add(outOfRange("bounce.request_timeout", b.RequestTimeout, "must be between 1ms and 24h"))
	}
	if b.Quarantine != 0 && (b.Quarantine < time.Millisecond || b.Quarantine > 24*time.Hour) {
		add(outOfRange("bounce.quarantine", b.Quarantine, "must be 0 (1 × request_timeout) or between 1ms and 24h"))
	}
	add(oneOf("bounce.arena_memory", b.ArenaMemory, "auto", "device", "pinned-host", "host"))
	return errs
}

// oneOf checks that v is one of kinds.
func oneOf(key, v string, kinds ...string) *KeyError {
	for _, k := range kinds {
		if v == k {
			return nil
		}
	}
	return outOfRange(key, v, "must be one of %s", strings.Join(kinds, ", "))
}

// checkHostPort validates host:port with a numeric port 0..65535.
func checkHostPort(key, v string) *KeyError {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return outOfRange(key, v, "must be host:port, e.g. 127.0.0.1:4317 or [::1]:0")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return outOfRange(key, v, "port must be a number from 0 to 65535")
	}
	if strings.ContainsFunc(host, unicode.IsSpace) {
		return outOfRange(key, v, "host must not contain spaces")
	}
	return nil
}

// Validate checks the engine settings.
func (e *EngineConfig) Validate() error { return joinKeyErrors(e.validate()) }

func (e *EngineConfig) validate() []*KeyError {
	var errs fieldErrors
	add := errs.add
	add(oneOf("engine.kind", e.Kind, "loopback", "tcp", "ucx", "nixl", "cudacopy", "plugin"))
	errs = append(errs, e.Plugin.validate("engine.plugin", e.Kind == "plugin", "engine.kind")...)
	if e.Listen != "" || e.Kind == "tcp" {
		add(checkHostPort("engine.listen", e.Listen))
	}
	if e.Connections < 1 || e.Connections > 256 {
		add(outOfRange("engine.connections", e.Connections, "must be between 1 and 256"))
	}
	for k := range e.Options {
		if k == "" {
			add(outOfRange("engine.options", "", "option names must not be empty"))
		}
	}
	add(oneOf("engine.encryption", e.Encryption, "off", "on"))
	if e.FrameTimeout < time.Millisecond || e.FrameTimeout > time.Hour {
		add(outOfRange("engine.frame_timeout", e.FrameTimeout, "must be between 1ms and 1h"))
	}
	if e.MaxPendingConns < 1 || e.MaxPendingConns > 65536 {
		add(outOfRange("engine.max_pending_conns", e.MaxPendingConns, "must be between 1 and 65536"))
	}
	return errs
}

// Validate checks the control plane settings.
func (c *ControlPlaneConfig) Validate() error { return joinKeyErrors(c.validate()) }

func (c *ControlPlaneConfig) validate() []*KeyError {
	var errs fieldErrors
	add := errs.add
	add(oneOf("control_plane.kind", c.Kind, "zmq", "nixlnotif", "inproc", "plugin"))
	errs = append(errs, c.Plugin.validate("control_plane.plugin", c.Kind == "plugin", "control_plane.kind")...)
	if c.Interface != "" && (len(c.Interface) > 15 || strings.ContainsAny(c.Interface, "/: \t\n") || strings.ContainsFunc(c.Interface, unicode.IsControl)) {
		add(outOfRange("control_plane.interface", c.Interface, "must be a network interface name (at most 15 bytes, no '/', ':' or spaces)"))
	}
	if c.BindAddress != "" {
		if _, err := netip.ParseAddr(c.BindAddress); err != nil {
			add(outOfRange("control_plane.bind_address", c.BindAddress, "must be an IP address such as 10.0.0.5 or ::1"))
		} else if c.Interface != "" {
			add(outOfRange("control_plane.bind_address", c.BindAddress, "conflicts with control_plane.interface %q; set only one", c.Interface))
		}
	}
	if c.SendHWM < 1 || c.SendHWM > 1<<20 {
		add(outOfRange("control_plane.send_hwm", c.SendHWM, "must be between 1 and 1048576"))
	}
	return errs
}

// Validate checks the stage settings.
func (s *StagesConfig) Validate() error { return joinKeyErrors(s.validate()) }

func (s *StagesConfig) validate() []*KeyError {
	var errs fieldErrors
	add := errs.add
	add(oneOf("stages.fallback", s.Fallback, "host", "refuse"))
	if s.Device < 0 || s.Device > 1023 {
		add(outOfRange("stages.device", s.Device, "must be between 0 and 1023"))
	}
	errs = append(errs, s.Gather.validate("stages.gather", "host", "cuda")...)
	errs = append(errs, s.Scatter.validate("stages.scatter", "host", "cuda")...)
	errs = append(errs, s.Write.validate("stages.write", "engine")...)
	return errs
}

// Validate checks the telemetry settings.
func (t *TelemetryConfig) Validate() error { return joinKeyErrors(t.validate()) }

func (t *TelemetryConfig) validate() []*KeyError {
	var errs fieldErrors
	add := errs.add
	add(oneOf("telemetry.traces", t.Traces, "none", "otlp", "stdout"))
	if t.OTLPEndpoint != "" {
		add(checkHostPort("telemetry.otlp_endpoint", t.OTLPEndpoint))
	}
	if t.MetricsListen != "" {
		add(checkHostPort("telemetry.metrics.listen", t.MetricsListen))
	}
	if strings.ContainsFunc(t.ServiceName, unicode.IsControl) {
		add(outOfRange("telemetry.service_name", t.ServiceName, "must not contain control characters"))
	}
	if !(t.SampleRatio >= 0 && t.SampleRatio <= 1) {
		add(outOfRange("telemetry.sample_ratio", strconv.FormatFloat(t.SampleRatio, 'g', -1, 64), "must be between 0 and 1"))
	}
	return errs
}
