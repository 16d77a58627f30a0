// Package config loads bounce's configuration with koanf from four layers,
// each overriding the one before:
//
//	defaults < YAML file < environment (BOUNCE_*) < command-line flags
//
// Load reports where every value came from (Loaded.Sources) and is strict:
// an unknown key, an environment variable with the BOUNCE_ prefix that names
// no setting, a value that does not parse and a value out of range are all
// errors (*KeyError) naming the key, the value, its source and what is
// accepted. Nothing silently falls back to a default.
//
// # Keys
//
// Files use nested snake_case keys; the dotted form names them everywhere
// else:
//
//	agent:          name
//	bounce:         enabled, arena_size, granularity, max_chunk, min_chunk, max_inflight,
//	                device_max_inflight, copy_contexts, copy_workers, scatter_workers, min_descriptors,
//	                max_avg_descriptor, request_timeout, quarantine,
//	                eager_gather, zero_copy_args, arena_memory, disable_merging, route, pull_read
//	engine:         kind, plugin, listen, connections, options
//	control_plane:  kind, interface, bind_address, send_hwm, plugin
//	stages:         gather, scatter, write, device, fallback
//	telemetry:      traces, otlp_endpoint, service_name, sample_ratio, metrics.listen
//	discovery:      kind, endpoints, prefix, lease, dial_timeout, username, password_file,
//	                tls_ca, tls_cert, tls_key
//
// Sizes take units B, K/KB/KiB, M/MB/MiB, G/GB/GiB and T/TB/TiB in any case,
// all powers of two ("512mb" is 512 MiB); durations are Go durations ("30s",
// "500ms"); booleans are true/false, 1/0, t/f, yes/no or on/off.
// engine.options is a mapping passed to the engine unchanged; layers merge it
// per option name. engine.plugin and control_plane.plugin, and the stages
// as {plugin: ...}, take one plugin block (PluginConfig): path, args, env,
// inherit_env, checksum, options, max_restarts, restart_backoff; a plain
// string is the path alone. Environment variables and flags set the scalar
// forms (a kind, a path).
//
// # Environment variables
//
// A key's variable is BOUNCE_ plus the key upper-cased with dots turned into
// underscores, except that keys of the bounce section drop the section name:
//
//	bounce.arena_size        BOUNCE_ARENA_SIZE
//	agent.name               BOUNCE_AGENT_NAME
//	control_plane.send_hwm   BOUNCE_CONTROL_PLANE_SEND_HWM
//	engine.options           BOUNCE_ENGINE_OPTIONS=k1=v1,k2=v2
//
// EnvVar returns the variable for a key.
//
// # Flags
//
// RegisterFlags adds a flag per key: the dotted key with underscores turned
// into dashes (--bounce.arena-size=1GiB, --control-plane.bind-address=...,
// --engine.options=k=v). Only flags the user sets override the layers below.
//
// # Adjustments
//
// bounce.max_chunk larger than the arena's usable capacity (the largest
// power-of-two multiple of bounce.granularity within bounce.arena_size) is
// clamped to it; Load reports each such adjustment in Loaded.Notices for the
// caller to log.
package config
