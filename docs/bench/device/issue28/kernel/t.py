# Byte-exact test of the shaped kernels on the device: random pools (1-3
# regions, aligned or not), disjoint shapes (uniform ones on the vector/bulk
# families, arbitrary ones on the general kernel), groups of 1-3 ids, random
# unit ranges; each launch is compared, every byte of both buffers, with
# ShapedCopy.Runs' meaning done in Python.
#   python3 t.py copy_sm90.ptx SEED ITERATIONS
import os
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "h.py")).read())
rnd = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
PM, RM = 8 << 20, 8 << 20
pool, reg, tab = alloc(PM), alloc(RM), alloc(1 << 20)
fails = runs = 0
for it in range(int(sys.argv[3]) if len(sys.argv) > 3 else 300):
    uni = rnd.random() < 0.7
    if uni:
        L = 1 << rnd.randint(7, 13); bl = L * rnd.randint(1, max(1, 16384 // L)); stride = bl + 16 * rnd.randint(0, 4); skew = 0
    else:
        L = 0; bl = rnd.randint(1, 9000); stride = bl + rnd.randint(0, 50); skew = rnd.randint(0, 15)
    group = rnd.randint(1, 3); segs = []
    for b in range(group):
        off = 0
        while off < bl:
            l = L or rnd.randint(1, min(bl - off, 3000))
            if off + l > bl: break
            if rnd.random() < 0.6 and len(segs) < 40: segs.append((b, off, l))
            off += l + (0 if uni else rnd.randint(0, 30))
    if not segs: segs = [(0, 0, L or 1)]
    rnd.shuffle(segs)
    ulen = sum(s[2] for s in segs); nreg = rnd.randint(1, 3)
    G = rnd.randint(1, max(1, min(50, (RM // 2) // (ulen * nreg))))
    nb = G * group + rnd.randint(0, 10)
    if nb * stride * nreg + 4096 > PM: continue
    idl = rnd.sample(range(nb), G * group)
    rbase = [pool + 32 + skew + k * (nb * stride + 64) for k in range(nreg)]
    units = nreg * G; first = rnd.randint(0, units - 1); count = rnd.randint(1, units - first)
    roff = 16 + skew
    P = bytearray(rnd.randbytes(PM)); R = bytearray(rnd.randbytes(RM)); h2d(pool, bytes(P)); h2d(reg, bytes(R))
    off0 = first % G; m = min(count, G); lo = first // G; hi = (first + count - 1) // G + 1
    win = [idl[((off0 + w) % G) * group + j] for w in range(m) for j in range(group)]
    bb = struct.pack("<%dQ" % (hi - lo), *rbase[lo:hi]); ib = struct.pack("<%dI" % len(win), *win)
    buf = bb + ib; buf += b"\0" * (-len(buf) % 16); sa = len(buf); buf += enc(segs); h2d(tab, buf)
    fam = rnd.choice(FAM) if (uni and all(s[2] == L for s in segs) and shift(L) is not None) else ""
    d = rnd.choice(["gather", "scatter"])
    shaped(d, fam, reg + roff, tab, tab + len(bb), tab + sa, G, off0, count, L if fam else 0, stride, ulen, group, len(segs))
    ck(cu.cuCtxSynchronize(), "sync %s%s" % (d, fam))
    o = roff
    for q in range(first, first + count):
        r, g = divmod(q, G)
        for (blk, so, l) in segs:
            a = rbase[r] - pool + idl[g * group + blk] * stride + so
            if d == "gather": R[o:o + l] = P[a:a + l]
            else: P[a:a + l] = R[o:o + l]
            o += l
    gp, gr = d2h(pool, PM), d2h(reg, RM); runs += 1
    if gp != bytes(P) or gr != bytes(R):
        fails += 1; print("FAIL", it, d, fam, "L", L, "bl", bl, "stride", stride, "group", group, "segs", segs[:4], len(segs), "G", G, "first", first, "count", count)
print("shaped random: %d passed, %d failed" % (runs - fails, fails))
