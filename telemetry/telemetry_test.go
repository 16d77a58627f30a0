package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/bouncekv/bounce/config"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestServiceNamePrecedence(t *testing.T) {
	cases := []struct {
		cfg, env, want string
	}{
		{"", "", DefaultServiceName},
		{"", "from-env", "from-env"},
		{"from-config", "from-env", "from-config"},
	}
	for _, c := range cases {
		got := ServiceName(config.TelemetryConfig{ServiceName: c.cfg}, env(map[string]string{"OTEL_SERVICE_NAME": c.env}))
		if got != c.want {
			t.Errorf("config %q, OTEL_SERVICE_NAME %q: %q, want %q", c.cfg, c.env, got, c.want)
		}
	}
}

// Off (the defaults) means the no-op providers: components start no span.
func TestOffIsNoop(t *testing.T) {
	p, err := New(context.Background(), config.Default().Telemetry, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.TracerProvider.(tracenoop.TracerProvider); !ok {
		t.Errorf("tracer provider %T, want the no-op one", p.TracerProvider)
	}
	if _, ok := p.MeterProvider.(noop.MeterProvider); !ok {
		t.Errorf("meter provider %T, want the no-op one", p.MeterProvider)
	}
	if p.MetricsAddr() != "" {
		t.Errorf("metrics served at %q with no listen address", p.MetricsAddr())
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// telemetry.traces=stdout exports every span, with the resource's service
// name and instance, when Shutdown flushes.
func TestStdoutExportsOnShutdown(t *testing.T) {
	cfg := config.Default().Telemetry
	cfg.Traces, cfg.ServiceName = "stdout", "svc"
	var out bytes.Buffer
	p, err := New(context.Background(), cfg, Options{Instance: "agent-1", Stdout: &out, Getenv: env(nil)})
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.TracerProvider.Tracer("t").Start(context.Background(), "op")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	var got struct {
		Name     string
		Resource []struct {
			Key   string
			Value struct{ Value any }
		}
	}
	if err := json.NewDecoder(&out).Decode(&got); err != nil {
		t.Fatalf("stdout output %q: %v", out.String(), err)
	}
	res := map[string]any{}
	for _, kv := range got.Resource {
		res[kv.Key] = kv.Value.Value
	}
	if got.Name != "op" || res["service.name"] != "svc" || res["service.instance.id"] != "agent-1" {
		t.Fatalf("span %q with resource %v", got.Name, res)
	}
}

// The configured ratio is the sampler unless OTEL_TRACES_SAMPLER names one:
// ratio 0 samples nothing new, but OTEL_TRACES_SAMPLER=always_on wins.
func TestSamplerHonoursEnvironment(t *testing.T) {
	for _, c := range []struct {
		name    string
		env     map[string]string
		sampled bool
	}{
		{"ratio 0", nil, false},
		{"OTEL_TRACES_SAMPLER wins", map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.Default().Telemetry
			cfg.Traces, cfg.SampleRatio = "stdout", 0
			for k, v := range c.env {
				t.Setenv(k, v) // the SDK reads the sampler variables itself
			}
			p, err := New(context.Background(), cfg, Options{Stdout: io.Discard, Getenv: env(c.env)})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Shutdown(context.Background())
			_, span := p.TracerProvider.Tracer("t").Start(context.Background(), "op")
			defer span.End()
			if span.SpanContext().IsSampled() != c.sampled {
				t.Fatalf("sampled = %v, want %v", span.SpanContext().IsSampled(), c.sampled)
			}
		})
	}
}

// A parent-based sampler follows a sampled parent even at ratio 0, so a
// receiver joins every trace its sender samples.
func TestSamplerFollowsSampledParent(t *testing.T) {
	cfg := config.Default().Telemetry
	cfg.Traces, cfg.SampleRatio = "stdout", 0
	p, err := New(context.Background(), cfg, Options{Stdout: io.Discard, Getenv: env(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: [16]byte{1}, SpanID: [8]byte{2}, TraceFlags: trace.FlagsSampled, Remote: true})
	_, span := p.TracerProvider.Tracer("t").Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "op")
	defer span.End()
	if !span.SpanContext().IsSampled() || span.SpanContext().TraceID() != parent.TraceID() {
		t.Fatalf("child of a sampled parent: %v", span.SpanContext())
	}
}

func TestMetricsEndpoint(t *testing.T) {
	cfg := config.Default().Telemetry
	cfg.MetricsListen, cfg.ServiceName = "127.0.0.1:0", "m"
	p, err := New(context.Background(), cfg, Options{Getenv: env(nil)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.MeterProvider.Meter("x").Int64Counter("bounce.test.things")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 3)
	resp, err := http.Get("http://" + p.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "bounce_test_things_total 3") || !strings.Contains(string(body), `service_name="m"`) || !strings.Contains(string(body), "bounce_build_info{") {
		t.Fatalf("exposition lacks the counter, the service or the build info:\n%s", body)
	}
	if strings.Contains(string(body), "otel_scope") {
		t.Fatalf("series carry otel_scope_* labels:\n%s", body)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + p.MetricsAddr() + "/metrics"); err == nil {
		t.Fatal("the endpoint still answers after Shutdown")
	}
	// A taken address is an error naming the key.
	cfg.MetricsListen = "256.0.0.1:1"
	if _, err := New(context.Background(), cfg, Options{Getenv: env(nil)}); err == nil || !strings.Contains(err.Error(), "telemetry.metrics.listen") {
		t.Fatalf("bad listen address: %v", err)
	}
}

func TestInvalidConfigIsAnError(t *testing.T) {
	cfg := config.Default().Telemetry
	cfg.Traces = "jaeger"
	if _, err := New(context.Background(), cfg, Options{}); err == nil || !strings.Contains(err.Error(), "telemetry.traces") {
		t.Fatalf("traces=jaeger: %v", err)
	}
	cfg = config.Default().Telemetry
	cfg.Traces = "otlp"
	if _, err := New(context.Background(), cfg, Options{Getenv: env(map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})}); err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Fatalf("unknown protocol: %v", err)
	}
}

// Records logged with a span's context carry its ids; others do not, and
// derived handlers keep the wrapper.
func TestLogHandlerAddsTraceIDs(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(LogHandler(slog.NewJSONHandler(&out, nil))).With("agent", "a")
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("t").Start(context.Background(), "op")
	log.InfoContext(ctx, "traced")
	log.Info("untraced")
	span.End()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("log output %q", out.String())
	}
	var traced, untraced map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &traced); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &untraced); err != nil {
		t.Fatal(err)
	}
	if traced["trace_id"] != span.SpanContext().TraceID().String() || traced["span_id"] != span.SpanContext().SpanID().String() || traced["agent"] != "a" {
		t.Errorf("traced record %v, want trace %s span %s", traced, span.SpanContext().TraceID(), span.SpanContext().SpanID())
	}
	if _, ok := untraced["trace_id"]; ok {
		t.Errorf("untraced record %v carries a trace id", untraced)
	}
}
