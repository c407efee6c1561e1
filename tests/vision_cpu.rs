//! CPU lane conformance: every stage of every committed vision golden (Pillow + timm).

mod common;

use fovea::backend::cpu::CpuBackend;
use fovea::pipeline::preprocess_config;
use fovea::processor;
use fovea::weights::Checkpoint;

#[test]
fn cpu_lane_matches_every_vision_golden() {
    let report = common::check_lane(&CpuBackend::new());
    assert!(report.len() >= 7);
}

/// The resized image (after `ImageOps.pad` or the plain stretch) is Pillow's byte for byte, for
/// PNG and JPEG sources alike (JPEG is decoded by libjpeg-turbo with Pillow's settings).
#[test]
fn resized_images_are_bit_exact_with_pillow() {
    let mut checked = 0;
    for g in common::goldens() {
        let ckpt = Checkpoint::open(&common::model_dir(&g.model)).unwrap();
        let img = processor::load_rgb(&common::image_path(&g.image)).unwrap();
        let prep = processor::prepare(&img, &preprocess_config(ckpt.config())).unwrap();
        let hw = (prep.resized.height() as usize, prep.resized.width() as usize);
        assert!(
            common::golden_resized_matches(&g, prep.resized.as_raw(), hw),
            "{}: resized image differs from Pillow's",
            g.file
        );
        checked += 1;
    }
    assert!(checked >= 7, "only {checked} goldens");
}
