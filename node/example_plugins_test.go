package node_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/node"
)

// Loading plugins from configuration: each of the five components takes
// the same plugin block. Here the gather and scatter stages run in plugin
// processes (plugins/internal/testplugin serves the in-tree host stages);
// node.WithPlugins adds the "plugin" kind of every component to the
// built-in factories.
func ExampleWithPlugins() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "stages")
	if out, err := exec.Command("go", "build", "-o", bin, "../plugins/internal/testplugin").CombinedOutput(); err != nil {
		fmt.Println(err, string(out))
		return
	}
	yaml := fmt.Sprintf(`
agent: {name: decode-0}
control_plane: {bind_address: 127.0.0.1}
stages:
  gather: {plugin: {path: %[1]s, options: {copy_workers: "2"}}}
  scatter: {plugin: {path: %[1]s, max_restarts: 3}}
`, bin)
	l, err := config.Load(config.LoadOptions{FileData: []byte(yaml)})
	if err != nil {
		fmt.Println(err)
		return
	}
	n, err := node.Build(l.Config, node.WithPlugins(node.Builtin(), ""), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer n.Close(context.Background()) // ends the plugin processes
	up, _ := n.Agent.BounceEnabled()
	fmt.Println("gather:", l.Config.Stages.Gather.Kind, "scatter:", l.Config.Stages.Scatter.Kind, "bounce path up:", up)
	// Output: gather: plugin scatter: plugin bounce path up: true
}
