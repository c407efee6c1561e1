// Shared prelude of every kernel file (prepended by src/backend/cuda/kernels.rs before NVRTC runs;
// NVRTC gets no include paths, so nothing here needs a header).
//
// Conventions: tensors are row-major f32 (index tensors i32); sizes arrive as `unsigned int`
// (the host checks they fit) and flat indices are computed in 64 bits (`u64`). 1-D kernels use
// grid-stride loops, so any grid size is correct.

typedef unsigned long long u64;

// Compilation units. A file whose kernels take weights (linear.cu, lm_small.cu, lm_attention.cu,
// moe.cu) is compiled once as its base unit, every kernel but the block formats' weight kernels
// (declared BASE_KERNEL), and once per block format a model uses: the host then defines
// FOVEA_BLOCK_FORMAT as the format's code and FOR_EACH_BLOCK_FORMAT (cuda/dequant.cuh) as that
// format alone, and BASE_KERNEL declares a template nothing instantiates, so none of the base
// kernels is compiled again. Compiling every format's kernels at the first weight kernel took
// minutes on a fresh machine (NVRTC, then the driver's JIT of the PTX). The host emulator and the
// base unit leave FOVEA_BLOCK_FORMAT at 0.
#ifndef FOVEA_BLOCK_FORMAT
#define FOVEA_BLOCK_FORMAT 0
#endif

// GEMM builds. The weight files' GEMM kernels (linear, grouped_linear, moe_gate/up/down) have two
// paths (gemm_block below): the tile for many rows, the small-row path (gemv_cols) for a decode
// step's few. They want different register budgets: the tile takes up to 128 registers a thread
// (GEMM_LAUNCH), while the small-row path streams its weight once and wants as many warps an SM as
// possible to keep loads in flight (Nsight Compute on an H200, 2026-12-02: held to 4 blocks an SM
// by the tile's budget, the expert GEMVs issued half an instruction a cycle, the rest waiting on
// memory). So the host compiles each weight file as two builds: FOVEA_GEMM_PATH = GEMM_PATH_TILES
// (every kernel; the GEMMs take the tile), and GEMM_PATH_ROWS (the GEMM kernels alone, declared
// GEMM_KERNEL or by the block-format macros, on the small-row path under GEMV_MIN_BLOCKS; every
// BASE_KERNEL then declares a template nothing instantiates). The host emulator keeps
// GEMM_PATH_BOTH: gemm_block then picks the path at run time by the rule the host uses.
#define GEMM_PATH_BOTH 0
#define GEMM_PATH_TILES 1
#define GEMM_PATH_ROWS 2
#ifndef FOVEA_GEMM_PATH
#define FOVEA_GEMM_PATH GEMM_PATH_BOTH
#endif
#if FOVEA_BLOCK_FORMAT || FOVEA_GEMM_PATH == GEMM_PATH_ROWS
#define BASE_KERNEL template <int> __global__
#else
#define BASE_KERNEL extern "C" __global__
#endif
#if FOVEA_BLOCK_FORMAT
#define GEMM_KERNEL template <int> __global__
#else
#define GEMM_KERNEL extern "C" __global__
#endif

#define NEG_INF __uint_as_float(0xff800000u)
#define QUIET_NAN __uint_as_float(0x7fc00000u)

// Programmatic dependent launch (sm_90+): unless FOVEA_PDL=0 the host launches every kernel with
// the programmatic-stream-serialization attribute, so the device may launch a kernel while the one
// before it in the stream still runs. grid_wait, every kernel's first statement, holds the
// kernel's threads until the previous kernel has completed and its writes are visible (so every
// memory access, reads and writes alike, keeps the stream's order), then lets the next kernel
// launch: its blocks take free SM slots and wait in their own grid_wait while this kernel works,
// so when it completes the next starts without a launch's latency. A no-op where the attribute
// is not set, below sm_90, and in the host emulator. (A unit test in src/backend/cuda/tests.rs
// checks that every kernel of cuda/ starts with it.)
__device__ __forceinline__ void grid_wait() {
#if !defined(CUDA_EMU) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

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
// f16 (the low 16 bits of h) by the device's conversion instruction, exact (every f16 is an f32;
// no cuda_fp16.h needed). The integer decode below it (subnormals, inf and NaN included) serves
// the host emulator; on the device its chain of integer operations and branches was paid for
// every f16 weight the small-row path streamed (a hyper-connection mix, 12 blocks and one row:
// 38 us with it, 11 us with the instruction and the one-row instantiation; Nsight, H200).
__device__ __forceinline__ float f16_to_f32(unsigned int h) {
#if !defined(CUDA_EMU)
    float f;
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }" : "=f"(f) : "r"(h));
    return f;
#else
    const unsigned int sign = (h & 0x8000u) << 16;
    const unsigned int exp = (h >> 10) & 0x1fu;
    const unsigned int man = h & 0x3ffu;
    if (exp == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (man << 13)); // inf, NaN
    if (exp != 0) return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
    const float f = (float)man * 5.9604644775390625e-8f; // subnormal (or zero): man * 2^-24, exact
    return sign ? -f : f;
#endif
}

// FMT: 0 = f32, 1 = bf16, 2 = f16; WF_FIRST_BLOCK and up the block formats, decoded by dq_run
// (cuda/dequant.cuh, prepended after this prelude to the files with weight kernels; declared here
// for the GEMM below). idx is a flat element index.
#define WF_FIRST_BLOCK 3
template <int FMT>
__device__ __forceinline__ void dq_run(const void* w, u64 idx, float* out, unsigned int n);
template <int FMT>
__device__ __forceinline__ void dq_run8(const void* w, u64 idx, float* out);
// A block format's geometry: QK values in BYTES bytes; ALIGN, the alignment of every block of a
// matrix whose base is ALIGN-aligned (dq_run8's word loads need it).
template <int FMT>
struct WBlock;

