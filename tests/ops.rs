//! The op harness (after ggml's test-backend-ops): every op of the contract on every lane under
//! test, against the CPU reference lane, on random inputs with awkward shapes. Each case checks
//! the normalised mean squared error against a per-op bound, that no NaN/inf appeared, and that
//! nothing was written past the end of the output (wgpu guard bands).
//!
//! Bounds (NMSE = Σ(a−b)²/Σb²): ops that only move data are exact (0). Transcendental
//! elementwise ops (exp, erf, cos/sin, rsqrt) differ by a few f32 ulps: NMSE ≈ (4·2⁻²⁴)² ≈ 6e-14,
//! bound 1e-12. Reductions (linear, norms, attention) also differ in summation order: a length-K
//! dot product has relative error ≈ √K·2⁻²⁴; for K ≤ 300 that is ≈ 1e-6, NMSE ≈ 1e-12, bound 1e-10.
//!
//! Block formats (Q8_0 … FP8, `block_cases`): every lane decodes each weight to the same f32 as
//! the CPU lane's `formats::decode_row` (ggml's arithmetic, each product exact in f32), so the
//! weight ops keep the bounds above: embed_rows EXACT, the reductions REDUCTION (K ≤ 768 here:
//! relative error ≈ √768·2⁻²⁴ ≈ 1.7e-6, NMSE ≈ 3e-12, still two decades under 1e-10). A decoder
//! that gets one code, scale or nibble order wrong moves whole runs of weights by O(1) of their
//! size: NMSE ≳ 1e-3.

mod common;

use std::borrow::Cow;

use common::blocks::weight_bytes;
use fovea::backend::cpu::CpuBackend;
use fovea::backend::cuda::CudaBackend;
use fovea::backend::wgpu::{Options, Reduction, WgpuBackend};
use fovea::backend::{Backend, HostData, HostTensor, HostWeight, Op, Precision, WeightFormat, decode_row};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const EXACT: f64 = 0.0;
const ELEMENTWISE: f64 = 1e-12;
const REDUCTION: f64 = 1e-10;
/// Fast precision (`--precision fast`, CUDA and wgpu): a GEMM whose operands are each rounded to
/// f16 once has an NMSE of ≈ 8e-8 (tests/common `FAST_GEMM_NMSE`, derived there); gated at 4×.
const FAST_GEMM: f64 = 4.0 * common::FAST_GEMM_NMSE;
/// Attention in fast precision (CUDA's tensor-core kernel, cuda/attention.cu): q, k, v and the
/// probabilities are each rounded once to f16 (relative error variance δ² = FAST_GEMM_NMSE / 2).
/// The output o = Σ p_j v_j / Σ p_j takes δ² from p's rounding and δ² from v's, relative to o
/// (each term's error scales with its own p_j v_j, as o does), and from the scores: s = scale·q·k
/// with q and k rounded has an absolute error of variance 2δ²·var(s), which moves p_j by that
/// relative to the row's mean and o by the same relative to o. NMSE ≈ FAST_GEMM_NMSE · (1 +
/// var(s)); the cases draw q and k uniform in ±1.5 (variance 0.75 each), so var(s) = 0.75² =
/// 0.5625 whatever the head width: ≈ 1.25e-7, gated at 4× (the host emulator measured
/// 0.4–2.5e-7 on its shapes, cuda/emu/emu_test.cpp).
const FAST_ATTENTION: f64 = 4.0 * common::FAST_GEMM_NMSE * (1.0 + 0.75 * 0.75);
/// The fewest blocks (queries × groups of 64 heads) of a case whose sink attention runs on
/// CUDA's tensor cores in fast precision (`SINK_SPLIT_TARGET_BLOCKS` in
/// src/backend/cuda/lm_attention.rs); fewer take the f32 kernel, at REDUCTION.
const SINK_FAST_MIN_BLOCKS: usize = 264;
/// The experts chain two GEMMs through the clamped SwiGLU: the up GEMM's error reaches both its
/// halves (≈ 1.6e-7, up to twice that through silu's slope) and the down GEMM adds its own 8e-8,
/// ≈ 4e-7; gated at 4×, 1.6e-6.
const FAST_MOE: f64 = 20.0 * common::FAST_GEMM_NMSE;
/// One token (decode, `small_row_cases`) averages the experts' rounding over only its 3 slots:
/// measured on lavapipe up to 3.4e-6 (Q4_K, whose weights' min offsets make the dot products
/// cancel), a fluctuation of the same rounding rather than another error (the exact run of the
/// same cases holds REDUCTION); gated at 4× FAST_MOE. The wgpu lane's small rows have since
/// become f32 products in both precisions (its `rows_shader`), so this now bounds the CUDA lane's.
const FAST_MOE_ONE_TOKEN: f64 = 4.0 * FAST_MOE;
/// The CUDA lane's one-token experts in fast precision take int8 activations where the format has
/// its q8x kernels (`fovea::backend::cuda::moe_q8x_kernels`: Q8_0, Q2_K, IQ2_XXS, MXFP4): each 32-value
/// group of x, and of the hidden row, is rounded to a step of amax / 127, an error uniform in
/// ±step / 2 (variance step² / 12), relative to the group's mean square (crest / 127)² / 12 with
/// crest = amax / rms. x's Gaussian groups: crest ≤ 3 (32 draws pass 3σ in about 8 % of the
/// groups, by little) → 4.7e-5 for the gate and the up each; the hidden row takes both (≤ 4 ×
/// 4.7e-5 when they add coherently); its clamped SwiGLU products are heavier-tailed, crest ≤ 5 →
/// 1.3e-4 more from the down's own rounding: ≈ 3.2e-4, gated at 4×.
const FAST_MOE_Q8X: f64 = 4.0 * (4.0 * 4.7e-5 + 1.3e-4);
/// The CUDA lane's one-token linears against wide weights (≥ `LINEAR_Q8X_MIN_COLS` outputs) in
/// fast precision take int8 activations in the same formats (`linear_q8x_kernel`): x's rounding
/// alone, as the experts' gate (4.7e-5, crest ≤ 3), gated at 4×.
const FAST_LINEAR_Q8X: f64 = 4.0 * 4.7e-5;
/// The most rows of x the wgpu lane's small-row kernels take (`SMALL_ROWS` in its rows.rs).
const SMALL_ROWS: usize = 8;

/// A lane compared with the CPU lane, plus its own output check (guard bands).
trait LaneUnderTest: Backend {
    fn check_output(&self, t: &Self::Tensor) -> fovea::Result<()>;
}

impl LaneUnderTest for WgpuBackend {
    fn check_output(&self, t: &Self::Tensor) -> fovea::Result<()> {
        self.check_guards(t)
    }
}

impl LaneUnderTest for CudaBackend {
    fn check_output(&self, t: &Self::Tensor) -> fovea::Result<()> {
        self.check_guards(t)
    }
}

/// Inputs of one case, as host data; each lane uploads them itself.
#[derive(Clone)]
struct Case {
    name: String,
    op: Op,
    bound: f64,
    tensors: Vec<HostTensor>,
    weight: Option<(WeightFormat, usize, usize, Vec<u8>)>,
    /// Several weights (moe_experts: every w1, then every w3, then every w2).
    experts: Vec<(WeightFormat, usize, usize, Vec<u8>)>,
    /// `weight` goes up with `upload_weight_exact` (f32 products in every precision).
    exact_weight: bool,
    /// How `experts` go up.
    upload: ExpertUpload,
    run: fn(&Args) -> Call,
    args: Args,
}

/// How a case's experts go up.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExpertUpload {
    /// As the model loads them: the gate's and the up's by `upload_expert_pair` (on the wgpu lane
    /// one binding, one token's gate and up in one int8 dispatch where they take it), the down's
    /// by `upload_experts`.
    AsTheModel,
    /// A projection at a time by `upload_experts`: on the wgpu lane one token's gate and up in a
    /// dispatch each.
    Projections,
    /// One `upload_weight` each: on the wgpu lane, the per-expert dispatches after an ids
    /// readback that experts too large to share one binding take.
    OneByOne,
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
    Linear {
        x: usize,
        bias: Option<usize>,
    },
    RmsNorm {
        x: usize,
        w: usize,
        eps: f32,
    },
    Add(usize, usize),
    SliceCols(usize, usize, usize),
    ConcatRows(usize, usize),
    GatherRows(usize, usize),
    Swiglu(usize),
    GeluErf(usize),
    Rope2d {
        x: usize,
        heads: usize,
        grid_w: usize,
        theta: f32,
    },
    Attention {
        q: usize,
        k: usize,
        v: usize,
        heads: usize,
    },
    LinearAdd {
        x: usize,
        bias: Option<usize>,
        residual: usize,
    },
    RmsNormLinear {
        x: usize,
        norm: usize,
        eps: f32,
        bias: Option<usize>,
    },
    SwigluLinearAdd {
        gate_up: usize,
        residual: usize,
    },
    AttentionRope2d {
        qkv: usize,
        heads: usize,
        grid_w: usize,
        theta: f32,
    },
    Unfold {
        x: usize,
        h: usize,
        w: usize,
        r: usize,
    },
    UnfoldLinearGelu {
        x: usize,
        h: usize,
        w: usize,
        r: usize,
        bias: Option<usize>,
    },
    // language model
    EmbedRows(usize),
    HcExpand(usize, usize),
    RmsNormHeads {
        x: usize,
        heads: usize,
        eps: f32,
    },
    HcPre {
        x: usize,
        w: usize,
        hc: usize,
    },
    HcPreNorm {
        x: usize,
        w: usize,
        weight: usize,
        hc: usize,
    },
    HcMixSplit {
        x: usize,
        scale: usize,
        base: usize,
        hc: usize,
    },
    /// Two outputs (the split, the sublayer's input), both compared.
    HcMixSplitPreNorm {
        x: usize,
        scale: usize,
        base: usize,
        weight: usize,
        hc: usize,
    },
    /// Three outputs (the residual after the post, the next split, the next input), all compared.
    HcPostMixSplitPreNorm {
        x: usize,
        f: usize,
        split: usize,
        scale: usize,
        base: usize,
        weight: usize,
        hc: usize,
    },
    /// `linear_pair` of x with the case's two weights (`experts`, in order).
    LinearPair(usize),
    HcPost {
        x: usize,
        f: usize,
        split: usize,
    },
    HcHeadWeights {
        mix: usize,
        scale: usize,
        base: usize,
        eps: f32,
    },
    SqrtSoftplus(usize),
    HashRoute {
        table: usize,
        ids: usize,
        fallback: usize,
    },
    RouteWeights {
        scores: usize,
        ids: usize,
        scale: f32,
    },
    /// Two outputs (ids, weights), both compared; `hash` = (table, token ids).
    RouteExperts {
        logits: usize,
        bias: usize,
        kind: usize,
        hash: Option<(usize, usize)>,
        k: usize,
        scale: f32,
    },
    SwigluClamp(usize, usize, f32),
    /// `shared_expert` of x and routed with the case's experts w1, w3 (uploaded as a pair), w2.
    SharedExpert {
        x: usize,
        routed: usize,
        limit: f32,
    },
    RopeTail {
        x: usize,
        heads: usize,
        inv_freq: usize,
        pos0: usize,
        stride: usize,
        inverse: bool,
    },
    RopeTailAt {
        x: usize,
        heads: usize,
        inv_freq: usize,
        positions: usize,
        inverse: bool,
    },
    RmsNormRope {
        x: usize,
        weight: Option<usize>,
        heads: usize,
        inv_freq: usize,
        positions: usize,
    },
    HcSplit {
        mix: usize,
        scale: usize,
        base: usize,
        hc: usize,
        iters: usize,
        eps: f32,
    },
    CompressPool {
        kv: usize,
        gate: usize,
        ape: usize,
        ratio: usize,
        overlap: bool,
    },
    IndexerScores {
        q: usize,
        k: usize,
        w: usize,
        heads: usize,
        scale: f32,
        pos0: usize,
        ratio: usize,
    },
    TopkRows(usize, usize),
    GroupedLinear(usize, usize),
    MoeExperts {
        x: usize,
        ids: usize,
        weights: usize,
        limit: f32,
    },
    SinkAttention {
        q: usize,
        kv: usize,
        window: usize,
        comp: Option<(usize, usize)>,
        sinks: usize,
        heads: usize,
    },
    /// `sink_attention_rope`: a `SinkAttention` with compressed entries, then its rotation's
    /// inv_freq and positions.
    SinkAttentionRope {
        heads: usize,
        inv_freq: usize,
        positions: usize,
    },
}

