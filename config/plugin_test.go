package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestPluginBlocks: one plugin block shape for all five components; the
// old string path of engine.plugin still works; the old stages.plugin key
// is refused with how to say it now.
func TestPluginBlocks(t *testing.T) {
	l, err := Load(LoadOptions{FileData: []byte(`
engine: {kind: plugin, plugin: ./eng}
control_plane: {kind: plugin, plugin: {path: /opt/ctl, env: [A=1], inherit_env: true}}
stages:
  gather: {plugin: {path: ./g, args: [-v, 2], checksum: "sha256:` + strings.Repeat("ab", 32) + `", options: {copy: 8}, restart_backoff: 1s}}
  scatter: host
  write: {plugin: ./w}
`)})
	if err != nil {
		t.Fatal(err)
	}
	c := l.Config
	def := DefaultPlugin()
	if c.Engine.Plugin.Path != "./eng" || c.Engine.Plugin.MaxRestarts != def.MaxRestarts {
		t.Errorf("engine.plugin string form: %+v", c.Engine.Plugin)
	}
	if p := c.ControlPlane.Plugin; p.Path != "/opt/ctl" || !p.InheritEnv || !reflect.DeepEqual(p.Env, []string{"A=1"}) {
		t.Errorf("control_plane.plugin: %+v", p)
	}
	g := c.Stages.Gather
	if g.Kind != "plugin" || g.Plugin.Path != "./g" || !reflect.DeepEqual(g.Plugin.Args, []string{"-v", "2"}) ||
		g.Plugin.Options["copy"] != "8" || g.Plugin.RestartBackoff != time.Second || g.Plugin.MaxRestarts != def.MaxRestarts {
		t.Errorf("stages.gather: %+v", g)
	}
	if c.Stages.Scatter.Kind != "host" || c.Stages.Write.Kind != "plugin" || c.Stages.Write.Plugin.Path != "./w" {
		t.Errorf("stages: %+v", c.Stages)
	}
	if l.Sources["stages.gather"] != "file:inline" {
		t.Errorf("source of stages.gather: %q", l.Sources["stages.gather"])
	}

	_, err = Load(LoadOptions{FileData: []byte("stages: {gather: plugin, plugin: ./g}\n")})
	ke := findKeyError(t, err, "stages.plugin", ErrUnknownKey)
	if !strings.Contains(ke.Error(), "stages.gather: {plugin: {path:") {
		t.Errorf("old form: %v", ke)
	}
	_, err = Load(LoadOptions{FileData: []byte("stages: {gather: {plugin: {path: ./g, evn: [A=1]}}}\n")})
	if ke := findKeyError(t, err, "stages.gather", ErrBadValue); !strings.Contains(ke.Error(), "inherit_env") {
		t.Errorf("misspelt block key: %v", ke)
	}
	_, err = Load(LoadOptions{FileData: []byte("stages: {gather: plugin}\n")})
	if ke := findKeyError(t, err, "stages.gather", ErrOutOfRange); !strings.Contains(ke.Error(), "needs its binary") {
		t.Errorf("plugin without a path: %v", ke)
	}
	// Environment and flags take the scalar forms: a kind, a path.
	l, err = Load(LoadOptions{Environ: []string{"BOUNCE_ENGINE_KIND=plugin", "BOUNCE_ENGINE_PLUGIN=/bin/eng", "BOUNCE_STAGES_SCATTER=host"}})
	if err != nil {
		t.Fatal(err)
	}
	if l.Config.Engine.Plugin.Path != "/bin/eng" {
		t.Errorf("env: %+v", l.Config.Engine.Plugin)
	}
}
