package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bouncekv/bounce/cuda"
)

// TestRunMemoryDevice: `bounce run --memory device` moves device KV between
// two processes over the host engines (pinned-host arenas, cuda stages),
// every byte verified on the receiver by copying it back; without a GPU it
// fails naming why, and a bad --memory is a usage error. A plugin engine
// (another process) carries it too: its pinned arena is a memfd arena
// page-locked for the device, which the plugin maps.
func TestRunMemoryDevice(t *testing.T) {
	if _, errOut, code := bounce(t, "run", "--memory", "hbm"); code != exitUsage || !strings.Contains(errOut, "--memory \"hbm\": accepted: host, device") {
		t.Fatalf("--memory hbm: exit %d, stderr %q", code, errOut)
	}
	_, noGPU := cuda.Open("")
	for _, engine := range []string{"tcp", "ucx", "plugin"} {
		t.Run(engine, func(t *testing.T) {
			args := []string{"run", "--memory", "device", "--workload", "gptoss120b-tp8-b16", "--count", "4096", "--requests", "2", "--compare=false",
				"--engine.kind", engine, "--bounce.arena-size", "32MiB", "--bounce.max-chunk", "4MiB"}
			if engine == "plugin" {
				if noGPU != nil {
					t.Skipf("skipping: %v", noGPU)
				}
				bin := filepath.Join(t.TempDir(), "tcpengine")
				if out, err := exec.Command("go", "build", "-o", bin, "../../plugins/examples/tcpengine").CombinedOutput(); err != nil {
					t.Fatalf("build example plugin: %v\n%s", err, out)
				}
				args = append(args, "--engine.plugin", bin)
			}
			out, errOut, code := bounce(t, args...)
			if noGPU != nil {
				if code == 0 || !strings.Contains(out+errOut, "cuda unavailable") {
					t.Fatalf("without a GPU: exit %d, want a failure naming cuda unavailable\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
			}
			for _, want := range []string{"device memory", "bounce  ", "every byte verified"} {
				if !strings.Contains(out, want) {
					t.Fatalf("summary lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
