package benchreport

import (
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestWritePlots(t *testing.T) {
	r := sample()
	// A wide latency spread at the highest concurrency.
	for i := range r.Cells {
		if r.Cells[i].Concurrency == 8 {
			lat := make([]time.Duration, 8)
			for k := range lat {
				lat[k] = time.Duration(k+1) * time.Duration(r.Cells[i].Iteration+1) * time.Millisecond
			}
			c := NewCell(r.Cells[i].Group, r.Cells[i].Route, r.Cells[i].Iteration, 0, 8, 0, r.Cells[i].Bytes, time.Duration(r.Cells[i].ElapsedNS), lat)
			c.Verified = VerifiedYes
			r.Cells[i] = c
		}
	}
	dir := filepath.Join(t.TempDir(), "plots")
	paths, err := WritePlots(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
	}
	want := []string{
		"throughput-fragmented-c1.png",
		"latency-cdf-gptoss120b-tp8-b16-2048x2KiB-fragmented-c1.png",
		"latency-cdf-llama70b-tp8-b16-4096x4KiB-fragmented-c8.png",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("plots %v, want %v", names, want)
	}
	for _, p := range paths {
		checkPNG(t, p)
	}
}

// TestWritePlotsOnePoint covers a sweep with one descriptor size, one
// route and one request: still a valid plot.
func TestWritePlotsOnePoint(t *testing.T) {
	r := &Report{Schema: Schema, Cells: []Cell{cell(small, RouteDirect, 0, 1)}}
	paths, err := WritePlots(t.TempDir(), r)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 2 {
		t.Fatalf("plots %v, want a throughput plot and a CDF", paths)
	}
	for _, p := range paths {
		checkPNG(t, p)
	}
}

func TestWritePlotsSkipsFailed(t *testing.T) {
	c := cell(small, RouteBounce, 0, 1)
	c.Verified = VerifiedFailed
	paths, err := WritePlots(t.TempDir(), &Report{Schema: Schema, Cells: []Cell{c}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if filepath.Base(p) == "throughput-fragmented-c1.png" {
			t.Fatal("a throughput plot of failed cells was written")
		}
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() < 10<<10 {
		t.Errorf("%s: %d bytes, a trivial image", path, st.Size())
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: not a PNG: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 400 {
		t.Errorf("%s: %dx%d pixels", path, b.Dx(), b.Dy())
	}
}

func TestNiceTicks(t *testing.T) {
	var labels []string
	for _, tk := range (niceTicks{}).Ticks(0, 2700) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if want := []string{"0", "500", "1000", "1500", "2000", "2500"}; !slices.Equal(labels, want) {
		t.Fatalf("labels %v, want %v", labels, want)
	}
	if ts := (niceTicks{}).Ticks(3, 3); len(ts) != 1 {
		t.Fatalf("empty range: %v", ts)
	}
}

func TestSizeTicks(t *testing.T) {
	var labels []string
	for _, tk := range (sizeTicks{}).Ticks(1500, 200000) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if want := []string{"2KiB", "4KiB", "8KiB", "16KiB", "32KiB", "64KiB", "128KiB"}; !slices.Equal(labels, want) {
		t.Fatalf("labels %v, want %v", labels, want)
	}
}
