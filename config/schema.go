package config

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// field is one setting: its dotted key, help text and where it lives in a
// Config. The table is the single source of keys, environment variables,
// flags and YAML output.
type field struct {
	key  string
	help string
	ptr  func(*Config) any
}

const optionsKey = "engine.options"

// fields returns the schema in documentation order. It is built on each call
// so the package holds no mutable state.
func fields() []field {
	return []field{
		{"agent.name", "agent name, unique among peers (default <hostname>-<pid>)", func(c *Config) any { return &c.Agent.Name }},

		{"bounce.enabled", "use the bounce path for eligible transfers", func(c *Config) any { return &c.Bounce.Enabled }},
		{"bounce.arena_size", "shared region arena size", func(c *Config) any { return &c.Bounce.ArenaSize }},
		{"bounce.granularity", "smallest arena block; a power of two <= arena_size", func(c *Config) any { return &c.Bounce.Granularity }},
		{"bounce.max_chunk", "largest chunk; clamped to the arena's usable capacity; peers must agree", func(c *Config) any { return &c.Bounce.MaxChunk }},
		{"bounce.min_chunk", "if set, chunks ramp up from and taper down to it (lower single-request latency, wider tail under load); 0 = off", func(c *Config) any { return &c.Bounce.MinChunk }},
		{"bounce.max_inflight", "regions one request may hold at once (W), 1..1024; device arenas use device_max_inflight", func(c *Config) any { return &c.Bounce.MaxInflight }},
		{"bounce.device_max_inflight", "W when the arena is device memory (bounce.arena_memory resolved to device), 1..1024", func(c *Config) any { return &c.Bounce.DeviceMaxInflight }},
		{"bounce.copy_contexts", "gather/scatter copy contexts, 1..1024", func(c *Config) any { return &c.Bounce.CopyContexts }},
		{"bounce.copy_workers", "copy goroutines per host stage, sharing large copies; 0 = CPUs (2..8), 0..256", func(c *Config) any { return &c.Bounce.CopyWorkers }},
		{"bounce.scatter_workers", "receiver scatter workers, 1..1024", func(c *Config) any { return &c.Bounce.ScatterWorkers }},
		{"bounce.min_descriptors", "route through bounce from this many descriptors on", func(c *Config) any { return &c.Bounce.MinDescriptors }},
		{"bounce.max_avg_descriptor", "route through bounce up to this average descriptor size", func(c *Config) any { return &c.Bounce.MaxAvgDescriptor }},
		{"bounce.request_timeout", "fail a request without progress for this long, 1ms..24h", func(c *Config) any { return &c.Bounce.RequestTimeout }},
		{"bounce.quarantine", "keep reclaimed regions a slow sender may still write unused this long; 0 = request_timeout, 1ms..24h", func(c *Config) any { return &c.Bounce.Quarantine }},
		{"bounce.eager_gather", "gather before the GRANT arrives", func(c *Config) any { return &c.Bounce.EagerGather }},
		{"bounce.zero_copy_args", "GPU stages read their plan from pinned host memory (false: staged to the device)", func(c *Config) any { return &c.Bounce.ZeroCopyArgs }},
		{"bounce.arena_memory", "arena memory: auto, device, pinned-host or host", func(c *Config) any { return &c.Bounce.ArenaMemory }},
		{"bounce.cost_model", "route auto predicts each request on both paths from the engine's calibrated costs and takes the faster (false: the gates alone decide)", func(c *Config) any { return &c.Bounce.CostModel }},
		{"bounce.disable_merging", "one scatter run per descriptor (debugging only)", func(c *Config) any { return &c.Bounce.DisableMerging }},
		{"bounce.route", "route of requests that choose none: auto, bounce (required: fail rather than fall back) or direct", func(c *Config) any { return &c.Bounce.Route }},
		{"bounce.pull_read", "pulls into host memory read the holder's staged regions where both engines can (auto; pulls into device memory are written) or the holder writes every pull (off)", func(c *Config) any { return &c.Bounce.PullRead }},

		{"engine.kind", "data-plane engine: loopback, tcp, ucx, nixl, cudacopy or plugin", func(c *Config) any { return &c.Engine.Kind }},
		{"engine.plugin", "engine plugin (engine.kind=plugin): a path or {path, args, env, inherit_env, checksum, options, max_restarts, restart_backoff}", func(c *Config) any { return &c.Engine.Plugin }},
		{"engine.listen", "tcp engine listen host:port", func(c *Config) any { return &c.Engine.Listen }},
		{"engine.connections", "tcp connections per peer, 1..256", func(c *Config) any { return &c.Engine.Connections }},
		{"engine.encryption", "tcp engine: encrypt the bytes after the authenticated handshake: off or on", func(c *Config) any { return &c.Engine.Encryption }},
		{"engine.frame_timeout", "tcp engine: bound on receiving one frame and on a handshake, 1ms..1h", func(c *Config) any { return &c.Engine.FrameTimeout }},
		{"engine.max_pending_conns", "tcp engine: incoming connections still in their handshake, 1..65536", func(c *Config) any { return &c.Engine.MaxPendingConns }},
		{optionsKey, "engine-specific options, passed through", func(c *Config) any { return &c.Engine.Options }},

		{"control_plane.kind", "control channel: zmq, nixlnotif, inproc or plugin", func(c *Config) any { return &c.ControlPlane.Kind }},
		{"control_plane.interface", "NIC whose address the channel binds; empty = automatic", func(c *Config) any { return &c.ControlPlane.Interface }},
		{"control_plane.bind_address", "explicit IP to bind instead of an interface", func(c *Config) any { return &c.ControlPlane.BindAddress }},
		{"control_plane.send_hwm", "per-peer send queue bound, 1..1048576", func(c *Config) any { return &c.ControlPlane.SendHWM }},
		{"control_plane.plugin", "control channel plugin (control_plane.kind=plugin): a path or a plugin block like engine.plugin", func(c *Config) any { return &c.ControlPlane.Plugin }},

		{"stages.gather", "gather stage: host, cuda or {plugin: <plugin block like engine.plugin>}", func(c *Config) any { return &c.Stages.Gather }},
		{"stages.scatter", "scatter stage: host, cuda or {plugin: <plugin block>}", func(c *Config) any { return &c.Stages.Scatter }},
		{"stages.write", "write stage: engine (one bulk write on the engine) or {plugin: <plugin block>}", func(c *Config) any { return &c.Stages.Write }},
		{"stages.device", "CUDA device of the cuda stages and a device arena, 0..1023", func(c *Config) any { return &c.Stages.Device }},
		{"stages.fallback", "a cuda stage without CUDA: host (use the host stage) or refuse", func(c *Config) any { return &c.Stages.Fallback }},

		{"telemetry.traces", "trace exporter: none, otlp or stdout", func(c *Config) any { return &c.Telemetry.Traces }},
		{"telemetry.otlp_endpoint", "OTLP/gRPC collector host:port (plaintext); empty = OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, else 127.0.0.1:4317", func(c *Config) any { return &c.Telemetry.OTLPEndpoint }},
		{"telemetry.service_name", "service name in traces and metrics; empty = OTEL_SERVICE_NAME, else bounce", func(c *Config) any { return &c.Telemetry.ServiceName }},
		{"telemetry.sample_ratio", "fraction of new traces sampled (parent-based), 0..1; OTEL_TRACES_SAMPLER overrides it", func(c *Config) any { return &c.Telemetry.SampleRatio }},
		{"telemetry.metrics.listen", "serve Prometheus metrics on this host:port (/metrics); empty = off", func(c *Config) any { return &c.Telemetry.MetricsListen }},

		{"log.level", "log level on stderr: debug, info, warn or error", func(c *Config) any { return &c.Log.Level }},
		{"log.format", "log format on stderr: text (key=value) or json (one object per line)", func(c *Config) any { return &c.Log.Format }},
		{"security.mode", "authenticate (only admitted peers, by key) or off (trust the network; warns)", func(c *Config) any { return &c.Security.Mode }},
		{"security.key_file", "this agent's key pair, generated there on first start (mode 0600); empty = a new key per process", func(c *Config) any { return &c.Security.KeyFile }},
		{"security.allowed_peers", "who may connect: loaded, NAME=KEY, @FILE (comma-separated)", func(c *Config) any { return &c.Security.AllowedPeers }},
		{"security.max_flows_per_peer", "open flows one peer may have on a receiver, 1..1048576", func(c *Config) any { return &c.Security.MaxFlowsPerPeer }},
		{"security.want_rate", "WANTs per second one peer may send, 1..10^9", func(c *Config) any { return &c.Security.WantRate }},
		{"security.want_burst", "WANT burst one peer may send at once, 1..10^9", func(c *Config) any { return &c.Security.WantBurst }},
		{"security.max_control_peers", "reverse control paths a receiver keeps (idle ones evicted), 1..1048576", func(c *Config) any { return &c.Security.MaxControlPeers }},
		{"security.max_control_conns_per_host", "incoming control connections one host may hold, in every mode, 1..65536", func(c *Config) any { return &c.Security.MaxControlConnsPerHost }},
		{"security.max_control_conns", "incoming control connections all hosts may hold, in every mode, 1..1048576", func(c *Config) any { return &c.Security.MaxControlConns }},
		{"security.max_message_size", "largest control message accepted, 64KiB..1GiB", func(c *Config) any { return &c.Security.MaxMessageSize }},
		{"security.max_arena_share", "fraction of the arena one peer may hold even when no other waits, (0, 1]", func(c *Config) any { return &c.Security.MaxArenaShare }},

		{"discovery.kind", "how agents find each other: file (descriptor files) or etcd", func(c *Config) any { return &c.Discovery.Kind }},
		{"discovery.endpoints", "etcd members, comma-separated host:port or http(s)://host:port", func(c *Config) any { return &c.Discovery.Endpoints }},
		{"discovery.prefix", "etcd key prefix; agents live under <prefix>/agents/<name>", func(c *Config) any { return &c.Discovery.Prefix }},
		{"discovery.lease", "TTL of an agent's etcd record; peers forget it this long after it stops, whole seconds, 2s..1h", func(c *Config) any { return &c.Discovery.Lease }},
		{"discovery.dial_timeout", "bound on connecting to etcd and on each etcd call, 100ms..10m", func(c *Config) any { return &c.Discovery.DialTimeout }},
		{"discovery.username", "etcd user (auth); empty = no auth", func(c *Config) any { return &c.Discovery.Username }},
		{"discovery.password_file", "file holding the etcd password of discovery.username", func(c *Config) any { return &c.Discovery.PasswordFile }},
		{"discovery.tls_ca", "PEM CA file for TLS to etcd (any tls_* set turns TLS on)", func(c *Config) any { return &c.Discovery.TLSCA }},
		{"discovery.tls_cert", "PEM client certificate for TLS to etcd (with tls_key)", func(c *Config) any { return &c.Discovery.TLSCert }},
		{"discovery.tls_key", "PEM client key for TLS to etcd (with tls_cert)", func(c *Config) any { return &c.Discovery.TLSKey }},
		{"discovery.insecure", "accept etcd without TLS or authentication (anyone who can write to it chooses the records agents load; warned once)", func(c *Config) any { return &c.Discovery.Insecure }},
	}
}

