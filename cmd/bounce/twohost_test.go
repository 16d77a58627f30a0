package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/benchreport"
)

// twoHosts makes two network namespaces joined by a veth pair — the test's
// own hosts, 10.199.<n>.1 and 10.199.<n>.2 — and removes them at cleanup. It
// skips where namespaces cannot be made (not root, no iproute2, a sandbox
// that forbids them).
func twoHosts(t *testing.T) (nsA, nsB, ifA, ifB, ipA, ipB string) {
	t.Helper()
	id := os.Getpid() % 100000
	n := id%250 + 1
	ifA, ifB = fmt.Sprintf("bva%d", id), fmt.Sprintf("bvb%d", id)
	ipA, ipB = fmt.Sprintf("10.199.%d.1", n), fmt.Sprintf("10.199.%d.2", n)
	nsA, nsB = twoHostsWith(t, "", ifA, ifB, ipA, ipB)
	return nsA, nsB, ifA, ifB, ipA, ipB
}

// twoHostsWith is twoHosts with the interface names and addresses given
// (each namespace has its own, so eth0 on both sides is fine); tag tells
// the namespaces of several calls in one process apart.
func twoHostsWith(t *testing.T, tag, ifA, ifB, ipA, ipB string) (nsA, nsB string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip(8): install iproute2")
	}
	id := os.Getpid() % 100000
	nsA, nsB = fmt.Sprintf("bnc-a%s-%d", tag, id), fmt.Sprintf("bnc-b%s-%d", tag, id)
	run := func(args ...string) error {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("netns", "add", nsA); err != nil {
		t.Skipf("cannot make a network namespace here: %v", err)
	}
	t.Cleanup(func() { run("netns", "del", nsA) })
	if err := run("netns", "add", nsB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run("netns", "del", nsB) })
	for _, args := range [][]string{
		{"link", "add", ifA, "netns", nsA, "type", "veth", "peer", "name", ifB, "netns", nsB},
		{"-n", nsA, "addr", "add", ipA + "/24", "dev", ifA},
		{"-n", nsB, "addr", "add", ipB + "/24", "dev", ifB},
		{"-n", nsA, "link", "set", ifA, "up"},
		{"-n", nsB, "link", "set", ifB, "up"},
		{"-n", nsA, "link", "set", "lo", "up"},
		{"-n", nsB, "link", "set", "lo", "up"},
	} {
		if err := run(args...); err != nil {
			t.Fatal(err)
		}
	}
	// Engines enumerate devices with a carrier only (UCX says "No such
	// device" otherwise): wait until both ends of the pair are up.
	for _, l := range [][2]string{{nsA, ifA}, {nsB, ifB}} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, _ := exec.Command("ip", "-n", l[0], "link", "show", "dev", l[1]).CombinedOutput()
			if strings.Contains(string(out), "LOWER_UP") && strings.Contains(string(out), "state UP") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("link %s in %s never came up: %s", l[1], l[0], out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nsA, nsB
}

