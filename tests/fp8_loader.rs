//! The official DeepSeek FP8/FP4 safetensors forms (formats.md §1) through the loader, on small
//! synthetic checkpoints written here.
//!
//! Expected values come from DeepSeek's published formulas, transcribed here independently of
//! `src/`: FP8 value = e4m3(code) · 2^(e − 127) (E8M0 scales) or e4m3(code) · s (F32 scales);
//! FP4 value = ±{0, .5, 1, 1.5, 2, 3, 4, 6}[code & 7] (sign bit 0x8) · 2^(e − 127), element 2i in
//! the low nibble of byte i. Each is exact in f32 (a 4-bit significand times a power of two, or
//! one correctly rounded product with an f32 scale), so a decoded row must equal it bit for bit.
//! One exception, by design: FP4 code 8 is −0 in DeepSeek's table and +0 in ggml's MXFP4 table
//! (an int8 table has no −0), so zeros compare by value.
//! E8M0 byte 255 (NaN in OCP, 2^128 to ggml) is not generated.

use std::path::Path;

use fovea::backend::WeightFormat;
use fovea::config::{LmConfig, QuantConfig};
use fovea::formats::decode_row;
use fovea::model::ParamSource;
use fovea::weights::{Checkpoint, check_lm, lm_manifest};
use safetensors::Dtype;
use safetensors::tensor::TensorView as StView;
use serde_json::{Value, json};

// ---- DeepSeek's formulas, transcribed -------------------------------------------------------

/// OCP e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal.
fn e4m3(code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (((code >> 3) & 0x0F) as i32, (code & 0x07) as f64);
    let mag = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
    sign * mag
}

fn e8m0(e: u8) -> f64 {
    2f64.powi(e as i32 - 127)
}

const FP4_TABLE: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

fn e2m1(code: u8) -> f64 {
    let v = FP4_TABLE[(code & 7) as usize];
    if code & 8 != 0 { -v } else { v }
}

// ---- synthetic data -------------------------------------------------------------------------

/// xorshift64*: deterministic bytes for the tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    /// An e4m3 code that is not NaN (0x7F, 0xFF).
    fn fp8_code(&mut self) -> u8 {
        loop {
            let c = self.byte();
            if c & 0x7F != 0x7F {
                return c;
            }
        }
    }
    /// An E8M0 exponent; the edges (0, 127, 254) come often, 255 never.
    fn exponent(&mut self) -> u8 {
        match self.next() % 8 {
            0 => 0,
            1 => 254,
            2 => 127,
            _ => 110 + (self.next() % 35) as u8,
        }
    }
}

#[derive(Clone)]
struct T {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn tensor(name: &str, dtype: Dtype, shape: &[usize], data: Vec<u8>) -> T {
    T { name: name.to_string(), dtype, shape: shape.to_vec(), data }
}

fn f32_tensor(name: &str, shape: &[usize]) -> T {
    let n: usize = shape.iter().product();
    let data = (0..n).flat_map(|i| ((i % 7) as f32 * 0.125 - 0.375).to_le_bytes()).collect();
    tensor(name, Dtype::F32, shape, data)
}

/// An FP8 weight `[rows, cols]` and its scale (`E8M0` bytes or f32 values), with the
/// expected matrix from the formula.
fn fp8_pair(rng: &mut Rng, stem: &str, rows: usize, cols: usize, f32_scale: bool) -> (Vec<T>, Vec<f32>) {
    let codes: Vec<u8> = (0..rows * cols).map(|_| rng.fp8_code()).collect();
    let (sr, sc) = (rows.div_ceil(128), cols / 128);
    let mut want = vec![0f32; rows * cols];
    let scale = if f32_scale {
        // f32 scales as the Base checkpoint stores them: arbitrary positive floats
        let s: Vec<f32> = (0..sr * sc).map(|_| (rng.next() % 100_000) as f32 * 1.7e-7 + 1e-9).collect();
        for r in 0..rows {
            for c in 0..cols {
                want[r * cols + c] = (e4m3(codes[r * cols + c]) * s[r / 128 * sc + c / 128] as f64) as f32;
            }
        }
        tensor(&format!("{stem}.scale"), Dtype::F32, &[sr, sc], s.iter().flat_map(|v| v.to_le_bytes()).collect())
    } else {
        let e: Vec<u8> = (0..sr * sc).map(|_| rng.exponent()).collect();
        for r in 0..rows {
            for c in 0..cols {
                want[r * cols + c] = (e4m3(codes[r * cols + c]) * e8m0(e[r / 128 * sc + c / 128])) as f32;
            }
        }
        tensor(&format!("{stem}.scale"), Dtype::F8_E8M0, &[sr, sc], e)
    };
    (vec![tensor(&format!("{stem}.weight"), Dtype::F8_E4M3, &[rows, cols], codes), scale], want)
}

/// An FP4 weight `[rows, cols]` (I8 `[rows, cols/2]`) and its E8M0 scale `[rows, cols/32]`.
fn fp4_pair(rng: &mut Rng, stem: &str, rows: usize, cols: usize) -> (Vec<T>, Vec<f32>) {
    let packed: Vec<u8> = (0..rows * cols / 2).map(|_| rng.byte()).collect();
    let e: Vec<u8> = (0..rows * cols / 32).map(|_| rng.exponent()).collect();
    let mut want = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let byte = packed[(r * cols + c) / 2];
            let code = if c % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            want[r * cols + c] = (e2m1(code) * e8m0(e[r * cols / 32 + c / 32])) as f32;
        }
    }
    let w = tensor(&format!("{stem}.weight"), Dtype::I8, &[rows, cols / 2], packed);
    (vec![w, tensor(&format!("{stem}.scale"), Dtype::F8_E8M0, &[rows, cols / 32], e)], want)
}

