//! Checkpoint loader and vision accounting on tiny checkpoints built in temp dirs.
//!
//! Tiny config: 2 layers, dim 32, 2 heads (head_dim 16), inter 48, patch 4, r 3, hidden 24.
//! Every refusal test asserts that the message names the offending tensor, file or key.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use fovea::config::VisionConfig;
use fovea::weights::{Checkpoint, check_vision, vision_manifest};
use safetensors::Dtype;
use safetensors::tensor::TensorView as StView;
use serde_json::{Value, json};

const DIM: usize = 32;
const INTER: usize = 48;
const PATCH: usize = 4;
const R: usize = 3;
const HIDDEN: usize = 24;
const LAYERS: usize = 2;

fn tiny_config() -> Value {
    json!({
        "architectures": ["DeepseekV4ForCausalLM"],
        "vision_n_layers": LAYERS, "vision_dim": DIM, "vision_n_heads": 2, "vision_inter_dim": INTER,
        "vision_patch_size": PATCH, "vision_rope_theta": 10000.0, "vision_downsample_ratio": R,
        "vision_max_n_token": 384, "vision_min_pixels": 147456, "vision_max_wh_ratio": 8,
        "hidden_size": HIDDEN, "vocab_size": 1000
    })
}

#[derive(Clone)]
struct T {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn elem_bytes(d: Dtype) -> usize {
    d.bitsize() / 8
}

/// Deterministic values exactly representable in f16 and bf16: k/4 - 1.5 for k in 0..13.
fn value(seed: usize, i: usize) -> f32 {
    ((i * 7 + seed) % 13) as f32 * 0.25 - 1.5
}

fn encode(dtype: Dtype, vals: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => vals.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        Dtype::BF16 => vals.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        _ => vec![0u8; vals.len() * elem_bytes(dtype)],
    }
}

fn t(name: &str, dtype: Dtype, shape: &[usize]) -> T {
    let n: usize = shape.iter().product();
    let vals: Vec<f32> = (0..n).map(|i| value(name.len(), i)).collect();
    T { name: name.to_string(), dtype, shape: shape.to_vec(), data: encode(dtype, &vals) }
}

/// The full tiny vision tensor set, written out independently of `vision_manifest`:
/// matrices BF16 (patch embed F16), vectors F32.
fn vision_tensors() -> Vec<T> {
    use Dtype::*;
    let mut v = vec![
        t("vision.patch_embed.proj.weight", F16, &[DIM, 3 * PATCH * PATCH]),
        t("vision.patch_embed.proj.bias", F32, &[DIM]),
    ];
    for n in 0..LAYERS {
        let b = format!("vision.blocks.{n}");
        v.push(t(&format!("{b}.norm1.weight"), F32, &[DIM]));
        v.push(t(&format!("{b}.attn.wqkv.weight"), BF16, &[3 * DIM, DIM]));
        v.push(t(&format!("{b}.attn.wqkv.bias"), F32, &[3 * DIM]));
        v.push(t(&format!("{b}.attn.wo.weight"), BF16, &[DIM, DIM]));
        v.push(t(&format!("{b}.attn.wo.bias"), F32, &[DIM]));
        v.push(t(&format!("{b}.norm2.weight"), F32, &[DIM]));
        v.push(t(&format!("{b}.mlp.w1.weight"), BF16, &[2 * INTER, DIM]));
        v.push(t(&format!("{b}.mlp.w2.weight"), BF16, &[DIM, INTER]));
    }
    v.push(t("vision.norm.weight", F32, &[DIM]));
    v.push(t("aligner.w1.weight", BF16, &[HIDDEN, DIM * R * R]));
    v.push(t("aligner.w1.bias", F32, &[HIDDEN]));
    v.push(t("aligner.w2.weight", BF16, &[HIDDEN, HIDDEN]));
    v.push(t("aligner.w2.bias", F32, &[HIDDEN]));
    for s in ["image_start", "image_pad", "image_newline", "image_end"] {
        v.push(t(s, F32, &[HIDDEN]));
    }
    v
}

/// Vision tensors plus two language-model tensors (ignored by the vision accounting).
fn all_tensors() -> Vec<T> {
    let mut v = vision_tensors();
    v.push(t("embed.weight", Dtype::BF16, &[1000, HIDDEN]));
    v.push(t("layers.0.ffn.gate.bias_vl", Dtype::F32, &[8]));
    v
}

