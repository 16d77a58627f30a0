package node

import (
	"strings"
	"testing"

	"github.com/bouncekv/bounce/config"
)

func TestWithPluginsAddsKindsWithoutMutating(t *testing.T) {
	base := Builtin()
	f := WithPlugins(base, "")
	if _, ok := f.Engines["plugin"]; !ok {
		t.Fatal("no plugin engine factory")
	}
	if _, ok := f.Controls["plugin"]; !ok {
		t.Fatal("no plugin control factory")
	}
	if _, ok := base.Engines["plugin"]; ok {
		t.Fatal("WithPlugins mutated its input")
	}
	_, err := f.Engines["plugin"].CreateEngine(Settings{Name: "a"}, config.EngineConfig{Kind: "plugin"})
	if err == nil || !strings.Contains(err.Error(), "engine.plugin") {
		t.Fatalf("no plugin path: %v", err)
	}
}