func splitKey(key string) (section, name string) {
	section, name, _ = strings.Cut(key, ".")
	return section, name
}

// envName maps a dotted key to its environment variable: BOUNCE_ followed
// by the upper-cased key with dots turned into underscores, except that
// keys of the bounce section drop the section (BOUNCE_ARENA_SIZE, not
// BOUNCE_BOUNCE_ARENA_SIZE).
func envName(key string) string {
	section, name := splitKey(key)
	if section != "bounce" {
		name = section + "_" + name
	}
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, ".", "_"))
}

// flagName maps a dotted key to its flag name: the key with underscores
// turned into dashes (bounce.arena_size → bounce.arena-size).
func flagName(key string) string { return strings.ReplaceAll(key, "_", "-") }

// EnvPrefix starts every environment variable Load reads.
const EnvPrefix = "BOUNCE_"

// Keys returns every dotted key, in documentation order. Each plugin
// block's keys follow the key that holds the block: engine.plugin, then
// engine.plugin.path, engine.plugin.args, …; stages.gather, then
// stages.gather.plugin.path, ….
func Keys() []string {
	subs := subKeys()
	var out []string
	for _, f := range fields() {
		out = append(out, f.key)
		for _, s := range subs {
			if s.field == f.key {
				out = append(out, s.key)
			}
		}
	}
	return out
}

