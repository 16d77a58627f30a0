// Gather and scatter kernels of the bounce CUDA stages. `make ptx` compiles
// this file to copy.ptx (compute_80) and copy_sm90.ptx (compute_90, which
// adds the Hopper bulk-copy block kernels); both are committed and
// embedded, so builds need no CUDA toolkit. Below the descriptor-form
// kernels come the compact-table kernels and the block-form kernels
// (transfer.BlockCopy: no table, addresses from base, stride and id) and
// the shaped block-form kernels (transfer.ShapedCopy). The host side (kernels.go) cuts a chunk's runs into pieces of at
// most a few KiB; one warp copies one piece at a time (grid-stride over the
// piece table, one wave of resident blocks), so one launch serves a whole
// chunk whatever its shape. Pieces must not overlap each other's
// destinations or sources (the pipeline's plans never do).
//
// A piece is transfer.Run's layout: count copies of len bytes, copy k
// between region + region_off + k*region_stride and addr + k*addr_stride.
// The table is read either from device memory (staged) or straight from
// pinned host memory (zero-copy): the kernel only sees a pointer.
#include <stdint.h>

// Tuning knobs (nvcc -D...), defaults as committed: the fewest resident
// blocks of 256 threads per multiprocessor the register budget must allow,
// the vector path's accesses in flight per lane, and whether runs of four
// small pieces are copied with their loads batched. The defaults were the
// fastest of seven variants on the H200 (docs/BENCHMARKS.md): capping
// registers harder spills, and spilling costs more than the lost
// occupancy.
#ifndef BOUNCE_MIN_BLOCKS
#define BOUNCE_MIN_BLOCKS 2
#endif
#ifndef BOUNCE_UNROLL
#define BOUNCE_UNROLL 8
#endif
#ifndef BOUNCE_SMALL4
#define BOUNCE_SMALL4 1
#endif
// The wide kernels (bounce_gather_wide, bounce_scatter_wide: tables whose
// pieces average 1 KiB or more, picked by the host) read each piece
// straight from the table, without the shuffles and the batched small
// path, so they need fewer registers and more warps fit: their own
// fewest resident blocks per multiprocessor, whether a warp copies two
// pieces at a time with all their loads in flight before the stores
// (8 KiB in flight per warp at 4 KiB pieces), and whether payload
// accesses are streaming (evict-first) hints.
// The defaults are the best of five builds on the H200
// (docs/bench/device/gpu/kernel-variants-3.txt): capped at 64 or 80
// registers the wide kernels spill (the inlined general path) and lose up
// to half the rate; at 128 registers they do not.
#ifndef BOUNCE_WIDE_MIN_BLOCKS
#define BOUNCE_WIDE_MIN_BLOCKS 2
#endif
#ifndef BOUNCE_WIDE_PAIR
#define BOUNCE_WIDE_PAIR 1
#endif
#ifndef BOUNCE_WIDE_STREAM
#define BOUNCE_WIDE_STREAM 0
#endif
// BOUNCE_WIDE_PREFETCH: a warp loads its next piece's table entry before
// copying the current one, so the table read does not wait behind the
// payload (one dependent round trip per piece instead of two).
#ifndef BOUNCE_WIDE_PREFETCH
#define BOUNCE_WIDE_PREFETCH 0
#endif

struct Piece {
    uint64_t region_off;
    uint64_t addr;
    uint64_t len;
    uint64_t count;
    uint64_t region_stride;
    uint64_t addr_stride;
};

// copy_vec copies n bytes with T-sized accesses: a byte head up to dst's
// T alignment, the aligned middle eight accesses per lane at a time (a
// 4 KiB block in one round of loads for uint4), a byte tail. Requires
// (dst ^ src) % sizeof(T) == 0.
template <typename T>
__device__ __forceinline__ void copy_vec(uint8_t* dst, const uint8_t* src, uint64_t n, unsigned lane) {
    const uint64_t A = sizeof(T);
    uint64_t head = (A - ((uintptr_t)dst & (A - 1))) & (A - 1);
    if (head > n) head = n;
    if (lane < head) dst[lane] = src[lane];
    dst += head;
    src += head;
    n -= head;
    const uint64_t nv = n / A;
    T* d = reinterpret_cast<T*>(dst);
    const T* s = reinterpret_cast<const T*>(src);
    uint64_t i = lane;
#if BOUNCE_UNROLL >= 8
    for (; i + 224 < nv; i += 256) {
        T v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = s[i + 32 * u];
#pragma unroll
        for (int u = 0; u < 8; ++u) d[i + 32 * u] = v[u];
    }
#endif
    for (; i + 96 < nv; i += 128) {
        T a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];
        d[i] = a;
        d[i + 32] = b;
        d[i + 64] = c;
        d[i + 96] = e;
    }
    for (; i < nv; i += 32) d[i] = s[i];
    const uint64_t done = nv * A;
    if (lane < n - done) dst[done + lane] = src[done + lane];
}