fn write_st(path: &Path, tensors: &[T]) {
    let views: Vec<(String, StView<'_>)> =
        tensors.iter().map(|t| (t.name.clone(), StView::new(t.dtype, t.shape.clone(), &t.data).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn write_config(dir: &Path, cfg: &Value) {
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(cfg).unwrap()).unwrap();
}

/// A temp dir holding the tiny config and a single-file checkpoint of `tensors`.
fn single(tensors: &[T]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &tiny_config());
    write_st(&dir.path().join("model.safetensors"), tensors);
    dir
}

/// Raw safetensors bytes: length prefix, header JSON padded with spaces so the data section
/// starts at a multiple of 8 in the file, then `data`.
fn raw_safetensors(header: &Value, data: &[u8]) -> Vec<u8> {
    let mut h = serde_json::to_string(header).unwrap().into_bytes();
    while (8 + h.len()) % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

fn open_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("expected Checkpoint::open({}) to fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn vision_err(tensors: &[T]) -> String {
    let dir = single(tensors);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    match check_vision(&ckpt, ckpt.config()) {
        Ok(_) => panic!("expected check_vision to fail"),
        Err(e) => e.to_string(),
    }
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error message {msg:?} lacks {p:?}");
    }
}

// ---- positive ------------------------------------------------------------------------------

#[test]
fn manifest_matches_independent_list() {
    let cfg = VisionConfig::from_value(tiny_config()).unwrap();
    let m = vision_manifest(&cfg);
    assert_eq!(m.len(), 8 * LAYERS + 11);
    let mine = vision_tensors();
    assert_eq!(m.len(), mine.len());
    for (e, t) in m.iter().zip(&mine) {
        assert_eq!((e.name.as_str(), e.shape.as_slice()), (t.name.as_str(), t.shape.as_slice()));
    }
}

#[test]
fn valid_single_file() {
    let tensors = all_tensors();
    let dir = single(&tensors);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.len(), tensors.len());
    assert_eq!(ckpt.files().len(), 1);
    assert_eq!(ckpt.config().head_dim(), 16);
    assert_eq!(ckpt.config().raw["vocab_size"], 1000);
    let total: u64 = tensors.iter().map(|t| t.data.len() as u64).sum();
    assert_eq!(ckpt.total_bytes(), total);
    let stats = ckpt.dtype_stats();
    assert_eq!(stats[&Dtype::F16].count, 1);
    assert_eq!(stats[&Dtype::BF16].count, 4 * LAYERS + 2 + 1);
    assert_eq!(stats[&Dtype::F32].count, 4 * LAYERS + 2 + 2 + 4 + 1);
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    assert_eq!(ckpt.names().collect::<Vec<_>>(), names);
    assert_eq!(ckpt.file_of("image_pad").unwrap(), dir.path().join("model.safetensors"));

    let acc = check_vision(&ckpt, ckpt.config()).unwrap();
    assert_eq!(acc.vision_tensors, 27);
    assert_eq!(acc.not_vision_tensors, 2);
    assert_eq!(acc.not_vision_bytes, (1000 * HIDDEN * 2 + 8 * 4) as u64);
    assert_eq!(acc.vision_bytes + acc.not_vision_bytes, total);
    let summary = acc.to_string();
    assert_has(&summary, &["27 tensors", "not vision: 2 tensors"]);
    assert_has(&ckpt.to_string(), &["tensors", "BF16", "2 layers"]);

    // Values round-trip, F32 vector and BF16 matrix (borrowed: the writer aligns offsets).
    let bias = ckpt.tensor("aligner.w1.bias").unwrap();
    assert!(bias.is_borrowed());
    let want: Vec<f32> = (0..HIDDEN).map(|i| value("aligner.w1.bias".len(), i)).collect();
    assert_eq!(bias.to_f32_vec().unwrap(), want);
    assert_eq!(bias.to_host_tensor().unwrap().shape, vec![HIDDEN]);

    let w = ckpt.tensor("vision.blocks.1.mlp.w2.weight").unwrap();
    assert!(w.is_borrowed());
    let hw = w.as_weight("vision.blocks.1.mlp.w2.weight").unwrap();
    assert!(matches!(hw.bytes, Cow::Borrowed(_)));
    assert_eq!((hw.rows, hw.cols, hw.format), (DIM, INTER, fovea::backend::WeightFormat::BF16));
    let mut row = vec![0f32; INTER];
    hw.row_f32(1, &mut row).unwrap();
    let seed = "vision.blocks.1.mlp.w2.weight".len();
    assert_eq!(row, (INTER..2 * INTER).map(|i| value(seed, i)).collect::<Vec<_>>());
}

#[test]
fn valid_sharded_checkpoint() {
    let tensors = all_tensors();
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &tiny_config());
    let (a, b) = tensors.split_at(13);
    write_st(&dir.path().join("model-00001-of-00002.safetensors"), a);
    write_st(&dir.path().join("model-00002-of-00002.safetensors"), b);
    let mut map = serde_json::Map::new();
    for t in a {
        map.insert(t.name.clone(), json!("model-00001-of-00002.safetensors"));
    }
    for t in b {
        map.insert(t.name.clone(), json!("model-00002-of-00002.safetensors"));
    }
    let index = json!({"metadata": {"total_size": 12345}, "weight_map": map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();

    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.files().len(), 2);
    assert_eq!(ckpt.len(), tensors.len());
    assert_eq!(ckpt.index_metadata().unwrap()["total_size"], 12345);
    assert_eq!(ckpt.file_of(&a[0].name).unwrap(), dir.path().join("model-00001-of-00002.safetensors"));
    assert_eq!(ckpt.file_of(&b[0].name).unwrap(), dir.path().join("model-00002-of-00002.safetensors"));
    let acc = check_vision(&ckpt, ckpt.config()).unwrap();
    assert_eq!(acc.vision_tensors, 27);
    let last = b.iter().find(|t| t.name == "image_end").unwrap();
    let want: Vec<f32> = (0..HIDDEN).map(|i| value(last.name.len(), i)).collect();
    assert_eq!(ckpt.tensor("image_end").unwrap().to_f32_vec().unwrap(), want);
}

#[test]
fn unaligned_offset_is_copied_and_read_correctly() {
    // A 1-byte U8 tensor first, so the F32 tensor's data starts at an odd file offset.
    let vals: Vec<f32> = vec![1.5, -2.25, 3.0, 1e-3, -0.0, 65536.5];
    let f16vals: Vec<f32> = vec![0.5, -1.0, 2.0];
    let mut data = vec![7u8];
    data.extend(encode(Dtype::F32, &vals));
    data.extend(encode(Dtype::F16, &f16vals)); // starts at 25: odd too
    let header = json!({
        "__metadata__": {"format": "pt"},
        "flag": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [1, 25]},
        "h": {"dtype": "F16", "shape": [3], "data_offsets": [25, 31]},
    });
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &tiny_config());
    std::fs::write(dir.path().join("model.safetensors"), raw_safetensors(&header, &data)).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();

    let flag = ckpt.tensor("flag").unwrap();
    assert!(flag.is_borrowed(), "a U8 tensor needs no alignment");
    assert_eq!(&*flag.bytes, &[7u8]);

    let w = ckpt.tensor("w").unwrap();
    assert!(!w.is_borrowed(), "odd offset must take the copy path");
    assert_eq!(w.shape, vec![2, 3]);
    assert_eq!(w.to_f32_vec().unwrap(), vals);
    let hw = w.as_weight("w").unwrap();
    assert!(matches!(hw.bytes, Cow::Owned(_)));
    let mut row = vec![0f32; 3];
    hw.row_f32(1, &mut row).unwrap();
    assert_eq!(row, &vals[3..]);
    let hw2 = w.into_weight("w").unwrap();
    assert_eq!(hw2.bytes.len(), 24);

    let h = ckpt.tensor("h").unwrap();
    assert!(!h.is_borrowed());
    assert_eq!(h.to_f32_vec().unwrap(), f16vals);
}

