"""Device memory from Python: a KV pool in GPU memory (a torch tensor, seen
through __cuda_array_interface__ and through DLPack) moved by block id
between two agents with the CUDA stages. Skips without torch and a GPU."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import bounce  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

BLOCK, REGIONS, BLOCKS, N = 4096, 16, 128, 96


def agent(name):
    return bounce.Agent(options={
        "agent.name": name, "engine.kind": "tcp", "engine.listen": "127.0.0.1:0",
        "control_plane.bind_address": "127.0.0.1", "bounce.route": "bounce",
        "stages.gather": "cuda", "stages.scatter": "cuda", "bounce.arena_size": "64MiB"})


@pytest.mark.parametrize("view", ["cuda_array_interface", "dlpack"])
def test_device_pool_blocks_by_id(view):
    g = torch.Generator(device="cuda").manual_seed(3)
    src = torch.randint(0, 256, (REGIONS, BLOCKS, BLOCK), dtype=torch.uint8, device="cuda", generator=g)
    dst = torch.zeros_like(src)

    class DL:  # only __dlpack__, so desc_of takes the DLPack path
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__()

    wrap = (lambda t: t) if view == "cuda_array_interface" else DL
    with agent("py-gpu-send") as send, agent("py-gpu-recv") as recv:
        s = send.register(wrap(src))
        d = recv.register(wrap(dst))
        assert s.kind == bounce.CUDA and d.kind == bounce.CUDA and s.nbytes == src.numel()
        send.register_pool("kv", bounce.Pool([s.addr + r * BLOCKS * BLOCK for r in range(REGIONS)], BLOCK, BLOCKS, kind=bounce.CUDA))
        recv.register_pool("kv", bounce.Pool([d.addr + r * BLOCKS * BLOCK for r in range(REGIONS)], BLOCK, BLOCKS, kind=bounce.CUDA))
        peer = send.load_peer(recv.descriptor())
        recv.load_peer(send.descriptor())
        sid = torch.randperm(BLOCKS, generator=torch.Generator().manual_seed(1))[:N].to(torch.int64)
        did = torch.randperm(BLOCKS, generator=torch.Generator().manual_seed(2))[:N].to(torch.int64)
        with send.submit_blocks(peer, "kv", sid.tolist(), "kv", did.tolist(), tag=b"gpu"):
            pass
        ev = recv.next_event(60)
        ev.raise_for_error()
        assert ev.route == "bounce" and ev.bytes == REGIONS * N * BLOCK
        torch.cuda.synchronize()
        assert torch.equal(dst[:, did.cuda()], src[:, sid.cuda()])
        rest = torch.ones(BLOCKS, dtype=torch.bool)
        rest[did] = False
        assert not dst[:, rest.cuda()].any()
