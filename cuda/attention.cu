// attention_f32: non-causal multi-head attention, q, k, v [n, heads*hd] -> out [n, heads*hd],
// softmax(q.k^T * scale) v per head. (Fast precision on tensor cores: attention_kv_f16 and
// attention_fast_d*, at the end of this file.)
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
    grid_wait();
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
// the padded head width HDP >= hd: dims hd .. HDP are zeros (q·k is unchanged, the extra output
// columns are never written).
//
// Two launches. attention_kv_f16 writes k and v once as the MMAs' f16 operands, zero-padded to
// np keys (n rounded up to FA_KEYS) and HDP dims, into one buffer of 2·heads·np·HDP/2 words:
//   kh [heads][np][HDP/2]  words of two f16 along the head dim (the low half the lower dim),
//   vt [heads][HDP][np/2]  words of two f16 along the keys (V transposed: the low half the lower key),
// the layouts the B fragments read with one 32-bit load each (mma_m16n8k16_bf16 in common.cuh has
// the fragment layout). attention_fast_d* then takes 16·FA_WARPS queries of one head a block (grid
// (ceil(n / (16·FA_WARPS)), heads)): each warp keeps its 16 queries' A fragments and their 16 × HDP
// output accumulators in registers, and the block streams the head's chunks of FA_KEYS keys
// through two shared-memory stages with cp.async (16-byte copies, the next chunk in flight while
// the current one multiplies; dynamic shared memory 2 · (FA_KEYS·KW + HDP·VW) words, the host
// mirrors it). Rows padded by 4 words put each fragment load of a warp on 32 distinct banks. The
// score fragments of two adjacent 8-key tiles are the A fragment of p·v for those 16 keys
// (FlashAttention-2's register reuse). Keys past n (the last chunk only) score -inf (p = 0); query
// rows past n run on zeros and are not written. A NaN in a query row makes that row's outputs
// NaN (its max skips the NaN, its exps are NaN), nothing else.
#define FA_WARPS 4
#define FA_KEYS 64

// k, v [n, heads·hd] -> kv16 = kh then vt (above), a thread per word (grid-stride).
extern "C" __global__ void attention_kv_f16(const float* k, const float* v, unsigned int* kv16, unsigned int n,
                                            unsigned int heads, unsigned int hd, unsigned int hdp, unsigned int np) {
    grid_wait();
    const u64 words = (u64)heads * np * (hdp / 2u), cols = (u64)heads * hd;
    for (u64 e = flat_index(); e < 2u * words; e += flat_stride()) {
        if (e < words) {
            const unsigned int dw = (unsigned int)(e % (hdp / 2u));
            const u64 hj = e / (hdp / 2u);
            const unsigned int j = (unsigned int)(hj % np), h = (unsigned int)(hj / np);
            kv16[e] = fa_pair16(j < n ? k + j * cols + (u64)h * hd : 0, 2u * dw, hd);
        } else {
            const u64 f = e - words;
            const unsigned int jw = (unsigned int)(f % (np / 2u));
            const u64 hdim = f / (np / 2u);
            const unsigned int d = (unsigned int)(hdim % hdp), h = (unsigned int)(hdim / hdp), j = 2u * jw;
            const float* col = v + (u64)h * hd + d;
            const bool in = d < hd;
            kv16[e] = f16x2_rn(in && j < n ? col[j * cols] : 0.0f, in && j + 1u < n ? col[(j + 1u) * cols] : 0.0f);
        }
    }
}