// TestTwoHosts moves a verified workload between two hosts (network
// namespaces): the receiver binds its engine and its control plane on its
// own interface, the sender on its own, and only the descriptor line crosses
// between them out of band.
func TestTwoHosts(t *testing.T) {
	nsA, nsB, ifA, ifB, ipA, ipB := twoHosts(t)
	bin := cliBinary(t)
	for _, engine := range []string{"tcp", "ucx"} {
		t.Run(engine, func(t *testing.T) {
			dir := t.TempDir()
			desc := filepath.Join(dir, "recv.json")
			keyFile, allow := senderKey(t, dir, "host-a")
			work := []string{"--workload", "llama70b-tp8-b16", "--count", "8192", "--requests", "2", "--seed", "11"}
			common := []string{"--engine.kind", engine, "--bounce.arena-size", "32MiB", "--bounce.max-chunk", "4MiB"}
			serve := exec.Command("ip", append(append([]string{"netns", "exec", nsB, bin, "serve", "--agent.name", "host-b",
				"--engine.listen", ipB + ":0", "--control-plane.interface", ifB, "--buffer-size", "64MiB",
				"--descriptor-out", desc, "--security.allowed-peers", allow, "--expect", "--expect-wait", "90s"}, common...), work...)...)
			serve.Env = append(os.Environ(), "UCX_NET_DEVICES="+ifB, "UCX_TLS=tcp")
			var sout, serr syncBuffer
			serve.Stdout, serve.Stderr = &sout, &serr
			if err := serve.Start(); err != nil {
				t.Fatal(err)
			}
			defer serve.Process.Kill()
			exited := make(chan struct{})
			var serveErr error
			go func() { serveErr = serve.Wait(); close(exited) }()
			waitForFileOf(t, desc, &serr, exited)
			b, _ := os.ReadFile(desc)
			if !strings.Contains(string(b), `"bounce":true`) {
				t.Fatalf("receiver offers no bounce path: %s\n%s", b, serr.String())
			}
			send := exec.Command("ip", append(append([]string{"netns", "exec", nsA, bin, "send", "--peer", desc, "--agent.name", "host-a", "--security.key-file", keyFile,
				"--engine.listen", ipA + ":0", "--control-plane.interface", ifA, "--route", "bounce"}, common...), work...)...)
			send.Env = append(os.Environ(), "UCX_NET_DEVICES="+ifA, "UCX_TLS=tcp")
			out, err := send.CombinedOutput()
			if err != nil {
				t.Fatalf("send: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "bounce  ") {
				t.Fatalf("send did not take the bounce route:\n%s", out)
			}
			select {
			case <-exited:
			case <-time.After(2 * time.Minute):
				t.Fatal("the receiver on host B never finished verifying")
			}
			if serveErr != nil || !strings.Contains(sout.String(), "verified: 2 request(s)") {
				t.Fatalf("receiver on host B: %v\nstdout:\n%s\nstderr:\n%s", serveErr, sout.String(), serr.String())
			}
			// The receiver was told of each request, by its tag.
			for _, tag := range []string{"req-0", "req-1"} {
				if !strings.Contains(serr.String(), "received: peer=host-a request=") || !strings.Contains(serr.String(), `tag="`+tag+`" bytes=33554432 route=bounce`) {
					t.Fatalf("receiver printed no completion event for %s:\n%s", tag, serr.String())
				}
			}
		})
	}
}

// readmeMarked returns the commands of the README block between the
// <!-- marker --> and <!-- /marker --> lines, one argv per command,
// continuation lines joined.
func readmeMarked(t *testing.T, marker string) [][]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(b), "<!-- "+marker+" -->")
	block, _, ok2 := strings.Cut(block, "<!-- /"+marker+" -->")
	if !ok || !ok2 {
		t.Fatalf("README.md has no %s block", marker)
	}
	return shellCommands(block)
}

// shellCommands splits the lines of a README sh block into commands: one
// argv per command, continuation lines joined, fences, blank lines and
// comments dropped.
func shellCommands(block string) [][]string {
	var cmds [][]string
	var cur []string
	for _, line := range strings.Split(block, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "```") || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.Index(line, " #"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		cont := strings.HasSuffix(line, "\\")
		cur = append(cur, strings.Fields(strings.TrimSuffix(line, "\\"))...)
		if !cont {
			cmds = append(cmds, cur)
			cur = nil
		}
	}
	return cmds
}

// readmeTwoHosts returns the two-host commands of the README (key, serve,
// send).
func readmeTwoHosts(t *testing.T) [][]string {
	t.Helper()
	cmds := readmeMarked(t, "two-hosts")
	if len(cmds) != 3 || cmds[0][0] != "bin/bounce" || cmds[0][1] != "key" || cmds[1][1] != "serve" || cmds[2][1] != "send" {
		t.Fatalf("README two-hosts block is not 'bin/bounce key ...', 'bin/bounce serve ...' then 'bin/bounce send ...': %q", cmds)
	}
	return cmds
}

