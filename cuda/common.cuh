// Shared prelude of every kernel file (prepended by src/backend/cuda/mod.rs before NVRTC runs;
// NVRTC gets no include paths, so nothing here needs a header).
//
// Conventions: tensors are row-major f32 (index tensors i32); sizes arrive as `unsigned int`
// (the host checks they fit) and flat indices are computed in 64 bits (`u64`). 1-D kernels use
// grid-stride loops, so any grid size is correct.

typedef unsigned long long u64;

#define NEG_INF __uint_as_float(0xff800000u)
#define QUIET_NAN __uint_as_float(0x7fc00000u)

// First flat index of this thread and the grid-wide stride, for grid-stride loops.
__device__ __forceinline__ u64 flat_index() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ u64 flat_stride() {
    return (u64)blockDim.x * gridDim.x;
}

// Sum of `v` over the block; every thread gets the total. blockDim.x must be a multiple of 32 and
// `red` must hold blockDim.x / 32 floats. The per-warp partials are added in warp order by every
// thread, so the result is the same in every thread. Safe to call repeatedly with the same `red`.
__device__ __forceinline__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int nw = blockDim.x >> 5;
    __syncthreads(); // earlier readers of red[] are done
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (unsigned int i = 0; i < nw; ++i) t += red[i];
    return t;
}

// Maximum of `v` over the block (same contract as block_sum).
__device__ __forceinline__ float block_max(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = red[0];
    for (unsigned int i = 1; i < nw; ++i) t = fmaxf(t, red[i]);
    return t;
}

// Weight decoding (linear, grouped_linear, moe): f32 as is, bf16 = the upper 16 bits of an f32,
// f16 by an exact integer decode (subnormals, inf and NaN included; no cuda_fp16.h needed).
__device__ __forceinline__ float f16_to_f32(unsigned int h) {
    const unsigned int sign = (h & 0x8000u) << 16;
    const unsigned int exp = (h >> 10) & 0x1fu;
    const unsigned int man = h & 0x3ffu;
    if (exp == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (man << 13)); // inf, NaN
    if (exp != 0) return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
    const float f = (float)man * 5.9604644775390625e-8f; // subnormal (or zero): man * 2^-24, exact
    return sign ? -f : f;
}

// FMT: 0 = f32, 1 = bf16, 2 = f16.
template <int FMT>
__device__ __forceinline__ float load_w(const void* w, u64 idx) {
    if (FMT == 0) return ((const float*)w)[idx];
    const unsigned int bits = ((const unsigned short*)w)[idx];
    if (FMT == 1) return __uint_as_float(bits << 16);
    return f16_to_f32(bits);
}

// ---- flash-attention tiles (cuda/attention.cu, cuda/lm_attention.cu) -----------------------
// A block holds R query rows (queries of one head, or heads of one query) and streams the keys
// in chunks of C through shared memory: scores S = rows . keys^T * scale, an online softmax per
// row (running max m and denominator l; a -inf score weighs 0), acc = acc * alpha + P . V.
// Rows, keys and acc sit in shared memory with row stride fa_stride(hd) floats (a multiple of 4
// for 16-byte loads; 4 more than a multiple of 8 to spread the rows of a warp over the banks),
// columns hd .. 4*ceil(hd/4) zero. T = blockDim.x threads; R a multiple of 4, C of 2.

// Four floats loaded or stored as one 16-byte access (no vector-type header under NVRTC).
struct alignas(16) fa_f4 {
    float x, y, z, w;
};

__device__ __forceinline__ unsigned int fa_stride(unsigned int hd) {
    const unsigned int s = (hd + 3u) & ~3u;
    return (s % 8u == 0u) ? s + 4u : s;
}

// One warp copies a row of hd floats from global memory (src = 0: a missing key, zeros) into dst
// [4*nvec], zero-padded; lane = threadIdx.x % 32.
__device__ __forceinline__ void fa_stage_row(float* dst, const float* src, unsigned int hd, unsigned int nvec,
                                             unsigned int lane) {
    for (unsigned int d = lane; d < 4u * nvec; d += 32u) dst[d] = (src && d < hd) ? src[d] : 0.0f;
}

// S[r*C + c] = scale * rows[r] . keys[c] over nvec float4s. Thread = (row group of 4, key pair
// c, c + C/2, DSPLIT-way split of the float4s); the DSPLIT partials (adjacent lanes) are summed
// with shuffles. Every thread of the block must call it (the shuffles).
template <int R, int C, int T>
__device__ __forceinline__ void fa_scores(const float* rows, const float* keys, unsigned int ld, unsigned int nvec,
                                          float scale, float* S) {
    constexpr int GROUPS = (R / 4) * (C / 2);
    constexpr int DSPLIT = T / GROUPS;
    static_assert(R % 4 == 0 && C % 2 == 0 && GROUPS * DSPLIT == T && DSPLIT >= 1 && DSPLIT <= 32 &&
                      (DSPLIT & (DSPLIT - 1)) == 0,
                  "fa_scores: T must be (R/4)*(C/2) times a power of two up to 32");
    const unsigned int tid = threadIdx.x;
    const unsigned int j = tid % DSPLIT, grp = tid / DSPLIT;
    const unsigned int c = grp % (C / 2), rg = grp / (C / 2);
    const float* k0 = keys + (u64)c * ld;
    const float* k1 = keys + (u64)(c + C / 2) * ld;
    const float* r0 = rows + (u64)(4 * rg) * ld;
    float dot[4][2];
    for (int a = 0; a < 4; ++a) dot[a][0] = dot[a][1] = 0.0f;
    for (unsigned int v = j; v < nvec; v += DSPLIT) {
        const fa_f4 ka = *(const fa_f4*)(k0 + 4 * v), kb = *(const fa_f4*)(k1 + 4 * v);
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const fa_f4 q = *(const fa_f4*)(r0 + (u64)a * ld + 4 * v);
            dot[a][0] = fmaf(q.w, ka.w, fmaf(q.z, ka.z, fmaf(q.y, ka.y, fmaf(q.x, ka.x, dot[a][0]))));
            dot[a][1] = fmaf(q.w, kb.w, fmaf(q.z, kb.z, fmaf(q.y, kb.y, fmaf(q.x, kb.x, dot[a][1]))));
        }
    }
