package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/config"
)

// run runs the CLI in this process and returns stdout, stderr and the exit
// code.
func runCLI(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := execute(args, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

// TestVersionFlag: --version prints what `bounce version` prints.
func TestVersionFlag(t *testing.T) {
	a, _, c1 := runCLI("--version")
	b, _, c2 := runCLI("version")
	if c1 != 0 || c2 != 0 || a != b || !strings.Contains(a, "wire protocol") {
		t.Fatalf("--version (exit %d) %q vs version (exit %d) %q", c1, a, c2, b)
	}
}

// TestSectionAsFlag: a section given as a flag (--engine tcp) is a usage
// error suggesting its kind key; a section without one lists its keys.
func TestSectionAsFlag(t *testing.T) {
	_, errs, code := runCLI("config", "--engine", "tcp")
	if code != exitUsage || !strings.Contains(errs, "did you mean --engine.kind?") {
		t.Fatalf("--engine tcp: exit %d, %q", code, errs)
	}
	_, errs, code = runCLI("config", "--bounce", "x")
	if code != exitUsage || !strings.Contains(errs, "bounce is a section: its keys are --bounce.") {
		t.Fatalf("--bounce x: exit %d, %q", code, errs)
	}
}

// TestTwoConfigFilesRefused: a second --config is a usage error naming
// both files, never the last one silently winning.
func TestTwoConfigFilesRefused(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	for _, f := range []string{a, b} {
		if err := os.WriteFile(f, []byte("agent:\n  name: "+filepath.Base(f)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, errs, code := runCLI("config", "-c", a, "-c", b)
	if code != exitUsage || !strings.Contains(errs, a) || !strings.Contains(errs, b) || !strings.Contains(errs, "one --config") {
		t.Fatalf("two -c: exit %d, %q", code, errs)
	}
	out, errs, code := runCLI("config", "-c", a)
	if code != 0 || !strings.Contains(out, "a.yaml") {
		t.Fatalf("one -c: exit %d\n%s\n%s", code, out, errs)
	}
}

// TestHelpValueNames: no flag's value name in --help is text lifted from
// its usage (pflag takes the first `quoted` words as the value name).
func TestHelpValueNames(t *testing.T) {
	for _, c := range []string{"run", "serve", "send", "bench", "key", "config", "conformance", "components"} {
		out, _, code := runCLI(c, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d", c, code)
		}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && strings.HasPrefix(f[0], "--") && strings.Contains(f[1], "bounce") {
				t.Errorf("%s --help: value name %q in %q", c, f[1], line)
			}
		}
	}
}

// TestHandStartedServiceNames: serve and send started by hand are the
// services bounce-recv and bounce-send (as bounce run names its two), and a
// service name the user set is kept.
func TestHandStartedServiceNames(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "")
	for _, role := range []string{"recv", "send"} {
		l, err := config.Load(config.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		roleService(l, role)
		if got := l.Config.Telemetry.ServiceName; got != "bounce-"+role {
			t.Errorf("%s: service %q, want bounce-%s", role, got, role)
		}
		l, err = config.Load(config.LoadOptions{Environ: []string{"BOUNCE_TELEMETRY_SERVICE_NAME=mine"}})
		if err != nil {
			t.Fatal(err)
		}
		roleService(l, role)
		if got := l.Config.Telemetry.ServiceName; got != "mine" {
			t.Errorf("%s with a configured name: %q, want mine", role, got)
		}
	}
}
