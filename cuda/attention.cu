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

// ---- fast precision: attention on tensor cores ------------------------------------------------
// attention_fast_d{16,32,64,128}: attention_f32's contract in fast precision (sm_80+; the host
// takes attention_f32 below that and in exact precision). q·kᵀ and p·v are f16 MMAs (m16n8k16,
// f32 accumulators); the scale, the online softmax (running max, exp, denominator) and the output
// stay f32. q, k and v are each rounded once to f16, as fast precision's GEMM operands are, and so
// are the probabilities p (in [0, 1]) before p·v (tests/ops.rs derives the bound). The suffix is
// the padded head width HDP >= hd: dims hd .. HDP are staged as zeros (q·k is unchanged, the extra
// output columns are never written).
//
// A block of FA_WARPS warps takes 16·FA_WARPS queries of one head (grid (ceil(n / (16·FA_WARPS)),
// heads)). Each warp keeps its 16 queries' A fragments and their 16 × HDP output accumulators in
// registers and streams the head's keys in chunks of FA_KEYS through shared memory: K as f16 pairs
// along the head dim, V transposed (f16 pairs along the keys), the two layouts the B fragments read
// with one 32-bit load each (mma_m16n8k16_bf16 in common.cuh has the fragment layout). Rows padded
// by 4 words put each fragment load of a warp on 32 distinct banks. The score fragments of two
// adjacent 8-key tiles are the A fragment of p·v for those 16 keys (FlashAttention-2's register
// reuse). Keys past n score -inf (p = 0); query rows past n run on zeros and are not written. A NaN
// in a query row makes that row's outputs NaN (its max skips the NaN, its exps are NaN), nothing else.
#define FA_WARPS 4
#define FA_KEYS 64

// Elements d .. d + 3 of a row of hd floats (row = 0: a missing row, zeros), 0 past hd; vec4: hd
// is a multiple of 4 (the row starts on 16 bytes).
__device__ __forceinline__ fa_f4 fa_load4(const float* row, unsigned int d, unsigned int hd, bool vec4) {
    if (!row) return fa_f4{0.0f, 0.0f, 0.0f, 0.0f};
    if (vec4 && d < hd) return *reinterpret_cast<const fa_f4*>(row + d);
    return fa_f4{d < hd ? row[d] : 0.0f, d + 1u < hd ? row[d + 1u] : 0.0f, d + 2u < hd ? row[d + 2u] : 0.0f,
                 d + 3u < hd ? row[d + 3u] : 0.0f};
}

// Elements d, d + 1 of a row (0 past hd or for a missing row) as an f16 pair, d in the low half.
__device__ __forceinline__ unsigned int fa_pair16(const float* row, unsigned int d, unsigned int hd) {
    return f16x2_rn(row && d < hd ? row[d] : 0.0f, row && d + 1u < hd ? row[d + 1u] : 0.0f);
}

