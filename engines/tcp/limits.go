package tcp

import (
	"fmt"
	"sync"
	"time"

	"github.com/bouncekv/bounce/transfer"
)

// smallBody is the largest frame body a connection reads into its own
// reused buffer; a larger one is charged to the engine's bodyBudget while
// it is received and handled.
const smallBody = 64 << 10

// bodyBudget bounds what peers hold of a receiver's resource: all peers
// together hold at most total units, one peer at most perPeer. The engine
// has one for the memory of large incoming frame bodies (bytes) and, with
// Config.Device, one for its incoming staging buffers (buffers). The
// frames' headers arrive before their bodies, so without it a peer that
// declares many large bodies and trickles them holds their memory for a
// frame timeout each. A body that does not fit waits for one to be
// handed back, up to its frame's deadline. It holds in every security
// mode. Peer "" is connections still in their HELLO.
type bodyBudget struct {
	total, perPeer int64

	mu     sync.Mutex
	used   int64
	byPeer map[string]int64
	freed  chan struct{} // closed and replaced whenever bytes are handed back
}

func newBodyBudget(total, perPeer int64) *bodyBudget {
	return &bodyBudget{total: total, perPeer: perPeer, byPeer: map[string]int64{}, freed: make(chan struct{})}
}

// take charges n units to peer, waiting while they do not fit, until
// deadline or until stop is closed.
func (b *bodyBudget) take(peer string, n int64, deadline time.Time, stop, done <-chan struct{}) error {
	if n > b.perPeer || n > b.total {
		return fmt.Errorf("%d exceeds the budget (%d per peer, %d in all): %w", n, b.perPeer, b.total, transfer.ErrQueueFull)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		b.mu.Lock()
		if b.used+n <= b.total && b.byPeer[peer]+n <= b.perPeer {
			b.used += n
			b.byPeer[peer] += n
			b.mu.Unlock()
			return nil
		}
		freed := b.freed
		b.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case <-freed:
		case <-timer.C:
			return fmt.Errorf("no room for %d from %q in time (%d per peer, %d in all): %w", n, peer, b.perPeer, b.total, transfer.ErrTimeout)
		case <-stop:
			return transfer.ErrClosed
		case <-done:
			return transfer.ErrClosed
		}
	}
}

// give hands back n units peer took.
func (b *bodyBudget) give(peer string, n int64) {
	b.mu.Lock()
	b.used -= n
	if b.byPeer[peer] -= n; b.byPeer[peer] <= 0 {
		delete(b.byPeer, peer)
	}
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// inUse returns the units held in all.
func (b *bodyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
