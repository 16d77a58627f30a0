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

//export bounce_register_pool
func bounce_register_pool(agent C.uint64_t, name *C.char, pool *C.bounce_pool, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	p, e := poolOf(pool)
	if e != nil {
		return fail(err, e)
	}
	if e := h.agent().RegisterPool(goString(name), p); e != nil {
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
func bounce_submit_blocks(agent C.uint64_t, peer, srcPool *C.char, srcIDs *C.uint32_t, dstPool *C.char, dstIDs *C.uint32_t, n C.size_t, tag *C.uint8_t, tagLen C.size_t, route C.int32_t, batch *C.uint64_t, err **C.char) C.bounce_code {
	e := submit(agent, peer, tag, tagLen, route, batch, func(req *pipeline.Request) error {
		if n > 0 && (srcIDs == nil || dstIDs == nil) {
			return invalid("src_ids or dst_ids is NULL with n = %d", n)
		}
		if e := checkLen("n", n, wire.MaxBlockIDs); e != nil {
			return e
		}
		req.Blocks = &pipeline.BlockRequest{SrcPool: goString(srcPool), SrcIDs: ids(srcIDs, n), DstPool: goString(dstPool), DstIDs: ids(dstIDs, n)}
		return nil
	})
	if e != nil {
		return fail(err, e)
	}
	return ok
}

// invalidIfNot classifies an error that wraps no sentinel (a bad pool
// geometry, duplicate ids) as a bad argument rather than a failure.
func invalidIfNot(e error) error {
	if codeOf(e) == codeFailed {
		return invalid("%v", e)
	}
	return e
}
