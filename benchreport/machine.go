package benchreport

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes where a sweep ran.
type Machine struct {
	GOOS      string `json:"goos"`
	GOARCH    string `json:"goarch"`
	NumCPU    int    `json:"num_cpu"`
	GoVersion string `json:"go_version"`
	Hostname  string `json:"hostname,omitempty"`
	// CPUModel is the first "model name" of /proc/cpuinfo, where readable.
	CPUModel string `json:"cpu_model,omitempty"`
	// MemTotal is MemTotal of /proc/meminfo in bytes, where readable.
	MemTotal uint64 `json:"mem_total,omitempty"`
	// LoadAvg is /proc/loadavg's 1, 5 and 15 minute load averages when the
	// description was taken: other work on the machine skews absolute
	// numbers (ratios measured side by side less so).
	LoadAvg string `json:"load_avg,omitempty"`
}

// CurrentMachine describes this machine; fields it cannot read stay empty.
func CurrentMachine() Machine {
	m := Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), GoVersion: runtime.Version()}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.CPUModel = procField(b, "model name")
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.MemTotal, _ = parseKB(procField(b, "MemTotal"))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	return m
}

// PeakRSS returns the peak resident set size (VmHWM) of process pid in
// bytes, read from /proc/<pid>/status.
func PeakRSS(pid int) (uint64, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("benchreport: peak RSS of pid %d: %w", pid, err)
	}
	n, err := ParseVmHWM(b)
	if err != nil {
		return 0, fmt.Errorf("benchreport: %s: %w", path, err)
	}
	return n, nil
}

// ParseVmHWM extracts VmHWM, in bytes, from the text of /proc/<pid>/status.
func ParseVmHWM(status []byte) (uint64, error) {
	v := procField(status, "VmHWM")
	if v == "" {
		return 0, fmt.Errorf("no VmHWM line")
	}
	return parseKB(v)
}

// procField returns the trimmed value of the first "key:" line of b.
func procField(b []byte, key string) string {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// parseKB parses "1234 kB" into bytes.
func parseKB(v string) (uint64, error) {
	num, unit, _ := strings.Cut(strings.TrimSpace(v), " ")
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("value %q: %w", v, err)
	}
	switch strings.TrimSpace(unit) {
	case "kB":
		return n << 10, nil
	case "":
		return n, nil
	}
	return 0, fmt.Errorf("value %q: unknown unit", v)
}
