package plugins_test

import (
	"bytes"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// TestRestartedPluginEngineKeepsItsAddress: an engine plugin opened on
// port 0 dies (SIGKILL) and is restarted; the new process listens on the
// address the first bound, so its metadata is the same and a peer that
// loaded the first process's metadata writes to the new one without
// reloading it: the bytes land.
func TestRestartedPluginEngineKeepsItsAddress(t *testing.T) {
	e, dst := restartableVictim(t, 8192)
	before, err := e.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	w, peer, src := writerTo(t, e, 4096, 0x3C)
	first := transfer.Desc{Addr: dst.Desc().Addr, Len: 4096, Kind: transfer.Host}
	if err := writeAndWait(t, w, peer, src.Desc(), first); err != nil {
		t.Fatalf("write before the restart: %v", err)
	}
	killAndAwaitRestart(t, e)
	after, err := e.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	// A new process is a new incarnation (the metadata's last 8 bytes);
	// everything before it, the address included, is the same.
	if len(before) != len(after) || len(before) < 8 || !bytes.Equal(before[:len(before)-8], after[:len(after)-8]) {
		t.Errorf("the restarted engine's metadata differs beyond its incarnation (a new address?):\n%q\n%q", before, after)
	}
	for i := range src.Bytes() {
		src.Bytes()[i] = 0xC3
	}
	second := transfer.Desc{Addr: dst.Desc().Addr + 4096, Len: 4096, Kind: transfer.Host}
	// The writer's connections to the dead process broke; its next write
	// dials the same address again (a write that raced the break may fail
	// with ErrPeerLost first).
	var werr error
	for range 3 {
		if werr = writeAndWait(t, w, peer, src.Desc(), second); werr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if werr != nil {
		t.Fatalf("write to the restarted engine with the first process's metadata: %v", werr)
	}
	if !bytes.Equal(dst.Bytes()[4096:], src.Bytes()) {
		t.Error("the write after the restart did not land")
	}
}

// TestPluginCrashDetection measures how long the supervisor takes to
// notice a plugin process killed with SIGKILL (calls fail fast with "is
// down" from then on): kills rounds processes in turn and logs the
// latencies. It asserts only that every death is noticed (within a
// generous bound); the numbers are docs/PLUGINS.md's crash-policy figures
// (go test -run TestPluginCrashDetection -v ./plugins).
func TestPluginCrashDetection(t *testing.T) {
	bin := buildExample(t)
	const rounds = 10
	e, err := plugins.OpenEngine(plugins.Spec{Path: bin}, plugins.Restart{MaxRestarts: rounds, Backoff: time.Millisecond}, "victim", map[string]string{"listen": "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	sv := e.(plugins.Supervised)
	var took []time.Duration
	for i := range rounds {
		var c *plugins.Client
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			if c = sv.Current(); c != nil && sv.Restarts() == i {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no process up within 30s", i)
			}
		}
		killed := time.Now()
		if err := syscall.Kill(c.Pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); sv.Current() == c; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the death was not noticed within 30s", i)
			}
		}
		took = append(took, time.Since(killed))
	}
	slices.Sort(took)
	t.Logf("crash detection over %d kills: min %v median %v max %v", rounds, took[0].Round(time.Millisecond), took[rounds/2].Round(time.Millisecond), took[rounds-1].Round(time.Millisecond))
}

// restartableVictim opens the example engine plugin as "victim" on a free
// loopback port, restarted once if it dies, with size bytes of memory
// registered with it; both are closed when the test ends.
func restartableVictim(t *testing.T, size uint64) (transfer.Engine, *mem.Buffer) {
	t.Helper()
	e, err := plugins.OpenEngine(plugins.Spec{Path: buildExample(t)}, plugins.Restart{MaxRestarts: 1, Backoff: 20 * time.Millisecond}, "victim", map[string]string{"listen": "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	dst, err := mem.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Free() })
	if err := e.RegisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	return e, dst
}

// killAndAwaitRestart kills e's plugin process (SIGKILL) and waits until
// its supervisor restarted it.
func killAndAwaitRestart(t *testing.T, e transfer.Engine) {
	t.Helper()
	sv := e.(plugins.Supervised)
	if err := syscall.Kill(sv.Current().Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); sv.Restarts() < 1 || sv.Current() == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the plugin was not restarted within 30s")
		}
	}
}
