package costmodel

import (
	"fmt"
	"time"
)

// Probe is one timed copy of the calibration probe: Bytes copied as Runs
// runs took Elapsed (the best of a few tries).
type Probe struct {
	Bytes   uint64
	Runs    int
	Elapsed time.Duration
}

// FitCopy derives the copy bandwidth and per-run cost from two probes of
// the same bytes: one copied as a single run (or a few), one as many. The
// bandwidth comes from the first; the per-run cost from the extra time of
// the second over its extra runs (never negative).
func FitCopy(few, many Probe) (bandwidth float64, perRun time.Duration, err error) {
	if few.Bytes == 0 || few.Elapsed <= 0 || many.Elapsed <= 0 || many.Runs <= few.Runs || few.Runs < 1 {
		return 0, 0, fmt.Errorf("costmodel: probes %+v and %+v: want timed copies of some bytes, the second in more runs", few, many)
	}
	bandwidth = float64(few.Bytes) / few.Elapsed.Seconds()
	// Scale the second probe's copy time to the first's bytes.
	base := time.Duration(float64(few.Elapsed) * float64(many.Bytes) / float64(few.Bytes))
	perRun = max(0, (many.Elapsed-base)/time.Duration(many.Runs-few.Runs))
	return bandwidth, perRun, nil
}
