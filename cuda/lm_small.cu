// The small language-model ops (src/backend/mod.rs, LM sections, for the exact semantics; each
// kernel mirrors its CPU reference in src/backend/cpu/lm.rs, float operations in the same order).
// Helpers are prefixed `lms_` (the host emulation compiles every file of cuda/ as one unit).
// f32 parameters that go through the lane's 1-D launcher arrive as bit patterns (`*_bits`).
//
// 1-D kernels (grid-stride, one output element per loop step; block 256, any grid):
//   embed_rows_f32:      table [vocab, d] (fmt 0 f32, 1 bf16, 2 f16; embed_rows_<block format> for
//                        the block formats), ids i32 [n] -> out [n, d];
//                        id >= vocab gives a zero row, a negative id a row of NaN (the CPU lane
//                        returns an error; a GPU lane cannot without a host round trip)
//   hc_expand_f32:       x [n, d] -> out [n, hc*d], every stream a copy of the row
//   hc_pre_f32:          X [n, hc*d], w [n, wc] (its first hc columns: wc = hc, or hc_split's
//                        output, whose first hc are pre) -> out [n, d], sum_i w_i X_i (i ascending)
//   hc_post_f32:         X [n, hc*d], f [n, d], split [n, pre hc | post hc | comb hc*hc] (hc_split's
//                        output) -> out [n, hc*d], post_dst f + sum_src comb[src*hc + dst] X_src
//                        (src ascending)
//   hc_head_weights_f32: mix [n, hc], scale [1], base [hc] -> sigmoid(mix*scale + base) + eps
//   rope_tail_f32:       x [n, cols] (heads of hd), inv_freq [rd/2] -> out [n, cols]; one element
//                        per step: the head part is copied, tail pair (2j, 2j+1) rotates by
//                        a = f32(pos0 + row*stride) * inv_freq[j] (minus sin when inverse)
//   rope_tail_at_f32:    rope_tail_f32 with row r at position positions[r] (i32 [n], >= 0, read
//                        as unsigned so that it rounds to float as rope_tail's does)
//   sqrt_softplus_f32:   x [n] -> sqrt(x > 20 ? x : log1p(exp(x)))
//   hash_route_i32:      table i32 [vocab, k], ids i32 [n], fallback i32 [n, k] -> i32 [n, k]
//   route_weights_f32:   scores [n, e], ids i32 [n, k] -> out [n, k], s / (sum_k s + 1e-20) * scale
//                        (an id outside 0..e makes its row NaN; the CPU lane returns an error)
//   swiglu_clamp_f32:    g, u [n, h] -> silu(min(g, limit)) * clamp(u, -limit, limit)  [n, h]
//   hc_split_f32:        a warp per token (32 threads per token, grid-stride over tokens; one
//                        thread of them when hc*hc > 32): mix [n, (2+hc)*hc],
//                        scale [3], base [(2+hc)*hc] -> out [n, pre hc | post hc | comb hc*hc];
//                        Sinkhorn in place in `out`, in the reference's order
// Block kernels:
//   rms_norm_heads_f32:  one block (blockDim multiple of 32) per (row, head) segment of hd
//                        elements, segments grid-strided; x [segs*hd] -> x * rsqrt(mean(x^2)+eps)
//   topk_rows_i32:       one block (LMS_TOPK_THREADS) per row, rows grid-strided; x [n, m] ->
//                        i32 [n, k]: the finite values ranked value descending, then column
//                        ascending; slot s = the column of rank s, -1 past the finite ones
//                        (a bitonic sort in shared memory for short rows, else a radix select
//                        over the row in global memory, then a sort of the selected; see
//                        lms_rank_key)
//   route_experts_f32:   one block (LMS_ROUTE_THREADS) per token row, rows grid-strided: logits
//                        [n, e], bias [kinds, e], kind i32 [n], (hashed) table i32 [vocab, k] and
//                        tok i32 [n] -> ids i32 [n, k], weights [n, k]. The composition
//                        sqrt_softplus, add(bias[kind]), topk_rows, hash_route, route_weights in
//                        one pass: the scores once into shared memory, k rounds of a block argmax
//                        (the topk_rows ranking) over s + bias[kind], then the table row for a
//                        hashed text token, then s[id] / (sum_k s[id] + 1e-20) * scale over slots
//                        in order.
//                        A kind outside 0..kinds gives a NaN bias row and an id outside 0..e a
//                        NaN weight row, as the composition on this lane (gather_rows,
//                        route_weights) does; the CPU lane returns an error

__device__ __forceinline__ float lms_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}

// false for +-inf and NaN (a NaN compares false)
__device__ __forceinline__ bool lms_is_finite(float x) {
    return fabsf(x) <= 3.40282346638528859812e+38f;
}

template <int FMT>
__device__ __forceinline__ void lms_embed_rows(const void* table, const int* ids, float* out, unsigned int n,
                                               unsigned int d, unsigned int vocab) {
    const u64 total = (u64)n * d;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 r = i / d, c = i % d;
        const int id = ids[r];
        float v;
        if (id < 0) {
            v = QUIET_NAN;
        } else if ((unsigned int)id >= vocab) {
            v = 0.0f;
        } else {
            v = load_w<FMT>(table, (u64)id * d + c);
        }
        out[i] = v;
    }
}

BASE_KERNEL void embed_rows_f32(const void* table, const int* ids, float* out, unsigned int n,
                                unsigned int d, unsigned int vocab, unsigned int fmt) {
    grid_wait();
    if (fmt == 0) lms_embed_rows<0>(table, ids, out, n, d, vocab);
    else if (fmt == 1) lms_embed_rows<1>(table, ids, out, n, d, vocab);
    else lms_embed_rows<2>(table, ids, out, n, d, vocab);
}

// embed_rows_<block format>: the same for a block-format table (one value decoded per element).
#define EMBED_ROWS_BLOCK_KERNEL(SFX, FMT)                                                                   \
    extern "C" __global__ void embed_rows_##SFX(const void* table, const int* ids, float* out,              \
                                                unsigned int n, unsigned int d, unsigned int vocab) { grid_wait(); \
        lms_embed_rows<FMT>(table, ids, out, n, d, vocab);                                                  \
    }
FOR_EACH_BLOCK_FORMAT(EMBED_ROWS_BLOCK_KERNEL)

BASE_KERNEL void hc_expand_f32(const float* x, float* out, unsigned int n, unsigned int d,
                               unsigned int hc) {
    grid_wait();
    const u64 total = (u64)n * hc * d;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 row = i / ((u64)hc * d);
        out[i] = x[row * d + i % d];
    }
}

