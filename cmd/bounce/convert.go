package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/bouncekv/bounce/benchreport"
	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/workload"
)

// layoutsFlag is run's --layouts: a conversion preset (workload.Conversions)
// or "list".
type layoutsFlag struct {
	preset string
	tokens uint32
}

func (f *layoutsFlag) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.preset, "layouts", "", "move a layout conversion instead of the workload: the preset sets both sides' pool layouts (llama70b-tp8-tp4, llama70b-b16-b32, llama70b-nhd-hnd; 'list' prints them); measured next to the same bytes unconverted, verified element by element")
	cmd.Flags().Uint32Var(&f.tokens, "layout-tokens", 8192, "with --layouts: the tokens one request moves (whole blocks on both sides)")
}

// conversion resolves the flag (ok false when unset).
func (f *layoutsFlag) conversion(wf workloadFlags) (workload.Conversion, bool, error) {
	if f.preset == "" {
		return workload.Conversion{}, false, nil
	}
	c, err := workload.LookupConversion(f.preset)
	if err != nil {
		return c, true, usage(err)
	}
	c.Fragmented, c.Seed, c.Tokens = !wf.contiguous, wf.seed, f.tokens
	if err := c.Validate(); err != nil {
		return c, true, usage(fmt.Errorf("--layout-tokens: %w", err))
	}
	if wf.requests < 1 || wf.requests > driver.MaxBlockRequests {
		return c, true, usage(fmt.Errorf("--layouts: --requests %d: 1 to %d (a pool per request)", wf.requests, driver.MaxBlockRequests))
	}
	return c, true, nil
}

// listConversions prints the conversion presets.
func listConversions(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PRESET\tSOURCE\tDESTINATION\tBYTES\tWHAT")
	for _, c := range workload.Conversions() {
		c.Tokens = 8192
		fmt.Fprintf(tw, "%s\t%v\t%v\t%s\t%s\n", c.Name, c.Src, c.Dst, benchreport.FormatSize(c.Payload()), c.About)
	}
	return tw.Flush()
}

// convertBuffers are the buffer sizes a conversion run needs: the source
// (the same for the converted and unconverted moves) and the destination.
func convertBuffers(c workload.Conversion, requests int) (src, dst uint64) {
	n := uint64(requests)
	return n * c.PoolBytes(c.Src), n * max(c.PoolBytes(c.Dst), c.PoolBytes(c.Src))
}

