package pipeline

import (
	"fmt"
	"sync"

	"github.com/bouncekv/bounce/transfer"
)

// PullRead says whether this agent's pulls read the holder's staged
// regions (bounce.pull_read) where both ends' engines can (a
// transfer.Reader that serves reads: transfer.CanRead): auto reads there
// the pulls that land in host memory and has the holder write the rest
// (device KV: readsInto), off always has the holder write. Zero means the
// default (DefaultConfig's).
type PullRead uint8

const (
	// PullReadAuto reads where both engines can.
	PullReadAuto PullRead = 1 + iota
	// PullReadOff never reads: the holder writes into the granted regions.
	PullReadOff
)

// String returns "auto", "off" or "default".
func (p PullRead) String() string {
	switch p {
	case PullReadAuto:
		return "auto"
	case PullReadOff:
		return "off"
	}
	return "default"
}

// readGuard is the holder's authorization of its pullers' reads,
// installed in an engine that serves reads (transfer.ReadGuarded): a peer
// may read only an arena region this agent staged for a pull of that peer
// and offered it (STAGED), from the offer until the chunk's ACK, or the
// pull's failure, revokes it. Nothing else of this agent's memory is ever
// readable. The reactor maintains the grants; engines ask from their own
// goroutines.
//
// Revoking ends the grant at once (no read of the region is admitted
// after) and queues its fence (transfer.ReadGuarded.FenceReads, waiting
// for the reads already being served), which runs off the reactor
// (readFencer): an engine's fence may wait for a response a puller does
// not drain, and the reactor serves every other peer meanwhile. fenced is
// told each region whose fence returned; only then is the region reused,
// so no peer reads what it holds next.
type readGuard struct {
	mu     sync.RWMutex
	arena  transfer.Desc
	grants map[uint64]readGrant // by arena offset
	closed bool
	fence  func(transfer.Desc)
	fencer readFencer
}

type readGrant struct {
	peer string
	len  uint64
}

// newReadGuard returns a guard of arena whose revocations fence with
// fence, off the caller's goroutine, and then call fenced with the region's
// offset (on the fencing goroutine).
func newReadGuard(arena transfer.Desc, fence func(transfer.Desc), fenced func(off uint64)) *readGuard {
	return &readGuard{arena: arena, grants: map[uint64]readGrant{}, fence: fence,
		fencer: readFencer{fence: fence, done: fenced, queues: map[string][]readFence{}}}
}

// grant lets peer read the arena region at off (n bytes).
func (g *readGuard) grant(peer string, off, n uint64) {
	g.mu.Lock()
	g.grants[off] = readGrant{peer: peer, len: n}
	g.mu.Unlock()
}

// revoke ends the read grant at off at once and queues its fence; it never
// waits. fencing says a fence was queued, and fenced will be told of off
// once no read of the region is served any more; false: off held no grant
// (nothing to fence), or the guard is closed (close fences the arena).
func (g *readGuard) revoke(off uint64) (fencing bool) {
	g.mu.Lock()
	e, ok := g.grants[off]
	delete(g.grants, off)
	closed := g.closed
	g.mu.Unlock()
	if !ok || closed {
		return false
	}
	return g.fencer.add(e.peer, readFence{off: off, region: g.region(off, e.len)})
}

// close refuses every read from now on, waits for the fences under way
// (those still queued are dropped) and fences the whole arena: once it
// returns no read of the arena is served.
func (g *readGuard) close() {
	g.mu.Lock()
	g.closed = true
	clear(g.grants)
	g.mu.Unlock()
	g.fencer.close()
	g.fence(g.arena)
}

func (g *readGuard) region(off, n uint64) transfer.Desc {
	return transfer.Desc{Addr: g.arena.Addr + off, Len: n, Device: g.arena.Device, Kind: g.arena.Kind}
}

// check is the transfer.ReadGuard.
func (g *readGuard) check(peer string, src transfer.Desc) (transfer.Desc, error) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return transfer.Desc{}, fmt.Errorf("agent shut down: %w", transfer.ErrForbidden)
	}
	if src.Addr >= g.arena.Addr && src.End() <= g.arena.End() {
		for off, e := range g.grants {
			r := g.region(off, e.len)
			if r.Contains(src.Addr, src.Len) {
				if e.peer != peer {
					return transfer.Desc{}, fmt.Errorf("staged region %#x is offered to %q, not %q: %w", off, e.peer, peer, transfer.ErrForbidden)
				}
				return r, nil
			}
		}
	}
	return transfer.Desc{}, fmt.Errorf("[%#x+%d] is no staged region offered to %q: %w", src.Addr, src.Len, peer, transfer.ErrForbidden)
}

// readFencer runs the fences of revoked read grants off the reactor: one
// goroutine per puller with fences queued, which ends once its queue is
// empty, so a puller whose fence waits (a response it does not drain)
// holds up only its own regions. done is called on that goroutine with
// each region's offset once its fence returned.
type readFencer struct {
	fence func(transfer.Desc)
	done  func(off uint64)

	mu sync.Mutex
	// queues holds each puller's fences not started yet; a puller is a
	// key while its goroutine runs.
	queues map[string][]readFence
	closed bool
	wg     sync.WaitGroup
}

// readFence is one revoked grant's region, at arena offset off.
type readFence struct {
	off    uint64
	region transfer.Desc
}

// add queues f behind peer's other fences, starting peer's goroutine when
// none runs; false once closed (nothing queued).
func (f *readFencer) add(peer string, j readFence) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	q, running := f.queues[peer]
	f.queues[peer] = append(q, j)
	if !running {
		f.wg.Add(1)
		go f.run(peer)
	}
	return true
}

// run fences peer's queued regions in order until none is left, or the
// fencer closed.
func (f *readFencer) run(peer string) {
	defer f.wg.Done()
	for {
		f.mu.Lock()
		q := f.queues[peer]
		if len(q) == 0 || f.closed {
			delete(f.queues, peer)
			f.mu.Unlock()
			return
		}
		j := q[0]
		q[0] = readFence{}
		f.queues[peer] = q[1:]
		f.mu.Unlock()
		f.fence(j.region)
		f.done(j.off)
	}
}

// close drops the fences not started yet and waits for those under way.
func (f *readFencer) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.wg.Wait()
}
