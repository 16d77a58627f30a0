//go:build nixl

package nixl

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/bouncekv/bounce/internal/childproc"
)

func TestMain(m *testing.M) {
	if childproc.Role(childEnv) != "" {
		os.Exit(childMain())
	}
	// Loopback only: never let UCX pick a non-loopback network device.
	if os.Getenv("UCX_NET_DEVICES") == "" {
		os.Setenv("UCX_NET_DEVICES", "lo")
	}
	goleak.VerifyTestMain(m)
}