// The ViT block's attention operands straight from its fused projection (the lane's
// attention_rope_2d in fast precision): qkv [n, 3·heads·hd] = q | k | v (hd a multiple of 4) and
// rope_2d_f32's table -> q rotated, f32 [n, heads·hd] (rope_2d_at, as rope_2d_f32 writes it), and k rotated and v
// as attention_kv_f16's kv16 (kh then vt, zero-padded to np keys and HDP = hdp dims), each value
// rounded once as there. It replaces three column slices, two rotations and that conversion.
// Grid (np / FA_KEYS, heads), QKV_THREADS threads: a block takes FA_KEYS rows of one head. q and kh
// are read and written along the rows; V's tile passes through shared memory, QKV_DIMS dims at a
// time, so that vt's words (two keys each) are written along the keys.
#define QKV_THREADS 256
#define QKV_DIMS 32
extern "C" __global__ void attention_qkv_rope_f16(const float* qkv, const float* tab, float* q, unsigned int* kv16,
                                                  unsigned int n, unsigned int heads, unsigned int hd,
                                                  unsigned int hdp, unsigned int np) {
    grid_wait();
    __shared__ float vs[FA_KEYS][QKV_DIMS + 1];
    const unsigned int j0 = blockIdx.x * FA_KEYS, h = blockIdx.y, half = hd / 2u, kw = hdp / 2u, tid = threadIdx.x;
    const u64 cols = (u64)heads * hd, row = 3u * cols, words = (u64)heads * np * kw;
    const float* cos_t = tab;
    const float* sin_t = tab + (u64)n * half;
    for (unsigned int e = tid; e < FA_KEYS * half; e += QKV_THREADS) {
        const unsigned int j = j0 + e / half, d = e % half;
        if (j >= n) continue;
        const float* x = qkv + j * row + (u64)h * hd;
        float* o = q + j * cols + (u64)h * hd;
        o[d] = rope_2d_at(x, cos_t + (u64)j * half, sin_t + (u64)j * half, d, half, hd);
        o[d + half] = rope_2d_at(x, cos_t + (u64)j * half, sin_t + (u64)j * half, d + half, half, hd);
    }
    for (unsigned int e = tid; e < FA_KEYS * kw; e += QKV_THREADS) {
        const unsigned int j = j0 + e / kw, dw = e % kw;
        float lo = 0.0f, hi = 0.0f;
        if (j < n) {
            const float* x = qkv + j * row + cols + (u64)h * hd;
            const float *c = cos_t + (u64)j * half, *s = sin_t + (u64)j * half;
            lo = rope_2d_at(x, c, s, 2u * dw, half, hd);
            hi = rope_2d_at(x, c, s, 2u * dw + 1u, half, hd);
        }
        kv16[((u64)h * np + j) * kw + dw] = f16x2_rn(lo, hi);
    }
    for (unsigned int d0 = 0; d0 < hdp; d0 += QKV_DIMS) {
        for (unsigned int e = tid; e < FA_KEYS * QKV_DIMS; e += QKV_THREADS) {
            const unsigned int r = e / QKV_DIMS, dd = e % QKV_DIMS, j = j0 + r, d = d0 + dd;
            vs[r][dd] = j < n && d < hd ? qkv[j * row + 2u * cols + (u64)h * hd + d] : 0.0f;
        }
        __syncthreads();
        for (unsigned int e = tid; e < QKV_DIMS * (FA_KEYS / 2); e += QKV_THREADS) {
            const unsigned int dd = e / (FA_KEYS / 2), jw = e % (FA_KEYS / 2);
            if (d0 + dd < hdp)
                kv16[words + ((u64)h * hdp + d0 + dd) * (np / 2u) + j0 / 2u + jw] =
                    f16x2_rn(vs[2u * jw][dd], vs[2u * jw + 1u][dd]);
        }
        __syncthreads();
    }
}

