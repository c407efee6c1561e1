//! The checkpoints users hold, end to end: `fixtures/models/vl-real-tiny` (DeepSeek's official
//! FP8 e4m3 / FP4 e2m1 safetensors form) and `fixtures/models/vl-real-tiny-gguf` (llama.cpp's own
//! converter output `text-MXFP4_MOE.gguf` + `mmproj-BF16.gguf`, and `text-mix-a.gguf`, a
//! `llama-quantize` mix carrying all eleven K/IQ formats) against the goldens of
//! `fixtures/gen/real/make_real.py`: transformers 5.24.0 (+ the vision extension, timm for the
//! image) run in f32 **on the dequantized weights of each exact file** (DeepSeek's formulas in
//! numpy for the safetensors, gguf-py's dequantizers for the GGUFs), plus llama.cpp's own logits on
//! the GGUFs requantized to F32 as a peer's second opinion.
//!
//! Every lane decodes the blocks bit-exactly as llama.cpp does (tests/formats.rs, the op harness),
//! so what is left between our logits and the goldens is f32 summation order, as in tests/lm_vl.rs:
//! * the LM: 2 layers in f32; lm_cpu.rs measures ~1e-6 and gates 1e-5 for hidden 64. Here the
//!   dot products are 4× longer (hidden and expert width 256): √4 = 2× the rounding, 2e-5;
//! * the vision rows (image prompts): gated at 2e-5 against timm (tests/common `tolerance`), which
//!   reach the logits through the LM's sensitivity measured by the generator
//!   (`image.aligner_sensitivity`, 0.615 here; the test checks it stays ≤ 1).
//!
//! So the logits bound is 2e-5 + 1 × 2e-5 = 4e-5, rounded up to 5e-5, on every lane (all are f32 in
//! exact precision); the ceilings (1e-3 CPU/CUDA, 3e-2 wgpu) are far above. A wrong decoder
//! or mapping (a swapped gate/up, one wrong nibble order, a missing scale) moves the logits by
//! 1e-2 or more. Token ids and greedy continuations are compared exactly (the generator re-drew the
//! prompts until every greedy top-1 gap exceeds 6e-3), and so is top-1 at every position.
//!
//! llama.cpp's logits (on the same weights decoded to F32, flash attention off, F32 K/V) differ
//! from transformers' by 5e-4 relative L2 (its own rounding and its Hadamard-rotated attention):
//! only top-1 at every position is compared with them, as the issue asks.
//!
//! Fast precision (`--precision fast`, the default of the CUDA lane and of the wgpu lane on a GPU
//! with f16 shaders; both lanes run in it here): each GEMM rounds its operands to f16, ≈ 2.8e-4
//! relative L2 per GEMM (tests/common `FAST_GEMM_NMSE`). Two layers of ≈ 12 GEMMs
//! plus the head: √25 · 2.8e-4 ≈ 1.4e-3; an image adds its vision rows' ≈ 1.1e-3
//! (`common::fast_tolerance`) times the gain 0.615: ≈ 1.6e-3 in all. Gated at the ceiling
//! for fast mode, 3e-2, with top-1 at every position but near-ties (the golden's top-2 gap under
//! 3e-2 × the rms of its row) and greedy tokens exact; agreement with llama.cpp's top-1 is
//! reported.

mod common;

use std::path::PathBuf;
use std::process::Command;

use safetensors::{Dtype, SafeTensors};

/// Logits, relative L2, every lane in exact precision (derivation in the header).
const LOGITS_REL_L2: f64 = 5e-5;
/// Logits, relative L2, fast precision (derivation in the header).
const FAST_LOGITS_REL_L2: f64 = 3e-2;
/// The LM's gain from aligner-row error to logits error that [`LOGITS_REL_L2`] assumes.
const MAX_ALIGNER_GAIN: f64 = 1.0;
const VOCAB: usize = 320;
const GREEDY: usize = 16;

/// One checkpoint form and its golden.
struct Form {
    golden: &'static str,
    /// `--model …` (and `--mmproj …`) arguments, relative to the repository root.
    model_args: &'static [&'static str],
    /// Whether the golden has an image prompt (needs the vision half).
    image: bool,
    /// Whether the golden has llama.cpp's logits.
    llama: bool,
}