BASE_KERNEL void hc_pre_f32(const float* x, const float* w, float* out, unsigned int n, unsigned int d,
                            unsigned int hc, unsigned int wc) {
    grid_wait();
    const u64 total = (u64)n * d;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 t = i / d, j = i % d;
        float s = 0.0f;
        for (unsigned int k = 0; k < hc; ++k) s += w[t * wc + k] * x[t * hc * d + (u64)k * d + j];
        out[i] = s;
    }
}

// One row of hc_pre_norm_f32 by the whole block: xt [hc*d], wt [>= hc] -> yt [d]; red: block_sum's.
__device__ __forceinline__ void lms_pre_norm_row(const float* xt, const float* wt, const float* weight, float* yt,
                                                 unsigned int d, unsigned int hc, float eps, float* red) {
    float s = 0.0f;
    for (unsigned int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = 0.0f;
        for (unsigned int k = 0; k < hc; ++k) v += wt[k] * xt[(u64)k * d + j];
        yt[j] = v;
        s = fmaf(v, v, s);
    }
    const float inv = 1.0f / sqrtf(block_sum(s, red) / (float)d + eps);
    for (unsigned int j = threadIdx.x; j < d; j += blockDim.x) yt[j] = (yt[j] * inv) * weight[j];
}

// hc_pre_norm_f32: rms_norm(hc_pre(X, w, hc), weight, eps) of every row, X [n, hc*d], w [n, wc]
// (its first hc columns), weight [d] -> out [n, d]. One block per row (the host's row_threads),
// rows grid-strided: the first pass writes the collapsed row (summed over the streams as
// hc_pre_f32 sums it) and its squares, the second scales it in place, each thread rereading only
// the elements it wrote.
BASE_KERNEL void hc_pre_norm_f32(const float* x, const float* w, const float* weight, float* out, unsigned int n,
                                 unsigned int d, unsigned int hc, unsigned int wc, float eps) {
    grid_wait();
    __shared__ float red[32];
    for (unsigned int t = blockIdx.x; t < n; t += gridDim.x)
        lms_pre_norm_row(x + (u64)t * hc * d, w + (u64)t * wc, weight, out + (u64)t * d, d, hc, eps, red);
}

// Stream dst, column j of row t of hc_post's output: post_dst f_j + sum_src comb[src*hc + dst] X_src,j
// (src ascending). hc_post_f32 and hc_post_mix_partials_f32 both take it, so they write the same bits.
__device__ __forceinline__ float lms_post_element(const float* x, const float* f, const float* split, u64 t,
                                                  unsigned int dst, u64 j, unsigned int d, unsigned int hc) {
    const float* post = split + t * (2u + hc) * hc + hc;
    const float* comb = post + hc;
    float s = post[dst] * f[t * d + j];
    for (unsigned int src = 0; src < hc; ++src) s += comb[(u64)src * hc + dst] * x[t * hc * d + (u64)src * d + j];
    return s;
}

BASE_KERNEL void hc_post_f32(const float* x, const float* f, const float* split, float* out, unsigned int n,
                             unsigned int d, unsigned int hc) {
    grid_wait();
    const u64 total = (u64)n * hc * d;
    for (u64 i = flat_index(); i < total; i += flat_stride())
        out[i] = lms_post_element(x, f, split, i / ((u64)hc * d), (unsigned int)((i / d) % hc), i % d, d, hc);
}

BASE_KERNEL void hc_head_weights_f32(const float* mix, const float* scale, const float* base, float* out,
                                     unsigned int total, unsigned int hc, unsigned int eps_bits) {
    grid_wait();
    const float eps = __uint_as_float(eps_bits);
    for (u64 i = flat_index(); i < total; i += flat_stride())
        out[i] = lms_sigmoid(mix[i] * scale[0] + base[i % hc]) + eps;
}

// element i of a rope_tail row at position `pos`: the head part copied, tail pair (2j, 2j+1)
// rotated by +-float(pos) * inv_freq[j]; shared by rope_tail_f32 and rope_tail_at_f32
__device__ __forceinline__ float lms_rotated_tail(const float* x, const float* inv_freq, u64 i, u64 pos,
                                                  unsigned int cols, unsigned int hd, unsigned int rd,
                                                  unsigned int inverse) {
    const unsigned int hc = (unsigned int)((i % cols) % hd); // column inside the head
    if (hc < hd - rd) return x[i];
    const unsigned int t = hc - (hd - rd); // index inside the rotary tail
    const float a = (float)pos * inv_freq[t / 2];
    const float c = cosf(a);
    const float s = inverse ? -sinf(a) : sinf(a);
    if ((t & 1u) == 0u) return x[i] * c - x[i + 1] * s;
    return x[i] * c + x[i - 1] * s;
}

BASE_KERNEL void rope_tail_f32(const float* x, const float* inv_freq, float* out, unsigned int n,
                               unsigned int cols, unsigned int hd, unsigned int rd, unsigned int pos0,
                               unsigned int stride, unsigned int inverse) {
    grid_wait();
    const u64 total = (u64)n * cols;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 row = i / cols;
        out[i] = lms_rotated_tail(x, inv_freq, i, (u64)pos0 + row * stride, cols, hd, rd, inverse);
    }
}

BASE_KERNEL void rope_tail_at_f32(const float* x, const float* inv_freq, const int* positions, float* out,
                                  unsigned int n, unsigned int cols, unsigned int hd, unsigned int rd,
                                  unsigned int inverse) {
    grid_wait();
    const u64 total = (u64)n * cols;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 row = i / cols;
        out[i] = lms_rotated_tail(x, inv_freq, i, (u64)(unsigned int)positions[row], cols, hd, rd, inverse);
    }
}

// rms_norm_rope_f32: x [n, heads*hd] -> each (row, head) segment RMS-normalised as
// rms_norm_heads_f32 (with has_weight, times weight [hd] as rms_norm_f32; one head), then its
// rotary tail rotated forward by positions[row] * inv_freq as rope_tail_at_f32 rotates it. One
// block per segment (the host's row_threads), segments grid-strided: the sum of squares is a block
// reduction, then each thread writes its elements from the normalised element and its pair's.
BASE_KERNEL void rms_norm_rope_f32(const float* x, const float* weight, const float* inv_freq, const int* positions,
                                   float* out, unsigned int segs, unsigned int heads, unsigned int hd,
                                   unsigned int rd, unsigned int has_weight, float eps) {
    grid_wait();
    __shared__ float red[32];
    for (unsigned int seg = blockIdx.x; seg < segs; seg += gridDim.x) {
        const float* xs = x + (u64)seg * hd;
        float* ys = out + (u64)seg * hd;
        const float inv = 1.0f / sqrtf(block_sum_squares(xs, hd, red) / (float)hd + eps);
        const u64 pos = (u64)(unsigned int)positions[seg / heads];
        for (unsigned int c = threadIdx.x; c < hd; c += blockDim.x) {
            const float v = has_weight ? (xs[c] * inv) * weight[c] : xs[c] * inv;
            if (c < hd - rd) {
                ys[c] = v;
                continue;
            }
            const unsigned int t = c - (hd - rd); // index inside the rotary tail
            const unsigned int p = (t & 1u) == 0u ? c + 1u : c - 1u;
            const float vp = has_weight ? (xs[p] * inv) * weight[p] : xs[p] * inv;
            const float a = (float)pos * inv_freq[t / 2];
            const float cs = cosf(a), sn = sinf(a);
            ys[c] = (t & 1u) == 0u ? v * cs - vp * sn : v * cs + vp * sn;
        }
    }
}

