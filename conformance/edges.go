package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bouncekv/bounce/transfer"
)

// ruleTerminalAfterForget: ops that were Done stay Done (without an error)
// when polled again after A.ForgetPeer(B), after B.ForgetPeer(A), after
// other ops were released and after time has passed.
func ruleTerminalAfterForget(c *rc, e *enginePeer) error {
	type held struct {
		op   transfer.Op
		what string
	}
	var ops []held
	for i, n := range []uint64{4097, 1, 65536, 4096} {
		j, err := e.rig.job(c, n, i%e.rig.variants())
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		op, err := c.complete(j)
		if err != nil {
			return err
		}
		ops = append(ops, held{op, j.what})
	}
	released := make([]bool, len(ops))
	defer func() {
		for i, h := range ops {
			if !released[i] {
				_ = h.op.Release()
			}
		}
	}()
	check := func(after string) error {
		for i, h := range ops {
			if released[i] {
				continue
			}
			t0 := time.Now()
			st, err := h.op.Poll()
			if qerr := c.quick(h.what+": Poll "+after, t0); qerr != nil {
				return qerr
			}
			if st != transfer.Done || err != nil {
				return fmt.Errorf("%s: Poll reported done, then %s it reported %v: a terminal status never changes, a forget included (only writes still in flight fail with ErrPeerLost)",
					h.what, after, outcome{st, err})
			}
		}
		return nil
	}
	if err := c.bounded(fmt.Sprintf("B.ForgetPeer(%q) with every write done", e.peerA), func() error { return e.B.ForgetPeer(e.peerA) }); err != nil {
		return fmt.Errorf("B.ForgetPeer(%q): %v", e.peerA, err)
	}
	if err := check("after B.ForgetPeer(A)"); err != nil {
		return err
	}
	if err := c.bounded(fmt.Sprintf("A.ForgetPeer(%q) with every write done", e.peerB), func() error { return e.A.ForgetPeer(e.peerB) }); err != nil {
		return fmt.Errorf("A.ForgetPeer(%q): %v", e.peerB, err)
	}
	if err := check("after A.ForgetPeer(B)"); err != nil {
		return err
	}
	_ = ops[0].op.Release()
	released[0] = true
	if err := check("after another op was released"); err != nil {
		return err
	}
	time.Sleep(c.cfg.Settle)
	return check(fmt.Sprintf("%v later", c.cfg.Settle))
}

// ruleBoundsEdges: a write ending exactly at the last byte of a registered
// region is accepted and lands; a destination crossing a 4 GiB-aligned
// address lands whole.
func ruleBoundsEdges(c *rc, e *enginePeer) error {
	const n = 4097
	src, err := c.buf(n)
	if err != nil {
		return err
	}
	dst, err := c.buf(n + 64)
	if err != nil {
		return err
	}
	c.fill(src)
	c.fill(dst)
	if err := e.A.RegisterMemory(c.desc(src)); err != nil {
		return fmt.Errorf("A.RegisterMemory: %w", err)
	}
	// Registered is the destination's last n bytes: the write ends at the
	// region's last byte, and so does its source.
	reg := dst[64:]
	if err := e.B.RegisterMemory(c.desc(reg)); err != nil {
		return fmt.Errorf("B.RegisterMemory: %w", err)
	}
	if err := e.reload(c); err != nil {
		return err
	}
	j := &job{what: fmt.Sprintf("write of %d bytes ending at the last byte of the registered source and destination", n)}
	j.watch("guard before the registered destination", dst[:64], nil)
	j.watch("destination", reg, src)
	j.watch("source", src, nil)
	j.post = func() (transfer.Op, error) {
		return e.A.PostWrite(e.peerB, []transfer.WriteOp{{Src: c.desc(src), Dst: c.desc(reg)}})
	}
	if err := completeExact(c, j); err != nil {
		return err
	}
	if c.alloc != nil || c.memory.Kind != transfer.Host {
		c.note("destination crossing a 4 GiB-aligned address not exercised: the fixture allocates the memory (EnginePair.Alloc or Memory)")
		return nil
	}
	const span = 1 << 20
	cross, free, err := mapAcross4G(2 * span)
	if err != nil {
		c.note("destination crossing a 4 GiB-aligned address not exercised: %v", err)
		return nil
	}
	c.mu.Lock()
	c.bufs = append(c.bufs, free)
	c.mu.Unlock()
	c.fill(cross)
	big, err := c.buf(span)
	if err != nil {
		return err
	}
	c.fill(big)
	if err := e.A.RegisterMemory(c.desc(big)); err != nil {
		return fmt.Errorf("A.RegisterMemory: %w", err)
	}
	if err := e.B.RegisterMemory(c.desc(cross)); err != nil {
		return fmt.Errorf("B.RegisterMemory(%v, across a 4 GiB boundary): %w", c.desc(cross), err)
	}
	if err := e.reload(c); err != nil {
		return err
	}
	// span bytes centred on the boundary, at an odd offset.
	d := cross[span/2+1 : span/2+1+span]
	j = &job{what: fmt.Sprintf("write of %d bytes to %v, across the 4 GiB-aligned address %#x", span, c.desc(d), c.desc(cross).Addr+span)}
	j.watch("guard before the destination", cross[:span/2+1], nil)
	j.watch("destination", d, big)
	j.watch("guard after the destination", cross[span/2+1+span:], nil)
	j.post = func() (transfer.Op, error) {
		return e.A.PostWrite(e.peerB, []transfer.WriteOp{{Src: c.desc(big), Dst: c.desc(d)}})
	}
	return completeExact(c, j)
}

