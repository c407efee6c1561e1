// Routed experts (language.md §3): moe_experts as route -> grouped GEMMs over all experts -> combine.
// x [n, d], ids i32 [n, k], weights [n, k]; per expert e: the gate w1[e] [h, d], the up w3[e]
// [h, d] and the down w2[e] [d, h], each a separate allocation, all experts of a call in one
// storage format per projection, the three projections each in its own (GGUF mixes store gate
// and up in different block formats; decoded in the kernels, load_w in common.cuh).
// A slot is one (token, k-index) pair, numbered s = token*k + k-index.
//
// 1. moe_route: groups the slots by expert on the device (stable: slot order within an expert) and
//    cuts each expert's range into row tiles of tile_rows (the tile list below): GEMV_ROWS when no
//    expert can see more rows than the small-row path takes (at most GEMV_ROWS tokens, each
//    routed to an expert once; a repeated id only adds tiles), so the expert GEMMs stream their
//    weights once for a batched decode step; else GEMM_BM.
// 2. one launch each, every block one (column tile, row tile), its expert's weight taken from a
//    device-side table of expert weight addresses (src/backend/cuda/moe.rs builds it):
//    moe_gate_*: hid[p] = w1[e] . x[token of order[p]] for p in the tile's rows
//    moe_up_*:   hid[p] = swiglu_clamp(hid[p], w3[e] . x[token of order[p]])
//    moe_down_*: ys[order[p]] = w2[e] . hid[p]
//    Gate and up are two launches, each built for its own weight's format, so that w1 and w3
//    may differ in format; the gate's values wait in hid, which the up's epilogue overwrites.
//    The host never reads the routing back: the grid is sized for the most tiles any routing can
//    give, and blocks past the device-side tile count exit at once.
// 3. moe_combine: out[token] = sum over its k slots, in slot order, of weights[s] * ys[s]
//    (no float atomics: the result is reproducible run to run).
//
// Tile list, i32 [1 + 3 * max_tiles]: word 0 the number of tiles T, then tile t at 1 + 3t as
// (expert e, first row p of the tile in order[], end of e's range in order[]); the tile's rows
// are p .. min(p + tile_rows, end). Tiles come in expert order, each expert's in row order. An
// expert with c slots has ceil(c / tile_rows) tiles, so T <= min(slots, ceil(slots / tile_rows) +
// experts) = max_tiles (the host's bound).

// ---- moe_route -----------------------------------------------------------------------------
// ids i32 [slots] -> order i32 [slots] (slot numbers grouped by expert, ascending within an
// expert), tiles (the tile list above), cursor i32 [experts] (scratch). A slot whose id is outside
// 0..experts is left out (moe_combine turns its token's row into NaN).
// ONE block of MR_THREADS threads (sizes here are small: n*k slots, a few hundred experts). The
// slots are visited in chunks of MR_THREADS; in a chunk each thread ranks its slot among the
// earlier slots of the chunk with the same expert (mr_rank), and the last slot of each expert in
// the chunk bumps that expert's counter by its rank + 1: no atomics, and the order and the tile
// list are deterministic. Dynamic shared memory: MR_WARPS rows of `experts` counts (the host
// mirrors the size). (Ranking by a scan over the chunk, each thread reading the slots before and
// after its own, took 0.86 ms a 2 048-token prefill chunk on an H100: 6.9 ms of a 4-layer q2
// prefill's 132.6 ms of device time, thirty-ninth sitting.)

#define MR_THREADS 256
#define MR_WARPS (MR_THREADS / 32)