/// The outputs of the case's op (one, or two for `route_experts`).
fn execute<B: Backend>(b: &B, case: &Case) -> fovea::Result<Vec<B::Tensor>> {
    let ts: Vec<B::Tensor> = case.tensors.iter().map(|t| b.upload(t)).collect::<fovea::Result<_>>()?;
    let weight = match &case.weight {
        Some((format, rows, cols, bytes)) => {
            let host = HostWeight {
                name: case.name.clone(),
                format: *format,
                rows: *rows,
                cols: *cols,
                bytes: Cow::Borrowed(bytes),
            };
            Some(if case.exact_weight { b.upload_weight_exact(&host)? } else { b.upload_weight(&host)? })
        }
        None => None,
    };
    fn host<'a>(name: &str, (format, rows, cols, bytes): &'a (WeightFormat, usize, usize, Vec<u8>)) -> HostWeight<'a> {
        HostWeight { name: name.to_string(), format: *format, rows: *rows, cols: *cols, bytes: Cow::Borrowed(bytes) }
    }
    let e = case.experts.len() / 3;
    let experts: Vec<B::Weight> = if case.upload == ExpertUpload::OneByOne {
        // each projection's experts uploaded last to first, so that expert 1 never lies after
        // expert 0 in one buffer (equal uploads in a row could lie evenly spaced, one span)
        let mut all = Vec::new();
        for projection in case.experts.chunks(e.max(1)) {
            let mut up: Vec<B::Weight> =
                projection.iter().rev().map(|w| b.upload_weight(&host(&case.name, w))).collect::<fovea::Result<_>>()?;
            up.reverse();
            all.extend(up);
        }
        all
    } else if let (Call::LinearPair(_), [wa, wb]) = ((case.run)(&case.args), case.experts.as_slice()) {
        // as the model uploads the weights linear_pair takes (a lane may place them together)
        let (wa, wb) = b.upload_weight_pair(&host(&case.name, wa), &host(&case.name, wb))?;
        vec![wa, wb]
    } else if let (Call::SharedExpert { .. }, [w1, w3, w2]) = ((case.run)(&case.args), case.experts.as_slice()) {
        // as the model uploads the shared expert: the gate and up as a pair
        let (w1, w3) = b.upload_weight_pair(&host(&case.name, w1), &host(&case.name, w3))?;
        vec![w1, w3, b.upload_weight(&host(&case.name, w2))?]
    } else if let (ExpertUpload::AsTheModel, [w1, w3, w2]) =
        (case.upload, case.experts.chunks(e.max(1)).collect::<Vec<_>>().as_slice())
    {
        let (mut all, ups) =
            b.upload_expert_pair(e, &mut |j| Ok(host(&case.name, &w1[j])), &mut |j| Ok(host(&case.name, &w3[j])))?;
        all.extend(ups);
        all.extend(b.upload_experts(e, &mut |j| Ok(host(&case.name, &w2[j])))?);
        all
    } else {
        // a projection at a time: every w1, every w3, every w2
        let mut all = Vec::new();
        for projection in case.experts.chunks(e.max(1)) {
            all.extend(b.upload_experts(projection.len(), &mut |j| Ok(host(&case.name, &projection[j])))?);
        }
        all
    };
    let one = match (case.run)(&case.args) {
        Call::RouteExperts { logits, bias, kind, hash, k, scale } => {
            let hash = hash.map(|(t, i)| (&ts[t], &ts[i]));
            let (ids, weights) = b.route_experts(&ts[logits], &ts[bias], &ts[kind], hash, k, scale)?;
            return Ok(vec![ids, weights]);
        }
        Call::Linear { x, bias } => b.linear(&ts[x], weight.as_ref().unwrap(), bias.map(|i| &ts[i])),
        Call::LinearAdd { x, bias, residual } => {
            b.linear_add(&ts[x], weight.as_ref().unwrap(), bias.map(|i| &ts[i]), &ts[residual])
        }
        Call::RmsNormLinear { x, norm, eps, bias } => {
            b.rms_norm_linear(&ts[x], &ts[norm], eps, weight.as_ref().unwrap(), bias.map(|i| &ts[i]))
        }
        Call::SwigluLinearAdd { gate_up, residual } => {
            b.swiglu_linear_add(&ts[gate_up], weight.as_ref().unwrap(), &ts[residual])
        }
        Call::RmsNorm { x, w, eps } => b.rms_norm(&ts[x], &ts[w], eps),
        Call::Add(x, y) => b.add(&ts[x], &ts[y]),
        Call::SliceCols(x, s, l) => b.slice_cols(&ts[x], s, l),
        Call::ConcatRows(x, y) => b.concat_rows(&ts[x], &ts[y]),
        Call::GatherRows(x, i) => b.gather_rows(&ts[x], &ts[i]),
        Call::Swiglu(x) => b.swiglu(&ts[x]),
        Call::GeluErf(x) => b.gelu_erf(&ts[x]),
        Call::Rope2d { x, heads, grid_w, theta } => b.rope_2d(&ts[x], heads, grid_w, theta),
        Call::Attention { q, k, v, heads } => b.attention(&ts[q], &ts[k], &ts[v], heads),
        Call::AttentionRope2d { qkv, heads, grid_w, theta } => b.attention_rope_2d(&ts[qkv], heads, grid_w, theta),
        Call::Unfold { x, h, w, r } => b.unfold(&ts[x], h, w, r),
        Call::UnfoldLinearGelu { x, h, w, r, bias } => {
            b.unfold_linear_gelu(&ts[x], h, w, r, weight.as_ref().unwrap(), bias.map(|i| &ts[i]))
        }
        Call::EmbedRows(ids) => b.embed_rows(weight.as_ref().unwrap(), &ts[ids]),
        Call::HcExpand(x, hc) => b.hc_expand(&ts[x], hc),
        Call::RmsNormHeads { x, heads, eps } => b.rms_norm_heads(&ts[x], heads, eps),
        Call::HcPre { x, w, hc } => b.hc_pre(&ts[x], &ts[w], hc),
        Call::HcPreNorm { x, w, weight, hc } => b.hc_pre_norm(&ts[x], &ts[w], hc, &ts[weight], 1e-6),
        Call::HcMixSplit { x, scale, base, hc } => {
            b.hc_mix_split(&ts[x], weight.as_ref().unwrap(), &ts[scale], &ts[base], hc, 20, 1e-6, 1e-6)
        }
        Call::HcMixSplitPreNorm { x, scale, base, weight: norm, hc } => {
            let mix = weight.as_ref().unwrap();
            let (split, y) =
                b.hc_mix_split_pre_norm(&ts[x], mix, &ts[scale], &ts[base], hc, 20, 1e-6, 1e-6, &ts[norm])?;
            return Ok(vec![split, y]);
        }
        Call::HcPostMixSplitPreNorm { x, f, split, scale, base, weight: norm, hc } => {
            let mix = weight.as_ref().unwrap();
            let (x, split, y) = b.hc_post_mix_split_pre_norm(
                &ts[x], &ts[f], &ts[split], mix, &ts[scale], &ts[base], hc, 20, 1e-6, 1e-6, &ts[norm],
            )?;
            return Ok(vec![x, split, y]);
        }
        Call::LinearPair(x) => {
            let (ya, yb) = b.linear_pair(&ts[x], &experts[0], &experts[1])?;
            return Ok(vec![ya, yb]);
        }
        Call::HcPost { x, f, split } => b.hc_post(&ts[x], &ts[f], &ts[split]),
        Call::HcHeadWeights { mix, scale, base, eps } => b.hc_head_weights(&ts[mix], &ts[scale], &ts[base], eps),
        Call::SqrtSoftplus(x) => b.sqrt_softplus(&ts[x]),
        Call::HashRoute { table, ids, fallback } => b.hash_route(&ts[table], &ts[ids], &ts[fallback]),
        Call::RouteWeights { scores, ids, scale } => b.route_weights(&ts[scores], &ts[ids], scale),
        Call::SwigluClamp(g, u, limit) => b.swiglu_clamp(&ts[g], &ts[u], limit),
        Call::SharedExpert { x, routed, limit } => {
            b.shared_expert(&ts[x], &experts[0], &experts[1], &experts[2], limit, &ts[routed])
        }
        Call::RopeTail { x, heads, inv_freq, pos0, stride, inverse } => {
            b.rope_tail(&ts[x], heads, &ts[inv_freq], pos0, stride, inverse)
        }
        Call::RopeTailAt { x, heads, inv_freq, positions, inverse } => {
            b.rope_tail_at(&ts[x], heads, &ts[inv_freq], &ts[positions], inverse)
        }
        Call::RmsNormRope { x, weight, heads, inv_freq, positions } => {
            b.rms_norm_rope(&ts[x], weight.map(|w| &ts[w]), heads, 1e-6, &ts[inv_freq], &ts[positions])
        }
        Call::HcSplit { mix, scale, base, hc, iters, eps } => {
            b.hc_split(&ts[mix], &ts[scale], &ts[base], hc, iters, eps)
        }
        Call::CompressPool { kv, gate, ape, ratio, overlap } => {
            b.compress_pool(&ts[kv], &ts[gate], &ts[ape], ratio, overlap)
        }
        Call::IndexerScores { q, k, w, heads, scale, pos0, ratio } => {
            b.indexer_scores(&ts[q], &ts[k], &ts[w], heads, scale, pos0, ratio)
        }
        Call::TopkRows(x, k) => b.topk_rows(&ts[x], k),
        Call::MoeExperts { x, ids, weights, limit } => {
            let e = experts.len() / 3;
            let (w1, w3, w2) = (&experts[..e], &experts[e..2 * e], &experts[2 * e..]);
            b.moe_experts(&ts[x], &ts[ids], &ts[weights], w1, w3, w2, limit)
        }
        Call::GroupedLinear(x, g) => b.grouped_linear(&ts[x], weight.as_ref().unwrap(), g),
        Call::SinkAttention { q, kv, window, comp, sinks, heads } => {
            b.sink_attention(&ts[q], &ts[kv], &ts[window], comp.map(|(c, i)| (&ts[c], &ts[i])), &ts[sinks], heads)
        }
        Call::SinkAttentionRope { heads, inv_freq, positions } => b.sink_attention_rope(
            &ts[0],
            &ts[1],
            &ts[2],
            Some((&ts[3], &ts[4])),
            &ts[5],
            heads,
            &ts[inv_freq],
            &ts[positions],
        ),
    };
    Ok(vec![one?])
}

fn randn(r: &mut StdRng, shape: &[usize], scale: f32) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::f32(shape.to_vec(), (0..n).map(|_| r.random_range(-scale..scale)).collect()).unwrap()
}

fn case(
    name: impl Into<String>,
    op: Op,
    bound: f64,
    tensors: Vec<HostTensor>,
    run: fn(&Args) -> Call,
    args: Args,
) -> Case {
    Case {
        name: name.into(),
        op,
        bound,
        tensors,
        weight: None,
        experts: Vec::new(),
        exact_weight: false,
        upload: ExpertUpload::AsTheModel,
        run,
        args,
    }
}

/// A sink_attention case with compressed entries, shaped (n queries, heads, hd, m kv rows, c
/// compressed rows, k slots a query): the picks (−1 where `no_slot(j)`, else a random entry), then
/// q, kv, `window`, comp and sinks, drawn from `r` in that order.
fn sink_attention_case(
    r: &mut StdRng,
    (n, heads, hd, m, c, k): (usize, usize, usize, usize, usize, usize),
    window: Vec<i32>,
    no_slot: impl Fn(usize) -> bool,
    tag: &str,
) -> Case {
    let idx: Vec<i32> = (0..n * k).map(|j| if no_slot(j) { -1 } else { r.random_range(0..c as i32) }).collect();
    case(
        format!("sink_attention n={n} {heads}x{hd} m={m} comp {c} k={k}{tag}"),
        Op::SinkAttention,
        REDUCTION,
        vec![
            randn(r, &[n, heads * hd], 1.5),
            randn(r, &[m, hd], 1.5),
            ints(&[n, 2], window),
            randn(r, &[c, hd], 1.5),
            ints(&[n, k], idx),
            randn(r, &[heads], 2.0),
        ],
        |a| Call::SinkAttention { q: 0, kv: 1, window: 2, comp: Some((3, 4)), sinks: 5, heads: a.a },
        Args { a: heads, ..Default::default() },
    )
}

