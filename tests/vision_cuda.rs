//! CUDA lane conformance: every stage of every committed vision golden (Pillow + timm), with the
//! same derived tolerances as the CPU and wgpu lanes (all compute in f32; see
//! `common::tolerance`). Skips, loudly, without a CUDA driver (fails instead under
//! `FOVEA_REQUIRE_CUDA=1`).

mod common;

#[test]
fn cuda_lane_matches_every_vision_golden() {
    let Some(lane) = common::cuda_lane_or_skip() else { return };
    eprintln!("cuda lane: {}", fovea::backend::Backend::device_name(&lane));
    let report = common::check_lane(&lane);
    assert!(report.len() >= 7);
}

/// Fast precision (bf16 GEMM operands): the same goldens at `common::fast_tolerance` (derived
/// there); layouts, types and the permutation stay exact.
#[test]
fn cuda_lane_in_fast_precision_matches_every_vision_golden() {
    let opts = fovea::backend::cuda::Options { precision: fovea::backend::Precision::Fast, ..Default::default() };
    let Some(lane) = common::cuda_lane_with_or_skip(opts) else { return };
    let report = common::check_lane_with(&lane, common::fast_tolerance);
    assert!(report.len() >= 7);
}
