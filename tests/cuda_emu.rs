//! The CUDA lane's kernels on the host: `sh cuda/emu/run.sh` compiles every file of `cuda/` with
//! g++ against `cuda/emu/cuda_emu.h` (threads, barriers, shuffles, `__dp4a` and the tensor-core
//! fragments emulated) in three builds (sm_90, sm_75, sm_90 in fast precision) and compares each
//! kernel with a plain C++ reference (`cuda/emu/emu_test.cpp`). It checks the kernels' logic —
//! indexing, reductions, online softmax, weight decoding against llama.cpp's golden blocks — not
//! what NVRTC accepts, nor speed: on a machine without a GPU (CI) this is what runs the CUDA code.
//! It takes about 17 minutes on a 2-core machine (three g++ builds of every kernel, then the
//! tests; 1 009 s in a fresh-clone CI run, 2026-12-04).
//!
//! Skips when g++ is missing, fails instead under `CI=true` (`.ci/run` installs it).

use std::process::Command;

#[test]
fn cuda_kernels_match_their_references_in_the_host_emulator() {
    if Command::new("g++").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true but g++ is missing: the CUDA host emulator cannot be built (.ci/run installs g++)"
        );
        eprintln!("skipping the CUDA host emulator: no g++ on this machine (`apt-get install g++`)");
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    // its own build folder: run.sh writes its binaries under $TMPDIR/fovea-cuda-emu
    let tmp = std::env::temp_dir().join(format!("fovea-cuda-emu-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("a temporary folder");
    let out = Command::new("sh")
        .arg("cuda/emu/run.sh")
        .current_dir(root)
        .env("TMPDIR", &tmp)
        .output()
        .expect("sh runs cuda/emu/run.sh");
    let _ = std::fs::remove_dir_all(&tmp);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failed: Vec<&str> = stdout.lines().filter(|l| l.ends_with("FAIL")).collect();
    let tail: Vec<&str> = stderr.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
    assert!(
        out.status.success() && failed.is_empty(),
        "cuda/emu/run.sh: {}; failed checks:\n{}\nstderr (last lines):\n{}",
        out.status,
        failed.join("\n"),
        tail.join("\n")
    );
    // the three builds each ran (the sm_90 build every test, the other two the GEMM tests), and
    // each compared something: not a run that checked nothing
    let builds = stdout.lines().filter(|l| l.starts_with("__CUDA_ARCH__")).count();
    let passed = stdout.lines().filter(|l| l.ends_with(" ok")).count();
    let summaries = stdout.lines().filter(|l| l.starts_with("all ok: 0 failure(s)")).count();
    assert_eq!((builds, summaries), (3, 3), "expected three builds, each all ok:\n{stdout}");
    assert!(passed >= 500, "only {passed} checks passed (a full run makes about 570):\n{stdout}");
    eprintln!("CUDA host emulator: {passed} checks ok in 3 builds");
}
