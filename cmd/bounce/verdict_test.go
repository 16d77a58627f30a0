package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/bouncekv/bounce/certify"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/node"
)

// TestConformanceVerdictsMatch: bounce conformance and the Go
// certification (certify.Run with certify.Waivers, as certify's
// TestBuiltins runs it) give every rule of a built-in engine the same
// outcome, and both certify it — ucx included, with its waived rules
// skipped for their reasons in both.
func TestConformanceVerdictsMatch(t *testing.T) {
	for _, name := range []string{"loopback", "tcp", "ucx"} {
		t.Run(name, func(t *testing.T) {
			js := filepath.Join(t.TempDir(), "r.json")
			out, errOut, code := bounce(t, "conformance", "engine", "--builtin", name, "--json", js)
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
			cfg := conformance.Config{Seed: 1}
			cfg.Skip, cfg.SkipReasons = certify.Waivers("engine", name)
			rep, err := certify.Run(node.Builtin(), "engine", name, certify.Options{}, cfg)
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
			}
		})
	}
}
