package tcp

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// tarpit is a listener on another loopback host (127.0.0.2) that counts
// the connections it accepts: the third host an attacker names.
type tarpit struct {
	ln       net.Listener
	accepted atomic.Int64
}

func newTarpit(t *testing.T) *tarpit {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	p := &tarpit{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}

func mustIdentity(t *testing.T) security.Identity {
	t.Helper()
	id, err := security.Generate(nil)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestHelloCannotChooseWhereTheReceiverDials (issue 26, docs/SECURITY.md
// "cannot make the receiver dial an address of its choosing"): an admitted
// peer whose HELLO advertises an address on a third host (127.0.0.2) does
// not make the receiver connect there when it writes or notifies back.
// Loaded: the loaded metadata's address is dialed, the HELLO's ignored.
// Not loaded (admitted by its key alone): the advertised address is not on
// the host the connection came from, so it is not dialed at all
// (ForeignAddrs) and the notification fails with ErrBadEndpoint. Before,
// the receiver learned the HELLO's address and dialed the third host.
func TestHelloCannotChooseWhereTheReceiverDials(t *testing.T) {
	for _, loaded := range []bool{true, false} {
		name := map[bool]string{true: "loaded", false: "admitted-by-key"}[loaded]
		t.Run(name, func(t *testing.T) {
			pit := newTarpit(t)
			recvID, mID := mustIdentity(t), mustIdentity(t)
			recvPeers := security.NewPeers(security.Authenticate, recvID, security.Policy{Loaded: true, Static: map[string]security.Key{"mallory": mID.Public}})
			engine := func(name string, id security.Identity, p *security.Peers, advertise string) *Engine {
				e, err := New(Config{Name: name, Peers: p, Advertise: advertise, DialTimeout: 2 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { e.Close() })
				return e
			}
			recv := engine("recv", recvID, recvPeers, "")
			mPeers := func() *security.Peers {
				return security.NewPeers(security.Authenticate, mID, security.Policy{Static: map[string]security.Key{"recv": recvID.Public}})
			}
			var real *Engine
			if loaded {
				// mallory's real engine, whose metadata the receiver loads.
				real = engine("mallory", mID, mPeers(), "")
				md, _ := real.Metadata()
				if _, err := recv.LoadPeer(md); err != nil {
					t.Fatal(err)
				}
			}
			// The engine that dials with a HELLO naming the third host.
			liar := engine("mallory", mID, mPeers(), pit.ln.Addr().String())
			dst, err := mem.Alloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Free()
			src, err := mem.Alloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Free()
			copy(src.Bytes(), bytes.Repeat([]byte{7}, 4096))
			if err := recv.RegisterMemory(dst.Desc()); err != nil {
				t.Fatal(err)
			}
			if err := liar.RegisterMemory(src.Desc()); err != nil {
				t.Fatal(err)
			}
			md, _ := recv.Metadata()
			if _, err := liar.LoadPeer(md); err != nil {
				t.Fatal(err)
			}
			op, err := liar.PostWrite("recv", []transfer.WriteOp{{Src: src.Desc(), Dst: dst.Desc()}})
			if err != nil {
				t.Fatal(err)
			}
			if err := waitOp(t, op); err != nil {
				t.Fatalf("mallory's write (its HELLO names %s): %v", pit.ln.Addr(), err)
			}
			op.Release()
			if !bytes.Equal(dst.Bytes(), src.Bytes()) {
				t.Fatal("mallory's write did not land")
			}
			// The receiver notifies back; so does its every write back.
			nerr := recv.Notify("mallory", []byte("done"))
			if loaded {
				if nerr != nil {
					t.Fatal(nerr)
				}
				m, err := real.RecvNotification(hangGuard)
				if err != nil || string(m.Payload) != "done" || m.Peer != "recv" {
					t.Fatalf("the loaded address got %q from %q (%v), want done from recv", m.Payload, m.Peer, err)
				}
			} else {
				time.Sleep(2 * time.Second) // a dial would have happened by now
				if st := recv.Stats(); st.ForeignAddrs != 1 {
					t.Errorf("ForeignAddrs = %d, want 1", st.ForeignAddrs)
				}
			}
			if n := pit.accepted.Load(); n != 0 {
				t.Fatalf("the receiver connected %d time(s) to %s, the address mallory's HELLO named", n, pit.ln.Addr())
			}
		})
	}
}

// waitOp waits (bounded) for op to resolve.
func waitOp(t *testing.T, op transfer.Op) error {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		st, err := op.Poll()
		if st.Terminal() {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatal("op did not resolve")
		}
		time.Sleep(time.Millisecond)
	}
}
