//go:build nixl

package pipeline

import (
	"testing"

	"github.com/bouncekv/bounce/controlplane/nixlnotif"
	"github.com/bouncekv/bounce/engines/loopback"
	"github.com/bouncekv/bounce/engines/nixl"
	"github.com/bouncekv/bounce/transfer"
)

// tagEngines adds the NIXL engine (16 KiB notifications) to the control
// message limit test.
func tagEngines() []limitEngine {
	return []limitEngine{{"nixl", nixl.DefaultMaxNotifySize, func(t testing.TB, _ *world, name string, _ loopback.Options) transfer.Engine {
		e, err := nixl.New(nixl.Config{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}}}
}

// TestEndToEndNIXL runs the end-to-end suite over NIXL engines with the
// nixlnotif control plane.
func TestEndToEndNIXL(t *testing.T) {
	e2e(t, func(t testing.TB) *world {
		w := newWorld(t)
		mk := tagEngines()[0].make
		w.engine = func(t testing.TB, name string, opt loopback.Options) transfer.Engine { return mk(t, w, name, opt) }
		w.ctrl = func(t testing.TB, _ string, eng transfer.Engine) transfer.ControlChannel {
			ch, err := nixlnotif.New(eng)
			if err != nil {
				t.Fatal(err)
			}
			return ch
		}
		return w
	})
}
