package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite the seed corpora under testdata/fuzz")

func FuzzLoadYAML(f *testing.F) {
	for _, s := range yamlSeeds(f) {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := Load(LoadOptions{File: "fuzz.yaml", FileData: data})
		if err != nil {
			if l != nil {
				t.Fatalf("error %v with a result", err)
			}
			// Schema problems are all *KeyErrors; anything else is the YAML
			// parser's, and names the file.
			if ks := keyErrors(err); len(ks) == 0 && !strings.Contains(err.Error(), "file:fuzz.yaml") {
				t.Fatalf("unexplained error %v", err)
			}
			return
		}
		if err := l.Config.Validate(); err != nil {
			t.Fatalf("Load returned a config that fails Validate: %v", err)
		}
		text, err := l.Config.YAML()
		if err != nil {
			t.Fatalf("YAML: %v", err)
		}
		again, err := Load(LoadOptions{FileData: text})
		if err != nil {
			t.Fatalf("reloading the rendered config: %v\n%s", err, text)
		}
		if !reflect.DeepEqual(again.Config, l.Config) {
			t.Fatalf("render round trip:\n%+v\nwant\n%+v", again.Config, l.Config)
		}
	})
}

type yamlSeed struct {
	name string
	data []byte
}

func yamlSeeds(tb testing.TB) []yamlSeed {
	example, err := os.ReadFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	full, err := Default().YAML()
	if err != nil {
		tb.Fatal(err)
	}
	// Agent names differ between machines; pin it so the corpus is stable.
	full = []byte(strings.Replace(string(full), "name: "+Default().Agent.Name, "name: seed-agent", 1))
	return []yamlSeed{
		{"valid-example", example},
		{"valid-full", full},
		{"valid-empty", []byte("")},
		{"valid-flow", []byte("bounce: {arena_size: 48MiB, max_chunk: 64MiB, granularity: 1MiB}\nengine: {options: {a: 1, b.c: true}}\n")},
		{"valid-anchor", []byte("stages: {gather: &s cuda, scatter: *s}\n")},
		{"valid-plugins", []byte("engine: {kind: plugin, plugin: {path: ./eng, args: [-v], env: [A=1], checksum: \"sha256:" + strings.Repeat("0f", 32) + "\", options: {rails: 4}}}\nstages: {gather: {plugin: ./g}, scatter: {plugin: {path: ./s, inherit_env: true}}, write: {plugin: {path: ./w, max_restarts: 0}}}\n")},
		{"invalid-plugin-key", []byte("stages: {gather: {plugin: {path: ./g, evn: [A=1]}}}\n")},
		{"invalid-old-stages-plugin", []byte("stages: {gather: plugin, plugin: ./g}\n")},
		{"invalid-unknown-key", []byte("bounce:\n  arena_sz: 1GiB\n")},
		{"invalid-garbage-size", []byte("bounce:\n  arena_size: lots\n")},
		{"invalid-range", []byte("bounce:\n  max_inflight: 0\ntelemetry: {sample_ratio: 2}\n")},
		{"invalid-null", []byte("bounce:\n  arena_size:\n")},
		{"invalid-list", []byte("- 1\n- 2\n")},
		{"invalid-yaml", []byte("bounce: [\n")},
		{"invalid-aliases", []byte("a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n")},
	}
}

func corpusFile(typ string, b []byte) string { return fmt.Sprintf("go test fuzz v1\n%s(%q)\n", typ, b) }

func parseCorpusFile(s, typ string) ([]byte, error) {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) != 2 || lines[0] != "go test fuzz v1" {
		return nil, errors.New("not a one-value corpus file")
	}
	lit, ok := strings.CutPrefix(lines[1], typ+"(")
	if !ok || !strings.HasSuffix(lit, ")") {
		return nil, fmt.Errorf("value is not %s(...)", typ)
	}
	v, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
	return []byte(v), err
}

// TestSeedCorpus checks the checked-in corpora: every seed present and
// current, valid ones accepted and invalid ones refused. Run with
// -update-corpus to rewrite them.
func TestSeedCorpus(t *testing.T) {
	type entry struct {
		name  string
		data  []byte
		valid bool
	}
	corpora := map[string]struct {
		typ     string
		entries []entry
		check   func([]byte) error
	}{
		"FuzzLoadYAML": {typ: "[]byte", check: func(b []byte) error {
			_, err := Load(LoadOptions{FileData: b})
			return err
		}},
		"FuzzParseSize": {typ: "string", check: func(b []byte) error {
			_, err := ParseSize(string(b))
			return err
		}},
	}
	c := corpora["FuzzLoadYAML"]
	for _, s := range yamlSeeds(t) {
		c.entries = append(c.entries, entry{s.name, s.data, strings.HasPrefix(s.name, "valid-")})
	}
	corpora["FuzzLoadYAML"] = c
	c = corpora["FuzzParseSize"]
	for i, s := range sizeSeeds() {
		c.entries = append(c.entries, entry{fmt.Sprintf("seed-%02d", i), []byte(s.s), s.valid})
	}
	corpora["FuzzParseSize"] = c

	for fuzzName, c := range corpora {
		dir := filepath.Join("testdata", "fuzz", fuzzName)
		if *updateCorpus {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, e := range c.entries {
				if err := os.WriteFile(filepath.Join(dir, e.name), []byte(corpusFile(c.typ, e.data)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, e := range c.entries {
			text, err := os.ReadFile(filepath.Join(dir, e.name))
			if err != nil {
				t.Fatalf("%s/%s missing (run go test -run TestSeedCorpus -update-corpus): %v", fuzzName, e.name, err)
			}
			b, err := parseCorpusFile(string(text), c.typ)
			if err != nil {
				t.Fatalf("%s/%s: %v", fuzzName, e.name, err)
			}
			if !bytes.Equal(b, e.data) {
				t.Fatalf("%s/%s is stale (run -update-corpus)", fuzzName, e.name)
			}
			if err := c.check(b); (err == nil) != e.valid {
				t.Fatalf("%s/%s: error %v, valid=%v", fuzzName, e.name, err, e.valid)
			}
		}
	}
}
