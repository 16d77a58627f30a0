package config

import (
	"encoding/hex"
	"slices"
	"strings"
	"time"
)

// PluginConfig says how to start a plugin binary: the one shape every
// component takes when it runs out of process (engine.plugin,
// control_plane.plugin, stages.gather.plugin, stages.scatter.plugin,
// stages.write.plugin). In YAML it is a mapping of the keys below; a plain
// string is its path alone.
type PluginConfig struct {
	// Path is the binary (path). A bare name is a file in the current
	// directory, never looked up in $PATH.
	Path string
	// Args are its arguments (args, a list).
	Args []string
	// Env is its environment, NAME=value entries (env, a list). The
	// plugin gets nothing else unless InheritEnv.
	Env []string
	// InheritEnv passes the agent's whole environment too (inherit_env,
	// default false).
	InheritEnv bool
	// Checksum pins the binary, "sha256:<64 hex digits>" (checksum); a
	// binary with another digest is refused before it starts.
	Checksum string
	// Options are passed to the plugin's constructor (options).
	Options map[string]string
	// MaxRestarts bounds the restarts after the plugin process dies
	// (max_restarts, default 5, 0..100; 0 never restarts).
	MaxRestarts int
	// RestartBackoff is the wait before the first restart, doubling up to
	// 30s (restart_backoff, default 100ms, 1ms..1m).
	RestartBackoff time.Duration
}

// DefaultPlugin returns the defaults of a plugin block.
func DefaultPlugin() PluginConfig {
	return PluginConfig{MaxRestarts: 5, RestartBackoff: 100 * time.Millisecond}
}

// StageConfig selects one pipeline stage: a built-in kind, or a plugin. In
// YAML it is the kind's name (host, cuda, engine) or a mapping
// {plugin: {path: ..., ...}}.
type StageConfig struct {
	// Kind is the built-in, or "plugin".
	Kind string
	// Plugin says how to start the plugin when Kind is plugin.
	Plugin PluginConfig
}

// PluginStage returns a stage served by the plugin binary at path.
func PluginStage(path string) StageConfig {
	p := DefaultPlugin()
	p.Path = path
	return StageConfig{Kind: "plugin", Plugin: p}
}

func assignPlugin(p *PluginConfig, raw any) bool {
	out := DefaultPlugin()
	switch v := raw.(type) {
	case string:
		out.Path = v
	case map[string]any:
		for k, x := range v {
			var ok bool
			switch k {
			case "path":
				out.Path, ok = x.(string)
			case "checksum":
				out.Checksum, ok = x.(string)
			case "args":
				out.Args, ok = stringList(x)
			case "env":
				out.Env, ok = stringList(x)
			case "inherit_env":
				out.InheritEnv, ok = toBool(x)
			case "max_restarts":
				out.MaxRestarts, ok = toInt(x)
			case "restart_backoff":
				ok = assign(&out.RestartBackoff, x)
			case "options":
				ok = x == nil || assign(&out.Options, x)
			}
			if !ok {
				return false
			}
		}
	default:
		return false
	}
	*p = out
	return true
}

func stringList(x any) ([]string, bool) {
	switch v := x.(type) {
	case nil:
		return nil, true
	case []any:
		out := make([]string, len(v))
		for i, e := range v {
			s, ok := scalarString(e)
			if !ok {
				return nil, false
			}
			out[i] = s
		}
		return out, true
	case []string:
		return slices.Clone(v), true
	}
	return nil, false
}

func assignStage(s *StageConfig, raw any) bool {
	switch v := raw.(type) {
	case string:
		*s = StageConfig{Kind: v, Plugin: DefaultPlugin()}
		return true
	case map[string]any:
		if len(v) != 1 || v["plugin"] == nil {
			return false
		}
		var p PluginConfig
		if !assignPlugin(&p, v["plugin"]) {
			return false
		}
		*s = StageConfig{Kind: "plugin", Plugin: p}
		return true
	}
	return false
}

