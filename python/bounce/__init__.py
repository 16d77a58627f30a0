"""bounce: move LLM KV cache between inference servers (Python binding of
libbounce.so, the C ABI in capi/bounce.h).

    import numpy as np, bounce

    with bounce.Agent(options={"agent.name": "decode-0"}) as decode:
        kv = np.zeros((2, 512, 4096), dtype=np.uint8)   # K and V, 512 blocks of 4 KiB
        decode.register(kv)
        decode.register_pool("kv", bounce.Pool.of(kv, blocks=512))
        ...

Memory is given as a numpy array (host memory), any object exposing
``__cuda_array_interface__`` or ``__dlpack__`` (device memory, e.g. a torch
or cupy tensor; no dependency on either), or a ``(address, nbytes)`` pair.
The caller keeps registered memory alive until it is deregistered or the
agent closed, and a batch's memory until the batch was released.
"""

import ctypes
import json
from ctypes import byref, c_char_p, c_int32, c_size_t, c_uint32, c_uint64, c_void_p

from . import _lib

__all__ = [
    "Agent", "Batch", "Event", "Pool", "Layout", "Desc", "BounceError", "InvalidArgument", "BadHandle", "UnknownPeer",
    "Timeout", "Closed", "PeerLost", "OutOfBounds", "NotRegistered", "InUse", "NotQuiescent", "DeviceFault",
    "Unsupported", "Forbidden", "Busy", "Refused", "Failed", "IncompatibleLayout", "HOST", "CUDA", "abi_version",
]

HOST, CUDA = 0, 1
_ROUTES = {"auto": 0, "bounce": 1, "direct": 2}
_ROUTE_NAMES = {v: k for k, v in _ROUTES.items()}
_STATUS = {0: "pending", 1: "done", 2: "failed"}
_ABANDON = {0: "recoverable", 1: "device-fault", 2: "not-quiescent"}


class BounceError(Exception):
    """A failed call: code is bounce.h's BOUNCE_ERR_* number."""

    code = 16

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgument(BounceError, ValueError):
    code = 1


class BadHandle(BounceError):
    code = 2


class UnknownPeer(BounceError, LookupError):
    code = 3


class Timeout(BounceError, TimeoutError):
    code = 4


class Closed(BounceError):
    code = 5


class PeerLost(BounceError, ConnectionError):
    code = 6


class OutOfBounds(BounceError):
    code = 7


class NotRegistered(BounceError):
    code = 8


class InUse(BounceError):
    code = 9


class NotQuiescent(BounceError):
    """No proof that nothing touches the memory any more: keep it."""
    code = 10


class DeviceFault(BounceError):
    """The device faulted: never release the memory; restart."""
    code = 11


class Unsupported(BounceError):
    code = 12


class Forbidden(BounceError, PermissionError):
    """The peer may not write there, or this agent may not pull that (the
    holder registered it for another peer, or not at all)."""
    code = 13


class Busy(BounceError):
    code = 14


class Refused(BounceError):
    """The receiver (or a pull's holder) refused, or a required route is
    unavailable."""
    code = 15


class Failed(BounceError):
    code = 16


class IncompatibleLayout(Unsupported):
    """Two pools' KV layouts cannot be converted (head size, element size,
    layer count, no head in common, ids not pairing as groups): the message
    says why. Also an Unsupported."""
    code = 17


_BY_CODE = {c.code: c for c in (InvalidArgument, BadHandle, UnknownPeer, Timeout, Closed, PeerLost, OutOfBounds,
                                NotRegistered, InUse, NotQuiescent, DeviceFault, Unsupported, Forbidden, Busy,
                                Refused, Failed, IncompatibleLayout)}

_L = _lib.load()


def abi_version():
    """The loaded library's ABI version."""
    return _L.bounce_abi_version()


def _take_str(p):
    """Copies and frees a string the library returned."""
    if not p:
        return None
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        _L.bounce_free(p)


