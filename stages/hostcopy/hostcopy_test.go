package hostcopy_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/mem/memtest"
	"github.com/bouncekv/bounce/stages/hostcopy"
	"github.com/bouncekv/bounce/transfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buffer is memtest.Buffer: registered host memory freed at the end of the test.
var buffer = memtest.Buffer

func newEngine(t testing.TB, dir hostcopy.Direction, cfg hostcopy.Settings) *hostcopy.Engine {
	t.Helper()
	e, err := hostcopy.New(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// wait blocks until op is terminal, sleeping on the engine's Notify channel.
func wait(t testing.TB, op transfer.Op, ch <-chan struct{}) (transfer.Status, error) {
	t.Helper()
	for {
		s, err := op.Poll()
		if s.Terminal() {
			return s, err
		}
		<-ch
	}
}

func mustDone(t testing.TB, op transfer.Op, ch <-chan struct{}) {
	t.Helper()
	if s, err := wait(t, op, ch); s != transfer.Done || err != nil {
		t.Fatalf("op = %v, %v; want done", s, err)
	}
	if err := op.Release(); err != nil {
		t.Fatalf("release: %v", err)
	}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// applyModel performs runs on plain slices the way the engine must: runs in
// order, copies in order.
func applyModel(dir hostcopy.Direction, region []byte, ext []byte, extBase uint64, runs []transfer.Run) {
	for _, r := range runs {
		for i := uint64(0); i < r.Count; i++ {
			roff, aoff := r.RegionOff, r.Addr-extBase
			if r.Count > 1 {
				roff += i * r.RegionStride
				aoff += i * r.AddrStride
			}
			if dir == hostcopy.Gather {
				copy(region[roff:roff+r.Len], ext[aoff:aoff+r.Len])
			} else {
				copy(ext[aoff:aoff+r.Len], region[roff:roff+r.Len])
			}
		}
	}
}

func TestGatherThenScatterMatchesModel(t *testing.T) {
	const size = 64 << 10
	reg := &mem.Registry{}
	src, region, dst := buffer(t, reg, size), buffer(t, reg, size), buffer(t, reg, size)
	ch := make(chan struct{}, 1)
	g := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Notify: hostcopy.Signal(ch)})
	s := newEngine(t, hostcopy.Scatter, hostcopy.Settings{Registry: reg, Notify: hostcopy.Signal(ch)})

	rapid.Check(t, func(rt *rapid.T) {
		fill(src.Bytes(), rapid.Uint64().Draw(rt, "seed"))
		clear(region.Bytes())
		clear(dst.Bytes())
		n := rapid.IntRange(0, 8).Draw(rt, "runs")
		gruns := make([]transfer.Run, n)
		sruns := make([]transfer.Run, n)
		for i := range gruns {
			r := transfer.Run{
				Len:          rapid.Uint64Range(0, 700).Draw(rt, "len"),
				Count:        rapid.Uint64Range(0, 6).Draw(rt, "count"),
				RegionStride: rapid.Uint64Range(0, 1500).Draw(rt, "rstride"),
				AddrStride:   rapid.Uint64Range(0, 1500).Draw(rt, "astride"),
			}
			if rapid.Bool().Draw(rt, "dense") {
				r.RegionStride, r.AddrStride = r.Len, r.Len
			}
			span := func(stride uint64) uint64 {
				if r.Count <= 1 {
					return r.Len
				}
				return (r.Count-1)*stride + r.Len
			}
			r.RegionOff = rapid.Uint64Range(0, size-span(r.RegionStride)).Draw(rt, "roff")
			off := rapid.Uint64Range(0, size-span(r.AddrStride)).Draw(rt, "aoff")
			r.Addr = src.Desc().Addr + off
			gruns[i] = r
			r.Addr = dst.Desc().Addr + off
			sruns[i] = r
		}

		op, err := g.Submit(region.Desc(), gruns)
		if err != nil {
			rt.Fatalf("gather: %v", err)
		}
		mustDone(t, op, ch)
		wantRegion := make([]byte, size)
		applyModel(hostcopy.Gather, wantRegion, src.Bytes(), src.Desc().Addr, gruns)
		if !bytes.Equal(region.Bytes(), wantRegion) {
			rt.Fatalf("gathered region differs from the model")
		}

		op, err = s.Submit(region.Desc(), sruns)
		if err != nil {
			rt.Fatalf("scatter: %v", err)
		}
		mustDone(t, op, ch)
		wantDst := make([]byte, size)
		applyModel(hostcopy.Scatter, wantRegion, wantDst, dst.Desc().Addr, sruns)
		if !bytes.Equal(dst.Bytes(), wantDst) {
			rt.Fatalf("scattered destination differs from the model")
		}
	})
}

func TestStridedRunsRoundTrip(t *testing.T) {
	reg := &mem.Registry{}
	src, region, dst := buffer(t, reg, 1<<16), buffer(t, reg, 1<<16), buffer(t, reg, 1<<16)
	fill(src.Bytes(), 7)
	ch := make(chan struct{}, 1)
	g := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Notify: hostcopy.Signal(ch)})
	s := newEngine(t, hostcopy.Scatter, hostcopy.Settings{Registry: reg, Notify: hostcopy.Signal(ch)})

	// 16 blocks of 100 bytes, every 256 bytes of the source, packed densely
	// into the region from offset 32; then 8 dense blocks of 64 bytes.
	runs := []transfer.Run{
		{RegionOff: 32, Addr: src.Desc().Addr + 1000, Len: 100, Count: 16, RegionStride: 100, AddrStride: 256},
		{RegionOff: 32 + 1600, Addr: src.Desc().Addr + 20000, Len: 64, Count: 8, RegionStride: 64, AddrStride: 64},
	}
	op, err := g.Submit(region.Desc(), runs)
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op, ch)
	for i := range 16 {
		got := region.Bytes()[32+i*100 : 32+(i+1)*100]
		want := src.Bytes()[1000+i*256 : 1000+i*256+100]
		if !bytes.Equal(got, want) {
			t.Fatalf("block %d gathered wrongly", i)
		}
	}
	if !bytes.Equal(region.Bytes()[1632:1632+512], src.Bytes()[20000:20512]) {
		t.Fatal("dense run gathered wrongly")
	}
	if !bytes.Equal(region.Bytes()[:32], make([]byte, 32)) || !bytes.Equal(region.Bytes()[2144:], make([]byte, 1<<16-2144)) {
		t.Fatal("gather wrote outside its runs")
	}

	back := make([]transfer.Run, len(runs))
	for i, r := range runs {
		r.Addr = r.Addr - src.Desc().Addr + dst.Desc().Addr
		back[i] = r
	}
	op, err = s.Submit(region.Desc(), back)
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op, ch)
	want := make([]byte, 1<<16)
	for i := range 16 {
		o := 1000 + i*256
		copy(want[o:o+100], src.Bytes()[o:o+100])
	}
	copy(want[20000:20512], src.Bytes()[20000:20512])
	if !bytes.Equal(dst.Bytes(), want) {
		t.Fatal("scatter did not restore exactly the gathered bytes")
	}
}

