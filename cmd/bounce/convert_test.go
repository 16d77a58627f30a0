package main

import (
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunLayouts: run --layouts moves every conversion preset between two
// processes, next to the same bytes unconverted, and the receiver verifies
// every element of both; a bad preset or token count is a usage error.
func TestRunLayouts(t *testing.T) {
	for _, preset := range []string{"llama70b-tp8-tp4", "llama70b-b16-b32", "llama70b-nhd-hnd"} {
		t.Run(preset, func(t *testing.T) {
			out, errOut, code := bounce(t, "run", "--layouts", preset, "--layout-tokens", "64", "--requests", "2", "--repeat", "2",
				"--bounce.arena-size", "32MiB", "--bounce.max-chunk", "1MiB")
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			for _, want := range []string{preset + " #0", preset + "-unconverted #1", "converted vs unconverted: ", "every element verified"} {
				if !strings.Contains(out, want) {
					t.Fatalf("summary lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "FAILED") {
				t.Fatalf("a move failed:\n%s", out)
			}
		})
	}
	if _, errOut, code := bounce(t, "run", "--layouts", "nope"); code != exitUsage || !strings.Contains(errOut, "llama70b-tp8-tp4") {
		t.Fatalf("unknown preset: exit %d, %s", code, errOut)
	}
	if _, errOut, code := bounce(t, "run", "--layouts", "llama70b-b16-b32", "--layout-tokens", "48"); code != exitUsage || !strings.Contains(errOut, "not whole blocks of 32") {
		t.Fatalf("48 tokens into 32-token blocks: exit %d, %s", code, errOut)
	}
	out, errOut, code := bounce(t, "bench", "--layouts", "llama70b-nhd-hnd", "--layout-tokens", "32", "--concurrency", "3", "--repeat", "1")
	if code != 0 || !strings.Contains(out, "bounce bench: layouts llama70b-nhd-hnd") || !strings.Contains(out, "every element verified") || !strings.Contains(out, "converted vs unconverted") {
		t.Fatalf("bench --layouts: exit %d\n%s\n%s", code, out, errOut)
	}
	out, _, code = bounce(t, "run", "--layouts", "list")
	if code != 0 || !strings.Contains(out, "llama70b-nhd-hnd") {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
}

// TestRunCPUProfile: run --cpu-profile writes a pprof profile (gzipped
// protobuf with samples) of the job, and a path that cannot be created is
// an error naming the flag before anything starts.
func TestRunCPUProfile(t *testing.T) {
	prof := filepath.Join(t.TempDir(), "cpu.pprof")
	cmd := exec.Command(cliBinary(t), "run", "--layouts", "llama70b-tp8-tp4", "--layout-tokens", "256", "--cpu-profile", prof)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("run --cpu-profile: %v\n%s", err, out)
	}
	f, err := os.Open(prof)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("the profile is not gzipped: %v", err)
	}
	body, err := io.ReadAll(zr)
	if err != nil || len(body) < 64 {
		t.Fatalf("profile body: %d bytes, %v", len(body), err)
	}
	out, err := exec.Command(cliBinary(t), "run", "--cpu-profile", filepath.Join(t.TempDir(), "no", "such", "dir", "p")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--cpu-profile") {
		t.Fatalf("an uncreatable profile path: %v\n%s", err, out)
	}
}