def _call(fn, *args):
    """Calls fn with a trailing err out-parameter; raises on failure."""
    err = c_void_p()
    rc = fn(*args, byref(err))
    if rc != 0:
        msg = _take_str(err.value) or f"bounce error {rc}"
        raise _BY_CODE.get(rc, BounceError)(msg, rc)


class Desc:
    """One contiguous piece of memory: nbytes at addr on a device."""

    __slots__ = ("addr", "nbytes", "kind", "device")

    def __init__(self, addr, nbytes, kind=HOST, device=0):
        self.addr, self.nbytes, self.kind, self.device = int(addr), int(nbytes), kind, device

    def _c(self):
        return _lib.Desc(self.addr, self.nbytes, self.device, self.kind)

    def __repr__(self):
        return f"Desc({'cuda' if self.kind else 'host'}:{self.device} {self.addr:#x}+{self.nbytes})"


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _contiguous(shape, strides, itemsize):
    if strides is None:
        return True
    want = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n > 1 and s != want:
            return False
        want *= n
    return True


def _prod(xs):
    n = 1
    for x in xs:
        n *= int(x)
    return n


def desc_of(obj, device=None):
    """The Desc of a buffer: a Desc, an (address, nbytes) pair, a numpy
    array (host), an object with __cuda_array_interface__ (device) or
    __dlpack__ (host or device). The buffer must be contiguous."""
    if isinstance(obj, Desc):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2:
        return Desc(obj[0], obj[1])
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        itemsize = int(cai["typestr"][2:])  # "<f2", "|u1": the last digits are bytes
        shape = tuple(cai["shape"])
        if not _contiguous(shape, cai.get("strides"), itemsize):
            raise InvalidArgument("device buffer is not contiguous")
        return Desc(cai["data"][0], _prod(shape) * itemsize, CUDA, 0 if device is None else device)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        itemsize = int(ai["typestr"][2:])
        shape = tuple(ai["shape"])
        if not _contiguous(shape, ai.get("strides"), itemsize):
            raise InvalidArgument("array is not contiguous")
        return Desc(ai["data"][0], _prod(shape) * itemsize, HOST, 0)
    if hasattr(obj, "__dlpack__"):
        return _dlpack_desc(obj)
    raise InvalidArgument(f"cannot describe a {type(obj).__name__}: give a numpy array, a CUDA array, "
                          "a DLPack tensor or (address, nbytes)")


def _dlpack_desc(obj):
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    cap = obj.__dlpack__()
    t = _DLTensor.from_address(get(cap, b"dltensor"))  # DLManagedTensor starts with its DLTensor
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = t.dtype.bits * t.dtype.lanes // 8
    strides = [t.strides[i] * itemsize for i in range(t.ndim)] if t.strides else None
    if not _contiguous(shape, strides, itemsize):
        raise InvalidArgument("DLPack tensor is not contiguous")
    kind = {_DL_CPU: HOST, _DL_CUDA_HOST: HOST, _DL_CUDA: CUDA}.get(t.device.device_type)
    if kind is None:
        raise Unsupported(f"DLPack device type {t.device.device_type} is neither CPU nor CUDA")
    return Desc(t.data + t.byte_offset, _prod(shape) * itemsize, kind, t.device.device_id if kind == CUDA else 0)


class Pool:
    """A KV pool: regions (one per layer, or per layer and K/V), each an
    array of `blocks` equal blocks of block_len bytes at `stride`."""

    def __init__(self, regions, block_len, blocks, stride=None, kind=HOST, device=0):
        self.regions = [int(r) for r in regions]
        self.block_len, self.blocks = int(block_len), int(blocks)
        self.stride = int(stride if stride is not None else block_len)
        self.kind, self.device = kind, device

    @classmethod
    def of(cls, buf, blocks, regions=None, device=None):
        """The pool of a contiguous buffer holding `regions` regions (its
        first dimension when None) of `blocks` dense blocks each."""
        d = desc_of(buf, device)
        if regions is None:
            shape = getattr(buf, "shape", None) or buf.__cuda_array_interface__["shape"]
            regions = int(shape[0])
        if d.nbytes % (regions * blocks):
            raise InvalidArgument(f"{d.nbytes} bytes do not split into {regions} regions of {blocks} blocks")
        block = d.nbytes // (regions * blocks)
        return cls([d.addr + r * blocks * block for r in range(regions)], block, blocks, block, d.kind, d.device)

    def _c(self):
        arr = (c_uint64 * len(self.regions))(*self.regions)
        c = _lib.PoolC(arr, len(self.regions), self.block_len, self.stride, self.blocks, self.device, self.kind)
        return c, arr


