package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/knadh/koanf/v2"
)

// FuzzParseYAML fuzzes the file layer's parser and strict schema check (the
// part of Load that reads hostile bytes) without the rest of a load
// (defaults, environment, flags, merge), so it runs thousands of times
// faster than FuzzLoadYAML and explores the parser. Seeds: the YAML seeds
// plus one document per key holding its default, so every key's value
// parser is reached from the start. Every problem is a *KeyError naming a
// key, its value's reason and a sentinel; every accepted key is in the
// schema and its value assigns.
func FuzzParseYAML(f *testing.F) {
	for _, s := range yamlSeeds(f) {
		f.Add(s.data)
	}
	def := Default()
	fs := fields()
	for _, fl := range fs {
		if fl.key == optionsKey {
			f.Add([]byte("engine:\n  options: {depth: 4, nic.mode: fast}\n"))
			continue
		}
		// One nested mapping per dot: a grouped key has three levels.
		var doc strings.Builder
		parts := strings.Split(fl.key, ".")
		for i, p := range parts[:len(parts)-1] {
			fmt.Fprintf(&doc, "%s%s:\n", strings.Repeat("  ", i), p)
		}
		fmt.Fprintf(&doc, "%s%s: %v\n", strings.Repeat("  ", len(parts)-1), parts[len(parts)-1], show(render(fl.ptr(&def))))
		f.Add([]byte(doc.String()))
	}
	byKey := make(map[string]field, len(fs))
	for _, fl := range fs {
		byKey[fl.key] = fl
	}
	src := Source("file:fuzz.yaml")
	srcOf := func(string) Source { return src }
	f.Fuzz(func(t *testing.T, data []byte) {
		fk := koanf.New(".")
		if err := fk.Load(bytesProvider(data), safeYAML{}); err != nil {
			return // the parser's own error; Load wraps it with the file name
		}
		sources := map[string]Source{}
		clean, bad := checkLayer(fs, fk.Raw(), srcOf, sources)
		for _, e := range bad {
			if e.Key == "" && e.Err != ErrUnknownKey || e.Reason == "" || e.Source != src ||
				!errors.Is(e, ErrUnknownKey) && !errors.Is(e, ErrBadValue) {
				t.Fatalf("unexplained key error %+v", e)
			}
		}
		var walk func(prefix string, m map[string]any)
		walk = func(prefix string, m map[string]any) {
			for name, raw := range m {
				key := prefix + "." + name
				fl, ok := byKey[key]
				if !ok {
					sub, isMap := raw.(map[string]any)
					if !isMap {
						t.Fatalf("accepted unknown key %s", key)
					}
					walk(key, sub) // a group of keys
					continue
				}
				var c Config
				if !assign(fl.ptr(&c), raw) {
					t.Fatalf("accepted %s=%v does not assign", fl.key, show(raw))
				}
				if sources[fl.key] != src {
					t.Fatalf("accepted %s without its source", fl.key)
				}
			}
		}
		for section, v := range clean {
			walk(section, v.(map[string]any))
		}
	})
}

// BenchmarkYAMLFuzzBody compares, side by side, the per-input cost of
// FuzzLoadYAML's body (a whole Load) with FuzzParseYAML's (parse and
// schema check) on the example file.
func BenchmarkYAMLFuzzBody(b *testing.B) {
	data := yamlSeeds(b)[0].data
	fs := fields()
	b.Run("load", func(b *testing.B) {
		for b.Loop() {
			if _, err := Load(LoadOptions{File: "fuzz.yaml", FileData: data}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parse", func(b *testing.B) {
		for b.Loop() {
			fk := koanf.New(".")
			if err := fk.Load(bytesProvider(data), safeYAML{}); err != nil {
				b.Fatal(err)
			}
			if _, bad := checkLayer(fs, fk.Raw(), func(string) Source { return "" }, map[string]Source{}); len(bad) > 0 {
				b.Fatal(bad[0])
			}
		}
	})
}
