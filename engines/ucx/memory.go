package ucx

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sort"
	"unsafe"

	"github.com/bouncekv/bounce/transfer"
)

// region is one registered local range.
type region struct {
	d        transfer.Desc
	memh     C.ucp_mem_h
	rkey     []byte // packed
	inflight int    // write ops reading from it
}

// RegisterMemory maps d with ucp_mem_map (existing address, no allocation)
// and packs its rkey for Metadata. d must be host memory that stays mapped
// until DeregisterMemory or Close. Registering the same range again is a
// no-op; an overlapping range is an error.
func (e *Engine) RegisterMemory(d transfer.Desc) error {
	if d.Kind != transfer.Host {
		return fmt.Errorf("ucx: register %v: only host memory: %w", d, transfer.ErrUnsupported)
	}
	return e.call("register "+d.String(), func() error {
		if r := e.regions[d.Addr]; r != nil && r.d.Len == d.Len {
			return nil
		}
		if err := e.reg.Add(d); err != nil {
			return fmt.Errorf("ucx: register: %w", err)
		}
		var memh C.ucp_mem_h
		var p unsafe.Pointer
		var n C.size_t
		if st := C.bkv_mem_map(e.c, C.uint64_t(d.Addr), C.uint64_t(d.Len), &memh, &p, &n); st != C.UCS_OK {
			e.reg.Remove(d)
			return fmt.Errorf("ucx: register %v: ucp_mem_map: %s", d, statusString(st))
		}
		rkey := C.GoBytes(p, C.int(n))
		C.free(p)
		if len(rkey) == 0 || len(rkey) > maxRKeyLen {
			C.ucp_mem_unmap(e.c.context, memh)
			e.reg.Remove(d)
			return fmt.Errorf("ucx: register %v: packed rkey of %d bytes, want 1..%d", d, len(rkey), maxRKeyLen)
		}
		e.regions[d.Addr] = &region{d: d, memh: memh, rkey: rkey}
		return nil
	})
}

// DeregisterMemory unmaps exactly a range given to RegisterMemory. It
// returns ErrInUse while a pending write reads from it and ErrNotRegistered
// for anything else. Peers keep stale rkeys until they reload Metadata; note
// that with the cma transport (NoPeerErrors) a peer's put does not depend on
// the registration, so deregistering is not a fence against remote writes.
func (e *Engine) DeregisterMemory(d transfer.Desc) error {
	return e.call("deregister "+d.String(), func() error {
		r := e.regions[d.Addr]
		if r == nil || r.d.Len != d.Len {
			return fmt.Errorf("ucx: deregister %v: %w", d, transfer.ErrNotRegistered)
		}
		if r.inflight > 0 {
			return fmt.Errorf("ucx: deregister %v: %d pending writes read from it: %w", d, r.inflight, transfer.ErrInUse)
		}
		if st := C.ucp_mem_unmap(e.c.context, r.memh); st != C.UCS_OK {
			return fmt.Errorf("ucx: deregister %v: ucp_mem_unmap: %s", d, statusString(st))
		}
		delete(e.regions, d.Addr)
		if err := e.reg.Remove(r.d); err != nil {
			return fmt.Errorf("ucx: deregister: %w", err)
		}
		return nil
	})
}

// Metadata returns a versioned, checksummed blob with the engine's name, its
// UCX worker address and every registered range with its packed rkey. A
// peer passes it to LoadPeer, and loads it again after more memory is
// registered here.
func (e *Engine) Metadata() ([]byte, error) {
	var md []byte
	err := e.call("metadata", func() error {
		info := peerInfo{Name: e.name, Addr: e.addr}
		for _, r := range e.regions {
			info.Ranges = append(info.Ranges, remoteRange{Addr: r.d.Addr, Len: r.d.Len, RKey: r.rkey})
		}
		if len(info.Ranges) > maxRanges {
			return fmt.Errorf("ucx: metadata: %d registered ranges exceed %d", len(info.Ranges), maxRanges)
		}
		sort.Slice(info.Ranges, func(i, j int) bool { return info.Ranges[i].Addr < info.Ranges[j].Addr })
		md = encodeMetadata(info)
		return nil
	})
	return md, err
}
