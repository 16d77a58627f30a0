#!/usr/bin/python3
"""A KV connector in miniature: a prefill process and a decode process
register a KV pool each, the decode side picks the block ids it has free,
the prefill side moves one request's blocks into them by id, and the decode
side waits for the landed event and checks every byte.

    make python-example        # builds libbounce.so, then runs this file

The prefill process (this one) starts the decode process itself; the two
exchange descriptors and the decode side's block ids through files in a
temporary directory, as a real connector would through its own control
plane. Both use the tcp engine and ZeroMQ on 127.0.0.1.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bounce  # noqa: E402

LAYERS, BLOCK, BLOCKS, REQUEST = 32, 4096, 256, 128  # 64 regions (K and V per layer), 32 MiB a request
TAG = b"request-17"


def options(name):
    return {"agent.name": name, "engine.kind": "tcp", "engine.listen": "127.0.0.1:0",
            "control_plane.bind_address": "127.0.0.1", "bounce.arena_size": "64MiB"}


def pattern(ids):
    """The bytes block id i holds in region r: every byte names (r, i)."""
    r = np.arange(2 * LAYERS, dtype=np.uint32)[:, None, None]
    i = np.asarray(ids, dtype=np.uint32)[None, :, None]
    k = np.arange(BLOCK, dtype=np.uint32)[None, None, :]
    return ((r * 131 + i * 7 + k) & 0xFF).astype(np.uint8)


def wait_for(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout}s")
        time.sleep(0.02)
    with open(path, "rb") as f:
        return f.read()


def publish(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def decode(tmp, src_ids):
    kv = np.zeros((2 * LAYERS, BLOCKS, BLOCK), dtype=np.uint8)  # the decode server's KV cache
    with bounce.Agent(options=options("decode-0")) as agent:
        agent.register(kv)
        agent.register_pool("kv", bounce.Pool.of(kv, blocks=BLOCKS))
        agent.load_peer(wait_for(os.path.join(tmp, "prefill.desc")))  # admit the prefill server
        free = np.random.default_rng(5).choice(BLOCKS, REQUEST, replace=False).astype(np.uint32)
        publish(os.path.join(tmp, "decode.ids"), free.tobytes())
        publish(os.path.join(tmp, "decode.desc"), agent.descriptor())
        ev = agent.next_event(timeout=120)
        ev.raise_for_error()
        assert ev.tag == TAG, ev
        if not np.array_equal(kv[:, free], pattern(src_ids)):
            bad = np.argwhere((kv[:, free] != pattern(src_ids)).any(axis=2))
            raise SystemExit(f"decode: {len(bad)} pieces differ, first (region, block) {tuple(bad[0])}")
        rest = np.setdiff1d(np.arange(BLOCKS), free)
        if kv[:, rest].any():
            raise SystemExit("decode: bytes landed outside the request's blocks")
        print(f"decode: {ev.bytes >> 20} MiB in {REQUEST} blocks x {2 * LAYERS} regions from {ev.peer} "
              f"landed by {ev.route}, every byte verified")


def prefill():
    src_ids = np.random.default_rng(7).choice(BLOCKS, REQUEST, replace=False).astype(np.uint32)
    kv = np.zeros((2 * LAYERS, BLOCKS, BLOCK), dtype=np.uint8)
    kv[:, src_ids] = pattern(src_ids)
    with tempfile.TemporaryDirectory() as tmp, bounce.Agent(options=options("prefill-0")) as agent:
        agent.register(kv)
        agent.register_pool("kv", bounce.Pool.of(kv, blocks=BLOCKS))
        publish(os.path.join(tmp, "prefill.desc"), agent.descriptor())
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--decode", tmp,
                                  "--src-ids", ",".join(map(str, src_ids))])
        try:
            peer = agent.load_peer(wait_for(os.path.join(tmp, "decode.desc")))
            dst_ids = np.frombuffer(wait_for(os.path.join(tmp, "decode.ids")), dtype=np.uint32)
            start = time.monotonic()
            with agent.submit_blocks(peer, "kv", src_ids, "kv", dst_ids, tag=TAG) as batch:
                pass  # waits for the batch, then releases it (its memory is quiescent)
            took = time.monotonic() - start
            print(f"prefill: {REQUEST} blocks x {2 * LAYERS} regions sent to {peer} in {took * 1e3:.1f} ms")
            if child.wait(timeout=120) != 0:
                raise SystemExit(f"decode exited with {child.returncode}")
        finally:
            if child.poll() is None:
                child.kill()
    print("every byte verified")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--src-ids", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.decode:
        decode(a.decode, [int(x) for x in a.src_ids.split(",")])
    else:
        prefill()
