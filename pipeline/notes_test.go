package pipeline

import (
	"testing"
	"time"

	"github.com/bouncekv/bounce/controlplane/nixlnotif"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// The nixlnotif channel reads its engine's notifications itself, so an agent
// over it must not (engineNotes returns nil and no note pump competes).
var _ notificationReader = (*nixlnotif.Channel)(nil)

func TestEngineNotesSkippedUnderNixlnotif(t *testing.T) {
	w := newWorld(t)
	eng := w.engine(t, "a", loopback.Options{})
	defer eng.Close()
	ch, err := nixlnotif.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if n := engineNotes(Settings{Engine: eng, Control: ch}); n != nil {
		t.Fatal("the agent would read notifications the nixlnotif channel reads")
	}
	if n := engineNotes(Settings{Engine: eng}); n == nil {
		t.Fatal("an agent without a control channel does not read its engine's notifications")
	}
}

// TestEngineNoteOnlyDone: an engine notification that is not a DONE notice
// (a WANT, bytes that do not decode) is dropped and counted, and no event is
// made of it; a DONE notice right after still is.
func TestEngineNoteOnlyDone(t *testing.T) {
	w := newWorld(t)
	events := make(chan Received, 4)
	a := w.node("a", testConfig())
	b := w.node("b", testConfig(), withReceived(events), func(s *Settings) {
		s.Control.Close()
		s.Control = nil
	})
	connect(t, a, b)
	n := a.eng.(transfer.Notifier)
	want, _ := wire.Marshal(&wire.Want{Request: 1, ChunkBytes: []uint64{1 << 20}, Endpoint: "x"})
	done, _ := wire.Marshal(&wire.Done{Request: 2, Bytes: 7, Tag: []byte("t")})
	for _, p := range [][]byte{want, []byte("not a message"), done} {
		if err := n.Notify("b", p); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ev := <-events:
		if ev.Request != 2 || ev.Bytes != 7 || string(ev.Tag) != "t" || ev.Route != RouteDirect || ev.Err != nil || ev.Peer != "a" {
			t.Fatalf("event %+v, want request 2 from a, 7 bytes, tag t, direct, no error", ev)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no event for the DONE notice within 20s")
	}
	if s := b.Stats(); s.BadMessages != 2 || s.Events != 1 {
		t.Fatalf("receiver: %d bad messages, %d events; want 2 and 1", s.BadMessages, s.Events)
	}
}
