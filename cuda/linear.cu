// linear_{f32,bf16,f16}: y [n, out] = x [n, k] . W [out, k]^T (+ bias [out]).
// The weight keeps its storage format in device memory and is decoded (and, on tensor cores,
// split into bf16 terms) as it is staged into shared memory; the GEMM is common.cuh's gemm_tile.
// Block GEMM_THREADS (1-D), grid (ceil(out / GEMM_BN), ceil(n / GEMM_BM)).

// Plain rows of x and W; the epilogue adds the bias.
struct LinearOperands {
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

template <int FMT>
__device__ __forceinline__ void linear_tiled(const float* x, const void* w, const float* bias, float* y,
                                             unsigned int n, unsigned int k, unsigned int out,
                                             unsigned int has_bias) {
    const LinearOperands op{x, has_bias ? bias : 0, y, k, out};
    gemm_tile<FMT>(op, w, n, out, k, blockIdx.y * GEMM_BM, blockIdx.x * GEMM_BN);
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