/// Every op, with shapes that are not multiples of any tile size.
fn cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0x0f0ea);
    let mut out = Vec::new();
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        for (n, k, o) in [(1, 7, 5), (37, 70, 45), (130, 96, 67)] {
            out.push(linear_case(&mut r, format, n, k, o, ""));
        }
    }
    // past the widest output tile (128 weight rows on cooperative matrices), the last one part
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        out.push(linear_case(&mut r, format, 70, 96, 300, " (three column tiles)"));
    }
    // with a bias (odd n) and k a multiple of 16: the cooperative direct tiles' store with one
    for format in [WeightFormat::F32, WeightFormat::BF16] {
        out.push(linear_case(&mut r, format, 129, 48, 150, " (a bias)"));
    }
    out.push(case(
        "rms_norm [33,50]",
        Op::RmsNorm,
        REDUCTION,
        vec![randn(&mut r, &[33, 50], 2.0), randn(&mut r, &[50], 1.5)],
        |_| Call::RmsNorm { x: 0, w: 1, eps: 1e-6 },
        Args::default(),
    ));
    out.push(case(
        "add [17,23]",
        Op::Add,
        EXACT,
        vec![randn(&mut r, &[17, 23], 1.0), randn(&mut r, &[17, 23], 1.0)],
        |_| Call::Add(0, 1),
        Args::default(),
    ));
    out.push(case(
        "slice_cols [19,30] 7..20",
        Op::SliceCols,
        EXACT,
        vec![randn(&mut r, &[19, 30], 1.0)],
        |_| Call::SliceCols(0, 7, 13),
        Args::default(),
    ));
    out.push(case(
        "concat_rows [5,9]+[3,9]",
        Op::ConcatRows,
        EXACT,
        vec![randn(&mut r, &[5, 9], 1.0), randn(&mut r, &[3, 9], 1.0)],
        |_| Call::ConcatRows(0, 1),
        Args::default(),
    ));
    out.push(case(
        "gather_rows [6,11] with repeats",
        Op::GatherRows,
        EXACT,
        vec![randn(&mut r, &[6, 11], 1.0), HostTensor::i32([9], vec![5, 0, 0, 3, 2, 5, 1, 4, 4]).unwrap()],
        |_| Call::GatherRows(0, 1),
        Args::default(),
    ));
    out.push(case(
        "swiglu [21,2x27]",
        Op::Swiglu,
        ELEMENTWISE,
        vec![randn(&mut r, &[21, 54], 4.0)],
        |_| Call::Swiglu(0),
        Args::default(),
    ));
    out.push(case(
        "gelu_erf [13,41]",
        Op::GeluErf,
        ELEMENTWISE,
        vec![randn(&mut r, &[13, 41], 6.0)],
        |_| Call::GeluErf(0),
        Args::default(),
    ));
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
    // head dim 64 is the ViT's (cooperative matrices on wgpu where the tiles are: 64-row query
    // blocks and key tiles, so n = 64 fills one exactly, 65 leaves a tile of one key, 130 of 2;
    // n = 1 is fewer rows than a 16×16 matrix)
    for (n, heads, hd) in [
        (1, 1, 16),
        (45, 3, 16),
        (1, 1, 64),
        (64, 1, 64),
        (65, 2, 64),
        (77, 2, 64),
        (130, 4, 32),
        (130, 3, 64),
        (200, 2, 64),
    ] {
        out.push(case(
            format!("attention n={n} {heads}x{hd}"),
            Op::Attention,
            REDUCTION,
            vec![
                randn(&mut r, &[n, heads * hd], 1.5),
                randn(&mut r, &[n, heads * hd], 1.5),
                randn(&mut r, &[n, heads * hd], 1.0),
            ],
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
    // the aligner's first layer: grids padded on both edges, on one, on none; r = 3 and 2
    for (i, (h, w, c, rr, o)) in [(7, 5, 6, 3, 70), (6, 9, 4, 3, 33), (23, 17, 5, 2, 65)].into_iter().enumerate() {
        let format = [WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16][i];
        let k = c * rr * rr;
        let mut c = case(
            format!("unfold_linear_gelu {format} {h}x{w}x{c} r={rr} -> {o}"),
            Op::UnfoldLinearGelu,
            REDUCTION,
            vec![randn(&mut r, &[h * w, c], 2.0), randn(&mut r, &[o], 0.5)],
            |a| Call::UnfoldLinearGelu { x: 0, h: a.a, w: a.b, r: a.c, bias: Some(1) },
            Args { a: h, b: w, c: rr, f: 0.0 },
        );
        c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
        out.push(c);
    }
    // a row past a workgroup's 256 threads and past one round of its four loads a thread (the
    // wgpu kernel's elements 256 apart: 1024 a round)
    out.push(case(
        "rms_norm [3,2100]",
        Op::RmsNorm,
        REDUCTION,
        vec![randn(&mut r, &[3, 2100], 2.0), randn(&mut r, &[2100], 1.5)],
        |_| Call::RmsNorm { x: 0, w: 1, eps: 1e-5 },
        Args::default(),
    ));
    // a residual stream's update: more rows than the CUDA lane's cuBLASLt threshold (64) with k a
    // multiple of 8 and out of 4 (its path there: the residual as the matmul's addend), and a few
    // rows (linear, then add). The residual is as large as x·Wᵀ (x uniform in ±1, W in ±√(3/k):
    // entries of variance 1/3 each), so a GEMM error shows against the sum at about its own size.
    for (format, n, k, o, bias) in [
        (WeightFormat::BF16, 70, 304, 36, true),
        (WeightFormat::F16, 80, 64, 20, false),
        (WeightFormat::F32, 9, 40, 17, true),
    ] {
        let mut c = case(
            format!("linear_add {format} x[{n},{k}] W[{o},{k}]{}", if bias { " + bias" } else { "" }),
            Op::LinearAdd,
            REDUCTION,
            vec![randn(&mut r, &[n, k], 1.0), randn(&mut r, &[n, o], 1.0), randn(&mut r, &[o], 0.5)],
            |a| Call::LinearAdd { x: 0, bias: (a.a == 1).then_some(2), residual: 1 },
            Args { a: bias as usize, ..Default::default() },
        );
        c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
        out.push(c);
    }
    // a ViT block's pre-norm projection and MLP update, each in one op: more rows than the CUDA
    // lane's cuBLASLt threshold with k a multiple of 8 and out of 4 (its path there: the norm or
    // the gating writes the GEMM's f16 operand), and a few rows (the composition)
    for (format, n, k, o, bias) in [
        (WeightFormat::BF16, 70, 304, 36, true),
        (WeightFormat::F16, 80, 64, 20, false),
        (WeightFormat::F32, 9, 40, 17, true),
    ] {
        let mut c = case(
            format!("rms_norm_linear {format} x[{n},{k}] W[{o},{k}]{}", if bias { " + bias" } else { "" }),
            Op::RmsNormLinear,
            REDUCTION,
            vec![randn(&mut r, &[n, k], 2.0), randn(&mut r, &[k], 1.5), randn(&mut r, &[o], 0.5)],
            |a| Call::RmsNormLinear { x: 0, norm: 1, eps: 1e-6, bias: (a.a == 1).then_some(2) },
            Args { a: bias as usize, ..Default::default() },
        );
        c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
        out.push(c);
        let mut c = case(
            format!("swiglu_linear_add {format} gate_up[{n},2x{k}] W[{o},{k}]"),
            Op::SwigluLinearAdd,
            REDUCTION,
            vec![randn(&mut r, &[n, 2 * k], 2.0), randn(&mut r, &[n, o], 1.0)],
            |_| Call::SwigluLinearAdd { gate_up: 0, residual: 1 },
            Args::default(),
        );
        c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
        out.push(c);
    }
    // a ViT block's attention from its fused projection (q, k and v uniform in ±1.5, as the
    // attention cases' q and k): one row, a grid of 65 rows (one key past a 64-key chunk), head
    // widths 16, 64 and 72 (padded to 128 on CUDA's tensor cores), 200 rows of four heads
    for (heads, hd, gh, gw, theta) in
        [(1, 16, 1, 1, 500.0f32), (2, 64, 5, 13, 10000.0), (2, 72, 7, 11, 10000.0), (4, 32, 10, 20, 100.0)]
    {
        out.push(case(
            format!("attention_rope_2d {heads}x{hd} grid {gh}x{gw} θ={theta}"),
            Op::AttentionRope2d,
            REDUCTION,
            vec![randn(&mut r, &[gh * gw, 3 * heads * hd], 1.5)],
            |a| Call::AttentionRope2d { qkv: 0, heads: a.a, grid_w: a.b, theta: a.f },
            Args { a: heads, b: gw, c: 0, f: theta },
        ));
    }
    out
}

/// More shapes for a lane whose kernels tile or chunk differently: reductions longer than one
/// block or tile, attention over several key chunks with an odd head width, i32 concat, and f16
/// weights full of subnormals (the kernel's own integer decode).
fn extra_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0xc0da);
    let mut out = Vec::new();
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        let (n, k, o) = (70, 300, 33);
        let mut c = case(
            format!("linear {format} x[{n},{k}] W[{o},{k}] long k"),
            Op::Linear,
            REDUCTION,
            vec![randn(&mut r, &[n, k], 1.0), randn(&mut r, &[o], 0.5)],
            |_| Call::Linear { x: 0, bias: Some(1) },
            Args::default(),
        );
        c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
        out.push(c);
    }
    {
        // |w| < 2^-14: mostly f16 subnormals (and some zeros of either sign)
        let (n, k, o) = (9, 40, 17);
        let w: Vec<u8> = (0..o * k)
            .flat_map(|i| {
                let v = if i % 11 == 0 { -0.0 } else { r.random_range(-6e-5f32..6e-5) };
                half::f16::from_f32(v).to_le_bytes()
            })
            .collect();
        let mut c = case(
            format!("linear F16 x[{n},{k}] W[{o},{k}] subnormal weights"),
            Op::Linear,
            REDUCTION,
            vec![randn(&mut r, &[n, k], 1000.0)],
            |_| Call::Linear { x: 0, bias: None },
            Args::default(),
        );
        c.weight = Some((WeightFormat::F16, o, k, w));
        out.push(c);
    }
    out.push(case(
        "rms_norm [5,1000]",
        Op::RmsNorm,
        REDUCTION,
        vec![randn(&mut r, &[5, 1000], 2.0), randn(&mut r, &[1000], 1.5)],
        |_| Call::RmsNorm { x: 0, w: 1, eps: 1e-5 },
        Args::default(),
    ));
    out.push(case(
        "attention n=300 2x72",
        Op::Attention,
        REDUCTION,
        vec![randn(&mut r, &[300, 144], 1.5), randn(&mut r, &[300, 144], 1.5), randn(&mut r, &[300, 144], 1.0)],
        |_| Call::Attention { q: 0, k: 1, v: 2, heads: 2 },
        Args::default(),
    ));
    out.push(case(
        "concat_rows i32 [4,3]+[2,3]",
        Op::ConcatRows,
        EXACT,
        vec![ints(&[4, 3], (0..12).collect()), ints(&[2, 3], vec![-1, 7, 9, 100, -5, 3])],
        |_| Call::ConcatRows(0, 1),
        Args::default(),
    ));
    out.push(case(
        "concat_rows [0,5]+[3,5]",
        Op::ConcatRows,
        EXACT,
        vec![HostTensor::f32([0, 5], Vec::new()).unwrap(), randn(&mut r, &[3, 5], 1.0)],
        |_| Call::ConcatRows(0, 1),
        Args::default(),
    ));
    out.push(case(
        "unfold 23x17x5 r=2",
        Op::Unfold,
        EXACT,
        vec![randn(&mut r, &[23 * 17, 5], 1.0)],
        |_| Call::Unfold { x: 0, h: 23, w: 17, r: 2 },
        Args::default(),
    ));
    out
}

fn ints(shape: &[usize], v: Vec<i32>) -> HostTensor {
    HostTensor::i32(shape.to_vec(), v).unwrap()
}

/// The language-model ops the wgpu lane implements (shapes not multiples of any tile size).
fn lm_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0x1a4);
    let mut out = Vec::new();
    // embed_rows: every format; ids include repeats, the last row, and sentinels ≥ vocab.
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        let (vocab, d) = (23, 37);
        let mut c = case(
            format!("embed_rows {format} [{vocab},{d}] sentinels"),
            Op::EmbedRows,
            EXACT,
            vec![ints(&[9], vec![3, 22, 0, 23, 3, 1000, 7, 22, 5])],
            |_| Call::EmbedRows(0),
            Args::default(),
        );
        c.weight = Some((format, vocab, d, weight_bytes(&mut r, format, vocab, d)));
        out.push(c);
    }
    out.push(case(
        "hc_expand [7,19] hc=4",
        Op::HcExpand,
        EXACT,
        vec![randn(&mut r, &[7, 19], 1.0)],
        |_| Call::HcExpand(0, 4),
        Args::default(),
    ));
    for (n, heads, hd) in [(5, 3, 29), (3, 1, 300), (2, 2, 1100)] {
        out.push(case(
            format!("rms_norm_heads [{n},{heads}x{hd}]"),
            Op::RmsNormHeads,
            REDUCTION,
            vec![randn(&mut r, &[n, heads * hd], 3.0)],
            |a| Call::RmsNormHeads { x: 0, heads: a.a, eps: 1e-6 },
            Args { a: heads, ..Default::default() },
        ));
    }
    // weights [n, hc] (the head's), and hc_split's [n, (2+hc)·hc] whose first hc columns are pre
    for wc in [4, 24] {
        out.push(case(
            format!("hc_pre [9,4x21] w [9,{wc}]"),
            Op::HcPre,
            REDUCTION,
            vec![randn(&mut r, &[9, 84], 2.0), randn(&mut r, &[9, wc], 1.0)],
            |_| Call::HcPre { x: 0, w: 1, hc: 4 },
            Args::default(),
        ));
    }
    out.push(case(
        "hc_post [6,4x13]",
        Op::HcPost,
        REDUCTION,
        vec![randn(&mut r, &[6, 52], 2.0), randn(&mut r, &[6, 13], 2.0), randn(&mut r, &[6, 24], 1.5)],
        |_| Call::HcPost { x: 0, f: 1, split: 2 },
        Args::default(),
    ));
    out.push(case(
        "hc_head_weights [11,4]",
        Op::HcHeadWeights,
        ELEMENTWISE,
        vec![randn(&mut r, &[11, 4], 3.0), randn(&mut r, &[1], 2.0), randn(&mut r, &[4], 1.0)],
        |_| Call::HcHeadWeights { mix: 0, scale: 1, base: 2, eps: 1e-6 },
        Args::default(),
    ));
    // wide range: ln1p of tiny eˣ and the linear branch above 20
    out.push(case(
        "sqrt_softplus [13,29]",
        Op::SqrtSoftplus,
        ELEMENTWISE,
        vec![randn(&mut r, &[13, 29], 30.0)],
        |_| Call::SqrtSoftplus(0),
        Args::default(),
    ));
    {
        let (vocab, k, n, e) = (10, 3, 8, 16);
        let table: Vec<i32> = (0..vocab * k).map(|_| r.random_range(0..e as i32)).collect();
        let fallback: Vec<i32> = (0..n * k).map(|_| r.random_range(0..e as i32)).collect();
        out.push(case(
            "hash_route vocab 10 k=3 with image ids",
            Op::HashRoute,
            EXACT,
            vec![ints(&[vocab, k], table), ints(&[n], vec![0, 9, 10, 4, 12345, 9, 3, 10]), ints(&[n, k], fallback)],
            |_| Call::HashRoute { table: 0, ids: 1, fallback: 2 },
            Args::default(),
        ));
    }
    {
        let (n, e, k) = (7, 19, 6);
        let scores = HostTensor::f32([n, e], (0..n * e).map(|_| r.random_range(0.01f32..3.0)).collect()).unwrap();
        let mut ids = Vec::new();
        for _ in 0..n {
            let mut row: Vec<i32> = Vec::new();
            while row.len() < k {
                let x = r.random_range(0..e as i32);
                if !row.contains(&x) {
                    row.push(x);
                }
            }
            ids.extend(row);
        }
        out.push(case(
            "route_weights [7,19] k=6 scale 2.5",
            Op::RouteWeights,
            REDUCTION,
            vec![scores, ints(&[n, k], ids)],
            |_| Call::RouteWeights { scores: 0, ids: 1, scale: 2.5 },
            Args::default(),
        ));
    }
    out.extend(route_cases(&mut r));
    out.push(case(
        "swiglu_clamp [15,23] limit 7",
        Op::SwigluClamp,
        ELEMENTWISE,
        vec![randn(&mut r, &[15, 23], 12.0), randn(&mut r, &[15, 23], 12.0)],
        |_| Call::SwigluClamp(0, 1, 7.0),
        Args::default(),
    ));
    // rope_tail: rd = 2·6 of hd = 22, inv_freq spanning 1 … 1e-4; positions up to ~9000 rad.
    let inv_freq = |r: &mut StdRng| {
        let v: Vec<f32> = (0..6).map(|j| 10000f32.powf(-(j as f32) / 6.0) * r.random_range(0.9f32..1.1)).collect();
        HostTensor::f32([6], v).unwrap()
    };
    for (pos0, stride, inverse) in [(0, 1, false), (8191, 3, true)] {
        out.push(case(
            format!("rope_tail [9,3x22] rd=12 pos {pos0}+{stride}i{}", if inverse { " inverse" } else { "" }),
            Op::RopeTail,
            ELEMENTWISE,
            vec![randn(&mut r, &[9, 66], 1.0), inv_freq(&mut r)],
            |a| Call::RopeTail { x: 0, heads: 3, inv_freq: 1, pos0: a.a, stride: a.b, inverse: a.c == 1 },
            Args { a: pos0, b: stride, c: inverse as usize, f: 0.0 },
        ));
    }
    // rope_tail_at: rows of several sequences at unordered positions (a decode batch), up to ~9000
    // rad as above
    for inverse in [false, true] {
        let positions = vec![8191, 0, 17, 4, 8000, 5, 63, 1, 640];
        out.push(case(
            format!("rope_tail_at [9,3x22] rd=12 scattered positions{}", if inverse { " inverse" } else { "" }),
            Op::RopeTailAt,
            ELEMENTWISE,
            vec![randn(&mut r, &[9, 66], 1.0), inv_freq(&mut r), ints(&[9], positions)],
            |a| Call::RopeTailAt { x: 0, heads: 3, inv_freq: 1, positions: 2, inverse: a.c == 1 },
            Args { c: inverse as usize, ..Default::default() },
        ));
    }
    // hc_split: the model's 4 streams (a decode row, a prefill's), 3 (blocks of 9 threads leave a
    // workgroup's last threads out) and 8 (one block a workgroup); 0 rounds normalise the
    // columns once, as 1 does (the CPU lane's loop).
    for (hc, n, iters) in [(4, 1, 1), (4, 13, 20), (3, 10, 5), (8, 3, 7), (4, 2, 0), (3, 2, 0)] {
        let w = (2 + hc) * hc;
        out.push(case(
            format!("hc_split [{n},{w}] hc={hc} iters {iters}"),
            Op::HcSplit,
            REDUCTION,
            vec![randn(&mut r, &[n, w], 2.0), randn(&mut r, &[3], 1.5), randn(&mut r, &[w], 1.0)],
            |a| Call::HcSplit { mix: 0, scale: 1, base: 2, hc: a.b, iters: a.a, eps: 1e-6 },
            Args { a: iters, b: hc, ..Default::default() },
        ));
    }
    // compress_pool: trailing partial block (T = 4·3 + 2), with and without overlap.
    for (overlap, ratio, d) in [(false, 4, 13), (true, 3, 11)] {
        let (t, w) = (14, if overlap { 2 * d } else { d });
        out.push(case(
            format!("compress_pool T={t} r={ratio} w={w}{}", if overlap { " overlap" } else { "" }),
            Op::CompressPool,
            REDUCTION,
            vec![randn(&mut r, &[t, w], 2.0), randn(&mut r, &[t, w], 3.0), randn(&mut r, &[ratio, w], 1.0)],
            |a| Call::CompressPool { kv: 0, gate: 1, ape: 2, ratio: a.a, overlap: a.b == 1 },
            Args { a: ratio, b: overlap as usize, ..Default::default() },
        ));
    }
    // indexer_scores: queries at 5.., ratio 4 → 1..=4 visible of 5 entries (future ones −inf).
    out.push(case(
        "indexer_scores n=11 m=5 3x17 pos0 5 r=4",
        Op::IndexerScores,
        REDUCTION,
        vec![randn(&mut r, &[11, 51], 1.0), randn(&mut r, &[5, 17], 1.0), randn(&mut r, &[11, 3], 1.0)],
        |_| Call::IndexerScores { q: 0, k: 1, w: 2, heads: 3, scale: 0.37, pos0: 5, ratio: 4 },
        Args::default(),
    ));
    // many query rows (the wgpu lane's tiles of 16 queries × 64 entries): 37 rows (a partial
    // tile), 150 entries, hd 40 (a chunk of 32 dims and part of another), 5 heads; queries at
    // 228.., ratio 4 → 57..=66 visible: the second row tile's last query sees only the first
    // entry of the second column tile (a tile skipped by its first query's count, or by the
    // last's without its own entry, would miss it), the third column tile all in the future.
    out.push(case(
        "indexer_scores n=37 m=150 5x40 pos0 228 r=4",
        Op::IndexerScores,
        REDUCTION,
        vec![randn(&mut r, &[37, 200], 1.0), randn(&mut r, &[150, 40], 1.0), randn(&mut r, &[37, 5], 1.0)],
        |_| Call::IndexerScores { q: 0, k: 1, w: 2, heads: 5, scale: 0.37, pos0: 228, ratio: 4 },
        Args::default(),
    ));
    // few query rows (decode; the wgpu lane's workgroup-an-output kernel): one row, every entry
    // visible; three rows of 70 heads (past one round of 64 threads), the last entries future.
    for (n, m, heads, pos0) in [(1, 9, 3, 40), (3, 9, 70, 30)] {
        out.push(case(
            format!("indexer_scores n={n} m={m} {heads}x17 pos0 {pos0} r=4"),
            Op::IndexerScores,
            REDUCTION,
            vec![randn(&mut r, &[n, heads * 17], 1.0), randn(&mut r, &[m, 17], 1.0), randn(&mut r, &[n, heads], 1.0)],
            |a| Call::IndexerScores { q: 0, k: 1, w: 2, heads: a.a, scale: 0.37, pos0: a.b, ratio: 4 },
            Args { a: heads, b: pos0, ..Default::default() },
        ));
    }
    // topk_rows: ties (quantised values), −inf / NaN entries, rows with fewer than k finite values,
    // m beyond one workgroup pass.
    {
        let (n, m) = (6, 300);
        let mut v: Vec<f32> = (0..n * m).map(|_| (r.random_range(-8i32..8) as f32) * 0.25).collect();
        for (j, x) in v.iter_mut().enumerate() {
            if j % 7 == 3 {
                *x = f32::NEG_INFINITY;
            }
            if j % 53 == 11 {
                *x = f32::NAN;
            }
        }
        // row 5: only 3 finite values
        for (j, x) in v[5 * m..].iter_mut().enumerate() {
            if j > 2 {
                *x = f32::NEG_INFINITY;
            }
        }
        out.push(case(
            "topk_rows [6,300] k=40 ties, -inf, short row",
            Op::TopkRows,
            EXACT,
            vec![HostTensor::f32([n, m], v).unwrap()],
            |_| Call::TopkRows(0, 40),
            Args::default(),
        ));
    }
    // topk_rows over few rows (the wgpu lane ranks each column over several workgroups there):
    // the indexer's k = 512 over 1500 entries with ties, −inf / NaN entries, and a second row
    // with fewer finite values than k
    {
        let (n, m, k) = (2, 1500, 512);
        let mut v: Vec<f32> = (0..n * m).map(|_| (r.random_range(-64i32..64) as f32) / 16.0).collect();
        for (j, x) in v.iter_mut().enumerate() {
            if j % 7 == 3 || (j >= m && j % 3 != 0) {
                *x = f32::NEG_INFINITY;
            }
            if j % 53 == 11 {
                *x = f32::NAN;
            }
        }
        out.push(case(
            format!("topk_rows [{n},{m}] k={k} few rows: ties, -inf, NaN, short row"),
            Op::TopkRows,
            EXACT,
            vec![HostTensor::f32([n, m], v).unwrap()],
            |a| Call::TopkRows(0, a.a),
            Args { a: k, ..Default::default() },
        ));
    }
    // topk_rows past 2048 columns (the CUDA lane's radix select instead of its shared-memory sort):
    // the indexer's k = 512 over 5000 entries, and k past 2048 (the select's chunks of 2048 slots);
    // ties (values in steps of 1/64), −inf / NaN / ±0 entries.
    for (n, m, k) in [(3, 5000, 512), (2, 3000, 2500)] {
        let mut v: Vec<f32> = (0..n * m).map(|_| (r.random_range(-512i32..512) as f32) / 64.0).collect();
        for (j, x) in v.iter_mut().enumerate() {
            if j % 7 == 3 {
                *x = f32::NEG_INFINITY;
            }
            if j % 53 == 11 {
                *x = f32::NAN;
            }
            if j % 89 == 7 {
                *x = -0.0;
            }
            if j % 89 == 8 {
                *x = 0.0;
            }
        }
        out.push(case(
            format!("topk_rows [{n},{m}] k={k} ties, -inf, NaN, -0"),
            Op::TopkRows,
            EXACT,
            vec![HostTensor::f32([n, m], v).unwrap()],
            |a| Call::TopkRows(0, a.a),
            Args { a: k, ..Default::default() },
        ));
    }
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16] {
        out.push(grouped_case(&mut r, format, 9, 3, 21, 5, ""));
    }
    out.push(grouped_case(&mut r, WeightFormat::BF16, 9, 2, 21, 130, " (groups wider than a column tile)"));
    // sink_attention: windows of varying length (one empty), compressed entries with −1 slots
    // and repeats; and a case without compressed entries.
    {
        let (n, hd, m) = (7, 20, 12);
        let window: Vec<i32> =
            (0..n as i32).flat_map(|i| if i == 2 { [5, 4] } else { [(i - 3).max(0), i + 4] }).collect();
        out.push(sink_attention_case(&mut r, (n, 3, hd, m, 5, 4), window, |j| j % 5 == 1, ""));
        let window: Vec<i32> = (0..n as i32).flat_map(|i| [(i - 3).max(0), i + 4]).collect();
        out.push(case(
            format!("sink_attention n={n} 1x{hd} m={m} window only"),
            Op::SinkAttention,
            REDUCTION,
            vec![
                randn(&mut r, &[n, hd], 1.5),
                randn(&mut r, &[m, hd], 1.5),
                ints(&[n, 2], window),
                randn(&mut r, &[1], 2.0),
            ],
            |_| Call::SinkAttention { q: 0, kv: 1, window: 2, comp: None, sinks: 3, heads: 1 },
            Args::default(),
        ));
        // more keys than one tile of the wgpu kernel (1024: its logits are taken again in each
        // pass) and hd past its 64 threads, not a multiple of them
        let m = 1100;
        let window = vec![0, m as i32 - 1, 50, 1000];
        out.push(sink_attention_case(&mut r, (2, 2, 70, m, 9, 40), window, |j| j % 7 == 2, " past one tile"));
        // a decode-like step split over keys (lm.rs): heads past one group of the wgpu part
        // kernel's 8 and not a multiple of it, hd past its 256 threads, windows ending in
        // different parts, the second query's compressed slots in the last part
        let m = 150;
        let window = vec![30, m as i32 - 1, 0, 70];
        out.push(sink_attention_case(&mut r, (2, 11, 272, m, 9, 20), window, |j| j % 6 == 4, " head groups"));
        // a prefill chunk's many queries (CUDA's tensor-core kernel in fast precision takes 264
        // and more blocks, cuda/lm_attention.cu): windows filling up to 128 keys, every fourth
        // slot −1 and all of the first 40 queries' (their compressed chunks skipped), head widths
        // padded to 128 and to 512
        let window = |n: usize, reach: i32| -> Vec<i32> {
            (0..n as i32).flat_map(|i| [(i + reach - 127).max(0), i + reach]).collect()
        };
        let (n, k) = (300, 70);
        let no_slot = move |j: usize| j % 4 == 3 || j < 40 * k;
        out.push(sink_attention_case(&mut r, (n, 3, 40, 400, 30, k), window(n, 99), no_slot, " many queries"));
        out.push(sink_attention_case(
            &mut r,
            (270, 2, 300, 300, 20, 30),
            window(270, 29),
            |j| j % 4 == 3,
            " many queries",
        ));
    }
    // moe_experts: 5 experts (one unused), k = 3 slots, in every format, then gate, up and down
    // each in another; limit cuts some values.
    use WeightFormat::{BF16, F16, F32};
    for formats in [(F32, F32, F32), (F16, F16, F16), (BF16, BF16, BF16), (F32, BF16, F16)] {
        let (n, d, h, e, k) = (6, 19, 13, 5, 3);
        let ids: Vec<i32> = (0..n * k).map(|j| [0, 2, 3, 1, 2, 0, 3, 1, 2][j % 9]).collect();
        let (g, u, o) = formats;
        let name = format!("moe_experts {g}/{u}/{o} n={n} d={d} h={h} {e} experts k={k}");
        out.push(moe_case(&mut r, name, formats, (n, d, h, e, k), ids));
    }
    fused_cases(&mut out);
    out
}

