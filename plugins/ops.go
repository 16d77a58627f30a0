package plugins

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// opTable is the plugin side's table of live operations by handle.
type opTable struct {
	mu   sync.Mutex
	next uint64
	ops  map[uint64]transfer.Op
}

// posted answers a post (a write, a stage copy): the handle of op, now in
// the table, or err.
func (t *opTable) posted(op transfer.Op, err error) *pb.HandleReply {
	if err != nil {
		return &pb.HandleReply{Error: toProtoError(err)}
	}
	return &pb.HandleReply{Handle: t.add(op)}
}

func (t *opTable) add(op transfer.Op) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ops == nil {
		t.ops = map[uint64]transfer.Op{}
	}
	t.next++
	t.ops[t.next] = op
	return t.next
}

func (t *opTable) get(h uint64) (transfer.Op, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	op, ok := t.ops[h]
	if !ok {
		return nil, fmt.Errorf("plugin: no operation with handle %d", h)
	}
	return op, nil
}

func (t *opTable) poll(h uint64) *pb.PollReply {
	op, err := t.get(h)
	if err != nil {
		return &pb.PollReply{Error: toProtoError(err), Status: uint32(transfer.Failed)}
	}
	st, err := op.Poll()
	return &pb.PollReply{Status: uint32(st), Error: toProtoError(err)}
}

// maxWaitBackoff caps the sleep between two local polls of an op a Wait
// holds.
const maxWaitBackoff = 100 * time.Microsecond

// wait polls the op locally until it is terminal, timeout passes or cx
// ends (the host went away): one reply per op instead of one round trip
// per poll.
func (t *opTable) wait(cx context.Context, h uint64, timeout time.Duration) *pb.PollReply {
	deadline := time.Now().Add(timeout)
	backoff := time.Duration(0)
	for spins := 0; ; spins++ {
		rep := t.poll(h)
		if rep.GetStatus() != uint32(transfer.Pending) || time.Now().After(deadline) || cx.Err() != nil {
			return rep
		}
		if spins < 32 {
			runtime.Gosched()
			continue
		}
		backoff = min(max(2*backoff, 5*time.Microsecond), maxWaitBackoff)
		time.Sleep(backoff)
	}
}

func (t *opTable) release(h uint64) *pb.Reply {
	op, err := t.get(h)
	if err != nil {
		return &pb.Reply{Error: toProtoError(err)}
	}
	if err := op.Release(); err != nil {
		return &pb.Reply{Error: toProtoError(err)}
	}
	t.mu.Lock()
	delete(t.ops, h)
	t.mu.Unlock()
	return &pb.Reply{}
}

// opService is the part of every service that starts ops (Engine, Gather,
// Scatter, Writer) that serves them: their clients all have it.
type opService interface {
	Poll(ctx context.Context, in *pb.HandleRequest, opts ...grpc.CallOption) (*pb.PollReply, error)
	Wait(ctx context.Context, in *pb.WaitRequest, opts ...grpc.CallOption) (*pb.PollReply, error)
	Release(ctx context.Context, in *pb.HandleRequest, opts ...grpc.CallOption) (*pb.Reply, error)
}

// rpcPoller is the poller of the ops svc serves, each call bounded.
type rpcPoller struct{ svc opService }

func (p rpcPoller) Poll(h uint64) (*pb.PollReply, error) {
	cx, cancel := ctx(PollTimeout)
	defer cancel()
	return p.svc.Poll(cx, &pb.HandleRequest{Handle: h})
}

func (p rpcPoller) Wait(h uint64, timeout time.Duration) (*pb.PollReply, error) {
	cx, cancel := ctx(timeout + waitSlack)
	defer cancel()
	return p.svc.Wait(cx, &pb.WaitRequest{Handle: h, TimeoutNs: int64(timeout)})
}

func (p rpcPoller) Release(h uint64) (*pb.Reply, error) {
	cx, cancel := ctx(CallTimeout)
	defer cancel()
	return p.svc.Release(cx, &pb.HandleRequest{Handle: h})
}

