// Language-model attention side (language.md §2.1-2.6): sink_attention, indexer_scores,
// compress_pool, grouped_linear. Semantics: the `Backend` trait docs and the CPU lane
// (src/backend/cpu/lm.rs), whose float order these kernels follow where it is cheap.

// ---- sink_attention ------------------------------------------------------------------------
// q [n, heads*hd], kv [m, hd] raw keys, window i32 [n, 2] (inclusive lo..=hi, lo > hi: none),
// comp [c, hd] with comp_idx i32 [n, kk] (-1 = empty slot), sinks [heads] -> out [n, heads*hd].
// K = V (one shared latent row per key); logits q.k * scale; the sink logit joins the softmax
// denominator but has no value.
//
// Flash attention over the heads of one query (the tile helpers of common.cuh): every head of a
// query sees the same keys, so a block takes SA_HEADS heads of one query (blockIdx.x = query,
// blockIdx.y = head group) and stages each chunk of SA_KEYS keys in shared memory once for all of
// them. The keys of a query are numbered t = 0 .. nwin + kk - 1: the window rows lo + t first,
// then the compressed slots t - nwin (missing when -1), the CPU lane's order. A query that sees
// no key gets zeros (the CPU lane's result, whatever the sink). A window outside 0..m or an index
// outside -1..c (the CPU lane's errors) makes the query's heads NaN.
//
// Split keys (flash-decoding, when queries x head groups alone do not fill the GPU): with
// gridDim.z = splits > 1, block z takes its share of the query's key chunks and writes its
// unnormalised state to part [n, heads, splits, 2 + hd] = (running max m, denominator l,
// acc [hd]) (m = NaN: bad operands); sink_attention_merge_f32 combines the splits and folds in the
// sink. With one split the block folds the sink in itself and writes out.
//
// Dynamic shared memory (floats, ld = fa_stride(hd)): q [SA_HEADS][ld], keys [SA_KEYS][ld], acc
// [SA_HEADS][ld], S [SA_HEADS][SA_KEYS], P^T [SA_KEYS][SA_HEADS], alpha [SA_HEADS], factor
// [SA_HEADS], present [SA_KEYS] (the host mirrors the size).

#define SA_THREADS 256
#define SA_HEADS 16
#define SA_KEYS 16

