package ucx

import (
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/engines/enginetest"
	"github.com/bouncekv/bounce/internal/childproc"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/mem/memtest"
	"github.com/bouncekv/bounce/transfer"
)

func TestMain(m *testing.M) {
	if childproc.Role(childEnv) != "" {
		os.Exit(childMain())
	}
	// Loopback only: never let UCX pick a non-loopback network device.
	if os.Getenv("UCX_NET_DEVICES") == "" {
		os.Setenv("UCX_NET_DEVICES", "lo")
	}
	goleak.VerifyTestMain(m)
}

// hangGuard bounds every wait in the tests; it detects hangs, it is not a
// performance threshold.
const hangGuard = 60 * time.Second

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// alloc maps size bytes freed at cleanup. Call it before newEngine for an
// engine that registers the buffer, so the engine closes first.
func alloc(t testing.TB, size uint64) *mem.Buffer { return memtest.Buffer(t, nil, size) }

// register registers a buffer; load makes its second engine known to its
// first.
var register, load = enginetest.Register, enginetest.Load

// pair is two engines, each with a registered buffer of size bytes, where a
// has loaded b.
type pair struct {
	a, b       *Engine
	abuf, bbuf *mem.Buffer
}

func newPair(t testing.TB, mode ErrMode, size uint64) pair {
	t.Helper()
	// Buffers first: cleanups run last-in first-out, so the engines close
	// before the memory they registered is unmapped.
	p := pair{abuf: alloc(t, size), bbuf: alloc(t, size)}
	p.a = newEngine(t, Config{Name: "a", ErrMode: mode})
	p.b = newEngine(t, Config{Name: "b", ErrMode: mode})
	register(t, p.a, p.abuf)
	register(t, p.b, p.bbuf)
	load(t, p.a, p.b)
	return p
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

func desc(b *mem.Buffer, off, n uint64) transfer.Desc {
	d := b.Desc()
	return transfer.Desc{Addr: d.Addr + off, Len: n, Kind: transfer.Host}
}

// wait polls op until it is terminal, failing the test if that takes longer
// than hangGuard.
func wait(t testing.TB, op transfer.Op) (transfer.Status, error) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		s, err := op.Poll()
		if s.Terminal() {
			return s, err
		}
		if time.Now().After(deadline) {
			t.Fatalf("op still %v after %v", s, hangGuard)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func mustDone(t testing.TB, op transfer.Op) {
	t.Helper()
	s, err := wait(t, op)
	if s != transfer.Done {
		t.Fatalf("op %v: %v", s, err)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
}

func mustFail(t testing.TB, op transfer.Op, want error) error {
	t.Helper()
	s, err := wait(t, op)
	if s != transfer.Failed || !errors.Is(err, want) {
		t.Fatalf("op %v (%v), want failed with %v", s, err, want)
	}
	return err
}

// pause blocks e's progress goroutine until the returned func is called: e
// then neither runs commands nor progresses UCX.
func pause(t testing.TB, e *Engine) (resume func()) {
	t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.call("pause", func() error { close(entered); <-release; return nil })
	}()
	<-entered
	resume = sync.OnceFunc(func() { close(release); <-done })
	t.Cleanup(resume)
	return resume
}

// allModes are the error-handling modes tests run under.
func allModes() []ErrMode { return []ErrMode{PeerErrors, NoPeerErrors} }
