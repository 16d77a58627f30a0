package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// observed is one agent's in-memory telemetry: every span it ends and a
// manual metric reader.
type observed struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	opt    func(*Settings)
}

func newObserved(t *testing.T) *observed {
	o := &observed{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	o.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(o.spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(o.reader))
	t.Cleanup(func() {
		_ = o.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	o.opt = func(s *Settings) {
		s.TracerProvider, s.MeterProvider, s.Propagator = o.tp, mp, propagation.TraceContext{}
		s.Kinds = Kinds{Engine: "loopback", Control: "inproc", Gather: "host", Scatter: "host"}
	}
	return o
}

func (o *observed) named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range o.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func one(t *testing.T, o *observed, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	s := o.named(name)
	if len(s) != 1 {
		t.Fatalf("%d %s spans, want 1 (all: %v)", len(s), name, spanNames(o.spans.Ended()))
	}
	return s[0]
}

func spanNames(spans []sdktrace.ReadOnlySpan) map[string]int {
	m := map[string]int{}
	for _, s := range spans {
		m[s.Name()]++
	}
	return m
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func wantAttr(t *testing.T, s sdktrace.ReadOnlySpan, key attribute.Key, want any) {
	t.Helper()
	got := attr(s, key)
	var ok bool
	switch w := want.(type) {
	case string:
		ok = got.Type() == attribute.STRING && got.AsString() == w
	case int:
		ok = got.Type() == attribute.INT64 && got.AsInt64() == int64(w)
	case bool:
		ok = got.Type() == attribute.BOOL && got.AsBool() == w
	case float64:
		ok = got.Type() == attribute.FLOAT64 && got.AsFloat64() == w
	}
	if !ok {
		t.Errorf("%s: %s = %v, want %v", s.Name(), key, got.Emit(), want)
	}
}

// childOf fails unless s's parent is p (same trace, parent span id).
func childOf(t *testing.T, s, p sdktrace.ReadOnlySpan) {
	t.Helper()
	if s.Parent().TraceID() != p.SpanContext().TraceID() || s.Parent().SpanID() != p.SpanContext().SpanID() {
		t.Errorf("%s: parent %s/%s, want %s %s/%s", s.Name(), s.Parent().TraceID(), s.Parent().SpanID(), p.Name(), p.SpanContext().TraceID(), p.SpanContext().SpanID())
	}
}

func withObs(o *observed) nodeOpt { return func(s *Settings) { o.opt(s) } }

// kvJob is a bounce-eligible transfer of count 4 KiB blocks from a to b.
func kvJob(t *testing.T, a, b *node, count int, seed uint64) job {
	size := uint64(count) * 4096
	return prepare(a.buffer(t, size), b.buffer(t, size), kvLayout{count: count, size: 4096, fragmented: true}, seed)
}

// One bounce transfer is one trace across both agents: the batch span under
// the caller's span, one span per chunk with its gather, write, DATA send
// and ACK wait, and on the receiver a flow span under the batch span, one
// grant wait per chunk and each chunk's scatter under the sender's chunk
// span. Spans are per chunk: 512 descriptors make 2 chunks, not 512 spans.
func TestTraceBounceTransfer(t *testing.T) {
	w := newWorld(t)
	oa, ob := newObserved(t), newObserved(t)
	a, b := w.node("a", testConfig(), withObs(oa)), w.node("b", testConfig(), withObs(ob))
	j := kvJob(t, a, b, 512, 1)
	connect(t, a, b)
	ctx, root := oa.tp.Tracer("test").Start(context.Background(), "caller")
	bt, err := a.SubmitContext(ctx, Request{Peer: "b", Src: j.src, Dst: j.dst, Tag: []byte("req-7")})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	root.End()
	j.verify(t)
	if bt.Route() != RouteBounce {
		t.Fatalf("route %v", bt.Route())
	}

	tr := one(t, oa, spanTransfer)
	childOf(t, tr, one(t, oa, "caller"))
	wantAttr(t, tr, attrRoute, "bounce")
	wantAttr(t, tr, attrReason, whyEligible)
	wantAttr(t, tr, attrPeer, "b")
	wantAttr(t, tr, attrPeerEndpoint, b.ctrl.LocalEndpoint())
	wantAttr(t, tr, attrTag, "req-7")
	if got := bt.TraceID(); got != tr.SpanContext().TraceID().String() {
		t.Errorf("Batch.TraceID %q, want the transfer span's %s", got, tr.SpanContext().TraceID())
	}
	wantAttr(t, tr, attrDescs, 512)
	wantAttr(t, tr, attrBytes, 512*4096)
	wantAttr(t, tr, attrEngine, "loopback")
	wantAttr(t, tr, attrControl, "inproc")
	if tr.Status().Code == codes.Error {
		t.Errorf("transfer span status %v", tr.Status())
	}
	if ev := tr.Events(); len(ev) != 1 || ev[0].Name != "retired" {
		t.Errorf("transfer events %v, want one retired", ev)
	}
	chunks := oa.named(spanChunk)
	n := int(attr(tr, attrChunks).AsInt64())
	if n < 2 || len(chunks) != n {
		t.Fatalf("%d chunk spans, transfer says %d chunks (want >= 2)", len(chunks), n)
	}
	byIndex := map[int64]sdktrace.ReadOnlySpan{}
	for _, c := range chunks {
		childOf(t, c, tr)
		byIndex[attr(c, attrChunk).AsInt64()] = c
	}
	if len(byIndex) != n {
		t.Fatalf("chunk indices %v are not distinct", byIndex)
	}
	var descs int64
	for _, c := range chunks {
		descs += attr(c, attrDescs).AsInt64()
	}
	if descs != 512 {
		t.Errorf("chunk spans cover %d descriptors, want 512", descs)
	}
	// Each chunk has exactly one of each phase, in order.
	for _, phase := range []string{spanGather, spanWrite, spanDataSend, spanAckWait} {
		spans := oa.named(phase)
		if len(spans) != n {
			t.Fatalf("%d %s spans, want %d", len(spans), phase, n)
		}
		seen := map[trace.SpanID]bool{}
		for _, s := range spans {
			seen[s.Parent().SpanID()] = true
			if s.Parent().TraceID() != tr.SpanContext().TraceID() {
				t.Errorf("%s in trace %s", phase, s.Parent().TraceID())
			}
		}
		for _, c := range chunks {
			if !seen[c.SpanContext().SpanID()] {
				t.Errorf("chunk %d has no %s span", attr(c, attrChunk).AsInt64(), phase)
			}
		}
	}
	if total, want := len(oa.spans.Ended()), 2+5*n; total != want {
		t.Errorf("sender ended %d spans, want %d (%v)", total, want, spanNames(oa.spans.Ended()))
	}

	// The receiver's spans are in the sender's trace.
	recv := one(t, ob, spanReceive)
	childOf(t, recv, tr)
	wantAttr(t, recv, attrPeer, "a")
	wantAttr(t, recv, attrPeerEndpoint, a.ctrl.LocalEndpoint())
	wantAttr(t, recv, attrRoute, "bounce")
	wantAttr(t, recv, attrTag, "req-7")
	wantAttr(t, recv, attrChunks, n)
	for _, w := range oa.named(spanWrite) {
		wantAttr(t, w, attrPeerEndpoint, b.ctrl.LocalEndpoint())
	}
	grants := ob.named(spanGrantWait)
	scatters := ob.named(spanScatter)
	if len(grants) != n || len(scatters) != n {
		t.Fatalf("receiver: %d grant waits and %d scatters, want %d each", len(grants), len(scatters), n)
	}
	for _, g := range grants {
		childOf(t, g, recv)
	}
	for _, s := range scatters {
		k := attr(s, attrChunk).AsInt64()
		c, ok := byIndex[k]
		if !ok {
			t.Fatalf("scatter of unknown chunk %d", k)
		}
		childOf(t, s, c)
		if l := s.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != recv.SpanContext().SpanID() {
			t.Errorf("scatter of chunk %d links %v, want the receive span", k, l)
		}
		if ev := s.Events(); len(ev) != 1 || ev[0].Name != "ack sent" {
			t.Errorf("scatter events %v", ev)
		}
	}
	for _, s := range ob.spans.Ended() {
		if s.SpanContext().TraceID() != tr.SpanContext().TraceID() {
			t.Errorf("receiver span %s in trace %s, want the sender's %s", s.Name(), s.SpanContext().TraceID(), tr.SpanContext().TraceID())
		}
	}
}

// A direct transfer is the batch span with one post span, both naming the
// peer's address, and on the receiver one span of its DONE notice in the
// sender's trace (a child of the batch span), naming the sender's address.
func TestTraceDirectTransfer(t *testing.T) {
	w := newWorld(t)
	oa, ob := newObserved(t), newObserved(t)
	a, b := w.node("a", testConfig(), withObs(oa)), w.node("b", testConfig(), withObs(ob))
	j := kvJob(t, a, b, 100, 2)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: RouteDirect, Tag: []byte("req-9")})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	j.verify(t)
	tr := one(t, oa, spanTransfer)
	wantAttr(t, tr, attrPeerEndpoint, b.ctrl.LocalEndpoint())
	if tr.Parent().IsValid() {
		t.Errorf("transfer without a caller span has parent %v", tr.Parent())
	}
	wantAttr(t, tr, attrRoute, "direct")
	wantAttr(t, tr, attrReason, whyDirectRequested)
	wantAttr(t, tr, attrDescs, 100)
	post := one(t, oa, spanDirectPost)
	childOf(t, post, tr)
	wantAttr(t, post, attrDescs, 100)
	wantAttr(t, post, attrPeer, "b")
	wantAttr(t, post, attrPeerEndpoint, b.ctrl.LocalEndpoint())
	if got := spanNames(oa.spans.Ended()); len(got) != 2 {
		t.Errorf("sender spans %v, want only the transfer and the post", got)
	}
	// The DONE notice follows the op's completion: wait for its span.
	eventually(t, func() bool { return len(ob.named(spanReceive)) > 0 })
	recv := one(t, ob, spanReceive)
	childOf(t, recv, tr)
	if recv.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("receive span kind %v", recv.SpanKind())
	}
	wantAttr(t, recv, attrRoute, "direct")
	wantAttr(t, recv, attrPeer, "a")
	wantAttr(t, recv, attrPeerEndpoint, a.ctrl.LocalEndpoint())
	wantAttr(t, recv, attrTag, "req-9")
	wantAttr(t, recv, attrBytes, 100*4096)
	if recv.Status().Code == codes.Error {
		t.Errorf("receive span status %v", recv.Status())
	}
	if got := spanNames(ob.spans.Ended()); len(got) != 1 {
		t.Errorf("receiver spans %v, want only the receive span", got)
	}
}

// peerAddr names a control endpoint and, when it is host:port behind an
// optional scheme, its host and port.
func TestPeerAddr(t *testing.T) {
	for _, c := range []struct {
		in   string
		host string
		port int
	}{
		{"tcp://10.0.0.2:41000", "10.0.0.2", 41000},
		{"tcp://[fd00::2]:7000", "fd00::2", 7000},
		{"10.0.0.3:1", "10.0.0.3", 1},
		{"inproc://b", "", 0},
		{"ucx-worker-blob", "", 0},
		{"tcp://:5", "", 0},
	} {
		kv := peerAddr(c.in)
		got := map[attribute.Key]attribute.Value{}
		for _, a := range kv {
			got[a.Key] = a.Value
		}
		if got[attrPeerEndpoint].AsString() != c.in {
			t.Errorf("%q: endpoint %v", c.in, got[attrPeerEndpoint].Emit())
		}
		if got[attrNetPeerAddr].AsString() != c.host || int(got[attrNetPeerPort].AsInt64()) != c.port {
			t.Errorf("%q: address %q port %d, want %q %d", c.in, got[attrNetPeerAddr].AsString(), got[attrNetPeerPort].AsInt64(), c.host, c.port)
		}
		want := 1
		if c.host != "" {
			want = 3
		}
		if len(kv) != want {
			t.Errorf("%q: %d attributes %v, want %d", c.in, len(kv), kv, want)
		}
	}
	if kv := peerAddr(""); kv != nil {
		t.Errorf("empty endpoint: %v", kv)
	}
}

// A failed transfer's spans carry the error: status Error and error.type
// on the batch span and on the phase that failed.
func TestTraceFailedTransfer(t *testing.T) {
	for _, route := range []Route{RouteBounce, RouteDirect} {
		t.Run(route.String(), func(t *testing.T) {
			w := newWorld(t)
			oa := newObserved(t)
			var fe *faultEngine
			a, b := w.node("a", shortTimeouts(), withObs(oa), withFaultEngine(&fe)), w.node("b", shortTimeouts())
			j := kvJob(t, a, b, 256, 3)
			connect(t, a, b)
			fe.failWrites.Store(true)
			bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst, Route: route})
			if err != nil {
				t.Fatal(err)
			}
			if err := wait(t, bt); !errors.Is(err, transfer.ErrPeerLost) {
				t.Fatalf("err = %v, want the injected failure", err)
			}
			tr := one(t, oa, spanTransfer)
			if tr.Status().Code != codes.Error {
				t.Errorf("transfer status %v, want Error", tr.Status())
			}
			wantAttr(t, tr, attrErrorType, "peer_lost")
			ev := tr.Events()
			var retired bool
			for _, e := range ev {
				if e.Name == "retired" {
					retired = true
					for _, kv := range e.Attributes {
						if kv.Key == attrOutcome && kv.Value.AsString() != "failed" {
							t.Errorf("retired outcome %v", kv.Value.AsString())
						}
					}
				}
			}
			if !retired {
				t.Errorf("no retired event in %v", ev)
			}
			failed := spanWrite
			if route == RouteDirect {
				failed = spanDirectPost
			}
			eventually(t, func() bool { return len(oa.named(failed)) > 0 })
			for _, s := range oa.named(failed) {
				if s.Status().Code != codes.Error {
					t.Errorf("%s status %v, want Error", failed, s.Status())
				}
				wantAttr(t, s, attrErrorType, "peer_lost")
			}
			if route == RouteBounce {
				eventually(t, func() bool { return len(oa.named(spanChunk)) == len(oa.named(spanGather)) })
				for _, c := range oa.named(spanChunk) {
					if c.Status().Code != codes.Error {
						t.Errorf("chunk %d status %v, want Error", attr(c, attrChunk).AsInt64(), c.Status())
					}
				}
			}
			settled(t, a, b)
		})
	}
}

