package write_test

import (
	"bytes"
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/stages/write"
	"github.com/bouncekv/bounce/transfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type setup struct {
	w        *write.Writer
	src, dst *mem.Buffer
	done     chan struct{}
}

func newSetup(t *testing.T, opts loopback.Options) setup {
	t.Helper()
	f := loopback.NewFabric()
	done := make(chan struct{}, 1)
	opts.OnComplete = func() {
		select {
		case done <- struct{}{}:
		default:
		}
	}
	a, err := f.NewEngine("a", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	b, err := f.NewEngine("b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	var bufs [2]*mem.Buffer
	for i, e := range []*loopback.Engine{a, b} {
		buf, err := mem.Alloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = buf.Free() })
		if err := e.RegisterMemory(buf.Desc()); err != nil {
			t.Fatal(err)
		}
		bufs[i] = buf
	}
	md, err := b.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.LoadPeer(md); err != nil {
		t.Fatal(err)
	}
	for i := range bufs[0].Bytes() {
		bufs[0].Bytes()[i] = byte(i*13 + 7)
	}
	return setup{w: write.New(a), src: bufs[0], dst: bufs[1], done: done}
}

func sub(d transfer.Desc, off, n uint64) transfer.Desc {
	return transfer.Desc{Addr: d.Addr + off, Len: n, Kind: transfer.Host}
}

func await(op transfer.Op, ch <-chan struct{}) (transfer.Status, error) {
	for {
		if s, err := op.Poll(); s.Terminal() {
			return s, err
		}
		<-ch
	}
}

func TestWriteLandsByteExact(t *testing.T) {
	s := newSetup(t, loopback.Options{})
	op, err := s.w.Write("b", sub(s.src.Desc(), 4096, 300000), sub(s.dst.Desc(), 12345, 300000))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := await(op, s.done); st != transfer.Done || err != nil {
		t.Fatalf("op = %v, %v", st, err)
	}
	want := make([]byte, 1<<20)
	copy(want[12345:], s.src.Bytes()[4096:4096+300000])
	if !bytes.Equal(s.dst.Bytes(), want) {
		t.Fatal("destination differs")
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
}

func TestWriteValidatesLengths(t *testing.T) {
	s := newSetup(t, loopback.Options{})
	for name, d := range map[string][2]transfer.Desc{
		"mismatch": {sub(s.src.Desc(), 0, 10), sub(s.dst.Desc(), 0, 11)},
		"empty":    {sub(s.src.Desc(), 0, 0), sub(s.dst.Desc(), 0, 0)},
	} {
		if _, err := s.w.Write("b", d[0], d[1]); !errors.Is(err, transfer.ErrOutOfBounds) {
			t.Errorf("%s: err = %v, want ErrOutOfBounds", name, err)
		}
	}
	if _, err := write.New(nil).Write("b", s.src.Desc(), s.dst.Desc()); err == nil {
		t.Error("nil engine accepted")
	}
}

func TestWriteFailurePropagates(t *testing.T) {
	errLink := errors.New("link down")
	s := newSetup(t, loopback.Options{BeforeCopy: func(string, []transfer.WriteOp) error { return errLink }})
	// Rejected at post: the engine's error comes back wrapped.
	if _, err := s.w.Write("nobody", s.src.Desc(), s.dst.Desc()); !errors.Is(err, transfer.ErrUnknownPeer) {
		t.Fatalf("unknown peer: err = %v", err)
	}
	if _, err := s.w.Write("b", sub(s.src.Desc(), 1<<20-8, 16), sub(s.dst.Desc(), 0, 16)); !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("source overrun: err = %v", err)
	}
	// Failed in flight: the Op is the engine's and reports its error.
	op, err := s.w.Write("b", s.src.Desc(), s.dst.Desc())
	if err != nil {
		t.Fatal(err)
	}
	if st, err := await(op, s.done); st != transfer.Failed || !errors.Is(err, errLink) {
		t.Fatalf("op = %v, %v; want failed with the engine's error", st, err)
	}
	if !bytes.Equal(s.dst.Bytes(), make([]byte, 1<<20)) {
		t.Fatal("failed write changed the destination")
	}
}
