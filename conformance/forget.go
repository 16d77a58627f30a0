package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// snapshot is a copy of every area of a job, taken at one moment.
type snapshot [][]byte

func takeSnapshot(j *job) snapshot {
	s := make(snapshot, len(j.areas))
	for i, a := range j.areas {
		s[i] = bytes.Clone(a.b)
	}
	return s
}

// fill copies j's areas into s, which takeSnapshot made for j: a copy
// into memory already faulted in, as fast as the areas can be read.
func (s snapshot) fill(j *job) {
	for i, a := range j.areas {
		copy(s[i], a.b)
	}
}

// since describes the first byte of j that differs from s, or "".
func (s snapshot) since(j *job) string {
	for i, a := range j.areas {
		if k := firstDiff(a.b, s[i]); k >= 0 {
			return fmt.Sprintf("%s byte %d changed from 0x%02x to 0x%02x", a.name, k, s[i][k], a.b[k])
		}
	}
	return ""
}

// pollAll polls every op in turn until all are terminal, and calls first
// on the very Poll that first reported each one terminal. It fails when a
// Poll blocks or an op is not terminal within OpTimeout.
func (c *rc) pollAll(ops []transfer.Op, what func(i int) string, first func(i int, o outcome)) ([]outcome, error) {
	c.step("waiting for %d ops at once", len(ops))
	outs := make([]outcome, len(ops))
	done := make([]bool, len(ops))
	left := len(ops)
	deadline := time.Now().Add(c.cfg.OpTimeout)
	for round := 0; left > 0; round++ {
		for i, op := range ops {
			if done[i] {
				continue
			}
			t0 := time.Now()
			st, err := op.Poll()
			if d := time.Since(t0); d > c.cfg.CallTimeout {
				c.tainted("%s: Poll blocked", what(i))
				return nil, fmt.Errorf("%s: Poll blocked for %v; Poll must never block (CallTimeout %v)", what(i), d.Round(time.Millisecond), c.cfg.CallTimeout)
			}
			switch st {
			case transfer.Pending:
				continue
			case transfer.Done, transfer.Failed:
			default:
				c.tainted("%s: unknown status", what(i))
				return nil, fmt.Errorf("%s: Poll returned unknown status %v", what(i), st)
			}
			if st == transfer.Failed && errors.Is(err, transfer.ErrNotQuiescent) {
				c.tainted("%s failed without proof of quiescence", what(i))
			}
			outs[i], done[i] = outcome{st, err}, true
			left--
			if first != nil {
				first(i, outs[i])
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			for i := range ops {
				if !done[i] {
					c.tainted("%s never became terminal", what(i))
					return nil, fmt.Errorf("%s did not complete within OpTimeout (%v): Poll still reports pending", what(i), c.cfg.OpTimeout)
				}
			}
		}
		if round < 200 {
			runtime.Gosched()
		} else {
			time.Sleep(100 * time.Microsecond)
		}
	}
	return outs, nil
}

// settleAll waits for ops cut off by event, all at once: each must be
// terminal within OpTimeout; its memory is snapshotted at its first
// terminal Poll. Then opened (if set) is called, Settle passes, and every
// op is checked: Done ones byte-exact and untouched since, Failed ones
// wrapping ErrPeerLost (or ErrNotQuiescent, which is not watched) and
// untouched since. The ops are released.
func settleAll(c *rc, jobs []*job, ops []transfer.Op, event string, opened func()) ([]outcome, error) {
	snaps := make([]snapshot, len(ops))
	outs, err := c.pollAll(ops, func(i int) string { return jobs[i].what + " after " + event },
		func(i int, _ outcome) { snaps[i] = takeSnapshot(jobs[i]) })
	if opened != nil {
		opened()
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, op := range ops {
			_ = op.Release()
		}
	}()
	time.Sleep(c.cfg.Settle)
	for i, o := range outs {
		j := jobs[i]
		switch {
		case o.st == transfer.Done:
			if m := j.mismatch(); m != "" {
				return outs, fmt.Errorf("%s reported done after %s, but %s", j.what, event, m)
			}
			if m := snaps[i].since(j); m != "" {
				c.tainted("%s touched memory after Done", j.what)
				return outs, fmt.Errorf("%s reported done after %s, then %s within %v: a terminal Poll promises quiescence", j.what, event, m, c.cfg.Settle)
			}
		case errors.Is(o.err, transfer.ErrNotQuiescent):
		case !errors.Is(o.err, transfer.ErrPeerLost):
			return outs, fmt.Errorf("%s failed after %s with %q; want an error wrapping %q", j.what, event, o.err, transfer.ErrPeerLost)
		default:
			if m := snaps[i].since(j); m != "" {
				c.tainted("%s touched memory after Failed", j.what)
				return outs, fmt.Errorf("%s after %s: Poll reported failed (%v), then %s within %v: once an op reports ErrPeerLost none of its bytes may land (or it must wrap ErrNotQuiescent)",
					j.what, event, o.err, m, c.cfg.Settle)
			}
		}
	}
	return outs, nil
}

// bounded runs fn, which may block, and waits at most OpTimeout for it.
// A call still running is left to finish on its own goroutine.
func (c *rc) bounded(what string, fn func() error) error {
	c.step("%s", what)
	done := make(chan error, 1)
	go func() { done <- c.protect(fn) }()
	t := time.NewTimer(c.cfg.OpTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		c.tainted("%s blocked", what)
		return fmt.Errorf("%s did not return within OpTimeout (%v)", what, c.cfg.OpTimeout)
	}
}

// stall stalls A's writes when the fixture can; release is never nil.
func (e *enginePeer) stall() (release func(), stalled bool) {
	if e.StallWrites == nil {
		return func() {}, false
	}
	return e.StallWrites(), true
}

func ruleSourceForget(c *rc, e *enginePeer) error {
	release, stalled := e.stall()
	defer release()
	n := c.cfg.maxSize()
	if stalled {
		n = min(n, stalledSize)
	}
	jobs, ops, err := inFlightSized(c, e, 4, n)
	if err != nil {
		return err
	}
	ferr := c.bounded(fmt.Sprintf("A.ForgetPeer(%q) with %d writes in flight", e.peerB, len(ops)), func() error { return e.A.ForgetPeer(e.peerB) })
	if ferr != nil {
		release()
		_, _ = c.pollAll(ops, func(int) string { return "a write" }, nil)
		return fmt.Errorf("A.ForgetPeer(%q): %v", e.peerB, ferr)
	}
	// The stall ends only after every op's memory was snapshotted, so a
	// stalled write that lands once released is seen.
	outs, err := settleAll(c, jobs, ops, "A.ForgetPeer", release)
	if err != nil {
		return err
	}
	lost := 0
	for _, o := range outs {
		if o.st == transfer.Failed {
			lost++
		}
	}
	if lost == 0 {
		if stalled {
			return fmt.Errorf("all %d writes stalled (EnginePair.StallWrites or transfer.WriteStaller) reported done after A.ForgetPeer: a forgotten peer's writes in flight must fail with ErrPeerLost", len(ops))
		}
		c.note("all %d writes were done before ForgetPeer (no stall: %s): writes failed by it not observed", len(ops), e.noStall)
	}
	return nil
}

// Rounds of engine/target-forget for an engine that claims the fence.
const fenceRounds = 3

func ruleTargetForget(c *rc, e *enginePeer) error {
	fencer, claims := e.B.(transfer.Fencer)
	if claims && !fencer.FencesForgottenPeers() {
		return c.skipf("B declares (transfer.Fencer) that its target-side ForgetPeer is no fence")
	}
	rounds := 1
	if claims {
		rounds = fenceRounds
	}
	for r := range rounds {
		if err := targetForgetRound(c, e, r, claims); err != nil {
			if rounds > 1 {
				return fmt.Errorf("round %d of %d (B claims transfer.Fencer): %w", r+1, rounds, err)
			}
			return err
		}
	}
	return nil
}

// targetForgetRound is one forget: round 0 starts with no write done yet
// (connections still to be set up), later rounds after a completed write.
func targetForgetRound(c *rc, e *enginePeer, round int, fencer bool) error {
	if round > 0 {
		if err := e.reloadA(c); err != nil {
			return err
		}
		warm, err := e.rig.job(c, 4097, 1)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		op, err := c.complete(warm)
		if err != nil {
			return fmt.Errorf("after B loaded A again: %w", err)
		}
		_ = op.Release()
	}
	// Prepared first: preparing a write registers memory at B and reloads B.
	var later []*job
	for range 3 {
		j, err := e.rig.job(c, min(c.cfg.maxSize(), 1<<20), 0)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		later = append(later, j)
	}
	release, stalled := e.stall()
	defer release()
	n := c.cfg.maxSize()
	if stalled {
		n = min(n, stalledSize)
	}
	jobs, ops, err := inFlightSized(c, e, 4, n)
	if err != nil {
		return err
	}
	// The snapshots are allocated (and faulted in) first and filled the
	// moment ForgetPeer returns, so bytes landing right after it are seen.
	snaps := make([]snapshot, len(jobs))
	for i, j := range jobs {
		snaps[i] = takeSnapshot(j)
	}
	ferr := c.bounded(fmt.Sprintf("B.ForgetPeer(%q) with %d writes of A in flight", e.peerA, len(ops)), func() error { return e.B.ForgetPeer(e.peerA) })
	for i, j := range jobs {
		snaps[i].fill(j)
	}
	release()
	if ferr != nil {
		_, _ = c.pollAll(ops, func(int) string { return "a write" }, nil)
		return fmt.Errorf("B.ForgetPeer(%q): %v", e.peerA, ferr)
	}
	for i, j := range later {
		j.what = fmt.Sprintf("%s posted after B.ForgetPeer(A) returned (#%d)", j.what, i+1)
		if i == len(later)-1 {
			// A fence that lapses after a while is no fence.
			time.Sleep(forgetLapse(c))
			j.what = fmt.Sprintf("%s, %v later", j.what, forgetLapse(c))
		}
		op, perr, err := c.post(j)
		if err != nil {
			return err
		}
		if perr != nil {
			continue
		}
		if _, err := c.waitFailed(op, j.what, "a forgotten peer's writes must be refused until B loads it again"); err != nil {
			return err
		}
	}
	outs, err := c.pollAll(ops, func(i int) string { return jobs[i].what + " after B.ForgetPeer(A)" }, nil)
	if err != nil {
		return err
	}
	for _, op := range ops {
		_ = op.Release()
	}
	time.Sleep(c.cfg.Settle)
	for i, j := range jobs {
		if m := snaps[i].since(j); m != "" {
			c.tainted("%s wrote after B.ForgetPeer(A)", j.what)
			return fmt.Errorf("%s (which then reported %v): %s after B.ForgetPeer(A) returned: once it returns no byte of the forgotten peer may land", j.what, outs[i], m)
		}
	}
	for _, j := range later {
		if m := j.changed(); m != "" {
			c.tainted("%s wrote", j.what)
			return fmt.Errorf("%s was refused, but %s", j.what, m)
		}
	}
	if !fencer {
		return nil
	}
	// The fence lasts until B loads A again, and no longer.
	if err := e.reloadA(c); err != nil {
		return err
	}
	j, err := e.rig.job(c, 4097, 2)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	op, err := c.complete(j)
	if err != nil {
		return fmt.Errorf("after B loaded the forgotten peer again: %w", err)
	}
	defer op.Release()
	if m := j.mismatch(); m != "" {
		return fmt.Errorf("after B loaded the forgotten peer again, %s: %s", j.what, m)
	}
	// Loading A again and writing anew must not bring old writes back.
	time.Sleep(c.cfg.Settle)
	for i, k := range jobs {
		if m := snaps[i].since(k); m != "" {
			c.tainted("%s wrote after B loaded A again", k.what)
			return fmt.Errorf("%s, cut off by B.ForgetPeer(A): %s once B loaded A again and A wrote anew: a forgotten write never lands, not even after a reload", k.what, m)
		}
	}
	for _, k := range later {
		if m := k.changed(); m != "" {
			c.tainted("%s wrote after B loaded A again", k.what)
			return fmt.Errorf("%s was refused, but once B loaded A again and A wrote anew %s: a refused write never lands later", k.what, m)
		}
	}
	return nil
}

// forgetLapse is how long engine/target-forget waits before its last post
// to a forgotten peer.
func forgetLapse(c *rc) time.Duration { return max(4*c.cfg.Settle, 150*time.Millisecond) }

// reloadA loads A's metadata into B again, under the name B knew it by.
func (e *enginePeer) reloadA(c *rc) error {
	return loadAgain(c, "A", e.A, "B", e.B, e.peerA)
}

func ruleNotQuiescent(c *rc, e *enginePeer) error {
	if e.StallWrites == nil {
		return c.skipf("%s: the suite cannot stall a write on purpose (no stall)", e.noStall)
	}
	j, err := e.rig.job(c, c.cfg.maxSize(), 0)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	release := e.StallWrites()
	defer release()
	op, perr, err := c.post(j)
	if err != nil {
		return err
	}
	if perr != nil {
		return fmt.Errorf("%s while A's writes were stalled: rejected: %v", j.what, perr)
	}
	// Let the engine give up on its own, then give up for it.
	window := min(c.cfg.OpTimeout/4, 10*c.cfg.Settle)
	how := "A.ForgetPeer(B)"
	deadline := time.Now().Add(window)
	for {
		st, _ := op.Poll()
		if st.Terminal() {
			how = "the engine"
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if how != "the engine" {
		if err := c.bounded(fmt.Sprintf("A.ForgetPeer(%q) with a stalled write", e.peerB), func() error { return e.A.ForgetPeer(e.peerB) }); err != nil {
			release()
			_, _ = c.wait(op, j.what)
			return fmt.Errorf("A.ForgetPeer(%q) with a stalled write: %v", e.peerB, err)
		}
	}
	o, err := c.wait(op, j.what+" given up by "+how)
	if err != nil {
		return err
	}
	snap := takeSnapshot(j)
	release()
	defer op.Release()
	switch {
	case o.st == transfer.Failed && errors.Is(o.err, transfer.ErrNotQuiescent):
		c.note("%s given up by %s: failed with ErrNotQuiescent", j.what, how)
		return nil
	case o.st == transfer.Done:
		if m := j.mismatch(); m != "" {
			return fmt.Errorf("%s, stalled, reported done after it was given up by %s, but %s", j.what, how, m)
		}
		c.note("%s reported done although A's writes were stalled: the stall (EnginePair.StallWrites or transfer.WriteStaller) did not hold it", j.what)
		return nil
	}
	// Watched long: a give-up that claims quiescence must have waited for
	// proof, also of bytes a retransmission would send later.
	time.Sleep(c.cfg.QuietWatch)
	if m := snap.since(j); m != "" {
		c.tainted("%s landed after it failed", j.what)
		return fmt.Errorf("%s, stalled, was given up by %s and failed with %q, which does not wrap %q; when the stall ended %s within %v: a give-up that is not proven quiescent must say ErrNotQuiescent",
			j.what, how, o.err, transfer.ErrNotQuiescent, m, c.cfg.QuietWatch)
	}
	return nil
}

// asyncAttempts bounds the posts engine/post-async makes without a stall.
const asyncAttempts = 20

func rulePostAsync(c *rc, e *enginePeer) error {
	n := c.cfg.maxSize()
	j, err := e.rig.job(c, n, 0)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if e.StallWrites != nil {
		return postStalled(c, e, j)
	}
	j.nonBlocking = true
	for range asyncAttempts {
		j.reset()
		op, perr, err := c.post(j)
		if err != nil {
			return err
		}
		if perr != nil {
			return fmt.Errorf("%s: rejected: %v", j.what, perr)
		}
		st, _ := op.Poll()
		o, err := c.wait(op, j.what)
		if err != nil {
			return err
		}
		_ = op.Release()
		if o.st != transfer.Done {
			return fmt.Errorf("%s: Poll reported %v; want done", j.what, o)
		}
		if st == transfer.Pending {
			c.note("fell back to timing (no stall: %s): a %s was pending at its first Poll; several writes in flight at once not checked", e.noStall, j.what)
			return nil
		}
	}
	return fmt.Errorf("no %s was pending at its first Poll in %d attempts: PostWrite seems to finish the write before it returns, and it must be asynchronous (an engine whose writes can be stalled — EnginePair.StallWrites, transfer.WriteStaller — is checked directly)", j.what, asyncAttempts)
}

// postStalled posts j while A's writes are stalled: the call must return
// within CallTimeout with a pending op, which completes once released.
func postStalled(c *rc, e *enginePeer, j *job) error {
	release := e.StallWrites()
	defer release()
	type posted struct {
		op  transfer.Op
		err error
	}
	ch := make(chan posted, 1)
	c.step("posting %s while A's writes are stalled", j.what)
	t0 := time.Now()
	go func() {
		var p posted
		p.err = c.protect(func() error {
			var err error
			p.op, err = j.post()
			return err
		})
		ch <- p
	}()
	var p posted
	select {
	case p = <-ch:
	case <-time.After(c.cfg.CallTimeout):
		release()
		msg := fmt.Sprintf("%s: PostWrite did not return within CallTimeout (%v) while A's writes were stalled: it must return without waiting for the bytes to move", j.what, c.cfg.CallTimeout)
		select {
		case p = <-ch:
			if p.err == nil && p.op != nil {
				if _, err := c.wait(p.op, j.what); err == nil {
					_ = p.op.Release()
				}
			}
		case <-time.After(c.cfg.OpTimeout):
			c.tainted("%s: PostWrite never returned", j.what)
		}
		return errors.New(msg)
	}
	if p.err != nil {
		return fmt.Errorf("%s while A's writes were stalled: rejected after %v: %v", j.what, time.Since(t0).Round(time.Microsecond), p.err)
	}
	if p.op == nil {
		return fmt.Errorf("%s: returned neither an op nor an error", j.what)
	}
	st, perr := p.op.Poll()
	// More writes while the first is stalled: none may wait for another.
	more, moreOps, merr := postSeveralStalled(c, e, stalledMore)
	release()
	var late *lateCall
	if errors.As(merr, &late) {
		if op, ok := late.ch(); ok {
			moreOps = append(moreOps, op)
		} else {
			c.tainted("a write posted while stalled never returned")
		}
	}
	jobs := append([]*job{j}, more...)
	ops := append([]transfer.Op{p.op}, moreOps...)
	outs := make([]outcome, len(ops))
	for i, op := range ops {
		o, err := c.wait(op, jobs[i].what)
		if err != nil {
			return errors.Join(merr, err)
		}
		outs[i] = o
		defer op.Release()
	}
	if merr != nil {
		return merr
	}
	if st != transfer.Pending {
		return fmt.Errorf("%s: the first Poll while A's writes were stalled reported %v (%v); a stalled write is pending", j.what, st, perr)
	}
	for i, o := range outs {
		if o.st != transfer.Done {
			return fmt.Errorf("%s: after the stall ended Poll reported %v; want done", jobs[i].what, o)
		}
		if m := jobs[i].mismatch(); m != "" {
			return fmt.Errorf("%s: after the stall ended: %s", jobs[i].what, m)
		}
	}
	return nil
}

// stalledMore is the number of writes engine/post-async posts after the
// first while A's writes are stalled.
const stalledMore = 3

// Notification sizes: the largest the suite tries, the smallest maximum it
// accepts from its probe, and the number of messages of the sizes rule.
const (
	maxNotifyProbe = 1 << 20
	minNotifyProbe = 4 << 10
	notifySizesN   = 60
)

// maxNotification returns the largest payload A's Notify accepts: the
// fixture's MaxNotification or, without one, the largest power of two up
// to maxNotifyProbe it accepts (each accepted probe is received and
// dropped by B).
func maxNotification(c *rc, e *enginePeer, a, b transfer.Notifier) (int, error) {
	if e.MaxNotification > 0 {
		return e.MaxNotification, nil
	}
	for n := maxNotifyProbe; n >= minNotifyProbe; n /= 2 {
		payload := make([]byte, n)
		c.fill(payload)
		err := sendN(c, fmt.Sprintf("Notify(%q) of a %d-byte probe", e.peerB, n), 1, func(p []byte) error { return a.Notify(e.peerB, p) }, func(int) []byte { return payload })
		if err != nil {
			continue
		}
		if err := recvNotes(c, b, "B", 1, func(int, transfer.Message) error { return nil }); err != nil {
			return 0, fmt.Errorf("the %d-byte probe notification: %w", n, err)
		}
		c.note("largest notification found by trying: %d bytes (set EnginePair.MaxNotification to name it)", n)
		return n, nil
	}
	return 0, fmt.Errorf("Notify refused every payload from %d down to %d bytes", maxNotifyProbe, minNotifyProbe)
}

// notifySize is the size of message i of the sizes rule: small, middle
// and maximal payloads interleaved.
func notifySize(i, maxN int) int {
	sizes := []int{8, maxN, 100, 4096, 9, min(65536, maxN), 300, maxN/2 + 1, 4097, 64}
	return max(8, min(sizes[i%len(sizes)], maxN))
}

func ruleNotifyOrderSizes(c *rc, e *enginePeer) error {
	a, b, err := notifiers(c, e)
	if err != nil {
		return err
	}
	maxN, err := maxNotification(c, e, a, b)
	if err != nil {
		return err
	}
	msgs := make([][]byte, notifySizesN)
	for i := range msgs {
		m := make([]byte, notifySize(i, maxN))
		c.fill(m)
		copy(m, fmt.Appendf(nil, "%08d", i))
		msgs[i] = m
	}
	sent := make(chan error, 1)
	go func() {
		sent <- notifyAll(c, a, e.peerB, len(msgs), func(i int) []byte { return msgs[i] })
	}()
	rerr := recvNotes(c, b, "B", len(msgs), func(i int, m transfer.Message) error {
		if bytes.Equal(m.Payload, msgs[i]) {
			return nil
		}
		got := "an unknown payload"
		for k, w := range msgs {
			if bytes.Equal(m.Payload, w) {
				got = fmt.Sprintf("notification %d (%d bytes)", k, len(w))
			}
		}
		return fmt.Errorf("notification %d received by B (%d bytes) is %s; want notification %d (%d bytes): order per peer holds for every payload size up to %d bytes",
			i, len(m.Payload), got, i, len(msgs[i]), maxN)
	})
	if serr := <-sent; serr != nil {
		return serr
	}
	return rerr
}

// ruleTerminalStable checks that terminal Polls keep their answer after
// time passed and after other ops were released.
func ruleTerminalStable(c *rc, g rig) error {
	type held struct {
		op   transfer.Op
		what string
		o    outcome
	}
	var ops []held
	for i, n := range []uint64{4097, min(c.cfg.maxSize(), 1<<20), 1, 65536} {
		j, err := g.job(c, n, i%g.variants())
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		op, err := c.complete(j)
		if err != nil {
			return err
		}
		ops = append(ops, held{op, j.what, outcome{st: transfer.Done}})
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
		o, err := c.wait(op, j.what)
		if err != nil {
			return err
		}
		ops = append(ops, held{op, j.what, o})
	}
	check := func(h held, after string) error {
		t0 := time.Now()
		st, err := h.op.Poll()
		if qerr := c.quick(h.what+": Poll "+after, t0); qerr != nil {
			return qerr
		}
		same := st == h.o.st && (err == nil) == (h.o.err == nil)
		if same && err != nil {
			same = err.Error() == h.o.err.Error()
		}
		if !same {
			return fmt.Errorf("%s: terminal Poll reported %v, then %s it reported %v: a terminal status (and its error) never changes",
				h.what, h.o, after, outcome{st, err})
		}
		return nil
	}
	time.Sleep(c.cfg.Settle)
	for _, h := range ops {
		if err := check(h, fmt.Sprintf("%v later", c.cfg.Settle)); err != nil {
			return err
		}
	}
	// Release every other op, and run one more to completion.
	var kept []held
	for i, h := range ops {
		if i%2 == 0 {
			_ = h.op.Release()
		} else {
			kept = append(kept, h)
		}
	}
	defer func() {
		for _, h := range kept {
			_ = h.op.Release()
		}
	}()
	j, err := g.job(c, 4096, 0)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	op, err := c.complete(j)
	if err != nil {
		return err
	}
	_ = op.Release()
	for _, h := range kept {
		if err := check(h, "after other ops were released"); err != nil {
			return err
		}
	}
	return nil
}
