# Shaped kernels against the whole-block kernels moving the same bytes, one
# launch each, timed by CUDA events (20 launches after a warm-up), per
# family (bulk, bulk2, vector) and gather/scatter: llama70b TP=8 (81,920 x
# 4 KiB) as TP-merge halves, NHD 256 B pieces and 16->32 token blocks;
# gpt-oss (36,864 x 2 KiB) as halves and NHD 128 B pieces. compute_90 module.
#   python3 b.py copy_sm90.ptx
import os
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "h.py")).read())
rnd = random.Random(2)
ev = [C.c_void_p(), C.c_void_p()]
for e in ev: ck(cu.cuEventCreate(C.byref(e), 0), "ev")
def timeit(f, reps=20):
    f(); ck(cu.cuCtxSynchronize(), "sync")
    ck(cu.cuEventRecord(ev[0], None), "rec")
    for _ in range(reps): f()
    ck(cu.cuEventRecord(ev[1], None), "rec"); ck(cu.cuEventSynchronize(ev[1]), "es")
    ms = C.c_float(); ck(cu.cuEventElapsedTime(C.byref(ms), ev[0], ev[1]), "el"); return ms.value / reps
def nhd(t, h, p, hh): return [(0, (i * h + hh) * p, p) for i in range(t)]
W = [("llama70b tp-merge-half", 81920, 4096, 8192, [(0, 4096, 4096)]), ("llama70b nhd-256B", 81920, 4096, 8192, nhd(16, 2, 256, 1)),
     ("llama70b block16to32", 81920, 4096, 4096, [(0, 0, 4096), (1, 0, 4096)]), ("gptoss tp-merge-half", 36864, 2048, 4096, [(0, 2048, 2048)]),
     ("gptoss nhd-128B", 36864, 2048, 4096, nhd(16, 2, 128, 1))]
for name, count, unit, bl, segs in W:
    total = count * unit; ulen = sum(s[2] for s in segs); units = total // ulen; group = 1 + max(s[0] for s in segs)
    nbw = 2 * count; nbs = 2 * units * group
    wp, sp, reg = alloc(nbw * unit), alloc(nbs * bl), alloc(total)
    wid = rnd.sample(range(nbw), count); sid = rnd.sample(range(nbs), units * group)
    wt = alloc(8 + 4 * count); h2d(wt, struct.pack("<Q", wp) + struct.pack("<%dI" % count, *wid))
    st = alloc(16 + 4 * len(sid) + 16 * len(segs)); sb = struct.pack("<Q", sp) + struct.pack("<%dI" % len(sid), *sid); sb += b"\0" * (-len(sb) % 16); sa = len(sb); h2d(st, sb + enc(segs))
    L = segs[0][2]
    for d in ["gather", "scatter"]:
        res = {}
        for fam in ["_bulk", "_bulk2", "_vec"]:
            tw = timeit(lambda: blocks(d, fam, reg, wt, wt + 8, count, 0, count, unit, unit))
            ts = timeit(lambda: shaped(d, fam, reg, st, st + 8, st + sa, units, 0, units, L, bl, ulen, group, len(segs)))
            res[fam] = (tw, ts)
        tgen = timeit(lambda: shaped(d, "", reg, st, st + 8, st + sa, units, 0, units, 0, bl, ulen, group, len(segs)))
        bw = min(v[0] for v in res.values())
        print("%-24s %-7s %6.1f MiB  " % (name, d, total / 2**20) + "  ".join("%s whole %.0f shaped %.0f GB/s (%.2fx)" % (f[1:], total / v[0] / 1e6, total / v[1] / 1e6, v[0] / v[1]) for f, v in res.items())
              + "  general shaped %.0f GB/s; best shaped / best whole %.2fx" % (total / tgen / 1e6, bw / min(v[1] for v in res.values())))
    for p in (wp, sp, reg, wt, st): cu.cuMemFree_v2(C.c_uint64(p))
