package conformance_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/conformance/broken"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/transfer"
)

// brokenCfg keeps the runs against broken fixtures short: small sizes and
// a short OpTimeout, since many rules end by waiting it out.
func brokenCfg() conformance.Config {
	return conformance.Config{
		Sizes:     []uint64{1, 4097, 65536},
		OpTimeout: 400 * time.Millisecond,
		Seed:      7,
	}
}

// requireRejected checks that rep failed rule with a message naming it and
// containing every one of want, and that every rule in passing passed.
func requireRejected(t *testing.T, rep conformance.Report, rule string, want []string, passing []string) {
	t.Helper()
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", text.String())
	if rep.Passed() {
		t.Fatalf("the suite passed a broken implementation")
	}
	res, ok := rep.Result(rule)
	if !ok {
		t.Fatalf("no result for %s", rule)
	}
	if res.Outcome != conformance.Fail {
		t.Fatalf("%s: outcome %s, want fail (message %q)", rule, res.Outcome, res.Message)
	}
	if !strings.HasPrefix(res.Message, "["+rule+"] ") {
		t.Errorf("%s: message %q does not start with the rule ID", rule, res.Message)
	}
	for _, w := range want {
		if !strings.Contains(res.Message, w) {
			t.Errorf("%s: message %q does not contain %q", rule, res.Message, w)
		}
	}
	for _, id := range passing {
		if r, _ := rep.Result(id); r.Outcome != conformance.Pass {
			t.Errorf("%s: outcome %s, want pass: the fault should not break it (%s)", id, r.Outcome, r.Message)
		}
	}
}

func TestRejectsBrokenEngines(t *testing.T) {
	cases := []struct {
		fault   broken.Fault
		rule    string
		want    []string
		passing []string
	}{
		{broken.CorruptByte, "engine/byte-exact", []string{"write of 1 bytes", "destination byte 0 = ", "want"}, []string{"engine/failure-reported", "engine/no-goroutine-leak"}},
		{broken.EarlyDone, "engine/done-means-landed", []string{"when Poll first reported done", "Done was reported before the data landed"}, []string{"engine/byte-exact"}},
		{broken.NeverComplete, "engine/byte-exact", []string{"did not complete within OpTimeout"}, []string{"engine/failure-reported"}},
		{broken.SwallowFailure, "engine/failure-reported", []string{"Poll reported done", "swallowed"}, []string{"engine/byte-exact", "engine/done-means-landed", "engine/release-terminal"}},
		{broken.LateWrite, "engine/quiescent-after-done", []string{"changed from", "after Poll reported done"}, []string{"engine/byte-exact", "engine/done-means-landed", "engine/failure-reported"}},
		{broken.LeakGoroutine, "engine/no-goroutine-leak", []string{"after rule engine/byte-exact", "broken/broken.go"}, []string{"engine/byte-exact", "engine/done-means-landed"}},
	}
	for _, tc := range cases {
		t.Run(tc.fault.String(), func(t *testing.T) {
			newPair, stop := broken.Engines(tc.fault)
			defer stop()
			cfg := brokenCfg()
			switch tc.fault {
			case broken.NeverComplete:
				// Every rule that waits for an op waits out OpTimeout.
				cfg.OpTimeout = 200 * time.Millisecond
			case broken.LateWrite:
				// Room for the late copy to land even on a loaded machine.
				cfg.Settle = 250 * time.Millisecond
			case broken.LeakGoroutine:
				// Each leaking rule costs goleak's retries (~0.5s).
				cfg.Only = []string{"engine/byte-exact", "engine/done-means-landed", "engine/no-goroutine-leak"}
			}
			rep := conformance.CheckEngine(newPair, cfg)
			requireRejected(t, rep, tc.rule, tc.want, tc.passing)
		})
	}
}

func TestRejectsCrosstalkChannel(t *testing.T) {
	rep := conformance.CheckControlChannel(broken.CrosstalkChannels(), brokenCfg())
	requireRejected(t, rep, "control/no-crosstalk", []string{`sent by "c", reported as from "b"`},
		[]string{"control/round-trip", "control/order", "control/no-goroutine-leak"})
}

func TestRejectsPartialGatherer(t *testing.T) {
	rep := conformance.CheckGatherer(broken.PartialGatherers(), brokenCfg())
	requireRejected(t, rep, "gather/failure-reported", []string{"was refused by the call", "region buffer byte"},
		[]string{"gather/byte-exact", "gather/done-means-landed", "gather/failure-sentinel"})
}

// hangingEngine blocks in PostWrite until release is closed.
type hangingEngine struct {
	*loopback.Engine
	release <-chan struct{}
}

func (e hangingEngine) PostWrite(peer string, ops []transfer.WriteOp) (transfer.Op, error) {
	<-e.release
	return nil, transfer.ErrClosed
}

func TestHungRuleIsAbandoned(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	newPair := func() (conformance.EnginePair, error) {
		p, err := loopbackPair()
		if err == nil {
			p.A = hangingEngine{Engine: p.A.(*loopback.Engine), release: release}
		}
		return p, err
	}
	cfg := brokenCfg()
	cfg.OpTimeout = 100 * time.Millisecond
	cfg.Only = []string{"engine/byte-exact", "engine/notify-timeout"}
	start := time.Now()
	rep := conformance.CheckEngine(newPair, cfg)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the run took %v", d)
	}
	requireRejected(t, rep, "engine/byte-exact", []string{"did not complete within 300ms (3×OpTimeout)", "posting write of 1 bytes"},
		[]string{"engine/notify-timeout"})
	if r, _ := rep.Result("engine/multi-op"); r.Outcome != conformance.Skip || !strings.Contains(r.Message, "Config.Only") {
		t.Errorf("engine/multi-op: %s %q, want skipped for Config.Only", r.Outcome, r.Message)
	}
}
