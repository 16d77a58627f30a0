package cudacopy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/bouncekv/bounce/cuda"
	"github.com/bouncekv/bounce/transfer"
)

// Cross-process peers (Config.IPC): an engine exports every CUDA range it
// registers with cuIpcGetMemHandle and lists the handles in its metadata;
// an engine of another process on the same host opens them with
// cuIpcOpenMemHandle at LoadPeer and writes into the peer's memory through
// the mapping, with the same asynchronous copies as in-process. ForgetPeer
// and Close close the mappings once no copy into them runs. A process
// cannot stop another process's copies, so an engine with IPC on does not
// fence forgotten peers (FencesForgottenPeers is false); a peer that died
// leaves its mappings valid until they are closed (the driver keeps the
// allocation alive), so late copies land in memory nobody reads and never
// fault the survivor.

// MaxExports bounds the ranges one engine's metadata lists.
const MaxExports = 4096

// mdVersionIPC is the metadata version that carries IPC exports.
const mdVersionIPC = 2

// ipcEntry is one exported range in metadata: the range, the base of the
// cuMemAlloc allocation holding it and the allocation's IPC handle.
const ipcEntry = 8 + 8 + 8 + cuda.IPCHandleSize

// export is one registered device range this engine exports.
type export struct {
	d      transfer.Desc
	base   uint64
	handle cuda.IPCHandle
}

// metadata is decoded engine metadata; IPC fields are set for version 2.
type metadata struct {
	fabric, inc uint64
	name        string
	ipc         bool
	host        [16]byte // the exporter's boot id: handles open only on its host
	device      int32
	exports     []export
}

func encodeMetadataIPC(fabric, inc uint64, name string, host [16]byte, device int32, ex []export) []byte {
	b := append([]byte(mdMagic), mdVersionIPC)
	b = binary.LittleEndian.AppendUint64(b, fabric)
	b = binary.LittleEndian.AppendUint64(b, inc)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(name)))
	b = append(b, name...)
	b = append(b, host[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(device))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(ex)))
	for _, x := range ex {
		b = binary.LittleEndian.AppendUint64(b, x.d.Addr)
		b = binary.LittleEndian.AppendUint64(b, x.d.Len)
		b = binary.LittleEndian.AppendUint64(b, x.base)
		b = append(b, x.handle[:]...)
	}
	return b
}

// decodeIPC parses the IPC tail of version-2 metadata (after the name).
func decodeIPC(md *metadata, b []byte) error {
	const fixed = 16 + 4 + 2
	if len(b) < fixed {
		return fmt.Errorf("IPC section of %d bytes, want at least %d: %w", len(b), fixed, transfer.ErrBadMetadata)
	}
	copy(md.host[:], b)
	md.device = int32(binary.LittleEndian.Uint32(b[16:]))
	n := int(binary.LittleEndian.Uint16(b[20:]))
	b = b[fixed:]
	switch {
	case md.device < 0:
		return fmt.Errorf("device %d: %w", md.device, transfer.ErrBadMetadata)
	case n > MaxExports:
		return fmt.Errorf("%d exported ranges, at most %d: %w", n, MaxExports, transfer.ErrBadMetadata)
	case len(b) != n*ipcEntry:
		return fmt.Errorf("%d exported ranges in %d bytes: %w", n, len(b), transfer.ErrBadMetadata)
	}
	md.ipc = true
	md.exports = make([]export, n)
	for i := range md.exports {
		x := &md.exports[i]
		x.d = transfer.Desc{Addr: binary.LittleEndian.Uint64(b), Len: binary.LittleEndian.Uint64(b[8:]), Kind: transfer.CUDA, Device: md.device}
		x.base = binary.LittleEndian.Uint64(b[16:])
		copy(x.handle[:], b[24:])
		b = b[ipcEntry:]
		switch {
		case x.d.Len == 0 || x.d.Addr+x.d.Len < x.d.Addr:
			return fmt.Errorf("exported range %d %v empty or wrapping: %w", i, x.d, transfer.ErrBadMetadata)
		case x.base > x.d.Addr:
			return fmt.Errorf("exported range %d %v below its allocation base %#x: %w", i, x.d, x.base, transfer.ErrBadMetadata)
		case i > 0 && md.exports[i-1].d.End() > x.d.Addr:
			return fmt.Errorf("exported range %d %v overlaps or precedes %v: %w", i, x.d, md.exports[i-1].d, transfer.ErrBadMetadata)
		}
	}
	return nil
}

