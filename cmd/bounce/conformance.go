package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/certify"
	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/conformance"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/plugins"
)

func newConformanceCmd() *cobra.Command {
	var (
		builtin, plugin, carrier, junit, jsonOut, sizes string
		only, skip                                      []string
		seed                                            int64
		opTimeout, callTimeout                          time.Duration
		list, noWaivers                                 bool
		memory                                          string
		device                                          int
	)
	cmd := &cobra.Command{
		Use:   "conformance <engine|control|gather|scatter|writer>",
		Short: "Certify an engine, control channel or stage with the conformance suite",
		Long: `conformance runs the conformance suite against one implementation — a
built-in (--builtin) or a plugin binary (--plugin) — and prints a
certification report: every rule, its result and its time, and the optional
capabilities (transfer.Notifier, ...) found absent, whose rules were skipped.
The exit status is the verdict: 0 certified, 1 a rule failed, 2 bad usage,
3 the implementation could not be started — a plugin that is missing, not a
plugin, fails its checksum or refuses its options — and no rule ran (the
message names the cause). writer --plugin certifies the binary's Writer
over --carrier engines, or, when it serves none, the bulk write over its
engine.

The configuration the fixtures use comes from --config and the usual key
flags (--engine.options k=v, --bounce.copy-contexts, ...), as for bounce run;
a plugin's block (engine.plugin: {checksum, env, args, options}) applies to
the --plugin binary, which is always the one certified: a path the block
names is replaced by it (the output says so), and a checksum pinned there
must match it.

Rules are reproducible from --seed. --junit and --json write the report for
CI systems.`,
		Example: `  bounce conformance engine --builtin tcp
  bounce conformance control --builtin nixlnotif --carrier ucx --junit report.xml
  bounce conformance engine --plugin ./my-fabric-engine --json report.json
  bounce conformance engine --plugin ./my-fabric-engine --engine.options rails=4
  bounce conformance gather --plugin ./my-stage --config agent.yaml
  bounce conformance --list`,
		Args: func(cmd *cobra.Command, args []string) error {
			if list {
				return nil
			}
			if len(args) != 1 {
				return usage(fmt.Errorf("want one kind: %s", strings.Join(certify.Kinds(), ", ")))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if list {
				for _, r := range conformance.Rules() {
					fmt.Fprintf(out, "%-40s %s\n", r.ID, r.Summary)
				}
				return nil
			}
			kind := args[0]
			cfg := conformance.Config{Seed: seed, OpTimeout: opTimeout, CallTimeout: callTimeout, Only: only, Skip: skip}
			if sizes != "" {
				for _, s := range strings.Split(sizes, ",") {
					n, err := parseSize(s)
					if err != nil {
						return usage(fmt.Errorf("--sizes: %w", err))
					}
					cfg.Sizes = append(cfg.Sizes, n)
				}
			}
			l, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			if plugin != "" {
				for _, other := range pinPlugin(&l.Config, kind, plugin) {
					fmt.Fprintf(out, "--plugin %s replaces %s from the configuration: the binary named on the command line is the one certified\n", plugin, other)
				}
			}
			// What a plugin writes to stderr is shown (info) whatever
			// log.level says; debug adds go-plugin's own lines.
			logc := l.Config.Log
			if logc.Level != "debug" {
				logc.Level = "info"
			}
			opts := certify.Options{Engine: l.Config.Engine, Control: l.Config.ControlPlane, Bounce: l.Config.Bounce, Stages: l.Config.Stages, Carrier: carrier, Logger: logger(cmd, logc)}
			f := node.Builtin()
			name := builtin
			switch {
			case plugin != "" && builtin != "":
				return usage(fmt.Errorf("--builtin and --plugin are exclusive"))
			case plugin != "":
				pf, pname, err := pluginFactories(plugin, kind, f)
				if err != nil {
					return usage(err)
				}
				if err := probePlugin(plugin, kind, l.Config); err != nil {
					return runtime(err)
				}
				f, name = pf, pname
				cfg.Subject = kind + "/" + filepath.Base(plugin)
			case builtin == "":
				return usage(fmt.Errorf("name the implementation: --builtin NAME or --plugin PATH"))
			default:
				if skip, why := certify.Waivers(kind, builtin); !noWaivers && len(skip) > 0 && len(cfg.Only) == 0 {
					for _, id := range skip {
						if !slices.Contains(cfg.Skip, id) {
							cfg.Skip = append(cfg.Skip, id)
						}
					}
					cfg.SkipReasons = why
				}
			}
			opts.Memory, opts.CUDADevice = memory, device
			rep, err := certify.Run(f, kind, name, opts, cfg)
			if kind == "writer" && plugin != "" && errors.Is(err, plugins.ErrNotServed) {
				// The binary serves no Writer: certify the bulk write
				// over the engine it serves.
				fmt.Fprintf(out, "%s serves no writer: certifying the bulk write over its engine\n", plugin)
				delete(f.Writers, name)
				rep, err = certify.Run(f, kind, name, opts, cfg)
			}
			var start *certify.StartError
			if errors.As(err, &start) {
				return runtime(err)
			}
			if err != nil {
				return usage(err)
			}
			if err := rep.WriteText(out); err != nil {
				return runtime(err)
			}
			writeAbsent(out, rep)
			if err := writeReport(junit, rep.WriteJUnit); err != nil {
				return runtime(err)
			}
			if err := writeReport(jsonOut, rep.WriteJSON); err != nil {
				return runtime(err)
			}
			if !rep.Passed() {
				return failed(fmt.Errorf("%s is not certified: %d rule(s) failed", rep.Subject, len(rep.Failures())))
			}
			fmt.Fprintf(out, "%s: certified (seed %d)\n", rep.Subject, rep.Seed)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&builtin, "builtin", "", "certify a built-in implementation by name (e.g. tcp, ucx, loopback, zmq, nixlnotif, inproc, host)")
	fl.StringVar(&plugin, "plugin", "", "certify the implementation served by this plugin binary")
	fl.StringVar(&carrier, "carrier", "loopback", "engine that carries a control plane built on notifications (nixlnotif)")
	fl.StringVar(&junit, "junit", "", "write a JUnit XML report to this file")
	fl.StringVar(&jsonOut, "json", "", "write a JSON report to this file")
	fl.StringSliceVar(&only, "only", nil, "run only these rule IDs")
	fl.StringSliceVar(&skip, "skip", nil, "skip these rule IDs")
	fl.Int64Var(&seed, "seed", 1, "seed for patterns and random plans")
	fl.DurationVar(&opTimeout, "op-timeout", 0, "bound on every wait for an operation (default 10s)")
	fl.DurationVar(&callTimeout, "call-timeout", 0, "bound on a call that must not block: Poll, Notify, a PostWrite of a stalled write (default 1s; raise it on a loaded machine or through a slow hop)")
	fl.StringVar(&sizes, "sizes", "", "transfer sizes, e.g. 1,4KiB,8MiB (default 1,7,4096,4097,64KiB,1MiB,8MiB; a write above 1 MiB and above the engine's fragment size is always added)")
	fl.BoolVar(&list, "list", false, "list every rule and exit")
	fl.StringVar(&memory, "memory", "auto", "memory the data rules run on: host, cuda (managed device memory) or auto (cuda for an implementation that declares CUDA memory); without a usable GPU cuda rules are skipped with the reason")
	fl.IntVar(&device, "device", 0, "CUDA ordinal of --memory cuda")
	configFlags(cmd)
	fl.BoolVar(&noWaivers, "no-waivers", false, "also run the rules a built-in is known not to keep (skipped with their reason by default)")
	return cmd
}

// pinPlugin makes path the binary of every plugin block the fixtures of
// kind may start (its other keys — checksum, env, args, options — stay and
// apply to path), and returns "key: other" for each block that named
// another binary.
func pinPlugin(c *config.Config, kind, path string) []string {
	var blocks []struct {
		key string
		p   *config.PluginConfig
	}
	add := func(key string, p *config.PluginConfig) {
		blocks = append(blocks, struct {
			key string
			p   *config.PluginConfig
		}{key, p})
	}
	switch kind {
	case "engine":
		add("engine.plugin.path", &c.Engine.Plugin)
	case "writer":
		add("engine.plugin.path", &c.Engine.Plugin)
		add("stages.write.plugin.path", &c.Stages.Write.Plugin)
	case "control":
		add("control_plane.plugin.path", &c.ControlPlane.Plugin)
	case "gather":
		add("stages.gather.plugin.path", &c.Stages.Gather.Plugin)
	case "scatter":
		add("stages.scatter.plugin.path", &c.Stages.Scatter.Plugin)
	}
	var replaced []string
	for _, b := range blocks {
		if b.p.Path != "" && b.p.Path != path {
			replaced = append(replaced, fmt.Sprintf("%s %s", b.key, b.p.Path))
		}
		b.p.Path = path
	}
	return replaced
}

// probePlugin starts the plugin once as the kind's fixtures will, so a
// binary that is missing, not a plugin, fails its checksum or speaks
// another protocol version is reported as what it is — not as a failure of
// the first rule.
func probePlugin(path, kind string, c config.Config) error {
	block := c.Engine.Plugin
	pkind := plugins.KindEngine
	switch kind {
	case "control":
		block, pkind = c.ControlPlane.Plugin, plugins.KindControl
	case "gather":
		block, pkind = c.Stages.Gather.Plugin, plugins.KindGather
	case "scatter":
		block, pkind = c.Stages.Scatter.Plugin, plugins.KindScatter
	}
	cl, err := plugins.LoadSpec(plugins.Spec{Path: path, Args: block.Args, Env: block.Env, InheritEnv: block.InheritEnv, Checksum: block.Checksum}, pkind)
	if err != nil {
		return fmt.Errorf("--plugin %s: cannot start it: %w", path, err)
	}
	return cl.Close()
}

// writeAbsent names the optional capabilities the subject lacks
// (rep.Absent, and any a skipped rule names) and the rules skipped for
// each (a wrapper that embeds the transfer.Engine interface, say, hides
// its engine's Notify).
func writeAbsent(w io.Writer, rep conformance.Report) {
	capability := regexp.MustCompile(`(?:do not|does not) implement (transfer\.[A-Z][A-Za-z]*)`)
	skipped := map[string][]string{}
	caps := slices.Clone(rep.Absent)
	for _, r := range rep.Results {
		if r.Outcome != conformance.Skip {
			continue
		}
		m := capability.FindStringSubmatch(r.Message)
		if m == nil {
			continue
		}
		if !slices.Contains(caps, m[1]) {
			caps = append(caps, m[1])
		}
		skipped[m[1]] = append(skipped[m[1]], r.Rule)
	}
	for _, c := range caps {
		if n := len(skipped[c]); n > 0 {
			fmt.Fprintf(w, "optional capability absent: %s — %d rule(s) skipped: %s\n", c, n, strings.Join(skipped[c], ", "))
		} else {
			fmt.Fprintf(w, "optional capability absent: %s\n", c)
		}
	}
}

func writeReport(path string, write func(w io.Writer) error) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// pluginFactories loads a plugin binary as the factories certify uses.
func pluginFactories(path, kind string, builtin node.Factories) (node.Factories, string, error) {
	if st, err := os.Stat(path); err != nil {
		return node.Factories{}, "", fmt.Errorf("--plugin %s: %w", path, err)
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		return node.Factories{}, "", fmt.Errorf("--plugin %s: not an executable file", path)
	}
	switch kind {
	case "engine", "writer", "control", "gather", "scatter":
		return node.WithPlugins(builtin, path), "plugin", nil
	}
	return node.Factories{}, "", fmt.Errorf("--plugin %s: kind %q cannot be served by a plugin; accepted: engine, writer, control, gather, scatter", path, kind)
}
