package main

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/benchreport"
)

var (
	benchOnce sync.Once
	benchPath string
	benchErr  error
)

// benchBinary builds the bounce binary once for the bench tests (the
// receiver is a child process of the binary, so the sweep needs a real one).
func benchBinary(t *testing.T) string {
	t.Helper()
	benchOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bounce-bench-")
		if err != nil {
			benchErr = err
			return
		}
		benchPath = filepath.Join(dir, "bounce")
		if out, err := exec.Command("go", "build", "-o", benchPath, ".").CombinedOutput(); err != nil {
			benchErr = errors.New(string(out))
		}
	})
	if benchErr != nil {
		t.Fatalf("build bounce: %v", benchErr)
	}
	return benchPath
}

// TestBenchEndToEnd runs a tiny sweep through two real processes and checks
// the JSON (every cell verified, ratios measured), the table, the per-cell
// progress lines and the PNG plots.
func TestBenchEndToEnd(t *testing.T) {
	plots := filepath.Join(t.TempDir(), "plots")
	rep, stdout, stderr := runBench(t, "--workload", "gptoss120b-tp8-b16", "--count", "2048",
		"--concurrency", "1,2", "--routes", "bounce,direct,bulk", "--repeat", "2", "--seed", "7",
		"--plots", plots, "--bounce.arena-size", "16MiB", "--bounce.max-chunk", "2MiB")
	if rep.Config.Engine != "tcp" || rep.Config.ControlPlane != "zmq" || rep.Config.ArenaSize != 16<<20 || rep.Config.Seed != 7 || !rep.Config.BounceOn {
		t.Errorf("config summary %+v", rep.Config)
	}
	if rep.Machine.NumCPU < 1 || rep.Machine.GOOS == "" {
		t.Errorf("machine %+v", rep.Machine)
	}
	// 2 concurrency levels x 3 routes x 2 iterations.
	if len(rep.Cells) != 12 {
		t.Fatalf("%d cells, want 12", len(rep.Cells))
	}
	seen := map[string]int{}
	for _, c := range rep.Cells {
		seen[c.Route]++
		if !c.Verified || c.NotVerified != "" || c.VerifiedRequests != c.Concurrency || c.Failed != 0 || c.Error != "" {
			t.Errorf("cell %s %s #%d: verified %v (%q), failed %d, error %q", c.Group, c.Route, c.Iteration, c.Verified, c.NotVerified, c.Failed, c.Error)
		}
		if c.Throughput <= 0 || c.Bytes != uint64(c.Concurrency)*2048*2048 || len(c.LatenciesNS) != c.Concurrency || c.Latency.P50NS <= 0 {
			t.Errorf("cell %s %s #%d: throughput %v, %d bytes, %d latencies, p50 %d", c.Group, c.Route, c.Iteration, c.Throughput, c.Bytes, len(c.LatenciesNS), c.Latency.P50NS)
		}
		if want := map[string]string{"bounce": "bounce", "direct": "direct", "bulk": "direct"}[c.Route]; c.Took != want {
			t.Errorf("cell %s %s took %s, want %s", c.Group, c.Route, c.Took, want)
		}
	}
	if seen["bounce"] != 4 || seen["direct"] != 4 || seen["bulk"] != 4 {
		t.Errorf("cells per route %v", seen)
	}
	var names []string
	for _, r := range rep.Ratios {
		names = append(names, r.Name())
		if len(r.PerIteration) != 2 || r.Median <= 0 {
			t.Errorf("ratio %s %s: %v median %v", r.Group, r.Name(), r.PerIteration, r.Median)
		}
	}
	if want := []string{"bounce/direct", "bounce/bulk", "bounce/direct", "bounce/bulk"}; !slices.Equal(names, want) {
		t.Errorf("ratios %v, want %v", names, want)
	}
	if m := rep.Memory; m == nil || m.SenderPeakRSS <= m.SourceBuffer || m.ReceiverPeakRSS <= m.DestinationBuffer {
		t.Errorf("memory %+v", rep.Memory)
	}
	out := stdout.String()
	for _, want := range []string{"p99/p50", "bounce/direct", "bounce/bulk", "bulk (1 desc)", "peak RSS", "every cell verified"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(stderr.String(), "bench ["); n != 12 {
		t.Errorf("%d progress lines on stderr (not a terminal), want 12:\n%s", n, stderr.String())
	}
	for _, name := range []string{"throughput-fragmented-c1.png", "latency-tail-gptoss120b-tp8-b16-2048x2KiB-fragmented-c2.png"} {
		checkBenchPNG(t, filepath.Join(plots, name))
	}
}

// TestBenchClosedLoop runs one closed-loop cell: 3 generations of 2
// requests, at most 2 in flight, latencies over the last 4, every byte of
// all 6 verified.
func TestBenchClosedLoop(t *testing.T) {
	rep, stdout, _ := runBench(t, "--workload", "gptoss120b-tp8-b16", "--count", "1024",
		"--concurrency", "2", "--generations", "3", "--routes", "bounce", "--repeat", "1",
		"--bounce.arena-size", "16MiB", "--bounce.max-chunk", "2MiB")
	if len(rep.Cells) != 1 || rep.Config.Generations != 3 {
		t.Fatalf("%d cells, generations %d", len(rep.Cells), rep.Config.Generations)
	}
	// The report says which build ran and with what configuration.
	bc, _ := rep.EffectiveConfig["bounce"].(map[string]any)
	if rep.Schema != benchreport.Schema || rep.Bounce.WireVersion != wireVersion() || rep.Bounce.Version == "" || bc["arena_size"] != "16MiB" || bc["max_chunk"] != "2MiB" {
		t.Fatalf("build %+v, effective bounce config %v", rep.Bounce, bc)
	}
	c := rep.Cells[0]
	if !c.Verified || c.VerifiedRequests != 6 || c.Requests != 6 || c.Failed != 0 || c.Bytes != 6*1024*2048 || c.Generations != 3 {
		t.Fatalf("cell %+v", c)
	}
	if len(c.LatenciesNS) != 4 || c.Latency.Count != 4 || c.AllLatency == nil || c.AllLatency.Count != 6 || c.PeakInFlight < 1 || c.PeakInFlight > 2 {
		t.Fatalf("cell latencies %d, summary %+v, all %+v, peak in flight %d", len(c.LatenciesNS), c.Latency, c.AllLatency, c.PeakInFlight)
	}
	if out := stdout.String(); !strings.Contains(out, "c2 loop3") || !strings.Contains(out, "closed loop") {
		t.Errorf("table does not name the closed loop:\n%s", out)
	}
}

// runBench runs `bounce bench args... --json F` as a process and returns
// the report read back from F with the command's stdout and stderr.
func runBench(t *testing.T, args ...string) (*benchreport.Report, bytes.Buffer, bytes.Buffer) {
	t.Helper()
	jsonPath := filepath.Join(t.TempDir(), "out.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, benchBinary(t), append(append([]string{"bench"}, args...), "--json", jsonPath)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	rep, err := benchreport.LoadJSON(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	return rep, stdout, stderr
}

func checkBenchPNG(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(b) < 10<<10 || img.Bounds().Dx() < 600 {
		t.Errorf("%s: %d bytes, %v: trivial", path, len(b), img.Bounds())
	}
}

// TestBenchPlan checks how flags become cells: presets, overrides, layouts,
// and the --max-bytes clamp with its notes.
func TestBenchPlan(t *testing.T) {
	o := benchOptions{workloads: []string{"llama70b-tp8-b16", "gptoss120b-tp8-b16"}, concurrency: []int{8, 1, 64}, generations: 1,
		routes: []string{"bounce", "bulk"}, layout: "both", repeat: 2, seed: 1, maxBytes: "1GiB", cellTimeout: time.Minute}
	p, err := o.plan()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range p.groups {
		got = append(got, g.g.String())
	}
	want := []string{
		// 320MiB per request: 8 fits nowhere in 1GiB, so it is clamped to 3; 64 then is skipped.
		"llama70b-tp8-b16 81920x4KiB fragmented c1", "llama70b-tp8-b16 81920x4KiB fragmented c3 (asked c8)",
		"llama70b-tp8-b16 81920x4KiB contiguous c1", "llama70b-tp8-b16 81920x4KiB contiguous c3 (asked c8)",
		// 72MiB per request: 64 is clamped to 14.
		"gptoss120b-tp8-b16 36864x2KiB fragmented c1", "gptoss120b-tp8-b16 36864x2KiB fragmented c8", "gptoss120b-tp8-b16 36864x2KiB fragmented c14 (asked c64)",
		"gptoss120b-tp8-b16 36864x2KiB contiguous c1", "gptoss120b-tp8-b16 36864x2KiB contiguous c8", "gptoss120b-tp8-b16 36864x2KiB contiguous c14 (asked c64)",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("groups:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !slices.Equal(p.routes, []string{"bounce", "bulk"}) || p.cells() != 10*2*2 || p.largest != 14*72<<20 {
		t.Fatalf("routes %v, %d cells, largest %d", p.routes, p.cells(), p.largest)
	}
	if len(p.notes) != 3 || !strings.Contains(p.notes[0], "clamped llama70b-tp8-b16 from concurrency 8 to 3") ||
		!strings.Contains(p.notes[1], "skipped llama70b-tp8-b16 at concurrency 64") || !strings.Contains(p.notes[2], "clamped gptoss120b-tp8-b16 from concurrency 64 to 14") {
		t.Fatalf("notes %q", p.notes)
	}
	if !p.groups[0].spec.Fragmented || p.groups[2].spec.Fragmented {
		t.Fatal("layouts not applied to the specs")
	}

	loop := benchOptions{workloads: []string{"gptoss120b-tp8-b16"}, concurrency: []int{4, 8}, generations: 3, routes: []string{"bounce"}, layout: "fragmented", repeat: 1, maxBytes: "1GiB", cellTimeout: time.Minute}
	if p, err = loop.plan(); err != nil {
		t.Fatal(err)
	}
	// 3 generations x 72MiB: 4 in flight fits (864MiB), 8 is clamped to 4 and so skipped.
	if len(p.groups) != 1 || p.groups[0].g.String() != "gptoss120b-tp8-b16 36864x2KiB fragmented c4 loop3" || p.largest != 12*72<<20 ||
		len(p.notes) != 1 || !strings.Contains(p.notes[0], "skipped gptoss120b-tp8-b16 at concurrency 8: 24 x") {
		t.Fatalf("closed-loop plan: groups %v, largest %d, notes %q", p.groups, p.largest, p.notes)
	}

	all := benchOptions{all: true, concurrency: []int{1}, generations: 1, routes: []string{"direct"}, layout: "fragmented", repeat: 1, maxBytes: "2GiB", cellTimeout: time.Minute}
	p, err = all.plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.groups) != 6 || len(p.notes) != 4 || !strings.Contains(p.notes[1], "skipped llama70b-tp1-b16: one request of 2.5GiB exceeds --max-bytes 2GiB") {
		t.Fatalf("--all with a 2GiB budget: %d groups, notes %q", len(p.groups), p.notes)
	}

	over := benchOptions{workloads: []string{"gptoss120b-tp8-b16"}, count: 2048, descSize: "4KiB", concurrency: []int{2}, generations: 1, routes: []string{"bulk"}, layout: "contiguous", repeat: 1, maxBytes: "1GiB", cellTimeout: time.Minute}
	if p, err = over.plan(); err != nil || p.groups[0].spec.Count != 2048 || p.groups[0].spec.DescSize != 4096 {
		t.Fatalf("overrides: %+v, %v", p.groups, err)
	}
	if s, rt := routeSpec("bulk", p.groups[0].spec); s.Count != 1 || s.DescSize != 8<<20 || rt.String() != "direct" {
		t.Fatalf("bulk spec %+v on %s", s, rt)
	}

	// A descriptor-size sweep keeps each preset's bytes.
	sweep := benchOptions{workloads: []string{"gptoss120b-tp8-b16"}, descSize: "512B..64KiB", concurrency: []int{1}, generations: 1, routes: []string{"bounce"}, layout: "fragmented", repeat: 1, maxBytes: "1GiB", cellTimeout: time.Minute}
	if p, err = sweep.plan(); err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, g := range p.groups {
		got = append(got, g.g.String())
		if g.g.Bytes() != 72<<20 {
			t.Fatalf("%s moves %d bytes, want the preset's 72MiB", g.g, g.g.Bytes())
		}
	}
	want = []string{
		"gptoss120b-tp8-b16 147456x512B fragmented c1", "gptoss120b-tp8-b16 73728x1KiB fragmented c1", "gptoss120b-tp8-b16 36864x2KiB fragmented c1",
		"gptoss120b-tp8-b16 18432x4KiB fragmented c1", "gptoss120b-tp8-b16 9216x8KiB fragmented c1", "gptoss120b-tp8-b16 4608x16KiB fragmented c1",
		"gptoss120b-tp8-b16 2304x32KiB fragmented c1", "gptoss120b-tp8-b16 1152x64KiB fragmented c1",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("sweep groups:\n%s", strings.Join(got, "\n"))
	}
	if sizes, err := parseSizeSweep("4KiB, 16KiB"); err != nil || !slices.Equal(sizes, []uint64{4096, 16384}) {
		t.Fatalf("list: %v, %v", sizes, err)
	}
}

// TestBenchUsageErrors checks that bad flags are usage errors (exit 2)
// before any process starts.
func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--layout", "diagonal"},
		{"--routes", "bounce,teleport"},
		{"--concurrency", "0"},
		{"--repeat", "0"},
		{"--generations", "0"},
		{"--generations", "65"},
		{"--workload", "llama405b"},
		{"--max-bytes", "lots"},
		{"--workload", "llama70b-tp1-b16", "--max-bytes", "1GiB"},
		{"--desc-size", "0"},
		{"--desc-size", "64KiB..512B"},
		{"--desc-size", "4KiB,4KiB"},
		{"--concurrency", "1,8,8"},
		{"--engine.kind", "carrier-pigeon"},
	} {
		var out, errb bytes.Buffer
		if code := execute(append([]string{"bench"}, args...), strings.NewReader(""), &out, &errb); code != exitUsage {
			t.Errorf("bench %v: exit %d, want %d\n%s%s", args, code, exitUsage, out.String(), errb.String())
		}
	}
}

