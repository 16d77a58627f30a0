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

// TestOutsideModuleFromAClone follows the outside README's way of
// depending on bounce (its "v=$(…)" and "go mod edit" lines, run as
// printed with /path/to/bounce this clone): a module in a fresh directory
// requires this commit's pseudo-version, replaces bounce with the clone,
// and builds a plugin with no network.
func TestOutsideModuleFromAClone(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Run(); err != nil {
		t.Skipf("not a git clone: %v", err)
	}
	readme, err := os.ReadFile(filepath.Join(outside, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "v=$(") || strings.HasPrefix(line, "go mod edit -require github.com/bouncekv/bounce@$v") {
			steps = append(steps, strings.ReplaceAll(line, "/path/to/bounce", root))
		}
	}
	if len(steps) != 2 {
		t.Fatalf("README lacks the pseudo-version and go mod edit lines: %q", steps)
	}
	dir := t.TempDir()
	for _, f := range []string{"go.mod", "go.sum", filepath.Join("copystage", "main.go")} {
		b, err := os.ReadFile(filepath.Join(outside, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := strings.Join(append(steps, "go mod edit -json", "go build -o copystage.bin ./copystage"), "\n")
	c := exec.Command("sh", "-ec", script)
	c.Dir = dir
	c.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's steps failed: %v\n%s\n%s", err, script, out)
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := `"Version": "v0.0.0-`; !strings.Contains(string(out), want) || !strings.Contains(string(out), strings.TrimSpace(string(head))+`"`) {
		t.Fatalf("go.mod does not require this commit's pseudo-version (%s):\n%s", head, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "copystage.bin")); err != nil {
		t.Fatal(err)
	}
}