BASE_KERNEL void sink_attention_f32(const float* q, const float* kv, const int* window,
                                    const float* comp, const int* comp_idx, const float* sinks,
                                    float* out, float* part, unsigned int n, unsigned int heads,
                                    unsigned int hd, unsigned int m, unsigned int kk,
                                    unsigned int c_rows, float scale) {
    grid_wait();
    extern __shared__ float smem[];
    const unsigned int ld = fa_stride(hd), nvec = (hd + 3u) / 4u;
    float* qs = smem;                         // [SA_HEADS][ld]
    float* ks = qs + SA_HEADS * ld;           // [SA_KEYS][ld]
    float* acc = ks + SA_KEYS * ld;           // [SA_HEADS][ld]
    float* S = acc + SA_HEADS * ld;           // [SA_HEADS][SA_KEYS]
    float* PT = S + SA_HEADS * SA_KEYS;       // [SA_KEYS][SA_HEADS]
    float* alpha = PT + SA_KEYS * SA_HEADS;   // [SA_HEADS]
    float* factor = alpha + SA_HEADS;         // [SA_HEADS]
    float* present = factor + SA_HEADS;       // [SA_KEYS]: 1 where the chunk's key exists
    __shared__ float red[SA_THREADS / 32];

    const unsigned int i = blockIdx.x, h0 = blockIdx.y * SA_HEADS, split = blockIdx.z, splits = gridDim.z;
    const unsigned int tid = threadIdx.x, lane = tid % 32u, warp = tid / 32u, warps = SA_THREADS / 32;
    const unsigned int nh = (heads - h0 < SA_HEADS) ? heads - h0 : SA_HEADS; // heads of this block
    const u64 cols = (u64)heads * hd;
    const int lo = window[2 * (u64)i], hi = window[2 * (u64)i + 1];
    const int* idx = comp_idx + (u64)i * kk;
    // this block's (query, head) state rows in part: ((i * heads + h) * splits + split) * (2 + hd)
    const u64 part_row = (u64)i * heads * splits + split;

    // operand check (every thread sees the same window; the slots are split over the block)
    float bad = (lo <= hi && (lo < 0 || (unsigned int)hi >= m)) ? 1.0f : 0.0f;
    for (unsigned int s = tid; s < kk; s += SA_THREADS) {
        const int e = idx[s];
        if (e < -1 || (e >= 0 && (unsigned int)e >= c_rows)) bad = 1.0f;
    }
    if (block_max(bad, red) > 0.0f) {
        for (unsigned int e = tid; e < nh * hd; e += SA_THREADS) {
            const unsigned int g = e / hd, d = e % hd;
            if (splits == 1) out[(u64)i * cols + (u64)(h0 + g) * hd + d] = QUIET_NAN;
            else if (d == 0) part[(part_row + (u64)(h0 + g) * splits) * (2u + hd)] = QUIET_NAN;
        }
        return;
    }

    for (unsigned int g = warp; g < SA_HEADS; g += warps) {
        fa_stage_row(qs + g * ld, g < nh ? q + (u64)i * cols + (u64)(h0 + g) * hd : 0, hd, nvec, lane);
        fa_stage_row(acc + g * ld, 0, hd, nvec, lane);
    }
    const unsigned int nwin = lo <= hi ? (unsigned int)(hi - lo) + 1u : 0u;
    const unsigned int nkeys = nwin + kk;
    // this split's chunks: an even share of the query's, chunk-aligned
    const unsigned int chunks = (nkeys + SA_KEYS - 1) / SA_KEYS;
    const unsigned int per_split = (chunks + splits - 1) / splits;
    const unsigned int t_begin = split * per_split * SA_KEYS;
    const unsigned int t_end_chunks = (split + 1) * per_split * SA_KEYS;
    const unsigned int t_end = t_end_chunks < nkeys ? t_end_chunks : nkeys;

    float mx = NEG_INF, l = 0.0f; // running max and denominator of this thread's softmax row (head)
    for (unsigned int t0 = t_begin; t0 < t_end; t0 += SA_KEYS) {
        __syncthreads(); // the previous chunk's keys, S, P^T are consumed (and q, acc staged)
        for (unsigned int r = warp; r < SA_KEYS; r += warps) {
            const unsigned int t = t0 + r;
            const float* row = 0; // missing: past this split's keys, or an empty slot
            if (t >= t_end) {
            } else if (t < nwin) {
                row = kv + ((u64)lo + t) * hd;
            } else {
                const int e = idx[t - nwin];
                if (e >= 0) row = comp + (u64)e * hd;
            }
            fa_stage_row(ks + r * ld, row, hd, nvec, lane);
            if (lane == 0) present[r] = row ? 1.0f : 0.0f;
        }
        __syncthreads();
        fa_scores<SA_HEADS, SA_KEYS, SA_THREADS>(qs, ks, ld, nvec, scale, S);
        unsigned int mask = 0;
        for (unsigned int r = 0; r < SA_KEYS; ++r) mask |= (present[r] != 0.0f ? 1u : 0u) << r;
        __syncthreads();
        fa_softmax<SA_HEADS, SA_KEYS, SA_THREADS>(S, mask, PT, alpha, mx, l);
        __syncthreads();
        fa_accumulate<SA_HEADS, SA_KEYS, SA_THREADS>(PT, alpha, ks, ld, nvec, acc);
    }

    // the head of this thread's softmax row, and the first of that row's threads
    const unsigned int g = tid / (SA_THREADS / SA_HEADS);
    const bool row_leader = tid % (SA_THREADS / SA_HEADS) == 0;
    if (splits > 1) {
        if (row_leader && g < nh) {
            float* st = part + (part_row + (u64)(h0 + g) * splits) * (2u + hd);
            st[0] = mx;
            st[1] = l;
        }
        __syncthreads();
        for (unsigned int e = tid; e < nh * hd; e += SA_THREADS) {
            const unsigned int gg = e / hd, d = e % hd;
            part[(part_row + (u64)(h0 + gg) * splits) * (2u + hd) + 2u + d] = acc[gg * ld + d];
        }
        return;
    }
    if (row_leader && g < nh) {
        // no key at all: zeros, as the CPU lane (its output starts at 0)
        const float sink = sinks[h0 + g];
        const float m_f = fmaxf(mx, sink);
        const float a = expf(mx - m_f);
        factor[g] = (l == 0.0f) ? 0.0f : a / (l * a + expf(sink - m_f));
    }
    __syncthreads();
    for (unsigned int e = tid; e < nh * hd; e += SA_THREADS) {
        const unsigned int gg = e / hd, d = e % hd;
        out[(u64)i * cols + (u64)(h0 + gg) * hd + d] = acc[gg * ld + d] * factor[gg];
    }
}

