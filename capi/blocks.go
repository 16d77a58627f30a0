package main

/*
#cgo CFLAGS: -DBOUNCE_NO_PROTOTYPES
#include "bounce.h"
*/
import "C"

import (
	"unsafe"

	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

func poolOf(p *C.bounce_pool) (transfer.Pool, error) {
	if p == nil {
		return transfer.Pool{}, invalid("pool is NULL")
	}
	if e := checkLen("pool n_regions", p.n_regions, transfer.MaxPoolRegions); e != nil {
		return transfer.Pool{}, e
	}
	if p.n_regions > 0 && p.regions == nil {
		return transfer.Pool{}, invalid("pool regions is NULL with n_regions = %d", p.n_regions)
	}
	k, err := kindOf(p.kind)
	if err != nil {
		return transfer.Pool{}, err
	}
	out := transfer.Pool{BlockLen: uint64(p.block_len), Stride: uint64(p.stride), Blocks: uint64(p.blocks), Kind: k, Device: int32(p.device)}
	if p.n_regions > 0 {
		out.Regions = make([]uint64, p.n_regions)
		for i, r := range unsafe.Slice(p.regions, int(p.n_regions)) {
			out.Regions[i] = uint64(r)
		}
	}
	return out, nil
}

// layoutOf converts a C layout; Validate and CheckPool judge it at
// registration.
func layoutOf(l *C.bounce_layout) (transfer.Layout, error) {
	if l == nil {
		return transfer.Layout{}, invalid("layout is NULL")
	}
	var o transfer.Order
	switch l.order {
	case C.BOUNCE_ORDER_NHD:
		o = transfer.NHD
	case C.BOUNCE_ORDER_HND:
		o = transfer.HND
	default:
		return transfer.Layout{}, invalid("layout order %d is not BOUNCE_ORDER_NHD (1) or BOUNCE_ORDER_HND (2)", l.order)
	}
	return transfer.Layout{
		Layers: uint32(l.layers), KV: uint32(l.kv), Heads: uint32(l.heads), FirstHead: uint32(l.first_head),
		HeadDim: uint32(l.head_dim), Tokens: uint32(l.tokens), Elem: uint32(l.elem), Order: o,
	}, nil
}

//export bounce_register_pool
func bounce_register_pool(agent C.uint64_t, name *C.char, pool *C.bounce_pool, err **C.char) C.bounce_code {
	return registerPool(agent, name, pool, false, nil, err)
}

//export bounce_register_pool_layout
func bounce_register_pool_layout(agent C.uint64_t, name *C.char, pool *C.bounce_pool, layout *C.bounce_layout, err **C.char) C.bounce_code {
	return registerPool(agent, name, pool, true, layout, err)
}

// registerPool registers pool under name, with the KV layout layout when
// withLayout (checked after the agent and the pool, NULL refused).
func registerPool(agent C.uint64_t, name *C.char, pool *C.bounce_pool, withLayout bool, layout *C.bounce_layout, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	p, e := poolOf(pool)
	if e != nil {
		return fail(err, e)
	}
	if !withLayout {
		e = h.agent().RegisterPool(goString(name), p)
	} else {
		var l transfer.Layout
		if l, e = layoutOf(layout); e != nil {
			return fail(err, e)
		}
		e = h.agent().RegisterPoolLayout(goString(name), p, l)
	}
	if e != nil {
		return fail(err, invalidIfNot(e))
	}
	return ok
}

//export bounce_deregister_pool
func bounce_deregister_pool(agent C.uint64_t, name *C.char, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	if e := h.agent().DeregisterPool(goString(name)); e != nil {
		return fail(err, e)
	}
	return ok
}

// ids copies n ids from C memory.
func ids(p *C.uint32_t, n C.size_t) []uint32 {
	out := make([]uint32, n)
	for i, v := range unsafe.Slice(p, int(n)) {
		out[i] = uint32(v)
	}
	return out
}

//export bounce_submit_blocks
func bounce_submit_blocks(agent C.uint64_t, peer, srcPool *C.char, srcIDs *C.uint32_t, nSrc C.size_t, dstPool *C.char, dstIDs *C.uint32_t, nDst C.size_t, tag *C.uint8_t, tagLen C.size_t, route C.int32_t, batch *C.uint64_t, err **C.char) C.bounce_code {
	e := submit(agent, peer, tag, tagLen, route, batch, func(req *pipeline.Request) error {
		var e error
		req.Blocks, e = blockRequest(srcPool, srcIDs, nSrc, dstPool, dstIDs, nDst)
		return e
	})
	if e != nil {
		return fail(err, e)
	}
	return ok
}

// blockRequest converts a C block request: pools by name, each side's ids
// (bounded before they are copied). The Go API judges the rest: equal
// counts unless the pools' layouts convert (a block-size change pairs
// groups of ids), ids in range, destinations distinct.
func blockRequest(srcPool *C.char, srcIDs *C.uint32_t, nSrc C.size_t, dstPool *C.char, dstIDs *C.uint32_t, nDst C.size_t) (*pipeline.BlockRequest, error) {
	if e := checkLen("n_src", nSrc, wire.MaxBlockIDs); e != nil {
		return nil, e
	}
	if e := checkLen("n_dst", nDst, wire.MaxBlockIDs); e != nil {
		return nil, e
	}
	if (nSrc > 0 && srcIDs == nil) || (nDst > 0 && dstIDs == nil) {
		return nil, invalid("src_ids or dst_ids is NULL with n_src = %d, n_dst = %d", nSrc, nDst)
	}
	return &pipeline.BlockRequest{SrcPool: goString(srcPool), SrcIDs: ids(srcIDs, nSrc), DstPool: goString(dstPool), DstIDs: ids(dstIDs, nDst)}, nil
}

// invalidIfNot classifies an error that wraps no sentinel (a bad pool
// geometry, duplicate ids) as a bad argument rather than a failure.
func invalidIfNot(e error) error {
	if codeOf(e) == codeFailed {
		return invalid("%v", e)
	}
	return e
}