/// The fused ops (a lane's own kernel against the CPU lane's composition of the parts), with
/// their own random stream so that the cases above keep their inputs.
fn fused_cases(out: &mut Vec<Case>) {
    let mut r = StdRng::seed_from_u64(0xf05ed);
    // hc_pre_norm: the head's weights [n, hc] and hc_split's [n, 24]; a row of ≥ 4096 (the
    // 1024-thread blocks of a decode step's residual) whose width is no multiple of 4
    for (n, d, wc) in [(9, 21, 4), (1, 21, 24), (2, 4101, 24)] {
        out.push(case(
            format!("hc_pre_norm [{n},4x{d}] w [{n},{wc}]"),
            Op::HcPreNorm,
            REDUCTION,
            vec![randn(&mut r, &[n, 4 * d], 2.0), randn(&mut r, &[n, wc], 1.0), randn(&mut r, &[d], 1.5)],
            |_| Call::HcPreNorm { x: 0, w: 1, weight: 2, hc: 4 },
            Args::default(),
        ));
    }
    // hc_mix_split: the mix in each float format (f32 products, as the model uploads it), one
    // token and a few, k no multiple of the CUDA lane's column range; Q8_0 and hc = 5 (more mix
    // rows than the CUDA kernel sums) take the lanes' composition
    for (format, n, hc, k) in [
        (WeightFormat::F32, 1, 4, 1100),
        (WeightFormat::F16, 5, 4, 333),
        (WeightFormat::BF16, 3, 4, 700),
        (WeightFormat::Q8_0, 2, 4, 1024),
        (WeightFormat::F32, 2, 5, 96),
    ] {
        let w = (2 + hc) * hc;
        let mut c = case(
            format!("hc_mix_split {format} [{n},{k}] hc={hc}"),
            Op::HcMixSplit,
            REDUCTION,
            vec![randn(&mut r, &[n, k], 2.0), randn(&mut r, &[3], 1.5), randn(&mut r, &[w], 1.0)],
            |a| Call::HcMixSplit { x: 0, scale: 1, base: 2, hc: a.a },
            Args { a: hc, ..Default::default() },
        );
        c.weight = Some((format, w, k, weight_bytes(&mut r, format, w, k)));
        c.exact_weight = true;
        out.push(c);
    }
    // rms_norm_rope: heads without a weight (the queries; a head width whose unrotated part is
    // odd, so the tail's pairs sit at odd columns), and one weighted head wider than a block
    // (the keys, 512 in the released model) at scattered positions up to ~9000 rad
    let inv_freq: Vec<f32> = (0..6).map(|j| 10000f32.powf(-(j as f32) / 6.0) * r.random_range(0.9f32..1.1)).collect();
    let inv_freq = HostTensor::f32([6], inv_freq).unwrap();
    let positions = vec![8191, 0, 17, 4, 8000, 5, 63, 1, 640];
    out.push(case(
        "rms_norm_rope [9,3x23] rd=12 scattered positions",
        Op::RmsNormRope,
        REDUCTION,
        vec![randn(&mut r, &[9, 69], 3.0), inv_freq.clone(), ints(&[9], positions.clone())],
        |_| Call::RmsNormRope { x: 0, weight: None, heads: 3, inv_freq: 1, positions: 2 },
        Args::default(),
    ));
    out.push(case(
        "rms_norm_rope [9,1x520] weighted, rd=12 scattered positions",
        Op::RmsNormRope,
        REDUCTION,
        vec![randn(&mut r, &[9, 520], 3.0), randn(&mut r, &[520], 1.5), inv_freq, ints(&[9], positions)],
        |_| Call::RmsNormRope { x: 0, weight: Some(1), heads: 1, inv_freq: 2, positions: 3 },
        Args::default(),
    ));
    // a segment past 4096 (the hyper-connections' 16 384-wide decode rows): the GPU kernels
    // walk it 4096 elements a step, so the second step and a last group cut mid-way
    out.push(case(
        "rms_norm_heads [2,1x8195]",
        Op::RmsNormHeads,
        REDUCTION,
        vec![randn(&mut r, &[2, 8195], 3.0)],
        |_| Call::RmsNormHeads { x: 0, heads: 1, eps: 1e-6 },
        Args::default(),
    ));
    // sink_attention_rope: a decode-like step split over keys on a GPU (three queries, one
    // without keys: its zeros rotated), heads of 273 dims (the tail's pairs at odd columns) at
    // scattered positions; and a prefill-like chunk of few keys (one part: the composition)
    let inv_freq: Vec<f32> = (0..6).map(|j| 10000f32.powf(-(j as f32) / 6.0) * r.random_range(0.9f32..1.1)).collect();
    let inv_freq = HostTensor::f32([6], inv_freq).unwrap();
    let (m, k) = (150, 20);
    let window = vec![30, m as i32 - 1, 0, 70, 5, 4];
    let mut c = sink_attention_case(&mut r, (3, 11, 273, m, 9, k), window, |j| j % 6 == 4 || j >= 2 * k, "");
    c.tensors.extend([inv_freq.clone(), ints(&[3], vec![8191, 17, 640])]);
    out.push(c);
    let n = 7;
    let window: Vec<i32> = (0..n as i32).flat_map(|i| [(i - 3).max(0), i + 4]).collect();
    let mut c = sink_attention_case(&mut r, (n, 3, 20, 12, 5, 4), window, |j| j % 5 == 1, "");
    c.tensors.extend([inv_freq, ints(&[n], vec![8000, 5, 63, 1, 0, 9, 4095])]);
    out.push(c);
    for c in out.iter_mut().rev().take(2) {
        c.name = c.name.replacen("sink_attention", "sink_attention_rope", 1) + " rd=12";
        c.run = |a| Call::SinkAttentionRope { heads: a.a, inv_freq: 6, positions: 7 };
    }
    // hc_mix_split_pre_norm: the released geometry's decode row (hc 4, d 4 096, an F16 mix) and
    // three rows; a width no multiple of 4 and hc = 5; past a fused kernel's reach: a row wider
    // than 4 096, more rows than a decode step's 8 (format, rows, hc, d)
    let hc_shapes = [
        (WeightFormat::F16, 1, 4, 4096),
        (WeightFormat::F32, 3, 4, 1101),
        (WeightFormat::F32, 2, 5, 21),
        (WeightFormat::BF16, 1, 4, 4101),
        (WeightFormat::F32, 9, 4, 37),
    ];
    for (format, n, hc, d) in hc_shapes {
        let (w, k) = ((2 + hc) * hc, hc * d);
        let mut c = case(
            format!("hc_mix_split_pre_norm {format} [{n},{hc}x{d}]"),
            Op::HcMixSplit,
            REDUCTION,
            vec![
                randn(&mut r, &[n, k], 2.0),
                randn(&mut r, &[3], 1.5),
                randn(&mut r, &[w], 1.0),
                randn(&mut r, &[d], 1.5),
            ],
            |a| Call::HcMixSplitPreNorm { x: 0, scale: 1, base: 2, weight: 3, hc: a.a },
            Args { a: hc, ..Default::default() },
        );
        c.weight = Some((format, w, k, weight_bytes(&mut r, format, w, k)));
        c.exact_weight = true;
        out.push(c);
    }
    // hc_post_mix_split_pre_norm: the same shapes, with a sublayer output and a split to write
    // back first
    for (format, n, hc, d) in hc_shapes {
        let (w, k) = ((2 + hc) * hc, hc * d);
        let mut c = case(
            format!("hc_post_mix_split_pre_norm {format} [{n},{hc}x{d}]"),
            Op::HcPost,
            REDUCTION,
            vec![
                randn(&mut r, &[n, k], 2.0),
                randn(&mut r, &[n, d], 2.0),
                randn(&mut r, &[n, w], 1.5),
                randn(&mut r, &[3], 1.5),
                randn(&mut r, &[w], 1.0),
                randn(&mut r, &[d], 1.5),
            ],
            |a| Call::HcPostMixSplitPreNorm { x: 0, f: 1, split: 2, scale: 3, base: 4, weight: 5, hc: a.a },
            Args { a: hc, ..Default::default() },
        );
        c.weight = Some((format, w, k, weight_bytes(&mut r, format, w, k)));
        c.exact_weight = true;
        out.push(c);
    }
}

