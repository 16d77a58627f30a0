package pipeline

import (
	"context"
	"encoding/hex"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// instrumentationName names the agent's tracer and meter (its import path).
const instrumentationName = "github.com/bouncekv/bounce/pipeline"

// Kinds names the components an agent was built from (engine kind, control
// plane kind, gather and scatter stage names). They label the agent's spans;
// empty names are left out.
type Kinds struct {
	Engine, Control, Gather, Scatter string
}

// Span names: one per kind of step, never per request or descriptor.
const (
	spanTransfer   = "bounce.transfer"    // sender: submit → resolution
	spanChunk      = "bounce.chunk"       // sender: gather start → ACK
	spanGather     = "bounce.gather"      // sender: the gather op
	spanWrite      = "bounce.write"       // sender: the engine's bulk write
	spanDataSend   = "bounce.data.send"   // sender: DATA marshalled and queued
	spanAckWait    = "bounce.ack.wait"    // sender: DATA sent → ACK
	spanDirectPost = "bounce.direct.post" // sender: the direct path's one engine post
	spanAbandon    = "bounce.abandon"     // caller: Abandon and its outcome
	spanReceive    = "bounce.receive"     // receiver: WANT → the flow's last chunk (bounce), the DONE notice (direct)
	spanGrantWait  = "bounce.grant.wait"  // receiver: WANT → this chunk's credit
	spanScatter    = "bounce.scatter"     // receiver: DATA → scatter done (ACK sent)
)

// Attribute keys.
const (
	attrRoute       = attribute.Key("bounce.route")
	attrReason      = attribute.Key("bounce.route.reason")
	attrReasonText  = attribute.Key("bounce.route.reason_text")
	attrPeer        = attribute.Key("bounce.peer")
	attrTag         = attribute.Key("bounce.tag")
	attrRequest     = attribute.Key("bounce.request")
	attrBytes       = attribute.Key("bounce.bytes")
	attrDescs       = attribute.Key("bounce.descriptors")
	attrChunks      = attribute.Key("bounce.chunks")
	attrRuns        = attribute.Key("bounce.runs")
	attrChunk       = attribute.Key("bounce.chunk")
	attrRegion      = attribute.Key("bounce.region")
	attrEngine      = attribute.Key("bounce.engine")
	attrControl     = attribute.Key("bounce.control_plane")
	attrStage       = attribute.Key("bounce.stage")
	attrOutcome     = attribute.Key("bounce.outcome")
	attrQuiescent   = attribute.Key("bounce.quiescent")
	attrEager       = attribute.Key("bounce.eager")
	attrCode        = attribute.Key("bounce.nack.code")
	attrDirection   = attribute.Key("bounce.direction")
	attrState       = attribute.Key("bounce.state")
	attrErrorType   = attribute.Key("error.type")
	attrFailReason  = attribute.Key("bounce.reason")
	attrLayer       = attribute.Key("bounce.layer")
	attrAbandonWait = attribute.Key("bounce.abandon.timeout_ms")
	// Route auto's prediction of the request on each path, and whether it
	// took the path predicted slower on purpose (to re-measure it).
	attrPredBounce  = attribute.Key("bounce.route.predicted_bounce_ms")
	attrPredDirect  = attribute.Key("bounce.route.predicted_direct_ms")
	attrPredExplore = attribute.Key("bounce.route.explore")
)

// The peer's control endpoint as its descriptor (sender) or its WANT or
// DONE (receiver) gave it, and its host and port when it has them
// (OpenTelemetry's network.peer.*).
const (
	attrPeerEndpoint = attribute.Key("bounce.peer.endpoint")
	attrNetPeerAddr  = attribute.Key("network.peer.address")
	attrNetPeerPort  = attribute.Key("network.peer.port")
)

// Low-cardinality reasons a route was chosen (the bounce.route.reason
// attribute and the routing-decision metric); the batch keeps the text.
const (
	whyDirectRequested  = "direct_requested"
	whyBounceRequested  = "bounce_requested"
	whyLocalOff         = "bounce_off_locally"
	whyPeerNotCapable   = "peer_not_capable"
	whyEmpty            = "empty"
	whyMixedDevices     = "mixed_devices"
	whyMemoryKind       = "memory_kind"        // sources the gather stage cannot read
	whyEngineKind       = "engine_memory_kind" // memory the engine cannot carry: bounce is the only route
	whyFewDescriptors   = "few_descriptors"
	whyLargeDescriptors = "large_descriptors"
	whyEligible         = "eligible"
	whyControlLimit     = "control_message_limit"
	whyCostModel        = "cost_model"
)

// Reasons a peer's input was rejected (bounce.peer.rejections).
const (
	rejectMalformed  = "malformed"
	rejectUnexpected = "unexpected"
	rejectLateData   = "late_data"
	rejectBadWant    = "bad_want"
	rejectBadRuns    = "bad_runs"
	rejectBadCredit  = "bad_credit"
	rejectPull       = "refused_pull"
	// rejectDuplicateWant counts a repeated WANT (dropped, harmless).
	rejectDuplicateWant = "duplicate_want"
)

// errorType names the class of a failure for error.type and the failure
// metric: the transfer sentinel it wraps, else "other".
func errorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrAbandoned):
		return "abandoned"
	case errors.Is(err, ErrRefused):
		return "refused"
	case errors.Is(err, transfer.ErrTimeout):
		return "timeout"
	case errors.Is(err, transfer.ErrPeerLost):
		return "peer_lost"
	case errors.Is(err, transfer.ErrClosed):
		return "closed"
	case errors.Is(err, transfer.ErrDeviceFault):
		return "device_fault"
	case errors.Is(err, transfer.ErrNotQuiescent):
		return "not_quiescent"
	case errors.Is(err, transfer.ErrQueueFull):
		return "queue_full"
	case errors.Is(err, transfer.ErrUnknownPeer):
		return "unknown_peer"
	case errors.Is(err, transfer.ErrOutOfBounds):
		return "out_of_bounds"
	case errors.Is(err, transfer.ErrNotRegistered):
		return "not_registered"
	case errors.Is(err, transfer.ErrBadEndpoint):
		return "bad_endpoint"
	case errors.Is(err, transfer.ErrUnsupported):
		return "unsupported"
	}
	return "other"
}

