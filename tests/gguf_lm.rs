//! The text GGUF as the language model: refusals of the config keys and of the tensor
//! accounting, each on a copy of `text-mix-a.gguf` patched in its header (a key's value, a
//! tensor's name, a tensor's dimensions), so the reader still accepts the file and the refusal
//! comes from the mapping. (The logits against transformers and llama.cpp are
//! tests/real_models.rs.)

mod common;

use std::path::{Path, PathBuf};

use fovea::model::ParamSource;
use fovea::weights::gguf_lm::{GgufLm, check_gguf_lm};

fn fixture() -> Vec<u8> {
    std::fs::read(common::root().join("fixtures/models/vl-real-tiny-gguf/text-mix-a.gguf")).unwrap()
}

/// The offset just past `name` written as a GGUF string (u64 length, bytes), which occurs
/// once in the header.
fn after_string(bytes: &[u8], name: &str) -> usize {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(name.as_bytes());
    let hits: Vec<usize> = bytes.windows(pat.len()).enumerate().filter(|(_, w)| *w == pat).map(|(i, _)| i).collect();
    assert_eq!(hits.len(), 1, "`{name}` occurs {} times", hits.len());
    hits[0] + pat.len()
}

/// Replace a string of the header by one of the same length.
fn rename(bytes: &mut [u8], from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let end = after_string(bytes, from);
    bytes[end - from.len()..end].copy_from_slice(to.as_bytes());
}

fn write(dir: &Path, bytes: &[u8]) -> PathBuf {
    let p = dir.join("patched.gguf");
    std::fs::write(&p, bytes).unwrap();
    p
}

/// The accounting's refusal of a patched file (the config still reads).
fn accounting_error(bytes: &[u8]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), bytes);
    let m = GgufLm::open(&p).unwrap();
    (check_gguf_lm(&m).unwrap_err().to_string(), p.display().to_string())
}

#[test]
fn the_unpatched_fixture_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let m = GgufLm::open(&write(dir.path(), &fixture())).unwrap();
    assert_eq!(check_gguf_lm(&m).unwrap().tensors, 70);
}

/// A required tensor renamed away: missing (named by its GGUF and official names), and the
/// renamed one unknown.
#[test]
fn a_missing_tensor_and_an_unknown_one_are_named() {
    let mut b = fixture();
    rename(&mut b, "blk.1.exp_probs_b.bias", "blk.1.exp_probs_q.bias");
    let (e, file) = accounting_error(&b);
    assert!(e.contains("blk.1.exp_probs_b.bias") && e.contains("missing") && e.contains(&file), "{e}");
    assert!(e.contains("layers.1.ffn.gate.bias"), "{e}");
    assert!(e.contains("blk.1.exp_probs_q.bias"), "{e}");
}

/// A tensor that is no parameter of this model, in place of an optional one.
#[test]
fn an_unexpected_tensor_is_named() {
    let mut b = fixture();
    rename(&mut b, "blk.0.exp_probs_b_vl.bias", "blk.0.exp_probs_b_xx.bias");
    let (e, file) = accounting_error(&b);
    assert!(e.starts_with("tensor `blk.0.exp_probs_b_xx.bias`: unknown tensor"), "{e}");
    assert!(e.contains(&file), "{e}");
}

/// The compressor's wkv with its two dimensions swapped (same byte count, so the reader takes
/// it): the accounting refuses the shape before anything is uploaded.
#[test]
fn a_wrong_shape_is_named() {
    let mut b = fixture();
    let name = "blk.0.attn_compressor_kv.weight";
    let at = after_string(&b, name);
    // n_dims u32, then ne[0], ne[1] as u64: [256, 128] (torch [128, 256]) becomes [128, 256]
    assert_eq!(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 2);
    let ne0 = b[at + 4..at + 12].to_vec();
    let ne1 = b[at + 12..at + 20].to_vec();
    b[at + 4..at + 12].copy_from_slice(&ne1);
    b[at + 12..at + 20].copy_from_slice(&ne0);
    let (e, file) = accounting_error(&b);
    assert!(e.starts_with(&format!("tensor `{name}`: wrong shape")), "{e}");
    assert!(e.contains("[256, 128], expected [128, 256]") && e.contains(&file), "{e}");
}