fn quant_config(scale_fmt: Option<&str>, expert_dtype: &str) -> Value {
    let mut q = json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                        "activation_scheme": "dynamic"});
    if let Some(s) = scale_fmt {
        q["scale_fmt"] = json!(s);
    }
    json!({"quantization_config": q, "expert_dtype": expert_dtype})
}

/// The official V4-Flash keys.
fn flash_quant() -> Value {
    quant_config(Some("ue8m0"), "fp4")
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

fn open(dir: &Path) -> fovea::Result<Checkpoint> {
    Checkpoint::open_without_vision(dir)
}

/// Every row of `name` through `ParamSource::matrix` and `decode_row`, against `want`.
fn assert_decodes(ckpt: &Checkpoint, name: &str, format: WeightFormat, rows: usize, cols: usize, want: &[f32]) {
    let w = ckpt.matrix(name).unwrap();
    assert_eq!((w.format, w.rows, w.cols), (format, rows, cols), "{name}");
    assert!(!w.bytes.is_empty() && matches!(w.bytes, std::borrow::Cow::Owned(_)), "{name}: re-laid bytes are owned");
    let rb = format.row_bytes(cols);
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        decode_row(format, &w.bytes[r * rb..(r + 1) * rb], &mut row);
        for (c, (&got, &exp)) in row.iter().zip(&want[r * cols..(r + 1) * cols]).enumerate() {
            // −0 (DeepSeek's FP4 code 8) decodes to +0 in ggml's MXFP4: zeros compare by value
            let same = got.to_bits() == exp.to_bits() || (got == 0.0 && exp == 0.0);
            assert!(
                same,
                "{name} [{r}, {c}]: decoded {got:e} ({:#010x}), formula {exp:e} ({:#010x})",
                got.to_bits(),
                exp.to_bits()
            );
        }
    }
}

// ---- decoding ---------------------------------------------------------------------------

#[test]
fn fp8_with_e8m0_block_scales_decodes_to_deepseeks_values() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // 200 rows: the second block row of the scale grid is partial (ceil(200/128) = 2)
    let (mut ts, want_o) = fp8_pair(&mut rng, "layers.0.attn.wo_a", 200, 384, false);
    let (more, want_s) = fp8_pair(&mut rng, "layers.0.ffn.shared_experts.w2", 128, 256, false);
    ts.extend(more);
    let dir = write(&flash_quant(), &ts);
    let ckpt = open(dir.path()).unwrap();
    assert_decodes(&ckpt, "layers.0.attn.wo_a.weight", WeightFormat::FP8_E4M3_B128_E8M0, 200, 384, &want_o);
    assert_decodes(&ckpt, "layers.0.ffn.shared_experts.w2.weight", WeightFormat::FP8_E4M3_B128_E8M0, 128, 256, &want_s);
    // 129/128 of the weight bytes: the scale byte is repeated once per row of its block
    assert_eq!(ckpt.matrix("layers.0.attn.wo_a.weight").unwrap().bytes.len(), 200 * 3 * 129);
}

