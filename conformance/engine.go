package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// EnginePair is what an EngineFactory returns: two fresh engines that can
// reach each other. The suite registers memory and loads each engine's
// metadata into the other itself. A is the writer; B owns the destinations.
type EnginePair struct {
	A, B transfer.Engine
	// KillB, if set, makes B vanish abruptly (close it without ceremony,
	// or kill the process it runs in). Nil skips engine/peer-loss.
	KillB func()
	// Alloc, if set, provides the host memory the suite registers with A
	// and B; nil means mem.Alloc.
	Alloc AllocFunc
	// Memory is the memory the rules write from and into; the zero value
	// is host memory. Both engines must declare its kind
	// (transfer.MemoryKinder).
	Memory Memory
	// Cleanup, if set, releases both engines and anything else the
	// factory made. It is called once after each rule, also after the rule
	// closed or killed an engine itself.
	Cleanup func()
	// StallWrites, if set, stalls A's data path on purpose until release
	// is called: writes A posts or has in flight move no byte and stay
	// pending meanwhile, except that ForgetPeer and Close may still fail
	// them. A fixture over an engine with a hook before it moves bytes
	// implements it with a Valve. When nil, the suite uses A's
	// transfer.WriteStaller if A has one that stalls (tried once per
	// pair: a plugin engine's host side refuses when the plugin's engine
	// lacks it). Without either, engine/not-quiescent is skipped, and
	// engine/post-async, engine/source-forget and engine/target-forget
	// rely on large writes being in flight (their results say so).
	StallWrites func() (release func())
	// FragmentSize is the largest piece the engine moves as one unit
	// inside (a frame, a put); the data rules then always include a write
	// above it. Zero means unknown (only the 1 MiB floor applies).
	FragmentSize uint64
	// MaxNotification is the largest notification payload the engine
	// accepts; zero means the suite finds it by trying (at most 1 MiB).
	MaxNotification int
}

// EngineFactory returns a fresh EnginePair for one rule.
type EngineFactory func() (EnginePair, error)

// Engine runs the engine rules against pairs from newPair as subtests of t,
// each named after its rule without the kind ("byte-exact"), so
// go test -run 'TestX/byte-exact' runs a single rule.
func Engine(t *testing.T, newPair EngineFactory, cfg Config) {
	t.Helper()
	engineSuite(newPair).test(t, cfg)
}

// CheckEngine runs the engine rules against pairs from newPair and returns
// the report; it needs no testing.T.
func CheckEngine(newPair EngineFactory, cfg Config) Report {
	return engineSuite(newPair).check(cfg)
}

// enginePeer is an EnginePair after the suite connected it.
type enginePeer struct {
	EnginePair
	// peerB is the name A knows B by, peerA the name B knows A by.
	peerB, peerA string
	rig          *writeRig
	// noStall says why A's writes cannot be stalled (StallWrites nil).
	noStall string
}

func engineSuite(newPair EngineFactory) suite[*enginePeer] {
	return suite[*enginePeer]{
		kind:  "engine",
		rules: engineRules(),
		open: func() (opened[*enginePeer], error) {
			if newPair == nil {
				return opened[*enginePeer]{}, errors.New("nil EngineFactory")
			}
			p, err := newPair()
			if err != nil {
				return opened[*enginePeer]{}, err
			}
			cleanup := p.Cleanup
			if cleanup == nil {
				cleanup = func() {}
			}
			if p.Memory.Unavailable != "" {
				return opened[*enginePeer]{cleanup: cleanup, memory: p.Memory}, nil
			}
			if p.A == nil || p.B == nil {
				return opened[*enginePeer]{cleanup: cleanup}, errors.New("EnginePair.A or B is nil")
			}
			var noStall string
			if p.StallWrites == nil {
				p.StallWrites, noStall = stallerOf(p.A)
			}
			o := opened[*enginePeer]{
				f:        &enginePeer{EnginePair: p, noStall: noStall},
				cleanup:  cleanup,
				alloc:    p.Alloc,
				memory:   p.Memory,
				subject:  fmt.Sprintf("%T", p.A),
				fragment: p.FragmentSize,
			}
			for _, e := range []struct {
				what string
				x    transfer.Engine
			}{{"EnginePair.A", p.A}, {"EnginePair.B", p.B}} {
				if err := transfer.CheckKinds(e.x, e.what, []transfer.Desc{{Kind: p.Memory.Kind}}); err != nil {
					return o, fmt.Errorf("EnginePair.Memory: %w", err)
				}
			}
			return o, nil
		},
	}
}

// stallerOf returns a StallWrites over e's transfer.WriteStaller, tried
// once (stalled and released at once), or nil and why there is none.
func stallerOf(e transfer.Engine) (stall func() (release func()), why string) {
	const none = "EnginePair.StallWrites is nil"
	s, ok := e.(transfer.WriteStaller)
	if !ok {
		return nil, none + " and A is no transfer.WriteStaller"
	}
	release, err := s.StallWrites()
	if err != nil {
		return nil, fmt.Sprintf("%s and A's transfer.WriteStaller refused: %v", none, err)
	}
	release()
	return func() func() {
		release, err := s.StallWrites()
		if err != nil {
			// Stalled once, refused now: the rule sees its write
			// complete unheld and says the stall did not hold.
			return func() {}
		}
		return release
	}, ""
}

