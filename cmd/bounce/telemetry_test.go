package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

var (
	jaegerOnce sync.Once
	jaegerPath string
	jaegerErr  error
)

// jaegerBinary returns a Jaeger all-in-one binary: $JAEGER_BINARY (make
// test builds it first), else one this test builds from tools/jaeger into
// the user cache (about 3 minutes and 2.2 GB the first time, reused after).
// It never skips silently: only -short skips, saying so.
func jaegerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("JAEGER_BINARY"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("JAEGER_BINARY=%s: %v (run `make jaeger-bin`)", p, err)
		}
		return p
	}
	if testing.Short() {
		t.Skip("SKIPPED: the Jaeger end-to-end test needs a Jaeger binary; -short does not build one (set JAEGER_BINARY or run `make test`)")
	}
	jaegerOnce.Do(func() {
		dir, err := os.UserCacheDir()
		if err != nil {
			dir = os.TempDir()
		}
		jaegerPath = filepath.Join(dir, "bounce", "jaeger-v1.76.0")
		if _, err := os.Stat(jaegerPath); err == nil {
			return
		}
		t.Logf("building Jaeger into %s (first time: minutes)", jaegerPath)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", jaegerPath, "github.com/jaegertracing/jaeger/cmd/jaeger")
		cmd.Dir = filepath.Join("..", "..", "tools", "jaeger")
		if out, err := cmd.CombinedOutput(); err != nil {
			jaegerErr = fmt.Errorf("%v: %s", err, out)
		}
	})
	if jaegerErr != nil {
		t.Fatalf("build Jaeger: %v", jaegerErr)
	}
	return jaegerPath
}

// freePorts returns n distinct free loopback ports.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

// jaeger is a running Jaeger process on loopback ports of its own.
type jaeger struct {
	otlp, query string
}

func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	bin := jaegerBinary(t)
	ports := freePorts(t, 4)
	j := &jaeger{otlp: ports[0], query: ports[2]}
	cmd := exec.Command(bin, "--config", filepath.Join("..", "..", "tools", "jaeger", "loopback.yaml"))
	cmd.Env = append(os.Environ(), "JAEGER_OTLP_GRPC="+ports[0], "JAEGER_OTLP_HTTP="+ports[1], "JAEGER_QUERY_HTTP="+ports[2], "JAEGER_QUERY_GRPC="+ports[3])
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("jaeger output:\n%s", logs.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + j.query + "/api/services")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return j
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jaeger's query API never came up on %s: %v\n%s", j.query, err, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// jaegerTrace is the part of Jaeger's /api/traces answer the test reads.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		ProcessID     string `json:"processID"`
		References    []struct {
			RefType string `json:"refType"`
			TraceID string `json:"traceID"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		Tags []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

func (j *jaeger) traces(t *testing.T, service, operation string) []jaegerTrace {
	t.Helper()
	q := url.Values{"service": {service}, "operation": {operation}, "limit": {"20"}, "lookback": {"1h"}}
	resp, err := http.Get("http://" + j.query + "/api/traces?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []jaegerTrace `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("decode /api/traces: %v", err)
	}
	return body.Data
}

