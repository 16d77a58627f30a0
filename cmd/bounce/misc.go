package main

import (
	"fmt"
	"runtime/debug"
	"sort"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/config"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the Go toolchain and the wire protocol version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, goV := "(devel)", "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				v, goV = bi.Main.Version, bi.GoVersion
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" && len(s.Value) >= 12 {
						v += " " + s.Value[:12]
					}
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bounce %s\n%s\nwire protocol %d\n", v, goV, wireVersion())
			return nil
		},
	}
}

func newConfigCmd() *cobra.Command {
	var keys bool
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Print the effective configuration and where each value came from",
		Long: `config loads the configuration exactly as the other commands do (defaults <
YAML file < BOUNCE_* environment < flags), prints it as YAML, then lists every
key with the layer its value came from. An unknown key or a bad value is an
error naming the key, the value and what is accepted (exit code 2).`,
		Example: `  bounce config --config bounce.yaml
  BOUNCE_ARENA_SIZE=512MiB bounce config --engine.kind ucx
  bounce config --keys`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if keys {
				tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "key\tflag\tenvironment")
				for _, k := range config.Keys() {
					fmt.Fprintf(tw, "%s\t--%s\t%s\n", k, config.FlagName(k), config.EnvVar(k))
				}
				return tw.Flush()
			}
			l, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			y, err := l.Config.YAML()
			if err != nil {
				return runtime(err)
			}
			fmt.Fprintf(out, "%s\n# sources\n", y)
			names := make([]string, 0, len(l.Sources))
			for k := range l.Sources {
				names = append(names, k)
			}
			sort.Strings(names)
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			for _, k := range names {
				fmt.Fprintf(tw, "# %s\t%s\n", k, l.Sources[k])
			}
			tw.Flush()
			for _, n := range l.Notices {
				fmt.Fprintf(out, "# notice: %s\n", n)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&keys, "keys", false, "list every key with its flag and environment variable")
	configFlags(cmd)
	return cmd
}
