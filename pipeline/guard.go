package pipeline

import (
	"fmt"
	"sync"

	"github.com/bouncekv/bounce/pipeline/credit"
	"github.com/bouncekv/bounce/transfer"
)

// writeGuard is the receiver's authorization of incoming writes, installed
// in engines that ask one (transfer.WriteGuarded) while authentication is
// on. A write into the arena is allowed only inside a region currently
// granted to a flow of the writing peer (from its GRANT until its DATA, a
// cancel, a reclaim or a drop); a write outside the arena only into user
// memory registered for all admitted peers or for that peer. The reactor
// maintains the grant side; engines read it from their own goroutines.
//
// Ending a grant is a fence: revoke and revokeMatching return only once no
// write the guard allowed into the region is still landing (fence, the
// engine's transfer.WriteFencer), so a region is never granted again while a
// trickling frame of its former holder could still write it.
type writeGuard struct {
	mu     sync.RWMutex
	arena  transfer.Desc
	grants map[uint64]grantEntry // by region offset
	// dests is the agent's table of registered user memory and who may
	// write it, the one the DATA check reads too.
	dests  *scatterDests
	closed bool
	// fence cuts the engine's writes still landing in a range whose
	// authorization ended and waits for them; nil when the engine offers
	// none. Set before the guard is installed.
	fence func(transfer.Desc)
}

type grantEntry struct {
	flow credit.FlowKey
	len  uint64
}

// userRange is registered user memory and who may write it (nil: every
// admitted peer).
type userRange struct {
	d     transfer.Desc
	peers []string
}

func newWriteGuard(dests *scatterDests) *writeGuard {
	return &writeGuard{grants: map[uint64]grantEntry{}, dests: dests}
}

func (g *writeGuard) setArena(d transfer.Desc) {
	g.mu.Lock()
	g.arena = d
	g.mu.Unlock()
}

// grant records that the region at off (len bytes) is granted to flow.
func (g *writeGuard) grant(flow credit.FlowKey, off, n uint64) {
	g.mu.Lock()
	g.grants[off] = grantEntry{flow: flow, len: n}
	g.mu.Unlock()
}

// revoke ends the writability of the region at off; it returns once no
// write into it is landing.
func (g *writeGuard) revoke(off uint64) {
	g.mu.Lock()
	e, ok := g.grants[off]
	delete(g.grants, off)
	r := g.region(off, e.len)
	g.mu.Unlock()
	if ok && g.fence != nil {
		g.fence(r)
	}
}

// revokeMatching ends every grant whose flow match selects; it returns
// once no write into them is landing.
func (g *writeGuard) revokeMatching(match func(credit.FlowKey) bool) {
	var ended []transfer.Desc
	g.mu.Lock()
	for off, e := range g.grants {
		if match(e.flow) {
			delete(g.grants, off)
			if g.fence != nil {
				ended = append(ended, g.region(off, e.len))
			}
		}
	}
	g.mu.Unlock()
	for _, r := range ended {
		g.fence(r)
	}
}

// region is the arena range at off (n bytes). The caller holds mu.
func (g *writeGuard) region(off, n uint64) transfer.Desc {
	return transfer.Desc{Addr: g.arena.Addr + off, Len: n, Device: g.arena.Device, Kind: g.arena.Kind}
}

func (g *writeGuard) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// check is the transfer.WriteGuard.
func (g *writeGuard) check(peer string, dst transfer.Desc) (transfer.Desc, error) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return transfer.Desc{}, fmt.Errorf("agent shut down: %w", transfer.ErrForbidden)
	}
	if g.arena.Len > 0 && dst.Addr < g.arena.End() && g.arena.Addr < dst.End() {
		for off, e := range g.grants {
			r := g.region(off, e.len)
			if r.Contains(dst.Addr, dst.Len) {
				if e.flow.Peer != peer {
					return transfer.Desc{}, fmt.Errorf("arena region %#x is granted to %q, not %q: %w", off, e.flow.Peer, peer, transfer.ErrForbidden)
				}
				return r, nil
			}
		}
		return transfer.Desc{}, fmt.Errorf("arena range [%#x+%d] is not granted to %q: %w", dst.Addr, dst.Len, peer, transfer.ErrForbidden)
	}
	return g.dests.allowed(peer, dst.Addr, dst.Len)
}