// the router score; shared by sqrt_softplus_f32 and route_experts_f32, so both give the same bits
__device__ __forceinline__ float lms_sqrt_softplus(float v) {
    return sqrtf(v > 20.0f ? v : log1pf(expf(v)));
}

BASE_KERNEL void sqrt_softplus_f32(const float* x, float* out, unsigned int total) {
    grid_wait();
    for (u64 i = flat_index(); i < total; i += flat_stride()) out[i] = lms_sqrt_softplus(x[i]);
}

BASE_KERNEL void hash_route_i32(const int* table, const int* ids, const int* fallback, int* out,
                                unsigned int n, unsigned int k, unsigned int vocab) {
    grid_wait();
    const u64 total = (u64)n * k;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const int t = ids[i / k];
        out[i] = (t >= 0 && (unsigned int)t < vocab) ? table[(u64)t * k + i % k] : fallback[i];
    }
}

BASE_KERNEL void route_weights_f32(const float* scores, const int* ids, float* out, unsigned int n,
                                   unsigned int k, unsigned int e, unsigned int scale_bits) {
    grid_wait();
    const float scale = __uint_as_float(scale_bits);
    const u64 total = (u64)n * k;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        const u64 t = i / k;
        const unsigned int me = (unsigned int)(i % k);
        float sum = 0.0f, mine = 0.0f;
        bool bad = false;
        for (unsigned int j = 0; j < k; ++j) {
            const int id = ids[t * k + j];
            if (id < 0 || (unsigned int)id >= e) {
                bad = true;
                continue;
            }
            const float v = scores[t * e + (unsigned int)id];
            sum += v;
            if (j == me) mine = v;
        }
        sum += 1e-20f;
        out[i] = bad ? QUIET_NAN : mine / sum * scale;
    }
}

