package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPluginConformanceCLI certifies the example plugin through the CLI:
// bounce conformance engine --plugin PATH starts one plugin process per
// engine and runs every engine rule through the gRPC hop.
func TestPluginConformanceCLI(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tcpengine")
	out, err := exec.Command("go", "build", "-o", bin, "../../plugins/examples/tcpengine").CombinedOutput()
	if err != nil {
		t.Fatalf("build example plugin: %v\n%s", err, out)
	}
	stdout, stderr, code := bounce(t, "conformance", "engine", "--plugin", bin, "--sizes", "1,4097,1MiB")
	if code != 0 || !strings.Contains(stdout, "certified") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestPluginConformanceCLIErrors: a missing or non-executable plugin, and a
// kind plugins cannot serve, are usage errors (exit 2) naming the problem.
func TestPluginConformanceCLIErrors(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"conformance", "engine", "--plugin", filepath.Join(dir, "missing")}, "missing"},
		{[]string{"conformance", "engine", "--plugin", plain}, "not an executable"},
		{[]string{"conformance", "gather", "--plugin", "/bin/true"}, "cannot be served by a plugin"},
	} {
		_, stderr, code := bounce(t, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 naming %q", tc.args, code, stderr, tc.want)
		}
	}
}

// TestRunWithPluginEngine swaps the engine for an out-of-process plugin by
// configuration alone: both agents of the main job move a verified transfer
// through plugin processes (four processes in all).
func TestRunWithPluginEngine(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tcpengine")
	if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/examples/tcpengine").CombinedOutput(); err != nil {
		t.Fatalf("build example plugin: %v\n%s", err, out)
	}
	out, errOut, code := bounce(t, "run", "--engine.kind", "plugin", "--engine.plugin", bin,
		"--workload", "gptoss120b-tp8-b16", "--count", "4096", "--bounce.arena-size", "32MiB", "--bounce.max-chunk", "4MiB")
	if code != 0 || !strings.Contains(out, "every byte verified") || !strings.Contains(out, "bounce vs direct") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
