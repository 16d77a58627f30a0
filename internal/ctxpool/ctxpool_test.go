package ctxpool

import (
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

func TestGetPutBusyClosed(t *testing.T) {
	var mu sync.Mutex
	p := New("gather/test", &mu, []int{1, 2})
	a, err := p.Get()
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Get()
	if err != nil || a == b {
		t.Fatalf("second Get = %d, %v (first %d)", b, err, a)
	}
	if _, err := p.Get(); !errors.Is(err, transfer.ErrBusy) || err.Error() != "gather/test: submit: all copy contexts in use: "+transfer.ErrBusy.Error() {
		t.Fatalf("Get of an empty pool = %v; want ErrBusy naming the engine", err)
	}
	if !p.Put(a) || p.Idle() != 1 {
		t.Fatalf("Put: idle %d, want 1", p.Idle())
	}
	ran := 0
	free := p.CloseWith(func() {
		ran++
		if mu.TryLock() {
			t.Error("CloseWith's fn ran without the engine's mutex held")
			mu.Unlock()
		}
		if !p.ClosedLocked() {
			t.Error("fn ran before the pool was marked closed")
		}
	})
	if ran != 1 || len(free) != 1 || free[0] != a {
		t.Fatalf("CloseWith: fn ran %d times, returned %v; want once and [%d]", ran, free, a)
	}
	if p.CloseWith(func() { ran++ }) != nil || ran != 1 || p.Close() != nil {
		t.Fatalf("a second close returned contexts or ran fn (%d)", ran)
	}
	if p.Put(b) {
		t.Fatal("Put after Close kept the context; the caller must free it")
	}
	if _, err := p.Get(); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("Get after Close = %v; want ErrClosed", err)
	}
	if p.Idle() != 0 {
		t.Fatalf("idle %d after Close", p.Idle())
	}
}

// TestConcurrentConservation: contexts borrowed and returned from many
// goroutines are never handed out twice at once, and every one is back.
func TestConcurrentConservation(t *testing.T) {
	var mu sync.Mutex
	const n = 4
	p := New("scatter/test", &mu, []int{0, 1, 2, 3})
	var held [n]int32
	var hmu sync.Mutex
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				c, err := p.Get()
				if errors.Is(err, transfer.ErrBusy) {
					continue
				}
				if err != nil {
					t.Errorf("goroutine %d: %v", g, err)
					return
				}
				hmu.Lock()
				held[c]++
				if held[c] != 1 {
					t.Errorf("context %d borrowed twice at once", c)
				}
				hmu.Unlock()
				runtime.Gosched() // others run while c is held
				hmu.Lock()
				held[c]--
				hmu.Unlock()
				p.Put(c)
			}
		}()
	}
	wg.Wait()
	if got := len(p.Close()); got != n {
		t.Fatalf("%d contexts back, want %d", got, n)
	}
}
