// Language-model attention side (language.md §2.1-2.6): sink_attention, indexer_scores,
// compress_pool, grouped_linear. Semantics: the `Backend` trait docs and the CPU lane
// (src/backend/cpu/lm.rs), whose float order these kernels follow where it is cheap.

// ---- sink_attention ------------------------------------------------------------------------
// q [n, heads*hd], kv [m, hd] raw keys, window i32 [n, 2] (inclusive lo..=hi, lo > hi: none),
// comp [c, hd] with comp_idx i32 [n, kk] (-1 = empty slot), sinks [heads] -> out [n, heads*hd].
// K = V (one shared latent row per key); logits q.k * scale; the sink logit joins the softmax
// denominator but has no value.
//
// One block (SA_THREADS threads) per (query, head): blockIdx.x = query, blockIdx.y = head. The
// keys of a query are numbered t = 0 .. nwin + kk - 1: the window rows lo + t first, then the
// compressed slots t - nwin (skipped when -1), the CPU lane's order. Keys are visited in chunks
// of SA_THREADS (one key per thread, a full hd-long dot product) with an online softmax (running
// max m and denominator l, the accumulator rescaled by exp(m_old - m_new)); the sink is folded in
// at the end. A query that sees no key gets zeros (the CPU lane's result, whatever the sink).
// A window outside 0..m or an index outside -1..c (the CPU lane's errors) makes the head NaN.
// Dynamic shared memory: q [hd] then acc [hd]; thread tid owns output dims tid, tid+SA_THREADS..

#define SA_THREADS 128

extern "C" __global__ void sink_attention_f32(const float* q, const float* kv, const int* window,
                                              const float* comp, const int* comp_idx, const float* sinks,
                                              float* out, unsigned int n, unsigned int heads, unsigned int hd,
                                              unsigned int m, unsigned int kk, unsigned int c_rows,
                                              float scale) {
    extern __shared__ float smem[];
    float* qs = smem;       // [hd]
    float* acc = smem + hd; // [hd]
    __shared__ float p[SA_THREADS];
    __shared__ const float* krow[SA_THREADS];
    __shared__ float red[SA_THREADS / 32];

    const unsigned int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const u64 cols = (u64)heads * hd;
    float* o = out + (u64)i * cols + (u64)h * hd;
    const int lo = window[2 * (u64)i], hi = window[2 * (u64)i + 1];
    const int* idx = comp_idx + (u64)i * kk;

    // operand check (every thread sees the same window; the slots are split over the block)
    float bad = (lo <= hi && (lo < 0 || (unsigned int)hi >= m)) ? 1.0f : 0.0f;
    for (unsigned int s = tid; s < kk; s += SA_THREADS) {
        const int e = idx[s];
        if (e < -1 || (e >= 0 && (unsigned int)e >= c_rows)) bad = 1.0f;
    }
    if (block_max(bad, red) > 0.0f) {
        for (unsigned int d = tid; d < hd; d += SA_THREADS) o[d] = QUIET_NAN;
        return;
    }

    for (unsigned int d = tid; d < hd; d += SA_THREADS) {
        qs[d] = q[(u64)i * cols + (u64)h * hd + d];
        acc[d] = 0.0f;
    }
    const unsigned int nwin = lo <= hi ? (unsigned int)(hi - lo) + 1u : 0u;
    const unsigned int nkeys = nwin + kk;
    __syncthreads();

    float mx = NEG_INF; // running max over the keys seen (same value in every thread)
    float l = 0.0f;     // running denominator (0 while no key was seen)
    for (unsigned int t0 = 0; t0 < nkeys; t0 += SA_THREADS) {
        const unsigned int t = t0 + tid;
        const float* kr = 0;
        if (t < nwin) {
            kr = kv + ((u64)lo + t) * hd;
        } else if (t < nkeys) {
            const int e = idx[t - nwin];
            if (e >= 0) kr = comp + (u64)e * hd;
        }
        float s = NEG_INF;
        if (kr) {
            float dot = 0.0f;
            for (unsigned int d = 0; d < hd; ++d) dot += qs[d] * kr[d];
            s = dot * scale;
        }
        krow[tid] = kr;
        const float m_new = fmaxf(mx, block_max(s, red));
        // -inf while no key was seen: keep alpha finite (acc and l are 0 then anyway)
        const float alpha = (m_new == NEG_INF) ? 1.0f : expf(mx - m_new);
        const float e = kr ? expf(s - m_new) : 0.0f;
        p[tid] = e;
        l = l * alpha + block_sum(e, red); // block_sum's barriers also publish p[] and krow[]
        const unsigned int cnt = (nkeys - t0 < SA_THREADS) ? nkeys - t0 : SA_THREADS;
        for (unsigned int d = tid; d < hd; d += SA_THREADS) {
            float a = acc[d] * alpha;
            for (unsigned int u = 0; u < cnt; ++u)
                if (krow[u]) a += p[u] * krow[u][d];
            acc[d] = a;
        }
        mx = m_new;
        __syncthreads(); // p[] and krow[] are rewritten by the next chunk
    }
    if (l == 0.0f) { // no key at all: zeros, as the CPU lane (its output starts at 0)
        for (unsigned int d = tid; d < hd; d += SA_THREADS) o[d] = 0.0f;
        return;
    }
    const float sink = sinks[h];
    const float m_f = fmaxf(mx, sink);
    const float alpha = expf(mx - m_f);
    const float denom = l * alpha + expf(sink - m_f);
    for (unsigned int d = tid; d < hd; d += SA_THREADS) o[d] = acc[d] * alpha / denom;
}

