package ucx

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// onLoop runs f on e's progress goroutine, which owns the peer tables.
func onLoop(t *testing.T, e *Engine, f func()) {
	t.Helper()
	if err := e.call("test probe", func() error { f(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or hangGuard passes, and reports it.
func waitFor(cond func() bool) bool {
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// TestIdleLoadedPeerCloseLogsNoWarn: engines that loaded one another's
// metadata (both, or one of them) and never exchanged a write or a
// notification — two agents that admitted each other and closed before any
// transfer. Loaded peers were never said bye to, so the side left behind
// logged its endpoint's failure as a fault (WARN "peer endpoint failed ...
// Endpoint timeout"), or kept a dead endpoint (and once, here, a worker
// destroyed while an endpoint was still being set up aborted in UCX: "got
// REP message", Known aborts (2) in doc.go).
// Now LoadPeer says hello and Close waits for the bye's ack of every loaded
// peer: when a closes, b learns it from a's bye ("closed its engine"),
// without sending anything itself, and neither side logs a warning.
func TestIdleLoadedPeerCloseLogsNoWarn(t *testing.T) {
	for _, loads := range []string{"both", "a", "b"} { // who loads the other
		t.Run(loads, func(t *testing.T) {
			abuf, bbuf := alloc(t, 1<<16), alloc(t, 1<<16)
			la, lb := newLevelCounter(), newLevelCounter()
			// PeerErrors: with NoPeerErrors an endpoint never reports a dead
			// peer, so there is no failure to log.
			a := newEngine(t, Config{Name: "a", ErrMode: PeerErrors, Logger: slog.New(la), DrainTimeout: hangGuard})
			b := newEngine(t, Config{Name: "b", ErrMode: PeerErrors, Logger: slog.New(lb)})
			register(t, a, abuf)
			register(t, b, bbuf)
			if loads != "b" {
				load(t, a, b)
			}
			if loads != "a" {
				load(t, b, a)
			}
			if loads == "b" {
				// a can say bye only to a peer it knows of: wait for the hello
				// b's LoadPeer sent. Closing while it is in flight is a race
				// no bye can close.
				known := func() (ok bool) { onLoop(t, a, func() { ok = a.peers["b"] != nil }); return ok }
				if !waitFor(known) {
					t.Fatal("b's hello never reached a")
				}
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			var why string
			lost := func() bool {
				onLoop(t, b, func() {
					if p := b.peers["a"]; p != nil && p.state.lost != nil {
						why = p.state.lost.Error()
					}
				})
				return why != ""
			}
			if !waitFor(lost) {
				t.Fatal("b still holds a live endpoint to the closed a")
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if w := append(la.list(), lb.list()...); len(w) > 0 {
				t.Fatalf("closing engines that exchanged nothing logged warnings: %q", w)
			}
			if !strings.Contains(why, "closed its engine") {
				t.Fatalf("b's loss of a: %q, want it to name a's close", why)
			}
		})
	}
}
