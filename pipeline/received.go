package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/pipeline/wire"
)

// Received is a receiver-side completion event: one request a peer sent to
// this agent ended. Err is nil when every byte of it landed in its
// destinations (bounce: every chunk scattered; direct: the sender's engine
// op was Done and the sender said so, on the control path or, to a peer
// without one, as an engine notification); otherwise it says why the request
// will never complete here (the sender cancelled it, the flow expired, the
// peer was forgotten, a scatter failed, the receiver shut down, ...). Bytes
// counts the payload bytes that landed before the event (all of them on
// success).
type Received struct {
	// Peer is the sending agent's name.
	Peer string
	// Request is the sender's request id (unique per sending agent).
	Request uint64
	// Tag is the caller tag the sender gave the request (Request.Tag).
	Tag []byte
	// Bytes is the payload that landed.
	Bytes uint64
	// Route is the path the request took.
	Route Route
	// Err is nil on success, the failure cause otherwise.
	Err error
	// Pull is set on the holder of a pull (PullRequest): the event reports
	// a pull Peer made of this agent's memory (Request is the puller's id),
	// once nothing of it is outstanding here; Bytes is the payload the
	// puller acknowledged. Quiescent then says no gather still reads the
	// sources (false only when a copy ended without that proof): the
	// memory may be reused.
	Pull      bool
	Quiescent bool
}

// Errors a failed Received event wraps (besides ErrRefused, when this
// receiver refused the request or one of its chunks, transfer.ErrPeerLost,
// transfer.ErrTimeout and transfer.ErrClosed).
var (
	// ErrSenderCancelled: the sender gave the request up (its own failure,
	// timeout or Abandon) before every chunk landed.
	ErrSenderCancelled = errors.New("cancelled by the sender")
	// ErrSenderFailed: the sender reported a direct-path request failed.
	ErrSenderFailed = errors.New("failed on the sender")
)

// recvFlow is the receiver's bookkeeping of one bounce request for its
// completion event; the reactor owns it.
type recvFlow struct {
	tag     []byte
	chunks  int // chunks the WANT asked for
	landed  int // chunks scattered
	payload uint64
	// blocks is a block-table request's destination, checked once at its
	// WANT; nil for the descriptor form.
	blocks *recvBlocks
	start  time.Time // the WANT's arrival (the receive latency's start)
	// pull is set on a flow this agent pulls (its batch resolves instead
	// of a Received event).
	pull *pullReq
}

// received delivers an event without ever blocking the reactor: the
// channel is the consumer's (Settings.Received, sized by it); when it is
// full the event is dropped, counted in Stats.DroppedEvents and logged (the
// first drop, then every 1024th).
func (r *reactor) received(ev Received) {
	r.a.stats.events.Add(1)
	ch := r.a.set.Received
	if ch == nil {
		return
	}
	select {
	case ch <- ev:
	default:
		if n := r.a.stats.droppedEvents.Add(1); n == 1 || n%1024 == 0 {
			r.log.Warn("receive event dropped: the consumer's channel is full", "peer", ev.Peer, "request", ev.Request, "dropped_total", n)
		}
	}
}

// flowStarted records an accepted WANT.
func (r *reactor) flowStarted(key credit.FlowKey, w *wire.Want, rb *recvBlocks) {
	r.rflows[key] = &recvFlow{tag: w.Tag, chunks: len(w.ChunkBytes), blocks: rb, start: r.clock.Now()}
}

// endRecvFlow forgets a flow's record and unpins its destination pool.
func (r *reactor) endRecvFlow(key credit.FlowKey, f *recvFlow) {
	delete(r.rflows, key)
	if f.blocks != nil && f.blocks.pool != nil {
		r.a.unusePool(f.blocks.pool)
	}
	f.blocks = nil
}

// chunkLanded counts a scattered chunk and reports the request when it was
// the last.
func (r *reactor) chunkLanded(key credit.FlowKey, payload uint64) {
	f, ok := r.rflows[key]
	if !ok {
		return
	}
	f.landed++
	f.payload += payload
	r.a.obs.bytesLanded(RouteBounce, payload)
	if f.pull != nil {
		f.pull.lastProgress = r.clock.Now()
	}
	if f.landed == f.chunks {
		r.endRecvFlow(key, f)
		if f.pull != nil {
			r.a.obs.receivedFlow(RouteBounce, nil, r.clock.Now().Sub(f.start))
			r.pullLanded(f.pull)
			return
		}
		r.a.obs.receivedFlow(RouteBounce, nil, r.clock.Now().Sub(f.start))
		r.received(Received{Peer: key.Peer, Request: key.Request, Tag: f.tag, Bytes: f.payload, Route: RouteBounce})
	}
}

// flowFailed reports a request that will not complete here, once.
func (r *reactor) flowFailed(key credit.FlowKey, err error) {
	f, ok := r.rflows[key]
	if !ok {
		return
	}
	// Its chunks still queued never start: the request failed, and its
	// destination pool is unpinned below.
	r.cancelScatters(func(k credit.FlowKey) bool { return k == key })
	r.endRecvFlow(key, f)
	r.a.obs.receivedFlow(RouteBounce, err, r.clock.Now().Sub(f.start))
	if f.pull != nil {
		r.pullFailed(f.pull, fmt.Errorf("pipeline: pull %d from %q: %w", f.pull.b.id, key.Peer, err))
		return
	}
	r.received(Received{Peer: key.Peer, Request: key.Request, Tag: f.tag, Bytes: f.payload, Route: RouteBounce,
		Err: fmt.Errorf("pipeline: request %d from %q: %w", key.Request, key.Peer, err)})
}

// failFlows reports every live request that match selects.
func (r *reactor) failFlows(match func(credit.FlowKey) bool, err error) {
	for key := range r.rflows {
		if match(key) {
			r.flowFailed(key, err)
		}
	}
}

// onDone reports a direct-path request its sender says ended.
func (r *reactor) onDone(peer string, m *wire.Done) {
	ev := Received{Peer: peer, Request: m.Request, Tag: m.Tag, Bytes: m.Bytes, Route: RouteDirect}
	if m.Reason != "" {
		ev.Err = fmt.Errorf("pipeline: direct request %d from %q: %w: %s", m.Request, peer, ErrSenderFailed, m.Reason)
	} else {
		r.a.obs.bytesLanded(RouteDirect, m.Bytes) // the engine placed them; DONE says so
	}
	r.a.obs.receivedFlow(RouteDirect, ev.Err, -1)
	r.a.obs.doneReceived(peer, m)
	r.received(ev)
}

// refused reports a WANT this receiver refused before its flow started.
func (r *reactor) refused(key credit.FlowKey, w *wire.Want, why string) {
	r.received(Received{Peer: key.Peer, Request: key.Request, Tag: w.Tag, Route: RouteBounce,
		Err: fmt.Errorf("pipeline: request %d from %q: %w: %s", key.Request, key.Peer, ErrRefused, why)})
}
