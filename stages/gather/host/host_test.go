package host_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/mem/memtest"
	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/stages/gather/host"
	"github.com/bouncekv/bounce/stages/hostcopy"
	scatterhost "github.com/bouncekv/bounce/stages/scatter/host"
	"github.com/bouncekv/bounce/transfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buffer is memtest.Buffer: registered host memory freed at the end of the test.
var buffer = memtest.Buffer

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func await(t testing.TB, op transfer.Op, ch <-chan struct{}) (transfer.Status, error) {
	t.Helper()
	for {
		if s, err := op.Poll(); s.Terminal() {
			return s, err
		}
		<-ch
	}
}

func done(t testing.TB, op transfer.Op, err error, ch <-chan struct{}) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if s, err := await(t, op, ch); s != transfer.Done {
		t.Fatalf("op = %v, %v; want done", s, err)
	}
	if err := op.Release(); err != nil {
		t.Fatal(err)
	}
}

// KV-like round trip: blocks picked from the source in random order are
// packed into the region (runs coalesced when both sides advance by a
// uniform stride), then scattered to random distinct destination blocks.
func TestGatherScatterRoundTripRapid(t *testing.T) {
	const block, blocks = 256, 64
	reg := &mem.Registry{}
	src, region, dst := buffer(t, reg, block*blocks), buffer(t, reg, block*blocks), buffer(t, reg, block*blocks)
	ch := make(chan struct{}, 1)
	g, err := host.New(host.Settings{Registry: reg, Contexts: 2, Notify: hostcopy.Signal(ch)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	s, err := scatterhost.New(scatterhost.Settings{Registry: reg, Contexts: 2, Notify: hostcopy.Signal(ch)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	rapid.Check(t, func(rt *rapid.T) {
		fill(src.Bytes(), rapid.Uint64().Draw(rt, "seed"))
		clear(region.Bytes())
		clear(dst.Bytes())
		idx := rapid.SliceOfNDistinct(rapid.IntRange(0, blocks-1), 1, blocks, rapid.ID[int]).Draw(rt, "src blocks")
		to := rapid.SliceOfNDistinct(rapid.IntRange(0, blocks-1), len(idx), len(idx), rapid.ID[int]).Draw(rt, "dst blocks")
		length := rapid.Uint64Range(1, block).Draw(rt, "bytes per block")

		gruns := coalesce(src.Desc().Addr, idx, block, length)
		sruns := coalesce(dst.Desc().Addr, to, block, length)
		op, err := g.Gather(region.Desc(), gruns)
		done(t, op, err, ch)
		op, err = s.Scatter(region.Desc(), sruns)
		done(t, op, err, ch)

		want := make([]byte, len(dst.Bytes()))
		for i := range idx {
			copy(want[uint64(to[i])*block:uint64(to[i])*block+length], src.Bytes()[uint64(idx[i])*block:])
		}
		if !bytes.Equal(dst.Bytes(), want) {
			rt.Fatalf("round trip of %d blocks (%d runs gather, %d runs scatter) lost bytes", len(idx), len(gruns), len(sruns))
		}
	})
}

// coalesce packs blocks idx (of size block, length bytes used) densely into
// the region, one run per block, and merges them with the transfer plan's
// own Coalesce.
func coalesce(base uint64, idx []int, block, length uint64) []transfer.Run {
	runs := make([]transfer.Run, len(idx))
	for i, b := range idx {
		runs[i] = transfer.Run{RegionOff: uint64(i) * length, Addr: base + uint64(b)*block, Len: length, Count: 1}
	}
	return plan.Coalesce(runs)
}

func TestGatherRejectsOutOfBounds(t *testing.T) {
	reg := &mem.Registry{}
	src, region := buffer(t, reg, 4096), buffer(t, reg, 4096)
	other := buffer(t, nil, 4096)
	fill(src.Bytes(), 3)
	g, err := host.New(host.Settings{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for _, tc := range []struct {
		name string
		run  transfer.Run
		want error
	}{
		{"past region", transfer.Run{RegionOff: 4000, Addr: src.Desc().Addr, Len: 97, Count: 1}, transfer.ErrOutOfBounds},
		{"unregistered source", transfer.Run{Addr: other.Desc().Addr, Len: 1, Count: 1}, transfer.ErrNotRegistered},
		{"stride overflow", transfer.Run{Addr: src.Desc().Addr, Len: 8, Count: 1 << 62, AddrStride: 8, RegionStride: 0}, transfer.ErrOutOfBounds},
		{"strided past source", transfer.Run{Addr: src.Desc().Addr, Len: 1024, Count: 4, AddrStride: 1025, RegionStride: 1024}, transfer.ErrOutOfBounds},
	} {
		runs := []transfer.Run{{Addr: src.Desc().Addr, Len: 4096, Count: 1}, tc.run}
		if _, err := g.Gather(region.Desc(), runs); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
		if !bytes.Equal(region.Bytes(), make([]byte, 4096)) {
			t.Fatalf("%s: rejected gather wrote to the region", tc.name)
		}
	}
	if g.Idle() != hostcopy.DefaultContexts {
		t.Fatalf("rejections leaked contexts: idle = %d", g.Idle())
	}
}

func TestGatherBusyThenRelease(t *testing.T) {
	reg := &mem.Registry{}
	src, region := buffer(t, reg, 4096), buffer(t, reg, 4096)
	ch := make(chan struct{}, 1)
	g, err := host.New(host.Settings{Registry: reg, Contexts: 3, Notify: hostcopy.Signal(ch)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	runs := []transfer.Run{{Addr: src.Desc().Addr, Len: 4096, Count: 1}}
	var ops []transfer.Op
	for range 3 {
		op, err := g.Gather(region.Desc(), runs)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	if _, err := g.Gather(region.Desc(), runs); !errors.Is(err, transfer.ErrBusy) {
		t.Fatalf("fourth gather: err = %v, want ErrBusy", err)
	}
	await(t, ops[0], ch)
	if err := ops[0].Release(); err != nil {
		t.Fatal(err)
	}
	op, err := g.Gather(region.Desc(), runs)
	done(t, op, err, ch)
	for _, op := range ops[1:] {
		done(t, op, nil, ch)
	}
}

// Close with work outstanding: every operation ends terminal, either copied
// in full or failed with ErrClosed, and all of them can be released.
func TestGatherCloseWithQueuedWork(t *testing.T) {
	const size = 1 << 20
	reg := &mem.Registry{}
	src := buffer(t, reg, size)
	fill(src.Bytes(), 5)
	regions := make([]*mem.Buffer, 6)
	for i := range regions {
		regions[i] = buffer(t, reg, size)
	}
	g, err := host.New(host.Settings{Registry: reg, Contexts: len(regions), Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	var ops []transfer.Op
	for _, r := range regions {
		op, err := g.Gather(r.Desc(), []transfer.Run{{Addr: src.Desc().Addr, Len: size, Count: 1}})
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		s, err := op.Poll()
		switch {
		case s == transfer.Done:
			if !bytes.Equal(regions[i].Bytes(), src.Bytes()) {
				t.Fatalf("op %d done but region differs", i)
			}
		case s == transfer.Failed && errors.Is(err, transfer.ErrClosed):
		default:
			t.Fatalf("op %d after Close = %v, %v; want done or failed with ErrClosed", i, s, err)
		}
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Gather(regions[0].Desc(), nil); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("gather after close: err = %v", err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsBadSettings(t *testing.T) {
	if _, err := host.New(host.Settings{}); err == nil {
		t.Fatal("nil registry accepted")
	}
	if _, err := host.New(host.Settings{Registry: &mem.Registry{}, Contexts: -1}); err == nil {
		t.Fatal("negative contexts accepted")
	}
}

// BenchmarkGatherScattered gathers 16,384 scattered 4 KiB blocks (one run
// each, shuffled so none coalesce) into a 64 MiB region, and in the same
// loop copies the same 64 MiB contiguously with one copy(). ratio is gather
// time over contiguous time.
func BenchmarkGatherScattered(b *testing.B) {
	const block, blocks = 4 << 10, 16384
	const size = block * blocks
	reg := &mem.Registry{}
	src, region, flat := buffer(b, reg, size), buffer(b, reg, size), buffer(b, nil, size)
	fill(src.Bytes(), 1)
	copy(region.Bytes(), src.Bytes()) // fault the pages in before timing
	copy(flat.Bytes(), src.Bytes())
	perm := rand.New(rand.NewPCG(2, 3)).Perm(blocks)
	runs := make([]transfer.Run, blocks)
	for i, p := range perm {
		runs[i] = transfer.Run{RegionOff: uint64(i) * block, Addr: src.Desc().Addr + uint64(p)*block, Len: block, Count: 1}
	}
	ch := make(chan struct{}, 1)
	g, err := host.New(host.Settings{Registry: reg, Notify: hostcopy.Signal(ch)})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()

	var gather, contiguous time.Duration
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		copy(flat.Bytes(), src.Bytes())
		t1 := time.Now()
		op, err := g.Gather(region.Desc(), runs)
		if err != nil {
			b.Fatal(err)
		}
		if s, err := await(b, op, ch); s != transfer.Done {
			b.Fatal(s, err)
		}
		_ = op.Release()
		t2 := time.Now()
		contiguous += t1.Sub(t0)
		gather += t2.Sub(t1)
	}
	b.ReportMetric(float64(gather)/float64(contiguous), "ratio")
	b.ReportMetric(float64(size)*float64(b.N)/gather.Seconds()/1e9, "gather-GB/s")
	b.ReportMetric(float64(size)*float64(b.N)/contiguous.Seconds()/1e9, "contig-GB/s")
}