const FORMS: [Form; 3] = [
    Form {
        golden: "official-fp8-fp4",
        model_args: &["--model", "fixtures/models/vl-real-tiny"],
        image: true,
        llama: false,
    },
    Form {
        golden: "gguf-MXFP4_MOE",
        model_args: &[
            "--model",
            "fixtures/models/vl-real-tiny-gguf/text-MXFP4_MOE.gguf",
            "--mmproj",
            "fixtures/models/vl-real-tiny-gguf/mmproj-BF16.gguf",
        ],
        image: true,
        llama: true,
    },
    Form {
        golden: "gguf-mix-a",
        model_args: &["--model", "fixtures/models/vl-real-tiny-gguf/text-mix-a.gguf"],
        image: false,
        llama: true,
    },
];

struct Golden {
    name: &'static str,
    bytes: Vec<u8>,
}

impl Golden {
    fn load(name: &'static str) -> Golden {
        let path = common::root().join(format!("fixtures/goldens/real/{name}.safetensors"));
        Golden { name, bytes: std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) }
    }
    fn st(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).unwrap()
    }
    fn f32(&self, key: &str) -> Vec<f32> {
        common::st_f32(&self.st(), key)
    }
    fn i64(&self, key: &str) -> Vec<i64> {
        let st = self.st();
        assert_eq!(st.tensor(key).unwrap().dtype(), Dtype::I64, "{}: {key}", self.name);
        common::st_i64(&st, key)
    }
    fn meta(&self, key: &str) -> String {
        let (_, header) = SafeTensors::read_metadata(&self.bytes).unwrap();
        header.metadata().as_ref().and_then(|m| m.get(key).cloned()).unwrap_or_else(|| panic!("{}: {key}", self.name))
    }
}

/// The `fovea` binary built with this test, unless `FOVEA_BIN` names another (prebuilt test
/// executables run on a GPU machine: cuda/gpu_tests.sh), run from the repository root.
fn fovea() -> Command {
    common::ensure_runtime_dir();
    let mut c = match std::env::var_os("FOVEA_BIN") {
        Some(bin) if !bin.is_empty() => Command::new(bin),
        _ => Command::new(env!("CARGO_BIN_EXE_fovea")),
    };
    c.current_dir(common::root());
    c
}

fn argmax(r: &[f32]) -> usize {
    r.iter().enumerate().fold((0, f32::NEG_INFINITY), |m, (i, &x)| if x > m.1 { (i, x) } else { m }).0
}

fn ids_arg(ids: &[i64]) -> String {
    ids.iter().map(|&x| if x == -1 { "IMG".to_string() } else { x.to_string() }).collect::<Vec<_>>().join(",")
}

/// Positions whose top-1 differs between two `[t, VOCAB]` logit tables.
fn top1_differs(a: &[f32], b: &[f32]) -> Vec<usize> {
    (0..a.len() / VOCAB)
        .filter(|&i| argmax(&a[i * VOCAB..(i + 1) * VOCAB]) != argmax(&b[i * VOCAB..(i + 1) * VOCAB]))
        .collect()
}