// known reports whether key is a key: a schema field or a plugin block's
// key.
func known(key string) bool {
	for _, f := range fields() {
		if f.key == key {
			return true
		}
	}
	_, ok := findSubKey(key)
	return ok
}

// EnvVar returns the environment variable that sets key, or "" if key is
// unknown.
func EnvVar(key string) string {
	if known(key) {
		return envName(key)
	}
	return ""
}

// FlagName returns the flag (without leading dashes) that sets key, or ""
// if key is unknown.
func FlagName(key string) string {
	if known(key) {
		return flagName(key)
	}
	return ""
}

// accepted describes the text forms of each kind of setting.
func accepted(ptr any) string {
	switch ptr.(type) {
	case *string:
		return "want a string (quote it in YAML)"
	case *int:
		return "want a whole number"
	case *bool:
		return "want true or false (also 1/0, t/f, yes/no, on/off)"
	case *Size:
		return "want " + sizeForms
	case *time.Duration:
		return "want a Go duration such as 30s, 500ms or 1m30s (a bare number other than 0 has no unit)"
	case *float64:
		return "want a number"
	case *map[string]string:
		return "want a mapping of option names to scalar values (k1=v1,k2=v2 in environment variables and flags)"
	case *PluginConfig:
		return pluginForms
	case *StageConfig:
		return "want a stage kind, or {plugin: {...}} whose value is a plugin path or a mapping with keys path, args, env, inherit_env, checksum, options, max_restarts, restart_backoff"
	default:
		return "unsupported setting type"
	}
}

