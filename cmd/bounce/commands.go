package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/pipeline/wire"
)

// extraCommands are the subcommands that live in their own files.
func extraCommands() []*cobra.Command {
	return []*cobra.Command{newConformanceCmd(), newBenchCmd(), newComponentsCmd(), newFleetSenderCmd()}
}

func newComponentsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "components",
		Short: "List the engines, control planes and stages in this build, and why any is missing",
		Long: `components lists every engine, control plane and gather/scatter stage kind
the configuration accepts (engine.kind, control_plane.kind, stages.gather,
stages.scatter), whether this build has it, and why not, and for a kind
it has that cannot run on this machine (the CUDA kinds without a loadable
libcuda.so.1) why not. Configuring a kind the build lacks is a configuration
error (exit code 2).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "role\tkind\tkey\tavailable")
			for _, c := range node.Components(factories()) {
				avail := "yes"
				switch {
				case !c.Available:
					avail = "no: " + c.Why
				case c.NotHere != "":
					avail = "no, not on this machine (in this build): " + c.NotHere
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.Role, c.Kind, c.Key, avail)
			}
			return tw.Flush()
		},
	}
}

func wireVersion() uint16 { return wire.Version }

// factories are the implementations the CLI builds agents from: every
// built-in plus the "plugin" kind of all five components (engine.plugin,
// control_plane.plugin and stages.<stage>: {plugin: ...} name the binaries).
func factories() node.Factories { return node.WithPlugins(node.Builtin(), "") }
