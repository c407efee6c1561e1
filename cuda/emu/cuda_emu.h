// Host emulation of the tiny subset of CUDA the kernels in cuda/ use, so their *logic* (indexing,
// reductions, barriers, online softmax, weight decoding) can be checked with g++ on a machine
// without a GPU. It is not a CUDA compiler check: NVRTC is stricter about some things and looser
// about others. Blocks run one after another; the threads of a block are real std::threads
// meeting at a std::barrier for __syncthreads, and the threads of a warp at the warp's own for
// its shuffles.
#pragma once
// Kernels see CUDA_EMU (common.cuh then calls emu_mma_m16n8k16_bf16 / _f16 and emu_f16x2_rn
// instead of the PTX) and an
// __CUDA_ARCH__ of EMU_CUDA_ARCH (default 900, the H200; run.sh also builds 750 for the paths
// that devices below sm_80 take).
#define CUDA_EMU 1
#ifndef EMU_CUDA_ARCH
#define EMU_CUDA_ARCH 900
#endif
#define __CUDA_ARCH__ EMU_CUDA_ARCH
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline std::barrier<>* g_bar = nullptr;
// one barrier per warp of the block (32 threads, fewer in a last partial warp): the shuffles and
// __syncwarp meet there, so a warp may shuffle while the block's other warps do something else,
// as on the device
inline std::vector<std::barrier<>*> g_warp_bar;
inline std::vector<float> g_shfl;
inline std::vector<float> g_dyn_smem;
inline std::vector<unsigned> g_mma; // per thread: the 4 A and 2 B registers of its mma fragments

#define __global__
#define __launch_bounds__(...)
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __constant__ static const

// Round-to-nearest float operations that the compiler never fuses (cuda/dequant.cuh): g++ on
// x86-64 without -mfma emits no fused multiply-add, so the plain operators round the same way.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }

