// linear_{f32,bf16,f16}: y [n, out] = x [n, k] . W [out, k]^T (+ bias [out]).
// The weight keeps its storage format in device memory and is decoded here, element by element,
// as it is staged into shared memory: f32 as is, bf16 = the upper 16 bits of an f32, f16 by an
// exact integer decode (subnormals, inf and NaN included; no cuda_fp16.h needed).
//
// Plain 16x16 shared-memory tiling (one output per thread), not tuned: block (16, 16),
// grid (ceil(out/16), ceil(n/16)). threadIdx.x walks output columns, threadIdx.y rows of x.

#define TILE 16

// f16_to_f32 and load_w<FMT> live in common.cuh (shared with the LM kernels).

template <int FMT>
__device__ __forceinline__ void linear_tiled(const float* x, const void* w, const float* bias, float* y,
                                             unsigned int n, unsigned int k, unsigned int out,
                                             unsigned int has_bias) {
    __shared__ float xs[TILE][TILE + 1];
    __shared__ float ws[TILE][TILE + 1];
    const unsigned int tx = threadIdx.x, ty = threadIdx.y;
    const unsigned int row = blockIdx.y * TILE + ty;  // row of x and y
    const unsigned int col = blockIdx.x * TILE + tx;  // output column = weight row
    const unsigned int wrow = blockIdx.x * TILE + ty; // weight row this thread stages
    float acc = 0.0f;
    for (unsigned int k0 = 0; k0 < k; k0 += TILE) {
        const unsigned int kk = k0 + tx;
        xs[ty][tx] = (row < n && kk < k) ? x[(u64)row * k + kk] : 0.0f;
        ws[ty][tx] = (wrow < out && kk < k) ? load_w<FMT>(w, (u64)wrow * k + kk) : 0.0f;
        __syncthreads();
        for (unsigned int t = 0; t < TILE; ++t) acc = fmaf(xs[ty][t], ws[tx][t], acc);
        __syncthreads();
    }
    if (row < n && col < out) y[(u64)row * out + col] = acc + (has_bias ? bias[col] : 0.0f);
}

extern "C" __global__ void linear_f32(const float* x, const float* w, const float* bias, float* y, unsigned int n,
                                      unsigned int k, unsigned int out, unsigned int has_bias) {
    linear_tiled<0>(x, w, bias, y, n, k, out, has_bias);
}

extern "C" __global__ void linear_bf16(const float* x, const unsigned short* w, const float* bias, float* y,
                                       unsigned int n, unsigned int k, unsigned int out, unsigned int has_bias) {
    linear_tiled<1>(x, w, bias, y, n, k, out, has_bias);
}

extern "C" __global__ void linear_f16(const float* x, const unsigned short* w, const float* bias, float* y,
                                      unsigned int n, unsigned int k, unsigned int out, unsigned int has_bias) {
    linear_tiled<2>(x, w, bias, y, n, k, out, has_bias);
}
