package node

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// BenchmarkGPUPipeline moves fragmented KV-shaped workloads between device
// buffers of two agents in one process on one GPU (default bounce
// configuration: 256 MiB device arenas, 8 MiB chunks) and reports, each
// measured in the same iteration, side by side: the full bounce pipeline
// (gather kernel → cudacopy DtoD write → scatter kernel), the direct path
// on the same engine (one cuMemcpyDtoDAsync per descriptor, and batched
// through cuMemcpyBatchAsync), and one contiguous device copy of the same
// bytes. Each request is verified byte-exact once, after the timing.
//
//	go test -run '^$' -bench GPUPipeline -benchtime 5x ./node/
func BenchmarkGPUPipeline(b *testing.B) {
	c := cudatest.Context(b)
	f := gpuFactories(b)
	cfg := func(name, batch string) *Node {
		cf := gpuConfig(name)
		cf.Bounce.ArenaSize, cf.Bounce.MaxChunk, cf.Bounce.MinDescriptors = 256<<20, 8<<20, 1024
		cf.Engine.Options = map[string]string{"batch": batch}
		return build(b, cf, f)
	}
	a, bn := cfg("a", "false"), cfg("b", "false")
	ab := cfg("a-batch", "true")
	for _, pair := range [][2]*Node{{a, bn}, {bn, a}, {ab, bn}, {bn, ab}} {
		connectTB(b, pair[0], pair[1])
	}
	s, err := c.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	for _, w := range []struct {
		size  uint64
		count int
	}{{4096, 16384}, {4096, 81920}, {2048, 36864}} {
		spec := workload.Spec{DescSize: w.size, Count: w.count, Fragmented: true, Seed: 5}
		src := cudatest.Device(b, c, spec.Bytes())
		dst := cudatest.Device(b, c, spec.Bytes())
		for _, n := range []*Node{a, ab} {
			if err := n.Agent.RegisterMemory(src); err != nil {
				b.Fatal(err)
			}
		}
		if err := bn.Agent.RegisterMemory(dst); err != nil {
			b.Fatal(err)
		}
		host := make([]byte, spec.Bytes())
		if err := spec.Fill(host); err != nil {
			b.Fatal(err)
		}
		if err := c.CopyHtoD(cuda.DevicePtr(src.Addr), host); err != nil {
			b.Fatal(err)
		}
		sd, dd := spec.Descs(src, dst)
		bulk := pipeline.Request{Peer: "b", Src: []transfer.Desc{src}, Dst: []transfer.Desc{dst}, Route: pipeline.RouteDirect}
		routes := []struct {
			name string
			n    *Node
			req  pipeline.Request
		}{
			{"bounce", a, pipeline.Request{Peer: "b", Src: sd, Dst: dd, Route: pipeline.RouteBounce}},
			{"direct", a, pipeline.Request{Peer: "b", Src: sd, Dst: dd, Route: pipeline.RouteDirect}},
			{"direct-batch", ab, pipeline.Request{Peer: "b", Src: sd, Dst: dd, Route: pipeline.RouteDirect}},
			{"bulk", a, bulk},
		}
		name := fmt.Sprintf("%dx%dKiB", w.count, w.size>>10)
		b.Run(name, func(b *testing.B) {
			times := make([]time.Duration, len(routes))
			for i, r := range routes { // warm-up and verification, untimed
				if _, err := move(r.n, r.req); err != nil {
					b.Fatalf("%s: %v", r.name, err)
				}
				if i == 3 {
					continue // the bulk copy moves the bytes in source order
				}
				got := make([]byte, spec.Bytes())
				if err := c.CopyDtoH(got, cuda.DevicePtr(dst.Addr)); err != nil {
					b.Fatal(err)
				}
				if err := spec.Verify(got); err != nil {
					b.Fatalf("%s: %v", r.name, err)
				}
				if err := c.Memset(cuda.DevicePtr(dst.Addr), 0, spec.Bytes()); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for it := range b.N {
				for k := range routes {
					i := (k + it) % len(routes) // rotate the order each iteration
					d, err := move(routes[i].n, routes[i].req)
					if err != nil {
						b.Fatalf("%s: %v", routes[i].name, err)
					}
					times[i] += d
				}
			}
			gbs := func(i int) float64 { return float64(spec.Bytes()) * float64(b.N) / times[i].Seconds() / 1e9 }
			for i, r := range routes {
				b.ReportMetric(gbs(i), r.name+"-GB/s")
			}
			b.ReportMetric(gbs(0)/gbs(1), "bounce/direct")
			b.ReportMetric(gbs(0)/gbs(2), "bounce/direct-batch")
			b.ReportMetric(gbs(0)/gbs(3), "bounce/bulk")
		})
		for _, n := range []*Node{a, ab} {
			if err := n.Agent.DeregisterMemory(src); err != nil {
				b.Fatal(err)
			}
		}
		if err := bn.Agent.DeregisterMemory(dst); err != nil {
			b.Fatal(err)
		}
	}
}

// move submits one request, waits for it and releases it; it returns the
// time from submit to completion.
func move(n *Node, req pipeline.Request) (time.Duration, error) {
	start := time.Now()
	bt, err := n.Agent.Submit(req)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := bt.Wait(ctx); err != nil {
		return 0, err
	}
	d := time.Since(start)
	if bt.Route() != req.Route {
		return 0, fmt.Errorf("route %v (%s), asked %v", bt.Route(), bt.RouteReason(), req.Route)
	}
	return d, bt.Release()
}

func connectTB(tb testing.TB, a, b *Node) {
	tb.Helper()
	blob, err := b.Agent.Descriptor()
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := a.Agent.LoadPeer(blob); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkGPUBounce is the bounce route of BenchmarkGPUPipeline alone
// (81,920 × 4 KiB fragmented), for CPU profiles of the pipeline's host
// side:
//
//	go test -run '^$' -bench GPUBounce -benchtime 20x -cpuprofile cpu.prof ./node/
func BenchmarkGPUBounce(b *testing.B) {
	c := cudatest.Context(b)
	f := gpuFactories(b)
	cfg := func(name string) config.Config {
		c := gpuConfig(name)
		c.Bounce.ArenaSize, c.Bounce.MaxChunk = 256<<20, 8<<20
		return c
	}
	a, bn := build(b, cfg("a"), f), build(b, cfg("b"), f)
	connectTB(b, a, bn)
	connectTB(b, bn, a)
	spec := workload.Spec{DescSize: 4096, Count: 81920, Fragmented: true, Seed: 5}
	src := cudatest.Device(b, c, spec.Bytes())
	dst := cudatest.Device(b, c, spec.Bytes())
	if err := a.Agent.RegisterMemory(src); err != nil {
		b.Fatal(err)
	}
	if err := bn.Agent.RegisterMemory(dst); err != nil {
		b.Fatal(err)
	}
	sd, dd := spec.Descs(src, dst)
	req := pipeline.Request{Peer: "b", Src: sd, Dst: dd, Route: pipeline.RouteBounce}
	if _, err := move(a, req); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(spec.Bytes()))
	b.ResetTimer()
	for range b.N {
		if _, err := move(a, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGPUBounceWindow is the bounce route of 81,920 × 4 KiB
// fragmented blocks under different windows: bounce.max_inflight (W 8, 16,
// 32, 64: the regions one request holds at once) and bounce.max_chunk, every
// configuration on its own pair of agents and all timed in the same
// iterations, in rotated order. It shows whether the pipeline is bound by
// its host work per descriptor (then the window changes nothing) or by the
// latency of each region's round trip (then a larger window helps).
func BenchmarkGPUBounceWindow(b *testing.B) {
	c := cudatest.Context(b)
	f := gpuFactories(b)
	type knob struct {
		w     int
		chunk int64
	}
	knobs := []knob{{8, 8 << 20}, {32, 8 << 20}, {8, 32 << 20}, {64, 4 << 20}, {16, 8 << 20}}
	spec := workload.Spec{DescSize: 4096, Count: 81920, Fragmented: true, Seed: 5}
	src := cudatest.Device(b, c, spec.Bytes())
	dst := cudatest.Device(b, c, spec.Bytes())
	reqs := make([]pipeline.Request, len(knobs))
	senders := make([]*Node, len(knobs))
	for i, k := range knobs {
		cfg := func(name string) config.Config {
			c := gpuConfig(name)
			c.Bounce.ArenaSize, c.Bounce.MaxChunk, c.Bounce.MaxInflight = 256<<20, config.Size(k.chunk), k.w
			return c
		}
		a, bn := build(b, cfg(fmt.Sprintf("a%d", i)), f), build(b, cfg(fmt.Sprintf("b%d", i)), f)
		connectTB(b, a, bn)
		connectTB(b, bn, a)
		if err := a.Agent.RegisterMemory(src); err != nil {
			b.Fatal(err)
		}
		if err := bn.Agent.RegisterMemory(dst); err != nil {
			b.Fatal(err)
		}
		sd, dd := spec.Descs(src, dst)
		reqs[i] = pipeline.Request{Peer: fmt.Sprintf("b%d", i), Src: sd, Dst: dd, Route: pipeline.RouteBounce}
		senders[i] = a
		if _, err := move(a, reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	took := make([]time.Duration, len(knobs))
	b.ResetTimer()
	for it := range b.N {
		for j := range knobs {
			i := (j + it) % len(knobs)
			d, err := move(senders[i], reqs[i])
			if err != nil {
				b.Fatal(err)
			}
			took[i] += d
		}
	}
	b.StopTimer()
	for i, k := range knobs {
		gbs := float64(spec.Bytes()) * float64(b.N) / took[i].Seconds() / 1e9
		b.ReportMetric(gbs, fmt.Sprintf("W%d-chunk%dMiB-GB/s", k.w, k.chunk>>20))
	}
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "W32/W8")
	b.ReportMetric(took[0].Seconds()/took[4].Seconds(), "W16/W8")
}

// BenchmarkGPUBlockForm is issue #24's single-GPU measurement: KV pools
// shaped like the TP=8 presets (Llama-3.1-70B: 160 regions × 512 blocks
// of 4 KiB = 81,920 pieces; gpt-oss-120b: 72 × 512 × 2 KiB = 36,864) on
// two agents in one process (cudacopy, CUDA stages, 256 MiB device
// arenas, 8 MiB chunks), random ids on both sides. Each iteration runs,
// in rotated order and on the same pieces: the block form on the bounce
// route (Request.Blocks), the descriptor form on the bounce route, the
// per-descriptor direct path (one cuMemcpyDtoDAsync per piece) and one
// contiguous device copy of the same bytes (cuMemcpyDtoDAsync on a
// stream), and the block form again with 32 MiB chunks (512 MiB arenas,
// its own pair of agents). It reports each one's GB/s, the ratios blocks/copy,
// blocks/direct and descs/copy (goals ≥ 0.28, ≥ 500, ≥ 0.1), and each
// form's host CPU time (user + system, getrusage, both agents together)
// per piece. Each route is verified byte-exact once, untimed.
//
//	go test -run '^$' -bench GPUBlockForm -benchtime 5x ./node/
func BenchmarkGPUBlockForm(b *testing.B) {
	c := cudatest.Context(b)
	f := gpuFactories(b)
	cfg := func(name string, arena, chunk config.Size) config.Config {
		c := gpuConfig(name)
		c.Bounce.ArenaSize, c.Bounce.MaxChunk = arena, chunk
		return c
	}
	a, bn := build(b, cfg("a", 256<<20, 8<<20), f), build(b, cfg("b", 256<<20, 8<<20), f)
	// a2 and b2: the block form with 32 MiB chunks (512 MiB arenas), to
	// show whether the per-chunk round trip bounds it.
	a2, b2 := build(b, cfg("a2", 512<<20, 32<<20), f), build(b, cfg("b2", 512<<20, 32<<20), f)
	s, err := c.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	for _, w := range []struct {
		name    string
		size    uint64
		count   int
		regions int
	}{{"llama70b-81920x4KiB", 4096, 81920, 160}, {"gptoss120b-36864x2KiB", 2048, 36864, 72}} {
		spec := workload.Spec{DescSize: w.size, Count: w.count, Regions: w.regions, Fragmented: true, Seed: 5}
		src := cudatest.Device(b, c, spec.Bytes())
		dst := cudatest.Device(b, c, spec.Bytes())
		for _, pair := range [][2]*Node{{a, bn}, {a2, b2}} {
			if err := pair[0].Agent.RegisterMemory(src); err != nil {
				b.Fatal(err)
			}
			if err := pair[1].Agent.RegisterMemory(dst); err != nil {
				b.Fatal(err)
			}
			if err := pair[0].Agent.RegisterPool(w.name, spec.Pool(src)); err != nil {
				b.Fatal(err)
			}
			if err := pair[1].Agent.RegisterPool(w.name, spec.Pool(dst)); err != nil {
				b.Fatal(err)
			}
			connectTB(b, pair[0], pair[1])
			connectTB(b, pair[1], pair[0])
		}
		host := make([]byte, spec.Bytes())
		if err := spec.Fill(host); err != nil {
			b.Fatal(err)
		}
		if err := c.CopyHtoD(cuda.DevicePtr(src.Addr), host); err != nil {
			b.Fatal(err)
		}
		sd, dd := spec.Descs(src, dst)
		si, di := spec.IDs()
		blocks := &pipeline.BlockRequest{SrcPool: w.name, SrcIDs: si, DstPool: w.name, DstIDs: di}
		const nRoutes, iCopy = 5, 3
		names := [nRoutes]string{"blocks", "descs", "direct", "copy", "blocks-32MiB"}
		senders := [nRoutes]*Node{a, a, a, nil, a2}
		reqs := [nRoutes]pipeline.Request{
			{Peer: "b", Blocks: blocks, Route: pipeline.RouteBounce},
			{Peer: "b", Src: sd, Dst: dd, Route: pipeline.RouteBounce},
			{Peer: "b", Src: sd, Dst: dd, Route: pipeline.RouteDirect},
			{},
			{Peer: "b2", Blocks: blocks, Route: pipeline.RouteBounce},
		}
		run := func(i int) (time.Duration, error) {
			if i == iCopy {
				start := time.Now()
				if err := s.CopyDtoD(cuda.DevicePtr(dst.Addr), cuda.DevicePtr(src.Addr), spec.Bytes()); err != nil {
					return 0, err
				}
				err := s.Synchronize()
				return time.Since(start), err
			}
			return move(senders[i], reqs[i])
		}
		b.Run(w.name, func(b *testing.B) {
			for i := range nRoutes { // warm-up and verification, untimed
				if i == iCopy {
					continue // the copy moves the bytes in source order
				}
				if err := c.Memset(cuda.DevicePtr(dst.Addr), 0, spec.Bytes()); err != nil {
					b.Fatal(err)
				}
				if _, err := run(i); err != nil {
					b.Fatalf("%s: %v", names[i], err)
				}
				got := make([]byte, spec.Bytes())
				if err := c.CopyDtoH(got, cuda.DevicePtr(dst.Addr)); err != nil {
					b.Fatal(err)
				}
				if err := spec.Verify(got); err != nil {
					b.Fatalf("%s: %v", names[i], err)
				}
			}
			var took, cpu [nRoutes]time.Duration
			b.ResetTimer()
			for it := range b.N {
				for k := range nRoutes {
					i := (k + it) % nRoutes // rotate the order each iteration
					c0 := cpuTime(b)
					d, err := run(i)
					if err != nil {
						b.Fatalf("%s: %v", names[i], err)
					}
					cpu[i] += cpuTime(b) - c0
					took[i] += d
				}
			}
			b.StopTimer()
			gbs := func(i int) float64 { return float64(spec.Bytes()) * float64(b.N) / took[i].Seconds() / 1e9 }
			for i, n := range names {
				b.ReportMetric(gbs(i), n+"-GB/s")
			}
			b.ReportMetric(gbs(0)/gbs(3), "blocks/copy")
			b.ReportMetric(gbs(0)/gbs(2), "blocks/direct")
			b.ReportMetric(gbs(1)/gbs(3), "descs/copy")
			b.ReportMetric(gbs(1)/gbs(2), "descs/direct")
			b.ReportMetric(gbs(4)/gbs(3), "blocks-32MiB/copy")
			pieces := float64(spec.Count) * float64(b.N)
			b.ReportMetric(float64(cpu[0].Nanoseconds())/pieces, "blocks-cpu-ns/piece")
			b.ReportMetric(float64(cpu[1].Nanoseconds())/pieces, "descs-cpu-ns/piece")
			b.ReportMetric(float64(took[0].Nanoseconds())/pieces, "blocks-wall-ns/piece")
		})
		// The pools and memory stay registered until the agents close
		// (the buffers are the next workload's neighbours, not reused).
	}
}

// cpuTime returns the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
