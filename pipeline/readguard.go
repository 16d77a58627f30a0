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
// Revoking is a fence: revoke returns only once the engine serves no read
// of the region any more (transfer.ReadGuarded.FenceReads), so the region
// is reused only when no peer can read what it holds next.
type readGuard struct {
	mu     sync.RWMutex
	arena  transfer.Desc
	grants map[uint64]readGrant // by arena offset
	closed bool
	fence  func(transfer.Desc)
}

type readGrant struct {
	peer string
	len  uint64
}

func newReadGuard(arena transfer.Desc, fence func(transfer.Desc)) *readGuard {
	return &readGuard{arena: arena, grants: map[uint64]readGrant{}, fence: fence}
}

// grant lets peer read the arena region at off (n bytes).
func (g *readGuard) grant(peer string, off, n uint64) {
	g.mu.Lock()
	g.grants[off] = readGrant{peer: peer, len: n}
	g.mu.Unlock()
}

// revoke ends the read grant at off; it returns once no read of the
// region is being served.
func (g *readGuard) revoke(off uint64) {
	g.mu.Lock()
	e, ok := g.grants[off]
	delete(g.grants, off)
	g.mu.Unlock()
	if ok {
		g.fence(g.region(off, e.len))
	}
}

// close refuses every read from now on and fences the whole arena.
func (g *readGuard) close() {
	g.mu.Lock()
	g.closed = true
	clear(g.grants)
	g.mu.Unlock()
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
