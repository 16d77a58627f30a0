package pipeline

import "fmt"

// peerRefuser is the optional capability of a control channel that learns
// when a peer refused this agent's handshake (zmq: its ZAP handler did not
// admit this agent's key). err says the likely cause.
type peerRefuser interface {
	SetPeerRefused(fn func(peer string, err error))
}

// watchRefusals has the requests to a peer that refused this agent fail at
// once, wrapping ErrRefused and the channel's cause, instead of waiting out
// request_timeout for a GRANT that cannot come. The refused peer learns
// nothing it did not know: its handshake already said no.
func (a *Agent) watchRefusals(c any) {
	pr, ok := c.(peerRefuser)
	if !ok || !a.bounceOn {
		return
	}
	pr.SetPeerRefused(func(peer string, err error) {
		a.post(func(r *reactor) { r.peerRefused(peer, err) })
	})
}

// peerRefused fails every unresolved request to peer.
func (r *reactor) peerRefused(peer string, err error) {
	for _, q := range r.reqs {
		if q.peer == peer && q.err == nil {
			r.fail(q, fmt.Errorf("pipeline: request %d to %q: %w: %w", q.id, peer, ErrRefused, err))
		}
	}
}
