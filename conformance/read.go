package conformance

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/transfer"
)

// The READ rules, for an engine that reads (A a transfer.Reader) and
// serves reads (B a transfer.ReadGuarded): A reads B's registered memory
// into its own, B serving only what its read guard allows A.

func readRules() []rule[*enginePeer] {
	return []rule[*enginePeer]{
		{"engine/read-byte-exact", "A.PostRead of B's memory (B's read guard allowing it) lands exactly B's bytes — reads of 1 byte, unaligned ones, one above FragmentSize and several in one post — changes nothing around A's destinations nor B's source, and B asks its guard with A's name and a range inside the source (skipped unless A is a transfer.Reader and B a transfer.ReadGuarded, and for memory other than host)", readable(ruleReadByteExact)},
		{"engine/read-guarded", "B serves no read without a guard, and a read its guard forbids, one starting inside an allowed range and ending outside it, one of a range allowed before and since revoked, and a post mixing an allowed and a forbidden source fail wrapping transfer.ErrForbidden and change no byte of A's destination (skipped likewise)", readable(ruleReadGuarded)},
		{"engine/read-after-forget", "a read held in B's guard when A.ForgetPeer(B) — or B.ForgetPeer(A) — is called is terminal within OpTimeout, failed wrapping transfer.ErrPeerLost, and none of its bytes reaches A's destination once B answers, watched for Config.QuietWatch (skipped likewise)", readable(ruleReadAfterForget)},
	}
}

// readable connects the pair and runs body with A's Reader and B's
// ReadGuarded, or skips saying which is missing.
func readable(body func(c *rc, e *enginePeer, r transfer.Reader, g transfer.ReadGuarded) error) func(c *rc, e *enginePeer) error {
	return func(c *rc, e *enginePeer) error {
		r, ok := e.A.(transfer.Reader)
		if !ok {
			return c.skipf("A does not implement transfer.Reader")
		}
		g, ok := e.B.(transfer.ReadGuarded)
		if !ok {
			return c.skipf("B does not implement transfer.ReadGuarded")
		}
		if c.memory.Kind != transfer.Host {
			return c.skipf("the read rules run on host memory; the fixture's is %s", c.memory.Kind)
		}
		if err := e.connect(c); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		defer g.SetReadGuard(nil)
		return body(c, e, r, g)
	}
}

// readJob prepares a read of n bytes of B's memory into A's: both fresh,
// registered whole (B's metadata loaded into A again), with guard bytes
// around A's destination.
func (e *enginePeer) readJob(c *rc, r transfer.Reader, n uint64, variant int) (*job, error) {
	so, do := writeOffsets(c, variant)
	src, err := c.buf(so + n + 13) // B's
	if err != nil {
		return nil, err
	}
	dst, err := c.buf(do + n + 29) // A's
	if err != nil {
		return nil, err
	}
	c.fill(src)
	c.fill(dst)
	j := &job{srcReg: c.desc(src), dstReg: c.desc(dst)}
	c.step("registering the source (B) and destination (A) of a %d-byte read", n)
	if err := e.B.RegisterMemory(j.srcReg); err != nil {
		return nil, fmt.Errorf("B.RegisterMemory(%v): %w", j.srcReg, err)
	}
	if err := e.reload(c); err != nil {
		return nil, err
	}
	if err := e.A.RegisterMemory(j.dstReg); err != nil {
		return nil, fmt.Errorf("A.RegisterMemory(%v): %w", j.dstReg, err)
	}
	j.src, j.dst = c.desc(src[so:so+n]), c.desc(dst[do:do+n])
	j.what = fmt.Sprintf("read of %d bytes (B's src+%d → A's dst+%d)", n, so, do)
	j.post = func() (transfer.Op, error) {
		return r.PostRead(e.peerB, []transfer.ReadOp{{Src: j.src, Dst: j.dst}})
	}
	j.watch("B's source", src, nil)
	j.watch("A's destination", dst[do:do+n], src[so:so+n])
	if do > 0 {
		j.watch("guard before A's destination:", dst[:do], nil)
	}
	j.watch("guard after A's destination:", dst[do+n:], nil)
	return j, nil
}

// readGuardRec is a read guard allowing A the ranges granted, recording
// what B asked.
type readGuardRec struct {
	mu     sync.Mutex
	peer   string
	grants []transfer.Desc
	asks   []struct {
		peer string
		d    transfer.Desc
	}
	hold chan struct{} // when set, every ask waits for it to close
	held chan struct{} // signalled when an ask is waiting
}

func (g *readGuardRec) grant(d transfer.Desc) {
	g.mu.Lock()
	g.grants = append(g.grants, d)
	g.mu.Unlock()
}