// bootID names this host for IPC (handles open only where they were
// made); a host without one gets zeros, and two such hosts look alike
// (opening the handle then fails and says so).
func bootID() [16]byte {
	var id [16]byte
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id
	}
	s := strings.ReplaceAll(strings.TrimSpace(string(b)), "-", "")
	for i := 0; i < 16 && 2*i+1 < len(s); i++ {
		fmt.Sscanf(s[2*i:2*i+2], "%02x", &id[i])
	}
	return id
}

// remote is a peer engine of another process, reached through its
// exported ranges mapped here.
type remote struct {
	name   string
	inc    uint64
	ranges []mapping // sorted by the peer's addresses
}

// mapping is one exported range opened here.
type mapping struct {
	d     transfer.Desc // in the peer's address space
	base  uint64        // the peer's allocation base
	local cuda.DevicePtr
	open  *opened
}

// opened is one peer allocation mapped into this process, shared by every
// range (and reload) that names its handle.
type opened struct {
	handle cuda.IPCHandle
	ptr    cuda.DevicePtr
	refs   int
}

// find translates [addr, addr+n) of the peer's memory to this process.
func (r *remote) find(addr, n uint64) (cuda.DevicePtr, error) {
	i, _ := slices.BinarySearchFunc(r.ranges, addr, func(m mapping, a uint64) int {
		switch {
		case m.d.End() <= a:
			return -1
		case m.d.Addr > a:
			return 1
		}
		return 0
	})
	if i == len(r.ranges) || r.ranges[i].d.Addr > addr {
		return 0, fmt.Errorf("[%#x+%d] is in no range peer %q exported: %w", addr, n, r.name, transfer.ErrNotRegistered)
	}
	m := r.ranges[i]
	if n > m.d.End()-addr {
		return 0, fmt.Errorf("[%#x+%d] runs past %v, which peer %q exported: %w", addr, n, m.d, r.name, transfer.ErrOutOfBounds)
	}
	return m.local + cuda.DevicePtr(addr-m.base), nil
}

// exportLocked makes a registered CUDA range d openable by other processes.
// Caller holds fab.mu.
func (e *Engine) exportLocked(d transfer.Desc) error {
	if len(e.exports) >= MaxExports {
		return fmt.Errorf("%d device ranges exported already (at most %d): %w", len(e.exports), MaxExports, transfer.ErrUnsupported)
	}
	base, size, err := e.cc.AddressRange(cuda.DevicePtr(d.Addr))
	if err != nil {
		return err
	}
	if d.End() > uint64(base)+size {
		return fmt.Errorf("range spans allocations (the one at %#x has %d bytes): %w", uint64(base), size, transfer.ErrUnsupported)
	}
	h, err := e.cc.IPCHandle(base)
	if err != nil {
		return fmt.Errorf("export for CUDA IPC (memory from cuMemAlloc only): %w: %w", err, transfer.ErrUnsupported)
	}
	e.exports[d.Addr] = export{d: d, base: uint64(base), handle: h}
	return nil
}

// ipcMetadataLocked encodes this engine's metadata with its exports.
func (e *Engine) ipcMetadataLocked() []byte {
	ex := make([]export, 0, len(e.exports))
	for _, x := range e.exports {
		ex = append(ex, x)
	}
	slices.SortFunc(ex, func(a, b export) int {
		switch {
		case a.d.Addr < b.d.Addr:
			return -1
		case a.d.Addr > b.d.Addr:
			return 1
		}
		return 0
	})
	return encodeMetadataIPC(e.fab.id, e.inc, e.name, e.host, int32(e.cc.Device()), ex)
}

