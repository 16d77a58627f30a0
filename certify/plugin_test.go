package certify

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/node"
)

// buildPlugin builds the plugin main package pkg (relative to this
// directory) into a temporary directory.
func buildPlugin(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// stallRules are the rules a stall of A's writes changes.
var stallRules = []string{"engine/not-quiescent", "engine/post-async", "engine/source-forget"}

// stallCfg runs stallRules with generous bounds (plugin processes on a
// loaded machine; a passing rule waits none of them out).
func stallCfg() conformance.Config {
	return conformance.Config{Seed: 1, Sizes: []uint64{4097, 1 << 20}, Only: stallRules, CallTimeout: 10 * time.Second, OpTimeout: 30 * time.Second}
}

// TestPluginStalls: the example tcp engine plugin is stalled through the
// plugin protocol (transfer.WriteStaller), so engine/not-quiescent runs
// for it instead of being skipped, and passes; engine/post-async and
// engine/source-forget run on stalled writes, not on timing.
func TestPluginStalls(t *testing.T) {
	bin := buildPlugin(t, "../plugins/examples/tcpengine")
	rep, err := Run(node.WithPlugins(node.Builtin(), bin), "engine", "plugin", Options{}, stallCfg())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range stallRules {
		r, _ := rep.Result(id)
		if r.Outcome != conformance.Pass {
			t.Errorf("%s: %s %q; want pass", id, r.Outcome, r.Message)
		}
		if strings.Contains(r.Message, "no stall") || strings.Contains(r.Message, "did not hold") {
			t.Errorf("%s ran without a stall: %q", id, r.Message)
		}
	}
	if t.Failed() {
		t.Log(rep.String())
	}
}

// TestRejectsBrokenPluginEngine: a tcp engine that gives up on a stalled
// write claiming quiescence (broken.UnprovenGiveUp), served by a real
// plugin process (conformance/broken/tcpplugin), is rejected by
// engine/not-quiescent through the plugin path — the stall crossed the
// protocol, else the rule would skip — while the same binary unbroken
// passes it.
func TestRejectsBrokenPluginEngine(t *testing.T) {
	bin := buildPlugin(t, "../conformance/broken/tcpplugin")
	f := node.WithPlugins(node.Builtin(), bin)
	for _, fault := range []string{"unproven-give-up", "none"} {
		t.Run(fault, func(t *testing.T) {
			o := Options{Engine: config.Default().Engine}
			o.Engine.Options = map[string]string{"fault": fault}
			cfg := stallCfg()
			cfg.Only = []string{"engine/byte-exact", "engine/not-quiescent"}
			rep, err := Run(f, "engine", "plugin", o, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var text strings.Builder
			if err := rep.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			t.Logf("report:\n%s", text.String())
			if r, _ := rep.Result("engine/byte-exact"); r.Outcome != conformance.Pass {
				t.Errorf("engine/byte-exact: %s %q; want pass (the fault breaks give-ups only)", r.Outcome, r.Message)
			}
			r, _ := rep.Result("engine/not-quiescent")
			if fault == "none" {
				if r.Outcome != conformance.Pass {
					t.Errorf("engine/not-quiescent, unbroken: %s %q; want pass", r.Outcome, r.Message)
				}
				return
			}
			if r.Outcome != conformance.Fail {
				t.Fatalf("engine/not-quiescent: %s %q; want fail", r.Outcome, r.Message)
			}
			for _, want := range []string{"[engine/not-quiescent] ", "given up by the engine", "does not wrap", "must say ErrNotQuiescent"} {
				if !strings.Contains(r.Message, want) {
					t.Errorf("engine/not-quiescent: message %q does not contain %q", r.Message, want)
				}
			}
		})
	}
}

// TestPluginWithoutStallerSkips: a plugin engine that does not declare
// transfer.WriteStaller (testplugin's hide_notify wrapper hides every
// optional method) has engine/not-quiescent skipped with the reason — the
// host side refused the stall — and engine/post-async falls back to
// timing and says so.
func TestPluginWithoutStallerSkips(t *testing.T) {
	bin := buildPlugin(t, "../plugins/internal/testplugin")
	o := Options{Engine: config.Default().Engine}
	o.Engine.Options = map[string]string{"hide_notify": "true"}
	cfg := stallCfg()
	cfg.Only = []string{"engine/not-quiescent", "engine/post-async"}
	rep, err := Run(node.WithPlugins(node.Builtin(), bin), "engine", "plugin", o, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := rep.Result("engine/not-quiescent")
	if r.Outcome != conformance.Skip || !strings.Contains(r.Message, "transfer.WriteStaller refused") || !strings.Contains(r.Message, "unsupported") {
		t.Errorf("engine/not-quiescent: %s %q; want skipped: the stall was refused as unsupported", r.Outcome, r.Message)
	}
	r, _ = rep.Result("engine/post-async")
	if r.Outcome != conformance.Pass || !strings.Contains(r.Message, "fell back to timing (no stall") {
		t.Errorf("engine/post-async: %s %q; want pass with the timing note", r.Outcome, r.Message)
	}
}