func (g *readGuardRec) revoke(d transfer.Desc) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, r := range g.grants {
		if r == d {
			g.grants = append(g.grants[:i], g.grants[i+1:]...)
			return
		}
	}
}

func (g *readGuardRec) mark() int { g.mu.Lock(); defer g.mu.Unlock(); return len(g.asks) }

func (g *readGuardRec) check(peer string, d transfer.Desc) (transfer.Desc, error) {
	g.mu.Lock()
	hold, held := g.hold, g.held
	g.asks = append(g.asks, struct {
		peer string
		d    transfer.Desc
	}{peer, d})
	g.mu.Unlock()
	if hold != nil {
		select {
		case held <- struct{}{}:
		default:
		}
		<-hold
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.grants {
		if peer == g.peer && r.Contains(d.Addr, d.Len) {
			return r, nil
		}
	}
	return transfer.Desc{}, fmt.Errorf("conformance read guard: %q may not read [%#x+%d]: %w", peer, d.Addr, d.Len, transfer.ErrForbidden)
}

// asked checks the guard's questions since mark: at least one, each naming
// A and a range inside srcs.
func (g *readGuardRec) asked(mark int, what string, srcs ...transfer.Desc) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.asks) == mark {
		return fmt.Errorf("B served %s without asking its read guard", what)
	}
	for _, q := range g.asks[mark:] {
		inside := false
		for _, d := range srcs {
			inside = inside || (q.d.Len > 0 && d.Contains(q.d.Addr, q.d.Len))
		}
		if q.peer != g.peer || !inside {
			return fmt.Errorf("for %s B asked its read guard about (%q, [%#x+%d]); want the reading peer %q and a range inside the read's source", what, q.peer, q.d.Addr, q.d.Len, g.peer)
		}
	}
	return nil
}

func ruleReadByteExact(c *rc, e *enginePeer, r transfer.Reader, g transfer.ReadGuarded) error {
	rec := &readGuardRec{peer: e.peerA}
	c.step("B.SetReadGuard(allow the granted ranges for %q only)", e.peerA)
	g.SetReadGuard(rec.check)
	sizes := []uint64{1, 4097, 1<<20 + 1}
	if e.FragmentSize > 0 {
		sizes = append(sizes, e.FragmentSize+4097)
	}
	for i, n := range sizes {
		j, err := e.readJob(c, r, n, i%3)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		rec.grant(j.srcReg)
		m0 := rec.mark()
		if err := completeExact(c, j); err != nil {
			return err
		}
		if err := rec.asked(m0, j.what, j.srcReg); err != nil {
			return err
		}
	}
	// Several reads in one post, out of address order.
	var jobs []*job
	for i := range 3 {
		j, err := e.readJob(c, r, uint64(100+1000*i), 2)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		rec.grant(j.srcReg)
		jobs = append(jobs, j)
	}
	multi := &job{what: "one post of 3 reads (out of address order)"}
	ops := []transfer.ReadOp{{Src: jobs[2].src, Dst: jobs[2].dst}, {Src: jobs[0].src, Dst: jobs[0].dst}, {Src: jobs[1].src, Dst: jobs[1].dst}}
	multi.post = func() (transfer.Op, error) { return r.PostRead(e.peerB, ops) }
	for _, j := range jobs {
		multi.areas = append(multi.areas, j.areas...)
	}
	return completeExact(c, multi)
}