#[test]
fn f16_and_bf16_convert_to_f32() {
    // Bit patterns written by hand: normal, negative, max/large, subnormal.
    let f16_bits: [u16; 5] = [0x3C00, 0xC100, 0x7BFF, 0x0001, 0x3555];
    let f16_want: [f32; 5] = [1.0, -2.5, 65504.0, 2f32.powi(-24), 0.333_251_95];
    let bf16_bits: [u16; 5] = [0x3F80, 0xC020, 0x4049, 0x0001, 0x7F7F];
    let bf16_want: [f32; 5] = [1.0, -2.5, 3.140625, 2f32.powi(-133), f32::from_bits(0x7F7F_0000)];
    let f16_data: Vec<u8> = f16_bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let bf16_data: Vec<u8> = bf16_bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let tensors = vec![
        T { name: "a16".into(), dtype: Dtype::F16, shape: vec![5], data: f16_data },
        T { name: "b16".into(), dtype: Dtype::BF16, shape: vec![5], data: bf16_data },
    ];
    let dir = single(&tensors);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.tensor("a16").unwrap().to_f32_vec().unwrap(), f16_want);
    assert_eq!(ckpt.tensor("b16").unwrap().to_f32_vec().unwrap(), bf16_want);
}

// ---- vision accounting refusals ------------------------------------------------------------

