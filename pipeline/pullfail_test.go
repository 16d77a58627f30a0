package pipeline

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// servedPulls counts the pulls n serves now (holder side), read on its reactor.
func servedPulls(n *node) int {
	res := make(chan int, 1)
	n.post(func(r *reactor) { res <- len(r.served) })
	select {
	case v := <-res:
		return v
	case <-n.stopped:
		return 0
	}
}

// pulling counts the pulls n has in flight (puller side).
func pulling(n *node) int {
	res := make(chan int, 1)
	n.post(func(r *reactor) { res <- len(r.pulls) + len(r.pullQuiet) })
	select {
	case v := <-res:
		return v
	case <-n.stopped:
		return 0
	}
}

// pullFixture is a holder a and a puller b, a job from a's memory to b's
// and a pull of it in flight.
type pullFixture struct {
	a, b   *node
	j      job
	bt     *Batch
	events chan Received // a's
}

func startPull(t *testing.T, w *world, acfg, bcfg Config, aopt, bopt []nodeOpt) *pullFixture {
	t.Helper()
	f := &pullFixture{events: make(chan Received, 8)}
	f.a = w.node("a", acfg, append(aopt, withReceived(f.events))...)
	f.b = w.node("b", bcfg, bopt...)
	f.j = simple(t, f.a, f.b, 29)
	clear(f.j.dstB)
	connect(t, f.a, f.b)
	bt, err := f.b.Pull(PullRequest{Peer: "a", Src: f.j.src, Dst: f.j.dst})
	if err != nil {
		t.Fatal(err)
	}
	f.bt = bt
	return f
}

// holderEnded waits for the holder's event of the pull and checks it
// failed with cause and is quiescent.
func (f *pullFixture) holderEnded(t *testing.T, cause error) {
	t.Helper()
	ev := waitEvent(t, f.events)
	if !ev.Pull || ev.Err == nil || !errors.Is(ev.Err, cause) || !ev.Quiescent {
		t.Fatalf("holder's event %+v (err %v), want a quiescent failed pull wrapping %v", ev, ev.Err, cause)
	}
	eventually(t, func() bool { return servedPulls(f.a) == 0 })
}

// untouched fails unless no byte reached the puller's destination.
func (f *pullFixture) untouched(t *testing.T) {
	t.Helper()
	for i, c := range f.j.dstB {
		if c != 0 {
			t.Fatalf("destination byte %d is %#x after the pull was given up", i, c)
		}
	}
}

// TestPullAbandon: the puller abandons a pull whose holder is still
// gathering: the batch is Recoverable at once (nothing scatters into its
// memory), the holder stops and reports the cancel, and no byte lands.
func TestPullAbandon(t *testing.T) {
	w := newWorld(t)
	var sg *stallGatherer
	f := startPull(t, w, testConfig(), testConfig(), []nodeOpt{withStall(&sg)}, nil)
	eventually(t, func() bool { return servedPulls(f.a) == 1 })
	if out := f.bt.Abandon(10 * time.Second); out != transfer.Recoverable {
		t.Fatalf("abandon = %v, want Recoverable", out)
	}
	if err := f.bt.Err(); !errors.Is(err, ErrAbandoned) {
		t.Fatalf("err = %v, want ErrAbandoned", err)
	}
	if err := f.bt.Release(); err != nil {
		t.Fatal(err)
	}
	close(sg.release)
	f.holderEnded(t, ErrPullCancelled)
	settled(t, f.a, f.b)
	f.untouched(t)
	if pulling(f.b) != 0 {
		t.Fatal("the puller still tracks the abandoned pull")
	}
}

// TestPullTimeout: a holder that never writes (its gathers stall) cannot
// hang the puller: the pull fails after the request timeout, the holder
// hears the cancel.
func TestPullTimeout(t *testing.T) {
	w := newWorld(t)
	var sg *stallGatherer
	f := startPull(t, w, testConfig(), shortTimeouts(), []nodeOpt{withStall(&sg)}, nil)
	if err := wait(t, f.bt); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if _, q := f.bt.Retirement(); !q {
		t.Fatal("a timed-out pull with no scatter is not quiescent")
	}
	close(sg.release)
	f.holderEnded(t, ErrPullCancelled)
	settled(t, f.a, f.b)
	f.untouched(t)
}

// TestPullForgetBothSides: both agents forget each other while the
// puller's scatter is in flight: both batches fail as lost, the puller's
// becomes quiescent only once its scatter stopped.
func TestPullForgetBothSides(t *testing.T) {
	w := newWorld(t)
	var fs *faultScatterer
	f := startPull(t, w, testConfig(), testConfig(), nil, []nodeOpt{withHeldScatter(t, &fs)})
	eventually(t, func() bool { return fs.held.Load() > 0 })
	if err := f.a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	if err := f.b.ForgetPeer("a"); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, f.bt); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("puller: err = %v, want ErrPeerLost", err)
	}
	if _, q := f.bt.Retirement(); q {
		t.Fatal("the pull is quiescent while its scatter still runs")
	}
	if err := f.bt.Release(); !errors.Is(err, transfer.ErrNotQuiescent) {
		t.Fatalf("release of a non-quiescent pull: %v", err)
	}
	f.holderEnded(t, transfer.ErrPeerLost)
	fs.release()
	select {
	case <-f.bt.Quiescent():
	case <-time.After(10 * time.Second):
		t.Fatal("the pull never became quiescent after its scatter stopped")
	}
	if err := f.bt.Release(); err != nil {
		t.Fatal(err)
	}
	settled(t, f.a, f.b)
}