_ORDERS = {"nhd": 1, "hnd": 2}


class Layout:
    """What a pool's bytes mean as KV cache: region r is layer r // kv, K
    (r % kv == 0) or V; a block holds `tokens` tokens of the heads
    first_head .. first_head+heads-1 (this rank's slice), head_dim elements
    of elem bytes each, token-major (order "nhd": [token][head][element])
    or head-major ("hnd": [head][token][element]). Give it to
    Agent.register_pool; block pushes between pools of different layouts
    are converted on the way."""

    __slots__ = ("layers", "kv", "heads", "head_dim", "tokens", "elem", "first_head", "order")

    def __init__(self, layers, heads, head_dim, tokens, elem, kv=2, first_head=0, order="nhd"):
        if order not in _ORDERS:
            raise InvalidArgument(f"layout order {order!r} is not one of {sorted(_ORDERS)}")
        self.layers, self.kv, self.heads, self.head_dim = int(layers), int(kv), int(heads), int(head_dim)
        self.tokens, self.elem, self.first_head, self.order = int(tokens), int(elem), int(first_head), order

    @property
    def regions(self):
        """The pool regions the layout needs: layers x kv."""
        return self.layers * self.kv

    @property
    def block_len(self):
        """The bytes of one block: tokens x heads x head_dim x elem."""
        return self.tokens * self.heads * self.head_dim * self.elem

    def _c(self):
        vals = (self.layers, self.kv, self.heads, self.first_head, self.head_dim, self.tokens, self.elem)
        if any(v < 0 or v >= 1 << 32 for v in vals):
            raise InvalidArgument(f"{self!r}: every axis is a uint32")
        return _lib.LayoutC(*vals, _ORDERS[self.order])

    def __repr__(self):
        return (f"Layout(layers={self.layers}, kv={self.kv}, heads={self.first_head}+{self.heads}, "
                f"head_dim={self.head_dim}, tokens={self.tokens}, elem={self.elem}, order={self.order!r})")


def _pairs(src, dst):
    """The C descriptor arrays of a request's sources and destinations
    (Descs or buffers), and their count."""
    if len(src) != len(dst):
        raise InvalidArgument(f"{len(src)} sources but {len(dst)} destinations")
    n = len(src)
    s = (_lib.Desc * max(n, 1))(*[desc_of(x)._c() for x in src])
    d = (_lib.Desc * max(n, 1))(*[desc_of(x)._c() for x in dst])
    return s, d, n


def _ids(xs):
    """A uint32 C array of ids (from a list or a numpy array)."""
    try:
        import numpy as np
        a = np.ascontiguousarray(xs, dtype=np.uint32)
        return a.ctypes.data_as(ctypes.POINTER(c_uint32)), len(a), a
    except ImportError:
        arr = (c_uint32 * len(xs))(*xs)
        return arr, len(xs), arr


def _ms(timeout):
    return -1 if timeout is None else int(timeout * 1000)


class Event:
    """A receiver event: a request from peer landed (ok), or never will;
    or, with pull set, a pull peer made of this agent's memory ended
    (request is the puller's id, bytes what it acknowledged; quiescent:
    nothing reads the sources any more, they may be reused)."""

    __slots__ = ("peer", "request", "tag", "bytes", "route", "error", "code", "pull", "quiescent")

    def __init__(self, peer, request, tag, nbytes, route, code, error, pull=False, quiescent=False):
        self.peer, self.request, self.tag, self.bytes = peer, request, tag, nbytes
        self.route, self.code, self.error = route, code, error
        self.pull, self.quiescent = pull, quiescent

    @property
    def ok(self):
        return self.code == 0

    def raise_for_error(self):
        """Raises the event's failure as an exception."""
        if self.code:
            raise _BY_CODE.get(self.code, BounceError)(self.error or "receive failed", self.code)

    def __repr__(self):
        state = "ok" if self.ok else f"failed: {self.error}"
        kind = f"pull, quiescent={self.quiescent}, " if self.pull else ""
        return f"Event({kind}peer={self.peer!r}, request={self.request}, tag={self.tag!r}, bytes={self.bytes}, {state})"