#[test]
fn refuses_missing_tensor() {
    let mut v = all_tensors();
    v.retain(|t| t.name != "vision.blocks.1.mlp.w2.weight");
    let e = vision_err(&v);
    assert_has(&e, &["vision.blocks.1.mlp.w2.weight", "missing", "[32, 48]"]);

    let mut v = all_tensors();
    v.retain(|t| t.name != "image_pad");
    assert_has(&vision_err(&v), &["`image_pad`", "missing", "[24]"]);
}

#[test]
fn refuses_unexpected_tensor() {
    let mut v = all_tensors();
    v.push(t("vision.blocks.2.norm1.weight", Dtype::F32, &[DIM])); // a third block in a 2-layer config
    assert_has(&vision_err(&v), &["vision.blocks.2.norm1.weight", "unexpected"]);

    let mut v = all_tensors();
    v.push(t("image_extra", Dtype::F32, &[HIDDEN]));
    assert_has(&vision_err(&v), &["`image_extra`", "unexpected"]);

    let mut v = all_tensors();
    v.push(t("aligner.w3.weight", Dtype::BF16, &[HIDDEN, HIDDEN]));
    assert_has(&vision_err(&v), &["`aligner.w3.weight`", "unexpected"]);
}

#[test]
fn refuses_wrong_shape() {
    let mut v = all_tensors();
    let i = v.iter().position(|t| t.name == "vision.blocks.0.attn.wqkv.weight").unwrap();
    v[i] = t("vision.blocks.0.attn.wqkv.weight", Dtype::BF16, &[DIM, 3 * DIM]); // transposed
    assert_has(&vision_err(&v), &["vision.blocks.0.attn.wqkv.weight", "found [32, 96]", "expected [96, 32]"]);

    let mut v = all_tensors();
    let i = v.iter().position(|t| t.name == "aligner.w1.weight").unwrap();
    v[i] = t("aligner.w1.weight", Dtype::BF16, &[HIDDEN, DIM * 4]); // r = 2 instead of 3
    assert_has(&vision_err(&v), &["`aligner.w1.weight`", "found [24, 128]", "expected [24, 288]"]);
}

#[test]
fn refuses_wrong_dtype() {
    for (name, dtype, shown) in
        [("image_pad", Dtype::I32, "I32"), ("vision.blocks.1.attn.wo.weight", Dtype::F64, "F64")]
    {
        let mut v = all_tensors();
        let i = v.iter().position(|t| t.name == name).unwrap();
        let shape = v[i].shape.clone();
        v[i] = t(name, dtype, &shape);
        let e = vision_err(&v);
        assert_has(&e, &[&format!("`{name}`"), shown, "F32, BF16, F16"]);
    }
}

#[test]
fn several_problems_are_counted() {
    let mut v = all_tensors();
    v.retain(|t| t.name != "image_end" && t.name != "vision.norm.weight");
    let e = vision_err(&v);
    assert_has(&e, &["`vision.norm.weight`", "missing", "1 more"]);
}

// ---- file-level refusals -------------------------------------------------------------------

#[test]
fn refuses_truncated_file() {
    let dir = single(&all_tensors());
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let e = open_err(dir.path());
    assert_has(&e, &[path.to_str().unwrap(), "truncated", "runs past the end"]);
}

#[test]
fn refuses_trailing_bytes() {
    let dir = single(&all_tensors());
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(&[0; 5]);
    std::fs::write(&path, &bytes).unwrap();
    assert_has(&open_err(dir.path()), &[path.to_str().unwrap(), "5 trailing bytes"]);
}