// Rank of this thread's expert e (-1: no slot, never counted) among the chunk's threads before it,
// and whether it is the chunk's last thread with e. A warp's lanes with the same e find each other
// with __match_any_sync; each group's lowest lane writes the group's size to counts[warp][e]
// (zero outside the chunk's groups), so a thread adds the sizes of e's groups in the warps before
// its own, and is the last when it is its group's highest lane and no later warp has e. A barrier
// of the block; mr_clear undoes the writes once every thread has read them.
__device__ __forceinline__ unsigned int mr_rank(int* counts, unsigned int experts, int e, unsigned int* peers,
                                                bool* last) {
    const unsigned int lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
    *peers = __match_any_sync(0xffffffffu, (unsigned int)e);
    const unsigned int below = *peers & ((1u << lane) - 1u);
    if (e >= 0 && below == 0u) counts[warp * experts + (unsigned int)e] = __popc(*peers);
    __syncthreads();
    unsigned int rank = (unsigned int)__popc(below);
    bool l = (*peers >> lane) == 1u; // no higher lane in the group
    if (e >= 0)
        for (unsigned int w = 0; w < MR_WARPS; ++w) {
            const int n = counts[w * experts + (unsigned int)e];
            if (w < warp) rank += (unsigned int)n;
            if (w > warp) l = l && n == 0;
        }
    *last = l;
    return rank;
}
// After a barrier past every mr_rank read of the chunk: the group's lowest lane zeroes its count
// again, and the warp syncs (the next chunk's writes of another lane come after the zero).
__device__ __forceinline__ void mr_clear(int* counts, unsigned int experts, int e, unsigned int peers) {
    const unsigned int lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
    if (e >= 0 && (peers & ((1u << lane) - 1u)) == 0u) counts[warp * experts + (unsigned int)e] = 0;
    __syncwarp();
}

BASE_KERNEL void moe_route(const int* ids, int* order, int* tiles, int* cursor, unsigned int slots,
                           unsigned int experts, unsigned int tile_rows) {
    grid_wait();
    extern __shared__ float smem[];
    int* counts = reinterpret_cast<int*>(smem); // [MR_WARPS][experts]
    const unsigned int tid = threadIdx.x;
    for (unsigned int e = tid; e < experts; e += MR_THREADS) cursor[e] = 0;
    for (unsigned int e = tid; e < MR_WARPS * experts; e += MR_THREADS) counts[e] = 0;
    __syncthreads();
    // pass 1: counts into cursor[]
    for (unsigned int s0 = 0; s0 < slots; s0 += MR_THREADS) {
        const unsigned int s = s0 + tid;
        int e = s < slots ? ids[s] : -1;
        if (e < 0 || (unsigned int)e >= experts) e = -1;
        unsigned int peers;
        bool last;
        const unsigned int rank = mr_rank(counts, experts, e, &peers, &last);
        if (e >= 0 && last) cursor[e] += (int)rank + 1;
        __syncthreads(); // counts[] read and cursor[] settled before the next chunk
        mr_clear(counts, experts, e, peers);
    }
    // exclusive prefix of the counts and of the tile counts over the experts, MR_THREADS experts
    // at a time (a scan in shared memory; integers, so exact in any order); cursor[] becomes each
    // expert's start and each expert writes its own tiles. (One thread walking all experts through
    // global memory took 35 us of a decode step on an H200.)
    __shared__ int scan_rows[MR_THREADS], scan_tiles[MR_THREADS];
    int rows_before = 0, tiles_before = 0; // over the experts of earlier rounds (the same in every thread)
    for (unsigned int e0 = 0; e0 < experts; e0 += MR_THREADS) {
        const unsigned int e = e0 + tid;
        const int c = e < experts ? cursor[e] : 0, nt = (c + (int)tile_rows - 1) / (int)tile_rows;
        scan_rows[tid] = c;
        scan_tiles[tid] = nt;
        __syncthreads();
        for (unsigned int off = 1; off < MR_THREADS; off *= 2) { // inclusive Hillis-Steele scan
            const int r = tid >= off ? scan_rows[tid - off] : 0, t = tid >= off ? scan_tiles[tid - off] : 0;
            __syncthreads();
            scan_rows[tid] += r;
            scan_tiles[tid] += t;
            __syncthreads();
        }
        const int start = rows_before + scan_rows[tid] - c, tile0 = tiles_before + scan_tiles[tid] - nt;
        if (e < experts) {
            cursor[e] = start;
            for (int j = 0; j < nt; ++j) {
                tiles[1 + 3 * (tile0 + j)] = (int)e;
                tiles[2 + 3 * (tile0 + j)] = start + j * (int)tile_rows;
                tiles[3 + 3 * (tile0 + j)] = start + c;
            }
        }
        rows_before += scan_rows[MR_THREADS - 1];
        tiles_before += scan_tiles[MR_THREADS - 1];
        __syncthreads(); // every thread read the scan before the next round writes it
    }
    if (tid == 0) tiles[0] = tiles_before;
    __syncthreads();
    // pass 2: scatter the slot numbers
    for (unsigned int s0 = 0; s0 < slots; s0 += MR_THREADS) {
        const unsigned int s = s0 + tid;
        int e = s < slots ? ids[s] : -1;
        if (e < 0 || (unsigned int)e >= experts) e = -1;
        unsigned int peers;
        bool last;
        const unsigned int rank = mr_rank(counts, experts, e, &peers, &last);
        if (e >= 0) order[cursor[e] + rank] = (int)s;
        __syncthreads(); // every thread read counts[] and cursor[e] before they move
        mr_clear(counts, experts, e, peers);
        if (e >= 0 && last) cursor[e] += (int)rank + 1;
        __syncthreads();
    }
}

