package benchreport

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes the summary of r: one row per cell and route (median
// throughput over iterations, latency percentiles pooled over them), the
// side-by-side ratios per cell, the agents' peak memory and the notes.
func WriteTable(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "cell\troute\tn\tthroughput\tdesc/s\tp50\tp90\tp99\tmax\tp99/p50\tverified")
	bulk, loop := false, false
	var unchecked []string // why bytes were not checked, each reason once
	for _, row := range Rows(r.Cells) {
		loop = loop || row.Generations > 1
		route := row.Route
		if row.Route == RouteBulk {
			bulk = true
			route = "bulk (1 desc)"
		}
		if row.Took != "" {
			route += " (took " + row.Took + ")"
		}
		v := row.Verified
		if row.Failed > 0 {
			v = fmt.Sprintf("%s (%d requests failed)", VerifiedFailed, row.Failed)
		}
		if row.NotVerified != "" && !slices.Contains(unchecked, row.NotVerified) {
			unchecked = append(unchecked, row.NotVerified)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.Group, route, row.Iterations,
			FormatRate(row.Throughput), descRate(row.Throughput, row.DescSize), dur(row.Latency.P50NS), dur(row.Latency.P90NS), dur(row.Latency.P99NS),
			dur(row.Latency.MaxNS), tail(row.Latency.TailRatio), v)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("benchreport: write table: %w", err)
	}
	for _, why := range unchecked {
		fmt.Fprintf(w, "verified skipped = the bytes were not checked: %s\n", why)
	}
	if bulk {
		fmt.Fprintln(w, "bulk (1 desc) = the same bytes as one contiguous descriptor per request, on the direct path")
	}
	if loop {
		fmt.Fprintln(w, "cK loopG = closed loop: K requests in flight, each completion submitting the next, G x K requests; latencies exclude the first K (steady state)")
	}
	if err := writeRatios(w, r.Ratios); err != nil {
		return err
	}
	if err := writeJudgements(w, r.AutoJudgements); err != nil {
		return err
	}
	if err := writeStages(w, r.Cells); err != nil {
		return err
	}
	if m := r.Memory; m != nil {
		if m.ReceiverElsewhere {
			fmt.Fprintf(w, "\npeak RSS (VmHWM): sender %s (source buffer %s), receiver not measured (it runs elsewhere; destination buffer %s); arena %s here; largest transfer %s\n",
				FormatSize(m.SenderPeakRSS), FormatSize(m.SourceBuffer), FormatSize(m.DestinationBuffer), FormatSize(m.ArenaSize), FormatSize(m.LargestTransfer))
			fmt.Fprintf(w, "beyond the KV buffers: sender %s\n", signedSize(m.SenderOverhead()))
		} else {
			fmt.Fprintf(w, "\npeak RSS (VmHWM): sender %s (source buffer %s), receiver %s (destination buffer %s); arena %s each; largest transfer %s\n",
				FormatSize(m.SenderPeakRSS), FormatSize(m.SourceBuffer), FormatSize(m.ReceiverPeakRSS), FormatSize(m.DestinationBuffer),
				FormatSize(m.ArenaSize), FormatSize(m.LargestTransfer))
			fmt.Fprintf(w, "beyond the KV buffers: sender %s, receiver %s\n", signedSize(m.SenderOverhead()), signedSize(m.ReceiverOverhead()))
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

// writeRatios writes one line per group with every ratio of the group.
func writeRatios(w io.Writer, ratios []Ratio) error {
	if len(ratios) == 0 {
		return nil
	}
	var names []string
	var groups []Group
	byGroup := map[Group]map[string]Ratio{}
	for _, r := range ratios {
		if !slices.Contains(names, r.Name()) {
			names = append(names, r.Name())
		}
		if byGroup[r.Group] == nil {
			byGroup[r.Group] = map[string]Ratio{}
			groups = append(groups, r.Group)
		}
		byGroup[r.Group][r.Name()] = r
	}
	fmt.Fprintln(w, "\nthroughput ratios, measured side by side in each iteration (median [per iteration]):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "cell\t%s\n", strings.Join(names, "\t"))
	for _, g := range groups {
		fmt.Fprintf(tw, "%s", g)
		for _, n := range names {
			r, ok := byGroup[g][n]
			if !ok {
				fmt.Fprint(tw, "\t-")
				continue
			}
			per := make([]string, len(r.PerIteration))
			for i, x := range r.PerIteration {
				per[i] = fmt.Sprintf("%.2f", x)
			}
			fmt.Fprintf(tw, "\t%.2fx [%s]", r.Median, strings.Join(per, " "))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("benchreport: write ratios: %w", err)
	}
	if within, cells := AutoVerdict(ratios); cells > 0 {
		fmt.Fprintf(w, "route auto within %.0f%% of the faster of bounce and direct (median auto/best >= %.2f): %d of %d cells\n",
			100*AutoTolerance, 1-AutoTolerance, within, cells)
	}
	return nil
}

// writeJudgements writes route auto's verdict per cell (JudgeAuto) and
// the tally.
func writeJudgements(w io.Writer, js []AutoJudgement) error {
	if len(js) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nroute auto against noise (bounce/direct: median of the per-iteration ratios [%.0f%% bootstrap interval]):\n", 100*bootstrapConfidence)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, j := range js {
		fmt.Fprintf(tw, "%s\t%s\n", j.Group, j)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("benchreport: write auto verdicts: %w", err)
	}
	ok, judged := AutoJudgementTally(js)
	fmt.Fprintf(w, "route auto took the faster path or one within noise (or within %.0f%%): %d of %d cells judged (%d with fewer than %d iterations not judged)\n",
		100*AutoTolerance, ok, judged, len(js)-judged, MinJudgedIterations)
	return nil
}

func dur(ns int64) string { return FormatDuration(time.Duration(ns)) }

func tail(x float64) string {
	if x == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}

func signedSize(n int64) string {
	if n < 0 {
		return "-" + FormatSize(uint64(-n))
	}
	return FormatSize(uint64(n))
}

// descRate formats the descriptors per second that bps bytes per second of
// descSize-byte descriptors make ("1.23M/s").
func descRate(bps float64, descSize uint64) string {
	if descSize == 0 || bps <= 0 {
		return "-"
	}
	r := bps / float64(descSize)
	switch {
	case r >= 1e9:
		return fmt.Sprintf("%.2fG/s", r/1e9)
	case r >= 1e6:
		return fmt.Sprintf("%.2fM/s", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.1fk/s", r/1e3)
	}
	return fmt.Sprintf("%.0f/s", r)
}

// writeStages writes, per group and route that recorded stage times, the
// mean over iterations of each stage's time per request.
func writeStages(w io.Writer, cells []Cell) error {
	type key struct {
		g     Group
		route string
	}
	var order []key
	sums := map[key]*[8]int64{} // seven stages and the count
	for _, c := range cells {
		if c.Stages == nil {
			continue
		}
		k := key{c.Group, c.Route}
		s := sums[k]
		if s == nil {
			s = &[8]int64{}
			sums[k] = s
			order = append(order, k)
		}
		for i, v := range []int64{c.Stages.PlanNS, c.Stages.GrantWaitNS, c.Stages.GatherNS, c.Stages.WriteNS, c.Stages.DataNS, c.Stages.ScatterNS, c.Stages.AckWaitNS} {
			s[i] += v
		}
		s[7]++
	}
	if len(order) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nwhere a request's time went (mean per request, summed over its chunks, which overlap; plan/piece is plan over the workload's pieces, the sender's host cost per block at submit; scatter is the receiver's, from its ACKs; ACK is the rest of DATA->ACK):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "cell\troute\tplan\tplan/piece\tWANT->GRANT\tgather\twrite\tDATA\tscatter\tACK")
	for _, k := range order {
		s := sums[k]
		n := s[7]
		perPiece := "-"
		if k.g.Count > 0 && k.route != RouteBulk && s[0] > 0 {
			perPiece = fmt.Sprintf("%.1fns", float64(s[0]/n)/float64(k.g.Count))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.g, k.route, dur(s[0]/n), perPiece, dur(s[1]/n), dur(s[2]/n), dur(s[3]/n), dur(s[4]/n), dur(s[5]/n), dur(s[6]/n))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("benchreport: write stages: %w", err)
	}
	return nil
}
