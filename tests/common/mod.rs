//! Shared helpers for the conformance tests: reading the committed goldens (written by
//! `fixtures/gen/make_vision.py` from Pillow + timm) and comparing a lane's stages with them.
#![allow(dead_code)] // each test binary uses a different subset

pub mod blocks;
pub mod lm;

use std::path::PathBuf;

use fovea::backend::Backend;
use fovea::pipeline::{VisionDump, VisionRunner};
use fovea::weights::Checkpoint;
use safetensors::{Dtype, SafeTensors};

/// The repository root: where this test was built, unless `FOVEA_REPO_ROOT` points at a copy
/// (for running prebuilt test executables on another machine, e.g. a GPU box).
pub fn root() -> PathBuf {
    match std::env::var_os("FOVEA_REPO_ROOT") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

/// One golden file: every stage of one (model, image, start_pos).
pub struct Golden {
    pub file: String,
    pub model: String,
    pub image: String,
    pub start_pos: usize,
    pub dtype: String,
    pub resized: Vec<u8>,
    pub resized_hw: (usize, usize),
    pub patches: Vec<f32>,
    pub vit: Vec<f32>,
    pub aligner: Vec<f32>,
    pub block: Vec<f32>,
    pub block_types: Vec<i64>,
    pub perm: Vec<i64>,
    pub grid: [usize; 4], // n_vit_h, n_vit_w, n_llm_h, n_llm_w
}

/// An f32 tensor of a safetensors file (panics naming it when absent or of another dtype).
pub fn st_f32(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("tensor {name}: {e}"));
    assert_eq!(t.dtype(), Dtype::F32, "{name}");
    t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// An i64 tensor of a safetensors file (panics naming it when absent or of another dtype).
pub fn st_i64(st: &SafeTensors, name: &str) -> Vec<i64> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("tensor {name}: {e}"));
    assert_eq!(t.dtype(), Dtype::I64, "{name}");
    t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The golden's normalised patches `[n_vit, 3p²]`. The file holds them as their pixels
/// (`patch_pixels`, u8 in the same layout) and the value the reference's normalisation gives each
/// of the 256 pixel values (`pixel_values`); the generator checks that this rebuilds its f32
/// patches bit for bit.
fn patches(st: &SafeTensors, file: &str) -> Vec<f32> {
    let values = st_f32(st, "pixel_values");
    assert_eq!(values.len(), 256, "{file}: pixel_values");
    let pixels = st.tensor("patch_pixels").unwrap_or_else(|e| panic!("{file}: tensor patch_pixels: {e}"));
    assert_eq!(pixels.dtype(), Dtype::U8, "{file}: patch_pixels");
    pixels.data().iter().map(|&p| values[p as usize]).collect()
}

/// All goldens listed in `fixtures/goldens/vision/index.json`.
pub fn goldens() -> Vec<Golden> {
    let dir = root().join("fixtures/goldens/vision");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).expect("golden index"))
            .expect("index json");
    let list = index["goldens"].as_array().expect("goldens array");
    assert!(list.len() >= 7, "expected at least 7 goldens, found {}", list.len());
    list.iter()
        .map(|g| {
            let file = g["file"].as_str().unwrap().to_string();
            let bytes = std::fs::read(dir.join(&file)).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            let resized = st.tensor("resized").unwrap();
            let u = |k: &str| g[k].as_u64().unwrap_or_else(|| panic!("{file}: index key {k}")) as usize;
            Golden {
                model: g["model"].as_str().unwrap().to_string(),
                image: g["image"].as_str().unwrap().to_string(),
                start_pos: u("start_pos"),
                dtype: g["dtype"].as_str().unwrap().to_string(),
                resized_hw: (resized.shape()[0], resized.shape()[1]),
                resized: resized.data().to_vec(),
                patches: patches(&st, &file),
                vit: st_f32(&st, "vit"),
                aligner: st_f32(&st, "aligner"),
                block: st_f32(&st, "block"),
                block_types: st_i64(&st, "block_types"),
                perm: st_i64(&st, "perm"),
                grid: [u("n_vit_h"), u("n_vit_w"), u("n_llm_h"), u("n_llm_w")],
                file,
            }
        })
        .collect()
}

pub fn model_dir(model: &str) -> PathBuf {
    root().join("fixtures/models").join(model)
}

