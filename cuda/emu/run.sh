#!/bin/sh
# Host-side logic check of the CUDA kernels (no GPU, no CUDA toolkit): builds every file of cuda/
# against cuda_emu.h with g++ and compares each kernel with a plain C++ reference.
#   sh cuda/emu/run.sh [TEST ...]   (only the named tests, e.g. attention sink_attention; `gemm`
#                                    names the GEMM tests)
# Two builds: __CUDA_ARCH__ 900 (the H200: tensor-core GEMM, mma emulated) runs the tests; 750
# (below sm_80: the FMA GEMM for every weight format) runs the GEMM tests again.
set -e
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/fovea-cuda-emu
mkdir -p "$out"
# what NVRTC compiles (common.cuh + each file), with dynamic shared memory mapped to the emulator's
for f in common.cuh elementwise.cu copy.cu norm.cu rope.cu attention.cu linear.cu debug.cu lm_small.cu lm_attention.cu moe.cu; do
    sed 's/extern __shared__ float smem\[\];/float* smem = g_dyn_smem.data();/' "$here/../$f"
done > "$out/all_kernels.inc"
build() {
    g++ -std=c++20 -O2 -pthread -Wall -Wno-unused-function -Wno-unknown-pragmas -fno-strict-aliasing \
        -DEMU_CUDA_ARCH="$1" -I"$here" -I"$out" "$here/emu_test.cpp" -o "$out/emu_test_$1"
}
build 900
build 750
"$out/emu_test_900" "$@"
"$out/emu_test_750" gemm
