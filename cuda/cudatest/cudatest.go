// Package cudatest gives tests a CUDA context and device buffers, and
// skips them with a clear message where the driver (libcuda.so.1) or a
// device is absent, so CI without a GPU runs everything else.
package cudatest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// PTXEnv names a file whose PTX tests load instead of the embedded
// module (to try a freshly compiled kernel before it is committed).
const PTXEnv = "BOUNCE_TEST_PTX"

// Context returns device 0's primary context, released at the end of the
// test, or skips the test when CUDA is unavailable.
func Context(tb testing.TB) *cuda.Context {
	tb.Helper()
	drv, err := cuda.Open("")
	if err != nil {
		tb.Skipf("skipping: %v (these tests need a GPU and libcuda.so.1)", err)
	}
	c, err := drv.Primary(0)
	if err != nil {
		tb.Skipf("skipping: %v", err)
	}
	tb.Cleanup(func() {
		if err := c.Release(); err != nil {
			tb.Errorf("release context: %v", err)
		}
	})
	return c
}

// PTX returns the module tests should load: the file PTXEnv names, or nil
// (the embedded one).
func PTX(tb testing.TB) []byte {
	tb.Helper()
	p := os.Getenv(PTXEnv)
	if p == "" {
		return nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		tb.Fatalf("%s: %v", PTXEnv, err)
	}
	return b
}

// Device allocates n bytes of device memory freed at the end of the test.
func Device(tb testing.TB, c *cuda.Context, n uint64) transfer.Desc {
	tb.Helper()
	p, err := c.MemAlloc(n)
	if err != nil {
		tb.Fatalf("device buffer of %d bytes: %v", n, err)
	}
	tb.Cleanup(func() {
		if err := c.MemFree(p); err != nil {
			tb.Errorf("free device buffer: %v", err)
		}
	})
	return transfer.Desc{Addr: uint64(p), Len: n, Kind: transfer.CUDA, Device: int32(c.Device())}
}

// Pinned allocates n bytes of pinned, device-mapped host memory freed at
// the end of the test.
func Pinned(tb testing.TB, c *cuda.Context, n uint64) (transfer.Desc, []byte) {
	tb.Helper()
	a, err := c.NewPinnedArena(n)
	if err != nil {
		tb.Fatalf("pinned buffer of %d bytes: %v", n, err)
	}
	tb.Cleanup(func() {
		if err := a.Close(); err != nil {
			tb.Errorf("free pinned buffer: %v", err)
		}
	})
	return a.Desc(), a.Bytes()
}

// Fill writes seeded random bytes to d (device memory, or host memory the
// process can read) and returns them.
func Fill(tb testing.TB, c *cuda.Context, d transfer.Desc, seed uint64) []byte {
	tb.Helper()
	b := make([]byte, d.Len)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	if d.Kind == transfer.Host {
		copy(mem.Unsafe(d.Addr, d.Len), b)
		return b
	}
	if err := c.CopyHtoD(cuda.DevicePtr(d.Addr), b); err != nil {
		tb.Fatalf("fill %v: %v", d, err)
	}
	return b
}

// Read returns the bytes of d.
func Read(tb testing.TB, c *cuda.Context, d transfer.Desc) []byte {
	tb.Helper()
	b := make([]byte, d.Len)
	if d.Kind == transfer.Host {
		copy(b, mem.Unsafe(d.Addr, d.Len))
		return b
	}
	if err := c.CopyDtoH(b, cuda.DevicePtr(d.Addr)); err != nil {
		tb.Fatalf("read %v: %v", d, err)
	}
	return b
}

// Diff describes the first difference of got from want, or "".
func Diff(got, want []byte) string {
	if bytes.Equal(got, want) {
		return ""
	}
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	n := 0
	first := -1
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	return fmt.Sprintf("%d bytes differ, first at offset %d (got %#02x, want %#02x)", n, first, got[first], want[first])
}

// Plan is a random set of runs between a region and a pool of memory,
// non-overlapping on both sides, as offsets (add the pool base with At).
type Plan struct {
	Runs       []transfer.Run // RegionOff relative to the region, Addr relative to the pool
	RegionSize uint64
	PoolSize   uint64
}

// PlanOptions shape RandomPlan.
type PlanOptions struct {
	Runs     int    // number of runs
	MaxLen   uint64 // largest copy length (>= 1)
	Aligned  bool   // lengths, offsets and strides multiples of 16
	Strided  bool   // some runs have Count > 1 with gaps
	Shuffled bool   // pool placement in random order (fragmented)
}

