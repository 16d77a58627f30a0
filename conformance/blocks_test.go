package conformance_test

import (
	"strings"
	"testing"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/conformance/broken"
	"github.com/bouncekv/bounce/transfer"
)

// blockRuleIDs returns the IDs of kind's block-form rules.
func blockRuleIDs(kind string) []string {
	var out []string
	for _, r := range conformance.Rules() {
		if strings.HasPrefix(r.ID, kind+"/blocks-") {
			out = append(out, r.ID)
		}
	}
	return out
}

// blockCfg runs only kind's block rules (and the leak rule), on brokenCfg.
func blockCfg(kind string) conformance.Config {
	cfg := brokenCfg()
	cfg.Only = append(blockRuleIDs(kind), kind+"/no-goroutine-leak")
	return cfg
}

func TestBlockRulesListed(t *testing.T) {
	for _, kind := range []string{"gather", "scatter", "engine"} {
		ids := blockRuleIDs(kind)
		for _, want := range []string{"byte-exact", "failure-reported", "failure-sentinel", "done-means-landed", "repeated-ids"} {
			if kind != "engine" && want == "geometry" {
				continue
			}
			found := false
			for _, id := range ids {
				found = found || id == kind+"/blocks-"+want
			}
			if !found {
				t.Errorf("%s: no rule %s/blocks-%s among %v", kind, kind, want, ids)
			}
		}
	}
}

// requirePassed checks that every rule of rep run passed (none skipped).
func requirePassed(t *testing.T, rep conformance.Report) {
	t.Helper()
	for _, r := range rep.Results {
		if r.Outcome != conformance.Pass && !strings.Contains(r.Message, "Config.Only") {
			t.Errorf("%s: %s %s", r.Rule, r.Outcome, r.Message)
		}
	}
}

// The block rules pass the reference expansion (one run or write per
// piece over the correct in-tree stage or engine).
func TestBlockRulesPassReference(t *testing.T) {
	t.Run("gather", func(t *testing.T) {
		requirePassed(t, conformance.CheckGatherer(broken.BlockGatherers(broken.BlockNone), blockCfg("gather")))
	})
	t.Run("scatter", func(t *testing.T) {
		requirePassed(t, conformance.CheckScatterer(broken.BlockScatterers(broken.BlockNone), blockCfg("scatter")))
	})
	t.Run("engine", func(t *testing.T) {
		requirePassed(t, conformance.CheckEngine(broken.BlockEngines(broken.BlockNone), blockCfg("engine")))
	})
}

// hidden hides every method of a stage but the Gatherer's.
type hidden struct{ transfer.Gatherer }

// Without the capability every block rule is skipped, naming it.
func TestBlockRulesSkipWithoutCapability(t *testing.T) {
	plain := func() (conformance.GathererFixture, error) {
		f, err := broken.BlockGatherers(broken.BlockNone)()
		f.Gatherer = hidden{f.Gatherer}
		return f, err
	}
	rep := conformance.CheckGatherer(plain, blockCfg("gather"))
	n := 0
	for _, r := range rep.Results {
		if !strings.HasPrefix(r.Rule, "gather/blocks-") {
			continue
		}
		n++
		if r.Outcome != conformance.Skip || !strings.Contains(r.Message, "does not offer transfer.BlockGatherer") {
			t.Errorf("%s: %s %q; want skipped naming transfer.BlockGatherer", r.Rule, r.Outcome, r.Message)
		}
	}
	if n == 0 {
		t.Fatal("no block rule reported")
	}
}

func TestRejectsBrokenBlockForms(t *testing.T) {
	cases := []struct {
		kind    string
		fault   broken.BlockFault
		rule    string
		want    []string
		passing []string
	}{
		{"gather", broken.BlockIgnoreFirst, "gather/blocks-byte-exact", []string{"block gather of pieces [", "region byte"}, []string{"gather/blocks-failure-reported"}},
		{"scatter", broken.BlockIgnoreFirst, "scatter/blocks-byte-exact", []string{"block scatter of pieces [", "destination pool buffer"}, []string{"scatter/blocks-failure-reported"}},
		{"engine", broken.BlockIgnoreFirst, "engine/blocks-byte-exact", []string{"block write of pieces [", "destination pool buffer"}, []string{"engine/blocks-failure-reported"}},
		{"gather", broken.BlockIgnoreStride, "gather/blocks-byte-exact", []string{"regions apart", "region byte"}, []string{"gather/blocks-failure-sentinel"}},
		{"scatter", broken.BlockIgnoreStride, "scatter/blocks-byte-exact", []string{"bytes between pieces are guards"}, []string{"scatter/blocks-failure-sentinel"}},
		{"gather", broken.BlockUncheckedIDs, "gather/blocks-failure-reported", []string{"an id at the pool's block count", "swallowed"}, []string{"gather/blocks-byte-exact"}},
		{"scatter", broken.BlockUncheckedIDs, "scatter/blocks-failure-reported", []string{"an id at the pool's block count", "swallowed"}, []string{"scatter/blocks-byte-exact"}},
		{"engine", broken.BlockUncheckedIDs, "engine/blocks-failure-reported", []string{"a destination id at the pool's block count", "swallowed"}, []string{"engine/blocks-byte-exact"}},
		{"gather", broken.BlockCheckAsYouGo, "gather/blocks-failure-reported", []string{"an id at the pool's block count", "was refused by the call", "region buffer byte"}, []string{"gather/blocks-byte-exact"}},
		{"scatter", broken.BlockCheckAsYouGo, "scatter/blocks-failure-reported", []string{"an id at the pool's block count", "was refused by the call", "the pool buffer"}, []string{"scatter/blocks-byte-exact"}},
		{"scatter", broken.BlockBlendRepeats, "scatter/blocks-repeated-ids", []string{"which is that byte of none of the"}, []string{"scatter/blocks-byte-exact"}},
		{"engine", broken.BlockBlendRepeats, "engine/blocks-repeated-ids", []string{"which is that byte of none of the"}, []string{"engine/blocks-byte-exact"}},
		{"engine", broken.BlockSameShape, "engine/blocks-geometry", []string{"from 3 regions x 10 ids", "to 2 regions x 15 ids"}, []string{"engine/blocks-byte-exact", "engine/blocks-failure-reported"}},
	}
	for _, tc := range cases {
		t.Run(tc.kind+"/"+tc.fault.String(), func(t *testing.T) {
			cfg := blockCfg(tc.kind)
			var rep conformance.Report
			switch tc.kind {
			case "gather":
				rep = conformance.CheckGatherer(broken.BlockGatherers(tc.fault), cfg)
			case "scatter":
				rep = conformance.CheckScatterer(broken.BlockScatterers(tc.fault), cfg)
			default:
				rep = conformance.CheckEngine(broken.BlockEngines(tc.fault), cfg)
			}
			requireRejected(t, rep, tc.rule, tc.want, tc.passing)
		})
	}
}
