package gpucopy_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/mem/memtest"
	"github.com/bouncekv/bounce/stages/gpucopy"
	"github.com/bouncekv/bounce/transfer"
)

func TestNewNeedsAContextAndRegistry(t *testing.T) {
	if _, err := gpucopy.New(gpucopy.Gather, gpucopy.Settings{Registry: &mem.Registry{}}); err == nil || !strings.Contains(err.Error(), "Context is required") {
		t.Fatalf("New without Context = %v", err)
	}
}

// wait polls op until terminal (the reactor's way: Poll never blocks).
func wait(t *testing.T, op transfer.Op) (transfer.Status, error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := op.Poll()
		if s.Terminal() {
			return s, err
		}
		if time.Now().After(deadline) {
			t.Fatal("op never became terminal")
		}
		time.Sleep(20 * time.Microsecond)
	}
}

type fixture struct {
	reg *mem.Registry
	g   *gpucopy.Engine
	s   *gpucopy.Engine
}

func newFixture(t *testing.T, contexts int, zero bool) (*fixture, *cudaCtx) {
	return newFixtureWith(t, gpucopy.Settings{Contexts: contexts, ZeroCopyTable: zero})
}

// newFixtureWith is newFixture with settings (Context, Registry and PTX
// filled in).
func newFixtureWith(t testing.TB, set gpucopy.Settings) (*fixture, *cudaCtx) {
	c := cudatest.Context(t)
	reg := &mem.Registry{}
	set.Context, set.Registry, set.PTX = c, reg, cudatest.PTX(t)
	g, err := gpucopy.New(gpucopy.Gather, set)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gpucopy.New(gpucopy.Scatter, set)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("close gather: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("close scatter: %v", err)
		}
		if n := reg.Pinned(); n != 0 {
			t.Errorf("%d ranges still pinned after close", n)
		}
	})
	return &fixture{reg: reg, g: g, s: s}, &cudaCtx{c}
}