// ErrRefused is the failure cause of a request the receiver refused with a
// NACK (the error names the code and the receiver's reason), or whose
// receiver refused this agent's control connection (the error names the
// likely cause: this agent's key is not in its security.allowed_peers).
var ErrRefused = errors.New("refused by the receiver")

// wireCarrier is a propagation.TextMapCarrier over a WANT's or DATA's trace
// field: the W3C traceparent, then, when there is one, a newline and the
// tracestate. Other keys (baggage) do not cross the wire.
type wireCarrier struct{ s *string }

// Get returns traceparent or tracestate from the field.
func (c wireCarrier) Get(key string) string {
	tp, ts, _ := strings.Cut(*c.s, "\n")
	switch key {
	case "traceparent":
		return tp
	case "tracestate":
		return ts
	}
	return ""
}

// Set stores traceparent or tracestate in the field.
func (c wireCarrier) Set(key, val string) {
	tp, ts, _ := strings.Cut(*c.s, "\n")
	switch key {
	case "traceparent":
		tp = val
	case "tracestate":
		ts = val
	default:
		return
	}
	if ts == "" {
		*c.s = tp
	} else {
		*c.s = tp + "\n" + ts
	}
}

// Keys lists the keys the field can hold.
func (c wireCarrier) Keys() []string { return []string{"traceparent", "tracestate"} }

// obs is an agent's tracer, propagator and instruments. Every span of a
// request is started and ended on the reactor goroutine, except the batch
// span (started in Submit before the request is posted to the reactor) and
// the abandon span (its own span, on the caller's goroutine).
type obs struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// traced is false when the TracerProvider is the no-op one: then no
	// span is started and the hot path does no tracing work at all.
	traced bool
	kinds  []attribute.KeyValue

	requests, reqBytes, decisions, failures, nacks, rejections metric.Int64Counter
	reqDur, chunkDur                                           metric.Float64Histogram
	// The receiver's: requests received by route and outcome, payload
	// bytes as each chunk lands, receive (WANT → last chunk) and scatter
	// (queued → done) latency.
	recvReqs, recvBytes metric.Int64Counter
	recvDur, scatterDur metric.Float64Histogram
	reg                 metric.Registration

	// Attribute sets built once, so counting a request allocates nothing.
	byOutcome  map[routeOutcomeKey]outcomeOpts
	byDecision map[routeOutcomeKey][]metric.AddOption
}

// routeOutcomeKey is (route, outcome) or (route, reason).
type routeOutcomeKey struct{ route, what string }

type outcomeOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

// batchObs is what a batch carries for telemetry. Set in Submit before the
// batch is posted; afterwards only the reactor touches span (sc is
// immutable and read by Abandon).
type batchObs struct {
	start time.Time
	bytes uint64
	why   string // low-cardinality route reason
	tag   []byte // the caller's tag (Request.Tag), on the batch span
	ctx   context.Context
	span  trace.Span // nil unless the batch span records
	sc    trace.SpanContext

	// peerAt is the peer's address as span attributes (peerAddr), set
	// with the batch span and put on its post and write spans too.
	peerAt []attribute.KeyValue
}