// RandomPlan draws a plan from seed.
func RandomPlan(seed uint64, o PlanOptions) Plan {
	r := rand.New(rand.NewPCG(seed, 77))
	align := func(v uint64) uint64 {
		if o.Aligned {
			return (v + 15) &^ 15
		}
		return v
	}
	type span struct {
		run  transfer.Run
		size uint64 // pool bytes the run spans
	}
	spans := make([]span, o.Runs)
	var regionOff uint64
	for i := range spans {
		l := 1 + r.Uint64N(o.MaxLen)
		if o.Aligned {
			l = align(l)
		}
		run := transfer.Run{Len: l, Count: 1, RegionStride: l, AddrStride: l}
		if o.Strided && r.IntN(3) == 0 {
			run.Count = 2 + r.Uint64N(40)
			run.RegionStride = align(l + r.Uint64N(3)*r.Uint64N(64))
			run.AddrStride = align(l + r.Uint64N(2)*r.Uint64N(4096))
		}
		if !o.Aligned {
			regionOff += r.Uint64N(3)
		}
		run.RegionOff = align(regionOff)
		_, end, _ := run.RegionSpan()
		regionOff = end
		_, aend, _ := transfer.Run{Addr: 0, Len: l, Count: run.Count, AddrStride: run.AddrStride}.AddrSpan()
		spans[i] = span{run: run, size: aend}
	}
	order := make([]int, len(spans))
	for i := range order {
		order[i] = i
	}
	if o.Shuffled {
		r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	var pool uint64
	for _, i := range order {
		if !o.Aligned {
			pool += r.Uint64N(5)
		}
		if o.Shuffled {
			pool += align(r.Uint64N(256))
		}
		pool = align(pool)
		spans[i].run.Addr = pool
		pool += spans[i].size
	}
	p := Plan{RegionSize: max(align(regionOff), 1), PoolSize: max(pool, 1)}
	for _, s := range spans {
		p.Runs = append(p.Runs, s.run)
	}
	return p
}

// At returns the plan's runs with the pool's base address added.
func (p Plan) At(poolBase uint64) []transfer.Run {
	out := make([]transfer.Run, len(p.Runs))
	for i, r := range p.Runs {
		r.Addr += poolBase
		out[i] = r
	}
	return out
}

// Apply does the plan's copies on host byte slices: gather copies pool
// into region, scatter region into pool.
func (p Plan) Apply(gather bool, region, pool []byte) {
	for _, r := range p.Runs {
		for k := range r.Count {
			ro, ao := r.RegionOff+k*r.RegionStride, r.Addr+k*r.AddrStride
			if gather {
				copy(region[ro:ro+r.Len], pool[ao:ao+r.Len])
			} else {
				copy(pool[ao:ao+r.Len], region[ro:ro+r.Len])
			}
		}
	}
}

// Bytes returns the payload bytes the plan moves.
func (p Plan) Bytes() uint64 {
	var n uint64
	for _, r := range p.Runs {
		n += r.Bytes()
	}
	return n
}

// WithoutKernels returns ptx (an nvcc module: each entry after a
// "// .globl" line, self-contained) without the entries whose names
// contain any of subs: a module lacking optional kernels.
func WithoutKernels(ptx []byte, subs ...string) []byte {
	const mark = "\t// .globl\t"
	parts := bytes.Split(ptx, []byte(mark))
	out := append([]byte(nil), parts[0]...)
	for _, p := range parts[1:] {
		name, _, _ := bytes.Cut(p, []byte("\n"))
		drop := false
		for _, s := range subs {
			drop = drop || bytes.Contains(name, []byte(s))
		}
		if !drop {
			out = append(append(out, mark...), p...)
		}
	}
	return out
}

// Finish polls op until it is terminal (Poll never blocks; the bound is
// generous for a loaded machine), fails unless it ended Done, and
// releases it.
func Finish(tb testing.TB, op transfer.Op) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := op.Poll()
		if st.Terminal() {
			if st != transfer.Done {
				tb.Fatalf("op ended %v: %v", st, err)
			}
			break
		}
		if time.Now().After(deadline) {
			tb.Fatal("op never became terminal")
		}
		time.Sleep(20 * time.Microsecond)
	}
	if err := op.Release(); err != nil {
		tb.Fatal(err)
	}
}
