package mem

import (
	"os"
	"strings"
	"testing"
	"testing/fstest"
)

const meminfo = "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\n"

func TestReadBudget(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	for _, tc := range []struct {
		name   string
		fs     fstest.MapFS
		bytes  uint64
		limit  uint64
		cgroup string
	}{
		{"meminfo only", fstest.MapFS{"proc/meminfo": file(meminfo)}, 8000000 << 10, 0, ""},
		{"v2 limit below MemAvailable", fstest.MapFS{
			"proc/meminfo":                       file(meminfo),
			"proc/self/cgroup":                   file("0::/job/a\n"),
			"sys/fs/cgroup/job/a/memory.max":     file("max\n"),
			"sys/fs/cgroup/job/a/memory.current": file("100\n"),
			"sys/fs/cgroup/job/memory.max":       file("1073741824\n"),
			"sys/fs/cgroup/job/memory.current":   file("73741824\n"),
		}, 1<<30 - 73741824, 1 << 30, "/sys/fs/cgroup/job/memory.max"},
		{"v2 max everywhere", fstest.MapFS{
			"proc/meminfo":                   file(meminfo),
			"proc/self/cgroup":               file("0::/a\n"),
			"sys/fs/cgroup/a/memory.max":     file("max\n"),
			"sys/fs/cgroup/a/memory.current": file("5\n"),
		}, 8000000 << 10, 0, ""},
		{"v1 unlimited is no bound", fstest.MapFS{
			"proc/meminfo":     file(meminfo),
			"proc/self/cgroup": file("4:memory:/p\n0::/\n"),
			"sys/fs/cgroup/memory/p/memory.limit_in_bytes": file("9223372036854771712\n"),
			"sys/fs/cgroup/memory/p/memory.usage_in_bytes": file("7066808320\n"),
		}, 8000000 << 10, 0, ""},
		{"v1 limit", fstest.MapFS{
			"proc/meminfo":     file(meminfo),
			"proc/self/cgroup": file("4:cpu,memory:/p\n"),
			"sys/fs/cgroup/memory/p/memory.limit_in_bytes": file("536870912\n"),
			"sys/fs/cgroup/memory/p/memory.usage_in_bytes": file("36870912\n"),
		}, 500000000, 536870912, "/sys/fs/cgroup/memory/p/memory.limit_in_bytes"},
		{"usage above limit leaves nothing", fstest.MapFS{
			"proc/meminfo":                 file(meminfo),
			"sys/fs/cgroup/memory.max":     file("1000\n"),
			"sys/fs/cgroup/memory.current": file("2000\n"),
		}, 0, 1000, "/sys/fs/cgroup/memory.max"},
		{"malformed cgroup ignored", fstest.MapFS{
			"proc/meminfo":                 file(meminfo),
			"sys/fs/cgroup/memory.max":     file("lots\n"),
			"sys/fs/cgroup/memory.current": file("1\n"),
		}, 8000000 << 10, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ReadBudget(tc.fs)
			if err != nil {
				t.Fatal(err)
			}
			if b.Bytes != tc.bytes || b.CgroupLimit != tc.limit || b.Cgroup != tc.cgroup {
				t.Fatalf("budget %+v, want bytes %d limit %d cgroup %q", b, tc.bytes, tc.limit, tc.cgroup)
			}
		})
	}
}

func TestReadBudgetBadMeminfo(t *testing.T) {
	for _, s := range []string{"", "MemTotal: 5 kB\n", "MemAvailable: x kB\n", "MemAvailable:\n"} {
		if _, err := ReadBudget(fstest.MapFS{"proc/meminfo": &fstest.MapFile{Data: []byte(s)}}); err == nil || !strings.Contains(err.Error(), "meminfo") {
			t.Errorf("meminfo %q: error %v, want one naming /proc/meminfo", s, err)
		}
	}
	if _, err := ReadBudget(fstest.MapFS{}); err == nil {
		t.Error("no /proc/meminfo: no error")
	}
}

func TestBudgetFits(t *testing.T) {
	b := Budget{Bytes: 100, MemAvailable: 100}
	if err := b.Fits(90, 10); err != nil {
		t.Fatal(err)
	}
	if err := b.Fits(91, 10); err == nil || !strings.Contains(err.Error(), "MemAvailable 100") {
		t.Fatalf("91+10 of 100: %v", err)
	}
	if err := (Budget{}).Fits(1<<60, 0); err != nil {
		t.Fatalf("unknown budget: %v", err)
	}
}

// TestReadBudgetReal reads this machine's budget: known, and no more than
// MemAvailable.
func TestReadBudgetReal(t *testing.T) {
	b, err := ReadBudget(os.DirFS("/"))
	if err != nil {
		t.Skipf("no /proc/meminfo here: %v", err)
	}
	if !b.Known() || b.Bytes == 0 || b.Bytes > b.MemAvailable {
		t.Fatalf("budget %v", b)
	}
	t.Logf("budget: %v", b)
}

// TestNewArenaRefusesBeyondBudget asks for an arena larger than this
// machine's memory: refused with an error naming the budget, not an OOM
// kill (MAP_POPULATE would fault it all in).
func TestNewArenaRefusesBeyondBudget(t *testing.T) {
	b, err := ReadBudget(os.DirFS("/"))
	if err != nil || !b.Known() {
		t.Skip("no memory budget readable here")
	}
	a, err := NewArena("huge", b.Bytes+1<<30)
	if err == nil {
		a.Close()
		t.Fatal("an arena beyond the budget was created")
	}
	if !strings.Contains(err.Error(), "exceed the memory available") {
		t.Fatalf("error %v", err)
	}
}
