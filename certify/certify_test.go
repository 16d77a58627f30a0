package certify

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/node"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBuiltins certifies every in-tree implementation with the conformance
// suite, as CI does on every change.
func TestBuiltins(t *testing.T) {
	f := node.Builtin()
	cfg := conformance.Config{Seed: 1}
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
	} {
		name := tc.kind + "/" + tc.name
		if tc.o.Carrier != "" {
			name += "-over-" + tc.o.Carrier
		}
		t.Run(name, func(t *testing.T) {
			rep, err := Run(f, tc.kind, tc.name, tc.o, cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Results {
				if r.Outcome == conformance.Fail {
					t.Errorf("%s: %s", r.Rule, r.Message)
				}
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
