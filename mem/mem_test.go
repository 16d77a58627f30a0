package mem

import (
	"bytes"
	"errors"
	"testing"

	"github.com/bouncekv/bounce/transfer"
)

func TestArenaSharedMapping(t *testing.T) {
	a, err := NewArena("t", 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	copy(a.Bytes()[100:], "hello")
	// A second mapping of the same memfd sees the same bytes.
	b, err := MapArena("t2", a.Fd(), 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b.Bytes()[100:105]); got != "hello" {
		t.Fatalf("shared mapping read %q, want hello", got)
	}
	b.buf2close()
	if a.Desc().Len != 1<<16 || a.Desc().Kind != transfer.Host {
		t.Fatalf("desc = %v", a.Desc())
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// buf2close unmaps without closing the shared fd (owned by the first arena).
func (a *Arena) buf2close() { _ = unmap(a) }

func TestRegistryBounds(t *testing.T) {
	buf, err := Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	var r Registry
	d := buf.Desc()
	if err := r.Add(d); err != nil {
		t.Fatal(err)
	}
	if err := r.Add(d); err != nil {
		t.Fatalf("re-adding the same range: %v", err)
	}
	if err := r.Add(transfer.Desc{Addr: d.Addr + 10, Len: 10}); err == nil {
		t.Fatal("overlapping range accepted")
	}
	s, err := r.Slice(d.Addr+4000, 96)
	if err != nil {
		t.Fatal(err)
	}
	copy(s, bytes.Repeat([]byte{7}, 96))
	if buf.Bytes()[4095] != 7 {
		t.Fatal("slice does not alias the buffer")
	}
	if _, err := r.Slice(d.Addr+4000, 97); !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("one byte over: err = %v, want ErrOutOfBounds", err)
	}
	if _, err := r.Slice(d.Addr-1, 1); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("below: err = %v, want ErrNotRegistered", err)
	}
	if _, err := r.Slice(d.End(), 1); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("past end: err = %v, want ErrNotRegistered", err)
	}
	if err := r.Remove(d); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Slice(d.Addr, 1); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("after remove: err = %v", err)
	}
}

func TestAllocIsSharedZeroedMemfd(t *testing.T) {
	b, err := Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range b.Bytes() {
		if c != 0 {
			t.Fatalf("byte %d = %d, want zeroed memory", i, c)
		}
	}
	copy(b.Bytes()[4000:], "shared")
	// A second mapping of the buffer's memfd sees the same bytes.
	m, err := MapArena("view", b.Fd(), 8192)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(m.Bytes()[4000:4006]); got != "shared" {
		t.Fatalf("second mapping read %q, want shared", got)
	}
	m.buf2close()
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if b.Fd() != -1 {
		t.Fatalf("Fd after Free = %d, want -1", b.Fd())
	}
	if err := b.Free(); err != nil {
		t.Fatalf("second Free: %v", err)
	}
}

// TestSharedMappingsUseTheShareWindow: shared memory lands in the address
// window plugin processes leave free (the kernel may refuse a taken hint,
// so one of several allocations is enough).
func TestSharedMappingsUseTheShareWindow(t *testing.T) {
	inWindow := false
	for range 4 {
		b, err := Alloc(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		a := b.Desc().Addr
		inWindow = inWindow || (a >= shareBase && a < shareBase+shareSpan)
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
	}
	if !inWindow {
		t.Fatal("no allocation landed in the share window")
	}
}
