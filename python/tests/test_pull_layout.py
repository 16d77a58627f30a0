"""pytest tests of pulls and KV layouts through the Python package: two
agents in this process over the tcp engine and ZeroMQ on loopback."""

import os
import subprocess
import sys

import numpy as np
import pytest

from test_bounce import BLOCK, agent, connect

import bounce

GUARD = 0xA5


@pytest.fixture
def pair():
    """A holder (prefill) and a puller (decode)."""
    with agent("py-holder") as holder, agent("py-puller") as puller:
        yield holder, puller


def pools(holder, puller, regions=4, blocks=96, for_peer="py-puller"):
    src = np.random.default_rng(11).integers(0, 256, (regions, blocks, BLOCK), dtype=np.uint8)
    dst = np.full((regions, blocks, BLOCK), GUARD, dtype=np.uint8)
    holder.register(src, for_peer=for_peer)
    puller.register(dst)
    holder.register_pool("kv", bounce.Pool.of(src, blocks=blocks))
    puller.register_pool("kv-in", bounce.Pool.of(dst, blocks=blocks))
    return src, dst


def test_pull_blocks_byte_exact(pair):
    holder, puller = pair
    src, dst = pools(holder, puller)
    name, _ = connect(puller, holder)
    rng = np.random.default_rng(12)
    sid = rng.choice(96, 64, replace=False).astype(np.uint32)
    did = rng.choice(96, 64, replace=False).astype(np.uint32)
    b = puller.pull_blocks(name, "kv", sid, "kv-in", did, tag=b"req-pull")
    b.wait(60)
    assert b.poll() == "done" and b.retirement == (True, True)
    b.release()
    assert np.array_equal(dst[:, did], src[:, sid])
    rest = np.setdiff1d(np.arange(96), did)
    assert (dst[:, rest] == GUARD).all()
    ev = holder.next_event(60)
    assert ev.ok and ev.pull and ev.quiescent and ev.peer == "py-puller"
    assert ev.tag == b"req-pull" and ev.bytes == 4 * 64 * BLOCK
    with pytest.raises(bounce.Timeout):
        puller.next_event(0.2)  # the puller's batch is its report
    assert puller.stats()["Pulls"] == 1 and holder.stats()["PullsServed"] == 1


def test_pull_descriptors_byte_exact(pair):
    holder, puller = pair
    n = 200
    src = np.random.default_rng(13).integers(0, 256, n * BLOCK, dtype=np.uint8)
    dst = np.full((n + 2) * BLOCK, GUARD, dtype=np.uint8)
    s, d = holder.register(src, for_peer="py-puller"), puller.register(dst)
    name, _ = connect(puller, holder)
    srcs = [bounce.Desc(s.addr + i * BLOCK, BLOCK) for i in range(n)]
    dsts = [bounce.Desc(d.addr + (n - i) * BLOCK, BLOCK) for i in range(n)]
    with puller.pull(name, srcs, dsts, tag=b"descs") as b:
        pass  # waits for the pull, then releases it
    assert b._h == 0
    got = dst[BLOCK:(n + 1) * BLOCK].reshape(n, BLOCK)[::-1]
    assert np.array_equal(got, src.reshape(n, BLOCK))
    assert (dst[:BLOCK] == GUARD).all() and (dst[(n + 1) * BLOCK:] == GUARD).all()
    ev = holder.next_event(60)
    assert ev.ok and ev.pull and ev.bytes == n * BLOCK and ev.tag == b"descs"


