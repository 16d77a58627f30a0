package conformance

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// rig is an implementation that moves bytes (an engine, a writer, a
// gatherer or a scatterer), reduced to what the shared data rules need.
type rig interface {
	// noun names one transfer: "write", "gather", "scatter".
	noun() string
	// variants is the number of transfer shapes job accepts.
	variants() int
	// job prepares a valid transfer of n payload bytes in shape variant.
	job(c *rc, n uint64, variant int) (*job, error)
	// badJobs prepares transfers that must be rejected without writing.
	badJobs(c *rc) ([]*job, error)
}

// dataRules returns the rules shared by every kind that moves bytes. mk
// turns a fixture into a rig.
func dataRules[F any](kind string, noun string, mk func(c *rc, f F) (rig, error)) []rule[F] {
	with := func(body func(c *rc, g rig) error) func(c *rc, f F) error {
		return func(c *rc, f F) error {
			g, err := mk(c, f)
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			return body(c, g)
		}
	}
	return []rule[F]{
		{kind + "/byte-exact", fmt.Sprintf("every %s of every Config.Sizes size, at aligned and unaligned offsets, ends with the destination equal to the source, no byte outside it written and the source unchanged", noun), with(ruleByteExact)},
		{kind + "/done-means-landed", fmt.Sprintf("when Poll first reports Done for a %s, every destination byte already holds its final value", noun), with(ruleDoneMeansLanded)},
		{kind + "/quiescent-after-done", fmt.Sprintf("after Poll reports Done the %s neither reads the source nor writes the destination any more: watched for Settle after each, then for Config.QuietWatch over all at once (a retransmission comes late)", noun), with(ruleQuiescentAfterDone)},
		{kind + "/poll-contract", "Poll never blocks, reports Done without an error and Failed with one, and once terminal keeps reporting the same status", with(rulePollContract)},
		{kind + "/terminal-stable", "a terminal Poll answers the same (status and error) after time has passed and after other ops were released", with(ruleTerminalStable)},
		{kind + "/failure-reported", fmt.Sprintf("a %s outside registered or granted memory is refused by the call or ends Failed, never Done, and writes nothing", noun), with(ruleFailureReported)},
		{kind + "/failure-sentinel", "the error of a refused out-of-bounds or unregistered access wraps transfer.ErrOutOfBounds or transfer.ErrNotRegistered", with(ruleFailureSentinel)},
		{kind + "/release-terminal", "Release returns nil after Poll reported Done and after it reported Failed", with(ruleReleaseTerminal)},
		{kind + "/release-pending", "Release of an op whose last Poll reported Pending returns transfer.ErrInUse and changes nothing (skipped when no op is ever seen pending)", with(ruleReleasePending)},
		{kind + "/concurrent", fmt.Sprintf("Config.Concurrency goroutines posting %ss with distinct patterns at once all get byte-exact results, with no cross-talk", noun), with(ruleConcurrent)},
	}
}

func ruleByteExact(c *rc, g rig) error {
	for _, n := range c.cfg.Sizes {
		for v := range g.variants() {
			j, err := g.job(c, n, v)
			if err != nil {
				return fmt.Errorf("setup of a %d-byte %s: %w", n, g.noun(), err)
			}
			op, err := c.complete(j)
			if err != nil {
				return err
			}
			doneAt := time.Now()
			if m := j.mismatch(); m != "" {
				if d, ok := c.eventually(j, doneAt); ok {
					c.note("%s: the bytes were right only %v after Done (see done-means-landed)", j.what, d.Round(time.Microsecond))
				} else {
					_ = op.Release()
					return fmt.Errorf("%s: %s", j.what, j.mismatch())
				}
			}
			_ = op.Release()
		}
	}
	return nil
}

