// Host emulation of the tiny subset of CUDA the kernels in cuda/ use, so their *logic* (indexing,
// reductions, barriers, online softmax, weight decoding) can be checked with g++ on a machine
// without a GPU. It is not a CUDA compiler check: NVRTC is stricter about some things and looser
// about others. Blocks run one after another; the threads of a block are real std::threads
// meeting at a std::barrier, so __syncthreads and __shfl_xor_sync behave like a block-wide sync.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline std::barrier<>* g_bar = nullptr;
inline std::vector<float> g_shfl;
inline std::vector<float> g_dyn_smem;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

inline void __syncthreads() { g_bar->arrive_and_wait(); }
inline unsigned emu_tid() { return threadIdx.y * blockDim.x + threadIdx.x; }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    unsigned t = emu_tid();
    g_shfl[t] = v;
    g_bar->arrive_and_wait();
    float r = g_shfl[t ^ (unsigned)o];
    g_bar->arrive_and_wait();
    return r;
}
inline unsigned __shfl_xor_sync(unsigned mask, unsigned v, int o) {
    float f, r;
    std::memcpy(&f, &v, 4);
    r = __shfl_xor_sync(mask, f, o); // the bits travel untouched (a copy, no arithmetic)
    unsigned u;
    std::memcpy(&u, &r, 4);
    return u;
}
// Only for kernels whose block is one warp (the emulated barrier is block-wide).
inline void __syncwarp(unsigned = 0xffffffffu) { g_bar->arrive_and_wait(); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
#include <math.h> // erfcf, expf, fmaf, fmaxf, sqrtf in the global namespace, as in CUDA

// Run kernel(args...) over grid x block, blocks sequentially, threads of a block concurrently.
template <typename... A>
void emu_launch(void (*k)(A...), dim3 grid, dim3 block, size_t dyn_smem_bytes, A... args) {
    gridDim = grid;
    blockDim = block;
    const unsigned nt = block.x * block.y;
    g_shfl.assign(nt, 0.0f);
    g_dyn_smem.assign(dyn_smem_bytes / 4 + 1, 0.0f);
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::barrier<> bar(nt);
            g_bar = &bar;
            std::vector<std::thread> ts;
            for (unsigned ty = 0; ty < block.y; ++ty)
                for (unsigned tx = 0; tx < block.x; ++tx)
                    ts.emplace_back([=] {
                        threadIdx = dim3{tx, ty, 0};
                        blockIdx = dim3{bx, by, bz};
                        k(args...);
                    });
            for (auto& t : ts) t.join();
        }
}