__device__ __forceinline__ void copy_bytes(uint8_t* dst, const uint8_t* src, uint64_t n, unsigned lane) {
    const uintptr_t x = (uintptr_t)dst ^ (uintptr_t)src;
    if ((x & 15) == 0) {
        copy_vec<uint4>(dst, src, n, lane);
    } else if ((x & 7) == 0) {
        copy_vec<uint2>(dst, src, n, lane);
    } else if ((x & 3) == 0) {
        copy_vec<uint32_t>(dst, src, n, lane);
    } else {
        uint64_t i = lane;
        for (; i + 96 < n; i += 128) {
            uint8_t a = src[i], b = src[i + 32], c = src[i + 64], e = src[i + 96];
            dst[i] = a;
            dst[i + 32] = b;
            dst[i + 64] = c;
            dst[i + 96] = e;
        }
        for (; i < n; i += 32) dst[i] = src[i];
    }
}

__device__ __forceinline__ Piece shfl_piece(const Piece& p, unsigned j) {
    const unsigned full = 0xffffffffu;
    Piece q;
    q.region_off = __shfl_sync(full, (unsigned long long)p.region_off, j);
    q.addr = __shfl_sync(full, (unsigned long long)p.addr, j);
    q.len = __shfl_sync(full, (unsigned long long)p.len, j);
    q.count = __shfl_sync(full, (unsigned long long)p.count, j);
    q.region_stride = __shfl_sync(full, (unsigned long long)p.region_stride, j);
    q.addr_stride = __shfl_sync(full, (unsigned long long)p.addr_stride, j);
    return q;
}

// small reports whether piece q is one copy of at most 512 bytes, 16-byte
// aligned on both sides: one uint4 per lane at most.
__device__ __forceinline__ bool small(const uint8_t* region, const Piece& q) {
    return q.count == 1 && q.len <= 512 && ((q.len | (uintptr_t)(region + q.region_off) | q.addr) & 15) == 0;
}

template <bool GATHER>
__device__ __forceinline__ void copy_piece(uint8_t* region, const Piece& p, unsigned lane) {
    for (uint64_t k = 0; k < p.count; ++k) {
        uint8_t* r = region + p.region_off + k * p.region_stride;
        uint8_t* a = reinterpret_cast<uint8_t*>(p.addr + k * p.addr_stride);
        if (GATHER) {
            copy_bytes(r, a, p.len, lane);
        } else {
            copy_bytes(a, r, p.len, lane);
        }
    }
}

// run_pieces: warp w copies pieces w, w+W, w+2W, ... (W warps in the grid).
// Each lane loads one of the warp's next 32 pieces, so the table is read
// 32 pieces per round trip, then the warp takes them one by one, broadcast
// by shuffles. Runs of four small aligned pieces are copied with all four
// loads in flight before the stores.
template <bool GATHER>
__device__ __forceinline__ void run_pieces(uint8_t* region, const Piece* __restrict__ pieces, uint64_t n) {
    const unsigned lane = threadIdx.x & 31;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    for (uint64_t base = warp; base < n; base += 32 * warps) {
        const uint64_t mine = base + lane * warps;
        Piece p = {0, 0, 0, 0, 0, 0};
        if (mine < n) p = pieces[mine];
        const uint64_t left = (n - base + warps - 1) / warps;
        const unsigned cnt = left < 32 ? (unsigned)left : 32u;
        unsigned j = 0;
        while (j < cnt) {
            if (BOUNCE_SMALL4 && j + 4 <= cnt) {
                Piece q[4];
                bool all = true;
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    q[u] = shfl_piece(p, j + u);
                    all = all && small(region, q[u]);
                }
                if (all) {
                    uint4 v[4];
                    const uint64_t off = (uint64_t)lane * 16;
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        if (off < q[u].len) {
                            const uint8_t* s = GATHER ? reinterpret_cast<const uint8_t*>(q[u].addr) : region + q[u].region_off;
                            v[u] = *reinterpret_cast<const uint4*>(s + off);
                        }
                    }
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        if (off < q[u].len) {
                            uint8_t* d = GATHER ? region + q[u].region_off : reinterpret_cast<uint8_t*>(q[u].addr);
                            *reinterpret_cast<uint4*>(d + off) = v[u];
                        }
                    }
                    j += 4;
                    continue;
                }
                copy_piece<GATHER>(region, q[0], lane);
                ++j;
                continue;
            }
            copy_piece<GATHER>(region, shfl_piece(p, j), lane);
            ++j;
        }
    }
}

// bounce_gather copies every piece's addresses into the region.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_MIN_BLOCKS) bounce_gather(uint8_t* region, const Piece* pieces, uint64_t n) {
    run_pieces<true>(region, pieces, n);
}

// bounce_scatter copies the region out to every piece's addresses.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_MIN_BLOCKS) bounce_scatter(uint8_t* region, const Piece* pieces, uint64_t n) {
    run_pieces<false>(region, pieces, n);
}

// Wide kernels. One warp per piece, grid-stride; every lane reads the same
// piece (one broadcast load). A piece that is one 16-byte-aligned copy of
// at most 4 KiB is moved with at most eight uint4 per lane in one round of
// loads; with BOUNCE_WIDE_PAIR two such pieces (i and i + warps) go
// together, sixteen loads in flight before the stores.

__device__ __forceinline__ bool simple16(const uint8_t* region, const Piece& q) {
    return q.count == 1 && q.len <= 4096 && ((q.len | (uintptr_t)(region + q.region_off) | q.addr) & 15) == 0;
}

