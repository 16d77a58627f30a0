package tcp

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// TestOnCompleteSignalsEveryOp: OnComplete runs once per op after it is
// terminal, and Done is closed by then, so a reactor can sleep until it.
func TestOnCompleteSignalsEveryOp(t *testing.T) {
	v := newEnv(t)
	var calls atomic.Int64
	wake := make(chan struct{}, 64)
	a := v.engine("a", func(c *Config) {
		c.OnComplete = func() { calls.Add(1); wake <- struct{}{} }
	})
	b := v.engine("b")
	src := v.buf(1<<20, 1, a)
	dst := v.buf(1<<20, 0, b)
	connect(t, a, b)
	const n = 8
	for i := range n {
		op, err := a.PostWrite("b", []transfer.WriteOp{{Src: sub(src, i*4096, 4096), Dst: sub(dst, i*4096, 4096)}})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-wake:
		case <-time.After(10 * time.Second):
			t.Fatalf("write %d: no OnComplete within 10s", i)
		}
		select {
		case <-op.(interface{ Done() <-chan struct{} }).Done():
		default:
			t.Fatalf("write %d: OnComplete ran before Done was closed", i)
		}
		if st, err := op.Poll(); st != transfer.Done || err != nil {
			t.Fatalf("write %d after OnComplete: %v, %v", i, st, err)
		}
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if got := calls.Load(); got != n {
		t.Fatalf("OnComplete ran %d times for %d writes", got, n)
	}
}
