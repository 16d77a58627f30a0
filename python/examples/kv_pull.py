#!/usr/bin/python3
"""A decode-initiated KV connector in miniature: the prefill process holds
one request's KV blocks and registers its pool for the decode server; the
decode process, once it has free blocks, pulls them by id, checks every
byte, and the prefill side learns from its event that the blocks were
served and may be reused.

    make python-pull-example   # builds libbounce.so, then runs this file

The prefill process (this one) starts the decode process itself; the two
exchange descriptors and block ids through files in a temporary directory,
as a real connector would through its own control plane. Both use the tcp
engine and ZeroMQ on 127.0.0.1. The pool geometry, the byte pattern and
the file exchange are kv_connector.py's.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kv_connector import BLOCK, BLOCKS, LAYERS, REQUEST, bounce, options, pattern, publish, wait_for  # noqa: E402

TAG = b"request-29"


def decode(tmp):
    kv = np.zeros((2 * LAYERS, BLOCKS, BLOCK), dtype=np.uint8)  # the decode server's KV cache
    with bounce.Agent(options=options("decode-0")) as agent:
        agent.register(kv)  # the holder writes what is pulled
        agent.register_pool("kv", bounce.Pool.of(kv, blocks=BLOCKS))
        publish(os.path.join(tmp, "decode.desc"), agent.descriptor())
        prefill = agent.load_peer(wait_for(os.path.join(tmp, "prefill.desc")))
        src_ids = np.frombuffer(wait_for(os.path.join(tmp, "prefill.ids")), dtype=np.uint32)
        # Ready for the request: free blocks found, so take the KV now.
        free = np.random.default_rng(5).choice(BLOCKS, REQUEST, replace=False).astype(np.uint32)
        start = time.monotonic()
        with agent.pull_blocks(prefill, "kv", src_ids, "kv", free, tag=TAG) as batch:
            pass  # waits for the pull, then releases it (its memory is quiescent)
        took = time.monotonic() - start
        if not np.array_equal(kv[:, free], pattern(src_ids)):
            bad = np.argwhere((kv[:, free] != pattern(src_ids)).any(axis=2))
            raise SystemExit(f"decode: {len(bad)} pieces differ, first (region, block) {tuple(bad[0])}")
        rest = np.setdiff1d(np.arange(BLOCKS), free)
        if kv[:, rest].any():
            raise SystemExit("decode: bytes landed outside the request's blocks")
        print(f"decode: pulled {REQUEST} blocks x {2 * LAYERS} regions from {prefill} in {took * 1e3:.1f} ms, "
              f"every byte verified")


def prefill():
    src_ids = np.random.default_rng(7).choice(BLOCKS, REQUEST, replace=False).astype(np.uint32)
    kv = np.zeros((2 * LAYERS, BLOCKS, BLOCK), dtype=np.uint8)
    kv[:, src_ids] = pattern(src_ids)
    with tempfile.TemporaryDirectory() as tmp, bounce.Agent(options=options("prefill-0")) as agent:
        agent.register(kv, for_peer="decode-0")  # only decode-0 may pull it
        agent.register_pool("kv", bounce.Pool.of(kv, blocks=BLOCKS))
        publish(os.path.join(tmp, "prefill.desc"), agent.descriptor())
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--decode", tmp])
        try:
            agent.load_peer(wait_for(os.path.join(tmp, "decode.desc")))  # admit the decode server
            publish(os.path.join(tmp, "prefill.ids"), src_ids.tobytes())
            ev = agent.next_event(timeout=120)  # the pull it served
            ev.raise_for_error()
            assert ev.pull and ev.tag == TAG and ev.bytes == REQUEST * 2 * LAYERS * BLOCK, ev
            print(f"prefill: {ev.peer} pulled {ev.bytes >> 20} MiB; blocks "
                  f"{'free to reuse' if ev.quiescent else 'still read: keep them'}")
            if child.wait(timeout=120) != 0:
                raise SystemExit(f"decode exited with {child.returncode}")
        finally:
            if child.poll() is None:
                child.kill()
    print("every byte verified")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", metavar="DIR", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.decode:
        decode(a.decode)
    else:
        prefill()
