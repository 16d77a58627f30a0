package main

import (
	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline/wire"
)

// extraCommands are the subcommands that live in their own files.
func extraCommands() []*cobra.Command { return []*cobra.Command{newConformanceCmd(), newBenchCmd()} }

func wireVersion() uint16 { return wire.Version }

// factories are the implementations the CLI builds agents from: every
// built-in plus the "plugin" kind of all five components (engine.plugin,
// control_plane.plugin and stages.<stage>: {plugin: ...} name the binaries).
func factories() node.Factories { return node.WithPlugins(node.Builtin(), "") }