// started returns the op a plugin started as handle h (what names it in
// errors), watched; settled, if set, runs once it is first seen terminal.
// A malformed handle (0, or one already live in hs) is an error wrapping
// ErrNotQuiescent: the plugin may run an op the host cannot poll.
func started(c *Client, hs *handles, svc opService, what string, h uint64, settled func()) (transfer.Op, error) {
	if err := hs.claim(h); err != nil {
		return nil, fmt.Errorf("plugin %s: %s: %v: %w", c.name, what, err, transfer.ErrNotQuiescent)
	}
	return (&remoteOp{c: c, rpc: rpcPoller{svc}, what: what, h: h, done: hs.drop, settled: settled}).watch(c.notify), nil
}

// poller is the host side of an operation's Poll, Wait and Release RPCs.
type poller interface {
	Poll(h uint64) (*pb.PollReply, error)
	// Wait blocks until the op is terminal or timeout passed (then the
	// reply is pending); the call itself is bounded by timeout+waitSlack.
	Wait(h uint64, timeout time.Duration) (*pb.PollReply, error)
	Release(h uint64) (*pb.Reply, error)
}

// waitTimeout is how long one Wait call holds; a watcher renews it.
const waitTimeout = time.Second

// watcher is the goroutine of one remote op: it waits for the op in the
// plugin (Wait calls renewed every waitTimeout) and hands the terminal
// reply to the op, so the host's Poll answers locally.
type watcher struct {
	o      *remoteOp
	notify func()
}

