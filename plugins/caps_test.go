package plugins_test

import (
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
