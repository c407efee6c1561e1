// Routed experts (language.md §3): moe_experts as route -> per-expert gathered GEMMs -> combine.
// x [n, d], ids i32 [n, k], weights [n, k]; per expert e: w13[e] [2h, d] (w1 rows, then w3 rows)
// and w2[e] [d, h], each in its storage format (decoded in the kernels, load_w in common.cuh).
// A slot is one (token, k-index) pair, numbered s = token*k + k-index.
//
// 1. moe_route: groups the slots by expert on the device (stable: slot order within an expert).
// 2. per expert with slots (launched from the host, see src/backend/cuda/moe.rs):
//    moe_up_*:   hid[p] = swiglu_clamp(w13[e] . x[token of order[p]]) for p in the expert's range
//    moe_down_*: ys[order[p]] = w2[e] . hid[p]
// 3. moe_combine: out[token] = sum over its k slots, in slot order, of weights[s] * ys[s]
//    (no float atomics: the result is reproducible run to run).

// ---- moe_route -----------------------------------------------------------------------------
// ids i32 [slots] -> offsets i32 [experts + 1] (exclusive prefix of the per-expert counts;
// offsets[experts] = the slots with a valid id), order i32 [slots] (slot numbers grouped by expert,
// ascending within an expert), cursor i32 [experts] (scratch). A slot whose id is outside
// 0..experts is left out (moe_combine turns its token's row into NaN).
// ONE block of MR_THREADS threads (sizes here are small: n*k slots, a few hundred experts). The
// slots are visited in chunks of MR_THREADS; in a chunk each thread ranks its slot among the
// earlier slots of the chunk with the same expert (a shared-memory scan), and the last slot of
// each expert in the chunk bumps that expert's counter by its rank + 1: no atomics, and the
// order is deterministic and stable.

#define MR_THREADS 256

// rank of this thread's expert e among threads < tid of the chunk, and whether it is the last one.
__device__ __forceinline__ unsigned int mr_rank(const int* chunk, unsigned int tid, int e, bool* last) {
    unsigned int rank = 0;
    for (unsigned int u = 0; u < tid; ++u) rank += chunk[u] == e;
    bool l = true;
    for (unsigned int u = tid + 1; u < MR_THREADS; ++u) l = l && chunk[u] != e;
    *last = l;
    return rank;
}

extern "C" __global__ void moe_route(const int* ids, int* offsets, int* order, int* cursor, unsigned int slots,
                                     unsigned int experts) {
    __shared__ int chunk[MR_THREADS];
    const unsigned int tid = threadIdx.x;
    for (unsigned int e = tid; e < experts; e += MR_THREADS) cursor[e] = 0;
    __syncthreads();
    // pass 1: counts into cursor[]
    for (unsigned int s0 = 0; s0 < slots; s0 += MR_THREADS) {
        const unsigned int s = s0 + tid;
        int e = s < slots ? ids[s] : -1;
        if (e < 0 || (unsigned int)e >= experts) e = -1;
        chunk[tid] = e;
        __syncthreads();
        bool last;
        const unsigned int rank = mr_rank(chunk, tid, e, &last);
        if (e >= 0 && last) cursor[e] += (int)rank + 1;
        __syncthreads(); // chunk[] and cursor[] settled before the next chunk
    }
    // exclusive prefix (one thread; experts is small), cursor[] becomes each expert's start
    if (tid == 0) {
        int run = 0;
        for (unsigned int e = 0; e < experts; ++e) {
            const int c = cursor[e];
            offsets[e] = run;
            cursor[e] = run;
            run += c;
        }
        offsets[experts] = run;
    }
    __syncthreads();
    // pass 2: scatter the slot numbers
    for (unsigned int s0 = 0; s0 < slots; s0 += MR_THREADS) {
        const unsigned int s = s0 + tid;
        int e = s < slots ? ids[s] : -1;
        if (e < 0 || (unsigned int)e >= experts) e = -1;
        chunk[tid] = e;
        __syncthreads();
        bool last;
        const unsigned int rank = mr_rank(chunk, tid, e, &last);
        if (e >= 0) order[cursor[e] + rank] = (int)s;
        __syncthreads(); // every thread read cursor[e] before it moves
        if (e >= 0 && last) cursor[e] += (int)rank + 1;
        __syncthreads();
    }
}

// ---- moe_up_{f32,bf16,f16} -------------------------------------------------------------------
// Gathered GEMM with the clamped SwiGLU fused in the epilogue, for one expert's rows
// p = p0 .. p0 + cnt of order[]: hid [slots, h] row p = silu(min(g, limit)) * clamp(u, +-limit)
// with g = w13[j] . x[order[p] / k], u = w13[h + j] . x[order[p] / k], j < h.
// 16x16 tiles: block (MOE_TILE, MOE_TILE), grid (ceil(h/MOE_TILE), ceil(cnt/MOE_TILE));
// threadIdx.x walks hidden units j, threadIdx.y the expert's rows; the gate and up rows of w13
// are staged side by side (two weight tiles).

#define MOE_TILE 16

