package plugins

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

func buildTCPEngine(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tcpengine")
	if out, err := exec.Command("go", "build", "-o", bin, "./examples/tcpengine").CombinedOutput(); err != nil {
		t.Fatalf("build plugin: %v\n%s", err, out)
	}
	return bin
}

// TestHostLendsNoSecret: what the host sends a plugin for its lent
// authenticator — the install and every answer to every kind of query —
// never holds the agent's secret key; a DH answer is the X25519 product
// of the secret with the asked key, KeyOf answers public keys and NameOf
// names, as the admitted set says.
func TestHostLendsNoSecret(t *testing.T) {
	self, err := security.Generate(nil)
	if err != nil {
		t.Fatal(err)
	}
	alice, _ := security.Generate(nil)
	peers := security.NewPeers(security.Authenticate, self, security.Policy{Static: map[string]security.Key{"alice": alice.Public}})
	h := &hostCallbacks{}
	h.auth.Store(&authBox{peers.Authenticator()})
	var sent [][]byte
	record := func(m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, b)
	}
	in := h.installMessage()
	if !in.GetAuth() || !bytes.Equal(in.GetPublicKey(), self.Public[:]) {
		t.Fatalf("install: auth %v, public key %x, want true and %x", in.GetAuth(), in.GetPublicKey(), self.Public[:])
	}
	record(in)
	ask := func(op pb.AuthQuery_Op, arg []byte) *pb.HostCallback {
		rep := h.answerAuth(&pb.PluginCallback{Id: 1, Auth: &pb.AuthQuery{Op: op, Arg: arg}})
		record(rep)
		return rep
	}
	for i := 0; i < 64; i++ {
		other, _ := security.Generate(nil)
		rep := ask(pb.AuthQuery_OP_DH, other.Public[:])
		priv, _ := ecdh.X25519().NewPrivateKey(self.Secret[:])
		pub, _ := ecdh.X25519().NewPublicKey(other.Public[:])
		want, _ := priv.ECDH(pub)
		if !bytes.Equal(rep.GetAuthResult(), want) {
			t.Fatalf("DH answer %x, want %x", rep.GetAuthResult(), want)
		}
	}
	ask(pb.AuthQuery_OP_DH, []byte("short"))
	ask(pb.AuthQuery_OP_DH, make([]byte, 32)) // low order: refused
	if rep := ask(pb.AuthQuery_OP_KEY_OF, []byte("alice")); !rep.GetAuthFound() || !bytes.Equal(rep.GetAuthResult(), alice.Public[:]) {
		t.Fatalf("KeyOf(alice) = %x, %v", rep.GetAuthResult(), rep.GetAuthFound())
	}
	if rep := ask(pb.AuthQuery_OP_NAME_OF, alice.Public[:]); !rep.GetAuthFound() || string(rep.GetAuthResult()) != "alice" {
		t.Fatalf("NameOf(alice's key) = %q, %v", rep.GetAuthResult(), rep.GetAuthFound())
	}
	for _, q := range []struct {
		op  pb.AuthQuery_Op
		arg []byte
	}{{pb.AuthQuery_OP_KEY_OF, []byte("recv")}, {pb.AuthQuery_OP_NAME_OF, self.Public[:]}, {pb.AuthQuery_OP_NAME_OF, []byte("x")}, {99, nil}} {
		if rep := ask(q.op, q.arg); rep.GetAuthFound() {
			t.Errorf("query %v %q found %x", q.op, q.arg, rep.GetAuthResult())
		}
	}
	for i, b := range sent {
		if bytes.Contains(b, self.Secret[:]) {
			t.Fatalf("message %d the host sent holds the agent's secret key", i)
		}
	}
}

// TestAuthenticatorWithoutHostRefuses: once the host's end of the callback
// stream is gone, the plugin's engine admits no new connection — its
// handshakes get no DH product and no name — so even the admitted peer's
// fresh connection is refused and no byte lands.
func TestAuthenticatorWithoutHostRefuses(t *testing.T) {
	c, err := Load(buildTCPEngine(t), KindEngine, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := c.Engine("recv", map[string]string{"listen": "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	self, _ := security.Generate(nil)
	alice, _ := security.Generate(nil)
	eng.(transfer.Authenticating).SetAuthenticator(security.NewPeers(security.Authenticate, self, security.Policy{Static: map[string]security.Key{"alice": alice.Public}}).Authenticator())
	dst, err := mem.Alloc(8192)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	if err := eng.RegisterMemory(dst.Desc()); err != nil {
		t.Fatal(err)
	}
	md, err := eng.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	write := func(off uint64, fill byte) error {
		w, err := tcp.New(tcp.Config{Name: "alice", Peers: security.NewPeers(security.Authenticate, alice, security.Policy{Static: map[string]security.Key{"recv": self.Public}}), DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		src, err := mem.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Free()
		copy(src.Bytes(), bytes.Repeat([]byte{fill}, 4096))
		if err := w.RegisterMemory(src.Desc()); err != nil {
			t.Fatal(err)
		}
		peer, err := w.LoadPeer(md)
		if err != nil {
			t.Fatal(err)
		}
		op, err := w.PostWrite(peer, []transfer.WriteOp{{Src: src.Desc(), Dst: transfer.Desc{Addr: dst.Desc().Addr + off, Len: 4096, Kind: transfer.Host}}})
		if err != nil {
			return err
		}
		defer op.Release()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if st, err := op.Poll(); st.Terminal() {
				return err
			}
		}
		t.Fatal("write did not resolve within 30s")
		return nil
	}
	if err := write(0, 1); err != nil {
		t.Fatalf("alice's write with the host answering: %v", err)
	}
	remoteOf(t, eng).cb.stop()
	if err := write(4096, 2); err == nil {
		t.Fatal("a new connection was admitted with no host to authenticate it")
	}
	if i := bytes.IndexFunc(dst.Bytes()[4096:], func(r rune) bool { return r != 0 }); i >= 0 {
		t.Fatalf("byte %d landed although no host authenticated its connection", 4096+i)
	}
}

// failingFence is a pb.EngineClient whose FenceWrites fails (fault
// injection; every other call goes to the plugin).
type failingFence struct{ pb.EngineClient }

func (failingFence) FenceWrites(context.Context, *pb.DescRequest, ...grpc.CallOption) (*pb.Reply, error) {
	return nil, status.Error(codes.DeadlineExceeded, "injected: no answer")
}

// TestFenceUnconfirmedKillsPlugin: a fence the plugin does not confirm
// fails closed — the plugin process is killed, so no frame of it lands
// after the authorization ended.
func TestFenceUnconfirmedKillsPlugin(t *testing.T) {
	c, err := Load(buildTCPEngine(t), KindEngine, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := c.Engine("recv", map[string]string{"listen": "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	r := remoteOf(t, eng)
	r.FenceWrites(transfer.Desc{Addr: 1 << 40, Len: 4096, Kind: transfer.Host}) // confirmed: the process lives
	if c.Exited() {
		t.Fatal("a confirmed fence killed the plugin")
	}
	r.rpc = failingFence{r.rpc}
	r.FenceWrites(transfer.Desc{Addr: 1 << 40, Len: 4096, Kind: transfer.Host})
	if !c.Exited() {
		t.Fatal("the plugin process lives on after a fence it did not confirm")
	}
	if _, err := eng.Metadata(); !errors.Is(err, transfer.ErrPeerLost) && !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("a call after the kill: %v, want ErrPeerLost", err)
	}
}
