package node

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
)

// noGPU returns the built-in table with every CUDA part pointed at a
// driver that does not exist, so the tests below take the no-GPU path on
// any machine.
func noGPU() Factories {
	f := Builtin()
	lib := &cuda.Lib{Path: "libcuda-missing.so.1"}
	f.CUDA = lib
	f.Gatherers["cuda"] = CUDAGatherFactory{Lib: lib}
	f.Scatterers["cuda"] = CUDAScatterFactory{Lib: lib}
	f.Engines["tcp"] = TCPFactory{Lib: lib}
	return f
}

// TestTCPDeviceStaging: engine.options device_staging. Without a driver,
// auto builds a tcp engine that stages nothing (the cuda stages fall back
// to host), on fails naming the option and why, and a bad value names the
// key and what is accepted. On a GPU, auto with the cuda stages stages
// CUDA memory and off does not.
func TestTCPDeviceStaging(t *testing.T) {
	cfg := cudaStagesConfig("a")
	cfg.Engine.Kind, cfg.ControlPlane.Kind = "tcp", "zmq"
	cfg.ControlPlane.BindAddress = "127.0.0.1"
	n, err := Build(cfg, noGPU(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if transfer.Stages(n.Engine, transfer.CUDA) {
		t.Fatal("tcp stages cuda memory without a driver")
	}
	n.Close(context.Background())
	cfg.Engine.Options = map[string]string{"device_staging": "on"}
	if _, err := Build(cfg, noGPU(), nil); err == nil || !strings.Contains(err.Error(), "device_staging=on") || !errors.Is(err, cuda.ErrUnavailable) {
		t.Fatalf("device_staging=on without a driver: err = %v", err)
	}
	cfg.Engine.Options = map[string]string{"device_staging": "maybe"}
	if _, err := Build(cfg, noGPU(), nil); err == nil || !strings.Contains(err.Error(), "engine.options.device_staging") || !strings.Contains(err.Error(), "auto, on or off") {
		t.Fatalf("device_staging=maybe: err = %v", err)
	}
	if _, err := cuda.Open(""); err != nil {
		t.Skipf("skipping the GPU half: %v", err)
	}
	for opt, want := range map[string]bool{"auto": true, "off": false} {
		cfg.Engine.Options = map[string]string{"device_staging": opt}
		n, err := Build(cfg, Builtin(), nil)
		if err != nil {
			t.Fatal(err)
		}
		got := transfer.Stages(n.Engine, transfer.CUDA)
		n.Close(context.Background())
		if got != want {
			t.Fatalf("device_staging=%s with cuda stages on a GPU: stages cuda %v, want %v", opt, got, want)
		}
	}
}

// TestWithPluginsKeepsTheCUDADriver: the CLI's table (Builtin plus the
// plugin kinds) still has the driver device and pinned-host arenas use.
func TestWithPluginsKeepsTheCUDADriver(t *testing.T) {
	f := Builtin()
	if got := WithPlugins(f, "").CUDA; got == nil || got != f.CUDA {
		t.Fatalf("WithPlugins dropped Factories.CUDA (%v, want %v)", got, f.CUDA)
	}
}

func cudaStagesConfig(name string) config.Config {
	c := testConfig(name, "loopback", "inproc")
	c.Stages.Gather.Kind, c.Stages.Scatter.Kind = "cuda", "cuda"
	return c
}

// TestCUDAStagesFallBackToHost: without a driver, cuda stages become the
// host stages with one log line each, and the node still bounces.
func TestCUDAStagesFallBackToHost(t *testing.T) {
	f := noGPU()
	var logs bytes.Buffer
	cfg := cudaStagesConfig("a")
	n, err := Build(cfg, f, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(context.Background()) })
	if transfer.Handles(n.Gatherer, transfer.CUDA) || transfer.Handles(n.Scatterer, transfer.CUDA) {
		t.Fatal("stages handle CUDA memory without a driver")
	}
	if got := strings.Count(logs.String(), "unavailable; using the host"); got != 2 {
		t.Fatalf("%d fallback log lines, want 2 (one per stage):\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "cuda unavailable") {
		t.Fatalf("fallback log does not give the reason:\n%s", logs.String())
	}
	if n.ArenaMemory != "host" {
		t.Fatalf("arena memory %q, want host", n.ArenaMemory)
	}
	b := build(t, testConfig("b", "loopback", "inproc"), f)
	moveAndVerify(t, n, b, pipeline.RouteBounce)
}

// TestCUDAStagesRefuse: stages.fallback=refuse turns a missing driver into
// a bounce path that is off, with the reason.
func TestCUDAStagesRefuse(t *testing.T) {
	cfg := cudaStagesConfig("a")
	cfg.Stages.Fallback = "refuse"
	var logs bytes.Buffer
	n, err := Build(cfg, noGPU(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	if on, _ := n.Agent.BounceEnabled(); on {
		t.Fatal("bounce on with refused cuda stages")
	}
	if !strings.Contains(logs.String(), "create cuda gather stage: cuda unavailable") {
		t.Fatalf("log does not say why:\n%s", logs.String())
	}
}

// TestDeviceArenaWithoutGPU: bounce.arena_memory=device without a driver
// disables the bounce path (the node serves the direct path).
func TestDeviceArenaWithoutGPU(t *testing.T) {
	cfg := testConfig("a", "loopback", "inproc")
	cfg.Bounce.ArenaMemory = "device"
	var logs bytes.Buffer
	n, err := Build(cfg, noGPU(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	if on, _ := n.Agent.BounceEnabled(); on {
		t.Fatal("bounce on with a device arena and no GPU")
	}
	if !strings.Contains(logs.String(), "bounce.arena_memory device") || !strings.Contains(logs.String(), "cuda unavailable") {
		t.Fatalf("log does not say why:\n%s", logs.String())
	}
}

// TestCUDAMemoryRefusedByHostEngine: a request naming CUDA memory is
// refused before anything moves when nothing on its route can touch it.
func TestCUDAMemoryRefusedByHostEngine(t *testing.T) {
	f := Builtin()
	a := build(t, testConfig("a", "loopback", "inproc"), f)
	b := build(t, testConfig("b", "loopback", "inproc"), f)
	connect(t, a, b)
	d := transfer.Desc{Addr: 1 << 40, Len: 4096, Kind: transfer.CUDA}
	for _, route := range []pipeline.Route{pipeline.RouteDirect, pipeline.RouteBounce} {
		_, err := a.Agent.Submit(pipeline.Request{Peer: "b", Src: []transfer.Desc{d}, Dst: []transfer.Desc{d}, Route: route})
		if !errors.Is(err, transfer.ErrUnsupported) || !strings.Contains(err.Error(), "cuda memory") {
			t.Fatalf("route %v: submit of CUDA memory to a host engine = %v", route, err)
		}
	}
}

func connect(t *testing.T, a, b *Node) {
	t.Helper()
	for _, pair := range [][2]*Node{{a, b}, {b, a}} {
		blob, err := pair[1].Agent.Descriptor()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pair[0].Agent.LoadPeer(blob); err != nil {
			t.Fatal(err)
		}
	}
}

// gpuFactories is Builtin with the cuda stages loading the PTX the test
// run names (cudatest.PTXEnv), if any.
func gpuFactories(tb testing.TB) Factories {
	f := Builtin()
	ptx := cudatest.PTX(tb)
	f.Gatherers["cuda"] = CUDAGatherFactory{Lib: f.CUDA, PTX: ptx}
	f.Scatterers["cuda"] = CUDAScatterFactory{Lib: f.CUDA, PTX: ptx}
	return f
}

func gpuConfig(name string) config.Config {
	c := testConfig(name, "cudacopy", "inproc")
	c.Stages.Gather.Kind, c.Stages.Scatter.Kind = "cuda", "cuda"
	c.Bounce.MinDescriptors = 1
	return c
}

// TestGPUStagesOnHostBuffers: cuda stages with device arenas serve host
// buffers too (cudacopy page-locks them on registration, the kernels reach
// them over PCIe) — what bounce run does with --stages.gather cuda.
func TestGPUStagesOnHostBuffers(t *testing.T) {
	cudatest.Context(t)
	f := gpuFactories(t)
	a, b := build(t, gpuConfig("a"), f), build(t, gpuConfig("b"), f)
	if a.ArenaMemory != "device" {
		t.Fatalf("arena memory %q, want device", a.ArenaMemory)
	}
	moveAndVerify(t, a, b, pipeline.RouteBounce)
}

// TestGPUPipelineByteExact moves random plans between device buffers of
// two agents in one process (gather kernel → cudacopy write → scatter
// kernel, device arenas): fragmented and contiguous, unaligned, sizes from
// one byte, a transfer ten times the arena; every batch retired quiescent
// and released, the arenas conserved.
func TestGPUPipelineByteExact(t *testing.T) {
	c := cudatest.Context(t)
	for _, zero := range []bool{true, false} {
		f := gpuFactories(t)
		ca, cb := gpuConfig("a"), gpuConfig("b")
		ca.Bounce.ZeroCopyArgs, cb.Bounce.ZeroCopyArgs = zero, zero
		a, b := build(t, ca, f), build(t, cb, f)
		if a.ArenaMemory != "device" {
			t.Fatalf("arena memory %q, want device (auto with cudacopy and cuda stages)", a.ArenaMemory)
		}
		connect(t, a, b)
		arena := uint64(ca.Bounce.ArenaSize)
		cases := []struct {
			name string
			o    cudatest.PlanOptions
		}{
			{"one-byte", cudatest.PlanOptions{Runs: 1, MaxLen: 1}},
			{"tiny-unaligned", cudatest.PlanOptions{Runs: 3000, MaxLen: 9, Shuffled: true}},
			{"4k-contiguous", cudatest.PlanOptions{Runs: 4096, MaxLen: 4096, Aligned: true}},
			{"4k-fragmented", cudatest.PlanOptions{Runs: 4096, MaxLen: 4096, Aligned: true, Shuffled: true}},
			{"mixed-unaligned", cudatest.PlanOptions{Runs: 3000, MaxLen: 20000, Shuffled: true}},
			{"10x-arena", cudatest.PlanOptions{Runs: int(10 * arena / (32 << 10)), MaxLen: 64 << 10, Aligned: true, Shuffled: true}},
		}
		for i, tc := range cases {
			p := cudatest.RandomPlan(uint64(1000+i), tc.o)
			if tc.name == "10x-arena" && p.Bytes() < 10*arena {
				// Lengths are drawn uniformly up to MaxLen: on average half of it.
				t.Logf("10x case moves %d bytes (%0.1fx the arena)", p.Bytes(), float64(p.Bytes())/float64(arena))
			}
			src := cudatest.Device(t, c, p.PoolSize+16)
			dst := cudatest.Device(t, c, p.RegionSize+16)
			if err := a.Agent.RegisterMemory(src); err != nil {
				t.Fatal(err)
			}
			if err := b.Agent.RegisterMemory(dst); err != nil {
				t.Fatal(err)
			}
			connect(t, a, b)
			srcB := cudatest.Fill(t, c, src, uint64(i))
			dstB := cudatest.Fill(t, c, dst, uint64(i)+7)
			// The plan's region is the destination buffer, its pool the source.
			sbase, dbase := src.Addr+uint64(i%3), dst.Addr+uint64(i%5)
			var sd, dd []transfer.Desc
			for _, r := range p.Runs {
				for k := range r.Count {
					sd = append(sd, transfer.Desc{Addr: sbase + r.Addr + k*r.AddrStride, Len: r.Len, Kind: transfer.CUDA})
					dd = append(dd, transfer.Desc{Addr: dbase + r.RegionOff + k*r.RegionStride, Len: r.Len, Kind: transfer.CUDA})
				}
			}
			bt, err := a.Agent.Submit(pipeline.Request{Peer: "b", Src: sd, Dst: dd, Route: pipeline.RouteBounce})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			err = bt.Wait(ctx)
			cancel()
			if err != nil {
				t.Fatalf("%s (zero-copy %v): %v", tc.name, zero, err)
			}
			if bt.Route() != pipeline.RouteBounce {
				t.Fatalf("%s: route %v (%s)", tc.name, bt.Route(), bt.RouteReason())
			}
			if retired, quiet := bt.Retirement(); !retired || !quiet {
				t.Fatalf("%s: retired %v quiescent %v", tc.name, retired, quiet)
			}
			if err := bt.Release(); err != nil {
				t.Fatal(err)
			}
			p.Apply(true, dstB[dbase-dst.Addr:], srcB[sbase-src.Addr:])
			if d := cudatest.Diff(cudatest.Read(t, c, dst), dstB); d != "" {
				t.Fatalf("%s (zero-copy %v, %d descriptors, %d bytes): %s", tc.name, zero, len(sd), p.Bytes(), d)
			}
			for _, n := range []*Node{a, b} {
				if err := n.Agent.CheckConservation(); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
			}
			if err := a.Agent.DeregisterMemory(src); err != nil {
				t.Fatalf("deregister source: %v", err)
			}
			if err := b.Agent.DeregisterMemory(dst); err != nil {
				t.Fatalf("deregister destination: %v", err)
			}
		}
	}
}