template <int HDP>
__device__ __forceinline__ void attention_fast(const float* q, const unsigned int* kv16, float* out, unsigned int n,
                                               unsigned int heads, unsigned int hd, unsigned int np, float scale) {
    constexpr int KT = HDP / 16;                          // k16 steps of q·kᵀ
    constexpr int DT = HDP / 8;                           // n8 tiles of the output
    constexpr int NT = FA_KEYS / 8;                       // n8 tiles of a chunk's scores
    constexpr unsigned int KW = HDP / 2 + 4;              // words a staged K row
    constexpr unsigned int VW = FA_KEYS / 2 + 4;          // words a staged Vᵀ row
    constexpr unsigned int STAGE = FA_KEYS * KW + HDP * VW; // words a stage: K chunk, then Vᵀ chunk
    constexpr unsigned int THREADS = 32 * FA_WARPS;
    static_assert(HDP % 16 == 0 && FA_KEYS % 16 == 0 && KW % 4 == 0 && VW % 4 == 0, "attention_fast: shapes");
    extern __shared__ float smem[];
    unsigned int* stages = reinterpret_cast<unsigned int*>(smem); // [2][STAGE]

    const unsigned int lane = threadIdx.x % 32u, warp = threadIdx.x / 32u, g = lane / 4u, t = lane % 4u;
    const u64 cols = (u64)heads * hd, head_off = (u64)blockIdx.y * hd;
    const unsigned int* kg = kv16 + (u64)blockIdx.y * np * (HDP / 2);                              // [np][HDP/2]
    const unsigned int* vg = kv16 + (u64)heads * np * (HDP / 2) + (u64)blockIdx.y * HDP * (np / 2u); // [HDP][np/2]
    // the copies of chunk c (keys c·FA_KEYS ..) into stage b, as one group
    const auto issue = [&](unsigned int c, unsigned int b) {
        unsigned int* ks = stages + b * STAGE;
        unsigned int* vs = ks + FA_KEYS * KW;
        const unsigned int j0 = c * FA_KEYS;
        for (unsigned int u = threadIdx.x; u < FA_KEYS * (HDP / 8); u += THREADS) {
            const unsigned int r = u / (HDP / 8), p = 4u * (u % (HDP / 8));
            fa_cp16(ks + r * KW + p, kg + (u64)(j0 + r) * (HDP / 2) + p);
        }
        for (unsigned int u = threadIdx.x; u < HDP * (FA_KEYS / 8); u += THREADS) {
            const unsigned int d = u / (FA_KEYS / 8), p = 4u * (u % (FA_KEYS / 8));
            fa_cp16(vs + d * VW + p, vg + (u64)d * (np / 2u) + j0 / 2u + p);
        }
        fa_cp_commit();
    };

    const unsigned int i0 = blockIdx.x * (16u * FA_WARPS) + warp * 16u; // the warp's first query
    const float* q0 = i0 + g < n ? q + (i0 + g) * cols + head_off : 0;
    const float* q1 = i0 + g + 8u < n ? q + (i0 + g + 8u) * cols + head_off : 0;
    const unsigned int chunks = np / FA_KEYS;
    issue(0u, 0u);
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

    for (unsigned int c = 0; c < chunks; ++c) {
        if (c + 1u < chunks) {
            issue(c + 1u, (c + 1u) % 2u);
            fa_cp_wait<1>(); // chunk c's group has landed (c + 1's may still be in flight)
        } else {
            fa_cp_wait<0>();
        }
        __syncthreads(); // every thread's copies of chunk c are visible
        const unsigned int* ks = stages + (c % 2u) * STAGE;
        const unsigned int* vs = ks + FA_KEYS * KW;
        const unsigned int j0 = c * FA_KEYS;

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
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] *= scale_log2;
        if (j0 + FA_KEYS > n) // the last chunk: its padding keys score -inf
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (j0 + nt * 8u + 2u * t + (e & 1u) >= n) s[nt][e] = NEG_INF;
        fa_online_softmax<NT, DT>(s, o, m0, m1, l0, l1);
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; ++kk) {
            const unsigned int pa[4] = {f16x2_rn(s[2 * kk][0], s[2 * kk][1]), f16x2_rn(s[2 * kk][2], s[2 * kk][3]),
                                        f16x2_rn(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                        f16x2_rn(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                const unsigned int* vr = vs + (dt * 8u + g) * VW + kk * 8u + t;
                const unsigned int b[2] = {vr[0], vr[4]};
                mma_m16n8k16_f16(o[dt], pa, b);
            }
        }
        __syncthreads(); // stage c % 2 is consumed before chunk c + 2's copies overwrite it
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

// One kernel a padded head width (written out: the lane's unit test finds each kernel it launches
// by its definition in this file).
extern "C" __global__ void attention_fast_d16(const float* q, const unsigned int* kv16, float* out, unsigned int n,
                                              unsigned int heads, unsigned int hd, unsigned int np, float scale) {
    grid_wait();
    attention_fast<16>(q, kv16, out, n, heads, hd, np, scale);
}
extern "C" __global__ void attention_fast_d32(const float* q, const unsigned int* kv16, float* out, unsigned int n,
                                              unsigned int heads, unsigned int hd, unsigned int np, float scale) {
    grid_wait();
    attention_fast<32>(q, kv16, out, n, heads, hd, np, scale);
}
extern "C" __global__ void attention_fast_d64(const float* q, const unsigned int* kv16, float* out, unsigned int n,
                                              unsigned int heads, unsigned int hd, unsigned int np, float scale) {
    grid_wait();
    attention_fast<64>(q, kv16, out, n, heads, hd, np, scale);
}
extern "C" __global__ void attention_fast_d128(const float* q, const unsigned int* kv16, float* out, unsigned int n,
                                               unsigned int heads, unsigned int hd, unsigned int np, float scale) {
    grid_wait();
    attention_fast<128>(q, kv16, out, n, heads, hd, np, scale);
}
