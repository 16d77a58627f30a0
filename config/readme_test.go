package config

import (
	"os"
	"strings"
	"testing"
)

// readmeBlocks returns the fenced blocks of the repository's README.md
// whose info string is lang, in order, their text unchanged.
func readmeBlocks(t *testing.T, lang string) []string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var cur []string
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case !in && line == "```"+lang:
			in, cur = true, nil
		case in && line == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n")+"\n")
		case in:
			cur = append(cur, line)
		}
	}
	if in {
		t.Fatalf("README.md: an unterminated ```%s block", lang)
	}
	return blocks
}

// TestReadmeYAML: every YAML block of the README loads as printed — the
// configuration reference and the plugin block — and the reference block
// sets what its comments say.
func TestReadmeYAML(t *testing.T) {
	blocks := readmeBlocks(t, "yaml")
	if len(blocks) < 2 {
		t.Fatalf("README.md has %d yaml blocks, want the configuration reference and the plugin block", len(blocks))
	}
	for i, b := range blocks {
		l, err := Load(LoadOptions{File: "README.md#yaml" + string(rune('1'+i)), FileData: []byte(b)})
		if err != nil {
			t.Fatalf("README yaml block %d does not load:\n%s\n%v", i+1, b, err)
		}
		if i == 0 {
			c := l.Config
			if c.Agent.Name != "prefill-0" || c.Bounce.Quarantine != 0 || c.Bounce.ArenaSize != 256*MiB || c.Engine.Listen != "10.0.0.2:7000" {
				t.Fatalf("README reference block: name %q quarantine %v arena %v listen %q", c.Agent.Name, c.Bounce.Quarantine, c.Bounce.ArenaSize, c.Engine.Listen)
			}
		}
	}
}
