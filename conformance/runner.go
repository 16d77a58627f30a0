package conformance

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/mem"
)

// AllocFunc provides host memory for the suite's buffers: size bytes that
// stay mapped until free is called. A fixture sets it when the
// implementation needs memory of a particular kind (say, a mem.Arena that a
// plugin process maps); nil means mem.Alloc.
type AllocFunc func(size uint64) (buf []byte, free func() error, err error)

// rule is one check of a suite, run against a fresh fixture F.
type rule[F any] struct {
	id      string
	summary string
	run     func(c *rc, f F) error
}

// opened is a fixture as the runner needs it.
type opened[F any] struct {
	f       F
	cleanup func()
	alloc   AllocFunc
	memory  Memory
	subject string
	// fragment is the implementation's internal fragment size, if known:
	// the rule's sizes then include one above it.
	fragment uint64
}

// suite is the rules of one kind and the way to open its fixtures.
type suite[F any] struct {
	kind  string
	rules []rule[F]
	open  func() (opened[F], error)
}

// Limits on the leak rule's message: the rules listed, and the goroutine
// dump shown for each.
const (
	maxLeaksShown = 3
	maxLeakText   = 1500
)

// leakRuleID is the ID of the kind's goroutine-leak rule.
func leakRuleID(kind string) string { return kind + "/no-goroutine-leak" }

// configRuleID is the pseudo rule that reports an invalid Config.
func configRuleID(kind string) string { return kind + "/config" }

// ruleList returns the public description of the suite's rules, the leak
// rule last.
func (s suite[F]) ruleList() []Rule {
	out := make([]Rule, 0, len(s.rules)+1)
	for _, r := range s.rules {
		out = append(out, Rule{ID: r.id, Summary: r.summary})
	}
	return append(out, Rule{
		ID:      leakRuleID(s.kind),
		Summary: "after each rule and its fixture Cleanup, no goroutine started during the rule is left running",
	})
}

// check runs the suite outside go test.
func (s suite[F]) check(cfg Config) Report {
	return s.run(cfg, func(_ string, fn func() Result) { fn() })
}

// test runs the suite as subtests of t, one per rule.
func (s suite[F]) test(t *testing.T, cfg Config) {
	t.Helper()
	s.run(cfg, func(id string, fn func() Result) {
		t.Run(strings.TrimPrefix(id, s.kind+"/"), func(t *testing.T) {
			r := fn()
			switch r.Outcome {
			case Fail:
				t.Error(r.Message)
			case Skip:
				t.Skip(r.Message)
			default:
				if r.Message != "" {
					t.Log(r.Message)
				}
			}
		})
	})
}

// run runs every rule through each, which calls fn (or, under go test,
// may not when the subtest is filtered out).
func (s suite[F]) run(cfg Config, each func(id string, fn func() Result)) Report {
	rep := Report{Kind: s.kind, Subject: cfg.Subject, Seed: cfg.Seed}
	record := func(id string, fn func() Result) {
		each(id, func() Result {
			r := fn()
			rep.Results = append(rep.Results, r)
			return r
		})
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		record(configRuleID(s.kind), func() Result {
			return Result{Rule: configRuleID(s.kind), Outcome: Fail, Message: fmt.Sprintf("[%s] %v", configRuleID(s.kind), err)}
		})
		return rep
	}
	var leaks []string
	leakChecked := 0
	for _, r := range s.rules {
		record(r.id, func() Result {
			res, leak, checked := s.runRule(r, cfg, &rep.Subject)
			if leak != "" {
				leaks = append(leaks, leak)
			}
			if checked {
				leakChecked++
			}
			return res
		})
	}
	id := leakRuleID(s.kind)
	record(id, func() Result {
		res := Result{Rule: id, Outcome: Pass}
		if ok, why := cfg.selected(id); !ok {
			res.Outcome, res.Message = Skip, fmt.Sprintf("[%s] skipped: %s", id, why)
			return res
		}
		switch {
		case len(leaks) > 0:
			res.Outcome = Fail
			shown := leaks
			if len(shown) > maxLeaksShown {
				shown = append(shown[:maxLeaksShown:maxLeaksShown], fmt.Sprintf("and after %d more rules", len(leaks)-maxLeaksShown))
			}
			res.Message = fmt.Sprintf("[%s] %s", id, strings.Join(shown, "\n"))
		case leakChecked == 0:
			res.Outcome, res.Message = Skip, fmt.Sprintf("[%s] skipped: no rule ran to completion", id)
		}
		return res
	})
	return rep
}

