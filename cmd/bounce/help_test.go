package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// helpExamples returns the commands of `bounce <cmd> --help`'s Examples
// section as this build prints them, one argv per command (continuation
// lines joined, comment lines skipped), "bounce" replaced by bin.
func helpExamples(t *testing.T, bin, cmd string) [][]string {
	t.Helper()
	out, err := exec.Command(bin, cmd, "--help").Output()
	if err != nil {
		t.Fatalf("%s --help: %v", cmd, err)
	}
	_, block, ok := strings.Cut(string(out), "\nExamples:\n")
	if !ok {
		t.Fatalf("%s --help has no Examples section:\n%s", cmd, out)
	}
	block, _, _ = strings.Cut(block, "\n\n")
	var cmds [][]string
	var cur []string
	for _, line := range strings.Split(block, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cont := strings.HasSuffix(line, "\\")
		cur = append(cur, strings.Fields(strings.TrimSuffix(line, "\\"))...)
		if !cont {
			if cur[0] != "bounce" {
				t.Fatalf("%s --help example %q does not start with bounce", cmd, cur)
			}
			cur[0] = bin
			cmds = append(cmds, cur)
			cur = nil
		}
	}
	return cmds
}

// TestServeHelpExamples runs `bounce serve --help`'s examples exactly as
// printed, under the default security mode, host A and host B being network
// namespaces with eth0 at 10.0.0.1 and 10.0.0.2 that share the directory the
// key line and recv.json are written to (the copies between hosts): the
// receiver verifies every byte.
func TestServeHelpExamples(t *testing.T) {
	bin := cliBinary(t)
	cmds := helpExamples(t, bin, "serve")
	if len(cmds) != 3 || cmds[0][1] != "key" || cmds[1][1] != "serve" || cmds[2][1] != "send" {
		t.Fatalf("serve --help examples are not key, serve, send: %q", cmds)
	}
	nsA, nsB := twoHostsWith(t, "h", "eth0", "eth0", "10.0.0.1", "10.0.0.2")
	dir := t.TempDir()
	in := func(ns string, argv []string) *exec.Cmd {
		c := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
		c.Dir = dir
		return c
	}
	keyServeSend(t, in, nsA, nsB, dir, cmds)
}

// TestSendHelpExamples runs `bounce send --help`'s file examples exactly as
// printed, under the default security mode, in host A's network namespace,
// against a plain `bounce serve` in host B's that admits host A's key (the
// key line made as the comment above them says). The etcd example, which
// needs an etcd and a receiver named decode-0, is not run here.
func TestSendHelpExamples(t *testing.T) {
	bin := cliBinary(t)
	cmds := helpExamples(t, bin, "send")
	var file [][]string
	for _, c := range cmds {
		if !strings.Contains(strings.Join(c, " "), "discovery.kind etcd") {
			file = append(file, c)
		}
	}
	if len(file) != 2 {
		t.Fatalf("send --help has %d examples with a descriptor file, want 2: %q", len(file), cmds)
	}
	nsA, nsB := twoHostsWith(t, "s", "eth0", "eth0", "10.0.0.1", "10.0.0.2")
	// Host A has a default route, as a host does: send, which names no
	// interface, binds its control plane on the egress address.
	if out, err := exec.Command("ip", "-n", nsA, "route", "add", "default", "via", "10.0.0.2", "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("default route: %v\n%s", err, out)
	}
	dir := t.TempDir()
	in := func(ns string, argv ...string) *exec.Cmd {
		c := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
		c.Dir = dir
		return c
	}
	if out, err := in(nsA, bin, "key", "--security.key-file", "a.key", "--agent.name", "host-a", "--out", "host-a.peer").CombinedOutput(); err != nil {
		t.Fatalf("key: %v\n%s", err, out)
	}
	serve := in(nsB, bin, "serve", "--engine.listen", "10.0.0.2:7000", "--control-plane.interface", "eth0",
		"--security.allowed-peers", "@host-a.peer", "--descriptor-out", "recv.json")
	var serr syncBuffer
	serve.Stderr = &serr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer serve.Process.Kill()
	exited := make(chan struct{})
	go func() { serve.Wait(); close(exited) }()
	waitForFileOf(t, filepath.Join(dir, "recv.json"), &serr, exited)
	for _, c := range file {
		out, err := in(nsA, c...).CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s\nserve stderr:\n%s", c[1:], err, out, serr.String())
		}
		if !strings.Contains(string(out), "bounce ") || strings.Contains(string(out), "fell back") {
			t.Fatalf("%q did not take the bounce route:\n%s", c[1:], out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "send.json")); err != nil {
		t.Fatalf("the --json example wrote no send.json: %v", err)
	}
}
