package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/bouncekv/bounce/mem/memtest"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
)

// benchShape is the workload both sides of BenchmarkPythonVsGo move: one
// rank of Llama-3.1-70B at TP=8, block 16 (160 regions x 512 ids x 4 KiB).
const (
	benchRegions = 160
	benchIDs     = 512
	benchBlock   = 4096
	benchReqs    = 3
)

// BenchmarkPythonVsGo moves the same 81,920 x 4 KiB request through the Go
// API and through the Python package (python/bench/abi_bench.py over
// libbounce.so) in one run and reports Python's time over Go's, and
// Python's per-call cost of poll and submit.
func BenchmarkPythonVsGo(b *testing.B) {
	python := "/usr/bin/python3" // Debian's, with python3-numpy
	if p := os.Getenv("BOUNCE_PYTHON"); p != "" {
		python = p
	}
	py, err := exec.LookPath(python)
	if err != nil {
		b.Skipf("no %s", python)
	}
	dir := buildLib(b)
	for range b.N {
		goSec := goRequestTime(b)
		cmd := exec.Command(py, "../python/bench/abi_bench.py", "--regions", strconv.Itoa(benchRegions), "--ids", strconv.Itoa(benchIDs),
			"--block", strconv.Itoa(benchBlock), "--requests", strconv.Itoa(benchReqs))
		cmd.Env = append(cmd.Environ(), "BOUNCE_LIBRARY="+filepath.Join(dir, "libbounce.so"))
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("abi_bench.py: %v\n%s", err, out)
		}
		var r struct {
			Seconds float64 `json:"seconds_per_request"`
			Submit  float64 `json:"submit_ns"`
			Poll    float64 `json:"poll_ns"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			b.Fatalf("abi_bench.py printed %q: %v", out, err)
		}
		b.ReportMetric(r.Seconds/goSec, "python/go")
		b.ReportMetric(goSec*1e3, "go-ms/req")
		b.ReportMetric(r.Seconds*1e3, "python-ms/req")
		b.ReportMetric(r.Poll, "python-ns/poll")
		b.ReportMetric(r.Submit, "python-ns/submit")
	}
}

// goRequestTime is the median time of benchReqs requests (after a warm-up)
// through the Go API, with the same agents' configuration as the Python side.
func goRequestTime(b *testing.B) float64 {
	b.Helper()
	opts := func(name string) []string {
		return []string{"agent.name=" + name, "engine.kind=tcp", "engine.listen=127.0.0.1:0",
			"control_plane.bind_address=127.0.0.1", "bounce.route=bounce"}
	}
	send, err := newAgent(nil, opts("go-send"), 0)
	if err != nil {
		b.Fatal(err)
	}
	recv, err := newAgent(nil, opts("go-recv"), 0)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	defer recv.close(ctx)
	defer send.close(ctx)
	size := benchRegions * benchIDs * benchBlock
	src, dst := memtest.Buffer(b, nil, uint64(size)), memtest.Buffer(b, nil, uint64(size))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src.Bytes() {
		src.Bytes()[i] = byte(rng.Uint32())
	}
	pool := func(base uint64) transfer.Pool {
		p := transfer.Pool{BlockLen: benchBlock, Stride: benchBlock, Blocks: benchIDs}
		for r := range benchRegions {
			p.Regions = append(p.Regions, base+uint64(r*benchIDs*benchBlock))
		}
		return p
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(send.agent().RegisterMemory(src.Desc()))
	must(recv.agent().RegisterMemory(dst.Desc()))
	must(send.agent().RegisterPool("kv", pool(src.Desc().Addr)))
	must(recv.agent().RegisterPool("kv", pool(dst.Desc().Addr)))
	rd, err := recv.agent().Descriptor()
	must(err)
	peer, err := send.agent().LoadPeer(rd)
	must(err)
	sd, err := send.agent().Descriptor()
	must(err)
	_, err = recv.agent().LoadPeer(sd)
	must(err)
	sid, did := perm(rng, benchIDs), perm(rng, benchIDs)
	var times []float64
	for i := range benchReqs + 1 {
		t0 := time.Now()
		bt, err := send.agent().Submit(pipeline.Request{Peer: peer, Blocks: &pipeline.BlockRequest{SrcPool: "kv", SrcIDs: sid, DstPool: "kv", DstIDs: did}})
		must(err)
		must(bt.Wait(ctx))
		must(bt.Release())
		if _, err := recv.next(2 * time.Minute); err != nil {
			b.Fatal(err)
		}
		if i > 0 {
			times = append(times, time.Since(t0).Seconds())
		}
	}
	slices.Sort(times)
	return times[len(times)/2]
}

func perm(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i, v := range rng.Perm(n) {
		out[i] = uint32(v)
	}
	return out
}
