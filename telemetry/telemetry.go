// Package telemetry builds the OpenTelemetry providers a bounce process
// uses from its configuration: a TracerProvider exporting over OTLP (gRPC
// or HTTP) or to stdout, a MeterProvider read by a Prometheus endpoint, and
// the W3C propagator. Components never reach for the otel globals
// themselves: the providers are injected through their Settings.
//
// The standard OpenTelemetry environment variables keep their meaning:
// OTEL_EXPORTER_OTLP_* configure the exporter wherever the configuration
// leaves a value empty, OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES the
// resource, and OTEL_TRACES_SAMPLER (with OTEL_TRACES_SAMPLER_ARG), when
// set, replaces the configured parent-based ratio sampler.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	promexp "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/bouncekv/bounce/config"
)

// DefaultServiceName names the service when neither telemetry.service_name
// nor OTEL_SERVICE_NAME does.
const DefaultServiceName = "bounce"

// DefaultOTLPEndpoint is the collector telemetry.traces=otlp exports to
// when neither telemetry.otlp_endpoint nor an OTEL_EXPORTER_OTLP_*ENDPOINT
// variable names one: a local Jaeger (make jaeger), in plaintext.
const DefaultOTLPEndpoint = "127.0.0.1:4317"

// Options are what New needs besides the configuration.
type Options struct {
	// Instance identifies this process among the service's instances
	// (service.instance.id), normally the agent name.
	Instance string
	// Stdout receives spans when telemetry.traces is stdout; nil means
	// os.Stdout.
	Stdout io.Writer
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
	// Log receives the one warning a failing trace export logs; nil means
	// slog.Default().
	Log *slog.Logger
	// ExportTimeout bounds one trace export while the collector answers;
	// zero means DefaultExportTimeout.
	ExportTimeout time.Duration
}

// Providers are the providers built from the configuration, ready to be
// put in components' Settings. Shutdown flushes and stops them.
type Providers struct {
	// TracerProvider is a no-op provider when telemetry.traces is none.
	TracerProvider trace.TracerProvider
	// MeterProvider is a no-op provider when no metrics endpoint is set.
	MeterProvider metric.MeterProvider
	// Propagator carries W3C trace context and baggage.
	Propagator propagation.TextMapPropagator

	metricsAddr string
	shutdown    []func(context.Context) error
}

// Noop returns providers that record nothing: the components' zero-cost
// setting when telemetry is off.
func Noop() *Providers {
	return &Providers{
		TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider:  metricnoop.NewMeterProvider(),
		Propagator:     propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}
}

// ServiceName resolves the service name: telemetry.service_name, else
// OTEL_SERVICE_NAME, else DefaultServiceName.
func ServiceName(cfg config.TelemetryConfig, getenv func(string) string) string {
	if getenv == nil {
		getenv = os.Getenv
	}
	switch {
	case cfg.ServiceName != "":
		return cfg.ServiceName
	case getenv("OTEL_SERVICE_NAME") != "":
		return getenv("OTEL_SERVICE_NAME")
	}
	return DefaultServiceName
}

// New builds the providers cfg asks for. On error nothing is left running.
func New(ctx context.Context, cfg config.TelemetryConfig, o Options) (*Providers, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	p := Noop()
	if cfg.Traces == "none" && cfg.MetricsListen == "" {
		return p, nil
	}
	res, err := buildResource(ctx, cfg, o)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Providers, error) {
		_ = p.Shutdown(ctx)
		return nil, err
	}
	if cfg.Traces != "none" {
		exp, err := traceExporter(ctx, cfg, o)
		if err != nil {
			return fail(err)
		}
		if o.Log == nil {
			o.Log = slog.Default()
		}
		if o.ExportTimeout <= 0 {
			o.ExportTimeout = DefaultExportTimeout
		}
		g := &guardedExporter{exp: exp, log: o.Log, endpoint: exportEndpoint(cfg, o), timeout: o.ExportTimeout,
			failing: min(ExportTimeoutFailing, o.ExportTimeout), flush: DefaultFlushTimeout}
		opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(g), sdktrace.WithResource(res)}
		if o.Getenv("OTEL_TRACES_SAMPLER") == "" {
			opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))))
		}
		tp := sdktrace.NewTracerProvider(opts...)
		p.TracerProvider = tp
		p.shutdown = append(p.shutdown, func(ctx context.Context) error {
			// The flush waits for exports, each bounded; the whole is
			// bounded too, so a dead collector never holds up the exit.
			ctx, cancel := context.WithTimeout(ctx, o.ExportTimeout+DefaultFlushTimeout)
			defer cancel()
			if err := tp.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			return nil
		})
	}
	if cfg.MetricsListen != "" {
		if err := p.serveMetrics(cfg.MetricsListen, res); err != nil {
			return fail(err)
		}
	}
	return p, nil
}

