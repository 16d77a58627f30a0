// Package driver runs KV-shaped workloads through an agent against a peer
// and measures them: throughput over the whole batch and per-request latency.
// It is what `bounce run` and `bounce bench` are made of.
package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// Target is where a workload lands: a peer and a destination buffer the peer
// registered (request i uses the i-th Spec.Bytes() slice of it).
type Target struct {
	Peer   string
	Buffer transfer.Desc
	// Pool names request i's destination pool in the block-table form
	// (Options.Blocks): a pool the peer registered over its buffer's i-th
	// slice (RegisterPools) and advertised in the descriptor the agent
	// loaded. Nil means DstPool.
	Pool func(i int) string
}

// Options describe one measured run.
type Options struct {
	// Spec is one request's transfer; request i uses Spec with Seed+i.
	Spec workload.Spec
	// Requests is how many requests the run moves.
	Requests int
	// InFlight caps the requests in flight. 0, or Requests or more, submits
	// every request at once (a burst). Fewer runs a closed loop: InFlight
	// requests start at once and each completion submits the next, so the
	// load stays at InFlight until the last requests drain — how serving
	// benchmarks define "concurrency N".
	InFlight int
	// Route forces a route (RouteAuto lets the agent decide).
	Route pipeline.Route
	// TagPrefix starts each request's tag (prefix + its index); empty
	// means "req-". A warm-up passes "warm-up-", which marks its spans
	// (bounce.tag) and the receiver's completion events.
	TagPrefix string
	// Prefilled skips filling the source: a run like the one before it on
	// this Driver (the same Spec and Requests) finds its bytes in place,
	// so a repeated run's time is the transfer's alone.
	Prefilled bool
	// Blocks submits every request in the block-table form
	// (pipeline.BlockRequest) instead of as descriptor lists: Spec.Regions
	// must be set, at most MaxBlockRequests requests; Run registers
	// request i's source pool (SrcPool(i)) over its slice of the source
	// buffer for the run and names the target's pool Target.Pool(i). The
	// pieces and their bytes are those of the descriptor form of the same
	// Spec.
	Blocks bool
	// Convert, when set, makes every request a layout conversion in the
	// block-table form (Blocks is implied; Spec is not used): request i
	// moves Convert with seed Convert.Seed+i from a source pool of layout
	// Convert.Src over its slice of the source buffer (PoolBytes(Src)
	// bytes a request) into the target's pool Target.Pool(i), which the
	// peer registered with layout Convert.Dst over its slice of
	// PoolBytes(Dst) bytes (RegisterConvPools).
	Convert *workload.Conversion
	// Pull moves every request the other way, as a pull (pipeline.Pull):
	// the agent asks the peer for request i's bytes, which the peer holds
	// in its buffer's i-th slice (filled with FillBuffer), into the i-th
	// slice of the Driver's own buffer, which VerifyBuffer then checks.
	// In the block-table form the peer's pools are the sources
	// (Target.Pool) and the Driver's (SrcPool) the destinations. Route
	// does not apply: a pull rides the bounce path.
	Pull bool
}

// RequestTrace names the trace of one request: its tag and the trace id
// Jaeger finds it by (/trace/<id>).
type RequestTrace struct {
	Tag     string `json:"tag"`
	TraceID string `json:"trace_id"`
}

// Result is one measured run.
type Result struct {
	Route     string          // the route the requests took ("mixed" if they differ)
	Reason    string          // why (from the first request)
	Requests  int             // requests submitted
	Failed    int             // requests that failed
	FirstErr  error           // the first failure
	Bytes     uint64          // payload of the successful requests
	Elapsed   time.Duration   // first submit to last completion
	Latencies []time.Duration // per successful request, sorted
	// Steady are the latencies of the successful requests submitted after
	// the first InFlight (each one when an earlier request finished), sorted:
	// the closed loop's steady state without its ramp-up. Nil for a burst.
	Steady []time.Duration
	// Traces are the traced requests' tags and trace ids, in submit order
	// (nil when tracing is off).
	Traces []RequestTrace
	// PeakInFlight is the most requests that were in flight at once.
	PeakInFlight int
	// Stages is the mean per successful request of where its time went on
	// the sender (pipeline.Stages).
	Stages pipeline.Stages
	// Fallbacks counts requests that went direct although the run did not
	// ask for direct (the agent's route decision: handshake, gates, bounce
	// off); FallbackReason is the first one's reason. Route auto's cost
	// model taking direct as the path predicted faster is a choice, not a
	// fallback, and is not counted (Route and Reason say it).
	Fallbacks      int
	FallbackReason string
	// NotQuiescent counts failed requests whose memory may still be touched
	// by a transport after Run returned (Abandon did not prove otherwise
	// within AbandonWait): neither buffer may be reused or freed, and Run's
	// error wraps transfer.ErrNotQuiescent.
	NotQuiescent int
}

// AbandonWait bounds how long Run waits for a failed or given-up request to
// prove that nothing touches its memory any more.
const AbandonWait = 30 * time.Second

// Throughput returns payload bytes per second.
func (r Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Elapsed.Seconds()
}