// TestGatherScatterByteExact runs random plans (fragmented and contiguous,
// unaligned, sizes from 1 byte, strided) through both stages on device
// memory and on a pinned host region, checking every byte of both sides,
// with compact piece tables where the runs allow (the default for runs of
// 4 KiB and more) and with full ones only.
func TestGatherScatterByteExact(t *testing.T) {
	for k, zero := range []bool{true, false, true, false} {
		set := gpucopy.Settings{Contexts: 4, ZeroCopyTable: zero}
		if k >= 2 {
			set = gpucopy.WithFullTables(set)
		}
		f, cc := newFixtureWith(t, set)
		c := cc.c
		cases := []cudatest.PlanOptions{
			{Runs: 1, MaxLen: 1},
			{Runs: 1000, MaxLen: 7},
			{Runs: 2000, MaxLen: 4096, Aligned: true},
			{Runs: 2000, MaxLen: 4096, Aligned: true, Shuffled: true},
			{Runs: 500, MaxLen: 20000, Shuffled: true},
			{Runs: 300, MaxLen: 3000, Strided: true, Shuffled: true},
			{Runs: 64, MaxLen: 1 << 20, Aligned: true},
			// Index 7: an aligned pool base (i%7 == 0), so the wide kernels'
			// one-round path runs; more pieces than a context's first table
			// holds, so the table grows in the middle of the pass.
			{Runs: 6000, MaxLen: 4096, Aligned: true, Shuffled: true},
		}
		for i, o := range cases {
			for _, pinnedRegion := range []bool{false, true} {
				p := cudatest.RandomPlan(uint64(100+i), o)
				var region transfer.Desc
				if pinnedRegion {
					region, _ = cudatest.Pinned(t, c, p.RegionSize+32)
				} else {
					region = cudatest.Device(t, c, p.RegionSize+32)
				}
				pool := cudatest.Device(t, c, p.PoolSize+32)
				for _, d := range []transfer.Desc{region, pool} {
					if err := f.reg.Add(d); err != nil {
						t.Fatal(err)
					}
				}
				sub := transfer.Desc{Addr: region.Addr + 16, Len: p.RegionSize, Kind: region.Kind, Device: region.Device}
				pbase := pool.Addr + uint64(i%7)
				regionB := cudatest.Fill(t, c, region, uint64(i))
				poolB := cudatest.Fill(t, c, pool, uint64(i)+50)
				op, err := f.g.Submit(sub, p.At(pbase))
				if err != nil {
					t.Fatal(err)
				}
				if s, err := wait(t, op); s != transfer.Done {
					t.Fatalf("case %d: gather %v: %v", i, s, err)
				}
				if err := op.Release(); err != nil {
					t.Fatal(err)
				}
				p.Apply(true, regionB[16:], poolB[pbase-pool.Addr:])
				if d := cudatest.Diff(cudatest.Read(t, c, region), regionB); d != "" {
					t.Fatalf("case %d (zero-copy %v, pinned region %v): gather: %s", i, zero, pinnedRegion, d)
				}
				// Scatter fresh region bytes back out.
				regionB = cudatest.Fill(t, c, region, uint64(i)+900)
				op, err = f.s.Submit(sub, p.At(pbase))
				if err != nil {
					t.Fatal(err)
				}
				if s, err := wait(t, op); s != transfer.Done {
					t.Fatalf("case %d: scatter %v: %v", i, s, err)
				}
				if err := op.Release(); err != nil {
					t.Fatal(err)
				}
				p.Apply(false, regionB[16:], poolB[pbase-pool.Addr:])
				if d := cudatest.Diff(cudatest.Read(t, c, pool), poolB); d != "" {
					t.Fatalf("case %d (zero-copy %v, pinned region %v): scatter: %s", i, zero, pinnedRegion, d)
				}
				if n := f.reg.Pinned(); n != 0 {
					t.Fatalf("%d pins left after release", n)
				}
				for _, d := range []transfer.Desc{region, pool} {
					if err := f.reg.Remove(d); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
}

func TestRefusesWhatTheDeviceCannotReach(t *testing.T) {
	f, cc := newFixture(t, 2, true)
	c := cc.c
	region := cudatest.Device(t, c, 1<<20)
	if err := f.reg.Add(region); err != nil {
		t.Fatal(err)
	}
	pageable := memtest.Buffer(t, f.reg, 1<<16) // ordinary host memory, registered
	_, err := f.g.Submit(region, []transfer.Run{{RegionOff: 0, Addr: pageable.Desc().Addr, Len: 100, Count: 1}})
	if !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "not pinned") {
		t.Fatalf("gather from pageable host memory = %v, want ErrUnsupported naming pinning", err)
	}
	// Reachable says so before any submit (route auto asks it), and
	// answers device memory of the stage's device with its range.
	part := pageable.Desc()
	part.Addr, part.Len = part.Addr+10, 100
	if _, err := f.g.Reachable(part); !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "not pinned") {
		t.Fatalf("Reachable(pageable host memory) = %v, want ErrUnsupported naming pinning", err)
	}
	if r, err := f.g.Reachable(transfer.Desc{Addr: region.Addr + 64, Len: 4096, Kind: transfer.CUDA}); err != nil || r != region {
		t.Fatalf("Reachable(device memory) = %v, %v; want the region %v and nil", r, err, region)
	}
	// Out of the region, unregistered source, overflow: nothing launched.
	dev := cudatest.Device(t, c, 4096)
	if _, err := f.g.Submit(region, []transfer.Run{{RegionOff: 0, Addr: dev.Addr, Len: 10, Count: 1}}); !errors.Is(err, transfer.ErrNotRegistered) {
		t.Fatalf("unregistered source = %v", err)
	}
	if err := f.reg.Add(dev); err != nil {
		t.Fatal(err)
	}
	if _, err := f.g.Submit(region, []transfer.Run{{RegionOff: region.Len - 5, Addr: dev.Addr, Len: 10, Count: 1}}); !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("run past the region = %v", err)
	}
	if _, err := f.g.Submit(region, []transfer.Run{{RegionOff: 0, Addr: dev.Addr + 4090, Len: 10, Count: 1}}); !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("run past the source = %v", err)
	}
	if _, err := f.g.Submit(region, []transfer.Run{{Addr: dev.Addr, Len: 1 << 40, Count: 1 << 40}}); !errors.Is(err, transfer.ErrOutOfBounds) {
		t.Fatalf("overflowing run = %v", err)
	}
	if n := f.reg.Pinned(); n != 0 {
		t.Fatalf("refused submits left %d pins", n)
	}
}