#[test]
fn refuses_absurd_header_length() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &tiny_config());
    let path = dir.path().join("model.safetensors");
    let good = raw_safetensors(&json!({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}), &[0u8; 8]);
    let room = (good.len() - 8) as u64;
    for n in [u64::MAX, room + 1, 1 << 40] {
        let mut b = good.clone();
        b[..8].copy_from_slice(&n.to_le_bytes());
        std::fs::write(&path, &b).unwrap();
        let e = open_err(dir.path());
        assert_has(&e, &[path.to_str().unwrap(), &format!("header length {n}"), "exceeds the file"]);
    }
    // Shorter than the 8-byte length prefix.
    std::fs::write(&path, [1u8, 2, 3]).unwrap();
    assert_has(&open_err(dir.path()), &[path.to_str().unwrap(), "too short"]);
    // Header length fits, but the header is not JSON.
    let mut b = 4u64.to_le_bytes().to_vec();
    b.extend_from_slice(b"abcd");
    std::fs::write(&path, &b).unwrap();
    assert_has(&open_err(dir.path()), &[path.to_str().unwrap(), "header"]);
}

#[test]
fn refuses_overlapping_and_out_of_range_offsets() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &tiny_config());
    let path = dir.path().join("model.safetensors");
    let cases = [
        (
            json!({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                   "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}),
            24,
            vec!["`b`", "overlap"],
        ),
        (
            json!({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                   "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}),
            24,
            vec!["`b`", "truncated"],
        ),
        (json!({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}), 12, vec!["`a`", "needs 16 bytes"]),
        (
            json!({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                   "b": {"dtype": "F32", "shape": [1], "data_offsets": [20, 24]}}),
            24,
            vec!["`b`", "gap"],
        ),
        (
            json!({"a": {"dtype": "F32", "shape": [4611686018427387904u64, 8], "data_offsets": [0, 16]}}),
            16,
            vec!["`a`", "overflow"],
        ),
    ];
    for (header, len, parts) in cases {
        std::fs::write(&path, raw_safetensors(&header, &vec![0u8; len])).unwrap();
        let e = open_err(dir.path());
        let mut parts = parts;
        parts.push(path.to_str().unwrap());
        assert_has(&e, &parts);
    }
}

#[test]
fn refuses_unknown_tensor_lookup_and_bad_conversion() {
    let dir = single(&all_tensors());
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let e = ckpt.tensor("nope.weight").unwrap_err().to_string();
    assert_has(&e, &["`nope.weight`", "not in checkpoint"]);
    // A 1-D tensor is not a weight matrix.
    let e = ckpt.tensor("image_pad").unwrap().as_weight("image_pad").unwrap_err().to_string();
    assert_has(&e, &["`image_pad`", "2-D"]);

    let dir = single(&[t("ints", Dtype::I32, &[2, 2])]);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let v = ckpt.tensor("ints").unwrap();
    assert_has(&v.to_f32_vec().unwrap_err().to_string(), &["`ints`", "I32"]);
    assert_has(&v.as_weight("ints").unwrap_err().to_string(), &["`ints`", "I32"]);
}

#[test]
fn refuses_directory_without_weights() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &tiny_config());
    assert_has(&open_err(dir.path()), &[dir.path().to_str().unwrap(), "model.safetensors"]);
}

// ---- config refusals -----------------------------------------------------------------------

fn config_err(cfg: Value) -> String {
    let dir = single(&all_tensors());
    write_config(dir.path(), &cfg);
    open_err(dir.path())
}

#[test]
fn refuses_bad_config() {
    let mut c = tiny_config();
    c.as_object_mut().unwrap().remove("vision_inter_dim");
    assert_has(&config_err(c), &["config key `vision_inter_dim`", "missing"]);

    let mut c = tiny_config();
    c["vision_patch_size"] = json!("4");
    assert_has(&config_err(c), &["config key `vision_patch_size`", "a string"]);

    let mut c = tiny_config();
    c["hidden_size"] = json!(-24);
    assert_has(&config_err(c), &["config key `hidden_size`", "positive"]);

    let mut c = tiny_config();
    c["vision_n_heads"] = json!(3); // 32 % 3 != 0
    assert_has(&config_err(c), &["config key `vision_n_heads`", "not divisible"]);

    let mut c = tiny_config();
    c["vision_n_heads"] = json!(16); // head_dim 2, not divisible by 4
    assert_has(&config_err(c), &["config key `vision_n_heads`", "divisible by 4"]);

    let mut c = tiny_config();
    c["vision_rope_theta"] = json!(null);
    assert_has(&config_err(c), &["config key `vision_rope_theta`"]);

    // max_wh_ratio may be null; theta may be an integer.
    let mut c = tiny_config();
    c["vision_max_wh_ratio"] = json!(null);
    c["vision_rope_theta"] = json!(10000);
    let dir = single(&all_tensors());
    write_config(dir.path(), &c);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.config().max_wh_ratio, None);
    assert_eq!(ckpt.config().rope_theta, 10000.0);

    // Not JSON / missing: the message names the file.
    let dir = single(&all_tensors());
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert_has(&open_err(dir.path()), &["config.json", "not valid JSON"]);
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    assert_has(&open_err(dir.path()), &["config.json", "cannot read"]);
}

