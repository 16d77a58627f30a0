package pipeline

import "time"

// peerRefuser is the optional capability of a control channel that learns
// when a peer refused this agent's handshake (zmq: its ZAP handler did not
// admit this agent's key). err says the likely cause.
type peerRefuser interface {
	SetPeerRefused(fn func(peer string, err error))
}

// watchRefusals has the requests to a peer that refused this agent fail
// within refusedGrace, wrapping ErrRefused and the channel's cause,
// instead of waiting out request_timeout for a GRANT that cannot come. The
// refused peer learns nothing it did not know: its handshake already said
// no.
func (a *Agent) watchRefusals(c any) {
	pr, ok := c.(peerRefuser)
	if !ok || !a.bounceOn {
		return
	}
	pr.SetPeerRefused(func(peer string, err error) {
		a.post(func(r *reactor) { r.peerRefused(peer, err) })
	})
}

// refusedGrace is how long a refusal stands before the requests to the
// peer fail: admission can trail a sender by a moment (a receiver that
// follows its senders through discovery admits one once it has read its
// record), and the channel dials again at its next send, so a refusal
// that is over within it (the peer heard from, or its connection up) fails
// nothing.
const refusedGrace = time.Second

// peerRefusal is a peer's refusal of this agent's handshake: the first
// since it was last heard from, and why.
type peerRefusal struct {
	at  time.Time
	err error
}

// peerRefused records the refusal; checkTimeouts fails the peer's
// requests once it stood for refusedGrace.
func (r *reactor) peerRefused(peer string, err error) {
	if _, ok := r.refusals[peer]; !ok {
		r.refusals[peer] = peerRefusal{at: r.clock.Now(), err: err}
	}
}

// peerUp clears what a peer's connection coming up disproves: its loss and
// its refusal.
func (r *reactor) peerUp(peer string) {
	delete(r.down, peer)
	delete(r.refusals, peer)
}

// refusedFor reports whether q's peer has refused this agent for
// refusedGrace.
func (r *reactor) refusedFor(q *sendReq, now time.Time) bool {
	f, ok := r.refusals[q.peer]
	return ok && now.Sub(f.at) > refusedGrace
}
