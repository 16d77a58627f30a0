package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"

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

The default workload is one rank of Llama-3.1-70B at TP=8 with block size 16:
81,920 fragmented descriptors of 4 KiB (320 MiB).`,
		Example: `  bounce run
  bounce run --workload gptoss120b-tp8-b16 --requests 8
  bounce run --engine.kind ucx --control-plane.kind zmq --compare=false
  bounce run --repeat 3 --json run.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := loadConfig(cmd)
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
			childArgs = append(childArgs, "--buffer-size="+config.Size(total).String())
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "bounce run: %s, engine %s, control plane %s, %s memory\n", describe(spec, wf.requests), cfg.Engine.Kind, cfg.ControlPlane.Kind, memory.kind)
			if repeat < 1 {
				return usage(fmt.Errorf("--repeat %d: must be at least 1", repeat))
			}
			return mainJob(cmd, cfg, childArgs, spec, wf.requests, jobOptions{compare: compare, warm: warm, repeat: repeat, json: jsonOut, memory: memory})
		},
	}
	wf.add(cmd, 1)
	cmd.Flags().BoolVar(&compare, "compare", true, "also move the workload over the direct path for comparison (--compare=false to skip)")
	cmd.Flags().BoolVar(&warm, "warm-up", true, "first move one request per route unrecorded, so connection setup and first-touch faults are measured on neither route")
	memory.add(cmd)
	cmd.Flags().IntVar(&repeat, "repeat", 1, "move every route's workload this many times, one summary row each")
	cmd.Flags().StringVar(&jsonOut, "json", "", "also write the results as JSON to this file")
	configFlags(cmd)
	return cmd
}

// jobOptions are run's choices besides the workload.
type jobOptions struct {
	compare, warm bool
	repeat        int    // iterations of every route
	json          string // file for the rows, "" for none
	memory        memoryFlag
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
	if jo.warm {
		var moves []warmMove
		for _, rt := range routes {
			moves = append(moves, warmMove{route: rt.String(), opts: driver.Options{Spec: spec, Requests: 1, Route: rt}})
		}
		if err := s.warmUp(cmd.Context(), moves...); err != nil {
			return failed(err)
		}
		fmt.Fprintln(out, "warm-up: one unrecorded request per route moved first")
	}
	var rows []namedResult
	var autoRes *driver.Result
	var bad []string
	for it := range jo.repeat {
		for _, rt := range routes {
			if _, err := s.recv.call(command{Op: "clear"}, 60*time.Second); err != nil {
				return runtime(err)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
			res, err := s.d.Run(ctx, s.tgt, driver.Options{Spec: spec, Requests: requests, Route: rt})
			cancel()
			if err != nil {
				return failed(err)
			}
			row := namedResult{label: rt.String(), res: res, verified: verifiedYes, asked: rt.String(), iteration: it}
			switch {
			case rt == pipeline.RouteAuto:
				row.label = fmt.Sprintf("auto (took %s)", res.Route)
				autoRes = &res
			case res.Route != rt.String():
				row.label = fmt.Sprintf("%s (asked %s)", res.Route, rt)
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
	printResults(out, spec, rows)
	if jo.json != "" {
		if err := writeSendJSON(jo.json, spec, "", rows); err != nil {
			return runtime(err)
		}
	}
	if n := len(rows); n >= 2 {
		bnc, dir := rows[n-2].res, rows[n-1].res
		if bnc.Failed == 0 && dir.Failed == 0 && dir.Throughput() > 0 {
			fmt.Fprintf(out, "bounce vs direct: %.2fx the throughput (%s vs %s), the same bytes verified on the receiver\n",
				bnc.Throughput()/dir.Throughput(), rate(bnc.Throughput()), rate(dir.Throughput()))
			if autoRes != nil && autoRes.Failed == 0 {
				best := max(bnc.Throughput(), dir.Throughput())
				fmt.Fprintf(out, "route auto took %s (%s): %.2fx the faster of bounce and direct\n", autoRes.Route, autoRes.Reason, autoRes.Throughput()/best)
			}
		}
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