// connect loads each engine's metadata into the other and builds the rig.
func (e *enginePeer) connect(c *rc) error {
	c.step("loading B's metadata into A")
	md, err := e.B.Metadata()
	if err != nil {
		return fmt.Errorf("B.Metadata: %w", err)
	}
	if e.peerB, err = e.A.LoadPeer(md); err != nil {
		return fmt.Errorf("A.LoadPeer(B's metadata): %w", err)
	}
	c.step("loading A's metadata into B")
	if md, err = e.A.Metadata(); err != nil {
		return fmt.Errorf("A.Metadata: %w", err)
	}
	if e.peerA, err = e.B.LoadPeer(md); err != nil {
		return fmt.Errorf("B.LoadPeer(A's metadata): %w", err)
	}
	e.rig = &writeRig{
		regSrc: e.A.RegisterMemory,
		regDst: func(d transfer.Desc) error {
			if err := e.B.RegisterMemory(d); err != nil {
				return err
			}
			return e.reload(c)
		},
		write: func(src, dst transfer.Desc) (transfer.Op, error) {
			return e.A.PostWrite(e.peerB, []transfer.WriteOp{{Src: src, Dst: dst}})
		},
		multi: func(ops []transfer.WriteOp) (transfer.Op, error) { return e.A.PostWrite(e.peerB, ops) },
	}
	return nil
}

// reload refreshes A's view of B after B registered more memory.
func (e *enginePeer) reload(c *rc) error {
	return loadAgain(c, "B", e.B, "A", e.A, e.peerB)
}

// loadAgain loads from's current metadata into into again and checks that
// into still names the peer want, the name its first load gave.
func loadAgain(c *rc, fromName string, from transfer.Engine, intoName string, into transfer.Engine, want string) error {
	c.step("loading %s's metadata into %s again", fromName, intoName)
	md, err := from.Metadata()
	if err != nil {
		return fmt.Errorf("%s.Metadata: %w", fromName, err)
	}
	name, err := into.LoadPeer(md)
	if err != nil {
		return fmt.Errorf("%s.LoadPeer(%s's metadata) again: %w", intoName, fromName, err)
	}
	if name != want {
		return fmt.Errorf("loading %s's metadata into %s again named the peer %q; the first load named it %q", fromName, intoName, name, want)
	}
	return nil
}