// A strided run may hop between registrations as long as every copy lies in
// one; the span between them need not be registered.
func TestStridedRunAcrossRegistrations(t *testing.T) {
	const page = 4096
	reg := &mem.Registry{}
	whole := buffer(t, nil, 3*page)
	base := whole.Desc().Addr
	for _, p := range []uint64{0, 2} {
		if err := reg.Add(transfer.Desc{Addr: base + p*page, Len: page, Kind: transfer.Host}); err != nil {
			t.Fatal(err)
		}
	}
	fill(whole.Bytes(), 3)
	region := buffer(t, reg, page)
	ch := make(chan struct{}, 1)
	g := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Notify: hostcopy.Signal(ch)})

	op, err := g.Submit(region.Desc(), []transfer.Run{{Addr: base + 100, Len: 50, Count: 2, RegionStride: 50, AddrStride: 2 * page}})
	if err != nil {
		t.Fatal(err)
	}
	mustDone(t, op, ch)
	if !bytes.Equal(region.Bytes()[:50], whole.Bytes()[100:150]) || !bytes.Equal(region.Bytes()[50:100], whole.Bytes()[2*page+100:2*page+150]) {
		t.Fatal("hopping run gathered wrongly")
	}

	_, err = g.Submit(region.Desc(), []transfer.Run{{Addr: base + 100, Len: 50, Count: 3, RegionStride: 50, AddrStride: page}})
	if !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("copy in the unregistered middle page: err = %v, want ErrNotRegistered", err)
	}
}