// Abandon's outcome is recorded as its own span, under the batch's.
func TestTraceAbandonOutcome(t *testing.T) {
	w := newWorld(t)
	oa := newObserved(t)
	var sg *stallGatherer
	a, b := w.node("a", testConfig(), withObs(oa), withStall(&sg)), w.node("b", testConfig())
	j := kvJob(t, a, b, 256, 4)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if out := bt.Abandon(50 * time.Millisecond); out != transfer.NotQuiescent {
		t.Fatalf("abandon with a stalled gather: %v", out)
	}
	close(sg.release)
	if out := bt.Abandon(5 * time.Second); out != transfer.Recoverable {
		t.Fatalf("abandon after the stall: %v", out)
	}
	tr := one(t, oa, spanTransfer)
	wantAttr(t, tr, attrErrorType, "abandoned")
	ab := oa.named(spanAbandon)
	if len(ab) != 2 {
		t.Fatalf("%d abandon spans, want 2", len(ab))
	}
	outcomes := map[string]codes.Code{}
	for _, s := range ab {
		childOf(t, s, tr)
		ev := s.Events()
		if len(ev) != 1 || ev[0].Name != "abandon outcome" {
			t.Fatalf("abandon events %v", ev)
		}
		outcomes[ev[0].Attributes[0].Value.AsString()] = s.Status().Code
	}
	if outcomes[transfer.NotQuiescent.String()] != codes.Error || outcomes[transfer.Recoverable.String()] != codes.Unset {
		t.Errorf("abandon outcomes %v", outcomes)
	}
	settled(t, a, b)
}

