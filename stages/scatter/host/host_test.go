package host_test

import (
	"bytes"
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/mem/memtest"
	"github.com/bouncekv/bounce/stages/hostcopy"
	"github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/transfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buffer is memtest.Buffer: registered host memory freed at the end of the test.
var buffer = memtest.Buffer

func await(op transfer.Op, ch <-chan struct{}) (transfer.Status, error) {
	for {
		if s, err := op.Poll(); s.Terminal() {
			return s, err
		}
		<-ch
	}
}

func TestScatterStridedCountRuns(t *testing.T) {
	reg := &mem.Registry{}
	region, dst := buffer(t, reg, 4096), buffer(t, reg, 1<<16)
	for i := range region.Bytes() {
		region.Bytes()[i] = byte(i*7 + 1)
	}
	ch := make(chan struct{}, 1)
	s, err := host.New(host.Settings{Registry: reg, Notify: hostcopy.Signal(ch)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := dst.Desc().Addr
	runs := []transfer.Run{
		// 10 copies of 48 bytes, densely from the region, 1000 bytes apart.
		{RegionOff: 0, Addr: base + 500, Len: 48, Count: 10, RegionStride: 48, AddrStride: 1000},
		// The same 16 region bytes broadcast to 4 places (region stride 0).
		{RegionOff: 480, Addr: base + 40000, Len: 16, Count: 4, RegionStride: 0, AddrStride: 100},
		// Count 1 ignores its strides.
		{RegionOff: 496, Addr: base + 60000, Len: 4, Count: 1, RegionStride: 1 << 60, AddrStride: 1 << 60},
	}
	op, err := s.Scatter(region.Desc(), runs)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := await(op, ch); st != transfer.Done {
		t.Fatalf("scatter = %v, %v", st, err)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 1<<16)
	r := region.Bytes()
	for i := range 10 {
		copy(want[500+i*1000:], r[i*48:(i+1)*48])
	}
	for i := range 4 {
		copy(want[40000+i*100:], r[480:496])
	}
	copy(want[60000:], r[496:500])
	if !bytes.Equal(dst.Bytes(), want) {
		t.Fatal("scattered bytes differ")
	}
}

func TestScatterRejectsWithoutWriting(t *testing.T) {
	reg := &mem.Registry{}
	region, dst := buffer(t, reg, 4096), buffer(t, reg, 4096)
	unreg := buffer(t, nil, 4096)
	for i := range region.Bytes() {
		region.Bytes()[i] = 0xAB
	}
	s, err := host.New(host.Settings{Registry: reg, Contexts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := transfer.Run{Addr: dst.Desc().Addr, Len: 4096, Count: 1} // valid, must not run
	for _, tc := range []struct {
		name string
		run  transfer.Run
		want error
	}{
		{"unregistered destination", transfer.Run{Addr: unreg.Desc().Addr, Len: 8, Count: 1}, transfer.ErrNotRegistered},
		{"destination overrun", transfer.Run{Addr: dst.Desc().Addr + 4090, Len: 8, Count: 1}, transfer.ErrOutOfBounds},
		{"strided destination overrun", transfer.Run{Addr: dst.Desc().Addr, Len: 8, Count: 3, AddrStride: 2046}, transfer.ErrOutOfBounds},
		{"region overrun", transfer.Run{RegionOff: 4089, Addr: dst.Desc().Addr, Len: 8, Count: 1}, transfer.ErrOutOfBounds},
		{"stride overflow", transfer.Run{Addr: dst.Desc().Addr, Len: 1, Count: 5, RegionStride: 1 << 62}, transfer.ErrOutOfBounds},
	} {
		if _, err := s.Scatter(region.Desc(), []transfer.Run{first, tc.run}); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
		if !bytes.Equal(dst.Bytes(), make([]byte, 4096)) || !bytes.Equal(unreg.Bytes(), make([]byte, 4096)) {
			t.Fatalf("%s: rejected scatter wrote bytes", tc.name)
		}
	}
	if s.Idle() != 1 {
		t.Fatalf("idle = %d, want 1", s.Idle())
	}
}

func TestScatterBusyAndClose(t *testing.T) {
	reg := &mem.Registry{}
	region, dst := buffer(t, reg, 4096), buffer(t, reg, 4096)
	ch := make(chan struct{}, 1)
	s, err := host.New(host.Settings{Registry: reg, Contexts: 1, Notify: hostcopy.Signal(ch)})
	if err != nil {
		t.Fatal(err)
	}
	runs := []transfer.Run{{Addr: dst.Desc().Addr, Len: 64, Count: 1}}
	op, err := s.Scatter(region.Desc(), runs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Scatter(region.Desc(), runs); !errors.Is(err, transfer.ErrBusy) {
		t.Fatalf("second scatter: err = %v, want ErrBusy", err)
	}
	if st, _ := await(op, ch); st != transfer.Done {
		t.Fatal(st)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	op, err = s.Scatter(region.Desc(), runs)
	if err != nil {
		t.Fatalf("scatter after release: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := op.Poll(); !(st == transfer.Done || (st == transfer.Failed && errors.Is(err, transfer.ErrClosed))) {
		t.Fatalf("op after close = %v, %v", st, err)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Scatter(region.Desc(), runs); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("scatter after close: err = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