#[test]
fn fp4_experts_decode_to_deepseeks_values_as_mxfp4() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let (mut ts, want1) = fp4_pair(&mut rng, "layers.1.ffn.experts.3.w1", 24, 96);
    let (more, want2) = fp4_pair(&mut rng, "layers.1.ffn.experts.3.w2", 96, 64);
    ts.extend(more);
    let dir = write(&flash_quant(), &ts);
    let ckpt = open(dir.path()).unwrap();
    assert_decodes(&ckpt, "layers.1.ffn.experts.3.w1.weight", WeightFormat::MXFP4, 24, 96, &want1);
    assert_decodes(&ckpt, "layers.1.ffn.experts.3.w2.weight", WeightFormat::MXFP4, 96, 64, &want2);
    // MXFP4 is exactly the packed weight plus its scales
    assert_eq!(ckpt.matrix("layers.1.ffn.experts.3.w1.weight").unwrap().bytes.len(), 24 * 48 + 24 * 3);
}

/// The MXFP4 block as llama.cpp's converter writes it (`repack_mxfp4_blocks`: the scale byte,
/// then byte j = element j | element j + 16 << 4), on one hand-made group.
#[test]
fn fp4_nibbles_are_repacked_like_llama_cpps_converter() {
    // element k = k % 16: bytes hold (2i, 2i+1) as (low, high)
    let packed: Vec<u8> = (0..16u8).map(|i| ((2 * i) % 16) | (((2 * i + 1) % 16) << 4)).collect();
    let ts = vec![
        tensor("layers.0.ffn.experts.0.w1.weight", Dtype::I8, &[1, 16], packed),
        tensor("layers.0.ffn.experts.0.w1.scale", Dtype::F8_E8M0, &[1, 1], vec![131]),
    ];
    let dir = write(&flash_quant(), &ts);
    let ckpt = open(dir.path()).unwrap();
    let w = ckpt.matrix("layers.0.ffn.experts.0.w1.weight").unwrap();
    let mut want = vec![131u8];
    // element j is j % 16; element j + 16 is (j + 16) % 16 = j
    want.extend((0..16u8).map(|j| j | (j << 4)));
    assert_eq!(&w.bytes[..], &want[..]);
}

#[test]
fn fp8_experts_with_f32_scales_as_in_flash_base() {
    let mut rng = Rng(0x94D0_49BB_1331_11EB);
    let (mut ts, want_e) = fp8_pair(&mut rng, "layers.0.ffn.experts.1.w3", 130, 128, true);
    let (more, want_a) = fp8_pair(&mut rng, "layers.0.attn.wq_a", 64, 256, false);
    ts.extend(more);
    let dir = write(&quant_config(Some("ue8m0"), "fp8"), &ts);
    let ckpt = open(dir.path()).unwrap();
    assert_eq!(ckpt.quant().unwrap(), QuantConfig::from_value(&quant_config(Some("ue8m0"), "fp8")).unwrap().unwrap());
    assert_decodes(&ckpt, "layers.0.ffn.experts.1.w3.weight", WeightFormat::FP8_E4M3_B128_F32, 130, 128, &want_e);
    assert_decodes(&ckpt, "layers.0.attn.wq_a.weight", WeightFormat::FP8_E4M3_B128_E8M0, 64, 256, &want_a);
}

#[test]
fn without_scale_fmt_every_fp8_scale_is_f32() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let (ts, want) = fp8_pair(&mut rng, "layers.0.attn.wkv", 16, 128, true);
    let dir = write(&quant_config(None, "fp8"), &ts);
    let ckpt = open(dir.path()).unwrap();
    assert_decodes(&ckpt, "layers.0.attn.wkv.weight", WeightFormat::FP8_E4M3_B128_F32, 16, 128, &want);
}

// ---- refusals (each names the tensor or key, and the file) -----------------------------------

fn refusal(config: &Value, tensors: &[T]) -> String {
    let dir = write(config, tensors);
    match open(dir.path()) {
        Ok(_) => panic!("expected the checkpoint to be refused"),
        Err(e) => e.to_string(),
    }
}

