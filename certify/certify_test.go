package certify

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/engines/cudacopy"
	"github.com/bouncekv/bounce/node"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBuiltins certifies every in-tree implementation with the conformance
// suite, as CI does on every change.
func TestBuiltins(t *testing.T) {
	f := node.Builtin()
	// Generous bounds, as on a loaded two-core machine under -race: with
	// the default OpTimeout (10 s, a rule abandoned after 3×) tcp's
	// engine/target-forget was once abandoned at 30 s with the load
	// average near 13. A write that never completes or a call that blocks
	// stays so until released, so these still catch them, and no rule
	// waits them out when it passes (rules that wait for nothing to happen
	// wait Settle).
	cfg := conformance.Config{Seed: 1, CallTimeout: 10 * time.Second, OpTimeout: 30 * time.Second}
	// The waivers are certify.Waivers, the list bounce conformance uses.
	for _, tc := range []struct {
		kind, name string
		o          Options
	}{
		{"engine", "loopback", Options{}},
		{"engine", "tcp", Options{}},
		{"engine", "ucx", Options{}},
		{"control", "inproc", Options{}},
		{"control", "zmq", Options{}},
		{"control", "nixlnotif", Options{Carrier: "loopback"}},
		{"control", "nixlnotif", Options{Carrier: "tcp"}},
		{"control", "nixlnotif", Options{Carrier: "ucx"}},
		{"gather", "host", Options{}},
		{"scatter", "host", Options{}},
		{"writer", "loopback", Options{}},
		{"writer", "tcp", Options{}},
		{"writer", "ucx", Options{}},
		{"engine", "cudacopy", Options{}},
		{"writer", "cudacopy", Options{}},
		{"engine", "cudacopy", Options{Memory: "cuda"}},
		{"writer", "cudacopy", Options{Memory: "cuda"}},
		{"gather", "cuda", Options{Memory: "cuda"}},
		{"scatter", "cuda", Options{Memory: "cuda"}},
	} {
		name := tc.kind + "/" + tc.name
		if tc.o.Carrier != "" {
			name += "-over-" + tc.o.Carrier
		}
		if tc.o.Memory != "" {
			name += "-on-" + tc.o.Memory
		}
		t.Run(name, func(t *testing.T) {
			if tc.name == "cudacopy" || tc.o.Memory == "cuda" {
				if _, err := cuda.Open(""); err != nil {
					t.Skipf("skipping: %v (cudacopy needs a GPU)", err)
				}
			}
			c := cfg
			c.Skip, c.SkipReasons = Waivers(tc.kind, tc.name)
			rep, err := Run(f, tc.kind, tc.name, tc.o, c)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Failures() {
				t.Errorf("%s: %s", r.Rule, r.Message)
			}
			if t.Failed() {
				t.Log(rep.String())
			}
		})
	}
}

func TestUnknownNames(t *testing.T) {
	f := node.Builtin()
	if _, err := Run(f, "engine", "infiniband", Options{}, conformance.Config{}); err == nil {
		t.Fatal("unknown engine accepted")
	}
	if _, err := Run(f, "teleporter", "x", Options{}, conformance.Config{}); err == nil {
		t.Fatal("unknown kind accepted")
	}
}

// TestWaiversNameRealRules: every waived rule exists and has a reason.
func TestWaiversNameRealRules(t *testing.T) {
	known := map[string]bool{}
	for _, r := range conformance.Rules() {
		known[r.ID] = true
	}
	for subject, w := range waivers {
		for id, why := range w {
			if !known[id] || why == "" {
				t.Errorf("%s: waiver %q (reason %q) names no rule or gives no reason", subject, id, why)
			}
		}
	}
	for _, name := range []string{"nixl", "ucx"} {
		if skip, why := Waivers("engine", name); len(skip) != len(why) || len(skip) == 0 {
			t.Fatalf("Waivers(engine, %s) = %v, %v", name, skip, why)
		}
	}
	if skip, _ := Waivers("engine", "tcp"); skip != nil {
		t.Fatalf("tcp has waivers: %v", skip)
	}
}