// chunkTrace is the trace state of one chunk on the sender (only while the
// batch span records).
type chunkTrace struct {
	ctx   context.Context // holds the chunk span
	span  trace.Span
	phase time.Time // start of the current gather, write or ACK wait
}

// recvTrace is the receiver's span of one flow.
type recvTrace struct {
	ctx          context.Context
	span         trace.Span
	wantAt       time.Time
	chunks, done int
}

func newObs(a *Agent, s Settings) *obs {
	tp, mp, prop := s.TracerProvider, s.MeterProvider, s.Propagator
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	_, noop := tp.(tracenoop.TracerProvider)
	o := &obs{tracer: tp.Tracer(instrumentationName), prop: prop, traced: !noop}
	for _, kv := range []struct {
		k attribute.Key
		v string
	}{{attrEngine, s.Kinds.Engine}, {attrControl, s.Kinds.Control}, {attribute.Key("bounce.gather"), s.Kinds.Gather}, {attribute.Key("bounce.scatter"), s.Kinds.Scatter}} {
		if kv.v != "" {
			o.kinds = append(o.kinds, kv.k.String(kv.v))
		}
	}
	m := mp.Meter(instrumentationName)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(latencyBuckets()...))
		errs = append(errs, err)
		return h
	}
	o.requests = counter("bounce.requests", "{request}", "Requests resolved, by route and outcome.")
	o.reqBytes = counter("bounce.request.bytes", "By", "Payload bytes of resolved requests, by route and outcome.")
	o.decisions = counter("bounce.route.decisions", "{request}", "Routing decisions, by route and reason.")
	o.failures = counter("bounce.failures", "{request}", "Failed requests by reason (error.type); timeouts are reason timeout.")
	o.nacks = counter("bounce.nacks", "{message}", "NACKs sent and received, by code.")
	o.rejections = counter("bounce.peer.rejections", "{message}", "Bad input rejected, by peer and reason.")
	o.reqDur = hist("bounce.request.duration", "Submit to resolution, by route and outcome.")
	o.recvReqs = counter("bounce.received.requests", "{request}", "Requests this receiver saw end, by route and outcome.")
	o.recvBytes = counter("bounce.received.bytes", "By", "Payload bytes landed here, by route, counted as each chunk lands (bounce) or as the sender's DONE arrives (direct).")
	o.recvDur = hist("bounce.receive.duration", "Receiver: WANT to the request's last chunk scattered, by outcome.")
	o.scatterDur = hist("bounce.scatter.duration", "Receiver: one chunk's scatter, queued to done.")
	o.byOutcome = map[routeOutcomeKey]outcomeOpts{}
	o.byDecision = map[routeOutcomeKey][]metric.AddOption{}
	for _, rt := range []Route{RouteBounce, RouteDirect} {
		for _, out := range []string{"success", "failure"} {
			set := attribute.NewSet(attrRoute.String(rt.String()), attrOutcome.String(out))
			o.byOutcome[routeOutcomeKey{rt.String(), out}] = outcomeOpts{
				add: []metric.AddOption{metric.WithAttributeSet(set)},
				rec: []metric.RecordOption{metric.WithAttributeSet(set)},
			}
		}
		for _, why := range []string{whyDirectRequested, whyBounceRequested, whyLocalOff, whyPeerNotCapable, whyEmpty, whyMixedDevices, whyMemoryKind, whyEngineKind, whyFewDescriptors, whyLargeDescriptors, whyEligible, whyControlLimit, whyCostModel} {
			set := attribute.NewSet(attrRoute.String(rt.String()), attrReason.String(why))
			o.byDecision[routeOutcomeKey{rt.String(), why}] = []metric.AddOption{metric.WithAttributeSet(set)}
		}
	}
	o.chunkDur = hist("bounce.chunk.duration", "Sender chunk latency: gather start to ACK.")

	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	ocounter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	arena := gauge("bounce.arena.bytes", "By", "Arena bytes by state: free, held (by remote flows), staging (local gathers), orphan, quarantined.")
	held := gauge("bounce.credits.held", "By", "Arena bytes granted to each peer's flows.")
	parked := gauge("bounce.requests.parked", "{request}", "Sender requests waiting for arena bytes or copy contexts.")
	active := gauge("bounce.requests.active", "{request}", "Requests in flight, by route.")
	dropped := ocounter("bounce.control.dropped", "{message}", "Control messages that could not be sent.")
	scatterFail := ocounter("bounce.scatter.failures", "{chunk}", "Receiver scatters that failed (no ACK sent).")
	expired := ocounter("bounce.flows.expired", "{flow}", "Receiver flows reclaimed because their sender went silent.")
	refused := ocounter("bounce.peer.refused", "{event}", "Connections and messages refused from peers, by layer (control, engine) and reason (not_admitted: a key not in security.allowed_peers, ...).")
	refusers := refusalSources(s)
	reg, err := m.RegisterCallback(func(ctx context.Context, ob metric.Observer) error {
		st := a.Stats()
		ob.ObserveInt64(dropped, int64(st.SendDrops))
		ob.ObserveInt64(scatterFail, int64(st.ScatterFailures))
		ob.ObserveInt64(expired, int64(st.ExpiredFlows))
		for _, src := range refusers {
			for why, n := range src.c.Refusals() {
				ob.ObserveInt64(refused, int64(n), metric.WithAttributes(attrLayer.String(src.layer), attrFailReason.String(why)))
			}
		}
		snap, ok := a.snapshot(ctx)
		if !ok {
			return nil
		}
		ob.ObserveInt64(arena, int64(snap.arena.FreeBytes), metric.WithAttributes(attrState.String("free")))
		ob.ObserveInt64(arena, int64(snap.arena.HeldBytes), metric.WithAttributes(attrState.String("held")))
		ob.ObserveInt64(arena, int64(snap.arena.LocalBytes), metric.WithAttributes(attrState.String("staging")))
		ob.ObserveInt64(arena, int64(snap.arena.OrphanBytes), metric.WithAttributes(attrState.String("orphan")))
		ob.ObserveInt64(arena, int64(snap.arena.QuarantinedBytes), metric.WithAttributes(attrState.String("quarantined")))
		for peer, n := range snap.held {
			ob.ObserveInt64(held, int64(n), metric.WithAttributes(attrPeer.String(peer)))
		}
		ob.ObserveInt64(parked, int64(snap.parked))
		ob.ObserveInt64(active, int64(snap.bounce), metric.WithAttributes(attrRoute.String("bounce")))
		ob.ObserveInt64(active, int64(snap.direct), metric.WithAttributes(attrRoute.String("direct")))
		return nil
	}, arena, held, parked, active, dropped, scatterFail, expired, refused)
	errs = append(errs, err)
	o.reg = reg
	if err := errors.Join(errs...); err != nil {
		a.log.Warn("some metrics are unavailable", "err", err)
	}
	return o
}

