package main

import (
	"fmt"
	"github.com/bouncekv/bounce/benchreport"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bouncekv/bounce/config"
	"github.com/bouncekv/bounce/driver"
	"github.com/bouncekv/bounce/workload"
)

// namedResult is one row of a summary.
type namedResult struct {
	label    string // defaults to the route
	res      driver.Result
	verified string // verifiedYes, "FAILED", "no: requests failed", or "" when not verified
	// notVerified says why the bytes were not checked (JSON); asked and
	// iteration are run's route asked and repetition (JSON).
	notVerified string
	asked       string
	iteration   int
}

// verifiedYes is a summary row whose bytes the receiver checked, all right.
const verifiedYes = "yes"

func describe(s workload.Spec, requests int) string {
	layout := "fragmented"
	if !s.Fragmented {
		layout = "contiguous"
	}
	return fmt.Sprintf("%d request(s) of %d x %s %s descriptors (%s each)", requests, s.Count, config.Size(s.DescSize), layout, config.Size(s.Bytes()))
}

// printResults writes a table: route, requests, throughput, latency
// percentiles and the verification outcome.
func printResults(w io.Writer, s workload.Spec, rows []namedResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "route\trequests\tfailed\tbytes\ttime\tthroughput\tp50\tp99\tmax\tverified")
	for _, r := range rows {
		label := r.label
		if label == "" {
			label = r.res.Route
		}
		v := r.verified
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", label, r.res.Requests, r.res.Failed,
			config.Size(r.res.Bytes), round(r.res.Elapsed), rate(r.res.Throughput()),
			round(r.res.Percentile(50)), round(r.res.Percentile(99)), round(r.res.Percentile(100)), v)
	}
	tw.Flush()
	for _, r := range rows {
		if r.res.Fallbacks > 0 {
			label := r.label
			if label == "" {
				label = r.res.Route
			}
			fmt.Fprintf(w, "%s: %d of %d request(s) fell back to the direct path: %s\n", label, r.res.Fallbacks, r.res.Requests, r.res.FallbackReason)
		}
		if r.res.FirstErr != nil {
			fmt.Fprintf(w, "%s: first failure: %v\n", r.label, r.res.FirstErr)
		}
	}
	for _, r := range rows {
		label := r.label
		if label == "" {
			label = r.res.Route
		}
		for _, tr := range r.res.Traces {
			fmt.Fprintf(w, "trace %s %s %s\n", label, tr.Tag, tr.TraceID)
		}
	}
}

func rate(bps float64) string { return benchreport.FormatRate(bps) }

func round(d time.Duration) string { return benchreport.FormatDuration(d) }

func parseSize(s string) (uint64, error) {
	n, err := config.ParseSize(strings.TrimSpace(s))
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("%q: must be positive", s)
	}
	return uint64(n), nil
}
