package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/benchreport"
	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/telemetry"
	"github.com/bouncekv/bounce/workload"
)

func newRunCmd() *cobra.Command {
	var wf workloadFlags
	var compare, warm bool
	var memory memoryFlag
	var repeat int
	var jsonOut string
	var forms []string
	var layouts layoutsFlag
	var cpuProfile string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "The main job: two agent processes move a KV-shaped transfer, verified byte-exact",
		Long: `run starts a receiver agent as a child process ('bounce serve') and a sender
agent in this process, with the configured engine and control plane (tcp and
zmq by default, on this machine's loopback unless configured otherwise). It
moves the workload with route auto (the agent predicts the request on both
paths and takes the faster), then through the bounce pipeline and over the
direct path (one engine post per descriptor) for comparison, has the receiver
verify every byte of each, and prints a summary: route, throughput, request
latency percentiles, verification, and which route auto took and why. One unrecorded request per route runs
first (--warm-up=false to measure cold); --repeat moves every route's
workload several times, one summary row each; --json writes the rows.
--form blocks moves the workload as block tables over pools registered on
each side (pipeline.BlockRequest; K and V of every layer as regions, at most
256 requests); --form blocks,descs moves both forms, route by route, in that
layout (the same pieces), one row each. --layouts PRESET moves a layout
conversion instead: both sides register pools of the preset's layouts
(tensor parallelism, block size, axis order), the bounce route converts on
the way, and the same bytes unconverted are moved beside it in one run (the
summary gives the ratio); every element is verified by a pattern encoding its
(layer, K/V, token, head, element). --layouts list prints the presets.

The default workload is one rank of Llama-3.1-70B at TP=8 with block size 16:
81,920 fragmented descriptors of 4 KiB (320 MiB).`,
		Example: `  bounce run
  bounce run --workload gptoss120b-tp8-b16 --requests 8
  bounce run --engine.kind ucx --control-plane.kind zmq --compare=false
  bounce run --repeat 3 --json run.json
  bounce run --form blocks,descs --compare=false
  bounce run --layouts llama70b-tp8-tp4 --repeat 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if layouts.preset == "list" {
				return listConversions(cmd.OutOrStdout())
			}
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			l, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			conv, converting, err := layouts.conversion(wf)
			if err != nil {
				return err
			}
			spec, err := wf.spec()
			if err != nil {
				return err
			}
			if err := memory.check(); err != nil {
				return err
			}
			memory.apply(&l.Config, cmd.ErrOrStderr())
			cfg, childArgs := localPair(cmd, l.Config)
			childArgs = append(childArgs, memory.arg())
			total := spec.Bytes() * uint64(wf.requests)
			if converting {
				_, total = convertBuffers(conv, wf.requests)
			}
			childArgs = append(childArgs, "--buffer-size="+config.Size(total).String())
			out := cmd.OutOrStdout()
			if repeat < 1 {
				return usage(fmt.Errorf("--repeat %d: must be at least 1", repeat))
			}
			if converting {
				fmt.Fprintf(out, "bounce run: layouts %s (%s), %d request(s) of %s, engine %s, control plane %s, %s memory\n", conv.Name, conv.About, wf.requests, config.Size(conv.Payload()),
					kindLabel(cfg.Engine.Kind, cfg.Engine.Plugin), kindLabel(cfg.ControlPlane.Kind, cfg.ControlPlane.Plugin), memory.kind)
				return convertJob(cmd, cfg, childArgs, conv, wf.requests, jobOptions{warm: warm, repeat: repeat, memory: memory})
			}
			fmt.Fprintf(out, "bounce run: %s, engine %s, control plane %s, %s memory\n", describe(spec, wf.requests), kindLabel(cfg.Engine.Kind, cfg.Engine.Plugin), kindLabel(cfg.ControlPlane.Kind, cfg.ControlPlane.Plugin), memory.kind)
			if repeat < 1 {
				return usage(fmt.Errorf("--repeat %d: must be at least 1", repeat))
			}
			jo := jobOptions{compare: compare, warm: warm, repeat: repeat, json: jsonOut, memory: memory}
			if spec, jo.forms, err = runForms(forms, wf, spec); err != nil {
				return err
			}
			return mainJob(cmd, cfg, childArgs, spec, wf.requests, jo)
		},
	}
	wf.add(cmd, 1)
	cmd.Flags().BoolVar(&compare, "compare", true, "also move the workload over the direct path for comparison (--compare=false to skip)")
	cmd.Flags().BoolVar(&warm, "warm-up", true, "first move one request per route unrecorded, so connection setup and first-touch faults are measured on neither route")
	memory.add(cmd)
	cmd.Flags().IntVar(&repeat, "repeat", 1, "move every route's workload this many times, one summary row each")
	cmd.Flags().StringVar(&jsonOut, "json", "", "also write the results as JSON to this file")
	cmd.Flags().StringSliceVar(&forms, "form", []string{benchreport.FormDescs}, "request forms, each named once: descs (descriptor lists), blocks (block tables over registered pools), or both")
	layouts.add(cmd)
	cmd.Flags().StringVar(&cpuProfile, "cpu-profile", "", "write a CPU profile of this process (the sender; the receiver too with an in-process engine such as cudacopy) to this file, for go tool pprof")
	configFlags(cmd)
	return cmd
}

// startCPUProfile profiles this process's CPU into file path until the
// returned stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile %s: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// runForms resolves run's --form: nil for descriptor lists alone (as
// before --form), else the forms with spec in the preset's block-table
// layout.
func runForms(forms []string, wf workloadFlags, spec workload.Spec) (workload.Spec, []string, error) {
	var out []string
	for _, f := range forms {
		f = strings.TrimSpace(f)
		if f != benchreport.FormDescs && f != benchreport.FormBlocks {
			return spec, nil, usage(fmt.Errorf("--form %q: accepted: descs, blocks", f))
		}
		if slices.Contains(out, f) {
			return spec, nil, usage(fmt.Errorf("--form %q is listed twice: name each form once", f))
		}
		out = append(out, f)
	}
	if !slices.Contains(out, benchreport.FormBlocks) {
		return spec, nil, nil
	}
	p, err := workload.Lookup(wf.preset)
	if err != nil {
		return spec, nil, usage(err)
	}
	spec.Regions = p.Regions()
	if err := spec.Validate(); err != nil {
		return spec, nil, usage(fmt.Errorf("--form blocks: %w", err))
	}
	if wf.requests > driver.MaxBlockRequests {
		return spec, nil, usage(fmt.Errorf("--form blocks: --requests %d: at most %d (a pool per request)", wf.requests, driver.MaxBlockRequests))
	}
	return spec, out, nil
}

// jobOptions are run's choices besides the workload.
type jobOptions struct {
	compare, warm bool
	repeat        int    // iterations of every route
	json          string // file for the rows, "" for none
	memory        memoryFlag
	forms         []string // --form; nil: descriptor lists, unlabelled
}

func mainJob(cmd *cobra.Command, cfg config.Config, childArgs []string, spec workload.Spec, requests int, jo jobOptions) error {
	memory := jo.memory
	out := cmd.OutOrStdout()
	s, err := startSession(cmd, cfg, childArgs, spec.Bytes()*uint64(requests), memory)
	if err != nil {
		return err
	}
	defer s.close()
	if on, why, _ := s.n.Agent.PeerRoute(s.tgt.Peer); !on {
		fmt.Fprintf(out, "note: the bounce path is unavailable (%s); the bounce route, which run requires, will fail with that reason\n", why)
	}
	if addr := s.n.Telemetry.MetricsAddr(); addr != "" {
		fmt.Fprintf(out, "metrics: sender http://%s/metrics, receiver http://%s/metrics\n", addr, s.recv.hello.Metrics)
	}
	routes := []pipeline.Route{pipeline.RouteBounce}
	if jo.compare {
		// auto first, then both forced routes: the summary says what auto
		// chose and why, next to what each route measured.
		routes = []pipeline.Route{pipeline.RouteAuto, pipeline.RouteBounce, pipeline.RouteDirect}
	}
	forms := jo.forms
	if forms == nil {
		forms = []string{benchreport.FormDescs}
	}
	if jo.warm {
		var moves []warmMove
		for _, form := range forms {
			for _, rt := range routes {
				moves = append(moves, warmMove{route: rt.String(), opts: driver.Options{Spec: spec, Requests: 1, Route: rt, Blocks: form == benchreport.FormBlocks, TagPrefix: "warm-up-"}})
			}
		}
		if err := s.warmUp(cmd.Context(), moves...); err != nil {
			return failed(err)
		}
		fmt.Fprintln(out, "warm-up: one unrecorded request per route moved first")
	}
	var rows []namedResult
	var bad []string
	for it := range jo.repeat {
		for _, form := range forms {
			for _, rt := range routes {
				if _, err := s.recv.call(command{Op: "clear"}, 60*time.Second); err != nil {
					return runtime(err)
				}
				blocks := form == benchreport.FormBlocks
				if blocks {
					if err := s.pools(spec, requests); err != nil {
						return runtime(err)
					}
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
				res, err := s.d.Run(ctx, s.tgt, driver.Options{Spec: spec, Requests: requests, Route: rt, Blocks: blocks})
				cancel()
				if err != nil {
					return failed(err)
				}
				row := namedResult{label: rt.String(), res: res, verified: verifiedYes, asked: rt.String(), iteration: it}
				switch {
				case rt == pipeline.RouteAuto:
					row.label = fmt.Sprintf("auto (took %s)", res.Route)
				case res.Route != rt.String():
					row.label = fmt.Sprintf("%s (asked %s)", res.Route, rt)
				}
				if jo.forms != nil {
					row.label += " [" + form + "]"
				}
				if jo.repeat > 1 {
					row.label += fmt.Sprintf(" #%d", it)
				}
				if res.Failed > 0 {
					row.verified = "no: requests failed"
					bad = append(bad, fmt.Sprintf("%s: %d of %d requests failed: %v", rt, res.Failed, res.Requests, res.FirstErr))
				} else if _, err := s.recv.call(verifyCommand(spec, requests), 5*time.Minute); err != nil {
					row.verified = "FAILED"
					bad = append(bad, fmt.Sprintf("%s: %v", rt, err))
				}
				rows = append(rows, row)
			}
		}
	}
	printResults(out, spec, rows)
	if jo.json != "" {
		if err := writeSendJSON(jo.json, spec, "", rows); err != nil {
			return runtime(err)
		}
	}
	for _, line := range routeSummary(rows) {
		fmt.Fprintln(out, line)
	}
	if len(bad) > 0 {
		return failed(fmt.Errorf("%d route(s) failed:\n  %s", len(bad), strings.Join(bad, "\n  ")))
	}
	fmt.Fprintln(out, "every byte verified")
	return nil
}

// localPair derives, from the configuration cmd loaded, the sender's
// configuration and the receiver child's arguments for two agents on this
// machine: the agents are named <name>-send and <name>-recv, so are their
// services in traces (<service>-send, <service>-recv), the receiver serves
// its metrics on a port of its own, and the control plane binds on loopback
// unless an address or interface was configured.
func localPair(cmd *cobra.Command, cfg config.Config) (config.Config, []string) {
	base := cfg.Agent.Name
	cfg.Agent.Name = base + "-send"
	svc := telemetry.ServiceName(cfg.Telemetry, nil)
	cfg.Telemetry.ServiceName = svc + "-send"
	childArgs := append(configArgs(cmd, "agent.name", "telemetry.service-name", "telemetry.metrics.listen"),
		"--agent.name="+base+"-recv", "--telemetry.service-name="+svc+"-recv")
	if cfg.Telemetry.MetricsListen != "" {
		host, _, _ := net.SplitHostPort(cfg.Telemetry.MetricsListen)
		childArgs = append(childArgs, "--telemetry.metrics.listen="+net.JoinHostPort(host, "0"))
	}
	if cfg.ControlPlane.BindAddress == "" && cfg.ControlPlane.Interface == "" {
		cfg.ControlPlane.BindAddress = "127.0.0.1"
		childArgs = append(childArgs, "--control-plane.bind-address=127.0.0.1")
	}
	return cfg, childArgs
}

// routeSummary compares the routes of run's rows: bounce against direct
// (the median throughput of each over the iterations where it moved every
// request), and which route auto took, why (the agent's reason: the cost
// model's prediction of both paths, or the gate that decided) and how it
// compares with the faster of the two. Routes without a successful row are
// left out of the comparison and said so.
func routeSummary(rows []namedResult) []string {
	tput := map[string][]float64{}
	var took []string
	tookN := map[string]int{}
	var reasons []string
	autoRows := 0 // requests, not rows: a row moves --requests of them
	for _, r := range rows {
		if r.res.Failed > 0 || r.res.Requests == 0 || r.verified == "FAILED" {
			continue
		}
		tput[r.asked] = append(tput[r.asked], r.res.Throughput())
		if r.asked == pipeline.RouteAuto.String() {
			autoRows += r.res.Requests
			if tookN[r.res.Route] == 0 {
				took = append(took, r.res.Route)
			}
			tookN[r.res.Route] += r.res.Requests
			if why := strings.TrimPrefix(r.res.Reason, "auto: "); !slices.Contains(reasons, why) {
				reasons = append(reasons, why)
			}
		}
	}
	over := ""
	if n := len(tput[pipeline.RouteBounce.String()]); n > 1 {
		over = fmt.Sprintf(" (medians over %d iterations)", n)
	}
	bnc, dir := benchreport.Median(tput[pipeline.RouteBounce.String()]), benchreport.Median(tput[pipeline.RouteDirect.String()])
	var out []string
	if bnc > 0 && dir > 0 {
		faster := "bounce"
		if dir > bnc {
			faster = "direct"
		}
		out = append(out, fmt.Sprintf("bounce vs direct: %.2fx the throughput (%s vs %s)%s, the same bytes verified on the receiver; %s was faster here",
			bnc/dir, rate(bnc), rate(dir), over, faster))
	}
	if autoRows == 0 {
		return out
	}
	var parts []string
	for _, t := range took {
		parts = append(parts, fmt.Sprintf("%s for %d of %d", t, tookN[t], autoRows))
	}
	parts[len(parts)-1] += " requests"
	line := fmt.Sprintf("route auto took %s, because %s", strings.Join(parts, ", "), strings.Join(reasons, "; "))
	if best := max(bnc, dir); bnc > 0 && dir > 0 {
		line += fmt.Sprintf(": %.2fx the faster of bounce and direct", benchreport.Median(tput[pipeline.RouteAuto.String()])/best)
	} else {
		line += ": not compared (bounce or direct did not complete)"
	}
	return append(out, line)
}

// kindLabel names a component kind in output: the kind, or for a plugin
// its binary ("tcpengine (plugin ./tcpengine)").
func kindLabel(kind string, p config.PluginConfig) string {
	if kind != "plugin" || p.Path == "" {
		return kind
	}
	return fmt.Sprintf("%s (plugin %s)", filepath.Base(p.Path), p.Path)
}