func engineRules() []rule[*enginePeer] {
	mk := func(c *rc, e *enginePeer) (rig, error) {
		if err := e.connect(c); err != nil {
			return nil, err
		}
		return e.rig, nil
	}
	connected := func(body func(c *rc, e *enginePeer) error) func(c *rc, e *enginePeer) error {
		return func(c *rc, e *enginePeer) error {
			if err := e.connect(c); err != nil {
				return fmt.Errorf("setup: %w", err)
			}
			return body(c, e)
		}
	}
	rules := append(dataRules("engine", "write", mk), blockEngineRules()...)
	rules = append(rules, pullRules()...)
	rules = append(rules, readRules()...)
	return append(rules,
		rule[*enginePeer]{"engine/multi-op", "a PostWrite of several writes (unaligned, adjacent, out of address order) is one op that lands every byte (skipped on ErrUnsupported)", connected(ruleMultiOp)},
		rule[*enginePeer]{"engine/unknown-peer", "PostWrite to a peer that was never loaded fails with transfer.ErrUnknownPeer and writes nothing", connected(ruleUnknownPeer)},
		rule[*enginePeer]{"engine/bad-metadata", "LoadPeer of empty, garbage or truncated metadata fails with transfer.ErrBadMetadata and leaves the loaded peer working", connected(ruleBadMetadata)},
		rule[*enginePeer]{"engine/reload-peer", "memory the peer registers after it was loaded is writable once its metadata is loaded again, under the same peer name", connected(ruleReloadPeer)},
		rule[*enginePeer]{"engine/deregister-in-flight", "A.DeregisterMemory of a source an in-flight write reads returns transfer.ErrInUse, or nil once the write let go of it, and the write completes byte-exact; B.DeregisterMemory of its destination returns ErrInUse (the write completes byte-exact) or nil, after which nothing lands there", connected(ruleDeregisterInFlight)},
		rule[*enginePeer]{"engine/forget-peer", "ForgetPeer makes in-flight writes terminal within OpTimeout (Failed ones wrap transfer.ErrPeerLost and are quiescent), later posts fail with transfer.ErrUnknownPeer, and loading the peer again works", connected(ruleForgetPeer)},
		rule[*enginePeer]{"engine/source-forget", "once A.ForgetPeer(B) made a write fail with transfer.ErrPeerLost, none of its bytes land later; every in-flight write is watched at once, from its first terminal Poll (A's writes are stalled first when EnginePair.StallWrites or A's transfer.WriteStaller can)", connected(ruleSourceForget)},
		rule[*enginePeer]{"engine/target-forget", "once B.ForgetPeer(A) returns, no byte of any write A posted — in flight, posted at once or a while later — changes B's memory (every destination snapshotted the moment it returns, then compared), and later posts never report Done; an engine claiming transfer.Fencer is checked over three rounds (cold and warm), must admit A again after B loads it, and the cut-off writes stay absent after that reload and a new write (skipped when B declares FencesForgottenPeers false)", connected(ruleTargetForget)},
		rule[*enginePeer]{"engine/not-quiescent", "a write stalled on purpose (EnginePair.StallWrites, or A's test-only transfer.WriteStaller) and given up — by the engine or by A.ForgetPeer — is terminal within OpTimeout and either fails wrapping transfer.ErrNotQuiescent or lands nothing once the stall ends, watched for Config.QuietWatch (skipped without a stall)", connected(ruleNotQuiescent)},
		rule[*enginePeer]{"engine/post-async", "PostWrite returns within CallTimeout without waiting for the bytes: stalled writes (EnginePair.StallWrites or transfer.WriteStaller) are posted, several in flight at once, and each is pending; without a stall, some large write must be pending at its first Poll, and one that never is is reported as a failure", connected(rulePostAsync)},
		rule[*enginePeer]{"engine/peer-loss", "when B dies (EnginePair.KillB) every in-flight write is terminal within OpTimeout, Failed ones wrap transfer.ErrPeerLost, and no later write reports Done (skipped without KillB)", connected(rulePeerLoss)},
		rule[*enginePeer]{"engine/write-guard", "B asks the transfer.WriteGuard installed with SetWriteGuard, with A's name and a range inside the destination, before A's write lands: a write into the range the guard admits for A lands byte-exact; one the guard forbids, one that starts inside a grant and ends outside it, one into a grant since revoked and a post mixing an admitted and a forbidden destination fail wrapping transfer.ErrForbidden and change no byte (skipped without transfer.WriteGuarded)", connected(ruleWriteGuard)},
		rule[*enginePeer]{"engine/terminal-after-forget", "writes that were Done stay Done, without an error, when polled again after B.ForgetPeer(A), after A.ForgetPeer(B), after another op was released and after time has passed", connected(ruleTerminalAfterForget)},
		rule[*enginePeer]{"engine/bounds-edges", "a write ending exactly at the last byte of a registered source and destination is accepted and lands; a destination across a 4 GiB-aligned address lands whole (that part noted as not exercised when the fixture allocates the memory)", connected(ruleBoundsEdges)},
		rule[*enginePeer]{"engine/deregister-idle", "memory B deregistered with nothing in flight is no destination any more: a write through the metadata A loaded before is refused or fails, and changes no byte", connected(ruleDeregisterIdle)},
		rule[*enginePeer]{"engine/connect", "transfer.Connector: Connect returns within CallTimeout (to a loaded, a never-loaded, a forgotten peer), posts right after it or racing it return at once and land, and A closes within OpTimeout right after a Connect (skipped without transfer.Connector)", connected(ruleConnect)},
		rule[*enginePeer]{"engine/notify-order", "1,000 notifications to one peer arrive in order, none lost or duplicated, and Notify never blocks (skipped without transfer.Notifier)", connected(ruleNotifyOrder)},
		rule[*enginePeer]{"engine/notify-order-sizes", "notifications of mixed payload sizes up to the engine's maximum (EnginePair.MaxNotification, or found by trying) arrive in order and byte-exact (skipped without transfer.Notifier)", connected(ruleNotifyOrderSizes)},
		rule[*enginePeer]{"engine/notify-sender", "a received notification names its sender as the receiver loaded it (skipped without transfer.Notifier)", connected(ruleNotifySender)},
		rule[*enginePeer]{"engine/notify-no-crosstalk", "notifications sent both ways at once each reach only the other engine, with the right sender, in order (skipped without transfer.Notifier)", connected(ruleNotifyCrosstalk)},
		rule[*enginePeer]{"engine/notify-after-write", "a notification A sends once a write is Done reaches B only when that write's bytes are visible there, with other writes in flight around it; once A and B loaded each other again no notification is delivered twice (skipped without transfer.Notifier)", connected(ruleNotifyAfterWrite)},
		rule[*enginePeer]{"engine/notify-timeout", "RecvNotification with nothing sent returns transfer.ErrTimeout after at most its timeout (skipped without transfer.Notifier)", connected(ruleNotifyTimeout)},
		rule[*enginePeer]{"engine/notify-closed", "RecvNotification on a closed engine returns transfer.ErrClosed at once (skipped without transfer.Notifier)", connected(ruleNotifyClosed)},
	)
}

