package main

import (
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/benchreport"
)

// TestBenchForms runs both request forms side by side: every cell
// verified, the forms alternating within each iteration, and the ratios
// holding <route>[blocks]/<route>[descs] for bounce and direct (not bulk).
func TestBenchForms(t *testing.T) {
	// gpt-oss-120b has 72 regions: 72 x 32 pieces of 2 KiB.
	rep, stdout, _ := runBench(t, "--workload", "gptoss120b-tp8-b16", "--count", "2304", "--form", "blocks,descs",
		"--concurrency", "2", "--routes", "bounce,direct,bulk", "--repeat", "2", "--bounce.arena-size", "16MiB", "--bounce.max-chunk", "2MiB")
	if len(rep.Cells) != 12 {
		t.Fatalf("%d cells, want 2 forms x 3 routes x 2 iterations", len(rep.Cells))
	}
	for i, c := range rep.Cells {
		if !c.Verified || c.Failed != 0 || c.Error != "" || c.VerifiedRequests != 2 {
			t.Errorf("cell %s %s #%d: verified %v, failed %d, error %q", c.Group, c.Route, c.Iteration, c.Verified, c.Failed, c.Error)
		}
		if want := []string{benchreport.FormBlocks, benchreport.FormDescs}[i/3%2]; c.Form != want || c.Iteration != i/6 {
			t.Errorf("cell %d: form %q iteration %d, want %q %d (forms side by side in each iteration)", i, c.Form, c.Iteration, want, i/6)
		}
	}
	var names []string
	for _, r := range rep.Ratios {
		if strings.Contains(r.Name(), "[") {
			names = append(names, r.Name())
			if len(r.PerIteration) != 2 || r.Median <= 0 {
				t.Errorf("%s: %v", r.Name(), r.PerIteration)
			}
		}
	}
	if strings.Join(names, ",") != "bounce[blocks]/bounce[descs],direct[blocks]/direct[descs]" {
		t.Errorf("form ratios %v", names)
	}
	if !strings.Contains(stdout.String(), "fragmented blocks c2") || !strings.Contains(stdout.String(), "plan/piece") {
		t.Errorf("table:\n%s", stdout.String())
	}
	if strings.Join(rep.Config.Forms, ",") != "blocks,descs" {
		t.Errorf("config forms %v", rep.Config.Forms)
	}
}

func TestBenchFormPlan(t *testing.T) {
	base := func() benchOptions {
		return benchOptions{workloads: []string{"gptoss120b-tp8-b16", "llama70b-tp8-b16"}, concurrency: []int{1}, generations: 1,
			routes: []string{"bounce"}, layout: "fragmented", repeat: 1, maxBytes: "1GiB", cellTimeout: time.Minute}
	}
	o := base()
	o.forms = []string{"blocks", "descs"}
	p, err := o.plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(p.groups) != 4 || p.groups[0].g.Form != "blocks" || p.groups[1].g.Form != "descs" || p.groups[0].spec.Regions != 72 || p.groups[3].spec.Regions != 160 {
		t.Fatalf("groups %+v", p.groups)
	}
	// Without blocks, nothing changes: unlabelled groups in the descriptor layout.
	o = base()
	o.forms = []string{"descs"}
	if p, err = o.plan(); err != nil || p.groups[0].g.Form != "" || p.groups[0].spec.Regions != 0 || p.forms != nil {
		t.Fatalf("descs alone: %+v %v", p.groups, err)
	}
	// A count the regions do not divide skips the shape, with a note.
	o = base()
	o.forms, o.count = []string{"blocks"}, 1000
	if _, err := o.plan(); err == nil {
		t.Fatal("a count no preset's regions divide planned")
	}
	o.workloads, o.count = []string{"gptoss120b-tp8-b16", "llama70b-tp8-b16"}, 360 // 72 x 5, not 160 x k
	if p, err = o.plan(); err != nil || len(p.groups) != 1 || !strings.Contains(strings.Join(p.notes, "\n"), "do not divide into its 160 regions") {
		t.Fatalf("groups %+v, notes %v, %v", p.groups, p.notes, err)
	}
	for _, bad := range []struct {
		forms []string
		peer  string
		want  string
	}{
		{[]string{"tables"}, "", `--form "tables": accepted: descs, blocks`},
		{[]string{"blocks", "blocks"}, "", "listed twice"},
		{[]string{"blocks"}, "recv.json", "not --peer"},
	} {
		o := base()
		o.forms, o.peer = bad.forms, bad.peer
		if _, err := o.plan(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("--form %v --peer %q: %v, want %q", bad.forms, bad.peer, err, bad.want)
		}
	}
}

// TestRunForms moves both forms with bounce run, every row verified.
func TestRunForms(t *testing.T) {
	out, errOut, code := bounce(t, "run", "--workload", "gptoss120b-tp8-b16", "--count", "1440", "--requests", "2", "--form", "blocks,descs",
		"--compare=false", "--bounce.arena-size", "16MiB", "--bounce.max-chunk", "2MiB")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"bounce [blocks]", "bounce [descs]", "every byte verified"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
