package conformance

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// GathererFixture is what a GathererFactory returns: a fresh gatherer and
// the way to register host memory with whatever it validates against.
type GathererFixture struct {
	Gatherer transfer.Gatherer
	// Register makes host memory usable by the gatherer, as a region or as
	// run addresses. For a stage that checks a *mem.Registry, pass its Add
	// method.
	Register func(d transfer.Desc) error
	// Cleanup, if set, runs after each rule; the suite closes the gatherer
	// itself before calling it.
	Cleanup func()
	// Memory is the memory the rules gather from and into; the zero value
	// is host memory. The gatherer must declare its kind
	// (transfer.MemoryKinder).
	Memory Memory
}

// GathererFactory returns a fresh GathererFixture for one rule.
type GathererFactory func() (GathererFixture, error)

// ScattererFixture is what a ScattererFactory returns; see GathererFixture.
type ScattererFixture struct {
	Scatterer transfer.Scatterer
	// Register makes host memory usable by the scatterer.
	Register func(d transfer.Desc) error
	// Cleanup, if set, runs after each rule, after the suite closed the
	// scatterer.
	Cleanup func()
	// Memory is the memory the rules scatter from and into; see
	// GathererFixture.Memory.
	Memory Memory
}

// ScattererFactory returns a fresh ScattererFixture for one rule.
type ScattererFactory func() (ScattererFixture, error)

// Gatherer runs the gather rules against fixtures from newFixture as
// subtests of t.
func Gatherer(t *testing.T, newFixture GathererFactory, cfg Config) {
	t.Helper()
	gathererSuite(newFixture).test(t, cfg)
}

// CheckGatherer runs the gather rules and returns the report.
func CheckGatherer(newFixture GathererFactory, cfg Config) Report {
	return gathererSuite(newFixture).check(cfg)
}

// Scatterer runs the scatter rules against fixtures from newFixture as
// subtests of t.
func Scatterer(t *testing.T, newFixture ScattererFactory, cfg Config) {
	t.Helper()
	scattererSuite(newFixture).test(t, cfg)
}

// CheckScatterer runs the scatter rules and returns the report.
func CheckScatterer(newFixture ScattererFactory, cfg Config) Report {
	return scattererSuite(newFixture).check(cfg)
}

// stageRig is a gatherer or scatterer under test.
type stageRig struct {
	scatter  bool
	do       func(region transfer.Desc, runs []transfer.Run) (transfer.Op, error)
	register func(d transfer.Desc) error
	stage    any // the stage itself, probed for the block form
}

// stageParts is what a gather or scatter fixture yields, stage-agnostic.
type stageParts struct {
	do       func(region transfer.Desc, runs []transfer.Run) (transfer.Op, error)
	closer   interface{ Close() error }
	subject  string
	register func(d transfer.Desc) error
	cleanup  func()
	memory   Memory
	stage    any
}

func gathererSuite(newFixture GathererFactory) suite[*stageRig] {
	return stageSuite("gather", "GathererFixture.Gatherer", false, func() (stageParts, error) {
		if newFixture == nil {
			return stageParts{}, errors.New("nil GathererFactory")
		}
		f, err := newFixture()
		if err != nil {
			return stageParts{}, err
		}
		p := stageParts{register: f.Register, cleanup: f.Cleanup, memory: f.Memory}
		if f.Gatherer != nil {
			p.do, p.closer, p.subject, p.stage = f.Gatherer.Gather, f.Gatherer, fmt.Sprintf("%T", f.Gatherer), f.Gatherer
		}
		return p, nil
	})
}

func scattererSuite(newFixture ScattererFactory) suite[*stageRig] {
	return stageSuite("scatter", "ScattererFixture.Scatterer", true, func() (stageParts, error) {
		if newFixture == nil {
			return stageParts{}, errors.New("nil ScattererFactory")
		}
		f, err := newFixture()
		if err != nil {
			return stageParts{}, err
		}
		p := stageParts{register: f.Register, cleanup: f.Cleanup, memory: f.Memory}
		if f.Scatterer != nil {
			p.do, p.closer, p.subject, p.stage = f.Scatterer.Scatter, f.Scatterer, fmt.Sprintf("%T", f.Scatterer), f.Scatterer
		}
		return p, nil
	})
}