// collect reads every metric of o into name → data points.
func collect(t *testing.T, o *observed) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := o.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != instrumentationName {
			t.Errorf("scope %q, want the import path", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// sum returns the int64 sum data point of m whose attributes include kvs.
func sum(t *testing.T, ms map[string]metricdata.Aggregation, name string, kvs ...attribute.KeyValue) int64 {
	t.Helper()
	var total int64
	switch d := ms[name].(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if has(p.Attributes, kvs) {
				total += p.Value
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if has(p.Attributes, kvs) {
				total += p.Value
			}
		}
	case nil:
		return 0
	default:
		t.Fatalf("%s is %T", name, d)
	}
	return total
}

func histCount(ms map[string]metricdata.Aggregation, name string, kvs ...attribute.KeyValue) uint64 {
	d, _ := ms[name].(metricdata.Histogram[float64])
	var n uint64
	for _, p := range d.DataPoints {
		if has(p.Attributes, kvs) {
			n += p.Count
		}
	}
	return n
}

func has(set attribute.Set, kvs []attribute.KeyValue) bool {
	for _, kv := range kvs {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// After a known workload the metrics equal the counts: requests and bytes
// by route and outcome, routing decisions by reason, one chunk latency per
// chunk, NACKs both ways, per-peer rejections, arena and held credits.
func TestMetricsAfterKnownWorkload(t *testing.T) {
	w := newWorld(t)
	oa, ob := newObserved(t), newObserved(t)
	var fe *faultEngine
	a, b := w.node("a", shortTimeouts(), withObs(oa), withFaultEngine(&fe)), w.node("b", shortTimeouts(), withObs(ob))
	const blocks = 512
	jobs := []job{kvJob(t, a, b, blocks, 10), kvJob(t, a, b, blocks, 11), kvJob(t, a, b, blocks, 12)}
	small := kvJob(t, a, b, 16, 13) // under min_descriptors: direct, eligible never
	connect(t, a, b)
	var chunks int
	for _, j := range jobs {
		bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
		if err != nil {
			t.Fatal(err)
		}
		if err := wait(t, bt); err != nil {
			t.Fatal(err)
		}
		p, _ := a.plan(Request{Src: j.src, Dst: j.dst})
		chunks += len(p.Chunks)
	}
	for range 2 {
		bt, err := a.Submit(Request{Peer: "b", Src: small.src, Dst: small.dst})
		if err != nil || wait(t, bt) != nil || bt.Route() != RouteDirect {
			t.Fatalf("small transfer: %v %v", err, bt.Route())
		}
	}
	fe.failWrites.Store(true)
	bt, err := a.Submit(Request{Peer: "b", Src: small.src, Dst: small.dst, Route: RouteDirect})
	if err != nil || wait(t, bt) == nil {
		t.Fatalf("failing transfer: %v", err)
	}
	// A chunk larger than b's max chunk is NACKed; garbage is rejected.
	if err := a.ctrl.Send("b", mustMarshal(t, &wire.Want{Request: 999, ChunkBytes: []uint64{64 << 20}, Endpoint: a.ctrl.LocalEndpoint()})); err != nil {
		t.Fatal(err)
	}
	if err := a.ctrl.Send("b", []byte("not a control message")); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return b.Stats().BadMessages == 1 && b.Stats().RejectedWants == 1 })
	// b's NACK reaches a a moment later (a loaded machine stretches it).
	nackCode := attrCode.String(wire.NackChunkTooLarge.String())
	eventually(t, func() bool {
		return sum(t, collect(t, oa), "bounce.nacks", attrDirection.String("received"), nackCode) > 0
	})
	settled(t, a, b)

	ma := collect(t, oa)
	route := func(r, outcome string) []attribute.KeyValue {
		return []attribute.KeyValue{attrRoute.String(r), attrOutcome.String(outcome)}
	}
	checks := []struct {
		what      string
		got, want int64
	}{
		{"bounce successes", sum(t, ma, "bounce.requests", route("bounce", "success")...), 3},
		{"direct successes", sum(t, ma, "bounce.requests", route("direct", "success")...), 2},
		{"direct failures", sum(t, ma, "bounce.requests", route("direct", "failure")...), 1},
		{"bounce bytes", sum(t, ma, "bounce.request.bytes", route("bounce", "success")...), 3 * blocks * 4096},
		{"direct bytes", sum(t, ma, "bounce.request.bytes", route("direct", "success")...), 2 * 16 * 4096},
		{"eligible decisions", sum(t, ma, "bounce.route.decisions", attrRoute.String("bounce"), attrReason.String(whyEligible)), 3},
		{"few-descriptor decisions", sum(t, ma, "bounce.route.decisions", attrRoute.String("direct"), attrReason.String(whyFewDescriptors)), 2},
		{"direct-requested decisions", sum(t, ma, "bounce.route.decisions", attrRoute.String("direct"), attrReason.String(whyDirectRequested)), 1},
		{"failures by reason", sum(t, ma, "bounce.failures", attrFailReason.String("peer_lost")), 1},
		{"request latencies", int64(histCount(ma, "bounce.request.duration")), 6},
		{"bounce request latencies", int64(histCount(ma, "bounce.request.duration", route("bounce", "success")...)), 3},
		{"chunk latencies", int64(histCount(ma, "bounce.chunk.duration")), int64(chunks)},
		{"NACKs received", sum(t, ma, "bounce.nacks", attrDirection.String("received"), attrCode.String(wire.NackChunkTooLarge.String())), 1},
		{"control messages dropped", sum(t, ma, "bounce.control.dropped"), 0},
		{"parked", sum(t, ma, "bounce.requests.parked"), 0},
		{"active bounce requests", sum(t, ma, "bounce.requests.active", attrRoute.String("bounce")), 0},
	}
	mb := collect(t, ob)
	st := b.ArenaStats()
	checks = append(checks, []struct {
		what      string
		got, want int64
	}{
		{"NACKs sent", sum(t, mb, "bounce.nacks", attrDirection.String("sent"), attrCode.String(wire.NackChunkTooLarge.String())), 1},
		{"rejections of a's bad WANT", sum(t, mb, "bounce.peer.rejections", attrPeer.String("a"), attrFailReason.String(rejectBadWant)), 1},
		{"rejections of a's garbage", sum(t, mb, "bounce.peer.rejections", attrPeer.String("a"), attrFailReason.String(rejectMalformed)), 1},
		{"free arena bytes", sum(t, mb, "bounce.arena.bytes", attrState.String("free")), int64(st.Capacity)},
		{"held arena bytes", sum(t, mb, "bounce.arena.bytes", attrState.String("held")), 0},
		{"staging arena bytes", sum(t, mb, "bounce.arena.bytes", attrState.String("staging")), 0},
		{"credits held by a", sum(t, mb, "bounce.credits.held", attrPeer.String("a")), 0},
	}...)
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
		}
	}
}