__device__ __forceinline__ uint4 load16(const uint4* p) {
#if BOUNCE_WIDE_STREAM
    return __ldcs(p);
#else
    return *p;
#endif
}

__device__ __forceinline__ void store16(uint4* p, uint4 v) {
#if BOUNCE_WIDE_STREAM
    __stcs(p, v);
#else
    *p = v;
#endif
}

// load8 loads a piece of n uint4 (n <= 256) into v, eight per lane at
// most; store8 stores them.
__device__ __forceinline__ void load8(uint4 (&v)[8], const uint4* s, unsigned n, unsigned lane) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const unsigned k = lane + 32u * u;
        if (k < n) v[u] = load16(s + k);
    }
}

__device__ __forceinline__ void store8(uint4* d, const uint4 (&v)[8], unsigned n, unsigned lane) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const unsigned k = lane + 32u * u;
        if (k < n) store16(d + k, v[u]);
    }
}

template <bool GATHER>
__device__ __forceinline__ void ends(uint8_t* region, const Piece& q, const uint4*& s, uint4*& d) {
    uint8_t* r = region + q.region_off;
    uint8_t* a = reinterpret_cast<uint8_t*>(q.addr);
    s = reinterpret_cast<const uint4*>(GATHER ? a : r);
    d = reinterpret_cast<uint4*>(GATHER ? r : a);
}

template <bool GATHER>
__device__ __forceinline__ void run_wide(uint8_t* region, const Piece* __restrict__ pieces, uint64_t n) {
    const unsigned lane = threadIdx.x & 31;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
#if BOUNCE_WIDE_PAIR
    for (uint64_t i = warp; i < n; i += 2 * warps) {
        const Piece a = pieces[i];
        const bool two = i + warps < n;
        Piece b = {0, 0, 0, 0, 0, 0};
        if (two) b = pieces[i + warps];
        if (two && simple16(region, a) && simple16(region, b)) {
            const uint4 *sa, *sb;
            uint4 *da, *db;
            ends<GATHER>(region, a, sa, da);
            ends<GATHER>(region, b, sb, db);
            const unsigned na = (unsigned)(a.len >> 4), nb = (unsigned)(b.len >> 4);
            uint4 va[8], vb[8];
            load8(va, sa, na, lane);
            load8(vb, sb, nb, lane);
            store8(da, va, na, lane);
            store8(db, vb, nb, lane);
            continue;
        }
        copy_piece<GATHER>(region, a, lane);
        if (two) copy_piece<GATHER>(region, b, lane);
    }
#else
#if BOUNCE_WIDE_PREFETCH
    Piece next = {0, 0, 0, 0, 0, 0};
    if (warp < n) next = pieces[warp];
#endif
    for (uint64_t i = warp; i < n; i += warps) {
#if BOUNCE_WIDE_PREFETCH
        const Piece a = next;
        if (i + warps < n) next = pieces[i + warps];
#else
        const Piece a = pieces[i];
#endif
        if (simple16(region, a)) {
            const uint4* sa;
            uint4* da;
            ends<GATHER>(region, a, sa, da);
            const unsigned na = (unsigned)(a.len >> 4);
            uint4 va[8];
            load8(va, sa, na, lane);
            store8(da, va, na, lane);
            continue;
        }
        copy_piece<GATHER>(region, a, lane);
    }
#endif
}

// bounce_gather_wide is bounce_gather for tables of large pieces.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_WIDE_MIN_BLOCKS) bounce_gather_wide(uint8_t* region, const Piece* pieces, uint64_t n) {
    run_wide<true>(region, pieces, n);
}

// bounce_scatter_wide is bounce_scatter for tables of large pieces.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_WIDE_MIN_BLOCKS) bounce_scatter_wide(uint8_t* region, const Piece* pieces, uint64_t n) {
    run_wide<false>(region, pieces, n);
}

// ---------------------------------------------------------------------------
// Block form (transfer.BlockCopy). No piece table: piece k of a chunk is
// block ids[w(k)] of region r(k), at bases[r(k)] + id*stride, and lies at
// region + k*len on the region side (pieces packed back to back). The
// host passes the window of ids the chunk touches (w(k) = k mod nids, the
// window starting at the chunk's first id, off0 = first mod nids) and the
// bases of the pool regions the chunk touches (r(k) = (off0 + k) / nids).
//
// Completion: when done is not null the last block to finish (counted in
// *counter, device memory, left at 0 again) stores seq to *done, pinned
// host memory the host polls, after a system fence, so a host that sees
// seq sees every byte the kernel wrote.

// BOUNCE_BLK_MIN_BLOCKS, BOUNCE_VEC_MIN_BLOCKS: the fewest resident blocks
// of 256 threads per multiprocessor the general and the vector block
// kernels' register budgets must allow. Four (64 registers) spills and
// loses up to 40% of the rate on the H200 (docs/bench/device/issue24).
#ifndef BOUNCE_BLK_MIN_BLOCKS
#define BOUNCE_BLK_MIN_BLOCKS 2
#endif
#ifndef BOUNCE_VEC_MIN_BLOCKS
#define BOUNCE_VEC_MIN_BLOCKS 2
#endif

