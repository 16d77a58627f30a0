package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/node"
)

// readmeShellBlocks returns the README's ```sh blocks, each split into
// commands (shellCommands).
func readmeShellBlocks(t *testing.T) [][][]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][][]string
	rest := string(b)
	for {
		_, after, ok := strings.Cut(rest, "\n```sh\n")
		if !ok {
			return blocks
		}
		block, tail, ok := strings.Cut(after, "\n```\n")
		if !ok {
			t.Fatal("README.md: an unterminated ```sh block")
		}
		blocks = append(blocks, shellCommands(block))
		rest = "\n" + tail
	}
}

// readmeYAML is the README's configuration reference block, the file its
// `bounce config --config bounce.yaml` line reads.
func readmeYAML(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "\n```yaml\n")
	block, _, ok2 := strings.Cut(after, "\n```\n")
	if !ok || !ok2 {
		t.Fatal("README.md has no yaml block")
	}
	return []byte(block + "\n")
}

// TestReadmeCommands checks every bounce command line of the README's sh
// blocks as printed: the subcommand exists, its flags parse, its arguments
// are accepted, and its configuration (with the block's exported BOUNCE_*
// variables, and the README's YAML block as bounce.yaml) loads with kinds
// this build has. The two-host blocks also run (TestReadmeTwoHosts,
// TestReadmeBenchPeer), and so do the cheap ones here: components, key and
// config.
func TestReadmeCommands(t *testing.T) {
	dir := t.TempDir()
	yamlPath := filepath.Join(dir, "bounce.yaml")
	if err := os.WriteFile(yamlPath, readmeYAML(t), 0o644); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for bi, block := range readmeShellBlocks(t) {
		var environ []string
		for _, argv := range block {
			if argv[0] == "export" {
				environ = append(environ, argv[1:]...)
				continue
			}
			// Leading VAR=value assignments apply to the one command.
			env := environ
			for len(argv) > 0 && strings.Contains(argv[0], "=") && strings.HasPrefix(argv[0], config.EnvPrefix) {
				env = append(env[:len(env):len(env)], argv[0])
				argv = argv[1:]
			}
			if len(argv) == 0 || (argv[0] != "bin/bounce" && argv[0] != "bounce") {
				continue // make, curl
			}
			line := strings.Join(argv, " ")
			checked++
			root := newRoot(strings.NewReader(""), io.Discard, io.Discard)
			cmd, rest, err := root.Find(argv[1:])
			if err != nil || cmd == root {
				t.Errorf("README sh block %d: %q: no such command: %v", bi+1, line, err)
				continue
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Errorf("README sh block %d: %q: %v", bi+1, line, err)
				continue
			}
			if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
				t.Errorf("README sh block %d: %q: %v", bi+1, line, err)
				continue
			}
			if cmd.Flags().Lookup("config") == nil {
				continue
			}
			file := cmd.Flags().Lookup("config").Value.String()
			opts := config.LoadOptions{Environ: env, Flags: cmd.Flags()}
			if file == "bounce.yaml" {
				opts.File = yamlPath
			}
			l, err := config.Load(opts)
			if err != nil {
				t.Errorf("README sh block %d: %q: configuration: %v", bi+1, line, err)
				continue
			}
			if err := node.CheckKinds(l.Config, factories()); err != nil {
				t.Errorf("README sh block %d: %q: %v", bi+1, line, err)
			}
		}
	}
	t.Logf("checked %d README commands", checked)
	if checked < 20 {
		t.Fatalf("checked %d README commands; the README has more", checked)
	}

	// The cheap ones run, as printed, in a directory of their own.
	run := func(args ...string) string {
		t.Helper()
		c := exec.Command(cliBinary(t), args...)
		c.Dir = dir
		var out, errOut bytes.Buffer
		c.Stdout, c.Stderr = &out, &errOut
		if err := c.Run(); err != nil {
			t.Fatalf("bounce %s: %v\n%s\n%s", strings.Join(args, " "), err, out.String(), errOut.String())
		}
		return out.String()
	}
	if out := run("components"); !strings.Contains(out, "tcp") {
		t.Fatalf("components:\n%s", out)
	}
	// The key line pastes safely: base64url, no shell metacharacter.
	if out := run("key", "--security.key-file", "a.key", "--agent.name", "host-a"); !regexp.MustCompile(`^host-a=[A-Za-z0-9_-]{43}\n$`).MatchString(out) {
		t.Fatalf("key printed %q, want host-a= and 43 characters of [A-Za-z0-9_-]", out)
	}
	if out := run("config", "--config", "bounce.yaml"); !strings.Contains(out, "prefill-0") {
		t.Fatalf("config:\n%s", out)
	}
}