/// Weight shapes for a block format: `cols` a whole, odd number of blocks (3) where that stays
/// small, so row padding and blocks straddling words are exercised (MXFP4 rows of 51 bytes …).
fn block_cols(format: WeightFormat) -> usize {
    3 * format.block_elems()
}

/// Every weight op on every block format (tests/common/blocks.rs makes the bytes): linear with
/// and without bias over more than one 64-row/64-column tile, grouped_linear, moe_experts (one
/// format per projection: the format for both, and the published mixes), embed_rows with the
/// sentinel ids, and the aligner's unfold_linear_gelu.
fn block_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0xb10c);
    let mut out = Vec::new();
    for format in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
        let k = block_cols(format);
        for (n, o, bias) in [(5, 67, true), (70, 9, false), (70, 137, true)] {
            let mut c = case(
                format!("linear {format} x[{n},{k}] W[{o},{k}]{}", if bias { " + bias" } else { "" }),
                Op::Linear,
                REDUCTION,
                vec![randn(&mut r, &[n, k], 1.0), randn(&mut r, &[o], 0.5)],
                |a| Call::Linear { x: 0, bias: (a.a == 1).then_some(1) },
                Args { a: bias as usize, ..Default::default() },
            );
            c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
            out.push(c);
        }
        out.push(grouped_case(&mut r, format, 3, 2, format.block_elems(), 5, ""));
        let (vocab, d) = (23, 2 * format.block_elems());
        let mut c = case(
            format!("embed_rows {format} [{vocab},{d}] sentinels"),
            Op::EmbedRows,
            EXACT,
            vec![ints(&[7], vec![3, 22, 5, 23, 3, 1000, 0])],
            |_| Call::EmbedRows(0),
            Args::default(),
        );
        c.weight = Some((format, vocab, d, weight_bytes(&mut r, format, vocab, d)));
        out.push(c);
        // the aligner: r = 2 over a 5×7 grid (padded on one edge), c·r² = one block
        let (h, w, rr, o) = (5, 7, 2, 33);
        let ch = format.block_elems() / (rr * rr);
        let k = ch * rr * rr;
        let mut c = case(
            format!("unfold_linear_gelu {format} {h}x{w}x{ch} r={rr} -> {o}"),
            Op::UnfoldLinearGelu,
            REDUCTION,
            vec![randn(&mut r, &[h * w, ch], 2.0), randn(&mut r, &[o], 0.5)],
            |a| Call::UnfoldLinearGelu { x: 0, h: a.a, w: a.b, r: a.c, bias: Some(1) },
            Args { a: h, b: w, c: rr, f: 0.0 },
        );
        c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
        out.push(c);
    }
    // moe_experts: the projections in the formats the published quants mix (gate and up alike,
    // down another), gate and up in different formats (the unsloth mixes: IQ1_S gate with IQ1_M
    // up; block sizes of 256 and 32; a float and a block format), then every format for all three.
    use WeightFormat::*;
    let mixes = [
        (IQ2_XXS, IQ2_XXS, Q2_K),
        (MXFP4, MXFP4, MXFP4),
        (IQ1_M, IQ1_M, IQ2_XS),
        (FP8_E4M3_B128_E8M0, FP8_E4M3_B128_E8M0, Q8_0),
        (IQ1_S, IQ1_M, Q2_K),
        (Q4_K, Q8_0, Q6_K),
        (F16, IQ3_XXS, BF16),
    ]
    .into_iter()
    .chain(WeightFormat::ALL.into_iter().filter(|f| f.is_block()).map(|f| (f, f, f)));
    for (g, u, o) in mixes {
        let (n, e, k) = (6, 5, 3);
        let d = [g, u, o].iter().map(|f| f.block_elems()).max().unwrap_or(1);
        let ids: Vec<i32> = (0..n * k).map(|j| [0, 2, 3, 1, 2, 0, 3, 1, 2][j % 9]).collect();
        let name = format!("moe_experts {g}/{u}/{o} n={n} d={d} h={d} {e} experts k={k}");
        out.push(moe_case(&mut r, name, (g, u, o), (n, d, d, e, k), ids));
    }
    out
}

/// A `moe_experts` case: x `[n, d]`, `e` experts with the gate w1 `[h, d]` in `formats.0`, the up
/// w3 `[h, d]` in `formats.1` and the down w2 `[d, h]` in `formats.2`, top-`k` ids as given.
fn moe_case(
    r: &mut StdRng,
    name: String,
    formats: (WeightFormat, WeightFormat, WeightFormat),
    (n, d, h, e, k): (usize, usize, usize, usize, usize),
    ids: Vec<i32>,
) -> Case {
    let (gate, up, down) = formats;
    let mut c = case(
        name,
        Op::MoeExperts,
        REDUCTION,
        vec![randn(r, &[n, d], 3.0), ints(&[n, k], ids), randn(r, &[n, k], 1.0)],
        |_| Call::MoeExperts { x: 0, ids: 1, weights: 2, limit: 0.8 },
        Args::default(),
    );
    for (format, rows, cols) in [(gate, h, d), (up, h, d), (down, d, h)] {
        for _ in 0..e {
            c.experts.push((format, rows, cols, weight_bytes(r, format, rows, cols)));
        }
    }
    c
}

/// The small-row path (at most 8 rows of x, tokens for the experts: decode) and the tile path
/// just past it, in every weight format: linear (with bias at odd n), grouped_linear and
/// moe_experts at 1, 2, 3, 7, 8 and 9 rows; k and the column counts odd for the float formats (a
/// block-format row is whole blocks: 3 of them, so rows straddle words). Token t routes its 3
/// slots to experts t, t + 2 and t (mod 4): two distinct experts, one of them twice. Then per
/// format one experts case at 8 tokens over 2 experts, 12 slots each, so an expert sees more than
/// 8 slots (the wgpu small-row path's second batch; 8 tokens with distinct ids never reach it);
/// drawn after the others, so theirs keep their random inputs. Each experts case comes twice: as
/// the model uploads them (on the wgpu lane one dispatch a projection, the experts read from the
/// ids on the device, one token's gate and up in one on int8 activations) and one by one (a
/// dispatch triple an expert); one token's also a third time, a projection at a time (its gate
/// and up a dispatch each).
fn small_row_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0x6e3f);
    let mut out = Vec::new();
    for format in WeightFormat::ALL {
        let (k, h) = if format.is_block() { (block_cols(format), format.block_elems()) } else { (77, 13) };
        for n in [1, 2, 3, 7, 8, 9] {
            out.push(linear_case(&mut r, format, n, k, 67, " small rows"));
            out.push(grouped_case(&mut r, format, n, 2, k, 5, " small rows"));
            let (e, topk) = (4, 3);
            let ids: Vec<i32> = (0..n * topk).map(|j| ((j / topk + 2 * (j % topk)) % e) as i32).collect();
            let name = format!("moe_experts {format} n={n} d={k} h={h} {e} experts k={topk} small rows");
            let c = moe_case(&mut r, name, (format, format, format), (n, k, h, e, topk), ids);
            out.push(Case { name: format!("{} one by one", c.name), upload: ExpertUpload::OneByOne, ..c.clone() });
            if n == 1 {
                let name = format!("{} projections apart", c.name);
                out.push(Case { name, upload: ExpertUpload::Projections, ..c.clone() });
            }
            out.push(c);
        }
    }
    for format in WeightFormat::ALL {
        let (k, h) = if format.is_block() { (block_cols(format), format.block_elems()) } else { (77, 13) };
        let (n, e, topk) = (8, 2, 3);
        let ids: Vec<i32> = (0..n * topk).map(|j| (j % e) as i32).collect();
        let name = format!("moe_experts {format} n={n} d={k} h={h} {e} experts k={topk} 12 slots an expert");
        let c = moe_case(&mut r, name, (format, format, format), (n, k, h, e, topk), ids);
        out.push(Case { name: format!("{} one by one", c.name), upload: ExpertUpload::OneByOne, ..c.clone() });
        out.push(c);
    }
    // past the small rows, experts with no slot between ones with several (the wgpu lane then
    // tiles each expert's own slots only: in one dispatch a projection when the experts were
    // uploaded together, a dispatch an expert one by one)
    for format in [WeightFormat::F32, WeightFormat::Q8_0, WeightFormat::IQ2_XXS] {
        let (k, h) = if format.is_block() { (block_cols(format), format.block_elems()) } else { (77, 13) };
        let (n, e, topk) = (11, 7, 3);
        let ids: Vec<i32> = (0..n * topk).map(|j| [5, 0, 2, 5, 2, 0, 6, 5][j % 8]).collect();
        let name = format!("moe_experts {format} n={n} d={k} h={h} {e} experts k={topk} experts 1, 3, 4 unused");
        let c = moe_case(&mut r, name, (format, format, format), (n, k, h, e, topk), ids);
        out.push(Case { name: format!("{} one by one", c.name), upload: ExpertUpload::OneByOne, ..c.clone() });
        out.push(c);
    }
    // an expert's rows past one 64-row tile, the second expert's run starting inside a tile (the
    // wgpu lane's tiles over each expert's rows of x gathered in expert order; both ways)
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::Q4_K] {
        let (k, h) = if format.is_block() { (block_cols(format), format.block_elems()) } else { (77, 13) };
        let (n, e, topk) = (50, 3, 2);
        let ids: Vec<i32> = (0..n * topk).map(|j| [2, 0, 2][j % 3]).collect();
        let name = format!("moe_experts {format} n={n} d={k} h={h} {e} experts k={topk} 33 and 67 slots");
        let c = moe_case(&mut r, name, (format, format, format), (n, k, h, e, topk), ids);
        out.push(Case { name: format!("{} one by one", c.name), upload: ExpertUpload::OneByOne, ..c.clone() });
        out.push(c);
    }
    // few columns over long rows, which the wgpu lane's small-row linear splits over k (slices of
    // a multiple of 256 elements summed in a second dispatch): 24 columns of 4096 (the model's
    // hyper-connection mixes are 24 of 16 384) in every format, and of 2100 (slices of 768, the
    // last one short) in the float formats, 3 rows with a bias
    for format in WeightFormat::ALL {
        out.push(linear_case(&mut r, format, 1, 4096, 24, " (k split)"));
        if !format.is_block() {
            out.push(linear_case(&mut r, format, 3, 2100, 24, " (k split)"));
        }
    }
    out
}

/// The CUDA lane's GEMM paths that `block_cases` leaves out, in block formats: linear over 1030
/// columns (the small-row path at a width `block_cases` does not reach; it has the tile), the
/// experts' small-row path (2 tokens, 6 slots), every format for both; and the small-row path's
/// long rows (and its k split).
fn cuda_block_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0xc0da);
    let mut out = Vec::new();
    for format in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
        let (n, o, k) = (3, 1030, block_cols(format));
        let mut c = case(
            format!("linear {format} x[{n},{k}] W[{o},{k}] + bias"),
            Op::Linear,
            REDUCTION,
            vec![randn(&mut r, &[n, k], 1.0), randn(&mut r, &[o], 0.5)],
            |_| Call::Linear { x: 0, bias: Some(1) },
            Args::default(),
        );
        c.weight = Some((format, o, k, weight_bytes(&mut r, format, o, k)));
        out.push(c);
        let (n, e, k) = (2, 4, 3);
        let d = format.block_elems();
        let h = 2 * d;
        let ids: Vec<i32> = (0..n * k).map(|j| [3, 0, 2, 0, 1, 3][j % 6]).collect();
        let name = format!("moe_experts {format} n={n} d={d} h={h} {e} experts k={k} (small-row path)");
        out.push(moe_case(&mut r, name, (format, format, format), (n, d, h, e, k), ids));
    }
    // one token over 8 experts (6 slots) at a width of several warps' columns and groups, in the
    // formats with the CUDA lane's q8x kernels (fast precision), and with gate/up/down mixed as
    // the Q2-class quants mix them
    use WeightFormat::{IQ2_XXS, MXFP4, Q2_K, Q8_0};
    // (and with a projection in a format without them between two with: each takes its own path)
    use WeightFormat::{IQ2_XS, Q4_K};
    let mixes = [
        (Q8_0, Q8_0, Q8_0),
        (MXFP4, MXFP4, MXFP4),
        (Q2_K, Q2_K, Q2_K),
        (IQ2_XXS, IQ2_XXS, IQ2_XXS),
        (IQ2_XXS, IQ2_XXS, Q2_K),
        (IQ2_XXS, IQ2_XS, Q2_K),
        (Q4_K, Q8_0, Q4_K),
    ];
    for formats in mixes {
        let (n, d, h, e, k) = (1, 1024, 768, 8, 6);
        let ids = vec![5, 0, 7, 2, 6, 3];
        let name = format!(
            "moe_experts {}/{}/{} n={n} d={d} h={h} {e} experts k={k} (one token)",
            formats.0, formats.1, formats.2
        );
        out.push(moe_case(&mut r, name, formats, (n, d, h, e, k), ids));
    }
    // gate and up in different formats on the small-row path too
    use WeightFormat::{IQ1_M, IQ1_S};
    let ids: Vec<i32> = (0..6).map(|j| [3, 0, 2, 0, 1, 3][j % 6]).collect();
    let name = "moe_experts IQ1_S/IQ1_M/Q8_0 n=2 d=256 h=512 4 experts k=3 (small-row path)".to_string();
    out.push(moe_case(&mut r, name, (IQ1_S, IQ1_M, Q8_0), (2, 256, 512, 4, 3), ids));
    // Long rows on the small-row path (drawn after the cases above, which keep their inputs):
    // 24 columns of 4096, which it splits over k (4 ranges and a sum), in every format; and 1056
    // columns (unsplit) of 4096 and 2048, several runs a thread.
    for format in WeightFormat::ALL {
        out.push(linear_case(&mut r, format, 1, 4096, 24, " (k split)"));
    }
    for format in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
        out.push(linear_case(&mut r, format, 2, 4096, 1056, " (long rows)"));
        out.push(linear_case(&mut r, format, 3, 2048, 1056, " (long rows)"));
    }
    // one token against a wide weight (with its bias), in every block format: the CUDA lane's
    // q8x linears in fast precision where the format has them, the small-row path elsewhere
    for format in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
        out.push(linear_case(&mut r, format, 1, 512, 8192, " (one token, wide)"));
    }
    out
}