// refusalCounter is the optional capability of a control channel or an
// engine that counts what it refused from peers, by low-cardinality
// reason (zmq's and tcp's Refusals).
type refusalCounter interface {
	Refusals() map[string]uint64
}

type refusalSource struct {
	layer string
	c     refusalCounter
}

// refusalSources are the components of s that count refusals.
func refusalSources(s Settings) []refusalSource {
	var out []refusalSource
	if c, ok := s.Control.(refusalCounter); ok {
		out = append(out, refusalSource{"control", c})
	}
	if c, ok := s.Engine.(refusalCounter); ok {
		out = append(out, refusalSource{"engine", c})
	}
	return out
}

// peerAddr is a peer's control endpoint as span attributes: the endpoint
// itself, and its host and port (network.peer.address, network.peer.port)
// when it is host:port behind an optional scheme:// (zmq's tcp://h:p).
// Nil for an empty endpoint.
func peerAddr(endpoint string) []attribute.KeyValue {
	if endpoint == "" {
		return nil
	}
	kv := []attribute.KeyValue{attrPeerEndpoint.String(endpoint)}
	hp := endpoint
	if _, after, ok := strings.Cut(hp, "://"); ok {
		hp = after
	}
	if host, port, err := net.SplitHostPort(hp); err == nil && host != "" {
		kv = append(kv, attrNetPeerAddr.String(host))
		if p, err := strconv.ParseUint(port, 10, 16); err == nil {
			kv = append(kv, attrNetPeerPort.Int(int(p)))
		}
	}
	return kv
}

// tagText is a request tag as a span attribute: the text when it is
// printable UTF-8, else its hex.
func tagText(tag []byte) string {
	if utf8.Valid(tag) && !strings.ContainsFunc(string(tag), func(r rune) bool { return !unicode.IsPrint(r) }) {
		return string(tag)
	}
	return hex.EncodeToString(tag)
}

// latencyBuckets are the latency histograms' bucket bounds in seconds: 1-2.5-5
// steps up to 0.5 s, then steps of 0.25 s to 3 s (a p99 between 1 and 2.5 s
// is read to within 0.25 s), then coarser to a minute.
func latencyBuckets() []float64 {
	return []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75,
		1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75, 3, 4, 5, 7.5, 10, 15, 20, 30, 60}
}

// bytesLanded counts n payload bytes landed here on route.
func (o *obs) bytesLanded(rt Route, n uint64) {
	if n > 0 {
		o.recvBytes.Add(context.Background(), int64(n), metric.WithAttributes(attrRoute.String(rt.String())))
	}
}

