//! The op harness (after ggml's test-backend-ops): every op of the contract on every lane under
//! test, against the CPU reference lane, on random inputs with awkward shapes. Each case checks
//! the normalised mean squared error against a per-op bound, that no NaN/inf appeared, and that
//! nothing was written past the end of the output (wgpu guard bands).
//!
//! Bounds (NMSE = Σ(a−b)²/Σb²): ops that only move data are exact (0). Transcendental
//! elementwise ops (exp, erf, cos/sin, rsqrt) differ by a few f32 ulps: NMSE ≈ (4·2⁻²⁴)² ≈ 6e-14,
//! bound 1e-12. Reductions (linear, norms, attention) also differ in summation order: a length-K
//! dot product has relative error ≈ √K·2⁻²⁴; for K ≤ 300 that is ≈ 1e-6, NMSE ≈ 1e-12, bound 1e-10.

mod common;

use std::borrow::Cow;

use fovea::backend::cpu::CpuBackend;
use fovea::backend::wgpu::{Options, WgpuBackend};
use fovea::backend::{Backend, HostTensor, HostWeight, Op, WeightFormat};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const EXACT: f64 = 0.0;
const ELEMENTWISE: f64 = 1e-12;
const REDUCTION: f64 = 1e-10;

/// A lane compared with the CPU lane, plus its own output check (guard bands).
trait LaneUnderTest: Backend {
    fn check_output(&self, t: &Self::Tensor) -> fovea::Result<()>;
}

impl LaneUnderTest for WgpuBackend {
    fn check_output(&self, t: &Self::Tensor) -> fovea::Result<()> {
        self.check_guards(t)
    }
}

/// Inputs of one case, as host data; each lane uploads them itself.
struct Case {
    name: String,
    op: Op,
    bound: f64,
    tensors: Vec<HostTensor>,
    weight: Option<(WeightFormat, usize, usize, Vec<u8>)>,
    run: fn(&Args) -> Call,
    args: Args,
}

#[derive(Clone, Copy, Default)]
struct Args {
    a: usize,
    b: usize,
    c: usize,
    f: f32,
}

/// Which op to call, with tensor indices into `Case::tensors`.
enum Call {
    Linear { x: usize, bias: Option<usize> },
    RmsNorm { x: usize, w: usize, eps: f32 },
    Add(usize, usize),
    SliceCols(usize, usize, usize),
    ConcatRows(usize, usize),
    GatherRows(usize, usize),
    Swiglu(usize),
    GeluErf(usize),
    Rope2d { x: usize, heads: usize, grid_w: usize, theta: f32 },
    Attention { q: usize, k: usize, v: usize, heads: usize },
    Unfold { x: usize, h: usize, w: usize, r: usize },
}

fn execute<B: Backend>(b: &B, case: &Case) -> fovea::Result<B::Tensor> {
    let ts: Vec<B::Tensor> = case.tensors.iter().map(|t| b.upload(t)).collect::<fovea::Result<_>>()?;
    let weight = match &case.weight {
        Some((format, rows, cols, bytes)) => Some(b.upload_weight(&HostWeight {
            name: case.name.clone(),
            format: *format,
            rows: *rows,
            cols: *cols,
            bytes: Cow::Borrowed(bytes),
        })?),
        None => None,
    };
    match (case.run)(&case.args) {
        Call::Linear { x, bias } => b.linear(&ts[x], weight.as_ref().unwrap(), bias.map(|i| &ts[i])),
        Call::RmsNorm { x, w, eps } => b.rms_norm(&ts[x], &ts[w], eps),
        Call::Add(x, y) => b.add(&ts[x], &ts[y]),
        Call::SliceCols(x, s, l) => b.slice_cols(&ts[x], s, l),
        Call::ConcatRows(x, y) => b.concat_rows(&ts[x], &ts[y]),
        Call::GatherRows(x, i) => b.gather_rows(&ts[x], &ts[i]),
        Call::Swiglu(x) => b.swiglu(&ts[x]),
        Call::GeluErf(x) => b.gelu_erf(&ts[x]),
        Call::Rope2d { x, heads, grid_w, theta } => b.rope_2d(&ts[x], heads, grid_w, theta),
        Call::Attention { q, k, v, heads } => b.attention(&ts[q], &ts[k], &ts[v], heads),
        Call::Unfold { x, h, w, r } => b.unfold(&ts[x], h, w, r),
    }
}