// completeExact posts j, requires Done and checks every byte.
func completeExact(c *rc, j *job) error {
	op, err := c.complete(j)
	if err != nil {
		return err
	}
	defer op.Release()
	if m := j.mismatch(); m != "" {
		return fmt.Errorf("%s: %s", j.what, m)
	}
	return nil
}

// mapAcross4G maps n bytes of shared memory (a memfd kept open, as
// mem.Alloc's buffers are) whose middle is a 4 GiB-aligned address.
func mapAcross4G(n uint64) ([]byte, func() error, error) {
	fd, err := unix.MemfdCreate("bounce-buf", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("ftruncate: %w", err)
	}
	// The window mem uses for shared mappings (unused by Go processes).
	const base, span, four = 0x5000_0000_0000, 0x1000_0000_0000, 1 << 32
	for range 16 {
		at := base + rand.Uint64N(span/four)*four - n/2
		p, err := unix.MmapPtr(fd, 0, *(*unsafe.Pointer)(unsafe.Pointer(&at)), uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED_NOREPLACE)
		if err != nil {
			continue
		}
		if uintptr(p) != uintptr(at) {
			_ = unix.MunmapPtr(p, uintptr(n))
			continue
		}
		// The descriptor stays open while the memory is mapped, as
		// mem.Buffer's does: a plugin host shares the memory through it.
		b := unsafe.Slice((*byte)(p), n)
		return b, func() error { return errors.Join(unix.MunmapPtr(p, uintptr(n)), unix.Close(fd)) }, nil
	}
	unix.Close(fd)
	return nil, nil, errors.New("no free address across a 4 GiB boundary found")
}

// ruleDeregisterIdle: memory B deregistered with nothing in flight is not
// writable through the metadata A loaded before.
func ruleDeregisterIdle(c *rc, e *enginePeer) error {
	j, err := e.rig.job(c, 4097, 1)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	c.step("B.DeregisterMemory(destination), idle")
	if err := e.B.DeregisterMemory(j.dstReg); err != nil {
		return fmt.Errorf("B.DeregisterMemory(%v) with nothing in flight: %v", j.dstReg, err)
	}
	j.what = "write through A's stale metadata to memory B deregistered while idle"
	op, perr, err := c.post(j)
	if err != nil {
		return err
	}
	st := "refused by the call"
	if perr == nil {
		o, err := c.waitFailed(op, j.what, "deregistered memory is no destination any more")
		if err != nil {
			return err
		}
		st = fmt.Sprintf("failed (%v)", o.err)
	}
	time.Sleep(c.cfg.Settle)
	if m := j.changed(); m != "" {
		c.tainted("%s wrote", j.what)
		return fmt.Errorf("%s was %s, but %s", j.what, st, m)
	}
	return nil
}

// Notifications of engine/notify-after-write.
const notifyWritesN = 24

