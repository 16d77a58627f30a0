package main

import (
	"fmt"
	"io"
	"runtime/debug"
	"sort"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/benchreport"
	"github.com/bouncekv/bounce/config"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, the Go toolchain and the wire protocol version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := io.WriteString(cmd.OutOrStdout(), versionText())
			return err
		},
	}
}

// versionText is what `bounce version` and `bounce --version` print.
func versionText() string {
	b, goV := buildInfo()
	commit := b.Commit
	switch {
	case commit == "":
		commit = "unknown (built without VCS information)"
	case b.Modified:
		commit += " (modified)"
	}
	return fmt.Sprintf("bounce %s\ncommit %s\n%s\nwire protocol %d\n", b.Version, commit, goV, b.WireVersion)
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

// linkedCommit is the commit `make build` links in (-X main.linkedCommit),
// for builds whose Go build information carries no VCS revision (a
// GOFLAGS=-buildvcs=false environment, a worktree git cannot read). It is
// written only by the linker.
var linkedCommit string

// buildInfo describes this binary: its version, VCS commit and whether the
// tree was modified (from the Go build information), the wire version, and
// the Go toolchain.
func buildInfo() (benchreport.Build, string) {
	b, goV := benchreport.Build{Version: "(devel)", WireVersion: wireVersion()}, "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		b.Version, goV = bi.Main.Version, bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	if b.Commit == "" {
		b.Commit = linkedCommit
	}
	return b, goV
}
