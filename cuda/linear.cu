// linear_{f32,bf16,f16} and linear_<block format> (FOR_EACH_BLOCK_FORMAT in cuda/dequant.cuh:
// linear_q8_0, ..., linear_fp8_e4m3_b128_f32): y [n, out] = x [n, k] . W [out, k]^T (+ bias [out]),
// or a split over k into part (below).
// unfold_linear_gelu_{f32,bf16,f16,<block format>}: the aligner's first layer, gelu_erf(unfold(x) . W^T + bias),
// with the zero-padded r x r unfold gathered in the A operand loads (no unfold buffer).
// The weight keeps its storage format in device memory and is decoded (and, on tensor cores,
// split into bf16 terms) as it is staged into shared memory; the GEMM is common.cuh's gemm_block
// (gemm_tile, or gemv_cols for a few rows, in the file's rows build). Block GEMM_THREADS (1-D),
// grid (column blocks, row tiles) as gemm_block says.

// Plain rows of x and W; the epilogue adds the bias.
struct LinearOperands : ContiguousRows {
    const float* x;
    const float* bias; // [out], or null
    float* y;
    unsigned int k, out;

    __device__ __forceinline__ const float* a_row(unsigned int m) const { return x + (u64)m * k; }
    __device__ __forceinline__ u64 w_row(unsigned int c) const { return (u64)c * k; }
    __device__ __forceinline__ void store2(unsigned int m, unsigned int c, float v0, float v1) const {
        float* yr = y + (u64)m * out;
        yr[c] = v0 + (bias ? bias[c] : 0.0f);
        if (c + 1u < out) yr[c + 1u] = v1 + (bias ? bias[c + 1u] : 0.0f);
    }
};

// Few output columns (a hyper-connection mix: 24 columns of 16384) give too few blocks to stream
// the weight, so the host splits k: block (.., s) takes k-range s, k_chunk wide (a multiple of
// 1024), and stores its plain sums in part [s] [n, out]; sum_splits_f32 (elementwise.cu) adds the
// ranges in order and the bias. The small-row path's splits are gridDim.y (block (pair, s)); the
// tile path's are gridDim.z (block (column block, row tile, s)), its gridDim.y being the row tiles.
template <int FMT>
__device__ __forceinline__ void linear_tiled(const float* x, const void* w, const float* bias, float* y, float* part,
                                             unsigned int n, unsigned int k, unsigned int out,
                                             unsigned int has_bias, unsigned int k_chunk) {
#if FOVEA_GEMM_PATH != GEMM_PATH_TILES
    if (n <= GEMV_ROWS && gridDim.y > 1u) {
        const unsigned int k0 = blockIdx.y * k_chunk, k1 = k - k0 > k_chunk ? k0 + k_chunk : k;
        const LinearOperands op{{}, x, 0, part + (u64)blockIdx.y * n * out, k, out};
        gemv_block<FMT>(op, w, n, out, k, k0, k1, blockIdx.x);
        return;
    }
#endif
#if FOVEA_GEMM_PATH != GEMM_PATH_ROWS
    if (n > GEMV_ROWS && gridDim.z > 1u) {
        const unsigned int k0 = blockIdx.z * k_chunk, k1 = k - k0 > k_chunk ? k0 + k_chunk : k;
        const LinearOperands op{{}, x, 0, part + (u64)blockIdx.z * n * out, k, out};
        gemm_tile<FMT>(op, w, n, out, k1, blockIdx.y * GEMM_BM, blockIdx.x * GEMM_BN, k0);
        return;
    }
#endif
    const LinearOperands op{{}, x, has_bias ? bias : 0, y, k, out};
    gemm_block<FMT>(op, w, n, out, k, n, blockIdx.x, blockIdx.y);
}

GEMM_KERNEL void GEMM_LAUNCH linear_f32(const float* x, const float* w, const float* bias, float* y, float* part, unsigned int n,
                            unsigned int k, unsigned int out, unsigned int has_bias, unsigned int k_chunk) {
    grid_wait();
    linear_tiled<0>(x, w, bias, y, part, n, k, out, has_bias, k_chunk);
}

GEMM_KERNEL void GEMM_LAUNCH linear_bf16(const float* x, const unsigned short* w, const float* bias, float* y, float* part,
                             unsigned int n, unsigned int k, unsigned int out, unsigned int has_bias, unsigned int k_chunk) {
    grid_wait();
    linear_tiled<1>(x, w, bias, y, part, n, k, out, has_bias, k_chunk);
}

