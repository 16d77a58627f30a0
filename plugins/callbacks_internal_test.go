package plugins

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestGuardWithoutHostRefuses: once the host's end of the callback stream
// is gone (here: stopped by the host while the plugin process keeps
// running, as when the host's connection breaks), the plugin's engine
// refuses every write — the guard's check got no answer — and no byte
// lands, although the host's guard would have admitted it.
func TestGuardWithoutHostRefuses(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tcpengine")
	if out, err := exec.Command("go", "build", "-o", bin, "./examples/tcpengine").CombinedOutput(); err != nil {
		t.Fatalf("build plugin: %v\n%s", err, out)
	}
	c, err := Load(bin, KindEngine, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := c.Engine("victim", map[string]string{"listen": "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	wg, ok := eng.(transfer.WriteGuarded)
	if !ok {
		t.Fatalf("%T is not a transfer.WriteGuarded", eng)
	}
	wg.SetWriteGuard(func(_ string, d transfer.Desc) (transfer.Desc, error) { return d, nil })
	dst, err := mem.Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if err := eng.RegisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	w, err := tcp.New(tcp.Config{Name: "writer", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	src, err := mem.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	copy(src.Bytes(), strings.Repeat("x", 4096))
	if err := w.RegisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	md, err := eng.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	peer, err := w.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	write := func(off uint64) error {
		op, err := w.PostWrite(peer, []transfer.WriteOp{{Src: src.Desc(), Dst: transfer.Desc{Addr: dst.Desc().Addr + off, Len: 4096, Kind: transfer.Host}}})
		if err != nil {
			return err
		}
		defer op.Release()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if st, err := op.Poll(); st.Terminal() {
				return err
			}
		}
		t.Fatal("write did not resolve within 30s")
		return nil
	}
	if err := write(0); err != nil {
		t.Fatalf("write the guard admits: %v", err)
	}
	remoteOf(t, eng).cb.stop() // the host's end of the stream goes away
	err = write(4096)
	// The refusal's text depends on whether the plugin's send or its
	// handler's cleanup saw the stream end first; its class does not.
	if !errors.Is(err, transfer.ErrForbidden) {
		t.Errorf("write after the host's end went away: err = %v, want ErrForbidden", err)
	}
	for i, b := range dst.Bytes()[4096:] {
		if b != 0 {
			t.Fatalf("byte %d landed although no guard answered", 4096+i)
		}
	}
}

// remoteOf digs the remoteEngine out of the tcp engine's host-side type
// (it declares every optional capability).
func remoteOf(t *testing.T, e transfer.Engine) *remoteEngine {
	t.Helper()
	if d, ok := e.(engNFGL); ok {
		if r, ok := d.hostEngine.(*remoteEngine); ok {
			return r
		}
	}
	t.Fatalf("%T wraps no remoteEngine", e)
	return nil
}

// refusingCallbacks is a pb.EngineClient whose Callbacks stream cannot
// be opened (fault injection; every other call is unused here).
type refusingCallbacks struct{ pb.EngineClient }

func (refusingCallbacks) Callbacks(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[pb.HostCallback, pb.PluginCallback], error) {
	return nil, status.Error(codes.Unavailable, "injected: no stream")
}

// TestGuardInstallFailureKillsPlugin: a guard that cannot be installed in
// the plugin fails closed — the plugin process is killed, so its engine
// lands no write the guard never saw; a peer-loss callback alone that
// cannot be installed only logs.
func TestGuardInstallFailureKillsPlugin(t *testing.T) {
	for _, tc := range []struct {
		name     string
		set      func(h *hostCallbacks)
		wantKill int
	}{
		{"guard", func(h *hostCallbacks) {
			h.setGuard(func(_ string, d transfer.Desc) (transfer.Desc, error) { return d, nil })
		}, 1},
		{"peer-lost only", func(h *hostCallbacks) { h.setLost(func(string) {}) }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kills := 0
			c := newClient(KindEngine, "fake", nil, func() { kills++ })
			h := &hostCallbacks{c: c, rpc: refusingCallbacks{}}
			tc.set(h)
			if kills != tc.wantKill {
				t.Fatalf("plugin killed %d times, want %d", kills, tc.wantKill)
			}
		})
	}
}

// replayRecorder records, in order, what a restarted engine is told.
type replayRecorder struct {
	transfer.Engine
	events []string
}

func (r *replayRecorder) SetWriteGuard(transfer.WriteGuard) { r.events = append(r.events, "guard") }

func (r *replayRecorder) RegisterMemory(transfer.Desc) error {
	r.events = append(r.events, "register")
	return nil
}

// TestReplayInstallsGuardFirst: a restarted engine process (which listens
// from its Open) gets the guard before any memory is registered again,
// so no registered byte is writable unchecked in between.
func TestReplayInstallsGuardFirst(t *testing.T) {
	e := &supervisedEngine{
		regs:  map[transfer.Desc]int{{Addr: 4096, Len: 4096, Kind: transfer.Host}: 1, {Addr: 1 << 20, Len: 4096, Kind: transfer.Host}: 2},
		guard: func(_ string, d transfer.Desc) (transfer.Desc, error) { return d, nil },
	}
	r := &replayRecorder{}
	if err := e.replay(r); err != nil {
		t.Fatal(err)
	}
	want := []string{"guard", "register", "register", "register"}
	if !slices.Equal(r.events, want) {
		t.Fatalf("replay told the engine %v, want %v", r.events, want)
	}
}
