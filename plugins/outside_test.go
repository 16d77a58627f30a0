package plugins_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/certify"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/node"
)

// outside is the example third-party module's directory.
var outside = filepath.Join("examples", "outside")

// goOutside runs the go command in the example third-party module
// (plugins/examples/outside) as an outside author would: in its own
// directory, with its own go.mod (GOFLAGS=-mod=mod).
func goOutside(t *testing.T, args ...string) string {
	t.Helper()
	c := exec.Command("go", args...)
	c.Dir = outside
	c.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), outside, err, out)
	}
	return string(out)
}

// TestOutsideModuleUsesOnlyTheSDK: the example module requires bounce
// alone, imports nothing of it but the SDK packages (transfer, plugins,
// mem), and its own tests (the sockengine metadata decoder and its fuzz
// seeds) pass.
func TestOutsideModuleUsesOnlyTheSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	mod, err := os.ReadFile(filepath.Join(outside, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var direct []string
	for _, line := range strings.Split(string(mod), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "require"))
		if f := strings.Fields(line); len(f) == 2 && strings.Contains(f[0], ".") && !strings.Contains(line, "// indirect") {
			direct = append(direct, f[0])
		}
	}
	if want := []string{"github.com/bouncekv/bounce"}; !slices.Equal(direct, want) {
		t.Errorf("go.mod requires %q directly, want only %q", direct, want)
	}
	sdk := []string{"github.com/bouncekv/bounce/transfer", "github.com/bouncekv/bounce/plugins", "github.com/bouncekv/bounce/mem"}
	for _, imp := range strings.Fields(goOutside(t, "list", "-f", `{{join .Imports " "}} {{join .TestImports " "}}`, "./...")) {
		if strings.HasPrefix(imp, "github.com/bouncekv/bounce") && !slices.Contains(sdk, imp) {
			t.Errorf("the example module imports %s; an outside plugin may use only %v", imp, sdk)
		}
	}
	goOutside(t, "vet", "./...")
	goOutside(t, "test", "-count=1", "./...")
}

// TestOutsideModuleCertified builds the example third-party stage plugin
// in its own module and certifies it through real plugin processes, with
// the factories `bounce conformance --plugin` uses. (The engine plugin is
// certified and run through the CLI, in cmd/bounce.)
func TestOutsideModuleCertified(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	bin := filepath.Join(t.TempDir(), "copystage")
	goOutside(t, "build", "-o", bin, "./copystage")
	for _, kind := range []string{"gather", "scatter"} {
		t.Run(kind, func(t *testing.T) {
			f := node.WithPlugins(node.Builtin(), bin)
			rep, err := certify.Run(f, kind, "plugin", certify.Options{}, conformance.Config{Seed: 1, Sizes: []uint64{1, 4097, 1 << 20}, CallTimeout: processCallTimeout, OpTimeout: processOpTimeout})
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Passed() {
				t.Errorf("%s is not certified:\n%s", bin, rep.String())
			}
		})
	}
}