struct BlockJob {
    uint8_t* region;
    const uint64_t* bases;
    const uint32_t* ids;
    uint64_t nids;
    uint64_t off0;
    uint64_t count;
    uint64_t len;
    uint64_t stride;
    // addr returns the pool address of piece k (block_addr).
    __device__ __forceinline__ uint8_t* addr(uint64_t k) const;
};

// block_addr returns the pool address of piece k.
__device__ __forceinline__ uint8_t* block_addr(const BlockJob& j, uint64_t k) {
    const uint64_t q = j.off0 + k;
    uint64_t r;
    if ((q >> 32) == 0 && (j.nids >> 32) == 0) {
        r = (uint32_t)q / (uint32_t)j.nids;
    } else {
        r = q / j.nids;
    }
    const uint64_t x = q - r * j.nids;                         // index in the whole id table
    const uint64_t w = x >= j.off0 ? x - j.off0 : x + j.nids - j.off0; // index in the window
    return reinterpret_cast<uint8_t*>(j.bases[r] + (uint64_t)j.ids[w] * j.stride);
}

__device__ __forceinline__ uint8_t* BlockJob::addr(uint64_t k) const { return block_addr(*this, k); }

// finish signals completion (see above). Every thread fences its own
// writes system-wide before the block counts itself done.
__device__ __forceinline__ void finish(uint32_t* done, uint32_t* counter, uint32_t seq) {
    if (done == nullptr) return;
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned nb = gridDim.x * gridDim.y * gridDim.z;
        if (atomicAdd(counter, 1u) == nb - 1) {
            *counter = 0;
            __threadfence_system();
            *reinterpret_cast<volatile uint32_t*>(done) = seq;
        }
    }
}

// General block kernel: any length and alignment. Work item i is 4 KiB
// (or less, the last) of piece i / subs; one warp per item, grid-stride.
template <bool GATHER>
__device__ __forceinline__ void run_blocks(const BlockJob& j) {
    const unsigned lane = threadIdx.x & 31;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    const uint64_t subs = (j.len + 4095) >> 12;
    const uint64_t items = j.count * subs;
    for (uint64_t i = warp; i < items; i += warps) {
        const uint64_t k = subs == 1 ? i : i / subs;
        const uint64_t s = (i - k * subs) << 12;
        const uint64_t n = min((uint64_t)4096, j.len - s);
        uint8_t* p = block_addr(j, k) + s;
        uint8_t* r = j.region + k * j.len + s;
        const uint8_t* src = GATHER ? p : r;
        uint8_t* dst = GATHER ? r : p;
        if ((((uintptr_t)src | (uintptr_t)dst | n) & 15) == 0) {
            uint4 v[8];
            load8(v, reinterpret_cast<const uint4*>(src), (unsigned)(n >> 4), lane);
            store8(reinterpret_cast<uint4*>(dst), v, (unsigned)(n >> 4), lane);
        } else {
            copy_bytes(dst, src, n, lane);
        }
    }
}

// Vector block kernel: every piece 16-byte aligned on both sides and len
// a power of two from 128 to 4096 or a multiple of 4096 (the host checks).
// Warp t copies slab t: region bytes [4096t, 4096t + 4096), eight uint4
// per lane, all loads in flight before the stores. A slab holds 4096/len
// whole pieces (lane p < 4096/len computes piece p's address, shared by
// shuffles) or 4 KiB of one piece. Addresses are computed at each access,
// not held.
template <bool GATHER, typename J>
__device__ __forceinline__ void slab_copy(const J& j, uint64_t t, unsigned sh, unsigned lane, uint64_t total) {
    uint4* reg = reinterpret_cast<uint4*>(j.region + (t << 12));
    uint4 v[8];
    if (sh >= 12) {
        // len is a multiple of 4096: the slab is whole and in one piece.
        const uint64_t spp = j.len >> 12;
        const uint64_t k = spp == 1 ? t : t / spp;
        uint4* p = reinterpret_cast<uint4*>(j.addr(k) + ((t - k * spp) << 12));
        const uint4* src = GATHER ? p : reg;
        uint4* dst = GATHER ? reg : p;
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = src[lane + 32u * u];
#pragma unroll
        for (int u = 0; u < 8; ++u) dst[lane + 32u * u] = v[u];
        return;
    }
    const uint64_t left = total - (t << 12);
    const unsigned nv = left >= 4096 ? 256u : (unsigned)(left >> 4);
    const unsigned per = 4096u >> sh; // pieces in a slab, at most 32
    const uint64_t k0 = t * per;
    uint64_t mine = 0;
    if (lane < per && k0 + lane < j.count) mine = (uint64_t)j.addr(k0 + lane);
    const unsigned q = sh - 4; // log2 of the uint4 in a piece
    const unsigned mask = (1u << q) - 1;
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const unsigned e = lane + 32u * u;
        uint4* p = reinterpret_cast<uint4*>(__shfl_sync(0xffffffffu, (unsigned long long)mine, e >> q)) + (e & mask);
        if (e < nv) v[u] = GATHER ? *p : reg[e];
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        const unsigned e = lane + 32u * u;
        uint4* p = reinterpret_cast<uint4*>(__shfl_sync(0xffffffffu, (unsigned long long)mine, e >> q)) + (e & mask);
        if (e < nv) {
            if (GATHER) {
                reg[e] = v[u];
            } else {
                *p = v[u];
            }
        }
    }
}

