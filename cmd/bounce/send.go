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
	"github.com/bouncekv/bounce/node"
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
	cmd.Flags().StringVar(&w.preset, "workload", "llama70b-tp8-b16", "workload preset (model-TP-block; see `bounce bench --list`)")
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
	var peerFile, route string
	cmd := &cobra.Command{
		Use:   "send",
		Short: "Move a KV-shaped workload to a serving agent",
		Long: `send builds a sender agent from the configuration, loads the peer
published by 'bounce serve' (its descriptor line, from a file or "-" for
stdin), moves the workload into the peer's buffer and prints a summary.
Bytes are verified on the receiving side (see 'bounce run' for a verified
single-host run).`,
		Example: `  bounce send --peer recv.json --workload gptoss120b-tp8-b16 --requests 8`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			spec, err := wf.spec()
			if err != nil {
				return err
			}
			rt, err := parseRoute(route)
			if err != nil {
				return err
			}
			h, blob, err := readHello(cmd.InOrStdin(), peerFile)
			if err != nil {
				return usage(err)
			}
			n, err := node.Build(l.Config, factories(), logger(cmd))
			if err != nil {
				return usage(err)
			}
			defer n.Close(context.Background())
			if _, err := n.Agent.LoadPeer(blob); err != nil {
				return failed(err)
			}
			d, err := driver.New(n.Agent, spec.Bytes()*uint64(wf.requests))
			if err != nil {
				return runtime(err)
			}
			defer d.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
			defer cancel()
			res, err := d.Run(ctx, driver.Target{Peer: h.Name, Buffer: h.buffer()}, driver.Options{Spec: spec, Requests: wf.requests, Route: rt})
			if err != nil {
				return failed(err)
			}
			printResults(cmd.OutOrStdout(), spec, []namedResult{{res: res}})
			if res.Failed > 0 {
				return failed(fmt.Errorf("%d of %d requests failed: %w", res.Failed, res.Requests, res.FirstErr))
			}
			return nil
		},
	}
	wf.add(cmd, 1)
	cmd.Flags().StringVar(&peerFile, "peer", "", `the receiver's descriptor line from 'bounce serve' (a file, or "-" for stdin)`)
	cmd.Flags().StringVar(&route, "route", "auto", "auto, bounce or direct")
	cmd.MarkFlagRequired("peer")
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
