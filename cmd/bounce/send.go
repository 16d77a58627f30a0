package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/workload"
)

// workloadFlags are the flags that describe a KV-shaped transfer.
type workloadFlags struct {
	preset     string
	descSize   string
	count      int
	contiguous bool
	seed       uint64
	requests   int
}

func (w *workloadFlags) add(cmd *cobra.Command, requests int) {
	cmd.Flags().StringVar(&w.preset, "workload", "llama70b-tp8-b16", "workload preset (model-TP-block; see 'bounce bench --list')")
	cmd.Flags().StringVar(&w.descSize, "desc-size", "", "override the preset's descriptor size (e.g. 4KiB)")
	cmd.Flags().IntVar(&w.count, "count", 0, "override the preset's descriptor count")
	cmd.Flags().BoolVar(&w.contiguous, "contiguous", false, "contiguous block ids instead of fragmented (random) ones")
	cmd.Flags().Uint64Var(&w.seed, "seed", 1, "seed for the block layout and the byte pattern")
	cmd.Flags().IntVar(&w.requests, "requests", requests, "concurrent requests (each moves one workload)")
}

// spec resolves the flags into one request's spec.
func (w *workloadFlags) spec() (workload.Spec, error) {
	p, err := workload.Lookup(w.preset)
	if err != nil {
		return workload.Spec{}, usage(err)
	}
	s := workload.Spec{DescSize: p.DescSize, Count: p.Count, Fragmented: !w.contiguous, Seed: w.seed}
	if w.descSize != "" {
		n, err := parseSize(w.descSize)
		if err != nil {
			return workload.Spec{}, usage(fmt.Errorf("--desc-size: %w", err))
		}
		s.DescSize = n
	}
	if w.count != 0 {
		s.Count = w.count
	}
	if err := s.Validate(); err != nil {
		return workload.Spec{}, usage(err)
	}
	if w.requests < 1 {
		return workload.Spec{}, usage(fmt.Errorf("--requests %d: must be at least 1", w.requests))
	}
	return s, nil
}

func parseRoute(s string) (pipeline.Route, error) {
	switch s {
	case "auto":
		return pipeline.RouteAuto, nil
	case "bounce":
		return pipeline.RouteBounce, nil
	case "direct":
		return pipeline.RouteDirect, nil
	}
	return 0, usage(fmt.Errorf("--route %q: accepted: auto, bounce, direct", s))
}

