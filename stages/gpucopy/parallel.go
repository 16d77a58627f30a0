package gpucopy

import (
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/bouncekv/bounce/cuda/kernels"
	"github.com/bouncekv/bounce/transfer"
)

// Parallel build of the descriptor form's piece table.
const (
	// runsPerWorker is the fewest runs worth a build worker of their own.
	runsPerWorker = 1024
	// parallelMinRuns is the fewest runs built on several workers: on the
	// H200 machine 2,048 runs on two workers took longer than on one
	// (53 against 47 ns a run), 4,096 on four less (30 against 45;
	// docs/BENCHMARKS.md issue 24).
	parallelMinRuns = 4096
	// maxBuildWorkers caps the workers of one Submit.
	maxBuildWorkers = 8
)

// buildWorkers returns how many goroutines build a table of n runs.
func (e *Engine) buildWorkers(n int) int {
	if e.workers > 0 {
		return min(e.workers, max(1, n))
	}
	if n < parallelMinRuns {
		return 1
	}
	return max(1, min(n/runsPerWorker, runtime.GOMAXPROCS(0), maxBuildWorkers))
}

// part is one build worker's share of a request: runs [lo, hi), checked
// into its own scope and cut into its own pieces (a buffer the context
// keeps, so no request allocates one), then copied to the table at off.
type part struct {
	scope
	lo, hi int
	pieces []transfer.Run
	bytes  uint64
	off    int
	err    error
}

// run checks and cuts the part's runs; runs are read once.
func (p *part) run(e *Engine, region transfer.Desc, runs []transfer.Run) {
	p.pins, p.last = p.pins[:0], transfer.Desc{}
	p.pieces, p.bytes, p.err = p.pieces[:0], 0, nil
	for i := p.lo; i < p.hi; i++ {
		r := runs[i]
		if r.Len == 0 || r.Count == 0 {
			continue
		}
		if err := e.checkRun(&p.scope, region, i, r); err != nil {
			p.err = err
			return
		}
		p.bytes += r.Len * r.Count
		p.pieces = kernels.AppendPieces(p.pieces, r, kernels.PieceBytes)
	}
}

// buildParallel is build's loop over w goroutines (the caller's among
// them): each checks and cuts its share of runs into its part's pieces,
// then each copies its pieces into the pinned table at its offset. The
// first failing run (the lowest part's) is the error, as on one
// goroutine.
func (e *Engine) buildParallel(c *copyCtx, region transfer.Desc, runs []transfer.Run, w int) error {
	if len(c.work) < w {
		c.work = append(c.work, make([]part, w-len(c.work))...)
	}
	parts := c.work[:w]
	per := (len(runs) + w - 1) / w
	for i := range parts {
		parts[i].lo, parts[i].hi = min(i*per, len(runs)), min((i+1)*per, len(runs))
	}
	fanOut(parts, func(p *part) { p.run(e, region, runs) })
	n := 0
	c.bytes = 0
	for i := range parts {
		p := &parts[i]
		if p.err != nil {
			return p.err
		}
		p.off = n
		n += len(p.pieces)
		c.bytes += p.bytes
		for _, a := range p.pins {
			if !slices.Contains(c.pins, a) {
				c.pins = append(c.pins, a)
			}
		}
	}
	if err := e.grow(c, n, 0); err != nil {
		return fmt.Errorf("piece table of %d pieces: %w", n, err)
	}
	tab := kernels.View(c.host.Bytes())[:n]
	fanOut(parts, func(p *part) { copy(tab[p.off:], p.pieces) })
	c.n = n
	return nil
}

// fanOut runs f on every part, parts[1:] on goroutines of their own and
// parts[0] on the caller's, and waits for all.
func fanOut(parts []part, f func(*part)) {
	var wg sync.WaitGroup
	for i := 1; i < len(parts); i++ {
		wg.Add(1)
		go func(p *part) {
			defer wg.Done()
			f(p)
		}(&parts[i])
	}
	f(&parts[0])
	wg.Wait()
}
