//! The mmproj GGUF (`clip`, `deepseek4v`) as the vision graph's parameter source, against the
//! official checkpoint it was converted from by llama.cpp's converter (fixtures/gen/real).
//!
//! - The `VisionConfig` from the `clip.*` keys equals config.json's field by field, except
//!   `raw` (an mmproj carries only the vision keys and `projection_dim`, no language-model keys).
//! - Every official vision parameter reads the same values bit for bit through both sources
//!   (same bytes where the storage format is the same; the converter stores the patch-embedding
//!   conv kernel as F32 where the checkpoint has BF16: decoded values compared bitwise).
//! - The vision stage on `odd.png` from the mmproj matches the golden aligner rows that the
//!   generator (fixtures/gen/real/make_real.py) computed with the reference on the mmproj's
//!   weights mapped back to official names, within the vision tolerance of tests/lm_vl.rs:
//!   2e-5 relative L2 (√K·u per linear over ≤ 3 blocks in f32, tests/common `tolerance`).
//! - Refusals (a missing tensor, a wrong shape) name the file and the tensor.

mod common;

use std::path::{Path, PathBuf};

use fovea::backend::cpu::CpuBackend;
use fovea::backend::{Backend, HostTensor, HostWeight};
use fovea::config::VisionConfig;
use fovea::model::ParamSource;
use fovea::model::vision::VisionModel;
use fovea::pipeline::preprocess_config;
use fovea::processor;
use fovea::weights::gguf_vision::{DEEPSEEK4V_MAX_N_TOKEN, DEEPSEEK4V_MAX_WH_RATIO, DEEPSEEK4V_ROPE_THETA};
use fovea::weights::{Checkpoint, open_mmproj, vision_manifest};
use safetensors::SafeTensors;

/// Vision rows against the reference (tests/lm_vl.rs `VISION_REL_L2`).
const VISION_REL_L2: f64 = 2e-5;

fn mmproj_path(model: &str) -> PathBuf {
    common::model_dir(model).join("mmproj-BF16.gguf")
}

/// Every field but `raw`.
fn assert_same_config(gguf: &VisionConfig, official: &VisionConfig) {
    assert_eq!(gguf.n_layers, official.n_layers, "n_layers");
    assert_eq!(gguf.dim, official.dim, "dim");
    assert_eq!(gguf.n_heads, official.n_heads, "n_heads");
    assert_eq!(gguf.inter_dim, official.inter_dim, "inter_dim");
    assert_eq!(gguf.patch_size, official.patch_size, "patch_size");
    assert_eq!(gguf.rope_theta, official.rope_theta, "rope_theta");
    assert_eq!(gguf.downsample_ratio, official.downsample_ratio, "downsample_ratio");
    assert_eq!(gguf.max_n_token, official.max_n_token, "max_n_token");
    assert_eq!(gguf.min_pixels, official.min_pixels, "min_pixels");
    assert_eq!(gguf.max_wh_ratio, official.max_wh_ratio, "max_wh_ratio");
    assert_eq!(gguf.norm_eps, official.norm_eps, "norm_eps");
    assert_eq!(gguf.hidden_size, official.hidden_size, "hidden_size");
}

fn decoded(w: &HostWeight<'_>) -> Vec<u32> {
    let mut out = vec![0f32; w.rows * w.cols];
    for (r, row) in out.chunks_exact_mut(w.cols).enumerate() {
        w.row_f32(r, row).unwrap();
    }
    out.into_iter().map(f32::to_bits).collect()
}

