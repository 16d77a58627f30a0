package pipeline

import (
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/bouncekv/bounce/transfer"
)

// directReq is a transfer on the direct path: one engine post of every
// descriptor. The engine reads the caller's memory until the op is terminal.
type directReq struct {
	b        *Batch
	peer     string
	pi       *peerInfo
	op       transfer.Op
	posted   time.Time
	timedOut bool
	span     trace.Span // the post's span; nil unless traced
}

func (r *reactor) submitDirect(b *Batch, pi *peerInfo, req Request) {
	if r.shuttingDown {
		r.publish(b, fmt.Errorf("pipeline: submit: %w", transfer.ErrClosed), true)
		return
	}
	if pi.forgotten.Load() {
		r.publish(b, fmt.Errorf("pipeline: submit to %q: forgotten before the request started: %w", req.Peer, transfer.ErrPeerLost), true)
		return
	}
	ops := make([]transfer.WriteOp, 0, len(req.Src))
	for i := range req.Src {
		if req.Src[i].Len == 0 {
			continue
		}
		ops = append(ops, transfer.WriteOp{Src: req.Src[i], Dst: req.Dst[i]})
	}
	if len(ops) == 0 {
		r.publish(b, nil, true)
		return
	}
	ctx, span := r.a.obs.directPosted(b, req.Peer, len(ops))
	var op transfer.Op
	var err error
	if cp, ok := r.a.set.Engine.(transfer.ContextPoster); ok && span != nil {
		op, err = cp.PostWriteContext(ctx, req.Peer, ops)
	} else {
		op, err = r.a.set.Engine.PostWrite(req.Peer, ops)
	}
	if err != nil {
		// Nothing was posted, so nothing touches the caller's memory.
		err = pi.lostErr(fmt.Errorf("pipeline: direct write to %q: %w", req.Peer, err))
		r.a.obs.directEnded(span, err)
		r.publish(b, err, true)
		return
	}
	r.direct[b.id] = &directReq{b: b, peer: req.Peer, pi: pi, op: op, posted: r.clock.Now(), span: span}
}

func (r *reactor) pollDirect() bool {
	progressed := false
	for id, d := range r.direct {
		st, err := d.op.Poll()
		if st == transfer.Pending {
			continue
		}
		progressed = true
		delete(r.direct, id)
		if rerr := d.op.Release(); rerr != nil {
			r.log.Warn("release direct op", "err", rerr)
		}
		quiet := true
		if st == transfer.Failed {
			if errors.Is(err, transfer.ErrDeviceFault) {
				d.b.markFault()
			}
			quiet = !errors.Is(err, transfer.ErrNotQuiescent)
			err = d.pi.lostErr(fmt.Errorf("pipeline: direct write to %q: %w", d.peer, err))
		}
		r.a.obs.directEnded(d.span, err)
		r.publish(d.b, err, quiet)
	}
	return progressed
}

// fail publishes the batch failed but not quiescent: the op stays polled
// and the batch becomes quiescent when the engine finally lets go.
func (d *directReq) fail(r *reactor, err error) {
	r.publish(d.b, err, false)
}

func (d *directReq) checkTimeout(r *reactor, now time.Time) {
	if !d.timedOut && now.Sub(d.posted) > r.cfg.RequestTimeout {
		d.timedOut = true
		d.fail(r, fmt.Errorf("pipeline: direct write to %q did not complete within %v: %w", d.peer, r.cfg.RequestTimeout, transfer.ErrTimeout))
	}
}
