// Command capi is bounce's C ABI: built with -buildmode=c-shared it is
// libbounce.so, whose functions bounce.h declares and documents. The
// exported functions are thin: they convert C arguments, look the handle up
// in the library's table and call the Go API (node, pipeline); errors become
// a code (codeOf) and a message the caller frees.
package main

/*
#cgo CFLAGS: -DBOUNCE_NO_PROTOTYPES
#include <stdlib.h>
#include <string.h>
#include "bounce.h"
*/
import "C"

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/bouncekv/bounce/pipeline"
	"github.com/bouncekv/bounce/pipeline/wire"
	"github.com/bouncekv/bounce/transfer"
)

func main() {}

// lib is the process's handle table. A C library's state is process-wide
// by nature (its callers name objects by handle, across threads); this is
// the one package-level variable, and it holds nothing but the table.
var lib = newTable()

// fail sets *err (when err is not NULL) to a message the caller frees and
// returns e's code.
func fail(err **C.char, e error) C.bounce_code {
	if err != nil {
		*err = C.CString(e.Error())
	}
	return C.bounce_code(codeOf(e))
}

// ok is the success return.
const ok = C.bounce_code(codeOK)

func goString(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

// cBytes copies b into memory the caller frees with bounce_free.
func cBytes(b []byte) (*C.uint8_t, C.size_t) {
	p := C.malloc(C.size_t(max(len(b), 1)))
	if len(b) > 0 {
		C.memcpy(p, unsafe.Pointer(&b[0]), C.size_t(len(b)))
	}
	return (*C.uint8_t)(p), C.size_t(len(b))
}

// goBytes copies n bytes of C memory at p (nil when n is 0); the caller
// has bounded n (checkLen).
func goBytes(p *C.uint8_t, n C.size_t) []byte {
	if p == nil || n == 0 {
		return nil
	}
	return C.GoBytes(unsafe.Pointer(p), C.int(n))
}

// Bounds on the lengths C callers pass, checked before any conversion: a
// size_t past them is refused, never cast to a negative int or allocated.
const (
	maxDescriptorBlob = 64 << 20 // an agent descriptor
	maxDescs          = 1 << 24  // descriptors in one submit
)

// checkLen refuses a length over limit, naming it.
func checkLen(what string, n C.size_t, limit uint64) error {
	if uint64(n) > limit {
		return invalid("%s is %d; at most %d", what, uint64(n), limit)
	}
	return nil
}

// timeout converts a C timeout in milliseconds (negative: no bound).
func timeout(ms C.int64_t) time.Duration {
	if ms < 0 {
		return -1
	}
	return time.Duration(ms) * time.Millisecond
}

//export bounce_abi_version
func bounce_abi_version() C.int32_t { return C.BOUNCE_ABI_VERSION }

//export bounce_free
func bounce_free(p unsafe.Pointer) { C.free(p) }

//export bounce_event_free
func bounce_event_free(ev *C.bounce_event) {
	if ev == nil {
		return
	}
	C.free(unsafe.Pointer(ev.peer))
	C.free(unsafe.Pointer(ev.tag))
	C.free(unsafe.Pointer(ev.error))
	*ev = C.bounce_event{}
}

//export bounce_agent_create
func bounce_agent_create(yaml *C.char, options **C.char, nOptions C.size_t, events C.size_t, agent *C.uint64_t, err **C.char) C.bounce_code {
	if agent == nil {
		return fail(err, invalid("agent is NULL"))
	}
	var opts []string
	if e := checkLen("n_options", nOptions, 4096); e != nil {
		return fail(err, e)
	}
	if nOptions > 0 {
		if options == nil {
			return fail(err, invalid("options is NULL but n_options is %d", nOptions))
		}
		for _, o := range unsafe.Slice(options, int(nOptions)) {
			if o == nil {
				return fail(err, invalid("an option is NULL"))
			}
			opts = append(opts, C.GoString(o))
		}
	}
	var text []byte
	if yaml != nil {
		text = []byte(C.GoString(yaml))
	}
	h, e := newAgent(text, opts, int(events))
	if e != nil {
		return fail(err, e)
	}
	*agent = C.uint64_t(lib.addAgent(h))
	return ok
}

//export bounce_agent_close
func bounce_agent_close(agent C.uint64_t, timeoutMS C.int64_t, err **C.char) C.bounce_code {
	h, e := lib.takeAgent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	ctx, cancel := contextFor(timeout(timeoutMS))
	defer cancel()
	if e := h.close(ctx); e != nil {
		return fail(err, e)
	}
	return ok
}

func contextFor(d time.Duration) (context.Context, context.CancelFunc) {
	if d < 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), d)
}