// TestTraceInJaeger is the end-to-end trace: `bounce run` (a sender and a
// receiver in two processes) exports over OTLP to a real Jaeger, found
// through OTEL_EXPORTER_OTLP_ENDPOINT and named by OTEL_SERVICE_NAME, and
// Jaeger's API holds one trace with the spans of both services, the
// expected operations and the parent links between them.
func TestTraceInJaeger(t *testing.T) {
	j := startJaeger(t)
	svc := fmt.Sprintf("e2e%d", os.Getpid())
	// The collector and the service name come from the standard OTEL_*
	// variables, which both processes read (the receiver inherits them).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, cliBinary(t), "run", "--workload", "llama70b-tp8-b16", "--count", "4096", "--requests", "1",
		"--compare=false", "--warm-up=false", "--telemetry.traces", "otlp")
	run.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=http://"+j.otlp, "OTEL_SERVICE_NAME="+svc)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("bounce run: %v\n%s", err, out)
	}
	send, recv := svc+"-send", svc+"-recv"
	var traces []jaegerTrace
	deadline := time.Now().Add(30 * time.Second)
	for {
		traces = j.traces(t, send, "bounce.transfer")
		if len(traces) == 1 && len(traces[0].Processes) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Jaeger has %d traces of %s/bounce.transfer (want 1 holding both services): %+v", len(traces), send, traces)
		}
		time.Sleep(200 * time.Millisecond)
	}
	tr := traces[0]
	services := map[string]string{} // process id -> service
	for id, p := range tr.Processes {
		services[id] = p.ServiceName
	}
	ops := map[string]map[string]int{send: {}, recv: {}}
	byID := map[string]string{} // span id -> operation
	for _, s := range tr.Spans {
		svcName := services[s.ProcessID]
		if ops[svcName] == nil {
			t.Fatalf("span %s from unexpected service %q", s.OperationName, svcName)
		}
		ops[svcName][s.OperationName]++
		byID[s.SpanID] = svcName + "/" + s.OperationName
	}
	chunks := ops[send]["bounce.chunk"]
	if chunks < 2 {
		t.Fatalf("%d chunk spans, want at least 2 (%v)", chunks, ops)
	}
	for _, op := range []string{"bounce.gather", "bounce.write", "bounce.data.send", "bounce.ack.wait"} {
		if ops[send][op] != chunks {
			t.Errorf("%s: %d %s spans, want one per chunk (%d)", send, ops[send][op], op, chunks)
		}
	}
	if ops[send]["bounce.transfer"] != 1 || ops[recv]["bounce.receive"] != 1 {
		t.Errorf("operations %v: want one bounce.transfer and one bounce.receive", ops)
	}
	for _, op := range []string{"bounce.grant.wait", "bounce.scatter"} {
		if ops[recv][op] != chunks {
			t.Errorf("%s: %d %s spans, want one per chunk (%d)", recv, ops[recv][op], op, chunks)
		}
	}
	// Parent links, as Jaeger shows them.
	wantParent := map[string]string{
		send + "/bounce.chunk":      send + "/bounce.transfer",
		send + "/bounce.gather":     send + "/bounce.chunk",
		send + "/bounce.write":      send + "/bounce.chunk",
		recv + "/bounce.receive":    send + "/bounce.transfer",
		recv + "/bounce.grant.wait": recv + "/bounce.receive",
		recv + "/bounce.scatter":    send + "/bounce.chunk",
	}
	for _, s := range tr.Spans {
		name := byID[s.SpanID]
		want, ok := wantParent[name]
		if !ok {
			continue
		}
		var parent string
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" && r.TraceID == tr.TraceID {
				parent = byID[r.SpanID]
			}
		}
		if parent != want {
			t.Errorf("%s: parent %q, want %q", name, parent, want)
		}
	}
	// The peer's address on both sides: the sender's transfer names the
	// receiver's control endpoint on loopback, the receiver's span the
	// sender's.
	for _, s := range tr.Spans {
		name := byID[s.SpanID]
		if name != send+"/bounce.transfer" && name != recv+"/bounce.receive" {
			continue
		}
		tags := map[string]any{}
		for _, kv := range s.Tags {
			tags[kv.Key] = kv.Value
		}
		if tags["network.peer.address"] != "127.0.0.1" || tags["network.peer.port"] == nil || tags["bounce.peer.endpoint"] == nil {
			t.Errorf("%s: peer address tags %v", name, tags)
		}
	}
}