func newSendCmd() *cobra.Command {
	var wf workloadFlags
	var peerFile, route, jsonOut string
	var warm bool
	var repeat int
	var memory memoryFlag
	cmd := &cobra.Command{
		Use:   "send",
		Short: "Move a KV-shaped workload to a serving agent",
		Long: `send builds a sender agent from the configuration, loads the peer
published by 'bounce serve' (its descriptor line, from a file or "-" for
stdin), moves the workload into the peer's buffer and prints a summary.
Bytes are verified on the receiving side (see 'bounce serve --expect', and
'bounce run' for a verified single-host run). Like 'bounce run', one
unrecorded request moves first (--warm-up=false to measure cold; it writes
the first request's bytes, which --expect accepts); --repeat moves the
workload several times, one summary row each (against a plain 'bounce
serve': one with --expect exits after the first complete pass); --json
writes the rows.

With discovery.kind etcd, --peer is the receiver's agent name: send
resolves it in etcd, publishes its own descriptor under its agent.name (a
receiver started with 'serve --follow NAME' admits it), follows the
receiver's record (each --repeat pass targets it as it is then, so a
receiver restarted on a new endpoint is picked up) and fails its requests at
once when the receiver's lease expires.`,
		Example: `  # the receiver admits this agent's key: serve --security.allowed-peers @host-a.peer,
  # host-a.peer from 'bounce key --security.key-file a.key --agent.name host-a --out host-a.peer'
  bounce send --peer recv.json --agent.name host-a --security.key-file a.key --workload gptoss120b-tp8-b16 --requests 8
  bounce send --peer recv.json --agent.name host-a --security.key-file a.key --repeat 5 --json send.json
  # through an etcd without TLS or users ('make etcd'): accepted only with discovery.insecure
  bounce send --discovery.kind etcd --discovery.insecure --agent.name prefill-0 --peer decode-0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rt, err := parseRoute(route)
			if err != nil {
				return err
			}
			j, err := startPeerJob(cmd, "send", memory, wf, repeat, peerFile)
			if err != nil {
				return err
			}
			defer j.close()
			spec, src, d := j.spec, j.src, j.d
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
			defer cancel()
			h, err := src.current(ctx)
			if err != nil {
				return failed(err)
			}
			tgt := driver.Target{Peer: h.Name, Buffer: h.buffer()}
			out := cmd.OutOrStdout()
			if warm {
				res, err := d.Run(ctx, tgt, driver.Options{Spec: spec, Requests: 1, Route: rt, TagPrefix: "warm-up-"})
				if err == nil && res.Failed > 0 {
					err = res.FirstErr
				}
				if err != nil {
					return failed(fmt.Errorf("warm-up: %w", err))
				}
				fmt.Fprintln(out, "warm-up: one unrecorded request moved first")
			}
			var rows []namedResult
			var firstErr error
			for i := range repeat {
				// Through etcd the receiver may have changed (restarted on
				// a new endpoint, a grown buffer): each pass targets its
				// record as it is now.
				if h, err = src.current(ctx); err != nil {
					return failed(err)
				}
				tgt = driver.Target{Peer: h.Name, Buffer: h.buffer()}
				res, err := d.Run(ctx, tgt, driver.Options{Spec: spec, Requests: wf.requests, Route: rt})
				if err != nil {
					return failed(err)
				}
				row := namedResult{res: res, notVerified: sendNotVerified, iteration: i}
				if repeat > 1 {
					row.label = fmt.Sprintf("%s #%d", res.Route, i)
				}
				rows = append(rows, row)
				if res.Failed > 0 && firstErr == nil {
					firstErr = fmt.Errorf("%d of %d requests failed: %w", res.Failed, res.Requests, res.FirstErr)
				}
			}
			printResults(out, spec, rows)
			if jsonOut != "" {
				if err := writeSendJSON(jsonOut, spec, rt.String(), rows); err != nil {
					return runtime(err)
				}
			}
			if firstErr != nil {
				return failed(firstErr)
			}
			return nil
		},
	}
	wf.add(cmd, 1)
	cmd.Flags().BoolVar(&warm, "warm-up", true, "first move one request unrecorded, so connection setup and first-touch faults are not measured")
	cmd.Flags().IntVar(&repeat, "repeat", 1, "move the workload this many times, one summary row each")
	cmd.Flags().StringVar(&jsonOut, "json", "", "also write the results as JSON to this file")
	cmd.Flags().StringVar(&peerFile, "peer", "", `the receiver: its descriptor line from 'bounce serve' (a file, or "-" for stdin), or with discovery.kind etcd its agent name`)
	cmd.Flags().StringVar(&route, "route", "auto", "auto, bounce or direct")
	cmd.MarkFlagRequired("peer")
	memory.add(cmd)
	configFlags(cmd)
	return cmd
}

func readHello(stdin io.Reader, path string) (hello, []byte, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(stdin, maxHello))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return hello{}, nil, fmt.Errorf("--peer: %w", err)
	}
	h, blob, err := parseHello(b)
	if err != nil {
		return hello{}, nil, fmt.Errorf("--peer %s: %w", path, err)
	}
	return h, blob, nil
}

// maxHello bounds a descriptor line (an agent descriptor is far smaller).
const maxHello = 16 << 20

// parseHello decodes the descriptor line 'bounce serve' publishes.
func parseHello(b []byte) (hello, []byte, error) {
	if len(b) > maxHello {
		return hello{}, nil, fmt.Errorf("descriptor line of %d bytes exceeds %d", len(b), maxHello)
	}
	var h hello
	if err := json.Unmarshal(b, &h); err != nil {
		return hello{}, nil, fmt.Errorf("not a descriptor line from 'bounce serve': %w", err)
	}
	blob, err := base64.StdEncoding.DecodeString(h.Descriptor)
	if err != nil || h.Name == "" || h.BufferLen == 0 || len(blob) == 0 {
		return hello{}, nil, fmt.Errorf("incomplete descriptor line (name, descriptor and buffer are required)")
	}
	if h.BufferAddr+h.BufferLen < h.BufferAddr {
		return hello{}, nil, fmt.Errorf("buffer [%#x+%d] wraps the address space", h.BufferAddr, h.BufferLen)
	}
	return h, blob, nil
}

// sendRow is one measured repetition in send's and run's JSON output.
type sendRow struct {
	Iteration      int     `json:"iteration"`
	Asked          string  `json:"route_asked,omitempty"`
	Route          string  `json:"route"`
	Reason         string  `json:"reason,omitempty"`
	Requests       int     `json:"requests"`
	Failed         int     `json:"failed"`
	Bytes          uint64  `json:"bytes"`
	ElapsedNS      int64   `json:"elapsed_ns"`
	BytesPerSecond float64 `json:"bytes_per_second"`
	P50NS          int64   `json:"p50_ns"`
	P99NS          int64   `json:"p99_ns"`
	MaxNS          int64   `json:"max_ns"`
	Fallbacks      int     `json:"fallbacks"`
	FallbackReason string  `json:"fallback_reason,omitempty"`
	// Verified is true when the receiver checked every byte and found each
	// right; NotVerified says why the bytes were not checked here.
	Verified    bool   `json:"verified"`
	NotVerified string `json:"not_verified,omitempty"`
	Error       string `json:"error,omitempty"`
	// Traces are the row's traced requests: tag and trace id.
	Traces []driver.RequestTrace `json:"traces,omitempty"`
}

// sendNotVerified is why send's rows are not verified.
const sendNotVerified = "the receiver checks the bytes ('bounce serve --expect')"

// writeSendJSON writes send's rows (asked: the route every row asked for)
// or run's (asked "": each row names its own) with the workload they moved.
func writeSendJSON(path string, spec workload.Spec, asked string, rows []namedResult) error {
	doc := struct {
		DescSize   uint64    `json:"desc_size"`
		Count      int       `json:"count"`
		Fragmented bool      `json:"fragmented"`
		Asked      string    `json:"route_asked,omitempty"`
		Rows       []sendRow `json:"rows"`
	}{DescSize: spec.DescSize, Count: spec.Count, Fragmented: spec.Fragmented, Asked: asked}
	for _, r := range rows {
		row := sendRow{
			Iteration: r.iteration, Asked: r.asked, Route: r.res.Route, Reason: r.res.Reason, Requests: r.res.Requests, Failed: r.res.Failed,
			Verified: r.verified == verifiedYes, NotVerified: r.notVerified,
			Bytes: r.res.Bytes, ElapsedNS: int64(r.res.Elapsed), BytesPerSecond: r.res.Throughput(),
			P50NS: int64(r.res.Percentile(50)), P99NS: int64(r.res.Percentile(99)), MaxNS: int64(r.res.Percentile(100)),
			Fallbacks: r.res.Fallbacks, FallbackReason: r.res.FallbackReason, Traces: r.res.Traces,
		}
		if r.res.FirstErr != nil {
			row.Error = r.res.FirstErr.Error()
		}
		doc.Rows = append(doc.Rows, row)
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