fn assert_has(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error message {msg:?} lacks {p:?}");
    }
}

fn e8m0_scale(name: &str, shape: &[usize]) -> T {
    tensor(name, Dtype::F8_E8M0, shape, vec![127; shape.iter().product()])
}

fn fp8_weight(name: &str, shape: &[usize]) -> T {
    tensor(name, Dtype::F8_E4M3, shape, vec![0x38; shape.iter().product()])
}

#[test]
fn a_missing_scale_is_named() {
    let msg = refusal(&flash_quant(), &[fp8_weight("layers.0.attn.wo_b.weight", &[64, 128])]);
    assert_has(&msg, &["`layers.0.attn.wo_b.weight`", "layers.0.attn.wo_b.scale", "model.safetensors"]);
}

#[test]
fn a_misshaped_scale_is_named_with_both_shapes() {
    let ts = [fp8_weight("layers.0.attn.wo_b.weight", &[256, 128]), e8m0_scale("layers.0.attn.wo_b.scale", &[1, 1])];
    let msg = refusal(&flash_quant(), &ts);
    assert_has(&msg, &["`layers.0.attn.wo_b.scale`", "[1, 1]", "[2, 1]", "model.safetensors"]);
    // FP4: one scale per 32 values of each row
    let ts = [
        tensor("layers.0.ffn.experts.0.w1.weight", Dtype::I8, &[4, 32], vec![0; 128]),
        e8m0_scale("layers.0.ffn.experts.0.w1.scale", &[4, 1]),
    ];
    assert_has(&refusal(&flash_quant(), &ts), &["`layers.0.ffn.experts.0.w1.scale`", "[4, 1]", "[4, 2]"]);
}

#[test]
fn a_scale_without_its_weight_is_named() {
    let msg = refusal(&flash_quant(), &[e8m0_scale("layers.0.attn.wq_b.scale", &[1, 1])]);
    assert_has(
        &msg,
        &["`layers.0.attn.wq_b.scale`", "without its weight", "layers.0.attn.wq_b.weight", "model.safetensors"],
    );
    // beside a float weight a scale means nothing
    let ts = [f32_tensor("layers.0.attn.wq_b.weight", &[4, 128]), e8m0_scale("layers.0.attn.wq_b.scale", &[1, 1])];
    assert_has(&refusal(&flash_quant(), &ts), &["`layers.0.attn.wq_b.scale`", "F32"]);
}

#[test]
fn in_dims_that_are_not_whole_blocks_are_named() {
    let ts = [fp8_weight("layers.0.attn.wkv.weight", &[128, 96]), e8m0_scale("layers.0.attn.wkv.scale", &[1, 1])];
    assert_has(&refusal(&flash_quant(), &ts), &["`layers.0.attn.wkv.weight`", "96", "128", "model.safetensors"]);
    let ts = [
        tensor("layers.0.ffn.experts.2.w2.weight", Dtype::I8, &[4, 8], vec![0; 32]),
        e8m0_scale("layers.0.ffn.experts.2.w2.scale", &[4, 1]),
    ];
    assert_has(&refusal(&flash_quant(), &ts), &["`layers.0.ffn.experts.2.w2.weight`", "16", "32"]);
}