// TestReadmeTwoHosts runs the README's two-host commands exactly as printed
// (bin/bounce is this build), host B and host A being network namespaces
// with eth0 at 10.0.0.2 and 10.0.0.1, sharing only the directory recv.json
// is written to (the copy between hosts). Nothing is added to them: the
// route is whichever route auto takes, and every byte is verified on B.
func TestReadmeTwoHosts(t *testing.T) {
	cmds := readmeTwoHosts(t)
	nsA, nsB := twoHostsWith(t, "r", "eth0", "eth0", "10.0.0.1", "10.0.0.2")
	bin := cliBinary(t)
	dir := t.TempDir()
	in := inNamespace(bin, dir)
	out, serr := keyServeSend(t, in, nsA, nsB, dir, cmds)
	if !strings.Contains(string(out), "bounce  ") && !strings.Contains(string(out), "direct  ") {
		t.Fatalf("send printed no route line:\n%s", out)
	}
	if n := strings.Count(serr, "received: peer="); n < 8 {
		t.Fatalf("receiver printed %d completion events, want at least 8:\n%s", n, serr)
	}
	t.Logf("send:\n%s", out)
}

// keyServeSend runs a two-host block's commands (in runs one in a host's
// namespace, in dir): the key on host A (its line reaches B through dir),
// serve on host B, send on host A; serve must exit having verified the 8
// requests. It returns send's output and serve's stderr.
func keyServeSend(t *testing.T, in func(ns string, argv []string) *exec.Cmd, nsA, nsB, dir string, cmds [][]string) (sendOut []byte, serveStderr string) {
	t.Helper()
	if out, err := in(nsA, cmds[0]).CombinedOutput(); err != nil {
		t.Fatalf("key: %v\n%s", err, out)
	}
	serve := in(nsB, cmds[1])
	var sout, serr syncBuffer
	serve.Stdout, serve.Stderr = &sout, &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer serve.Process.Kill()
	exited := make(chan struct{})
	var serveErr error
	go func() { serveErr = serve.Wait(); close(exited) }()
	waitForFileOf(t, filepath.Join(dir, "recv.json"), &serr, exited)
	out, err := in(nsA, cmds[2]).CombinedOutput()
	if err != nil {
		t.Fatalf("send: %v\n%s\nserve stderr:\n%s", err, out, serr.String())
	}
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("the receiver never finished verifying")
	}
	if serveErr != nil || !strings.Contains(sout.String(), "verified: 8 request(s)") {
		t.Fatalf("receiver: %v\nstdout:\n%s\nstderr:\n%s", serveErr, sout.String(), serr.String())
	}
	return out, serr.String()
}

// TestReadmeBenchPeer runs the README's bench-peer block as printed: host
// A's key from the two-hosts block, a plain 'bounce serve' on host B
// admitting it, and 'bench --peer' on host A knowing only B's descriptor
// file. The report marks the cells unverified (B runs elsewhere) and B
// announces every request: 2 warm-ups and 1 + 4 per route.
func TestReadmeBenchPeer(t *testing.T) {
	key := readmeTwoHosts(t)[0]
	cmds := readmeMarked(t, "bench-peer")
	if len(cmds) != 2 || cmds[0][1] != "serve" || cmds[1][1] != "bench" {
		t.Fatalf("README bench-peer block is not 'bin/bounce serve ...' then 'bin/bounce bench ...': %q", cmds)
	}
	nsA, nsB := twoHostsWith(t, "p", "eth0", "eth0", "10.0.0.1", "10.0.0.2")
	bin := cliBinary(t)
	dir := t.TempDir()
	in := inNamespace(bin, dir)
	if out, err := in(nsA, key).CombinedOutput(); err != nil {
		t.Fatalf("key: %v\n%s", err, out)
	}
	serve := in(nsB, cmds[0])
	var serr syncBuffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	waitForFileOf(t, filepath.Join(dir, "recv.json"), &serr, nil)
	out, err := in(nsA, cmds[1]).CombinedOutput()
	if err != nil {
		t.Fatalf("bench --peer: %v\n%s\nserve:\n%s", err, out, serr.String())
	}
	for _, want := range []string{"bounce", "direct", "runs elsewhere (--peer)", "receiver not measured"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("bench --peer printed no %q:\n%s", want, out)
		}
	}
	if n := strings.Count(string(out), "note: --peer:"); n != 1 || strings.Contains(string(out), "receiver 0B") || strings.Contains(string(out), "receiver -") {
		t.Fatalf("bench --peer: the --peer note %d times, or the remote receiver's memory as measured:\n%s", n, out)
	}
	if n := strings.Count(serr.String(), "received: peer=host-a"); n < 12 { // 2 warm-ups + 2 routes x (1 + 4)
		t.Fatalf("the remote receiver announced %d requests, want at least 12:\n%s", n, serr.String())
	}
	t.Logf("bench --peer:\n%s", out)
}

