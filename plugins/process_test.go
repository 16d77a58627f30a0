package plugins_test

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
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
func buildExample(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tcpengine")
	out, err := exec.Command("go", "build", "-o", bin, "./examples/tcpengine").CombinedOutput()
	if err != nil {
		t.Fatalf("build example plugin: %v\n%s", err, out)
	}
	return bin
}

// TestPluginProcessCertified certifies the example plugin through real
// plugin processes (one per engine), with node's plugin factories as the
// CLI uses them.
func TestPluginProcessCertified(t *testing.T) {
	bin := buildExample(t)
	f := node.WithPlugins(node.Builtin(), bin)
	rep, err := certify.Run(f, "engine", "plugin", certify.Options{}, conformance.Config{Seed: 1, Sizes: []uint64{1, 4097, 1 << 20}})
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
	if _, err := plugins.Load(filepath.Join(t.TempDir(), "nope"), plugins.KindEngine, nil); err == nil {
		t.Fatal("missing binary loaded")
	}
	if _, err := plugins.Load("/bin/true", plugins.KindEngine, nil); err == nil {
		t.Fatal("/bin/true loaded as a plugin")
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
