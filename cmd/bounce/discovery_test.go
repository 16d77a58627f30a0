package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bouncekv/bounce/benchreport"
	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/discovery/etcd"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// TestFleetBenchThroughEtcd: bench --senders --receivers starts its own
// etcd, receiver and sender processes, and verifies every byte. Its log
// holds one warning: the embedded etcd has no TLS or users (once, not once
// per process); no first connection is refused (the receivers admit every
// sender before a sender loads a receiver).
func TestFleetBenchThroughEtcd(t *testing.T) {
	js := filepath.Join(t.TempDir(), "fleet.json")
	out, errs, code := bounce(t, "bench", "--senders", "2", "--receivers", "2", "--count", "256", "--sender-requests", "3",
		"--pattern", "seeded", "--seed", "7", "--json", js)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	var warns []string
	for _, l := range strings.Split(errs, "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			warns = append(warns, l)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], etcd.InsecureWarning) {
		t.Fatalf("fleet log: %d warnings, want the one about the embedded etcd:\n%s", len(warns), strings.Join(warns, "\n"))
	}
	var rep fleetReport
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	verified := 0
	for _, r := range rep.PerRecv {
		verified += r.Verified
	}
	if !rep.Verified || rep.Requests != 6 || verified != 6 || rep.Bytes != 6*256*rep.DescSize || !strings.Contains(rep.Etcd, "embedded") {
		t.Fatalf("report %+v (verified requests %d)\n%s", rep, verified, out)
	}
	if rep.P50NS <= 0 || rep.MaxNS < rep.P99NS || rep.P99NS < rep.P50NS {
		t.Fatalf("latency percentiles %d/%d/%d", rep.P50NS, rep.P99NS, rep.MaxNS)
	}
}

func TestPlanFleetCoversEveryRequestOnce(t *testing.T) {
	for _, pattern := range []string{"round-robin", "seeded"} {
		for _, c := range [][3]int{{4, 2, 8}, {3, 5, 7}, {1, 1, 1}, {8, 3, 1}} {
			p, err := planFleet(c[0], c[1], c[2], pattern, 42)
			if err != nil {
				t.Fatal(err)
			}
			// Slots at each receiver are disjoint ranges, one per sender,
			// that tile [0, slots).
			for k := range c[1] {
				next := 0
				for s := range c[0] {
					if p.start[s][k] != next {
						t.Fatalf("%s %v: receiver %d sender %d starts at %d, want %d", pattern, c, k, s, p.start[s][k], next)
					}
					next += p.count[s][k]
				}
				if next != p.slots[k] {
					t.Fatalf("%s %v: receiver %d has %d slots, ranges cover %d", pattern, c, k, p.slots[k], next)
				}
			}
			total := 0
			for s := range c[0] {
				for k := range c[1] {
					total += p.count[s][k]
				}
			}
			if total != c[0]*c[2] {
				t.Fatalf("%s %v: %d requests planned, want %d", pattern, c, total, c[0]*c[2])
			}
			again, _ := planFleet(c[0], c[1], c[2], pattern, 42)
			if !equalPlans(p, again) {
				t.Fatalf("%s %v: the plan is not reproducible from its seed", pattern, c)
			}
		}
	}
	if p, _ := planFleet(4, 2, 8, "round-robin", 1); p.count[0][0] != 4 || p.count[0][1] != 4 {
		t.Fatalf("round robin over 2 receivers: counts %v", p.count[0])
	}
	if _, err := planFleet(2, 2, 2, "zigzag", 1); err == nil || !strings.Contains(err.Error(), "round-robin, seeded") {
		t.Fatalf("bad pattern: %v", err)
	}
}