func TestRejectsBadRunsWithoutWriting(t *testing.T) {
	const size = 8192
	// One mapping, laid out src | unreg | region | gap | dst | gap, with only
	// src, region and dst registered, so every address past a registered
	// buffer is known to be unregistered.
	reg := &mem.Registry{}
	whole := buffer(t, nil, 6*size).Bytes()
	src, unreg, region, dst := whole[:size], whole[size:2*size], whole[2*size:3*size], whole[4*size:5*size]
	for _, b := range [][]byte{src, region, dst} {
		if err := reg.Add(mem.DescOf(b)); err != nil {
			t.Fatal(err)
		}
	}
	fill(src, 1)
	fill(unreg, 2)
	S, R, D, U := mem.DescOf(src), mem.DescOf(region), mem.DescOf(dst), mem.DescOf(unreg)
	const max = ^uint64(0)

	good := func(addr uint64) transfer.Run { return transfer.Run{Addr: addr, Len: 64, Count: 1} }
	cases := []struct {
		name   string
		region transfer.Desc
		runs   func(addr uint64) []transfer.Run // addr: base of the registered side buffer
		want   error
	}{
		{"region end overflow", R, func(a uint64) []transfer.Run {
			return []transfer.Run{good(a), {RegionOff: size - 10, Addr: a, Len: 11, Count: 1}}
		}, transfer.ErrOutOfBounds},
		{"region offset past end", R, func(a uint64) []transfer.Run { return []transfer.Run{{RegionOff: size, Addr: a, Len: 1, Count: 1}} }, transfer.ErrOutOfBounds},
		{"region offset wraps", R, func(a uint64) []transfer.Run { return []transfer.Run{{RegionOff: max - 3, Addr: a, Len: 8, Count: 1}} }, transfer.ErrOutOfBounds},
		{"last strided copy outside region", R, func(a uint64) []transfer.Run {
			return []transfer.Run{{Addr: a, Len: 64, Count: 3, RegionStride: size / 2, AddrStride: 64}}
		}, transfer.ErrOutOfBounds},
		{"region stride overflow", R, func(a uint64) []transfer.Run {
			return []transfer.Run{{Addr: a, Len: 1, Count: 1 << 40, RegionStride: 1 << 30, AddrStride: 0}}
		}, transfer.ErrOutOfBounds},
		{"addr stride overflow", R, func(a uint64) []transfer.Run {
			return []transfer.Run{{Addr: a, Len: 1, Count: 3, RegionStride: 0, AddrStride: max / 2}}
		}, transfer.ErrOutOfBounds},
		{"addr wraps", R, func(a uint64) []transfer.Run { return []transfer.Run{{Addr: max - 2, Len: 8, Count: 1}} }, transfer.ErrOutOfBounds},
		{"addr unregistered", R, func(uint64) []transfer.Run { return []transfer.Run{good(S.Addr), good(U.Addr)} }, transfer.ErrNotRegistered},
		{"addr crosses registered end", R, func(a uint64) []transfer.Run {
			return []transfer.Run{{Addr: a + size - 32, Len: 64, Count: 1}}
		}, transfer.ErrOutOfBounds},
		{"strided addr leaves registration", R, func(a uint64) []transfer.Run {
			return []transfer.Run{{Addr: a, Len: 64, Count: 4, RegionStride: 64, AddrStride: size / 2}}
		}, transfer.ErrNotRegistered},
		{"region unregistered", U, func(a uint64) []transfer.Run { return []transfer.Run{good(a)} }, transfer.ErrNotRegistered},
		{"region larger than registration", transfer.Desc{Addr: R.Addr, Len: size + 1, Kind: transfer.Host}, func(a uint64) []transfer.Run {
			return []transfer.Run{good(a)}
		}, transfer.ErrOutOfBounds},
		{"empty region", transfer.Desc{Addr: R.Addr, Kind: transfer.Host}, func(a uint64) []transfer.Run { return nil }, transfer.ErrOutOfBounds},
		{"device region", transfer.Desc{Addr: R.Addr, Len: size, Kind: transfer.CUDA}, func(a uint64) []transfer.Run { return []transfer.Run{good(a)} }, transfer.ErrUnsupported},
	}

	for _, dir := range []hostcopy.Direction{hostcopy.Gather, hostcopy.Scatter} {
		e := newEngine(t, dir, hostcopy.Settings{Registry: reg, Contexts: 2})
		side := S.Addr
		if dir == hostcopy.Scatter {
			side = D.Addr
			fill(region, 5)
		}
		for _, tc := range cases {
			t.Run(dir.String()+"/"+tc.name, func(t *testing.T) {
				wantRegion := bytes.Clone(region)
				wantDst := bytes.Clone(dst)
				wantUnreg := bytes.Clone(unreg)
				runs := tc.runs(side)
				if dir == hostcopy.Scatter {
					for i := range runs {
						if runs[i].Addr == S.Addr {
							runs[i].Addr = D.Addr
						}
					}
				}
				op, err := e.Submit(tc.region, runs)
				if !errors.Is(err, tc.want) || op != nil {
					t.Fatalf("Submit = %v, %v; want error wrapping %v", op, err, tc.want)
				}
				if !bytes.Equal(region, wantRegion) || !bytes.Equal(dst, wantDst) || !bytes.Equal(unreg, wantUnreg) {
					t.Fatal("a rejected submit wrote bytes")
				}
				if n := e.Idle(); n != 2 {
					t.Fatalf("rejected submit kept a context: idle = %d, want 2", n)
				}
			})
		}
	}
}

