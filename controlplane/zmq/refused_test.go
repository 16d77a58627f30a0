package zmq

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bouncekv/bounce/security"
)

// refusalLog records SetPeerRefused reports.
type refusalLog struct {
	mu   sync.Mutex
	errs map[string][]error
}

func (l *refusalLog) add(peer string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.errs == nil {
		l.errs = map[string][]error{}
	}
	l.errs[peer] = append(l.errs[peer], err)
}

func (l *refusalLog) get(peer string) []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]error(nil), l.errs[peer]...)
}

// TestRefusedPeerReported: x knows b's key but b does not admit x's. x's
// DEALER learns it from the CURVE handshake (b's ZAP handler says 400, the
// socket monitor reports the failed authentication): SetPeerRefused is
// called for b with an error wrapping security.ErrNotAdmitted that names
// security.allowed_peers, b counts the refusal, and an admitted peer a
// sees no report.
func TestRefusedPeerReported(t *testing.T) {
	ka, kb, kx := newKeys(t), newKeys(t), newKeys(t)
	ka.introduce(t, "b", kb)
	kb.introduce(t, "a", ka)
	kx.introduce(t, "b", kb)
	b := curveChannel(t, "b", kb)
	a := curveChannel(t, "a", ka)
	x := curveChannel(t, "x", kx)
	var ra, rx refusalLog
	a.SetPeerRefused(ra.add)
	x.SetPeerRefused(rx.add)
	connect(t, a, b)
	mustSend(t, a, "b", "hello")
	expectMsg(t, b, "a", "hello")
	if err := x.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	mustSend(t, x, "b", "WANT")
	deadline := time.Now().Add(hangGuard)
	for len(rx.get("b")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("x was never told b refused it; b stats %+v", b.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	err := rx.get("b")[0]
	if !errors.Is(err, security.ErrNotAdmitted) || !strings.Contains(err.Error(), "security.allowed_peers") || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("refusal error %v: want one wrapping security.ErrNotAdmitted naming b and security.allowed_peers", err)
	}
	if st := b.Stats(); st.Refused == 0 {
		t.Fatalf("b counted no refusal: %+v", st)
	}
	if r := ra.get("b"); len(r) != 0 {
		t.Fatalf("admitted a got refusals: %v", r)
	}
	if st := x.Stats(); st.RefusedBy == 0 {
		t.Fatalf("x counted no refusal by its peer: %+v", st)
	}
}

// warnCounter counts the log records at level Warn and above by message.
type warnCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnCounter) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == nil {
		w.n = map[string]int{}
	}
	w.n[r.Message]++
	return nil
}
func (w *warnCounter) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnCounter) WithGroup(string) slog.Handler      { return w }

func (w *warnCounter) count(msg string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n[msg]
}

// TestRefusedAgainAfterAdmission: b refuses x, later admits it (x's DEALER
// reconnects and is accepted), then refuses it again. The second refusal
// is warned about like the first: the DEALER's refusal mark is cleared once
// its connection is up, so it no longer silences a later refusal (nor
// makes a full queue read as a refusal).
func TestRefusedAgainAfterAdmission(t *testing.T) {
	kb, kx := newKeys(t), newKeys(t)
	kx.introduce(t, "b", kb)
	// A message over 1 KiB makes b drop x's connection: the way to make x's
	// DEALER handshake again.
	b := curveChannel(t, "b", kb, func(c *Config) { c.MaxMessageSize = 1 << 10 })
	var warns warnCounter
	x := curveChannel(t, "x", kx, func(c *Config) { c.Logger = slog.New(&warns) })
	var refusals refusalLog
	var up lostLog
	x.SetPeerRefused(refusals.add)
	x.SetPeerUp(up.add)
	if err := x.AddPeer("b", b.LocalEndpoint()); err != nil {
		t.Fatal(err)
	}
	const refusedMsg = "zmq: peer refused this agent"
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(hangGuard)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: never happened; x stats %+v, b stats %+v", what, x.Stats(), b.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	mustSend(t, x, "b", "WANT")
	waitFor("first refusal", func() bool { return len(refusals.get("b")) >= 1 })
	if n := warns.count(refusedMsg); n != 1 {
		t.Fatalf("first refusal warned %d times, want 1", n)
	}
	kb.introduce(t, "x", kx)
	mustSend(t, x, "b", "hello") // dials b again
	expectMsg(t, b, "x", "hello")
	waitFor("x's connection up", func() bool { p, _ := up.get(); return len(p) >= 1 })
	kb.peers.Forget("x")
	before := len(refusals.get("b"))
	mustSend(t, x, "b", strings.Repeat("x", 2<<10)) // b drops the connection; x reconnects
	waitFor("second refusal", func() bool { return len(refusals.get("b")) > before })
	if n := warns.count(refusedMsg); n != 2 {
		t.Fatalf("a refusal after the peer had admitted x warned %d times in all, want 2", n)
	}
}
