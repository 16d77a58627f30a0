package main

import (
	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/pipeline/wire"
)

// extraCommands are the subcommands that live in their own files.
func extraCommands() []*cobra.Command { return []*cobra.Command{newConformanceCmd(), newBenchCmd()} }

func wireVersion() uint16 { return wire.Version }
