package pipeline

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// TestRouteBounceRequiredFailsWithReason: a request that requires bounce
// (per request, or Config.Route) and meets a handshake mismatch is refused
// at Submit with the reason in human units; an auto request goes direct,
// is counted, and the fallback is warned once per peer.
func TestRouteBounceRequiredFailsWithReason(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	w := newWorld(t)
	bcfg := testConfig()
	bcfg.MaxChunk = 2 << 20
	acfg := testConfig()
	a := w.node("a", acfg, func(s *Settings) { s.Logger = log })
	b := w.node("b", bcfg)
	j := simple(t, a, b, 5)
	connect(t, a, b)
	_, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteBounce})
	if !errors.Is(err, ErrBounceUnavailable) || !strings.Contains(err.Error(), "max chunk 1 MiB here vs 2 MiB on b") {
		t.Fatalf("err = %v, want ErrBounceUnavailable naming max chunk 1 MiB here vs 2 MiB on b", err)
	}
	if s := a.Stats(); s.BounceRefused != 1 || s.Wants != 0 {
		t.Fatalf("stats: refused %d, wants %d", s.BounceRefused, s.Wants)
	}
	for range 3 {
		bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
		if err != nil {
			t.Fatal(err)
		}
		if err := wait(t, bt); err != nil || bt.Route() != RouteDirect {
			t.Fatalf("auto: %v on %v", err, bt.Route())
		}
	}
	j.verify(t)
	if got := a.Stats().Fallbacks; got != 3 {
		t.Fatalf("fallbacks = %d, want 3", got)
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"peer stays on the direct path\""); n != 1 {
		t.Fatalf("%d handshake warnings at load, want 1:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "transfers to this peer take the direct path"); n != 1 {
		t.Fatalf("%d fallback warnings for 3 requests, want 1:\n%s", n, logs.String())
	}

	// Config.Route bounce makes auto requests require it too.
	rcfg := testConfig()
	rcfg.Route = RouteBounce
	c := w.node("c", rcfg)
	connect(t, c, b)
	jc := simple(t, c, b, 6)
	if _, err := c.Submit(Request{Peer: "b", Src: jc.src, Dst: jc.dst}); !errors.Is(err, ErrBounceUnavailable) {
		t.Fatalf("route bounce by config: err = %v", err)
	}
	// ... while the descriptor gates do not apply to a required bounce.
	d := w.node("d", bcfg)
	connect(t, d, b)
	jd := simple(t, d, b, 7)
	bt, err := d.Submit(Request{Peer: "b", Src: jd.src[:2], Dst: jd.dst[:2], Route: RouteBounce})
	if err != nil || bt.Route() != RouteBounce {
		t.Fatalf("2 descriptors, bounce required: %v", err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
}

func TestSizeString(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 512: "512 B", 1024: "1 KiB", 1536: "1.5 KiB", 16 << 20: "16 MiB", 5 << 30: "5 GiB", 2684354560: "2.5 GiB"} {
		if got := sizeString(n); got != want {
			t.Errorf("sizeString(%d) = %q, want %q", n, got, want)
		}
	}
}
