package main

/*
#cgo CFLAGS: -DBOUNCE_NO_PROTOTYPES
#include "bounce.h"
*/
import "C"

import (
	"github.com/bouncekv/bounce/pipeline"
)

//export bounce_pull
func bounce_pull(agent C.uint64_t, peer *C.char, src, dst *C.bounce_desc, n C.size_t, tag *C.uint8_t, tagLen C.size_t, batch *C.uint64_t, err **C.char) C.bounce_code {
	e := pull(agent, peer, tag, tagLen, batch, func(req *pipeline.PullRequest) error {
		var e error
		req.Src, req.Dst, e = descPairs(src, dst, n)
		return e
	})
	if e != nil {
		return fail(err, e)
	}
	return ok
}

//export bounce_pull_blocks
func bounce_pull_blocks(agent C.uint64_t, peer, srcPool *C.char, srcIDs *C.uint32_t, nSrc C.size_t, dstPool *C.char, dstIDs *C.uint32_t, nDst C.size_t, tag *C.uint8_t, tagLen C.size_t, batch *C.uint64_t, err **C.char) C.bounce_code {
	e := pull(agent, peer, tag, tagLen, batch, func(req *pipeline.PullRequest) error {
		var e error
		req.Blocks, e = blockRequest(srcPool, srcIDs, nSrc, dstPool, dstIDs, nDst)
		return e
	})
	if e != nil {
		return fail(err, e)
	}
	return ok
}

// pull is what bounce_pull and bounce_pull_blocks share, as submit is for
// the pushes: the agent, the batch out-parameter and the tag checked, the
// request completed by body (the peer's sources, this agent's
// destinations), started, and the batch's handle stored in *batch.
func pull(agent C.uint64_t, peer *C.char, tag *C.uint8_t, tagLen C.size_t, batch *C.uint64_t, body func(*pipeline.PullRequest) error) error {
	h, e := requestCall(agent, batch, tagLen)
	if e != nil {
		return e
	}
	return start(pipeline.PullRequest{Peer: goString(peer), Tag: goBytes(tag, tagLen)}, body, h.agent().Pull, batch)
}