// TestBenchRejectsDuplicates: a value listed twice in a list flag is a
// usage error naming the flag and the value, never silently merged, so
// every cell is one that was asked for once.
func TestBenchRejectsDuplicates(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--routes", "bounce,direct,bounce"}, `--routes "bounce" is listed twice`},
		{[]string{"--routes", "bulk", "--routes", "bulk"}, `--routes "bulk" is listed twice`},
		{[]string{"--workload", "gptoss120b-tp8-b16,llama70b-tp8-b16,gptoss120b-tp8-b16"}, `--workload "gptoss120b-tp8-b16" is listed twice`},
		{[]string{"--concurrency", "8,1,8"}, "--concurrency 8 is listed twice"},
		{[]string{"--desc-size", "4KiB,16KiB,4096"}, "--desc-size: 4096 is listed twice"},
		{[]string{"--all", "--workload", "llama70b-tp8-b16"}, "--all and --workload llama70b-tp8-b16"},
	} {
		var out, errb bytes.Buffer
		code := execute(append([]string{"bench"}, c.args...), strings.NewReader(""), &out, &errb)
		if code != exitUsage || !strings.Contains(errb.String(), c.want) {
			t.Errorf("bench %v: exit %d, stderr %q; want exit %d naming %q", c.args, code, errb.String(), exitUsage, c.want)
		}
	}
}