// skipError is returned by a rule body that skips itself.
type skipError struct{ msg string }

func (e *skipError) Error() string { return e.msg }

// runRule runs one rule against a fresh fixture and returns its result and,
// when goroutines were left behind, a description of them. checked says
// whether the leak check ran.
func (s suite[F]) runRule(r rule[F], cfg Config, subject *string) (res Result, leak string, checked bool) {
	res = Result{Rule: r.id}
	if ok, why := cfg.selected(r.id); !ok {
		res.Outcome, res.Message = Skip, fmt.Sprintf("[%s] skipped: %s", r.id, why)
		return res, "", false
	}
	leakCheck := leakRuleID(s.kind)
	watchLeaks, _ := cfg.selected(leakCheck)
	var ignore goleak.Option
	if watchLeaks {
		ignore = goleak.IgnoreCurrent()
	}
	start := time.Now()
	c := newRC(r.id, cfg)
	done := make(chan error, 1)
	go func() {
		done <- c.protect(func() error {
			c.step("opening the fixture")
			o, err := s.open()
			c.opened(o.cleanup, o.alloc, o.subject, o.memory) // a half-made fixture may need its cleanup
			if err != nil {
				return fmt.Errorf("fixture: %w", err)
			}
			if why := o.memory.Unavailable; why != "" {
				return &skipError{msg: fmt.Sprintf("%s memory unavailable here: %s", o.memory, why)}
			}
			c.cfg.Sizes = sizeFloors(c.cfg.Sizes, o.fragment)
			c.step("running the rule")
			return r.run(c, o.f)
		})
	}()
	bound := 3 * cfg.OpTimeout
	timer := time.NewTimer(bound)
	var err error
	hung := false
	select {
	case err = <-done:
	case <-timer.C:
		hung = true
		err = fmt.Errorf("did not complete within %v (3×OpTimeout); last step: %s", bound, c.lastStep())
	}
	timer.Stop()
	if cerr := c.finish(hung || (err != nil && !isSkip(err))); cerr != nil && (err == nil || isSkip(err)) {
		err = cerr
	}
	c.mu.Lock()
	if *subject == "" && c.subject != "" {
		*subject = c.subject
	}
	c.mu.Unlock()
	res.Duration = time.Since(start)
	var skip *skipError
	switch {
	case err == nil:
		res.Outcome = Pass
		res.Message = c.noteText()
	case errors.As(err, &skip):
		res.Outcome, res.Message = Skip, fmt.Sprintf("[%s] skipped: %s", r.id, skip.msg)
	default:
		res.Outcome, res.Message = Fail, fmt.Sprintf("[%s] %v", r.id, err)
	}
	if !watchLeaks || hung {
		return res, "", false
	}
	opts := []goleak.Option{ignore}
	for _, f := range cfg.IgnoreGoroutines {
		opts = append(opts, goleak.IgnoreAnyFunction(f))
	}
	if lerr := goleak.Find(opts...); lerr != nil {
		msg := lerr.Error()
		if len(msg) > maxLeakText {
			msg = msg[:maxLeakText] + " …"
		}
		return res, fmt.Sprintf("after rule %s: %s", r.id, msg), true
	}
	return res, "", true
}

func isSkip(err error) bool {
	var s *skipError
	return errors.As(err, &s)
}

// rc is the context a rule body runs with. The rng is used by the body's
// goroutine only; everything else is safe for concurrent use.
type rc struct {
	id  string
	cfg Config
	rng *rand.Rand
	// bytes fills buffers: ChaCha8 reads are fast even under -race.
	bytes *rand.ChaCha8

	mu      sync.Mutex
	where   string
	subject string
	alloc   AllocFunc
	memory  Memory
	cleanup func()
	bufs    []func() error
	taint   []string
	notes   []string
	closed  bool
}

