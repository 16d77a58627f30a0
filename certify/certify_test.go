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
	// UCX 1.13 as Debian ships it emulates puts with its own active messages
	// on every transport here (engines/ucx/doc.go): the target's UCX copies
	// to whatever address the writer names, so deregistration is no fence,
	// and a target closed mid-write can leave a write the writer's flush
	// reported done partly landed. Both rules fail intermittently for that
	// reason alone; the engine is certified on every other rule. (Bounce
	// transfers stay safe: success needs the receiver's ACK after scatter.)
	ucxSkips := []string{"engine/deregister-in-flight", "engine/peer-loss"}
	for _, tc := range []struct {
		kind, name string
		o          Options
		skip       []string
	}{
		{"engine", "loopback", Options{}, nil},
		{"engine", "tcp", Options{}, nil},
		{"engine", "ucx", Options{}, ucxSkips},
		{"control", "inproc", Options{}, nil},
		{"control", "zmq", Options{}, nil},
		{"control", "nixlnotif", Options{Carrier: "loopback"}, nil},
		{"control", "nixlnotif", Options{Carrier: "tcp"}, nil},
		{"control", "nixlnotif", Options{Carrier: "ucx"}, nil},
		{"gather", "host", Options{}, nil},
		{"scatter", "host", Options{}, nil},
		{"writer", "loopback", Options{}, nil},
		{"writer", "tcp", Options{}, nil},
		{"writer", "ucx", Options{}, nil},
	} {
		name := tc.kind + "/" + tc.name
		if tc.o.Carrier != "" {
			name += "-over-" + tc.o.Carrier
		}
		t.Run(name, func(t *testing.T) {
			c := cfg
			c.Skip = tc.skip
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