fn randn(r: &mut StdRng, shape: &[usize], scale: f32) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::f32(shape.to_vec(), (0..n).map(|_| r.random_range(-scale..scale)).collect()).unwrap()
}

fn weight_bytes(r: &mut StdRng, format: WeightFormat, rows: usize, cols: usize) -> Vec<u8> {
    let a = (3.0 / cols as f32).sqrt();
    (0..rows * cols)
        .flat_map(|_| {
            let v = r.random_range(-a..a);
            match format {
                WeightFormat::F32 => v.to_le_bytes().to_vec(),
                WeightFormat::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                WeightFormat::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
            }
        })
        .collect()
}

fn case(name: impl Into<String>, op: Op, bound: f64, tensors: Vec<HostTensor>, run: fn(&Args) -> Call, args: Args) -> Case {
    Case { name: name.into(), op, bound, tensors, weight: None, run, args }
}

/// Every op, with shapes that are not multiples of any tile size.
fn cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0x0f0ea);
    let mut out = Vec::new();
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        for (n, k, o) in [(1, 7, 5), (37, 70, 45), (130, 96, 67)] {
            let mut c = case(
                format!("linear {format} x[{n},{k}] W[{o},{k}]"),
                Op::Linear,
                REDUCTION,
                vec![randn(&mut r, &[n, k], 1.0), randn(&mut r, &[o], 0.5)],
                // a = 1: with bias (odd n), a = 0: without.
                |a| Call::Linear { x: 0, bias: (a.a == 1).then_some(1) },
                Args { a: n % 2, ..Default::default() },
            );
            c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
            out.push(c);
        }
    }
    out.push(case("rms_norm [33,50]", Op::RmsNorm, REDUCTION, vec![randn(&mut r, &[33, 50], 2.0), randn(&mut r, &[50], 1.5)], |_| Call::RmsNorm { x: 0, w: 1, eps: 1e-6 }, Args::default()));
    out.push(case("add [17,23]", Op::Add, EXACT, vec![randn(&mut r, &[17, 23], 1.0), randn(&mut r, &[17, 23], 1.0)], |_| Call::Add(0, 1), Args::default()));
    out.push(case("slice_cols [19,30] 7..20", Op::SliceCols, EXACT, vec![randn(&mut r, &[19, 30], 1.0)], |_| Call::SliceCols(0, 7, 13), Args::default()));
    out.push(case("concat_rows [5,9]+[3,9]", Op::ConcatRows, EXACT, vec![randn(&mut r, &[5, 9], 1.0), randn(&mut r, &[3, 9], 1.0)], |_| Call::ConcatRows(0, 1), Args::default()));
    out.push(case(
        "gather_rows [6,11] with repeats",
        Op::GatherRows,
        EXACT,
        vec![randn(&mut r, &[6, 11], 1.0), HostTensor::i32([9], vec![5, 0, 0, 3, 2, 5, 1, 4, 4]).unwrap()],
        |_| Call::GatherRows(0, 1),
        Args::default(),
    ));
    out.push(case("swiglu [21,2x27]", Op::Swiglu, ELEMENTWISE, vec![randn(&mut r, &[21, 54], 4.0)], |_| Call::Swiglu(0), Args::default()));
    out.push(case("gelu_erf [13,41]", Op::GeluErf, ELEMENTWISE, vec![randn(&mut r, &[13, 41], 6.0)], |_| Call::GeluErf(0), Args::default()));
    for (heads, hd, gh, gw, theta) in [(2, 16, 5, 7, 500.0f32), (3, 64, 4, 9, 10000.0)] {
        out.push(case(
            format!("rope_2d {heads}x{hd} grid {gh}x{gw} θ={theta}"),
            Op::Rope2d,
            ELEMENTWISE,
            vec![randn(&mut r, &[gh * gw, heads * hd], 1.0)],
            |a| Call::Rope2d { x: 0, heads: a.a, grid_w: a.b, theta: a.f },
            Args { a: heads, b: gw, c: 0, f: theta },
        ));
    }
    for (n, heads, hd) in [(1, 1, 16), (45, 3, 16), (77, 2, 64), (130, 4, 32)] {
        out.push(case(
            format!("attention n={n} {heads}x{hd}"),
            Op::Attention,
            REDUCTION,
            vec![randn(&mut r, &[n, heads * hd], 1.5), randn(&mut r, &[n, heads * hd], 1.5), randn(&mut r, &[n, heads * hd], 1.0)],
            |a| Call::Attention { q: 0, k: 1, v: 2, heads: a.a },
            Args { a: heads, ..Default::default() },
        ));
    }
    for (h, w, c, rr) in [(5, 7, 6, 3), (6, 6, 4, 3), (1, 4, 3, 2)] {
        out.push(case(
            format!("unfold {h}x{w}x{c} r={rr}"),
            Op::Unfold,
            EXACT,
            vec![randn(&mut r, &[h * w, c], 1.0)],
            |a| Call::Unfold { x: 0, h: a.a, w: a.b, r: a.c },
            Args { a: h, b: w, c: rr, f: 0.0 },
        ));
    }
    out
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(f64::MIN_POSITIVE)
}