// stageSuite is the suite of one stage kind over fixtures from open; field
// names the fixture's stage field in errors.
func stageSuite(kind, field string, scatter bool, open func() (stageParts, error)) suite[*stageRig] {
	return suite[*stageRig]{
		kind:  kind,
		rules: stageRules(kind),
		open: func() (opened[*stageRig], error) {
			p, err := open()
			if err != nil {
				return opened[*stageRig]{}, err
			}
			cleanup := func() {
				if p.closer != nil {
					_ = p.closer.Close()
				}
				if p.cleanup != nil {
					p.cleanup()
				}
			}
			if p.memory.Unavailable != "" {
				return opened[*stageRig]{cleanup: cleanup, memory: p.memory}, nil
			}
			if p.do == nil || p.register == nil {
				return opened[*stageRig]{cleanup: cleanup}, fmt.Errorf("%s or Register is nil", field)
			}
			o := opened[*stageRig]{
				f:       &stageRig{scatter: scatter, do: p.do, register: p.register, stage: p.stage},
				cleanup: cleanup,
				subject: p.subject,
				memory:  p.memory,
			}
			{
				if err := transfer.CheckKinds(p.stage, field, []transfer.Desc{{Kind: p.memory.Kind}}); err != nil {
					return o, fmt.Errorf("%s: Memory: %w", field, err)
				}
			}
			return o, nil
		},
	}
}

func stageRules(kind string) []rule[*stageRig] {
	mk := func(_ *rc, s *stageRig) (rig, error) { return s, nil }
	rules := append(dataRules(kind, kind, mk), blockStageRules(kind)...)
	call := "Gather"
	if kind == "scatter" {
		call = "Scatter"
	}
	return append(rules, rule[*stageRig]{
		kind + "/busy",
		fmt.Sprintf("%s never blocks: with its copy contexts exhausted it returns transfer.ErrBusy having written nothing, and the same request succeeds once an op is released (skipped when ErrBusy never comes)", call),
		func(c *rc, s *stageRig) error { return ruleBusy(c, s) },
	})
}

func (s *stageRig) noun() string {
	if s.scatter {
		return "scatter"
	}
	return "gather"
}

// variants: one unaligned run; a random plan with merged (Count > 1,
// strided) runs; a random plan of single-copy runs.
func (s *stageRig) variants() int { return 3 }

// plan is a set of runs with addresses relative to a pool of memory.
type plan struct {
	runs      []transfer.Run
	regionLen uint64
	poolLen   uint64
}

// randomPlan draws runs moving n bytes in total. Region ranges never
// overlap, and neither do address ranges, so the result of the copy does
// not depend on its order. Runs are shuffled.
func randomPlan(c *rc, n uint64, merged bool) plan {
	r := c.rng
	maxLen := max(1, n/(4+r.Uint64N(29)))
	var p plan
	rc, ac := r.Uint64N(8), r.Uint64N(64)
	for left := n; left > 0; {
		count := uint64(1)
		if merged && left >= 2 && r.IntN(3) > 0 {
			count = 2 + r.Uint64N(min(15, left-1))
		}
		l := 1 + r.Uint64N(min(maxLen, left/count))
		run := transfer.Run{RegionOff: rc, Addr: ac, Len: l, Count: count}
		if count > 1 {
			run.RegionStride = l
			if r.IntN(2) == 0 {
				run.RegionStride += r.Uint64N(8)
			}
			run.AddrStride = l + r.Uint64N(64)
		} else {
			// Strides of a single copy are ignored; make them noisy.
			switch r.IntN(3) {
			case 1:
				run.RegionStride, run.AddrStride = r.Uint64N(1<<20), r.Uint64N(1<<20)
			case 2:
				run.RegionStride, run.AddrStride = ^uint64(0), ^uint64(0)
			}
		}
		_, rend, _ := run.RegionSpan()
		_, aend, _ := run.AddrSpan()
		rc = rend
		if r.IntN(2) == 0 {
			rc += r.Uint64N(16)
		}
		ac = aend + r.Uint64N(32)
		p.runs = append(p.runs, run)
		left -= l * count
	}
	r.Shuffle(len(p.runs), func(i, k int) { p.runs[i], p.runs[k] = p.runs[k], p.runs[i] })
	p.regionLen = rc + 1 + r.Uint64N(8)
	p.poolLen = ac + 1 + r.Uint64N(8)
	return p
}

func singlePlan(c *rc, n uint64) plan {
	ro, ao := 1+2*c.rng.Uint64N(4), 1+2*c.rng.Uint64N(2048)
	return plan{
		runs:      []transfer.Run{{RegionOff: ro, Addr: ao, Len: n, Count: 1}},
		regionLen: ro + n + 5,
		poolLen:   ao + n + 11,
	}
}

// regionGuard is the number of registered bytes around a region.
const regionGuard = 13

