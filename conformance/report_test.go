package conformance_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"strings"
	"testing"
	"time"

	"github.com/bouncekv/bounce/conformance"
)

func sampleReport() conformance.Report {
	return conformance.Report{
		Kind:    "engine",
		Subject: "sample",
		Seed:    3,
		Results: []conformance.Result{
			{Rule: "engine/byte-exact", Outcome: conformance.Pass, Duration: 12 * time.Millisecond},
			{Rule: "engine/done-means-landed", Outcome: conformance.Fail, Message: "[engine/done-means-landed] write of 7 bytes: <byte> & \"quote\"\nsecond line", Duration: time.Second},
			{Rule: "engine/peer-loss", Outcome: conformance.Skip, Message: "[engine/peer-loss] skipped: EnginePair.KillB is nil"},
		},
	}
}

func TestReportVerdict(t *testing.T) {
	rep := sampleReport()
	if rep.Passed() {
		t.Error("Passed() with a failed rule")
	}
	if f := rep.Failures(); len(f) != 1 || f[0].Rule != "engine/done-means-landed" {
		t.Errorf("Failures() = %v", f)
	}
	rep.Results = append(rep.Results[:1], rep.Results[2:]...)
	if !rep.Passed() {
		t.Error("Passed() false with only passed and skipped rules")
	}
}

func TestReportText(t *testing.T) {
	var b bytes.Buffer
	rep := sampleReport()
	rep.Results = append(rep.Results, conformance.Result{Rule: "engine/release-terminal", Outcome: conformance.Pass, Message: "[engine/release-terminal] Release after Failed not exercised"})
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"RULE", "RESULT", "TIME",
		"engine/byte-exact         PASS    12ms",
		"engine/done-means-landed  FAIL    1s",
		"[engine/done-means-landed] write of 7 bytes",
		"[engine/peer-loss] skipped: EnginePair.KillB is nil",
		"note: [engine/release-terminal] Release after Failed not exercised",
		"FAIL engine conformance of sample: 2 passed, 1 failed, 1 skipped",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
}

func TestReportJSON(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Kind, Subject string
		Seed          int64
		Passed        bool
		Results       []struct {
			Rule, Outcome, Message string
			Seconds                float64
		}
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if got.Kind != "engine" || got.Subject != "sample" || got.Seed != 3 || got.Passed || len(got.Results) != 3 {
		t.Fatalf("decoded %+v", got)
	}
	r := got.Results[1]
	if r.Rule != "engine/done-means-landed" || r.Outcome != "fail" || r.Seconds != 1 || !strings.Contains(r.Message, "second line") {
		t.Errorf("result 1 = %+v", r)
	}
}

func TestReportJUnit(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteJUnit(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Suites []struct {
			Name     string `xml:"name,attr"`
			Tests    int    `xml:"tests,attr"`
			Failures int    `xml:"failures,attr"`
			Skipped  int    `xml:"skipped,attr"`
			Cases    []struct {
				Name    string `xml:"name,attr"`
				Failure *struct {
					Message string `xml:"message,attr"`
					Body    string `xml:",chardata"`
				} `xml:"failure"`
				Skipped *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if len(got.Suites) != 1 {
		t.Fatalf("%d testsuites", len(got.Suites))
	}
	s := got.Suites[0]
	if s.Tests != 3 || s.Failures != 1 || s.Skipped != 1 || !strings.Contains(s.Name, "engine") || len(s.Cases) != 3 {
		t.Fatalf("suite = %+v", s)
	}
	f := s.Cases[1].Failure
	if f == nil || s.Cases[1].Name != "engine/done-means-landed" || !strings.HasPrefix(f.Message, "[engine/done-means-landed]") ||
		strings.Contains(f.Message, "second line") || !strings.Contains(f.Body, "<byte> & \"quote\"\nsecond line") {
		t.Errorf("failure case = %+v %+v", s.Cases[1], f)
	}
	if s.Cases[2].Skipped == nil || s.Cases[0].Failure != nil || s.Cases[0].Skipped != nil {
		t.Errorf("cases = %+v", s.Cases)
	}
}

func TestRules(t *testing.T) {
	seen := map[string]bool{}
	kinds := map[string]int{}
	for _, r := range conformance.Rules() {
		kind, name, ok := strings.Cut(r.ID, "/")
		if !ok || name == "" || r.Summary == "" {
			t.Errorf("rule %+v: want <kind>/<name> and a summary", r)
		}
		if seen[r.ID] {
			t.Errorf("rule %s listed twice", r.ID)
		}
		seen[r.ID] = true
		kinds[kind]++
	}
	for _, k := range []string{"engine", "control", "gather", "scatter", "writer"} {
		if kinds[k] == 0 || !seen[k+"/no-goroutine-leak"] {
			t.Errorf("kind %s: %d rules, leak rule listed: %v", k, kinds[k], seen[k+"/no-goroutine-leak"])
		}
	}
}

func TestConfigErrorsAreReported(t *testing.T) {
	for _, cfg := range []conformance.Config{
		{Skip: []string{"engine/no-such-rule"}},
		{Only: []string{"nonsense"}},
		{Sizes: []uint64{0}},
		{Concurrency: -1},
		{OpTimeout: -time.Second},
	} {
		rep := conformance.CheckEngine(loopbackPair, cfg)
		if rep.Passed() || len(rep.Results) != 1 || rep.Results[0].Rule != "engine/config" ||
			!strings.HasPrefix(rep.Results[0].Message, "[engine/config] Config") {
			t.Errorf("config %+v: report %+v", cfg, rep)
		}
	}
}

func TestSkipAndOnly(t *testing.T) {
	cfg := certConfig()
	cfg.Only = []string{"control/round-trip", "control/order", "control/no-goroutine-leak"}
	cfg.Skip = []string{"control/order"}
	rep := conformance.CheckControlChannel(inprocSet, cfg)
	if !rep.Passed() || rep.Subject != "inproc" || rep.Kind != "control" {
		t.Fatalf("report %v", rep)
	}
	want := map[string]conformance.Outcome{
		"control/round-trip":        conformance.Pass,
		"control/order":             conformance.Skip,
		"control/close":             conformance.Skip,
		"control/no-goroutine-leak": conformance.Pass,
	}
	for id, o := range want {
		if r, ok := rep.Result(id); !ok || r.Outcome != o {
			t.Errorf("%s: %+v, want %s", id, r, o)
		}
	}
	if r, _ := rep.Result("control/order"); !strings.Contains(r.Message, "Config.Skip") {
		t.Errorf("control/order skipped with %q", r.Message)
	}
}

func TestFixtureErrorsFailRules(t *testing.T) {
	cfg := certConfig()
	cfg.Only = []string{"gather/byte-exact"}
	rep := conformance.CheckGatherer(func() (conformance.GathererFixture, error) {
		return conformance.GathererFixture{}, nil
	}, cfg)
	r, _ := rep.Result("gather/byte-exact")
	if r.Outcome != conformance.Fail || !strings.Contains(r.Message, "[gather/byte-exact] fixture: GathererFixture.Gatherer or Register is nil") {
		t.Errorf("result %+v", r)
	}
}
