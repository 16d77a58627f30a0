package node

import (
	"strings"
	"testing"

	"github.com/bouncekv/bounce/config"
)

// TestNIXLFactoryOptions: bad NIXL engine options are errors naming the
// option, the value and what is accepted, before any NIXL call.
func TestNIXLFactoryOptions(t *testing.T) {
	for _, c := range []struct {
		opts map[string]string
		want string
	}{
		{map[string]string{"colour": "blue"}, "engine.options.colour: unknown option"},
		{map[string]string{"error_mode": "sometimes"}, `engine.options.error_mode = "sometimes": accepted: peer, none`},
		{map[string]string{"max_notify_size": "lots"}, `engine.options.max_notify_size = "lots"`},
		{map[string]string{"progress_thread": "maybe"}, `engine.options.progress_thread = "maybe"`},
		{map[string]string{"backend_": "x"}, "engine.options.backend_: empty backend parameter name"},
		{map[string]string{"max_notify_size": "2MiB"}, "MaxNotifySize"},
	} {
		_, err := NIXLFactory{}.CreateEngine(Settings{Name: "a"}, config.EngineConfig{Kind: "nixl", Options: c.opts})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("options %v: err = %v, want it to contain %q", c.opts, err, c.want)
		}
	}
}

// TestNIXLIsABuiltinEngine: engine.kind nixl is in the table of a build
// with -tags nixl; without the tag, building it says the build lacks NIXL
// rather than that no such engine exists.
func TestNIXLIsABuiltinEngine(t *testing.T) {
	_, ok := Builtin().Engines["nixl"]
	if ok != nixlBuilt {
		t.Fatalf("nixl factory in Builtin() = %v in a build with nixl %v", ok, nixlBuilt)
	}
	if nixlBuilt {
		return
	}
	_, err := Build(testConfig("a", "nixl", "zmq"), Builtin(), nil)
	if err == nil || !strings.Contains(err.Error(), "built without NIXL") {
		t.Fatalf("engine.kind nixl untagged: err = %v", err)
	}
}
