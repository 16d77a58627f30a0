package mem

import (
	"errors"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

func TestLookupNumbersEachRegistration(t *testing.T) {
	var r Registry
	d := transfer.Desc{Addr: 4096, Len: 4096}
	if err := r.Add(d); err != nil {
		t.Fatal(err)
	}
	_, g1, err := r.Lookup(4096+10, 10)
	if err != nil || g1 == 0 {
		t.Fatalf("lookup: %d %v", g1, err)
	}
	if err := r.Add(d); err != nil { // the same range again: the same registration
		t.Fatal(err)
	}
	if _, g, _ := r.Lookup(4096, 1); g != g1 {
		t.Fatalf("re-adding an identical range renumbered it: %d, want %d", g, g1)
	}
	if err := r.Remove(d); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Lookup(4096, 1); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("lookup after remove: %v", err)
	}
	if err := r.Add(d); err != nil {
		t.Fatal(err)
	}
	if _, g2, _ := r.Lookup(4096, 1); g2 == g1 || g2 == 0 {
		t.Fatalf("registered again: number %d, want new (not %d)", g2, g1)
	}
}
