// attention_f32: non-causal multi-head attention, q, k, v [n, heads*hd] -> out [n, heads*hd],
// softmax(q.k^T * scale) v per head.
//
// Flash attention (the tile helpers of common.cuh): a block of ATT_THREADS threads takes
// ATT_ROWS queries of one head (blockIdx.x = query tile, blockIdx.y = head) and streams the keys
// and values through shared memory in chunks of ATT_KEYS, each chunk read from global memory once
// for all the tile's queries (instead of once per query). Keys past n score -inf (weight 0);
// query rows past n are computed on zeros and not written. Dynamic shared memory (floats, ld =
// fa_stride(hd)): q [ATT_ROWS][ld], k [ATT_KEYS][ld], v [ATT_KEYS][ld], acc [ATT_ROWS][ld],
// S [ATT_ROWS][ATT_KEYS], P^T [ATT_KEYS][ATT_ROWS], alpha [ATT_ROWS], factor [ATT_ROWS]
// (att_shared_floats; the host mirrors it).

#define ATT_THREADS 128
#define ATT_ROWS 32
#define ATT_KEYS 32

extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, float* out,
                                         unsigned int n, unsigned int heads, unsigned int hd, float scale) {
    extern __shared__ float smem[];
    const unsigned int ld = fa_stride(hd), nvec = (hd + 3u) / 4u;
    float* qs = smem;                             // [ATT_ROWS][ld]
    float* ks = qs + ATT_ROWS * ld;               // [ATT_KEYS][ld]
    float* vs = ks + ATT_KEYS * ld;               // [ATT_KEYS][ld]
    float* acc = vs + ATT_KEYS * ld;              // [ATT_ROWS][ld]
    float* S = acc + ATT_ROWS * ld;               // [ATT_ROWS][ATT_KEYS]
    float* PT = S + ATT_ROWS * ATT_KEYS;          // [ATT_KEYS][ATT_ROWS]
    float* alpha = PT + ATT_KEYS * ATT_ROWS;      // [ATT_ROWS]
    float* factor = alpha + ATT_ROWS;             // [ATT_ROWS]

    const unsigned int i0 = blockIdx.x * ATT_ROWS, h = blockIdx.y, tid = threadIdx.x;
    const unsigned int lane = tid % 32u, warp = tid / 32u, warps = ATT_THREADS / 32;
    const u64 cols = (u64)heads * hd, head_off = (u64)h * hd;
    for (unsigned int r = warp; r < ATT_ROWS; r += warps) {
        const unsigned int i = i0 + r;
        fa_stage_row(qs + r * ld, i < n ? q + i * cols + head_off : 0, hd, nvec, lane);
        fa_stage_row(acc + r * ld, 0, hd, nvec, lane);
    }

    float m = NEG_INF, l = 0.0f; // running max and denominator of this thread's softmax row
    for (unsigned int j0 = 0; j0 < n; j0 += ATT_KEYS) {
        __syncthreads(); // the previous chunk's k, v, S, P^T are consumed (and q, acc staged)
        for (unsigned int r = warp; r < ATT_KEYS; r += warps) {
            const unsigned int j = j0 + r;
            fa_stage_row(ks + r * ld, j < n ? k + j * cols + head_off : 0, hd, nvec, lane);
            fa_stage_row(vs + r * ld, j < n ? v + j * cols + head_off : 0, hd, nvec, lane);
        }
        __syncthreads();
        fa_scores<ATT_ROWS, ATT_KEYS, ATT_THREADS>(qs, ks, ld, nvec, scale, S);
        __syncthreads();
        const unsigned int keys = (n - j0 < ATT_KEYS) ? n - j0 : ATT_KEYS; // keys past n are missing
        const unsigned int present = keys == 32u ? 0xffffffffu : (1u << keys) - 1u;
        fa_softmax<ATT_ROWS, ATT_KEYS, ATT_THREADS>(S, present, PT, alpha, m, l);
        __syncthreads();
        fa_accumulate<ATT_ROWS, ATT_KEYS, ATT_THREADS>(PT, alpha, vs, ld, nvec, acc);
    }
    if (tid % (ATT_THREADS / ATT_ROWS) == 0) factor[tid / (ATT_THREADS / ATT_ROWS)] = 1.0f / l;
    __syncthreads();
    for (unsigned int e = tid; e < ATT_ROWS * hd; e += ATT_THREADS) {
        const unsigned int r = e / hd, d = e % hd, i = i0 + r;
        if (i < n) out[i * cols + head_off + d] = acc[r * ld + d] * factor[r];
    }
}