/// Config equal, every parameter bit-identical; returns (matrices with identical bytes,
/// matrices with identical decoded values only, vectors).
fn compare_with_official(model: &str, official: &str) -> (usize, usize, usize) {
    let ckpt = Checkpoint::open(&common::model_dir(official)).unwrap();
    let m = open_mmproj(&mmproj_path(model)).unwrap();
    // The token budget is not in the file: clip.cpp's 384 unless overridden (its
    // `--image-max-tokens`), as a user of a checkpoint with another budget must.
    assert_eq!(m.config().max_n_token, DEEPSEEK4V_MAX_N_TOKEN);
    let m = m.with_max_n_token(ckpt.config().max_n_token).unwrap();
    assert_same_config(m.config(), ckpt.config());
    let (mut same_bytes, mut same_values, mut vectors) = (0, 0, 0);
    for exp in vision_manifest(ckpt.config()) {
        assert!(m.has(&exp.name), "{}", exp.name);
        if exp.shape.len() == 2 {
            let (a, b) = (m.matrix(&exp.name).unwrap(), ckpt.matrix(&exp.name).unwrap());
            assert_eq!((a.rows, a.cols), (b.rows, b.cols), "{}", exp.name);
            if a.format == b.format {
                assert!(a.bytes == b.bytes, "{}: bytes differ", exp.name);
                same_bytes += 1;
            } else {
                assert_eq!(decoded(&a), decoded(&b), "{}: values differ ({} vs {})", exp.name, a.format, b.format);
                same_values += 1;
            }
        } else {
            let (a, b) = (m.vector(&exp.name).unwrap(), ckpt.vector(&exp.name).unwrap());
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(a), bits(b), "{}", exp.name);
            vectors += 1;
        }
    }
    eprintln!("{model}: {same_bytes} matrices byte-identical, {same_values} value-identical, {vectors} vectors");
    (same_bytes, same_values, vectors)
}

#[test]
fn vl_real_tiny_mmproj_config_and_parameters_equal_the_official_checkpoint() {
    let (same_bytes, same_values, vectors) = compare_with_official("vl-real-tiny-gguf", "vl-real-tiny");
    // 3 blocks × 4 matrices + 2 aligner matrices, BF16 in both; the F32 patch kernel.
    assert_eq!((same_bytes, same_values, vectors), (14, 1, 3 * 4 + 1 + 1 + 2 + 4));
    // The values clip.cpp hard-codes are the released model's (and this checkpoint's).
    assert_eq!(DEEPSEEK4V_ROPE_THETA, 10000.0);
    assert_eq!(DEEPSEEK4V_MAX_N_TOKEN, 384);
    assert_eq!(DEEPSEEK4V_MAX_WH_RATIO, 8.0);
}

#[test]
fn vl_scenes_mmproj_opens_accounts_and_equals_the_official_checkpoint() {
    let m = open_mmproj(&mmproj_path("vl-scenes-gguf")).unwrap();
    let acc = m.accounting();
    let n = m.config().n_layers;
    assert_eq!(acc.official, fovea::weights::vision::vision_tensor_count(n));
    // Fused q/k/v; w1 stored as two halves: one GGUF tensor more per block.
    assert!(acc.fused_qkv);
    assert_eq!(acc.gguf_tensors, acc.official + n);
    assert_eq!(acc.bytes, m.gguf().tensors().map(|(t, _)| t.nbytes as u64).sum::<u64>());
    eprintln!("{acc}");
    compare_with_official("vl-scenes-gguf", "vl-scenes");
}