class Batch:
    """A submitted transfer. Release it once done; as a context manager it
    waits for it and releases it on exit."""

    def __init__(self, handle):
        self._h = handle

    def poll(self):
        """'pending', 'done' or 'failed' (a failure raises its exception)."""
        st = c_int32()
        _call(_L.bounce_batch_poll, self._h, byref(st))
        return _STATUS[st.value]

    def wait(self, timeout=None):
        """Waits for the batch; raises its failure, or Timeout."""
        st = c_int32()
        _call(_L.bounce_batch_wait, self._h, _ms(timeout), byref(st))

    @property
    def retirement(self):
        """(retired, quiescent)."""
        r, q = c_int32(), c_int32()
        _call(_L.bounce_batch_retirement, self._h, byref(r), byref(q))
        return bool(r.value), bool(q.value)

    def abandon(self, timeout):
        """Gives the batch up within timeout seconds: 'recoverable',
        'device-fault' or 'not-quiescent'."""
        out = c_int32()
        _call(_L.bounce_batch_abandon, self._h, _ms(timeout), byref(out))
        return _ABANDON[out.value]

    def release(self):
        """Releases the batch; NotQuiescent means keep its memory."""
        if self._h:
            _call(_L.bounce_batch_release, self._h)
            self._h = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._h:
            return
        try:
            if exc[0] is None:
                self.wait()
        finally:
            if self.retirement[1]:
                self.release()