// Percentile returns the p-th percentile (0..100) of the request latencies
// (nearest rank), or 0 without successful requests.
func (r Result) Percentile(p float64) time.Duration { return Percentile(r.Latencies, p) }

// Percentile returns the p-th percentile (0..100) of sorted latencies: the
// element of rank round(p/100 × n), clamped to 1..n, or 0 for none.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	k := int(p/100*float64(len(sorted))+0.5) - 1
	k = max(0, min(k, len(sorted)-1))
	return sorted[k]
}

// Driver owns a registered source buffer on one agent.
type Driver struct {
	agent *pipeline.Agent
	src   Buffer
}

// New allocates and registers capacity bytes of host source memory on
// agent.
func New(agent *pipeline.Agent, capacity uint64) (*Driver, error) {
	src, err := AllocHost(capacity)
	if err != nil {
		return nil, err
	}
	return NewOn(agent, src)
}

// NewOn registers src (host or device memory) on agent as the source
// buffer; the Driver owns it from then on (Close frees it), also when
// NewOn fails.
func NewOn(agent *pipeline.Agent, src Buffer) (*Driver, error) {
	if err := agent.RegisterMemory(src.Desc()); err != nil {
		src.Free()
		return nil, err
	}
	return &Driver{agent: agent, src: src}, nil
}

// Close deregisters and frees the source buffer.
func (d *Driver) Close() error {
	err := d.agent.DeregisterMemory(d.src.Desc())
	if ferr := d.src.Free(); err == nil {
		err = ferr
	}
	return err
}

// RequestSpec returns request i's spec for o (its own seed).
func (o Options) RequestSpec(i int) workload.Spec {
	s := o.Spec
	s.Seed += uint64(i)
	return s
}

