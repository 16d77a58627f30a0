package pipeline

import (
	"fmt"
	"slices"
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
type writeGuard struct {
	mu     sync.RWMutex
	arena  transfer.Desc
	grants map[uint64]grantEntry // by region offset
	user   []userRange
	closed bool
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

func newWriteGuard() *writeGuard { return &writeGuard{grants: map[uint64]grantEntry{}} }

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

// revoke ends the writability of the region at off.
func (g *writeGuard) revoke(off uint64) {
	g.mu.Lock()
	delete(g.grants, off)
	g.mu.Unlock()
}

// revokeMatching ends every grant whose flow match selects.
func (g *writeGuard) revokeMatching(match func(credit.FlowKey) bool) {
	g.mu.Lock()
	for off, e := range g.grants {
		if match(e.flow) {
			delete(g.grants, off)
		}
	}
	g.mu.Unlock()
}

// addUser records registered user memory writable by peers (nil: all).
func (g *writeGuard) addUser(d transfer.Desc, peers []string) {
	g.mu.Lock()
	g.user = append(g.user, userRange{d: d, peers: peers})
	g.mu.Unlock()
}

func (g *writeGuard) removeUser(d transfer.Desc) {
	g.mu.Lock()
	g.user = slices.DeleteFunc(g.user, func(u userRange) bool { return u.d == d })
	g.mu.Unlock()
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
			r := transfer.Desc{Addr: g.arena.Addr + off, Len: e.len, Device: g.arena.Device, Kind: g.arena.Kind}
			if r.Contains(dst.Addr, dst.Len) {
				if e.flow.Peer != peer {
					return transfer.Desc{}, fmt.Errorf("arena region %#x is granted to %q, not %q: %w", off, e.flow.Peer, peer, transfer.ErrForbidden)
				}
				return r, nil
			}
		}
		return transfer.Desc{}, fmt.Errorf("arena range [%#x+%d] is not granted to %q: %w", dst.Addr, dst.Len, peer, transfer.ErrForbidden)
	}
	for _, u := range g.user {
		if u.d.Contains(dst.Addr, dst.Len) {
			if u.peers != nil && !slices.Contains(u.peers, peer) {
				return transfer.Desc{}, fmt.Errorf("memory %v is registered for %v, not %q: %w", u.d, u.peers, peer, transfer.ErrForbidden)
			}
			return u.d, nil
		}
	}
	return transfer.Desc{}, fmt.Errorf("[%#x+%d] is not registered memory: %w", dst.Addr, dst.Len, transfer.ErrForbidden)
}