func ruleDoneMeansLanded(c *rc, g rig) error {
	for _, n := range c.cfg.Sizes {
		for _, v := range []int{0, g.variants() - 1} {
			j, err := g.job(c, n, v)
			if err != nil {
				return fmt.Errorf("setup of a %d-byte %s: %w", n, g.noun(), err)
			}
			op, err := c.complete(j)
			if err != nil {
				return err
			}
			// complete returns on the very Poll that first reported Done.
			doneAt := time.Now()
			if m := j.mismatch(); m != "" {
				msg := fmt.Sprintf("%s: when Poll first reported done, %s", j.what, m)
				if d, ok := c.eventually(j, doneAt); ok {
					msg += fmt.Sprintf("; the bytes landed %v later: Done was reported before the data landed", d.Round(time.Microsecond))
				}
				_ = op.Release()
				return errors.New(msg)
			}
			_ = op.Release()
		}
	}
	return nil
}

func ruleQuiescentAfterDone(c *rc, g rig) error {
	var jobs []*job
	var canaries [][][]byte
	for _, n := range c.cfg.Sizes {
		j, err := g.job(c, n, 0)
		if err != nil {
			return fmt.Errorf("setup of a %d-byte %s: %w", n, g.noun(), err)
		}
		op, err := c.complete(j)
		if err != nil {
			return err
		}
		if m := c.watchQuiet(j, "Poll reported done"); m != "" {
			c.tainted("%s touched memory after Done", j.what)
			_ = op.Release()
			return fmt.Errorf("%s: %s: a terminal Poll promises that no memory of the op is touched any more", j.what, m)
		}
		_ = op.Release()
		// Scribbled again and watched for longer, all at once at the end:
		// a retransmission comes late.
		jobs, canaries = append(jobs, j), append(canaries, c.scribble(j))
	}
	time.Sleep(c.cfg.QuietWatch)
	for i, j := range jobs {
		if m := unchanged(j, canaries[i], c.cfg.QuietWatch, "Poll reported done and the op was released"); m != "" {
			c.tainted("a %s touched memory long after Done", g.noun())
			return fmt.Errorf("%s: a terminal Poll promises that no memory of the op is touched any more, bytes re-sent later included", m)
		}
	}
	return nil
}

// pollAgain checks that later Polls repeat the terminal outcome.
func pollAgain(c *rc, op transfer.Op, first outcome, what string) error {
	for i := range 3 {
		t0 := time.Now()
		st, err := op.Poll()
		if qerr := c.quick(what+": Poll after terminal", t0); qerr != nil {
			return qerr
		}
		if st != first.st || (err == nil) != (first.err == nil) {
			return fmt.Errorf("%s: Poll %d after the first terminal Poll (%v) reported %v (err %v); a terminal status never changes",
				what, i+2, first, st, err)
		}
	}
	return nil
}

func checkOutcomeShape(o outcome, what string) error {
	switch {
	case o.st == transfer.Done && o.err != nil:
		return fmt.Errorf("%s: Poll reported done with error %v; Done carries no error", what, o.err)
	case o.st == transfer.Failed && o.err == nil:
		return fmt.Errorf("%s: Poll reported failed with a nil error; Failed carries its cause", what)
	}
	return nil
}

func rulePollContract(c *rc, g rig) error {
	n := c.cfg.Sizes[len(c.cfg.Sizes)/2]
	j, err := g.job(c, n, 0)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	op, perr, err := c.post(j)
	if err != nil {
		return err
	}
	if perr != nil {
		return fmt.Errorf("%s: rejected: %v", j.what, perr)
	}
	if err := pollShape(c, op, j.what); err != nil {
		return err
	}
	bad, err := g.badJobs(c)
	if err != nil {
		return fmt.Errorf("setup of invalid %ss: %w", g.noun(), err)
	}
	for _, j := range bad {
		op, perr, err := c.post(j)
		if err != nil {
			return err
		}
		if perr != nil {
			continue
		}
		if err := pollShape(c, op, j.what); err != nil {
			return err
		}
	}
	return nil
}

