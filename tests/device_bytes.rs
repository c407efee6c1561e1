//! Device bytes ≤ 1.05 × file bytes (issue 12) on the real-format fixtures: DeepSeek's official
//! FP8/FP4 safetensors (`vl-real-tiny`), llama.cpp's GGUFs (`vl-real-tiny-gguf`: the MXFP4_MOE
//! text file with the BF16 mmproj, the K/IQ mix) and the shipped model's Q8_0 + BF16 pair.
//!
//! Two measurements per checkpoint, held to each other:
//! - what `fovea inspect` prints (`weights::footprint`, from headers only): per lane, the bytes
//!   the matrices take once uploaded, and the vectors as f32, against their bytes in the files;
//! - the lanes themselves after loading the model (`LmModel::load`, `VisionModel::load`): the
//!   matrix bytes each lane counted as it allocated (`MemoryReport::matrix_bytes`) must equal
//!   the footprint's for that lane, and on the CPU lane every weight byte it holds (vectors and
//!   the tables the graph derives included) must stay within 1.05 × the file bytes. (The wgpu
//!   lane's `weight_bytes` counts its 4 MiB weight pools whole, more than these few-MiB models.)
//!
//! A load that expands a weight (decoding it to F32, as mixed gate/up pairs once were) breaks
//! both: its lane's matrix bytes no longer match the file's formats, and the ratio passes 1.05.

mod common;

use std::path::PathBuf;

use fovea::backend::cpu::CpuBackend;
use fovea::backend::{Backend, MemoryReport};
use fovea::config::LmConfig;
use fovea::model::lm::LmModel;
use fovea::model::vision::VisionModel;
use fovea::weights::footprint::{self, Footprint};
use fovea::weights::gguf_lm::{GgufLm, GgufPair};
use fovea::weights::{Checkpoint, open_mmproj};

/// The bound on device bytes over file bytes.
const MAX_RATIO: f64 = 1.05;

/// A checkpoint as the CLI takes it.
enum Form {
    /// A safetensors directory (language model and vision tower).
    Dir(PathBuf),
    /// A text GGUF, with its mmproj when given.
    Gguf(PathBuf, Option<PathBuf>),
}

fn forms() -> Vec<(&'static str, Form)> {
    let root = common::root().join("fixtures/models");
    let real = root.join("vl-real-tiny-gguf");
    let scenes = root.join("vl-scenes-gguf");
    vec![
        ("vl-real-tiny (official FP8/FP4)", Form::Dir(root.join("vl-real-tiny"))),
        (
            "vl-real-tiny-gguf text-MXFP4_MOE + mmproj-BF16",
            Form::Gguf(real.join("text-MXFP4_MOE.gguf"), Some(real.join("mmproj-BF16.gguf"))),
        ),
        ("vl-real-tiny-gguf text-mix-a", Form::Gguf(real.join("text-mix-a.gguf"), None)),
        (
            "vl-scenes-gguf text-Q8_0 + mmproj-BF16",
            Form::Gguf(scenes.join("text-Q8_0.gguf"), Some(scenes.join("mmproj-BF16.gguf"))),
        ),
    ]
}

/// What `fovea inspect` reports for the form (the same functions).
fn footprint_of(form: &Form) -> Footprint {
    match form {
        Form::Dir(dir) => {
            let ckpt = Checkpoint::open(dir).unwrap();
            let cfg = LmConfig::from_file(&dir.join("config.json")).unwrap();
            footprint::of_checkpoint(&ckpt, Some(&cfg)).unwrap()
        }
        Form::Gguf(text, mmproj) => {
            let lm = footprint::of_gguf_lm(&GgufLm::open(text).unwrap()).unwrap();
            match mmproj {
                Some(m) => lm.merge(footprint::of_mmproj(&open_mmproj(m).unwrap()).unwrap()),
                None => lm,
            }
        }
    }
}

