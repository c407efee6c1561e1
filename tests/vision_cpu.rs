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

/// The resized image (after `ImageOps.pad` or the plain stretch) is Pillow's byte for byte for
/// PNG sources. JPEG sources are decoded by different libraries (zune-jpeg vs libjpeg-turbo), so
/// only PNG is held to bit-exactness.
#[test]
fn resized_png_images_are_bit_exact_with_pillow() {
    let mut checked = 0;
    for g in common::goldens().into_iter().filter(|g| g.image.ends_with(".png")) {
        let ckpt = Checkpoint::open(&common::model_dir(&g.model)).unwrap();
        let img = processor::load_rgb(&common::image_path(&g.image)).unwrap();
        let prep = processor::prepare(&img, &preprocess_config(ckpt.config())).unwrap();
        let hw = (prep.resized.height() as usize, prep.resized.width() as usize);
        assert!(common::golden_resized_matches(&g, prep.resized.as_raw(), hw), "{}: resized image differs from Pillow's", g.file);
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} PNG goldens");
}