// The row tile of this block (blockIdx.y) in the tile list: false past the tile count, where the
// whole block exits (uniformly, before any barrier of gemm_block).
struct MoeTile {
    unsigned int expert, p0, rows;
};

__device__ __forceinline__ bool moe_tile(const int* tiles, unsigned int tile_rows, MoeTile* t) {
    if (blockIdx.y >= (unsigned int)tiles[0]) return false;
    const int* r = tiles + 1 + 3u * blockIdx.y;
    t->expert = (unsigned int)r[0];
    t->p0 = (unsigned int)r[1];
    const unsigned int left = (unsigned int)(r[2] - r[1]);
    t->rows = left < tile_rows ? left : tile_rows;
    return true;
}

// ---- moe_gate_* and moe_up_* {f32,bf16,f16,<block format>} ----------------------------------------
// Gathered GEMMs for the rows p = p0 .. p0 + rows of one tile, over the h columns j of hid
// [slots, h], A rows x[order[p] / k]:
//   moe_gate: hid[p][j] = g = w1[e][j] . x
//   moe_up:   hid[p][j] = silu(min(g, limit)) * clamp(u, +-limit), u = w3[e][j] . x, g = hid[p][j]
// (each element read and written by the one thread that stores it). w1 / w3 is the table of the
// experts' w1 or w3 device addresses (all in the kernel's format).
// Block GEMM_THREADS, grid (column blocks of h, max_tiles); tile_rows bounds every tile's rows, so
// gemm_block takes its small-row path in every block or in none.

// A rows gathered through order[]; W rows plain.
struct MoeRows : ContiguousRows {
    const float* x;
    const int* order; // the tile's slots start at order + p0
    float* hid;
    unsigned int p0, d, h, k;

    __device__ __forceinline__ const float* a_row(unsigned int m) const {
        return x + (u64)order[p0 + m] / k * d;
    }
    __device__ __forceinline__ u64 w_row(unsigned int c) const { return (u64)c * d; }
};

// Plain store of the gate.
struct MoeGateOperands : MoeRows {
    __device__ __forceinline__ void store2(unsigned int m, unsigned int c, float g0, float g1) const {
        float* hr = hid + ((u64)p0 + m) * h;
        hr[c] = g0;
        if (c + 1u < h) hr[c + 1u] = g1;
    }
};

// SwiGLU + clamp of the stored gate with the up.
struct MoeUpOperands : MoeRows {
    float limit;

    __device__ __forceinline__ float swiglu(float g, float u) const {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return g / (1.0f + expf(-g)) * u;
    }
    __device__ __forceinline__ void store2(unsigned int m, unsigned int c, float u0, float u1) const {
        float* hr = hid + ((u64)p0 + m) * h;
        hr[c] = swiglu(hr[c], u0);
        if (c + 1u < h) hr[c + 1u] = swiglu(hr[c + 1u], u1);
    }
};