func (w watcher) run() {
	for {
		start := time.Now()
		rep, err := w.o.rpc.Wait(w.o.h, waitTimeout)
		if status.Code(err) == codes.Unimplemented {
			w.o.unwatch() // a plugin without Wait: the host polls
			return
		}
		if w.o.offer(rep, err) {
			if w.notify != nil {
				w.notify()
			}
			return
		}
		if time.Since(start) < waitTimeout/2 {
			// A plugin that answers pending early, or an error that is
			// not a lost connection: do not spin.
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// remoteOp is an operation running in a plugin, known by its handle.
type remoteOp struct {
	c    *Client
	rpc  poller
	what string
	h    uint64
	done func(h uint64) // forgets the handle on the host side
	// settled, if set, runs once when the op is first seen terminal (a
	// stage unpins the memory it used).
	settled func()

	mu       sync.Mutex
	watched  bool          // a watcher runs: Poll answers from its replies
	reply    *pb.PollReply // the watcher's terminal reply, not yet taken
	replyErr error
	gotReply bool
	terminal bool
	local    bool // resolved on the host (plugin gone): nothing to release
	st       transfer.Status
	err      error
	released bool
}

// Poll asks the plugin, within PollTimeout. A plugin that is gone resolves
// the op Failed (ErrClosed after Close, else ErrPeerLost): its process no
// longer touches memory. A reply with an unknown status is Failed with
// ErrNotQuiescent, since nothing proves the plugin let go of the memory.
func (o *remoteOp) Poll() (transfer.Status, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.terminal {
		return o.st, o.err
	}
	var rep *pb.PollReply
	var err error
	switch {
	case o.watched && o.gotReply:
		rep, err = o.reply, o.replyErr
	case o.c.gone():
		return o.resolveLocal(o.c.rpcErr(o.what, fmt.Errorf("plugin process gone")))
	case o.watched:
		return transfer.Pending, nil
	default:
		rep, err = o.rpc.Poll(o.h)
	}
	if err != nil {
		if o.c.gone() || isConnLost(err) {
			return o.resolveLocal(o.c.rpcErr("poll "+o.what, err))
		}
		return transfer.Pending, nil // slow reply: the op may still run
	}
	st := transfer.Status(rep.GetStatus())
	rerr := fromProtoError(rep.GetError())
	switch {
	case rep.GetStatus() > uint32(transfer.Failed):
		o.terminal, o.local, o.st = true, true, transfer.Failed
		o.err = fmt.Errorf("plugin %s: poll %s (handle %d): malformed reply: status %d is not pending, done or failed; the plugin may still use the memory: %w", o.c.name, o.what, o.h, rep.GetStatus(), transfer.ErrNotQuiescent)
	case st == transfer.Pending:
		return transfer.Pending, nil
	case st == transfer.Done && rerr != nil:
		o.terminal, o.st = true, transfer.Failed
		o.err = fmt.Errorf("plugin %s: poll %s (handle %d): malformed reply: done with an error: %w", o.c.name, o.what, o.h, rerr)
	case st == transfer.Failed && rerr == nil:
		o.terminal, o.st = true, transfer.Failed
		o.err = fmt.Errorf("plugin %s: poll %s (handle %d): failed without a cause", o.c.name, o.what, o.h)
	case st == transfer.Failed:
		o.terminal, o.st, o.err = true, transfer.Failed, fmt.Errorf("plugin %s: %s: %w", o.c.name, o.what, rerr)
	default:
		o.terminal, o.st = true, transfer.Done
	}
	o.settle()
	return o.st, o.err
}

// watch starts the op's watcher; notify (if set) runs when it learned the
// op is terminal.
func (o *remoteOp) watch(notify func()) *remoteOp {
	o.watched = true
	go watcher{o: o, notify: notify}.run()
	return o
}

func (o *remoteOp) unwatch() {
	o.mu.Lock()
	o.watched = false
	o.mu.Unlock()
}

// offer gives the op a Wait reply; it reports whether the watcher is done:
// the reply is terminal, the plugin is gone or the op resolved already.
func (o *remoteOp) offer(rep *pb.PollReply, err error) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.terminal {
		return true
	}
	if err != nil {
		if o.c.gone() || isConnLost(err) {
			o.reply, o.replyErr, o.gotReply = nil, err, true
			return true
		}
		return false
	}
	if rep.GetStatus() == uint32(transfer.Pending) {
		return false
	}
	o.reply, o.replyErr, o.gotReply = rep, nil, true
	return true
}

func (o *remoteOp) resolveLocal(err error) (transfer.Status, error) {
	o.terminal, o.local, o.st, o.err = true, true, transfer.Failed, err
	o.settle()
	return o.st, o.err
}

func (o *remoteOp) settle() {
	if o.settled != nil {
		o.settled()
		o.settled = nil
	}
}

// Release frees the op in the plugin; an op the host resolved itself has
// nothing left to free.
func (o *remoteOp) Release() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.released {
		return fmt.Errorf("plugin %s: release %s (handle %d): already released", o.c.name, o.what, o.h)
	}
	if !o.terminal {
		return fmt.Errorf("plugin %s: release %s (handle %d): still pending: %w", o.c.name, o.what, o.h, transfer.ErrInUse)
	}
	if !o.local && !o.c.gone() {
		rep, err := o.rpc.Release(o.h)
		if err != nil {
			if !o.c.gone() && !isConnLost(err) {
				return o.c.rpcErr("release "+o.what, err)
			}
		} else if rerr := fromProtoError(rep.GetError()); rerr != nil {
			return fmt.Errorf("plugin %s: release %s: %w", o.c.name, o.what, rerr)
		}
	}
	o.released = true
	o.done(o.h)
	return nil
}

// handles tracks the live handles a host-side client got from its plugin,
// so a malformed reply (handle 0, a handle already live) is caught.
type handles struct {
	mu   sync.Mutex
	live map[uint64]bool
}

func (hs *handles) claim(h uint64) error {
	if h == 0 {
		return fmt.Errorf("malformed reply: op handle 0")
	}
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.live == nil {
		hs.live = map[uint64]bool{}
	}
	if hs.live[h] {
		return fmt.Errorf("malformed reply: op handle %d is already in use", h)
	}
	hs.live[h] = true
	return nil
}

func (hs *handles) drop(h uint64) {
	hs.mu.Lock()
	delete(hs.live, h)
	hs.mu.Unlock()
}