func newRC(id string, cfg Config) *rc {
	h := fnv.New64a()
	h.Write([]byte(id))
	sum := h.Sum64()
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(cfg.Seed))
	binary.LittleEndian.PutUint64(seed[8:], sum)
	return &rc{
		id:    id,
		cfg:   cfg,
		rng:   rand.New(rand.NewPCG(uint64(cfg.Seed), sum)),
		bytes: rand.NewChaCha8(seed),
	}
}

// protect runs fn and turns a panic into an error with its stack.
func (c *rc) protect(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic during %s: %v\n%s", c.lastStep(), p, debug.Stack())
		}
	}()
	return fn()
}

func (c *rc) opened(cleanup func(), alloc AllocFunc, subject string, memory Memory) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cleanup, c.alloc, c.subject, c.memory = cleanup, alloc, subject, memory
	if memory.Alloc != nil {
		c.alloc = memory.Alloc
	}
}

// step records what the rule is doing, for the message of a rule that hangs.
func (c *rc) step(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	c.mu.Lock()
	c.where = s
	c.mu.Unlock()
}

func (c *rc) lastStep() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.where
}

// note records a remark shown with a passing result.
func (c *rc) note(format string, args ...any) {
	c.mu.Lock()
	c.notes = append(c.notes, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

func (c *rc) noteText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.notes) == 0 {
		return ""
	}
	return fmt.Sprintf("[%s] %s", c.id, strings.Join(c.notes, "; "))
}

// skipf ends the rule as skipped.
func (c *rc) skipf(format string, args ...any) error {
	return &skipError{msg: fmt.Sprintf(format, args...)}
}

// tainted records that the implementation may still touch the rule's
// memory, which is then never unmapped.
func (c *rc) tainted(format string, args ...any) {
	c.mu.Lock()
	c.taint = append(c.taint, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

// buf returns n bytes of host memory outside the Go heap, freed after the
// rule only if nothing may touch them any more.
func (c *rc) buf(n uint64) ([]byte, error) {
	c.mu.Lock()
	alloc, closed := c.alloc, c.closed
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("rule abandoned")
	}
	var (
		b    []byte
		free func() error
		err  error
	)
	if alloc != nil {
		b, free, err = alloc(n)
		if err == nil && uint64(len(b)) != n {
			err = fmt.Errorf("fixture Alloc(%d) returned %d bytes", n, len(b))
		}
	} else {
		var mb *mem.Buffer
		mb, err = mem.Alloc(n)
		if err == nil {
			b, free = mb.Bytes(), mb.Free
		}
	}
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes: %w", n, err)
	}
	c.mu.Lock()
	c.bufs = append(c.bufs, free)
	c.mu.Unlock()
	return b, nil
}

// finish runs the fixture's Cleanup (bounded by OpTimeout) and frees the
// rule's memory unless the rule failed, hung, or saw an operation that did
// not prove quiescence.
func (c *rc) finish(keepMemory bool) error {
	c.mu.Lock()
	c.closed = true
	cleanup := c.cleanup
	c.mu.Unlock()
	var err error
	if cleanup != nil {
		done := make(chan error, 1)
		go func() { done <- c.protect(func() error { cleanup(); return nil }) }()
		t := time.NewTimer(c.cfg.OpTimeout)
		select {
		case perr := <-done:
			if perr != nil {
				err = fmt.Errorf("fixture Cleanup: %w", perr)
			}
		case <-t.C:
			err = fmt.Errorf("fixture Cleanup did not return within OpTimeout (%v)", c.cfg.OpTimeout)
		}
		t.Stop()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if keepMemory || err != nil || len(c.taint) > 0 {
		c.bufs = nil // left mapped on purpose: something may still write there
		return err
	}
	for _, free := range c.bufs {
		_ = free()
	}
	c.bufs = nil
	return err
}