// TestPullForgetPuller: the puller alone forgets the holder mid-pull: its
// batch fails as lost at once; the holder, whose writes and DATAs now go
// nowhere, fails too (the puller's fence, or its own timeout).
func TestPullForgetPuller(t *testing.T) {
	w := newWorld(t)
	var sg *stallGatherer
	f := startPull(t, w, shortTimeouts(), testConfig(), []nodeOpt{withStall(&sg)}, nil)
	eventually(t, func() bool { return servedPulls(f.a) == 1 })
	if err := f.b.ForgetPeer("a"); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, f.bt); !errors.Is(err, transfer.ErrPeerLost) {
		t.Fatalf("puller: err = %v, want ErrPeerLost", err)
	}
	close(sg.release)
	ev := waitEvent(t, f.events)
	if !ev.Pull || ev.Err == nil || !ev.Quiescent {
		t.Fatalf("holder's event %+v, want a failed quiescent pull", ev)
	}
	settled(t, f.a, f.b)
	f.untouched(t)
}

// TestPullForgetHolder: the holder alone forgets the puller mid-pull: its
// request fails as lost; the puller, which hears nothing more, fails at
// its timeout.
func TestPullForgetHolder(t *testing.T) {
	w := newWorld(t)
	var sg *stallGatherer
	f := startPull(t, w, testConfig(), shortTimeouts(), []nodeOpt{withStall(&sg)}, nil)
	eventually(t, func() bool { return servedPulls(f.a) == 1 })
	if err := f.a.ForgetPeer("b"); err != nil {
		t.Fatal(err)
	}
	close(sg.release)
	f.holderEnded(t, transfer.ErrPeerLost)
	if err := wait(t, f.bt); !errors.Is(err, transfer.ErrTimeout) {
		t.Fatalf("puller: err = %v, want ErrTimeout", err)
	}
	settled(t, f.a, f.b)
	f.untouched(t)
}

// TestPullHolderShutdown: the holder shuts down mid-pull: the puller's
// batch fails with the holder's reason (shutdown), not at its timeout.
func TestPullHolderShutdown(t *testing.T) {
	w := newWorld(t)
	var sg *stallGatherer
	f := startPull(t, w, testConfig(), testConfig(), []nodeOpt{withStall(&sg)}, nil)
	eventually(t, func() bool { return servedPulls(f.a) == 1 })
	done := make(chan error, 1)
	go func() { done <- f.a.Shutdown(t.Context()) }()
	err := wait(t, f.bt)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "(shutdown)") {
		t.Fatalf("puller: err = %v, want the holder's shutdown", err)
	}
	close(sg.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	settled(t, f.b)
	f.untouched(t)
}

// TestPullPullerShutdown: the puller shuts down mid-pull: its batch fails
// closed and the holder hears the cancel.
func TestPullPullerShutdown(t *testing.T) {
	w := newWorld(t)
	var sg *stallGatherer
	f := startPull(t, w, testConfig(), testConfig(), []nodeOpt{withStall(&sg)}, nil)
	eventually(t, func() bool { return servedPulls(f.a) == 1 })
	if err := f.b.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, f.bt); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("puller: err = %v, want ErrClosed", err)
	}
	close(sg.release)
	f.holderEnded(t, ErrPullCancelled)
	settled(t, f.a)
}

// TestPullFlowLimit: a holder serves at most MaxFlowsPerPeer pulls of one
// peer at once; one more is refused with the reason and counted, and the
// first is served once the stall ends.
func TestPullFlowLimit(t *testing.T) {
	w := newWorld(t)
	var sg *stallGatherer
	hcfg := testConfig()
	hcfg.MaxFlowsPerPeer = 1
	f := startPull(t, w, hcfg, testConfig(), []nodeOpt{withStall(&sg)}, nil)
	eventually(t, func() bool { return servedPulls(f.a) == 1 })
	second := simple(t, f.a, f.b, 30)
	bt, err := f.b.Pull(PullRequest{Peer: "a", Src: second.src, Dst: second.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "open pulls, the limit") {
		t.Fatalf("a pull over the holder's per-peer limit: %v, want refused naming the limit", err)
	}
	if st := f.a.Stats(); st.RefusedPulls != 1 || st.FlowLimited != 1 {
		t.Fatalf("holder counted %d refused pulls, %d flow-limited, want 1 and 1", st.RefusedPulls, st.FlowLimited)
	}
	close(sg.release)
	if err := wait(t, f.bt); err != nil {
		t.Fatalf("the pull within the limit: %v", err)
	}
	f.j.verify(t)
	settled(t, f.a, f.b)
}