template <int HDP>
__device__ __forceinline__ void attention_fast(const float* q, const float* k, const float* v, float* out,
                                               unsigned int n, unsigned int heads, unsigned int hd, float scale) {
    constexpr int KT = HDP / 16;         // k16 steps of q·kᵀ
    constexpr int DT = HDP / 8;          // n8 tiles of the output
    constexpr int NT = FA_KEYS / 8;      // n8 tiles of a chunk's scores
    constexpr int KW = HDP / 2 + 4;      // words a staged K row (f16 pairs along the head dim)
    constexpr int VW = FA_KEYS / 2 + 4;  // words a staged Vᵀ row (f16 pairs along the keys)
    constexpr int THREADS = 32 * FA_WARPS;
    static_assert(HDP % 16 == 0 && FA_KEYS % 16 == 0, "attention_fast: MMA shapes");
    __shared__ unsigned int ks[FA_KEYS * KW]; // [key][word]
    __shared__ unsigned int vt[HDP * VW];     // [dim][key pair]

    const unsigned int lane = threadIdx.x % 32u, warp = threadIdx.x / 32u, g = lane / 4u, t = lane % 4u;
    const u64 cols = (u64)heads * hd, head_off = (u64)blockIdx.y * hd;
    const bool vec4 = hd % 4u == 0u;
    const unsigned int i0 = blockIdx.x * (16u * FA_WARPS) + warp * 16u; // the warp's first query
    const float* q0 = i0 + g < n ? q + (i0 + g) * cols + head_off : 0;
    const float* q1 = i0 + g + 8u < n ? q + (i0 + g + 8u) * cols + head_off : 0;
    unsigned int qa[KT][4]; // rows g and g + 8, dims kt·16 + 2t (+1) and + 8
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
        const unsigned int d = kt * 16u + 2u * t;
        qa[kt][0] = fa_pair16(q0, d, hd);
        qa[kt][1] = fa_pair16(q1, d, hd);
        qa[kt][2] = fa_pair16(q0, d + 8u, hd);
        qa[kt][3] = fa_pair16(q1, d + 8u, hd);
    }
    const float scale_log2 = scale * 1.4426950408889634f; // scores in log2 units: exp(x) = exp2(x·log2 e)
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f; // rows g, g + 8: running max, this thread's part of the sum

    for (unsigned int j0 = 0; j0 < n; j0 += FA_KEYS) {
        __syncthreads(); // the previous chunk's K and Vᵀ are consumed
        for (unsigned int u = threadIdx.x; u < FA_KEYS * (HDP / 4); u += THREADS) {
            const unsigned int r = u / (HDP / 4), d = 4u * (u % (HDP / 4)), j = j0 + r;
            const fa_f4 x = fa_load4(j < n ? k + j * cols + head_off : 0, d, hd, vec4);
            ks[r * KW + d / 2u] = f16x2_rn(x.x, x.y);
            ks[r * KW + d / 2u + 1u] = f16x2_rn(x.z, x.w);
        }
        // a warp takes 32 consecutive key pairs of one 4-dim group: its Vᵀ stores hit 32 banks
        for (unsigned int u = threadIdx.x; u < (FA_KEYS / 2) * (HDP / 4); u += THREADS) {
            const unsigned int kp = u % (FA_KEYS / 2), d = 4u * (u / (FA_KEYS / 2)), j = j0 + 2u * kp;
            const fa_f4 a = fa_load4(j < n ? v + j * cols + head_off : 0, d, hd, vec4);
            const fa_f4 b = fa_load4(j + 1u < n ? v + (j + 1u) * cols + head_off : 0, d, hd, vec4);
            vt[d * VW + kp] = f16x2_rn(a.x, b.x);
            vt[(d + 1u) * VW + kp] = f16x2_rn(a.y, b.y);
            vt[(d + 2u) * VW + kp] = f16x2_rn(a.z, b.z);
            vt[(d + 3u) * VW + kp] = f16x2_rn(a.w, b.w);
        }
        __syncthreads();

        // s[nt]: scores of rows g (0, 1) and g + 8 (2, 3) with keys j0 + nt·8 + 2t (+1)
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            const unsigned int* kr = ks + (nt * 8u + g) * KW + t;
#pragma unroll
            for (int kt = 0; kt < KT; ++kt) {
                const unsigned int b[2] = {kr[kt * 8], kr[kt * 8 + 4]};
                mma_m16n8k16_f16(s[nt], qa[kt], b);
            }
        }
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const unsigned int j = j0 + nt * 8u + 2u * t + (e & 1u);
                s[nt][e] = j < n ? s[nt][e] * scale_log2 : NEG_INF;
                if (e < 2) mx0 = fmaxf(mx0, s[nt][e]);
                else mx1 = fmaxf(mx1, s[nt][e]);
            }
#pragma unroll
        for (int o2 = 1; o2 < 4; o2 <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
        }
        // exps relative to the new max (0 while a row has seen only -inf, where m - max would be NaN)
        const float base0 = mx0 == NEG_INF ? 0.0f : mx0, base1 = mx1 == NEG_INF ? 0.0f : mx1;
        const float a0 = exp2f(m0 - base0), a1 = exp2f(m1 - base1);
        m0 = mx0;
        m1 = mx1;
        l0 *= a0;
        l1 *= a1;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            o[dt][0] *= a0, o[dt][1] *= a0;
            o[dt][2] *= a1, o[dt][3] *= a1;
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            s[nt][0] = exp2f(s[nt][0] - base0), s[nt][1] = exp2f(s[nt][1] - base0);
            s[nt][2] = exp2f(s[nt][2] - base1), s[nt][3] = exp2f(s[nt][3] - base1);
            l0 += s[nt][0] + s[nt][1];
            l1 += s[nt][2] + s[nt][3];
        }
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; ++kk) {
            const unsigned int pa[4] = {f16x2_rn(s[2 * kk][0], s[2 * kk][1]), f16x2_rn(s[2 * kk][2], s[2 * kk][3]),
                                        f16x2_rn(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                        f16x2_rn(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                const unsigned int* vr = vt + (dt * 8u + g) * VW + kk * 8u + t;
                const unsigned int b[2] = {vr[0], vr[4]};
                mma_m16n8k16_f16(o[dt], pa, b);
            }
        }
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    float* y0 = i0 + g < n ? out + (i0 + g) * cols + head_off : 0;
    float* y1 = i0 + g + 8u < n ? out + (i0 + g + 8u) * cols + head_off : 0;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
        const unsigned int d = dt * 8u + 2u * t;
        if (y0 && d < hd) y0[d] = o[dt][0] * inv0;
        if (y0 && d + 1u < hd) y0[d + 1u] = o[dt][1] * inv0;
        if (y1 && d < hd) y1[d] = o[dt][2] * inv1;
        if (y1 && d + 1u < hd) y1[d + 1u] = o[dt][3] * inv1;
    }
}

#define ATTENTION_FAST_KERNEL(HDP)                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * FA_WARPS)                                           \
        attention_fast_d##HDP(const float* q, const float* k, const float* v, float* out, unsigned int n, \
                              unsigned int heads, unsigned int hd, float scale) {                         \
        attention_fast<HDP>(q, k, v, out, n, heads, hd, scale);                                           \
    }
ATTENTION_FAST_KERNEL(16)
ATTENTION_FAST_KERNEL(32)
ATTENTION_FAST_KERNEL(64)
ATTENTION_FAST_KERNEL(128)