// receivedFlow counts a request that ended here and, when took >= 0, its
// receive latency.
func (o *obs) receivedFlow(rt Route, err error, took time.Duration) {
	out := "success"
	if err != nil {
		out = "failure"
	}
	opts := o.byOutcome[routeOutcomeKey{rt.String(), out}]
	o.recvReqs.Add(context.Background(), 1, opts.add...)
	if took >= 0 {
		o.recvDur.Record(context.Background(), took.Seconds(), opts.rec...)
	}
}

// close unregisters the observable instruments' callback.
func (o *obs) close() {
	if o.reg != nil {
		_ = o.reg.Unregister()
	}
}

// snapshot is the reactor state the observable gauges read.
type snapshot struct {
	arena                  credit.Stats
	held                   map[string]uint64
	parked, bounce, direct int
}

// snapshot asks the reactor for its state; false when the agent stopped or
// ctx ended first.
func (a *Agent) snapshot(ctx context.Context) (snapshot, bool) {
	res := make(chan snapshot, 1)
	select {
	case <-a.stopped:
		return snapshot{}, false
	default:
	}
	a.post(func(r *reactor) {
		s := snapshot{parked: r.parked.len(), bounce: len(r.reqs), direct: len(r.direct)}
		if r.sched != nil {
			s.arena, s.held = r.sched.Stats(), r.sched.HeldByPeer()
		}
		res <- s
	})
	select {
	case s := <-res:
		return s, true
	case <-a.stopped:
	case <-ctx.Done():
	}
	return snapshot{}, false
}

// submitted counts the routing decision and starts the batch span (a child
// of the span in ctx, if any). It runs in Submit, before the batch is
// posted to the reactor.
func (o *obs) submitted(ctx context.Context, b *Batch, peer, endpoint string, descs int, reasonText string) {
	o.decisions.Add(ctx, 1, o.byDecision[routeOutcomeKey{b.route.String(), b.obs.why}]...)
	if !o.traced {
		return
	}
	ctx, span := o.tracer.Start(ctx, spanTransfer, trace.WithSpanKind(trace.SpanKindProducer))
	if !span.IsRecording() {
		// Sampled out: no spans here, but the WANT still carries the
		// context (unsampled), so a parent-based receiver drops it too.
		b.obs.ctx, b.obs.sc = ctx, span.SpanContext()
		return
	}
	span.SetAttributes(attrRoute.String(b.route.String()), attrReason.String(b.obs.why), attrReasonText.String(reasonText),
		attrPeer.String(peer), attrRequest.Int64(int64(b.id)), attrDescs.Int(descs), attrBytes.Int64(int64(b.obs.bytes)))
	span.SetAttributes(o.kinds...)
	b.obs.peerAt = peerAddr(endpoint)
	span.SetAttributes(b.obs.peerAt...)
	if len(b.obs.tag) > 0 {
		span.SetAttributes(attrTag.String(tagText(b.obs.tag)))
	}
	if p := b.pred; p.Made {
		span.SetAttributes(attrPredBounce.Float64(float64(p.Bounce)/float64(time.Millisecond)),
			attrPredDirect.Float64(float64(p.Direct)/float64(time.Millisecond)), attrPredExplore.Bool(p.Explore))
	}
	b.obs.ctx, b.obs.span, b.obs.sc = ctx, span, span.SpanContext()
}

// planned records the plan's shape (its chunks) on the batch
// span.
func (o *obs) planned(b *Batch, p *plan.Plan) {
	if b.obs.span == nil {
		return
	}
	// Runs are emitted chunk by chunk as chunks start (Agent.plan); each
	// chunk's span carries its own count.
	b.obs.span.SetAttributes(attrChunks.Int(len(p.Chunks)))
}

// resolved counts a batch's resolution and ends its span with the
// retirement outcome as an event. It runs on the reactor, once per batch.
func (o *obs) resolved(b *Batch, err error, quiescent bool) {
	ctx := context.Background()
	outcome := "success"
	if err != nil {
		outcome = "failure"
	}
	opts := o.byOutcome[routeOutcomeKey{b.route.String(), outcome}]
	o.requests.Add(ctx, 1, opts.add...)
	o.reqBytes.Add(ctx, int64(b.obs.bytes), opts.add...)
	o.reqDur.Record(ctx, time.Since(b.obs.start).Seconds(), opts.rec...)
	et := errorType(err)
	if err != nil {
		o.failures.Add(ctx, 1, metric.WithAttributes(attrRoute.String(b.route.String()), attrFailReason.String(et)))
	}
	span := b.obs.span
	if span == nil {
		return
	}
	outcome = "done"
	if err != nil {
		outcome = "failed"
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(attrErrorType.String(et))
	}
	span.AddEvent("retired", trace.WithAttributes(attrOutcome.String(outcome), attrQuiescent.Bool(quiescent)))
	span.End()
}

