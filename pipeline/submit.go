package pipeline

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/bouncekv/bounce/pipeline/costmodel"
	"github.com/bouncekv/bounce/pipeline/plan"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// SubmitContext is Submit with a context whose span, if any, becomes the
// parent of the transfer's span. Cancelling ctx does not cancel the
// transfer (see Batch.Abandon).
//
// A request's way in reads validate → decide → dispatch: validate checks
// the arguments (and resolves a block-table request's pools), decide
// returns the route, the plan and the reason, dispatch hands the batch to
// the reactor.
func (a *Agent) SubmitContext(ctx context.Context, req Request) (*Batch, error) {
	s, err := a.validate(req)
	if err != nil {
		return nil, err
	}
	d, err := a.decide(s)
	if err != nil {
		s.release()
		return nil, err
	}
	return a.dispatch(ctx, s, d), nil
}

// submission is a request on its way in: validated, with what decide
// needs computed once.
type submission struct {
	req   Request
	pi    *peerInfo
	want  Route    // the route asked for, RouteAuto resolved to Config.Route
	kinds kindMiss // what the engine cannot touch (engineCannot, once)
	start time.Time
	// pool is a block-table request's source pool, pinned until the batch
	// is quiescent (or the request is refused: release).
	pool   *localPool
	a      *Agent
	pinned bool
}

// release unpins a refused request's source pool.
func (s *submission) release() {
	if s.pinned {
		s.pinned = false
		s.a.unusePool(s.pool)
	}
}

// decision is decide's answer: the route, why (low cardinality) and the
// reason text, the plan of a bounce request and route auto's prediction.
type decision struct {
	route       Route
	why, reason string
	plan        *plan.Plan
	planDur     time.Duration
	pred        RoutePrediction
	shape       costmodel.Shape
}

// validate checks req's arguments (mismatched descriptors, both forms,
// unknown peer or pool, block ids out of range or repeated at the
// destination, agent shut down): O(descriptors) or O(ids), never
// O(pieces).
func (a *Agent) validate(req Request) (*submission, error) {
	if a.closing.Load() {
		return nil, fmt.Errorf("pipeline: submit: %w", transfer.ErrClosed)
	}
	if req.Blocks != nil && (len(req.Src) > 0 || len(req.Dst) > 0) {
		return nil, fmt.Errorf("pipeline: submit: a request has descriptors (Src, Dst) or blocks (Blocks), not both")
	}
	if len(req.Src) != len(req.Dst) {
		return nil, fmt.Errorf("pipeline: submit: %d sources but %d destinations", len(req.Src), len(req.Dst))
	}
	if len(req.Tag) > wire.MaxTag {
		return nil, fmt.Errorf("pipeline: submit: tag is %d bytes; a tag holds at most %d", len(req.Tag), wire.MaxTag)
	}
	for i := range req.Src {
		if req.Src[i].Len != req.Dst[i].Len {
			return nil, fmt.Errorf("pipeline: submit: descriptor %d: source length %d != destination length %d", i, req.Src[i].Len, req.Dst[i].Len)
		}
	}
	a.peersMu.RLock()
	pi, ok := a.peers[req.Peer]
	a.peersMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("pipeline: submit to %q: %w (call LoadPeer first)", req.Peer, transfer.ErrUnknownPeer)
	}
	s := &submission{pi: pi, start: time.Now(), a: a}
	if req.Blocks != nil {
		br, lp, err := a.resolveBlocks(req.Blocks, pi)
		if err != nil {
			return nil, fmt.Errorf("pipeline: submit to %q: %w", req.Peer, err)
		}
		req.Blocks, s.pool, s.pinned = br, lp, true
	}
	req.Tag = bytes.Clone(req.Tag) // the caller may reuse its slice
	s.req = req
	s.want = req.Route
	if s.want == RouteAuto {
		s.want = a.cfg.Route
	}
	s.kinds = engineCannot(a.set.Engine, req)
	return s, nil
}

