package mem

import (
	"bytes"
	"errors"
	"strings"
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

// TestCheckWrite covers the op checks engines share: host memory only,
// equal lengths, empty ops accepted without a lookup, the source in a
// registered range; the destination is not CheckWrite's to check.
func TestCheckWrite(t *testing.T) {
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
	far := transfer.Desc{Addr: 1 << 40, Len: 8, Kind: transfer.Host}
	for _, tc := range []struct {
		name string
		op   transfer.WriteOp
		want error  // nil: accepted
		msg  string // in the error
	}{
		{"cuda source", transfer.WriteOp{Src: transfer.Desc{Addr: d.Addr, Len: 8, Kind: transfer.CUDA}, Dst: far}, transfer.ErrUnsupported, "only host memory"},
		{"cuda destination", transfer.WriteOp{Src: sub(d, 0, 8), Dst: transfer.Desc{Addr: 1 << 40, Len: 8, Kind: transfer.CUDA}}, transfer.ErrUnsupported, "only host memory"},
		{"lengths differ", transfer.WriteOp{Src: sub(d, 0, 8), Dst: transfer.Desc{Addr: 1 << 40, Len: 9}}, transfer.ErrOutOfBounds, "source and destination lengths differ"},
		{"source past the range", transfer.WriteOp{Src: sub(d, 4090, 8), Dst: far}, transfer.ErrOutOfBounds, "exceeds registered"},
		{"source unregistered", transfer.WriteOp{Src: transfer.Desc{Addr: d.End(), Len: 8}, Dst: far}, transfer.ErrNotRegistered, ""},
	} {
		got, err := CheckWrite(&r, tc.op)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) || got != (transfer.Desc{}) {
			t.Errorf("%s: CheckWrite = %v, %v; want an error wrapping %v saying %q", tc.name, got, err, tc.want, tc.msg)
		}
	}
	if got, err := CheckWrite(&r, transfer.WriteOp{Src: sub(d, 4088, 8), Dst: far}); err != nil || got != d {
		t.Errorf("op in the range: %v, %v; want %v", got, err, d)
	}
	if got, err := CheckWrite(&r, transfer.WriteOp{Src: transfer.Desc{Addr: 8}, Dst: transfer.Desc{Addr: 16}}); err != nil || got != (transfer.Desc{}) {
		t.Errorf("empty op outside any range: %v, %v; want accepted with a zero range", got, err)
	}
}

func sub(d transfer.Desc, off, n uint64) transfer.Desc {
	return transfer.Desc{Addr: d.Addr + off, Len: n, Kind: d.Kind}
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

func TestCheckRanges(t *testing.T) {
	ok := []transfer.Desc{{Addr: 0x1000, Len: 0x100}, {Addr: 0x1100, Len: 1}, {Addr: 0x2000, Len: 0x10}}
	if err := CheckRanges(ok); err != nil {
		t.Fatalf("adjacent ascending ranges refused: %v", err)
	}
	if err := CheckRanges(nil); err != nil {
		t.Fatalf("no ranges refused: %v", err)
	}
	for name, bad := range map[string][]transfer.Desc{
		"empty":    {{Addr: 0x1000, Len: 0}},
		"wraps":    {{Addr: ^uint64(0) - 1, Len: 4}},
		"overlap":  {{Addr: 0x1000, Len: 0x100}, {Addr: 0x10ff, Len: 1}},
		"unsorted": {{Addr: 0x2000, Len: 1}, {Addr: 0x1000, Len: 1}},
	} {
		if err := CheckRanges(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestRegistryPin: a pinned range cannot be removed until every pin is
// released; a pin of a range no longer registered pins nothing.
func TestRegistryPin(t *testing.T) {
	var r Registry
	a := transfer.Desc{Addr: 1 << 20, Len: 4096, Kind: transfer.Host}
	b := transfer.Desc{Addr: 2 << 20, Len: 4096, Kind: transfer.Host}
	for _, d := range []transfer.Desc{a, b} {
		if err := r.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Pin([]uint64{a.Addr}); err != nil {
		t.Fatal(err)
	}
	if err := r.Pin([]uint64{a.Addr}); err != nil { // a second copy
		t.Fatal(err)
	}
	if err := r.Remove(a); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("remove pinned: %v, want ErrInUse", err)
	}
	r.Unpin([]uint64{a.Addr})
	if err := r.Remove(a); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("remove with one pin left: %v, want ErrInUse", err)
	}
	r.Unpin([]uint64{a.Addr})
	if err := r.Remove(a); err != nil {
		t.Fatalf("remove unpinned: %v", err)
	}
	// a is gone: pinning it with b fails and leaves b unpinned.
	if err := r.Pin([]uint64{b.Addr, a.Addr}); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("pin of a removed range: %v, want ErrNotRegistered", err)
	}
	if err := r.Remove(b); err != nil {
		t.Fatalf("b was pinned by a failed Pin: %v", err)
	}
}
