"""ctypes bindings of libbounce.so (capi/bounce.h): types, prototypes and
the error mapping. The public API is in bounce/__init__.py."""

import ctypes
import os
from ctypes import (POINTER, Structure, c_char_p, c_int32, c_int64, c_size_t,
                    c_uint8, c_uint32, c_uint64, c_void_p)

ABI_VERSION = 2

code = c_int32


class Desc(Structure):
    _fields_ = [("addr", c_uint64), ("len", c_uint64), ("device", c_int32), ("kind", c_int32)]


class PoolC(Structure):
    _fields_ = [("regions", POINTER(c_uint64)), ("n_regions", c_size_t), ("block_len", c_uint64),
                ("stride", c_uint64), ("blocks", c_uint64), ("device", c_int32), ("kind", c_int32)]


class LayoutC(Structure):
    _fields_ = [("layers", c_uint32), ("kv", c_uint32), ("heads", c_uint32), ("first_head", c_uint32),
                ("head_dim", c_uint32), ("tokens", c_uint32), ("elem", c_uint32), ("order", c_int32)]


class EventC(Structure):
    _fields_ = [("peer", c_void_p), ("request", c_uint64), ("tag", c_void_p), ("tag_len", c_size_t),
                ("bytes", c_uint64), ("route", c_int32), ("code", c_int32), ("error", c_void_p),
                ("pull", c_int32), ("quiescent", c_int32)]


_err = POINTER(c_void_p)  # char **err, read as a pointer the library allocated

_PROTOS = {
    "bounce_abi_version": (c_int32, []),
    "bounce_free": (None, [c_void_p]),
    "bounce_event_free": (None, [POINTER(EventC)]),
    "bounce_agent_create": (code, [c_char_p, POINTER(c_char_p), c_size_t, c_size_t, POINTER(c_uint64), _err]),
    "bounce_agent_close": (code, [c_uint64, c_int64, _err]),
    "bounce_agent_name": (code, [c_uint64, POINTER(c_void_p), _err]),
    "bounce_descriptor": (code, [c_uint64, POINTER(c_void_p), POINTER(c_size_t), _err]),
    "bounce_load_peer": (code, [c_uint64, c_char_p, c_size_t, POINTER(c_void_p), _err]),
    "bounce_forget_peer": (code, [c_uint64, c_char_p, _err]),
    "bounce_register_memory": (code, [c_uint64, Desc, c_char_p, _err]),
    "bounce_deregister_memory": (code, [c_uint64, Desc, _err]),
    "bounce_register_pool": (code, [c_uint64, c_char_p, POINTER(PoolC), _err]),
    "bounce_register_pool_layout": (code, [c_uint64, c_char_p, POINTER(PoolC), POINTER(LayoutC), _err]),
    "bounce_deregister_pool": (code, [c_uint64, c_char_p, _err]),
    "bounce_submit": (code, [c_uint64, c_char_p, POINTER(Desc), POINTER(Desc), c_size_t, c_char_p, c_size_t,
                             c_int32, POINTER(c_uint64), _err]),
    "bounce_submit_blocks": (code, [c_uint64, c_char_p, c_char_p, POINTER(c_uint32), c_size_t, c_char_p,
                                    POINTER(c_uint32), c_size_t, c_char_p, c_size_t, c_int32, POINTER(c_uint64), _err]),
    "bounce_pull": (code, [c_uint64, c_char_p, POINTER(Desc), POINTER(Desc), c_size_t, c_char_p, c_size_t,
                           POINTER(c_uint64), _err]),
    "bounce_pull_blocks": (code, [c_uint64, c_char_p, c_char_p, POINTER(c_uint32), c_size_t, c_char_p,
                                  POINTER(c_uint32), c_size_t, c_char_p, c_size_t, POINTER(c_uint64), _err]),
    "bounce_batch_poll": (code, [c_uint64, POINTER(c_int32), _err]),
    "bounce_batch_wait": (code, [c_uint64, c_int64, POINTER(c_int32), _err]),
    "bounce_batch_retirement": (code, [c_uint64, POINTER(c_int32), POINTER(c_int32), _err]),
    "bounce_batch_abandon": (code, [c_uint64, c_int64, POINTER(c_int32), _err]),
    "bounce_batch_release": (code, [c_uint64, _err]),
    "bounce_next_event": (code, [c_uint64, c_int64, POINTER(EventC), _err]),
    "bounce_agent_stats": (code, [c_uint64, POINTER(c_void_p), _err]),
}


def _candidates():
    env = os.environ.get("BOUNCE_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libbounce.so")
    # A source checkout: python/bounce -> bin/libbounce.so (make capi).
    yield os.path.join(here, "..", "..", "bin", "libbounce.so")


def load():
    """Loads libbounce.so ($BOUNCE_LIBRARY, beside the package, or the
    checkout's bin/) and checks its ABI version."""
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            tried.append(path)
            continue
        lib = ctypes.CDLL(os.path.abspath(path))
        for name, (res, args) in _PROTOS.items():
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
        v = lib.bounce_abi_version()
        if v != ABI_VERSION:
            raise ImportError(f"{path}: ABI version {v}, this package speaks {ABI_VERSION}")
        return lib
    raise ImportError("libbounce.so not found (set BOUNCE_LIBRARY, or run `make capi` in the checkout); looked at "
                      + ", ".join(tried))