// ---- shard index refusals ------------------------------------------------------------------

/// Two shards of `all_tensors()` and an index; `edit` may change the index and shard contents.
fn sharded(edit: impl FnOnce(&mut serde_json::Map<String, Value>, &mut Vec<T>, &mut Vec<T>)) -> tempfile::TempDir {
    let tensors = all_tensors();
    let (a, b) = tensors.split_at(13);
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    let mut map = serde_json::Map::new();
    for t in &a {
        map.insert(t.name.clone(), json!("s1.safetensors"));
    }
    for t in &b {
        map.insert(t.name.clone(), json!("s2.safetensors"));
    }
    edit(&mut map, &mut a, &mut b);
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &tiny_config());
    write_st(&dir.path().join("s1.safetensors"), &a);
    write_st(&dir.path().join("s2.safetensors"), &b);
    let index = json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    dir
}

#[test]
fn sharded_fixture_is_valid() {
    let dir = sharded(|_, _, _| {});
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    check_vision(&ckpt, ckpt.config()).unwrap();
}

#[test]
fn refuses_index_pointing_at_missing_file() {
    let dir = sharded(|map, _, _| {
        map.insert("image_pad".into(), json!("s3.safetensors"));
    });
    let missing: PathBuf = dir.path().join("s3.safetensors");
    assert_has(&open_err(dir.path()), &[missing.to_str().unwrap(), "does not exist", "`image_pad`"]);
}

#[test]
fn refuses_tensor_not_in_its_shard() {
    // Listed for s2, stored nowhere.
    let dir = sharded(|_, _, b| b.retain(|t| t.name != "image_pad"));
    assert_has(&open_err(dir.path()), &["`image_pad`", "absent from that file", "s2.safetensors"]);
    // Listed for s1, stored in s2.
    let dir = sharded(|map, _, _| {
        map.insert("image_pad".into(), json!("s1.safetensors"));
    });
    assert_has(&open_err(dir.path()), &["`image_pad`", "maps it to", "s1.safetensors", "stored in"]);
}

#[test]
fn refuses_tensor_in_two_shards() {
    let dir = sharded(|_, a, b| a.push(b.iter().find(|t| t.name == "image_pad").unwrap().clone()));
    assert_has(&open_err(dir.path()), &["`image_pad`", "more than one shard", "s1.safetensors", "s2.safetensors"]);
}

#[test]
fn refuses_tensor_missing_from_index() {
    let dir = sharded(|map, _, _| {
        map.remove("image_pad");
    });
    assert_has(&open_err(dir.path()), &["`image_pad`", "not listed"]);
}

#[test]
fn refuses_index_path_escape_and_bad_index() {
    let dir = sharded(|map, _, _| {
        map.insert("image_pad".into(), json!("../s2.safetensors"));
    });
    assert_has(&open_err(dir.path()), &["model.safetensors.index.json", "`image_pad`", "not a plain relative path"]);

    let dir = sharded(|_, _, _| {});
    std::fs::write(dir.path().join("model.safetensors.index.json"), r#"{"metadata": {}}"#).unwrap();
    assert_has(&open_err(dir.path()), &["model.safetensors.index.json", "weight_map"]);
}

#[test]
fn corrupt_shard_is_named() {
    let dir = sharded(|_, _, _| {});
    let p = dir.path().join("s2.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    assert_has(&open_err(dir.path()), &[p.to_str().unwrap()]);
}