func TestBenchList(t *testing.T) {
	var out, errb bytes.Buffer
	if code := execute([]string{"bench", "--list"}, strings.NewReader(""), &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"llama70b-tp8-b16", "Llama-3.1-70B", "81920", "320MiB", "gptoss120b-tp8-b64", "2.5GiB"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--list lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBenchRotate(t *testing.T) {
	r := []string{"bounce", "direct", "bulk"}
	for it, want := range [][]string{{"bounce", "direct", "bulk"}, {"direct", "bulk", "bounce"}, {"bulk", "bounce", "direct"}, {"bounce", "direct", "bulk"}} {
		if got := rotate(r, it); !slices.Equal(got, want) {
			t.Errorf("iteration %d: %v, want %v", it, got, want)
		}
	}
	if iterationSeed(5, 0) != 5 || iterationSeed(5, 1)-iterationSeed(5, 0) < maxConcurrency*maxGenerations {
		t.Error("iteration seeds overlap the per-request seeds of the previous iteration")
	}
}

// TestBenchDuration: --duration moves a cell's workload round after round
// until it ran that long, every round counted and verified at the end.
func TestBenchDuration(t *testing.T) {
	rep, stdout, _ := runBench(t, "--workload", "gptoss120b-tp8-b16", "--count", "1024",
		"--concurrency", "1", "--routes", "bounce", "--repeat", "1", "--duration", "500ms")
	if len(rep.Cells) != 1 {
		t.Fatalf("%d cells", len(rep.Cells))
	}
	c := rep.Cells[0]
	if c.Requests < 2 || c.Failed != 0 || c.Bytes != uint64(c.Requests)*1024*2048 || c.ElapsedNS < int64(500*time.Millisecond) ||
		len(c.LatenciesNS) != c.Requests || !c.Verified || c.DescriptorsPerSecond <= 0 {
		t.Fatalf("cell %+v", c)
	}
	if st := c.Stages; st == nil || st.GrantWaitNS <= 0 || st.GatherNS <= 0 || st.WriteNS <= 0 || st.ScatterNS <= 0 || st.AckWaitNS <= 0 {
		t.Fatalf("stages %+v", c.Stages)
	}
	if out := stdout.String(); !strings.Contains(out, "where a request's time went") || !regexp.MustCompile(`DATA +scatter +ACK\n`).MatchString(out) {
		t.Fatalf("no stage table:\n%s", stdout.String())
	}
}
