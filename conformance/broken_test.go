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

// brokenCfg keeps the runs against broken fixtures short: small sizes (the
// suite adds a write above 1 MiB) and a short OpTimeout, since many rules
// end by waiting it out.
func brokenCfg() conformance.Config {
	return conformance.Config{
		Sizes:     []uint64{1, 4097, 65536},
		OpTimeout: time.Second,
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
		{broken.IgnoreTargetForget, "engine/target-forget", []string{"B.ForgetPeer(A)"}, []string{"engine/byte-exact", "engine/forget-peer", "engine/source-forget"}},
		{broken.LandAfterLost, "engine/source-forget", []string{"after A.ForgetPeer: Poll reported failed", "once an op reports ErrPeerLost none of its bytes may land"}, []string{"engine/byte-exact", "engine/target-forget"}},
		{broken.UnstableStatus, "engine/terminal-stable", []string{"after other ops were released it reported pending", "a terminal status (and its error) never changes"}, []string{"engine/byte-exact", "engine/poll-contract"}},
		{broken.UnprovenGiveUp, "engine/not-quiescent", []string{"given up by the engine", "does not wrap", "must say ErrNotQuiescent"}, []string{"engine/byte-exact", "engine/failure-reported"}},
		{broken.ReorderLarge, "engine/notify-order-sizes", []string{"order per peer holds for every payload size"}, []string{"engine/notify-order", "engine/byte-exact"}},
		// brokenCfg's Sizes stop at 64 KiB: the suite adds the large writes.
		{broken.CorruptLarge, "engine/byte-exact", []string{"write of 1052673 bytes"}, []string{"engine/failure-reported"}},
		{broken.CorruptAboveFragment, "engine/byte-exact", []string{"write of 2101249 bytes"}, []string{"engine/failure-reported"}},
		{broken.SyncPost, "engine/post-async", []string{"PostWrite did not return within CallTimeout", "while A's writes were stalled"}, []string{"engine/byte-exact"}},
		{broken.LateRefusedWrite, "engine/failure-reported", []string{"write from unregistered source memory was refused", "destination buffer byte"}, []string{"engine/byte-exact"}},
		{broken.IgnoreGuard, "engine/write-guard", []string{"without asking its guard"}, []string{"engine/byte-exact"}},
		{broken.LapsingFence, "engine/target-forget", []string{"posted after B.ForgetPeer(A) returned (#3), 150ms later", "Poll reported done"}, []string{"engine/byte-exact", "engine/forget-peer"}},
		{broken.ReplayAfterReload, "engine/target-forget", []string{"was refused, but once B loaded A again and A wrote anew", "a refused write never lands later"}, []string{"engine/byte-exact", "engine/forget-peer"}},
		{broken.ForgetFailsDone, "engine/terminal-after-forget", []string{"after A.ForgetPeer(B) it reported failed", "a terminal status never changes"}, []string{"engine/byte-exact", "engine/terminal-stable"}},
		{broken.SerialPost, "engine/post-async", []string{"PostWrite did not return within CallTimeout", "while 1 earlier write(s) were in flight"}, []string{"engine/byte-exact"}},
		{broken.Retransmit, "engine/quiescent-after-done", []string{"within 300ms after Poll reported done and the op was released", "bytes re-sent later included"}, []string{"engine/byte-exact", "engine/done-means-landed"}},
		{broken.HastyGiveUp, "engine/not-quiescent", []string{"given up by the engine", "must say ErrNotQuiescent", "within 300ms"}, []string{"engine/byte-exact"}},
		{broken.EndExclusive, "engine/bounds-edges", []string{"ending at the last byte of the registered source", "rejected", "out of bounds"}, []string{"engine/byte-exact"}},
		{broken.Drop4G, "engine/bounds-edges", []string{"across the 4 GiB-aligned address", "destination byte"}, []string{"engine/byte-exact"}},
		{broken.StaleDeregister, "engine/deregister-idle", []string{"Poll reported done; deregistered memory is no destination any more"}, []string{"engine/byte-exact"}},
		{broken.RedeliverOnReload, "engine/notify-after-write", []string{"which it had received before", "never delivers an old notification again"}, []string{"engine/byte-exact", "engine/notify-order"}},
		{broken.AckBeforeApply, "engine/notify-after-write", []string{"before its bytes were visible", "write of 307200 bytes"}, []string{"engine/byte-exact", "engine/done-means-landed"}},
		{broken.BlockingConnect, "engine/connect", []string{"posted right after A.Connect(B)", "the call blocked"}, []string{"engine/byte-exact"}},
		{broken.GuardCached, "engine/write-guard", []string{"the same write again once its grant was revoked", "Poll reported done"}, []string{"engine/byte-exact"}},
		{broken.GuardStartOnly, "engine/write-guard", []string{"write starting inside a grant (its first half) and ending outside it", "Poll reported done"}, []string{"engine/byte-exact"}},
		{broken.ReadUnguarded, "engine/read-guarded", []string{"read with no read guard installed at B", "Poll reported done"}, []string{"engine/byte-exact"}},
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
			case broken.SyncPost:
				// Rules that stall a write hang in its post until abandoned.
				cfg.Only = []string{"engine/byte-exact", "engine/post-async"}
			case broken.SerialPost:
				// Rules that stall several writes hang in the second post.
				cfg.Only = []string{"engine/byte-exact", "engine/post-async"}
			case broken.GuardCached, broken.GuardStartOnly, broken.ReadUnguarded:
				cfg.Only = []string{"engine/byte-exact", tc.rule}
				cfg.OpTimeout = 10 * time.Second // tcp, which may be slow under -race
			case broken.HastyGiveUp, broken.BlockingConnect, broken.EndExclusive, broken.Drop4G, broken.StaleDeregister:
				// The rule at stake and byte-exact only: the other rules
				// would pass or fail for the same reason at length.
				cfg.Only = []string{"engine/byte-exact", tc.rule}
			case broken.ForgetFailsDone:
				cfg.Only = []string{"engine/byte-exact", "engine/terminal-stable", tc.rule}
			case broken.LapsingFence, broken.ReplayAfterReload:
				cfg.Only = []string{"engine/byte-exact", "engine/forget-peer", tc.rule}
			case broken.RedeliverOnReload:
				cfg.Only = []string{"engine/byte-exact", "engine/notify-order", tc.rule}
			case broken.Retransmit, broken.AckBeforeApply:
				cfg.Only = []string{"engine/byte-exact", "engine/done-means-landed", tc.rule}
			case broken.LateRefusedWrite:
				// Room for the late copy to land even on a loaded machine.
				cfg.Settle = 100 * time.Millisecond
			case broken.LandAfterLost:
				// The late bytes come 50ms after ForgetPeer: after the
				// snapshots, within Settle. Its rules end well before
				// OpTimeout, so a long one costs nothing but keeps a loaded
				// machine from abandoning a rule at 3×OpTimeout.
				cfg.Settle = 500 * time.Millisecond
				cfg.OpTimeout = 10 * time.Second
			}
			rep := conformance.CheckEngine(newPair, cfg)
			requireRejected(t, rep, tc.rule, tc.want, tc.passing)
		})
	}
}

