package plugins_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/bouncekv/bounce/plugins"
	"github.com/bouncekv/bounce/transfer"
)

// A plugin binary's main is one line: examples/tcpengine is
//
//	func main() { plugins.Serve(plugins.ServeOpts{Engine: newEngine}) }
//
// with newEngine building the engine from the host's options. The host
// starts the binary (mTLS, an explicit environment, optionally a checksum
// pin) and opens the engine it serves; the engine's methods are then gRPC
// calls to the plugin process.
func ExampleServe() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "tcpengine")
	if out, err := exec.Command("go", "build", "-o", bin, "./examples/tcpengine").CombinedOutput(); err != nil {
		fmt.Println(err, string(out))
		return
	}
	sum, _ := plugins.FileChecksum(bin)
	c, err := plugins.LoadSpec(plugins.Spec{Path: bin, Checksum: sum}, plugins.KindEngine)
	if err != nil {
		fmt.Println(err)
		return
	}
	e, err := c.Engine("prefill-0", map[string]string{"listen": "127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close() // ends the plugin process
	_, notifier := e.(transfer.Notifier)
	fmt.Printf("engine %s in plugin %s, notifications: %v\n", e.Name(), c.Name(), notifier)
	// Output: engine prefill-0 in plugin tcpengine, notifications: true
}