def test_refused_pull_raises_forbidden_and_changes_nothing(pair):
    holder, puller = pair
    src, dst = pools(holder, puller, for_peer="py-someone-else")
    loose = np.ones(4 * BLOCK, dtype=np.uint8)
    ls = holder.register(loose, for_peer="py-someone-else")
    name, _ = connect(puller, holder)
    b = puller.pull_blocks(name, "kv", [0, 1, 2], "kv-in", [5, 6, 7])
    with pytest.raises(bounce.Forbidden, match='pool "kv" is not registered for "py-puller"') as ei:
        b.wait(60)
    assert ei.value.code == 13 and isinstance(ei.value, PermissionError)
    with pytest.raises(bounce.Forbidden):
        b.poll()
    assert b.retirement == (True, True)
    b.release()
    b = puller.pull(name, [bounce.Desc(ls.addr, BLOCK)], [bounce.Desc(dst.ctypes.data, BLOCK)])
    with pytest.raises(bounce.Forbidden, match='not "py-puller"'):
        b.wait(60)
    b.release()
    assert (dst == GUARD).all()
    assert holder.stats()["RefusedPulls"] == 2 and holder.stats()["PullsServed"] == 0
    with pytest.raises(bounce.Timeout):
        holder.next_event(0.2)  # a refused pull is no event
    with pytest.raises(bounce.NotRegistered, match='"none"'):
        puller.pull_blocks(name, "none", [0], "kv-in", [0])
    with pytest.raises(bounce.InvalidArgument, match="2 source block ids but 1"):
        puller.pull_blocks(name, "kv", [0, 1], "kv-in", [0])  # a pull does not convert: one id for one
    with pytest.raises(bounce.InvalidArgument, match="nothing to pull"):
        puller.pull(name, [], [])
    with pytest.raises(bounce.UnknownPeer):
        puller.pull_blocks("nobody", "kv", [0], "kv-in", [0])


L, D, E = 2, 8, 2  # layers, head size, bytes per element (uint16)


def kv_pool(agent_, name, lay, blocks, fill=None):
    """A pool of layout lay: an array (regions, blocks, ...) in its order
    of uint16 elements, registered with the layout."""
    shape = (lay.tokens, lay.heads, lay.head_dim) if lay.order == "nhd" else (lay.heads, lay.tokens, lay.head_dim)
    a = np.full((lay.regions, blocks) + shape, GUARD * 0x0101, dtype=np.uint16)
    if fill is not None:
        a[...] = fill
    agent_.register(a)
    agent_.register_pool(name, bounce.Pool.of(a, blocks=blocks), layout=lay)
    return a


def as_nhd(a, lay):
    """Blocks of layout lay as (regions, ids, tokens, heads, D)."""
    return a if lay.order == "nhd" else a.swapaxes(2, 3)


