package driver

import (
	"errors"
	"fmt"

	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/transfer"
	"github.com/bouncekv/bounce/workload"
)

// MaxBlockRequests is the most requests one Run moves in the block-table
// form: each request has a pool of its own on each side (its slice of the
// buffer), and an agent's descriptor carries at most this many pools.
const MaxBlockRequests = 256

// SrcPool and DstPool name request i's pools in the block-table form: the
// sender's over its source buffer's i-th slice, the receiver's over its
// destination buffer's.
func SrcPool(i int) string { return fmt.Sprintf("kv-src-%d", i) }

// DstPool names request i's destination pool; see SrcPool.
func DstPool(i int) string { return fmt.Sprintf("kv-dst-%d", i) }

// Pools are block pools registered over a buffer, one per request slice.
type Pools struct {
	agent *pipeline.Agent
	names []string
}

// RegisterPools registers on agent, under name(i), the pool of request i's
// slice of buf (spec's block-table layout, workload.Spec.Pool, at
// buf.Addr + i*spec.Bytes()), for i below requests. buf must be registered
// with agent. On error nothing stays registered.
func RegisterPools(agent *pipeline.Agent, buf transfer.Desc, spec workload.Spec, requests int, name func(int) string) (*Pools, error) {
	switch {
	case spec.Regions <= 0:
		return nil, fmt.Errorf("driver: the block-table form needs a spec with regions (got %d)", spec.Regions)
	case requests <= 0 || requests > MaxBlockRequests:
		return nil, fmt.Errorf("driver: %d requests in the block-table form: 1 to %d (a pool per request)", requests, MaxBlockRequests)
	case spec.Bytes()*uint64(requests) > buf.Len:
		return nil, fmt.Errorf("driver: %d requests x %d bytes exceed the %d-byte buffer", requests, spec.Bytes(), buf.Len)
	}
	p := &Pools{agent: agent}
	for i := range requests {
		base := buf
		base.Addr += uint64(i) * spec.Bytes()
		if err := agent.RegisterPool(name(i), spec.Pool(base)); err != nil {
			return nil, errors.Join(fmt.Errorf("driver: pool of request %d: %w", i, err), p.Release())
		}
		p.names = append(p.names, name(i))
	}
	return p, nil
}

// Release deregisters the pools; it stops at none, reporting every one
// that could not be (in use) and keeping those for a later Release.
func (p *Pools) Release() error {
	if p == nil {
		return nil
	}
	var errs []error
	var kept []string
	for _, n := range p.names {
		if err := p.agent.DeregisterPool(n); err != nil {
			errs = append(errs, err)
			kept = append(kept, n)
		}
	}
	p.names = kept
	return errors.Join(errs...)
}

// RegisterConvPools is RegisterPools for a layout conversion: request i's
// pool of layout l (c.Src on the sender, c.Dst on the receiver) over its
// slice of buf, c.PoolBytes(l) bytes a request, registered with the layout
// (pipeline.Agent.RegisterPoolLayout) so the peer converts.
func RegisterConvPools(agent *pipeline.Agent, buf transfer.Desc, c workload.Conversion, l transfer.Layout, requests int, name func(int) string) (*Pools, error) {
	per := c.PoolBytes(l)
	switch {
	case requests <= 0 || requests > MaxBlockRequests:
		return nil, fmt.Errorf("driver: %d requests in the block-table form: 1 to %d (a pool per request)", requests, MaxBlockRequests)
	case per*uint64(requests) > buf.Len:
		return nil, fmt.Errorf("driver: %d requests x %d bytes exceed the %d-byte buffer", requests, per, buf.Len)
	}
	p := &Pools{agent: agent}
	for i := range requests {
		base := buf
		base.Addr += uint64(i) * per
		if err := agent.RegisterPoolLayout(name(i), c.Pool(l, base), l); err != nil {
			return nil, errors.Join(fmt.Errorf("driver: pool of request %d: %w", i, err), p.Release())
		}
		p.names = append(p.names, name(i))
	}
	return p, nil
}
