package config

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestPluginBlockKeysAreFlagsAndVariables: every key of a plugin block is a
// flag and an environment variable of its own, so a stage plugin is chosen
// without YAML; the layers merge a block key by key (a flag adds a
// checksum to the file's engine.plugin: /path), and each block key has its
// source.
func TestPluginBlockKeysAreFlagsAndVariables(t *testing.T) {
	sum := "sha256:" + strings.Repeat("ab", 32)
	fs := flags(t,
		"--stages.gather.plugin.path", "/opt/g",
		"--stages.gather.plugin.options", "a=1", "--stages.gather.plugin.options", "b=2",
		"--stages.gather.plugin.args", "--rails,4",
		"--stages.gather.plugin.inherit-env",
		"--engine.plugin.checksum", sum,
	)
	l := mustLoad(t, LoadOptions{
		FileData: []byte("engine:\n  kind: plugin\n  plugin: /opt/e\n"),
		Environ:  []string{"BOUNCE_STAGES_SCATTER_PLUGIN_PATH=/opt/s", "BOUNCE_STAGES_SCATTER_PLUGIN_MAX_RESTARTS=2", "BOUNCE_STAGES_SCATTER_PLUGIN_ENV=A=1,B=2"},
		Flags:    fs,
	})
	c := l.Config
	g := c.Stages.Gather
	if g.Kind != "plugin" || g.Plugin.Path != "/opt/g" || !reflect.DeepEqual(g.Plugin.Options, map[string]string{"a": "1", "b": "2"}) ||
		!reflect.DeepEqual(g.Plugin.Args, []string{"--rails", "4"}) || !g.Plugin.InheritEnv || g.Plugin.MaxRestarts != 5 {
		t.Errorf("stages.gather from flags: %+v", g)
	}
	s := c.Stages.Scatter
	if s.Kind != "plugin" || s.Plugin.Path != "/opt/s" || s.Plugin.MaxRestarts != 2 || !reflect.DeepEqual(s.Plugin.Env, []string{"A=1", "B=2"}) || s.Plugin.RestartBackoff != 100*time.Millisecond {
		t.Errorf("stages.scatter from the environment: %+v", s)
	}
	if e := c.Engine.Plugin; e.Path != "/opt/e" || e.Checksum != sum {
		t.Errorf("engine.plugin: the file's path and the flag's checksum, got %+v", e)
	}
	for k, want := range map[string]Source{
		"stages.gather":                      "flag:--stages.gather.plugin.path",
		"stages.gather.plugin.path":          "flag:--stages.gather.plugin.path",
		"stages.gather.plugin.options":       "flag:--stages.gather.plugin.options",
		"stages.gather.plugin.checksum":      SourceDefault,
		"stages.scatter.plugin.path":         "env:BOUNCE_STAGES_SCATTER_PLUGIN_PATH",
		"stages.scatter.plugin.max_restarts": "env:BOUNCE_STAGES_SCATTER_PLUGIN_MAX_RESTARTS",
		"engine.plugin.path":                 "file:inline",
		"engine.plugin.checksum":             "flag:--engine.plugin.checksum",
		"stages.write.plugin.path":           SourceDefault,
	} {
		if got := l.Sources[k]; got != want && !(k == "stages.gather" && strings.HasPrefix(string(got), "flag:--stages.gather.plugin.")) {
			t.Errorf("source of %s: %q, want %q", k, got, want)
		}
	}
	if FlagName("stages.gather.plugin.inherit_env") != "stages.gather.plugin.inherit-env" || EnvVar("control_plane.plugin.path") != "BOUNCE_CONTROL_PLANE_PLUGIN_PATH" {
		t.Error("block keys' flag and variable names")
	}
}

// TestPluginBlockKeysBadValues: a block key's bad text is an error naming
// the key, its source and what it accepts — from a flag at parse time,
// from a variable at Load.
func TestPluginBlockKeysBadValues(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	RegisterFlags(fs)
	if err := fs.Parse([]string{"--stages.gather.plugin.max-restarts", "many"}); err == nil || !strings.Contains(err.Error(), "stages.gather.plugin.max_restarts: want a whole number") {
		t.Errorf("bad flag: %v", err)
	}
	_, err := Load(LoadOptions{Environ: []string{"BOUNCE_ENGINE_PLUGIN_RESTART_BACKOFF=5", "BOUNCE_STAGES_WRITE_PLUGIN_OPTIONS=novalue"}})
	for _, key := range []string{"engine.plugin.restart_backoff", "stages.write.plugin.options"} {
		ke := findKeyError(t, err, key, ErrBadValue)
		if !strings.HasPrefix(string(ke.Source), "env:BOUNCE_") {
			t.Errorf("%s: source %q", key, ke.Source)
		}
	}
	// A range error is the block's, as from YAML.
	_, err = Load(LoadOptions{Environ: []string{"BOUNCE_STAGES_GATHER_PLUGIN_PATH=/x", "BOUNCE_STAGES_GATHER_PLUGIN_MAX_RESTARTS=1000"}})
	if ke := findKeyError(t, err, "stages.gather.plugin.max_restarts", ErrOutOfRange); !strings.Contains(ke.Error(), "between 0 and 100") {
		t.Errorf("range: %v", ke)
	}
	if !errors.Is(err, ErrOutOfRange) {
		t.Errorf("not ErrOutOfRange: %v", err)
	}
}