#pragma unroll
    for (int o = DSPLIT / 2; o > 0; o >>= 1)
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            dot[a][0] += __shfl_xor_sync(0xffffffffu, dot[a][0], o);
            dot[a][1] += __shfl_xor_sync(0xffffffffu, dot[a][1], o);
        }
    if (j == 0)
        for (int a = 0; a < 4; ++a) {
            S[(4 * rg + a) * C + c] = dot[a][0] * scale;
            S[(4 * rg + a) * C + c + C / 2] = dot[a][1] * scale;
        }
}

// Online-softmax step over one chunk: row r = threadIdx.x / (T/R) (its T/R adjacent threads
// take C/(T/R) keys each); m, l are the row's running max and denominator (the same in each of
// its threads). Key c exists when bit c of `present` is set (C <= 32); a missing key scores -inf.
// Writes PT[c*R + r] = exp(S[r][c] - m_new) (0 for a -inf score) and alpha[r] =
// exp(m_old - m_new) (1 while the row has seen only -inf). Every thread calls it.
template <int R, int C, int T>
__device__ __forceinline__ void fa_softmax(const float* S, unsigned int present, float* PT, float* alpha, float& m,
                                           float& l) {
    constexpr int TPR = T / R, PER = C / TPR;
    static_assert(TPR * R == T && PER * TPR == C && TPR <= 32 && (TPR & (TPR - 1)) == 0,
                  "fa_softmax: T/R must be a power of two up to 32 dividing C");
    const unsigned int r = threadIdx.x / TPR, part = threadIdx.x % TPR;
    static_assert(C <= 32, "fa_softmax: the present mask has 32 bits");
    float s[PER];
    float mx = NEG_INF;
    for (int u = 0; u < PER; ++u) {
        const unsigned int c = part * PER + u;
        s[u] = ((present >> c) & 1u) ? S[r * C + c] : NEG_INF;
        mx = fmaxf(mx, s[u]);
    }
    for (int o = TPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m, mx);
    const float a = (m_new == NEG_INF) ? 1.0f : expf(m - m_new);
    float sum = 0.0f;
    for (int u = 0; u < PER; ++u) {
        const float p = (s[u] == NEG_INF) ? 0.0f : expf(s[u] - m_new);
        PT[(part * PER + u) * R + r] = p;
        sum += p;
    }
    for (int o = TPR / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    l = l * a + sum;
    m = m_new;
    if (part == 0) alpha[r] = a;
}

// acc[r][d] = acc[r][d] * alpha[r] + sum_c PT[c][r] * V[c][d] for r < R and the nvec float4s
// of d; a thread takes tiles of 4 rows x 4 dims (tile = tid, tid + T, ...).
template <int R, int C, int T>
__device__ __forceinline__ void fa_accumulate(const float* PT, const float* alpha, const float* V, unsigned int ld,
                                              unsigned int nvec, float* acc) {
    const unsigned int tiles = (R / 4) * nvec;
    for (unsigned int t = threadIdx.x; t < tiles; t += T) {
        const unsigned int v = t % nvec, rg = t / nvec;
        fa_f4 o[4];
        for (int a = 0; a < 4; ++a) {
            o[a] = *(const fa_f4*)(acc + (u64)(4 * rg + a) * ld + 4 * v);
            const float al = alpha[4 * rg + a];
            o[a].x *= al, o[a].y *= al, o[a].z *= al, o[a].w *= al;
        }
        for (int c = 0; c < C; ++c) {
            const fa_f4 x = *(const fa_f4*)(V + (u64)c * ld + 4 * v);
            const fa_f4 p = *(const fa_f4*)(PT + c * R + 4 * rg);
            const float pa[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
            for (int a = 0; a < 4; ++a) {
                o[a].x = fmaf(pa[a], x.x, o[a].x);
                o[a].y = fmaf(pa[a], x.y, o[a].y);
                o[a].z = fmaf(pa[a], x.z, o[a].z);
                o[a].w = fmaf(pa[a], x.w, o[a].w);
            }
        }
        for (int a = 0; a < 4; ++a) *(fa_f4*)(acc + (u64)(4 * rg + a) * ld + 4 * v) = o[a];
    }
}
