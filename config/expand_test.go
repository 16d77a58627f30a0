package config

import (
	"strings"
	"testing"
)

// TestYAMLEnvExpansion: ${env:NAME} in a YAML value is the variable's
// value, ${env:NAME:-default} falls back when it is unset or empty, $$ is
// a literal $, and an unset variable without a default is an error naming
// the key and the variable.
func TestYAMLEnvExpansion(t *testing.T) {
	yaml := []byte(`agent:
  name: ${env:HOST}-prefill
engine:
  listen: ${env:ADDR}:${env:PORT:-7000}
bounce:
  arena_size: ${env:ARENA}
telemetry:
  service_name: cost$$5
`)
	l, err := Load(LoadOptions{FileData: yaml, Environ: []string{"HOST=node7", "ADDR=10.0.0.2", "ARENA=64MiB", "PORT="}})
	if err != nil {
		t.Fatal(err)
	}
	c := l.Config
	if c.Agent.Name != "node7-prefill" || c.Engine.Listen != "10.0.0.2:7000" || c.Bounce.ArenaSize != 64*MiB || c.Telemetry.ServiceName != "cost$5" {
		t.Fatalf("name %q listen %q arena %v service %q", c.Agent.Name, c.Engine.Listen, c.Bounce.ArenaSize, c.Telemetry.ServiceName)
	}
	_, err = Load(LoadOptions{FileData: yaml, Environ: []string{"HOST=node7", "ARENA=64MiB"}})
	if err == nil || !strings.Contains(err.Error(), "engine.listen") || !strings.Contains(err.Error(), "ADDR is not set") {
		t.Fatalf("unset ADDR: %v, want an error naming engine.listen and ADDR", err)
	}
	if _, err := Load(LoadOptions{FileData: []byte("agent:\n  name: ${env:bad-name}\n")}); err == nil || !strings.Contains(err.Error(), "${env:NAME}") {
		t.Fatalf("malformed reference: %v", err)
	}
}

// TestEnvErrorPointsToConfigKeys: an unknown BOUNCE_ variable's error
// points to the command that lists the variables, not to Go names.
func TestEnvErrorPointsToConfigKeys(t *testing.T) {
	_, err := Load(LoadOptions{Environ: []string{"BOUNCE_MAX_INFLIGT=8"}})
	if err == nil || !strings.Contains(err.Error(), "bounce config --keys") || strings.Contains(err.Error(), "config.EnvVar") {
		t.Fatalf("%v", err)
	}
}
