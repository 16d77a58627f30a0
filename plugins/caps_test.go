package plugins_test

import (
	"errors"
	"testing"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/engines/tcp"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// declaredCaps is what an engine declares beyond transfer.Engine.
type declaredCaps struct {
	notifier, fencer, fences bool
	guarded, peerLoss        bool
	maxNotify                int
	post, write              time.Duration
	bandwidth                float64
}

func declared(e transfer.Engine) declaredCaps {
	var d declaredCaps
	_, d.notifier = e.(transfer.Notifier)
	_, d.guarded = e.(transfer.WriteGuarded)
	_, d.peerLoss = e.(transfer.PeerLossReporter)
	if f, ok := e.(transfer.Fencer); ok {
		d.fencer, d.fences = true, f.FencesForgottenPeers()
	}
	if l, ok := e.(interface{ MaxNotifySize() int }); ok {
		d.maxNotify = l.MaxNotifySize()
	}
	if c, ok := e.(interface {
		RouteCosts() (time.Duration, time.Duration, float64)
	}); ok {
		d.post, d.write, d.bandwidth = c.RouteCosts()
	}
	return d
}

// TestPluginEngineDeclaresWhatItsEngineDeclares: the tcp engine served by a
// plugin process declares, on the host, the optional capabilities the
// in-process tcp engine declares — transfer.Notifier, transfer.Fencer
// (FencesForgottenPeers true), transfer.WriteGuarded,
// transfer.PeerLossReporter, MaxNotifySize and RouteCosts (route auto's
// cost model) — with the same values, through the factory the agent uses
// (a supervised plugin) and through a bare Client.
func TestPluginEngineDeclaresWhatItsEngineDeclares(t *testing.T) {
	inproc, err := tcp.New(tcp.Config{Name: "in", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	want := declared(inproc)
	inproc.Close()
	if !want.notifier || !want.fencer || !want.guarded || !want.peerLoss || !want.fences || want.maxNotify <= 0 || !(want.bandwidth > 0) {
		t.Fatalf("the in-process tcp engine declares %+v; the test expects every capability", want)
	}
	bin := buildExample(t)
	f := node.WithPlugins(node.Builtin(), bin)
	cfg := config.Default().Engine
	cfg.Listen = "127.0.0.1:0"
	e, err := f.Engines["plugin"].CreateEngine(node.Settings{Name: "p"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got := declared(e); got != want {
		t.Errorf("supervised plugin engine %T declares %+v, want %+v", e, got, want)
	}
	c, err := plugins.Load(bin, plugins.KindEngine, nil)
	if err != nil {
		t.Fatal(err)
	}
	bare, err := c.Engine("q", map[string]string{"listen": "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if got := declared(bare); got != want {
		t.Errorf("plugin engine %T declares %+v, want %+v", bare, got, want)
	}
}

// TestPluginEngineConnects: transfer.Connector crosses the plugin
// boundary. The tcp engine in a plugin process, told to Connect to a peer
// it never wrote to, opens its connection: when the process then ends, the
// peer reports it lost (it could not without a connection).
func TestPluginEngineConnects(t *testing.T) {
	bin := buildExample(t)
	for how, open := range pluginEngines(t, bin) {
		t.Run(how, func(t *testing.T) {
			target, err := tcp.New(tcp.Config{Name: "target", Listen: "127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			defer target.Close()
			lost := make(chan string, 16)
			target.SetPeerLost(func(peer string) {
				select {
				case lost <- peer:
				default:
				}
			})
			dialer := open(t, "dialer")
			md, err := target.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			peer, err := dialer.LoadPeer(md)
			if err != nil {
				t.Fatal(err)
			}
			c, ok := dialer.(transfer.Connector)
			if !ok {
				t.Fatalf("plugin engine %T is not a transfer.Connector", dialer)
			}
			c.Connect(peer)
			deadline := time.Now().Add(20 * time.Second)
			for target.Stats().IncomingConns == 0 {
				if time.Now().After(deadline) {
					t.Fatal("Connect opened no connection to the peer within 20s")
				}
				time.Sleep(5 * time.Millisecond)
			}
			dialer.Close()
			select {
			case p := <-lost:
				if p != "dialer" {
					t.Errorf("lost peer %q, want dialer", p)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the peer heard of no lost connection within 20s")
			}
		})
	}
}

// TestPluginWakeRecv: transfer.NotificationWaker (engines) and
// transfer.RecvWaker (control channels) cross the plugin boundary: a
// receive in progress returns ErrTimeout long before its timeout, and a
// wake with none in progress makes the next receive return at once.
func TestPluginWakeRecv(t *testing.T) {
	bin := buildPlugin(t, "./internal/testplugin")
	const long = 10 * time.Minute
	check := func(t *testing.T, recv func(time.Duration) error, wake func()) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- recv(long) }()
		time.Sleep(50 * time.Millisecond) // let it start waiting (a wake before is kept for it)
		wake()
		select {
		case err := <-done:
			if !errors.Is(err, transfer.ErrTimeout) {
				t.Errorf("woken receive: %v, want ErrTimeout", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the receive was not woken")
		}
		wake()
		go func() { done <- recv(long) }()
		select {
		case err := <-done:
			if !errors.Is(err, transfer.ErrTimeout) {
				t.Errorf("receive after a wake: %v, want ErrTimeout", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a wake with no receive in progress was lost")
		}
	}
	for how, open := range pluginEngines(t, bin) {
		t.Run("engine/"+how, func(t *testing.T) {
			e := open(t, "e")
			n, ok := e.(transfer.Notifier)
			w, ok2 := e.(transfer.NotificationWaker)
			if !ok || !ok2 {
				t.Fatalf("plugin engine %T: Notifier %v, NotificationWaker %v", e, ok, ok2)
			}
			check(t, func(d time.Duration) error { _, err := n.RecvNotification(d); return err }, w.WakeRecvNotification)
		})
	}
	t.Run("control", func(t *testing.T) {
		ch, err := plugins.OpenControl(plugins.Spec{Path: bin}, plugins.Restart{}, "c", map[string]string{"bind_address": "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		w, ok := ch.(transfer.RecvWaker)
		if !ok {
			t.Fatalf("plugin control channel %T is no transfer.RecvWaker", ch)
		}
		check(t, func(d time.Duration) error { _, err := ch.Recv(d); return err }, w.WakeRecv)
	})
}