/// linear_pair: two weights of one input in every format, one row and three (the CUDA lane's one
/// launch: 40 and 23 columns, the last pair's second missing), nine rows (past the small-row path:
/// two linears), and Wa and Wb in different formats (two linears).
fn linear_pair_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0x9a12);
    let mut out = Vec::new();
    let pair_formats = WeightFormat::ALL.map(|f| (f, f)).into_iter().chain([(WeightFormat::Q8_0, WeightFormat::F16)]);
    for (fa, fb) in pair_formats {
        let k = if fa.is_block() || fb.is_block() { fa.block_elems().max(fb.block_elems()) * 2 } else { 77 };
        for n in [1, 3, 9] {
            let mut c = case(
                format!("linear_pair {fa}|{fb} x[{n},{k}] W[40|23]"),
                Op::Linear,
                REDUCTION,
                vec![randn(&mut r, &[n, k], 1.0)],
                |_| Call::LinearPair(0),
                Args::default(),
            );
            c.experts.push((fa, 40, k, weight_bytes(&mut r, fa, 40, k)));
            c.experts.push((fb, 23, k, weight_bytes(&mut r, fb, 23, k)));
            out.push(c);
        }
    }
    out
}

/// shared_expert: the shared expert's gate and up (a pair), clamped SwiGLU, down projection and
/// the routed sum, in a float and two block formats, one row (the wgpu lane: the SwiGLU in the
/// pair's dispatch, routed as the down's bias) and three (the SwiGLU fused, the sum composed), and
/// an odd hidden width (no pair dispatch: composed); gate and up values past the clamp (limit 2)
/// both ways.
fn shared_expert_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0x5e2d);
    let mut out = Vec::new();
    use WeightFormat::{F32, Q2_K, Q8_0};
    for (format, n, h) in
        [(F32, 1, 40), (F32, 3, 40), (F32, 1, 41), (Q8_0, 1, 64), (Q8_0, 3, 64), (Q2_K, 1, 512), (Q2_K, 3, 512)]
    {
        let d = if format.is_block() { h } else { 77 };
        let mut c = case(
            format!("shared_expert {format} x[{n},{d}] w1,w3[{h},{d}] w2[{d},{h}]"),
            Op::Linear,
            REDUCTION,
            vec![randn(&mut r, &[n, d], 1.0), randn(&mut r, &[n, d], 1.0)],
            |_| Call::SharedExpert { x: 0, routed: 1, limit: 2.0 },
            Args::default(),
        );
        c.experts.push((format, h, d, weight_bytes(&mut r, format, h, d)));
        c.experts.push((format, h, d, weight_bytes(&mut r, format, h, d)));
        c.experts.push((format, d, h, weight_bytes(&mut r, format, d, h)));
        out.push(c);
    }
    out
}

/// The tile path's k split (CUDA: a grid of one block, 21 rows x 24 columns of 4096 with a bias,
/// split in 4 ranges over grid z and summed, as a prefill chunk's hyper-connection mix is), in
/// every format.
fn tile_split_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0x5b17);
    WeightFormat::ALL.into_iter().map(|format| linear_case(&mut r, format, 21, 4096, 24, " (tile, k split)")).collect()
}

/// Block-format weights over many row chunks (run with a 1 KiB binding cap; x stays under it):
/// linear and embed_rows in every block format.
fn block_chunked_cases() -> Vec<Case> {
    let mut r = StdRng::seed_from_u64(0xb1c4);
    let mut out = Vec::new();
    for format in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
        let k = if format.block_elems() == 32 { 96 } else { format.block_elems() };
        let (n, o) = (1, 45);
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
        let vocab = 40;
        // The output [ids, k] f32 must fit the 1 KiB cap too: one id for the 256-value formats.
        let ids: Vec<i32> = if 2 * k * 4 <= 1024 { vec![39, 17] } else { vec![39] };
        let mut c = case(
            format!("embed_rows {format} [{vocab},{k}] chunked"),
            Op::EmbedRows,
            EXACT,
            vec![ints(&[ids.len()], ids)],
            |_| Call::EmbedRows(0),
            Args::default(),
        );
        c.weight = Some((format, vocab, k, weight_bytes(&mut r, format, vocab, k)));
        out.push(c);
    }
    out
}

/// route_experts: the full-size router (e 256, k 6) with text and image rows (bias / bias_vl),
/// a NaN and a −inf logit; the vl-scenes hash layer (e 8, k 2) with image tokens; quantised
/// logits and bias (ties); k = e; n = 1 and n = 0. Tensors: logits, bias `[2, e]`, kind, then
/// the hash table and token ids; `a` = 1 on hash layers, `b` = k.
fn route_cases(r: &mut StdRng) -> Vec<Case> {
    let vocab = 10;
    let mut out = Vec::new();
    for (n, e, k, hashed, ties) in
        [(9, 256, 6, false, false), (9, 8, 2, true, false), (7, 256, 6, false, true), (5, 8, 8, false, false)]
            .into_iter()
            .chain([(6, 64, 4, true, true), (1, 5, 3, false, false), (0, 8, 2, true, false)])
    {
        let mut logits: Vec<f32> = (0..n * e)
            .map(|_| if ties { (r.random_range(-8i32..8) as f32) * 0.5 } else { r.random_range(-6f32..6.0) })
            .collect();
        if n > 1 && k < e {
            // a NaN is never picked (k < e: the row keeps k candidates); −inf scores 0 and stays one
            logits[e + 1] = f32::NAN;
            logits[e + 2] = f32::NEG_INFINITY;
        }
        // hash layers: the text bias is zeros (the table decides), bias_vl selects image rows
        let bias: Vec<f32> = (0..2 * e)
            .map(|j| match (hashed && j < e, ties) {
                (true, _) => 0.0,
                (false, true) => (r.random_range(0..2) as f32) * 0.5,
                (false, false) => r.random_range(-0.3f32..0.3),
            })
            .collect();
        // every third token is an image token: kind 1, an id ≥ vocab (a vision sentinel)
        let kind: Vec<i32> = (0..n).map(|i| i32::from(i % 3 == 1)).collect();
        let tok: Vec<i32> =
            (0..n).map(|i| if i % 3 == 1 { (vocab + i) as i32 } else { r.random_range(0..vocab as i32) }).collect();
        let table: Vec<i32> = (0..vocab * k).map(|_| r.random_range(0..e as i32)).collect();
        out.push(case(
            format!(
                "route_experts [{n},{e}] k={k}{}{}",
                if hashed { " hash" } else { "" },
                if ties { " ties" } else { "" }
            ),
            Op::RouteExperts,
            REDUCTION,
            vec![
                HostTensor::f32([n, e], logits).unwrap(),
                HostTensor::f32([2, e], bias).unwrap(),
                ints(&[n], kind),
                ints(&[vocab, k], table),
                ints(&[n], tok),
            ],
            |a| Call::RouteExperts {
                logits: 0,
                bias: 1,
                kind: 2,
                hash: (a.a == 1).then_some((3, 4)),
                k: a.b,
                scale: a.f,
            },
            Args { a: hashed as usize, b: k, c: 0, f: 1.5 },
        ));
    }
    out
}

/// grouped_linear: x `[n, g·k]`, W `[g·r, k]` in `format`.
/// linear over x `[n, k]` and a weight `[o, k]` in `format`, with a bias at odd n.
fn linear_case(r: &mut StdRng, format: WeightFormat, n: usize, k: usize, o: usize, tag: &str) -> Case {
    let mut c = case(
        format!("linear {format} x[{n},{k}] W[{o},{k}]{tag}"),
        Op::Linear,
        REDUCTION,
        vec![randn(r, &[n, k], 1.0), randn(r, &[o], 0.5)],
        // a = 1: with bias (odd n), a = 0: without.
        |a| Call::Linear { x: 0, bias: (a.a == 1).then_some(1) },
        Args { a: n % 2, ..Default::default() },
    );
    c.weight = Some((format, o, k, weight_bytes(r, format, o, k)));
    c
}

fn grouped_case(r: &mut StdRng, format: WeightFormat, n: usize, g: usize, k: usize, rr: usize, tag: &str) -> Case {
    let mut c = case(
        format!("grouped_linear {format} x[{n},{g}x{k}] W[{g}x{rr},{k}]{tag}"),
        Op::GroupedLinear,
        REDUCTION,
        vec![randn(r, &[n, g * k], 1.0)],
        |a| Call::GroupedLinear(0, a.a),
        Args { a: g, ..Default::default() },
    );
    c.weight = Some((format, g * rr, k, weight_bytes(r, format, g * rr, k)));
    c
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
        // LM ops with a weight operand, over many row chunks (activations stay under the 1 KiB cap)
        out.push(grouped_case(&mut r, format, 2, 4, 30, 11, " chunked"));
        let (vocab, d) = (40, 60);
        let mut c = case(
            format!("embed_rows {format} [{vocab},{d}] chunked"),
            Op::EmbedRows,
            EXACT,
            vec![ints(&[4], vec![39, 40, 17, 2])],
            |_| Call::EmbedRows(0),
            Args::default(),
        );
        c.weight = Some((format, vocab, d, weight_bytes(&mut r, format, vocab, d)));
        out.push(c);
    }
    // grouped_linear past the small rows: linear's tiles a group at a time, the second group's
    // weight rows (13..26) over two chunks (21 f32 rows of 12 a chunk)
    out.push(grouped_case(&mut r, WeightFormat::F32, 9, 2, 12, 13, " chunked, a group over two chunks"));
    out
}

/// One output against the CPU lane's: index outputs exact, f32 within `bound` (NMSE).
fn compare_output(got: &HostTensor, want: &HostTensor, bound: f64, name: &str) -> Result<(), String> {
    if got.shape != want.shape {
        return Err(format!("{name}: shape {:?} vs cpu {:?}", got.shape, want.shape));
    }
    if let (HostData::I32(g), HostData::I32(w)) = (&got.data, &want.data) {
        // index outputs are exact
        let diff = g.iter().zip(w).filter(|(a, b)| a != b).count();
        eprintln!("{name:<44} {diff} index(es) differ");
        if diff != 0 {
            return Err(format!("{name}: {diff} index(es) differ: {g:?} vs cpu {w:?}"));
        }
        return Ok(());
    }
    let (Some(g), Some(w)) = (got.as_f32(), want.as_f32()) else {
        return Err(format!("{name}: dtype {} vs cpu {}", got.dtype(), want.dtype()));
    };
    // Non-finite values only where the reference has the same one (−inf masks); NMSE over the rest.
    if let Some(i) = (0..g.len()).find(|&i| !g[i].is_finite() && g[i].to_bits() != w[i].to_bits()) {
        return Err(format!("{name}: non-finite value {} at {i} (cpu {})", g[i], w[i]));
    }
    if let Some(i) = (0..g.len()).find(|&i| !w[i].is_finite() && g[i].to_bits() != w[i].to_bits()) {
        return Err(format!("{name}: {} at {i} where cpu has {}", g[i], w[i]));
    }
    let keep: Vec<usize> = (0..g.len()).filter(|&i| w[i].is_finite()).collect();
    let (g, w): (Vec<f32>, Vec<f32>) = keep.iter().map(|&i| (g[i], w[i])).unzip();
    let e = nmse(&g, &w);
    eprintln!("{name:<44} nmse {e:.2e} (bound {bound:.0e})");
    if !(e <= bound) {
        return Err(format!("{name}: nmse {e:.3e} > {bound:.0e}"));
    }
    Ok(())
}

fn compare_with_cpu<L: LaneUnderTest>(lane: &L, cases: Vec<Case>) -> std::collections::HashSet<Op> {
    compare_with_cpu_on(lane, cases, |c| Cow::Borrowed(c))
}

/// [`compare_with_cpu`] with the CPU lane given `reference(case)` instead of the case itself.
fn compare_with_cpu_on<L: LaneUnderTest>(
    lane: &L,
    cases: Vec<Case>,
    reference: impl Fn(&Case) -> Cow<'_, Case>,
) -> std::collections::HashSet<Op> {
    let cpu = CpuBackend::new();
    let mut covered = std::collections::HashSet::new();
    let mut failures = Vec::new();
    for c in cases {
        covered.insert(c.op);
        let wants = execute(&cpu, &reference(&c)).unwrap();
        let gots = match execute(lane, &c) {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{}: {e}", c.name));
                continue;
            }
        };
        for (o, (got_t, want_t)) in gots.iter().zip(&wants).enumerate() {
            let name = if wants.len() > 1 { format!("{} #{o}", c.name) } else { c.name.clone() };
            let want = cpu.download(want_t).unwrap();
            if let Err(e) = lane.check_output(got_t) {
                failures.push(format!("{name}: {e}"));
            }
            if let Err(e) = compare_output(&lane.download(got_t).unwrap(), &want, c.bound, &name) {
                failures.push(e);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed on the {} lane:\n{}",
        failures.len(),
        lane.lane(),
        failures.join("\n")
    );
    covered
}

/// The wgpu tests hold this while they run: a device is never created while another test works
/// on one (the NVIDIA Vulkan driver was seen to deadlock on that).
static WGPU_DEVICES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn wgpu_alone() -> std::sync::MutexGuard<'static, ()> {
    WGPU_DEVICES.lock().unwrap_or_else(|e| e.into_inner())
}

/// One test for both devices, so the second is never created while the first works.
#[test]
fn wgpu_ops_match_cpu() {
    let _alone = wgpu_alone();
    let Some(lane) = common::wgpu_lane(Options { guard_words: 8, ..Options::default() }) else { return };
    let mut all = cases();
    all.extend(lm_cases());
    all.extend(block_cases());
    all.extend(small_row_cases());
    all.extend(tile_split_cases());
    all.extend(linear_pair_cases());
    all.extend(shared_expert_cases());
    eprintln!("small-row reduction on {}: {:?}", lane.adapter_info().name, lane.reduction());
    let covered = compare_with_cpu(&lane, all);
    let missing: Vec<_> = Op::VISION.iter().filter(|op| !covered.contains(op)).map(|op| op.name()).collect();
    assert!(missing.is_empty(), "ops without a harness case: {missing:?}");
    // Every language-model op the lane claims must be compared with the CPU lane here.
    let missing: Vec<_> = Op::LM
        .iter()
        .filter(|op| lane.supports(**op, WeightFormat::F32) && !covered.contains(op))
        .map(|op| op.name())
        .collect();
    assert!(missing.is_empty(), "LM ops the wgpu lane supports without a harness case: {missing:?}");
    drop(lane);

    // A 1 KiB binding cap splits every weight into many row chunks; f16 via the integer decode.
    let opts =
        Options { guard_words: 8, max_binding_bytes: Some(1024), force_f16_fallback: true, ..Options::default() };
    let Some(lane) = common::wgpu_lane(opts) else { return };
    let mut chunked = chunked_linear_cases();
    chunked.extend(block_chunked_cases());
    compare_with_cpu(&lane, chunked);
}

