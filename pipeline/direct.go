package pipeline

import (
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/bouncekv/bounce/pipeline/wire"
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
	tag      []byte
	bytes    uint64
	told     bool // the DONE notice went out (or could not)
}

// tell sends the receiver the DONE notice of a direct request, once: after
// the op was Done (every byte landed), or when the request failed. It goes
// on the control path when the peer has one, else as an engine
// notification (transfer.Notifier) on the connections the bytes took; an
// engine without notifications and no control path leave nobody to tell.
func (d *directReq) tell(r *reactor, err error) {
	if d.told {
		return
	}
	d.told = true
	if d.pi.forgotten.Load() {
		return
	}
	n, notes := r.a.set.Engine.(transfer.Notifier)
	if !d.pi.ctrl && !notes {
		return
	}
	m := &wire.Done{Request: d.b.id, Tag: d.tag}
	r.a.obs.inject(d.b.obs.ctx, &m.TraceParent)
	if err != nil {
		m.Reason = err.Error()
		if len(m.Reason) > wire.MaxString {
			m.Reason = m.Reason[:wire.MaxString]
		}
	} else {
		m.Bytes = d.bytes
	}
	if d.pi.ctrl {
		m.Endpoint = r.a.set.Control.LocalEndpoint()
		_ = r.send(d.peer, m)
		return
	}
	if nerr := notify(n, d.peer, m); nerr != nil {
		r.a.stats.sendDrops.Add(1)
		r.log.Warn("DONE notice not sent as an engine notification", "peer", d.peer, "request", d.b.id, "err", nerr)
	}
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
	d := &directReq{b: b, peer: req.Peer, pi: pi, posted: r.clock.Now(), tag: req.Tag}
	var ops []transfer.WriteOp
	var blocks *transfer.BlockWrite
	if br := req.Blocks; br != nil && br.conv != nil {
		ops = convertedWrites(br)
		d.bytes = br.pieces() * br.unitLen()
	} else if br != nil {
		if n := br.pieces(); n > 0 {
			blocks = &transfer.BlockWrite{Src: br.src, Dst: br.dst, Count: n}
			d.bytes = n * br.src.Pool.BlockLen
		}
	} else {
		ops = make([]transfer.WriteOp, 0, len(req.Src))
		for i := range req.Src {
			if req.Src[i].Len == 0 {
				continue
			}
			ops = append(ops, transfer.WriteOp{Src: req.Src[i], Dst: req.Dst[i]})
			d.bytes += req.Src[i].Len
		}
	}
	if len(ops) == 0 && blocks == nil {
		d.tell(r, nil)
		r.publish(b, nil, true)
		return
	}
	n := len(ops)
	if blocks != nil {
		n = int(blocks.Count)
	}
	ctx, span := r.a.obs.directPosted(b, req.Peer, n)
	var op transfer.Op
	var err error
	bp, posts := r.a.set.Engine.(transfer.BlockPoster)
	switch {
	case blocks != nil && posts:
		op, err = bp.PostBlocks(req.Peer, *blocks)
	case blocks != nil:
		// An engine without block posts gets the pieces spelled out: the
		// per-descriptor baseline itself.
		ops = expandWrites(*blocks)
		fallthrough
	default:
		if cp, ok := r.a.set.Engine.(transfer.ContextPoster); ok && span != nil {
			op, err = cp.PostWriteContext(ctx, req.Peer, ops)
		} else {
			op, err = r.a.set.Engine.PostWrite(req.Peer, ops)
		}
	}
	if err != nil {
		// Nothing was posted, so nothing touches the caller's memory.
		err = pi.lostErr(fmt.Errorf("pipeline: direct write to %q: %w", req.Peer, err))
		r.a.obs.directEnded(span, err)
		d.tell(r, err)
		r.publish(b, err, true)
		return
	}
	d.op, d.span = op, span
	r.direct[b.id] = d
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
		d.tell(r, err)
		if err == nil {
			d.b.setStages(Stages{Write: time.Since(d.posted)})
		}
		r.publish(d.b, err, quiet)
	}
	return progressed
}

// fail publishes the batch failed but not quiescent: the op stays polled
// and the batch becomes quiescent when the engine finally lets go.
func (d *directReq) fail(r *reactor, err error) {
	d.tell(r, err)
	r.publish(d.b, err, false)
}

func (d *directReq) checkTimeout(r *reactor, now time.Time) {
	if !d.timedOut && now.Sub(d.posted) > r.cfg.RequestTimeout {
		d.timedOut = true
		d.fail(r, fmt.Errorf("pipeline: direct write to %q did not complete within %v: %w", d.peer, r.cfg.RequestTimeout, transfer.ErrTimeout))
	}
}
