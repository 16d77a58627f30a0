package gpucopy

// WithFullTables returns s never building compact piece tables.
func WithFullTables(s Settings) Settings {
	s.fullTables = true
	return s
}

// SegTables returns the segment tables e keeps on the device.
func SegTables(e *Engine) int {
	e.segs.mu.Lock()
	defer e.segs.mu.Unlock()
	return len(e.segs.m)
}

// MaxSegTables is maxSegTables.
const MaxSegTables = maxSegTables