// pollShape waits for op, checks that its terminal Poll and the Polls after
// it have the contract's shape, and releases it.
func pollShape(c *rc, op transfer.Op, what string) error {
	o, err := c.wait(op, what)
	if err != nil {
		return err
	}
	if err := checkOutcomeShape(o, what); err != nil {
		return err
	}
	if err := pollAgain(c, op, o, what); err != nil {
		return err
	}
	_ = op.Release()
	return nil
}

// rejection is what the implementation did with a bad job.
type rejection struct {
	j     *job
	cause error
	how   string // "the call", "a failed op" or "a done op"
	wrote string // what was written, if anything
}

// runBad posts every bad job of g and records how each was handled. It
// fails only when the implementation blocks or never finishes an op.
func runBad(c *rc, g rig) ([]rejection, error) {
	bad, err := g.badJobs(c)
	if err != nil {
		return nil, fmt.Errorf("setup of invalid %ss: %w", g.noun(), err)
	}
	var out []rejection
	for _, j := range bad {
		op, perr, err := c.post(j)
		if err != nil {
			return nil, err
		}
		r := rejection{j: j, cause: perr, how: "the call"}
		if perr == nil {
			o, err := c.wait(op, j.what)
			if err != nil {
				return nil, err
			}
			_ = op.Release()
			r.cause, r.how = o.err, "a failed op"
			if o.st == transfer.Done {
				r.how = "a done op"
				c.tainted("%s reported done", j.what)
			}
		}
		r.wrote = j.changed()
		out = append(out, r)
	}
	// A write that lands later is still a write.
	time.Sleep(c.cfg.Settle)
	for i := range out {
		if r := &out[i]; r.wrote == "" {
			if m := r.j.changed(); m != "" {
				r.wrote = fmt.Sprintf("within %v %s", c.cfg.Settle, m)
			}
		}
		if out[i].wrote != "" {
			c.tainted("%s wrote memory", out[i].j.what)
		}
	}
	return out, nil
}

func ruleFailureReported(c *rc, g rig) error {
	rs, err := runBad(c, g)
	if err != nil {
		return err
	}
	for _, r := range rs {
		switch {
		case r.how == "a done op":
			return fmt.Errorf("%s: Poll reported done; want an error from the call or a failed op (the failure was swallowed)", r.j.what)
		case r.wrote != "":
			return fmt.Errorf("%s was refused by %s (%v) but %s: nothing may be written", r.j.what, r.how, r.cause, r.wrote)
		case r.cause == nil:
			return fmt.Errorf("%s: refused by %s with a nil error", r.j.what, r.how)
		}
	}
	return nil
}

func ruleFailureSentinel(c *rc, g rig) error {
	rs, err := runBad(c, g)
	if err != nil {
		return err
	}
	checked := 0
	for _, r := range rs {
		if r.how == "a done op" || r.j.sentinels == nil || (r.j.optional && errors.Is(r.cause, transfer.ErrUnsupported)) {
			continue // not refused (failure-reported says so), or no sentinel to expect
		}
		checked++
		if !anyOf(r.cause, r.j.sentinels) {
			return fmt.Errorf("%s: refused by %s with %q, which wraps neither %s", r.j.what, r.how, fmt.Sprint(r.cause), names(r.j.sentinels))
		}
	}
	if checked == 0 {
		return c.skipf("no invalid %s was refused", g.noun())
	}
	return nil
}