GEMM_KERNEL void GEMM_LAUNCH linear_f16(const float* x, const unsigned short* w, const float* bias, float* y, float* part,
                            unsigned int n, unsigned int k, unsigned int out, unsigned int has_bias, unsigned int k_chunk) {
    grid_wait();
    linear_tiled<2>(x, w, bias, y, part, n, k, out, has_bias, k_chunk);
}

#define LINEAR_BLOCK_KERNEL(SFX, FMT)                                                                       \
    extern "C" __global__ void GEMM_LAUNCH linear_##SFX(const float* x, const void* w, const float* bias, float* y, \
                                                        float* part, unsigned int n, unsigned int k,                \
                                                        unsigned int out, unsigned int has_bias,                    \
                                                        unsigned int k_chunk) { grid_wait();                        \
        linear_tiled<FMT>(x, w, bias, y, part, n, k, out, has_bias, k_chunk);                                       \
    }
FOR_EACH_BLOCK_FORMAT(LINEAR_BLOCK_KERNEL)

// linear_pair_{f32,bf16,f16,<block format>}: two weights of one format read against the same
// rows of x (at most GEMV_ROWS of them, no bias), ya [n, out_a] = x . Wa^T and yb [n, out_b] =
// x . Wb^T, in one launch of the small-row path: blocks 0 .. pairs_a take Wa's column pairs, the
// rest Wb's, each as linear's unsplit small-row launch takes it (the same bits). Rows build only;
// block GEMM_THREADS, grid (ceil(out_a / 2) + ceil(out_b / 2)).
#if FOVEA_GEMM_PATH != GEMM_PATH_TILES
template <int FMT>
__device__ __forceinline__ void linear_pair_rows(const float* x, const void* wa, const void* wb, float* ya, float* yb,
                                                 unsigned int n, unsigned int k, unsigned int out_a,
                                                 unsigned int out_b) {
    const unsigned int pairs_a = (out_a + 1u) / 2u;
    const bool b = blockIdx.x >= pairs_a;
    const unsigned int out = b ? out_b : out_a;
    const LinearOperands op{{}, x, 0, b ? yb : ya, k, out};
    gemv_block<FMT>(op, b ? wb : wa, n, out, k, 0u, k, b ? blockIdx.x - pairs_a : blockIdx.x);
}

GEMM_KERNEL void GEMM_LAUNCH linear_pair_f32(const float* x, const float* wa, const float* wb, float* ya, float* yb,
                                             unsigned int n, unsigned int k, unsigned int out_a, unsigned int out_b) {
    grid_wait();
    linear_pair_rows<0>(x, wa, wb, ya, yb, n, k, out_a, out_b);
}

GEMM_KERNEL void GEMM_LAUNCH linear_pair_bf16(const float* x, const unsigned short* wa, const unsigned short* wb,
                                              float* ya, float* yb, unsigned int n, unsigned int k,
                                              unsigned int out_a, unsigned int out_b) {
    grid_wait();
    linear_pair_rows<1>(x, wa, wb, ya, yb, n, k, out_a, out_b);
}

GEMM_KERNEL void GEMM_LAUNCH linear_pair_f16(const float* x, const unsigned short* wa, const unsigned short* wb,
                                             float* ya, float* yb, unsigned int n, unsigned int k,
                                             unsigned int out_a, unsigned int out_b) {
    grid_wait();
    linear_pair_rows<2>(x, wa, wb, ya, yb, n, k, out_a, out_b);
}

#define LINEAR_PAIR_BLOCK_KERNEL(SFX, FMT)                                                                      \
    extern "C" __global__ void GEMM_LAUNCH linear_pair_##SFX(const float* x, const void* wa, const void* wb,     \
                                                             float* ya, float* yb, unsigned int n,                 \
                                                             unsigned int k, unsigned int out_a,                   \
                                                             unsigned int out_b) { grid_wait();                   \
        linear_pair_rows<FMT>(x, wa, wb, ya, yb, n, k, out_a, out_b);                                           \
    }
FOR_EACH_BLOCK_FORMAT(LINEAR_PAIR_BLOCK_KERNEL)
#endif

