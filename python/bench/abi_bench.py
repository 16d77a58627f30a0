#!/usr/bin/python3
"""Times one workload through the Python package, for capi's
BenchmarkPythonVsGo (which times the same workload through the Go API in
the same run): two agents in this process over tcp and ZeroMQ on loopback,
REGIONS x IDS blocks of BLOCK bytes by id, bounce route. Prints one JSON
object: seconds per request, and the per-call cost of poll and submit."""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bounce  # noqa: E402


def agent(name):
    return bounce.Agent(options={"agent.name": name, "engine.kind": "tcp", "engine.listen": "127.0.0.1:0",
                                 "control_plane.bind_address": "127.0.0.1", "bounce.route": "bounce"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regions", type=int, default=160)
    ap.add_argument("--ids", type=int, default=512)
    ap.add_argument("--block", type=int, default=4096)
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    src = rng.integers(0, 256, (a.regions, a.ids, a.block), dtype=np.uint8)
    dst = np.zeros_like(src)
    sid = rng.permutation(a.ids).astype(np.uint32)
    did = rng.permutation(a.ids).astype(np.uint32)
    with agent("bench-send") as send, agent("bench-recv") as recv:
        send.register(src)
        recv.register(dst)
        send.register_pool("kv", bounce.Pool.of(src, blocks=a.ids))
        recv.register_pool("kv", bounce.Pool.of(dst, blocks=a.ids))
        peer = send.load_peer(recv.descriptor())
        recv.load_peer(send.descriptor())
        times, submits = [], []
        for i in range(a.requests + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            b = send.submit_blocks(peer, "kv", sid, "kv", did)
            t1 = time.perf_counter()
            b.wait(120)
            b.release()
            recv.next_event(120).raise_for_error()
            if i:
                times.append(time.perf_counter() - t0)
                submits.append(t1 - t0)
        if not np.array_equal(dst[:, did], src[:, sid]):
            raise SystemExit("bytes differ")
        b = send.submit_blocks(peer, "kv", sid[:1], "kv", did[:1])
        b.wait(60)
        n = 20000
        t0 = time.perf_counter()
        for _ in range(n):
            b.poll()
        poll_ns = (time.perf_counter() - t0) / n * 1e9
        b.release()
        recv.next_event(60)
    print(json.dumps({"seconds_per_request": sorted(times)[len(times) // 2], "submit_ns": sorted(submits)[len(submits) // 2] * 1e9,
                      "poll_ns": poll_ns, "pieces": a.regions * a.ids}))


if __name__ == "__main__":
    main()
