package mem

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
)

// Reserve is the memory an arena must leave free in the budget: room for
// the Go runtime, stacks and the engines' and control plane's buffers.
const Reserve = 64 << 20

// Budget is how much more memory this process may take before the kernel
// (MemAvailable) or its cgroup (limit minus usage) runs out.
type Budget struct {
	// Bytes is the smaller of the two bounds below that are known; it is
	// meaningless when Known is false.
	Bytes uint64
	// MemAvailable is /proc/meminfo's MemAvailable, 0 when unknown.
	MemAvailable uint64
	// CgroupLimit and CgroupUsage are the memory cgroup's limit and usage;
	// CgroupLimit is 0 when the cgroup sets no limit (or none was found).
	CgroupLimit, CgroupUsage uint64
	// Cgroup names the cgroup file the limit came from ("" when none).
	Cgroup string
}

// Known reports whether any bound was read.
func (b Budget) Known() bool { return b.MemAvailable != 0 || b.CgroupLimit != 0 }

// String describes the budget and where it came from.
func (b Budget) String() string {
	if !b.Known() {
		return "unknown"
	}
	s := fmt.Sprintf("%d bytes (MemAvailable %d", b.Bytes, b.MemAvailable)
	if b.CgroupLimit != 0 {
		s += fmt.Sprintf(", cgroup %s limit %d minus usage %d", b.Cgroup, b.CgroupLimit, b.CgroupUsage)
	}
	return s + ")"
}

// Fits returns nil when n more bytes fit in the budget with reserve bytes to
// spare (the Go runtime, stacks, engines' buffers), or an error saying by
// how much they do not. An unknown budget fits everything.
func (b Budget) Fits(n, reserve uint64) error {
	if !b.Known() || n <= b.Bytes && b.Bytes-n >= reserve {
		return nil
	}
	return fmt.Errorf("%d bytes plus a reserve of %d exceed the memory available to this process: %v", n, reserve, b)
}

// ReadBudget reads the budget from fsys, the file system rooted at "/"
// (os.DirFS("/") for the real one): /proc/meminfo, and the memory cgroup
// this process is in (/proc/self/cgroup), unified (v2: memory.max,
// memory.current) or v1 (memory.limit_in_bytes, memory.usage_in_bytes). A
// cgroup whose limit is at least MemTotal (v1's "unlimited") sets no bound.
// Only a missing or malformed /proc/meminfo is an error.
func ReadBudget(fsys fs.FS) (Budget, error) {
	info, err := fs.ReadFile(fsys, "proc/meminfo")
	if err != nil {
		return Budget{}, fmt.Errorf("mem: budget: %w", err)
	}
	avail, total, err := parseMeminfo(string(info))
	if err != nil {
		return Budget{}, fmt.Errorf("mem: budget: /proc/meminfo: %w", err)
	}
	b := Budget{Bytes: avail, MemAvailable: avail}
	cg, _ := fs.ReadFile(fsys, "proc/self/cgroup")
	var bestLeft uint64
	// The tightest cgroup bound wins: a limit may be set on an ancestor
	// rather than on this process's own cgroup.
	for _, c := range cgroupCandidates(string(cg)) {
		limit, lerr := readCgroupValue(fsys, c.limit)
		usage, uerr := readCgroupValue(fsys, c.usage)
		if lerr != nil || uerr != nil || limit == 0 || total != 0 && limit >= total {
			continue // unreadable, or no limit below the machine's memory
		}
		left := uint64(0)
		if usage < limit {
			left = limit - usage
		}
		if b.CgroupLimit == 0 || left < bestLeft {
			b.CgroupLimit, b.CgroupUsage, b.Cgroup, bestLeft = limit, usage, "/"+c.limit, left
		}
	}
	if b.CgroupLimit != 0 {
		b.Bytes = min(b.Bytes, bestLeft)
	}
	return b, nil
}

type cgroupFiles struct{ limit, usage string }

// cgroupCandidates lists the cgroup files to try, most specific first,
// from the text of /proc/self/cgroup.
func cgroupCandidates(self string) []cgroupFiles {
	var v1, v2 []cgroupFiles
	for _, line := range strings.Split(self, "\n") {
		id, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		ctrls, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		// The cgroup and each of its ancestors, below the root.
		var dirs []string
		for p := strings.Trim(path, "/"); p != "" && !strings.Contains(p, ".."); {
			dirs = append(dirs, p)
			i := strings.LastIndexByte(p, '/')
			if i < 0 {
				break
			}
			p = p[:i]
		}
		for _, d := range dirs {
			switch {
			case id == "0" && ctrls == "":
				v2 = append(v2, cgroupFiles{"sys/fs/cgroup/" + d + "/memory.max", "sys/fs/cgroup/" + d + "/memory.current"})
			case hasController(ctrls, "memory"):
				v1 = append(v1, cgroupFiles{"sys/fs/cgroup/memory/" + d + "/memory.limit_in_bytes", "sys/fs/cgroup/memory/" + d + "/memory.usage_in_bytes"})
			}
		}
	}
	// A v1 memory controller, when mounted, is the one that limits: it
	// goes before the unified hierarchy (hybrid systems list both).
	out := append(v1, v2...)
	// Inside a container the cgroup path may not be visible: the root of
	// the mount is then this process's cgroup.
	out = append(out,
		cgroupFiles{"sys/fs/cgroup/memory/memory.limit_in_bytes", "sys/fs/cgroup/memory/memory.usage_in_bytes"},
		cgroupFiles{"sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"})
	return out
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// readCgroupValue reads a cgroup file holding a byte count or "max" (0).
func readCgroupValue(fsys fs.FS, name string) (uint64, error) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}

// parseMeminfo returns MemAvailable and MemTotal in bytes.
func parseMeminfo(s string) (avail, total uint64, err error) {
	sc := bufio.NewScanner(strings.NewReader(s))
	var haveAvail bool
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || key != "MemAvailable" && key != "MemTotal" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, 0, fmt.Errorf("%s has no value", key)
		}
		v, perr := strconv.ParseUint(f[0], 10, 64)
		if perr != nil || v > 1<<53 {
			return 0, 0, fmt.Errorf("%s %q is not a count of kB", key, f[0])
		}
		if len(f) > 1 && f[1] == "kB" {
			v <<= 10
		}
		if key == "MemTotal" {
			total = v
		} else {
			avail, haveAvail = v, true
		}
	}
	if !haveAvail {
		return 0, 0, errors.New("no MemAvailable line (kernel older than 3.14?)")
	}
	return avail, total, nil
}
