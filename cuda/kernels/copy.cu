// Gather and scatter kernels of the bounce CUDA stages. `make ptx` compiles
// this file to copy.ptx (committed; builds embed it, no CUDA toolkit
// needed). The host side (kernels.go) cuts a chunk's runs into pieces of at
// most a few KiB; one warp copies one piece at a time (grid-stride over the
// piece table), so one launch serves a whole chunk whatever its shape.
//
// A piece is transfer.Run's layout: count copies of len bytes, copy k
// between region + region_off + k*region_stride and addr + k*addr_stride.
// The table is read either from device memory (staged) or straight from
// pinned host memory (zero-copy): the kernel only sees a pointer.
#include <stdint.h>

struct Piece {
    uint64_t region_off;
    uint64_t addr;
    uint64_t len;
    uint64_t count;
    uint64_t region_stride;
    uint64_t addr_stride;
};

// copy_vec copies n bytes with T-sized accesses: a byte head up to dst's
// T alignment, the aligned middle four accesses per lane at a time, a
// byte tail. Requires (dst ^ src) % sizeof(T) == 0.
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

template <bool GATHER>
__device__ __forceinline__ void run_pieces(uint8_t* region, const Piece* pieces, uint64_t n) {
    const unsigned lane = threadIdx.x & 31;
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const uint64_t warps = ((uint64_t)gridDim.x * blockDim.x) >> 5;
    for (uint64_t w = warp; w < n; w += warps) {
        const Piece p = pieces[w];
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
}

// bounce_gather copies every piece's addresses into the region.
extern "C" __global__ void __launch_bounds__(256) bounce_gather(uint8_t* region, const Piece* pieces, uint64_t n) {
    run_pieces<true>(region, pieces, n);
}

// bounce_scatter copies the region out to every piece's addresses.
extern "C" __global__ void __launch_bounds__(256) bounce_scatter(uint8_t* region, const Piece* pieces, uint64_t n) {
    run_pieces<false>(region, pieces, n);
}
