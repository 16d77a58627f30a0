package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// outcome is the terminal state of an operation.
type outcome struct {
	st  transfer.Status
	err error
}

func (o outcome) String() string {
	if o.err != nil {
		return fmt.Sprintf("%v (%v)", o.st, o.err)
	}
	return o.st.String()
}

// waitFailed waits for op, which must fail, and releases it. An op that
// reports done taints the engine and is an error: what, that Poll reported
// done, and want (what should have happened instead).
func (c *rc) waitFailed(op transfer.Op, what, want string) (outcome, error) {
	o, err := c.wait(op, what)
	if err != nil {
		return o, err
	}
	_ = op.Release()
	if o.st == transfer.Done {
		c.tainted("%s reported done", what)
		return o, fmt.Errorf("%s: Poll reported done; %s", what, want)
	}
	return o, nil
}

// wait polls op until it is terminal and returns the first terminal status.
// It polls tightly at first, so that a check made right after it returns
// sees memory as it was when Done was first reported. It fails when one Poll
// blocks longer than CallTimeout or the op is not terminal within OpTimeout.
func (c *rc) wait(op transfer.Op, what string) (outcome, error) {
	c.step("waiting for %s", what)
	deadline := time.Now().Add(c.cfg.OpTimeout)
	sleep := 20 * time.Microsecond
	for i := 0; ; i++ {
		t0 := time.Now()
		st, err := op.Poll()
		if d := time.Since(t0); d > c.cfg.CallTimeout {
			c.tainted("%s: Poll blocked", what)
			return outcome{}, fmt.Errorf("%s: Poll blocked for %v; Poll must never block (CallTimeout %v)",
				what, d.Round(time.Millisecond), c.cfg.CallTimeout)
		}
		switch st {
		case transfer.Done, transfer.Failed:
			if st == transfer.Failed && errors.Is(err, transfer.ErrNotQuiescent) {
				c.tainted("%s failed without proof of quiescence", what)
			}
			return outcome{st, err}, nil
		case transfer.Pending:
		default:
			c.tainted("%s: unknown status", what)
			return outcome{}, fmt.Errorf("%s: Poll returned unknown status %v", what, st)
		}
		if time.Now().After(deadline) {
			c.tainted("%s never became terminal", what)
			return outcome{}, fmt.Errorf("%s did not complete within OpTimeout (%v): Poll still reports pending",
				what, c.cfg.OpTimeout)
		}
		if i < 200 {
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, 2*time.Millisecond)
	}
}

// post posts j, retrying while the implementation answers ErrBusy, for at
// most OpTimeout. It returns the op or the implementation's error (perr);
// err is a rule failure (a post call that blocked, ErrBusy that never ends).
func (c *rc) post(j *job) (op transfer.Op, perr, err error) {
	c.step("posting %s", j.what)
	deadline := time.Now().Add(c.cfg.OpTimeout)
	sleep := 50 * time.Microsecond
	for {
		t0 := time.Now()
		op, perr = j.post()
		if d := time.Since(t0); j.nonBlocking && d > c.cfg.CallTimeout {
			return nil, nil, fmt.Errorf("%s: the call blocked for %v; it must return at once (CallTimeout %v)",
				j.what, d.Round(time.Millisecond), c.cfg.CallTimeout)
		}
		if perr == nil && op == nil {
			return nil, nil, fmt.Errorf("%s: returned neither an op nor an error", j.what)
		}
		if !errors.Is(perr, transfer.ErrBusy) {
			return op, perr, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("%s: still ErrBusy after OpTimeout (%v) with nothing else in flight: %v",
				j.what, c.cfg.OpTimeout, perr)
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, 5*time.Millisecond)
	}
}

// complete posts j, waits for it and requires Done. The op is returned
// unreleased.
func (c *rc) complete(j *job) (transfer.Op, error) {
	op, perr, err := c.post(j)
	if err != nil {
		return nil, err
	}
	if perr != nil {
		return nil, fmt.Errorf("%s: rejected: %v", j.what, perr)
	}
	o, err := c.wait(op, j.what)
	if err != nil {
		return nil, err
	}
	if o.st != transfer.Done {
		_ = op.Release()
		return nil, fmt.Errorf("%s: Poll reported %v; want done", j.what, o)
	}
	return op, nil
}