// assign parses raw (from YAML, the environment, a flag or the defaults)
// into the field ptr points to. It reports whether raw was accepted.
func assign(ptr any, raw any) bool {
	if raw == nil {
		return false
	}
	switch p := ptr.(type) {
	case *PluginConfig:
		return assignPlugin(p, raw)
	case *StageConfig:
		return assignStage(p, raw)
	case *string:
		s, ok := raw.(string)
		if ok {
			*p = s
		}
		return ok
	case *int:
		v, ok := toInt(raw)
		if ok {
			*p = v
		}
		return ok
	case *bool:
		v, ok := toBool(raw)
		if ok {
			*p = v
		}
		return ok
	case *Size:
		v, ok := toSize(raw)
		if ok {
			*p = v
		}
		return ok
	case *time.Duration:
		var d time.Duration
		switch v := raw.(type) {
		case time.Duration:
			d = v
		case string:
			var err error
			if d, err = time.ParseDuration(strings.TrimSpace(v)); err != nil {
				return false
			}
		default:
			// A bare 0 needs no unit (YAML reads "quarantine: 0" as a
			// number); any other bare number is ambiguous.
			if n, ok := toInt(raw); !ok || n != 0 {
				return false
			}
		}
		*p = d
		return true
	case *float64:
		v, ok := toFloat(raw)
		if ok {
			*p = v
		}
		return ok
	case *map[string]string:
		m, ok := raw.(map[string]any)
		if !ok {
			return false
		}
		out := make(map[string]string, len(m))
		for k, v := range m {
			s, ok := scalarString(v)
			if !ok {
				return false
			}
			out[k] = s
		}
		if len(out) == 0 {
			out = nil
		}
		*p = out
		return true
	}
	return false
}

func toInt(raw any) (int, bool) {
	switch v := raw.(type) {
	case int:
		return v, true
	case int64:
		if v < math.MinInt || v > math.MaxInt {
			return 0, false
		}
		return int(v), true
	case uint64:
		if v > math.MaxInt {
			return 0, false
		}
		return int(v), true
	case string:
		n, err := strconv.Atoi(strings.TrimSpace(v))
		return n, err == nil
	}
	return 0, false
}

func toBool(raw any) (bool, bool) {
	switch v := raw.(type) {
	case bool:
		return v, true
	case string:
		switch asciiLower(strings.TrimSpace(v)) {
		case "true", "t", "1", "yes", "on":
			return true, true
		case "false", "f", "0", "no", "off":
			return false, true
		}
	}
	return false, false
}

func toSize(raw any) (Size, bool) {
	switch v := raw.(type) {
	case Size:
		return v, true
	case int:
		return Size(v), v >= 0
	case int64:
		return Size(v), v >= 0
	case uint64:
		return Size(v), true
	case string:
		s, err := ParseSize(v)
		return s, err == nil
	}
	return 0, false
}

func toFloat(raw any) (float64, bool) {
	switch v := raw.(type) {
	case float64:
		return v, true
	case int:
		return float64(v), true
	case int64:
		return float64(v), true
	case uint64:
		return float64(v), true
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		return f, err == nil
	}
	return 0, false
}

// scalarString renders an option value; nested values are refused.
func scalarString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case bool:
		return strconv.FormatBool(v), true
	case int:
		return strconv.Itoa(v), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case uint64:
		return strconv.FormatUint(v, 10), true
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), true
	}
	return "", false
}

// parseOptions reads the k1=v1,k2=v2 form used by environment variables and
// flags. An empty string is no options.
func parseOptions(s string) (map[string]any, bool) {
	out := map[string]any{}
	if strings.TrimSpace(s) == "" {
		return out, true
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, false
		}
		out[k] = v
	}
	return out, true
}

// show renders a raw value for an error message.
func show(raw any) string {
	switch v := raw.(type) {
	case nil:
		return ""
	case string:
		return v
	case map[string]any:
		keys := slices.Sorted(maps.Keys(v))
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%s=%v", k, v[k])
		}
		return "{" + strings.Join(parts, ",") + "}"
	default:
		return fmt.Sprint(v)
	}
}

// render returns the field's value in the form YAML output and the defaults
// layer use: sizes and durations as their text, options as a mapping.
func render(ptr any) any {
	switch p := ptr.(type) {
	case *PluginConfig:
		return renderPlugin(*p)
	case *StageConfig:
		return renderStage(*p)
	case *string:
		return *p
	case *int:
		return *p
	case *bool:
		return *p
	case *Size:
		return p.String()
	case *time.Duration:
		return p.String()
	case *float64:
		return *p
	case *map[string]string:
		m := make(map[string]any, len(*p))
		for k, v := range *p {
			m[k] = v
		}
		return m
	}
	return nil
}
