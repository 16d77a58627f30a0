// Package memtest provides registered host memory for tests.
package memtest

import (
	"testing"

	"github.com/bouncekv/bounce/mem"
)

// Buffer allocates n bytes of host memory (mem.Alloc), adds it to reg when
// reg is not nil, and frees it when the test ends.
func Buffer(t testing.TB, reg *mem.Registry, n uint64) *mem.Buffer {
	t.Helper()
	b, err := mem.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Free() })
	if reg != nil {
		if err := reg.Add(b.Desc()); err != nil {
			t.Fatal(err)
		}
	}
	return b
}
