package plugins_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/mem"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/security"
	"github.com/bouncekv/bounce/transfer"
)

// openPlugin opens the tcpengine example's engine named name with opts,
// supervised (what the agent's factory returns) or on a bare Client.
func openPlugin(t *testing.T, bin, how, name string, opts map[string]string) transfer.Engine {
	t.Helper()
	var e transfer.Engine
	var err error
	if how == "supervised" {
		e, err = plugins.OpenEngine(plugins.Spec{Path: bin}, plugins.Restart{}, name, opts)
	} else {
		var c *plugins.Client
		if c, err = plugins.Load(bin, plugins.KindEngine, nil); err == nil {
			e, err = c.Engine(name, opts)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func identity(t *testing.T) security.Identity {
	t.Helper()
	id, err := security.Generate(nil)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// sourceEngine is an in-process tcp engine named name, authenticated with
// peers (nil: the unauthenticated protocol), with a registered source of n
// bytes of fill, loaded with victim's metadata.
func sourceEngine(t *testing.T, victim transfer.Engine, name string, peers *security.Peers, n uint64, fill byte, mods ...func(*tcp.Config)) (*tcp.Engine, string, transfer.Desc) {
	t.Helper()
	c := tcp.Config{Name: name, Peers: peers}
	for _, m := range mods {
		m(&c)
	}
	w, err := tcp.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	src, err := mem.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Free() })
	for i := range src.Bytes() {
		src.Bytes()[i] = fill
	}
	if err := w.RegisterMemory(src.Desc()); err != nil {
		t.Fatal(err)
	}
	md, err := victim.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	peer, err := w.LoadPeer(md)
	if err != nil {
		t.Fatal(err)
	}
	return w, peer, src.Desc()
}

// TestPluginEngineAuthenticatesWithTheHostsKeys (issue 26 item 4): the
// tcp engine in a real plugin process is lent the host's authenticator
// (the keys stay in the host) and names its peers by their keys. A dialer
// that claims the admitted peer alice's name — with the plain protocol, or
// with a key of its own that is admitted under another name — is refused
// and not one byte of alice's grant changes; alice herself, with her key,
// is accepted and her bytes land. Before, the plugin's engine held no keys
// and its guard checked whatever name the HELLO claimed: the plain
// impersonator wrote into alice's grant.
func TestPluginEngineAuthenticatesWithTheHostsKeys(t *testing.T) {
	bin := buildExample(t)
	for _, how := range []string{"supervised", "bare"} {
		t.Run(how, func(t *testing.T) {
			recvID, aliceID, malloryID := identity(t), identity(t), identity(t)
			hostPeers := security.NewPeers(security.Authenticate, recvID, security.Policy{Static: map[string]security.Key{
				"alice": aliceID.Public, "mallory": malloryID.Public}})
			victim := openPlugin(t, bin, how, "recv", map[string]string{"listen": "127.0.0.1:0"})
			au, ok := victim.(transfer.Authenticating)
			if !ok {
				t.Fatalf("plugin engine %T is no transfer.Authenticating", victim)
			}
			au.SetAuthenticator(hostPeers.Authenticator())
			dst, err := mem.Alloc(64 << 10)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Free()
			if err := victim.RegisterMemory(dst.Desc()); err != nil {
				t.Fatal(err)
			}
			grant := transfer.Desc{Addr: dst.Desc().Addr, Len: 4096, Kind: transfer.Host}
			var mu sync.Mutex
			var asked []string
			victim.(transfer.WriteGuarded).SetWriteGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) {
				mu.Lock()
				asked = append(asked, peer)
				mu.Unlock()
				if peer == "alice" && grant.Contains(d.Addr, d.Len) {
					return grant, nil
				}
				return transfer.Desc{}, errors.New("test guard: not granted: " + peer + ": " + transfer.ErrForbidden.Error())
			})
			peersOf := func(id security.Identity) *security.Peers {
				return security.NewPeers(security.Authenticate, id, security.Policy{Static: map[string]security.Key{"recv": recvID.Public}})
			}
			short := func(c *tcp.Config) {
				c.DialTimeout, c.WriteTimeout, c.IdleTimeout = 2*time.Second, 5*time.Second, 5*time.Second
			}

			// The impersonators: alice's name, no key or mallory's key.
			for _, imp := range []struct {
				what  string
				peers *security.Peers
			}{{"plain HELLO naming alice", nil}, {"mallory's key, HELLO naming alice", peersOf(malloryID)}} {
				w, peer, src := sourceEngine(t, victim, "alice", imp.peers, 4096, 0xEE, short)
				err := writeAndWait(t, w, peer, src, grant)
				if err == nil {
					t.Errorf("%s: the write into alice's grant succeeded", imp.what)
				}
				if i := bytes.IndexFunc(dst.Bytes(), func(r rune) bool { return r != 0 }); i >= 0 {
					t.Fatalf("%s: byte %d of alice's memory was written (%#x)", imp.what, i, dst.Bytes()[i])
				}
				t.Logf("%s: refused: %v", imp.what, err)
				w.Close()
			}
			mu.Lock()
			for _, p := range asked {
				t.Errorf("the guard was asked for %q before alice wrote: an impersonator got past the handshake", p)
			}
			mu.Unlock()

			w, peer, src := sourceEngine(t, victim, "alice", peersOf(aliceID), 4096, 0xA1)
			if err := writeAndWait(t, w, peer, src, grant); err != nil {
				t.Fatalf("alice's write into her grant: %v", err)
			}
			if !bytes.Equal(dst.Bytes()[:4096], bytes.Repeat([]byte{0xA1}, 4096)) {
				t.Fatal("alice's bytes did not land")
			}
			if i := bytes.IndexFunc(dst.Bytes()[4096:], func(r rune) bool { return r != 0 }); i >= 0 {
				t.Fatalf("byte %d past alice's grant was written", 4096+i)
			}
		})
	}
}

