package zmq

import (
	"errors"
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