// TestRejectsSyncPostWithoutStall: without EnginePair.StallWrites, an
// engine whose ops are never pending is reported, not skipped.
func TestRejectsSyncPostWithoutStall(t *testing.T) {
	newPair, stop := broken.Engines(broken.SyncPost)
	defer stop()
	noStall := func() (conformance.EnginePair, error) {
		p, err := newPair()
		p.StallWrites = nil
		return p, err
	}
	cfg := brokenCfg()
	cfg.Only = []string{"engine/byte-exact", "engine/post-async", "engine/not-quiescent"}
	rep := conformance.CheckEngine(noStall, cfg)
	requireRejected(t, rep, "engine/post-async", []string{"was pending at its first Poll in 20 attempts", "it must be asynchronous"}, []string{"engine/byte-exact"})
	if r, _ := rep.Result("engine/not-quiescent"); r.Outcome != conformance.Skip || !strings.Contains(r.Message, "StallWrites is nil") {
		t.Errorf("engine/not-quiescent: %s %q, want skipped naming the missing StallWrites", r.Outcome, r.Message)
	}
}

// TestFailureBlamesTheCaseThatWrote: with LateRefusedWrite only the
// unregistered-source case writes; no other case may be blamed.
func TestFailureBlamesTheCaseThatWrote(t *testing.T) {
	newPair, stop := broken.Engines(broken.LateRefusedWrite)
	defer stop()
	cfg := brokenCfg()
	cfg.Settle = 100 * time.Millisecond
	cfg.Only = []string{"engine/failure-reported"}
	rep := conformance.CheckEngine(newPair, cfg)
	res, _ := rep.Result("engine/failure-reported")
	for _, other := range []string{"write to unregistered destination memory", "write straddling", "write from a source straddling", "wraps the address space", "Src.Len != Dst.Len", "post of two writes"} {
		if strings.Contains(res.Message, other) {
			t.Errorf("the failure blames %q, which wrote nothing: %s", other, res.Message)
		}
	}
	if !strings.Contains(res.Message, "write from unregistered source memory") {
		t.Errorf("the failure does not name the case that wrote: %q", res.Message)
	}
}