/// The cases of the ops with a weight operand (every float and block format): the only ops whose
/// wgpu kernels have a fast build (the others have one build, the exact one, in both precisions).
fn weight_op_cases() -> Vec<Case> {
    cases()
        .into_iter()
        .chain(lm_cases())
        .chain(block_cases())
        .chain(small_row_cases())
        .chain(tile_split_cases())
        .chain(linear_pair_cases())
        .chain(shared_expert_cases())
        .filter(|c| c.weight.is_some() || !c.experts.is_empty())
        .collect()
}

/// The small-row kernels' reduction through workgroup memory, which a device with SUBGROUP
/// (lavapipe too) does not run otherwise (`Options::force_workgroup_reduction`): every small-row
/// case in exact precision with f16 by the integer decode, then in fast precision.
#[test]
fn wgpu_small_rows_match_cpu_with_workgroup_reduction() {
    let _alone = wgpu_alone();
    let forced = Options { guard_words: 8, force_workgroup_reduction: true, ..Options::default() };
    let Some(lane) = common::wgpu_lane(Options { force_f16_fallback: true, ..forced.clone() }) else { return };
    assert_eq!(lane.reduction(), Reduction::Workgroup);
    compare_with_cpu(&lane, small_row_cases());
    drop(lane);
    let Some(lane) = common::wgpu_lane(Options { precision: Precision::Fast, ..forced }) else { return };
    compare_with_cpu(&lane, with_wgpu_fast_bounds(small_row_cases()));
}

/// sink_attention in the GPUs' workgroup kernels, which a software adapter (lavapipe) does not run
/// otherwise (`Options::force_workgroup_attention`; it takes one thread per head there where that
/// fits): every sink_attention case, with the keys of few (query, head) pairs split into parts
/// (the cases past 32 keys: lm.rs), with `split_attention_keys` off (a workgroup per query's head
/// group, `sink_attention_heads`), and off with `per_pair_attention` (a workgroup per (query,
/// head): what lavapipe runs past the serial kernel's budget).
#[test]
fn wgpu_sink_attention_in_workgroups_matches_cpu() {
    let _alone = wgpu_alone();
    for (split_attention_keys, per_pair_attention) in [(true, false), (false, false), (false, true)] {
        let opts = Options {
            guard_words: 8,
            force_workgroup_attention: true,
            split_attention_keys,
            per_pair_attention,
            ..Options::default()
        };
        let Some(lane) = common::wgpu_lane(opts) else { return };
        let cases: Vec<Case> = lm_cases().into_iter().filter(|c| c.op == Op::SinkAttention).collect();
        assert!(cases.len() >= 3, "the sink_attention cases: {}", cases.len());
        compare_with_cpu(&lane, cases);
    }
}

/// The indexer's scores a thread per score (`Options::indexer_tiles` off), the kernel a software
/// adapter keeps where the tiles' loops pass its budget (the model's sizes): every
/// indexer_scores case.
#[test]
fn wgpu_indexer_scores_per_score_matches_cpu() {
    let _alone = wgpu_alone();
    let Some(lane) = common::wgpu_lane(Options { guard_words: 8, indexer_tiles: false, ..Options::default() }) else {
        return;
    };
    let cases: Vec<Case> = lm_cases().into_iter().filter(|c| c.op == Op::IndexerScores).collect();
    assert!(cases.len() >= 4, "the indexer_scores cases: {}", cases.len());
    compare_with_cpu(&lane, cases);
}

/// The wgpu lane in fast precision: the GEMM ops at fast precision's bounds (`with_fast_bounds`),
/// embed_rows (a lookup, not a product) still exact, and every linear case again with its weight
/// uploaded by `upload_weight_exact` (the router, the hyper-connection mixes) at the exact bound.
#[test]
fn wgpu_ops_match_cpu_in_fast_precision() {
    let _alone = wgpu_alone();
    let opts = Options { guard_words: 8, precision: Precision::Fast, ..Options::default() };
    let Some(lane) = common::wgpu_lane(opts) else { return };
    let mut all = with_wgpu_fast_bounds(weight_op_cases());
    all.extend(cases().into_iter().filter(|c| c.op == Op::Linear).map(|c| Case {
        name: format!("{} exact weight", c.name),
        exact_weight: true,
        ..c
    }));
    compare_with_cpu(&lane, all);
}

/// Fast precision is the f32 GEMM of operands rounded once to the nearest f16 (ties to even: the
/// CUDA lane's `cvt.rn`), nothing else: the wgpu lane's fast linear, aligner GEMM and grouped
/// projection (every float and block format) against the CPU lane given the same inputs with the
/// operand and the decoded weight rounded on the host (`half::f16::from_f32`, ties to even). The
/// product of two f16 values is exact in f32, so the two differ only in summation order: the
/// exact bounds apply (REDUCTION, 1e-10). Against this reference, f32 operands (fast mode
/// silently exact) are off by ≈ FAST_GEMM_NMSE = 8e-8, bf16 operands by ≈ 5e-6, and rounding
/// toward zero biases every product (NMSE ≳ 1e-7): each fails here by decades, where the fast
/// bounds of `wgpu_ops_match_cpu_in_fast_precision` would let the first pass.
/// The small-row products (at most 8 rows of x: decode) are f32 products in both precisions by
/// design (`rows_shader`: bound by memory, not arithmetic): the second half holds every small-row
/// case in fast precision to its exact bound against the unrounded reference, which rounding the
/// operands there (≈ FAST_GEMM_NMSE) would fail — but one token's experts on int8 activations
/// (`wgpu_q8x_case`), which `wgpu_int8_gemvs_are_f32_gemvs_of_int8_rounded_activations` holds.
#[test]
fn wgpu_fast_gemms_are_f32_gemms_of_f16_rounded_operands() {
    let _alone = wgpu_alone();
    let opts = Options { guard_words: 8, precision: Precision::Fast, ..Options::default() };
    let Some(lane) = common::wgpu_lane(opts) else { return };
    let gemms: Vec<Case> = weight_op_cases()
        .into_iter()
        .filter(|c| match c.op {
            // the unfolded rows: a.a × a.b patches in cells of a.c × a.c
            Op::UnfoldLinearGelu => c.args.a.div_ceil(c.args.c) * c.args.b.div_ceil(c.args.c) > SMALL_ROWS,
            // (linear_pair's cases carry two weights: not this single-operand rounding)
            Op::Linear | Op::GroupedLinear => c.weight.is_some() && c.tensors[0].shape[0] > SMALL_ROWS,
            _ => false,
        })
        .collect();
    assert!(gemms.len() >= 3 * 15, "every block format's linear, grouped and aligner case: {}", gemms.len());
    compare_with_cpu_on(&lane, gemms, |c| Cow::Owned(with_f16_operands(c)));
    let small: Vec<Case> =
        small_row_cases().into_iter().filter(|c| c.tensors[0].shape[0] <= SMALL_ROWS && !wgpu_q8x_case(c)).collect();
    compare_with_cpu(&lane, small);
}

/// One token's GEMVs on int8 activations (wgpu, fast precision, dequant/q8x.wgsl) are the f32
/// GEMVs of the token's row rounded as ggml's q8_1 rounds it (`int8_rounded`): against the CPU
/// lane given the rounded row, the two differ by summation order and by where the block scales
/// multiply (once a group on the device, each value on the CPU), so the exact bound REDUCTION
/// holds; against it, the unrounded row (the int8 path silently skipped) is off by ≈ 2e-6 to
/// 9e-5 and a rounding toward zero by ≈ 1e-4, decades past it. The rows are drawn so that the
/// rounding is not a near thing (`int8_clear_row`): a driver's division may be a few ulp off
/// (Vulkan allows 2.5), which would move a value lying near half a step to the other side.
/// - The linear (the lane set to take it from 1 column: `q8x_linear_min_cols`), with a bias and
///   without, over 67 columns (a workgroup's 32, 64 or 128 columns cut short) and, with a 4 KiB binding cap,
///   over 200 columns in row chunks (each dispatch's columns from its chunk's first).
/// - The experts: gate and up in a q8x format, the down in Q4_K (f32 small rows: its input, hid,
///   is the device's own, which the host cannot round alike); then the down in the same format
///   too, at FAST_MOE_Q8X, on Gaussian rows.
/// Rows of 3 or 24 groups (teams of 8, fewer groups than invocations), of 65–72 (teams of 16,
/// looped over unevenly) and of 129–136 (teams of 32: q8x.rs's `team`). The kernels that
/// ran are checked by name, so a fallback to the f32 rows cannot pass by not running.
#[test]
fn wgpu_int8_gemvs_are_f32_gemvs_of_int8_rounded_activations() {
    use WeightFormat::{IQ2_XXS, Q2_K, Q4_K, Q8_0};
    let _alone = wgpu_alone();
    let opts = Options {
        guard_words: 8,
        precision: Precision::Fast,
        kernel_times: true,
        q8x_linear_min_cols: 1,
        ..Options::default()
    };
    let Some(lane) = common::wgpu_lane(opts.clone()) else { return };
    let ran = |lane: &WgpuBackend| -> Vec<String> {
        lane.kernel_times().unwrap().expect("kernel times (TIMESTAMP_QUERY)").into_iter().map(|k| k.name).collect()
    };
    let mut r = StdRng::seed_from_u64(0x1878);
    let formats = [(Q8_0, 2080, 4128), (Q2_K, 2304, 4352), (IQ2_XXS, 2304, 4352)];
    let clear = |r: &mut StdRng, mut c: Case, k: usize| {
        c.tensors[0] = int8_clear_row(r, k);
        c
    };

    let mut linears = Vec::new();
    for (format, long, longer) in formats {
        for k in [block_cols(format), long, longer] {
            let c = linear_case(&mut r, format, 1, k, 67, " (int8 row)");
            linears.push(clear(&mut r, c, k));
        }
        // without a bias, as the lane's wide linears (wq_b, the head) are
        let k = block_cols(format);
        let mut c = linear_case(&mut r, format, 1, k, 67, " (int8 row, no bias)");
        c.args.a = 0;
        linears.push(clear(&mut r, c, k));
    }
    compare_with_cpu_on(&lane, linears, |c| Cow::Owned(int8_rounded(c)));
    let names = ran(&lane);
    assert!(names.iter().any(|n| n == "linear_q8x"), "linear_q8x did not run: {names:?}");
    assert!(!names.iter().any(|n| n == "linear_rows"), "{names:?}");

    let (h, e, topk, ids) = (256, 8, 3, vec![5, 0, 7]);
    let mut gate_up = Vec::new();
    let mut all_three = Vec::new();
    for (format, long, longer) in formats {
        for d in [block_cols(format), long, longer] {
            let name = format!("moe_experts {format} gate/up, Q4_K down, d={d} one token (int8 row)");
            let c = moe_case(&mut r, name, (format, format, Q4_K), (1, d, h, e, topk), ids.clone());
            gate_up.push(clear(&mut r, c, d));
            let name = format!("moe_experts {format} d={d} one token (int8 row and hid)");
            all_three.push(moe_case(&mut r, name, (format, format, format), (1, d, h, e, topk), ids.clone()));
        }
    }
    // each as the model uploads the experts (gate and up in one dispatch) and a projection at a
    // time (a dispatch each)
    let apart = |cases: Vec<Case>| -> Vec<Case> {
        cases
            .into_iter()
            .flat_map(|c| {
                let name = format!("{} projections apart", c.name);
                [Case { name, upload: ExpertUpload::Projections, ..c.clone() }, c]
            })
            .collect()
    };
    let (gate_up, all_three) = (apart(gate_up), apart(all_three));
    assert!(gate_up.iter().chain(&all_three).all(wgpu_q8x_case));
    compare_with_cpu_on(&lane, gate_up, |c| Cow::Owned(int8_rounded(c)));
    let names = ran(&lane);
    for kernel in ["moe_gate_up_q8x", "moe_gate_q8x", "moe_up_q8x", "moe_down_rows"] {
        assert!(names.iter().any(|n| n == kernel), "{kernel} did not run: {names:?}");
    }
    assert!(!names.iter().any(|n| n == "moe_gate_rows" || n == "moe_down_q8x"), "{names:?}");
    compare_with_cpu(&lane, with_wgpu_fast_bounds(all_three));
    let names = ran(&lane);
    for kernel in ["moe_gate_up_q8x", "moe_gate_q8x", "moe_up_q8x", "moe_down_q8x"] {
        assert!(names.iter().any(|n| n == kernel), "{kernel} did not run: {names:?}");
    }
    assert!(!names.iter().any(|n| n.ends_with("_rows")), "{names:?}");
    drop(lane);

    let Some(lane) = common::wgpu_lane(Options { max_binding_bytes: Some(4096), ..opts }) else { return };
    let chunked: Vec<Case> = formats
        .into_iter()
        .map(|(format, _, _)| {
            let k = block_cols(format);
            let c = linear_case(&mut r, format, 1, k, 200, " (int8 row, row chunks of 4 KiB)");
            clear(&mut r, c, k)
        })
        .collect();
    let cases = chunked.len() as u64;
    compare_with_cpu_on(&lane, chunked, |c| Cow::Owned(int8_rounded(c)));
    let times = lane.kernel_times().unwrap().expect("kernel times (TIMESTAMP_QUERY)");
    let dispatches: u64 = times.iter().filter(|k| k.name == "linear_q8x").map(|k| k.count).sum();
    assert!(dispatches > cases, "a dispatch a row chunk: {times:?}");
}

/// A row `[1, d]` whose int8 rounding is clear-cut: per 32 values the step 2⁻⁵ (so amax / 127 is
/// exact), one value ±127 steps (the amax), the others a random code in ±126 plus at most a
/// quarter step, so x / dx lies at least a quarter step from a rounding boundary.
fn int8_clear_row(r: &mut StdRng, d: usize) -> HostTensor {
    const STEP: f32 = 1.0 / 32.0;
    let v = (0..d)
        .map(|i| {
            if i % 32 == (i / 32) % 32 {
                return if r.random::<bool>() { 127.0 * STEP } else { -127.0 * STEP };
            }
            (r.random_range(-126i32..=126) as f32 + r.random_range(-0.25f32..=0.25)) * STEP
        })
        .collect();
    HostTensor::f32([1, d], v).unwrap()
}

/// `c` (a one-row linear or one-token experts case) with the token's row rounded as the int8 experts round it: per
/// 32 values the step dx = amax / 127 and each value round(x / dx)·dx.
fn int8_rounded(c: &Case) -> Case {
    let mut rounded = c.clone();
    let x = c.tensors[0].as_f32().unwrap();
    let mut v = x.to_vec();
    for group in v.chunks_mut(32) {
        let dx = group.iter().fold(0f32, |m, a| m.max(a.abs())) / 127.0;
        let inv = if dx != 0.0 { 1.0 / dx } else { 0.0 };
        group.iter_mut().for_each(|a| *a = (*a * inv).round_ties_even() * dx);
    }
    rounded.tensors[0] = HostTensor::f32(c.tensors[0].shape.clone(), v).unwrap();
    rounded
}