// linear_q8x_<block format>: one row of x in fast precision against a wide weight (the host takes
// it from LINEAR_Q8X_MIN_COLS columns: wq_b, the indexer's wq_b, the head), on int8
// activations (dequant.cuh, q8x_cols) in the formats q8x_dot32 takes (Q8X_IF_<format>): the
// small-row path decodes every weight to f32, ≈ 13 instructions a weight on the Q8_0 projections
// (Nsight Compute, H200). Block Q8X_THREADS, grid (ceil(out / (Q8X_WARPS · Q8X_COLS))); dynamic shared
// memory k + k / 8 bytes (5k + k / 8 with a norm); bias [out] added where has_bias. With `norm`
// (not null) the row is rms_norm(x, norm, eps) first (q8x_norm_row): a decode step's q_norm in
// wq_b's launch.
#if FOVEA_GEMM_PATH != GEMM_PATH_TILES
// The row linear_q8x_* quantizes: x itself, or with `norm` rms_norm_f32's row of x, bit for bit
// (its block sum of squares and scaling: the host fuses only where rms_norm_f32's block, row_threads(k),
// is Q8X_THREADS), written to the dynamic shared memory after the int8 row and its scales.
__device__ __forceinline__ const float* q8x_norm_row(const float* x, const float* norm, unsigned int k, float eps) {
    if (!norm) return x;
    extern __shared__ float smem[];
    __shared__ float red[32];
    float* row = smem + k / 4u + k / 32u;
    const float s = block_sum_squares(x, k, red);
    const float inv = 1.0f / sqrtf(s / (float)k + eps);
    block_scale_row(x, norm, row, k, inv);
    __syncthreads(); // the row is whole before any thread quantizes its groups
    return row;
}
#define LINEAR_Q8X_DEFINE(SFX, FMT)                                                                            \
    extern "C" __global__ void __launch_bounds__(Q8X_THREADS)                                                  \
        linear_q8x_##SFX(const float* x, const void* w, const float* bias, float* y, unsigned int k,           \
                         unsigned int out, unsigned int has_bias, const float* norm, float eps) { grid_wait(); \
        const LinearOperands op{{}, q8x_norm_row(x, norm, k, eps), has_bias ? bias : 0, y, k, out};            \
        q8x_cols<FMT>(op, w, 1u, out, k);                                                                      \
    }
#define LINEAR_Q8X_KERNEL(SFX, FMT) Q8X_IF_##SFX(LINEAR_Q8X_DEFINE(SFX, FMT))
FOR_EACH_BLOCK_FORMAT(LINEAR_Q8X_KERNEL)
#endif

// ---- the aligner's first layer --------------------------------------------------------------
// x [h*w, c] is the ViT grid (row-major); A row m is unfold cell m = (cy, cx) = (m / cells_w,
// m % cells_w), its feature kk = ch*r*r + dy*r + dx reads x[(cy*r + dy)*w + cx*r + dx][ch], zero
// past the bottom/right edge (the padding to a multiple of r): the same features, in the same
// order, as unfold_f32 (copy.cu) writes. The epilogue adds the bias and applies gelu_erf_f32's
// formula. Block GEMM_THREADS, grid (ceil(out / GEMM_BN), ceil(cells / GEMM_BM)).
struct UnfoldCell {
    unsigned int y0, x0; // the cell's top-left grid position
};

struct UnfoldOperands {
    using ARow = UnfoldCell;
    static constexpr bool CONTIGUOUS = false; // rows gathered from the grid: gemm_tile_mma stages pairs
    const float* x;
    const float* bias; // [out], or null
    float* y;
    unsigned int c, h, w, r, cells_w, k, out;

    __device__ __forceinline__ UnfoldCell a_row(unsigned int m) const {
        return UnfoldCell{m / cells_w * r, m % cells_w * r};
    }
    __device__ __forceinline__ float a_at(UnfoldCell cell, unsigned int kk) const {
        const unsigned int rr = r * r, ch = kk / rr, rem = kk - ch * rr, dy = rem / r, dx = rem - dy * r;
        const unsigned int gy = cell.y0 + dy, gx = cell.x0 + dx;
        return (gy < h && gx < w) ? x[((u64)gy * w + gx) * c + ch] : 0.0f;
    }
    __device__ __forceinline__ u64 w_row(unsigned int col) const { return (u64)col * k; }
    __device__ __forceinline__ static float gelu(float v) { return 0.5f * v * erfcf(-v * 0.70710678118654752f); }
    __device__ __forceinline__ void store2(unsigned int m, unsigned int col, float v0, float v1) const {
        float* yr = y + (u64)m * out;
        yr[col] = gelu(v0 + (bias ? bias[col] : 0.0f));
        if (col + 1u < out) yr[col + 1u] = gelu(v1 + (bias ? bias[col + 1u] : 0.0f));
    }
};

template <int FMT>
__device__ __forceinline__ void unfold_linear_gelu_tiled(const float* x, const void* w, const float* bias, float* y,
                                                         unsigned int c, unsigned int h, unsigned int gw,
                                                         unsigned int r, unsigned int cells_w, unsigned int cells,
                                                         unsigned int out, unsigned int has_bias) {
    const UnfoldOperands op{x, has_bias ? bias : 0, y, c, h, gw, r, cells_w, c * r * r, out};
    gemm_tile<FMT>(op, w, cells, out, c * r * r, blockIdx.y * GEMM_BM, blockIdx.x * GEMM_BN);
}

