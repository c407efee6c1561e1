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