func ruleMultiOp(c *rc, e *enginePeer) error {
	sizes := []uint64{1, 4097, 300, 64, 64, 7}
	var ops []transfer.WriteOp
	j := &job{what: fmt.Sprintf("post of %d writes", len(sizes))}
	// The fourth and fifth writes fill the two halves of one buffer, the
	// second half first.
	var shared []byte
	for i, n := range sizes {
		src, err := c.buf(n + 5)
		if err != nil {
			return err
		}
		c.fill(src)
		if err := e.A.RegisterMemory(c.desc(src)); err != nil {
			return fmt.Errorf("A.RegisterMemory: %w", err)
		}
		var dst []byte
		switch i {
		case 3:
			if shared, err = c.buf(2*n + 2); err != nil {
				return err
			}
			c.fill(shared)
			if err := e.B.RegisterMemory(c.desc(shared)); err != nil {
				return fmt.Errorf("B.RegisterMemory: %w", err)
			}
			dst = shared[1+n : 1+2*n]
		case 4:
			dst = shared[1 : 1+n]
		default:
			if dst, err = c.buf(n + 9); err != nil {
				return err
			}
			c.fill(dst)
			if err := e.B.RegisterMemory(c.desc(dst)); err != nil {
				return fmt.Errorf("B.RegisterMemory: %w", err)
			}
			j.watch(fmt.Sprintf("write %d: guard before the destination:", i), dst[:3], nil)
			j.watch(fmt.Sprintf("write %d: guard after the destination:", i), dst[3+n:], nil)
			dst = dst[3 : 3+n]
		}
		j.watch(fmt.Sprintf("write %d (%d bytes): destination", i, n), dst, src[2:2+n])
		ops = append(ops, transfer.WriteOp{Src: c.desc(src[2 : 2+n]), Dst: c.desc(dst)})
	}
	j.watch("shared destination: guard", shared[:1], nil)
	j.watch("shared destination: guard at the end", shared[len(shared)-1:], nil)
	if err := e.reload(c); err != nil {
		return err
	}
	j.post = func() (transfer.Op, error) { return e.A.PostWrite(e.peerB, ops) }
	op, perr, err := c.post(j)
	if err != nil {
		return err
	}
	if errors.Is(perr, transfer.ErrUnsupported) {
		return c.skipf("PostWrite of %d writes: %v", len(ops), perr)
	}
	if perr != nil {
		return fmt.Errorf("%s: rejected: %v", j.what, perr)
	}
	o, err := c.wait(op, j.what)
	if err != nil {
		return err
	}
	defer op.Release()
	if o.st != transfer.Done {
		return fmt.Errorf("%s: Poll reported %v; want done", j.what, o)
	}
	if m := j.mismatch(); m != "" {
		return fmt.Errorf("%s: %s", j.what, m)
	}
	return nil
}

// expectRefused posts j and requires a refusal (by the call or a failed
// op) wrapping want, with nothing written. It returns the refusal.
func expectRefused(c *rc, j *job, want ...error) error {
	op, perr, err := c.post(j)
	if err != nil {
		return err
	}
	cause, how := perr, "the call"
	if perr == nil {
		o, err := c.waitFailed(op, j.what, "want a failure wrapping "+names(want))
		if err != nil {
			return err
		}
		cause, how = o.err, "a failed op"
	}
	if !anyOf(cause, want) {
		return fmt.Errorf("%s: refused by %s with %q, which wraps neither %s", j.what, how, fmt.Sprint(cause), names(want))
	}
	if m := j.changed(); m != "" {
		c.tainted("%s wrote memory", j.what)
		return fmt.Errorf("%s was refused but %s", j.what, m)
	}
	return nil
}

// retarget returns a copy of j that posts the same write to peer.
func retarget(e *enginePeer, j *job, what, peer string) *job {
	k := *j
	k.what = what
	k.post = func() (transfer.Op, error) {
		return e.A.PostWrite(peer, []transfer.WriteOp{{Src: j.src, Dst: j.dst}})
	}
	return &k
}

func ruleUnknownPeer(c *rc, e *enginePeer) error {
	j, err := e.rig.job(c, 64, 1)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	const ghost = "conformance-peer-never-loaded"
	return expectRefused(c, retarget(e, j, fmt.Sprintf("write to never-loaded peer %q", ghost), ghost), transfer.ErrUnknownPeer)
}

func ruleBadMetadata(c *rc, e *enginePeer) error {
	md, err := e.B.Metadata()
	if err != nil {
		return fmt.Errorf("B.Metadata: %w", err)
	}
	inputs := []struct {
		what string
		md   []byte
	}{
		{"nil metadata", nil},
		{"empty metadata", []byte{}},
		{"garbage metadata", []byte("\x00conformance: not metadata\xff\xfe")},
		{"B's metadata truncated to half", md[:len(md)/2]},
		{"B's metadata truncated to one byte", md[:min(1, len(md))]},
	}
	for _, in := range inputs {
		c.step("A.LoadPeer(%s)", in.what)
		name, err := e.A.LoadPeer(in.md)
		if err == nil {
			return fmt.Errorf("A.LoadPeer(%s) accepted it as peer %q; want an error wrapping %q", in.what, name, transfer.ErrBadMetadata)
		}
		if !errors.Is(err, transfer.ErrBadMetadata) {
			return fmt.Errorf("A.LoadPeer(%s): %q does not wrap %q", in.what, err, transfer.ErrBadMetadata)
		}
	}
	j, err := e.rig.job(c, 4097, 1)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	op, err := c.complete(j)
	if err != nil {
		return fmt.Errorf("after the bad LoadPeer calls: %w", err)
	}
	defer op.Release()
	if m := j.mismatch(); m != "" {
		return fmt.Errorf("after the bad LoadPeer calls, %s: %s", j.what, m)
	}
	return nil
}

