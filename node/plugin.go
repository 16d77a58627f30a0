package node

import (
	"fmt"
	"maps"
	"path/filepath"
	"strconv"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// WithPlugins returns a copy of f that also offers the "plugin" kind of
// all five components — engine, control plane, gather, scatter and write
// stages — each served by an out-of-process plugin binary (package
// plugins) under its plugin block's crash policy. path is the binary used
// when the configuration names none; leave it empty to require one.
func WithPlugins(f Factories, path string) Factories {
	out := Factories{
		Engines:    maps.Clone(f.Engines),
		Controls:   maps.Clone(f.Controls),
		Gatherers:  maps.Clone(f.Gatherers),
		Scatterers: maps.Clone(f.Scatterers),
		CUDA:       f.CUDA,
		Writers:    maps.Clone(f.Writers),
	}
	if out.Engines == nil {
		out.Engines = map[string]EngineFactory{}
	}
	if out.Controls == nil {
		out.Controls = map[string]ControlFactory{}
	}
	if out.Gatherers == nil {
		out.Gatherers = map[string]GatherFactory{}
	}
	if out.Scatterers == nil {
		out.Scatterers = map[string]ScatterFactory{}
	}
	if out.Writers == nil {
		out.Writers = map[string]WriteFactory{}
	}
	out.Engines["plugin"] = PluginEngineFactory{Path: path}
	out.Controls["plugin"] = PluginControlFactory{Path: path}
	out.Gatherers["plugin"] = PluginGatherFactory{Path: path}
	out.Scatterers["plugin"] = PluginScatterFactory{Path: path}
	out.Writers["plugin"] = PluginWriteFactory{Path: path}
	return out
}

// pluginSpec turns a plugin block into how to start it; fallback is the
// path used when the block names none.
func pluginSpec(s Settings, p config.PluginConfig, fallback, key, component string) (plugins.Spec, plugins.Restart, error) {
	path := p.Path
	if path == "" {
		path = fallback
	}
	if path == "" {
		return plugins.Spec{}, plugins.Restart{}, fmt.Errorf("%s: no plugin binary configured", key)
	}
	if p.RestartBackoff == 0 && p.MaxRestarts == 0 {
		// A zero block (built in code, not by config.Load): the defaults.
		d := config.DefaultPlugin()
		p.MaxRestarts, p.RestartBackoff = d.MaxRestarts, d.RestartBackoff
	}
	spec := plugins.Spec{
		Path:       path,
		Args:       p.Args,
		Env:        p.Env,
		InheritEnv: p.InheritEnv,
		Checksum:   p.Checksum,
		Name:       fmt.Sprintf("%s[%s]", filepath.Base(path), component),
		Logger:     s.Logger,
		Notify:     s.Notify,
		// The node's providers: a traced call's span joins the trace.
		TracerProvider: s.TracerProvider,
		Propagator:     s.Propagator,
	}
	return spec, plugins.Restart{MaxRestarts: p.MaxRestarts, Backoff: p.RestartBackoff}, nil
}

// pluginOptions merges the plugin block's options with what the host
// derives from other keys (extra); a name set in both is an error.
func pluginOptions(key string, block map[string]string, base map[string]string, extra map[string]string) (map[string]string, error) {
	opts := maps.Clone(base)
	if opts == nil {
		opts = map[string]string{}
	}
	for k, v := range block {
		if _, dup := opts[k]; dup {
			return nil, fmt.Errorf("%s.options.%s: also set elsewhere (engine.options); set it once", key, k)
		}
		opts[k] = v
	}
	for k, v := range extra {
		if _, set := opts[k]; !set {
			opts[k] = v
		}
	}
	return opts, nil
}

// PluginEngineFactory creates engines in plugin processes: one process per
// engine, started from engine.plugin (or Path when that names no binary),
// restarted under its crash policy, ended when the engine is closed.
type PluginEngineFactory struct {
	// Path is the plugin binary used when engine.plugin names none.
	Path string
}

// Type returns "plugin".
func (PluginEngineFactory) Type() string { return "plugin" }

// CreateEngine starts the plugin and opens its engine with the agent's
// name. The plugin receives engine.options and engine.plugin.options, plus
// "listen" and "connections" (from engine.listen and engine.connections)
// when set and not already given.
func (f PluginEngineFactory) CreateEngine(s Settings, cfg config.EngineConfig) (transfer.Engine, error) {
	spec, policy, err := pluginSpec(s, cfg.Plugin, f.Path, "engine.plugin", "engine")
	if err != nil {
		return nil, err
	}
	extra := map[string]string{}
	if cfg.Listen != "" {
		extra["listen"] = cfg.Listen
	}
	if cfg.Connections != 0 {
		extra["connections"] = strconv.Itoa(cfg.Connections)
	}
	opts, err := pluginOptions("engine.plugin", cfg.Plugin.Options, cfg.Options, extra)
	if err != nil {
		return nil, err
	}
	return plugins.OpenEngine(spec, policy, s.Name, opts)
}

// PluginControlFactory creates control channels in plugin processes, one
// process per channel, from control_plane.plugin (or Path when that names
// no binary). A plugin channel cannot ride on the host's engine.
type PluginControlFactory struct {
	// Path is the plugin binary used when control_plane.plugin names none.
	Path string
}

// Type returns "plugin".
func (PluginControlFactory) Type() string { return "plugin" }

// CreateControl starts the plugin and opens its channel with the agent's
// name. The plugin receives control_plane.plugin.options plus
// "bind_address", "interface" and "send_hwm" from the control_plane
// section when set.
func (f PluginControlFactory) CreateControl(s Settings, cfg config.ControlPlaneConfig, _ transfer.Engine) (transfer.ControlChannel, error) {
	spec, policy, err := pluginSpec(s, cfg.Plugin, f.Path, "control_plane.plugin", "control")
	if err != nil {
		return nil, err
	}
	extra := map[string]string{}
	if cfg.BindAddress != "" {
		extra["bind_address"] = cfg.BindAddress
	}
	if cfg.Interface != "" {
		extra["interface"] = cfg.Interface
	}
	if cfg.SendHWM != 0 {
		extra["send_hwm"] = strconv.Itoa(cfg.SendHWM)
	}
	opts, err := pluginOptions("control_plane.plugin", cfg.Plugin.Options, nil, extra)
	if err != nil {
		return nil, err
	}
	return plugins.OpenControl(spec, policy, s.Name, opts)
}

// stageOptions are the options a stage plugin receives: its block's, plus
// "copy_contexts" and "copy_workers" from the bounce section.
func stageOptions(key string, p config.PluginConfig, b config.BounceConfig) (map[string]string, error) {
	extra := map[string]string{}
	if b.CopyContexts != 0 {
		extra["copy_contexts"] = strconv.Itoa(b.CopyContexts)
	}
	if b.CopyWorkers != 0 {
		extra["copy_workers"] = strconv.Itoa(b.CopyWorkers)
	}
	return pluginOptions(key, p.Options, nil, extra)
}

// PluginGatherFactory creates gather stages in plugin processes from
// stages.gather.plugin (Settings.Plugin), or Path when that names none.
type PluginGatherFactory struct {
	// Path is the plugin binary used when the block names none.
	Path string
}

// Type returns "plugin".
func (PluginGatherFactory) Type() string { return "plugin" }

// CreateGatherer starts the plugin and opens its stage over the agent's
// registry: host memory crosses by memfd handle, never by copy.
func (f PluginGatherFactory) CreateGatherer(s Settings, cfg config.BounceConfig) (transfer.Gatherer, error) {
	spec, policy, err := pluginSpec(s, s.Plugin, f.Path, "stages.gather.plugin", "gather")
	if err != nil {
		return nil, err
	}
	opts, err := stageOptions("stages.gather.plugin", s.Plugin, cfg)
	if err != nil {
		return nil, err
	}
	return plugins.OpenGatherer(spec, policy, s.Name, opts, s.Registry)
}

// PluginScatterFactory creates scatter stages in plugin processes, like
// PluginGatherFactory.
type PluginScatterFactory struct {
	// Path is the plugin binary used when the block names none.
	Path string
}

// Type returns "plugin".
func (PluginScatterFactory) Type() string { return "plugin" }

// CreateScatterer starts the plugin and opens its stage over the agent's
// registry.
func (f PluginScatterFactory) CreateScatterer(s Settings, cfg config.BounceConfig) (transfer.Scatterer, error) {
	spec, policy, err := pluginSpec(s, s.Plugin, f.Path, "stages.scatter.plugin", "scatter")
	if err != nil {
		return nil, err
	}
	opts, err := stageOptions("stages.scatter.plugin", s.Plugin, cfg)
	if err != nil {
		return nil, err
	}
	return plugins.OpenScatterer(spec, policy, s.Name, opts, s.Registry)
}

// PluginWriteFactory creates writers in plugin processes from
// stages.write.plugin (Settings.Plugin), or Path when that names none. The
// plugin posts through the node's engine, lent to it.
type PluginWriteFactory struct {
	// Path is the plugin binary used when the block names none.
	Path string
}

// Type returns "plugin".
func (PluginWriteFactory) Type() string { return "plugin" }

// CreateWriter starts the plugin and opens its writer over engine. The
// plugin receives stages.write.plugin.options.
func (f PluginWriteFactory) CreateWriter(s Settings, engine transfer.Engine) (transfer.Writer, error) {
	spec, policy, err := pluginSpec(s, s.Plugin, f.Path, "stages.write.plugin", "writer")
	if err != nil {
		return nil, err
	}
	opts, err := pluginOptions("stages.write.plugin", s.Plugin.Options, nil, nil)
	if err != nil {
		return nil, err
	}
	return plugins.OpenWriter(spec, policy, s.Name, opts, engine)
}