// TestStartFailure: a subject that cannot be created — here the tcp engine
// given an option it does not know — is a *StartError naming the cause,
// and no rule runs.
func TestStartFailure(t *testing.T) {
	o := Options{Engine: config.Default().Engine}
	o.Engine.Options = map[string]string{"bogus": "1"}
	rep, err := Run(node.Builtin(), "engine", "tcp", o, conformance.Config{Seed: 1})
	var start *StartError
	if !errors.As(err, &start) || start.Subject != "engine/tcp" || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("Run = %v (%T), want a *StartError for engine/tcp naming the option", err, err)
	}
	if len(rep.Results) != 0 {
		t.Fatalf("%d rules ran", len(rep.Results))
	}
}

// TestAbsentCapabilities: the report lists what the subject lacks of the
// optional capabilities — nothing for the tcp engine, which has them all;
// the loopback engine has no peer-loss reports and no write guard.
func TestAbsentCapabilities(t *testing.T) {
	cfg := conformance.Config{Seed: 1, Only: []string{"engine/unknown-peer"}}
	rep, err := Run(node.Builtin(), "engine", "tcp", Options{}, cfg)
	if err != nil || !rep.Passed() || len(rep.Absent) != 0 {
		t.Fatalf("tcp: absent %q, err %v, passed %v", rep.Absent, err, rep.Passed())
	}
	rep, err = Run(node.Builtin(), "engine", "loopback", Options{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"transfer.PeerLossReporter", "transfer.WriteGuarded"}; !slices.Equal(rep.Absent, want) {
		t.Fatalf("loopback: absent %q, want %q", rep.Absent, want)
	}
}

// Without a GPU, certifying a CUDA implementation on device memory (what
// --memory auto picks for one) skips every rule with the driver's reason.
func TestCUDAMemoryWithoutGPU(t *testing.T) {
	f := node.Builtin()
	lib := &cuda.Lib{Path: "libcuda-missing.so.1"}
	f.CUDA = lib
	f.Engines["cudacopy"] = &node.CUDACopyFactory{Fabric: cudacopy.NewFabric(lib)}
	f.Gatherers["cuda"] = node.CUDAGatherFactory{Lib: lib}
	f.Scatterers["cuda"] = node.CUDAScatterFactory{Lib: lib}
	for _, kind := range []string{"engine", "writer", "gather", "scatter"} {
		name := "cuda"
		if kind == "engine" || kind == "writer" {
			name = "cudacopy"
		}
		rep, err := Run(f, kind, name, Options{Memory: "auto"}, conformance.Config{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Results) < 2 {
			t.Fatalf("%s/%s: %d results", kind, name, len(rep.Results))
		}
		for _, r := range rep.Results {
			if strings.HasSuffix(r.Rule, "/no-goroutine-leak") {
				continue // checked after every skipped rule too
			}
			if r.Outcome != conformance.Skip || !strings.Contains(r.Message, "cuda:0 memory unavailable here") || !strings.Contains(r.Message, "libcuda-missing") {
				t.Errorf("%s/%s %s: %v %q; want skipped with the driver's reason", kind, name, r.Rule, r.Outcome, r.Message)
			}
		}
	}
}

func TestUnknownMemory(t *testing.T) {
	_, err := Run(node.Builtin(), "engine", "loopback", Options{Memory: "hbm"}, conformance.Config{})
	if err == nil || !strings.Contains(err.Error(), `unknown memory "hbm"`) {
		t.Fatalf("err = %v; want unknown memory", err)
	}
}

// TestTCPStalls: the suite stalls the tcp engine's writes on purpose
// through its transfer.WriteStaller, so engine/not-quiescent runs for tcp
// instead of being skipped, and passes.
func TestTCPStalls(t *testing.T) {
	cfg := stallCfg()
	rep, err := Run(node.Builtin(), "engine", "tcp", Options{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range cfg.Only {
		if r, _ := rep.Result(id); r.Outcome != conformance.Pass {
			t.Errorf("%s: %s %q; want pass", id, r.Outcome, r.Message)
		}
	}
	if r, _ := rep.Result("engine/source-forget"); strings.Contains(r.Message, "no stall") {
		t.Errorf("engine/source-forget ran without a stall: %q", r.Message)
	}
}