func renderPlugin(p PluginConfig) any {
	m := map[string]any{"path": p.Path, "max_restarts": p.MaxRestarts, "restart_backoff": p.RestartBackoff.String()}
	if len(p.Args) > 0 {
		m["args"] = toAnyList(p.Args)
	}
	if len(p.Env) > 0 {
		m["env"] = toAnyList(p.Env)
	}
	if p.InheritEnv {
		m["inherit_env"] = true
	}
	if p.Checksum != "" {
		m["checksum"] = p.Checksum
	}
	if len(p.Options) > 0 {
		o := map[string]any{}
		for k, v := range p.Options {
			o[k] = v
		}
		m["options"] = o
	}
	return m
}

func toAnyList(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func renderStage(s StageConfig) any {
	if s.Kind != "plugin" {
		return s.Kind
	}
	return map[string]any{"plugin": renderPlugin(s.Plugin)}
}

const pluginForms = "want a plugin binary path, or a mapping with keys path, args, env, inherit_env, checksum, options, max_restarts, restart_backoff (args and env are lists)"

// validatePlugin checks a plugin block under key; selected says whether
// the component is set to plugin (selector names the key that does so).
func (p *PluginConfig) validate(key string, selected bool, selector string) []*KeyError {
	var errs fieldErrors
	add := errs.add
	if !selected {
		if p.Path != "" || p.Checksum != "" || len(p.Args) > 0 || len(p.Env) > 0 || len(p.Options) > 0 {
			add(outOfRange(key, p.Path, "is only used when %s is plugin; clear it", selector))
		}
		return errs
	}
	if p.Path == "" {
		add(outOfRange(key, p.Path, "path is required when %s is plugin", selector))
	}
	if p.Checksum != "" {
		h, ok := strings.CutPrefix(p.Checksum, "sha256:")
		if b, err := hex.DecodeString(h); !ok || err != nil || len(b) != 32 {
			add(outOfRange(key+".checksum", p.Checksum, "must be sha256:<64 hex digits> (sha256sum prints them)"))
		}
	}
	for _, e := range p.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			add(outOfRange(key+".env", e, "entries must be NAME=value"))
		}
	}
	for k := range p.Options {
		if k == "" {
			add(outOfRange(key+".options", "", "option names must not be empty"))
		}
	}
	if p.MaxRestarts < 0 || p.MaxRestarts > 100 {
		add(outOfRange(key+".max_restarts", p.MaxRestarts, "must be between 0 and 100"))
	}
	if p.RestartBackoff < time.Millisecond || p.RestartBackoff > time.Minute {
		add(outOfRange(key+".restart_backoff", p.RestartBackoff, "must be between 1ms and 1m"))
	}
	return errs
}

func (s *StageConfig) validate(key string, kinds ...string) []*KeyError {
	var errs fieldErrors
	errs.add(oneOf(key, s.Kind, append(kinds, "plugin")...))
	if s.Kind == "plugin" && s.Plugin.Path == "" {
		errs.add(outOfRange(key, s.Kind, "needs its binary: %s: {plugin: {path: /path/to/binary}}", key))
		return errs
	}
	errs = append(errs, s.Plugin.validate(key+".plugin", s.Kind == "plugin", key)...)
	return errs
}

// removedKeys maps keys of earlier releases to how to say the same now.
func removedKeys() map[string]string {
	return map[string]string{
		"stages.plugin": "removed: each stage names its own plugin now, e.g. stages.gather: {plugin: {path: /path/to/binary}} (likewise stages.scatter, stages.write)",
	}
}

// blockSub is one key of a plugin block, as a key of its own
// (engine.plugin.path, stages.gather.plugin.checksum): every key a YAML
// block takes is also a flag and an environment variable.
type blockSub struct {
	name string // the block's key: path, args, ...
	help string
	ptr  func() any // a scratch value of its type, for checking a text
}

func blockSubs() []blockSub {
	return []blockSub{
		{"path", "the plugin binary (a bare name is ./name; never $PATH)", func() any { return new(string) }},
		{"args", "the binary's arguments, comma-separated", func() any { return new([]string) }},
		{"env", "the plugin's environment, NAME=value entries, comma-separated", func() any { return new([]string) }},
		{"inherit_env", "pass the agent's whole environment too", func() any { return new(bool) }},
		{"checksum", "pin the binary: sha256:<64 hex digits>", func() any { return new(string) }},
		{"options", "options passed to the plugin's constructor (k1=v1,k2=v2)", func() any { return new(map[string]string) }},
		{"max_restarts", "restarts after the process dies, 0..100 (0 never)", func() any { return new(int) }},
		{"restart_backoff", "wait before the first restart, doubling to 30s, 1ms..1m", func() any { return new(time.Duration) }},
	}
}

