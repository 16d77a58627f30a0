package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// loadedBounds are the suite's bounds for runs through plugin processes
// on a loaded machine: the defaults (a call that must not block within 1 s,
// an op within 10 s) were overrun there by calls that do not block (a
// 1 MiB Notify through the gRPC hop took 2.5 s under -race at load 13). A
// call that blocks or an op that never completes stays so until released,
// so these still catch them, and no rule waits them out when it passes.
var loadedBounds = []string{"--call-timeout", "10s", "--op-timeout", "30s"}

// TestPluginConformanceCLI certifies the example plugin through the CLI:
// bounce conformance engine --plugin PATH starts one plugin process per
// engine and runs every engine rule through the gRPC hop.
func TestPluginConformanceCLI(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tcpengine")
	out, err := exec.Command("go", "build", "-o", bin, "../../plugins/examples/tcpengine").CombinedOutput()
	if err != nil {
		t.Fatalf("build example plugin: %v\n%s", err, out)
	}
	stdout, stderr, code := bounce(t, append([]string{"conformance", "engine", "--plugin", bin, "--sizes", "1,4097,1MiB"}, loadedBounds...)...)
	if code != 0 || !strings.Contains(stdout, "engine/tcpengine: certified") {
		t.Fatalf("exit %d (want the subject named after the binary)\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// The plugin form declares every capability the in-process tcp engine
	// declares: the write guard, peer-loss reports and transfer.Connector
	// included (the plugin protocol carries them all) — except reads,
	// which do not cross the plugin boundary yet (docs/PLUGINS.md).
	var absent []string
	for _, line := range strings.Split(stdout, "\n") {
		if c, ok := strings.CutPrefix(line, "optional capability absent: "); ok && !strings.HasPrefix(c, "transfer.Reader ") {
			absent = append(absent, c)
		}
	}
	if len(absent) != 0 {
		t.Fatalf("absent capabilities %q, want none:\n%s", absent, stdout)
	}
}

// TestWriterPluginConformanceCLI: bounce conformance writer --plugin
// certifies the Writer a binary serves (stages.write.plugin), over a pair
// of carrier engines; a binary that serves no Writer has the bulk write
// over its engine certified instead, and says so.
func TestWriterPluginConformanceCLI(t *testing.T) {
	dir := t.TempDir()
	writer, engine := filepath.Join(dir, "testplugin"), filepath.Join(dir, "tcpengine")
	for bin, pkg := range map[string]string{writer: "../../plugins/internal/testplugin", engine: "../../plugins/examples/tcpengine"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	stdout, stderr, code := bounce(t, append([]string{"conformance", "writer", "--plugin", writer, "--sizes", "1,4097"}, loadedBounds...)...)
	if code != 0 || !strings.Contains(stdout, "writer/testplugin: certified") || strings.Contains(stdout, "serves no writer") || !strings.Contains(stdout, "writer/byte-exact") {
		t.Fatalf("writer plugin: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if strings.Contains(stdout, "capability absent") {
		t.Fatalf("the writer plugin lacks a capability (transfer.ContextWriter?):\n%s", stdout)
	}
	stdout, stderr, code = bounce(t, append([]string{"conformance", "writer", "--plugin", engine, "--sizes", "1,4097"}, loadedBounds...)...)
	if code != 0 || !strings.Contains(stdout, "serves no writer: certifying the bulk write over its engine") || !strings.Contains(stdout, "writer/tcpengine: certified") {
		t.Fatalf("engine plugin as writer: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestPluginConformanceCLIOptions: --engine.options reach the plugin (here
// one that makes the test plugin wrap its engine by embedding the
// transfer.Engine interface), and the report names the optional capability
// that wrapper lost and the rules skipped for it.
func TestPluginConformanceCLIOptions(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "testplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/internal/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build test plugin: %v\n%s", err, out)
	}
	stdout, stderr, code := bounce(t, append([]string{"conformance", "engine", "--plugin", bin, "--sizes", "1,4097", "--engine.options", "hide_notify=true"}, loadedBounds...)...)
	if code != 0 || !strings.Contains(stdout, "optional capability absent: transfer.Notifier") || !strings.Contains(stdout, "engine/notify-order") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
}

// TestPluginConformanceCLIStartFailures: a plugin that refuses an option
// (engine.options, or a stage's plugin options from --config), or a
// binary that is not a plugin, is a start failure — exit 3 naming the
// cause — and no rule runs.
func TestPluginConformanceCLIStartFailures(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "testplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/internal/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build test plugin: %v\n%s", err, out)
	}
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte("stages:\n  gather: {plugin: {path: "+bin+", options: {bogus: \"1\"}}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"conformance", "engine", "--plugin", bin, "--engine.options", "bogus=1"}, `unknown engine option "bogus"`},
		{[]string{"conformance", "gather", "--plugin", bin, "--config", cfg}, `unknown stage option "bogus"`},
		{[]string{"conformance", "engine", "--plugin", "/bin/true"}, "not a bounce plugin"},
	} {
		stdout, stderr, code := bounce(t, tc.args...)
		if code != 3 || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "start") || strings.Contains(stdout, "PASS") || strings.Contains(stdout, "FAIL") {
			t.Errorf("%v: exit %d, want 3 naming %q and no rule run\nstdout:\n%s\nstderr:\n%s", tc.args, code, tc.want, stdout, stderr)
		}
	}
}

// TestPluginConformanceCLIErrors: a missing or non-executable plugin is a
// usage error (exit 2) and a binary that is not a plugin a start failure
// (exit 3), each naming the problem rather than failing a rule.
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
	} {
		_, stderr, code := bounce(t, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 naming %q", tc.args, code, stderr, tc.want)
		}
	}
	for _, kind := range []string{"engine", "gather"} {
		stdout, stderr, code := bounce(t, "conformance", kind, "--plugin", "/bin/true")
		if code != 3 || !strings.Contains(stderr, "cannot start it") || !strings.Contains(stderr, "not a bounce plugin") || strings.Contains(stdout, "byte-exact") {
			t.Errorf("%s --plugin /bin/true: exit %d, stderr %q, stdout %q; want exit 3 naming a start failure", kind, code, stderr, stdout)
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

// TestOutsideEnginePlugin follows plugins/examples/outside/README.md: the
// SDK-only engine plugin of the example third-party module, built in its
// own module as an outside author builds it, is certified by `bounce
// conformance engine --plugin` (the report naming its absent capabilities)
// and moves the main job's verified transfer under `bounce run`.
func TestOutsideEnginePlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a separate module")
	}
	bin := filepath.Join(t.TempDir(), "sockengine")
	build := exec.Command("go", "build", "-o", bin, "./sockengine")
	build.Dir = filepath.Join("..", "..", "plugins", "examples", "outside")
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the example module's engine: %v\n%s", err, out)
	}
	stdout, stderr, code := bounce(t, append([]string{"conformance", "engine", "--plugin", bin, "--sizes", "1,4097,1MiB"}, loadedBounds...)...)
	if code != 0 || !strings.Contains(stdout, "engine/sockengine: certified") || !strings.Contains(stdout, "optional capability absent: transfer.Notifier — 7 rule(s) skipped") {
		t.Fatalf("conformance: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	if res, _ := regexpFind(`engine/target-forget\s+(\w+)`, stdout); res != "PASS" {
		t.Fatalf("engine/target-forget %q, want PASS (sockengine claims transfer.Fencer):\n%s", res, stdout)
	}
	out, errOut, code := bounce(t, "run", "--engine.kind", "plugin", "--engine.plugin", bin,
		"--workload", "gptoss120b-tp8-b16", "--count", "4096", "--bounce.arena-size", "32MiB", "--bounce.max-chunk", "4MiB")
	if code != 0 || !strings.Contains(out, "every byte verified") || !strings.Contains(out, "engine sockengine (plugin "+bin+")") {
		t.Fatalf("run: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// regexpFind returns the first submatch of pattern in s.
func regexpFind(pattern, s string) (string, bool) {
	m := regexp.MustCompile(pattern).FindStringSubmatch(s)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// TestPluginConformanceCLIConfigNamesAnother: with --config naming another
// binary in engine.plugin.path, bounce conformance --plugin A certifies A
// (the output says the configured path was replaced), and a checksum
// pinned in that block applies to A: A's digest passes, another is a
// start failure naming the checksum.
func TestPluginConformanceCLIConfigNamesAnother(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tcpengine")
	if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/examples/tcpengine").CombinedOutput(); err != nil {
		t.Fatalf("build example plugin: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	write := func(name, block string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("engine:\n  kind: plugin\n  plugin: {path: /bin/true"+block+"}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := append([]string{"conformance", "engine", "--plugin", bin, "--only", "engine/byte-exact,engine/unknown-peer", "--sizes", "1,4097"}, loadedBounds...)
	for _, tc := range []struct {
		name, block string
		code        int
		want        string
	}{
		{"other.yaml", "", 0, "engine/tcpengine: certified"},
		{"pinned.yaml", ", checksum: \"sha256:" + hex.EncodeToString(sum[:]) + "\"", 0, "engine/tcpengine: certified"},
		{"wrongpin.yaml", ", checksum: \"sha256:" + strings.Repeat("0", 64) + "\"", 3, "checksum"},
	} {
		stdout, stderr, code := bounce(t, append(run, "--config", write(tc.name, tc.block))...)
		if code != tc.code || !strings.Contains(stdout+stderr, tc.want) {
			t.Errorf("%s: exit %d, want %d naming %q\nstdout:\n%s\nstderr:\n%s", tc.name, code, tc.code, tc.want, stdout, stderr)
		}
		if tc.code == 0 && !strings.Contains(stdout, "replaces engine.plugin.path /bin/true from the configuration") {
			t.Errorf("%s: the output does not say the configured path was replaced:\n%s", tc.name, stdout)
		}
	}
}

// TestPluginConformanceCLIShowsPluginStderr: what a stage plugin writes
// to stderr after plugins.Serve started (its constructor's lines, through
// os.Stderr and the log package) is shown by bounce conformance on
// stderr, tagged with the plugin's name; go-plugin's own JSON lines are
// not, unless log.level is debug (then as records with their message).
func TestPluginConformanceCLIShowsPluginStderr(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "testplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/internal/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build test plugin: %v\n%s", err, out)
	}
	stdout, stderr, code := bounce(t, append([]string{"conformance", "gather", "--plugin", bin, "--sizes", "1,4097"}, loadedBounds...)...)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{`msg="testplugin: open gather" plugin=testplugin[gather]`, "testplugin: log from open gather"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "@level") || strings.Contains(stderr, "plugin address") {
		t.Errorf("go-plugin's own lines shown at info:\n%s", stderr)
	}
	_, stderr, code = bounce(t, "conformance", "gather", "--plugin", bin, "--sizes", "1", "--log.level", "debug")
	if code != 0 || !strings.Contains(stderr, `level=DEBUG msg="plugin address"`) || strings.Contains(stderr, "@level") {
		t.Errorf("log.level debug: exit %d, want go-plugin's lines as debug records:\n%s", code, stderr)
	}
}

// TestStagePluginsByFlag: stage plugins are chosen by flags alone (every
// key of a plugin block is a flag, stages.gather.plugin.path and so on),
// and the receiver process started by bounce run gets them too: the main
// job's bytes go through testplugin's gather (sender) and scatter
// (receiver) stages, whose constructors say so in the log.
func TestStagePluginsByFlag(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "testplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/internal/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build test plugin: %v\n%s", err, out)
	}
	out, errOut, code := bounce(t, "run", "--stages.gather.plugin.path", bin, "--stages.scatter.plugin.path", bin,
		"--stages.scatter.plugin.options", "copy_workers=2", "--log.level", "info",
		"--workload", "gptoss120b-tp8-b16", "--count", "4096", "--bounce.arena-size", "32MiB", "--bounce.max-chunk", "4MiB", "--compare=false")
	if code != 0 || !strings.Contains(out, "every byte verified") {
		t.Fatalf("run: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"testplugin: open gather", "testplugin: open scatter"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("log lacks %q (the stage plugin did not run):\n%s", want, errOut)
		}
	}
}