//export bounce_agent_name
func bounce_agent_name(agent C.uint64_t, name **C.char, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	if name == nil {
		return fail(err, invalid("name is NULL"))
	}
	*name = C.CString(h.agent().Name())
	return ok
}

//export bounce_descriptor
func bounce_descriptor(agent C.uint64_t, desc **C.uint8_t, n *C.size_t, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	if desc == nil || n == nil {
		return fail(err, invalid("desc or len is NULL"))
	}
	blob, e := h.agent().Descriptor()
	if e != nil {
		return fail(err, e)
	}
	*desc, *n = cBytes(blob)
	return ok
}

//export bounce_load_peer
func bounce_load_peer(agent C.uint64_t, desc *C.uint8_t, n C.size_t, peer **C.char, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	if desc == nil || n == 0 {
		return fail(err, invalid("empty descriptor"))
	}
	if e := checkLen("descriptor length", n, maxDescriptorBlob); e != nil {
		return fail(err, e)
	}
	blob := goBytes(desc, n)
	name, e := h.agent().LoadPeer(blob)
	if e != nil {
		return fail(err, e)
	}
	if peer != nil {
		*peer = C.CString(name)
	}
	return ok
}

//export bounce_forget_peer
func bounce_forget_peer(agent C.uint64_t, peer *C.char, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	if e := h.agent().ForgetPeer(goString(peer)); e != nil {
		return fail(err, e)
	}
	return ok
}

func descOf(d C.bounce_desc) (transfer.Desc, error) {
	k, e := kindOf(d.kind)
	if e != nil {
		return transfer.Desc{}, e
	}
	return transfer.Desc{Addr: uint64(d.addr), Len: uint64(d.len), Device: int32(d.device), Kind: k}, nil
}

func kindOf(k C.int32_t) (transfer.MemKind, error) {
	switch k {
	case C.BOUNCE_MEM_HOST:
		return transfer.Host, nil
	case C.BOUNCE_MEM_CUDA:
		return transfer.CUDA, nil
	}
	return 0, invalid("memory kind %d is not BOUNCE_MEM_HOST (0) or BOUNCE_MEM_CUDA (1)", k)
}

//export bounce_register_memory
func bounce_register_memory(agent C.uint64_t, m C.bounce_desc, forPeer *C.char, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	d, e := descOf(m)
	if e != nil {
		return fail(err, e)
	}
	var peers []string
	if forPeer != nil {
		peers = []string{C.GoString(forPeer)}
	}
	if e := h.agent().RegisterMemoryFor(d, peers...); e != nil {
		return fail(err, invalidIfNot(e))
	}
	return ok
}

//export bounce_deregister_memory
func bounce_deregister_memory(agent C.uint64_t, m C.bounce_desc, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	d, e := descOf(m)
	if e != nil {
		return fail(err, e)
	}
	if e := h.agent().DeregisterMemory(d); e != nil {
		return fail(err, e)
	}
	return ok
}

func routeOf(r C.int32_t) (pipeline.Route, error) {
	switch r {
	case C.BOUNCE_ROUTE_AUTO:
		return pipeline.RouteAuto, nil
	case C.BOUNCE_ROUTE_BOUNCE:
		return pipeline.RouteBounce, nil
	case C.BOUNCE_ROUTE_DIRECT:
		return pipeline.RouteDirect, nil
	}
	return 0, invalid("route %d is not BOUNCE_ROUTE_AUTO, _BOUNCE or _DIRECT", r)
}