template <bool GATHER, typename J>
__device__ __forceinline__ void run_blocks_vec(const J& j, unsigned sh) {
    const unsigned lane = threadIdx.x & 31;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    const uint64_t total = j.count * j.len;
    const uint64_t slabs = (total + 4095) >> 12;
    for (uint64_t t = warp; t < slabs; t += warps) slab_copy<GATHER, J>(j, t, sh, lane, total);
}

#define BLOCK_PARAMS uint8_t *region, const uint64_t *bases, const uint32_t *ids, uint64_t nids, uint64_t off0, uint64_t count, uint64_t len, uint64_t stride, uint32_t *done, uint32_t *counter, uint32_t seq, uint32_t sh
#define BLOCK_JOB BlockJob j = {region, bases, ids, nids, off0, count, len, stride}

// bounce_gather_blocks copies pieces [first, first+count) of a block table
// into the region (any length, any alignment). sh is unused.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_BLK_MIN_BLOCKS) bounce_gather_blocks(BLOCK_PARAMS) {
    BLOCK_JOB;
    run_blocks<true>(j);
    finish(done, counter, seq);
}

// bounce_scatter_blocks copies the region out to the pieces.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_BLK_MIN_BLOCKS) bounce_scatter_blocks(BLOCK_PARAMS) {
    BLOCK_JOB;
    run_blocks<false>(j);
    finish(done, counter, seq);
}

// bounce_gather_blocks_vec is bounce_gather_blocks for aligned pieces of
// len = 1 << sh (7 <= sh <= 12) or a multiple of 4096 (sh = 12 then).
extern "C" __global__ void __launch_bounds__(256, BOUNCE_VEC_MIN_BLOCKS) bounce_gather_blocks_vec(BLOCK_PARAMS) {
    BLOCK_JOB;
    run_blocks_vec<true, BlockJob>(j, sh);
    finish(done, counter, seq);
}

// bounce_scatter_blocks_vec is bounce_scatter_blocks for aligned pieces.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_VEC_MIN_BLOCKS) bounce_scatter_blocks_vec(BLOCK_PARAMS) {
    BLOCK_JOB;
    run_blocks_vec<false, BlockJob>(j, sh);
    finish(done, counter, seq);
}

// ---------------------------------------------------------------------------
// Shaped block form (transfer.ShapedCopy): the ids are taken in groups of
// group consecutive ids and every (region, group) unit moves the same
// segments, packed back to back on the region side. Item k of a chunk is
// segment k mod nsegs of its unit k / nsegs; unit u of the chunk is group
// (off0 + u) mod ngroups of pool region (off0 + u) / ngroups (bases
// indexed from the chunk's first region), its ids at window index
// w * group, w = the group's index from off0, wrapping. The segment table
// (Seg, 16 bytes each) lives in device memory, uploaded once per shape.
// Two paths: the vector and bulk ones for uniform segments (every segment
// len = 1 << sh bytes, 7 <= sh <= 12, or a multiple of 4096, everything
// 16-byte aligned: the block kernels' slab loops, an item standing for a
// piece) and a general one (any lengths and alignment, one warp per item,
// region offset u * ulen + the segment's roff).
struct Seg {
    uint32_t block; // index in the group
    uint32_t off;   // byte offset in that block
    uint32_t len;
    uint32_t roff;  // offset in the unit on the region side
};

struct ShapedJob {
    uint8_t* region;
    const uint64_t* bases;
    const uint32_t* ids;
    const Seg* segs;
    uint64_t ngroups;
    uint64_t off0;
    uint64_t count; // items: units * nsegs
    uint64_t len;   // the vector paths' segment length
    uint64_t stride;
    uint64_t ulen;  // unit length (general path)
    uint32_t group;
    uint32_t nsegs;
    // item returns item k's unit (in the chunk) and segment.
    __device__ __forceinline__ void item(uint64_t k, uint64_t& u, Seg& g) const {
        if ((k >> 32) == 0) {
            u = (uint32_t)k / nsegs;
        } else {
            u = k / nsegs;
        }
        const uint4 v = *reinterpret_cast<const uint4*>(segs + (k - u * nsegs));
        g.block = v.x;
        g.off = v.y;
        g.len = v.z;
        g.roff = v.w;
    }
    // unit_addr returns the pool address of block b of unit u's group.
    __device__ __forceinline__ uint8_t* unit_addr(uint64_t u, uint32_t b) const {
        const uint64_t q = off0 + u;
        uint64_t r;
        if ((q >> 32) == 0 && (ngroups >> 32) == 0) {
            r = (uint32_t)q / (uint32_t)ngroups;
        } else {
            r = q / ngroups;
        }
        const uint64_t x = q - r * ngroups;
        const uint64_t w = x >= off0 ? x - off0 : x + ngroups - off0;
        return reinterpret_cast<uint8_t*>(bases[r] + (uint64_t)ids[w * group + b] * stride);
    }
    // addr returns the pool address of item k.
    __device__ __forceinline__ uint8_t* addr(uint64_t k) const {
        uint64_t u;
        Seg g;
        item(k, u, g);
        return unit_addr(u, g.block) + g.off;
    }
};

