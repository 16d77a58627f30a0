package plugins_test

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// pluginEngines opens the tcpengine example plugin's engine both ways a
// host does: supervised (what the agent's factory returns) and on a bare
// Client.
func pluginEngines(t *testing.T, bin string) map[string]func(t *testing.T, name string) transfer.Engine {
	opts := map[string]string{"listen": "127.0.0.1:0"}
	return map[string]func(t *testing.T, name string) transfer.Engine{
		"supervised": func(t *testing.T, name string) transfer.Engine {
			e, err := plugins.OpenEngine(plugins.Spec{Path: bin}, plugins.Restart{}, name, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		},
		"bare": func(t *testing.T, name string) transfer.Engine {
			c, err := plugins.Load(bin, plugins.KindEngine, nil)
			if err != nil {
				t.Fatal(err)
			}
			e, err := c.Engine(name, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		},
	}
}

// writeAndWait posts one write and waits (bounded) for it to resolve.
// writerTo is an in-process tcp engine named "writer" with a registered
// source of n bytes of fill, loaded with victim's metadata; it returns the
// engine, the victim's peer name and the source. Both are released when
// the test ends.
func writerTo(t *testing.T, victim transfer.Engine, n uint64, fill byte) (*tcp.Engine, string, *mem.Buffer) {
	t.Helper()
	w, err := tcp.New(tcp.Config{Name: "writer", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	src, err := mem.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Free() })
	for i := range src.Bytes() {
		src.Bytes()[i] = fill
	}
	if err := w.RegisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	md, err := victim.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	peer, err := w.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	return w, peer, src
}

func writeAndWait(t *testing.T, e transfer.Engine, peer string, src, dst transfer.Desc) error {
	t.Helper()
	op, err := e.PostWrite(peer, []transfer.WriteOp{{Src: src, Dst: dst}})
	if err != nil {
		return err
	}
	defer op.Release()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := op.Poll()
		if st.Terminal() {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("write %v did not resolve within 30s", dst)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPluginEngineAsksTheHostsWriteGuard: the tcp engine served by a real
// plugin process is a transfer.WriteGuarded on the host, and the guard the
// host installs is asked (across the process boundary) before a byte a
// peer sends lands: a write into the range the guard admits lands, a write
// the guard forbids fails at the sender with ErrForbidden and the guard's
// own reason, and no byte outside the admitted range changes.
func TestPluginEngineAsksTheHostsWriteGuard(t *testing.T) {
	bin := buildExample(t)
	for how, open := range pluginEngines(t, bin) {
		t.Run(how, func(t *testing.T) {
			victim := open(t, "victim")
			dst, err := mem.Alloc(64 << 10)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Free()
			if err := victim.RegisterMemory(dst.Desc()); err != nil {
				t.Fatal(err)
			}
			granted := transfer.Desc{Addr: dst.Desc().Addr, Len: 4096, Kind: transfer.Host}
			var asked atomic.Int64
			if g, ok := victim.(transfer.WriteGuarded); ok {
				g.SetWriteGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) {
					asked.Add(1)
					if peer == "writer" && granted.Contains(d.Addr, d.Len) {
						return granted, nil
					}
					return transfer.Desc{}, fmt.Errorf("test guard: [%#x+%d] is not granted to %q: %w", d.Addr, d.Len, peer, transfer.ErrForbidden)
				})
			} else {
				t.Errorf("plugin engine %T is not a transfer.WriteGuarded: the host cannot guard what lands in its memory", victim)
			}

			w, peer, src := writerTo(t, victim, 64<<10, 0xAB)
			chunk := func(off uint64) transfer.Desc {
				return transfer.Desc{Addr: dst.Desc().Addr + off, Len: 4096, Kind: transfer.Host}
			}
			srcChunk := transfer.Desc{Addr: src.Desc().Addr, Len: 4096, Kind: transfer.Host}

			if err := writeAndWait(t, w, peer, srcChunk, chunk(0)); err != nil {
				t.Fatalf("write into the granted range: %v", err)
			}
			if !bytes.Equal(dst.Bytes()[:4096], src.Bytes()[:4096]) {
				t.Error("the admitted write did not land")
			}
			err = writeAndWait(t, w, peer, srcChunk, chunk(8192))
			if !errors.Is(err, transfer.ErrForbidden) || !strings.Contains(err.Error(), "test guard") {
				t.Errorf("write outside the grant: err = %v, want ErrForbidden with the guard's reason", err)
			}
			if i := bytes.IndexFunc(dst.Bytes()[4096:], func(r rune) bool { return r != 0 }); i >= 0 {
				t.Errorf("byte %d outside the grant was written", 4096+i)
			}
			if asked.Load() == 0 && !t.Failed() {
				t.Error("the host's guard was never asked")
			}
		})
	}
}

// TestPluginEngineReportsPeerLoss: the tcp engine served by a real plugin
// process is a transfer.PeerLossReporter on the host: a peer that wrote to
// it and then closes every connection is reported to the host's callback.
func TestPluginEngineReportsPeerLoss(t *testing.T) {
	bin := buildExample(t)
	for how, open := range pluginEngines(t, bin) {
		t.Run(how, func(t *testing.T) {
			victim := open(t, "victim")
			lost := make(chan string, 16)
			if r, ok := victim.(transfer.PeerLossReporter); ok {
				r.SetPeerLost(func(peer string) {
					select {
					case lost <- peer:
					default:
					}
				})
			} else {
				t.Fatalf("plugin engine %T is not a transfer.PeerLossReporter: the host never hears of a lost peer", victim)
			}
			dst, err := mem.Alloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Free()
			if err := victim.RegisterMemory(dst.Desc()); err != nil {
				t.Fatal(err)
			}
			w, peer, src := writerTo(t, victim, 4096, 0)
			if err := writeAndWait(t, w, peer, src.Desc(), dst.Desc()); err != nil {
				t.Fatal(err)
			}
			w.Close() // every connection the writer opened ends
			select {
			case p := <-lost:
				if p != "writer" {
					t.Errorf("lost peer %q, want writer", p)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the host heard of no lost peer within 30s")
			}
		})
	}
}

// BenchmarkPluginWriteGuard: writes (64 KiB, 1 MiB) into a plugin's tcp
// engine, one at a time, with the host's write guard installed (one
// callback round trip per incoming frame) and without, alternating in one
// run; it reports µs per write for both and their ratio.
func BenchmarkPluginWriteGuard(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "tcpengine")
	if out, err := exec.Command("go", "build", "-o", bin, "./examples/tcpengine").CombinedOutput(); err != nil {
		b.Fatalf("build plugin: %v\n%s", err, out)
	}
	for _, size := range []uint64{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) { benchWriteGuard(b, bin, size) })
	}
}