func buildResource(ctx context.Context, cfg config.TelemetryConfig, o Options) (*resource.Resource, error) {
	// Later sources win: the default name, then OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES, then the configured name.
	attrs := []attribute.KeyValue{attribute.String("service.name", ServiceName(cfg, o.Getenv))}
	if o.Instance != "" {
		attrs = append(attrs, attribute.String("service.instance.id", o.Instance))
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", DefaultServiceName)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attrs...),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}

// exportEndpoint names where spans go, for the export warning.
func exportEndpoint(cfg config.TelemetryConfig, o Options) string {
	switch {
	case cfg.Traces == "stdout":
		return "stdout"
	case cfg.OTLPEndpoint != "":
		return cfg.OTLPEndpoint
	case o.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "":
		return o.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	case o.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "":
		return o.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	return DefaultOTLPEndpoint
}

// traceExporter builds the exporter telemetry.traces names. For otlp the
// protocol is gRPC unless OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL says
// http/protobuf; an endpoint is passed only when the configuration sets
// one or no OTEL_EXPORTER_OTLP_*ENDPOINT variable does, so the variables
// (and their TLS, header and timeout companions) keep their meaning.
func traceExporter(ctx context.Context, cfg config.TelemetryConfig, o Options) (sdktrace.SpanExporter, error) {
	switch cfg.Traces {
	case "stdout":
		w := o.Stdout
		if w == nil {
			w = os.Stdout
		}
		exp, err := stdouttrace.New(stdouttrace.WithWriter(w))
		if err != nil {
			return nil, fmt.Errorf("telemetry: stdout exporter: %w", err)
		}
		return exp, nil
	case "otlp":
	default:
		return nil, fmt.Errorf("telemetry: telemetry.traces %q: accepted none, otlp, stdout", cfg.Traces)
	}
	endpoint := cfg.OTLPEndpoint
	if endpoint == "" && o.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" && o.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		endpoint = DefaultOTLPEndpoint
	}
	proto := o.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = o.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch proto {
	case "", "grpc":
		// No retries: a refused connection fails the export at once (its
		// spans dropped, one warning) instead of retrying up to the bound.
		opts := []otlptracegrpc.Option{otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false})}
		if endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpoint(endpoint), otlptracegrpc.WithInsecure())
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	case "http/protobuf":
		opts := []otlptracehttp.Option{otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false})}
		if cfg.OTLPEndpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpoint(cfg.OTLPEndpoint), otlptracehttp.WithInsecure())
		} else if endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpoint("127.0.0.1:4318"), otlptracehttp.WithInsecure())
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL %q: accepted grpc, http/protobuf", proto)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: otlp exporter: %w", err)
	}
	return exp, nil
}

// serveMetrics starts the Prometheus endpoint: an exporter on a registry
// of its own (no process-global state) served at /metrics.
func (p *Providers) serveMetrics(listen string, res *resource.Resource) error {
	reg := prometheus.NewRegistry()
	// Without the otel_scope_* labels on every series: one instrumentation
	// scope names them all (the bounce_ prefix says the same).
	exp, err := promexp.New(promexp.WithRegisterer(reg), promexp.WithoutScopeInfo())
	if err != nil {
		return fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	p.MeterProvider = mp
	p.shutdown = append(p.shutdown, mp.Shutdown)
	if err := registerBuildInfo(mp); err != nil {
		return fmt.Errorf("telemetry: build info: %w", err)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("telemetry: telemetry.metrics.listen %q: %w", listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	p.metricsAddr = ln.Addr().String()
	p.shutdown = append(p.shutdown, srv.Shutdown)
	return nil
}

// registerBuildInfo adds bounce_build_info: 1, labelled with the main
// module's version, the VCS revision and whether the tree was modified, and
// the Go version, as the binary records them.
func registerBuildInfo(mp metric.MeterProvider) error {
	version, revision, modified, goVersion := "(unknown)", "unknown", "false", runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
	}
	m := mp.Meter("github.com/bouncekv/bounce/telemetry")
	g, err := m.Int64ObservableGauge("bounce.build.info", metric.WithDescription("Always 1; the labels say which build this process runs."))
	if err != nil {
		return err
	}
	attrs := metric.WithAttributes(attribute.String("version", version), attribute.String("revision", revision),
		attribute.String("modified", modified), attribute.String("go_version", goVersion))
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(g, 1, attrs)
		return nil
	}, g)
	return err
}

// MetricsAddr returns the address the Prometheus endpoint listens on (with
// the port the system chose for port 0), or "" when there is none.
func (p *Providers) MetricsAddr() string { return p.metricsAddr }

// Shutdown flushes pending spans and stops the exporters and the metrics
// endpoint, bounded by ctx. It is idempotent.
func (p *Providers) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(p.shutdown) - 1; i >= 0; i-- {
		if err := p.shutdown[i](ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	p.shutdown = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: shutdown: %w", err)
	}
	return nil
}