// General shaped kernel: one warp per item, grid-stride.
template <bool GATHER>
__device__ __forceinline__ void run_shaped(const ShapedJob& j) {
    const unsigned lane = threadIdx.x & 31;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    for (uint64_t k = warp; k < j.count; k += warps) {
        uint64_t u;
        Seg g;
        j.item(k, u, g);
        uint8_t* p = j.unit_addr(u, g.block) + g.off;
        uint8_t* r = j.region + u * j.ulen + g.roff;
        const uint8_t* src = GATHER ? p : r;
        uint8_t* dst = GATHER ? r : p;
        if (g.len <= 4096 && (((uintptr_t)src | (uintptr_t)dst | g.len) & 15) == 0) {
            uint4 v[8];
            load8(v, reinterpret_cast<const uint4*>(src), g.len >> 4, lane);
            store8(reinterpret_cast<uint4*>(dst), v, g.len >> 4, lane);
        } else {
            copy_bytes(dst, src, g.len, lane);
        }
    }
}

#define SHAPED_PARAMS uint8_t *region, const uint64_t *bases, const uint32_t *ids, const Seg *segs, uint64_t ngroups, uint64_t off0, uint64_t count, uint64_t len, uint64_t stride, uint64_t ulen, uint32_t group, uint32_t nsegs, uint32_t *done, uint32_t *counter, uint32_t seq, uint32_t sh
#define SHAPED_JOB ShapedJob j = {region, bases, ids, segs, ngroups, off0, count, len, stride, ulen, group, nsegs}

// bounce_gather_shaped copies items [0, count) of a shaped chunk into the
// region (any lengths and alignment). sh and len are unused.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_BLK_MIN_BLOCKS) bounce_gather_shaped(SHAPED_PARAMS) {
    SHAPED_JOB;
    run_shaped<true>(j);
    finish(done, counter, seq);
}

// bounce_scatter_shaped copies the region out to a shaped chunk's items.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_BLK_MIN_BLOCKS) bounce_scatter_shaped(SHAPED_PARAMS) {
    SHAPED_JOB;
    run_shaped<false>(j);
    finish(done, counter, seq);
}

// bounce_gather_shaped_vec is bounce_gather_blocks_vec over a shaped
// chunk's uniform items (len = 1 << sh or a multiple of 4096).
extern "C" __global__ void __launch_bounds__(256, BOUNCE_VEC_MIN_BLOCKS) bounce_gather_shaped_vec(SHAPED_PARAMS) {
    SHAPED_JOB;
    run_blocks_vec<true, ShapedJob>(j, sh);
    finish(done, counter, seq);
}

// bounce_scatter_shaped_vec is bounce_gather_shaped_vec's inverse.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_VEC_MIN_BLOCKS) bounce_scatter_shaped_vec(SHAPED_PARAMS) {
    SHAPED_JOB;
    run_blocks_vec<false, ShapedJob>(j, sh);
    finish(done, counter, seq);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Hopper bulk copies (built into the compute_90 module only): each warp
// moves a 4 KiB slab global -> shared -> global with cp.async.bulk, the
// loads completing on a per-warp mbarrier; lanes issue one bulk copy per
// piece on the pool side, lane 0 one for the whole slab on the region
// side. Same conditions as the vector kernels.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

template <bool GATHER, typename J>
__device__ __forceinline__ void run_blocks_bulk(const J& j, unsigned sh) {
    __shared__ alignas(128) uint8_t buf[8][4096];
    __shared__ alignas(8) uint64_t bar[8];
    const unsigned lane = threadIdx.x & 31;
    const unsigned wib = threadIdx.x >> 5;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    const uint64_t total = j.count * j.len;
    const uint64_t slabs = (total + 4095) >> 12;
    const uint32_t b = smem_addr(&bar[wib]);
    const uint32_t sbuf = smem_addr(&buf[wib][0]);
    if (lane == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    uint32_t phase = 0;
    const bool whole = sh >= 12;
    const unsigned per = whole ? 1u : 4096u >> sh;
    for (uint64_t t = warp; t < slabs; t += warps) {
        const uint64_t base = t << 12;
        const uint64_t left = total - base;
        const uint32_t nbytes = left >= 4096 ? 4096u : (uint32_t)left;
        uint8_t* reg = j.region + base;
        // Pool-side piece of this lane (lanes below per): address and size.
        uint8_t* p = nullptr;
        uint32_t plen = 0;
        if (whole) {
            if (lane == 0) {
                const uint64_t spp = j.len >> 12;
                const uint64_t k = spp == 1 ? t : t / spp;
                p = j.addr(k) + ((t - k * spp) << 12);
                plen = nbytes;
            }
        } else if (lane < per && (uint64_t)lane * j.len < nbytes) {
            p = j.addr(t * per + lane);
            plen = (uint32_t)j.len;
        }
        if (lane == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(nbytes) : "memory");
        }
        __syncwarp();
        if (GATHER) {
            if (plen) {
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             ::"r"(sbuf + lane * (whole ? 0u : (uint32_t)j.len)), "l"(p), "r"(plen), "r"(b) : "memory");
            }
        } else if (lane == 0) {
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(sbuf), "l"(reg), "r"(nbytes), "r"(b) : "memory");
        }
        // Wait for the slab to land in shared memory.
        uint32_t ok = 0;
        while (!ok) {
            asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                         : "=r"(ok) : "r"(b), "r"(phase) : "memory");
        }
        phase ^= 1;
        if (GATHER) {
            if (lane == 0) {
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(reg), "r"(sbuf), "r"(nbytes) : "memory");
                asm volatile("cp.async.bulk.commit_group;" ::: "memory");
                asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            }
        } else if (plen) {
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                         ::"l"(p), "r"(sbuf + lane * (whole ? 0u : (uint32_t)j.len)), "r"(plen) : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        }
        __syncwarp();
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Persistent, double-buffered bulk kernels: a grid of one wave, blocks of
// 128 threads (four warps, 8 KiB of shared memory each); a warp takes
// slabs t, t + W, ... and issues slab t + W's loads into its second
// buffer before it waits for slab t's, so two slabs are in flight per
// warp and no block waits for a second wave.
struct SlabIO {
    uint8_t* p;     // this lane's pool-side piece (or 4 KiB of one), when plen > 0
    uint32_t plen;
    uint8_t* reg;   // the slab in the region
    uint32_t nbytes;
};