// job prepares a transfer of n bytes. Region and pool are registered
// whole; the region is a sub-range of its buffer at an odd address.
func (s *stageRig) job(c *rc, n uint64, variant int) (*job, error) {
	var p plan
	switch variant {
	case 0:
		p = singlePlan(c, n)
	case 1:
		p = randomPlan(c, n, true)
	default:
		p = randomPlan(c, n, false)
	}
	rbuf, err := c.buf(regionGuard + p.regionLen + regionGuard)
	if err != nil {
		return nil, err
	}
	pool, err := c.buf(p.poolLen)
	if err != nil {
		return nil, err
	}
	c.fill(rbuf)
	c.fill(pool)
	c.step("registering the region and pool of a %d-byte %s", n, s.noun())
	if err := s.register(c.desc(rbuf)); err != nil {
		return nil, fmt.Errorf("registering the region's buffer: %w", err)
	}
	if err := s.register(c.desc(pool)); err != nil {
		return nil, fmt.Errorf("registering the pool: %w", err)
	}
	regionB := rbuf[regionGuard : regionGuard+p.regionLen]
	region := c.desc(regionB)
	base := c.desc(pool).Addr
	runs := make([]transfer.Run, len(p.runs))
	merged := 0
	for i, r := range p.runs {
		r.Addr += base
		runs[i] = r
		if r.Count > 1 {
			merged++
		}
	}
	// The expected result, by the definition of a run.
	want := make([]byte, 0)
	var from, to []byte
	if s.scatter {
		want = append(want, pool...)
		from, to = regionB, want
	} else {
		want = append(want, regionB...)
		from, to = pool, want
	}
	for _, r := range p.runs {
		for i := range r.Count {
			ro, ao := r.RegionOff+i*r.RegionStride, r.Addr+i*r.AddrStride
			if s.scatter {
				copy(to[ao:ao+r.Len], from[ro:ro+r.Len])
			} else {
				copy(to[ro:ro+r.Len], from[ao:ao+r.Len])
			}
		}
	}
	j := &job{
		what:        fmt.Sprintf("%s of %d bytes in %d runs (%d merged)", s.noun(), n, len(runs), merged),
		post:        func() (transfer.Op, error) { return s.do(region, runs) },
		nonBlocking: true,
	}
	j.watch("guard before the region:", rbuf[:regionGuard], nil)
	j.watch("guard after the region:", rbuf[regionGuard+p.regionLen:], nil)
	if s.scatter {
		j.watch("region", regionB, nil)
		j.watch("destination memory", pool, want)
	} else {
		j.watch("source memory", pool, nil)
		j.watch("region", regionB, want)
	}
	return j, nil
}

// badJobs prepares requests that must be refused. Each starts with a valid
// run, so "nothing written" means the valid run was not copied either.
func (s *stageRig) badJobs(c *rc) ([]*job, error) {
	const regionLen, poolReg, poolLen = 256, 4096, 8192
	rbuf, err := c.buf(regionGuard + regionLen + 64)
	if err != nil {
		return nil, err
	}
	pool, err := c.buf(poolLen)
	if err != nil {
		return nil, err
	}
	loose, err := c.buf(4096)
	if err != nil {
		return nil, err
	}
	for _, b := range [][]byte{rbuf, pool, loose} {
		c.fill(b)
	}
	// The region's buffer is registered up to just past the region.
	if err := s.register(c.desc(rbuf[:regionGuard+regionLen+8])); err != nil {
		return nil, fmt.Errorf("registering the region's buffer: %w", err)
	}
	if err := s.register(c.desc(pool[:poolReg])); err != nil {
		return nil, fmt.Errorf("registering the pool: %w", err)
	}
	region := c.desc(rbuf[regionGuard : regionGuard+regionLen])
	p, l := c.desc(pool).Addr, c.desc(loose).Addr
	ok := transfer.Run{RegionOff: 0, Addr: p, Len: 32, Count: 1}
	bounds := []error{transfer.ErrOutOfBounds, transfer.ErrNotRegistered}
	cases := []struct {
		what   string
		region transfer.Desc
		bad    transfer.Run
	}{
		{"run past the end of the region", region, transfer.Run{RegionOff: regionLen - 4, Addr: p + 64, Len: 8, Count: 1}},
		{"strided run whose last copy passes the region end", region, transfer.Run{RegionOff: 64, Addr: p + 64, Len: 8, Count: 4, RegionStride: 70, AddrStride: 8}},
		{"run straddling the end of registered memory", region, transfer.Run{RegionOff: 64, Addr: p + poolReg - 4, Len: 8, Count: 1}},
		{"strided run whose last copy leaves registered memory", region, transfer.Run{RegionOff: 64, Addr: p, Len: 8, Count: 4, RegionStride: 8, AddrStride: poolReg/3 + 8}},
		{"run in unregistered memory", region, transfer.Run{RegionOff: 64, Addr: l, Len: 8, Count: 1}},
		{"run whose address span overflows", region, transfer.Run{RegionOff: 64, Addr: p, Len: 8, Count: 1 << 40, RegionStride: 0, AddrStride: 1 << 40}},
		{"run whose region span overflows", region, transfer.Run{RegionOff: 64, Addr: p, Len: 8, Count: 1 << 40, RegionStride: 1 << 40, AddrStride: 0}},
		{"run at an address that wraps", region, transfer.Run{RegionOff: 64, Addr: ^uint64(0) - 3, Len: 8, Count: 1}},
		{"region in unregistered memory", c.desc(loose[:regionLen]), transfer.Run{RegionOff: 64, Addr: p + 64, Len: 8, Count: 1}},
		{"region straddling the end of registered memory", c.desc(rbuf[regionGuard+32 : regionGuard+32+regionLen]), transfer.Run{RegionOff: 64, Addr: p + 64, Len: 8, Count: 1}},
	}
	var out []*job
	for _, k := range cases {
		runs := []transfer.Run{ok, k.bad}
		j := &job{
			what:        fmt.Sprintf("%s with a %s", s.noun(), k.what),
			post:        func() (transfer.Op, error) { return s.do(k.region, runs) },
			nonBlocking: true,
			sentinels:   bounds,
		}
		j.watch("region buffer", rbuf, nil)
		j.watch("pool", pool, nil)
		j.watch("unregistered buffer", loose, nil)
		out = append(out, j)
	}
	return out, nil
}