// While a sender holds credits the gauges show them, per peer.
func TestMetricsCreditsHeldPerPeer(t *testing.T) {
	w := newWorld(t)
	ob := newObserved(t)
	b := w.node("b", testConfig(), withObs(ob))
	im := newImpostor(t, w, b)
	cr := im.grant(t, b, 1, 1<<20)
	ms := collect(t, ob)
	if got := sum(t, ms, "bounce.credits.held", attrPeer.String("evil")); got != int64(cr.Len) {
		t.Errorf("credits held by evil: %d, want %d", got, cr.Len)
	}
	if got := sum(t, ms, "bounce.arena.bytes", attrState.String("held")); got != int64(cr.Len) {
		t.Errorf("held arena bytes: %d, want %d", got, cr.Len)
	}
	im.send(t, "b", &wire.Want{Request: 1, Endpoint: "x"}) // cancel
	settled(t, b)
}

func mustMarshal(t *testing.T, m wire.Message) []byte {
	t.Helper()
	b, err := wire.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// recordingHandler keeps the span context of every record's ctx.
type recordingHandler struct {
	mu  sync.Mutex
	got map[string]trace.SpanContext
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got[r.Message] = trace.SpanContextFromContext(ctx)
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

func (h *recordingHandler) spanOf(msg string) (trace.SpanContext, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sc, ok := h.got[msg]
	return sc, ok
}

// Log records about a traced request are logged with its span's context,
// so a trace-aware handler (telemetry.LogHandler) adds trace_id/span_id:
// the sender's failing request, and the receiver's failed scatter under the
// sender's trace.
func TestLogsCarryTheTrace(t *testing.T) {
	w := newWorld(t)
	oa, ob := newObserved(t), newObserved(t)
	ha, hb := &recordingHandler{got: map[string]trace.SpanContext{}}, &recordingHandler{got: map[string]trace.SpanContext{}}
	var fs *faultScatterer
	logTo := func(h slog.Handler) nodeOpt { return func(s *Settings) { s.Logger = slog.New(h) } }
	a := w.node("a", shortTimeouts(), withObs(oa), logTo(ha))
	b := w.node("b", shortTimeouts(), withObs(ob), logTo(hb), withFaultScatter(&fs))
	j := kvJob(t, a, b, 256, 5)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); !errors.Is(err, ErrRefused) {
		t.Fatalf("err = %v, want the receiver's NACK of its failed scatter", err)
	}
	tr := one(t, oa, spanTransfer)
	sc, ok := ha.spanOf("request failing")
	if !ok || sc.TraceID() != tr.SpanContext().TraceID() || sc.SpanID() != tr.SpanContext().SpanID() {
		t.Errorf("sender's failure record: span %v (logged %v), want the transfer span %v", sc, ok, tr.SpanContext())
	}
	sc, ok = hb.spanOf("scatter failed; no ACK sent")
	if !ok || sc.TraceID() != tr.SpanContext().TraceID() {
		t.Errorf("receiver's scatter failure record: span %v (logged %v), want trace %s", sc, ok, tr.SpanContext().TraceID())
	}
	settled(t, a, b)
}

// The trace field's carrier keeps traceparent and tracestate apart and
// drops keys the wire has no room for.
func TestWireCarrier(t *testing.T) {
	var field string
	c := wireCarrier{&field}
	c.Set("tracestate", "a=1")
	c.Set("traceparent", "00-x-y-01")
	c.Set("baggage", "k=v")
	if field != "00-x-y-01\na=1" || c.Get("traceparent") != "00-x-y-01" || c.Get("tracestate") != "a=1" || c.Get("baggage") != "" {
		t.Fatalf("field %q", field)
	}
	c.Set("tracestate", "")
	if field != "00-x-y-01" {
		t.Fatalf("field after clearing tracestate: %q", field)
	}
}

func FuzzTraceField(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\nrojo=00f067aa0ba902b7")
	f.Add("")
	f.Add("\n\n")
	prop := propagation.TraceContext{}
	f.Fuzz(func(t *testing.T, field string) {
		o := &obs{prop: prop}
		sc := o.extract(field)
		if !sc.IsValid() {
			return
		}
		// A context the propagator accepted survives a round trip.
		var out string
		o.inject(trace.ContextWithRemoteSpanContext(context.Background(), sc), &out)
		if again := o.extract(out); again.TraceID() != sc.TraceID() || again.SpanID() != sc.SpanID() || again.TraceFlags() != sc.TraceFlags() {
			t.Fatalf("round trip of %q: %v -> %q -> %v", field, sc, out, again)
		}
	})
}

// With tracing off (the no-op providers) every telemetry hook on the hot
// path allocates nothing: per request (submit, resolution) and per chunk
// (gather, grant, write, DATA, ACK).
func TestUntracedHooksAllocateNothing(t *testing.T) {
	w := newWorld(t)
	x := w.node("x", testConfig(), func(s *Settings) {
		s.TracerProvider, s.MeterProvider = tracenoop.NewTracerProvider(), metricnoop.NewMeterProvider()
	})
	o := x.obs
	if o.traced {
		t.Fatal("a no-op TracerProvider counts as traced")
	}
	p := &plan.Plan{Chunks: []plan.Chunk{{Bytes: 4096, Payload: 4096, Descs: 1}}}
	b := newBatch(1, RouteBounce, "eligible", nil)
	b.obs.why = whyEligible
	q := &sendReq{b: b, plan: p, ch: make([]sendChunk, 1), peer: "y"}
	cr := &wire.Credit{Region: 0, Len: 4096}
	q.ch[0].credit = cr
	d := &wire.Data{}
	done := &wire.Done{Request: 1, Bytes: 4096, TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		o.submitted(ctx, b, "y", "tcp://10.0.0.2:41000", 1, "eligible")
		o.planned(b, p)
		now := time.Now()
		o.chunkStarted(q, 0, now)
		o.gatherEnded(q, 0, nil)
		o.granted(q, 0, cr)
		o.writeStarted(q, 0)
		_, _ = o.write(nopWriter{}, q.ch[0].tr, "y", transfer.Desc{}, transfer.Desc{})
		o.writeEnded(q, 0, nil)
		o.dataSending(q, 0, d)
		o.dataSent(q, 0, d, nil)
		o.acked(q, 0)
		o.inject(b.obs.ctx, &d.TraceParent)
		o.doneReceived("y", done)
		o.resolved(b, nil, true)
	})
	if allocs != 0 {
		t.Fatalf("untraced hooks allocated %v times per request", allocs)
	}
}