template <bool GATHER, typename J>
__device__ __forceinline__ SlabIO bulk_load(const J& j, uint64_t t, unsigned sh, unsigned lane, uint64_t total, uint32_t sbuf, uint32_t b) {
    SlabIO io;
    const uint64_t base = t << 12;
    const uint64_t left = total - base;
    io.nbytes = left >= 4096 ? 4096u : (uint32_t)left;
    io.reg = j.region + base;
    io.p = nullptr;
    io.plen = 0;
    const bool whole = sh >= 12;
    if (whole) {
        if (lane == 0) {
            const uint64_t spp = j.len >> 12;
            const uint64_t k = spp == 1 ? t : t / spp;
            io.p = j.addr(k) + ((t - k * spp) << 12);
            io.plen = io.nbytes;
        }
    } else if (lane < (4096u >> sh) && (uint64_t)lane * j.len < io.nbytes) {
        io.p = j.addr(t * (4096u >> sh) + lane);
        io.plen = (uint32_t)j.len;
    }
    if (lane == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(io.nbytes) : "memory");
    }
    __syncwarp();
    const uint32_t mine = sbuf + (whole ? 0u : lane * (uint32_t)j.len);
    if (GATHER) {
        if (io.plen) {
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(mine), "l"(io.p), "r"(io.plen), "r"(b) : "memory");
        }
    } else if (lane == 0) {
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(sbuf), "l"(io.reg), "r"(io.nbytes), "r"(b) : "memory");
    }
    return io;
}