pub fn image_path(image: &str) -> PathBuf {
    root().join("fixtures/images").join(image)
}

/// ‖a − b‖₂ / ‖b‖₂.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Whether the top-2 gap of a reference logits row is under `tol` times its rms: a near-tie,
/// which a relative error of `tol` may cross (fast precision's top-1 rule).
pub fn near_tie(row: &[f32], tol: f64) -> bool {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in row {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    let rms = (row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / row.len() as f64).sqrt();
    ((a - b) as f64) < tol * rms
}

/// Tolerances for one golden's float stages (relative L2), by the golden's numerics.
pub struct Tolerance {
    pub stages: f64,
}

/// f32 goldens: torch and our lanes both compute in f32; they differ only in summation order.
/// A length-K dot product in f32 carries a relative error of about √K·u (u = 2⁻²⁴ ≈ 6e-8); our
/// longest is K = 9·vision_dim ≤ 900, so ≈ 2e-6 per linear, compounded over ≤ 3 blocks of ≤ 6
/// dependent linears/norms: ≲ 2e-5. We gate at 2e-5 (the held-out check asks 1e-4 on CPU).
///
/// bf16 goldens: the reference rounds every activation to bf16 (u = 2⁻⁸ ≈ 3.9e-3) after each op
/// while our lanes keep f32, so the difference is the reference's own rounding: about √R·u for R
/// independent roundings along the path (≈ 12 per block, 2 blocks, plus patch embed, final norm,
/// 3 in the aligner: R ≈ 30 → 2.1e-2). We gate at 3e-2.
pub fn tolerance(g: &Golden) -> Tolerance {
    match g.dtype.as_str() {
        "f32" => Tolerance { stages: 2e-5 },
        "bf16" => Tolerance { stages: 3e-2 },
        other => panic!("{}: unknown golden dtype {other}", g.file),
    }
}

/// Fast precision (`--precision fast`): each GEMM tile rounds both operands to f16 (to nearest)
/// once. A value with significand m in [1, 2) moves by at most 2⁻¹¹/m relative, uniformly, so
/// E[δ²] = 2⁻²²/3 · E[1/m²] = 2⁻²²/6 ≈ 4.0e-8 per operand and 8.0e-8 per product; independent
/// over the k terms, the NMSE of a dot product is ≈ 8e-8: `FAST_GEMM_NMSE` (the op harness gates
/// a single GEMM at 4× that). As a relative L2 that is 2.8e-4 per GEMM.
///
/// Measured first with bf16 operands (2⁻⁸: 5.1e-6 per GEMM, 2.2e-3 relative L2), on the H200: the
/// vision goldens' stages reached 4.1e-3 – 1.11e-2 (the derivation said 8.6e-3: the ceiling of
/// 1e-2 was crossed once), and lm-tiny's routers, whose generator leaves margins of only 1e-4,
/// flipped on up to 16 of 304 positions per layer (logits 6.9e-2). Hence f16.
pub const FAST_GEMM_NMSE: f64 = 8.0e-8;

/// Vision stages in fast precision. f32 goldens: the fixtures' path has ≤ 15 dependent GEMMs
/// (patch embedding, 3 blocks of qkv, projection, SwiGLU in, SwiGLU out, the aligner's two), whose
/// errors add in quadrature: √15 · 2.8e-4 ≈ 1.1e-3. On CUDA each block's attention also rounds
/// to f16 (tests/ops.rs `FAST_ATTENTION`: 1 + var(scores) GEMMs' worth): with scores of variance
/// up to 10, √(15 + 3 · 11) · 2.8e-4 ≈ 1.9e-3. The gate is the ceiling for fast mode,
/// 1e-2 (5× the estimate: the full-size ViT's 130 GEMMs and 32 attentions give
/// √(130 + 32 · 11) · 2.8e-4 ≈ 6.1e-3 at that variance). bf16
/// goldens: the reference's own rounding (≈ 2.1e-2, see `tolerance`) dominates ours; the exact
/// mode's 3e-2 stays the gate.
pub fn fast_tolerance(g: &Golden) -> Tolerance {
    match g.dtype.as_str() {
        "f32" => Tolerance { stages: 1e-2 },
        "bf16" => Tolerance { stages: 3e-2 },
        other => panic!("{}: unknown golden dtype {other}", g.file),
    }
}

/// Run every golden on lane `b` and check each stage; returns a report line per golden.
pub fn check_lane<B: Backend>(b: &B) -> Vec<String> {
    check_lane_with(b, tolerance)
}

/// [`check_lane`] with the tolerances of a precision mode.
pub fn check_lane_with<B: Backend>(b: &B, tolerance: fn(&Golden) -> Tolerance) -> Vec<String> {
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let mut last_model = String::new();
    let mut ckpt_runner: Option<(Checkpoint, String)> = None;
    for g in goldens() {
        if g.model != last_model {
            ckpt_runner =
                Some((Checkpoint::open(&model_dir(&g.model)).expect("open fixture checkpoint"), g.model.clone()));
            last_model = g.model.clone();
        }
        let (ckpt, _) = ckpt_runner.as_ref().unwrap();
        let runner = VisionRunner::load(b, ckpt).unwrap_or_else(|e| panic!("{}: load: {e}", g.file));
        let dump = runner.run(&image_path(&g.image), g.start_pos).unwrap_or_else(|e| panic!("{}: run: {e}", g.file));
        let tol = tolerance(&g);
        let line = compare(&g, &dump, tol.stages, &mut failures);
        report.push(line);
    }
    for line in &report {
        eprintln!("{line}");
    }
    assert!(failures.is_empty(), "{} stage(s) out of tolerance:\n{}", failures.len(), failures.join("\n"));
    report
}

fn compare(g: &Golden, d: &VisionDump, tol: f64, failures: &mut Vec<String>) -> String {
    let grid = [d.n_vit_h, d.n_vit_w, d.n_llm_h, d.n_llm_w];
    if grid != g.grid {
        failures.push(format!("{}: grid {grid:?} vs golden {:?}", g.file, g.grid));
        return format!("{}: grid mismatch", g.file);
    }
    // Exact things stay exact.
    let types: Vec<i64> = d.block_types.iter().map(|&t| t as i64).collect();
    if types != g.block_types {
        failures.push(format!("{}: block_types differ", g.file));
    }
    let perm: Vec<i64> = d.perm.iter().map(|&p| p as i64).collect();
    if perm != g.perm {
        failures.push(format!("{}: perm differs", g.file));
    }
    let patches_exact = d.patches == g.patches;
    let patches_err = rel_l2(&d.patches, &g.patches);
    if !patches_exact && g.dtype == "f32" {
        failures.push(format!("{}: patches not bit-exact (rel L2 {patches_err:.2e})", g.file));
    }
    let mut line =
        format!("{}: patches {}", g.file, if patches_exact { "exact".into() } else { format!("{patches_err:.2e}") });
    for (name, ours, gold) in
        [("vit", &d.vit, &g.vit), ("aligner", &d.aligner, &g.aligner), ("block", &d.block, &g.block)]
    {
        let e = rel_l2(ours, gold);
        line += &format!(", {name} {e:.2e}");
        if !(e <= tol) {
            failures.push(format!("{}: {name} rel L2 {e:.3e} > {tol:.1e}", g.file));
        }
    }
    line
}

/// The resized image must be Pillow's, byte for byte.
pub fn golden_resized_matches(g: &Golden, ours: &[u8], ours_hw: (usize, usize)) -> bool {
    ours_hw == g.resized_hw && ours == g.resized.as_slice()
}

/// Whether the wgpu tests must run rather than skip: under `CI` (lavapipe is installed there, so a
/// missing adapter is a broken setup) or with `FOVEA_REQUIRE_WGPU=1` (set on GPU machines by
/// cuda/gpu_tests.sh, so nothing passes there by skipping).
pub fn wgpu_required() -> bool {
    std::env::var_os("CI").is_some() || std::env::var("FOVEA_REQUIRE_WGPU").is_ok_and(|v| v.trim() == "1")
}

/// The wgpu lane for a test. Without an adapter the test fails where [`wgpu_required`] and is
/// skipped, loudly, elsewhere.
pub fn wgpu_lane(opts: fovea::backend::wgpu::Options) -> Option<fovea::backend::wgpu::WgpuBackend> {
    ensure_runtime_dir();
    match fovea::backend::wgpu::WgpuBackend::with_options(opts) {
        Ok(b) => Some(b),
        Err(e) if wgpu_required() => {
            panic!("wgpu lane unavailable where it must run (CI or FOVEA_REQUIRE_WGPU=1): {e}")
        }
        Err(e) => {
            // Written past the test harness's capture so the skip is visible in a normal run.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: wgpu lane unavailable ({e}); install a Vulkan driver or mesa-vulkan-drivers"
            );
            None
        }
    }
}