func ruleReadGuarded(c *rc, e *enginePeer, r transfer.Reader, g transfer.ReadGuarded) error {
	var jobs [6]*job
	for i := range jobs {
		j, err := e.readJob(c, r, 4097, 1)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		jobs[i] = j
	}
	none, refused, straddle, revoked, mixedIn, mixedOut := jobs[0], jobs[1], jobs[2], jobs[3], jobs[4], jobs[5]
	c.step("B.SetReadGuard(nil): no guard installed")
	g.SetReadGuard(nil)
	none.what = "read with no read guard installed at B"
	if err := expectRefused(c, none, transfer.ErrForbidden); err != nil {
		return err
	}
	rec := &readGuardRec{peer: e.peerA}
	c.step("B.SetReadGuard(allow the granted ranges for %q only)", e.peerA)
	g.SetReadGuard(rec.check)
	refused.what = "read the guard forbids"
	m0 := rec.mark()
	if err := expectRefused(c, refused, transfer.ErrForbidden); err != nil {
		return err
	}
	if err := rec.asked(m0, refused.what, refused.srcReg); err != nil {
		return err
	}
	rec.grant(transfer.Desc{Addr: straddle.src.Addr, Len: straddle.src.Len / 2, Kind: straddle.src.Kind, Device: straddle.src.Device})
	straddle.what = "read starting inside an allowed range (its first half) and ending outside it"
	if err := expectRefused(c, straddle, transfer.ErrForbidden); err != nil {
		return err
	}
	rec.grant(revoked.srcReg)
	revoked.what = "read of an allowed range"
	if err := completeExact(c, revoked); err != nil {
		return err
	}
	rec.revoke(revoked.srcReg)
	again := *revoked
	again.what = "the same read again once its range was revoked"
	again.areas = nil
	srcB := mem.Unsafe(revoked.src.Addr, revoked.src.Len)
	dstA := mem.Unsafe(revoked.dst.Addr, revoked.dst.Len)
	clear(dstA)
	again.watch("A's destination", dstA, nil)
	again.watch("B's source", srcB, nil)
	if err := expectRefused(c, &again, transfer.ErrForbidden); err != nil {
		return err
	}
	rec.grant(mixedIn.srcReg)
	mixed := &job{what: "one post of an allowed and a forbidden read"}
	mixed.post = func() (transfer.Op, error) {
		return r.PostRead(e.peerB, []transfer.ReadOp{{Src: mixedIn.src, Dst: mixedIn.dst}, {Src: mixedOut.src, Dst: mixedOut.dst}})
	}
	for _, j := range []*job{mixedIn, mixedOut} {
		for _, a := range j.areas {
			if a.name == "A's destination" {
				// The allowed half may land or not; the forbidden half
				// must not.
				if j == mixedOut {
					mixed.watch(a.name+" (forbidden read)", a.b, nil)
				}
				continue
			}
			mixed.areas = append(mixed.areas, a)
		}
	}
	if err := expectRefused(c, mixed, transfer.ErrForbidden); err != nil {
		return err
	}
	return nil
}

func ruleReadAfterForget(c *rc, e *enginePeer, r transfer.Reader, g transfer.ReadGuarded) error {
	for _, side := range []string{"A.ForgetPeer(B)", "B.ForgetPeer(A)"} {
		if side != "A.ForgetPeer(B)" {
			if err := e.connect(c); err != nil {
				return fmt.Errorf("setup: loading the pair again: %w", err)
			}
		}
		j, err := e.readJob(c, r, 256<<10, 2)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		dst := mem.Unsafe(j.dst.Addr, j.dst.Len)
		clear(dst)
		rec := &readGuardRec{peer: e.peerA, hold: make(chan struct{}), held: make(chan struct{}, 1)}
		rec.grant(j.srcReg)
		g.SetReadGuard(rec.check)
		released := false
		release := func() {
			if !released {
				released = true
				close(rec.hold)
			}
		}
		op, perr, err := c.post(j)
		if err != nil {
			release()
			return err
		}
		if perr != nil {
			release()
			return fmt.Errorf("%s: %v", j.what, perr)
		}
		c.step("waiting until B's read guard holds the read")
		select {
		case <-rec.held:
		case <-time.After(c.cfg.OpTimeout):
			release()
			return fmt.Errorf("%s: B never asked its read guard within OpTimeout", j.what)
		}
		c.step("%s with the read held in B's guard", side)
		forgot := make(chan error, 1)
		go func() {
			if side == "A.ForgetPeer(B)" {
				forgot <- e.A.ForgetPeer(e.peerB)
			} else {
				forgot <- e.B.ForgetPeer(e.peerA)
			}
		}()
		o, err := c.wait(op, j.what+" after "+side)
		release() // B answers now, if it still can
		if err != nil {
			return err
		}
		_ = op.Release()
		select {
		case ferr := <-forgot:
			if ferr != nil {
				return fmt.Errorf("%s: %w", side, ferr)
			}
		case <-time.After(c.cfg.OpTimeout):
			return fmt.Errorf("%s did not return within OpTimeout", side)
		}
		if o.st != transfer.Failed || !errors.Is(o.err, transfer.ErrPeerLost) {
			c.tainted("%s was not failed by %s", j.what, side)
			return fmt.Errorf("%s after %s: %v; want failed wrapping transfer.ErrPeerLost", j.what, side, o)
		}
		time.Sleep(c.cfg.QuietWatch)
		for i, b := range dst {
			if b != 0 {
				c.tainted("%s landed after %s", j.what, side)
				return fmt.Errorf("%s failed after %s, but A's destination byte %d changed within %v once B answered; a failed read never lands", j.what, side, i, c.cfg.QuietWatch)
			}
		}
	}
	return nil
}
