package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"

	"github.com/spf13/cobra"
)

var (
	cliOnce sync.Once
	cliPath string
	cliErr  error
)

// cliBinary builds the bounce binary once per test run, or returns the
// one BOUNCETEST_CLI names (a machine without a Go toolchain, the GPU
// host say, runs the test binary against a prebuilt bounce).
func cliBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("BOUNCETEST_CLI"); p != "" {
		return p
	}
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bounce-cli-")
		if err != nil {
			cliErr = err
			return
		}
		cliPath = filepath.Join(dir, "bounce")
		out, err := exec.Command("go", "build", "-o", cliPath, ".").CombinedOutput()
		if err != nil {
			cliErr = errors.New(string(out))
		}
	})
	if cliErr != nil {
		t.Fatalf("build bounce: %v", cliErr)
	}
	return cliPath
}

// bounce runs the binary and returns stdout, stderr and the exit code.
func bounce(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cliBinary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestRunTwoProcesses is the main job across two real OS processes for every
// engine and control plane pairing: both routes, verified by the receiver,
// and no warning in either process's log (ucx ended every run with the
// receiver's "peer endpoint failed ... Endpoint timeout" when the sender
// closed its engine).
func TestRunTwoProcesses(t *testing.T) {
	for _, tc := range []struct{ engine, control string }{
		{"tcp", "zmq"},
		{"tcp", "nixlnotif"},
		{"ucx", "zmq"},
		{"ucx", "nixlnotif"},
	} {
		t.Run(tc.engine+"+"+tc.control, func(t *testing.T) {
			out, errOut, code := bounce(t, "run", "--workload", "gptoss120b-tp8-b16", "--count", "4096", "--requests", "2",
				"--engine.kind", tc.engine, "--control-plane.kind", tc.control, "--bounce.arena-size", "32MiB", "--bounce.max-chunk", "4MiB")
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			for _, want := range []string{"warm-up: one unrecorded request per route", "bounce  ", "direct  ", "every byte verified", "bounce vs direct", "auto (took ", "route auto took "} {
				if !strings.Contains(out, want) {
					t.Fatalf("summary lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "FAILED") || strings.Contains(out, "asked") {
				t.Fatalf("a route failed or was rerouted:\n%s", out)
			}
			if strings.Contains(errOut, "level=WARN") || strings.Contains(errOut, "level=ERROR") {
				t.Fatalf("a clean run logged a warning:\n%s", errOut)
			}
		})
	}
}

// TestRunRepeatJSON: run --repeat moves every route's workload that many
// times, one row each, and --json writes the rows with the route asked,
// the one taken and a boolean verified.
func TestRunRepeatJSON(t *testing.T) {
	js := filepath.Join(t.TempDir(), "run.json")
	out, errOut, code := bounce(t, "run", "--workload", "gptoss120b-tp8-b16", "--count", "1024", "--repeat", "2", "--json", js, "--warm-up=false",
		"--bounce.arena-size", "16MiB", "--bounce.max-chunk", "2MiB")
	if code != 0 || !strings.Contains(out, "bounce #1") || !strings.Contains(out, "direct #1") || !strings.Contains(out, "every byte verified") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Rows []struct {
			Iteration int    `json:"iteration"`
			Asked     string `json:"route_asked"`
			Route     string `json:"route"`
			Bytes     uint64 `json:"bytes"`
			Verified  any    `json:"verified"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || len(doc.Rows) != 6 {
		t.Fatalf("%v: %s", err, b)
	}
	for i, r := range doc.Rows {
		asked := []string{"auto", "bounce", "direct"}[i%3]
		if r.Iteration != i/3 || r.Asked != asked || (asked != "auto" && r.Route != asked) || r.Bytes != 1024*2048 || r.Verified != true {
			t.Fatalf("row %d = %+v, want iteration %d asking %s, verified true", i, r, i/3, asked)
		}
	}
}

// TestRunInProcessEngine: an engine whose agents meet only within one
// process (loopback; cudacopy on a GPU) runs its receiver in-process, with
// the same verification (before, the child's separate fabric could not
// load the sender).
func TestRunInProcessEngine(t *testing.T) {
	out, errOut, code := bounce(t, "run", "--workload", "gptoss120b-tp8-b16", "--count", "2048", "--requests", "2",
		"--engine.kind", "loopback", "--control-plane.kind", "inproc", "--bounce.arena-size", "32MiB", "--bounce.max-chunk", "4MiB")
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "the receiver runs in this process") {
		t.Fatalf("stderr does not say the receiver runs in-process:\n%s", errOut)
	}
	for _, want := range []string{"bounce  ", "direct  ", "every byte verified"} {
		if !strings.Contains(out, want) {
			t.Fatalf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "asked") {
		t.Fatalf("a route was rerouted:\n%s", out)
	}
}

// TestServeSend runs the two-host flow on one machine: serve publishes its
// descriptor to a file and expects a workload, send loads the descriptor and
// moves it, and serve verifies every byte and exits 0.
func TestServeSend(t *testing.T) {
	dir := t.TempDir()
	desc := filepath.Join(dir, "recv.json")
	work := []string{"--workload", "llama70b-tp8-b16", "--count", "8192", "--requests", "2", "--seed", "5"}
	keyFile, allow := senderKey(t, dir, "send")
	serve := exec.Command(cliBinary(t), append([]string{"serve", "--agent.name", "recv", "--buffer-size", "64MiB", "--security.allowed-peers", allow,
		"--descriptor-out", desc, "--control-plane.bind-address", "127.0.0.1", "--expect", "--expect-wait", "60s"}, work...)...)
	var sout, serr syncBuffer
	serve.Stdout, serve.Stderr = &sout, &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer serve.Process.Kill()
	waitForFile(t, desc, &serr)
	// Route by the gates: this tests the serve/send flow on the bounce path;
	// route auto's cost model may send this box's tcp transfers direct.
	out, errOut, code := bounce(t, append([]string{"send", "--peer", desc, "--agent.name", "send", "--security.key-file", keyFile,
		"--control-plane.bind-address", "127.0.0.1", "--bounce.cost-model=false"}, work...)...)
	if code != 0 {
		t.Fatalf("send exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "bounce  ") {
		t.Fatalf("send did not take the bounce route:\n%s", out)
	}
	if err := serve.Wait(); err != nil {
		t.Fatalf("serve --expect: %v\nstdout:\n%s\nstderr:\n%s", err, sout.String(), serr.String())
	}
	if !strings.Contains(sout.String(), "verified: 2 request(s)") {
		t.Fatalf("serve did not report the verification:\n%s", sout.String())
	}
}

// TestServeExpectFails: a receiver that expects other bytes than it gets
// exits 1 naming the first wrong byte.
func TestServeExpectFails(t *testing.T) {
	dir := t.TempDir()
	desc := filepath.Join(dir, "recv.json")
	keyFile, allow := senderKey(t, dir, "send")
	serve := exec.Command(cliBinary(t), "serve", "--agent.name", "recv", "--buffer-size", "64MiB", "--descriptor-out", desc, "--security.allowed-peers", allow,
		"--control-plane.bind-address", "127.0.0.1", "--expect", "--expect-wait", "3s", "--workload", "gptoss120b-tp8-b16", "--count", "1024", "--seed", "1")
	var serr syncBuffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer serve.Process.Kill()
	waitForFile(t, desc, &serr)
	if _, errOut, code := bounce(t, "send", "--peer", desc, "--agent.name", "send", "--security.key-file", keyFile, "--control-plane.bind-address", "127.0.0.1",
		"--workload", "gptoss120b-tp8-b16", "--count", "1024", "--seed", "2"); code != 0 {
		t.Fatalf("send: exit %d: %s", code, errOut)
	}
	err := serve.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitFailed || !strings.Contains(serr.String(), "seed 1 block") {
		t.Fatalf("serve with the wrong seed: %v\n%s", err, serr.String())
	}
}

// senderKey creates the key file of a sender named name with `bounce key`
// and returns it with the allowed_peers value a receiver that never loads
// the sender's descriptor needs to admit it.
func senderKey(t *testing.T, dir, name string) (keyFile, allowedPeers string) {
	t.Helper()
	keyFile = filepath.Join(dir, name+".key")
	out, errOut, code := bounce(t, "key", "--security.key-file", keyFile, "--agent.name", name)
	if code != 0 || !strings.HasPrefix(out, name+"=") {
		t.Fatalf("bounce key: exit %d\n%s\n%s", code, out, errOut)
	}
	return keyFile, "loaded," + strings.TrimSpace(out)
}

func waitForFile(t *testing.T, path string, stderr fmt.Stringer) {
	t.Helper()
	waitForFileOf(t, path, stderr, nil)
}

// startServe starts 'bounce serve --descriptor-out desc args...', stops
// it when the test ends, and returns its stderr once its descriptor is
// out.
func startServe(t *testing.T, desc string, args ...string) *syncBuffer {
	t.Helper()
	serve := exec.Command(cliBinary(t), append([]string{"serve", "--descriptor-out", desc}, args...)...)
	serr := &syncBuffer{}
	serve.Stderr = serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = serve.Process.Kill()
		_ = serve.Wait()
	})
	waitForFile(t, desc, serr)
	return serr
}

// waitForFileOf waits for serve's descriptor line at path, failing at once
// if the serve process (exited, when given) ends first.
func waitForFileOf(t *testing.T, path string, stderr fmt.Stringer, exited <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			return
		}
		select {
		case <-exited:
			t.Fatalf("serve exited before publishing its descriptor; stderr:\n%s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve published no descriptor; stderr:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe to read while a child process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestPeerKilledMidTransfer: the receiver process is frozen mid-transfer and
// then killed; every request fails within the timeout, nothing hangs, and
// retirement reports the caller's buffers quiescent.
func TestPeerKilledMidTransfer(t *testing.T) {
	for _, engine := range []string{"tcp", "ucx"} {
		t.Run(engine, func(t *testing.T) {
			recv := exec.Command(cliBinary(t), "serve", "--stdin-control", "--agent.name", "victim", "--buffer-size", "256MiB",
				"--engine.kind", engine, "--control-plane.bind-address", "127.0.0.1", "--bounce.arena-size", "16MiB")
			stdout, _ := recv.StdoutPipe()
			stdin, _ := recv.StdinPipe()
			defer stdin.Close()
			if err := recv.Start(); err != nil {
				t.Fatal(err)
			}
			defer recv.Process.Kill()
			line, err := bufio.NewReader(stdout).ReadBytes('\n')
			if err != nil {
				t.Fatal(err)
			}
			var h hello
			if err := json.Unmarshal(line, &h); err != nil {
				t.Fatal(err)
			}
			blob, _ := base64.StdEncoding.DecodeString(h.Descriptor)

			cfg := config.Default()
			cfg.Agent.Name = "killer"
			cfg.Engine.Kind = engine
			cfg.ControlPlane.BindAddress = "127.0.0.1"
			cfg.Bounce.ArenaSize = 16 * config.MiB
			cfg.Bounce.RequestTimeout = 2 * time.Second
			n, err := node.Build(cfg, node.Builtin(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close(context.Background())
			if _, err := n.Agent.LoadPeer(blob); err != nil {
				t.Fatal(err)
			}
			spec := workload.Spec{DescSize: 4096, Count: 16384, Fragmented: true, Seed: 3}
			src, err := mem.Alloc(4 * spec.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			defer src.Free()
			if err := n.Agent.RegisterMemory(src.Desc()); err != nil {
				t.Fatal(err)
			}
			// Freeze the receiver, then kill it while the requests are stuck.
			if err := recv.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			time.AfterFunc(300*time.Millisecond, func() { recv.Process.Kill() })
			start := time.Now()
			var batches []*pipeline.Batch
			for i := 0; i < 4; i++ {
				s := spec
				s.Seed += uint64(i)
				sb, db := src.Desc(), transfer.Desc{Addr: h.BufferAddr, Len: h.BufferLen}
				sb.Addr += uint64(i) * spec.Bytes()
				db.Addr += uint64(i) * spec.Bytes()
				sd, dd := s.Descs(sb, db)
				b, err := n.Agent.Submit(pipeline.Request{Peer: h.Name, Src: sd, Dst: dd, Route: pipeline.RouteBounce})
				if err != nil {
					t.Fatal(err)
				}
				batches = append(batches, b)
			}
			requireFailedQuiescent(t, batches, "a killed peer")
			t.Logf("all 4 requests failed after %v: %v", time.Since(start).Round(time.Millisecond), batches[0].Err())
			recv.Wait()
			if err := n.Agent.CheckConservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestExitCodesAndConfig(t *testing.T) {
	if _, errOut, code := bounce(t, "run", "--workload", "no-such-model"); code != exitUsage || !strings.Contains(errOut, "llama70b-tp8-b16") {
		t.Fatalf("unknown workload: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := bounce(t, "config", "--bounce.max-inflight", "0"); code != exitUsage || !strings.Contains(errOut, "bounce.max_inflight") {
		t.Fatalf("out-of-range config: exit %d, stderr %q", code, errOut)
	}
	if _, errOut, code := bounce(t, "config", "--bounce.arena-size", "lots"); code != exitUsage || !strings.Contains(errOut, "lots") {
		t.Fatalf("unparsable size: exit %d, stderr %q", code, errOut)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "b.yaml")
	os.WriteFile(file, []byte("engine:\n  kind: ucx\nbounce:\n  arena_size: 64MiB\n"), 0o644)
	out, errOut, code := bounce(t, "config", "--config", file, "--engine.kind", "tcp")
	if code != 0 {
		t.Fatalf("config: exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "arena_size: 64MiB") {
		t.Fatalf("config output lacks the file's arena size:\n%s", out)
	}
	for key, src := range map[string]string{"bounce.arena_size": "file:" + file, "engine.kind": "flag:--engine.kind", "bounce.max_inflight": "default"} {
		if !hasSource(out, key, src) {
			t.Fatalf("config output does not attribute %s to %s:\n%s", key, src, out)
		}
	}
	os.WriteFile(file, []byte("engine:\n  kind: tcp\n  colour: blue\n"), 0o644)
	if _, errOut, code := bounce(t, "config", "--config", file); code != exitUsage || !strings.Contains(errOut, "engine.colour") {
		t.Fatalf("unknown key: exit %d, stderr %q", code, errOut)
	}
	if out, _, code := bounce(t, "version"); code != 0 || !strings.Contains(out, fmt.Sprintf("wire protocol %d", wireVersion())) {
		t.Fatalf("version: exit %d: %s", code, out)
	}
}

// hasSource reports whether the sources listing attributes key to src.
func hasSource(out, key, src string) bool {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "#" && f[1] == key && f[2] == src {
			return true
		}
	}
	return false
}

func TestConformanceCommand(t *testing.T) {
	dir := t.TempDir()
	junit, js := filepath.Join(dir, "r.xml"), filepath.Join(dir, "r.json")
	out, errOut, code := bounce(t, "conformance", "engine", "--builtin", "loopback", "--sizes", "1,4097,1MiB", "--junit", junit, "--json", js)
	if code != 0 || !strings.Contains(out, "engine/loopback: certified") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	var rep struct {
		Results []struct{ Rule, Outcome string }
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Results) < 20 {
		t.Fatalf("JSON report: %v, %d results", err, len(rep.Results))
	}
	if x, err := os.ReadFile(junit); err != nil || !bytes.Contains(x, []byte("<testsuite")) {
		t.Fatalf("JUnit report: %v %q", err, x)
	}
	if _, errOut, code := bounce(t, "conformance", "engine"); code != exitUsage || !strings.Contains(errOut, "--builtin") {
		t.Fatalf("no implementation named: exit %d: %s", code, errOut)
	}
	if out, _, code := bounce(t, "conformance", "--list"); code != 0 || !strings.Contains(out, "engine/done-means-landed") {
		t.Fatalf("--list: exit %d", code)
	}
}

// TestServeBadInterfaceFailsAtStart: a receiver whose control plane cannot
// bind the interface it was given exits with a usage error naming it, and
// publishes no descriptor (it would have served direct only).
func TestServeBadInterfaceFailsAtStart(t *testing.T) {
	desc := filepath.Join(t.TempDir(), "recv.json")
	_, errOut, code := bounce(t, "serve", "--agent.name", "recv", "--buffer-size", "1MiB", "--descriptor-out", desc,
		"--control-plane.interface", "nosuch0")
	if code != exitUsage || !strings.Contains(errOut, `interface "nosuch0"`) {
		t.Fatalf("exit %d, stderr:\n%s\nwant a usage error naming the interface", code, errOut)
	}
	if _, err := os.Stat(desc); !os.IsNotExist(err) {
		t.Fatalf("descriptor written by a receiver that failed to start: %v", err)
	}
}

// TestSendShowsFallback: a sender whose peer fails the handshake says so in
// its summary (auto), and fails with the reason when bounce is required.
func TestSendShowsFallback(t *testing.T) {
	dir := t.TempDir()
	desc := filepath.Join(dir, "recv.json")
	work := []string{"--workload", "gptoss120b-tp8-b16", "--count", "2048", "--seed", "3"}
	keyFile, allow := senderKey(t, dir, "send")
	startServe(t, desc, "--agent.name", "recv", "--buffer-size", "16MiB",
		"--security.allowed-peers", allow, "--control-plane.bind-address", "127.0.0.1", "--bounce.max-chunk", "4MiB")
	base := append([]string{"send", "--peer", desc, "--agent.name", "send", "--security.key-file", keyFile, "--control-plane.bind-address", "127.0.0.1"}, work...)
	out, errOut, code := bounce(t, base...)
	if code != 0 || !strings.Contains(out, "1 of 1 request(s) fell back to the direct path") || !strings.Contains(out, "max chunk 8 MiB here vs 4 MiB on recv") {
		t.Fatalf("auto: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "level=WARN") || !strings.Contains(errOut, "max chunk 8 MiB here vs 4 MiB on recv") {
		t.Fatalf("auto: no warning naming the reason:\n%s", errOut)
	}
	out, errOut, code = bounce(t, append(base, "--route", "bounce")...)
	if code == 0 || !strings.Contains(out+errOut, "bounce route unavailable") || !strings.Contains(out+errOut, "max chunk 8 MiB here vs 4 MiB on recv") {
		t.Fatalf("route bounce: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestServeRefusesSmallBufferBeforePublishing: an explicit --buffer-size
// below what --expect needs is a usage error, and no descriptor is written.
func TestServeRefusesSmallBufferBeforePublishing(t *testing.T) {
	desc := filepath.Join(t.TempDir(), "recv.json")
	_, errOut, code := bounce(t, "serve", "--agent.name", "recv", "--buffer-size", "1GiB", "--descriptor-out", desc,
		"--control-plane.bind-address", "127.0.0.1", "--expect", "--requests", "8")
	if code != exitUsage || !strings.Contains(errOut, "--buffer-size 1GiB is smaller than the 2560MiB --expect needs (8 request(s) x 320MiB)") {
		t.Fatalf("exit %d:\n%s", code, errOut)
	}
	if _, err := os.Stat(desc); !os.IsNotExist(err) {
		t.Fatalf("descriptor written before validation: %v", err)
	}
}

// TestSendRepeatJSON: send --repeat writes one row per repetition, with
// bytes per second named so and booleans as booleans.
func TestSendRepeatJSON(t *testing.T) {
	dir := t.TempDir()
	desc, js := filepath.Join(dir, "recv.json"), filepath.Join(dir, "send.json")
	keyFile, allow := senderKey(t, dir, "send")
	serr := startServe(t, desc, "--agent.name", "recv", "--buffer-size", "8MiB",
		"--security.allowed-peers", allow, "--control-plane.bind-address", "127.0.0.1")
	out, errOut, code := bounce(t, "send", "--peer", desc, "--agent.name", "send", "--security.key-file", keyFile, "--control-plane.bind-address", "127.0.0.1",
		"--workload", "gptoss120b-tp8-b16", "--count", "2048", "--repeat", "3", "--json", js, "--bounce.cost-model=false") // bounce rows, by the gates
	if code != 0 || !strings.Contains(out, "warm-up: one unrecorded request moved first") || !strings.Contains(out, "bounce #2") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Fragmented *bool `json:"fragmented"`
		Rows       []struct {
			Route          string  `json:"route"`
			Bytes          uint64  `json:"bytes"`
			BytesPerSecond float64 `json:"bytes_per_second"`
			Verified       any     `json:"verified"`
			NotVerified    string  `json:"not_verified"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(b, &doc); err != nil || doc.Fragmented == nil || !*doc.Fragmented || len(doc.Rows) != 3 {
		t.Fatalf("%v: %s", err, b)
	}
	for _, r := range doc.Rows {
		if r.Route != "bounce" || r.Bytes != 2048*2048 || r.BytesPerSecond <= 0 || r.Verified != false || !strings.Contains(r.NotVerified, "bounce serve --expect") {
			t.Fatalf("row %+v", r)
		}
	}
	// Each of the 4 requests (warm-up included) was announced by the receiver.
	eventually := time.Now().Add(5 * time.Second)
	for strings.Count(serr.String(), "received: peer=send") < 4 && time.Now().Before(eventually) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := strings.Count(serr.String(), "received: peer=send"); n != 4 {
		t.Fatalf("%d receive events, want 4:\n%s", n, serr.String())
	}
}

// TestServeHearsDirectOnlySender: a receiver with bounce off (so the sender
// has no control path to it: no handshake) still prints one received line
// per request, route direct, from the engine notification the sender's
// agent sends when each direct write is Done (real processes, tcp engines).
func TestServeHearsDirectOnlySender(t *testing.T) {
	dir := t.TempDir()
	desc := filepath.Join(dir, "recv.json")
	keyFile, allow := senderKey(t, dir, "send")
	serr := startServe(t, desc, "--agent.name", "recv", "--buffer-size", "8MiB",
		"--security.allowed-peers", allow, "--control-plane.bind-address", "127.0.0.1", "--bounce.enabled=false")
	out, errOut, code := bounce(t, "send", "--peer", desc, "--agent.name", "send", "--security.key-file", keyFile, "--control-plane.bind-address", "127.0.0.1",
		"--workload", "gptoss120b-tp8-b16", "--count", "1024", "--requests", "3", "--warm-up=false")
	if code != 0 || !strings.Contains(out, "direct") {
		t.Fatalf("send: exit %d\n%s\n%s", code, out, errOut)
	}
	const line = "bytes=2097152 route=direct"
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(serr.String(), line) < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := strings.Count(serr.String(), line); n != 3 || strings.Count(serr.String(), "received: peer=send") != 3 {
		t.Fatalf("%d direct receive events from send, want 3:\n%s", n, serr.String())
	}
}

// TestHelpExamplesParse: every example in every command's help names flags
// that command has (the run help once showed a --no-compare that does not
// exist).
func TestHelpExamplesParse(t *testing.T) {
	root := newRoot(strings.NewReader(""), io.Discard, io.Discard)
	var walk func(c *cobra.Command)
	checked := 0
	walk = func(c *cobra.Command) {
		var lines []string
		cur := ""
		for _, l := range strings.Split(c.Example, "\n") {
			l = strings.TrimSpace(l)
			if i := strings.Index(l, " #"); i >= 0 {
				l = strings.TrimSpace(l[:i])
			}
			if strings.HasSuffix(l, "\\") {
				cur += strings.TrimSuffix(l, "\\") + " "
				continue
			}
			lines = append(lines, cur+l)
			cur = ""
		}
		for _, l := range lines {
			fields := strings.Fields(l)
			for len(fields) > 0 && strings.Contains(fields[0], "=") { // VAR=value prefixes
				fields = fields[1:]
			}
			if len(fields) < 2 || fields[0] != "bounce" {
				continue
			}
			cmd, rest, err := root.Find(fields[1:])
			if err != nil || cmd != c {
				continue // an example of another command
			}
			fresh, _, _ := newRoot(strings.NewReader(""), io.Discard, io.Discard).Find(fields[1:])
			if err := fresh.ParseFlags(rest); err != nil {
				t.Errorf("%s help example %q: %v", c.CommandPath(), l, err)
			}
			checked++
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if checked < 10 {
		t.Fatalf("only %d examples checked", checked)
	}
}

func TestComponentsAndUnavailableKinds(t *testing.T) {
	out, errOut, code := bounce(t, "components")
	if code != 0 || !strings.Contains(out, "engine         nixl") || !strings.Contains(out, "-tags nixl") || !strings.Contains(out, "engine         tcp        engine.kind         yes") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	_, errOut, code = bounce(t, "config", "--engine.kind", "nixl")
	if code != exitUsage || !strings.Contains(errOut, `engine.kind "nixl" is unavailable`) {
		t.Fatalf("config with nixl: exit %d\n%s", code, errOut)
	}
	_, errOut, code = bounce(t, "config", "--log.format", "xml")
	if code != exitUsage || !strings.Contains(errOut, `log.format="xml"`) {
		t.Fatalf("config with log.format xml: exit %d\n%s", code, errOut)
	}
	_, errOut, code = bounce(t, "config", "--bounce.arena-sise", "1GiB")
	if code != exitUsage || !strings.Contains(errOut, `did you mean "--bounce.arena-size"?`) {
		t.Fatalf("misspelt flag: exit %d\n%s", code, errOut)
	}
}

// requireFailedQuiescent waits (30 s at most) for every batch sent to the
// peer what names, and requires each to fail retired and quiescent — every
// gather finished before the failure was published and the engine's writes
// are terminal, so the caller's buffers are provably untouched — and to be
// released.
func requireFailedQuiescent(t *testing.T, batches []*pipeline.Batch, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, b := range batches {
		err := b.Wait(ctx)
		if ctx.Err() != nil {
			t.Fatalf("request %d to %s did not resolve within 30s", i, what)
		}
		if err == nil {
			t.Fatalf("request %d to %s succeeded", i, what)
		}
		if retired, quiescent := b.Retirement(); !retired || !quiescent {
			t.Fatalf("request %d: retirement = (%v, %v), want (true, true); err %v", i, retired, quiescent, err)
		}
		if err := b.Release(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestServeRefusesUnmappableArena: serve builds its node strict (bounce
// must be served, or serve fails), so an arena that cannot be mapped (here
// a file-size limit of 128 MiB below the 256 MiB default arena, which the
// 64 MiB buffer fits) makes it refuse to start with exit 3 (the
// environment) and the reason, instead of serving direct only.
func TestServeRefusesUnmappableArena(t *testing.T) {
	dir := t.TempDir()
	desc := filepath.Join(dir, "recv.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", `ulimit -f 131072 && exec "$0" "$@"`, cliBinary(t), "serve",
		"--descriptor-out", desc, "--buffer-size", "64MiB", "--control-plane.bind-address", "127.0.0.1", "--engine.listen", "127.0.0.1:0")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitRuntime {
		b, _ := os.ReadFile(desc)
		t.Fatalf("serve with an unmappable arena: %v, want exit %d\ndescriptor: %s\nstderr:\n%s", err, exitRuntime, b, errb.String())
	}
	if !strings.Contains(errb.String(), "arena") || !strings.Contains(errb.String(), "file too large") {
		t.Fatalf("the error does not name the arena and why:\n%s", errb.String())
	}
	if _, err := os.Stat(desc); err == nil {
		t.Fatal("serve published a descriptor")
	}
}