func equalPlans(a, b fleetPlan) bool {
	for s := range a.assign {
		for j := range a.assign[s] {
			if a.assign[s][j] != b.assign[s][j] {
				return false
			}
		}
	}
	return true
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestEtcdUnavailableAtStart: serve and send against an etcd that is not
// there fail at once, the environment failing (exit 3), naming the
// endpoint.
func TestEtcdUnavailableAtStart(t *testing.T) {
	addr := closedPort(t)
	common := []string{"--discovery.kind", "etcd", "--discovery.insecure", "--discovery.endpoints", addr, "--discovery.dial-timeout", "500ms"}
	for _, args := range [][]string{
		append([]string{"serve", "--buffer-size", "1MiB", "--agent.name", "decode-0"}, common...),
		append([]string{"send", "--peer", "decode-0", "--count", "16"}, common...),
	} {
		_, errs, code := bounce(t, args...)
		if code != exitRuntime || !strings.Contains(errs, "directory unavailable") || !strings.Contains(errs, addr) {
			t.Fatalf("%s: exit %d, stderr %q; want exit %d naming %s as unavailable", args[0], code, errs, exitRuntime, addr)
		}
	}
}

// TestStoppedReceiverLeaseFailsInFlight: a receiver process that stops
// (SIGSTOP: its sockets stay open, it answers nothing, it keeps no lease)
// is forgotten by the sender when its lease expires, and the sender's
// request in flight fails then with ErrPeerLost, well before its timeout.
func TestStoppedReceiverLeaseFailsInFlight(t *testing.T) {
	srv, err := etcd.StartServer(t.TempDir(), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const lease = 2 * time.Second
	dc := config.Default().Discovery
	dc.Kind, dc.Endpoints, dc.Lease, dc.Prefix, dc.Insecure = "etcd", srv.Endpoint, lease, "/t", true

	cmd := exec.Command(cliBinary(t), "serve", "--stdin-control", "--agent.name", "decode-0", "--buffer-size", "16MiB",
		"--follow", "prefill-0", "--discovery.kind", "etcd", "--discovery.insecure", "--discovery.endpoints", srv.Endpoint,
		"--discovery.lease", "2s", "--discovery.prefix", "/t", "--control-plane.bind-address", "127.0.0.1")
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &receiver{stdin: stdin, lines: make(chan []byte, 4), wait: cmd.Wait, pid: cmd.Process.Pid}
	r.stop = func() { cmd.Process.Signal(syscall.SIGCONT); cmd.Process.Kill(); cmd.Wait() }
	defer r.stop()
	if err := r.start(stdout, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	cfg := config.Default()
	cfg.Agent.Name = "prefill-0"
	cfg.ControlPlane.BindAddress = "127.0.0.1"
	cfg.Bounce.RequestTimeout = 2 * time.Minute // only the lease may fail the request
	cfg.Discovery = dc
	n, err := node.Build(cfg, node.Builtin(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	spec := workload.Spec{DescSize: 4096, Count: 256, Fragmented: true, Seed: 3}
	src, err := mem.Alloc(spec.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Free()
	if err := n.Agent.RegisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	own, _ := n.Agent.Descriptor()
	line, _ := json.Marshal(hello{Name: "prefill-0", Descriptor: base64.StdEncoding.EncodeToString(own)})
	in, err := join(ctx, cfg, n, nil, line, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer in.close()
	rec, err := in.peers.Resolve(ctx, "decode-0")
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := parseHello(rec.Value)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		rep, err := r.call(command{Op: "known", Peers: []string{"prefill-0"}}, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Known) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the receiver never admitted prefill-0")
		}
		time.Sleep(50 * time.Millisecond)
	}
	submit := func() *pipeline.Batch {
		if err := spec.Fill(src.Bytes()); err != nil {
			t.Fatal(err)
		}
		s, d := spec.Descs(src.Desc(), h.buffer())
		b, err := n.Agent.Submit(pipeline.Request{Peer: "decode-0", Src: s, Dst: d, Route: pipeline.RouteBounce})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	first := submit()
	if err := first.Wait(wctx); err != nil {
		t.Fatalf("request before the stop: %v", err)
	}
	first.Release()
	if rep, err := r.call(verifyCommand(spec, 1), 30*time.Second); err != nil || rep.Verified != 1 {
		t.Fatalf("verify: %+v %v", rep, err)
	}

	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	b := submit()
	err = b.Wait(wctx)
	took := time.Since(stopped)
	if !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("request to the stopped receiver: %v, want ErrPeerLost", err)
	}
	t.Logf("in-flight request failed %v after the receiver stopped (lease %v)", took.Round(time.Millisecond), lease)
	if took > lease+15*time.Second {
		t.Fatalf("failed %v after the stop: not by the lease (%v)", took, lease)
	}
	b.Abandon(10 * time.Second)
	b.Release()
	if _, ok := in.peers.Current("decode-0"); ok {
		t.Fatal("the stopped receiver is still current")
	}
}

// TestServeRefusesALiveAgentsName: a second serve under a name a live
// agent holds in etcd exits 3 (the environment: another agent has the
// name) naming the name; the first keeps it.
func TestServeRefusesALiveAgentsName(t *testing.T) {
	srv, err := etcd.StartServer(t.TempDir(), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	args := []string{"serve", "--agent.name", "decode-0", "--buffer-size", "1MiB", "--discovery.kind", "etcd", "--discovery.insecure",
		"--discovery.endpoints", srv.Endpoint, "--control-plane.bind-address", "127.0.0.1"}
	desc := filepath.Join(t.TempDir(), "first.json")
	first := exec.Command(cliBinary(t), append(args, "--descriptor-out", desc)...)
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { first.Process.Kill(); first.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for { // the descriptor file appears once the record is published
		if _, err := os.Stat(desc); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first serve never published")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, errs, code := bounce(t, args...)
	if code != exitRuntime || !strings.Contains(errs, "name held by a live agent") || !strings.Contains(errs, "decode-0") {
		t.Fatalf("second serve: exit %d, stderr %q", code, errs)
	}
}

// TestBenchPeerThroughEtcd: with discovery.kind etcd, bench --peer NAME
// resolves the receiver's agent name through discovery as send does, and
// publishes its own record, so a 'serve --follow' receiver admits it; the
// report names the receiver and every cell moved its bytes.
func TestBenchPeerThroughEtcd(t *testing.T) {
	srv, err := etcd.StartServer(t.TempDir(), 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	common := []string{"--discovery.kind", "etcd", "--discovery.insecure", "--discovery.endpoints", srv.Endpoint,
		"--discovery.prefix", "/bp", "--control-plane.bind-address", "127.0.0.1"}
	desc := filepath.Join(t.TempDir(), "recv.json")
	serve := exec.Command(cliBinary(t), append([]string{"serve", "--agent.name", "decode-0", "--follow", "prefill-1",
		"--buffer-size", "16MiB", "--descriptor-out", desc}, common...)...)
	var serr syncBuffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	waitForFileOf(t, desc, &serr, nil)
	js := filepath.Join(t.TempDir(), "bench.json")
	out, errs, code := bounce(t, append([]string{"bench", "--agent.name", "prefill-1", "--peer", "decode-0",
		"--workload", "gptoss120b-tp8-b16", "--count", "256", "--concurrency", "1", "--repeat", "1",
		"--routes", "bounce,direct", "--json", js}, common...)...)
	if code != 0 {
		t.Fatalf("bench --peer decode-0: exit %d\n%s\n%s\nserve:\n%s", code, out, errs, serr.String())
	}
	rep, err := benchreport.LoadJSON(js)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Config.Peer != "decode-0" || len(rep.Cells) != 2 {
		t.Fatalf("peer %q, %d cells:\n%s", rep.Config.Peer, len(rep.Cells), out)
	}
	for _, c := range rep.Cells {
		if c.Failed != 0 || c.Took != c.Route || c.Bytes != 256*2048 || c.Verified {
			t.Fatalf("cell %+v\n%s", c, out)
		}
	}
	if n := strings.Count(serr.String(), "received: peer=prefill-1"); n < 4 { // 2 warm-ups + 2 cells
		t.Fatalf("the receiver announced %d requests from prefill-1, want at least 4:\n%s", n, serr.String())
	}
	// A name nobody holds is a clear failure, not a hang.
	_, errs, code = bounce(t, append([]string{"bench", "--agent.name", "prefill-1", "--peer", "nobody", "--count", "256",
		"--repeat", "1", "--discovery.dial-timeout", "500ms"}, common...)...)
	if code == 0 || !strings.Contains(errs, "nobody") {
		t.Fatalf("bench --peer nobody: exit %d, %q", code, errs)
	}
}

// TestFleetLogsOnce: lines of several children pass through whole, in any
// chunking, and a line naming a once-only message is printed the first
// time only.
func TestFleetLogsOnce(t *testing.T) {
	var b bytes.Buffer
	l := &fleetLogs{w: &b, once: []string{"same warning"}}
	c1, c2 := l.child(), l.child()
	c1.Write([]byte("level=WARN msg=\"same warn"))
	c2.Write([]byte("level=INFO msg=two\nlevel=WARN msg=\"same warning\" child=2\n"))
	c1.Write([]byte("ing\" child=1\nlevel=INFO msg=one\n"))
	c2.Write([]byte("level=WARN msg=other\n"))
	want := "level=INFO msg=two\nlevel=WARN msg=\"same warning\" child=2\nlevel=INFO msg=one\nlevel=WARN msg=other\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// TestFleetConnsPerHost: a fleet larger than the default per-host control
// connection cap raises it for its agents (all on this host); a small one
// keeps the configured cap.
func TestFleetConnsPerHost(t *testing.T) {
	if n, raise := fleetConnsPerHost(2, 2, 64); raise {
		t.Fatalf("2 x 2 fleet raises the cap to %d", n)
	}
	if n, raise := fleetConnsPerHost(256, 4, 64); !raise || n != 520 {
		t.Fatalf("256 x 4 fleet: cap %d (raise %v), want 520", n, raise)
	}
	if _, raise := fleetConnsPerHost(256, 4, 1000); raise {
		t.Fatal("a configured cap above the fleet's need is lowered")
	}
}
