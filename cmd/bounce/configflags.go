package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/node"
	"github.com/bouncekv/bounce/telemetry"
)

// configFlags adds --config and one flag per configuration key to cmd.
func configFlags(cmd *cobra.Command) {
	cmd.Flags().VarP(new(configFile), "config", "c", "YAML configuration file, one (precedence: defaults < file < BOUNCE_* environment < flags)")
	fs := pflag.NewFlagSet("config", pflag.ContinueOnError)
	config.RegisterFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) { f.Hidden = true })
	cmd.Flags().AddFlagSet(fs)
	cmd.SetUsageTemplate(cmd.UsageTemplate() + "\nEvery configuration key is also a flag, e.g. --engine.kind tcp --bounce.arena-size 512MiB;\nsee `bounce config --keys`.\n")
}

// configFile is --config: one file. A second --config is refused rather
// than silently replacing the first.
type configFile string

func (f *configFile) String() string { return string(*f) }
func (f *configFile) Type() string   { return "file" }
func (f *configFile) Set(v string) error {
	if *f != "" && string(*f) != v {
		return fmt.Errorf("a second file (%s after %s): give one --config; put the settings of both in one file, or set the differing keys by flag or BOUNCE_* variable", v, string(*f))
	}
	*f = configFile(v)
	return nil
}

// loadConfig reads the configuration layers for cmd; a bad value is a usage
// error naming the key.
func loadConfig(cmd *cobra.Command) (*config.Loaded, error) {
	file := cmd.Flags().Lookup("config").Value.String()
	l, err := config.Load(config.LoadOptions{File: file, Environ: os.Environ(), Flags: cmd.Flags()})
	if err != nil {
		return nil, usage(fmt.Errorf("configuration: %w", err))
	}
	// A kind this build cannot make is a configuration error now, not a
	// failure once the agent starts.
	if err := node.CheckKinds(l.Config, factories()); err != nil {
		return nil, usage(fmt.Errorf("configuration: %w", err))
	}
	for _, n := range l.Notices {
		fmt.Fprintln(cmd.ErrOrStderr(), "bounce: notice:", n)
	}
	return l, nil
}

// roleService names the service of a serve or send started by hand
// <default>-<role> (bounce-recv, bounce-send), as bounce run names its two,
// so the two sides of a trace are told apart; a service name the user set
// (telemetry.service_name, OTEL_SERVICE_NAME) is kept.
func roleService(l *config.Loaded, role string) {
	if l.Sources["telemetry.service_name"] == config.SourceDefault && os.Getenv("OTEL_SERVICE_NAME") == "" {
		l.Config.Telemetry.ServiceName = telemetry.DefaultServiceName + "-" + role
	}
}

// configArgs renders the configuration flags the user set on cmd (and
// --config) so a child process can be started with the same configuration.
func configArgs(cmd *cobra.Command, skip ...string) []string {
	keys := map[string]bool{"config": true}
	for _, k := range config.Keys() {
		keys[config.FlagName(k)] = true
	}
	for _, s := range skip {
		delete(keys, s)
	}
	var args []string
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if !keys[f.Name] {
			return
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			for _, v := range sv.GetSlice() {
				args = append(args, "--"+f.Name+"="+v)
			}
			return
		}
		args = append(args, "--"+f.Name+"="+f.Value.String())
	})
	return args
}

// logger returns the logger on stderr that the configuration's log.level
// and log.format (validated by Load) describe.
func logger(cmd *cobra.Command, c config.LogConfig) *slog.Logger {
	return c.Logger(cmd.ErrOrStderr())
}
