package benchreport

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func millis(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestSummarize(t *testing.T) {
	// 100 latencies 1..100 ms in reverse order: Summarize sorts a copy.
	lat := make([]time.Duration, 100)
	for i := range lat {
		lat[i] = millis(100 - i)
	}
	st := Summarize(lat)
	want := LatencyStats{Count: 100, MinNS: int64(millis(1)), MeanNS: int64(50500 * time.Microsecond), P50NS: int64(millis(50)),
		P90NS: int64(millis(90)), P99NS: int64(millis(99)), MaxNS: int64(millis(100)), TailRatio: 99.0 / 50}
	if st != want {
		t.Fatalf("Summarize = %+v\nwant        %+v", st, want)
	}
	if lat[0] != millis(100) {
		t.Fatal("Summarize reordered its input")
	}
	if (Summarize(nil) != LatencyStats{}) {
		t.Fatal("Summarize(nil) is not zero")
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

var (
	small = Group{Workload: "gptoss120b-tp8-b16", DescSize: 2 << 10, Count: 2048, Layout: "fragmented", Concurrency: 1}
	big   = Group{Workload: "llama70b-tp8-b16", DescSize: 4 << 10, Count: 4096, Layout: "fragmented", Concurrency: 1}
	bigC8 = Group{Workload: "llama70b-tp8-b16", DescSize: 4 << 10, Count: 4096, Layout: "fragmented", Concurrency: 8}
)

// cell is a successful, verified cell moving g at gbps with latencies lat.
func cell(g Group, route string, iter int, gbps float64, lat ...time.Duration) Cell {
	bytes := g.Bytes() * uint64(g.Concurrency)
	elapsed := time.Duration(float64(bytes) / (gbps * 1e9) * 1e9)
	if len(lat) == 0 {
		for i := 0; i < g.Concurrency; i++ {
			lat = append(lat, elapsed-time.Duration(i)*time.Microsecond)
		}
	}
	c := NewCell(g, route, iter, 0, g.Concurrency, 0, bytes, elapsed, lat)
	c.Took, c.Verified = expectedTook(route), true
	// Make the throughput exact so ratios are exact.
	c.Throughput = gbps * 1e9
	return c
}

// sample is a two-workload, three-route, three-iteration sweep.
func sample() *Report {
	r := &Report{
		Schema:   Schema,
		Started:  time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Finished: time.Date(2026, 1, 2, 3, 5, 5, 0, time.UTC),
		Command:  []string{"bounce", "bench"},
		Machine:  Machine{GOOS: "linux", GOARCH: "amd64", NumCPU: 2, GoVersion: "go1.26"},
		Config: Config{Engine: "tcp", EngineOptions: map[string]string{"stripe_bytes": "1MiB"}, ControlPlane: "zmq", BounceOn: true, ArenaSize: 256 << 20, Workloads: []string{small.Workload, big.Workload},
			Layouts: []string{"fragmented"}, Concurrency: []int{1, 8}, Routes: []string{"bounce", "direct", "bulk"}, Repeat: 3, Seed: 7, Verify: true, MaxBytes: 3 << 30},
		Memory: &Memory{SenderPeakRSS: 400 << 20, ReceiverPeakRSS: 380 << 20, SourceBuffer: 320 << 20, DestinationBuffer: 320 << 20, ArenaSize: 32 << 20, LargestTransfer: 320 << 20},
		Notes:  []string{"a note"},
	}
	for it := 0; it < 3; it++ {
		f := float64(it + 1)
		r.Cells = append(r.Cells,
			cell(small, RouteBounce, it, 1*f), cell(small, RouteDirect, it, 2*f), cell(small, RouteBulk, it, 4*f),
			cell(big, RouteBounce, it, 1.5*f), cell(big, RouteDirect, it, 1*f), cell(big, RouteBulk, it, 3*f))
	}
	for it := 0; it < 3; it++ {
		r.Cells = append(r.Cells, cell(bigC8, RouteBounce, it, 1), cell(bigC8, RouteDirect, it, 2))
	}
	r.Ratios = ComputeRatios(r.Cells)
	return r
}

func TestComputeRatios(t *testing.T) {
	rs := ComputeRatios(sample().Cells)
	want := []struct {
		g    Group
		name string
		per  []float64
	}{
		{small, "bounce/direct", []float64{0.5, 0.5, 0.5}},
		{small, "bounce/bulk", []float64{0.25, 0.25, 0.25}},
		{big, "bounce/direct", []float64{1.5, 1.5, 1.5}},
		{big, "bounce/bulk", []float64{0.5, 0.5, 0.5}},
		{bigC8, "bounce/direct", []float64{0.5, 0.5, 0.5}},
	}
	if len(rs) != len(want) {
		t.Fatalf("%d ratios, want %d: %+v", len(rs), len(want), rs)
	}
	for i, w := range want {
		r := rs[i]
		if r.Group != w.g || r.Name() != w.name || r.Median != w.per[0] || !approx(r.PerIteration, w.per) {
			t.Errorf("ratio %d = %s %s %v median %v, want %s %s %v", i, r.Group, r.Name(), r.PerIteration, r.Median, w.g, w.name, w.per)
		}
	}
}

// TestComputeRatiosPairsIterations checks that a ratio divides cells of the
// same iteration, skips failed cells and needs a bounce cell.
func TestComputeRatiosPairsIterations(t *testing.T) {
	cells := []Cell{
		cell(small, RouteBounce, 0, 1), cell(small, RouteDirect, 0, 4),
		cell(small, RouteDirect, 1, 100), cell(small, RouteBounce, 1, 2), // order within an iteration does not matter
		cell(small, RouteBounce, 2, 9), cell(small, RouteDirect, 2, 1),
		cell(big, RouteDirect, 0, 1), // no bounce: no ratio
	}
	cells[4].Verified = false // iteration 2 is left out
	rs := ComputeRatios(cells)
	if len(rs) != 1 || !approx(rs[0].PerIteration, []float64{0.25, 0.02}) || !near(rs[0].Median, 0.135) {
		t.Fatalf("ratios = %+v", rs)
	}
	cells[0].Failed = 1
	cells[3].Failed = 1
	if rs := ComputeRatios(cells); len(rs) != 0 {
		t.Fatalf("ratios over failed cells: %+v", rs)
	}
}

func TestRows(t *testing.T) {
	r := sample()
	r.Cells[0].Verified = false              // small bounce, iteration 0: checked, wrong
	r.Cells[1].Took = "bounce"               // small direct took something else once
	r.Cells[len(r.Cells)-1].Verified = false // bigC8 direct: not checked
	r.Cells[len(r.Cells)-1].NotVerified = "verification off (test)"
	rows := Rows(r.Cells)
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 8", len(rows))
	}
	got := rows[0]
	if got.Group != small || got.Route != RouteBounce || got.Iterations != 3 || got.Throughput != 2e9 || got.Verified != VerifiedFailed {
		t.Fatalf("row 0 = %+v", got)
	}
	if got.Latency.Count != 3 {
		t.Fatalf("row 0 pools %d latencies, want 3", got.Latency.Count)
	}
	if rows[1].Took != "bounce" || rows[2].Took != "" {
		t.Fatalf("took: %q, %q (bulk takes direct: no mention)", rows[1].Took, rows[2].Took)
	}
	if last := rows[len(rows)-1]; last.Group != bigC8 || last.Route != RouteDirect || last.Verified != VerifiedSkipped || last.NotVerified != "verification off (test)" || last.Latency.Count != 24 {
		t.Fatalf("last row = %+v", last)
	}
}

func TestSortCells(t *testing.T) {
	cells := []Cell{cell(big, RouteBounce, 1, 1), cell(small, RouteBounce, 0, 1), cell(big, RouteDirect, 0, 1), cell(big, RouteBounce, 0, 1)}
	cells[3].Order = 1
	SortCells(cells)
	var got []string
	for _, c := range cells {
		got = append(got, c.Workload[:5]+c.Route[:1]+string(rune('0'+c.Iteration)))
	}
	if want := []string{"llamad0", "llamab0", "llamab1", "gptosb0"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	r := sample()
	var buf bytes.Buffer
	if err := WriteJSON(&buf, r); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"bytes_per_second"`, `"p99_over_p50"`, `"latencies_ns"`, `"per_iteration"`, `"receiver_peak_rss"`, `"num_cpu"`} {
		if !strings.Contains(buf.String(), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
	back, err := ReadJSON(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", back, r)
	}
	path := t.TempDir() + "/r.json"
	if err := SaveJSON(path, r); err != nil {
		t.Fatal(err)
	}
	if back, err := LoadJSON(path); err != nil || !reflect.DeepEqual(back, r) {
		t.Fatalf("file round trip: %v", err)
	}
}

func TestReadJSONRejects(t *testing.T) {
	for name, in := range map[string]string{
		"other schema":  `{"schema": 99}`,
		"unknown field": `{"schema": 1, "surprise": true}`,
		"not JSON":      `cells: []`,
	} {
		if _, err := ReadJSON(strings.NewReader(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, sample()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"cell", "p99/p50", "verified",
		"gptoss120b-tp8-b16 2048x2KiB fragmented c1  bounce",
		"bulk (1 desc)",
		"bounce/direct", "bounce/bulk",
		"0.50x [0.50 0.50 0.50]", "1.50x [1.50 1.50 1.50]",
		"peak RSS (VmHWM): sender 400MiB", "beyond the KV buffers: sender 80MiB, receiver 60MiB",
		"note: a note",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestParseVmHWM(t *testing.T) {
	status := []byte("Name:\tbounce\nVmPeak:\t  999 kB\nVmHWM:\t   12345 kB\nVmRSS:\t  100 kB\n")
	if n, err := ParseVmHWM(status); err != nil || n != 12345<<10 {
		t.Fatalf("ParseVmHWM = %d, %v", n, err)
	}
	for _, bad := range []string{"Name: x\n", "VmHWM: lots kB\n", "VmHWM: 12 MB\n"} {
		if _, err := ParseVmHWM([]byte(bad)); err == nil {
			t.Errorf("ParseVmHWM(%q) accepted", bad)
		}
	}
}

func TestPeakRSSSelf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("VmHWM is read from /proc")
	}
	n, err := PeakRSS(os.Getpid())
	if err != nil || n == 0 {
		t.Fatalf("PeakRSS(self) = %d, %v", n, err)
	}
	if _, err := PeakRSS(-1); err == nil {
		t.Fatal("PeakRSS(-1) succeeded")
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[uint64]string{0: "0B", 2048: "2KiB", 320 << 20: "320MiB", 5 << 29: "2.5GiB", 1536: "1.5KiB"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
	if got := FormatRate(2.79e9); got != "2.79 GB/s" {
		t.Errorf("FormatRate = %q", got)
	}
	if got := FormatDuration(12345678 * time.Nanosecond); got != "12.3ms" {
		t.Errorf("FormatDuration = %q", got)
	}
}

func approx(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !near(a[i], b[i]) {
			return false
		}
	}
	return true
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestEngineLabel(t *testing.T) {
	if got := (Config{Engine: "tcp"}).EngineLabel(); got != "tcp" {
		t.Errorf("label %q", got)
	}
	c := Config{Engine: "ucx", EngineOptions: map[string]string{"fragment_size": "1MiB", "error_mode": "none"}}
	if got := c.EngineLabel(); got != "ucx (error_mode=none,fragment_size=1MiB)" {
		t.Errorf("label %q", got)
	}
}

// TestReadsSchema1: the stored reports of schema 1 still load, their
// throughput_bps read as bytes per second.
func TestReadsSchema1(t *testing.T) {
	r, err := LoadJSON("../docs/bench/vcpu2/tcp-conc.json")
	if err != nil {
		t.Fatal(err)
	}
	if r.Schema != 1 || len(r.Cells) == 0 || r.Cells[0].Throughput <= 0 {
		t.Fatalf("schema %d, %d cells, first throughput %v", r.Schema, len(r.Cells), r.Cells)
	}
	for _, c := range r.Cells {
		if !c.Verified || c.NotVerified != "" || c.Verification() != VerifiedYes {
			t.Fatalf("schema 1 cell verified %q read as verified %v, not verified %q", "yes", c.Verified, c.NotVerified)
		}
	}
}

// TestVerifiedIsABoolean: a cell's verified is a JSON boolean, with the
// reason bytes were not checked in not_verified; schema 2's strings read
// as the same three outcomes, and the text summary names the reason.
func TestVerifiedIsABoolean(t *testing.T) {
	r := &Report{Schema: Schema, Cells: []Cell{cell(small, RouteBounce, 0, 1), cell(small, RouteDirect, 0, 1), cell(big, RouteBounce, 0, 1)}}
	r.Cells[1].Verified, r.Cells[1].Error = false, "byte 7 of request 2 differs"
	r.Cells[2].Verified, r.Cells[2].NotVerified = false, "the receiver \"d\" runs elsewhere (--peer)"
	var buf bytes.Buffer
	if err := WriteJSON(&buf, r); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Cells []map[string]any `json:"cells"`
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		if v, ok := raw.Cells[i]["verified"].(bool); !ok || v != want {
			t.Fatalf("cell %d: verified %#v, want the boolean %v", i, raw.Cells[i]["verified"], want)
		}
	}
	if _, ok := raw.Cells[0]["not_verified"]; ok {
		t.Fatal("a verified cell carries not_verified")
	}
	if raw.Cells[2]["not_verified"] != "the receiver \"d\" runs elsewhere (--peer)" {
		t.Fatalf("not_verified = %#v", raw.Cells[2]["not_verified"])
	}
	for i, want := range []string{VerifiedYes, VerifiedFailed, VerifiedSkipped} {
		if got := r.Cells[i].Verification(); got != want {
			t.Fatalf("cell %d: %s, want %s", i, got, want)
		}
	}
	if r.Cells[1].OK() || !r.Cells[2].OK() {
		t.Fatal("OK: a cell that failed verification is OK, or one not checked is not")
	}
	var tbl bytes.Buffer
	if err := WriteTable(&tbl, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tbl.String(), "verified skipped = the bytes were not checked: the receiver \"d\" runs elsewhere (--peer)") {
		t.Fatalf("the summary does not say why bytes were not checked:\n%s", tbl.String())
	}
	// Schema 2 wrote strings.
	old := []byte(`{"schema": 2, "cells": [{"verified": "yes"}, {"verified": "failed"}, {"verified":"skipped"}]}`)
	got, err := ReadJSON(bytes.NewReader(old))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{VerifiedYes, VerifiedFailed, VerifiedSkipped} {
		if v := got.Cells[i].Verification(); v != want {
			t.Fatalf("schema 2 cell %d read as %s, want %s", i, v, want)
		}
	}
}

// TestAutoBest checks that auto/best divides auto's throughput by the
// faster of bounce and direct of the same iteration, and that AutoVerdict
// counts the cells whose median lands within AutoTolerance.
func TestAutoBest(t *testing.T) {
	cells := []Cell{
		cell(small, RouteBounce, 0, 10), cell(small, RouteDirect, 0, 8), cell(small, RouteAuto, 0, 9.7),
		cell(small, RouteBounce, 1, 6), cell(small, RouteDirect, 1, 8), cell(small, RouteAuto, 1, 8),
		cell(big, RouteBounce, 0, 4), cell(big, RouteDirect, 0, 5), cell(big, RouteAuto, 0, 4),
	}
	rs := ComputeRatios(cells)
	var got []Ratio
	for _, r := range rs {
		if r.Name() == "auto/best" {
			got = append(got, r)
		}
	}
	if len(got) != 2 || got[0].Group != small || !approx(got[0].PerIteration, []float64{0.97, 1}) || got[1].Group != big || !approx(got[1].PerIteration, []float64{0.8}) {
		t.Fatalf("auto/best ratios = %+v", got)
	}
	if within, n := AutoVerdict(rs); within != 1 || n != 2 {
		t.Fatalf("AutoVerdict = %d of %d, want 1 of 2", within, n)
	}
	var sb strings.Builder
	if err := writeRatios(&sb, rs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "route auto within 5% of the faster of bounce and direct (median auto/best >= 0.95): 1 of 2 cells") {
		t.Fatalf("summary lacks the verdict:\n%s", sb.String())
	}
}

// TestWriteTableRemoteReceiver: with the receiver elsewhere (bench --peer)
// its memory is said to be unmeasured, never "receiver 0B" or a negative
// overhead; a note is printed once.
func TestWriteTableRemoteReceiver(t *testing.T) {
	r := &Report{
		Memory: &Memory{SenderPeakRSS: 344 << 20, SourceBuffer: 32 << 20, DestinationBuffer: 1 << 30, ArenaSize: 256 << 20, LargestTransfer: 32 << 20, ReceiverElsewhere: true},
		Notes:  []string{"--peer: the receiver runs elsewhere"},
	}
	var b strings.Builder
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if !strings.Contains(out, "receiver not measured (it runs elsewhere; destination buffer 1GiB)") || strings.Contains(out, "receiver 0B") || strings.Contains(out, "-1GiB") {
		t.Fatalf("remote receiver's memory:\n%s", out)
	}
	if n := strings.Count(out, "--peer: the receiver runs elsewhere"); n != 1 {
		t.Fatalf("note printed %d times:\n%s", n, out)
	}
}