template <int FMT>
__device__ __forceinline__ void moe_gate_tiled(const float* x, const int* order, const int* tiles, const u64* w1,
                                               float* hid, unsigned int tile_rows, unsigned int d, unsigned int h,
                                               unsigned int k) {
    MoeTile t;
    if (!moe_tile(tiles, tile_rows, &t)) return;
    const MoeGateOperands op{{{}, x, order, hid, t.p0, d, h, k}};
    gemm_block<FMT>(op, (const void*)w1[t.expert], t.rows, h, d, tile_rows, blockIdx.x, 0u);
}

template <int FMT>
__device__ __forceinline__ void moe_up_tiled(const float* x, const int* order, const int* tiles, const u64* w3,
                                             float* hid, unsigned int tile_rows, unsigned int d, unsigned int h,
                                             unsigned int k, float limit) {
    MoeTile t;
    if (!moe_tile(tiles, tile_rows, &t)) return;
    const MoeUpOperands op{{{}, x, order, hid, t.p0, d, h, k}, limit};
    gemm_block<FMT>(op, (const void*)w3[t.expert], t.rows, h, d, tile_rows, blockIdx.x, 0u);
}

GEMM_KERNEL void GEMM_LAUNCH moe_gate_f32(const float* x, const int* order, const int* tiles, const u64* w1,
                              float* hid, unsigned int tile_rows, unsigned int d, unsigned int h, unsigned int k) {
    grid_wait();
    moe_gate_tiled<0>(x, order, tiles, w1, hid, tile_rows, d, h, k);
}

GEMM_KERNEL void GEMM_LAUNCH moe_gate_bf16(const float* x, const int* order, const int* tiles, const u64* w1,
                              float* hid, unsigned int tile_rows, unsigned int d, unsigned int h, unsigned int k) {
    grid_wait();
    moe_gate_tiled<1>(x, order, tiles, w1, hid, tile_rows, d, h, k);
}

GEMM_KERNEL void GEMM_LAUNCH moe_gate_f16(const float* x, const int* order, const int* tiles, const u64* w1,
                              float* hid, unsigned int tile_rows, unsigned int d, unsigned int h, unsigned int k) {
    grid_wait();
    moe_gate_tiled<2>(x, order, tiles, w1, hid, tile_rows, d, h, k);
}

#define MOE_GATE_BLOCK_KERNEL(SFX, FMT)                                                                       \
    extern "C" __global__ void GEMM_LAUNCH moe_gate_##SFX(const float* x, const int* order, const int* tiles, \
                                                          const u64* w1, float* hid, unsigned int tile_rows,      \
                                                          unsigned int d, unsigned int h, unsigned int k) { grid_wait(); \
        moe_gate_tiled<FMT>(x, order, tiles, w1, hid, tile_rows, d, h, k);                                       \
    }
FOR_EACH_BLOCK_FORMAT(MOE_GATE_BLOCK_KERNEL)

GEMM_KERNEL void GEMM_LAUNCH moe_up_f32(const float* x, const int* order, const int* tiles, const u64* w3,
                            float* hid, unsigned int tile_rows, unsigned int d, unsigned int h, unsigned int k,
                            float limit) {
    grid_wait();
    moe_up_tiled<0>(x, order, tiles, w3, hid, tile_rows, d, h, k, limit);
}

GEMM_KERNEL void GEMM_LAUNCH moe_up_bf16(const float* x, const int* order, const int* tiles, const u64* w3,
                            float* hid, unsigned int tile_rows, unsigned int d, unsigned int h, unsigned int k,
                            float limit) {
    grid_wait();
    moe_up_tiled<1>(x, order, tiles, w3, hid, tile_rows, d, h, k, limit);
}

GEMM_KERNEL void GEMM_LAUNCH moe_up_f16(const float* x, const int* order, const int* tiles, const u64* w3,
                            float* hid, unsigned int tile_rows, unsigned int d, unsigned int h, unsigned int k,
                            float limit) {
    grid_wait();
    moe_up_tiled<2>(x, order, tiles, w3, hid, tile_rows, d, h, k, limit);
}