// abandoned records an Abandon call and its outcome as a span of its own
// (the batch span may have ended), a child of the batch span.
func (o *obs) abandoned(b *Batch, timeout time.Duration, start time.Time, out transfer.AbandonOutcome) {
	if !o.traced || !b.obs.sc.IsValid() {
		return
	}
	ctx := trace.ContextWithSpanContext(context.Background(), b.obs.sc)
	_, span := o.tracer.Start(ctx, spanAbandon, trace.WithTimestamp(start),
		trace.WithAttributes(attrRequest.Int64(int64(b.id)), attrAbandonWait.Int64(timeout.Milliseconds())))
	span.AddEvent("abandon outcome", trace.WithAttributes(attrOutcome.String(out.String())))
	if out != transfer.Recoverable {
		span.SetStatus(codes.Error, out.String())
		span.SetAttributes(attrErrorType.String(out.String()))
	}
	span.End()
}

// logContext is the context log records about the batch are logged with:
// it carries the batch span, so the records carry its trace.
func (b *batchObs) logContext() context.Context {
	if b.ctx != nil {
		return b.ctx
	}
	return context.Background()
}

// spanContext returns a context holding the remote span sc (for log
// records about a peer's traced request).
func spanContext(sc trace.SpanContext) context.Context {
	if !sc.IsValid() {
		return context.Background()
	}
	return trace.ContextWithRemoteSpanContext(context.Background(), sc)
}

// inject writes the trace context of ctx into a wire trace field.
func (o *obs) inject(ctx context.Context, field *string) {
	if ctx != nil {
		o.prop.Inject(ctx, wireCarrier{field})
	}
}

// extract reads a wire trace field's context (an invalid one when empty).
func (o *obs) extract(field string) trace.SpanContext {
	if field == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(o.prop.Extract(context.Background(), wireCarrier{&field}))
}

// ---- sender chunks ----

// chunkStarted starts chunk k's span and its gather phase.
func (o *obs) chunkStarted(q *sendReq, k int, now time.Time) {
	if q.b.obs.span == nil {
		return
	}
	pc := &q.plan.Chunks[k]
	ctx, span := o.tracer.Start(q.b.obs.ctx, spanChunk, trace.WithTimestamp(now), trace.WithAttributes(
		attrChunk.Int(k), attrBytes.Int64(int64(pc.Payload)), attrDescs.Int(pc.Descs), attrRuns.Int(len(pc.Gather))))
	q.ch[k].tr = &chunkTrace{ctx: ctx, span: span, phase: now}
}

// phaseSpan records one finished phase of a chunk as a child span from the
// phase's start to now, with the error if it failed.
func (o *obs) phaseSpan(t *chunkTrace, name string, err error, attrs ...attribute.KeyValue) time.Time {
	now := time.Now()
	_, span := o.tracer.Start(t.ctx, name, trace.WithTimestamp(t.phase), trace.WithAttributes(attrs...))
	if err != nil {
		setError(span, err)
	}
	span.End(trace.WithTimestamp(now))
	t.phase = now
	return now
}

func setError(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(attrErrorType.String(errorType(err)))
}

// gatherEnded records chunk k's gather.
func (o *obs) gatherEnded(q *sendReq, k int, err error) {
	if t := q.ch[k].tr; t != nil {
		o.phaseSpan(t, spanGather, err, attrStage.String("gather"), attrRuns.Int(len(q.plan.Chunks[k].Gather)))
		if err != nil {
			o.chunkFailed(q, k, err)
		}
	}
}

// granted marks chunk k's credit on its span.
func (o *obs) granted(q *sendReq, k int, cr *wire.Credit) {
	if t := q.ch[k].tr; t != nil {
		t.span.AddEvent("grant", trace.WithAttributes(attrRegion.Int64(int64(cr.Region)), attrEager.Bool(q.ch[k].eager)))
	}
}

// writeStarted begins chunk k's write phase.
func (o *obs) writeStarted(q *sendReq, k int) {
	if t := q.ch[k].tr; t != nil {
		t.phase = time.Now()
	}
}

// writeEnded records chunk k's bulk write.
func (o *obs) writeEnded(q *sendReq, k int, err error) {
	if t := q.ch[k].tr; t != nil {
		attrs := append([]attribute.KeyValue{attrStage.String("write"), attrPeer.String(q.peer), attrRegion.Int64(int64(q.ch[k].credit.Region))}, q.b.obs.peerAt...)
		o.phaseSpan(t, spanWrite, err, attrs...)
		if err != nil {
			o.chunkFailed(q, k, err)
		}
	}
}

