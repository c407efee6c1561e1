#!/bin/sh
# Host-side logic check of the CUDA kernels (no GPU, no CUDA toolkit): builds every file of cuda/
# against cuda_emu.h with g++ and compares each kernel with a plain C++ reference.
#   sh cuda/emu/run.sh [TEST ...]   (only the named tests, e.g. attention sink_attention; `gemm`
#                                    names the GEMM tests)
# Three builds: __CUDA_ARCH__ 900 (the H200: tensor-core GEMM, mma emulated) runs the tests; 750
# (below sm_80: the FMA GEMM for every weight format) runs the GEMM tests again; 900 with
# FOVEA_FAST=1 (fast precision: one bf16 MMA per tile, every format) runs the GEMM tests again
# (the block formats' fast tiles are checked on the device by the op harness: emulated MMAs over
# every format take longer than CI's budget).
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/fovea-cuda-emu
mkdir -p "$out"
# what NVRTC compiles (common.cuh + each file), with dynamic shared memory mapped to the emulator's;
# after common.cuh: ggml's lookup tables as `__device__ const` arrays, converted from the same Rust
# arrays (src/formats/tables.rs) that src/backend/cuda/kernels.rs emits into the NVRTC source, then
# dequant.cuh (the lane prepends both to the files with weight kernels)
tables() {
    sed -n -E -e 's/^pub const IQ1_DELTA: f32 = (.*);$/#define IQ1_DELTA \1f/p' \
        -e 's/^pub static ([A-Z0-9_]+): \[u8; ([0-9]+)\] = \[$/__device__ const unsigned char \1[\2] = {/p' \
        -e 's/^pub static ([A-Z0-9_]+): \[i8; ([0-9]+)\] = \[$/__device__ const signed char \1[\2] = {/p' \
        -e 's/^pub static ([A-Z0-9_]+): \[u32; ([0-9]+)\] = \[$/__device__ const unsigned int \1[\2] = {/p' \
        -e 's/^pub static ([A-Z0-9_]+): \[u64; ([0-9]+)\] = \[$/__device__ const unsigned long long \1[\2] = {/p' \
        -e 's/^\];$/};/p' -e 's/^( +[-0-9].*)$/\1/p' "$here/../../src/formats/tables.rs"
}
for f in common.cuh tables dequant.cuh elementwise.cu copy.cu norm.cu rope.cu attention.cu linear.cu debug.cu lm_small.cu lm_attention.cu moe.cu; do
    if [ "$f" = tables ]; then tables; continue; fi
    sed 's/extern __shared__ float smem\[\];/float* smem = g_dyn_smem.data();/' "$here/../$f"
done > "$out/all_kernels.inc"
build() {
    g++ -std=c++20 -O2 -pthread -Wall -Wno-unused-function -Wno-unknown-pragmas -fno-strict-aliasing \
        -DEMU_CUDA_ARCH="$1" -DFOVEA_FAST="${2:-0}" -DDEQUANT_GOLDENS="\"$here/../../fixtures/goldens/cuda/dequant_blocks.bin\"" \
        -DFORMAT_GOLDENS="\"$here/../../fixtures/goldens/formats\"" -I"$here" -I"$out" "$here/emu_test.cpp" -o "$out/emu_test_$1${2:+_fast}"
}
build 900
build 750
build 900 1
"$out/emu_test_900" "$@"
"$out/emu_test_750" gemm
"$out/emu_test_900_fast" gemm