#define MOE_UP_BLOCK_KERNEL(SFX, FMT)                                                                       \
    extern "C" __global__ void GEMM_LAUNCH moe_up_##SFX(const float* x, const int* order, const int* tiles, \
                                                        const u64* w3, float* hid, unsigned int tile_rows,     \
                                                        unsigned int d, unsigned int h, unsigned int k,     \
                                                        float limit) { grid_wait();                        \
        moe_up_tiled<FMT>(x, order, tiles, w3, hid, tile_rows, d, h, k, limit);                                 \
    }
FOR_EACH_BLOCK_FORMAT(MOE_UP_BLOCK_KERNEL)

// ---- moe_down_{f32,bf16,f16,<block format>} -----------------------------------------------------------------
// ys [slots, d] row order[p] = w2[e] [d, h] . hid[p] for the tile's rows p = p0 .. p0 + rows
// (common.cuh's gemm_block, plain store scattered back to the slot's row). w2 is the table of the
// experts' w2 device addresses.
// Block GEMM_THREADS, grid (column blocks of d, max_tiles), as moe_up.

struct MoeDownOperands : ContiguousRows {
    const float* hid;
    const int* order;
    float* ys;
    unsigned int p0, d, h;

    __device__ __forceinline__ const float* a_row(unsigned int m) const { return hid + ((u64)p0 + m) * h; }
    __device__ __forceinline__ u64 w_row(unsigned int c) const { return (u64)c * h; }
    __device__ __forceinline__ void store2(unsigned int m, unsigned int c, float v0, float v1) const {
        float* yr = ys + (u64)order[p0 + m] * d;
        yr[c] = v0;
        if (c + 1u < d) yr[c + 1u] = v1;
    }
};

template <int FMT>
__device__ __forceinline__ void moe_down_tiled(const float* hid, const int* order, const int* tiles, const u64* w2,
                                               float* ys, unsigned int tile_rows, unsigned int d, unsigned int h) {
    MoeTile t;
    if (!moe_tile(tiles, tile_rows, &t)) return;
    const MoeDownOperands op{{}, hid, order, ys, t.p0, d, h};
    gemm_block<FMT>(op, (const void*)w2[t.expert], t.rows, d, h, tile_rows, blockIdx.x, 0u);
}

GEMM_KERNEL void GEMM_LAUNCH moe_down_f32(const float* hid, const int* order, const int* tiles, const u64* w2, float* ys,
                              unsigned int tile_rows, unsigned int d, unsigned int h) {
    grid_wait();
    moe_down_tiled<0>(hid, order, tiles, w2, ys, tile_rows, d, h);
}

GEMM_KERNEL void GEMM_LAUNCH moe_down_bf16(const float* hid, const int* order, const int* tiles, const u64* w2,
                               float* ys, unsigned int tile_rows, unsigned int d, unsigned int h) {
    grid_wait();
    moe_down_tiled<1>(hid, order, tiles, w2, ys, tile_rows, d, h);
}

GEMM_KERNEL void GEMM_LAUNCH moe_down_f16(const float* hid, const int* order, const int* tiles, const u64* w2, float* ys,
                              unsigned int tile_rows, unsigned int d, unsigned int h) {
    grid_wait();
    moe_down_tiled<2>(hid, order, tiles, w2, ys, tile_rows, d, h);
}

#define MOE_DOWN_BLOCK_KERNEL(SFX, FMT)                                                                     \
    extern "C" __global__ void GEMM_LAUNCH moe_down_##SFX(const float* hid, const int* order,               \
                                                          const int* tiles, const u64* w2, float* ys,       \
                                                          unsigned int tile_rows, unsigned int d,               \
                                                          unsigned int h) { grid_wait();                    \
        moe_down_tiled<FMT>(hid, order, tiles, w2, ys, tile_rows, d, h);                                        \
    }
FOR_EACH_BLOCK_FORMAT(MOE_DOWN_BLOCK_KERNEL)