/// A config key renamed away, and one with a value the graph does not implement: each refusal
/// names the GGUF key and the file.
#[test]
fn config_refusals_name_the_gguf_key_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = fixture();
    rename(&mut b, "deepseek4.hash_layer_count", "deepseek4.hash_layer_xxxxx");
    let p = write(dir.path(), &b);
    let e = GgufLm::open(&p).unwrap_err().to_string();
    assert!(e.starts_with("config key `deepseek4.hash_layer_count`: missing"), "{e}");
    assert!(e.contains(&p.display().to_string()), "{e}");

    // expert_gating_func 4 (sqrt-softplus) → 2 (sigmoid): u32 value right after the key's type
    let mut b = fixture();
    let at = after_string(&b, "deepseek4.expert_gating_func");
    assert_eq!(b[at..at + 8], [4, 0, 0, 0, 4, 0, 0, 0], "type u32 (4), value 4");
    b[at + 4] = 2;
    let p = write(dir.path(), &b);
    let e = GgufLm::open(&p).unwrap_err().to_string();
    assert!(e.starts_with("config key `deepseek4.expert_gating_func`: is u32 2"), "{e}");

    // a check of LmConfig (o_groups must divide the heads) comes back under the GGUF key
    let mut b = fixture();
    let at = after_string(&b, "deepseek4.attention.output_group_count");
    b[at + 4] = 3;
    let p = write(dir.path(), &b);
    let e = GgufLm::open(&p).unwrap_err().to_string();
    assert!(e.starts_with("config key `deepseek4.attention.output_group_count`: 3 does not divide"), "{e}");
    assert!(e.contains(&p.display().to_string()), "{e}");
}

/// A parameter read through the source names both the official and the GGUF tensor.
#[test]
fn a_parameter_read_of_a_missing_tensor_names_both_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = fixture();
    rename(&mut b, "blk.1.ffn_up_exps.weight", "blk.1.ffn_up_exqs.weight");
    let m = GgufLm::open(&write(dir.path(), &b)).unwrap();
    let e = m.matrix("layers.1.ffn.experts.3.w3.weight").unwrap_err().to_string();
    assert!(e.contains("layers.1.ffn.experts.3.w3.weight") && e.contains("blk.1.ffn_up_exps.weight"), "{e}");
}

/// An expert count the stacks do not hold is refused before the manifest is listed (3 names
/// per expert and layer: a header's count must not size that list).
#[test]
fn an_expert_count_beyond_the_stacks_is_refused_first() {
    let mut b = fixture();
    let at = after_string(&b, "deepseek4.expert_count");
    assert_eq!(b[at..at + 8], [4, 0, 0, 0, 4, 0, 0, 0], "type u32 (4), value 4");
    b[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let (e, file) = accounting_error(&b);
    assert!(e.starts_with("tensor `blk.0.ffn_gate_exps.weight`: "), "{e}");
    assert!(e.contains("4294967295 experts") && e.contains(&file), "{e}");
}

fn fovea() -> std::process::Command {
    common::ensure_runtime_dir();
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_fovea"));
    c.current_dir(common::root());
    c
}

const MIX_A: &str = "fixtures/models/vl-real-tiny-gguf/text-mix-a.gguf";
const MMPROJ: &str = "fixtures/models/vl-real-tiny-gguf/mmproj-BF16.gguf";

/// `inspect` on a text GGUF prints the tensors, the bytes per type and the accounting.
#[test]
fn inspect_prints_a_gguf() {
    let out = fovea().args(["inspect", "--model", MIX_A]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("1 file(s), 70 tensors, 1928020 bytes of tensor data"), "{text}");
    assert!(text.contains("   IQ1_S:      1 tensors,          51200 bytes"), "{text}");
    assert!(text.contains("LM accounting (GGUF): OK, 2 layers, 70 tensors"), "{text}");
}

/// What a GGUF cannot do without its mmproj, or with a wrong one, is refused by name before loading.
#[test]
fn cli_refusals_on_a_gguf_name_what_is_missing() {
    let err = |args: &[&str]| {
        let out = fovea().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = err(&[
        "dump",
        "--backend",
        "cpu",
        "--model",
        MIX_A,
        "--token-ids",
        "0,IMG",
        "--image",
        "fixtures/images/odd.png",
        "--out",
        "/dev/null",
    ]);
    assert!(e.contains("needs --mmproj FILE"), "{e}");
    let e = err(&[
        "dump",
        "--backend",
        "cpu",
        "--model",
        MIX_A,
        "--mmproj",
        MIX_A,
        "--token-ids",
        "0",
        "--out",
        "/dev/null",
    ]);
    assert!(e.contains("general.architecture") && e.contains("text-mix-a.gguf"), "{e}");
    let e = err(&[
        "dump",
        "--backend",
        "cpu",
        "--model",
        "fixtures/models/vl-real-tiny",
        "--mmproj",
        MMPROJ,
        "--token-ids",
        "0",
        "--out",
        "/dev/null",
    ]);
    assert!(e.contains("--mmproj goes with a .gguf --model"), "{e}");
}

/// `--prompt` on a GGUF: the chat prompt is encoded with the tokenizer in the file's own
/// `tokenizer.ggml.*` keys and the generated text decoded with it (no tokenizer.json needed).
#[test]
fn generate_with_a_prompt_reads_the_tokenizer_from_the_gguf() {
    let out = fovea()
        .args(["generate", "--backend", "cpu", "--model", MIX_A, "--prompt", "hi", "--max-tokens", "4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty(), "some text was generated");
}
