package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/cuda/cudatest"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// TestRunMemoryDevice: `bounce run --memory device` moves device KV between
// two processes over the host engines (pinned-host arenas, cuda stages),
// every byte verified on the receiver by copying it back; without a GPU it
// fails naming why, and a bad --memory is a usage error. A plugin engine
// (another process) carries it too: its pinned arena is a memfd arena
// page-locked for the device, which the plugin maps.
func TestRunMemoryDevice(t *testing.T) {
	if _, errOut, code := bounce(t, "run", "--memory", "hbm"); code != exitUsage || !strings.Contains(errOut, "--memory \"hbm\": accepted: host, device") {
		t.Fatalf("--memory hbm: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := bounce(t, "bench", "--memory", "device", "--senders", "2", "--receivers", "2"); code != exitUsage || !strings.Contains(errOut, "not yet with --senders/--receivers") {
		t.Fatalf("--memory device with the fleet bench: exit %d, stderr %q", code, errOut)
	}
	_, noGPU := cuda.Open("")
	for _, engine := range []string{"tcp", "ucx", "plugin"} {
		t.Run(engine, func(t *testing.T) {
			args := []string{"run", "--memory", "device", "--workload", "gptoss120b-tp8-b16", "--count", "4096", "--requests", "2", "--compare=false",
				"--engine.kind", engine, "--bounce.arena-size", "32MiB", "--bounce.max-chunk", "4MiB"}
			if engine == "plugin" {
				if noGPU != nil {
					t.Skipf("skipping: %v", noGPU)
				}
				bin := filepath.Join(t.TempDir(), "tcpengine")
				if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/examples/tcpengine").CombinedOutput(); err != nil {
					t.Fatalf("build example plugin: %v\n%s", err, out)
				}
				args = append(args, "--engine.plugin", bin)
			}
			out, errOut, code := bounce(t, args...)
			if noGPU != nil {
				if code == 0 || !strings.Contains(out+errOut, "cuda unavailable") {
					t.Fatalf("without a GPU: exit %d, want a failure naming cuda unavailable\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			for _, want := range []string{"device memory", "bounce  ", "every byte verified"} {
				if !strings.Contains(out, want) {
					t.Fatalf("summary lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// gpuOrSkip returns device 0's context or skips the test.
func gpuOrSkip(t *testing.T) *cuda.Context {
	t.Helper()
	return cudatest.Context(t)
}

// deviceNodeConfig is a tcp agent with cuda stages (device KV over a host
// engine through a pinned-host arena). Security is off on every agent of
// these tests: each admits peers it never loaded (the subject is peer
// death, not admission).
func deviceNodeConfig(name string) config.Config {
	cfg := config.Default()
	cfg.Agent.Name = name
	cfg.Engine.Kind = "tcp"
	cfg.ControlPlane.BindAddress = "127.0.0.1"
	cfg.Security.Mode = "off"
	cfg.Bounce.ArenaSize = 16 * config.MiB
	cfg.Bounce.RequestTimeout = 5 * time.Second
	cfg.Stages.Gather.Kind, cfg.Stages.Scatter.Kind = "cuda", "cuda"
	cfg.Bounce.CostModel = false // route by the gates: these tests want bounce
	return cfg
}

// startDeviceReceiver starts `bounce serve --stdin-control --memory device`
// and returns it with its hello line and a line reader of its stdout.
func startDeviceReceiver(t *testing.T, name string) (*exec.Cmd, io.WriteCloser, *bufio.Reader, hello, []byte) {
	t.Helper()
	recv := exec.Command(cliBinary(t), "serve", "--stdin-control", "--memory", "device", "--agent.name", name, "--buffer-size", "256MiB",
		"--engine.kind", "tcp", "--control-plane.bind-address", "127.0.0.1", "--bounce.arena-size", "16MiB", "--security.mode", "off")
	recv.Stderr = &logWriter{t: t, prefix: name + ": "}
	stdout, _ := recv.StdoutPipe()
	stdin, _ := recv.StdinPipe()
	if err := recv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); recv.Process.Kill(); recv.Wait() })
	r := bufio.NewReader(stdout)
	line, err := r.ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var h hello
	if err := json.Unmarshal(line, &h); err != nil {
		t.Fatal(err)
	}
	if h.BufferKind != "cuda" {
		t.Fatalf("receiver buffer kind %q, want cuda", h.BufferKind)
	}
	blob, _ := base64.StdEncoding.DecodeString(h.Descriptor)
	return recv, stdin, r, h, blob
}

// TestDeviceKVReceiverKilled: device KV over tcp, the receiver process is
// frozen mid-transfer and killed -9: every request resolves within the
// timeout with an error, retirement says the sender's device buffers are
// quiescent, and the sender then serves a new receiver, byte-exact.
func TestDeviceKVReceiverKilled(t *testing.T) {
	c := gpuOrSkip(t)
	recv, _, _, h, blob := startDeviceReceiver(t, "victim")
	ds := newDeviceSender(t, c, "killer", 3)
	n, spec := ds.n, ds.spec
	if _, err := n.Agent.LoadPeer(blob); err != nil {
		t.Fatal(err)
	}
	submit := func(peer string, dst transfer.Desc, k int) *pipeline.Batch {
		b := ds.submit(peer, dst, k, pipeline.RouteAuto)
		if b.Route() != pipeline.RouteBounce {
			t.Fatalf("device KV over tcp took %v (%s), want bounce", b.Route(), b.RouteReason())
		}
		return b
	}
	if err := recv.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { recv.Process.Kill() })
	var batches []*pipeline.Batch
	for k := range 4 {
		batches = append(batches, submit(h.Name, h.buffer(), k))
	}
	requireFailedQuiescent(t, batches, "a killed receiver")
	if err := n.Agent.CheckConservation(); err != nil {
		t.Fatal(err)
	}
	// The survivor keeps serving: a new receiver gets every byte.
	_, stdin, out, h2, blob2 := startDeviceReceiver(t, "next")
	if _, err := n.Agent.LoadPeer(blob2); err != nil {
		t.Fatal(err)
	}
	b := submit(h2.Name, h2.buffer(), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("request to the next receiver: %v", err)
	}
	b.Release()
	verifyOnReceiver(t, stdin, out, spec, 0)
}

// TestDeviceKVSenderKilled: device KV over tcp into this process's GPU
// buffer; the sending process is killed -9 once the first request landed:
// the receiver reclaims every flow (its arena all free again, conserved)
// within a bounded wait and then serves a new sender, byte-exact.
func TestDeviceKVSenderKilled(t *testing.T) {
	c := gpuOrSkip(t)
	events := make(chan pipeline.Received, 64)
	n, err := node.BuildWith(deviceNodeConfig("survivor"), node.Builtin(), node.Options{Received: events})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	spec := workload.Spec{DescSize: 4096, Count: 16384, Fragmented: true, Seed: 1}
	dst, err := driver.AllocDevice(c, 8*spec.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if err := n.Agent.RegisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	defer n.Agent.DeregisterMemory(dst.Desc())
	blob, err := n.Agent.Descriptor()
	if err != nil {
		t.Fatal(err)
	}
	d := dst.Desc()
	line, _ := json.Marshal(hello{Name: n.Agent.Name(), Descriptor: base64.StdEncoding.EncodeToString(blob), BufferAddr: d.Addr, BufferLen: d.Len, Bounce: true, BufferKind: "cuda"})
	peer := filepath.Join(t.TempDir(), "recv.json")
	if err := os.WriteFile(peer, append(line, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	send := func(requests int, name string) *exec.Cmd {
		cmd := exec.Command(cliBinary(t), "send", "--peer", peer, "--memory", "device", "--agent.name", name, "--warm-up=false",
			"--desc-size", "4KiB", "--count", "16384", "--requests", strconv.Itoa(requests), "--seed", "1",
			"--engine.kind", "tcp", "--control-plane.bind-address", "127.0.0.1", "--bounce.arena-size", "16MiB", "--security.mode", "off",
			"--bounce.cost-model=false") // the bounce path, by the gates
		cmd.Stdout = &logWriter{t: t, prefix: name + ": "}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	victim := send(8, "victim")
	exited := make(chan error, 1)
	go func() { exited <- victim.Wait() }()
	select {
	case <-events:
	case err := <-exited:
		t.Fatalf("the sender exited (%v) before a request landed", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no request landed from the sender in 60s")
	}
	victim.Process.Kill()
	<-exited
	deadline := time.Now().Add(30 * time.Second)
	for {
		s := n.Agent.ArenaStats()
		if s.Flows == 0 && s.Regions == 0 && s.FreeBytes == s.Capacity {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the receiver did not reclaim the killed sender's flows within 30s: %+v", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := n.Agent.CheckConservation(); err != nil {
		t.Fatal(err)
	}
	if err := dst.Clear(); err != nil {
		t.Fatal(err)
	}
	next := send(1, "next")
	stop := time.AfterFunc(2*time.Minute, func() { next.Process.Kill() }) // never hang
	defer stop.Stop()
	if err := next.Wait(); err != nil {
		t.Fatalf("the next sender: %v", err)
	}
	got := make([]byte, spec.Bytes())
	if err := dst.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if err := spec.Verify(got); err != nil {
		t.Fatalf("bytes from the next sender: %v", err)
	}
}

// logWriter copies a child's output into the test log, line by line.
type logWriter struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Log(w.prefix + string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

// TestDeviceKVDirectStaged: device KV over tcp between two processes on
// the direct route (the per-descriptor baseline: every descriptor copied to
// a page-locked staging buffer on the sender, written, copied out on the
// receiver), byte-exact on the receiver's GPU; route auto still takes
// bounce for it and says why. Then the receiver is frozen and killed -9
// mid-transfer: every direct request resolves within the timeout, retired
// quiescent (the staging copies of the sender's device memory ended), and
// the sender serves a new receiver.
func TestDeviceKVDirectStaged(t *testing.T) {
	c := gpuOrSkip(t)
	_, stdin, out, h, blob := startDeviceReceiver(t, "direct-recv")
	ds := newDeviceSender(t, c, "direct-send", 5)
	n := ds.n
	if !transfer.Stages(n.Engine, transfer.CUDA) {
		t.Fatal("the tcp engine with cuda stages does not stage cuda memory (engine.options device_staging auto)")
	}
	if _, err := n.Agent.LoadPeer(blob); err != nil {
		t.Fatal(err)
	}
	submit := ds.submit
	verify := func(stdin io.Writer, out *bufio.Reader, k int) {
		t.Helper()
		verifyOnReceiver(t, stdin, out, ds.spec, k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := submit(h.Name, h.buffer(), 0, pipeline.RouteDirect)
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("direct request: %v", err)
	}
	if b.Route() != pipeline.RouteDirect {
		t.Fatalf("route %v, want direct", b.Route())
	}
	b.Release()
	verify(stdin, out, 0) // the receiver's whole buffer is checked from offset 0
	b = submit(h.Name, h.buffer(), 0, pipeline.RouteAuto)
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("auto request: %v", err)
	}
	if b.Route() != pipeline.RouteBounce || !strings.Contains(b.RouteReason(), "only by staging") {
		t.Fatalf("auto took %v (%s), want bounce because tcp only stages cuda memory", b.Route(), b.RouteReason())
	}
	b.Release()

	victim, _, _, hv, blobv := startDeviceReceiver(t, "direct-victim")
	if _, err := n.Agent.LoadPeer(blobv); err != nil {
		t.Fatal(err)
	}
	if err := victim.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { victim.Process.Kill() })
	var batches []*pipeline.Batch
	for k := range 4 {
		batches = append(batches, submit(hv.Name, hv.buffer(), k, pipeline.RouteDirect))
	}
	requireFailedQuiescent(t, batches, "a killed receiver on the direct route")
	_, stdin2, out2, h2, blob2 := startDeviceReceiver(t, "direct-next")
	if _, err := n.Agent.LoadPeer(blob2); err != nil {
		t.Fatal(err)
	}
	b = submit(h2.Name, h2.buffer(), 0, pipeline.RouteDirect)
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("direct request to the next receiver: %v", err)
	}
	b.Release()
	verify(stdin2, out2, 0)
}

// TestServeHostBulkBuffer: `serve --host-bulk-buffer` (what bench passes
// for the bulk route on device KV) serves a host buffer of --buffer-size
// beside the destination buffer, named in its hello line; clear and verify
// act on it when a command names buffer "bulk", and an unknown buffer is
// refused naming what is accepted. Without the flag "bulk" is refused.
func TestServeHostBulkBuffer(t *testing.T) {
	for _, bulk := range []bool{true, false} {
		args := []string{"serve", "--stdin-control", "--agent.name", "bulky", "--buffer-size", "4MiB",
			"--control-plane.bind-address", "127.0.0.1", "--security.mode", "off"}
		if bulk {
			args = append(args, "--host-bulk-buffer")
		}
		recv := exec.Command(cliBinary(t), args...)
		recv.Stderr = &logWriter{t: t, prefix: "bulky: "}
		stdout, _ := recv.StdoutPipe()
		stdin, _ := recv.StdinPipe()
		if err := recv.Start(); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(stdout)
		line, err := r.ReadBytes('\n')
		var h hello
		if err != nil || json.Unmarshal(line, &h) != nil {
			t.Fatalf("hello: %q, %v", line, err)
		}
		if bulk && (h.BulkLen != 4<<20 || h.BulkAddr == 0 || h.BulkAddr == h.BufferAddr) || !bulk && h.BulkLen != 0 {
			t.Fatalf("--host-bulk-buffer %v: hello bulk buffer [%#x+%d], destination [%#x+%d]", bulk, h.BulkAddr, h.BulkLen, h.BufferAddr, h.BufferLen)
		}
		call := func(c command) reply {
			t.Helper()
			b, _ := json.Marshal(c)
			fmt.Fprintf(stdin, "%s\n", b)
			rl, err := r.ReadBytes('\n')
			var rep reply
			if err != nil || json.Unmarshal(rl, &rep) != nil {
				t.Fatalf("%s: %q, %v", b, rl, err)
			}
			return rep
		}
		if rep := call(command{Op: "clear", Buffer: "bulk"}); rep.OK != bulk || !bulk && !strings.Contains(rep.Error, "no host bulk buffer") {
			t.Fatalf("clear bulk with --host-bulk-buffer %v: %+v", bulk, rep)
		}
		// The bulk buffer is zero after clear: a workload does not verify.
		if rep := call(command{Op: "verify", Buffer: "bulk", DescSize: 4096, Count: 16, Seed: 1, Requests: 1}); bulk && (rep.OK || rep.Error == "") {
			t.Fatalf("verify of a cleared bulk buffer passed: %+v", rep)
		}
		if rep := call(command{Op: "clear", Buffer: "hbm"}); rep.OK || !strings.Contains(rep.Error, `unknown buffer "hbm"; accepted: bulk`) {
			t.Fatalf("clear hbm: %+v", rep)
		}
		if rep := call(command{Op: "quit"}); !rep.OK {
			t.Fatalf("quit: %+v", rep)
		}
		stdin.Close()
		if err := recv.Wait(); err != nil {
			t.Fatalf("serve exited: %v", err)
		}
	}
}

// deviceSender is a node on the cuda stages and tcp with a GPU source of
// four workload requests (spec, 16,384 fragmented 4 KiB descriptors each),
// registered; everything is released when the test ends.
type deviceSender struct {
	t    *testing.T
	n    *node.Node
	spec workload.Spec
	src  driver.Buffer
}

func newDeviceSender(t *testing.T, c *cuda.Context, name string, seed uint64) *deviceSender {
	t.Helper()
	n, err := node.Build(deviceNodeConfig(name), node.Builtin(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(context.Background()) })
	spec := workload.Spec{DescSize: 4096, Count: 16384, Fragmented: true, Seed: seed}
	src, err := driver.AllocDevice(c, 4*spec.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Free() })
	if err := n.Agent.RegisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Agent.DeregisterMemory(src.Desc()) })
	return &deviceSender{t: t, n: n, spec: spec, src: src}
}

// submit fills request k's pattern (seed + k) into the k-th quarter of
// the source and submits it to peer's dst (its k-th quarter) on route.
func (d *deviceSender) submit(peer string, dst transfer.Desc, k int, route pipeline.Route) *pipeline.Batch {
	t := d.t
	t.Helper()
	s := d.spec
	s.Seed += uint64(k)
	host := make([]byte, s.Bytes())
	if err := s.Fill(host); err != nil {
		t.Fatal(err)
	}
	if err := d.src.WriteAt(host, uint64(k)*s.Bytes()); err != nil {
		t.Fatal(err)
	}
	sb := d.src.Desc()
	sb.Addr += uint64(k) * s.Bytes()
	dst.Addr += uint64(k) * s.Bytes()
	sd, dd := s.Descs(sb, dst)
	b, err := d.n.Agent.Submit(pipeline.Request{Peer: peer, Src: sd, Dst: dd, Route: route})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// verifyOnReceiver asks a `serve --stdin-control` receiver to verify one
// request of spec with pattern seed + k.
func verifyOnReceiver(t *testing.T, stdin io.Writer, out *bufio.Reader, spec workload.Spec, k int) {
	t.Helper()
	line, _ := json.Marshal(command{Op: "verify", DescSize: spec.DescSize, Count: spec.Count, Fragmented: true, Seed: spec.Seed + uint64(k), Requests: 1})
	fmt.Fprintf(stdin, "%s\n", line)
	rl, err := out.ReadBytes('\n')
	var rep reply
	if err != nil || json.Unmarshal(rl, &rep) != nil || !rep.OK || rep.Verified != 1 {
		t.Fatalf("verify request %d on the receiver: %s, %v", k, rl, err)
	}
}