func cRoute(r pipeline.Route) C.int32_t {
	switch r {
	case pipeline.RouteBounce:
		return C.BOUNCE_ROUTE_BOUNCE
	case pipeline.RouteDirect:
		return C.BOUNCE_ROUTE_DIRECT
	}
	return C.BOUNCE_ROUTE_AUTO
}

//export bounce_submit
func bounce_submit(agent C.uint64_t, peer *C.char, src, dst *C.bounce_desc, n C.size_t, tag *C.uint8_t, tagLen C.size_t, route C.int32_t, batch *C.uint64_t, err **C.char) C.bounce_code {
	e := submit(agent, peer, tag, tagLen, route, batch, func(req *pipeline.Request) error {
		var e error
		req.Src, req.Dst, e = descPairs(src, dst, n)
		return e
	})
	if e != nil {
		return fail(err, e)
	}
	return ok
}

// descPairs converts the n source and destination descriptors of a
// descriptor request (bounce_submit, bounce_pull): both arrays present
// when n > 0, n within maxDescs, each descriptor valid.
func descPairs(src, dst *C.bounce_desc, n C.size_t) (srcs, dsts []transfer.Desc, err error) {
	if n > 0 && (src == nil || dst == nil) {
		return nil, nil, invalid("src or dst is NULL with n = %d", n)
	}
	if err := checkLen("n", n, maxDescs); err != nil {
		return nil, nil, err
	}
	if srcs, err = descsOf("src", src, n); err != nil {
		return nil, nil, err
	}
	if dsts, err = descsOf("dst", dst, n); err != nil {
		return nil, nil, err
	}
	return srcs, dsts, nil
}

// requestCall checks what every request call (submit, pull) takes first:
// the agent's handle, the batch out-parameter and the tag's length.
func requestCall(agent C.uint64_t, batch *C.uint64_t, tagLen C.size_t) (*agentHandle, error) {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return nil, e
	}
	if batch == nil {
		return nil, invalid("batch is NULL")
	}
	if e := checkLen("tag_len", tagLen, wire.MaxTag); e != nil {
		return nil, e
	}
	return h, nil
}

// submit is what bounce_submit and bounce_submit_blocks share: the agent,
// the batch out-parameter, the tag and the route checked, the request
// completed by body (its sources and destinations), submitted, and the
// batch's handle stored in *batch.
func submit(agent C.uint64_t, peer *C.char, tag *C.uint8_t, tagLen C.size_t, route C.int32_t, batch *C.uint64_t, body func(*pipeline.Request) error) error {
	h, e := requestCall(agent, batch, tagLen)
	if e != nil {
		return e
	}
	rt, e := routeOf(route)
	if e != nil {
		return e
	}
	return start(pipeline.Request{Peer: goString(peer), Route: rt, Tag: goBytes(tag, tagLen)}, body, h.agent().Submit, batch)
}

// start completes req with body, starts it with run (Submit, Pull) and
// stores the batch's handle in *batch.
func start[R any](req R, body func(*R) error, run func(R) (*pipeline.Batch, error), batch *C.uint64_t) error {
	if e := body(&req); e != nil {
		return e
	}
	b, e := run(req)
	if e != nil {
		return invalidIfNot(e)
	}
	*batch = C.uint64_t(lib.addBatch(b))
	return nil
}

// descsOf converts n C descriptors (n already bounded), naming the array
// in an error.
func descsOf(what string, p *C.bounce_desc, n C.size_t) ([]transfer.Desc, error) {
	if n == 0 {
		return nil, nil
	}
	out := make([]transfer.Desc, n)
	for i, d := range unsafe.Slice(p, int(n)) {
		var e error
		if out[i], e = descOf(d); e != nil {
			return nil, fmt.Errorf("%s[%d]: %w", what, i, e)
		}
	}
	return out, nil
}

func cStatus(s transfer.Status) C.int32_t {
	switch s {
	case transfer.Done:
		return C.BOUNCE_DONE
	case transfer.Failed:
		return C.BOUNCE_FAILED
	}
	return C.BOUNCE_PENDING
}