/// The vision stage (VisionModel, the graph VisionRunner uploads) on the mmproj, CPU lane.
#[test]
fn vision_stage_from_the_mmproj_matches_the_golden_aligner_rows() {
    let m = open_mmproj(&mmproj_path("vl-real-tiny-gguf")).unwrap();
    let cfg = m.config();
    let b = CpuBackend::new();
    let model = VisionModel::load(&b, &m, cfg).unwrap();
    let img = processor::load_rgb(&common::image_path("odd.png")).unwrap();
    let prepared = processor::prepare(&img, &preprocess_config(cfg)).unwrap();
    let n = prepared.n_vit_h * prepared.n_vit_w;
    let patches = b.upload(&HostTensor::f32([n, cfg.patch_dim()], prepared.patches.clone()).unwrap()).unwrap();
    let stages = model.encode(&b, &patches, prepared.n_vit_h, prepared.n_vit_w).unwrap();
    let aligner = b.download(&stages.aligner).unwrap().into_f32("aligner").unwrap();

    let path = common::root().join("fixtures/goldens/real/gguf-MXFP4_MOE.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    assert_eq!(meta["image.image"], "fixtures/images/odd.png");
    assert_eq!(prepared.n_llm_h.to_string(), meta["image.n_llm_h"]);
    assert_eq!(prepared.n_llm_w.to_string(), meta["image.n_llm_w"]);
    let golden = common::st_f32(&st, "image.aligner_rows");
    let e = common::rel_l2(&aligner, &golden);
    eprintln!("odd.png from mmproj-BF16.gguf: aligner rows rel L2 {e:.3e}");
    assert!(e <= VISION_REL_L2, "aligner rows rel L2 {e:.3e} > {VISION_REL_L2:.0e}");
}

/// The mmproj's bytes with one header edit, written to a temporary file.
fn edited(edit: impl FnOnce(&mut Vec<u8>)) -> (tempfile::TempDir, PathBuf) {
    let mut bytes = std::fs::read(mmproj_path("vl-real-tiny-gguf")).unwrap();
    edit(&mut bytes);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmproj-edited.gguf");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

/// Offset just past the one occurrence of a GGUF string (u64 length + bytes) in the header.
fn after_string(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    let hits: Vec<usize> =
        bytes.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i).collect();
    assert_eq!(hits.len(), 1, "`{s}` occurs {} times", hits.len());
    hits[0] + needle.len()
}

fn refusal(path: &Path) -> String {
    open_mmproj(path).expect_err("the edited mmproj must be refused").to_string()
}

#[test]
fn a_missing_tensor_is_refused_naming_file_and_tensor() {
    // Rename `v.post_ln.weight` (same length) so the file no longer holds it.
    let (_dir, path) = edited(|b| {
        let end = after_string(b, "v.post_ln.weight");
        b[end - "weight".len()] = b'W';
    });
    let msg = refusal(&path);
    eprintln!("{msg}");
    assert!(msg.contains("v.post_ln.weight") && msg.contains("missing"), "{msg}");
    // The renamed tensor is the other problem: no official parameter reads it.
    assert!(msg.contains("(and 1 more mmproj accounting problem(s))"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
}

#[test]
fn a_wrong_shape_is_refused_naming_file_and_tensor() {
    // Swap the two dims of `v.blk.1.attn_qkv.weight` (ne [32, 96] → [96, 32]): same bytes,
    // transposed shape.
    let (_dir, path) = edited(|b| {
        let at = after_string(b, "v.blk.1.attn_qkv.weight");
        assert_eq!(b[at..at + 4], 2u32.to_le_bytes());
        let ne0 = at + 4;
        let (x, y) = (b[ne0..ne0 + 8].to_vec(), b[ne0 + 8..ne0 + 16].to_vec());
        assert_eq!(
            (u64::from_le_bytes(x[..].try_into().unwrap()), u64::from_le_bytes(y[..].try_into().unwrap())),
            (32, 96)
        );
        b[ne0..ne0 + 8].copy_from_slice(&y);
        b[ne0 + 8..ne0 + 16].copy_from_slice(&x);
    });
    let msg = refusal(&path);
    eprintln!("{msg}");
    assert!(msg.contains("v.blk.1.attn_qkv.weight") && msg.contains("wrong shape"), "{msg}");
    assert!(msg.contains("[32, 96]") && msg.contains("[96, 32]"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
}

/// A GGUF string: u64 length, bytes.
fn gguf_string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// The fixture rewritten with each block's `attn_qkv` split into `attn_q`, `attn_k`, `attn_v`
/// (the other layout clip.cpp loads, clip.cpp:2280-2299): the key-values copied verbatim, q/k/v
/// the row thirds of the fused tensors, every other tensor unchanged.
fn split_qkv_file() -> (tempfile::TempDir, PathBuf, usize) {
    let src = mmproj_path("vl-real-tiny-gguf");
    let bytes = std::fs::read(&src).unwrap();
    let g = fovea::weights::gguf::Gguf::open(&src).unwrap();
    assert_eq!(g.meta().alignment(), 32);
    // The key-value section ends where the first tensor info (the first name written) begins.
    let first = g.tensors().min_by_key(|(t, _)| t.offset).unwrap().0.name.clone();
    let kv_end = after_string(&bytes, &first) - gguf_string(&first).len();
    let mut tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)> = Vec::new();
    for (t, _) in g.tensors() {
        let data = g.data(&t.name).unwrap().to_vec();
        let ty = match t.ty {
            fovea::weights::gguf::GgmlType::Weight(f) => f.ggml_type().unwrap(),
            other => panic!("{}: {other}", t.name),
        };
        match t.name.strip_suffix(".weight").or(t.name.strip_suffix(".bias")) {
            Some(stem) if stem.ends_with(".attn_qkv") => {
                let suffix = &t.name[stem.len()..];
                let third = data.len() / 3;
                let mut ne = t.ne.clone();
                *ne.last_mut().unwrap() /= 3;
                for (i, part) in ["attn_q", "attn_k", "attn_v"].into_iter().enumerate() {
                    let name = format!("{}{part}{suffix}", stem.strip_suffix("attn_qkv").unwrap());
                    tensors.push((name, ne.clone(), ty, data[i * third..(i + 1) * third].to_vec()));
                }
            }
            _ => tensors.push((t.name.clone(), t.ne.clone(), ty, data)),
        }
    }
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&bytes[16..24]); // the key-value count
    out.extend_from_slice(&bytes[24..kv_end]);
    let mut offset = 0u64;
    let mut data = Vec::new();
    for (name, ne, ty, d) in &tensors {
        out.extend(gguf_string(name));
        out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        ne.iter().for_each(|n| out.extend_from_slice(&n.to_le_bytes()));
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        data.extend_from_slice(d);
        data.resize(data.len().next_multiple_of(32), 0);
        offset = data.len() as u64;
    }
    out.resize(out.len().next_multiple_of(32), 0);
    out.extend(data);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mmproj-split-qkv.gguf");
    std::fs::write(&path, out).unwrap();
    (dir, path, tensors.len())
}

#[test]
fn split_qkv_reads_the_same_parameters_as_fused() {
    let (_dir, path, n_tensors) = split_qkv_file();
    let split = open_mmproj(&path).unwrap();
    let fused = open_mmproj(&mmproj_path("vl-real-tiny-gguf")).unwrap();
    let n = split.config().n_layers;
    assert!(!split.accounting().fused_qkv && fused.accounting().fused_qkv);
    // Per block: w1 as gate + up (+1), q/k/v weight and bias as three each (+4).
    assert_eq!(split.accounting().gguf_tensors, n_tensors);
    assert_eq!(n_tensors, split.accounting().official + 5 * n);
    for (name, r) in split.plan() {
        if r.shape.len() == 2 {
            let (a, b) = (split.matrix(name).unwrap(), fused.matrix(name).unwrap());
            assert_eq!((a.format, a.rows, a.cols), (b.format, b.rows, b.cols), "{name}");
            assert!(a.bytes == b.bytes, "{name}: bytes differ");
        } else {
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(split.vector(name).unwrap()), bits(fused.vector(name).unwrap()), "{name}");
        }
    }
    assert_eq!(split.plan()["vision.blocks.0.attn.wqkv.weight"].parts.len(), 3);
}

#[test]
fn an_mmproj_of_another_width_is_refused_naming_key_and_file() {
    let path = mmproj_path("vl-real-tiny-gguf");
    let m = open_mmproj(&path).unwrap();
    m.check_lm_hidden_size(256).unwrap();
    let msg = m.check_lm_hidden_size(512).unwrap_err().to_string();
    eprintln!("{msg}");
    assert!(msg.contains("clip.vision.projection_dim") && msg.contains(&path.display().to_string()), "{msg}");
    let text = m.to_string();
    assert!(
        text.contains("mmproj accounting: OK, 35 official parameters from 38 GGUF tensors (fused q/k/v)"),
        "{text}"
    );
}