// loadRemote opens the exports of a peer of another process and makes it
// a write target, replacing an earlier load of it (whose writes in flight
// fail and stop first).
func (e *Engine) loadRemote(md metadata) (string, error) {
	ctx := fmt.Sprintf("cudacopy %s: load peer %q", e.name, md.name)
	if !e.cfg.IPC {
		return "", fmt.Errorf("%s: metadata from another process (engine.options ipc: true opens its memory by CUDA IPC): %w", ctx, transfer.ErrBadMetadata)
	}
	if !md.ipc {
		return "", fmt.Errorf("%s: metadata from another process without IPC exports (its engine has ipc off): %w", ctx, transfer.ErrBadMetadata)
	}
	if !bytes.Equal(md.host[:], e.host[:]) {
		return "", fmt.Errorf("%s: the peer runs on another host; CUDA IPC works within one: %w", ctx, transfer.ErrUnsupported)
	}
	if err := e.quiesce(md.name, fmt.Errorf("cudacopy %s: write to %q: peer loaded again: %w", e.name, md.name, transfer.ErrPeerLost)); err != nil {
		return "", fmt.Errorf("%s: %w", ctx, err)
	}
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	switch {
	case e.closed:
		return "", fmt.Errorf("%s: %w", ctx, transfer.ErrClosed)
	case e.fab.engines[md.name] != nil:
		return "", fmt.Errorf("%s: an engine of this process has that name: %w", ctx, transfer.ErrBadMetadata)
	}
	r := &remote{name: md.name, inc: md.inc}
	for _, x := range md.exports {
		o, err := e.openLocked(x.handle)
		if err != nil {
			_ = e.releaseLocked(r)
			return "", fmt.Errorf("%s: open %v: %w: %w", ctx, x.d, err, transfer.ErrUnsupported)
		}
		r.ranges = append(r.ranges, mapping{d: x.d, base: x.base, local: o.ptr, open: o})
	}
	if old := e.remotes[md.name]; old != nil {
		_ = e.releaseLocked(old) // its copies stopped above; shared allocations stay mapped
	}
	e.remotes[md.name] = r
	delete(e.peers, md.name)
	delete(e.fenced, md.name)
	return md.name, nil
}

// quiesce fails this engine's writes to peer with err and waits, bounded,
// until their copies have stopped.
func (e *Engine) quiesce(peer string, err error) error {
	e.fab.mu.Lock()
	var pending []*writeOp
	for o := range e.out {
		if o.peer == peer {
			o.failLocked(err)
			pending = append(pending, o)
		}
	}
	e.fab.mu.Unlock()
	return waitOps(pending)
}

// openLocked maps handle here, once per allocation. Caller holds fab.mu.
func (e *Engine) openLocked(h cuda.IPCHandle) (*opened, error) {
	if o := e.opened[h]; o != nil {
		o.refs++
		return o, nil
	}
	p, err := e.cc.OpenIPC(h)
	if err != nil {
		return nil, err
	}
	o := &opened{handle: h, ptr: p, refs: 1}
	e.opened[h] = o
	return o, nil
}

// releaseLocked drops r's references and closes mappings nothing uses.
// Caller holds fab.mu and has waited for r's copies.
func (e *Engine) releaseLocked(r *remote) error {
	var first error
	for _, m := range r.ranges {
		m.open.refs--
		if m.open.refs == 0 {
			delete(e.opened, m.open.handle)
			if err := e.cc.CloseIPC(m.open.ptr); err != nil && first == nil {
				first = err
			}
		}
	}
	r.ranges = nil
	return first
}

// postRemoteLocked checks and queues ops to a peer of another process: each
// source in memory registered here, each destination in a range the peer
// exported, translated to its mapping. Caller holds fab.mu.
func (e *Engine) postRemoteLocked(r *remote, ops []transfer.WriteOp) (*writeOp, error) {
	if e.fenced[r.name] {
		return nil, fmt.Errorf("peer forgotten (load it again): %w", transfer.ErrPeerLost)
	}
	for i := range ops {
		w := &ops[i]
		sd, err := e.reg.FindAny(w.Src.Addr, w.Src.Len)
		if err != nil {
			return nil, fmt.Errorf("write %d source: %w", i, err)
		}
		p, err := r.find(w.Dst.Addr, w.Dst.Len)
		if err != nil {
			return nil, fmt.Errorf("write %d destination: %w", i, err)
		}
		w.Src.Kind, w.Src.Device = sd.Kind, sd.Device
		w.Dst = transfer.Desc{Addr: uint64(p), Len: w.Dst.Len, Kind: transfer.CUDA, Device: int32(e.cc.Device())}
	}
	s, err := e.slotLocked()
	if err != nil {
		return nil, fmt.Errorf("streams: %w", err)
	}
	o := &writeOp{src: e, peer: r.name, ops: ops, slot: s, abortC: make(chan struct{}), held: make(chan struct{})}
	if h := e.cfg.Hold; h != nil {
		e.out[o] = struct{}{}
		go e.release(o, h)
		return o, nil
	}
	if err := e.queue(s, nil, ops); err != nil {
		_ = s.stream.Synchronize()
		e.streams = append(e.streams, s)
		return nil, fmt.Errorf("queue: %w", err)
	}
	close(o.held)
	e.out[o] = struct{}{}
	return o, nil
}