/// The wgpu lane in exact and in fast precision, both opened once per test binary before any test
/// works on either (the tests of a precision run in parallel on its device; on the NVIDIA driver,
/// creating a device while another thread works on one was seen to deadlock). Fast precision
/// needs f16 shaders: on an adapter without them its slot is None with a visible skip, also under
/// CI (the adapter lacks a feature; the setup is not broken).
pub fn wgpu_lanes() -> &'static [Option<fovea::backend::wgpu::WgpuBackend>; 2] {
    use fovea::backend::Precision;
    use fovea::backend::wgpu::{Options, WgpuBackend};
    static LANES: std::sync::OnceLock<[Option<WgpuBackend>; 2]> = std::sync::OnceLock::new();
    LANES.get_or_init(|| {
        let exact = wgpu_lane(Options { precision: Precision::Exact, ..Options::default() });
        let fast = match &exact {
            Some(b) if b.native_f16() => wgpu_lane(Options { precision: Precision::Fast, ..Options::default() }),
            Some(b) => {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: fast precision needs f16 shaders, which {} lacks",
                    b.device_name()
                );
                None
            }
            None => None,
        };
        if let Some(b) = &exact {
            eprintln!("wgpu adapter: {}", b.device_name());
        }
        [exact, fast]
    })
}