// ---- moe_{gate,up,down}_q8x_<block format>: one token's experts on int8 activations ----------
// Fast precision, a decode step of one sequence (each tile one row, a repeated id a few): the
// small-row path above spends 15 instructions a weight on these shapes (Nsight Compute, H200: the
// IQ2_XXS gate 24.2 M instructions for 50 M weights, 34.8 us, issue-bound at 2.9 IPC), decoding
// every value to f32. Here each tile's rows go through q8x_cols (dequant.cuh): int8 activations,
// integer dot products with the codes. Instantiated for the formats q8x_dot32 takes (Q8X_IF_<fmt>
// in dequant.cuh; the host's moe_q8x_kernels). Grid (columns / (Q8X_WARPS · Q8X_COLS), max_tiles).
#define MOE_Q8X_KERNEL(SFX, FMT) Q8X_IF_##SFX(MOE_Q8X_DEFINE(SFX, FMT))
#if FOVEA_GEMM_PATH != GEMM_PATH_TILES
#define MOE_Q8X_DEFINE(SFX, FMT)                                                                               \
    extern "C" __global__ void __launch_bounds__(Q8X_THREADS)                                                  \
        moe_gate_q8x_##SFX(const float* x, const int* order, const int* tiles, const u64* w1, float* hid,      \
                           unsigned int tile_rows, unsigned int d, unsigned int h, unsigned int k) { grid_wait(); \
        MoeTile t;                                                                                             \
        if (!moe_tile(tiles, tile_rows, &t)) return;                                                          \
        const MoeGateOperands op{{{}, x, order, hid, t.p0, d, h, k}};                                          \
        q8x_cols<FMT>(op, (const void*)w1[t.expert], t.rows, h, d);                                            \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(Q8X_THREADS)                                                  \
        moe_up_q8x_##SFX(const float* x, const int* order, const int* tiles, const u64* w3, float* hid,        \
                         unsigned int tile_rows, unsigned int d, unsigned int h, unsigned int k, float limit) { grid_wait(); \
        MoeTile t;                                                                                             \
        if (!moe_tile(tiles, tile_rows, &t)) return;                                                          \
        const MoeUpOperands op{{{}, x, order, hid, t.p0, d, h, k}, limit};                                     \
        q8x_cols<FMT>(op, (const void*)w3[t.expert], t.rows, h, d);                                            \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(Q8X_THREADS)                                                  \
        moe_down_q8x_##SFX(const float* hid, const int* order, const int* tiles, const u64* w2, float* ys,     \
                           unsigned int tile_rows, unsigned int d, unsigned int h) { grid_wait();              \
        MoeTile t;                                                                                             \
        if (!moe_tile(tiles, tile_rows, &t)) return;                                                          \
        const MoeDownOperands op{{}, hid, order, ys, t.p0, d, h};                                              \
        q8x_cols<FMT>(op, (const void*)w2[t.expert], t.rows, d, h);                                            \
    }
FOR_EACH_BLOCK_FORMAT(MOE_Q8X_KERNEL)
#endif

// ---- moe_combine ---------------------------------------------------------------------------
// ys [n*k, d], weights [n, k], ids [n, k] -> out [n, d] = sum_s weights[i, s] * ys[i*k + s] in slot
// order (out starts at 0, the CPU lane's order); a slot id outside 0..experts makes the element
// NaN. 1-D grid-stride, one thread per output element x = i*d + c.

BASE_KERNEL void moe_combine(const float* ys, const float* weights, const int* ids, float* out,
                             unsigned int total, unsigned int d, unsigned int k, unsigned int experts) {
    grid_wait();
    for (u64 x = flat_index(); x < total; x += flat_stride()) {
        const u64 i = x / d, c = x % d;
        float s = 0.0f;
        for (unsigned int q = 0; q < k; ++q) {
            const int e = ids[i * k + q];
            if (e < 0 || (unsigned int)e >= experts) {
                s = QUIET_NAN;
                break;
            }
            s += weights[i * k + q] * ys[(i * k + q) * d + c];
        }
        out[x] = s;
    }
}