template <int FMT>
__device__ __forceinline__ float load_w(const void* w, u64 idx) {
    if constexpr (FMT >= WF_FIRST_BLOCK) {
        float v;
        dq_run<FMT>(w, idx, &v, 1u);
        return v;
    }
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

// Sum of x[c]^2 over c < d for the block's row (every thread gets it; block_sum's contract): 16-byte
// loads when the row is 16-byte aligned and d % 4 == 0, else single floats. A decode step's norms
// are one block streaming a 4096- or 16384-float row, where single loads left it waiting on memory.
__device__ __forceinline__ float block_sum_squares(const float* x, unsigned int d, float* red) {
    float s = 0.0f;
    if (d % 4u == 0u && ((u64)x & 15u) == 0u) {
        const fa_f4* x4 = reinterpret_cast<const fa_f4*>(x);
#pragma unroll 4
        for (unsigned int c = threadIdx.x; c < d / 4u; c += blockDim.x) {
            const fa_f4 v = x4[c];
            s = fmaf(v.x, v.x, s);
            s = fmaf(v.y, v.y, s);
            s = fmaf(v.z, v.z, s);
            s = fmaf(v.w, v.w, s);
        }
    } else {
        for (unsigned int c = threadIdx.x; c < d; c += blockDim.x) s = fmaf(x[c], x[c], s);
    }
    return block_sum(s, red);
}

// y[c] = (x[c] * inv) * w[c] for c < d (w null: x[c] * inv), the block's threads striding over
// the row (the RMS norms' second pass): float4s when x, y and w are 16-byte aligned and d % 4 == 0,
// else single floats; the same arithmetic either way.
__device__ __forceinline__ void block_scale_row(const float* x, const float* w, float* y, unsigned int d, float inv) {
    if (d % 4u == 0u && (((u64)x | (u64)y | (u64)w) & 15u) == 0u) {
        const fa_f4 *x4 = reinterpret_cast<const fa_f4*>(x), *w4 = reinterpret_cast<const fa_f4*>(w);
        fa_f4* y4 = reinterpret_cast<fa_f4*>(y);
        for (unsigned int c = threadIdx.x; c < d / 4u; c += blockDim.x) {
            const fa_f4 v = x4[c];
            y4[c] = w ? fa_f4{(v.x * inv) * w4[c].x, (v.y * inv) * w4[c].y, (v.z * inv) * w4[c].z, (v.w * inv) * w4[c].w}
                      : fa_f4{v.x * inv, v.y * inv, v.z * inv, v.w * inv};
        }
    } else {
        for (unsigned int c = threadIdx.x; c < d; c += blockDim.x) y[c] = w ? (x[c] * inv) * w[c] : x[c] * inv;
    }
}

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

// ---- One tiled GEMM for linear, grouped_linear and moe -----------------------------------------
// C [rows, cols] = A [rows, k] . W [cols, k]^T for one block tile, with the caller's operand
// addressing and epilogue in `Op` (a plain struct):
//   const float* a_row(unsigned int m) const   row m (< rows) of A: k contiguous f32
//   u64 w_row(unsigned int c) const            element offset of W's row for column c (< cols)
//   void store2(unsigned int m, unsigned int c, float v0, float v1) const
//                                              C[m][c], C[m][c+1] (m < rows, c < cols, c even;
//                                              c + 1 may equal cols: the op drops v1 then)
// Columns come in even/odd pairs: one call stores two adjacent outputs of a row.
//
// Block tile GEMM_BM x GEMM_BN (rows x cols) starting at (row0, col0), k in steps of GEMM_BK,
// GEMM_THREADS threads (4 warps, 2 x 2, each warp a 32 x 32 sub-tile), 1-D blocks. Every operand
// element outside rows / cols / k is staged as 0, so any size is correct (edge tiles included).
//
// Tensor cores (sm_80+, bf16 and f16 weights): mma.sync m16n8k16 bf16 x bf16 -> f32. The goldens
// and the op harness hold the lane to f32 accuracy (nmse ~1e-10), which one bf16 rounding of x
// (8 significant bits) would miss by far, so each f32 activation is split exactly into three bf16
// terms x = hi + mid + lo (truncations; hi·w, mid·w, lo·w are exact products) and the tile does
// 3 MMAs where a plain bf16 GEMM does one (exact for |x| >= 2^-110, see split_bf16x3). bf16 weights are exact in bf16; an f16 weight (11
// significant bits) is split exactly into hi + lo, and the tile does 5 MMAs (every product but
// lo·w_lo, which is below 2^-24 relative). f32 and block-format weights (see gemm_tile), and
// devices below sm_80 (chosen at compile time by __CUDA_ARCH__), take the FMA path: the same tiles in shared memory, 32 outputs per
// thread, k accumulated in order with fmaf.

#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 32
#define GEMM_THREADS 128
// Every GEMM kernel is declared GEMM_LAUNCH: at most 128 registers a thread, so four blocks (16
// warps) fit an SM; unbounded, NVRTC gave 130-154 and three blocks (12 warps), and the tiles'
// load latency went unhidden (Nsight Compute: 30 % issue-slot use, ViT and expert GEMMs).
#define GEMM_MIN_BLOCKS 4
// The rows build's bound (see "GEMM builds" above): at least GEMV_MIN_BLOCKS blocks an SM, so at
// most 65536 / (GEMM_THREADS * GEMV_MIN_BLOCKS) registers a thread (40 at 12). One layer's q2
// decode step on an H200 (bench_model --layers 1, median of 16, one sitting, 2026-12-02): 0.85,
// 0.88, 0.80 and 0.78 ms at 4, 8, 12 and 16 (the tile build's bound, 4, gave 1.87 ms with the
// other changes of that commit absent); 16 leaves 32 registers, too few for the eight-row
// instantiation of a batched step.
#ifndef GEMV_MIN_BLOCKS
#define GEMV_MIN_BLOCKS 12
#endif
#if FOVEA_GEMM_PATH == GEMM_PATH_ROWS
#define GEMM_LAUNCH __launch_bounds__(GEMM_THREADS, GEMV_MIN_BLOCKS)
#else
#define GEMM_LAUNCH __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)
#endif
// k pairs per staged row (the MMA path keeps two bf16 of adjacent k in one 32-bit word) and the
// padded row length in words: 20 words spreads the fragment loads of a warp over all 32 banks.
#define GEMM_KP (GEMM_BK / 2)
#define GEMM_KP_PAD (GEMM_KP + 4)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define GEMM_TENSOR_CORES 1
#else
#define GEMM_TENSOR_CORES 0
#endif

// Fast precision (`--precision fast`; the host compiles the GEMM files a second time with
// -DFOVEA_FAST=1): each operand is rounded once to f16 (to nearest even: 11 significant bits, a
// relative error under 2^-11) and every tile does one f16 MMA, for every weight format, with f32
// accumulation. bf16 (8 bits) was tried first: its 2^-8 per operand compounds to 1.1e-2 on the
// fixtures' vision path and moves the language model's routing (tests/common/mod.rs has the
// measurements and the derivation). f16's range is the price: operands beyond ±65504 become
// ±inf, which shows in the output (no silent saturation); every GEMM input of the model is
// normalised, clamped (SwiGLU's limit) or a softmax average of such values, and weights are far
// below it. The small-row path (gemv_cols) is unchanged: it streams the weight once and is bound
// by memory, not arithmetic.
#ifndef FOVEA_FAST
#define FOVEA_FAST 0
#endif

// D [16x8] += A [16x16] . B [16x8], bf16 inputs, f32 accumulators (PTX ISA "Matrix Fragments for
// mma.m16n8k16 with floating point type"; g = lane / 4, t = lane % 4, low half = lower k):
//   a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..]   a[3] = A[g+8][2t+8..]
//   b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]
//   d[0], d[1] = D[g][2t], D[g][2t+1]                 d[2], d[3] = D[g+8][2t], D[g+8][2t+1]
// The host emulator (cuda/emu/cuda_emu.h) provides emu_mma_m16n8k16_bf16 with the same layout.
__device__ __forceinline__ void mma_m16n8k16_bf16(float* d, const unsigned int* a, const unsigned int* b) {
#if defined(CUDA_EMU)
    emu_mma_m16n8k16_bf16(d, a, b);
#elif !GEMM_TENSOR_CORES
    __trap(); // no such instruction below sm_80, where gemm_tile never calls this
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// The upper 16 bits of v as a bf16 (truncation, so v - bf16(v) is exact in f32); a NaN stays a
// NaN (its payload may sit in the dropped bits).
__device__ __forceinline__ unsigned int bf16_trunc_bits(float v) {
    const unsigned int u = __float_as_uint(v);
    const bool nan = (u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu) != 0u;
    return nan ? (u >> 16) | 0x40u : u >> 16;
}
__device__ __forceinline__ float bf16_bits_to_f32(unsigned int b) { return __uint_as_float(b << 16); }

// (lo, hi) rounded to the nearest f16 (ties to even) and packed, lo in the low half: the k, k + 1
// pair layout of the MMA fragments. inf and NaN stay so; past ±65504 a value becomes ±inf.
__device__ __forceinline__ unsigned int f16x2_rn(float lo, float hi) {
#if defined(CUDA_EMU)
    return emu_f16x2_rn(lo, hi);
#elif !GEMM_TENSOR_CORES
    __trap(); // only the tensor-core tile calls this
    return 0u;
#else
    unsigned int r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

// Two words of packed f16, four values (one 8-byte store): f32_to_f16's, rms_norm_f16's and
// swiglu_f16's output, the A operand of fast precision's cuBLASLt GEMMs.
struct alignas(8) f16x4_words {
    unsigned int lo, hi;
};

// D [16x8] += A [16x16] . B [16x8] with f16 inputs: the layout of mma_m16n8k16_bf16.
__device__ __forceinline__ void mma_m16n8k16_f16(float* d, const unsigned int* a, const unsigned int* b) {
#if defined(CUDA_EMU)
    emu_mma_m16n8k16_f16(d, a, b);
#elif !GEMM_TENSOR_CORES
    __trap();
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Dim d of a head row x (hd dims, half = hd / 2) rotated by the 2-D RoPE's rotate-half pairs
// (d, d + half), c and s the row's cos and sin (half each); zero past hd (a padded operand's dims).
// rope_2d_f32 (rope.cu) and attention_qkv_rope_f16 (attention.cu) rotate with it.
__device__ __forceinline__ float rope_2d_at(const float* x, const float* c, const float* s, unsigned int d,
                                            unsigned int half, unsigned int hd) {
    if (d >= hd) return 0.0f;
    if (d < half) return x[d] * c[d] - x[d + half] * s[d];
    const unsigned int e = d - half;
    return x[d] * c[e] + x[e] * s[e];
}

// ---- fast precision's attention operands (cuda/attention.cu, cuda/lm_attention.cu) -----------
// Elements d, d + 1 of a row (0 past hd or for a missing row) as an f16 pair, d in the low half.
__device__ __forceinline__ unsigned int fa_pair16(const float* row, unsigned int d, unsigned int hd) {
    return f16x2_rn(row && d < hd ? row[d] : 0.0f, row && d + 1u < hd ? row[d + 1u] : 0.0f);
}

// 16 bytes from global memory to shared memory without passing through registers (cp.async.cg,
// sm_80+; the host emulator copies at once), and the group bookkeeping: commit the copies issued
// so far as a group; wait until at most N groups are still in flight.
__device__ __forceinline__ void fa_cp16(unsigned int* dst, const unsigned int* src) {
#if defined(CUDA_EMU)
    std::memcpy(dst, src, 16);
#elif !GEMM_TENSOR_CORES
    __trap(); // the host launches these kernels on sm_80+ only
#else
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
#endif
}
__device__ __forceinline__ void fa_cp_commit() {
#if !defined(CUDA_EMU) && GEMM_TENSOR_CORES
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void fa_cp_wait() {
#if !defined(CUDA_EMU) && GEMM_TENSOR_CORES
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// One chunk's online-softmax step of a warp's fast attention (attention_fast_d*, sink_attention_fast_d*):
// s [NT][4] are the chunk's scores in log2 units (rows g: elements 0, 1; g + 8: 2, 3; -inf for a
// missing key), m0/m1 the rows' running maxima, l0/l1 this thread's part of their sums, o [DT][4]
// the rows' output accumulators. The maxima over the 4 lanes of a row, then o and l rescaled to
// the new maxima and s turned into exps relative to them (0 while a row has seen only -inf, where
// m - max would be NaN), added to l.
template <int NT, int DT>
__device__ __forceinline__ void fa_online_softmax(float (&s)[NT][4], float (&o)[DT][4], float& m0, float& m1,
                                                  float& l0, float& l1) {
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
    }
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
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 (sm_75+; called on sm_80+ only): lanes 8i ..
// 8i + 7 each give the shared-memory address of one row (8 consecutive f16, 16-byte aligned) of
// the 8 × 8 matrix M_i, and r[i] of lane (g, t) receives M_i[2t][g] (low half) and M_i[2t + 1][g]:
// with M_i's rows along k, the B fragment b[0] (or b[1]) of mma_m16n8k16_f16 for column n = g.
// The host emulator provides emu_ldmatrix_x4_trans.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int* r, const unsigned int* row) {
#if defined(CUDA_EMU)
    emu_ldmatrix_x4_trans(r, row);
#elif !GEMM_TENSOR_CORES
    __trap();
#else
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

__device__ __forceinline__ bool f32_is_finite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
}

// x = hi + mid + lo exactly for every finite f32 with |x| >= 2^-110 (each truncation takes the
// next 8 significant bits; what is left after two fits the third). Below that, lo would need bits
// under bf16's smallest subnormal (2^-133), which are dropped: an absolute error under 2^-133.
// inf and NaN go whole into hi (mid = lo = 0); see gemm_combine.
__device__ __forceinline__ void split_bf16x3(float x, unsigned int* hi, unsigned int* mid, unsigned int* lo) {
    *hi = bf16_trunc_bits(x);
    if (!f32_is_finite(x)) {
        *mid = 0u;
        *lo = 0u;
        return;
    }
    const float r1 = x - bf16_bits_to_f32(*hi);
    *mid = bf16_trunc_bits(r1);
    *lo = bf16_trunc_bits(r1 - bf16_bits_to_f32(*mid));
}

// A decoded f16 weight (11 significant bits, subnormals included: they are normal f32) = hi + lo
// exactly in bf16; inf and NaN go whole into hi.
__device__ __forceinline__ void split_bf16x2(float w, unsigned int* hi, unsigned int* lo) {
    *hi = bf16_trunc_bits(w);
    *lo = f32_is_finite(w) ? bf16_trunc_bits(w - bf16_bits_to_f32(*hi)) : 0u;
}

// hi_sum = sum of hi·w_hi, aux_sum = sum of the smaller split terms. An inf or NaN operand lives
// whole in its hi term with zeros beside it, so the cross terms can make a NaN (inf · 0) where the
// f32 dot product has an inf; but then hi_sum is already non-finite and is the answer (an inf next
// to a zero weight gives NaN in hi_sum too, as in f32). Otherwise hi_sum + aux_sum.
__device__ __forceinline__ float gemm_combine(float hi_sum, float aux_sum) {
    return f32_is_finite(hi_sum) ? hi_sum + aux_sum : hi_sum;
}

template <int FMT>
__device__ __forceinline__ void load_w_run(const void* w, u64 idx, float* out);
template <int FMT>
__device__ __forceinline__ bool gemv_w_aligned(const void* w, u64 row);

// Elements a run of the small-row path (gemv_cols) and of the tile's run staging (gemm_tile_mma)
// covers: one 16-byte load of 16-bit weights, two of f32.
#define GEMV_RUN 8

// The operand rows one thread stages: tile rows (and tile columns) tid / GEMM_KP + 8i, i < 8, at
// k pair tid % GEMM_KP of every k step, so a warp reads two rows of 16 adjacent pairs.
#define GEMM_STAGE_ROWS (GEMM_BM * GEMM_KP / GEMM_THREADS)

// How an operand struct (Op) feeds gemm_tile: `a_row(m)` names A row m as an `Op::ARow`,
// `a_at(row, kk)` reads its element kk < k, `w_row(c)` is W row c's element offset, and
// `store2(m, c, v0, v1)` writes the results of columns c and c + 1 (c + 1 may be past the last
// column: store2 checks). Most operands read A rows as k contiguous floats (ContiguousRows); the
// aligner gathers its rows from the ViT grid (UnfoldOperands, linear.cu), and calls gemm_tile
// only: gemm_block's small-row path (gemv_cols) reads A rows as `const float*` in 16-byte runs,
// so its operands must be ContiguousRows.
struct ContiguousRows {
    using ARow = const float*;
    static constexpr bool CONTIGUOUS = true; // rows are k floats: gemm_tile_mma may stage them in runs
    __device__ __forceinline__ static float a_at(const float* row, unsigned int kk) { return row[kk]; }
};

template <class Op>
struct GemmStage {
    typename Op::ARow a[GEMM_STAGE_ROWS]; // A rows (valid where bit i of a_ok is set)
    u64 w[GEMM_STAGE_ROWS];               // W row offsets (~0 outside cols)
    unsigned int a_ok;                    // bit i: staged row i is inside rows
    unsigned int kp;                      // k pair of this thread within the step

    __device__ __forceinline__ void init(const Op& op, unsigned int rows, unsigned int cols, unsigned int row0,
                                         unsigned int col0) {
        kp = threadIdx.x % GEMM_KP;
        a_ok = 0u;
#pragma unroll
        for (unsigned int i = 0; i < GEMM_STAGE_ROWS; ++i) {
            const unsigned int r = threadIdx.x / GEMM_KP + 8u * i;
            if (row0 + r < rows) {
                a[i] = op.a_row(row0 + r);
                a_ok |= 1u << i;
            }
            w[i] = col0 + r < cols ? op.w_row(col0 + r) : ~0ull;
        }
    }
    // x at k, k + 1 of staged row i (0 outside)
    __device__ __forceinline__ void load_a(const Op& op, unsigned int i, unsigned int kk, unsigned int k, float* v0,
                                           float* v1) const {
        const bool ok = (a_ok >> i) & 1u;
        *v0 = (ok && kk < k) ? op.a_at(a[i], kk) : 0.0f;
        *v1 = (ok && kk + 1 < k) ? op.a_at(a[i], kk + 1) : 0.0f;
    }
    template <int FMT>
    __device__ __forceinline__ void load_w2(const void* wp, unsigned int i, unsigned int kk, unsigned int k, float* v0,
                                            float* v1) const {
        const bool ok = w[i] != ~0ull;
        if constexpr (FMT >= WF_FIRST_BLOCK) {
            // k is a whole number of (even-sized) blocks and kk is even: both values or neither,
            // decoded as one run of the block
            float v[2] = {0.0f, 0.0f};
            if (ok && kk < k) dq_run<FMT>(wp, w[i] + kk, v, 2u);
            *v0 = v[0];
            *v1 = v[1];
            return;
        }
        *v0 = (ok && kk < k) ? load_w<FMT>(wp, w[i] + kk) : 0.0f;
        *v1 = (ok && kk + 1 < k) ? load_w<FMT>(wp, w[i] + kk + 1) : 0.0f;
    }
};

// FMA path. Shared: A and W tiles as f32 [64][GEMM_BK + 1]. Thread (tr = tid / 16, tc = tid % 16)
// owns rows tr + 8i (i < 8) and columns 2tc + 32j + {0, 1} (j < 2).
template <int FMT, class Op>
__device__ __forceinline__ void gemm_tile_fma(const Op& op, const void* w, unsigned int rows, unsigned int cols,
                                              unsigned int k, unsigned int row0, unsigned int col0,
                                              unsigned int k_begin) {
    __shared__ float as[GEMM_BM][GEMM_BK + 1];
    __shared__ float ws[GEMM_BN][GEMM_BK + 1];
    GemmStage<Op> st;
    st.init(op, rows, cols, row0, col0);
    const unsigned int tr = threadIdx.x / 16u, tc = threadIdx.x % 16u;
    float acc[8][4];
#pragma unroll
    for (unsigned int i = 0; i < 8; ++i)
        for (unsigned int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (unsigned int k0 = k_begin; k0 < k; k0 += GEMM_BK) {
        const unsigned int kk = k0 + 2u * st.kp;
#pragma unroll
        for (unsigned int i = 0; i < GEMM_STAGE_ROWS; ++i) {
            const unsigned int r = threadIdx.x / GEMM_KP + 8u * i;
            st.load_a(op, i, kk, k, &as[r][2u * st.kp], &as[r][2u * st.kp + 1u]);
            st.template load_w2<FMT>(w, i, kk, k, &ws[r][2u * st.kp], &ws[r][2u * st.kp + 1u]);
        }
        __syncthreads();
        const unsigned int steps = k - k0 < GEMM_BK ? k - k0 : GEMM_BK;
        for (unsigned int t = 0; t < steps; ++t) {
            float b[4];
#pragma unroll
            for (unsigned int j = 0; j < 4; ++j) b[j] = ws[2u * tc + 32u * (j >> 1) + (j & 1u)][t];
#pragma unroll
            for (unsigned int i = 0; i < 8; ++i) {
                const float av = as[tr + 8u * i][t];
#pragma unroll
                for (unsigned int j = 0; j < 4; ++j) acc[i][j] = fmaf(av, b[j], acc[i][j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (unsigned int i = 0; i < 8; ++i) {
        const unsigned int m = row0 + tr + 8u * i;
        for (unsigned int j = 0; j < 2; ++j) {
            const unsigned int c = col0 + 2u * tc + 32u * j;
            if (m < rows && c < cols) op.store2(m, c, acc[i][2 * j], acc[i][2 * j + 1]);
        }
    }
}

// Tensor-core path. Shared: the three bf16 terms of the A tile and the one (bf16) or two (f16)
// terms of the W tile, each [64][GEMM_KP_PAD] words of two bf16 (k, k + 1). Warp (wm, wn) =
// (warp / 2, warp % 2) owns rows wm*32 + 16i (i < 2) and columns wn*32 + 8j (j < 4).
template <int FMT, class Op>
__device__ __forceinline__ void gemm_tile_mma(const Op& op, const void* w, unsigned int rows, unsigned int cols,
                                              unsigned int k, unsigned int row0, unsigned int col0,
                                              unsigned int k_begin) {
    // fast: one rounded f16 term of each operand; exact: x in three bf16, an f16 weight in two.
    // FAST depends on FMT so that the branch of the other mode is never instantiated.
    constexpr bool FAST = FOVEA_FAST && FMT >= 0;
    constexpr unsigned int ATERMS = FAST ? 1 : 3;
    constexpr unsigned int WTERMS = (!FAST && FMT == 2) ? 2 : 1;
    __shared__ unsigned int as[ATERMS][GEMM_BM][GEMM_KP_PAD];
    __shared__ unsigned int ws[WTERMS][GEMM_BN][GEMM_KP_PAD];
    const unsigned int lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
    const unsigned int g = lane / 4u, t = lane % 4u;
    const unsigned int wm = warp / 2u, wn = warp % 2u;
    // hi·w_hi in acc, the smaller terms in aux (see gemm_combine)
    float acc[2][4][4], aux[2][4][4];
#pragma unroll
    for (unsigned int i = 0; i < 2; ++i)
        for (unsigned int j = 0; j < 4; ++j)
            for (unsigned int e = 0; e < 4; ++e) acc[i][j][e] = aux[i][j][e] = 0.0f;

    // tile row r, word kw (a k pair) of the step: x0, x1 and w0, w1 as this mode's terms
    const auto stage_pair = [&](unsigned int r, unsigned int kw, float x0, float x1, float w0, float w1) {
        if constexpr (FAST) {
            as[0][r][kw] = f16x2_rn(x0, x1);
            ws[0][r][kw] = f16x2_rn(w0, w1);
        } else {
            unsigned int h0, m0, l0, h1, m1, l1;
            split_bf16x3(x0, &h0, &m0, &l0);
            split_bf16x3(x1, &h1, &m1, &l1);
            as[0][r][kw] = h0 | (h1 << 16);
            as[1][r][kw] = m0 | (m1 << 16);
            as[2][r][kw] = l0 | (l1 << 16);
            if constexpr (FMT == 2) {
                unsigned int wh0, wl0, wh1, wl1;
                split_bf16x2(w0, &wh0, &wl0);
                split_bf16x2(w1, &wh1, &wl1);
                ws[0][r][kw] = wh0 | (wh1 << 16);
                ws[1][r][kw] = wl0 | (wl1 << 16);
            } else {
                // bf16 weights: the decoded f32 is exact, its upper 16 bits are the weight
                ws[0][r][kw] = (__float_as_uint(w0) >> 16) | (__float_as_uint(w1) >> 16 << 16);
            }
        }
    };
    // the MMAs of one staged k step
    const auto multiply = [&]() {
        for (unsigned int ks = 0; ks < GEMM_KP; ks += 8u) { // two k16 steps per GEMM_BK
            unsigned int af[ATERMS][2][4];
#pragma unroll
            for (unsigned int s = 0; s < ATERMS; ++s)
                for (unsigned int i = 0; i < 2; ++i) {
                    const unsigned int r = wm * 32u + 16u * i + g;
                    af[s][i][0] = as[s][r][ks + t];
                    af[s][i][1] = as[s][r + 8u][ks + t];
                    af[s][i][2] = as[s][r][ks + t + 4u];
                    af[s][i][3] = as[s][r + 8u][ks + t + 4u];
                }
#pragma unroll
            for (unsigned int j = 0; j < 4; ++j) {
                const unsigned int c = wn * 32u + 8u * j + g;
                unsigned int bf[WTERMS][2];
                for (unsigned int q = 0; q < WTERMS; ++q) {
                    bf[q][0] = ws[q][c][ks + t];
                    bf[q][1] = ws[q][c][ks + t + 4u];
                }
#pragma unroll
                for (unsigned int i = 0; i < 2; ++i) {
                    if constexpr (!FAST) {
                        // smallest terms first
                        mma_m16n8k16_bf16(aux[i][j], af[2][i], bf[0]);
                        if constexpr (FMT == 2) mma_m16n8k16_bf16(aux[i][j], af[1][i], bf[1]);
                        mma_m16n8k16_bf16(aux[i][j], af[1][i], bf[0]);
                        if constexpr (FMT == 2) mma_m16n8k16_bf16(aux[i][j], af[0][i], bf[1]);
                    }
                    if constexpr (FAST)
                        mma_m16n8k16_f16(acc[i][j], af[0][i], bf[0]);
                    else
                        mma_m16n8k16_bf16(acc[i][j], af[0][i], bf[0]);
                }
            }
        }
    };

    // Staging, by one of two assignments of the same shared tiles. Either way a thread loads
    // (and a block format decodes) its values of the next k step into registers (xa, wa) before
    // the current step's MMAs, so that the loads are in flight meanwhile.
    // - runs: thread (rr = tid / 4, kr = tid % 4) takes tile rows rr and rr + 32, elements
    //   8kr .. 8kr + 7 of the step (row i at xa/wa [8i, 8i + 8)): A in two 16-byte loads, W as one
    //   8-run (load_w_run: 16-byte loads, a block format's run decoded once). It needs contiguous A
    //   rows (the Op says so), k % 8 == 0 and rows aligned as the small-row path's runs need them,
    //   in every thread of the block;
    // - pairs, otherwise (odd shapes, the aligner's gathered rows): tile rows tid / 16 + 8i
    //   (i < 8), k pair tid % 16 (GemmStage), element loads (row i at xa/wa [2i, 2i + 2)).
    // The two are separate loops so that each keeps only its own addressing in registers.
    float xa[16], wa[16];
    constexpr unsigned int RUN_ROWS = GEMM_BM * GEMM_BK / GEMV_RUN / GEMM_THREADS; // 2
    bool runs = false;
    const float* a_run[RUN_ROWS];
    u64 w_run[RUN_ROWS];
    const unsigned int rr = threadIdx.x / 4u, kr = threadIdx.x % 4u;
    if constexpr (Op::CONTIGUOUS) {
        bool ok = k % GEMV_RUN == 0u && k_begin % GEMV_RUN == 0u;
#pragma unroll
        for (unsigned int i = 0; i < RUN_ROWS; ++i) {
            const unsigned int r = rr + 32u * i;
            a_run[i] = row0 + r < rows ? op.a_row(row0 + r) : 0;
            w_run[i] = col0 + r < cols ? op.w_row(col0 + r) : ~0ull;
            ok = ok && ((u64)a_run[i] & 15u) == 0u && (w_run[i] == ~0ull || gemv_w_aligned<FMT>(w, w_run[i]));
        }
        runs = __syncthreads_and(ok);
    }
    if (runs) {
        const auto fetch = [&](unsigned int k0) {
            const unsigned int kk = k0 + GEMV_RUN * kr;
#pragma unroll
            for (unsigned int i = 0; i < RUN_ROWS; ++i) {
                float* x = xa + GEMV_RUN * i;
                float* v = wa + GEMV_RUN * i;
                if (a_run[i] && kk < k) {
                    const fa_f4 lo = *reinterpret_cast<const fa_f4*>(a_run[i] + kk);
                    const fa_f4 hi = *reinterpret_cast<const fa_f4*>(a_run[i] + kk + 4u);
                    x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w;
                    x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
                } else {
#pragma unroll
                    for (unsigned int e = 0; e < GEMV_RUN; ++e) x[e] = 0.0f;
                }
                if (w_run[i] != ~0ull && kk < k) {
                    load_w_run<FMT>(w, w_run[i] + kk, v);
                } else {
#pragma unroll
                    for (unsigned int e = 0; e < GEMV_RUN; ++e) v[e] = 0.0f;
                }
            }
        };
        fetch(k_begin);
        for (unsigned int k0 = k_begin; k0 < k; k0 += GEMM_BK) {
#pragma unroll
            for (unsigned int i = 0; i < RUN_ROWS; ++i)
#pragma unroll
                for (unsigned int e = 0; e < GEMV_RUN / 2u; ++e) {
                    const unsigned int at = GEMV_RUN * i + 2u * e;
                    stage_pair(rr + 32u * i, 4u * kr + e, xa[at], xa[at + 1u], wa[at], wa[at + 1u]);
                }
            __syncthreads();
            if (k0 + GEMM_BK < k) fetch(k0 + GEMM_BK);
            multiply();
            __syncthreads();
        }
    } else {
        GemmStage<Op> st;
        st.init(op, rows, cols, row0, col0);
        const auto fetch = [&](unsigned int k0) {
            const unsigned int kk = k0 + 2u * st.kp;
#pragma unroll
            for (unsigned int i = 0; i < GEMM_STAGE_ROWS; ++i) {
                st.load_a(op, i, kk, k, &xa[2 * i], &xa[2 * i + 1]);
                st.template load_w2<FMT>(w, i, kk, k, &wa[2 * i], &wa[2 * i + 1]);
            }
        };
        fetch(k_begin);
        for (unsigned int k0 = k_begin; k0 < k; k0 += GEMM_BK) {
#pragma unroll
            for (unsigned int i = 0; i < GEMM_STAGE_ROWS; ++i)
                stage_pair(threadIdx.x / GEMM_KP + 8u * i, st.kp, xa[2 * i], xa[2 * i + 1], wa[2 * i], wa[2 * i + 1]);
            __syncthreads();
            if (k0 + GEMM_BK < k) fetch(k0 + GEMM_BK);
            multiply();
            __syncthreads();
        }
    }
#pragma unroll
    for (unsigned int i = 0; i < 2; ++i)
#pragma unroll
        for (unsigned int j = 0; j < 4; ++j) {
            const unsigned int m = row0 + wm * 32u + 16u * i + g;
            const unsigned int c = col0 + wn * 32u + 8u * j + 2u * t;
            if (c >= cols) continue;
            const float* v = acc[i][j];
            const float* s = aux[i][j];
            if (m < rows) op.store2(m, c, gemm_combine(v[0], s[0]), gemm_combine(v[1], s[1]));
            if (m + 8u < rows) op.store2(m + 8u, c, gemm_combine(v[2], s[2]), gemm_combine(v[3], s[3]));
        }
}

// The block's tile: blockDim.x == GEMM_THREADS.
// Block formats take the FMA path on every device: a decoded weight is a product such as
// (d * sc) * q - dmin * m, with up to 24 significant bits, so unlike bf16 (one term) and f16 (two)
// it is not exact in one or two bf16 terms; a three-term split of it would make 9 MMAs (or 6,
// dropping the smallest cross terms, no longer exact) per product where the FMA path keeps f32
// products of the exact decoded value, the same arithmetic as f32 weights. Faster block-format
// tiles (decode once per block into shared memory, integer MMAs) are the speed issue's.
// In fast precision every format takes the tensor cores (one rounded f16 term per operand).
// k_begin .. k is the k range the tile sums (k_begin a multiple of GEMM_BK): 0 .. the row length,
// or one range of a k split (linear.cu); operand offsets stay those of whole rows.
template <int FMT, class Op>
__device__ __forceinline__ void gemm_tile(const Op& op, const void* w, unsigned int rows, unsigned int cols,
                                          unsigned int k, unsigned int row0, unsigned int col0,
                                          unsigned int k_begin = 0u) {
    if constexpr ((FOVEA_FAST || FMT == 1 || FMT == 2) && GEMM_TENSOR_CORES)
        gemm_tile_mma<FMT>(op, w, rows, cols, k, row0, col0, k_begin);
    else
        gemm_tile_fma<FMT>(op, w, rows, cols, k, row0, col0, k_begin);
}

// Few rows (decode: one token, or the few slots of each expert): a 64-row tile would stage
// mostly zeros and give only cols / 64 blocks to stream the weight. Instead a block owns one pair
// of output columns (c, c + 1) for all rows (up to GEMV_ROWS), and its threads stride over k in
// runs of GEMV_RUN elements: thread t takes runs t, t + GEMM_THREADS, ..., so a warp reads 32
// adjacent 16-byte pieces of a 16-bit weight row (coalesced), and the unrolled run loop keeps
// several independent loads in flight per thread. One block per column pair keeps the memory busy
// at every width: a 1024-column projection is 512 blocks of 4 warps. Plain f32 FMAs of the
// decoded weights (the f32 path's products) in both precisions: the path is bound by memory, not
// arithmetic. The warps' sums meet by shuffles, then in shared memory in warp order.
// Measured on an H200 (Nsight Compute, a full-size layer's decode step): the first version, a
// warp per column pair reading one 2-byte element per lane per step, streamed 130-530 GB/s; this
// one 1.0-2.1 TB/s on the matrices of 8 MB and more (Nsight flushes the caches between
// kernels). Three variants measured slower and were dropped: a warp per pair for wide outputs
// (faster only at k = 1024), loads batched explicitly into arrays (the experts 30-60 % slower),
// and for block formats a warp per pair, four pairs a block, 8 runs in flight a lane (the q2 mix's
// whole-model decode 43.7 ms against 41.6 ms a token, same sitting, 2026-12-02), and for block
// formats a thread per 32-run (its scales and indices decoded once for 32 values: 17 % fewer
// instructions in the IQ2_XXS experts, but a warp's loads then span 32 blocks, and the Q8_0
// projections took 1.5-2x as long; one q2 layer's step 1.16 ms against 0.75, same sitting).
// Runs need k % GEMV_RUN == 0, 16-byte aligned rows of A and of float weights, and a block-format
// matrix base aligned to WBlock::ALIGN; otherwise (odd shapes in the op harness) every thread takes
// single elements, with the same reduction.
// Block GEMM_THREADS; block b owns columns 2b, 2b + 1.
#define GEMV_ROWS 8
#define GEMV_WARPS (GEMM_THREADS / 32)

// Eight 16-bit weights (one 16-byte load).
struct alignas(16) gemv_u4 {
    unsigned int x, y, z, w;
};

// W elements idx .. idx + GEMV_RUN - 1 of one row, decoded to f32. f32 and 16-bit rows come in
// 16-byte loads (the caller checked the alignment); a block format decodes the run from its
// block (k is a whole number of blocks, so a run of 8 at a multiple of 8 never crosses one).
template <int FMT>
__device__ __forceinline__ void load_w_run(const void* w, u64 idx, float* out) {
    if constexpr (FMT == 0) {
        const fa_f4* p = reinterpret_cast<const fa_f4*>(static_cast<const float*>(w) + idx);
        const fa_f4 a = p[0], b = p[1];
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
        out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else if constexpr (FMT == 1 || FMT == 2) {
        const gemv_u4 q = *reinterpret_cast<const gemv_u4*>(static_cast<const unsigned short*>(w) + idx);
        const unsigned int words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (unsigned int i = 0; i < 4; ++i) {
            if constexpr (FMT == 1) {
                out[2 * i] = __uint_as_float(words[i] << 16);
                out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
            } else {
                out[2 * i] = f16_to_f32(words[i] & 0xffffu);
                out[2 * i + 1] = f16_to_f32(words[i] >> 16);
            }
        }
    } else {
        static_assert(GEMV_RUN == 8, "dq_run8 decodes runs of 8");
        dq_run8<FMT>(w, idx, out);
    }
}

// Whether W row `row` (an element offset) starts on 16 bytes, as load_w_run's vector loads need;
// for a block format (rows start on block boundaries), whether the matrix base has dq_run8's alignment.
template <int FMT>
__device__ __forceinline__ bool gemv_w_aligned(const void* w, u64 row) {
    if constexpr (FMT == 0)
        return ((u64)(static_cast<const float*>(w) + row) & 15u) == 0u;
    else if constexpr (FMT == 1 || FMT == 2)
        return ((u64)(static_cast<const unsigned short*>(w) + row) & 15u) == 0u;
    else
        return ((u64)w & (WBlock<FMT>::ALIGN - 1u)) == 0u;
}

// acc[i] += the products of x row i's elements kk .. kk + 7 (16-byte loads) with the two columns'
// decoded 8-runs, for the rows that exist.
template <unsigned int R>
__device__ __forceinline__ void gemv_fma_run(const float* const* a, unsigned int rows, unsigned int kk,
                                             const float* wa, const float* wb, float (*acc)[2]) {
#pragma unroll
    for (unsigned int i = 0; i < R; ++i)
        if (i < rows) {
            const fa_f4* xp = reinterpret_cast<const fa_f4*>(a[i] + kk);
            const fa_f4 xa = xp[0], xb = xp[1];
            const float xv[GEMV_RUN] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
            for (unsigned int e = 0; e < GEMV_RUN; ++e) {
                acc[i][0] = fmaf(xv[e], wa[e], acc[i][0]);
                acc[i][1] = fmaf(xv[e], wb[e], acc[i][1]);
            }
        }
}

template <int FMT, unsigned int R, class Op>
__device__ __forceinline__ void gemv_cols(const Op& op, const void* w, unsigned int rows, unsigned int cols,
                                          unsigned int k, unsigned int k0, unsigned int k1, unsigned int block) {
    __shared__ float part[GEMV_WARPS][R][2];
    const unsigned int lane = threadIdx.x % 32u, warp = threadIdx.x / 32u;
    const unsigned int c = 2u * block;
    // no early return: every thread of the block reaches the shuffles and the barrier. A missing
    // second column reads the first's row (in bounds); store2 drops its sum.
    const bool have0 = c < cols, have1 = c + 1u < cols;
    const u64 w0 = have0 ? op.w_row(c) : 0, w1 = have1 ? op.w_row(c + 1u) : w0;
    const float* a[R];
    bool runs = k % GEMV_RUN == 0u && k0 % GEMV_RUN == 0u && gemv_w_aligned<FMT>(w, w0) && gemv_w_aligned<FMT>(w, w1);
#pragma unroll
    for (unsigned int i = 0; i < R; ++i) {
        a[i] = i < rows ? op.a_row(i) : 0;
        if (i < rows) runs = runs && ((u64)a[i] & 15u) == 0u;
    }
    float acc[R][2];
#pragma unroll
    for (unsigned int i = 0; i < R; ++i) acc[i][0] = acc[i][1] = 0.0f;
    if (have0 && runs) {
#pragma unroll 4
        for (unsigned int kk = k0 + GEMV_RUN * threadIdx.x; kk < k1; kk += GEMV_RUN * GEMM_THREADS) {
            float wa[GEMV_RUN], wb[GEMV_RUN];
            load_w_run<FMT>(w, w0 + kk, wa);
            load_w_run<FMT>(w, w1 + kk, wb);
            gemv_fma_run<R>(a, rows, kk, wa, wb, acc);
        }
    } else if (have0) {
        for (unsigned int kk = k0 + threadIdx.x; kk < k1; kk += GEMM_THREADS) {
            const float wa = load_w<FMT>(w, w0 + kk), wb = load_w<FMT>(w, w1 + kk);
#pragma unroll
            for (unsigned int i = 0; i < R; ++i)
                if (i < rows) {
                    acc[i][0] = fmaf(a[i][kk], wa, acc[i][0]);
                    acc[i][1] = fmaf(a[i][kk], wb, acc[i][1]);
                }
        }
    }
#pragma unroll
    for (unsigned int i = 0; i < R; ++i)
        for (int o = 16; o > 0; o >>= 1) {
            acc[i][0] += __shfl_xor_sync(0xffffffffu, acc[i][0], o);
            acc[i][1] += __shfl_xor_sync(0xffffffffu, acc[i][1], o);
        }
    if (lane == 0)
#pragma unroll
        for (unsigned int i = 0; i < R; ++i) {
            part[warp][i][0] = acc[i][0];
            part[warp][i][1] = acc[i][1];
        }
    __syncthreads();
    if (have0 && threadIdx.x < rows && threadIdx.x < R) {
        const unsigned int i = threadIdx.x;
        float v0 = 0.0f, v1 = 0.0f;
        for (unsigned int v = 0; v < GEMV_WARPS; ++v) {
            v0 += part[v][i][0];
            v1 += part[v][i][1];
        }
        op.store2(i, c, v0, v1);
    }
}

// gemv_cols over k-range k0 .. k1 of rows of k (a split's, linear.cu; else 0 .. k) for `rows`
// (1 ..= GEMV_ROWS) rows: a decode step of one sequence (one row, and one row in each routed
// expert's tile) gets the one-row instantiation, without the registers and the per-row tests of
// eight.
template <int FMT, class Op>
__device__ __forceinline__ void gemv_block(const Op& op, const void* w, unsigned int rows, unsigned int cols,
                                           unsigned int k, unsigned int k0, unsigned int k1, unsigned int block) {
    if (rows == 1u)
        gemv_cols<FMT, 1>(op, w, rows, cols, k, k0, k1, block);
    else
        gemv_cols<FMT, GEMV_ROWS>(op, w, rows, cols, k, k0, k1, block);
}

// The GEMM of one block, for operands of `rows` rows (rows <= bound_rows, the same bound in
// every block of the launch): the small-row path when bound_rows <= GEMV_ROWS, the column pair
// col_block; else the GEMM_BM x GEMM_BN tile (row_tile, col_block). The host
// sizes the grid by the same rule (`gemm_grid` in src/backend/cuda/mod.rs).
// The build fixes the path (see "GEMM builds" at the top): the host launches the rows build
// exactly when bound_rows <= GEMV_ROWS; a launch against that rule traps rather than computing
// part of the rows.
template <int FMT, class Op>
__device__ __forceinline__ void gemm_block(const Op& op, const void* w, unsigned int rows, unsigned int cols,
                                           unsigned int k, unsigned int bound_rows, unsigned int col_block,
                                           unsigned int row_tile) {
#if FOVEA_GEMM_PATH == GEMM_PATH_ROWS
    if (bound_rows > GEMV_ROWS) __trap();
    gemv_block<FMT>(op, w, rows, cols, k, 0u, k, col_block);
#elif FOVEA_GEMM_PATH == GEMM_PATH_TILES
    if (bound_rows <= GEMV_ROWS) __trap();
    gemm_tile<FMT>(op, w, rows, cols, k, row_tile * GEMM_BM, col_block * GEMM_BN);
#else
    if (bound_rows <= GEMV_ROWS)
        gemv_block<FMT>(op, w, rows, cols, k, 0u, k, col_block);
    else
        gemm_tile<FMT>(op, w, rows, cols, k, row_tile * GEMM_BM, col_block * GEMM_BN);
#endif
}
