package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/bouncekv/bounce/certify"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/node"
)

// TestConformanceVerdictsMatch: bounce conformance and the Go
// certification (certify.Run with certify.Waivers, as certify's
// TestBuiltins runs it) give every rule of a built-in engine the same
// outcome, and both certify it — ucx included, with its waived rules
// skipped for their reasons in both — and so for the example tcp engine
// plugin (--plugin), through real plugin processes, whose
// engine/not-quiescent runs (its writes stalled through the plugin
// protocol) and passes in both.
func TestConformanceVerdictsMatch(t *testing.T) {
	for _, name := range []string{"loopback", "tcp", "ucx", "plugin"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			js := filepath.Join(dir, "r.json")
			args := append([]string{"conformance", "engine", "--builtin", name, "--json", js}, loadedBounds...)
			f := node.Builtin()
			if name == "plugin" {
				// The example tcp engine plugin, in its own process.
				bin := filepath.Join(dir, "tcpengine")
				if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/examples/tcpengine").CombinedOutput(); err != nil {
					t.Fatalf("build example plugin: %v\n%s", err, out)
				}
				args = append([]string{"conformance", "engine", "--plugin", bin, "--json", js}, loadedBounds...)
				f = node.WithPlugins(f, bin)
			}
			out, errOut, code := bounce(t, args...)
			if code != 0 {
				t.Fatalf("bounce conformance engine --builtin %s: exit %d\n%s\n%s", name, code, out, errOut)
			}
			var cli struct {
				Results []struct {
					Rule    string
					Outcome conformance.Outcome
					Message string
				}
			}
			b, err := os.ReadFile(js)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &cli); err != nil {
				t.Fatal(err)
			}
			// The bounds loadedBounds gives the CLI (certify's TestBuiltins
			// uses the same).
			cfg := conformance.Config{Seed: 1, CallTimeout: 10 * time.Second, OpTimeout: 30 * time.Second}
			cfg.Skip, cfg.SkipReasons = certify.Waivers("engine", name)
			rep, err := certify.Run(f, "engine", name, certify.Options{}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Passed() {
				t.Fatalf("certify.Run: %s\n%v", rep, rep.Failures())
			}
			if len(cli.Results) != len(rep.Results) {
				t.Fatalf("the CLI reported %d rules, certify.Run %d", len(cli.Results), len(rep.Results))
			}
			for i, r := range rep.Results {
				c := cli.Results[i]
				if c.Rule != r.Rule || c.Outcome != r.Outcome {
					t.Errorf("rule %d: the CLI says %s %s (%q), certify.Run %s %s (%q)", i, c.Rule, c.Outcome, c.Message, r.Rule, r.Outcome, r.Message)
				}
				// Every engine here can be stalled (loopback by its
				// fixture, tcp and the plugin through
				// transfer.WriteStaller, ucx is waived): none skips the
				// stall rule.
				if r.Rule == "engine/not-quiescent" && name != "ucx" && (r.Outcome != conformance.Pass || c.Outcome != conformance.Pass) {
					t.Errorf("%s: the CLI says %s (%q), certify.Run %s (%q); want pass in both (the writes are stalled)", r.Rule, c.Outcome, c.Message, r.Outcome, r.Message)
				}
			}
		})
	}
}
