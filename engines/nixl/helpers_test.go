//go:build nixl

package nixl

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/enginetest"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/mem/memtest"
	"github.com/bouncekv/bounce/transfer"
)

// hangGuard bounds every wait in the tests; it detects hangs, it is not a
// performance threshold.
const hangGuard = 60 * time.Second

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%q): %v", cfg.Name, err)
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

// pair is two engines, each with a registered buffer, where a has loaded b.
type pair struct {
	a, b       *Engine
	abuf, bbuf *mem.Buffer
}

func newPair(t testing.TB, size uint64, cfg Config) *pair {
	t.Helper()
	ca, cb := cfg, cfg
	ca.Name, cb.Name = "a", "b"
	p := &pair{a: newEngine(t, ca), b: newEngine(t, cb), abuf: alloc(t, size), bbuf: alloc(t, size)}
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

// wait polls op until it is terminal.
func wait(t testing.TB, op transfer.Op) (transfer.Status, error) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		s, err := op.Poll()
		if s.Terminal() {
			return s, err
		}
		if time.Now().After(deadline) {
			t.Fatalf("op still pending after %v", hangGuard)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func mustDone(t testing.TB, op transfer.Op) {
	t.Helper()
	if s, err := wait(t, op); s != transfer.Done {
		t.Fatalf("op ended %v: %v", s, err)
	}
	if err := op.Release(); err != nil {
		t.Fatalf("release: %v", err)
	}
}

func sub(b *mem.Buffer, off, n uint64) transfer.Desc {
	return mem.DescOf(b.Bytes()[off : off+n])
}

func recv(t testing.TB, e *Engine) transfer.Message {
	t.Helper()
	m, err := e.RecvNotification(hangGuard)
	if err != nil {
		t.Fatalf("%s: receive: %v", e.Name(), err)
	}
	return m
}

func isAll(err error, targets ...error) bool {
	for _, t := range targets {
		if !errors.Is(err, t) {
			return false
		}
	}
	return true
}
