package conformance

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Outcome is the result of one rule.
type Outcome string

// Outcomes of a rule.
const (
	Pass Outcome = "pass"
	Fail Outcome = "fail"
	Skip Outcome = "skip"
)

// Result is the outcome of one rule. Message starts with the rule ID in
// brackets and says what failed or why the rule was skipped; it is empty or
// a short note for a pass.
type Result struct {
	Rule     string
	Outcome  Outcome
	Message  string
	Duration time.Duration
}

// Report is the outcome of one suite run: Kind is "engine", "control",
// "gather", "scatter" or "writer"; Subject names the implementation; Seed
// is the Config.Seed that reproduces the run. Results are in rule order,
// the kind's no-goroutine-leak rule last.
type Report struct {
	Kind    string
	Subject string
	Seed    int64
	Results []Result
	// Absent names the optional capabilities the subject was found to
	// lack ("transfer.Fencer", "RouteCosts", ...), as whoever built the
	// fixtures inspected it (package certify does); nil when nobody did.
	Absent []string
}

// Passed reports whether no rule failed (skipped rules do not count).
func (r Report) Passed() bool {
	for _, res := range r.Results {
		if res.Outcome == Fail {
			return false
		}
	}
	return true
}

// Result returns the result of rule id, if the report has one.
func (r Report) Result(id string) (Result, bool) {
	for _, res := range r.Results {
		if res.Rule == id {
			return res, true
		}
	}
	return Result{}, false
}

// Failures returns the failed results in rule order.
func (r Report) Failures() []Result {
	var out []Result
	for _, res := range r.Results {
		if res.Outcome == Fail {
			out = append(out, res)
		}
	}
	return out
}

func (r Report) counts() (pass, fail, skip int, total time.Duration) {
	for _, res := range r.Results {
		switch res.Outcome {
		case Pass:
			pass++
		case Fail:
			fail++
		case Skip:
			skip++
		}
		total += res.Duration
	}
	return
}

// String summarizes the report in one line.
func (r Report) String() string {
	p, f, s, d := r.counts()
	verdict := "PASS"
	if f > 0 {
		verdict = "FAIL"
	}
	return fmt.Sprintf("%s %s conformance of %s: %d passed, %d failed, %d skipped in %v",
		verdict, r.Kind, r.Subject, p, f, s, d.Round(time.Millisecond))
}

// WriteText writes a table of rule, result and time, then the message of
// every failed rule, the reason of every skipped one, the note of every
// passing rule that has one (what it could not exercise, what it fell back
// to) and the summary line.
func (r Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RULE\tRESULT\tTIME")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%v\n", res.Rule, strings.ToUpper(string(res.Outcome)), res.Duration.Round(time.Millisecond))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for _, res := range r.Results {
		if res.Outcome == Fail {
			b.WriteString("\n" + res.Message + "\n")
		}
	}
	sep := "\n"
	for _, res := range r.Results {
		if res.Outcome == Skip {
			b.WriteString(sep + res.Message + "\n")
			sep = ""
		}
	}
	sep = "\n"
	for _, res := range r.Results {
		if res.Outcome == Pass && res.Message != "" {
			b.WriteString(sep + "note: " + res.Message + "\n")
			sep = ""
		}
	}
	b.WriteString("\n" + r.String() + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

type jsonResult struct {
	Rule    string  `json:"rule"`
	Outcome Outcome `json:"outcome"`
	Message string  `json:"message,omitempty"`
	Seconds float64 `json:"seconds"`
}

type jsonReport struct {
	Kind    string       `json:"kind"`
	Subject string       `json:"subject"`
	Seed    int64        `json:"seed"`
	Passed  bool         `json:"passed"`
	Absent  []string     `json:"absent,omitempty"`
	Results []jsonResult `json:"results"`
}

// WriteJSON writes the report as one indented JSON object with fields kind,
// subject, seed, passed, absent (the optional capabilities found absent,
// when any) and results (rule, outcome, message, seconds).
func (r Report) WriteJSON(w io.Writer) error {
	out := jsonReport{Kind: r.Kind, Subject: r.Subject, Seed: r.Seed, Passed: r.Passed(), Absent: r.Absent, Results: []jsonResult{}}
	for _, res := range r.Results {
		out.Results = append(out.Results, jsonResult{res.Rule, res.Outcome, res.Message, res.Duration.Seconds()})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

type junitSuites struct {
	XMLName xml.Name   `xml:"testsuites"`
	Suites  []junitSet `xml:"testsuite"`
}

type junitSet struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string      `xml:"name,attr"`
	Classname string      `xml:"classname,attr"`
	Time      string      `xml:"time,attr"`
	Failure   *junitIssue `xml:"failure,omitempty"`
	Skipped   *junitIssue `xml:"skipped,omitempty"`
}

type junitIssue struct {
	Message string `xml:"message,attr"`
	Body    string `xml:",chardata"`
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// WriteJUnit writes the report as JUnit XML: one testsuite named after the
// kind and subject, one testcase per rule.
func (r Report) WriteJUnit(w io.Writer) error {
	_, f, s, d := r.counts()
	set := junitSet{
		Name:     fmt.Sprintf("bounce conformance %s (%s)", r.Kind, r.Subject),
		Tests:    len(r.Results),
		Failures: f,
		Skipped:  s,
		Time:     seconds(d),
	}
	for _, res := range r.Results {
		c := junitCase{Name: res.Rule, Classname: "conformance." + r.Kind, Time: seconds(res.Duration)}
		first, _, _ := strings.Cut(res.Message, "\n")
		switch res.Outcome {
		case Fail:
			c.Failure = &junitIssue{Message: first, Body: res.Message}
		case Skip:
			c.Skipped = &junitIssue{Message: first}
		}
		set.Cases = append(set.Cases, c)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSet{set}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}