#[test]
fn dtypes_the_config_does_not_announce_are_named() {
    let pair = [fp8_weight("layers.0.attn.wq_a.weight", &[8, 128]), e8m0_scale("layers.0.attn.wq_a.scale", &[1, 1])];
    // no quantization_config at all
    assert_has(
        &refusal(&json!({}), &pair),
        &["`layers.0.attn.wq_a.weight`", "quantization_config", "model.safetensors"],
    );
    // E8M0 scales where scale_fmt is absent (F32 announced)
    assert_has(&refusal(&quant_config(None, "fp4"), &pair), &["`layers.0.attn.wq_a.scale`", "F8_E8M0", "F32"]);
    // F32 scales on an attention matrix where ue8m0 is announced
    let f32_scale = tensor("layers.0.attn.wq_a.scale", Dtype::F32, &[1, 1], 1f32.to_le_bytes().to_vec());
    assert_has(
        &refusal(&flash_quant(), &[pair[0].clone(), f32_scale]),
        &["`layers.0.attn.wq_a.scale`", "F32", "F8_E8M0"],
    );
    // FP4 outside the routed experts
    let fp4_attn = [
        tensor("layers.0.attn.wq_a.weight", Dtype::I8, &[8, 64], vec![0; 512]),
        e8m0_scale("layers.0.attn.wq_a.scale", &[8, 4]),
    ];
    assert_has(&refusal(&flash_quant(), &fp4_attn), &["`layers.0.attn.wq_a.weight`", "I8", "routed experts"]);
    // FP4 experts where expert_dtype says fp8, FP8 experts where it says fp4
    let fp4_expert = [
        tensor("layers.0.ffn.experts.0.w1.weight", Dtype::I8, &[8, 64], vec![0; 512]),
        e8m0_scale("layers.0.ffn.experts.0.w1.scale", &[8, 4]),
    ];
    assert_has(
        &refusal(&quant_config(Some("ue8m0"), "fp8"), &fp4_expert),
        &["`layers.0.ffn.experts.0.w1.weight`", "expert_dtype"],
    );
    let fp8_expert = [
        fp8_weight("layers.0.ffn.experts.0.w1.weight", &[8, 128]),
        e8m0_scale("layers.0.ffn.experts.0.w1.scale", &[1, 1]),
    ];
    assert_has(&refusal(&flash_quant(), &fp8_expert), &["`layers.0.ffn.experts.0.w1.weight`", "expert_dtype", "fp4"]);
}

#[test]
fn quantization_config_keys_are_validated_by_name() {
    let bad = |key: &str, v: Value| {
        let mut c = flash_quant();
        c["quantization_config"][key] = v;
        QuantConfig::from_value(&c).unwrap_err().to_string()
    };
    assert_has(&bad("quant_method", json!("bitsandbytes")), &["quantization_config.quant_method", "bitsandbytes"]);
    assert_has(&bad("fmt", json!("e5m2")), &["quantization_config.fmt", "e5m2"]);
    assert_has(&bad("scale_fmt", json!("e4m3")), &["quantization_config.scale_fmt"]);
    assert_has(&bad("weight_block_size", json!([64, 64])), &["quantization_config.weight_block_size", "[64,64]"]);
    assert_has(&bad("activation_scheme", json!("static")), &["quantization_config.activation_scheme", "static"]);
    let mut c = flash_quant();
    c["quantization_config"].as_object_mut().unwrap().remove("fmt");
    assert_has(&QuantConfig::from_value(&c).unwrap_err().to_string(), &["quantization_config.fmt", "missing"]);
    let mut c = flash_quant();
    c["expert_dtype"] = json!("int4");
    assert_has(&QuantConfig::from_value(&c).unwrap_err().to_string(), &["expert_dtype", "int4"]);
    // the refusal reaches the loader, naming the key
    let dir = write(
        &{
            let mut c = flash_quant();
            c["quantization_config"]["fmt"] = json!("e5m2");
            c
        },
        &[],
    );
    assert_has(&open(dir.path()).unwrap_err().to_string(), &["quantization_config.fmt"]);
}

// ---- accounting ------------------------------------------------------------------------------

/// A small LM whose FP8 matrices have in-dims of 128 (hidden, q_lora_rank, head width, o rank,
/// expert width).
fn quantized_lm_config() -> Value {
    let mut c = json!({
        "vocab_size": 16, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "head_dim": 64, "qk_rope_head_dim": 16, "q_lora_rank": 128, "o_groups": 1, "o_lora_rank": 128,
        "n_routed_experts": 2, "num_experts_per_tok": 1, "n_shared_experts": 1, "moe_intermediate_size": 128,
        "num_hash_layers": 1, "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "sliding_window": 8, "compress_ratios": [0, 4], "compress_rope_theta": 160000.0, "rope_theta": 10000.0,
        "index_n_heads": 2, "index_head_dim": 64, "index_topk": 4, "hc_mult": 2, "hc_sinkhorn_iters": 2,
        "hc_eps": 1e-6, "rms_norm_eps": 1e-6
    });
    let q = flash_quant();
    c["quantization_config"] = q["quantization_config"].clone();
    c["expert_dtype"] = q["expert_dtype"].clone();
    c
}