// Run fills the source, submits o.Requests requests (at once, or
// o.InFlight at a time) and waits for all of them, bounded by ctx: when ctx
// ends, the requests still pending are abandoned (see Result.NotQuiescent).
// A request that fails is counted, not fatal. Run returns an error when the
// run could not start, or, with the partial Result, when ctx ended or a
// submit failed before every request was submitted, and an error wrapping
// transfer.ErrNotQuiescent when the buffers are unsafe to reuse.
func (d *Driver) Run(ctx context.Context, t Target, o Options) (Result, error) {
	cv := o.Convert
	if cv != nil {
		if err := cv.Validate(); err != nil {
			return Result{}, err
		}
		o.Blocks = true
	} else if err := o.Spec.Validate(); err != nil {
		return Result{}, err
	}
	per := o.Spec.Bytes()
	payload, dstPer := per, per
	if cv != nil {
		per, dstPer, payload = cv.PoolBytes(cv.Src), cv.PoolBytes(cv.Dst), cv.Payload()
	}
	need := per * uint64(o.Requests)
	switch {
	case o.Requests <= 0:
		return Result{}, fmt.Errorf("driver: requests must be positive, got %d", o.Requests)
	case need > d.src.Desc().Len:
		return Result{}, fmt.Errorf("driver: %d requests x %d bytes exceed the %d-byte source buffer", o.Requests, per, d.src.Desc().Len)
	case dstPer*uint64(o.Requests) > t.Buffer.Len:
		return Result{}, fmt.Errorf("driver: %d requests x %d bytes exceed the peer's %d-byte buffer", o.Requests, dstPer, t.Buffer.Len)
	}
	type req struct {
		src, dst       []transfer.Desc
		srcIDs, dstIDs []uint32
	}
	reqs := make([]req, o.Requests)
	host := HostBytes(d.src) // filled in place; device memory through one request's scratch
	var fill []byte
	if host == nil {
		fill = make([]byte, per)
	}
	for i := range reqs {
		s := o.RequestSpec(i)
		off := uint64(i) * per
		fillReq := s.Fill
		if cv != nil {
			seed := cv.Seed + uint64(i)
			fillReq = func(b []byte) error { return cv.Fill(b, seed) }
		}
		switch {
		case o.Prefilled, o.Pull: // a pull's bytes are the peer's
		case host != nil:
			if err := fillReq(host[off : off+per]); err != nil {
				return Result{}, err
			}
		default:
			if err := fillReq(fill); err != nil {
				return Result{}, err
			}
			if err := d.src.WriteAt(fill, off); err != nil {
				return Result{}, fmt.Errorf("driver: fill request %d: %w", i, err)
			}
		}
		sb := d.src.Desc()
		sb.Addr += off
		db := t.Buffer
		db.Addr += off
		switch {
		case cv != nil:
			reqs[i].srcIDs, reqs[i].dstIDs = cv.IDs(cv.Seed + uint64(i))
		case o.Blocks:
			reqs[i].srcIDs, reqs[i].dstIDs = s.IDs()
		case o.Pull: // from the peer's slice into this buffer's
			reqs[i].src, reqs[i].dst = s.Descs(db, sb)
		default:
			reqs[i].src, reqs[i].dst = s.Descs(sb, db)
		}
	}
	if o.Blocks {
		var pools *Pools
		var err error
		if cv != nil {
			pools, err = RegisterConvPools(d.agent, d.src.Desc(), *cv, cv.Src, o.Requests, SrcPool)
		} else {
			pools, err = RegisterPools(d.agent, d.src.Desc(), o.Spec, o.Requests, SrcPool)
		}
		if err != nil {
			return Result{}, err
		}
		// After every request was waited for or abandoned (deferred
		// calls run last in, first out: after the wait below).
		defer pools.Release()
	}
	dstPool := t.Pool
	if dstPool == nil {
		dstPool = DstPool
	}
	inFlight := o.InFlight
	if inFlight <= 0 || inFlight > o.Requests {
		inFlight = o.Requests
	}
	res := Result{Requests: o.Requests}
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, inFlight)
	start := time.Now()
	var end time.Time
	var submitErr error
	live := 0 // requests in flight now
	for i := range reqs {
		if ctx.Err() == nil {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
			}
		}
		if err := ctx.Err(); err != nil {
			submitErr = fmt.Errorf("driver: request %d not submitted: %w", i, err)
			break
		}
		submitted := time.Now()
		// The tag names the request for the receiver's completion event.
		prefix := o.TagPrefix
		if prefix == "" {
			prefix = "req-"
		}
		tag := fmt.Appendf(nil, "%s%d", prefix, i)
		r := pipeline.Request{Peer: t.Peer, Src: reqs[i].src, Dst: reqs[i].dst, Route: o.Route, Tag: tag}
		if o.Blocks {
			r.Blocks = &pipeline.BlockRequest{SrcPool: SrcPool(i), SrcIDs: reqs[i].srcIDs, DstPool: dstPool(i), DstIDs: reqs[i].dstIDs}
		}
		var bt *pipeline.Batch
		var err error
		if o.Pull {
			pr := pipeline.PullRequest{Peer: t.Peer, Src: r.Src, Dst: r.Dst, Tag: tag}
			if o.Blocks {
				pr.Blocks = &pipeline.BlockRequest{SrcPool: dstPool(i), SrcIDs: reqs[i].srcIDs, DstPool: SrcPool(i), DstIDs: reqs[i].dstIDs}
			}
			bt, err = d.agent.Pull(pr)
		} else {
			bt, err = d.agent.Submit(r)
		}
		if err != nil {
			submitErr = fmt.Errorf("driver: submit request %d: %w", i, err)
			break
		}
		if bt.Route() == pipeline.RouteDirect && o.Route != pipeline.RouteDirect && !bt.Prediction().Made {
			if res.Fallbacks == 0 {
				res.FallbackReason = bt.RouteReason()
			}
			res.Fallbacks++
		}
		if id := bt.TraceID(); id != "" {
			res.Traces = append(res.Traces, RequestTrace{Tag: string(tag), TraceID: id})
		}
		route := bt.Route().String()
		if o.Pull {
			route = "pull" // the bounce path, the other way round
		}
		if i == 0 {
			res.Route, res.Reason = route, bt.RouteReason()
		} else if route != res.Route {
			res.Route = "mixed"
		}
		steady := inFlight < o.Requests && i >= inFlight
		mu.Lock()
		live++
		res.PeakInFlight = max(res.PeakInFlight, live)
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			err := bt.Wait(ctx)
			done := time.Now()
			var out transfer.AbandonOutcome
			if err != nil {
				// Failed, or Run is giving up (ctx ended): fail the batch if
				// it is still pending and wait, bounded, for proof that
				// nothing touches its memory before the buffers are reused.
				out = bt.Abandon(AbandonWait)
			}
			mu.Lock()
			defer mu.Unlock()
			live--
			if done.After(end) {
				end = done
			}
			if err != nil {
				res.Failed++
				if res.FirstErr == nil {
					res.FirstErr = err
				}
				if out != transfer.Recoverable {
					res.NotQuiescent++
				} else if rerr := bt.Release(); rerr != nil && res.FirstErr == nil {
					res.FirstErr = rerr
				}
				return
			}
			res.Bytes += payload
			res.Stages = res.Stages.Add(bt.Stages())
			res.Latencies = append(res.Latencies, done.Sub(submitted))
			if steady {
				res.Steady = append(res.Steady, done.Sub(submitted))
			}
			if rerr := bt.Release(); rerr != nil && !errors.Is(rerr, transfer.ErrNotQuiescent) {
				res.FirstErr = rerr
			}
		}()
	}
	wg.Wait()
	if !end.IsZero() {
		res.Elapsed = end.Sub(start)
	}
	slices.Sort(res.Latencies)
	slices.Sort(res.Steady)
	res.Stages = res.Stages.Div(len(res.Latencies))
	// Every request submitted was waited for or abandoned: unless
	// NotQuiescent says otherwise, nothing touches the buffers now.
	if res.NotQuiescent > 0 {
		unsafe := fmt.Errorf("driver: %d failed request(s) not proven quiescent after %v, so the buffers must not be reused (first error: %v): %w",
			res.NotQuiescent, AbandonWait, res.FirstErr, transfer.ErrNotQuiescent)
		return res, errors.Join(unsafe, submitErr)
	}
	return res, submitErr
}
