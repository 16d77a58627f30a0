package certify

import (
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/node"
)

// blockRules returns the IDs of kind's block-form rules.
func blockRules(kind string) []string {
	var out []string
	for _, r := range conformance.Rules() {
		if strings.HasPrefix(r.ID, kind+"/blocks-") {
			out = append(out, r.ID)
		}
	}
	return out
}

// TestBlockForm certifies the block-table form of the built-ins that offer
// it (transfer.BlockGatherer, BlockScatterer, BlockPoster): every block
// rule runs and passes, none is skipped — on host memory, and on device
// memory for the CUDA stages (skipped without a GPU).
func TestBlockForm(t *testing.T) {
	f := node.Builtin()
	for _, tc := range blockFormSubjects {
		name := tc.kind + "/" + tc.name
		if tc.o.Memory != "" {
			name += "-on-" + tc.o.Memory
		}
		t.Run(name, func(t *testing.T) {
			if tc.o.Memory == "cuda" {
				if _, err := cuda.Open(""); err != nil {
					t.Skipf("skipping: %v (device memory needs a GPU)", err)
				}
			}
			rules := blockRules(tc.kind)
			cfg := conformance.Config{Seed: 1, Only: rules, CallTimeout: 10 * time.Second, OpTimeout: 30 * time.Second} // TestBuiltins' generous bounds
			for id, why := range tc.known {
				cfg.Skip = append(cfg.Skip, id)
				if cfg.SkipReasons == nil {
					cfg.SkipReasons = map[string]string{}
				}
				cfg.SkipReasons[id] = why
			}
			rep, err := Run(f, tc.kind, tc.name, tc.o, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ran := 0
			for _, r := range rep.Results {
				if !strings.Contains(r.Rule, "/blocks-") {
					continue
				}
				ran++
				if _, known := tc.known[r.Rule]; known && r.Outcome == conformance.Skip {
					t.Logf("%s: known defect, skipped: %s", r.Rule, r.Message)
					continue
				}
				if r.Outcome != conformance.Pass {
					t.Errorf("%s: %s %s", r.Rule, r.Outcome, r.Message)
				}
			}
			if ran != len(rules) {
				t.Errorf("%d block rules reported, want %d", ran, len(rules))
			}
		})
	}
}

// blockFormSubjects are the built-ins TestBlockForm certifies.
// known lists a subject's rules with a known defect (skipped with the
// reason; remove the entry once fixed).
var blockFormSubjects = []struct {
	kind, name string
	o          Options
	known      map[string]string
}{
	{"gather", "host", Options{}, nil},
	{"scatter", "host", Options{}, nil},
	{"engine", "loopback", Options{}, nil},
	{"gather", "cuda", Options{Memory: "cuda"}, nil},
	{"scatter", "cuda", Options{Memory: "cuda"}, nil},
}
