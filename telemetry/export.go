package telemetry

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Bounds on trace export: a collector that is down or slow never slows the
// job. Spans are exported asynchronously by the batcher; each export is cut
// after DefaultExportTimeout (ExportTimeoutFailing once one failed, until
// one succeeds again), and shutting down flushes for at most
// DefaultFlushTimeout.
const (
	DefaultExportTimeout = 2 * time.Second
	ExportTimeoutFailing = 250 * time.Millisecond
	DefaultFlushTimeout  = time.Second
)

// guardedExporter bounds every export of exp and keeps its failures out of
// the OpenTelemetry error handler (raw log lines on stderr): the first
// failure is one warning in the process's log, later ones are counted.
type guardedExporter struct {
	exp      sdktrace.SpanExporter
	log      *slog.Logger
	endpoint string
	timeout  time.Duration // per export while the collector answers
	failing  time.Duration // per export once one failed
	flush    time.Duration // exporter shutdown

	down    atomic.Bool
	warned  atomic.Bool
	dropped atomic.Uint64
}

// ExportSpans exports spans within the bound; a failure drops them and
// returns nil (the batcher would hand it to the global error handler).
func (g *guardedExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	bound := g.timeout
	if g.down.Load() {
		bound = g.failing
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if err := g.exp.ExportSpans(ctx, spans); err != nil {
		n := g.dropped.Add(uint64(len(spans)))
		g.down.Store(true)
		if !g.warned.Swap(true) {
			g.log.Warn("telemetry: trace export failed; spans are dropped while the collector does not answer (the transfers are not slowed)",
				"endpoint", g.endpoint, "err", err, "dropped", n)
		}
		return nil
	}
	if g.down.Swap(false) {
		g.log.Info("telemetry: trace export works again", "endpoint", g.endpoint, "dropped_total", g.dropped.Load())
	}
	return nil
}

// Shutdown stops exp within the flush bound.
func (g *guardedExporter) Shutdown(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, g.flush)
	defer cancel()
	_ = g.exp.Shutdown(ctx) // a collector that is down is not the caller's failure
	return nil
}

// Dropped returns how many spans failed to export.
func (g *guardedExporter) Dropped() uint64 { return g.dropped.Load() }