/// `fovea dump` then `fovea generate` for one prompt (`text` or `image`) of one form on `lane`;
/// failures are pushed to `fails`.
fn check_prompt(lane: &str, precision: &str, form: &Form, g: &Golden, prompt: &str, fails: &mut Vec<String>) {
    let tag = format!("{} {prompt} on {lane} ({precision})", g.name);
    let fast = precision == "fast";
    let bound = if fast { FAST_LOGITS_REL_L2 } else { LOGITS_REL_L2 };
    let (ids_key, image): (String, Option<PathBuf>) = if prompt == "image" {
        let gain: f64 = g.meta("image.aligner_sensitivity").parse().unwrap();
        assert!(
            gain <= MAX_ALIGNER_GAIN,
            "{tag}: aligner sensitivity {gain} > {MAX_ALIGNER_GAIN}: re-derive the bound"
        );
        ("image.prompt_ids".into(), Some(common::root().join(g.meta("image.image"))))
    } else {
        ("text.input_ids".into(), None)
    };
    let prompt_ids = ids_arg(&g.i64(&ids_key));
    let tmp = tempfile::tempdir().unwrap();
    let out_path = tmp.path().join("dump.safetensors");
    let mut dump = fovea();
    dump.args(["dump", "--backend", lane, "--precision", precision, "--token-ids", &prompt_ids]).args(form.model_args);
    if let Some(img) = &image {
        dump.arg("--image").arg(img);
    }
    let out = dump.arg("--out").arg(&out_path).output().unwrap();
    if !out.status.success() {
        fails.push(format!("{tag}: dump failed: {}", String::from_utf8_lossy(&out.stderr)));
        return;
    }
    let bytes = std::fs::read(&out_path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids = common::st_i64(&st, "input_ids");
    if ids != g.i64(&format!("{prompt}.input_ids")) {
        fails.push(format!("{tag}: expanded input_ids differ"));
        return;
    }
    let logits = common::st_f32(&st, "logits");
    let gold = g.f32(&format!("{prompt}.logits"));
    let e = common::rel_l2(&logits, &gold);
    eprintln!("{tag}: logits rel L2 {e:.2e} against transformers");
    if !(e <= bound) {
        fails.push(format!("{tag}: logits rel L2 {e:.3e} > {bound:.0e}"));
    }
    let (ties, bad): (Vec<usize>, Vec<usize>) = top1_differs(&logits, &gold)
        .into_iter()
        .partition(|&i| fast && common::near_tie(&gold[i * VOCAB..(i + 1) * VOCAB], bound));
    if !ties.is_empty() {
        eprintln!("{tag}: top-1 differs at near-ties {ties:?} (allowed in fast precision)");
    }
    if !bad.is_empty() {
        fails.push(format!("{tag}: top-1 differs from transformers at positions {bad:?}"));
    }
    if form.llama && prompt == "text" {
        let peer = g.f32("llama.text.logits_f32");
        let bad = top1_differs(&logits, &peer);
        eprintln!("{tag}: top-1 equals llama.cpp's at {}/{} positions", ids.len() - bad.len(), ids.len());
        if !bad.is_empty() && !fast {
            fails.push(format!("{tag}: top-1 differs from llama.cpp's at positions {bad:?}"));
        }
    }

    let mut generate = fovea();
    generate
        .args(["generate", "--backend", lane, "--precision", precision, "--print-ids", "--temperature", "0"])
        .args(["--max-tokens", &GREEDY.to_string(), "--token-ids", &prompt_ids])
        .args(form.model_args);
    if let Some(img) = &image {
        generate.arg("--image").arg(img);
    }
    let out = generate.output().unwrap();
    if !out.status.success() {
        fails.push(format!("{tag}: generate failed: {}", String::from_utf8_lossy(&out.stderr)));
        return;
    }
    let got: Vec<i64> = String::from_utf8_lossy(&out.stdout).split_whitespace().map(|t| t.parse().unwrap()).collect();
    if got != g.i64(&format!("{prompt}.greedy_tokens")) {
        fails.push(format!("{tag}: greedy tokens {got:?} differ from the golden's"));
    }
}

fn check_lane(lane: &str, precision: &str) {
    let mut fails = Vec::new();
    for form in &FORMS {
        let g = Golden::load(form.golden);
        check_prompt(lane, precision, form, &g, "text", &mut fails);
        if form.image {
            check_prompt(lane, precision, form, &g, "image", &mut fails);
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

#[test]
fn cpu_lane_matches_transformers_and_llama_cpp_on_every_real_form() {
    check_lane("cpu", "exact");
}

#[test]
fn wgpu_lane_matches_transformers_and_llama_cpp_on_every_real_form() {
    if common::wgpu_adapter_or_skip() {
        check_lane("wgpu", "exact");
    }
}

/// Under CI (lavapipe on 2 cores, ≈ 30 s per prompt, each a `dump` and a `generate` process that
/// build their pipelines) the fast pass takes the two prompts the other fast tests cover least:
/// gguf-mix-a's text (the mixed block formats; the largest fast error measured, 2.1e-2) and
/// gguf-MXFP4_MOE's image (the mmproj's vision tower into MXFP4 experts). Every prompt elsewhere.
#[test]
fn wgpu_lane_in_fast_precision_matches_transformers_on_every_real_form() {
    if !common::wgpu_adapter_or_skip() {
        return;
    }
    if std::env::var_os("CI").is_none() {
        return check_lane("wgpu", "fast");
    }
    let mut fails = Vec::new();
    for (form, prompt) in [(&FORMS[2], "text"), (&FORMS[1], "image")] {
        check_prompt("wgpu", "fast", form, &Golden::load(form.golden), prompt, &mut fails);
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

#[test]
fn cuda_lane_matches_transformers_and_llama_cpp_on_every_real_form() {
    if common::cuda_lane_or_skip().is_some() {
        check_lane("cuda", "exact");
    }
}

#[test]
fn cuda_lane_in_fast_precision_matches_transformers_on_every_real_form() {
    if common::cuda_lane_or_skip().is_some() {
        check_lane("cuda", "fast");
    }
}