/// Linear with few rows and weights far larger than a 1 KiB binding cap (many row chunks, the
/// last one short), in every format.
fn chunked_linear_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0xc4u64);
    let mut out = Vec::new();
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        for (n, k, o) in [(2, 70, 45), (2, 33, 101)] {
            let mut c = case(
                format!("linear {format} x[{n},{k}] W[{o},{k}] chunked"),
                Op::Linear,
                REDUCTION,
                vec![randn(&mut r, &[n, k], 1.0), randn(&mut r, &[o], 0.5)],
                |_| Call::Linear { x: 0, bias: Some(1) },
                Args::default(),
            );
            c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
            out.push(c);
        }
    }
    out
}

fn compare_with_cpu<L: LaneUnderTest>(lane: &L, cases: Vec<Case>) -> std::collections::HashSet<Op> {
    let cpu = CpuBackend::new();
    let mut covered = std::collections::HashSet::new();
    let mut failures = Vec::new();
    for c in cases {
        covered.insert(c.op);
        let want = cpu.download(&execute(&cpu, &c).unwrap()).unwrap();
        let got_t = match execute(lane, &c) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{}: {e}", c.name));
                continue;
            }
        };
        if let Err(e) = lane.check_output(&got_t) {
            failures.push(format!("{}: {e}", c.name));
        }
        let got = lane.download(&got_t).unwrap();
        if got.shape != want.shape {
            failures.push(format!("{}: shape {:?} vs cpu {:?}", c.name, got.shape, want.shape));
            continue;
        }
        let (g, w) = (got.as_f32().unwrap(), want.as_f32().unwrap());
        if let Some(i) = g.iter().position(|v| !v.is_finite()) {
            failures.push(format!("{}: non-finite value {} at {i}", c.name, g[i]));
        }
        let e = nmse(g, w);
        eprintln!("{:<44} nmse {e:.2e} (bound {:.0e})", c.name, c.bound);
        if !(e <= c.bound) {
            failures.push(format!("{}: nmse {e:.3e} > {:.0e}", c.name, c.bound));
        }
    }
    assert!(failures.is_empty(), "{} case(s) failed on the {} lane:\n{}", failures.len(), lane.lane(), failures.join("\n"));
    covered
}

/// One test, so the two devices are never created while the other works (the NVIDIA Vulkan
/// driver was seen to deadlock on that).
#[test]
fn wgpu_ops_match_cpu() {
    let Some(lane) = common::wgpu_lane(Options { guard_words: 8, ..Options::default() }) else { return };
    let covered = compare_with_cpu(&lane, cases());
    let missing: Vec<_> = Op::VISION.iter().filter(|op| !covered.contains(op)).map(|op| op.name()).collect();
    assert!(missing.is_empty(), "ops without a harness case: {missing:?}");
    drop(lane);

    // A 1 KiB binding cap splits every weight into many row chunks; f16 via the integer decode.
    let opts = Options { guard_words: 8, max_binding_bytes: Some(1024), force_f16_fallback: true, ..Options::default() };
    let Some(lane) = common::wgpu_lane(opts) else { return };
    compare_with_cpu(&lane, chunked_linear_cases());
}