//export bounce_batch_poll
func bounce_batch_poll(batch C.uint64_t, status *C.int32_t, err **C.char) C.bounce_code {
	b, e := lib.batch(uint64(batch))
	if e != nil {
		return fail(err, e)
	}
	if status == nil {
		return fail(err, invalid("status is NULL"))
	}
	s := b.Status()
	*status = cStatus(s)
	if s == transfer.Failed {
		return fail(err, b.Err())
	}
	return ok
}

//export bounce_batch_wait
func bounce_batch_wait(batch C.uint64_t, timeoutMS C.int64_t, status *C.int32_t, err **C.char) C.bounce_code {
	b, e := lib.batch(uint64(batch))
	if e != nil {
		return fail(err, e)
	}
	ctx, cancel := contextFor(timeout(timeoutMS))
	defer cancel()
	select {
	case <-b.Done():
	case <-ctx.Done():
	}
	s := b.Status()
	if status != nil {
		*status = cStatus(s)
	}
	switch s {
	case transfer.Done:
		return ok
	case transfer.Failed:
		return fail(err, b.Err())
	}
	return fail(err, fmt.Errorf("batch %d still pending after %v: %w", b.ID(), timeout(timeoutMS), transfer.ErrTimeout))
}

//export bounce_batch_retirement
func bounce_batch_retirement(batch C.uint64_t, retired, quiescent *C.int32_t, err **C.char) C.bounce_code {
	b, e := lib.batch(uint64(batch))
	if e != nil {
		return fail(err, e)
	}
	if retired == nil || quiescent == nil {
		return fail(err, invalid("retired or quiescent is NULL"))
	}
	r, q := b.Retirement()
	*retired, *quiescent = cBool(r), cBool(q)
	return ok
}

func cBool(v bool) C.int32_t {
	if v {
		return 1
	}
	return 0
}

//export bounce_batch_abandon
func bounce_batch_abandon(batch C.uint64_t, timeoutMS C.int64_t, outcome *C.int32_t, err **C.char) C.bounce_code {
	b, e := lib.batch(uint64(batch))
	if e != nil {
		return fail(err, e)
	}
	if outcome == nil {
		return fail(err, invalid("outcome is NULL"))
	}
	d := timeout(timeoutMS)
	if d < 0 {
		return fail(err, invalid("abandon needs a bound: timeout_ms %d is negative", timeoutMS))
	}
	*outcome = C.int32_t(b.Abandon(d))
	return ok
}

//export bounce_batch_release
func bounce_batch_release(batch C.uint64_t, err **C.char) C.bounce_code {
	if e := lib.releaseBatch(uint64(batch)); e != nil {
		return fail(err, e)
	}
	return ok
}

//export bounce_next_event
func bounce_next_event(agent C.uint64_t, timeoutMS C.int64_t, ev *C.bounce_event, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	if ev == nil {
		return fail(err, invalid("ev is NULL"))
	}
	r, e := h.next(timeout(timeoutMS))
	if e != nil {
		return fail(err, e)
	}
	*ev = C.bounce_event{
		peer:      C.CString(r.Peer),
		request:   C.uint64_t(r.Request),
		bytes:     C.uint64_t(r.Bytes),
		route:     cRoute(r.Route),
		code:      C.bounce_code(codeOK),
		pull:      cBool(r.Pull),
		quiescent: cBool(r.Pull && r.Quiescent),
	}
	if len(r.Tag) > 0 {
		ev.tag, ev.tag_len = cBytes(bytes.Clone(r.Tag))
	}
	if r.Err != nil {
		ev.code = C.bounce_code(codeOf(r.Err))
		ev.error = C.CString(r.Err.Error())
	}
	return ok
}

//export bounce_agent_stats
func bounce_agent_stats(agent C.uint64_t, out **C.char, err **C.char) C.bounce_code {
	h, e := lib.agent(uint64(agent))
	if e != nil {
		return fail(err, e)
	}
	if out == nil {
		return fail(err, invalid("json is NULL"))
	}
	js, e := h.statsJSON()
	if e != nil {
		return fail(err, e)
	}
	*out = C.CString(js)
	return ok
}

// errInvalid marks a bad argument of a C call.
var errInvalid = errors.New("invalid argument")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errInvalid)
}