class Agent:
    """One bounce agent (a sender, a receiver, or both).

    config is YAML text (as `bounce config` prints); options a dict of
    configuration keys (`bounce config --keys`) over it, e.g.
    {"engine.kind": "tcp", "engine.listen": "10.0.0.2:7000"}."""

    def __init__(self, config=None, options=None, events=0):
        opts = [f"{k}={v}".encode() for k, v in (options or {}).items()]
        arr = (c_char_p * max(len(opts), 1))(*opts)
        h = c_uint64()
        _call(_L.bounce_agent_create, config.encode() if config else None, arr, len(opts), events, byref(h))
        self._h = h.value

    def close(self, timeout=30.0):
        """Fails what is in flight, waits for it to stop, closes the agent."""
        if self._h:
            h, self._h = self._h, 0
            _call(_L.bounce_agent_close, h, _ms(timeout))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def name(self):
        p = c_void_p()
        _call(_L.bounce_agent_name, self._h, byref(p))
        return _take_str(p.value)

    def descriptor(self):
        """This agent's descriptor (bytes) for a peer's load_peer."""
        p, n = c_void_p(), c_size_t()
        _call(_L.bounce_descriptor, self._h, byref(p), byref(n))
        try:
            return ctypes.string_at(p.value, n.value)
        finally:
            _L.bounce_free(p.value)

    def load_peer(self, descriptor):
        """Loads a peer from its descriptor; returns its name."""
        p = c_void_p()
        _call(_L.bounce_load_peer, self._h, descriptor, len(descriptor), byref(p))
        return _take_str(p.value)

    def forget_peer(self, peer):
        _call(_L.bounce_forget_peer, self._h, peer.encode())

    def register(self, buf, for_peer=None, device=None):
        """Registers a buffer (source, or destination peers may write)."""
        d = desc_of(buf, device)
        _call(_L.bounce_register_memory, self._h, d._c(), for_peer.encode() if for_peer else None)
        return d

    def deregister(self, buf, device=None):
        _call(_L.bounce_deregister_memory, self._h, desc_of(buf, device)._c())

    def register_pool(self, name, pool, layout=None):
        """Registers a Pool by name (its memory registered first); with a
        Layout, which must describe the pool, block pushes to or from
        pools of other layouts are converted on the way (or refused with
        IncompatibleLayout)."""
        c, _keep = pool._c()
        if layout is None:
            _call(_L.bounce_register_pool, self._h, name.encode(), byref(c))
            return
        lc = layout._c()
        _call(_L.bounce_register_pool_layout, self._h, name.encode(), byref(c), byref(lc))

    def deregister_pool(self, name):
        _call(_L.bounce_deregister_pool, self._h, name.encode())

    def submit(self, peer, src, dst, tag=b"", route="auto"):
        """Pushes src[i] (local Descs or buffers) to dst[i] (the peer's)."""
        s, d, n = _pairs(src, dst)
        h = c_uint64()
        _call(_L.bounce_submit, self._h, peer.encode(), s, d, n, bytes(tag), len(tag), _route(route), byref(h))
        return Batch(h.value)

    def submit_blocks(self, peer, src_pool, src_ids, dst_pool, dst_ids, tag=b"", route="auto"):
        """Pushes block src_ids[i] of the local pool to block dst_ids[i] of
        the peer's pool (ids: a list or a numpy array). As many ids on each
        side, unless the pools' layouts change the block size: then they
        pair as groups (two 16-token blocks into one 32-token block)."""
        sp, sn, _ks = _ids(src_ids)
        dp, dn, _kd = _ids(dst_ids)
        h = c_uint64()
        _call(_L.bounce_submit_blocks, self._h, peer.encode(), src_pool.encode(), sp, sn, dst_pool.encode(), dp, dn,
              bytes(tag), len(tag), _route(route), byref(h))
        return Batch(h.value)

    def pull(self, peer, src, dst, tag=b""):
        """Pulls src[i] (the peer's memory, Descs) into dst[i] (local Descs
        or buffers): the peer serves only memory it registered for this
        agent or for every peer; the batch of anything else fails with
        Forbidden and nothing is written. Always the bounce path."""
        s, d, n = _pairs(src, dst)
        h = c_uint64()
        _call(_L.bounce_pull, self._h, peer.encode(), s, d, n, bytes(tag), len(tag), byref(h))
        return Batch(h.value)

    def pull_blocks(self, peer, src_pool, src_ids, dst_pool, dst_ids, tag=b""):
        """Pulls block src_ids[i] of the peer's pool (as its descriptor
        advertises it) into block dst_ids[i] of the local pool: the decode
        side takes the KV when it is ready for it. Same block length and
        region count on both sides (a pull does not convert layouts)."""
        sp, sn, _ks = _ids(src_ids)
        dp, dn, _kd = _ids(dst_ids)
        h = c_uint64()
        _call(_L.bounce_pull_blocks, self._h, peer.encode(), src_pool.encode(), sp, sn, dst_pool.encode(), dp, dn,
              bytes(tag), len(tag), byref(h))
        return Batch(h.value)

    def next_event(self, timeout=None):
        """The next receiver event; raises Timeout when none came in time."""
        ev = _lib.EventC()
        _call(_L.bounce_next_event, self._h, _ms(timeout), byref(ev))
        try:
            peer = ctypes.string_at(ev.peer).decode() if ev.peer else ""
            tag = ctypes.string_at(ev.tag, ev.tag_len) if ev.tag else b""
            err = ctypes.string_at(ev.error).decode("utf-8", "replace") if ev.error else None
            return Event(peer, ev.request, tag, ev.bytes, _ROUTE_NAMES.get(ev.route, "auto"), ev.code, err,
                         bool(ev.pull), bool(ev.quiescent))
        finally:
            _L.bounce_event_free(byref(ev))

    def stats(self):
        """The agent's counters (a dict)."""
        p = c_void_p()
        _call(_L.bounce_agent_stats, self._h, byref(p))
        return json.loads(_take_str(p.value))


def _route(r):
    try:
        return _ROUTES[r]
    except KeyError:
        raise InvalidArgument(f"route {r!r} is not one of {sorted(_ROUTES)}") from None
