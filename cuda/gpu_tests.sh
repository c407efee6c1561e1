#!/bin/bash
# The GPU lanes' conformance tests (CUDA, and wgpu on the machine's Vulkan driver) on a GPU machine
# that has no Rust toolchain.
#
#   bash cuda/gpu_tests.sh pack OUT.tar.xz   # here: build the test executables and pack them (stripped)
#   bash cuda/gpu_tests.sh run OUT.tar.xz    # there, in a copy of this repository (fixtures are read
#                                            # from it): run each executable in its own process
#   bash cuda/gpu_tests.sh bench OUT.tar.xz  # there: the whole q2 model's decode step at 4K on each
#                                            # lane (examples/bench_model, packed beside the tests)
#
# `run` sets FOVEA_REQUIRE_CUDA=1, so a missing driver fails instead of skipping, and finds NVRTC
# and cuBLASLt under the CUDA toolkit or pip-installed nvidia-* packages (never the toolkit's stubs,
# which would shadow the real libcuda). One process per executable: a kernel fault poisons its context.
# FOVEA_LANES picks the lanes (default "cuda wgpu"); the wgpu lane needs a Vulkan loader and driver
# there (VK_DRIVER_FILES naming the NVIDIA ICD where the loader does not find it by itself); its
# tests run with FOVEA_REQUIRE_WGPU=1, so a missing adapter fails instead of skipping, and on an
# NVIDIA GPU with FOVEA_REQUIRE_COOP_TILES=1, so fast precision's tiles must run on cooperative
# matrices there.
set -u
cmd=${1:-}
archive=${2:-}
tests="ops cuda_lane vision_cuda lm_cuda wgpu_lane vision_wgpu lm_wgpu describe_image real_models device_bytes"
case "$cmd" in
pack)
    [ -n "$archive" ] || { echo "usage: $0 pack OUT.tar.xz" >&2; exit 2; }
    dir=$(mktemp -d)
    set -o pipefail
    args=""
    for t in $tests; do args="$args --test $t"; done
    # the executables cargo reports, by target name
    cargo test --release --lib $args --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])' |
        while read -r name exe; do strip -o "$dir/$name" "$exe"; done || exit 1
    cargo build --release --bin fovea --example describe_image --example bench_model || exit 1
    strip -o "$dir/fovea-cli" "${CARGO_TARGET_DIR:-target}/release/fovea"
    strip -o "$dir/describe_image-example" "${CARGO_TARGET_DIR:-target}/release/examples/describe_image"
    strip -o "$dir/bench_model" "${CARGO_TARGET_DIR:-target}/release/examples/bench_model"
    # xz -9: its 64 MiB window finds what the executables share (about half the size of -6)
    tar cf - -C "$dir" . | xz -9 -T2 >"$archive" && rm -rf "$dir" && ls -l "$archive"
    ;;
run | bench)
    [ -f "$archive" ] || { echo "usage: $0 $cmd OUT.tar.xz (from \`$0 pack\`)" >&2; exit 2; }
    bin=$(mktemp -d)
    tar xJf "$archive" -C "$bin" || exit 1
    for f in $(find / \( -name 'libnvrtc.so*' -o -name 'libcublasLt.so*' \) -not -path '/proc/*' -not -path '*/stubs/*' 2>/dev/null); do
        export LD_LIBRARY_PATH=$(dirname "$f"):${LD_LIBRARY_PATH:-}
        # found: the CUDA lane's cuBLASLt tests fail rather than skip without it
        case "$f" in *libcublasLt.so.13*) export FOVEA_REQUIRE_CUBLASLT=1 ;; esac
    done
    if [ "$cmd" = bench ]; then
        # the figures README's Benchmarks sections report: fast precision, q2, decode at 4K, 43
        # layers, twice (run-to-run spread); FOVEA_HOST_PROFILE=1 adds the host's breakdown
        status=0
        for lane in ${FOVEA_LANES:-cuda wgpu}; do
            for run in 1 2; do
                echo "=== bench_model --backend $lane, run $run"
                "$bin/bench_model" --backend "$lane" --mix q2 --image off --prefill off --decode-at 4096 \
                    --decode-steps 32 --layers 43 || status=1
            done
        done
        exit $status
    fi
    export FOVEA_REQUIRE_CUDA=1 FOVEA_REPO_ROOT=$PWD FOVEA_BIN=$bin/fovea-cli
    export FOVEA_DESCRIBE_IMAGE=$bin/describe_image-example
    if command -v nvidia-smi >/dev/null; then export FOVEA_REQUIRE_COOP_TILES=1; fi
    status=0
    run_one() {
        echo "=== $*"
        "$@" || status=1
    }
    for lane in ${FOVEA_LANES:-cuda wgpu}; do
        case $lane in
        cuda)
            run_one "$bin/fovea" backend::cuda --test-threads=1
            run_one "$bin/ops" cuda --test-threads=1 --nocapture
            run_one "$bin/cuda_lane" --test-threads=1
            run_one "$bin/vision_cuda" --test-threads=1
            run_one "$bin/lm_cuda" --test-threads=1
            run_one "$bin/describe_image" cuda --nocapture
            run_one "$bin/real_models" cuda --nocapture
            run_one "$bin/device_bytes" cuda --nocapture
            ;;
        wgpu)
            FOVEA_REQUIRE_WGPU=1 run_one "$bin/fovea" backend::wgpu --test-threads=1
            FOVEA_REQUIRE_WGPU=1 run_one "$bin/ops" wgpu --test-threads=1 --nocapture
            FOVEA_REQUIRE_WGPU=1 run_one "$bin/wgpu_lane" --test-threads=1
            FOVEA_REQUIRE_WGPU=1 run_one "$bin/vision_wgpu" --test-threads=1
            FOVEA_REQUIRE_WGPU=1 run_one "$bin/lm_wgpu" --test-threads=1
            FOVEA_REQUIRE_WGPU=1 run_one "$bin/describe_image" wgpu --nocapture
            FOVEA_REQUIRE_WGPU=1 run_one "$bin/real_models" wgpu --nocapture
            FOVEA_REQUIRE_WGPU=1 run_one "$bin/device_bytes" wgpu --nocapture
            ;;
        *) echo "unknown lane $lane (cuda, wgpu)"; status=1 ;;
        esac
    done
    exit $status
    ;;
*)
    echo "usage: $0 pack OUT.tar.xz | run OUT.tar.xz | bench OUT.tar.xz" >&2
    exit 2
    ;;
esac
