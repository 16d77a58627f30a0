package main

import (
	"fmt"
	"sync"

	"github.com/bouncekv/bounce/pipeline/convert"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

// layoutBook is what an agent handle knows of pool layouts: its own
// pools' (as registered through the library) and its peers' (from the
// descriptors it loaded). It exists for one check the pipeline does not
// make: a pull moves blocks as they are (Agent.Pull plans no
// conversion), so a pull between pools of different layouts is refused
// here rather than landing its bytes in the wrong order (checkPull).
type layoutBook struct {
	mu    sync.Mutex
	own   map[string]transfer.Layout            // pool name -> layout; absent: none
	peers map[string]map[string]transfer.Layout // peer -> pool name -> layout
}

func newLayoutBook() *layoutBook {
	return &layoutBook{own: map[string]transfer.Layout{}, peers: map[string]map[string]transfer.Layout{}}
}

// registered records local pool name's layout (nil: none), once the
// pipeline registered it.
func (b *layoutBook) registered(name string, l *transfer.Layout) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l == nil {
		delete(b.own, name)
		return
	}
	b.own[name] = *l
}

// deregistered forgets local pool name.
func (b *layoutBook) deregistered(name string) { b.registered(name, nil) }

// loaded records the layouts of the pools peer's descriptor advertises
// (the pipeline loaded it: blob decodes); a reload replaces them.
func (b *layoutBook) loaded(peer string, blob []byte) {
	d, err := wire.UnmarshalAgentDesc(blob)
	ls := map[string]transfer.Layout{}
	if err == nil {
		for _, p := range d.Pools {
			if p.Layout != nil {
				ls[p.Name] = *p.Layout
			}
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.peers[peer] = ls
}

// forgot forgets peer's layouts.
func (b *layoutBook) forgot(peer string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.peers, peer)
}

// checkPull refuses a block pull from peer's pool src into local pool dst
// when both have a layout and they differ in more than name: layouts that
// cannot be converted wrap convert.ErrIncompatible (with its reason),
// layouts that could be but are not by a pull transfer.ErrUnsupported.
// A pool without a layout is moved as is, as a push would.
func (b *layoutBook) checkPull(peer, src, dst string) error {
	b.mu.Lock()
	sl, sok := b.peers[peer][src]
	dl, dok := b.own[dst]
	b.mu.Unlock()
	if !sok || !dok {
		return nil
	}
	return pullLayouts(src, sl, dst, dl)
}

// pullLayouts is checkPull's judgement of two layouts.
func pullLayouts(src string, sl transfer.Layout, dst string, dl transfer.Layout) error {
	c, err := convert.Plan(sl, dl, convert.Auto)
	if err != nil {
		return fmt.Errorf("pull from pool %q into pool %q: %w", src, dst, err)
	}
	if !c.Identity() {
		return fmt.Errorf("pull from pool %q (%v) into pool %q (%v): a pull does not convert layouts (push instead, or pull into a pool of the holder's layout): %w",
			src, sl, dst, dl, transfer.ErrUnsupported)
	}
	return nil
}