template <bool GATHER>
__device__ __forceinline__ void bulk_store(const SlabIO& io, unsigned sh, unsigned lane, uint32_t len, uint32_t sbuf) {
    if (GATHER) {
        if (lane == 0) {
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(io.reg), "r"(sbuf), "r"(io.nbytes) : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }
    } else if (io.plen) {
        const uint32_t mine = sbuf + (sh >= 12 ? 0u : lane * len);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(io.p), "r"(mine), "r"(io.plen) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
}

__device__ __forceinline__ void bulk_wait(uint32_t b, uint32_t phase) {
    uint32_t ok = 0;
    while (!ok) {
        asm volatile("{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
                     : "=r"(ok) : "r"(b), "r"(phase) : "memory");
    }
}

template <bool GATHER, typename J>
__device__ __forceinline__ void run_blocks_bulk2(const J& j, unsigned sh) {
    __shared__ alignas(128) uint8_t buf[4][2][4096];
    __shared__ alignas(8) uint64_t bar[4][2];
    const unsigned lane = threadIdx.x & 31;
    const unsigned wib = threadIdx.x >> 5;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    const uint64_t total = j.count * j.len;
    const uint64_t slabs = (total + 4095) >> 12;
    uint32_t bs[2], sb[2];
    for (int i = 0; i < 2; ++i) {
        bs[i] = smem_addr(&bar[wib][i]);
        sb[i] = smem_addr(&buf[wib][i][0]);
    }
    if (lane == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bs[0]));
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bs[1]));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    uint32_t phase[2] = {0, 0};
    SlabIO io[2];
    unsigned cur = 0;
    uint64_t t = warp;
    if (t < slabs) io[0] = bulk_load<GATHER, J>(j, t, sh, lane, total, sb[0], bs[0]);
    for (; t < slabs; t += warps) {
        const unsigned nx = cur ^ 1;
        if (t + warps < slabs) {
            // Buffer nx's last store (the previous slab) must have read it.
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            __syncwarp();
            if (nx) {
                io[1] = bulk_load<GATHER, J>(j, t + warps, sh, lane, total, sb[1], bs[1]);
            } else {
                io[0] = bulk_load<GATHER, J>(j, t + warps, sh, lane, total, sb[0], bs[0]);
            }
        }
        if (cur) {
            bulk_wait(bs[1], phase[1]);
            phase[1] ^= 1;
            bulk_store<GATHER>(io[1], sh, lane, (uint32_t)j.len, sb[1]);
        } else {
            bulk_wait(bs[0], phase[0]);
            phase[0] ^= 1;
            bulk_store<GATHER>(io[0], sh, lane, (uint32_t)j.len, sb[0]);
        }
        cur = nx;
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// bounce_gather_blocks_bulk2 is bounce_gather_blocks_bulk, persistent and
// double-buffered (blocks of 128 threads, one wave).
extern "C" __global__ void __launch_bounds__(128, 1) bounce_gather_blocks_bulk2(BLOCK_PARAMS) {
    BLOCK_JOB;
    run_blocks_bulk2<true, BlockJob>(j, sh);
    finish(done, counter, seq);
}

// bounce_scatter_blocks_bulk2 is bounce_scatter_blocks_bulk, persistent
// and double-buffered.
extern "C" __global__ void __launch_bounds__(128, 1) bounce_scatter_blocks_bulk2(BLOCK_PARAMS) {
    BLOCK_JOB;
    run_blocks_bulk2<false, BlockJob>(j, sh);
    finish(done, counter, seq);
}

// bounce_gather_blocks_bulk is bounce_gather_blocks_vec by bulk copies.
extern "C" __global__ void __launch_bounds__(256, 1) bounce_gather_blocks_bulk(BLOCK_PARAMS) {
    BLOCK_JOB;
    run_blocks_bulk<true, BlockJob>(j, sh);
    finish(done, counter, seq);
}

// bounce_scatter_blocks_bulk is bounce_scatter_blocks_vec by bulk copies.
extern "C" __global__ void __launch_bounds__(256, 1) bounce_scatter_blocks_bulk(BLOCK_PARAMS) {
    BLOCK_JOB;
    run_blocks_bulk<false, BlockJob>(j, sh);
    finish(done, counter, seq);
}
// bounce_gather_shaped_bulk, bounce_scatter_shaped_bulk(2): the bulk
// block kernels over a shaped chunk's uniform items.
extern "C" __global__ void __launch_bounds__(256, 1) bounce_gather_shaped_bulk(SHAPED_PARAMS) {
    SHAPED_JOB;
    run_blocks_bulk<true, ShapedJob>(j, sh);
    finish(done, counter, seq);
}

extern "C" __global__ void __launch_bounds__(256, 1) bounce_scatter_shaped_bulk(SHAPED_PARAMS) {
    SHAPED_JOB;
    run_blocks_bulk<false, ShapedJob>(j, sh);
    finish(done, counter, seq);
}

extern "C" __global__ void __launch_bounds__(128, 1) bounce_gather_shaped_bulk2(SHAPED_PARAMS) {
    SHAPED_JOB;
    run_blocks_bulk2<true, ShapedJob>(j, sh);
    finish(done, counter, seq);
}

extern "C" __global__ void __launch_bounds__(128, 1) bounce_scatter_shaped_bulk2(SHAPED_PARAMS) {
    SHAPED_JOB;
    run_blocks_bulk2<false, ShapedJob>(j, sh);
    finish(done, counter, seq);
}
#endif

// ---------------------------------------------------------------------------
// Compact descriptor tables: 16 bytes a piece (address; region offset << 16
// | length), for pieces that are one copy of at most 65535 bytes in a
// region below 2^48 bytes: the common table of KV descriptors, a third of
// the bytes the host writes for a Piece. One warp per piece, one
// broadcast load of its entry; an aligned piece of at most 4 KiB moves in
// one round of eight uint4 per lane.
struct Compact {
    uint64_t addr;
    uint64_t off_len;
};

template <bool GATHER>
__device__ __forceinline__ void run_compact(uint8_t* region, const Compact* __restrict__ t, uint64_t n) {
    const unsigned lane = threadIdx.x & 31;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    for (uint64_t i = warp; i < n; i += warps) {
        const Compact c = t[i];
        uint8_t* a = reinterpret_cast<uint8_t*>(c.addr);
        uint8_t* r = region + (c.off_len >> 16);
        const unsigned len = (unsigned)(c.off_len & 0xffff);
        const uint8_t* src = GATHER ? a : r;
        uint8_t* dst = GATHER ? r : a;
        if (len <= 4096 && (((uintptr_t)src | (uintptr_t)dst | len) & 15) == 0) {
            uint4 v[8];
            load8(v, reinterpret_cast<const uint4*>(src), len >> 4, lane);
            store8(reinterpret_cast<uint4*>(dst), v, len >> 4, lane);
        } else {
            copy_bytes(dst, src, len, lane);
        }
    }
}

// bounce_gather_compact copies every compact piece into the region.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_WIDE_MIN_BLOCKS) bounce_gather_compact(uint8_t* region, const Compact* table, uint64_t n) {
    run_compact<true>(region, table, n);
}

// bounce_scatter_compact copies the region out to every compact piece.
extern "C" __global__ void __launch_bounds__(256, BOUNCE_WIDE_MIN_BLOCKS) bounce_scatter_compact(uint8_t* region, const Compact* table, uint64_t n) {
    run_compact<false>(region, table, n);
}