// subKey is a block key as a setting of its own: key is
// <block>.<name> (stages.gather.plugin.path); field is the schema key
// whose value holds the block (stages.gather).
type subKey struct {
	key, field, name, help string
	ptr                    func() any
}

// blockOf returns the plugin block key of a schema field ("" for a field
// that holds none): engine.plugin for itself, stages.gather.plugin for the
// stage stages.gather.
func blockOf(f field) string {
	switch f.ptr(new(Config)).(type) {
	case *PluginConfig:
		return f.key
	case *StageConfig:
		return f.key + ".plugin"
	}
	return ""
}

// subKeys returns every block key of every plugin block, in documentation
// order.
func subKeys() []subKey {
	var out []subKey
	for _, f := range fields() {
		b := blockOf(f)
		if b == "" {
			continue
		}
		for _, s := range blockSubs() {
			out = append(out, subKey{key: b + "." + s.name, field: f.key, name: s.name, help: "plugin block " + b + ": " + s.help, ptr: s.ptr})
		}
	}
	return out
}

// findSubKey returns the block key named key.
func findSubKey(key string) (subKey, bool) {
	for _, s := range subKeys() {
		if s.key == key {
			return s, true
		}
	}
	return subKey{}, false
}

// subText turns the text of a block key's flag or environment variable
// into the raw value a YAML block holds (lists and options split on
// commas), and reports whether it parses.
func (s subKey) subText(text string) (any, bool) {
	switch s.ptr().(type) {
	case *[]string:
		if strings.TrimSpace(text) == "" {
			return []any{}, true
		}
		parts := strings.Split(text, ",")
		out := make([]any, len(parts))
		for i, p := range parts {
			out[i] = p
		}
		return out, true
	case *map[string]string:
		m, ok := parseOptions(text)
		return m, ok
	case *string:
		return text, true
	default:
		return text, assign(s.ptr(), text)
	}
}

// subReason says what a block key's text accepts.
func (s subKey) subReason() string {
	switch s.ptr().(type) {
	case *[]string:
		return "want a comma-separated list"
	}
	return accepted(s.ptr())
}

// subRaw nests a block key's raw value the way its field's YAML holds it:
// engine.plugin.path=v is engine.plugin: {path: v}; stages.gather.plugin.path=v
// is stages.gather: {plugin: {path: v}}.
func (s subKey) subRaw(v any) (section string, nested map[string]any) {
	section, rest := splitKey(s.key)
	nested = map[string]any{}
	setNested(nested, rest, v)
	return section, nested
}

// blockKeysSet records the source of each block key a layer's value of
// field f sets (every key of the mapping; path for a plain string).
func blockKeysSet(f field, v any, srcOf func(string) Source, sources map[string]Source) {
	b := blockOf(f)
	if b == "" {
		return
	}
	if _, ok := f.ptr(new(Config)).(*StageConfig); ok {
		m, ok := v.(map[string]any)
		if !ok {
			return
		}
		v = m["plugin"]
	}
	switch x := v.(type) {
	case string:
		sources[b+".path"] = srcOf(b + ".path")
	case map[string]any:
		for k := range x {
			sources[b+"."+k] = srcOf(b + "." + k)
		}
	}
}

// blockMapping returns a layer's value of field f with a plugin block
// given as a plain path turned into its mapping ({path: …}), so that
// layers merge key by key: a flag setting engine.plugin.checksum adds to
// the file's engine.plugin: /path.
func blockMapping(f field, v any) any {
	switch f.ptr(new(Config)).(type) {
	case *PluginConfig:
		if p, ok := v.(string); ok {
			return map[string]any{"path": p}
		}
	case *StageConfig:
		if m, ok := v.(map[string]any); ok {
			if p, ok := m["plugin"].(string); ok {
				return map[string]any{"plugin": map[string]any{"path": p}}
			}
		}
	}
	return v
}