// eventually reports how long it took until j's memory matched want, or
// false when it never did within OpTimeout.
func (c *rc) eventually(j *job, since time.Time) (time.Duration, bool) {
	deadline := time.Now().Add(c.cfg.OpTimeout)
	for time.Now().Before(deadline) {
		if j.mismatch() == "" {
			return time.Since(since), true
		}
		time.Sleep(time.Millisecond)
	}
	return 0, false
}

// watchQuiet scribbles over every area of j (sources and destinations),
// waits Settle and reports the first byte that changed, if any.
func (c *rc) watchQuiet(j *job, after string) string {
	canary := make([][]byte, len(j.areas))
	for i, a := range j.areas {
		c.fill(a.b)
		canary[i] = bytes.Clone(a.b)
	}
	time.Sleep(c.cfg.Settle)
	for i, a := range j.areas {
		if k := firstDiff(a.b, canary[i]); k >= 0 {
			return fmt.Sprintf("%s byte %d changed from 0x%02x to 0x%02x within %v after %s",
				a.name, k, canary[i][k], a.b[k], c.cfg.Settle, after)
		}
	}
	return ""
}

// fill writes the rule's next random bytes into b.
func (c *rc) fill(b []byte) { _, _ = c.bytes.Read(b) }

// firstDiff returns the index of the first byte where got and want differ,
// or -1.
func firstDiff(got, want []byte) int {
	if bytes.Equal(got, want) {
		return -1
	}
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return i
		}
	}
	return min(len(got), len(want))
}

// describeDiff says where got differs from want, or "" when it does not.
func describeDiff(name string, got, want []byte) string {
	k := firstDiff(got, want)
	if k < 0 {
		return ""
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%s is %d bytes, want %d", name, len(got), len(want))
	}
	n := 0
	for i := k; i < len(got); i++ {
		if got[i] != want[i] {
			n++
		}
	}
	return fmt.Sprintf("%s byte %d = 0x%02x, want 0x%02x (%s)", name, k, got[k], want[k], plural(n, "byte differs", "bytes differ"))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// area is memory a job watches: want is what it must hold after Done, init
// what it held before the post.
type area struct {
	name string
	b    []byte
	init []byte
	want []byte
}

// job is one transfer the data rules post and check. Every byte the
// transfer may read or write, and the guard bytes around them, is in areas.
type job struct {
	what        string
	post        func() (transfer.Op, error)
	nonBlocking bool
	areas       []*area
	// sentinels are the errors a rejection of this (bad) job must wrap;
	// nil means any error will do.
	sentinels []error
	// optional marks a bad job that may be refused with ErrUnsupported.
	optional bool
	// src and dst are the descriptors of a single write, and srcReg and
	// dstReg the registered ranges holding them (write jobs only).
	src, dst       transfer.Desc
	srcReg, dstReg transfer.Desc
}

// watch adds b to the job's areas: want nil means b must not change.
func (j *job) watch(name string, b []byte, want []byte) {
	init := bytes.Clone(b)
	if want == nil {
		want = init
	}
	j.areas = append(j.areas, &area{name: name, b: b, init: init, want: want})
}

// mismatch describes the first area that differs from what it must hold
// after Done.
func (j *job) mismatch() string {
	for _, a := range j.areas {
		if d := describeDiff(a.name, a.b, a.want); d != "" {
			return d
		}
	}
	return ""
}

// changed describes the first area that differs from its content before
// the post.
func (j *job) changed() string {
	for _, a := range j.areas {
		if d := describeDiff(a.name, a.b, a.init); d != "" {
			return d
		}
	}
	return ""
}

// reset restores every area to its content before the post.
func (j *job) reset() {
	for _, a := range j.areas {
		copy(a.b, a.init)
	}
}

// anyOf reports whether err wraps one of targets.
func anyOf(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

func names(errs []error) string {
	var b bytes.Buffer
	for i, e := range errs {
		if i > 0 {
			b.WriteString(" or ")
		}
		fmt.Fprintf(&b, "%q", e.Error())
	}
	return b.String()
}

// quick measures a call that must not block.
func (c *rc) quick(what string, t0 time.Time) error {
	if d := time.Since(t0); d > c.cfg.CallTimeout {
		return fmt.Errorf("%s blocked for %v; it must return at once (CallTimeout %v)", what, d.Round(time.Millisecond), c.cfg.CallTimeout)
	}
	return nil
}