func ruleReloadPeer(c *rc, e *enginePeer) error {
	// Memory registered at B while A's view is stale.
	stale := *e.rig
	stale.regDst = e.B.RegisterMemory
	j, err := stale.job(c, 4097, 1)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	for range 2 {
		if err := e.reload(c); err != nil {
			return err
		}
	}
	op, err := c.complete(j)
	if err != nil {
		return fmt.Errorf("after reloading B's metadata: %w", err)
	}
	defer op.Release()
	if m := j.mismatch(); m != "" {
		return fmt.Errorf("after reloading B's metadata, %s: %s", j.what, m)
	}
	return nil
}

func ruleDeregisterInFlight(c *rc, e *enginePeer) error {
	n := c.cfg.maxSize()
	// The source side: A knows its own writes, so it refuses (ErrInUse)
	// or waits for them; either way the write completes byte-exact.
	j, err := e.rig.job(c, n, 0)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	want := bytes.Clone(j.areas[1].want) // the source bytes as posted
	op, perr, err := c.post(j)
	if err != nil {
		return err
	}
	if perr != nil {
		return fmt.Errorf("%s: rejected: %v", j.what, perr)
	}
	c.step("A.DeregisterMemory(source) during %s", j.what)
	derr := e.A.DeregisterMemory(j.srcReg)
	if derr == nil {
		// Deregistered: the memory is the caller's again. A write that
		// still read it would now copy these bytes.
		c.fill(j.areas[0].b)
	}
	if derr != nil && !errors.Is(derr, transfer.ErrInUse) {
		_, _ = c.wait(op, j.what)
		return fmt.Errorf("A.DeregisterMemory(source) during %s: %v; want nil (after the write let go of it) or transfer.ErrInUse", j.what, derr)
	}
	o, err := c.wait(op, j.what)
	if err != nil {
		return err
	}
	if o.st != transfer.Done {
		return fmt.Errorf("A.DeregisterMemory(source) returned %v during %s, then Poll reported %v; the write must still complete", derr, j.what, o)
	}
	if d := describeDiff("destination", j.areas[1].b, want); d != "" {
		if derr == nil {
			return fmt.Errorf("A.DeregisterMemory(source) returned nil during %s, which then copied source bytes changed after that: %s", j.what, d)
		}
		return fmt.Errorf("A.DeregisterMemory(source) returned %v during %s, then: %s", derr, j.what, d)
	}
	_ = op.Release()
	if derr != nil {
		if err := e.A.DeregisterMemory(j.srcReg); err != nil {
			return fmt.Errorf("A.DeregisterMemory(source) after %s was done and released: %v; want nil", j.what, err)
		}
	}

	// The destination side: B may not know of a write still on its way,
	// so it may deregister at once; but from then on nothing may land in
	// the range. With ErrInUse the write completes byte-exact.
	j, err = e.rig.job(c, n, 0)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	op, perr, err = c.post(j)
	if err != nil {
		return err
	}
	if perr != nil {
		return fmt.Errorf("%s: rejected: %v", j.what, perr)
	}
	c.step("B.DeregisterMemory(destination) during %s", j.what)
	derr = e.B.DeregisterMemory(j.dstReg)
	var canary []byte
	if derr == nil {
		dst := j.areas[1].b
		c.fill(dst)
		canary = bytes.Clone(dst)
	}
	if derr != nil && !errors.Is(derr, transfer.ErrInUse) {
		_, _ = c.wait(op, j.what)
		return fmt.Errorf("B.DeregisterMemory(destination) during %s: %v; want nil or transfer.ErrInUse", j.what, derr)
	}
	o, err = c.wait(op, j.what)
	if err != nil {
		return err
	}
	if derr == nil {
		_ = op.Release()
		time.Sleep(c.cfg.Settle)
		if k := firstDiff(j.areas[1].b, canary); k >= 0 {
			c.tainted("%s wrote deregistered memory", j.what)
			return fmt.Errorf("B.DeregisterMemory(destination) returned nil during %s (which then reported %v), yet destination byte %d changed afterwards: nothing may land in deregistered memory", j.what, o, k)
		}
		return nil
	}
	_ = op.Release()
	if o.st != transfer.Done {
		return fmt.Errorf("B.DeregisterMemory(destination) returned %v during %s, then Poll reported %v; the write must still complete", derr, j.what, o)
	}
	if m := j.mismatch(); m != "" {
		return fmt.Errorf("B.DeregisterMemory(destination) returned %v during %s, then: %s", derr, j.what, m)
	}
	if err := e.B.DeregisterMemory(j.dstReg); err != nil {
		return fmt.Errorf("B.DeregisterMemory(destination) after %s was done and released: %v; want nil", j.what, err)
	}
	return nil
}

