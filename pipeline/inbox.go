package pipeline

import (
	"sync"

	"github.com/bouncekv/bounce/transfer"
)

// Per-sender bounds of the receive queue: a sender that floods the control
// plane fills only its own queue, and the reactor takes messages from the
// senders in turn, so a flood delays another sender's messages by at most
// one message per flooding sender.
const (
	inboxPerPeer      = 1024
	inboxPerPeerBytes = 64 << 20
)

// fairInbox is the queue between the control receive pump and the
// reactor: one FIFO per sending peer, served round-robin. It is safe for
// concurrent use by one pusher and one popper.
type fairInbox struct {
	mu     sync.Mutex
	queues map[string]*peerQueue
	ring   []string // peers with queued messages, in service order
	next   int

	ready chan struct{} // has a token while messages are queued
	space chan struct{} // gets a token when a message is taken
}

type peerQueue struct {
	msgs  []transfer.Message
	bytes int
}

func newFairInbox() *fairInbox {
	return &fairInbox{queues: map[string]*peerQueue{}, ready: make(chan struct{}, 1), space: make(chan struct{}, 1)}
}

// push queues m; false when m's sender already has its bound queued (the
// pusher waits on space and tries again).
func (q *fairInbox) push(m transfer.Message) bool {
	q.mu.Lock()
	pq := q.queues[m.Peer]
	if pq == nil {
		pq = &peerQueue{}
		q.queues[m.Peer] = pq
	}
	if len(pq.msgs) > 0 && (len(pq.msgs) >= inboxPerPeer || pq.bytes+len(m.Payload) > inboxPerPeerBytes) {
		q.mu.Unlock()
		return false
	}
	if len(pq.msgs) == 0 {
		q.ring = append(q.ring, m.Peer)
	}
	pq.msgs = append(pq.msgs, m)
	pq.bytes += len(m.Payload)
	q.mu.Unlock()
	signal(q.ready)
	return true
}

// pop takes the next message, from the next sender in turn.
func (q *fairInbox) pop() (transfer.Message, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.ring) == 0 {
		return transfer.Message{}, false
	}
	if q.next >= len(q.ring) {
		q.next = 0
	}
	peer := q.ring[q.next]
	pq := q.queues[peer]
	m := pq.msgs[0]
	pq.msgs[0] = transfer.Message{}
	pq.msgs = pq.msgs[1:]
	pq.bytes -= len(m.Payload)
	if len(pq.msgs) == 0 {
		delete(q.queues, peer)
		q.ring = append(q.ring[:q.next], q.ring[q.next+1:]...)
	} else {
		q.next++
	}
	if len(q.ring) > 0 {
		signal(q.ready)
	}
	signal(q.space)
	return m, true
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
