package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExitCodeEnvironment: an address the agent cannot have is the
// environment failing (exit 3), naming the address: the engine's listen
// port in use, the metrics port in use, and an address not on this host.
func TestExitCodeEnvironment(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	used := l.Addr().String()
	base := []string{"serve", "--buffer-size", "1MiB", "--control-plane.bind-address", "127.0.0.1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--engine.listen", used}, "address already in use"},
		{[]string{"--telemetry.metrics.listen", used}, "address already in use"},
		{[]string{"--engine.listen", "192.0.2.1:0"}, "cannot assign requested address"}, // TEST-NET-1: on no host
	} {
		_, errs, code := bounce(t, append(base, tc.args...)...)
		if code != exitRuntime || !strings.Contains(errs, tc.want) || !strings.Contains(errs, tc.args[1]) {
			t.Errorf("serve %s: exit %d, stderr %q; want exit %d naming %s (%s)", strings.Join(tc.args, " "), code, errs, exitRuntime, tc.args[1], tc.want)
		}
	}
}

// TestExitCodeBadKeyFile: a key file that does not parse, or that others
// may read, is bad configuration (exit 2) for every command that reads
// it — key, serve and send alike — naming the file.
func TestExitCodeBadKeyFile(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.key")
	if err := os.WriteFile(garbage, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.key")
	if _, _, code := bounce(t, "key", "--security.key-file", open, "--agent.name", "x"); code != 0 {
		t.Fatal("key: could not make a key file")
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	// A real receiver's descriptor, so send reaches its key file.
	desc := filepath.Join(dir, "recv.json")
	startServe(t, desc, "--buffer-size", "1MiB", "--control-plane.bind-address", "127.0.0.1")
	for _, kf := range []struct{ path, want string }{{garbage, "line 1"}, {open, "chmod 600"}} {
		for _, args := range [][]string{
			{"key", "--agent.name", "x"},
			{"serve", "--buffer-size", "1MiB", "--control-plane.bind-address", "127.0.0.1"},
			{"send", "--peer", desc, "--count", "16", "--control-plane.bind-address", "127.0.0.1"},
		} {
			_, errs, code := bounce(t, append(args, "--security.key-file", kf.path)...)
			if code != exitUsage || !strings.Contains(errs, kf.path) || !strings.Contains(errs, kf.want) {
				t.Errorf("%s with %s: exit %d, stderr %q; want exit %d naming the file (%s)", args[0], filepath.Base(kf.path), code, errs, exitUsage, kf.want)
			}
		}
	}
}