// inFlight posts k writes of the largest size and returns them with ops.
func inFlight(c *rc, e *enginePeer, k int) ([]*job, []transfer.Op, error) {
	return inFlightSized(c, e, k, c.cfg.maxSize())
}

// stalledSize is the size of the writes the forget rules keep in flight
// while A's writes are stalled: the stall, not the size, holds them.
const stalledSize = 2 << 20

// inFlightSized posts k writes of n bytes and returns them with ops.
func inFlightSized(c *rc, e *enginePeer, k int, n uint64) ([]*job, []transfer.Op, error) {
	var jobs []*job
	for range k {
		j, err := e.rig.job(c, n, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("setup: %w", err)
		}
		jobs = append(jobs, j)
	}
	var ops []transfer.Op
	for _, j := range jobs {
		op, perr, err := c.post(j)
		if err != nil {
			return nil, nil, err
		}
		if perr != nil {
			return nil, nil, fmt.Errorf("%s: rejected: %v", j.what, perr)
		}
		ops = append(ops, op)
	}
	return jobs, ops, nil
}

// settleLost waits for ops cut off by a lost peer: each must be terminal
// within OpTimeout, Done ones byte-exact, Failed ones wrap ErrPeerLost (or
// ErrNotQuiescent) and, unless not quiescent, touch nothing afterwards.
// Every op is watched at once (settleAll), from its first terminal Poll.
func settleLost(c *rc, jobs []*job, ops []transfer.Op, event string) (failed int, err error) {
	outs, err := settleAll(c, jobs, ops, event, nil)
	for _, o := range outs {
		if o.st == transfer.Failed {
			failed++
		}
	}
	return failed, err
}

func ruleForgetPeer(c *rc, e *enginePeer) error {
	// Prepared first: preparing a write registers memory at B and reloads B.
	j, err := e.rig.job(c, 4097, 1)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	jobs, ops, err := inFlight(c, e, 4)
	if err != nil {
		return err
	}
	c.step("A.ForgetPeer(%q) with writes in flight", e.peerB)
	if err := e.A.ForgetPeer(e.peerB); err != nil {
		for _, op := range ops {
			_, _ = c.wait(op, "a write")
		}
		return fmt.Errorf("A.ForgetPeer(%q): %v", e.peerB, err)
	}
	failed, err := settleLost(c, jobs, ops, "ForgetPeer")
	if err != nil {
		return err
	}
	if failed == 0 {
		c.note("all %d writes were done before ForgetPeer; failing in-flight writes not observed", len(ops))
	}
	if err := expectRefused(c, retarget(e, j, "write to the forgotten peer", e.peerB), transfer.ErrUnknownPeer); err != nil {
		return err
	}
	if err := e.reload(c); err != nil {
		return fmt.Errorf("loading the forgotten peer again: %w", err)
	}
	op, err := c.complete(j)
	if err != nil {
		return fmt.Errorf("after loading the forgotten peer again: %w", err)
	}
	defer op.Release()
	if m := j.mismatch(); m != "" {
		return fmt.Errorf("after loading the forgotten peer again, %s: %s", j.what, m)
	}
	return nil
}

func rulePeerLoss(c *rc, e *enginePeer) error {
	if e.KillB == nil {
		return c.skipf("EnginePair.KillB is nil")
	}
	after, err := e.rig.job(c, 4097, 1)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	jobs, ops, err := inFlight(c, e, 4)
	if err != nil {
		return err
	}
	c.step("killing B with writes in flight")
	e.KillB()
	failed, err := settleLost(c, jobs, ops, "B was killed")
	if err != nil {
		return err
	}
	if failed == 0 {
		c.note("all %d writes were done before B died; failing in-flight writes not observed", len(ops))
	}
	after.what = "write to B after it was killed"
	op, perr, err := c.post(after)
	if err != nil {
		return err
	}
	if perr == nil {
		o, err := c.wait(op, after.what)
		if err != nil {
			return err
		}
		_ = op.Release()
		if o.st == transfer.Done {
			return fmt.Errorf("%s: Poll reported done", after.what)
		}
	}
	return nil
}