// ruleNotifyAfterWrite: a notification A sends once a write is Done is
// received by B only when that write's bytes are visible at B — with other
// writes in flight around it; and once B and A loaded each other again, no
// notification already received is delivered again.
func ruleNotifyAfterWrite(c *rc, e *enginePeer) error {
	a, b, err := notifiers(c, e)
	if err != nil {
		return err
	}
	jobs := make([]*job, notifyWritesN)
	noise := make([]*job, notifyWritesN)
	for i := range jobs {
		n := []uint64{4097, 65536, 1, 300 << 10}[i%4]
		if jobs[i], err = e.rig.job(c, n, i%e.rig.variants()); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		if noise[i], err = e.rig.job(c, 65536, 0); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	type seen struct {
		i   int
		msg string
	}
	got := make(chan seen, notifyWritesN)
	recvErr := make(chan error, 1)
	go func() {
		recvErr <- recvNotes(c, b, "B", notifyWritesN, func(i int, m transfer.Message) error {
			k := -1
			_, _ = fmt.Sscanf(string(m.Payload), "after-write-%d", &k)
			if k < 0 || k >= notifyWritesN {
				return fmt.Errorf("notification %d received by B is %q; want one the rule sent", i, m.Payload)
			}
			// Checked at the moment of receipt.
			if d := jobs[k].mismatch(); d != "" {
				got <- seen{k, d}
			}
			return nil
		})
	}()
	var noiseOps []transfer.Op
	defer func() {
		for _, op := range noiseOps {
			if _, err := c.wait(op, "a write in flight around the notifications"); err == nil {
				_ = op.Release()
			}
		}
	}()
	for i, j := range jobs {
		op, err := c.complete(j)
		if err != nil {
			return err
		}
		_ = op.Release()
		if np, perr, err := c.post(noise[i]); err == nil && perr == nil {
			noiseOps = append(noiseOps, np)
		}
		if err := sendN(c, fmt.Sprintf("Notify(%q) after %s was done", e.peerB, j.what), 1,
			func(p []byte) error { return a.Notify(e.peerB, p) },
			func(int) []byte { return fmt.Appendf(nil, "after-write-%d", i) }); err != nil {
			return err
		}
	}
	if err := <-recvErr; err != nil {
		return err
	}
	close(got)
	for s := range got {
		return fmt.Errorf("B received the notification A sent once %s was done before its bytes were visible: at receipt %s (a notification after a write never overtakes the write's bytes)", jobs[s.i].what, s.msg)
	}
	// Reload both ways: nothing received may come again.
	if err := e.reload(c); err != nil {
		return err
	}
	if err := e.reloadA(c); err != nil {
		return err
	}
	c.step("B.RecvNotification after both engines loaded each other again")
	if m, err := b.RecvNotification(max(c.cfg.Settle, 100*time.Millisecond)); err == nil {
		return fmt.Errorf("after A and B loaded each other again, B received %q from %q, which it had received before: a reload never delivers an old notification again", m.Payload, m.Peer)
	} else if !errors.Is(err, transfer.ErrTimeout) {
		return fmt.Errorf("B.RecvNotification after the reload: %v; want an error wrapping %q", err, transfer.ErrTimeout)
	}
	return nil
}

// ruleConnect: Connect returns at once (to a loaded, an unknown and a
// forgotten peer), never delays a post, and an engine closed right after
// a Connect closes within OpTimeout (the dial is cancelled).
func ruleConnect(c *rc, e *enginePeer) error {
	cn, ok := e.A.(transfer.Connector)
	if !ok {
		return c.skipf("A does not implement transfer.Connector")
	}
	connect := func(peer, when string) error {
		t0 := time.Now()
		c.step("A.Connect(%q) %s", peer, when)
		if err := c.protect(func() error { cn.Connect(peer); return nil }); err != nil {
			return err
		}
		return c.quick(fmt.Sprintf("A.Connect(%q) %s", peer, when), t0)
	}
	j, err := e.rig.job(c, 4097, 1)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if err := connect(e.peerB, "to a loaded peer"); err != nil {
		return err
	}
	j.nonBlocking = true
	j.what += " posted right after A.Connect(B)"
	if err := completeExact(c, j); err != nil {
		return err
	}
	// Connects racing posts from several goroutines.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var cerr error
	var once sync.Once
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := connect(e.peerB, "while writes are posted"); err != nil {
				once.Do(func() { cerr = err })
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	for i := range 4 {
		k, err := e.rig.job(c, 65536, i%e.rig.variants())
		if err != nil {
			close(stop)
			wg.Wait()
			return fmt.Errorf("setup: %w", err)
		}
		k.nonBlocking = true
		k.what += " posted while A.Connect(B) is called again and again"
		if err := completeExact(c, k); err != nil {
			close(stop)
			wg.Wait()
			return err
		}
	}
	close(stop)
	wg.Wait()
	if cerr != nil {
		return cerr
	}
	if err := connect("conformance-peer-never-loaded", "to a peer never loaded"); err != nil {
		return err
	}
	// Prepared first: preparing a write registers memory at B and reloads B.
	after, err := e.rig.job(c, 64, 0)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if err := c.bounded(fmt.Sprintf("A.ForgetPeer(%q)", e.peerB), func() error { return e.A.ForgetPeer(e.peerB) }); err != nil {
		return fmt.Errorf("A.ForgetPeer(%q): %v", e.peerB, err)
	}
	if err := connect(e.peerB, "to a forgotten peer"); err != nil {
		return err
	}
	if err := expectRefused(c, retarget(e, after, "write to the forgotten peer after A.Connect(B)", e.peerB), transfer.ErrUnknownPeer); err != nil {
		return err
	}
	if err := e.reload(c); err != nil {
		return err
	}
	if err := connect(e.peerB, "to the peer loaded again"); err != nil {
		return err
	}
	return c.bounded("A.Close right after A.Connect(B)", e.A.Close)
}

// postSeveralStalled posts k more writes while A's writes are stalled
// (the first, j0, already pending): each call must return within
// CallTimeout with a pending op.
func postSeveralStalled(c *rc, e *enginePeer, k int) ([]*job, []transfer.Op, error) {
	var jobs []*job
	for i := range k {
		j, err := e.rig.job(c, []uint64{4097, 65536, 1}[i%3], i%e.rig.variants())
		if err != nil {
			return nil, nil, fmt.Errorf("setup: %w", err)
		}
		jobs = append(jobs, j)
	}
	var ops []transfer.Op
	for i, j := range jobs {
		j.what = fmt.Sprintf("%s (write %d in flight while stalled)", j.what, i+2)
		c.step("posting %s", j.what)
		type posted struct {
			op  transfer.Op
			err error
		}
		ch := make(chan posted, 1)
		go func() {
			var p posted
			p.err = c.protect(func() error {
				var err error
				p.op, err = j.post()
				return err
			})
			ch <- p
		}()
		select {
		case p := <-ch:
			if p.err != nil {
				return jobs, ops, fmt.Errorf("%s: rejected: %v", j.what, p.err)
			}
			if p.op == nil {
				return jobs, ops, fmt.Errorf("%s: returned neither an op nor an error", j.what)
			}
			ops = append(ops, p.op)
			if st, err := p.op.Poll(); st != transfer.Pending {
				return jobs, ops, fmt.Errorf("%s: the first Poll while A's writes were stalled reported %v; a stalled write is pending", j.what, outcome{st, err})
			}
		case <-time.After(c.cfg.CallTimeout):
			return jobs, ops, &lateCall{ch: func() (transfer.Op, bool) {
				select {
				case p := <-ch:
					return p.op, p.err == nil && p.op != nil
				case <-time.After(c.cfg.OpTimeout):
					return nil, false
				}
			}, msg: fmt.Sprintf("%s: PostWrite did not return within CallTimeout (%v) while %d earlier write(s) were in flight: it must return without waiting for the bytes of any write to move",
				j.what, c.cfg.CallTimeout, i+1)}
		}
	}
	return jobs, ops, nil
}

// lateCall is a post that did not return in time; ch waits for it.
type lateCall struct {
	ch  func() (transfer.Op, bool)
	msg string
}

func (l *lateCall) Error() string { return l.msg }

// scribble fills every area of j with fresh bytes and returns a copy of
// them, for unchanged to compare with later.
func (c *rc) scribble(j *job) [][]byte {
	var canary [][]byte
	for _, a := range j.areas {
		c.fill(a.b)
		canary = append(canary, bytes.Clone(a.b))
	}
	return canary
}

// unchanged describes the first byte of j that differs from canary (its
// scribble), or "".
func unchanged(j *job, canary [][]byte, within time.Duration, after string) string {
	for k, a := range j.areas {
		if d := firstDiff(a.b, canary[k]); d >= 0 {
			return fmt.Sprintf("%s: %s byte %d changed from 0x%02x to 0x%02x within %v after %s",
				j.what, a.name, d, canary[k][d], a.b[d], within, after)
		}
	}
	return ""
}
