package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// twoHosts makes two network namespaces joined by a veth pair — the test's
// own hosts, 10.199.<n>.1 and 10.199.<n>.2 — and removes them at cleanup. It
// skips where namespaces cannot be made (not root, no iproute2, a sandbox
// that forbids them).
func twoHosts(t *testing.T) (nsA, nsB, ifA, ifB, ipA, ipB string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip(8): install iproute2")
	}
	id := os.Getpid() % 100000
	nsA, nsB = fmt.Sprintf("bnc-a-%d", id), fmt.Sprintf("bnc-b-%d", id)
	ifA, ifB = fmt.Sprintf("bva%d", id), fmt.Sprintf("bvb%d", id)
	n := id%250 + 1
	ipA, ipB = fmt.Sprintf("10.199.%d.1", n), fmt.Sprintf("10.199.%d.2", n)
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
	return nsA, nsB, ifA, ifB, ipA, ipB
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
		})
	}
}