// decide returns the route of s, with the reason and, for the bounce
// route, the plan: the gates (route), a required bounce refused, route
// auto's cost model, planning (a WANT too large for the control channel
// sends the request direct), then the kind check of the route's first
// stage.
func (a *Agent) decide(s *submission) (decision, error) {
	var d decision
	req := s.req
	d.route, d.why, d.reason = a.route(s)
	if s.want == RouteBounce && d.route != RouteBounce && d.why != whyEmpty {
		a.stats.bounceRefused.Add(1)
		if d.why == whyMemoryKind { // no stage on this route can touch the memory
			return d, fmt.Errorf("pipeline: submit to %q: %w: %s: %w", req.Peer, ErrBounceUnavailable, d.reason, transfer.ErrUnsupported)
		}
		return d, fmt.Errorf("pipeline: submit to %q: %w: %s", req.Peer, ErrBounceUnavailable, d.reason)
	}
	if a.router != nil {
		if d.route == RouteBounce && s.want == RouteAuto && d.why != whyEngineKind {
			c, shape := a.router.decide(req)
			d.pred = RoutePrediction{Made: true, Bounce: c.Prediction.Bounce, Direct: c.Prediction.Direct, Explore: c.Explore}
			d.shape, d.why, d.reason = shape, whyCostModel, "auto: "+c.Reason
			if c.Route == costmodel.Direct {
				d.route = RouteDirect
				a.stats.autoDirect.Add(1)
			} else {
				a.stats.autoBounce.Add(1)
			}
		} else {
			d.shape = a.router.shape(req)
		}
	}
	if d.route == RouteBounce {
		planning := time.Now()
		p, err := a.plan(req)
		if err != nil {
			return d, err
		}
		d.plan, d.planDur = p, time.Since(planning)
		if tooLarge := a.wantTooLarge(p); tooLarge != "" {
			if s.want == RouteBounce {
				a.stats.bounceRefused.Add(1)
				return d, fmt.Errorf("pipeline: submit to %q: %w: %s", req.Peer, ErrBounceUnavailable, tooLarge)
			}
			d.route, d.why, d.reason, d.plan = RouteDirect, whyControlLimit, tooLarge, nil
		}
	}
	if err := a.checkKinds(d.route, s); err != nil {
		if d.route == RouteDirect && d.why != whyDirectRequested {
			return d, fmt.Errorf("pipeline: submit to %q: %w (the bounce route was not taken: %s)", req.Peer, err, d.reason)
		}
		return d, fmt.Errorf("pipeline: submit to %q: %w", req.Peer, err)
	}
	return d, nil
}

// dispatch makes the batch of a decided request and hands it to the
// reactor.
func (a *Agent) dispatch(ctx context.Context, s *submission, d decision) *Batch {
	req, pi := s.req, s.pi
	if d.route == RouteDirect {
		a.fellBack(pi, d.why, d.reason)
	}
	id := a.nextID.Add(1)
	b := newBatch(id, d.route, d.reason, req.OnComplete)
	b.obs.start, b.obs.why, b.obs.tag = s.start, d.why, s.req.Tag
	b.pred, b.start = d.pred, s.start
	if s.pinned {
		lp := s.pool
		b.unpin = func() { a.unusePool(lp) }
	}
	if a.router != nil && d.shape.Descs > 0 {
		cr := costmodel.Direct
		if d.route == RouteBounce {
			cr = costmodel.Bounce
		}
		rt, shape := a.router, d.shape
		b.observe = func(el time.Duration) { rt.observe(cr, shape, el) }
	}
	b.abandon = func(timeout time.Duration) transfer.AbandonOutcome { return a.abandon(b, timeout) }
	switch d.route {
	case RouteBounce:
		p := d.plan
		b.plan = d.planDur
		b.obs.bytes = p.Payload
		a.obs.submitted(ctx, b, req.Peer, pi.endpoint, req.count(), d.reason)
		a.obs.planned(b, p)
		a.stats.bounceSubmits.Add(1)
		var wb *wire.WantBlocks
		if br := req.Blocks; br != nil {
			wb = &wire.WantBlocks{Pool: br.DstPool, BlockLen: br.dst.Pool.BlockLen, Pieces: br.pieces(), IDs: br.DstIDs}
			if br.conv != nil {
				wb.Shape = &br.conv.Dst
			}
		}
		a.post(func(r *reactor) { r.submitBounce(b, pi, p, req.Tag, wb) })
	default:
		b.obs.bytes = req.bytes()
		a.obs.submitted(ctx, b, req.Peer, pi.endpoint, req.count(), d.reason)
		a.stats.directSubmits.Add(1)
		a.post(func(r *reactor) { r.submitDirect(b, pi, req) })
	}
	return b
}