// TestPrometheusEndpoint scrapes a running `bounce serve` after a transfer
// and parses the exposition with the Prometheus text parser.
func TestPrometheusEndpoint(t *testing.T) {
	dir := t.TempDir()
	desc := filepath.Join(dir, "recv.json")
	work := []string{"--workload", "llama70b-tp8-b16", "--count", "4096", "--requests", "1", "--bounce.cost-model=false"} // the bounce path, by the gates
	keyFile, allow := senderKey(t, dir, "send")
	h, _ := serveMetrics(t, desc, "--agent.name", "recv", "--buffer-size", "64MiB", "--security.allowed-peers", allow,
		"--control-plane.bind-address", "127.0.0.1", "--telemetry.service-name", "scrape")
	out, errOut, code := bounce(t, append([]string{"send", "--peer", desc, "--agent.name", "send", "--security.key-file", keyFile, "--control-plane.bind-address", "127.0.0.1"}, work...)...)
	if code != 0 {
		t.Fatalf("send exit %d\n%s\n%s", code, out, errOut)
	}
	families := scrape(t, h.Metrics)
	gauge := func(name string, labels map[string]string) (float64, bool) {
		f, ok := families[name]
		if !ok {
			return 0, false
		}
		for _, m := range f.GetMetric() {
			if matches(m, labels) {
				if f.GetType() == dto.MetricType_GAUGE {
					return m.GetGauge().GetValue(), true
				}
				return m.GetCounter().GetValue(), true
			}
		}
		return 0, false
	}
	var total float64
	for _, state := range []string{"free", "held", "staging", "orphan", "quarantined"} {
		v, ok := gauge("bounce_arena_bytes", map[string]string{"bounce_state": state})
		if !ok {
			t.Fatalf("no bounce_arena_bytes{bounce_state=%q} in %v", state, names(families))
		}
		total += v
	}
	if total != 256<<20 {
		t.Errorf("arena bytes by state sum to %v, want the 256 MiB arena", total)
	}
	if v, ok := gauge("bounce_control_dropped_total", nil); !ok || v != 0 {
		t.Errorf("bounce_control_dropped_total = %v (present %v), want 0", v, ok)
	}
	if f := families["bounce_control_dropped_total"]; f != nil && f.GetType() != dto.MetricType_COUNTER {
		t.Errorf("bounce_control_dropped_total is a %v", f.GetType())
	}
	if v, ok := gauge("target_info", map[string]string{"service_name": "scrape", "service_instance_id": "recv"}); !ok || v != 1 {
		t.Errorf("target_info for service scrape/recv: %v %v (%v)", v, ok, names(families))
	}
	// The receiver's own series: what landed (the warm-up and the
	// request, 16 MiB each), how long receiving and scattering took, the
	// build, and no otel_scope_* label anywhere.
	const reqBytes = 4096 * 4096
	if v, ok := gauge("bounce_received_bytes_total", map[string]string{"bounce_route": "bounce"}); !ok || v < reqBytes || int64(v)%reqBytes != 0 {
		t.Errorf("bounce_received_bytes_total{bounce_route=bounce} = %v (present %v), want a positive multiple of %d", v, ok, reqBytes)
	}
	if v, ok := gauge("bounce_received_requests_total", map[string]string{"bounce_route": "bounce", "bounce_outcome": "success"}); !ok || v < 1 {
		t.Errorf("bounce_received_requests_total{bounce,success} = %v (present %v)", v, ok)
	}
	for _, h := range []string{"bounce_receive_duration_seconds", "bounce_scatter_duration_seconds"} {
		f := families[h]
		if f == nil || f.GetType() != dto.MetricType_HISTOGRAM || len(f.GetMetric()) == 0 || f.GetMetric()[0].GetHistogram().GetSampleCount() < 1 {
			t.Errorf("%s: %v", h, f)
			continue
		}
		var bounds []float64
		for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		for _, want := range []float64{1, 1.25, 1.5, 1.75, 2, 2.25, 2.5} {
			if !slices.Contains(bounds, want) {
				t.Errorf("%s has no bucket at %v s (buckets %v): a p99 between 1 and 2.5 s must be read to 0.25 s", h, want, bounds)
			}
		}
	}
	if v, ok := gauge("bounce_build_info", nil); !ok || v != 1 {
		t.Errorf("bounce_build_info = %v (present %v)", v, ok)
	}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.HasPrefix(l.GetName(), "otel_scope") {
					t.Fatalf("%s carries %s=%q: the scope labels are dropped", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
}

func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	return families
}

func matches(m *dto.Metric, labels map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range labels {
		if have[k] != v {
			return false
		}
	}
	return true
}

func names(f map[string]*dto.MetricFamily) []string {
	var out []string
	for n := range f {
		if strings.HasPrefix(n, "bounce") || n == "target_info" {
			out = append(out, n)
		}
	}
	return out
}

// TestRefusedSenderLearnsWhy: a sender whose key the receiver does not
// admit (its allowed_peers lists another key) fails at once with the
// likely cause, not after request_timeout: the request timeout here is 10
// minutes, so only the refusal can end the send. The receiver counts the
// refused connection in bounce_peer_refused_total.
func TestRefusedSenderLearnsWhy(t *testing.T) {
	dir := t.TempDir()
	desc := filepath.Join(dir, "recv.json")
	keyFile, _ := senderKey(t, dir, "send")
	_, other := senderKey(t, dir, "someone-else")
	h, _ := serveMetrics(t, desc, "--agent.name", "recv", "--buffer-size", "64MiB", "--security.allowed-peers", other,
		"--control-plane.bind-address", "127.0.0.1")
	start := time.Now()
	out, errOut, code := bounce(t, "send", "--peer", desc, "--agent.name", "send", "--security.key-file", keyFile, "--control-plane.bind-address", "127.0.0.1",
		"--route", "bounce", "--bounce.request-timeout", "10m", "--workload", "llama70b-tp8-b16", "--count", "4096", "--requests", "2")
	took := time.Since(start)
	if code != exitFailed || !strings.Contains(out+errOut, "security.allowed_peers") || !strings.Contains(out+errOut, `"recv" refused`) || strings.Contains(out+errOut, "timed out") {
		t.Fatalf("send: exit %d after %v\n%s\n%s\nwant exit 1 naming the refusal and security.allowed_peers", code, took, out, errOut)
	}
	t.Logf("refused send failed after %v:\n%s", took.Round(time.Millisecond), errOut)
	families := scrape(t, h.Metrics)
	var refused float64
	if f := families["bounce_peer_refused_total"]; f != nil {
		for _, m := range f.GetMetric() {
			if matches(m, map[string]string{"bounce_layer": "control", "bounce_reason": "not_admitted"}) {
				refused = m.GetCounter().GetValue()
			}
		}
	}
	if refused < 1 {
		t.Fatalf("bounce_peer_refused_total{bounce_layer=control,bounce_reason=not_admitted} = %v, want at least 1 (%v)", refused, names(families))
	}
}

// TestDeadTraceEndpoint: `run` exporting traces to an endpoint nothing
// listens on moves and verifies everything as without traces, and its
// stderr holds one warning per process (sender, receiver child) in the
// tool's log format and no raw Go log line from the exporter. Each
// request's trace id is printed and written to --json.
func TestDeadTraceEndpoint(t *testing.T) {
	js := filepath.Join(t.TempDir(), "run.json")
	out, errOut, code := bounce(t, "run", "--telemetry.traces", "otlp", "--telemetry.otlp-endpoint", closedPort(t),
		"--workload", "llama70b-tp8-b16", "--count", "1024", "--json", js)
	if code != 0 || !strings.Contains(out, "every byte verified") {
		t.Fatalf("run: exit %d\n%s\n%s", code, out, errOut)
	}
	if n := strings.Count(errOut, "trace export failed"); n < 1 || n > 2 {
		t.Fatalf("%d export warnings, want one per process:\n%s", n, errOut)
	}
	if raw := regexp.MustCompile(`(?m)^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d `).FindString(errOut); raw != "" {
		t.Fatalf("a raw Go log line on stderr (%q):\n%s", raw, errOut)
	}
	if n := len(regexp.MustCompile(`(?m)^trace (bounce|direct|auto.*) req-0 [0-9a-f]{32}$`).FindAllString(out, -1)); n != 3 {
		t.Fatalf("%d trace lines for req-0, want one per route (auto, bounce, direct):\n%s", n, out)
	}
	raw, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Rows []struct {
			Traces []struct {
				Tag     string `json:"tag"`
				TraceID string `json:"trace_id"`
			} `json:"traces"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || len(doc.Rows) == 0 {
		t.Fatalf("--json: %v\n%s", err, raw)
	}
	for _, r := range doc.Rows {
		if len(r.Traces) != 1 || r.Traces[0].Tag != "req-0" || len(r.Traces[0].TraceID) != 32 {
			t.Fatalf("--json row traces %+v, want req-0 with its trace id", r.Traces)
		}
	}
}

// serveMetrics is startServe with the metrics endpoint on a free loopback
// port: it returns serve's descriptor line, which names that address, and
// its stderr.
func serveMetrics(t *testing.T, desc string, args ...string) (hello, *syncBuffer) {
	t.Helper()
	serr := startServe(t, desc, append(args, "--telemetry.metrics.listen", "127.0.0.1:0")...)
	raw, err := os.ReadFile(desc)
	if err != nil {
		t.Fatal(err)
	}
	var h hello
	if err := json.Unmarshal(raw, &h); err != nil || h.Metrics == "" {
		t.Fatalf("descriptor line %s: %v (want a metrics address)", raw, err)
	}
	return h, serr
}
