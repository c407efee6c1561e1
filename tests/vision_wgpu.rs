//! wgpu lane conformance: every stage of every committed vision golden (Pillow + timm), with the
//! same derived tolerances as the CPU lane (both compute in f32; see `common::tolerance`).

mod common;

use fovea::backend::wgpu::Options;

#[test]
fn wgpu_lane_matches_every_vision_golden() {
    let Some(lane) = common::wgpu_lane(Options::default()) else { return };
    let report = common::check_lane(&lane);
    assert!(report.len() >= 7);
}