func benchWriteGuard(b *testing.B, bin string, size uint64) {
	open := func(name string, guard bool) (transfer.Engine, transfer.Engine, *mem.Buffer, *mem.Buffer, string) {
		v, err := plugins.OpenEngine(plugins.Spec{Path: bin}, plugins.Restart{}, name, map[string]string{"listen": "127.0.0.1:0"})
		if err != nil {
			b.Fatal(err)
		}
		dst, err := mem.Alloc(size)
		if err != nil {
			b.Fatal(err)
		}
		if err := v.RegisterMemory(dst.Desc()); err != nil {
			b.Fatal(err)
		}
		if guard {
			all := dst.Desc()
			v.(transfer.WriteGuarded).SetWriteGuard(func(_ string, d transfer.Desc) (transfer.Desc, error) {
				if all.Contains(d.Addr, d.Len) {
					return all, nil
				}
				return transfer.Desc{}, transfer.ErrForbidden
			})
		}
		w, err := tcp.New(tcp.Config{Name: name + "-writer", Listen: "127.0.0.1:0"})
		if err != nil {
			b.Fatal(err)
		}
		src, err := mem.Alloc(size)
		if err != nil {
			b.Fatal(err)
		}
		if err := w.RegisterMemory(src.Desc()); err != nil {
			b.Fatal(err)
		}
		md, err := v.Metadata()
		if err != nil {
			b.Fatal(err)
		}
		peer, err := w.LoadPeer(md)
		if err != nil {
			b.Fatal(err)
		}
		return v, w, src, dst, peer
	}
	type side struct {
		v, w     transfer.Engine
		src, dst *mem.Buffer
		peer     string
		took     time.Duration
	}
	var sides [2]*side
	for i := range sides {
		v, w, src, dst, peer := open(fmt.Sprintf("v%d", i), i == 1)
		sides[i] = &side{v: v, w: w, src: src, dst: dst, peer: peer}
		defer func(s *side) { s.w.Close(); s.v.Close(); s.src.Free(); s.dst.Free() }(sides[i])
	}
	one := func(s *side) {
		op, err := s.w.PostWrite(s.peer, []transfer.WriteOp{{Src: s.src.Desc(), Dst: s.dst.Desc()}})
		if err != nil {
			b.Fatal(err)
		}
		for {
			st, err := op.Poll()
			if st.Terminal() {
				if err != nil {
					b.Fatal(err)
				}
				break
			}
			runtime.Gosched()
		}
		op.Release()
	}
	for _, s := range sides {
		one(s) // connect
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, s := range sides {
			start := time.Now()
			one(s)
			s.took += time.Since(start)
		}
	}
	plain, guarded := sides[0].took, sides[1].took
	b.ReportMetric(float64(plain.Microseconds())/float64(b.N), "plain-µs/write")
	b.ReportMetric(float64(guarded.Microseconds())/float64(b.N), "guarded-µs/write")
	b.ReportMetric(float64(plain)/float64(guarded), "plain/guarded")
}

// TestRestartedPluginEngineKeepsTheGuard: the plugin process dies
// (SIGKILL) and is restarted; the new process asks the host's guard too
// (installed again before it serves), so a write outside the grant is
// refused and lands nothing there.
func TestRestartedPluginEngineKeepsTheGuard(t *testing.T) {
	e, dst := restartableVictim(t, 16<<10)
	granted := transfer.Desc{Addr: dst.Desc().Addr, Len: 4096, Kind: transfer.Host}
	e.(transfer.WriteGuarded).SetWriteGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) {
		if granted.Contains(d.Addr, d.Len) {
			return granted, nil
		}
		return transfer.Desc{}, fmt.Errorf("test guard: [%#x+%d] not granted: %w", d.Addr, d.Len, transfer.ErrForbidden)
	})
	killAndAwaitRestart(t, e)
	w, peer, src := writerTo(t, e, 4096, 0x5A) // the restarted process listens on a new port
	if err := writeAndWait(t, w, peer, src.Desc(), granted); err != nil {
		t.Fatalf("write into the grant after the restart: %v", err)
	}
	outside := transfer.Desc{Addr: dst.Desc().Addr + 8192, Len: 4096, Kind: transfer.Host}
	if err := writeAndWait(t, w, peer, src.Desc(), outside); !errors.Is(err, transfer.ErrForbidden) || !strings.Contains(err.Error(), "test guard") {
		t.Errorf("write outside the grant after the restart: err = %v, want ErrForbidden with the guard's reason", err)
	}
	if !bytes.Equal(dst.Bytes()[:4096], src.Bytes()) {
		t.Error("the admitted write did not land")
	}
	if i := bytes.IndexFunc(dst.Bytes()[4096:], func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("byte %d outside the grant was written", 4096+i)
	}
}