func ruleWriteGuard(c *rc, e *enginePeer) error {
	g, ok := e.B.(transfer.WriteGuarded)
	if !ok {
		return c.skipf("B does not implement transfer.WriteGuarded")
	}
	var jobs [6]*job
	for i := range jobs {
		j, err := e.rig.job(c, 4097, 1)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		jobs[i] = j
	}
	admitted, refused, straddle, revoked, mixedIn, mixedOut := jobs[0], jobs[1], jobs[2], jobs[3], jobs[4], jobs[5]
	type ask struct {
		peer string
		d    transfer.Desc
	}
	var (
		mu     sync.Mutex
		grants []transfer.Desc
		asks   []ask
	)
	grant := func(d transfer.Desc) {
		mu.Lock()
		grants = append(grants, d)
		mu.Unlock()
	}
	c.step("B.SetWriteGuard(admit the granted ranges for %q only)", e.peerA)
	g.SetWriteGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) {
		mu.Lock()
		defer mu.Unlock()
		asks = append(asks, ask{peer, d})
		for _, r := range grants {
			if peer == e.peerA && r.Contains(d.Addr, d.Len) {
				return r, nil
			}
		}
		return transfer.Desc{}, fmt.Errorf("conformance guard: %q may not write [%#x+%d]: %w", peer, d.Addr, d.Len, transfer.ErrForbidden)
	})
	defer g.SetWriteGuard(nil)
	// asked checks the guard's questions since mark: at least one, each
	// naming A and a range inside the write's destinations.
	asked := func(mark int, what string, dsts ...transfer.Desc) error {
		mu.Lock()
		defer mu.Unlock()
		if len(asks) == mark {
			return fmt.Errorf("B handled %s without asking its guard", what)
		}
		for _, q := range asks[mark:] {
			inside := false
			for _, d := range dsts {
				inside = inside || (q.d.Len > 0 && d.Contains(q.d.Addr, q.d.Len))
			}
			if q.peer != e.peerA || !inside {
				return fmt.Errorf("for %s B asked its guard about (%q, [%#x+%d]); want the writing peer %q and a range inside the write's destination", what, q.peer, q.d.Addr, q.d.Len, e.peerA)
			}
		}
		return nil
	}
	mark := func() int { mu.Lock(); defer mu.Unlock(); return len(asks) }

	grant(admitted.dst)
	admitted.what = "write the guard admits"
	m0 := mark()
	if err := completeExact(c, admitted); err != nil {
		return err
	}
	if err := asked(m0, admitted.what, admitted.dst); err != nil {
		return err
	}
	refused.what = "write the guard forbids"
	m0 = mark()
	if err := expectRefused(c, refused, transfer.ErrForbidden); err != nil {
		return err
	}
	if err := asked(m0, refused.what, refused.dst); err != nil {
		return err
	}
	// A write that starts inside a grant and ends outside it.
	grant(transfer.Desc{Addr: straddle.dst.Addr, Len: straddle.dst.Len / 2, Kind: straddle.dst.Kind, Device: straddle.dst.Device})
	straddle.what = "write starting inside a grant (its first half) and ending outside it"
	if err := expectRefused(c, straddle, transfer.ErrForbidden); err != nil {
		return err
	}
	// A grant revoked, then the same range written again.
	grant(revoked.dst)
	revoked.what = "write into a granted range"
	if err := completeExact(c, revoked); err != nil {
		return err
	}
	mu.Lock()
	grants = slices.DeleteFunc(grants, func(r transfer.Desc) bool { return r == revoked.dst })
	mu.Unlock()
	revoked.reset()
	revoked.what = "the same write again once its grant was revoked"
	if err := expectRefused(c, revoked, transfer.ErrForbidden); err != nil {
		return err
	}
	// One post mixing an admitted and a forbidden destination.
	grant(mixedIn.dst)
	mixed := &job{what: "post of two writes, the first admitted by the guard and the second forbidden"}
	mixed.areas = append(append(mixed.areas, mixedIn.areas...), mixedOut.areas...)
	mixed.post = func() (transfer.Op, error) {
		return e.A.PostWrite(e.peerB, []transfer.WriteOp{{Src: mixedIn.src, Dst: mixedIn.dst}, {Src: mixedOut.src, Dst: mixedOut.dst}})
	}
	op, perr, err := c.post(mixed)
	if err != nil {
		return err
	}
	if errors.Is(perr, transfer.ErrUnsupported) {
		c.note("%s not exercised: PostWrite of two writes: %v", mixed.what, perr)
		return nil
	}
	if perr == nil {
		o, err := c.waitFailed(op, mixed.what, fmt.Sprintf("want a failure wrapping %q", transfer.ErrForbidden))
		if err != nil {
			return err
		}
		perr = o.err
	}
	if !errors.Is(perr, transfer.ErrForbidden) {
		return fmt.Errorf("%s: refused with %q, which does not wrap %q", mixed.what, fmt.Sprint(perr), transfer.ErrForbidden)
	}
	time.Sleep(c.cfg.Settle)
	if m := mixed.changed(); m != "" {
		c.tainted("%s wrote", mixed.what)
		return fmt.Errorf("%s was refused, but %s: a refused write changes no byte, its admitted part included", mixed.what, m)
	}
	return nil
}

// notifiers returns A and B as transfer.Notifiers, or a skip.
func notifiers(c *rc, e *enginePeer) (transfer.Notifier, transfer.Notifier, error) {
	a, okA := e.A.(transfer.Notifier)
	b, okB := e.B.(transfer.Notifier)
	if !okA || !okB {
		return nil, nil, c.skipf("the engines do not implement transfer.Notifier")
	}
	return a, b, nil
}