/// Whether a wgpu adapter exists for a CLI-level wgpu test: a missing one fails the test where
/// [`wgpu_required`], elsewhere prints a visible skip and returns false.
pub fn wgpu_adapter_or_skip() -> bool {
    ensure_runtime_dir();
    if fovea::backend::wgpu::list_adapters().is_empty() {
        assert!(!wgpu_required(), "no wgpu adapter where the wgpu tests must run (CI or FOVEA_REQUIRE_WGPU=1)");
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED: no wgpu adapter; install a Vulkan driver or mesa-vulkan-drivers");
        return false;
    }
    true
}

/// Whether `FOVEA_REQUIRE_CUDA=1`: the CUDA tests must run (set on GPU machines, so nothing
/// passes there by skipping).
pub fn cuda_required() -> bool {
    std::env::var("FOVEA_REQUIRE_CUDA").is_ok_and(|v| v.trim() == "1")
}

/// The CUDA lane for a test, or `None` (a visible skip) where there is no CUDA driver. Unlike the
/// wgpu helpers this does not fail under `CI` (CI machines have no GPU); with
/// `FOVEA_REQUIRE_CUDA=1` a missing driver fails the test instead.
pub fn cuda_lane_or_skip() -> Option<fovea::backend::cuda::CudaBackend> {
    cuda_lane_with_or_skip(fovea::backend::cuda::Options::default())
}

/// [`cuda_lane_or_skip`] with options (guard bands, device ordinal).
pub fn cuda_lane_with_or_skip(opts: fovea::backend::cuda::Options) -> Option<fovea::backend::cuda::CudaBackend> {
    match fovea::backend::cuda::CudaBackend::with_options(opts) {
        Ok(b) => Some(b),
        Err(e) if cuda_required() => panic!("FOVEA_REQUIRE_CUDA=1 but the CUDA lane is unavailable: {e}"),
        Err(e) => {
            // Written past the test harness's capture so the skip is visible in a normal run.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED: no CUDA driver: {e}");
            None
        }
    }
}

/// Mesa wants a private XDG_RUNTIME_DIR; give the test process one if the environment has none.
pub fn ensure_runtime_dir() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
            let dir = std::env::temp_dir().join(format!("fovea-xdg-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
            // SAFETY: called before any backend (and its threads) exists in this test process.
            unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
        }
    });
}