@pytest.mark.parametrize("case", ["nhd-to-hnd-16-to-32", "tp-split"])
def test_layout_conversion_byte_exact(pair, case):
    send, recv = pair
    if case == "nhd-to-hnd-16-to-32":
        ls = bounce.Layout(L, heads=4, head_dim=D, tokens=16, elem=E)
        ld = bounce.Layout(L, heads=4, head_dim=D, tokens=32, elem=E, order="hnd")
    else:  # prefill TP=2 rank holding heads 0..3 -> decode TP=4 rank holding heads 2..3
        ls = bounce.Layout(L, heads=4, head_dim=D, tokens=16, elem=E)
        ld = bounce.Layout(L, heads=2, head_dim=D, tokens=16, elem=E, first_head=2)
    blocks = 40
    # Every element distinct: region, block, token, head and element all in its value.
    vals = np.arange(ls.regions * blocks * 16 * 4 * D, dtype=np.uint32).reshape(ls.regions, blocks, 16, 4, D)
    src = kv_pool(send, "kv", ls, blocks, fill=(vals * 40503 % 65521).astype(np.uint16))
    dst = kv_pool(recv, "kv-in", ld, blocks)
    peer, sender = connect(send, recv)
    rng = np.random.default_rng(14)
    tokens = 256
    sid = rng.choice(blocks, tokens // ls.tokens, replace=False).astype(np.uint32)
    did = rng.choice(blocks, tokens // ld.tokens, replace=False).astype(np.uint32)
    with send.submit_blocks(peer, "kv", sid, "kv-in", did, tag=b"conv", route="bounce"):
        pass
    ev = recv.next_event(60)
    assert ev.ok and not ev.pull and ev.peer == sender
    h0, nh = ld.first_head, ld.heads
    # The request's tokens in order, (regions, tokens, model heads, D), then as the decode side's blocks.
    want = as_nhd(src[:, sid], ls).reshape(ls.regions, tokens, 4, D)[:, :, h0:h0 + nh]
    want = want.reshape(ld.regions, len(did), ld.tokens, nh, D)
    if ld.order == "hnd":
        want = want.swapaxes(2, 3)
    assert np.array_equal(dst[:, did], want)
    assert ev.bytes == ld.regions * len(did) * ld.block_len
    rest = np.setdiff1d(np.arange(blocks), did)
    assert (dst[:, rest] == GUARD * 0x0101).all()


def test_bad_layout_raises(pair):
    send, recv = pair
    ls = bounce.Layout(L, heads=4, head_dim=D, tokens=16, elem=E)
    src = kv_pool(send, "kv", ls, 8)
    raw = np.zeros((ls.regions, 8, ls.block_len), dtype=np.uint8)
    send.register(raw)
    with pytest.raises(bounce.InvalidArgument, match="layout block is"):
        send.register_pool("bad", bounce.Pool.of(raw, blocks=8), layout=bounce.Layout(L, 2, D, 16, E))
    with pytest.raises(bounce.InvalidArgument, match="regions"):
        send.register_pool("bad", bounce.Pool.of(raw, blocks=8), layout=bounce.Layout(3, 4, D, 16, E))
    with pytest.raises(bounce.InvalidArgument, match="order"):
        bounce.Layout(L, 4, D, 16, E, order="thd")
    with pytest.raises(bounce.InvalidArgument, match="kv is 3"):
        send.register_pool("bad", bounce.Pool.of(raw, blocks=8), layout=bounce.Layout(L, 4, D, 16, E, kv=3))
    # The same block length, but heads of 16 elements: no conversion exists.
    odd = kv_pool(recv, "kv-odd", bounce.Layout(L, heads=2, head_dim=2 * D, tokens=16, elem=E), 8)
    peer, _ = connect(send, recv)
    with pytest.raises(bounce.IncompatibleLayout, match="heads of 8 elements against 16") as ei:
        send.submit_blocks(peer, "kv", [0, 1], "kv-odd", [2, 3], route="bounce")
    assert ei.value.code == 17 and isinstance(ei.value, bounce.Unsupported)
    assert (odd == GUARD * 0x0101).all()
    assert src.any()


def test_pull_example_runs_as_printed():
    """docs/EMBEDDING.md's pull example: decode pulls a request's blocks by id."""
    here = os.path.dirname(__file__)
    out = subprocess.run([sys.executable, os.path.join(here, "..", "examples", "kv_pull.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "decode: pulled 128 blocks x 64 regions from prefill-0" in out.stdout
    assert "prefill: decode-0 pulled 32 MiB; blocks free to reuse" in out.stdout
    assert out.stdout.rstrip().endswith("every byte verified")


def test_pull_between_layouts_is_refused(pair):
    """A pull does not convert layouts: between pools of different layouts
    (here NHD and HND of the same block length) it is refused before
    anything moves, not copied as raw bytes in the wrong order."""
    holder, puller = pair
    ls = bounce.Layout(L, heads=4, head_dim=D, tokens=16, elem=E)
    src = kv_pool(holder, "kv", ls, 8, fill=7)
    dst = kv_pool(puller, "kv-in", bounce.Layout(L, heads=4, head_dim=D, tokens=16, elem=E, order="hnd"), 8)
    same = kv_pool(puller, "kv-same", ls, 8)
    name, _ = connect(puller, holder)
    with pytest.raises(bounce.Unsupported, match="a pull does not convert layouts") as ei:
        puller.pull_blocks(name, "kv", [0, 1], "kv-in", [2, 3])
    assert ei.value.code == 12 and not isinstance(ei.value, bounce.IncompatibleLayout)
    odd = kv_pool(puller, "kv-odd", bounce.Layout(L, heads=2, head_dim=2 * D, tokens=16, elem=E), 8)
    with pytest.raises(bounce.IncompatibleLayout, match="heads of 8 elements against 16"):
        puller.pull_blocks(name, "kv", [0, 1], "kv-odd", [2, 3])
    assert (dst == GUARD * 0x0101).all() and (odd == GUARD * 0x0101).all()
    with puller.pull_blocks(name, "kv", [0, 1], "kv-same", [2, 3]):
        pass  # the same layout on both sides: pulled as is
    assert np.array_equal(same[:, [2, 3]], src[:, [0, 1]])
    ev = holder.next_event(60)  # the one pull that moved
    assert ev.ok and ev.pull and ev.bytes == ls.regions * 2 * ls.block_len
    assert holder.stats()["PullsServed"] == 1 and holder.stats()["RefusedPulls"] == 0
