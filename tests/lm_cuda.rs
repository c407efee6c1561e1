//! CUDA lane conformance of the language model against the transformers 5.24.0 goldens, the same
//! comparison as the CPU and wgpu lanes (`common::lm`): per-layer hidden states, final hidden,
//! logits, router ids and weights, indexer picks, and 32 greedy decode steps, for `lm-text` and
//! `lm-vision`. Skips visibly without a CUDA driver (fails under `FOVEA_REQUIRE_CUDA=1`).
//!
//! Tolerance: the CPU lane's `REL_L2` = 1e-5 (tests/lm_cpu.rs), by the wgpu lane's derivation
//! (tests/lm_wgpu.rs): f32 weights and f32 accumulation, reductions in another order (block trees,
//! whose error bound is no larger than a sequential sum's), transcendentals a few ulp off
//! (`expf`, `log1pf`, `cosf`/`sinf` of CUDA's math library; NVRTC may contract a·b+c into FMA,
//! which only removes a rounding). Router ids, indexer picks and greedy tokens are exact.

mod common;

use std::sync::OnceLock;

use fovea::backend::Backend;
use fovea::backend::cuda::CudaBackend;

const REL_L2: f64 = 1e-5;

/// One device for both tests.
fn lane() -> Option<&'static CudaBackend> {
    static LANE: OnceLock<Option<CudaBackend>> = OnceLock::new();
    LANE.get_or_init(|| {
        let lane = common::cuda_lane_or_skip();
        if let Some(b) = &lane {
            eprintln!("cuda device: {}", b.device_name());
        }
        lane
    })
    .as_ref()
}

#[test]
fn cuda_lm_text_matches_transformers() {
    let Some(b) = lane() else { return };
    let fails = common::lm::check_lm_text(b, REL_L2);
    assert!(fails.is_empty(), "lm-text on {}:\n{}", b.device_name(), fails.join("\n"));
}

#[test]
fn cuda_lm_vision_matches_transformers_with_vision_ext() {
    let Some(b) = lane() else { return };
    let fails = common::lm::check_lm_vision(b, REL_L2);
    assert!(fails.is_empty(), "lm-vision on {}:\n{}", b.device_name(), fails.join("\n"));
}
