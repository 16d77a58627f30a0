package config

import (
	"strings"
	"testing"
)

func TestDidYouMean(t *testing.T) {
	keys := []string{"arena_size", "max_chunk", "min_chunk", "route"}
	for name, want := range map[string]string{
		"arena_sise": `"arena_size"`, "max_chunck": `"max_chunk"`, "Route": `"route"`, "rout": `"route"`,
		"totally_else": "", "x": "",
	} {
		got := DidYouMean(name, keys)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("DidYouMean(%q) = %q, want %s", name, got, want)
		}
	}
	_, err := Load(LoadOptions{FileData: []byte("bounce:\n  arena_sise: 1GiB\ntelemetri: {}\n")})
	if err == nil || !strings.Contains(err.Error(), `bounce.arena_sise`) || !strings.Contains(err.Error(), `did you mean "arena_size"?`) ||
		!strings.Contains(err.Error(), `did you mean "telemetry"?`) {
		t.Fatalf("err = %v", err)
	}
}