// convertJob is run --layouts: the conversion c and the same bytes
// unconverted (c.Unconverted: whole blocks, the source layout on both
// sides), each on the bounce route, alternating over jo.repeat iterations,
// every request verified element by element on the receiver; the summary
// is the converted throughput as a ratio of the unconverted.
func convertJob(cmd *cobra.Command, cfg config.Config, childArgs []string, c workload.Conversion, requests int, jo jobOptions) error {
	out := cmd.OutOrStdout()
	srcCap, _ := convertBuffers(c, requests)
	s, err := startSession(cmd, cfg, childArgs, srcCap, jo.memory)
	if err != nil {
		return err
	}
	defer s.close()
	if on, why, _ := s.n.Agent.PeerRoute(s.tgt.Peer); !on {
		return failed(fmt.Errorf("a layout conversion needs the bounce route, unavailable: %s", why))
	}
	moves := []workload.Conversion{c, c.Unconverted()}
	move := func(m workload.Conversion, n int, prefix string) (driver.Result, error) {
		if _, err := s.recv.call(command{Op: "clear"}, 60*time.Second); err != nil {
			return driver.Result{}, runtime(err)
		}
		if err := s.convPools(m, n); err != nil {
			return driver.Result{}, runtime(err)
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Minute)
		defer cancel()
		res, err := s.d.Run(ctx, s.tgt, driver.Options{Convert: &m, Requests: n, Route: pipeline.RouteBounce, TagPrefix: prefix})
		if err != nil {
			return res, failed(err)
		}
		return res, nil
	}
	if jo.warm {
		for _, m := range moves {
			if res, err := move(m, 1, "warm-up-"); err != nil || res.Failed > 0 {
				return failed(fmt.Errorf("warm-up of %s: %v %v", m.Name, err, res.FirstErr))
			}
		}
		fmt.Fprintln(out, "warm-up: one unrecorded request of each moved first")
	}
	var rows []namedResult
	var bad []string
	tput := map[string][]float64{}
	for it := range jo.repeat {
		for k := range moves {
			m := moves[(k+it)%len(moves)] // alternate which goes first
			res, err := move(m, requests, "")
			if err != nil {
				return err
			}
			row := namedResult{label: m.Name, res: res, verified: verifiedYes, asked: "bounce", iteration: it}
			if jo.repeat > 1 {
				row.label += fmt.Sprintf(" #%d", it)
			}
			if res.Failed > 0 {
				row.verified = "no: requests failed"
				bad = append(bad, fmt.Sprintf("%s: %d of %d requests failed: %v", m.Name, res.Failed, res.Requests, res.FirstErr))
			} else if _, err := s.recv.call(command{Op: "verify", Convert: &m, Requests: requests}, 5*time.Minute); err != nil {
				row.verified = "FAILED"
				bad = append(bad, fmt.Sprintf("%s: %v", m.Name, err))
			} else {
				tput[m.Name] = append(tput[m.Name], res.Throughput())
			}
			rows = append(rows, row)
		}
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MOVE\tROUTE\tREQUESTS\tBYTES\tTHROUGHPUT\tP50\tP99\tVERIFIED")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%v\t%v\t%s\n", r.label, r.res.Route, r.res.Requests, benchreport.FormatSize(r.res.Bytes), rate(r.res.Throughput()),
			r.res.Percentile(50).Round(time.Microsecond), r.res.Percentile(99).Round(time.Microsecond), r.verified)
	}
	tw.Flush()
	cm, um := benchreport.Median(tput[c.Name]), benchreport.Median(tput[c.Unconverted().Name])
	if cm > 0 && um > 0 {
		fmt.Fprintf(out, "converted vs unconverted: %.2fx the throughput (%s vs %s, medians over %d iterations), the same bytes verified element by element\n", cm/um, rate(cm), rate(um), jo.repeat)
	}
	if len(bad) > 0 {
		return failed(fmt.Errorf("%d move(s) failed:\n  %s", len(bad), strings.Join(bad, "\n  ")))
	}
	fmt.Fprintln(out, "every element verified")
	return nil
}

// convPools has the receiver register request slices of c's destination
// layout (replacing the previous pools) and loads its new descriptor.
func (s *session) convPools(c workload.Conversion, requests int) error {
	return s.loadPools("a layout conversion", command{Op: "pools", Convert: &c, Requests: requests})
}

// benchLayouts is bench --layouts: run's conversion job with the bench's
// choices (the first --concurrency as the requests, --repeat iterations,
// --layout contiguous for ordered ids, --seed).
func benchLayouts(cmd *cobra.Command, cfg config.Config, o *benchOptions, f layoutsFlag) error {
	if f.preset == "list" {
		return listConversions(cmd.OutOrStdout())
	}
	if o.fleet.on() || o.peer != "" {
		return usage(fmt.Errorf("--layouts: not with --peer or --senders/--receivers (the conversion job starts its own receiver)"))
	}
	wf := workloadFlags{contiguous: o.layout == "contiguous", seed: o.seed, requests: 1}
	if len(o.concurrency) > 0 {
		wf.requests = o.concurrency[0]
	}
	c, _, err := f.conversion(wf)
	if err != nil {
		return err
	}
	if o.repeat < 1 {
		return usage(fmt.Errorf("--repeat %d: must be at least 1", o.repeat))
	}
	cfg, childArgs := localPair(cmd, cfg)
	_, total := convertBuffers(c, wf.requests)
	childArgs = append(childArgs, o.memory.arg(), "--buffer-size="+config.Size(total).String())
	fmt.Fprintf(cmd.OutOrStdout(), "bounce bench: layouts %s (%s), %d request(s) of %s, %d iterations, engine %s, %s memory\n", c.Name, c.About, wf.requests, config.Size(c.Payload()), o.repeat,
		kindLabel(cfg.Engine.Kind, cfg.Engine.Plugin), o.memory.kind)
	return convertJob(cmd, cfg, childArgs, c, wf.requests, jobOptions{warm: true, repeat: o.repeat, memory: o.memory})
}
