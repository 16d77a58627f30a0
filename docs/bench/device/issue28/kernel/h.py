# Driver-API harness (ctypes, no Go, no toolkit) for the shaped and block
# kernels of a copy.cu module: loads the PTX named by argv[1] on device 0 and
# launches kernels with the grids gpucopy/kernels compute (LaunchShaped,
# LaunchBlocks). t.py and b.py exec it.
import ctypes as C, random, struct, sys, time
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r: raise SystemExit("%s: CUDA error %d" % (what, r))
ck(cu.cuInit(0), "init")
dev = C.c_int(); ck(cu.cuDeviceGet(C.byref(dev), 0), "dev")
ctx = C.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "ctx"); ck(cu.cuCtxSetCurrent(ctx), "cur")
ptx = open(sys.argv[1], "rb").read() + b"\0"
mod = C.c_void_p(); ck(cu.cuModuleLoadData(C.byref(mod), ptx), "load")
def fn(n):
    f = C.c_void_p(); ck(cu.cuModuleGetFunction(C.byref(f), mod, n.encode()), n); return f
sms = C.c_int(); ck(cu.cuDeviceGetAttribute(C.byref(sms), 16, dev), "sms")
def alloc(n):
    p = C.c_uint64(); ck(cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(n)), "alloc"); return p.value
def h2d(p, b): ck(cu.cuMemcpyHtoD_v2(C.c_uint64(p), b, C.c_size_t(len(b))), "h2d")
def d2h(p, n):
    b = C.create_string_buffer(n); ck(cu.cuMemcpyDtoH_v2(b, C.c_uint64(p), C.c_size_t(n)), "d2h"); return b.raw
def launch(f, grid, threads, args):
    vals = [C.c_uint64(a) for a in args]
    arr = (C.c_void_p * len(vals))(*[C.cast(C.byref(v), C.c_void_p) for v in vals])
    ck(cu.cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, 0, None, arr, None), "launch")
def occ(f, t):
    n = C.c_int(); ck(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(C.byref(n), f, t, C.c_size_t(0)), "occ"); return n.value
FAM0 = ["", "_vec", "_bulk", "_bulk2"]
K = {}
for kind in ["shaped", "blocks"]:
    for fam in FAM0:
        for d in ["gather", "scatter"]:
            f = C.c_void_p()
            if cu.cuModuleGetFunction(C.byref(f), mod, ("bounce_%s_%s%s" % (d, kind, fam)).encode()) == 0: K[(kind, fam, d)] = f
FAM = [f for f in FAM0 if ("shaped", f, "gather") in K]
def shift(l):
    if l >= 4096 and l % 4096 == 0: return 12
    if 128 <= l <= 4096 and l & (l - 1) == 0: return l.bit_length() - 1
def geom(fam, items, L, f):
    warps = items if fam == "" else (items * L + 4095) // 4096
    if fam == "_bulk2": return max(1, min((warps + 3) // 4, sms.value * max(occ(f, 128), 1))), 128
    return max(1, min((warps + 7) // 8, 1 << 20)), 256
def shaped(d, fam, region, bases, ids, segs, G, off0, units, L, stride, ulen, group, ns):
    f = K[("shaped", fam, d)]; g, t = geom(fam, units * ns, L, f)
    launch(f, g, t, [region, bases, ids, segs, G, off0, units * ns, L, stride, ulen, group, ns, 0, 0, 0, shift(L) or 0])
def blocks(d, fam, region, bases, ids, n, off0, count, L, stride):
    f = K[("blocks", fam, d)]; g, t = geom(fam, count, L, f)
    launch(f, g, t, [region, bases, ids, n, off0, count, L, stride, 0, 0, 0, shift(L) or 0])
def enc(segs):
    b, r = b"", 0
    for (blk, off, l) in segs: b += struct.pack("<4I", blk, off, l, r); r += l
    return b