BASE_KERNEL void GEMM_LAUNCH unfold_linear_gelu_f32(const float* x, const float* w, const float* bias, float* y,
                                       unsigned int c, unsigned int h, unsigned int gw, unsigned int r,
                                       unsigned int cells_w, unsigned int cells, unsigned int out,
                                       unsigned int has_bias) {
    grid_wait();
    unfold_linear_gelu_tiled<0>(x, w, bias, y, c, h, gw, r, cells_w, cells, out, has_bias);
}

BASE_KERNEL void GEMM_LAUNCH unfold_linear_gelu_bf16(const float* x, const unsigned short* w, const float* bias, float* y,
                                       unsigned int c, unsigned int h, unsigned int gw, unsigned int r,
                                       unsigned int cells_w, unsigned int cells, unsigned int out,
                                       unsigned int has_bias) {
    grid_wait();
    unfold_linear_gelu_tiled<1>(x, w, bias, y, c, h, gw, r, cells_w, cells, out, has_bias);
}

BASE_KERNEL void GEMM_LAUNCH unfold_linear_gelu_f16(const float* x, const unsigned short* w, const float* bias, float* y,
                                       unsigned int c, unsigned int h, unsigned int gw, unsigned int r,
                                       unsigned int cells_w, unsigned int cells, unsigned int out,
                                       unsigned int has_bias) {
    grid_wait();
    unfold_linear_gelu_tiled<2>(x, w, bias, y, c, h, gw, r, cells_w, cells, out, has_bias);
}

#define UNFOLD_LINEAR_GELU_BLOCK_KERNEL(SFX, FMT)                                                           \
    extern "C" __global__ void GEMM_LAUNCH unfold_linear_gelu_##SFX(                                        \
        const float* x, const void* w, const float* bias, float* y, unsigned int c, unsigned int h,         \
        unsigned int gw, unsigned int r, unsigned int cells_w, unsigned int cells, unsigned int out,        \
        unsigned int has_bias) { grid_wait();                                                               \
        unfold_linear_gelu_tiled<FMT>(x, w, bias, y, c, h, gw, r, cells_w, cells, out, has_bias);           \
    }
// always the tile: no rows build (BASE_KERNEL keeps the f32/bf16/f16 ones out of it too)
#if FOVEA_GEMM_PATH != GEMM_PATH_ROWS
FOR_EACH_BLOCK_FORMAT(UNFOLD_LINEAR_GELU_BLOCK_KERNEL)
#endif

// ---- weight_f16_{f32,bf16,<block format>}: W [rows, k] in its format -> f16 [rows, k] --------
// Fast precision's cuBLASLt GEMMs (src/backend/cuda/blas.rs) take f16 operands: each value decoded
// as the tiles decode it (load_w_run) and rounded to the nearest f16 (f16x2_rn), the operand the
// fast tiles' MMAs take, so both paths multiply the same values. A thread a run of GEMV_RUN values
// (runs = rows · k / GEMV_RUN): the host checks k % GEMV_RUN == 0, so a run is one row's and, in a
// block format, one block's; every weight is an allocation of its own (256-byte aligned), which
// load_w_run's vector loads and dq_run8 need. An f16 weight is
// cuBLASLt's operand as it is (no kernel).
template <int FMT>
__device__ __forceinline__ void weight_f16(const void* w, gemv_u4* y, u64 runs) {
    for (u64 r = flat_index(); r < runs; r += flat_stride()) {
        float v[GEMV_RUN];
        load_w_run<FMT>(w, r * GEMV_RUN, v);
        y[r] = {f16x2_rn(v[0], v[1]), f16x2_rn(v[2], v[3]), f16x2_rn(v[4], v[5]), f16x2_rn(v[6], v[7])};
    }
}

BASE_KERNEL void weight_f16_f32(const float* w, gemv_u4* y, unsigned int runs) {
    grid_wait();
    weight_f16<0>(w, y, runs);
}

BASE_KERNEL void weight_f16_bf16(const unsigned short* w, gemv_u4* y, unsigned int runs) {
    grid_wait();
    weight_f16<1>(w, y, runs);
}

#define WEIGHT_F16_BLOCK_KERNEL(SFX, FMT)                                                                   \
    extern "C" __global__ void weight_f16_##SFX(const void* w, gemv_u4* y, unsigned int runs) {       \
        grid_wait();                                                                                        \
        weight_f16<FMT>(w, y, runs);                                                                        \
    }
FOR_EACH_BLOCK_FORMAT(WEIGHT_F16_BLOCK_KERNEL)
