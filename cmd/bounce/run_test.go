package main

import (
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/driver"
)

// runRow is a successful, verified row of run asked on route, that took
// took and moved 1 GB in ms milliseconds.
func runRow(asked, took string, ms int, reason string) namedResult {
	return namedResult{asked: asked, verified: verifiedYes,
		res: driver.Result{Requests: 1, Route: took, Reason: reason, Bytes: 1e9, Elapsed: time.Duration(ms) * time.Millisecond}}
}

// TestRouteSummary checks run's summary: bounce against direct by the
// median over iterations, which route auto took in how many iterations and
// why, and auto over the faster path; a failed bounce leaves both
// comparisons out and says so.
func TestRouteSummary(t *testing.T) {
	why := "auto: predicted bounce 400ms vs direct 500ms (1.25x)"
	rows := []namedResult{
		runRow("auto", "bounce", 500, why), runRow("bounce", "bounce", 500, ""), runRow("direct", "direct", 1000, ""),
		runRow("auto", "bounce", 500, why), runRow("bounce", "bounce", 400, ""), runRow("direct", "direct", 1000, ""),
		runRow("auto", "direct", 1000, "auto: predicted bounce 600ms vs direct 500ms (0.83x)"), runRow("bounce", "bounce", 500, ""), runRow("direct", "direct", 2000, ""),
	}
	rows[0].res.Requests = 8 // counted by request, not by row
	got := strings.Join(routeSummary(rows), "\n")
	for _, want := range []string{
		"bounce vs direct: 2.00x the throughput (2.00 GB/s vs 1.00 GB/s) (medians over 3 iterations)",
		"bounce was faster here",
		"route auto took bounce for 9 of 10, direct for 1 of 10 requests, because predicted bounce 400ms vs direct 500ms (1.25x); predicted bounce 600ms vs direct 500ms (0.83x): 1.00x the faster of bounce and direct",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("summary lacks %q:\n%s", want, got)
		}
	}
	failedBounce := []namedResult{runRow("auto", "direct", 1000, "auto: predicted bounce 600ms vs direct 500ms (0.83x)"), runRow("bounce", "bounce", 500, ""), runRow("direct", "direct", 1000, "")}
	failedBounce[1].res.Failed = 1
	got = strings.Join(routeSummary(failedBounce), "\n")
	if strings.Contains(got, "bounce vs direct") || !strings.Contains(got, "route auto took direct for 1 of 1 requests, because predicted bounce 600ms vs direct 500ms (0.83x): not compared") {
		t.Fatalf("summary with bounce failed:\n%s", got)
	}
}
