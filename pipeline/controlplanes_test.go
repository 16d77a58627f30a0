package pipeline

import (
	"testing"

	"github.com/bouncekv/bounce/controlplane/nixlnotif"
	"github.com/bouncekv/bounce/controlplane/zmq"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/ucx"
	"github.com/bouncekv/bounce/transfer"
)

// The end-to-end suite runs unchanged over every control plane.

func TestEndToEndZMQ(t *testing.T) {
	e2e(t, func(t testing.TB) *world {
		w := newWorld(t)
		w.ctrl = func(t testing.TB, name string, _ transfer.Engine) transfer.ControlChannel {
			ch, err := zmq.New(zmq.Config{Name: name, BindAddress: "127.0.0.1"})
			if err != nil {
				t.Fatal(err)
			}
			return ch
		}
		return w
	})
}

func TestEndToEndNixlNotif(t *testing.T) {
	e2e(t, func(t testing.TB) *world {
		w := newWorld(t)
		w.ctrl = func(t testing.TB, name string, eng transfer.Engine) transfer.ControlChannel {
			ch, err := nixlnotif.New(eng)
			if err != nil {
				t.Fatal(err)
			}
			return ch
		}
		return w
	})
}

// The end-to-end suite runs unchanged over every real engine too (with the
// zmq control plane).

func TestEndToEndTCP(t *testing.T) {
	e2e(t, tcpZMQWorld)
}

func TestEndToEndUCX(t *testing.T) {
	e2e(t, func(t testing.TB) *world {
		w := zmqWorld(t, 0)
		w.engine = func(t testing.TB, name string, _ loopback.Options) transfer.Engine {
			e, err := ucx.New(ucx.Config{Name: name})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}
		return w
	})
}