// busyOps bounds how many ops ruleBusy keeps outstanding looking for ErrBusy.
const busyOps = 256

func ruleBusy(c *rc, s *stageRig) error {
	var (
		jobs []*job
		ops  []transfer.Op
		busy *job
	)
	defer func() {
		for i, op := range ops {
			if op != nil {
				_, _ = c.wait(op, jobs[i].what)
				_ = op.Release()
			}
		}
	}()
	for range busyOps {
		j, err := s.job(c, 4096, 0)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		t0 := time.Now()
		op, err := j.post()
		if qerr := c.quick(fmt.Sprintf("%s with %d ops outstanding", j.what, len(ops)), t0); qerr != nil {
			if op != nil {
				jobs, ops = append(jobs, j), append(ops, op)
			}
			return qerr
		}
		if errors.Is(err, transfer.ErrBusy) {
			if m := j.changed(); m != "" {
				return fmt.Errorf("%s returned ErrBusy with %d ops outstanding, but %s: ErrBusy means nothing happened", j.what, len(ops), m)
			}
			busy = j
			break
		}
		if err != nil {
			return fmt.Errorf("%s with %d ops outstanding: %v", j.what, len(ops), err)
		}
		jobs, ops = append(jobs, j), append(ops, op)
	}
	if busy == nil {
		return c.skipf("no ErrBusy with %d ops outstanding", len(ops))
	}
	if len(ops) == 0 {
		return fmt.Errorf("%s returned ErrBusy with no op outstanding", busy.what)
	}
	o, err := c.wait(ops[0], jobs[0].what)
	if err != nil {
		return err
	}
	if o.st != transfer.Done {
		return fmt.Errorf("%s: Poll reported %v; want done", jobs[0].what, o)
	}
	if err := ops[0].Release(); err != nil {
		return fmt.Errorf("%s: Release after done: %v", jobs[0].what, err)
	}
	ops[0] = nil
	busy.what += fmt.Sprintf(" retried after ErrBusy and one Release (%d ops outstanding)", len(ops)-1)
	op, err := c.complete(busy)
	if err != nil {
		return err
	}
	defer op.Release()
	if m := busy.mismatch(); m != "" {
		return fmt.Errorf("%s: %s", busy.what, m)
	}
	for i, op := range ops {
		if op == nil {
			continue
		}
		o, err := c.wait(op, jobs[i].what)
		if err != nil {
			return err
		}
		if o.st != transfer.Done {
			return fmt.Errorf("%s: Poll reported %v; want done", jobs[i].what, o)
		}
		if m := jobs[i].mismatch(); m != "" {
			return fmt.Errorf("%s (one of %d outstanding): %s", jobs[i].what, len(ops), m)
		}
	}
	return nil
}
