//go:build nixl

package node

import (
	"testing"

	"github.com/bouncekv/bounce/pipeline"
)

const nixlBuilt = true

// TestNIXLNodesMoveBytes: two nodes on NIXL engines, over nixlnotif and
// over zmq, move a fragmented workload on the bounce path.
func TestNIXLNodesMoveBytes(t *testing.T) {
	for _, ctrl := range []string{"nixlnotif", "zmq"} {
		t.Run(ctrl, func(t *testing.T) {
			f := Builtin()
			a := build(t, testConfig("a-"+ctrl, "nixl", ctrl), f)
			b := build(t, testConfig("b-"+ctrl, "nixl", ctrl), f)
			moveAndVerify(t, a, b, pipeline.RouteBounce)
		})
	}
}