// dataSending injects chunk k's trace context into its DATA; dataSent
// records the send (and its error) and begins the ACK wait.
func (o *obs) dataSending(q *sendReq, k int, d *wire.Data) {
	if t := q.ch[k].tr; t != nil {
		t.phase = time.Now()
		o.inject(t.ctx, &d.TraceParent)
	}
}

func (o *obs) dataSent(q *sendReq, k int, d *wire.Data, err error) {
	if t := q.ch[k].tr; t != nil {
		o.phaseSpan(t, spanDataSend, err, attrRegion.Int64(int64(d.Region)), attrRuns.Int(len(d.Runs)))
		if err != nil {
			o.chunkFailed(q, k, err)
		}
	}
}

// acked records chunk k's ACK wait and ends its span; the chunk latency
// histogram is recorded whether or not the chunk is traced.
func (o *obs) acked(q *sendReq, k int) {
	c := &q.ch[k]
	o.chunkDur.Record(context.Background(), time.Since(c.started).Seconds())
	if t := c.tr; t != nil {
		now := o.phaseSpan(t, spanAckWait, nil)
		t.span.End(trace.WithTimestamp(now))
		c.tr = nil
	}
}

// chunkFailed ends chunk k's span with err.
func (o *obs) chunkFailed(q *sendReq, k int, err error) {
	if t := q.ch[k].tr; t != nil {
		setError(t.span, err)
		t.span.End()
		q.ch[k].tr = nil
	}
}

// reqFailed ends the spans of a failing request's chunks that have no
// phase in flight (those in flight end when their op does).
func (o *obs) reqFailed(q *sendReq, err error) {
	if q.b.obs.span == nil {
		return
	}
	for k := range q.ch {
		if c := &q.ch[k]; c.tr != nil && c.st != cGathering && c.st != cWriting {
			o.chunkFailed(q, k, err)
		}
	}
}

// ---- direct path ----

// directPosted starts the direct post's span.
func (o *obs) directPosted(b *Batch, peer string, ops int) (context.Context, trace.Span) {
	if b.obs.span == nil {
		return nil, nil
	}
	ctx, span := o.tracer.Start(b.obs.ctx, spanDirectPost, trace.WithAttributes(attrPeer.String(peer), attrDescs.Int(ops)))
	span.SetAttributes(b.obs.peerAt...)
	return ctx, span
}

// write starts a chunk's bulk write, handing the chunk's span to a writer
// that takes a context (so an engine plugin's spans join the trace).
func (o *obs) write(w transfer.Writer, t *chunkTrace, peer string, src, dst transfer.Desc) (transfer.Op, error) {
	if t != nil {
		if cw, ok := w.(transfer.ContextWriter); ok {
			return cw.WriteContext(t.ctx, peer, src, dst)
		}
	}
	return w.Write(peer, src, dst)
}

// directEnded ends the direct post's span.
func (o *obs) directEnded(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		setError(span, err)
	}
	span.End()
}

// ---- receiver ----

// wantReceived starts the receiver's span of a flow, joined to the
// sender's batch span through the WANT's trace field.
func (o *obs) wantReceived(r *reactor, key credit.FlowKey, w *wire.Want) {
	if !o.traced {
		return
	}
	rt := r.rtraces[key]
	if rt == nil {
		ctx := trace.ContextWithRemoteSpanContext(context.Background(), o.extract(w.TraceParent))
		ctx, span := o.tracer.Start(ctx, spanReceive, trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(attrPeer.String(key.Peer), attrRequest.Int64(int64(key.Request))))
		if !span.IsRecording() {
			return
		}
		span.SetAttributes(o.kinds...)
		span.SetAttributes(attrRoute.String(RouteBounce.String()))
		span.SetAttributes(peerAddr(w.Endpoint)...)
		if len(w.Tag) > 0 {
			span.SetAttributes(attrTag.String(tagText(w.Tag)))
		}
		rt = &recvTrace{ctx: ctx, span: span, wantAt: time.Now()}
		r.rtraces[key] = rt
	}
	var bytes uint64
	for _, n := range w.ChunkBytes {
		bytes += n
	}
	rt.chunks += len(w.ChunkBytes)
	rt.span.SetAttributes(attrChunks.Int(rt.chunks), attrBytes.Int64(int64(bytes)))
}