BASE_KERNEL void swiglu_clamp_f32(const float* gate, const float* up, float* out, unsigned int n,
                                  unsigned int h, unsigned int limit_bits) {
    grid_wait();
    const float lim = __uint_as_float(limit_bits);
    const u64 total = (u64)n * h;
    for (u64 i = flat_index(); i < total; i += flat_stride()) {
        // f32::min ignores a NaN operand (fminf does too); f32::clamp keeps a NaN
        const float g = fminf(gate[i], lim);
        float u = up[i];
        if (u < -lim) u = -lim;
        if (u > lim) u = lim;
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

// One token of hc_split_f32 on one warp (hc * hc <= 32): lane L < hc * hc holds comb entry (src,
// dst) = (L / hc, L % hc). Every normalisation reads its row's or column's entries by shuffles and
// sums them in the reference's order (dst, then src, ascending), so each lane does the arithmetic
// of the one-thread version for its entry and the result is the same, bit for bit; the 20-round
// chain then costs a few shuffles and one division per step rather than hc * hc divisions in a
// row (one thread per token took 25-57 us of a decode step on an H200). Every lane of the warp
// calls every shuffle; only `active` lanes (a token that exists) store.
__device__ __forceinline__ void hc_split_warp(const float* m, const float* scale, const float* base, float* o,
                                              unsigned int hc, unsigned int iters, float eps, bool active) {
    const unsigned int lane = threadIdx.x % 32u, cells = hc * hc;
    const unsigned int cell = lane < cells ? lane : 0u, src = cell / hc, dst = cell % hc;
    if (active && lane < hc) {
        o[lane] = lms_sigmoid(m[lane] * scale[0] + base[lane]) + eps;
        o[hc + lane] = 2.0f * lms_sigmoid(m[hc + lane] * scale[1] + base[hc + lane]);
    }
    // softmax over dst for each src, + eps
    const float v0 = active ? m[2 * hc + cell] * scale[2] + base[2 * hc + cell] : 0.0f;
    float mx = NEG_INF;
    for (unsigned int j = 0; j < hc; ++j) mx = fmaxf(mx, __shfl_sync(0xffffffffu, v0, (int)(src * hc + j)));
    const float ex = expf(v0 - mx);
    float sum = 0.0f;
    for (unsigned int j = 0; j < hc; ++j) sum += __shfl_sync(0xffffffffu, ex, (int)(src * hc + j));
    float v = ex / sum + eps;
    // column (src) normalisation, then iters - 1 rounds of {row (dst), column (src)}
    for (unsigned int it = 0; it < (iters > 0 ? iters : 1u); ++it) {
        if (it > 0) {
            float rs = 0.0f;
            for (unsigned int j = 0; j < hc; ++j) rs += __shfl_sync(0xffffffffu, v, (int)(src * hc + j));
            v /= rs + eps;
        }
        float cs = 0.0f;
        for (unsigned int j = 0; j < hc; ++j) cs += __shfl_sync(0xffffffffu, v, (int)(j * hc + dst));
        v /= cs + eps;
    }
    if (active && lane < cells) o[2 * hc + lane] = v;
}

// One token of hc_split_f32 on one thread, in place in `o` (any hc).
__device__ __forceinline__ void hc_split_thread(const float* m, const float* scale, const float* base, float* o,
                                                unsigned int hc, unsigned int iters, float eps) {
    for (unsigned int i = 0; i < hc; ++i) {
        o[i] = lms_sigmoid(m[i] * scale[0] + base[i]) + eps;
        o[hc + i] = 2.0f * lms_sigmoid(m[hc + i] * scale[1] + base[hc + i]);
    }
    float* c = o + 2 * hc;
    const float* mc = m + 2 * hc;
    const float* bc = base + 2 * hc;
    // softmax over dst for each src, + eps
    for (unsigned int src = 0; src < hc; ++src) {
        float* row = c + (u64)src * hc;
        float mx = NEG_INF;
        for (unsigned int dst = 0; dst < hc; ++dst) {
            const float v = mc[src * hc + dst] * scale[2] + bc[src * hc + dst];
            row[dst] = v;
            mx = fmaxf(mx, v);
        }
        float sum = 0.0f;
        for (unsigned int dst = 0; dst < hc; ++dst) {
            row[dst] = expf(row[dst] - mx);
            sum += row[dst];
        }
        for (unsigned int dst = 0; dst < hc; ++dst) row[dst] = row[dst] / sum + eps;
    }
    // column (src) normalisation, then iters - 1 rounds of {row (dst), column (src)}
    for (unsigned int it = 0; it < (iters > 0 ? iters : 1u); ++it) {
        if (it > 0) {
            for (unsigned int src = 0; src < hc; ++src) {
                float* row = c + (u64)src * hc;
                float sum = 0.0f;
                for (unsigned int dst = 0; dst < hc; ++dst) sum += row[dst];
                sum += eps;
                for (unsigned int dst = 0; dst < hc; ++dst) row[dst] /= sum;
            }
        }
        for (unsigned int dst = 0; dst < hc; ++dst) {
            float sum = 0.0f;
            for (unsigned int src = 0; src < hc; ++src) sum += c[(u64)src * hc + dst];
            sum += eps;
            for (unsigned int src = 0; src < hc; ++src) c[(u64)src * hc + dst] /= sum;
        }
    }
}

// Launched with 32 threads per token (blockDim a multiple of 32): a warp per token when hc * hc
// fits a warp (the released model's hc = 4), else one thread per token.
BASE_KERNEL void hc_split_f32(const float* mix, const float* scale, const float* base, float* out,
                              unsigned int n, unsigned int hc, unsigned int iters, unsigned int eps_bits) {
    grid_wait();
    const float eps = __uint_as_float(eps_bits);
    const u64 w = (u64)(2 + hc) * hc;
    if (hc * hc <= 32u) {
        // every warp of a block runs the same number of rounds; warps past n run with
        // active = false
        const unsigned int warps = blockDim.x / 32u;
        for (u64 t0 = (u64)blockIdx.x * warps; t0 < n; t0 += (u64)gridDim.x * warps) {
            const u64 t = t0 + threadIdx.x / 32u;
            const bool active = t < n;
            const u64 tt = active ? t : 0;
            hc_split_warp(mix + tt * w, scale, base, out + tt * w, hc, iters, eps, active);
        }
    } else {
        for (u64 t = flat_index(); t < n; t += flat_stride()) hc_split_thread(mix + t * w, scale, base, out + t * w, hc, iters, eps);
    }
}

// hc_mix_split: hc_split of the mix (x . mix^T) * rsqrt(mean(x^2) + norm_eps) of every row of the
// residual X [n, k] (the RMS norm's factor taken out of the product), in two kernels: the
// partial sums over column ranges, then a warp or a block per token adds them and splits. The mix is
// (2 + hc) * hc <= LMS_MIX_MAX rows (24 for hc = 4) of f32, bf16 or f16.
#define LMS_MIX_MAX 24
#define LMS_MIX_THREADS 256

// R rows at a time (rows t0 .. t0 + R - 1 of the block's column range): each mix value is loaded
// once for the R rows, so a prefill chunk reads the mix (24 rows of 16 384 f32, 1.5 MiB) a quarter
// as often (at R = 1 every row re-read it: 3.2 GB from L2 for 2 048 rows, 0.58 ms on an H100). Each
// row's sums are its own, in the same order whatever R (a thread's columns in turn, then the
// warps' sums in warp order).
// Row t, column c of X comes from load(t, c): the residual itself, or (hc_post_mix_partials_f32) its
// hc_post computed and stored as it is read; each (t, c) is loaded once.
template <int FMT, unsigned int R, class Load>
__device__ __forceinline__ void lms_mix_partials(Load load, const void* mix, float* part, unsigned int n,
                                                 unsigned int k, unsigned int w, unsigned int splits) {
    __shared__ float red[LMS_MIX_THREADS / 32][R][LMS_MIX_MAX + 1];
    const unsigned int span = (k + splits - 1) / splits, lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
    const unsigned int c0 = blockIdx.x * span, c1 = c0 + span < k ? c0 + span : k;
    for (unsigned int t0 = blockIdx.y * R; t0 < n; t0 += gridDim.y * R) {
        float acc[R][LMS_MIX_MAX + 1];
#pragma unroll
        for (unsigned int r = 0; r < R; ++r)
#pragma unroll
            for (unsigned int o = 0; o <= LMS_MIX_MAX; ++o) acc[r][o] = 0.0f;
        for (unsigned int c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
            float v[R];
#pragma unroll
            for (unsigned int r = 0; r < R; ++r) {
                v[r] = t0 + r < n ? load((u64)(t0 + r), c) : 0.0f;
                acc[r][LMS_MIX_MAX] = fmaf(v[r], v[r], acc[r][LMS_MIX_MAX]);
            }
#pragma unroll
            for (unsigned int o = 0; o < LMS_MIX_MAX; ++o)
                if (o < w) {
                    const float m = load_w<FMT>(mix, (u64)o * k + c);
#pragma unroll
                    for (unsigned int r = 0; r < R; ++r) acc[r][o] = fmaf(m, v[r], acc[r][o]);
                }
        }
        // the block's sums: each warp's by shuffles, then one thread per value over the warps
#pragma unroll
        for (unsigned int r = 0; r < R; ++r)
#pragma unroll
            for (unsigned int o = 0; o <= LMS_MIX_MAX; ++o)
                for (int sh = 16; sh > 0; sh >>= 1) acc[r][o] += __shfl_xor_sync(0xffffffffu, acc[r][o], sh);
        __syncthreads(); // the previous rows' readers of red[] are done
        if (lane == 0)
            for (unsigned int r = 0; r < R; ++r)
                for (unsigned int o = 0; o <= LMS_MIX_MAX; ++o) red[warp][r][o] = acc[r][o];
        __syncthreads();
        // value o <= w of row r: o < w a dot product, o = w the sum of squares (red's last slot)
        for (unsigned int i = threadIdx.x; i < R * (w + 1u); i += blockDim.x) {
            const unsigned int r = i / (w + 1u), o = i % (w + 1u), slot = o < w ? o : LMS_MIX_MAX;
            if (t0 + r >= n) continue;
            float s = 0.0f;
            for (unsigned int j = 0; j < blockDim.x / 32u; ++j) s += red[j][r][slot];
            part[((u64)(t0 + r) * splits + blockIdx.x) * (w + 1) + o] = s;
        }
    }
}

// grid (splits, rows), LMS_MIX_THREADS threads; part [n, splits, w + 1] (w dot products, then
// the sum of squares, of each column range); code 0 f32, 1 bf16, 2 f16
BASE_KERNEL void hc_mix_partials_f32(const float* x, const void* mix, float* part, unsigned int n, unsigned int k,
                                     unsigned int w, unsigned int splits, unsigned int code) {
    grid_wait();
    auto load = [=](u64 t, unsigned int c) { return x[t * k + c]; };
    if (code == 0) lms_mix_partials<0, 1>(load, mix, part, n, k, w, splits);
    else if (code == 1) lms_mix_partials<1, 1>(load, mix, part, n, k, w, splits);
    else lms_mix_partials<2, 1>(load, mix, part, n, k, w, splits);
}

// The same, four rows a block (grid (splits, ⌈rows / 4⌉)): a prefill chunk's.
BASE_KERNEL void hc_mix_partials_rows4_f32(const float* x, const void* mix, float* part, unsigned int n,
                                           unsigned int k, unsigned int w, unsigned int splits, unsigned int code) {
    grid_wait();
    auto load = [=](u64 t, unsigned int c) { return x[t * k + c]; };
    if (code == 0) lms_mix_partials<0, 4>(load, mix, part, n, k, w, splits);
    else if (code == 1) lms_mix_partials<1, 4>(load, mix, part, n, k, w, splits);
    else lms_mix_partials<2, 4>(load, mix, part, n, k, w, splits);
}

// A sublayer's hc_post_f32 and the next sublayer's hc_mix_partials_f32 in one launch (a decode
// step's rows, grid (splits, rows)): each block computes X' = hc_post(X, f, split) over its column
// range, stores it in xout and sums the mix's dot products and the squares from the values it
// stored. X, xout [n, hc*d], f [n, d], split [n, (2+hc)*hc]; part and code as hc_mix_partials_f32's.
// The next launch (hc_mix_split_pre_norm_f32) reads xout, so the pair does a decode step's
// post, split and norm in two launches instead of three, with their bits.
BASE_KERNEL void hc_post_mix_partials_f32(const float* x, const float* f, const float* split, float* xout,
                                          const void* mix, float* part, unsigned int n, unsigned int d,
                                          unsigned int hc, unsigned int w, unsigned int splits, unsigned int code) {
    grid_wait();
    const unsigned int k = hc * d;
    auto load = [=](u64 t, unsigned int c) {
        const float v = lms_post_element(x, f, split, t, c / d, c % d, d, hc);
        xout[t * k + c] = v;
        return v;
    };
    if (code == 0) lms_mix_partials<0, 1>(load, mix, part, n, k, w, splits);
    else if (code == 1) lms_mix_partials<1, 1>(load, mix, part, n, k, w, splits);
    else lms_mix_partials<2, 1>(load, mix, part, n, k, w, splits);
}

// Token t's split by the token_warps warps of its group (warp / token_warps): warp sub of the group
// sums ranges sub, sub + token_warps, ..., the group's first warp adds the group's sums in warp
// order, scales the mix by the norm's factor and splits it. Every thread of the block calls it
// (its barriers); red, sum and mix hold a row per warp / group of the block.
__device__ __forceinline__ void lms_mix_split_group(const float* part, const float* scale, const float* base,
                                                    float* out, u64 t, bool active, unsigned int k, unsigned int hc,
                                                    unsigned int splits, unsigned int iters, float eps,
                                                    float norm_eps, unsigned int token_warps, float (*red)[32],
                                                    float (*sum)[32], float (*mix)[32]) {
    const unsigned int w = (2u + hc) * hc, warp = threadIdx.x / 32u, lane = threadIdx.x % 32u;
    const unsigned int group = warp / token_warps, sub = warp % token_warps;
    const u64 tt = active ? t : 0;
    float v = 0.0f;
    if (active && lane <= w) // an inactive group's sums are never used
        for (unsigned int i = sub; i < splits; i += token_warps) v += part[(tt * splits + i) * (w + 1) + lane];
    red[warp][lane] = v;
    __syncthreads();
    if (sub == 0 && lane <= w) {
        float s = 0.0f;
        for (unsigned int j = 0; j < token_warps; ++j) s += red[warp + j][lane];
        sum[group][lane] = s;
    }
    __syncthreads();
    if (sub == 0 && lane < w) mix[group][lane] = sum[group][lane] * (1.0f / sqrtf(sum[group][w] / (float)k + norm_eps));
    __syncthreads();
    hc_split_warp(mix[group], scale, base, out + tt * w, hc, iters, eps, active && sub == 0);
    __syncthreads(); // red, sum and mix are read, the split written, before the caller goes on
}

// token_warps (1 or a divisor of the block's warps, the host's choice) warps per token, tokens
// grid-strided: warp j of a token's group sums the ranges j, j + token_warps, ... (lane o value o),
// the group's first warp adds the group's sums, scales the mix by the norm's factor and splits it
// (hc_split_warp). A decode step takes a block a token (8 warps: a warp alone read the 32 ranges
// one after another, 13.1 us of 2 launches a layer on an H200, 10.4 so); a prefill chunk a warp a
// token (a block a token idles 7 warps of 8 through the Sinkhorn: 47.8 us for 2 048 tokens, 19.7
// so). Every warp runs hc_split_warp, the groups' first warps active.
BASE_KERNEL void hc_mix_split_f32(const float* part, const float* scale, const float* base, float* out,
                                  unsigned int n, unsigned int k, unsigned int hc, unsigned int splits,
                                  unsigned int iters, unsigned int eps_bits, float norm_eps,
                                  unsigned int token_warps) {
    grid_wait();
    __shared__ float red[LMS_MIX_THREADS / 32][32];
    __shared__ float sum[LMS_MIX_THREADS / 32][32];
    __shared__ float mix[LMS_MIX_THREADS / 32][32];
    const unsigned int groups = blockDim.x / 32u / token_warps, group = threadIdx.x / 32u / token_warps;
    for (u64 t0 = (u64)blockIdx.x * groups; t0 < n; t0 += (u64)gridDim.x * groups)
        lms_mix_split_group(part, scale, base, out, t0 + group, t0 + group < n, k, hc, splits, iters,
                            __uint_as_float(eps_bits), norm_eps, token_warps, red, sum, mix);
}

// hc_mix_split_pre_norm_f32: a decode step's hc_mix_split_f32 (a block a token, its first
// LMS_MIX_THREADS / 32 warps summing the token's ranges as hc_mix_split_f32 with that many
// token_warps), then in the same block hc_pre_norm_f32 of the token with the split's pre: split
// [n, (2+hc)*hc] and out [n, d] for X [n, hc*d], tokens grid-strided. The host launches it with
// hc_pre_norm_f32's block (row_threads(d), at least LMS_MIX_THREADS), so both outputs have the
// two kernels' bits, one launch fewer. The other warps wait through the split.
BASE_KERNEL void hc_mix_split_pre_norm_f32(const float* part, const float* scale, const float* base, float* split,
                                           const float* x, const float* weight, float* out, unsigned int n,
                                           unsigned int k, unsigned int hc, unsigned int splits, unsigned int iters,
                                           unsigned int eps_bits, float norm_eps, unsigned int d) {
    grid_wait();
    __shared__ float red[32][32];
    __shared__ float sum[32][32];
    __shared__ float mix[32][32];
    const unsigned int token_warps = LMS_MIX_THREADS / 32u, w = (2u + hc) * hc;
    for (unsigned int t = blockIdx.x; t < n; t += gridDim.x) {
        lms_mix_split_group(part, scale, base, split, t, threadIdx.x / 32u < token_warps, k, hc, splits, iters,
                            __uint_as_float(eps_bits), norm_eps, token_warps, red, sum, mix);
        lms_pre_norm_row(x + (u64)t * hc * d, split + (u64)t * w, weight, out + (u64)t * d, d, hc, norm_eps, red[0]);
        __syncthreads(); // red[0] is read before the next token's split writes it
    }
}

BASE_KERNEL void rms_norm_heads_f32(const float* x, float* out, unsigned int segs, unsigned int hd,
                                    float eps) {
    grid_wait();
    __shared__ float red[32];
    for (unsigned int seg = blockIdx.x; seg < segs; seg += gridDim.x) {
        const float* xs = x + (u64)seg * hd;
        float* ys = out + (u64)seg * hd;
        const float s = block_sum_squares(xs, hd, red);
        const float inv = 1.0f / sqrtf(s / (float)hd + eps);
        block_scale_row(xs, nullptr, ys, hd, inv);
    }
}

#define LMS_TOPK_THREADS 256
#define LMS_NONE 0xffffffffu

// (v1, c1) ranks before (v2, c2): larger value first, then lower column.
__device__ __forceinline__ bool lms_ranks_before(float v1, unsigned int c1, float v2, unsigned int c2) {
    return v1 > v2 || (v1 == v2 && c1 < c2);
}

// topk_rows_i32 ranks a row by 64-bit keys that order the elements as the ranking does (value
// descending, then column ascending; every non-finite element after all finite ones): the top k
// are the k smallest keys, in key order. Rows of at most LMS_TOPK_SORT_MAX columns (the indexer's
// compressed entries up to a context of 8K at ratio 4) are staged in shared memory as keys and
// bitonic-sorted: O(m log^2 m) compare-exchanges, all threads busy. (The first version counted,
// for each element, the elements ranked before it: O(m^2) comparisons, 80 us of a decode step at
// 4K context on an H200.) Longer rows do not fit shared memory: a radix select finds the k-th key
// in a few passes over the row in global memory, then the keys up to it are gathered and sorted
// (topk_row_by_select; these rows took k rounds of a block argmax before, O(k m): 512 rounds over
// 32768 entries per token and layer at 128K context). Both give the same slots.
#define LMS_TOPK_SORT_MAX 2048
#define LMS_KEY_LAST 0xffffffffffffffffull
// The radix select's digit: 8 bits of the key per pass, one bin per thread of the block. A decode
// step's row is one block, paced by the loads it has in flight: LMS_RADIX_BATCH per thread.
#define LMS_RADIX_BITS 8
#define LMS_RADIX_BINS 256
#define LMS_RADIX_BATCH 8
static_assert(LMS_RADIX_BINS == LMS_TOPK_THREADS, "lms_radix_bound scans one bin per thread");

// The sort key of (v, column j): larger v -> smaller key; -0 and +0 alike (they tie, as `>` and
// `==` see them); non-finite -> LMS_KEY_LAST, after every finite element. Finite keys are unique
// (the column is in the low half) and never 0 (the high half of a finite v is at least 0x00800000).
__device__ __forceinline__ unsigned long long lms_rank_key(float v, unsigned int j) {
    if (!lms_is_finite(v)) return LMS_KEY_LAST;
    const unsigned int u = __float_as_uint(v == 0.0f ? 0.0f : v);
    const unsigned int ascending = (u & 0x80000000u) ? ~u : u | 0x80000000u; // monotone in v
    return ((unsigned long long)~ascending << 32) | j;
}

// keys[0, p) ascending in place, p a power of two; the block's threads share each pass's pairs.
// Ends synced.
__device__ __forceinline__ void lms_bitonic_sort(unsigned long long* keys, unsigned int p) {
    for (unsigned int size = 2; size <= p; size *= 2)
        for (unsigned int stride = size / 2; stride > 0; stride /= 2) {
            for (unsigned int i = threadIdx.x; i < p / 2; i += LMS_TOPK_THREADS) {
                // the i-th pair (lo, lo + stride) of this pass; ascending where lo & size == 0
                const unsigned int lo = 2 * stride * (i / stride) + i % stride, hi = lo + stride;
                const unsigned long long a = keys[lo], b = keys[hi];
                if ((a > b) == ((lo & size) == 0)) {
                    keys[lo] = b;
                    keys[hi] = a;
                }
            }
            __syncthreads();
        }
}

__device__ __forceinline__ void topk_row_by_sort(const float* xr, int* yr, unsigned int m, unsigned int k,
                                                 unsigned long long* keys, float* red) {
    const unsigned int tid = threadIdx.x;
    unsigned int p = 1;
    while (p < m) p *= 2; // the sort's power-of-two length, padded with LMS_KEY_LAST
    float finite = 0.0f;
    for (unsigned int j = tid; j < p; j += LMS_TOPK_THREADS) {
        const float v = j < m ? xr[j] : QUIET_NAN;
        keys[j] = lms_rank_key(v, j);
        finite += keys[j] != LMS_KEY_LAST ? 1.0f : 0.0f;
    }
    const unsigned int f = (unsigned int)block_sum(finite, red); // exact: at most 2048; syncs keys too
    lms_bitonic_sort(keys, p);
    const unsigned int picked = f < k ? f : k;
    for (unsigned int s = tid; s < k; s += LMS_TOPK_THREADS) yr[s] = s < picked ? (int)(keys[s] & 0xffffffffu) : -1;
    __syncthreads(); // keys are read before the next row overwrites them
}

// Adds 1 to hist[bin] for every lane of the warp (bin == LMS_RADIX_BINS: nothing to count); called
// by every lane. The lanes that share a bin add once: the first pass sees most of a row in one or
// two bins (the sign and the top exponent bits), where an atomic per element would serialise.
__device__ __forceinline__ void lms_count_bin(unsigned int* hist, unsigned int bin) {
    const unsigned int peers = __match_any_sync(0xffffffffu, bin);
    if (bin < LMS_RADIX_BINS && (unsigned int)(__ffs((int)peers) - 1) == (threadIdx.x & 31u))
        atomicAdd(&hist[bin], (unsigned int)__popc(peers));
}

// The radix select of topk_row_by_select: a bound T such that exactly e = min(want, f) finite keys
// of the row are <= T, f being the row's finite count (returned in `finite`; T is meaningless when
// e == 0). Digit by digit from the top, each pass a histogram (in shared memory) of the digit of
// the keys in the bin found so far: the bin holding the e-th key is the next prefix, until the
// keys below the bin plus the whole bin are exactly e (at the latest on the last digit: keys are
// unique); T is then the largest key that bin can hold (the prefix, ones below it). Distinct
// values settle within the 4 value digits; the column digits only separate a tie at the k-th value.
//   hist [LMS_RADIX_BINS], warp_total [LMS_TOPK_THREADS / 32], pick [3]: shared scratch
__device__ __forceinline__ unsigned long long lms_radix_bound(const float* xr, unsigned int m, unsigned int want,
                                                              unsigned int* hist, unsigned int* warp_total,
                                                              unsigned int* pick, unsigned int& finite) {
    const unsigned int tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    unsigned long long prefix = 0; // the digits fixed so far, in place
    unsigned int below = 0;        // finite keys below the current bin
    unsigned int e = want;
    for (int shift = 64 - LMS_RADIX_BITS; shift >= 0; shift -= LMS_RADIX_BITS) {
        // every column is below m: a column digit above m's top bit is 0 in every key
        if (shift < 32 && ((m - 1u) >> shift) == 0u) continue;
        hist[tid] = 0u;
        __syncthreads();
        // whole-block steps (every lane reaches lms_count_bin's match) of LMS_RADIX_BATCH elements
        // per thread, all loaded before any is counted
        for (u64 j0 = 0; j0 < m; j0 += LMS_RADIX_BATCH * LMS_TOPK_THREADS) {
            float v[LMS_RADIX_BATCH];
#pragma unroll
            for (unsigned int b = 0; b < LMS_RADIX_BATCH; ++b) {
                const u64 j = j0 + b * LMS_TOPK_THREADS + tid;
                v[b] = j < m ? xr[j] : QUIET_NAN;
            }
#pragma unroll
            for (unsigned int b = 0; b < LMS_RADIX_BATCH; ++b) {
                const unsigned long long key = lms_rank_key(v[b], (unsigned int)(j0 + b * LMS_TOPK_THREADS + tid));
                const bool in_bin = key != LMS_KEY_LAST && ((key ^ prefix) >> shift >> LMS_RADIX_BITS) == 0u;
                lms_count_bin(hist, in_bin ? (unsigned int)(key >> shift) & (LMS_RADIX_BINS - 1u) : LMS_RADIX_BINS);
            }
        }
        __syncthreads();
        // inclusive prefix sum over the bins (thread b holds bin b): a scan per warp, then the
        // totals of the warps before
        const unsigned int c = hist[tid];
        unsigned int incl = c;
        for (unsigned int o = 1; o < 32u; o *= 2) {
            const unsigned int up = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += up;
        }
        if (lane == 31u) warp_total[warp] = incl;
        __syncthreads();
        unsigned int total = 0;
        for (unsigned int w = 0; w < LMS_TOPK_THREADS / 32; ++w) {
            if (w < warp) incl += warp_total[w];
            total += warp_total[w];
        }
        if (shift == 64 - LMS_RADIX_BITS) { // the first pass counts every finite key
            finite = total;
            e = want < total ? want : total;
        }
        if (e == 0u) return 0; // the same in every thread
        if (below + incl - c < e && e <= below + incl) { // exactly one bin
            pick[0] = tid;
            pick[1] = incl - c;
            pick[2] = c;
        }
        __syncthreads(); // pick is rewritten no sooner than two barriers on, in the next pass
        prefix |= (unsigned long long)pick[0] << shift;
        below += pick[1];
        if (below + pick[2] == e) return prefix | ((1ull << shift) - 1ull);
    }
    return prefix; // not reached: the last digit's bin is one key (a bounded loop all the same)
}

// Rows longer than LMS_TOPK_SORT_MAX, in chunks of up to LMS_TOPK_SORT_MAX slots (one chunk for
// k <= 2048, the indexer's 512): the radix bound of the chunk's last slot, then one more pass
// gathers the finite keys above the previous chunk's bound and up to this one (exactly the chunk's
// keys, in any order) into shared memory to be sorted; slots past the finite keys take -1.
//   keys [LMS_TOPK_SORT_MAX], hist [LMS_RADIX_BINS], warp_total [LMS_TOPK_THREADS / 32],
//   pick [3], count [1]: shared scratch
__device__ __forceinline__ void topk_row_by_select(const float* xr, int* yr, unsigned int m, unsigned int k,
                                                   unsigned long long* keys, unsigned int* hist,
                                                   unsigned int* warp_total, unsigned int* pick,
                                                   unsigned int* count) {
    const unsigned int tid = threadIdx.x;
    unsigned long long prev_bound = 0; // the previous chunk's bound: below every finite key at first
    for (unsigned int s0 = 0, s1; s0 < k; s0 = s1) {
        s1 = k - s0 < LMS_TOPK_SORT_MAX ? k : s0 + LMS_TOPK_SORT_MAX; // no wrap past 2^32
        unsigned int f;
        const unsigned long long bound = lms_radix_bound(xr, m, s1, hist, warp_total, pick, f);
        const unsigned int picked = f > s0 ? (f < s1 ? f : s1) - s0 : 0u; // keys of this chunk
        if (tid == 0) *count = 0u;
        __syncthreads();
        if (picked > 0u) {
#pragma unroll 8
            for (u64 j = tid; j < m; j += LMS_TOPK_THREADS) {
                const unsigned long long key = lms_rank_key(xr[j], (unsigned int)j);
                if (key != LMS_KEY_LAST && key > prev_bound && key <= bound) keys[atomicAdd(count, 1u)] = key;
            }
        }
        unsigned int p = 1;
        while (p < picked) p *= 2; // the sort's power-of-two length, padded with LMS_KEY_LAST
        for (unsigned int i = picked + tid; i < p; i += LMS_TOPK_THREADS) keys[i] = LMS_KEY_LAST;
        __syncthreads();
        lms_bitonic_sort(keys, p);
        for (unsigned int s = s0 + tid; s < s1; s += LMS_TOPK_THREADS)
            yr[s] = s - s0 < picked ? (int)(keys[s - s0] & 0xffffffffu) : -1;
        __syncthreads(); // keys are read before the next chunk or row overwrites them
        prev_bound = bound;
    }
}

BASE_KERNEL void topk_rows_i32(const float* x, int* out, unsigned int n, unsigned int m, unsigned int k) {
    grid_wait();
    __shared__ unsigned long long keys[LMS_TOPK_SORT_MAX];
    __shared__ unsigned int hist[LMS_RADIX_BINS];
    __shared__ unsigned int warp_total[LMS_TOPK_THREADS / 32];
    __shared__ unsigned int pick[3];
    __shared__ unsigned int count;
    __shared__ float red[32];
    for (unsigned int row = blockIdx.x; row < n; row += gridDim.x) {
        const float* xr = x + (u64)row * m;
        int* yr = out + (u64)row * k;
        if (m <= LMS_TOPK_SORT_MAX) // the same in every block
            topk_row_by_sort(xr, yr, m, k, keys, red);
        else
            topk_row_by_select(xr, yr, m, k, keys, hist, warp_total, pick, &count);
    }
}

#define LMS_ROUTE_THREADS 256
#define LMS_ROUTE_WARPS (LMS_ROUTE_THREADS / 32)
// Rows of at most this many experts keep their scores, raw and biased, in shared memory for the
// k rounds and the weights; longer rows recompute them where they are needed. One warp per row,
// recomputing sqrt(softplus) of all 256 logits in each of 6 rounds, took 18 us of an H200 decode
// step's layer (Nsight); the block computes each score once, a thread per expert.
#define LMS_ROUTE_CACHE 1024

// (v, c) of the candidate that ranks first, (bv, bc) and (ov, oc) either a candidate or none.
__device__ __forceinline__ void lms_route_better(float ov, unsigned int oc, float* bv, unsigned int* bc) {
    if (oc != LMS_NONE && (*bc == LMS_NONE || lms_ranks_before(ov, oc, *bv, *bc))) {
        *bv = ov;
        *bc = oc;
    }
}

BASE_KERNEL void route_experts_f32(const float* logits, const float* bias, const int* kind,
                                   const int* table, const int* tok, int* ids, float* weights,
                                   unsigned int n, unsigned int e, unsigned int k, unsigned int kinds,
                                   unsigned int hashed, unsigned int vocab, unsigned int scale_bits) {
    grid_wait();
    __shared__ float raw[LMS_ROUTE_CACHE], biased[LMS_ROUTE_CACHE];
    __shared__ float cand_v[2][LMS_ROUTE_WARPS];
    __shared__ unsigned int cand_c[2][LMS_ROUTE_WARPS];
    const float scale = __uint_as_float(scale_bits);
    const unsigned int tid = threadIdx.x, lane = tid % 32u, warp = tid / 32u;
    const bool cache = e <= LMS_ROUTE_CACHE;
    for (unsigned int row = blockIdx.x; row < n; row += gridDim.x) {
        const float* lr = logits + (u64)row * e;
        const int kd = kind[row];
        const float* br = (kd >= 0 && (unsigned int)kd < kinds) ? bias + (u64)kd * e : nullptr;
        int* ir = ids + (u64)row * k;
        float* wr = weights + (u64)row * k;
        if (cache)
            for (unsigned int j = tid; j < e; j += LMS_ROUTE_THREADS) {
                raw[j] = lms_sqrt_softplus(lr[j]);
                biased[j] = br ? raw[j] + br[j] : QUIET_NAN;
            }
        __syncthreads();
        // top-k of the biased scores: round s picks the candidate ranking first among those that
        // rank after round s - 1's pick, by a block argmax (a strict order: any reduction order
        // gives the same pick); thread s % LMS_ROUTE_THREADS writes slot s
        float pv = 0.0f; // previous pick (value, column); none before the first round
        unsigned int pc = LMS_NONE;
        for (unsigned int s = 0; s < k; ++s) {
            float bv = 0.0f;
            unsigned int bc = LMS_NONE;
            if (pc != LMS_NONE || s == 0) {
                for (unsigned int j = tid; j < e; j += LMS_ROUTE_THREADS) {
                    const float v = cache ? biased[j] : br ? lms_sqrt_softplus(lr[j]) + br[j] : QUIET_NAN;
                    if (!lms_is_finite(v)) continue;
                    if (pc != LMS_NONE && !lms_ranks_before(pv, pc, v, j)) continue;
                    lms_route_better(v, j, &bv, &bc);
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const unsigned int oc = __shfl_xor_sync(0xffffffffu, bc, o);
                lms_route_better(ov, oc, &bv, &bc);
            }
            // the warps' picks, double-buffered by round: round s + 2 rewrites this buffer only
            // after every thread passed round s + 1's barrier, so after it read round s's
            if (lane == 0) {
                cand_v[s % 2u][warp] = bv;
                cand_c[s % 2u][warp] = bc;
            }
            __syncthreads();
            bv = 0.0f;
            bc = LMS_NONE;
            for (unsigned int w = 0; w < LMS_ROUTE_WARPS; ++w) lms_route_better(cand_v[s % 2u][w], cand_c[s % 2u][w], &bv, &bc);
            pv = bv;
            pc = bc; // once NONE, every later round is NONE too (no candidate ranks after none)
            if (tid == s % LMS_ROUTE_THREADS) ir[s] = pc == LMS_NONE ? -1 : (int)pc;
        }
        // hash layers: a text token takes its table row, an image token keeps the top-k
        const int t = hashed ? tok[row] : -1;
        const int* hr = (t >= 0 && (unsigned int)t < vocab) ? table + (u64)t * k : nullptr;
        __syncthreads(); // every thread reads the slots the others wrote
        float sum = 0.0f;
        bool bad = false;
        for (unsigned int s = 0; s < k; ++s) {
            const int id = hr ? hr[s] : ir[s];
            if (id < 0 || (unsigned int)id >= e) {
                bad = true;
                continue;
            }
            sum += cache ? raw[id] : lms_sqrt_softplus(lr[id]);
        }
        sum += 1e-20f;
        __syncthreads(); // the slots are read before they are overwritten
        for (unsigned int s = tid; s < k; s += LMS_ROUTE_THREADS) {
            const int id = hr ? hr[s] : ir[s];
            ir[s] = id;
            wr[s] = bad ? QUIET_NAN : (cache ? raw[id] : lms_sqrt_softplus(lr[id])) / sum * scale;
        }
        __syncthreads(); // the scores are read before the next row overwrites them
    }
}