// throttle is a TCP proxy: connections accepted while slow is set forward
// the dialer's bytes 4 KiB every 10 ms; forwarded counts them.
type throttle struct {
	ln        net.Listener
	upstream  string
	slow      atomic.Bool
	forwarded atomic.Int64
}

func newThrottle(t *testing.T, upstream string) *throttle {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &throttle{ln: ln, upstream: upstream}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.upstream)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			slow := p.slow.Load()
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(c, up); c.Close() }()
			go func() {
				defer wg.Done()
				defer up.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := up.Write(buf[:n]); werr != nil {
							return
						}
						p.forwarded.Add(int64(n))
						if slow {
							time.Sleep(10 * time.Millisecond)
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// freePort returns a loopback port nothing listens on (for a moment).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestPluginEngineFencesWrites (issue 26): the tcp engine in a real plugin
// process is a transfer.WriteFencer on the host. A peer trickles a 1 MiB
// frame into the region its guard allowed; the authorization ends and the
// host's FenceWrites returns: the frame was cut, not one byte lands in the
// region after, and the peer's write fails. Before, the fence did not
// cross the plugin boundary and the payload kept landing for up to the
// frame timeout.
func TestPluginEngineFencesWrites(t *testing.T) {
	bin := buildExample(t)
	for _, how := range []string{"supervised", "bare"} {
		t.Run(how, func(t *testing.T) {
			port := strconv.Itoa(freePort(t))
			p := newThrottle(t, "127.0.0.1:"+port)
			victim := openPlugin(t, bin, how, "recv", map[string]string{"listen": "127.0.0.1:" + port, "advertise": p.ln.Addr().String()})
			f, ok := victim.(transfer.WriteFencer)
			if !ok {
				t.Fatalf("plugin engine %T is no transfer.WriteFencer", victim)
			}
			const size = 1 << 20
			dst, err := mem.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Free()
			if err := victim.RegisterMemory(dst.Desc()); err != nil {
				t.Fatal(err)
			}
			region := dst.Desc()
			var revoked atomic.Bool
			victim.(transfer.WriteGuarded).SetWriteGuard(func(peer string, d transfer.Desc) (transfer.Desc, error) {
				if peer != "trickler" || revoked.Load() || !region.Contains(d.Addr, d.Len) {
					return transfer.Desc{}, errors.New("test guard: not granted: " + transfer.ErrForbidden.Error())
				}
				return region, nil
			})
			w, peer, src := sourceEngine(t, victim, "trickler", nil, size, 0xEE, func(c *tcp.Config) {
				c.Connections, c.WriteTimeout, c.IdleTimeout = 1, time.Minute, time.Minute
			})
			p.slow.Store(true)
			op, err := w.PostWrite(peer, []transfer.WriteOp{{Src: src, Dst: region}})
			if err != nil {
				t.Fatal(err)
			}
			defer op.Release()
			deadline := time.Now().Add(30 * time.Second)
			for bytes.IndexByte(dst.Bytes(), 0xEE) < 0 {
				if time.Now().After(deadline) {
					t.Fatal("the trickled payload never started landing")
				}
				time.Sleep(time.Millisecond)
			}
			revoked.Store(true)
			f.FenceWrites(region)
			after := bytes.Clone(dst.Bytes())
			if bytes.Count(after, []byte{0xEE}) == size {
				t.Fatal("the whole frame landed before the fence: the test proves nothing")
			}
			// The trickle forwards 400 KB/s: a second is plenty to see it
			// land had the fence not cut it.
			time.Sleep(time.Second)
			if !bytes.Equal(dst.Bytes(), after) {
				t.Fatalf("%d bytes landed in the region after FenceWrites returned", bytes.Count(dst.Bytes(), []byte{0xEE})-bytes.Count(after, []byte{0xEE}))
			}
			for {
				st, err := op.Poll()
				if st.Terminal() {
					if err == nil {
						t.Fatal("the cut write succeeded")
					}
					t.Logf("the trickling write failed: %v", err)
					break
				}
				if time.Now().After(deadline.Add(30 * time.Second)) {
					t.Fatal("the cut write never resolved")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