/// Load the form's model onto `b` and return what the lane's weight counters gained (read while
/// the model is still resident).
fn load_onto<B: Backend>(b: &B, form: &Form) -> (u64, u64) {
    let before = b.memory();
    let after: MemoryReport = match form {
        Form::Dir(dir) => {
            let ckpt = Checkpoint::open(dir).unwrap();
            let cfg = LmConfig::from_file(&dir.join("config.json")).unwrap();
            let _lm = LmModel::load(b, &ckpt, &cfg).unwrap();
            let _vision = VisionModel::load(b, &ckpt, ckpt.vision_config().unwrap()).unwrap();
            b.memory()
        }
        Form::Gguf(text, mmproj) => {
            let lm = GgufLm::open(text).unwrap();
            let m = mmproj.as_ref().map(|p| open_mmproj(p).unwrap());
            let pair = GgufPair { lm: &lm, mmproj: m.as_ref() };
            let _lm = LmModel::load(b, &pair, lm.config()).unwrap();
            let _vision = m.as_ref().map(|m| VisionModel::load(b, &pair, m.config()).unwrap());
            b.memory()
        }
    };
    (after.matrix_bytes - before.matrix_bytes, after.weight_bytes - before.weight_bytes)
}

#[test]
fn inspect_sizes_every_real_form_within_the_bound() {
    for (name, form) in forms() {
        let fp = footprint_of(&form);
        eprintln!("{name}\n{fp}");
        for (what, row) in [("matrices", fp.matrix_total()), ("total", fp.total())] {
            assert!(row.ratio() <= MAX_RATIO, "{name}: {what} take {:.4} x their file bytes", row.ratio());
        }
    }
}

#[test]
fn the_cpu_lane_allocates_what_inspect_reports() {
    for (name, form) in forms() {
        let fp = footprint_of(&form);
        let (matrix, weight) = load_onto(&CpuBackend::new(), &form);
        assert_eq!(matrix, fp.matrix_total().cpu_cuda_bytes, "{name}: matrix bytes on the cpu lane");
        let file = fp.total().file_bytes;
        let ratio = weight as f64 / file as f64;
        eprintln!("{name}: cpu lane holds {weight} weight bytes for {file} file bytes ({ratio:.4})");
        assert!(ratio <= MAX_RATIO, "{name}: the cpu lane holds {ratio:.4} x the file bytes");
    }
}

#[test]
fn the_wgpu_lane_allocates_what_inspect_reports() {
    let Some(b) = common::wgpu_lane(Default::default()) else { return };
    for (name, form) in forms() {
        let fp = footprint_of(&form);
        let (matrix, _) = load_onto(&b, &form);
        assert_eq!(matrix, fp.matrix_total().wgpu_bytes, "{name}: matrix bytes on the wgpu lane");
    }
}

#[test]
fn the_cuda_lane_allocates_what_inspect_reports() {
    let Some(b) = common::cuda_lane_or_skip() else { return };
    for (name, form) in forms() {
        let fp = footprint_of(&form);
        let (matrix, weight) = load_onto(&b, &form);
        assert_eq!(matrix, fp.matrix_total().cpu_cuda_bytes, "{name}: matrix bytes on the cuda lane");
        let ratio = weight as f64 / fp.total().file_bytes as f64;
        assert!(ratio <= MAX_RATIO, "{name}: the cuda lane holds {ratio:.4} x the file bytes");
    }
}

/// `Backend::capacity`, what bench_model checks a load against: each lane reports its memory,
/// free ≤ total.
fn check_capacity<B: Backend>(b: &B, lane: &str) {
    let Some(c) = b.capacity() else {
        panic!("{lane}: no capacity reported ({})", b.device_name());
    };
    eprintln!("{lane}: {} of {} bytes free ({})", c.free_bytes, c.total_bytes, b.device_name());
    assert!(c.free_bytes <= c.total_bytes && c.total_bytes > 0, "{lane}: {c:?}");
}

#[test]
fn every_lane_reports_its_memory_capacity() {
    // the CPU lane's is the host's /proc/meminfo, on Linux
    if cfg!(target_os = "linux") {
        check_capacity(&CpuBackend::new(), "cpu");
    }
    // the wgpu lane answers on Vulkan (lavapipe here, the NVIDIA driver on the GPU machine)
    if let Some(b) = common::wgpu_lane(Default::default())
        && b.adapter_info().backend == wgpu::Backend::Vulkan
    {
        check_capacity(&b, "wgpu");
    }
    if let Some(b) = common::cuda_lane_or_skip() {
        check_capacity(&b, "cuda");
    }
}