/// Every LM tensor of `cfg` in the official storage: routed experts FP4, the FP8 list FP8 with
/// E8M0 scales (formats.md §1), the rest F32 (I64 tid2eid).
fn quantized_lm(cfg: &LmConfig) -> Vec<T> {
    let mut rng = Rng(7);
    let fp8_names = ["wq_a.weight", "wq_b.weight", "wkv.weight", "wo_a.weight", "wo_b.weight", "shared_experts."];
    let mut out = Vec::new();
    for e in lm_manifest(cfg).unwrap() {
        let stem = e.name.trim_end_matches(".weight");
        if e.name.contains(".ffn.experts.") {
            out.extend(fp4_pair(&mut rng, stem, e.shape[0], e.shape[1]).0);
        } else if e.name.starts_with("layers.")
            && fp8_names.iter().any(|n| e.name.contains(n))
            && !e.name.contains("compressor")
        {
            out.extend(fp8_pair(&mut rng, stem, e.shape[0], e.shape[1], false).0);
        } else if e.name.ends_with("tid2eid") {
            let n: usize = e.shape.iter().product();
            out.push(tensor(
                &e.name,
                Dtype::I64,
                &e.shape,
                (0..n as i64).flat_map(|i| (i % 2).to_le_bytes()).collect(),
            ));
        } else if e.required {
            out.push(f32_tensor(&e.name, &e.shape));
        }
    }
    out
}

#[test]
fn the_lm_accounting_accepts_the_official_dtypes_and_counts_scales_with_their_weights() {
    let config = quantized_lm_config();
    let cfg = LmConfig::from_value(&config).unwrap();
    let ts = quantized_lm(&cfg);
    let dir = write(&config, &ts);
    let ckpt = Checkpoint::open_auto(dir.path()).unwrap();
    let acc = check_lm(&ckpt, &cfg).unwrap();
    let scales = ts.iter().filter(|t| t.name.ends_with(".scale")).count();
    assert!(scales > 0);
    assert_eq!(acc.lm_tensors, ts.len() - scales, "a scale is part of its weight, not a tensor of its own");
    assert_eq!(acc.lm_bytes, ts.iter().map(|t| t.data.len() as u64).sum::<u64>());
    // parameters are the matrices' logical elements: an I8 byte holds two FP4 values
    let params: u64 = lm_manifest(&cfg)
        .unwrap()
        .iter()
        .filter(|e| e.required)
        .map(|e| e.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(acc.lm_params, params);
    // 2 layers × 2 experts × 3 matrices FP4; per layer 5 attention + 3 shared FP8, + the indexer's wq_b on the ratio-4 layer
    assert_eq!(acc.by_dtype[&Dtype::I8].count, 12);
    assert_eq!(acc.by_dtype[&Dtype::F8_E4M3].count, 2 * 8 + 1);
    let fp4_bytes: u64 = ts.iter().filter(|t| t.name.contains(".experts.")).map(|t| t.data.len() as u64).sum();
    assert_eq!(acc.by_dtype[&Dtype::I8].bytes, fp4_bytes, "FP4 bytes include the E8M0 scales");
    // every matrix re-lays
    for e in lm_manifest(&cfg).unwrap().iter().filter(|e| e.shape.len() == 2 && !e.name.ends_with("tid2eid")) {
        if ckpt.contains(&e.name) {
            let w = ckpt.matrix(&e.name).unwrap();
            assert_eq!([w.rows, w.cols], e.shape[..], "{}", e.name);
        }
    }
}

#[test]
fn the_lm_accounting_refuses_fp8_outside_the_listed_matrices() {
    let config = quantized_lm_config();
    let cfg = LmConfig::from_value(&config).unwrap();
    let mut ts = quantized_lm(&cfg);
    // the compressor's wkv is BF16 in the official checkpoint
    let name = "layers.1.attn.compressor.wkv.weight";
    let pos = ts.iter().position(|t| t.name == name).unwrap();
    let shape = ts[pos].shape.clone();
    ts.remove(pos);
    ts.extend(fp8_pair(&mut Rng(3), "layers.1.attn.compressor.wkv", shape[0], shape[1], false).0);
    let dir = write(&config, &ts);
    let msg = check_lm(&Checkpoint::open_auto(dir.path()).unwrap(), &cfg).unwrap_err().to_string();
    assert_has(&msg, &[&format!("`{name}`"), "unsupported dtype F8_E4M3", "model.safetensors"]);
}
