package cuda_test

import (
	"testing"
	"unsafe"

	"github.com/bouncekv/bounce/cuda"
)

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func TestArgsPacking(t *testing.T) {
	mem := make([]uint64, 2*3)
	base := uintptr(unsafe.Pointer(&mem[0]))
	a := cuda.NewArgsAt(base, 3)
	a.SetU64(0, 0x1122334455667788)
	a.SetU32(1, 0xdeadbeef)
	a.SetU64(2, 7)
	want := []uint64{0x1122334455667788, 0xdeadbeef, 7}
	for i, w := range want {
		if got := a.Slot(i); got != w {
			t.Errorf("slot %d = %#x, want %#x", i, got, w)
		}
		if mem[i] != w {
			t.Errorf("memory word %d = %#x, want %#x", i, mem[i], w)
		}
		// The pointer array follows the slots; entry i points at slot i.
		if p := a.Pointer(i); p != base+uintptr(8*i) {
			t.Errorf("pointer %d = %#x, want %#x", i, p, base+uintptr(8*i))
		}
		if mem[3+i] != uint64(base)+uint64(8*i) {
			t.Errorf("pointer word %d = %#x", i, mem[3+i])
		}
	}
}
