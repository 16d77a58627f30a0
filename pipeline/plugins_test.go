package pipeline

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	gatherhost "github.com/bouncekv/bounce/stages/gather/host"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/transfer"
)

// buildTestPlugin builds plugins/internal/testplugin, which serves all
// five components from the in-tree implementations.
func buildTestPlugin(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "testplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "../plugins/internal/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build test plugin: %v\n%s", err, out)
	}
	return bin
}

// pluginWorld is a world whose nodes run one component (engine, control,
// gather, scatter or writer) as a real plugin process each.
func pluginWorld(bin, component string) func(testing.TB) *world {
	spec := plugins.Spec{Path: bin}
	must := func(t testing.TB, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	hostStages := func(t testing.TB, reg *mem.Registry) (transfer.Gatherer, transfer.Scatterer) {
		g, err := gatherhost.New(gatherhost.Settings{Registry: reg, Contexts: 8})
		must(t, err)
		sc, err := scatterhost.New(scatterhost.Settings{Registry: reg, Contexts: 8})
		must(t, err)
		return g, sc
	}
	return func(t testing.TB) *world {
		w := newWorld(t)
		switch component {
		case "engine":
			w.engine = func(t testing.TB, name string, _ loopback.Options) transfer.Engine {
				e, err := plugins.OpenEngine(spec, plugins.Restart{}, name, nil)
				must(t, err)
				return e
			}
		case "control":
			w.ctrl = func(t testing.TB, name string, _ transfer.Engine) transfer.ControlChannel {
				ch, err := plugins.OpenControl(spec, plugins.Restart{}, name, map[string]string{"bind_address": "127.0.0.1"})
				must(t, err)
				return ch
			}
		case "gather":
			w.stages = func(t testing.TB, name string, reg *mem.Registry, _ transfer.Engine) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
				unused, sc := hostStages(t, reg)
				unused.Close()
				g, err := plugins.OpenGatherer(spec, plugins.Restart{}, name, nil, reg)
				must(t, err)
				return g, sc, nil
			}
		case "scatter":
			w.stages = func(t testing.TB, name string, reg *mem.Registry, _ transfer.Engine) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
				g, unused := hostStages(t, reg)
				unused.Close()
				sc, err := plugins.OpenScatterer(spec, plugins.Restart{}, name, nil, reg)
				must(t, err)
				return g, sc, nil
			}
		case "writer":
			w.stages = func(t testing.TB, name string, reg *mem.Registry, eng transfer.Engine) (transfer.Gatherer, transfer.Scatterer, transfer.Writer) {
				g, sc := hostStages(t, reg)
				wr, err := plugins.OpenWriter(spec, plugins.Restart{}, name, nil, eng)
				must(t, err)
				return g, sc, wr
			}
		default:
			t.Fatalf("unknown component %q", component)
		}
		return w
	}
}

// TestEndToEndPlugins runs the end-to-end suite with each of the five
// components swapped for its plugin form: real plugin processes, memory
// shared by memfd handle, ops polled over gRPC.
func TestEndToEndPlugins(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts plugin processes")
	}
	bin := buildTestPlugin(t)
	for _, component := range []string{"engine", "control", "gather", "scatter", "writer"} {
		t.Run(component, func(t *testing.T) { e2e(t, pluginWorld(bin, component)) })
	}
}