// notifyAll sends n notifications from s to peer.
func notifyAll(c *rc, s transfer.Notifier, peer string, n int, payload func(int) []byte) error {
	return sendN(c, fmt.Sprintf("Notify(%q)", peer), n, func(b []byte) error { return s.Notify(peer, b) }, payload)
}

// recvNotes receives n notifications on r and checks each with check.
func recvNotes(c *rc, r transfer.Notifier, who string, n int, check func(i int, m transfer.Message) error) error {
	return recvN(c, who, who+": RecvNotification", "notifications", n, r.RecvNotification, check)
}

func ruleNotifyOrder(c *rc, e *enginePeer) error {
	a, b, err := notifiers(c, e)
	if err != nil {
		return err
	}
	const n = 1000
	sent := make(chan error, 1)
	go func() { sent <- notifyAll(c, a, e.peerB, n, tagged("order")) }()
	rerr := recvNotes(c, b, "B", n, func(i int, m transfer.Message) error {
		if want := tagged("order")(i); string(m.Payload) != string(want) {
			return fmt.Errorf("notification %d received by B is %q; want %q (order per peer, none lost or duplicated)", i, m.Payload, want)
		}
		return nil
	})
	if serr := <-sent; serr != nil {
		return serr
	}
	return rerr
}

func ruleNotifySender(c *rc, e *enginePeer) error {
	a, b, err := notifiers(c, e)
	if err != nil {
		return err
	}
	const n = 10
	for _, d := range []struct {
		from, to     transfer.Notifier
		fromN, toN   string
		peer, sender string
	}{
		{a, b, "A", "B", e.peerB, e.peerA},
		{b, a, "B", "A", e.peerA, e.peerB},
	} {
		if err := notifyAll(c, d.from, d.peer, n, tagged(d.fromN)); err != nil {
			return fmt.Errorf("%s: %w", d.fromN, err)
		}
		err := recvNotes(c, d.to, d.toN, n, func(i int, m transfer.Message) error {
			if m.Peer != d.sender {
				return fmt.Errorf("%s received %q naming the sender %q; %s loaded %s as %q", d.toN, m.Payload, m.Peer, d.toN, d.fromN, d.sender)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func ruleNotifyCrosstalk(c *rc, e *enginePeer) error {
	a, b, err := notifiers(c, e)
	if err != nil {
		return err
	}
	const n = 300
	sent := make(chan error, 2)
	go func() { sent <- notifyAll(c, a, e.peerB, n, tagged("from-A")) }()
	go func() { sent <- notifyAll(c, b, e.peerA, n, tagged("from-B")) }()
	got := make(chan error, 1)
	go func() {
		got <- recvNotes(c, a, "A", n, func(i int, m transfer.Message) error {
			if want := tagged("from-B")(i); string(m.Payload) != string(want) || m.Peer != e.peerB {
				return fmt.Errorf("notification %d received by A is %q from %q; want %q from %q", i, m.Payload, m.Peer, want, e.peerB)
			}
			return nil
		})
	}()
	berr := recvNotes(c, b, "B", n, func(i int, m transfer.Message) error {
		if want := tagged("from-A")(i); string(m.Payload) != string(want) || m.Peer != e.peerA {
			return fmt.Errorf("notification %d received by B is %q from %q; want %q from %q", i, m.Payload, m.Peer, want, e.peerA)
		}
		return nil
	})
	return errors.Join(<-sent, <-sent, <-got, berr)
}

func ruleNotifyTimeout(c *rc, e *enginePeer) error {
	_, b, err := notifiers(c, e)
	if err != nil {
		return err
	}
	const timeout = 50 * time.Millisecond
	t0 := time.Now()
	m, err := b.RecvNotification(timeout)
	if qerr := c.quick(fmt.Sprintf("RecvNotification(%v) past its timeout", timeout), t0.Add(timeout)); qerr != nil {
		return qerr
	}
	if !errors.Is(err, transfer.ErrTimeout) {
		return fmt.Errorf("RecvNotification(%v) with nothing sent returned (%q from %q, %v); want an error wrapping %q", timeout, m.Payload, m.Peer, err, transfer.ErrTimeout)
	}
	return nil
}

func ruleNotifyClosed(c *rc, e *enginePeer) error {
	_, b, err := notifiers(c, e)
	if err != nil {
		return err
	}
	c.step("B.Close")
	if err := e.B.Close(); err != nil {
		return fmt.Errorf("B.Close: %v", err)
	}
	c.step("B.RecvNotification after Close")
	t0 := time.Now()
	_, err = b.RecvNotification(c.cfg.OpTimeout)
	if qerr := c.quick("RecvNotification on a closed engine", t0); qerr != nil {
		return qerr
	}
	if !errors.Is(err, transfer.ErrClosed) {
		return fmt.Errorf("RecvNotification on a closed engine: %v; want an error wrapping %q", err, transfer.ErrClosed)
	}
	return nil
}
