// attention_f32: non-causal multi-head attention, q, k, v [n, heads*hd] -> out [n, heads*hd],
// softmax(q.k^T * scale) v per head.
//
// Naive and obviously correct, not fast: one block (ATT_THREADS threads) per (query, head),
// blockIdx.x = query, blockIdx.y = head. Keys are visited in chunks of ATT_THREADS (one key per
// thread: a full hd-long dot product), with an online softmax (running max m and denominator l;
// the accumulator is rescaled by exp(m_old - m_new) when the max grows). Dynamic shared memory:
// q [hd] then acc [hd] (2*hd floats); each thread owns the output dims d = tid, tid + ATT_THREADS, ...

#define ATT_THREADS 128

extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, float* out,
                                         unsigned int n, unsigned int heads, unsigned int hd, float scale) {
    extern __shared__ float smem[];
    float* qs = smem;       // [hd]
    float* acc = smem + hd; // [hd]
    __shared__ float p[ATT_THREADS];
    __shared__ float red[ATT_THREADS / 32];

    const unsigned int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const u64 cols = (u64)heads * hd;
    const u64 head_off = (u64)h * hd;
    for (unsigned int d = tid; d < hd; d += ATT_THREADS) {
        qs[d] = q[(u64)i * cols + head_off + d];
        acc[d] = 0.0f;
    }
    __syncthreads();

    float m = NEG_INF; // running max (same value in every thread)
    float l = 0.0f;    // running denominator
    for (unsigned int j0 = 0; j0 < n; j0 += ATT_THREADS) {
        const unsigned int j = j0 + tid;
        float s = NEG_INF;
        if (j < n) {
            const float* kj = k + (u64)j * cols + head_off;
            float dot = 0.0f;
            for (unsigned int d = 0; d < hd; ++d) dot = fmaf(qs[d], kj[d], dot);
            s = dot * scale;
        }
        const float m_new = fmaxf(m, block_max(s, red)); // finite: key j0 exists
        const float alpha = expf(m - m_new);              // 0 on the first chunk (m = -inf)
        const float e = (j < n) ? expf(s - m_new) : 0.0f;
        p[tid] = e;
        l = l * alpha + block_sum(e, red); // block_sum's barriers also publish p[]
        const unsigned int cnt = (n - j0 < ATT_THREADS) ? n - j0 : ATT_THREADS;
        for (unsigned int d = tid; d < hd; d += ATT_THREADS) {
            float a = acc[d] * alpha;
            const float* vd = v + (u64)j0 * cols + head_off + d;
            for (unsigned int t = 0; t < cnt; ++t) a = fmaf(p[t], vd[(u64)t * cols], a);
            acc[d] = a;
        }
        m = m_new;
        __syncthreads(); // p[] is rewritten by the next chunk
    }
    const float inv = 1.0f / l;
    for (unsigned int d = tid; d < hd; d += ATT_THREADS) out[(u64)i * cols + head_off + d] = acc[d] * inv;
}
