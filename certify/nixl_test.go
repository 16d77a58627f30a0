//go:build nixl

package certify

import (
	"testing"
	"time"

	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/node"
)

// TestNIXL certifies the NIXL engine (with its waivers), its writer and
// nixlnotif carried by it, as `make nixl-check` does.
func TestNIXL(t *testing.T) {
	f := node.Builtin()
	for _, tc := range []struct {
		kind, name string
		o          Options
	}{
		{"engine", "nixl", Options{}},
		{"writer", "nixl", Options{}},
		{"control", "nixlnotif", Options{Carrier: "nixl"}},
	} {
		t.Run(tc.kind+"/"+tc.name, func(t *testing.T) {
			// TestBuiltins' generous bounds: a loaded machine must not fail a
			// call that does not block (the defaults are 1 s and 10 s).
			c := conformance.Config{Seed: 1, CallTimeout: 10 * time.Second, OpTimeout: 30 * time.Second}
			c.Skip, c.SkipReasons = Waivers(tc.kind, tc.name)
			rep, err := Run(f, tc.kind, tc.name, tc.o, c)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Failures() {
				t.Errorf("%s: %s", r.Rule, r.Message)
			}
		})
	}
}