func TestBusyWhenContextsExhausted(t *testing.T) {
	reg := &mem.Registry{}
	src, region := buffer(t, reg, 4096), buffer(t, reg, 4096)
	ch := make(chan struct{}, 1)
	e := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Contexts: 2, Workers: 1, Notify: hostcopy.Signal(ch)})
	runs := []transfer.Run{{Addr: src.Desc().Addr, Len: 128, Count: 1}}

	op1, err := e.Submit(region.Desc(), runs)
	if err != nil {
		t.Fatal(err)
	}
	op2, err := e.Submit(region.Desc(), runs)
	if err != nil {
		t.Fatal(err)
	}
	// Done operations still hold their contexts until released.
	wait(t, op1, ch)
	wait(t, op2, ch)
	if _, err := e.Submit(region.Desc(), runs); !errors.Is(err, transfer.ErrBusy) {
		t.Fatalf("third submit: err = %v, want ErrBusy", err)
	}
	if err := op1.Release(); err != nil {
		t.Fatal(err)
	}
	if err := op1.Release(); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("second release: err = %v, want ErrClosed", err)
	}
	if e.Idle() != 1 {
		t.Fatalf("idle = %d after one release, want 1", e.Idle())
	}
	op3, err := e.Submit(region.Desc(), runs)
	if err != nil {
		t.Fatalf("submit after release: %v", err)
	}
	mustDone(t, op3, ch)
	mustDone(t, op2, ch)
	if e.Idle() != 2 {
		t.Fatalf("idle = %d, want 2", e.Idle())
	}
}