func ruleReleaseTerminal(c *rc, g rig) error {
	j, err := g.job(c, 4096, 0)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	op, err := c.complete(j)
	if err != nil {
		return err
	}
	if err := op.Release(); err != nil {
		return fmt.Errorf("%s: Release after done: %v; want nil", j.what, err)
	}
	bad, err := g.badJobs(c)
	if err != nil {
		return fmt.Errorf("setup of invalid %ss: %w", g.noun(), err)
	}
	failed := 0
	for _, j := range bad {
		op, perr, err := c.post(j)
		if err != nil {
			return err
		}
		if perr != nil {
			continue
		}
		o, err := c.wait(op, j.what)
		if err != nil {
			return err
		}
		if o.st != transfer.Failed {
			_ = op.Release() // a swallowed failure is failure-reported's finding
			continue
		}
		failed++
		if err := op.Release(); err != nil {
			return fmt.Errorf("%s: Release after failed: %v; want nil", j.what, err)
		}
	}
	if failed == 0 {
		c.note("Release after Failed not exercised: every invalid %s was refused by the call itself", g.noun())
	}
	return nil
}

func ruleReleasePending(c *rc, g rig) error {
	j, err := g.job(c, c.cfg.maxSize(), 0)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	const attempts = 20
	for range attempts {
		j.reset()
		op, perr, err := c.post(j)
		if err != nil {
			return err
		}
		if perr != nil {
			return fmt.Errorf("%s: rejected: %v", j.what, perr)
		}
		st, _ := op.Poll()
		if st != transfer.Pending {
			if _, err := c.wait(op, j.what); err != nil {
				return err
			}
			_ = op.Release()
			continue
		}
		rerr := op.Release()
		if rerr == nil {
			// Maybe the op finished between Poll and Release; the
			// destination says whether it had.
			if m := j.mismatch(); m != "" {
				c.tainted("%s released while pending", j.what)
				return fmt.Errorf("%s: Release after a pending Poll returned nil while the op was still running (%s); want transfer.ErrInUse", j.what, m)
			}
			continue
		}
		if !errors.Is(rerr, transfer.ErrInUse) {
			return fmt.Errorf("%s: Release after a pending Poll: %v; want transfer.ErrInUse", j.what, rerr)
		}
		o, err := c.wait(op, j.what)
		if err != nil {
			return err
		}
		if o.st != transfer.Done {
			return fmt.Errorf("%s: after a refused Release, Poll reported %v; Release on a pending op changes nothing", j.what, o)
		}
		if m := j.mismatch(); m != "" {
			return fmt.Errorf("%s: after a refused Release: %s", j.what, m)
		}
		if err := op.Release(); err != nil {
			return fmt.Errorf("%s: Release after done (following a refused Release): %v; want nil", j.what, err)
		}
		return nil
	}
	return c.skipf("no %s of %d bytes was still pending at its first Poll in %d attempts", g.noun(), c.cfg.maxSize(), attempts)
}

// concurrentSize caps the sizes the concurrency rule moves, to bound memory.
const concurrentSize = 1 << 20

func ruleConcurrent(c *rc, g rig) error {
	const per = 4
	w := c.cfg.Concurrency
	jobs := make([][]*job, w)
	k := 0
	for i := range w {
		for range per {
			n := min(c.cfg.Sizes[k%len(c.cfg.Sizes)], concurrentSize)
			j, err := g.job(c, n, k%g.variants())
			if err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			j.what = fmt.Sprintf("goroutine %d: %s", i, j.what)
			jobs[i] = append(jobs[i], j)
			k++
		}
	}
	errs := make([]error, w)
	var wg sync.WaitGroup
	for i := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, j := range jobs[i] {
				op, err := c.complete(j)
				if err != nil {
					errs[i] = err
					return
				}
				if m := j.mismatch(); m != "" {
					_ = op.Release()
					errs[i] = fmt.Errorf("%s: %s", j.what, m)
					return
				}
				_ = op.Release()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Everything is done: each goroutine's memory must still hold its own
	// bytes (a late write from another goroutine's op would show here).
	for _, js := range jobs {
		for _, j := range js {
			if m := j.mismatch(); m != "" {
				return fmt.Errorf("%s: after every goroutine finished: %s", j.what, m)
			}
		}
	}
	return nil
}
