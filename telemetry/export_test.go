package telemetry

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/bouncekv/bounce/config"
)

// stuckExporter blocks every export until its context ends (a collector
// that accepts and never answers), recording each context's deadline.
type stuckExporter struct {
	mu        sync.Mutex
	deadlines []time.Duration // deadline minus the call's start
	shutdown  time.Duration
}

func (s *stuckExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	d, ok := ctx.Deadline()
	s.mu.Lock()
	if ok {
		s.deadlines = append(s.deadlines, time.Until(d))
	} else {
		s.deadlines = append(s.deadlines, -1)
	}
	s.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (s *stuckExporter) Shutdown(ctx context.Context) error {
	d, ok := ctx.Deadline()
	if ok {
		s.shutdown = time.Until(d)
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestExportBoundedAndQuiet: every export gets a deadline within its bound
// (the shorter one once an export failed), a failure returns nil to the
// batcher (so nothing reaches OpenTelemetry's error handler, which prints
// raw log lines) and is logged once, in the caller's log, however often it
// repeats; Shutdown is bounded too.
func TestExportBoundedAndQuiet(t *testing.T) {
	var logs bytes.Buffer
	inner := &stuckExporter{}
	g := &guardedExporter{exp: inner, log: slog.New(slog.NewTextHandler(&logs, nil)), endpoint: "127.0.0.1:1",
		timeout: 50 * time.Millisecond, failing: 10 * time.Millisecond, flush: 20 * time.Millisecond}
	for range 3 {
		if err := g.ExportSpans(context.Background(), make([]sdktrace.ReadOnlySpan, 2)); err != nil {
			t.Fatalf("ExportSpans = %v, want nil (the failure is logged, not handed to the batcher)", err)
		}
	}
	if err := g.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(inner.deadlines) != 3 || inner.deadlines[0] <= 0 || inner.deadlines[0] > 50*time.Millisecond ||
		inner.deadlines[1] <= 0 || inner.deadlines[1] > 10*time.Millisecond || inner.deadlines[2] > 10*time.Millisecond {
		t.Fatalf("export deadlines %v: want the first within 50ms, the rest (collector down) within 10ms", inner.deadlines)
	}
	if inner.shutdown <= 0 || inner.shutdown > 20*time.Millisecond {
		t.Fatalf("exporter shutdown deadline %v, want within 20ms", inner.shutdown)
	}
	if n := strings.Count(logs.String(), "trace export failed"); n != 1 || !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "127.0.0.1:1") {
		t.Fatalf("%d warnings, want one naming the endpoint:\n%s", n, logs.String())
	}
	if g.Dropped() != 6 {
		t.Fatalf("dropped %d spans, want 6", g.Dropped())
	}
}

// TestDeadCollectorShutdownBounded: with telemetry.traces otlp at a
// collector that accepts connections and never answers, the providers'
// Shutdown (which flushes) returns within its bounds — well before the
// exporter's own 10 s timeout — and logs one warning.
func TestDeadCollectorShutdownBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	cfg := config.Default().Telemetry
	cfg.Traces, cfg.OTLPEndpoint = "otlp", ln.Addr().String()
	var logs bytes.Buffer
	p, err := New(context.Background(), cfg, Options{Getenv: env(nil), Log: slog.New(slog.NewTextHandler(&logs, nil)), ExportTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.TracerProvider.Tracer("t").Start(context.Background(), "s")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // the hang guard
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("Shutdown ran into the hang guard")
	}
	if n := strings.Count(logs.String(), "trace export failed"); n != 1 {
		t.Fatalf("%d export warnings, want 1:\n%s", n, logs.String())
	}
}