func TestReleasePendingIsInUse(t *testing.T) {
	reg := &mem.Registry{}
	src, region := buffer(t, reg, 4096), buffer(t, reg, 4096)
	fill(src.Bytes(), 9)
	ch := make(chan struct{}, 1)
	e := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Workers: 1, Notify: hostcopy.Signal(ch)})
	entered, proceed := make(chan struct{}), make(chan struct{})
	hostcopy.SetBeforeCopy(e, func() { entered <- struct{}{}; <-proceed })

	op, err := e.Submit(region.Desc(), []transfer.Run{{Addr: src.Desc().Addr, Len: 4096, Count: 1}})
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	if s, err := op.Poll(); s != transfer.Pending || err != nil {
		t.Fatalf("poll while stalled = %v, %v; want pending", s, err)
	}
	if err := op.Release(); !errors.Is(err, transfer.ErrInUse) {
		t.Fatalf("release pending: err = %v, want ErrInUse", err)
	}
	if !bytes.Equal(region.Bytes(), make([]byte, 4096)) {
		t.Fatal("bytes moved before the copy started")
	}
	close(proceed)
	mustDone(t, op, ch)
	if !bytes.Equal(region.Bytes(), src.Bytes()) {
		t.Fatal("copy wrong after release attempt")
	}
}

func TestCloseFailsQueuedAndWaitsForRunning(t *testing.T) {
	reg := &mem.Registry{}
	src, region := buffer(t, reg, 4096), buffer(t, reg, 4096)
	fill(src.Bytes(), 11)
	ch := make(chan struct{}, 8)
	var notified atomic.Int32
	e, err := hostcopy.New(hostcopy.Gather, hostcopy.Settings{
		Registry: reg, Contexts: 4, Workers: 1,
		Notify: func() { notified.Add(1); ch <- struct{}{} },
	})
	if err != nil {
		t.Fatal(err)
	}
	entered, proceed := make(chan struct{}), make(chan struct{})
	hostcopy.SetBeforeCopy(e, func() { entered <- struct{}{}; <-proceed })

	runs := []transfer.Run{{Addr: src.Desc().Addr, Len: 4096, Count: 1}}
	running, err := e.Submit(region.Desc(), runs)
	if err != nil {
		t.Fatal(err)
	}
	<-entered // the only worker is now inside the first copy
	var queued []transfer.Op
	for range 3 {
		op, err := e.Submit(region.Desc(), runs)
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, op)
	}

	closed := make(chan error)
	go func() { closed <- e.Close() }()
	for range queued {
		<-ch // Close fails the queued operations before waiting for workers
	}
	for i, op := range queued {
		s, err := op.Poll()
		if s != transfer.Failed || !errors.Is(err, transfer.ErrClosed) {
			t.Fatalf("queued op %d = %v, %v; want failed with ErrClosed", i, s, err)
		}
		if err := op.Release(); err != nil {
			t.Fatalf("release failed op: %v", err)
		}
	}
	if s, _ := running.Poll(); s != transfer.Pending {
		t.Fatalf("running op = %v before its copy finished", s)
	}
	close(proceed)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	// Close returned, so the running copy finished first.
	if s, err := running.Poll(); s != transfer.Done || err != nil {
		t.Fatalf("running op after Close = %v, %v; want done", s, err)
	}
	if !bytes.Equal(region.Bytes(), src.Bytes()) {
		t.Fatal("running copy incomplete")
	}
	if err := running.Release(); err != nil {
		t.Fatal(err)
	}
	if n := notified.Load(); n != 4 {
		t.Fatalf("notify called %d times, want 4 (once per op)", n)
	}
	if _, err := e.Submit(region.Desc(), runs); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("submit after close: err = %v, want ErrClosed", err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	reg := &mem.Registry{}
	bad := []struct {
		dir hostcopy.Direction
		cfg hostcopy.Settings
	}{
		{hostcopy.Gather, hostcopy.Settings{}},
		{7, hostcopy.Settings{Registry: reg}},
		{hostcopy.Gather, hostcopy.Settings{Registry: reg, Contexts: -1}},
		{hostcopy.Gather, hostcopy.Settings{Registry: reg, Contexts: hostcopy.MaxContexts + 1}},
		{hostcopy.Scatter, hostcopy.Settings{Registry: reg, Workers: -2}},
		{hostcopy.Scatter, hostcopy.Settings{Registry: reg, Workers: hostcopy.MaxWorkers + 1}},
	}
	for i, b := range bad {
		if e, err := hostcopy.New(b.dir, b.cfg); err == nil {
			_ = e.Close()
			t.Errorf("config %d accepted", i)
		}
	}
	e := newEngine(t, hostcopy.Scatter, hostcopy.Settings{Registry: reg})
	if e.Idle() != hostcopy.DefaultContexts {
		t.Fatalf("default contexts = %d, want %d", e.Idle(), hostcopy.DefaultContexts)
	}
}