// ---- indexer_scores ------------------------------------------------------------------------
// q [n, heads*hd], k [m, hd], w [n, heads] -> out [n, m]:
// out[i, j] = scale * sum_h w[i, h] * max(q_h . k_j, 0) for j < min((pos0 + i + 1) / ratio, m),
// -inf otherwise. One block (IX_THREADS) per query row i (blockIdx.x; blockIdx.y continues it
// when n exceeds the grid's x limit: i = blockIdx.y * gridDim.x + blockIdx.x); the row's q and w
// sit in dynamic shared memory (heads*hd + heads floats) and the threads stride over the keys j,
// one full score per thread (heads x hd products, the CPU lane's order).

#define IX_THREADS 256

extern "C" __global__ void indexer_scores_f32(const float* q, const float* k, const float* w, float* out,
                                              unsigned int n, unsigned int m, unsigned int heads,
                                              unsigned int hd, float scale, unsigned int pos0,
                                              unsigned int ratio) {
    extern __shared__ float smem[];
    const unsigned int i = blockIdx.y * gridDim.x + blockIdx.x;
    if (i >= n) return; // whole block: no barrier below is skipped by only some threads
    const u64 cols = (u64)heads * hd;
    float* qs = smem;        // [heads*hd]
    float* ws = smem + cols; // [heads]
    for (u64 e = threadIdx.x; e < cols; e += IX_THREADS) qs[e] = q[(u64)i * cols + e];
    for (unsigned int e = threadIdx.x; e < heads; e += IX_THREADS) ws[e] = w[(u64)i * heads + e];
    __syncthreads();
    u64 visible = ((u64)pos0 + i + 1) / ratio;
    if (visible > m) visible = m;
    for (unsigned int j = threadIdx.x; j < m; j += IX_THREADS) {
        float r = NEG_INF;
        if (j < visible) {
            const float* kj = k + (u64)j * hd;
            float s = 0.0f;
            for (unsigned int hh = 0; hh < heads; ++hh) {
                const float* qh = qs + (u64)hh * hd;
                float dot = 0.0f;
                for (unsigned int d = 0; d < hd; ++d) dot += qh[d] * kj[d];
                s += ws[hh] * fmaxf(dot, 0.0f);
            }
            r = s * scale;
        }
        out[(u64)i * m + j] = r;
    }
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

extern "C" __global__ void compress_pool_f32(const float* kv, const float* gate, const float* ape, float* out,
                                             unsigned int total, unsigned int d, unsigned int w,
                                             unsigned int ratio, unsigned int overlap) {
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

// ---- grouped_linear_{f32,bf16,f16} ----------------------------------------------------------
// x [n, g*k], W [g*r, k] (storage format, decoded in the kernel) -> y [n, g*r]; group j maps
// columns j*k .. (j+1)*k of x through rows j*r .. (j+1)*r of W. One GEMM tile of one group per
// block (common.cuh's gemm_tile): block GEMM_THREADS, grid (g * tiles_r, ceil(n / GEMM_BM)) with
// tiles_r = ceil(r / GEMM_BN); blockIdx.x = group * tiles_r + tile of the group's r outputs.

// The group's column slice of x and row slice of W.
struct GroupedOperands {
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
    const GroupedOperands op{x, y, (u64)groups * k, (u64)groups * r, (u64)g * k, (u64)g * r, k, r};
    gemm_tile<FMT>(op, w, n, r, k, blockIdx.y * GEMM_BM, tile * GEMM_BN);
}

extern "C" __global__ void grouped_linear_f32(const float* x, const float* w, float* y, unsigned int n,
                                              unsigned int k, unsigned int r, unsigned int groups,
                                              unsigned int tiles_r) {
    grouped_tiled<0>(x, w, y, n, k, r, groups, tiles_r);
}

extern "C" __global__ void grouped_linear_bf16(const float* x, const unsigned short* w, float* y, unsigned int n,
                                               unsigned int k, unsigned int r, unsigned int groups,
                                               unsigned int tiles_r) {
    grouped_tiled<1>(x, w, y, n, k, r, groups, tiles_r);
}

extern "C" __global__ void grouped_linear_f16(const float* x, const unsigned short* w, float* y, unsigned int n,
                                              unsigned int k, unsigned int r, unsigned int groups,
                                              unsigned int tiles_r) {
    grouped_tiled<2>(x, w, y, n, k, r, groups, tiles_r);
}