/// Attention whose row maxima jump after the first key tile, at its own fast bound: the first 64
/// keys shrunk 4× and the rest grown 4×, so scores of standard deviation 0.19 in the first tile,
/// then 3 (variance q 0.75 × k 0.75·16 × 64 dims × the scale² 1/64 = 9): most rows' running max
/// moves by about 7 (a factor of e^-7 on what the walk has summed) at the second tile, where the
/// other cases' scores (standard deviation 0.75) move it by fractions. Bound: FAST_ATTENTION's
/// derivation with var(s) = 9, FAST_GEMM_NMSE · (1 + 9), gated at 4×. (At n = 200, twenty-ninth
/// sitting: a cooperative kernel that rescaled its accumulators only past a factor of 2^8 failed
/// it at 1.2e4 with the rescale skipped; that kernel, the landed one and the one before gave 3.7e-7.)
fn rising_keys_attention_case() -> Case {
    // 250 = 3 × 64 + 58: the last workgroup's second subgroup holds one whole block of 16 and
    // one of 10 queries (the other cases' n leave at most 13 rows of a last workgroup)
    let (n, heads, hd) = (250, 2, 64);
    let mut r = StdRng::seed_from_u64(29);
    let q = randn(&mut r, &[n, heads * hd], 1.5);
    let mut k = randn(&mut r, &[n, heads * hd], 1.5);
    let v = randn(&mut r, &[n, heads * hd], 1.0);
    let HostData::F32(kv) = &mut k.data else { unreachable!("randn gives f32") };
    for (i, x) in kv.iter_mut().enumerate() {
        *x *= if i / (heads * hd) < 64 { 0.25 } else { 4.0 };
    }
    case(
        format!("attention n={n} {heads}x{hd} rising keys"),
        Op::Attention,
        4.0 * common::FAST_GEMM_NMSE * (1.0 + 9.0),
        vec![q, k, v],
        |a| Call::Attention { q: 0, k: 1, v: 2, heads: a.a },
        Args { a: heads, ..Default::default() },
    )
}

/// Fast precision's tiles on both their maths where the adapter has cooperative matrices: the
/// fast tests above ran the cooperative tiles there (`coop_tiles`), so this runs the attention
/// cases (head dim 64 on cooperative matrices: attention_coop_direct.wgsl) and
/// `rising_keys_attention_case`, `linear`'s cases on the direct and the staged tiles
/// (`Options::direct_tiles`) and the row-chunked cases on
/// them too (a weight split over many bindings), then every fast weight case on the FMA tiles
/// (`Options::force_fma_tiles`). Where the adapter has none (lavapipe) the tests above ran
/// the FMA tiles, and this says so. `FOVEA_REQUIRE_COOP_TILES=1` (cuda/gpu_tests.sh, on NVIDIA)
/// makes a lane without them a failure, so the cooperative path cannot pass there by not running.
#[test]
fn wgpu_fast_tiles_on_cooperative_matrices_and_fmas() {
    let _alone = wgpu_alone();
    let fast = Options { guard_words: 8, precision: Precision::Fast, ..Options::default() };
    let Some(lane) = common::wgpu_lane(fast.clone()) else { return };
    let (coop, name) = (lane.coop_tiles(), lane.adapter_info().name.clone());
    drop(lane);
    if std::env::var("FOVEA_REQUIRE_COOP_TILES").is_ok_and(|v| v.trim() == "1") {
        assert!(coop, "{name}: no cooperative-matrix tiles where FOVEA_REQUIRE_COOP_TILES=1");
    }
    if !coop {
        eprintln!("{name}: no cooperative-matrix tiles; the fast tests ran the FMA tiles");
        return;
    }
    eprintln!("{name}: the fast tests ran the cooperative-matrix tiles; now attention and the chunked cases on them");
    // the ViT's attention (head dim 64) on cooperative matrices too: its cases on both kernels
    // (key and value tiles in workgroup memory, where the adapter has the 44 KiB, or every
    // matrix load from the copies), each by name; NVIDIA's driver (48 KiB, where
    // FOVEA_REQUIRE_COOP_TILES is set) must take the wide one when asked
    for wide_attention in [true, false] {
        let Some(lane) = common::wgpu_lane(Options { kernel_times: true, wide_attention, ..fast.clone() }) else {
            return;
        };
        if wide_attention && std::env::var("FOVEA_REQUIRE_COOP_TILES").is_ok_and(|v| v.trim() == "1") {
            assert!(lane.wide_attention(), "{name}: no attention_coop_wide where FOVEA_REQUIRE_COOP_TILES=1");
        }
        let kernel = if lane.wide_attention() { "attention_coop_wide" } else { "attention_coop_direct" };
        let mut attention = with_fast_bounds(cases().into_iter().filter(|c| c.op == Op::Attention).collect());
        attention.push(rising_keys_attention_case());
        compare_with_cpu(&lane, attention);
        let kernels = lane.kernel_times().unwrap().expect("kernel times were asked for");
        assert!(kernels.iter().any(|k| k.name == kernel), "no attention on {kernel}: {kernels:?}");
    }
    // `linear` on both cooperative kernels: the direct tiles (the default, for a weight of any
    // format with k a multiple of 16 and at least 64 rows of x; both their row tilings, forced, as the
    // cases are below the rows from which the lane takes the wider on its own, the 128-row one
    // with and without its 16-byte staging where k is a multiple of 32) and the staged ones,
    // each by name
    for (direct_tiles, direct_tile_rows, wide_tiles, kernel) in [
        (true, Some(64), false, "linear_direct"),
        (true, Some(128), false, "linear_direct_128"),
        (true, Some(128), true, "linear_wide_128"),
        (false, None, false, "linear_tiles"),
    ] {
        let opts = Options { kernel_times: true, direct_tiles, direct_tile_rows, wide_tiles, ..fast.clone() };
        let Some(lane) = common::wgpu_lane(opts) else { return };
        let linear: Vec<Case> = weight_op_cases().into_iter().filter(|c| c.op == Op::Linear).collect();
        compare_with_cpu(&lane, with_wgpu_fast_bounds(linear));
        let kernels = lane.kernel_times().unwrap().expect("kernel times were asked for");
        assert!(kernels.iter().any(|k| k.name == kernel), "no `linear` on {kernel}: {kernels:?}");
        let direct_ran =
            kernels.iter().any(|k| k.name.starts_with("linear_direct") || k.name.starts_with("linear_wide"));
        assert_eq!(direct_ran, direct_tiles, "the direct tiles ran with direct_tiles = {direct_tiles}");
        if !direct_tiles {
            continue;
        }
        // a weight over two bindings of 128 KiB (f32 400 × 96: chunks of 320 and 80 rows; bf16
        // 500 × 160: 384 and 116), each chunk its own f16 copy and output columns, neither's rows
        // a multiple of 128; y, x's padded copy and each chunk's fit one binding, so the direct
        // tiles take them
        let opts = Options {
            kernel_times: true,
            direct_tiles,
            direct_tile_rows,
            wide_tiles,
            max_binding_bytes: Some(131072),
            ..fast.clone()
        };
        let Some(lane) = common::wgpu_lane(opts) else { return };
        let mut r = StdRng::seed_from_u64(0xd1ec7);
        let chunked = vec![
            linear_case(&mut r, WeightFormat::F32, 70, 96, 400, " (two chunks)"),
            linear_case(&mut r, WeightFormat::BF16, 65, 160, 500, " (two chunks, a bias)"),
        ];
        compare_with_cpu(&lane, with_wgpu_fast_bounds(chunked));
        let kernels = lane.kernel_times().unwrap().expect("kernel times were asked for");
        assert!(kernels.iter().any(|k| k.name == kernel), "no chunked `linear` on {kernel}: {kernels:?}");
    }
    let Some(lane) = common::wgpu_lane(Options { max_binding_bytes: Some(1024), ..fast.clone() }) else { return };
    assert!(lane.coop_tiles());
    let mut chunked = chunked_linear_cases();
    chunked.extend(block_chunked_cases());
    compare_with_cpu(&lane, with_fast_bounds(chunked));
    drop(lane);
    eprintln!("{name}: the fast weight cases on the FMA tiles");
    let Some(lane) = common::wgpu_lane(Options { force_fma_tiles: true, ..fast }) else { return };
    assert!(!lane.coop_tiles());
    compare_with_cpu(&lane, with_wgpu_fast_bounds(weight_op_cases()));
}

/// `c` with its GEMM operands rounded to the nearest f16 (ties to even): the operand tensor x
/// (not the bias) and the weight, decoded to f32 as the CPU lane decodes it, rounded, as F32.
fn with_f16_operands(c: &Case) -> Case {
    let x = match (c.run)(&c.args) {
        Call::Linear { x, .. } | Call::UnfoldLinearGelu { x, .. } | Call::GroupedLinear(x, _) => x,
        _ => panic!("{}: not a GEMM case", c.name),
    };
    let round = |v: f32| half::f16::from_f32(v).to_f32();
    let mut rounded = c.clone();
    let t = &c.tensors[x];
    rounded.tensors[x] =
        HostTensor::f32(t.shape.clone(), t.as_f32().unwrap().iter().map(|&v| round(v)).collect()).unwrap();
    let (format, rows, cols, bytes) = c.weight.as_ref().unwrap();
    let mut w = vec![0f32; rows * cols];
    for (row, out) in bytes.chunks_exact(format.row_bytes(*cols)).zip(w.chunks_exact_mut(*cols)) {
        decode_row(*format, row, out);
    }
    let w_bytes = w.iter().flat_map(|&v| round(v).to_le_bytes()).collect();
    rounded.weight = Some((WeightFormat::F32, *rows, *cols, w_bytes));
    rounded
}

/// Fast precision's bounds: the GEMM ops (linear, the aligner's fused GEMM, the grouped
/// projection, the experts) and the ViT's attention at the fast bounds, every other op at its own
/// (fast mode changes only the GEMM tiles and that attention).
fn with_fast_bounds(mut cases: Vec<Case>) -> Vec<Case> {
    for c in &mut cases {
        c.bound = match c.op {
            Op::Linear
            | Op::LinearAdd
            | Op::RmsNormLinear
            | Op::SwigluLinearAdd
            | Op::UnfoldLinearGelu
            | Op::GroupedLinear => c.bound.max(FAST_GEMM),
            Op::Attention | Op::AttentionRope2d => c.bound.max(FAST_ATTENTION),
            Op::MoeExperts if c.tensors[0].shape[0] == 1 => c.bound.max(FAST_MOE_ONE_TOKEN),
            Op::MoeExperts => c.bound.max(FAST_MOE),
            _ => c.bound,
        };
    }
    cases
}

/// The wgpu lane's fast bounds: [`with_fast_bounds`], and one token's experts on int8
/// activations where the lane takes them (`wgpu_q8x_case`) at FAST_MOE_Q8X (the same rounding of
/// x and of the hidden row as the CUDA lane's, dequant/q8x.wgsl).
fn with_wgpu_fast_bounds(cases: Vec<Case>) -> Vec<Case> {
    let mut cases = with_fast_bounds(cases);
    for c in cases.iter_mut().filter(|c| wgpu_q8x_case(c)) {
        c.bound = c.bound.max(FAST_MOE_Q8X);
    }
    cases
}

/// Whether the wgpu lane in fast precision runs some projection of `c` on int8 activations: one
/// token's experts uploaded together (one binding a projection) with a projection in a
/// `q8x_format` (k is whole 32-value groups in every block format, and the cases' rows are far
/// below the kernel's longest).
fn wgpu_q8x_case(c: &Case) -> bool {
    c.op == Op::MoeExperts
        && c.tensors[0].shape[0] == 1
        && c.upload != ExpertUpload::OneByOne
        && c.experts.iter().any(|e| fovea::backend::wgpu::formats::q8x_format(e.0))
}

/// The CUDA lane against the CPU lane on every shared/vision op and every language-model op it
/// claims (each must have a case). Skips without a CUDA driver, fails instead under
/// `FOVEA_REQUIRE_CUDA=1`.
#[test]
fn cuda_ops_match_cpu() {
    let Some(lane) =
        common::cuda_lane_with_or_skip(fovea::backend::cuda::Options { guard_words: 8, ..Default::default() })
    else {
        return;
    };
    eprintln!("cuda lane: {}", lane.device_name());
    let all = cuda_cases(&lane);
    check_cuda_coverage(&lane, compare_with_cpu(&lane, all));
}

/// The same cases in fast precision: the GEMM ops (linear, the aligner's fused GEMM, the grouped
/// projection, the experts) and attention at the fast bounds, every other op at its own.
#[test]
fn cuda_ops_match_cpu_in_fast_precision() {
    let opts = fovea::backend::cuda::Options {
        guard_words: 8,
        precision: fovea::backend::Precision::Fast,
        ..Default::default()
    };
    let Some(lane) = common::cuda_lane_with_or_skip(opts) else { return };
    let mut all = with_fast_bounds(cuda_cases(&lane));
    for c in &mut all {
        let q8x = c.experts.iter().any(|e| fovea::backend::cuda::moe_q8x_kernels(e.0).is_some());
        if c.op == Op::MoeExperts && c.tensors[0].shape[0] == 1 && q8x {
            c.bound = c.bound.max(FAST_MOE_Q8X);
        }
        // a prefill chunk's queries on the tensor-core sink attention (the ViT attention's
        // operands and bound: q and the keys uniform in ±1.5 there too)
        if c.op == Op::SinkAttention
            && c.tensors[0].shape[0] * (c.tensors[0].shape[1] / c.tensors[1].shape[1]).div_ceil(64)
                >= SINK_FAST_MIN_BLOCKS
        {
            c.bound = c.bound.max(FAST_ATTENTION);
        }
        if let (Op::Linear, Some((format, o, _, _))) = (c.op, &c.weight)
            && c.tensors[0].shape[0] == 1
            && *o >= fovea::backend::cuda::LINEAR_Q8X_MIN_COLS
            && fovea::backend::cuda::linear_q8x_kernel(*format).is_some()
        {
            c.bound = c.bound.max(FAST_LINEAR_Q8X);
        }
    }
    check_cuda_coverage(&lane, compare_with_cpu(&lane, all));
}

/// Every case the CUDA lane is compared on: the shared and vision ops, the block formats and the
/// language-model ops it claims.
fn cuda_cases(lane: &CudaBackend) -> Vec<Case> {
    let mut all = cases();
    all.extend(extra_cases());
    all.extend(tile_split_cases());
    all.extend(linear_pair_cases());
    all.extend(shared_expert_cases());
    all.extend(
        block_cases()
            .into_iter()
            .chain(cuda_block_cases())
            .filter(|c| !c.op.is_lm() || lane.supports(c.op, WeightFormat::F32)),
    );
    // the language-model ops the lane claims (the others answer Unsupported)
    all.extend(
        lm_cases()
            .into_iter()
            .chain(chunked_linear_cases())
            .filter(|c| c.op.is_lm() && lane.supports(c.op, WeightFormat::F32)),
    );
    all
}

/// Every vision op, and every language-model op the CUDA lane claims, had a case.
fn check_cuda_coverage(lane: &CudaBackend, covered: std::collections::HashSet<Op>) {
    let missing: Vec<_> = Op::VISION.iter().filter(|op| !covered.contains(op)).map(|op| op.name()).collect();
    assert!(missing.is_empty(), "ops without a harness case: {missing:?}");
    // Every language-model op the lane claims must be compared with the CPU lane here.
    let missing: Vec<_> = Op::LM
        .iter()
        .filter(|op| lane.supports(**op, WeightFormat::F32) && !covered.contains(op))
        .map(|op| op.name())
        .collect();
    assert!(missing.is_empty(), "LM ops the cuda lane supports without a harness case: {missing:?}");
}