// TestLargeOperationSharedAmongWorkers: one operation of 4 x 2 x
// MinShareBytes, strided, is copied by 4 workers at once (all four stall in
// the copy hook together), byte for byte as the model says, and notifies once.
func TestLargeOperationSharedAmongWorkers(t *testing.T) {
	const workers = 4
	n := uint64(workers * 2 * hostcopy.MinShareBytes)
	reg := &mem.Registry{}
	src, region := buffer(t, reg, 2*n), buffer(t, reg, n)
	fill(src.Bytes(), 21)
	ch := make(chan struct{}, 8)
	var notified atomic.Int32
	e := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg, Workers: workers, Notify: func() { notified.Add(1); ch <- struct{}{} }})
	entered, proceed := make(chan struct{}, workers), make(chan struct{})
	hostcopy.SetBeforeCopy(e, func() { entered <- struct{}{}; <-proceed })
	// Every other 4 KiB block of the source, packed into the region.
	runs := []transfer.Run{{Addr: src.Desc().Addr, Len: 4096, Count: n / 4096, RegionStride: 4096, AddrStride: 8192}}
	op, err := e.Submit(region.Desc(), runs)
	if err != nil {
		t.Fatal(err)
	}
	for range workers { // blocks unless all four shares run at once
		<-entered
	}
	if s, _ := op.Poll(); s != transfer.Pending {
		t.Fatalf("op %v while its shares are stalled", s)
	}
	close(proceed)
	mustDone(t, op, ch)
	want := make([]byte, n)
	applyModel(hostcopy.Gather, want, src.Bytes(), src.Desc().Addr, runs)
	if !bytes.Equal(region.Bytes(), want) {
		t.Fatal("region differs from the model")
	}
	if got := notified.Load(); got != 1 {
		t.Fatalf("notified %d times for one operation, want 1", got)
	}
}

// TestCloseFailsPartlyRunOperation: Close while one share of an operation
// runs and the others are queued fails the operation (ErrClosed) once the
// running share ends; it is released normally.
func TestCloseFailsPartlyRunOperation(t *testing.T) {
	n := uint64(4 * hostcopy.MinShareBytes)
	reg := &mem.Registry{}
	src, region := buffer(t, reg, n), buffer(t, reg, n)
	ch := make(chan struct{}, 8)
	e, err := hostcopy.New(hostcopy.Scatter, hostcopy.Settings{Registry: reg, Workers: 2, Notify: hostcopy.Signal(ch)})
	if err != nil {
		t.Fatal(err)
	}
	entered, proceed := make(chan struct{}, 2), make(chan struct{})
	var calls atomic.Int32
	hostcopy.SetBeforeCopy(e, func() {
		calls.Add(1)
		entered <- struct{}{}
		<-proceed
	})
	// Occupy one worker with a small op first, so the big op's two shares
	// meet one free worker: one share runs, one stays queued.
	small, err := e.Submit(region.Desc(), []transfer.Run{{Addr: src.Desc().Addr, Len: 64, Count: 1}})
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	big, err := e.Submit(region.Desc(), []transfer.Run{{Addr: src.Desc().Addr, Len: n, Count: 1}})
	if err != nil {
		t.Fatal(err)
	}
	<-entered // one share of big runs
	closed := make(chan struct{})
	go func() { _ = e.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while copies were running")
	case <-time.After(50 * time.Millisecond):
	}
	close(proceed)
	<-closed
	if s, err := small.Poll(); s != transfer.Done || err != nil {
		t.Fatalf("small op %v, %v; want done", s, err)
	}
	if s, err := big.Poll(); s != transfer.Failed || !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("big op %v, %v; want failed with ErrClosed", s, err)
	}
	if calls.Load() != 2 {
		t.Fatalf("%d copies ran, want 2 (the queued share must not run)", calls.Load())
	}
	for _, op := range []transfer.Op{small, big} {
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRejectsOverflowingRun: a run whose Len x Count overflows is refused
// before a byte moves (its spans alone look small with zero strides).
func TestRejectsOverflowingRun(t *testing.T) {
	reg := &mem.Registry{}
	src, region := buffer(t, reg, 4096), buffer(t, reg, 4096)
	e := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg})
	_, err := e.Submit(region.Desc(), []transfer.Run{{Addr: src.Desc().Addr, Len: 2, Count: 1 << 63}})
	if !errors.Is(err, transfer.ErrOutOfBounds) || !strings.Contains(err.Error(), "overflow") {
		t.Fatalf("err = %v, want ErrOutOfBounds naming the overflow", err)
	}
}

