"""pytest tests of the Python package over libbounce.so: two agents in this
process over the tcp engine and ZeroMQ on loopback (real sockets)."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import bounce  # noqa: E402

BLOCK = 4096


def agent(name, **extra):
    opts = {"agent.name": name, "engine.kind": "tcp", "engine.listen": "127.0.0.1:0",
            "control_plane.bind_address": "127.0.0.1", "bounce.route": "bounce"}
    opts.update(extra)
    return bounce.Agent("bounce:\n  arena_size: 64MiB\n", opts)


@pytest.fixture
def pair():
    with agent("py-prefill") as send, agent("py-decode") as recv:
        yield send, recv


def connect(send, recv):
    peer = send.load_peer(recv.descriptor())
    sender = recv.load_peer(send.descriptor())
    return peer, sender


def test_descriptors_land_byte_exact(pair):
    send, recv = pair
    n = 512
    src = np.random.default_rng(1).integers(0, 256, n * BLOCK, dtype=np.uint8)
    dst = np.full((n + 2) * BLOCK, 0xA5, dtype=np.uint8)
    s, d = send.register(src), recv.register(dst)
    peer, sender = connect(send, recv)
    srcs = [bounce.Desc(s.addr + i * BLOCK, BLOCK) for i in range(n)]
    dsts = [bounce.Desc(d.addr + (n - i) * BLOCK, BLOCK) for i in range(n)]
    b = send.submit(peer, srcs, dsts, tag=b"req-1", route="bounce")
    b.wait(60)
    assert b.poll() == "done" and b.retirement == (True, True)
    b.release()
    with pytest.raises(bounce.BadHandle):
        bounce.Batch(1 << 60).poll()
    ev = recv.next_event(timeout=60)
    assert ev.ok and ev.peer == sender and ev.tag == b"req-1" and ev.bytes == n * BLOCK and ev.route == "bounce"
    got = dst[BLOCK:(n + 1) * BLOCK].reshape(n, BLOCK)[::-1]
    assert np.array_equal(got, src.reshape(n, BLOCK))
    assert (dst[:BLOCK] == 0xA5).all() and (dst[(n + 1) * BLOCK:] == 0xA5).all()
    assert send.stats()["Succeeded"] == 1


def test_blocks_by_id(pair):
    send, recv = pair
    regions, blocks, n = 8, 64, 48
    rng = np.random.default_rng(2)
    src = rng.integers(0, 256, (regions, blocks, BLOCK), dtype=np.uint8)
    dst = np.zeros((regions, blocks, BLOCK), dtype=np.uint8)
    send.register(src)
    recv.register(dst)
    send.register_pool("kv", bounce.Pool.of(src, blocks=blocks))
    recv.register_pool("kv", bounce.Pool.of(dst, blocks=blocks))
    peer, sender = connect(send, recv)
    sid = rng.choice(blocks, n, replace=False).astype(np.uint32)
    did = rng.choice(blocks, n, replace=False).astype(np.uint32)
    with send.submit_blocks(peer, "kv", sid, "kv", did, tag=b"blocks", route="bounce") as b:
        pass  # the with block waits for the batch and releases it
    assert b._h == 0
    ev = recv.next_event(60)
    assert ev.ok and ev.bytes == regions * n * BLOCK and ev.tag == b"blocks"
    assert np.array_equal(dst[:, did], src[:, sid])
    untouched = np.setdiff1d(np.arange(blocks), did)
    assert not dst[:, untouched].any()


def test_bad_input_raises_mapped_errors(pair):
    send, recv = pair
    with pytest.raises(bounce.InvalidArgument, match="engine.knd"):
        bounce.Agent(options={"engine.knd": "tcp"})
    with pytest.raises(bounce.UnknownPeer):
        send.submit("nobody", [bounce.Desc(1, 1)], [bounce.Desc(1, 1)])
    with pytest.raises(bounce.Timeout):
        recv.next_event(timeout=0.05)
    src = np.zeros((2, 8, BLOCK), dtype=np.uint8)
    dst = np.zeros((2, 8, BLOCK), dtype=np.uint8)
    send.register(src)
    recv.register(dst)
    send.register_pool("kv", bounce.Pool.of(src, blocks=8))
    recv.register_pool("kv", bounce.Pool.of(dst, blocks=8))
    peer, _ = connect(send, recv)
    with pytest.raises(bounce.InvalidArgument, match="duplicate"):
        send.submit_blocks(peer, "kv", [0, 1], "kv", [3, 3])
    with pytest.raises(bounce.BounceError):
        send.submit_blocks(peer, "kv", [0, 9], "kv", [1, 2])
    assert not dst.any()
    with pytest.raises(bounce.InvalidArgument):
        send.register_pool("bad", bounce.Pool([0], 0, 1))


def test_buffer_protocols():
    a = np.arange(64, dtype=np.float32)
    d = bounce.desc_of(a)
    assert (d.addr, d.nbytes, d.kind) == (a.ctypes.data, 256, bounce.HOST)
    if hasattr(a, "__dlpack__"):
        dl = bounce.desc_of(type("T", (), {"__dlpack__": lambda self, **k: a.__dlpack__()})())
        assert (dl.addr, dl.nbytes, dl.kind) == (d.addr, d.nbytes, bounce.HOST)

    class FakeCuda:
        __cuda_array_interface__ = {"data": (0x7000_0000, False), "shape": (4, 1024), "typestr": "<f2",
                                    "strides": None, "version": 3}

    c = bounce.desc_of(FakeCuda(), device=1)
    assert (c.addr, c.nbytes, c.kind, c.device) == (0x7000_0000, 8192, bounce.CUDA, 1)
    with pytest.raises(bounce.InvalidArgument, match="contiguous"):
        bounce.desc_of(a[::2])


def test_closed_agent_is_refused():
    a = agent("py-closed")
    a.close()
    with pytest.raises(bounce.BadHandle):
        a._h = 999999
        a.descriptor()
    a._h = 0


def test_connector_example_runs_as_printed():
    """The README's example: two processes move a request's blocks by id."""
    import subprocess
    here = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, os.path.join(here, "..", "examples", "kv_connector.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every byte verified" in out.stdout and "decode: 32 MiB" in out.stdout


def test_threads_submit_at_once(pair):
    """The ABI is thread-safe: four threads submit and wait at once (ctypes
    releases the GIL during each call); every request lands byte-exact."""
    import threading
    send, recv = pair
    threads, per, blocks = 4, 6, 16
    src = np.random.default_rng(3).integers(0, 256, (threads * per, blocks, BLOCK), dtype=np.uint8)
    dst = np.zeros_like(src)
    s, d = send.register(src), recv.register(dst)
    peer, _ = connect(send, recv)
    errors = []

    def work(k):
        try:
            for j in range(per):
                r = k * per + j
                base = r * blocks * BLOCK
                srcs = [bounce.Desc(s.addr + base + i * BLOCK, BLOCK) for i in range(blocks)]
                dsts = [bounce.Desc(d.addr + base + (blocks - 1 - i) * BLOCK, BLOCK) for i in range(blocks)]
                with send.submit(peer, srcs, dsts, tag=b"t%d" % r):
                    pass
        except Exception as e:  # reported below, on the test's thread
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    tags = {recv.next_event(60).tag for _ in range(threads * per)}
    assert tags == {b"t%d" % r for r in range(threads * per)}
    assert np.array_equal(dst[:, ::-1], src)