// part [n, heads, splits, 2 + hd] (sink_attention_f32's split states), sinks [heads] -> out
// [n, heads*hd]: per (query, head) M = max_s m_s, L = sum_s l_s e^(m_s - M), O = sum_s acc_s
// e^(m_s - M), then the sink folded in as in the one-split case; no key in any split: zeros; a
// NaN m (bad operands): NaN. 1-D grid-stride, one thread per output element x = (i*heads + h)*hd + d.
BASE_KERNEL void sink_attention_merge_f32(const float* part, const float* sinks, float* out,
                                          unsigned int total, unsigned int heads, unsigned int hd,
                                          unsigned int splits) {
    grid_wait();
    for (u64 x = flat_index(); x < total; x += flat_stride()) {
        const u64 ih = x / hd;
        const unsigned int d = (unsigned int)(x % hd), h = (unsigned int)(ih % heads);
        const float* st = part + ih * splits * (2u + hd);
        float big = NEG_INF;
        bool bad = false;
        for (unsigned int s = 0; s < splits; ++s) {
            const float ms = st[(u64)s * (2u + hd)];
            bad = bad || ms != ms;
            big = fmaxf(big, ms);
        }
        float l = 0.0f, o = 0.0f;
        for (unsigned int s = 0; s < splits; ++s) {
            const float* sp = st + (u64)s * (2u + hd);
            if (sp[1] == 0.0f) continue; // a split without keys (its m may be -inf)
            const float w = expf(sp[0] - big);
            l = fmaf(sp[1], w, l);
            o = fmaf(sp[2 + d], w, o);
        }
        float r;
        if (bad) {
            r = QUIET_NAN;
        } else if (l == 0.0f) {
            r = 0.0f;
        } else {
            const float sink = sinks[h];
            const float m_f = fmaxf(big, sink);
            const float a = expf(big - m_f);
            r = o * (a / (l * a + expf(sink - m_f)));
        }
        out[x] = r;
    }
}

// ---- sink_attention in fast precision (tensor cores) ---------------------------------------
// sink_attention_f32's contract with f16 operands and f32 softmax, as the ViT's attention_fast_d*
// (cuda/attention.cu; tests/ops.rs derives the bound): q is rounded to f16 here, the keys (which
// are also the values) once by sink_rows_f16, the probabilities before p·v. The suffix is the
// padded head width HDP >= hd (dims hd .. HDP are zeros: q·k is unchanged, the extra output
// columns are never written; q or key elements past ±65504 become ±inf, unlike the f32 kernel).
// sm_80+ and the block's shared memory (below); no key splits: the host takes this kernel in fast
// precision when the queries × head groups fill the GPU (a prefill chunk), sink_attention_f32
// otherwise.
//
// Block (32·SF_WARPS threads) = one query i (blockIdx.x) and SF_HEADS heads from h0 = blockIdx.y ·
// SF_HEADS (the released model's 64 heads in one block: every head of a query sees the same keys,
// so each chunk of keys is staged once for all of them). Warp w takes the 16 heads 16·(w % 4) ..
// and the half (w / 4) of the output dims: it scores its 16 heads against the whole chunk (each
// head's scores are computed by two warps: 1.5× the minimal MMAs, for no exchange between warps
// and 16 × HDP/2 accumulators a warp instead of 16 × HDP), keeps their online softmax in
// registers and reuses the score fragments as p's A fragments (FlashAttention-2). The values' B
// fragments come from the staged keys themselves through ldmatrix.trans.
// The keys of a query, t = 0 .. nwin + kk − 1 (sink_attention_f32's order: the window rows lo + t,
// then the compressed rows comp_idx[t − nwin]), go SF_KEYS a chunk through two shared-memory
// stages with cp.async (the next chunk in flight while the current one multiplies); a missing
// slot (−1) or a key past the last stages zeros and scores −inf, and a chunk without any key is
// skipped. A query without keys gives zeros; bad operands give NaN heads (sink_attention_f32's).
// Dynamic shared memory (words, rows of HDP/2 + 4 words: 16-byte aligned, fragment loads on 32
// banks): q [SF_HEADS] rows, then two stages of SF_KEYS key rows and SF_KEYS present flags (the
// host mirrors the size).
#define SF_WARPS 8
#define SF_HEADS 64
#define SF_KEYS 64