type nopWriter struct{}

func (nopWriter) Write(string, transfer.Desc, transfer.Desc) (transfer.Op, error) { return nil, nil }

// A transfer the sender samples out still carries its (unsampled) context,
// so a receiver with a parent-based sampler records nothing of it either.
func TestSampledOutTransferStaysUnsampled(t *testing.T) {
	w := newWorld(t)
	oa, ob := newObserved(t), newObserved(t)
	never := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(oa.spans), sdktrace.WithSampler(sdktrace.NeverSample()))
	parentBased := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(ob.spans), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	defer never.Shutdown(context.Background())
	defer parentBased.Shutdown(context.Background())
	a := w.node("a", testConfig(), withObs(oa), func(s *Settings) { s.TracerProvider = never })
	b := w.node("b", testConfig(), withObs(ob), func(s *Settings) { s.TracerProvider = parentBased })
	j := kvJob(t, a, b, 256, 6)
	connect(t, a, b)
	bt, err := a.Submit(Request{Peer: "b", Src: j.src, Dst: j.dst})
	if err != nil {
		t.Fatal(err)
	}
	if err := wait(t, bt); err != nil {
		t.Fatal(err)
	}
	settled(t, a, b)
	if got := len(oa.spans.Ended()) + len(ob.spans.Ended()); got != 0 {
		t.Fatalf("a sampled-out transfer recorded %v on the sender and %v on the receiver", spanNames(oa.spans.Ended()), spanNames(ob.spans.Ended()))
	}
}