// doneReceived records a direct-path request's DONE notice as the
// receiver's span of it (the engine placed the bytes before; the receiver
// takes part only here), a child of the sender's batch span through the
// DONE's trace field; a DONE with a reason (the sender's failure) ends it
// with status Error.
func (o *obs) doneReceived(peer string, m *wire.Done) {
	if !o.traced || m.TraceParent == "" {
		return
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), o.extract(m.TraceParent))
	_, span := o.tracer.Start(ctx, spanReceive, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrPeer.String(peer), attrRequest.Int64(int64(m.Request)), attrRoute.String(RouteDirect.String()), attrBytes.Int64(int64(m.Bytes))))
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(o.kinds...)
	span.SetAttributes(peerAddr(m.Endpoint)...)
	if len(m.Tag) > 0 {
		span.SetAttributes(attrTag.String(tagText(m.Tag)))
	}
	if m.Reason != "" {
		span.SetStatus(codes.Error, m.Reason)
		span.SetAttributes(attrErrorType.String("sender_failed"), attrOutcome.String("failed"))
	}
	span.End()
}

// grantedChunk records the wait of one chunk for its credit.
func (o *obs) grantedChunk(r *reactor, g credit.Grant) {
	rt := r.rtraces[g.Flow]
	if rt == nil {
		return
	}
	_, span := o.tracer.Start(rt.ctx, spanGrantWait, trace.WithTimestamp(rt.wantAt),
		trace.WithAttributes(attrChunk.Int(g.Chunk), attrRegion.Int64(int64(g.Offset)), attrBytes.Int64(int64(g.Len))))
	span.End()
}

// scatterQueued stamps a scatter job with its DATA's trace context.
func (o *obs) scatterQueued(r *reactor, job *scatterTask, d *wire.Data) {
	if !o.traced || r.rtraces[job.key] == nil {
		return
	}
	job.at = time.Now()
	job.parent = o.extract(d.TraceParent)
}

// scatterEnded records a scatter (a child of the sender's chunk span, so
// the scatter sits under the chunk it placed, linked to the receiver's
// flow span) and ends the flow's span after its last chunk.
func (o *obs) scatterEnded(r *reactor, job *scatterTask, err error, acked bool) {
	if !job.queued.IsZero() && err == nil {
		o.scatterDur.Record(context.Background(), time.Since(job.queued).Seconds()) // queued is wall time, as the ACK's ScatterNS
	}
	rt := r.rtraces[job.key]
	if rt == nil || job.at.IsZero() {
		return
	}
	parent := rt.ctx
	opts := []trace.SpanStartOption{trace.WithTimestamp(job.at), trace.WithAttributes(
		attrChunk.Int64(int64(job.chunk)), attrRegion.Int64(int64(job.off)), attrRuns.Int(len(job.runs)), attrBytes.Int64(int64(job.region.Len)), attrStage.String("scatter"))}
	if job.parent.IsValid() {
		parent = trace.ContextWithRemoteSpanContext(context.Background(), job.parent)
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: rt.span.SpanContext()}))
	}
	_, span := o.tracer.Start(parent, spanScatter, opts...)
	if err != nil {
		setError(span, err)
	} else if acked {
		span.AddEvent("ack sent")
	}
	span.End()
	rt.done++
	if err != nil {
		rt.span.AddEvent("scatter failed", trace.WithAttributes(attrChunk.Int64(int64(job.chunk))))
	}
	if rt.done >= rt.chunks {
		o.flowEnded(r, job.key, "")
	}
}

// flowEnded ends the receiver's span of a flow; why is empty for a flow
// whose chunks were all scattered, else cancelled, expired, reclaimed or
// shutdown.
func (o *obs) flowEnded(r *reactor, key credit.FlowKey, why string) {
	rt := r.rtraces[key]
	if rt == nil {
		return
	}
	delete(r.rtraces, key)
	if why != "" {
		rt.span.AddEvent(why)
		rt.span.SetAttributes(attrOutcome.String(why))
	}
	rt.span.End()
}

// peerFlowsEnded ends the receiver spans of every flow of peer.
func (o *obs) peerFlowsEnded(r *reactor, peer, why string) {
	for key := range r.rtraces {
		if key.Peer == peer {
			o.flowEnded(r, key, why)
		}
	}
}

// ---- counters of bad input ----

// reject counts one rejected input from peer. Unknown peers share one
// label so a flood of names cannot grow the metric.
func (o *obs) reject(r *reactor, peer, reason string) {
	if _, ok := r.ctrlPeers[peer]; !ok {
		if _, _, known := r.a.PeerRoute(peer); !known {
			peer = "unknown"
		}
	}
	o.rejections.Add(context.Background(), 1, metric.WithAttributes(attrPeer.String(peer), attrFailReason.String(reason)))
}

// nack counts a NACK sent or received.
func (o *obs) nack(direction string, code wire.NackCode) {
	o.nacks.Add(context.Background(), 1, metric.WithAttributes(attrDirection.String(direction), attrCode.String(code.String())))
}