/// A lane's fused `route_experts` against the five ops it replaces, composed on the same lane:
/// the same selections and the same weight bits (one score function, one ranking), NaN rows
/// included (a kind outside the bias rows without a table, a table entry outside the experts), at
/// the released router's 256 experts, at 1 024 (the most the wgpu kernel keeps in workgroup
/// memory) and past it; and its shape errors name it, 3-D logits among them.
pub fn route_experts_matches_its_composition<B: Backend>(b: &B) {
    use fovea::backend::{DeviceTensor, HostTensor};
    let f = |shape: &[usize], v: Vec<f32>| b.upload(&HostTensor::f32(shape.to_vec(), v).unwrap()).unwrap();
    let i = |shape: &[usize], v: Vec<i32>| b.upload(&HostTensor::i32(shape.to_vec(), v).unwrap()).unwrap();
    let shape_err = |r: fovea::Result<(B::Tensor, B::Tensor)>| match r {
        Err(fovea::Error::Shape { op, msg }) => assert_eq!(op, "route_experts", "{msg}"),
        Err(other) => panic!("route_experts: expected a shape error, got {other:?}"),
        Ok((ids, _)) => panic!("route_experts: expected a shape error, got ids {:?}", ids.shape()),
    };
    // 3 tokens: a decode step's (wgpu's composition ranks them with topk_rows_rank); 1 100
    // experts: past the wgpu kernel's workgroup memory (its fallback) and CUDA's score cache
    for (n, e, k) in [(50, 256, 6), (9, 1024, 8), (3, 256, 6), (7, 1100, 6)] {
        let vocab = 12;
        // quantised logits (ties); every 7th token an image token; token 3 has a kind outside 0..2
        let logits = f(&[n, e], (0..n * e).map(|j| ((j * 7919 % 61) as f32 - 30.0) * 0.25).collect());
        let bias = f(&[2, e], (0..2 * e).map(|j| ((j * 13 % 5) as f32 - 2.0) * 0.125).collect());
        let kind = i(&[n], (0..n).map(|t| if t == 3 { 2 } else { i32::from(t % 7 == 1) }).collect());
        let tok = i(&[n], (0..n).map(|t| if t % 7 == 1 { (vocab + t) as i32 } else { (t % vocab) as i32 }).collect());
        // token 5's table row names expert e (outside 0..e)
        let table =
            i(&[vocab, k], (0..vocab * k).map(|j| if j == 5 * k { e as i32 } else { (j * 31 % e) as i32 }).collect());
        for hash in [None, Some((&table, &tok))] {
            let what = format!("e {e}, k {k}, hash {}", hash.is_some());
            let (ids, w) = b.route_experts(&logits, &bias, &kind, hash, k, 1.5).unwrap();
            let scores = b.sqrt_softplus(&logits).unwrap();
            let biased = b.add(&scores, &b.gather_rows(&bias, &kind).unwrap()).unwrap();
            let mut want_ids = b.topk_rows(&biased, k).unwrap();
            if let Some((t, ti)) = hash {
                want_ids = b.hash_route(t, ti, &want_ids).unwrap();
            }
            let want_w = b.route_weights(&scores, &want_ids, 1.5).unwrap();
            assert_eq!(b.download(&ids).unwrap(), b.download(&want_ids).unwrap(), "{what}");
            let (got, want) = (b.download(&w).unwrap(), b.download(&want_w).unwrap());
            let bits = |t: HostTensor| t.into_f32("w").unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got.clone()), bits(want), "{what}");
            let got = got.into_f32("w").unwrap();
            assert!(got[..3 * k].iter().all(|v| v.is_finite()), "{what}: {:?}", &got[..3 * k]);
            if n > 5 {
                // token 3 (a bad kind) selects nothing by top-k; on the hash layer its table row
                // decides
                assert_eq!(got[3 * k].is_nan(), hash.is_none(), "{what}: a bad kind gives a NaN row");
                assert_eq!(
                    got[5 * k].is_nan(),
                    hash.is_some(),
                    "{what}: a table entry outside the experts gives a NaN row"
                );
            }
        }
        shape_err(b.route_experts(&logits, &f(&[2, e - 1], vec![0.0; 2 * (e - 1)]), &kind, None, k, 1.0));
        shape_err(b.route_experts(&logits, &bias, &i(&[n - 1], vec![0; n - 1]), None, k, 1.0));
        shape_err(b.route_experts(&logits, &bias, &kind, Some((&table, &tok)), k - 1, 1.0));
        shape_err(b.route_experts(&logits, &bias, &kind, Some((&table, &i(&[2], vec![0, 1]))), k, 1.0));
        shape_err(b.route_experts(&kind, &bias, &kind, None, k, 1.0));
        let cube = f(&[n, 2, e / 2], vec![0.5; n * e]);
        shape_err(b.route_experts(&cube, &bias, &kind, None, k, 1.0));
    }
}
