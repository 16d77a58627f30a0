package main

import (
	"strings"
	"testing"

	"github.com/bouncekv/bounce/cuda"
)

// TestRunMemoryDeviceForms: device KV in both request forms with bounce
// run, every byte verified by copying it back: over tcp between two
// processes (cuda stages, pinned-host arenas), and on one GPU with
// cudacopy, the inproc control plane and the cuda stages (device arenas,
// the block form through the stages' GatherBlocks/ScatterBlocks).
func TestRunMemoryDeviceForms(t *testing.T) {
	if _, err := cuda.Open(""); err != nil {
		t.Skipf("skipping: %v (needs a GPU and libcuda.so.1)", err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"tcp", []string{"--engine.kind", "tcp"}},
		{"cudacopy-inproc", []string{"--engine.kind", "cudacopy", "--control-plane.kind", "inproc", "--stages.gather", "cuda", "--stages.scatter", "cuda"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// gpt-oss-120b's 72 regions: 72 x 64 pieces of 2 KiB.
			args := append([]string{"run", "--memory", "device", "--workload", "gptoss120b-tp8-b16", "--count", "4608", "--requests", "2",
				"--form", "blocks,descs", "--compare=false", "--bounce.arena-size", "32MiB", "--bounce.max-chunk", "4MiB"}, tc.args...)
			out, errOut, code := bounce(t, args...)
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			for _, want := range []string{"device memory", "bounce [blocks]", "bounce [descs]", "every byte verified"} {
				if !strings.Contains(out, want) {
					t.Fatalf("summary lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
