//! Language-model weight accounting (`weights::check_lm`) on modified copies of
//! `fixtures/models/lm-tiny` written to temp dirs: every refusal names the offending tensor, and
//! the accepted variants (mtp.* present, bias_vl absent, I32 tid2eid, a vision side) load.
//! The accounting runs in `fovea dump`/`generate` before anything is uploaded, and in `inspect`.

mod common;

use std::path::Path;

use fovea::backend::cpu::CpuBackend;
use fovea::config::LmConfig;
use fovea::model::lm::LmModel;
use fovea::pipeline::{self, LaneChoice, LmRequest, PromptToken};
use fovea::weights::{Checkpoint, check_lm, lm_manifest};
use safetensors::tensor::TensorView as StView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// One tensor to write.
#[derive(Clone)]
struct T {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn lm_tiny() -> std::path::PathBuf {
    common::model_dir("lm-tiny")
}

fn tiny_config() -> Value {
    serde_json::from_str(&std::fs::read_to_string(lm_tiny().join("config.json")).unwrap()).unwrap()
}

/// Every tensor of lm-tiny, as stored.
fn tiny_tensors() -> Vec<T> {
    let bytes = std::fs::read(lm_tiny().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<T> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| T { name, dtype: t.dtype(), shape: t.shape().to_vec(), data: t.data().to_vec() })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

fn f32_tensor(name: &str, shape: &[usize]) -> T {
    let n: usize = shape.iter().product();
    let data = (0..n).flat_map(|i| ((i % 7) as f32 * 0.125 - 0.375).to_le_bytes()).collect();
    T { name: name.into(), dtype: Dtype::F32, shape: shape.to_vec(), data }
}

fn without(mut v: Vec<T>, pred: impl Fn(&str) -> bool) -> Vec<T> {
    let before = v.len();
    v.retain(|t| !pred(&t.name));
    assert!(v.len() < before, "nothing removed");
    v
}

fn replace(mut v: Vec<T>, t: T) -> Vec<T> {
    let slot = v.iter_mut().find(|x| x.name == t.name).unwrap_or_else(|| panic!("{} not in lm-tiny", t.name));
    *slot = t;
    v
}

/// A temp dir holding `config` and a single-file checkpoint of `tensors`.
fn write(config: &Value, tensors: &[T]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), serde_json::to_string_pretty(config).unwrap()).unwrap();
    let views: Vec<(String, StView<'_>)> =
        tensors.iter().map(|t| (t.name.clone(), StView::new(t.dtype, t.shape.clone(), &t.data).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

fn check(dir: &Path) -> fovea::Result<fovea::weights::LmAccounting> {
    let cfg = LmConfig::from_file(&dir.join("config.json"))?;
    check_lm(&Checkpoint::open_auto(dir)?, &cfg)
}

fn refusal(tensors: &[T]) -> String {
    let dir = write(&tiny_config(), tensors);
    match check(dir.path()) {
        Ok(a) => panic!("expected the LM accounting to refuse, got:\n{a}"),
        Err(e) => e.to_string(),
    }
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error message {msg:?} lacks {p:?}");
    }
}

/// One prefill of four tokens through the pipeline (the path `fovea dump --token-ids` takes).
fn dump(dir: &Path) -> fovea::Result<pipeline::LmDump> {
    let tokens = [0, 450, 319, 352].into_iter().map(PromptToken::Id).collect();
    pipeline::dump_lm(&LmRequest {
        model_dir: dir.to_path_buf(),
        mmproj: None,
        image_max_tokens: None,
        tokens,
        images: Vec::new(),
        lane: LaneChoice::Cpu,
        precision: None,
    })
}

// ---- accepted ------------------------------------------------------------------------------

#[test]
fn lm_tiny_accounting_closes() {
    let tensors = tiny_tensors();
    let ckpt = Checkpoint::open_auto(&lm_tiny()).unwrap();
    assert!(ckpt.vision_config().is_none());
    let cfg = LmConfig::from_file(&lm_tiny().join("config.json")).unwrap();
    let acc = check_lm(&ckpt, &cfg).unwrap();
    // every stored tensor is an LM tensor (the 4 sentinels included: no vision config)
    assert_eq!(acc.lm_tensors, tensors.len());
    assert_eq!(acc.lm_bytes, tensors.iter().map(|t| t.data.len() as u64).sum::<u64>());
    let numel: u64 = tensors.iter().map(|t| t.shape.iter().product::<usize>() as u64).sum();
    assert_eq!(acc.lm_params, numel);
    assert_eq!((acc.bias_vl_layers, acc.sentinels), (5, true));
    assert_eq!((acc.mtp.tensors, acc.vision.tensors), (0, 0));
    assert_eq!(acc.by_dtype[&Dtype::I64].count, 2, "tid2eid on the 2 hash layers");
    // the manifest alone: everything but the sentinels
    assert_eq!(lm_manifest(&cfg).unwrap().len(), tensors.len() - 4);
}

#[test]
fn mtp_tensors_are_recognised_and_skipped() {
    let mut tensors = tiny_tensors();
    tensors.push(f32_tensor("mtp.0.e_proj.weight", &[64, 64]));
    tensors.push(f32_tensor("mtp.0.attn.wq_a.weight", &[32, 64]));
    let dir = write(&tiny_config(), &tensors);
    let acc = check(dir.path()).unwrap();
    assert_eq!((acc.mtp.tensors, acc.mtp.bytes), (2, (64 * 64 + 32 * 64) * 4));
    assert_eq!(acc.lm_tensors, tensors.len() - 2);
    assert_has(&acc.to_string(), &["mtp.* skipped: 2 tensors"]);
    dump(dir.path()).expect("a checkpoint with mtp.* tensors runs");
}

#[test]
fn bias_vl_absent_is_accepted_and_runs() {
    let tensors = without(tiny_tensors(), |n| n.ends_with(".gate.bias_vl"));
    let dir = write(&tiny_config(), &tensors);
    let acc = check(dir.path()).unwrap();
    assert_eq!(acc.bias_vl_layers, 0);
    dump(dir.path()).expect("a text-only checkpoint without bias_vl runs");
}

#[test]
fn tid2eid_stored_as_i32_is_accepted() {
    let mut tensors = tiny_tensors();
    for t in tensors.iter_mut().filter(|t| t.name.ends_with(".tid2eid")) {
        t.data = t
            .data
            .chunks_exact(8)
            .flat_map(|c| (i64::from_le_bytes(c.try_into().unwrap()) as i32).to_le_bytes())
            .collect();
        t.dtype = Dtype::I32;
    }
    let dir = write(&tiny_config(), &tensors);
    assert_eq!(check(dir.path()).unwrap().by_dtype[&Dtype::I32].count, 2);
    let want = dump(&lm_tiny()).unwrap().logits;
    assert_eq!(dump(dir.path()).unwrap().logits, want, "same routing from I32 ids");
}

/// A Vision-Exp style checkpoint: LM and vision tensors side by side; each accounting checks its
/// own side and the two together cover every tensor.
#[test]
fn vision_side_is_left_to_the_vision_accounting() {
    let mut config = tiny_config();
    let vision_keys = serde_json::json!({
        "vision_n_layers": 1, "vision_dim": 16, "vision_n_heads": 2, "vision_inter_dim": 16,
        "vision_patch_size": 14, "vision_rope_theta": 500.0, "vision_downsample_ratio": 3,
        "vision_max_n_token": 384, "vision_min_pixels": 147456, "vision_max_wh_ratio": 8
    });
    config.as_object_mut().unwrap().extend(vision_keys.as_object().unwrap().clone());
    let vcfg = fovea::config::VisionConfig::from_value(config.clone()).unwrap();
    let mut tensors = tiny_tensors(); // holds the 4 sentinels already
    for e in fovea::weights::vision_manifest(&vcfg) {
        if !e.name.starts_with("image_") {
            tensors.push(f32_tensor(&e.name, &e.shape));
        }
    }
    let dir = write(&config, &tensors);
    let ckpt = Checkpoint::open_auto(dir.path()).unwrap();
    assert!(ckpt.vision_config().is_some());
    let vis = fovea::weights::check_vision(&ckpt, &vcfg).unwrap();
    let acc = check(dir.path()).unwrap();
    assert!(!acc.sentinels, "with a vision config the sentinels are the vision accounting's");
    assert_eq!(acc.vision.tensors, vis.vision_tensors);
    assert_eq!(acc.lm_tensors + acc.vision.tensors, ckpt.len());
    let text = pipeline::inspect(dir.path()).unwrap();
    assert_has(&text, &["vision accounting: OK, 19 tensors", "LM accounting: OK, 5 layers", "vision side: 19 tensors"]);
    dump(dir.path()).expect("a text prompt on a checkpoint with a vision side runs");
}

#[test]
fn inspect_prints_the_lm_accounting() {
    let text = pipeline::inspect(&lm_tiny()).unwrap();
    let n = tiny_tensors().len();
    assert_has(
        &text,
        &[
            "(no vision config)",
            &format!("LM accounting: OK, 5 layers, {n} tensors"),
            "I64:      2 tensors",
            "gate.bias_vl on 5 of 5 layers; image sentinels included",
            "mtp.* skipped: 0 tensors, 0 bytes",
        ],
    );
}

// ---- refused -------------------------------------------------------------------------------

#[test]
fn missing_tensor_is_named() {
    let name = "layers.3.attn.indexer.compressor.ape";
    let msg = refusal(&without(tiny_tensors(), |n| n == name));
    assert_has(&msg, &[&format!("tensor `{name}`"), "missing", "[4, 64]"]);
    // a required text bias on a non-hash layer, too
    let name = "layers.2.ffn.gate.bias";
    assert_has(&refusal(&without(tiny_tensors(), |n| n == name)), &[&format!("tensor `{name}`"), "missing"]);
}

#[test]
fn unknown_tensors_are_named() {
    let mut tensors = tiny_tensors();
    tensors.push(f32_tensor("layers.1.attn.wq_a.scale", &[1, 1]));
    tensors.push(f32_tensor("layers.5.attn_norm.weight", &[64]));
    tensors.push(f32_tensor("layers.0.ffn.gate.bias", &[8])); // a hash layer has no text bias
    let msg = refusal(&tensors);
    assert_has(
        &msg,
        &[
            "tensor `layers.0.ffn.gate.bias`",
            "unknown tensor",
            "and 2 more",
            "`layers.1.attn.wq_a.scale`",
            "`layers.5.attn_norm.weight`",
        ],
    );
    // a vision-side tensor without a vision config
    let mut tensors = tiny_tensors();
    tensors.push(f32_tensor("vision.norm.weight", &[16]));
    assert_has(&refusal(&tensors), &["tensor `vision.norm.weight`", "no vision config"]);
}

#[test]
fn wrong_shape_is_named_with_both_shapes() {
    let name = "layers.2.attn.compressor.ape";
    let msg = refusal(&replace(tiny_tensors(), f32_tensor(name, &[4, 32])));
    assert_has(&msg, &[&format!("tensor `{name}`"), "found [4, 32]", "expected [16, 32]"]);
    let name = "layers.1.ffn.gate.tid2eid";
    let t = T { name: name.into(), dtype: Dtype::I64, shape: vec![512, 2], data: vec![0; 512 * 2 * 8] };
    assert_has(&refusal(&replace(tiny_tensors(), t)), &[&format!("tensor `{name}`"), "expected [512, 3]"]);
}

#[test]
fn wrong_dtype_is_named_with_the_accepted_ones() {
    let name = "layers.0.attn.wq_b.weight";
    let t = T { name: name.into(), dtype: Dtype::I32, shape: vec![128, 32], data: vec![0; 128 * 32 * 4] };
    let msg = refusal(&replace(tiny_tensors(), t));
    assert_has(&msg, &[&format!("tensor `{name}`"), "dtype I32", "F32, BF16, F16"]);
    let name = "layers.0.ffn.gate.tid2eid";
    let msg = refusal(&replace(tiny_tensors(), f32_tensor(name, &[512, 3])));
    assert_has(&msg, &[&format!("tensor `{name}`"), "dtype F32", "I64, I32"]);
}

/// A config that implies more tensors than the checkpoint holds names the first missing one
/// without listing (or allocating for) all of them; impossible shape products name the keys.
#[test]
fn oversized_configs_are_refused_by_name_and_quickly() {
    let with = |key: &str, v: Value| -> Value {
        let mut c = tiny_config();
        c[key] = v;
        c
    };
    let tensors = tiny_tensors();
    let run = |config: Value| -> String {
        let dir = write(&config, &tensors);
        check(dir.path()).map(|a| a.to_string()).unwrap_err().to_string()
    };
    let started = std::time::Instant::now();
    let msg = run(with("n_routed_experts", 1_000_000_000_000u64.into()));
    assert_has(&msg, &["tensor `layers.0.ffn.experts.8.w1.weight`", "missing", "more language-model tensors"]);
    assert!(started.elapsed().as_secs() < 5, "the listing must stop early: {:?}", started.elapsed());
    assert_has(&run(with("num_hidden_layers", 6.into())), &["tensor `layers.5.attn_norm.weight`", "missing"]);
    let mut huge = with("hc_mult", (1u64 << 40).into());
    huge["hidden_size"] = (1u64 << 30).into();
    assert_has(&run(huge), &["config key `hc_mult × hidden_size`", "overflows"]);
}

#[test]
fn partial_sentinels_are_refused() {
    let msg = refusal(&without(tiny_tensors(), |n| n == "image_end"));
    assert_has(&msg, &["tensor `image_end`", "missing", "[64]"]);
}

// ---- wired into the LM loading path --------------------------------------------------------

/// An extra tensor `LmModel::load` would silently ignore: the pipeline refuses it by name, so
/// the accounting runs before the upload.
#[test]
fn dump_refuses_an_unknown_tensor_before_loading() {
    let mut tensors = tiny_tensors();
    tensors.push(f32_tensor("layers.0.attn.wq_c.weight", &[4, 4]));
    let dir = write(&tiny_config(), &tensors);
    let ckpt = Checkpoint::open_auto(dir.path()).unwrap();
    let cfg = LmConfig::from_file(&dir.path().join("config.json")).unwrap();
    assert!(LmModel::load(&CpuBackend::new(), &ckpt, &cfg).is_ok(), "the model itself ignores it");
    let msg = dump(dir.path()).map(|_| ()).unwrap_err().to_string();
    assert_has(&msg, &["tensor `layers.0.attn.wq_c.weight`", "unknown tensor"]);
}

/// Expert ids outside `0..n_routed_experts` pass the header accounting; `LmModel::load` refuses
/// them, and the pipeline surfaces that error.
#[test]
fn tid2eid_out_of_range_surfaces_from_the_load() {
    let name = "layers.1.ffn.gate.tid2eid";
    let mut tensors = tiny_tensors();
    let t = tensors.iter_mut().find(|t| t.name == name).unwrap();
    t.data[8 * 100..8 * 101].copy_from_slice(&8i64.to_le_bytes());
    let dir = write(&tiny_config(), &tensors);
    check(dir.path()).expect("headers are fine");
    let msg = dump(dir.path()).map(|_| ()).unwrap_err().to_string();
    assert_has(&msg, &[&format!("tensor `{name}`"), "expert id 8 outside 0..8"]);
}

/// The load progress counts each tensor's bytes once as the graph reads it: on the shipped
/// vl-scenes model (vision + LM, nothing skipped) the reports climb strictly to exactly the
/// checkpoint's total before `finish`; with mtp.* tensors never read, `finish` supplies the end.
#[test]
fn load_progress_counts_every_read_tensor_once() {
    use fovea::model::vision::VisionModel;
    use fovea::model::{CountingSource, LoadProgress};

    // (every report, the bytes reported before `finish`, the checkpoint's total)
    let reports = |dir: &Path, vision: bool| {
        let ckpt = if vision { Checkpoint::open(dir) } else { Checkpoint::open_auto(dir) }.unwrap();
        let cfg = LmConfig::from_file(&dir.join("config.json")).unwrap();
        let seen = std::cell::RefCell::new(Vec::<LoadProgress>::new());
        let mut record = |p| seen.borrow_mut().push(p);
        let src = CountingSource::new(&ckpt, &mut record);
        let b = CpuBackend::new();
        LmModel::load(&b, &src, &cfg).unwrap();
        if vision {
            VisionModel::load(&b, &src, ckpt.config()).unwrap();
        }
        let before_finish = seen.borrow().last().map_or(0, |p| p.done_bytes);
        src.finish();
        drop(src);
        (seen.into_inner(), before_finish, ckpt.total_bytes())
    };

    let (seen, before_finish, total) = reports(&common::model_dir("vl-scenes"), true);
    let (last, climbing) = seen.split_last().unwrap();
    assert!(climbing.windows(2).all(|w| w[0].done_bytes < w[1].done_bytes), "reports must climb");
    assert_eq!(last.done_bytes, total, "finish reports the end");
    assert!(seen.iter().all(|p| p.total_bytes == total));
    assert_eq!(before_finish, total, "every tensor of vl-scenes is read exactly once");

    let mut tensors = tiny_tensors();
    tensors.push(f32_tensor("mtp.0.e_proj.weight", &[64, 64]));
    let dir = write(&tiny_config(), &tensors);
    let (seen, before_finish, total) = reports(dir.path(), false);
    assert_eq!(before_finish, total - 64 * 64 * 4, "the skipped mtp.* bytes are not counted");
    assert_eq!(seen.last().unwrap().done_bytes, total, "finish reports the end");
}