template <int FMT>
__device__ __forceinline__ void moe_up_tiled(const float* x, const int* order, const void* w13, float* hid,
                                             unsigned int p0, unsigned int cnt, unsigned int d, unsigned int h,
                                             unsigned int k, float limit) {
    __shared__ float xs[MOE_TILE][MOE_TILE + 1];
    __shared__ float gs[MOE_TILE][MOE_TILE + 1];
    __shared__ float us[MOE_TILE][MOE_TILE + 1];
    const unsigned int tx = threadIdx.x, ty = threadIdx.y;
    const unsigned int row = blockIdx.y * MOE_TILE + ty; // row of the expert's range
    const unsigned int j = blockIdx.x * MOE_TILE + tx;   // hidden unit computed
    const unsigned int wj = blockIdx.x * MOE_TILE + ty;  // hidden unit whose w13 rows are staged
    const u64 tok = row < cnt ? (u64)order[p0 + row] / k : 0;
    float g = 0.0f, u = 0.0f;
    for (unsigned int k0 = 0; k0 < d; k0 += MOE_TILE) {
        const unsigned int kk = k0 + tx;
        xs[ty][tx] = (row < cnt && kk < d) ? x[tok * d + kk] : 0.0f;
        const bool wok = wj < h && kk < d;
        gs[ty][tx] = wok ? load_w<FMT>(w13, (u64)wj * d + kk) : 0.0f;
        us[ty][tx] = wok ? load_w<FMT>(w13, ((u64)h + wj) * d + kk) : 0.0f;
        __syncthreads();
        for (unsigned int t = 0; t < MOE_TILE; ++t) {
            g += xs[ty][t] * gs[tx][t];
            u += xs[ty][t] * us[tx][t];
        }
        __syncthreads();
    }
    if (row < cnt && j < h) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        hid[((u64)p0 + row) * h + j] = g / (1.0f + expf(-g)) * u;
    }
}

extern "C" __global__ void moe_up_f32(const float* x, const int* order, const float* w13, float* hid,
                                      unsigned int p0, unsigned int cnt, unsigned int d, unsigned int h,
                                      unsigned int k, float limit) {
    moe_up_tiled<0>(x, order, w13, hid, p0, cnt, d, h, k, limit);
}

extern "C" __global__ void moe_up_bf16(const float* x, const int* order, const unsigned short* w13, float* hid,
                                       unsigned int p0, unsigned int cnt, unsigned int d, unsigned int h,
                                       unsigned int k, float limit) {
    moe_up_tiled<1>(x, order, w13, hid, p0, cnt, d, h, k, limit);
}

extern "C" __global__ void moe_up_f16(const float* x, const int* order, const unsigned short* w13, float* hid,
                                      unsigned int p0, unsigned int cnt, unsigned int d, unsigned int h,
                                      unsigned int k, float limit) {
    moe_up_tiled<2>(x, order, w13, hid, p0, cnt, d, h, k, limit);
}

// ---- moe_down_{f32,bf16,f16} -----------------------------------------------------------------
// ys [slots, d] row order[p] = w2 [d, h] . hid[p] for the expert's rows p = p0 .. p0 + cnt.
// 16x16 tiles: block (MOE_TILE, MOE_TILE), grid (ceil(d/MOE_TILE), ceil(cnt/MOE_TILE));
// threadIdx.x walks output columns, threadIdx.y the expert's rows.

template <int FMT>
__device__ __forceinline__ void moe_down_tiled(const float* hid, const int* order, const void* w2, float* ys,
                                               unsigned int p0, unsigned int cnt, unsigned int d, unsigned int h) {
    __shared__ float hs[MOE_TILE][MOE_TILE + 1];
    __shared__ float ws[MOE_TILE][MOE_TILE + 1];
    const unsigned int tx = threadIdx.x, ty = threadIdx.y;
    const unsigned int row = blockIdx.y * MOE_TILE + ty;
    const unsigned int col = blockIdx.x * MOE_TILE + tx;
    const unsigned int wrow = blockIdx.x * MOE_TILE + ty;
    float acc = 0.0f;
    for (unsigned int k0 = 0; k0 < h; k0 += MOE_TILE) {
        const unsigned int kk = k0 + tx;
        hs[ty][tx] = (row < cnt && kk < h) ? hid[((u64)p0 + row) * h + kk] : 0.0f;
        ws[ty][tx] = (wrow < d && kk < h) ? load_w<FMT>(w2, (u64)wrow * h + kk) : 0.0f;
        __syncthreads();
        for (unsigned int t = 0; t < MOE_TILE; ++t) acc += hs[ty][t] * ws[tx][t];
        __syncthreads();
    }
    if (row < cnt && col < d) ys[(u64)order[p0 + row] * d + col] = acc;
}

extern "C" __global__ void moe_down_f32(const float* hid, const int* order, const float* w2, float* ys,
                                        unsigned int p0, unsigned int cnt, unsigned int d, unsigned int h) {
    moe_down_tiled<0>(hid, order, w2, ys, p0, cnt, d, h);
}

extern "C" __global__ void moe_down_bf16(const float* hid, const int* order, const unsigned short* w2, float* ys,
                                         unsigned int p0, unsigned int cnt, unsigned int d, unsigned int h) {
    moe_down_tiled<1>(hid, order, w2, ys, p0, cnt, d, h);
}

extern "C" __global__ void moe_down_f16(const float* hid, const int* order, const unsigned short* w2, float* ys,
                                        unsigned int p0, unsigned int cnt, unsigned int d, unsigned int h) {
    moe_down_tiled<2>(hid, order, w2, ys, p0, cnt, d, h);
}

// ---- moe_combine ---------------------------------------------------------------------------
// ys [n*k, d], weights [n, k], ids [n, k] -> out [n, d] = sum_s weights[i, s] * ys[i*k + s] in slot
// order (out starts at 0, the CPU lane's order); a slot id outside 0..experts makes the element
// NaN. 1-D grid-stride, one thread per output element x = i*d + c.

extern "C" __global__ void moe_combine(const float* ys, const float* weights, const int* ids, float* out,
                                       unsigned int total, unsigned int d, unsigned int k, unsigned int experts) {
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
