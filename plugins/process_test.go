package plugins_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bouncekv/bounce/certify"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// buildExample builds the tcpengine example plugin into a temporary dir.
func buildExample(t *testing.T) string { return buildPlugin(t, "./examples/tcpengine") }

// buildPlugin builds the plugin main package pkg into a temporary dir.
func buildPlugin(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("build plugin %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// waitLog waits (bounded) until the log holds want.
func (l *logBuffer) waitLog(t *testing.T, want string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(l.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("log lacks %q:\n%s", want, l.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return l.String()
}

// processCallTimeout and processOpTimeout are the suite's CallTimeout and
// OpTimeout through a real plugin process (a gRPC hop and another
// process): under -race with the load average near 13 on two cores a 1 MiB
// Notify that does not block took 2.5 s against the default one second
// (engine/notify-order-sizes). A call that does block stays blocked until
// released, so ten seconds still catches it, and no rule waits these out
// when it passes (hopCallTimeout in grpc_test.go, for the in-process hop).
const (
	processCallTimeout = 10 * time.Second
	processOpTimeout   = 30 * time.Second
)

// TestPluginProcessCertified certifies the example plugin through real
// plugin processes (one per engine), with node's plugin factories as the
// CLI uses them.
func TestPluginProcessCertified(t *testing.T) {
	bin := buildExample(t)
	f := node.WithPlugins(node.Builtin(), bin)
	rep, err := certify.Run(f, "engine", "plugin", certify.Options{}, conformance.Config{Seed: 1, Sizes: []uint64{1, 4097, 1 << 20}, CallTimeout: processCallTimeout, OpTimeout: processOpTimeout})
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
}

// TestPluginProcessCrash kills the plugin process with a write in flight:
// the op fails with ErrPeerLost, later calls fail at once, nothing hangs.
func TestPluginProcessCrash(t *testing.T) {
	bin := buildExample(t)
	c, err := plugins.Load(bin, plugins.KindEngine, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Engine("a", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := tcp.New(tcp.Config{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	src, err := mem.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	dst, err := mem.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if err := a.RegisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	md, err := b.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	peer, err := a.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	op, err := a.PostWrite(peer, []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Pid() <= 0 {
		t.Fatal("plugin pid unknown")
	}
	if err := syscall.Kill(c.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := op.Poll()
		if st == transfer.Failed {
			if !errors.Is(err, transfer.ErrPeerLost) {
				t.Fatalf("op of a killed plugin failed with %v, want ErrPeerLost", err)
			}
			break
		}
		if st == transfer.Done {
			t.Fatal("op of a killed plugin reported Done without the host ever seeing it done")
		}
		if time.Now().After(deadline) {
			t.Fatal("op of a killed plugin still pending after 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := op.Release(); err != nil {
		t.Fatalf("release: %v", err)
	}
	start := time.Now()
	if _, err := a.Metadata(); !errors.Is(err, transfer.ErrPeerLost) || !strings.Contains(err.Error(), "plugin") {
		t.Fatalf("metadata of a killed plugin: %v", err)
	}
	if err := a.RegisterMemory(dst.Desc()); err == nil {
		t.Fatal("register with a killed plugin succeeded")
	}
	if err := a.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if d := time.Since(start); d > plugins.CallTimeout {
		t.Fatalf("calls to a dead plugin took %v", d)
	}
}

// TestLoadErrors: a missing binary, a binary that is not a plugin and a
// kind the plugin does not serve are clear errors within StartTimeout.
func TestLoadErrors(t *testing.T) {
	if _, err := plugins.Load(filepath.Join(t.TempDir(), "nope"), plugins.KindEngine, nil); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing binary: %v", err)
	}
	if _, err := plugins.Load("/bin/true", plugins.KindEngine, nil); err == nil || !strings.Contains(err.Error(), "plugin true: start: not a bounce plugin: it ended (exit status 0)") {
		t.Fatalf("/bin/true as a plugin: %v, want a start error with its exit status", err)
	}
	if _, err := plugins.Load("/bin/echo", plugins.KindEngine, nil); err == nil || !strings.Contains(err.Error(), "not a bounce plugin") {
		t.Fatalf("/bin/echo as a plugin: %v, want \"not a bounce plugin\"", err)
	}
	if _, err := plugins.Load("/bin/true", "teleporter", nil); err == nil || !strings.Contains(err.Error(), "unknown kind") {
		t.Fatalf("unknown kind: %v", err)
	}
	bin := buildExample(t)
	c, err := plugins.Load(bin, plugins.KindControl, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Control("a", nil); !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "does not serve") {
		t.Fatalf("kind not served: %v", err)
	}
}

// TestPluginStderrReachesTheLog: every stderr line of the plugin is one
// record of the host's logger, tagged with the plugin's name. (Before,
// go-plugin logged non-JSON lines at debug level, below the host's info
// logger, so none arrived.)
func TestPluginStderrReachesTheLog(t *testing.T) {
	bin := buildPlugin(t, "./internal/testplugin")
	var logs logBuffer
	c, err := plugins.Load(bin, plugins.KindEngine, logs.logger())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := logs.waitLog(t, "testplugin: started")
	if !strings.Contains(out, "plugin=testplugin") {
		t.Fatalf("stderr line not tagged with the plugin name:\n%s", out)
	}
}

// TestSecureByDefault: the connection uses go-plugin's AutoMTLS, and the
// plugin's environment holds only what the Spec lists (plus go-plugin's
// handshake variables) unless InheritEnv is set.
func TestSecureByDefault(t *testing.T) {
	bin := buildPlugin(t, "./internal/testplugin")
	t.Setenv("BOUNCE_TEST_HOST_SECRET", "s3cret")
	start := func(s plugins.Spec) string {
		t.Helper()
		var logs logBuffer
		s.Path, s.Logger = bin, logs.logger()
		c, err := plugins.LoadSpec(s, plugins.KindEngine)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return logs.waitLog(t, "testplugin: started")
	}
	out := start(plugins.Spec{Env: []string{"GIVEN_VAR=1"}, Args: []string{"--flag", "x y"}})
	if !strings.Contains(out, "mtls=true") {
		t.Errorf("plugin was not given a client certificate (AutoMTLS off?):\n%s", out)
	}
	if !strings.Contains(out, "GIVEN_VAR") || strings.Contains(out, "BOUNCE_TEST_HOST_SECRET") || strings.Contains(out, "PATH,") {
		t.Errorf("default environment is not explicit:\n%s", out)
	}
	if !strings.Contains(out, `args=[\"--flag\" \"x y\"]`) {
		t.Errorf("args not passed:\n%s", out)
	}
	if out := start(plugins.Spec{InheritEnv: true}); !strings.Contains(out, "BOUNCE_TEST_HOST_SECRET") {
		t.Errorf("InheritEnv did not pass the host environment:\n%s", out)
	}
	if _, err := plugins.LoadSpec(plugins.Spec{Path: bin, Env: []string{"NOEQUALS"}}, plugins.KindEngine); err == nil || !strings.Contains(err.Error(), "NAME=value") {
		t.Errorf("bad env entry: %v", err)
	}
}

// TestChecksumPin: a pinned binary starts only with its own digest; a
// mismatch is refused before the process runs, naming both digests.
func TestChecksumPin(t *testing.T) {
	bin := buildPlugin(t, "./internal/testplugin")
	sum, err := plugins.FileChecksum(bin)
	if err != nil {
		t.Fatal(err)
	}
	c, err := plugins.LoadSpec(plugins.Spec{Path: bin, Checksum: sum}, plugins.KindEngine)
	if err != nil {
		t.Fatalf("load with the right checksum: %v", err)
	}
	c.Close()
	var logs logBuffer
	wrong := "sha256:" + strings.Repeat("00", 32)
	_, err = plugins.LoadSpec(plugins.Spec{Path: bin, Checksum: wrong, Logger: logs.logger()}, plugins.KindEngine)
	if err == nil || !strings.Contains(err.Error(), "checksum mismatch") || !strings.Contains(err.Error(), wrong) || !strings.Contains(err.Error(), sum) {
		t.Fatalf("wrong checksum: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	if strings.Contains(logs.String(), "started") {
		t.Fatalf("a binary failing its checksum ran:\n%s", logs.String())
	}
	if _, err := plugins.LoadSpec(plugins.Spec{Path: bin, Checksum: "md5:abc"}, plugins.KindEngine); err == nil || !strings.Contains(err.Error(), "sha256:<64 hex digits>") {
		t.Fatalf("malformed checksum: %v", err)
	}
}

// TestProtocolVersionMismatch: a plugin built at protocol version 1 is
// refused by this host with a message naming both versions.
func TestProtocolVersionMismatch(t *testing.T) {
	bin := buildPlugin(t, "./internal/oldplugin")
	_, err := plugins.Load(bin, plugins.KindEngine, nil)
	if err == nil {
		t.Fatal("a protocol 1 plugin was accepted")
	}
	for _, want := range []string{"protocol version", "Plugin version: 1", "[2]", "rebuild"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("version error %q lacks %q", err, want)
		}
	}
}

// TestBareNameIsACurrentDirectoryFile: a plugin named without a directory
// is the file in the current directory, never a $PATH lookup.
func TestBareNameIsACurrentDirectoryFile(t *testing.T) {
	bin := buildPlugin(t, "./internal/testplugin")
	t.Chdir(filepath.Dir(bin))
	t.Setenv("PATH", "/nonexistent")
	c, err := plugins.Load(filepath.Base(bin), plugins.KindEngine, nil)
	if err != nil {
		t.Fatalf("bare name in the current directory: %v", err)
	}
	c.Close()
	if err := os.Remove(filepath.Base(bin)); err != nil {
		t.Fatal(err)
	}
	if _, err := plugins.Load("true", plugins.KindEngine, nil); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("bare name not in the current directory: %v (looked up in $PATH?)", err)
	}
}