// TestDeregisterRefusedWhileCopying: memory a copy is moving bytes into
// cannot be deregistered (and so freed) until the copy ended; the region is
// pinned too.
func TestDeregisterRefusedWhileCopying(t *testing.T) {
	reg := &mem.Registry{}
	dst, region := buffer(t, reg, 4096), buffer(t, reg, 4096)
	ch := make(chan struct{}, 1)
	e := newEngine(t, hostcopy.Scatter, hostcopy.Settings{Registry: reg, Workers: 1, Notify: hostcopy.Signal(ch)})
	entered, proceed := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(proceed) })
	t.Cleanup(release) // runs before the engine's Close, even when a check fails
	hostcopy.SetBeforeCopy(e, func() { entered <- struct{}{}; <-proceed })
	op, err := e.Submit(region.Desc(), []transfer.Run{{Addr: dst.Desc().Addr, Len: 4096, Count: 1}})
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	for _, d := range []transfer.Desc{dst.Desc(), region.Desc()} {
		if err := reg.Remove(d); !errors.Is(err, transfer.ErrInUse) {
			t.Fatalf("remove %v during the copy: %v, want ErrInUse", d, err)
		}
	}
	release()
	mustDone(t, op, ch)
	for _, d := range []transfer.Desc{dst.Desc(), region.Desc()} {
		if err := reg.Remove(d); err != nil {
			t.Fatalf("remove %v after the copy: %v", d, err)
		}
	}
	// Unregistered now: a new copy is refused before a byte moves.
	if _, err := e.Submit(region.Desc(), []transfer.Run{{Addr: dst.Desc().Addr, Len: 4096, Count: 1}}); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("submit after deregister: %v, want ErrNotRegistered", err)
	}
}

// TestDoneClosedWhenTerminal: an op's Done channel is closed once it is
// terminal, never before, so a worker can block on it instead of polling.
func TestDoneClosedWhenTerminal(t *testing.T) {
	const size = 4 << 20
	reg := &mem.Registry{}
	src, region := buffer(t, reg, size), buffer(t, reg, size)
	g := newEngine(t, hostcopy.Gather, hostcopy.Settings{Registry: reg})
	fill(src.Bytes(), 3)
	for range 20 {
		op, err := g.Submit(region.Desc(), []transfer.Run{{Addr: src.Desc().Addr, Len: size, Count: 1}})
		if err != nil {
			t.Fatal(err)
		}
		d := op.(interface{ Done() <-chan struct{} }).Done()
		select {
		case <-d:
		case <-time.After(10 * time.Second):
			t.Fatal("Done not closed within 10s")
		}
		if st, err := op.Poll(); st != transfer.Done || err != nil {
			t.Fatalf("after Done: %v, %v", st, err)
		}
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(region.Bytes(), src.Bytes()) {
		t.Fatal("region differs from source")
	}
}
