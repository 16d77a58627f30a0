package node

import (
	"fmt"
	"maps"
	"strconv"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// WithPlugins returns a copy of f that also offers the "plugin" engine and
// control plane kinds, served by out-of-process plugin binaries (package
// plugins). path is the binary used when the configuration names none
// (engine.plugin, control_plane.plugin); leave it empty to require one.
func WithPlugins(f Factories, path string) Factories {
	out := Factories{
		Engines:    maps.Clone(f.Engines),
		Controls:   maps.Clone(f.Controls),
		Gatherers:  maps.Clone(f.Gatherers),
		Scatterers: maps.Clone(f.Scatterers),
		CUDA:       f.CUDA,
	}
	if out.Engines == nil {
		out.Engines = map[string]EngineFactory{}
	}
	if out.Controls == nil {
		out.Controls = map[string]ControlFactory{}
	}
	out.Engines["plugin"] = PluginEngineFactory{Path: path}
	out.Controls["plugin"] = PluginControlFactory{Path: path}
	return out
}

func pluginPath(configured, fallback, key string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	if fallback != "" {
		return fallback, nil
	}
	return "", fmt.Errorf("%s: no plugin binary configured", key)
}

// PluginEngineFactory creates engines in plugin processes: one process per
// engine, started from engine.plugin (or Path when that is empty), and
// ended when the engine is closed.
type PluginEngineFactory struct {
	// Path is the plugin binary used when engine.plugin is empty.
	Path string
}

// Type returns "plugin".
func (PluginEngineFactory) Type() string { return "plugin" }

// CreateEngine starts the plugin and opens its engine with the agent's name.
// The plugin receives engine.options plus "listen" and "connections" (from
// engine.listen and engine.connections) when set.
func (f PluginEngineFactory) CreateEngine(s Settings, cfg config.EngineConfig) (transfer.Engine, error) {
	path, err := pluginPath(cfg.Plugin, f.Path, "engine.plugin")
	if err != nil {
		return nil, err
	}
	opts := maps.Clone(cfg.Options)
	if opts == nil {
		opts = map[string]string{}
	}
	if cfg.Listen != "" {
		opts["listen"] = cfg.Listen
	}
	if cfg.Connections != 0 {
		opts["connections"] = strconv.Itoa(cfg.Connections)
	}
	c, err := plugins.LoadWith(path, plugins.KindEngine, plugins.LoadOpts{Logger: s.Logger, TracerProvider: s.TracerProvider, Propagator: s.Propagator})
	if err != nil {
		return nil, err
	}
	return c.Engine(s.Name, opts)
}

// PluginControlFactory creates control channels in plugin processes, one
// process per channel, from control_plane.plugin (or Path when that is
// empty). A plugin channel cannot ride on the host's engine.
type PluginControlFactory struct {
	// Path is the plugin binary used when control_plane.plugin is empty.
	Path string
}

// Type returns "plugin".
func (PluginControlFactory) Type() string { return "plugin" }

// CreateControl starts the plugin and opens its channel with the agent's
// name. The plugin receives "bind_address", "interface" and "send_hwm" from
// the control_plane section when set.
func (f PluginControlFactory) CreateControl(s Settings, cfg config.ControlPlaneConfig, _ transfer.Engine) (transfer.ControlChannel, error) {
	path, err := pluginPath(cfg.Plugin, f.Path, "control_plane.plugin")
	if err != nil {
		return nil, err
	}
	opts := map[string]string{}
	if cfg.BindAddress != "" {
		opts["bind_address"] = cfg.BindAddress
	}
	if cfg.Interface != "" {
		opts["interface"] = cfg.Interface
	}
	if cfg.SendHWM != 0 {
		opts["send_hwm"] = strconv.Itoa(cfg.SendHWM)
	}
	c, err := plugins.LoadWith(path, plugins.KindControl, plugins.LoadOpts{Logger: s.Logger, TracerProvider: s.TracerProvider, Propagator: s.Propagator})
	if err != nil {
		return nil, err
	}
	return c.Control(s.Name, opts)
}