inline void __syncthreads() { g_bar->arrive_and_wait(); }
inline unsigned emu_tid() { return threadIdx.y * blockDim.x + threadIdx.x; }
inline std::vector<int> g_pred; // per thread: its predicate in __syncthreads_and
// 1 when every thread of the block passes a non-zero predicate (a barrier, as in CUDA)
inline int __syncthreads_and(int p) {
    g_pred[emu_tid()] = p != 0;
    g_bar->arrive_and_wait();
    int all = 1;
    for (int v : g_pred) all &= v;
    g_bar->arrive_and_wait(); // everyone has read before the next call writes
    return all;
}
inline void emu_warp_sync() { g_warp_bar[emu_tid() / 32]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    unsigned t = emu_tid();
    g_shfl[t] = v;
    emu_warp_sync();
    float r = g_shfl[t ^ (unsigned)o];
    emu_warp_sync();
    return r;
}
// v of lane src_lane of the calling thread's warp (src_lane < 32)
inline float __shfl_sync(unsigned, float v, int src_lane) {
    unsigned t = emu_tid();
    g_shfl[t] = v;
    emu_warp_sync();
    float r = g_shfl[(t & ~31u) + (unsigned)src_lane];
    emu_warp_sync();
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
// var of lane (lane - delta) of the calling thread's warp; its own var in lanes below delta
inline unsigned __shfl_up_sync(unsigned mask, unsigned v, unsigned delta) {
    const unsigned lane = emu_tid() % 32;
    float f, r;
    std::memcpy(&f, &v, 4);
    r = __shfl_sync(mask, f, int(lane >= delta ? lane - delta : lane));
    unsigned u;
    std::memcpy(&u, &r, 4);
    return u;
}
// The lanes of the calling thread's warp whose v equals this lane's, as a mask.
inline unsigned __match_any_sync(unsigned, unsigned v) {
    const unsigned t = emu_tid(), warp0 = t & ~31u;
    std::memcpy(&g_shfl[t], &v, 4);
    emu_warp_sync();
    unsigned peers = 0;
    for (unsigned l = 0; l < 32 && warp0 + l < g_shfl.size(); ++l)
        if (std::memcmp(&g_shfl[warp0 + l], &v, 4) == 0) peers |= 1u << l;
    emu_warp_sync();
    return peers;
}
inline int __popc(unsigned v) { return std::popcount(v); }
// Four signed byte products of a and b added to c.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
// Byte n of the result is byte (s >> 4n) & 7 of the eight bytes y:x (x bytes 0-3), as CUDA's
// documentation gives __byte_perm (the selector's fourth bit is not used).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= unsigned((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
    return r;
}
inline int __ffs(int v) { return v ? std::countr_zero(unsigned(v)) + 1 : 0; }
// Shared-memory counters (the threads of a block are real threads).
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_sync(); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 of one warp, D = A . B + C, following the
// PTX ISA fragment layout (groupID g = lane >> 2, threadID_in_group t = lane % 4; each .b32 holds
// two bf16, the lower-numbered element in the low half):
//   A [16x16] register r of lane (g, t): row g + 8 (r & 1), columns 2t + 8 (r >> 1) + {0, 1}
//   B [16x8]  register r of lane (g, t): rows 2t + 8r + {0, 1}, column g
//   C/D [16x8] element e of lane (g, t): row g + 8 (e >> 1), column 2t + (e & 1)
// Every lane of the warp publishes its fragments, then computes its own four outputs (products
// summed in double, rounded once: the hardware's f32 accumulation differs in the last bits).
// The lanes of the calling warp meet (as on the device, a warp-wide instruction).
inline float emu_bf16(unsigned bits) { return __uint_as_float((bits & 0xffffu) << 16); }
inline float emu_f16(unsigned bits) {
    const uint16_t h = uint16_t(bits & 0xffffu);
    _Float16 f;
    std::memcpy(&f, &h, 2);
    return float(f);
}
// cvt.rn.f16x2.f32: lo into the low half, hi into the high half, each rounded to nearest even.
inline unsigned emu_f16x2_rn(float lo, float hi) {
    const _Float16 l = (_Float16)lo, h = (_Float16)hi;
    uint16_t lb, hb;
    std::memcpy(&lb, &l, 2);
    std::memcpy(&hb, &h, 2);
    return unsigned(lb) | (unsigned(hb) << 16);
}
inline void emu_mma_m16n8k16(float* d, const unsigned* a, const unsigned* b, float (*elem_of)(unsigned));
inline void emu_mma_m16n8k16_bf16(float* d, const unsigned* a, const unsigned* b) {
    emu_mma_m16n8k16(d, a, b, emu_bf16);
}
inline void emu_mma_m16n8k16_f16(float* d, const unsigned* a, const unsigned* b) { emu_mma_m16n8k16(d, a, b, emu_f16); }
inline void emu_mma_m16n8k16(float* d, const unsigned* a, const unsigned* b, float (*elem_of)(unsigned)) {
    const unsigned tid = emu_tid(), lane = tid % 32, warp0 = tid - lane;
    for (int r = 0; r < 4; ++r) g_mma[tid * 6 + r] = a[r];
    for (int r = 0; r < 2; ++r) g_mma[tid * 6 + 4 + r] = b[r];
    emu_warp_sync();
    auto elem = [&](unsigned owner, unsigned reg, unsigned hi) {
        const unsigned w = g_mma[(warp0 + owner) * 6 + reg];
        return elem_of(hi ? w >> 16 : w);
    };
    auto A = [&](unsigned row, unsigned col) {
        return elem((row % 8) * 4 + (col % 8) / 2, (row >= 8 ? 1u : 0u) + (col >= 8 ? 2u : 0u), col & 1u);
    };
    auto B = [&](unsigned row, unsigned col) { return elem(col * 4 + (row % 8) / 2, 4 + (row >= 8 ? 1u : 0u), row & 1u); };
    const unsigned g = lane / 4, t = lane % 4;
    float out[4];
    for (unsigned e = 0; e < 4; ++e) {
        const unsigned row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
        double s = d[e];
        for (unsigned kk = 0; kk < 16; ++kk) s += double(A(row, kk)) * double(B(kk, col));
        out[e] = float(s);
    }
    emu_warp_sync(); // every lane has read the fragments before they are overwritten
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}
// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 of one warp (common.cuh's ldmatrix_x4_trans):
// every lane publishes its row address; lanes 8i .. 8i + 7 address the rows of matrix i (8 b16
// each), and lane (g, t) receives in r[i] the elements (row 2t, column g) in the low half and
// (row 2t + 1, column g) in the high half. The lanes of the calling warp meet.
// A row address that is not 16-byte aligned (the instruction's requirement, a fault on the device)
// stops the emulator with a message.
inline std::vector<const void*> g_ptr;
inline void emu_ldmatrix_x4_trans(unsigned* r, const void* row) {
    const unsigned tid = emu_tid(), lane = tid % 32, warp0 = tid - lane, g = lane / 4, t = lane % 4;
    if (reinterpret_cast<std::uintptr_t>(row) % 16 != 0) {
        std::fprintf(stderr, "ldmatrix: lane %u's row address %p is not 16-byte aligned\n", lane, row);
        std::abort();
    }
    g_ptr[tid] = row;
    emu_warp_sync();
    unsigned out[4];
    for (unsigned i = 0; i < 4; ++i) {
        uint16_t lo, hi;
        std::memcpy(&lo, static_cast<const char*>(g_ptr[warp0 + 8 * i + 2 * t]) + 2 * g, 2);
        std::memcpy(&hi, static_cast<const char*>(g_ptr[warp0 + 8 * i + 2 * t + 1]) + 2 * g, 2);
        out[i] = unsigned(lo) | (unsigned(hi) << 16);
    }
    emu_warp_sync(); // every lane has read the addresses before they are overwritten
    for (unsigned i = 0; i < 4; ++i) r[i] = out[i];
}
#include <math.h> // erfcf, expf, fmaf, fmaxf, sqrtf in the global namespace, as in CUDA

// Run kernel(args...) over grid x block, blocks sequentially, threads of a block concurrently.
template <typename... A>
void emu_launch(void (*k)(A...), dim3 grid, dim3 block, size_t dyn_smem_bytes, A... args) {
    gridDim = grid;
    blockDim = block;
    const unsigned nt = block.x * block.y;
    g_shfl.assign(nt, 0.0f);
    g_mma.assign(nt * 6, 0u);
    g_ptr.assign(nt, nullptr);
    g_pred.assign(nt, 0);
    g_dyn_smem.assign(dyn_smem_bytes / 4 + 1, 0.0f);
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::barrier<> bar(nt);
            g_bar = &bar;
            std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
            g_warp_bar.clear();
            for (unsigned w0 = 0; w0 < nt; w0 += 32) {
                warp_bars.push_back(std::make_unique<std::barrier<>>(std::ptrdiff_t(nt - w0 < 32 ? nt - w0 : 32)));
                g_warp_bar.push_back(warp_bars.back().get());
            }
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