// x [rows, hd] -> y [rows, hdp / 2] words of two f16 (zeros past hd), a thread per word.
BASE_KERNEL void sink_rows_f16(const float* x, unsigned int* y, unsigned int rows, unsigned int hd,
                               unsigned int hdp) {
    grid_wait();
    const unsigned int rw = hdp / 2u;
    for (u64 e = flat_index(); e < (u64)rows * rw; e += flat_stride())
        y[e] = fa_pair16(x + (e / rw) * hd, 2u * (unsigned int)(e % rw), hd);
}

template <int HDP>
__device__ __forceinline__ void sink_attention_fast(const float* q, const unsigned int* kv16, const int* window,
                                                    const unsigned int* comp16, const int* comp_idx,
                                                    const float* sinks, float* out, unsigned int heads,
                                                    unsigned int hd, unsigned int m, unsigned int kk,
                                                    unsigned int c_rows, float scale) {
    constexpr unsigned int RW = HDP / 2 + 4;               // words a staged row (a head's q, a key)
    constexpr unsigned int STAGE = SF_KEYS * RW + SF_KEYS; // words a stage: keys, present flags
    constexpr int KT = HDP / 16;                           // k16 steps of q·kᵀ
    constexpr int NT = SF_KEYS / 8;                        // n8 tiles of a chunk's scores
    constexpr int DT = HDP / 16;                           // n8 tiles of a warp's half of the output
    constexpr unsigned int THREADS = 32 * SF_WARPS;
    static_assert(HDP % 32 == 0 && SF_WARPS == 2 * (SF_HEADS / 16) && SF_KEYS % 16 == 0, "sink_attention_fast");
    extern __shared__ float smem[];
    unsigned int* qs = reinterpret_cast<unsigned int*>(smem); // [SF_HEADS][RW]
    unsigned int* stages = qs + SF_HEADS * RW;                // [2][STAGE]
    __shared__ float red[SF_WARPS];

    const unsigned int i = blockIdx.x, h0 = blockIdx.y * SF_HEADS;
    const unsigned int tid = threadIdx.x, lane = tid % 32u, warp = tid / 32u, g = lane / 4u, t = lane % 4u;
    const unsigned int nh = heads - h0 < SF_HEADS ? heads - h0 : SF_HEADS; // heads of this block
    const u64 cols = (u64)heads * hd;
    const int lo = window[2 * (u64)i], hi = window[2 * (u64)i + 1];
    const int* idx = comp_idx + (u64)i * kk;

    // operand check (sink_attention_f32's)
    float bad = (lo <= hi && (lo < 0 || (unsigned int)hi >= m)) ? 1.0f : 0.0f;
    for (unsigned int s = tid; s < kk; s += THREADS) {
        const int e = idx[s];
        if (e < -1 || (e >= 0 && (unsigned int)e >= c_rows)) bad = 1.0f;
    }
    if (block_max(bad, red) > 0.0f) {
        for (unsigned int e = tid; e < nh * hd; e += THREADS)
            out[(u64)i * cols + (u64)h0 * hd + e] = QUIET_NAN;
        return;
    }

    const unsigned int nwin = lo <= hi ? (unsigned int)(hi - lo) + 1u : 0u, nkeys = nwin + kk;
    const unsigned int chunks = (nkeys + SF_KEYS - 1) / SF_KEYS;
    // the copies of chunk c (keys c·SF_KEYS ..) into stage b as one group; zeros for a missing key
    const auto issue = [&](unsigned int c, unsigned int b) {
        unsigned int* ks = stages + b * STAGE;
        unsigned int* present = ks + SF_KEYS * RW;
        for (unsigned int u = tid; u < SF_KEYS * (HDP / 8); u += THREADS) {
            const unsigned int r = u / (HDP / 8), p = 4u * (u % (HDP / 8)), key = c * SF_KEYS + r;
            const unsigned int* row = 0;
            if (key < nwin) {
                row = kv16 + ((u64)lo + key) * (HDP / 2);
            } else if (key < nkeys) {
                const int e = idx[key - nwin];
                if (e >= 0) row = comp16 + (u64)e * (HDP / 2);
            }
            unsigned int* dst = ks + r * RW + p;
            if (row) fa_cp16(dst, row + p);
            else dst[0] = dst[1] = dst[2] = dst[3] = 0u;
            if (p == 0u) present[r] = row ? 1u : 0u;
        }
        fa_cp_commit();
    };
    if (chunks > 0u) issue(0u, 0u);
    for (unsigned int u = tid; u < SF_HEADS * (HDP / 2); u += THREADS) {
        const unsigned int r = u / (HDP / 2), w = u % (HDP / 2);
        qs[r * RW + w] = fa_pair16(r < nh ? q + (u64)i * cols + (u64)(h0 + r) * hd : 0, 2u * w, hd);
    }
    __syncthreads(); // q and chunk 0's flags are visible (its copies: after the wait below)

    const unsigned int r0 = 16u * (warp % (SF_HEADS / 16u)); // the warp's first head (row of qs)
    const unsigned int w0 = (warp / (SF_HEADS / 16u)) * (HDP / 4); // the word of its first output dim
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
        const unsigned int* ks = stages + (c % 2u) * STAGE;
        const unsigned int* present = ks + SF_KEYS * RW;
        // a barrier (every thread's copies of chunk c are visible) that also tells whether the
        // chunk has no key at all (its flags were written before the previous barrier)
        if (__syncthreads_and(present[tid % SF_KEYS] == 0u)) continue; // nobody reads the stage

        // s[nt]: scores of rows g (0, 1) and g + 8 (2, 3) with keys nt·8 + 2t (+1)
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll 4
        for (int kt = 0; kt < KT; ++kt) {
            const unsigned int* qr = qs + (r0 + g) * RW + kt * 8 + t;
            const unsigned int a[4] = {qr[0], qr[8 * RW], qr[4], qr[8 * RW + 4]};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const unsigned int* kr = ks + (nt * 8u + g) * RW + kt * 8 + t;
                const unsigned int b[2] = {kr[0], kr[4]};
                mma_m16n8k16_f16(s[nt], a, b);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[nt][e] = present[nt * 8u + 2u * t + (e & 1u)] ? s[nt][e] * scale_log2 : NEG_INF;
        fa_online_softmax<NT, DT>(s, o, m0, m1, l0, l1);
        // o += p·v: v = the staged keys, B fragments by ldmatrix.trans, two n8 tiles a load (lane
        // 8j + r gives key row r + 8 (j % 2) of the 16, at dims + 8 (j / 2))
        const unsigned int* vrow = ks + (lane % 8u + 8u * ((lane / 8u) % 2u)) * RW + w0 + 4u * (lane / 16u);
#pragma unroll
        for (int kc = 0; kc < SF_KEYS / 16; ++kc) {
            const unsigned int pa[4] = {f16x2_rn(s[2 * kc][0], s[2 * kc][1]), f16x2_rn(s[2 * kc][2], s[2 * kc][3]),
                                        f16x2_rn(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                        f16x2_rn(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                unsigned int b4[4];
                ldmatrix_x4_trans(b4, vrow + kc * 16u * RW + dp * 8u);
                mma_m16n8k16_f16(o[2 * dp], pa, b4);
                mma_m16n8k16_f16(o[2 * dp + 1], pa, b4 + 2);
            }
        }
        __syncthreads(); // stage c % 2 is consumed before chunk c + 2's copies overwrite it
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    // the sink joins the denominator (in log2 units as the scores); no key at all: zeros
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const unsigned int hh = r0 + g + 8u * half;
        if (hh >= nh) continue;
        const float mx = half ? m1 : m0, l = half ? l1 : l0, sink = sinks[h0 + hh] * 1.4426950408889634f;
        const float m_f = fmaxf(mx, sink), a = exp2f(mx - m_f);
        const float factor = l == 0.0f ? 0.0f : a / (l * a + exp2f(sink - m_f));
        float* y = out + (u64)i * cols + (u64)(h0 + hh) * hd;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            const unsigned int d = 2u * w0 + dt * 8u + 2u * t;
            if (d < hd) y[d] = o[dt][2 * half] * factor;
            if (d + 1u < hd) y[d + 1u] = o[dt][2 * half + 1] * factor;
        }
    }
}

// One kernel a padded head width (written out: the lane's unit test finds each kernel it launches
// by its definition in this file). 256 threads; d512 takes 235-239 registers a thread (its
// accumulators alone are 128; ptxas 12.9, no spills) and 196 KiB of shared memory: one block an
// SM, and only where blocks may have that much (sm_90: the host checks).
BASE_KERNEL void sink_attention_fast_d128(const float* q, const unsigned int* kv16, const int* window,
                                          const unsigned int* comp16, const int* comp_idx, const float* sinks,
                                          float* out, unsigned int heads, unsigned int hd, unsigned int m,
                                          unsigned int kk, unsigned int c_rows, float scale) {
    grid_wait();
    sink_attention_fast<128>(q, kv16, window, comp16, comp_idx, sinks, out, heads, hd, m, kk, c_rows, scale);
}
BASE_KERNEL void sink_attention_fast_d512(const float* q, const unsigned int* kv16, const int* window,
                                          const unsigned int* comp16, const int* comp_idx, const float* sinks,
                                          float* out, unsigned int heads, unsigned int hd, unsigned int m,
                                          unsigned int kk, unsigned int c_rows, float scale) {
    grid_wait();
    sink_attention_fast<512>(q, kv16, window, comp16, comp_idx, sinks, out, heads, hd, m, kk, c_rows, scale);
}

// ---- indexer_scores ------------------------------------------------------------------------
// q [n, heads*hd], k [m, hd], w [n, heads] -> out [n, m]:
// out[i, j] = scale * sum_h w[i, h] * max(q_h . k_j, 0) for j < min((pos0 + i + 1) / ratio, m),
// -inf otherwise.
// For one query this is a small GEMM, Q_i [heads, hd] . K^T [hd, keys], then a weighted sum of
// the relu'd column over the heads. Block (IX_THREADS) = one query i and IX_KEYS keys j0.. (grid
// (ceil(m / IX_KEYS), queries): i = blockIdx.z * gridDim.y + blockIdx.y); a tile of keys nobody
// may see is written as -inf without reading anything (about half of a causal prefill). Heads go
// IX_HEADS at a time: q and k chunks of IX_D dims through shared memory, each thread a 4 x 4
// block of (head, key) dot products summed over d in order; then one thread per key adds the
// heads' w * relu(dot) in head order. Both sums run in the CPU lane's order.

#define IX_THREADS 256
#define IX_HEADS 64
#define IX_KEYS 64
#define IX_D 32

BASE_KERNEL void indexer_scores_f32(const float* q, const float* k, const float* w, float* out,
                                    unsigned int n, unsigned int m, unsigned int heads,
                                    unsigned int hd, float scale, unsigned int pos0,
                                    unsigned int ratio) {
    grid_wait();
    __shared__ float qs[IX_D][IX_HEADS + 1];
    __shared__ float ks[IX_D][IX_KEYS + 1];
    __shared__ float dots[IX_HEADS][IX_KEYS + 1];
    __shared__ float ws[IX_HEADS];
    const unsigned int i = blockIdx.z * gridDim.y + blockIdx.y, j0 = blockIdx.x * IX_KEYS, tid = threadIdx.x;
    if (i >= n) return; // whole block: no barrier below is skipped by only some threads
    u64 visible = ((u64)pos0 + i + 1) / ratio;
    if (visible > m) visible = m;
    float* row = out + (u64)i * m;
    if (j0 >= visible) { // whole block
        for (unsigned int j = j0 + tid; j < m && j < j0 + IX_KEYS; j += IX_THREADS) row[j] = NEG_INF;
        return;
    }
    const u64 cols = (u64)heads * hd;
    const unsigned int tk = tid % 16u, th = tid / 16u; // keys 4tk.., heads 4th.. of the tile
    float sum = 0.0f;                                  // key j0 + tid (tid < IX_KEYS)
    for (unsigned int h0 = 0; h0 < heads; h0 += IX_HEADS) {
        float acc[4][4];
#pragma unroll
        for (unsigned int a = 0; a < 4; ++a)
            for (unsigned int b = 0; b < 4; ++b) acc[a][b] = 0.0f;
        for (unsigned int d0 = 0; d0 < hd; d0 += IX_D) {
            for (unsigned int e = tid; e < IX_HEADS * IX_D; e += IX_THREADS) {
                const unsigned int r = e / IX_D, dd = e % IX_D;
                const bool in_d = d0 + dd < hd;
                qs[dd][r] = (h0 + r < heads && in_d) ? q[(u64)i * cols + (u64)(h0 + r) * hd + d0 + dd] : 0.0f;
                ks[dd][r] = (j0 + r < m && in_d) ? k[(u64)(j0 + r) * hd + d0 + dd] : 0.0f;
            }
            __syncthreads();
            const unsigned int steps = hd - d0 < IX_D ? hd - d0 : IX_D;
            for (unsigned int dd = 0; dd < steps; ++dd) {
                float qa[4], kb[4];
#pragma unroll
                for (unsigned int a = 0; a < 4; ++a) qa[a] = qs[dd][4u * th + a];
#pragma unroll
                for (unsigned int b = 0; b < 4; ++b) kb[b] = ks[dd][4u * tk + b];
#pragma unroll
                for (unsigned int a = 0; a < 4; ++a)
                    for (unsigned int b = 0; b < 4; ++b) acc[a][b] = fmaf(qa[a], kb[b], acc[a][b]);
            }
            __syncthreads();
        }
#pragma unroll
        for (unsigned int a = 0; a < 4; ++a)
            for (unsigned int b = 0; b < 4; ++b) dots[4u * th + a][4u * tk + b] = acc[a][b];
        if (tid < IX_HEADS) ws[tid] = h0 + tid < heads ? w[(u64)i * heads + h0 + tid] : 0.0f;
        __syncthreads();
        if (tid < IX_KEYS) {
            const unsigned int hn = heads - h0 < IX_HEADS ? heads - h0 : IX_HEADS;
            for (unsigned int hh = 0; hh < hn; ++hh) sum += ws[hh] * fmaxf(dots[hh][tid], 0.0f);
        }
        __syncthreads(); // dots and ws are rewritten by the next head tile
    }
    const unsigned int j = j0 + tid;
    if (tid < IX_KEYS && j < m) row[j] = j < visible ? sum * scale : NEG_INF;
}

// ---- compress_pool -------------------------------------------------------------------------
// kv, gate [T, w], ape [ratio, w] -> out [T / ratio, d] (d = w, or w / 2 with overlap).
// Entry i, channel c: softmax over the block's rows t of gate[t] + ape[t mod ratio] (max, then the
// denominator, then sum of exp(l - max) / denom * kv, the CPU lane's order), over rows
// (i-1)*ratio .. i*ratio of the first halves (overlap and i > 0 only), then rows
// i*ratio .. (i+1)*ratio of column off + c (off = d with overlap, else 0).
// 1-D grid-stride, one thread per (entry, channel): x = i*d + c.

__device__ __forceinline__ void cp_row(const float* kv, const float* gate, const float* ape, u64 t, unsigned int col,
                                       unsigned int w, unsigned int ratio, float* v, float* logit) {
    *v = kv[t * w + col];
    *logit = gate[t * w + col] + ape[(t % ratio) * w + col];
}

BASE_KERNEL void compress_pool_f32(const float* kv, const float* gate, const float* ape, float* out,
                                   unsigned int total, unsigned int d, unsigned int w,
                                   unsigned int ratio, unsigned int overlap) {
    grid_wait();
    for (u64 x = flat_index(); x < total; x += flat_stride()) {
        const u64 i = x / d;
        const unsigned int c = (unsigned int)(x % d);
        const unsigned int off = overlap ? d : 0u;
        const u64 prev0 = (overlap && i > 0) ? (i - 1) * ratio : i * ratio; // prev rows: prev0 .. i*ratio
        const u64 cur0 = i * ratio, cur1 = (i + 1) * ratio;
        float v, lg, mx = NEG_INF;
        for (u64 t = prev0; t < cur0; ++t) {
            cp_row(kv, gate, ape, t, c, w, ratio, &v, &lg);
            mx = fmaxf(mx, lg);
        }
        for (u64 t = cur0; t < cur1; ++t) {
            cp_row(kv, gate, ape, t, off + c, w, ratio, &v, &lg);
            mx = fmaxf(mx, lg);
        }
        float denom = 0.0f;
        for (u64 t = prev0; t < cur0; ++t) {
            cp_row(kv, gate, ape, t, c, w, ratio, &v, &lg);
            denom += expf(lg - mx);
        }
        for (u64 t = cur0; t < cur1; ++t) {
            cp_row(kv, gate, ape, t, off + c, w, ratio, &v, &lg);
            denom += expf(lg - mx);
        }
        float acc = 0.0f;
        for (u64 t = prev0; t < cur0; ++t) {
            cp_row(kv, gate, ape, t, c, w, ratio, &v, &lg);
            acc += expf(lg - mx) / denom * v;
        }
        for (u64 t = cur0; t < cur1; ++t) {
            cp_row(kv, gate, ape, t, off + c, w, ratio, &v, &lg);
            acc += expf(lg - mx) / denom * v;
        }
        out[x] = acc;
    }
}

// ---- grouped_linear_{f32,bf16,f16,<block format>} ----------------------------------------------------------
// x [n, g*k], W [g*r, k] (storage format, decoded in the kernel) -> y [n, g*r]; group j maps
// columns j*k .. (j+1)*k of x through rows j*r .. (j+1)*r of W. One GEMM block of one group per
// block (common.cuh's gemm_block): block GEMM_THREADS, grid (g * tiles_r, row tiles) with tiles_r
// the group's column blocks; blockIdx.x = group * tiles_r + column block of the group's r outputs.

// The group's column slice of x and row slice of W.
struct GroupedOperands : ContiguousRows {
    const float* x;
    float* y;
    u64 xcols, ycols; // g*k, g*r
    u64 xcol0, wrow0; // first x column and first W row (= first y column) of the group
    unsigned int k, r;

    __device__ __forceinline__ const float* a_row(unsigned int m) const { return x + (u64)m * xcols + xcol0; }
    __device__ __forceinline__ u64 w_row(unsigned int c) const { return (wrow0 + c) * k; }
    __device__ __forceinline__ void store2(unsigned int m, unsigned int c, float v0, float v1) const {
        float* yr = y + (u64)m * ycols + wrow0;
        yr[c] = v0;
        if (c + 1u < r) yr[c + 1u] = v1;
    }
};

template <int FMT>
__device__ __forceinline__ void grouped_tiled(const float* x, const void* w, float* y, unsigned int n,
                                              unsigned int k, unsigned int r, unsigned int groups,
                                              unsigned int tiles_r) {
    const unsigned int g = blockIdx.x / tiles_r, tile = blockIdx.x % tiles_r;
    const GroupedOperands op{{}, x, y, (u64)groups * k, (u64)groups * r, (u64)g * k, (u64)g * r, k, r};
    gemm_block<FMT>(op, w, n, r, k, n, tile, blockIdx.y);
}

GEMM_KERNEL void GEMM_LAUNCH grouped_linear_f32(const float* x, const float* w, float* y, unsigned int n,
                                    unsigned int k, unsigned int r, unsigned int groups,
                                    unsigned int tiles_r) {
    grid_wait();
    grouped_tiled<0>(x, w, y, n, k, r, groups, tiles_r);
}

GEMM_KERNEL void GEMM_LAUNCH grouped_linear_bf16(const float* x, const unsigned short* w, float* y, unsigned int n,
                                     unsigned int k, unsigned int r, unsigned int groups,
                                     unsigned int tiles_r) {
    grid_wait();
    grouped_tiled<1>(x, w, y, n, k, r, groups, tiles_r);
}

GEMM_KERNEL void GEMM_LAUNCH grouped_linear_f16(const float* x, const unsigned short* w, float* y, unsigned int n,
                                    unsigned int k, unsigned int r, unsigned int groups,
                                    unsigned int tiles_r) {
    grid_wait();
    grouped_tiled<2>(x, w, y, n, k, r, groups, tiles_r);
}

#define GROUPED_LINEAR_BLOCK_KERNEL(SFX, FMT)                                                               \
    extern "C" __global__ void GEMM_LAUNCH grouped_linear_##SFX(const float* x, const void* w, float* y,    \
                                                                unsigned int n, unsigned int k,             \
                                                                unsigned int r, unsigned int groups,        \
                                                                unsigned int tiles_r) { grid_wait();        \
        grouped_tiled<FMT>(x, w, y, n, k, r, groups, tiles_r);                                              \
    }
FOR_EACH_BLOCK_FORMAT(GROUPED_LINEAR_BLOCK_KERNEL)
