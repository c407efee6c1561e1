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