func TestSkipReasonsShown(t *testing.T) {
	cfg := brokenCfg()
	cfg.Only = []string{"engine/unknown-peer"}
	cfg.Skip = []string{"engine/target-forget"}
	cfg.SkipReasons = map[string]string{"engine/target-forget": "the engine documents it cannot fence"}
	rep := conformance.CheckEngine(loopbackPair, cfg)
	if r, _ := rep.Result("engine/target-forget"); r.Outcome != conformance.Skip || !strings.Contains(r.Message, "the engine documents it cannot fence") {
		t.Errorf("engine/target-forget: %s %q, want skipped with its reason", r.Outcome, r.Message)
	}
	cfg.SkipReasons = map[string]string{"engine/byte-exact": "not listed in Skip"}
	if r, _ := conformance.CheckEngine(loopbackPair, cfg).Result("engine/config"); r.Outcome != conformance.Fail {
		t.Errorf("a reason for a rule not in Skip: %s %q, want a config failure", r.Outcome, r.Message)
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
	// A rule not abandoned would hang until release (the test's end); the
	// bound only tells that from abandonment, generous for a loaded box.
	if d := time.Since(start); d > time.Minute {
		t.Errorf("the run took %v", d)
	}
	requireRejected(t, rep, "engine/byte-exact", []string{"did not complete within 300ms (3×OpTimeout)", "posting write of 1 bytes"},
		[]string{"engine/notify-timeout"})
	if r, _ := rep.Result("engine/multi-op"); r.Outcome != conformance.Skip || !strings.Contains(r.Message, "Config.Only") {
		t.Errorf("engine/multi-op: %s %q, want skipped for Config.Only", r.Outcome, r.Message)
	}
}

// TestUnbrokenWrappersCertify: the wrappers the faults are built in break
// nothing by themselves — fault zero over loopback, and over tcp with B's
// guard wrapper in place — so a rejection is the fault's doing.
func TestUnbrokenWrappersCertify(t *testing.T) {
	newPair, stop := broken.Engines(0)
	defer stop()
	for name, f := range map[string]conformance.EngineFactory{"loopback": newPair, "tcp": broken.TCPEngines(0)} {
		t.Run(name, func(t *testing.T) {
			cfg := brokenCfg()
			// Generous bounds: nothing here is broken, so no rule waits
			// them out, and on a loaded machine under -race tcp's forget
			// (which waits for the peer to close, tcp.Config.FenceTimeout)
			// and a Notify that does not block can overrun the defaults.
			cfg.OpTimeout, cfg.CallTimeout = 30*time.Second, 10*time.Second
			rep := conformance.CheckEngine(f, cfg)
			for _, r := range rep.Failures() {
				t.Errorf("%s: %s", r.Rule, r.Message)
			}
			if t.Failed() {
				t.Log(rep.String())
			}
		})
	}
}

// TestReadRulesOverTCP: tcp engines read and serve reads, so the read
// rules run and pass on them (loopback's pass in TestLoopbackEngine); over
// the broken package's loopback wrapper, which embeds the interface and so
// hides the capability, they skip saying why. The unguarded fixture fails
// engine/read-byte-exact too: B served without asking its guard.
func TestReadRulesOverTCP(t *testing.T) {
	rules := []string{"engine/read-byte-exact", "engine/read-guarded", "engine/read-after-forget"}
	cfg := brokenCfg()
	cfg.OpTimeout, cfg.CallTimeout = 30*time.Second, 10*time.Second
	cfg.Only = rules
	rep := conformance.CheckEngine(broken.TCPEngines(0), cfg)
	for _, id := range rules {
		if r, _ := rep.Result(id); r.Outcome != conformance.Pass {
			t.Errorf("tcp: %s: %s %q, want pass", id, r.Outcome, r.Message)
		}
	}
	newPair, stop := broken.Engines(0)
	defer stop()
	rep = conformance.CheckEngine(newPair, cfg)
	for _, id := range rules {
		if r, _ := rep.Result(id); r.Outcome != conformance.Skip || !strings.Contains(r.Message, "transfer.Reader") {
			t.Errorf("loopback: %s: %s %q, want skipped for transfer.Reader", id, r.Outcome, r.Message)
		}
	}
	cfg.Only = []string{"engine/read-byte-exact"}
	cfg.OpTimeout = 10 * time.Second
	rep = conformance.CheckEngine(broken.TCPEngines(broken.ReadUnguarded), cfg)
	requireRejected(t, rep, "engine/read-byte-exact", []string{"without asking its read guard"}, nil)
}
