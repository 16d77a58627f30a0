package plugins_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/bouncekv/bounce/certify"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/node"
)

// buildOutside builds a command of the example third-party module
// (plugins/examples/outside) as an outside author would: in its own
// directory, with its own go.mod (GOFLAGS=-mod=mod).
func buildOutside(t *testing.T, cmd string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), cmd)
	c := exec.Command("go", "build", "-o", bin, "./"+cmd)
	c.Dir = filepath.Join("examples", "outside")
	c.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("build example module command %s: %v\n%s", cmd, err, out)
	}
	return bin
}

// TestOutsideModuleCertified builds the example third-party engine and
// stage plugins in their own module and certifies them through real
// plugin processes, with the factories `bounce conformance --plugin` uses.
func TestOutsideModuleCertified(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	for _, c := range []struct{ cmd, kind string }{
		{"fabricengine", "engine"},
		{"copystage", "gather"},
		{"copystage", "scatter"},
	} {
		t.Run(c.cmd+"/"+c.kind, func(t *testing.T) {
			bin := buildOutside(t, c.cmd)
			f := node.WithPlugins(node.Builtin(), bin)
			rep, err := certify.Run(f, c.kind, "plugin", certify.Options{}, conformance.Config{Seed: 1, Sizes: []uint64{1, 4097, 1 << 20}})
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Passed() {
				t.Errorf("%s is not certified:\n%s", bin, rep.String())
			}
		})
	}
}
