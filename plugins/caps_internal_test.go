package plugins

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bouncekv/bounce/engines/tcp"
	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// TestCapsFromOlderPlugin: an Open reply without capabilities (a plugin
// built before they were carried) declares none beyond what it said —
// no transfer.Fencer, no route costs, no notification limit, no stall —
// and a reply with them declares exactly those.
func TestCapsFromOlderPlugin(t *testing.T) {
	c := &Client{name: "old"}
	old := newRemoteEngine(c, nil, &pb.OpenReply{Name: []byte("e"), Notifier: true}).declared()
	if _, ok := old.(transfer.Fencer); ok {
		t.Errorf("%T declares transfer.Fencer for a plugin that did not", old)
	}
	n, ok := old.(interface {
		transfer.Notifier
		MaxNotifySize() int
	})
	if !ok || n.MaxNotifySize() != 0 {
		t.Fatalf("%T: want a Notifier stating no limit", old)
	}
	if post, write, bw := old.(costDeclarer).RouteCosts(); post != 0 || write != 0 || bw != 0 {
		t.Errorf("undeclared route costs %v %v %v, want zero (invalid: route auto assumes its defaults)", post, write, bw)
	}
	if release, err := old.(transfer.WriteStaller).StallWrites(); !errors.Is(err, transfer.ErrUnsupported) || release != nil {
		t.Errorf("StallWrites of a plugin that declared no transfer.WriteStaller: %v; want ErrUnsupported, no call", err)
	}
	caps := &pb.Capabilities{Fencer: true, Fences: false, RouteCosts: true, PostPerDescNs: 1000, PerWriteNs: 2000, Bandwidth: 3e9}
	e := newRemoteEngine(c, nil, &pb.OpenReply{Name: []byte("e"), Caps: caps}).declared()
	f, ok := e.(transfer.Fencer)
	if !ok || f.FencesForgottenPeers() {
		t.Errorf("%T: want a transfer.Fencer answering false", e)
	}
	if _, ok := e.(transfer.Notifier); ok {
		t.Errorf("%T declares transfer.Notifier for a plugin that did not", e)
	}
	if post, write, bw := e.(costDeclarer).RouteCosts(); post != time.Microsecond || write != 2*time.Microsecond || bw != 3e9 {
		t.Errorf("route costs %v %v %v, want 1µs 2µs 3e9", post, write, bw)
	}
}

// TestRestartListen: a restarted engine keeps the host of its listen
// option and the port its first process bound, unless the option fixed a
// port already or the address reported is not host:port.
func TestRestartListen(t *testing.T) {
	for _, tc := range []struct{ listen, addr, want string }{
		{"127.0.0.1:0", "127.0.0.1:41234", "127.0.0.1:41234"},
		{"", "10.0.0.5:41234", "10.0.0.5:41234"},
		{"0.0.0.0:0", "10.0.0.5:41234", "0.0.0.0:41234"},
		{"[::1]:0", "[::1]:5000", "[::1]:5000"},
		{"127.0.0.1:7000", "127.0.0.1:7000", ""}, // a fixed port stays as given
		{"127.0.0.1:0", "", ""},                  // no transfer.Listener
		{"127.0.0.1:0", "not an address", ""},
		{"127.0.0.1:0", "127.0.0.1:0", ""},
		{"garbage", "127.0.0.1:5000", ""},
	} {
		if got := restartListen(tc.listen, tc.addr); got != tc.want {
			t.Errorf("restartListen(%q, %q) = %q, want %q", tc.listen, tc.addr, got, tc.want)
		}
	}
}

// TestLentEngineRefusesStall: the host's engine lent to a writer plugin
// declares no transfer.WriteStaller, and the plugin's StallWrites is
// refused: a writer plugin cannot stall the host's writes.
func TestLentEngineRefusesStall(t *testing.T) {
	e, err := tcp.New(tcp.Config{Name: "host", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s := lendEngine(e)
	rep, err := s.Open(context.Background(), &pb.OpenRequest{})
	if err != nil || rep.GetCaps().GetWriteStaller() {
		t.Fatalf("lent engine's Open: %v, declares a stall %v; want none", err, rep.GetCaps().GetWriteStaller())
	}
	hr, err := s.StallWrites(context.Background(), &pb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if err := fromProtoError(hr.GetError()); !errors.Is(err, transfer.ErrUnsupported) || hr.GetHandle() != 0 {
		t.Fatalf("StallWrites of the lent engine: handle %d, %v; want refused with ErrUnsupported", hr.GetHandle(), err)
	}
}
