//! wgpu lane conformance: every stage of every committed vision golden (Pillow + timm), with the
//! same derived tolerances as the CPU lane (both compute in f32; see `common::tolerance`), and
//! again in fast precision at `common::fast_tolerance` (derived there, the CUDA lane's gate).

mod common;

#[test]
fn wgpu_lane_matches_every_vision_golden() {
    let Some(lane) = &common::wgpu_lanes()[0] else { return };
    let report = common::check_lane(lane);
    assert!(report.len() >= 7);
}

/// Fast precision (f16 GEMM operands, f32 accumulation): the same goldens at
/// `common::fast_tolerance`; layouts, types and the permutation stay exact.
#[test]
fn wgpu_lane_in_fast_precision_matches_every_vision_golden() {
    let Some(lane) = &common::wgpu_lanes()[1] else { return };
    let report = common::check_lane_with(lane, common::fast_tolerance);
    assert!(report.len() >= 7);
}