func TestBusyWhenThePoolIsExhausted(t *testing.T) {
	f, cc := newFixture(t, 2, true)
	c := cc.c
	region := cudatest.Device(t, c, 64<<20)
	src := cudatest.Device(t, c, 64<<20)
	for _, d := range []transfer.Desc{region, src} {
		if err := f.reg.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	runs := []transfer.Run{{Addr: src.Addr, Len: 64 << 20, Count: 1}}
	a, err := f.g.Submit(region, runs)
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.g.Submit(region, runs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.g.Submit(region, runs); !errors.Is(err, transfer.ErrBusy) {
		t.Fatalf("third submit on a pool of 2 = %v, want ErrBusy", err)
	}
	if err := f.reg.Remove(src); !errors.Is(err, transfer.ErrInUse) {
		// Either still pinned (copy running) or the copy already ended;
		// only the pinned case may refuse.
		if s, _ := a.Poll(); !s.Terminal() {
			t.Fatalf("deregister during a copy = %v, want ErrInUse", err)
		}
	}
	for _, op := range []transfer.Op{a, b} {
		if s, err := wait(t, op); s != transfer.Done {
			t.Fatalf("copy %v: %v", s, err)
		}
		if err := op.Release(); err != nil {
			t.Fatal(err)
		}
		if err := op.Release(); !errors.Is(err, transfer.ErrClosed) {
			t.Fatalf("second release = %v", err)
		}
	}
	if f.g.Idle() != 2 {
		t.Fatalf("idle = %d after release, want 2", f.g.Idle())
	}
}

func TestSubmitAfterClose(t *testing.T) {
	f, cc := newFixture(t, 1, false)
	region := cudatest.Device(t, cc.c, 4096)
	if err := f.reg.Add(region); err != nil {
		t.Fatal(err)
	}
	if err := f.g.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.g.Submit(region, nil); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("submit after close = %v", err)
	}
}

// TestParallelBuildReportsTheFirstBadRun: a request large enough for
// several build workers with bad runs in two workers' shares is refused
// with the first bad run's error, as on one goroutine, nothing moves
// and nothing stays pinned.
func TestParallelBuildReportsTheFirstBadRun(t *testing.T) {
	for _, workers := range []int{1, 4} {
		f, cc := newFixtureWith(t, gpucopy.Settings{Contexts: 2, BuildWorkers: workers})
		c := cc.c
		const n = 5000
		region := cudatest.Device(t, c, n*64)
		pool := cudatest.Device(t, c, n*64)
		for _, d := range []transfer.Desc{region, pool} {
			if err := f.reg.Add(d); err != nil {
				t.Fatal(err)
			}
		}
		runs := make([]transfer.Run, n)
		for i := range runs {
			runs[i] = transfer.Run{RegionOff: uint64(i) * 64, Addr: pool.Addr + uint64(n-1-i)*64, Len: 64, Count: 1}
		}
		runs[3210].Addr = 64              // memory never registered
		runs[4500].RegionOff = region.Len // past the region
		regionB := cudatest.Fill(t, c, region, 1)
		_, err := f.g.Submit(region, runs)
		if !errors.Is(err, transfer.ErrNotRegistered) || !strings.Contains(err.Error(), "run 3210") {
			t.Fatalf("workers %d: %v, want run 3210 not registered", workers, err)
		}
		if err := c.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if d := cudatest.Diff(cudatest.Read(t, c, region), regionB); d != "" {
			t.Errorf("workers %d: region changed: %s", workers, d)
		}
		if n := f.reg.Pinned(); n != 0 {
			t.Errorf("workers %d: %d ranges pinned", workers, n)
		}
		// The good request after the bad one is byte-exact.
		runs[3210].Addr, runs[4500].RegionOff = pool.Addr+uint64(n-1-3210)*64, 4500*64
		poolB := cudatest.Fill(t, c, pool, 2)
		op, err := f.g.Submit(region, runs)
		if err != nil {
			t.Fatal(err)
		}
		cudatest.Finish(t, op)
		for _, r := range runs {
			copy(regionB[r.RegionOff:r.RegionOff+64], poolB[r.Addr-pool.Addr:][:64])
		}
		if d := cudatest.Diff(cudatest.Read(t, c, region), regionB); d != "" {
			t.Errorf("workers %d: gather: %s", workers, d)
		}
	}
}