// TestBenchPeerTwoHosts: bench --peer measures against a plain 'bounce
// serve' on another host (network namespace), knowing only its descriptor
// line; the JSON report names the remote receiver and marks the cells
// unverified.
func TestBenchPeerTwoHosts(t *testing.T) {
	nsA, nsB := twoHostsWith(t, "p", "eth0", "eth0", "10.0.9.1", "10.0.9.2")
	bin := cliBinary(t)
	dir := t.TempDir()
	desc, js := filepath.Join(dir, "recv.json"), filepath.Join(dir, "bench.json")
	keyFile, allow := senderKey(t, dir, "prefill-0")
	serve := exec.Command("ip", "netns", "exec", nsB, bin, "serve", "--agent.name", "decode-0", "--buffer-size", "64MiB",
		"--security.allowed-peers", allow, "--engine.listen", "10.0.9.2:0", "--control-plane.interface", "eth0", "--descriptor-out", desc)
	var serr syncBuffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	waitForFileOf(t, desc, &serr, nil)
	out, err := exec.Command("ip", "netns", "exec", nsA, bin, "bench", "--peer", desc, "--agent.name", "prefill-0", "--security.key-file", keyFile,
		"--engine.listen", "10.0.9.1:0", "--control-plane.interface", "eth0",
		"--workload", "gptoss120b-tp8-b16", "--count", "4096", "--concurrency", "1,4", "--repeat", "1",
		"--routes", "bounce,direct", "--json", js).CombinedOutput()
	if err != nil {
		t.Fatalf("bench --peer: %v\n%s\nserve:\n%s", err, out, serr.String())
	}
	rep, err := benchreport.LoadJSON(js)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Config.Peer != "decode-0" || len(rep.Cells) != 4 {
		t.Fatalf("peer %q, %d cells:\n%s", rep.Config.Peer, len(rep.Cells), out)
	}
	for _, c := range rep.Cells {
		if c.Failed != 0 || c.Took != c.Route || c.Verified || c.NotVerified != `the receiver "decode-0" runs elsewhere (--peer)` || c.Bytes != uint64(c.Concurrency)*4096*2048 {
			t.Fatalf("cell %+v\n%s", c, out)
		}
	}
	if n := strings.Count(serr.String(), "received: peer=prefill-0"); n < 10 { // 2 warm-ups + 2 x (1 + 4)
		t.Fatalf("the remote receiver announced %d requests, want at least 10:\n%s", n, serr.String())
	}
}

// inNamespace returns what runs a README command (argv[0] is its
// bin/bounce) in a host's network namespace, in dir, with bin (this build)
// in place of argv[0].
func inNamespace(bin, dir string) func(ns string, argv []string) *exec.Cmd {
	return func(ns string, argv []string) *exec.Cmd {
		c := exec.Command("ip", append([]string{"netns", "exec", ns, bin}, argv[1:]...)...)
		c.Dir = dir
		return c
	}
}
