//! The language-model ops of `shaders/lm.wgsl` (its weight products are linear.rs's tiles and
//! small rows):
//! embeddings, hyper-connections, per-head RMS norm, tail RoPE, routing, the compressor's pooling,
//! the lightning indexer, top-k and sink attention. Most run one thread per output element
//! through [`WgpuBackend::per_element`]; `embed_rows` (one dispatch per row chunk of its table),
//! the reductions (`rms_norm_heads`, `topk_rows`), the per-row Sinkhorn (`hc_split`) and
//! `sink_attention` size their own dispatches.
//!
//! Where the CPU lane returns an error for a bad index (a negative token id in `embed_rows`, an
//! expert id outside `0..e` in `route_weights`, a window or compressed index out of range in
//! `sink_attention`), these kernels write NaN instead: the lane cannot see the indices without a
//! host round trip.

use super::linear::lm_weight_shader;
use super::rows::{self, RowsParams, RowsWeight, SMALL_ROWS};
use super::{Output, SOFTWARE_LOOP_BUDGET, Shader, WgpuBackend, WgpuTensor, WgpuWeight, grid};
use crate::backend::{DType, DeviceTensor, Op, checks, hc_mix_split_parts, route_experts_parts};
use crate::error::{Error, Result};

/// lm.wgsl (one build: its ops have no precision to choose).
const LM: Shader = Shader::Lm;
/// The most hyper-connection streams `hc_split` takes (lm.wgsl's `HC_MAX`: a row's hc² threads
/// fit its workgroup; the model has 4).
const HC_MAX: usize = 8;
/// The widest row `hc_split_pre_norm` collapses and normalises (lm.wgsl's `HS_HELD`·1024: its
/// threads hold the row in registers between the two passes).
const HS_HELD_WIDTH: usize = 4 * 1024;
/// The words of partial sums and squares `hc_split_pre_norm` stages (lm.wgsl's `HS_STAGE`).
const HS_STAGE: usize = 2048;
/// The largest head dim `sink_attention` sums in registers (lm.wgsl: SA_THREADS · SA_DIMS, and
/// SH_BLOCKS · SP_THREADS in `sink_attention_heads`; the model's is 512).
const SINK_ATTENTION_MAX_HEAD_DIM: usize = 64 * 16;
/// The keys of one part of a split `sink_attention` (lm.wgsl's `SP_KEYS` override in the
/// [`Shader::LmAttentionParts`] build; `sink_attention_heads` keeps the default 64).
pub(super) const SINK_ATTENTION_PART_KEYS: usize = 32;
/// The heads of one query a workgroup of a split `sink_attention` takes (lm.wgsl's SP_HEADS).
const SINK_ATTENTION_PART_HEADS: usize = 8;
/// The queries and entries of one workgroup of `indexer_scores_tiles` (lm.wgsl's IT_ROWS,
/// IT_COLS).
const INDEXER_TILE_ROWS: usize = 16;
const INDEXER_TILE_COLS: usize = 64;
/// `topk_rows` ranks each column by its own thread (`topk_rows_rank`, several workgroups a row)
/// for at most this many rows: a decode step's (one a sequence); more rows fill the GPU with a
/// workgroup each sorting its row.
const TOPK_RANK_ROWS: usize = 4;
/// The longest rows `topk_rows` sorts in workgroup memory (lm.wgsl's TK_SORT), and so the longest
/// it ranks: past them each column's count over the row grows, where a radix select does not.
const TOPK_SORT_COLUMNS: usize = 2048;
/// The columns of one workgroup of `topk_rows_rank` (lm.wgsl's TR_COLS).
const TOPK_RANK_COLUMNS: usize = 64;
/// The most experts `route_experts` keeps in workgroup memory (lm.wgsl's RE_CACHE; the model has
/// 256); past them, and past [`ROUTE_MAX_K`] slots, the lane composes the router's five ops.
const ROUTE_MAX_EXPERTS: usize = 1024;
/// The most slots `route_experts` picks (lm.wgsl's RE_K_MAX: a thread a slot; the model picks 6).
const ROUTE_MAX_K: usize = 256;
/// `sink_attention` splits its keys into parts below this many (query, head) pairs (a workgroup
/// a query's head group unsplit): a decode step's 64 heads fill a quarter of an H200's 132
/// multiprocessors' first wave, a prefill chunk's thousands all of them.
const SINK_ATTENTION_SPLIT_BELOW: usize = 2048;

impl WgpuBackend {
    /// table `[vocab, d]` (any format, possibly row-chunked), ids i32 `[n]` → `[n, d]`; ids ≥ vocab
    /// give a zero row, a negative id a row of NaN.
    pub(super) fn embed_rows(&self, table: &WgpuWeight, ids: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "embed_rows";
        let (n, d) = checks::embed_rows(table, ids)?;
        self.check_inputs(OP, [("ids", ids)])?;
        let y = self.alloc(OP, vec![n, d], DType::F32)?;
        let (shader, fmt) = lm_weight_shader(table.format);
        // block formats: one thread per run of 32 values (d is a whole number of blocks)
        let threads = if table.format.is_block() { n * d / 32 } else { n * d };
        for (ci, c) in table.chunks.iter().enumerate() {
            let params = [
                (n * d) as u32,
                d as u32,
                table.rows as u32,
                c.row0 as u32,
                c.rows as u32,
                fmt,
                table.stride_words as u32,
                (ci == 0) as u32,
            ];
            self.dispatch_1d(shader, OP, threads, &params, &[(4, ids.binding()), (6, y.binding()), (8, c.binding())])?;
        }
        Ok(y)
    }

    /// x `[n, d]` → `[n, hc·d]`.
    pub(super) fn hc_expand(&self, x: &WgpuTensor, hc: usize) -> Result<WgpuTensor> {
        let (n, d) = checks::hc_expand(x)?;
        let out = Output { binding: 6, shape: vec![n, hc * d], dtype: DType::F32 };
        self.per_element(LM, "hc_expand", &[("x", 1, x)], out, &[d as u32, hc as u32])
    }

    /// x `[n, heads·hd]` → per-head unweighted RMS norm; one workgroup per (row, head).
    pub(super) fn rms_norm_heads(&self, x: &WgpuTensor, n_heads: usize, eps: f32) -> Result<WgpuTensor> {
        const OP: &str = "rms_norm_heads";
        let (n, cols) = checks::rms_norm_heads(x, n_heads)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let segs = n * n_heads;
        if segs > 0 && cols > 0 {
            self.dispatch(
                LM,
                OP,
                0,
                &[segs as u32, (cols / n_heads) as u32, eps.to_bits()],
                &[(1, x.binding()), (6, y.binding())],
                grid(segs),
            )?;
        }
        Ok(y)
    }

    /// X `[n, hc·d]`, w `[n, c ≥ hc]` (its first hc columns) → `[n, d]`.
    pub(super) fn hc_pre(&self, x: &WgpuTensor, w: &WgpuTensor, hc: usize) -> Result<WgpuTensor> {
        let (n, d, wc) = checks::hc_pre(x, w, hc)?;
        let out = Output { binding: 6, shape: vec![n, d], dtype: DType::F32 };
        self.per_element(LM, "hc_pre", &[("x", 1, x), ("w", 2, w)], out, &[d as u32, hc as u32, wc as u32])
    }

    /// X `[n, hc·d]`, f `[n, d]`, split `[n, (2+hc)·hc]` (hc_split's) → X' `[n, hc·d]`.
    pub(super) fn hc_post(&self, x: &WgpuTensor, f: &WgpuTensor, split: &WgpuTensor) -> Result<WgpuTensor> {
        let (n, cols, d, hc) = checks::hc_post(x, f, split)?;
        let inputs = [("x", 1, x), ("f", 2, f), ("split", 3, split)];
        let out = Output { binding: 6, shape: vec![n, cols], dtype: DType::F32 };
        self.per_element(LM, "hc_post", &inputs, out, &[d as u32, hc as u32])
    }

    /// mix `[n, hc]`, scale `[1]`, base `[hc]` → `σ(mix·scale + base) + eps`.
    pub(super) fn hc_head_weights(
        &self,
        mix: &WgpuTensor,
        scale: &WgpuTensor,
        base: &WgpuTensor,
        eps: f32,
    ) -> Result<WgpuTensor> {
        let (_, hc) = checks::hc_head_weights(mix, scale, base)?;
        let inputs = [("mix", 1, mix), ("scale", 2, scale), ("base", 3, base)];
        let out = Output { binding: 6, shape: mix.shape.clone(), dtype: DType::F32 };
        self.per_element(LM, "hc_head_weights", &inputs, out, &[hc as u32, eps.to_bits()])
    }

    /// `sqrt(softplus(x))` elementwise.
    pub(super) fn sqrt_softplus(&self, x: &WgpuTensor) -> Result<WgpuTensor> {
        checks::sqrt_softplus(x)?;
        let out = Output { binding: 6, shape: x.shape.clone(), dtype: DType::F32 };
        self.per_element(LM, "sqrt_softplus", &[("x", 1, x)], out, &[])
    }

    /// table i32 `[vocab, k]`, ids i32 `[n]`, fallback i32 `[n, k]` → i32 `[n, k]`.
    pub(super) fn hash_route(&self, table: &WgpuTensor, ids: &WgpuTensor, fallback: &WgpuTensor) -> Result<WgpuTensor> {
        let (vocab, k, n) = checks::hash_route(table, ids, fallback)?;
        let inputs = [("table", 4, table), ("ids", 5, ids), ("fallback", 10, fallback)];
        let out = Output { binding: 7, shape: vec![n, k], dtype: DType::I32 };
        self.per_element(LM, "hash_route", &inputs, out, &[k as u32, vocab as u32])
    }

    /// scores `[n, e]`, ids i32 `[n, k]` → `[n, k]`; a row with an id outside `0..e` is NaN.
    pub(super) fn route_weights(&self, scores: &WgpuTensor, ids: &WgpuTensor, scale: f32) -> Result<WgpuTensor> {
        let (n, e, k) = checks::route_weights(scores, ids)?;
        let out = Output { binding: 6, shape: vec![n, k], dtype: DType::F32 };
        let params = [k as u32, e as u32, scale.to_bits()];
        self.per_element(LM, "route_weights", &[("scores", 1, scores), ("ids", 4, ids)], out, &params)
    }

    /// g, u `[n, h]` → `silu(min(g, limit)) · clamp(u, ±limit)` `[n, h]`.
    pub(super) fn swiglu_clamp(&self, g: &WgpuTensor, u: &WgpuTensor, limit: f32) -> Result<WgpuTensor> {
        let (n, h) = checks::swiglu_clamp(g, u)?;
        let out = Output { binding: 6, shape: vec![n, h], dtype: DType::F32 };
        self.per_element(LM, "swiglu_clamp", &[("g", 1, g), ("u", 2, u)], out, &[limit.to_bits()])
    }

    /// `Backend::shared_expert`: the gate and up projections through the clamped SwiGLU in one
    /// small-row dispatch where `linear_pair` would take one ([`Self::linear_pair_swiglu`]), and
    /// for one row `routed`'s row as the down projection's bias, so the sum is the linear's
    /// epilogue (shared + routed) rather than an `add` dispatch of its own; the composition's
    /// bits. More rows, or weights linear_pair would not take in one dispatch, compose.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn shared_expert(
        &self,
        x: &WgpuTensor,
        w1: &WgpuWeight,
        w3: &WgpuWeight,
        w2: &WgpuWeight,
        limit: f32,
        routed: &WgpuTensor,
    ) -> Result<WgpuTensor> {
        let hidden = match self.linear_pair_swiglu(x, w1, w3, limit)? {
            Some(hidden) => hidden,
            None => {
                let (g, u) = self.linear_pair(x, w1, w3)?;
                self.swiglu_clamp(&g, &u, limit)?
            }
        };
        if hidden.rows() == 1 && routed.shape() == [1, w2.rows] {
            return self.linear(&hidden, w2, Some(routed));
        }
        let shared = self.linear(&hidden, w2, None)?;
        self.add(routed, &shared)
    }

    /// The router after the gate projection (`Backend::route_experts`) in one dispatch, one
    /// workgroup a row, bit for bit the five ops it replaces (composed here past
    /// [`ROUTE_MAX_EXPERTS`] experts or [`ROUTE_MAX_K`] slots).
    pub(super) fn route_experts(
        &self,
        logits: &WgpuTensor,
        bias: &WgpuTensor,
        kind: &WgpuTensor,
        hash: Option<(&WgpuTensor, &WgpuTensor)>,
        k: usize,
        scale: f32,
    ) -> Result<(WgpuTensor, WgpuTensor)> {
        const OP: &str = "route_experts";
        let (n, e) = checks::route_experts(logits, bias, kind, hash, k)?;
        if e > ROUTE_MAX_EXPERTS || k > ROUTE_MAX_K {
            return route_experts_parts(self, logits, bias, kind, hash, k, scale);
        }
        // without a table the kernel never reads `table` / `tok`; `kind` stands in for both
        let (table, tok, hashed, vocab) = match hash {
            Some((table, tok)) => (table, tok, 1, table.rows()),
            None => (kind, kind, 0, 0),
        };
        self.check_inputs(OP, [("logits", logits), ("bias", bias), ("kind", kind), ("table", table), ("tok", tok)])?;
        let ids = self.alloc(OP, vec![n, k], DType::I32)?;
        let weights = self.alloc(OP, vec![n, k], DType::F32)?;
        if n == 0 || k == 0 {
            return Ok((ids, weights));
        }
        let params = [n as u32, e as u32, k as u32, bias.rows() as u32, hashed, vocab as u32, scale.to_bits()];
        let bindings = [
            (1, logits.binding()),
            (2, bias.binding()),
            (4, kind.binding()),
            (5, tok.binding()),
            (10, table.binding()),
            (6, weights.binding()),
            (7, ids.binding()),
        ];
        self.dispatch(LM, OP, 0, &params, &bindings, grid(n))?;
        Ok((ids, weights))
    }

    /// Per-head RMS norm (times `weight` `[hd]` with one head), then RoPE at `positions[i]`, in
    /// one dispatch (one workgroup per (row, head) segment): x `[n, heads·hd]` → `[n, heads·hd]`,
    /// bit for bit `rms_norm` / `rms_norm_heads` then `rope_tail_at`.
    pub(super) fn rms_norm_rope(
        &self,
        x: &WgpuTensor,
        weight: Option<&WgpuTensor>,
        n_heads: usize,
        eps: f32,
        inv_freq: &WgpuTensor,
        positions: &WgpuTensor,
    ) -> Result<WgpuTensor> {
        const OP: &str = "rms_norm_rope";
        let (n, _, hd, rd) = checks::rms_norm_rope(x, weight, n_heads, inv_freq, positions)?;
        // without a weight the kernel never reads `c`; x stands in
        let w = weight.unwrap_or(x);
        self.check_inputs(OP, [("x", x), ("weight", w), ("inv_freq", inv_freq), ("positions", positions)])?;
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let segs = n * n_heads;
        if segs == 0 || hd == 0 {
            return Ok(y);
        }
        let params = [segs as u32, hd as u32, eps.to_bits(), n_heads as u32, weight.is_some() as u32, rd as u32];
        let bindings =
            [(1, x.binding()), (2, inv_freq.binding()), (3, w.binding()), (4, positions.binding()), (6, y.binding())];
        self.dispatch(LM, OP, 0, &params, &bindings, grid(segs))?;
        Ok(y)
    }

    /// Interleaved RoPE on the last `2·inv_freq.len()` dims of every head.
    pub(super) fn rope_tail(
        &self,
        x: &WgpuTensor,
        n_heads: usize,
        inv_freq: &WgpuTensor,
        pos0: usize,
        stride: usize,
        inverse: bool,
    ) -> Result<WgpuTensor> {
        let (n, cols, hd, rd) = checks::rope_tail(x, n_heads, inv_freq)?;
        let last = pos0 + n.saturating_sub(1) * stride;
        if last > u32::MAX as usize {
            return Err(Self::unsupported(Op::RopeTail, format!("position {last} beyond u32")));
        }
        let out = Output { binding: 6, shape: x.shape.clone(), dtype: DType::F32 };
        let params = [cols as u32, hd as u32, rd as u32, pos0 as u32, stride as u32, inverse as u32];
        self.per_element(LM, "rope_tail", &[("x", 1, x), ("inv_freq", 2, inv_freq)], out, &params)
    }

    /// [`Self::rope_tail`] with row i at `positions[i]`.
    pub(super) fn rope_tail_at(
        &self,
        x: &WgpuTensor,
        n_heads: usize,
        inv_freq: &WgpuTensor,
        positions: &WgpuTensor,
        inverse: bool,
    ) -> Result<WgpuTensor> {
        let (_, cols, hd, rd) = checks::rope_tail_at(x, n_heads, inv_freq, positions)?;
        let out = Output { binding: 6, shape: x.shape.clone(), dtype: DType::F32 };
        let params = [cols as u32, hd as u32, rd as u32, inverse as u32];
        let inputs = [("x", 1, x), ("inv_freq", 2, inv_freq), ("positions", 4, positions)];
        self.per_element(LM, "rope_tail_at", &inputs, out, &params)
    }

    /// mHC split with Sinkhorn; a row's hc×hc block over hc² threads, `HC_MAX² / hc²` rows a
    /// workgroup (hc ≤ [`HC_MAX`]).
    pub(super) fn hc_split(
        &self,
        mix: &WgpuTensor,
        scale: &WgpuTensor,
        base: &WgpuTensor,
        hc: usize,
        iters: usize,
        eps: f32,
    ) -> Result<WgpuTensor> {
        const OP: &str = "hc_split";
        let (n, _) = checks::hc_split(mix, scale, base, hc)?;
        self.check_inputs(OP, [("mix", mix), ("scale", scale), ("base", base)])?;
        self.dispatch_hc_split(n, mix, None, scale, base, hc, iters, eps)
    }

    /// [`Backend::hc_mix_split`](crate::backend::Backend::hc_mix_split) in two dispatches for at
    /// most [`SMALL_ROWS`] rows (decode), where the composition took four: rows.wgsl's
    /// `hc_mix_rows` sums x·mixᵀ over slices of k on the raw residual (split as a small-row
    /// linear with few columns is, [`rows::k_slice`]) and each slice's x², and hc_split adds
    /// the slices and applies the norm's factor, taken out of the product (equal to the
    /// composition up to rounding). More rows, a mix in row chunks, or `fused_hc_mix` off: the
    /// composition.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hc_mix_split(
        &self,
        x: &WgpuTensor,
        mix: &WgpuWeight,
        scale: &WgpuTensor,
        base: &WgpuTensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
    ) -> Result<WgpuTensor> {
        const OP: &str = "hc_mix_split";
        let (n, k, w) = checks::hc_mix_split(x, mix, scale, base, hc)?;
        if !self.fused_hc_mix_applies(n, mix, hc) {
            return hc_mix_split_parts(self, x, mix, scale, base, hc, iters, eps, norm_eps);
        }
        self.check_inputs(OP, [("x", x), ("scale", scale), ("base", base)])?;
        let (part, squares, slices) = self.hc_mix_partials(x, mix, n, k, w)?;
        self.dispatch_hc_split(n, &part, Some((&squares, slices, k, norm_eps)), scale, base, hc, iters, eps)
    }

    /// Whether hc_mix_split of n rows takes the fused path (`hc_mix_rows` over slices of k).
    fn fused_hc_mix_applies(&self, n: usize, mix: &WgpuWeight, hc: usize) -> bool {
        self.opts.fused_hc_mix && (1..=SMALL_ROWS).contains(&n) && mix.chunks.len() == 1 && hc <= HC_MAX
    }

    /// rows.wgsl's `hc_mix_rows`: x·mixᵀ of x `[n, k]` over slices of k, `[slices, n, w]`, and each
    /// slice's sums of x² `[slices, n]`, with the number of slices.
    fn hc_mix_partials(
        &self,
        x: &WgpuTensor,
        mix: &WgpuWeight,
        n: usize,
        k: usize,
        w: usize,
    ) -> Result<(WgpuTensor, WgpuTensor, usize)> {
        const OP: &str = "hc_mix_rows";
        let (slice, slices) = self.hc_mix_slices(w, k);
        let part = self.alloc(OP, vec![slices, n, w], DType::F32)?;
        let squares = self.alloc(OP, vec![slices, n], DType::F32)?;
        let params = RowsParams { n, k, out_cols: w, k_slice: slice, ..RowsParams::default() };
        let weight = RowsWeight::chunk(mix, 0);
        let no_bias = (3, self.dummy.as_entire_binding());
        self.dispatch_rows_over(OP, weight, n, params, x, &part, &[no_bias, (6, squares.binding())])?;
        Ok((part, squares, slices))
    }

    /// The elements of k each slice of `hc_mix_rows` sums (a mix of w rows of k), and the slices.
    fn hc_mix_slices(&self, w: usize, k: usize) -> (usize, usize) {
        let slice = if self.opts.split_rows_k { rows::k_slice(w, k) } else { k };
        (slice, k.div_ceil(slice.max(1)).max(1))
    }

    /// [`Backend::hc_mix_split_pre_norm`](crate::backend::Backend::hc_mix_split_pre_norm) in two
    /// dispatches where hc_mix_split takes its fused path (hc_mix_rows, then lm.wgsl's
    /// `hc_split_pre_norm`: the split and the norm of the collapsed streams from two workgroups a
    /// row, the norm and the Sinkhorn block), for rows of 1 to [`HS_HELD_WIDTH`] whose partial
    /// sums fit [`HS_STAGE`] words (the kernel's loads clamp to the row's last element, so a row
    /// of none takes the other path); elsewhere hc_mix_split then hc_pre_norm.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hc_mix_split_pre_norm(
        &self,
        x: &WgpuTensor,
        mix: &WgpuWeight,
        scale: &WgpuTensor,
        base: &WgpuTensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
        weight: &WgpuTensor,
    ) -> Result<(WgpuTensor, WgpuTensor)> {
        const OP: &str = "hc_split_pre_norm";
        let (n, k, w, d) = checks::hc_mix_split_pre_norm(x, mix, scale, base, hc, weight)?;
        let staged = self.hc_mix_slices(w, k).1 * (w + 1);
        if !self.fused_hc_mix_applies(n, mix, hc) || !(1..=HS_HELD_WIDTH).contains(&d) || staged > HS_STAGE {
            let split = self.hc_mix_split(x, mix, scale, base, hc, iters, eps, norm_eps)?;
            let y = self.hc_pre_norm(x, &split, hc, weight, norm_eps)?;
            return Ok((split, y));
        }
        self.check_inputs(OP, [("x", x), ("scale", scale), ("base", base), ("weight", weight)])?;
        let (part, squares, slices) = self.hc_mix_partials(x, mix, n, k, w)?;
        let split = self.alloc(OP, vec![n, w], DType::F32)?;
        let y = self.alloc(OP, vec![n, d], DType::F32)?;
        let one = self.opts.sinkhorn_one_invocation as usize;
        let params =
            [n, hc, iters, eps.to_bits() as usize, slices, k, norm_eps.to_bits() as usize, d, one].map(|v| v as u32);
        let bindings = [
            (1, part.binding()),
            (2, scale.binding()),
            (3, base.binding()),
            (6, split.binding()),
            (9, squares.binding()),
            (11, x.binding()),
            (12, weight.binding()),
            (13, y.binding()),
        ];
        // two workgroups a row: the norm, and the Sinkhorn block beside it
        self.dispatch(LM, OP, 0, &params, &bindings, (n as u32, 2, 1))?;
        Ok((split, y))
    }

    /// hc_split over rows of `mix` `[n, w]`, or over its partial sums `[slices, n, w]` with the
    /// slices' sums of squares (`squares`, the slices, the residual's width, the norm's eps).
    #[allow(clippy::too_many_arguments)]
    fn dispatch_hc_split(
        &self,
        n: usize,
        mix: &WgpuTensor,
        partial: Option<(&WgpuTensor, usize, usize, f32)>,
        scale: &WgpuTensor,
        base: &WgpuTensor,
        hc: usize,
        iters: usize,
        eps: f32,
    ) -> Result<WgpuTensor> {
        const OP: &str = "hc_split";
        if hc > HC_MAX {
            return Err(Self::unsupported(Op::HcSplit, format!("hc = {hc} streams (at most {HC_MAX})")));
        }
        let y = self.alloc(OP, vec![n, (2 + hc) * hc], DType::F32)?;
        if n > 0 && hc > 0 {
            let g = n.div_ceil(HC_MAX * HC_MAX / (hc * hc));
            if g > self.limits.max_compute_workgroups_per_dimension as usize {
                return Err(Error::Device(format!("op `{OP}`: {n} rows exceed the dispatch limit")));
            }
            let (squares, slices, width, norm_eps) = match partial {
                Some((sq, slices, width, norm_eps)) => (sq.binding(), slices, width, norm_eps),
                None => (self.dummy.as_entire_binding(), 0, 0, 0.0),
            };
            self.dispatch(
                LM,
                OP,
                0,
                &[
                    n as u32,
                    hc as u32,
                    iters as u32,
                    eps.to_bits(),
                    slices as u32,
                    width as u32,
                    norm_eps.to_bits(),
                    0,
                    self.opts.sinkhorn_one_invocation as u32,
                ],
                &[(1, mix.binding()), (2, scale.binding()), (3, base.binding()), (6, y.binding()), (9, squares)],
                (g as u32, 1, 1),
            )?;
        }
        Ok(y)
    }

    /// Gated pooling of ratio-r blocks (overlap: w = 2d, 2r rows).
    pub(super) fn compress_pool(
        &self,
        kv: &WgpuTensor,
        gate: &WgpuTensor,
        ape: &WgpuTensor,
        ratio: usize,
        overlap: bool,
    ) -> Result<WgpuTensor> {
        let (n, d, w) = checks::compress_pool(kv, gate, ape, ratio, overlap)?;
        let inputs = [("kv", 1, kv), ("gate", 2, gate), ("ape", 3, ape)];
        let out = Output { binding: 6, shape: vec![n, d], dtype: DType::F32 };
        let params = [d as u32, w as u32, ratio as u32, overlap as u32];
        self.per_element(LM, "compress_pool", &inputs, out, &params)
    }

    /// Lightning-indexer scores `[n, m]`, −inf for entries not yet complete.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn indexer_scores(
        &self,
        q: &WgpuTensor,
        k: &WgpuTensor,
        w: &WgpuTensor,
        n_heads: usize,
        scale: f32,
        pos0: usize,
        ratio: usize,
    ) -> Result<WgpuTensor> {
        let (n, m, hd) = checks::indexer_scores(q, k, w, n_heads, ratio)?;
        let params = [m as u32, n_heads as u32, hd as u32, scale.to_bits(), pos0 as u32, ratio as u32];
        let tiles = self.opts.indexer_tiles
            && (!self.is_software() || indexer_tile_iterations(n_heads, hd) <= SOFTWARE_LOOP_BUDGET);
        if n > SMALL_ROWS && !tiles {
            let out = Output { binding: 6, shape: vec![n, m], dtype: DType::F32 };
            return self.per_element(LM, "indexer_scores", &[("q", 1, q), ("k", 2, k), ("w", 3, w)], out, &params);
        }
        self.check_inputs("indexer_scores", [("q", q), ("k", k), ("w", w)])?;
        let y = self.alloc("indexer_scores", vec![n, m], DType::F32)?;
        if n * m == 0 {
            return Ok(y);
        }
        let params: Vec<u32> = std::iter::once((n * m) as u32).chain(params).collect();
        let bindings = [(1, q.binding()), (2, k.binding()), (3, w.binding()), (6, y.binding())];
        if n > SMALL_ROWS {
            // many query rows (prefill): tiles of 16 queries × 64 entries
            let groups = (m.div_ceil(INDEXER_TILE_COLS) as u32, n.div_ceil(INDEXER_TILE_ROWS) as u32, 1);
            self.dispatch(LM, "indexer_scores_tiles", 0, &params, &bindings, groups)?;
        } else {
            // few query rows (decode): a workgroup an output, its threads over the heads
            self.dispatch(LM, "indexer_scores_rows", 0, &params, &bindings, grid(n * m))?;
        }
        Ok(y)
    }

    /// Top-k columns per row (descending, ties to the lower column, −1 fill); one workgroup per
    /// row: a bitonic sort of the row's keys up to 2048 columns, a radix select past that; for at
    /// most [`TOPK_RANK_ROWS`] rows of at most 2048 columns (decode) each column ranked by its own
    /// thread over several workgroups a row (`topk_rows_rank`).
    pub(super) fn topk_rows(&self, x: &WgpuTensor, k: usize) -> Result<WgpuTensor> {
        const OP: &str = "topk_rows";
        let (n, m) = checks::topk_rows(x)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, vec![n, k], DType::I32)?;
        if n > 0 && k > 0 {
            let params = [n as u32, m as u32, k as u32];
            let bindings = [(1, x.binding()), (7, y.binding())];
            if n <= TOPK_RANK_ROWS && (1..=TOPK_SORT_COLUMNS).contains(&m) {
                let parts = m.div_ceil(TOPK_RANK_COLUMNS) as u32;
                self.dispatch(LM, "topk_rows_rank", 0, &params, &bindings, (parts, n as u32, 1))?;
            } else {
                self.dispatch(LM, OP, 0, &params, &bindings, grid(n))?;
            }
        }
        Ok(y)
    }

    /// Joint softmax over window keys ∪ selected compressed entries with a per-head sink. On a
    /// GPU a workgroup per (query, [`SINK_ATTENTION_PART_HEADS`] heads), each key row read once
    /// for those heads, which share it: for fewer than [`SINK_ATTENTION_SPLIT_BELOW`] pairs
    /// (decode) one per part of [`SINK_ATTENTION_PART_KEYS`] keys and a merge
    /// (`Options::split_attention_keys`), else one going through the parts itself
    /// (`sink_attention_heads`, an online softmax). On a software adapter one thread per (query,
    /// head) (`sink_attention_serial`, in the reference's summation order: lavapipe runs the
    /// workgroups' barriers and serial folds far slower; the shipped model's prefill in
    /// describe_image took 72 tokens/s with them against 91) where that thread's loops stay
    /// within [`SOFTWARE_LOOP_BUDGET`]; past it the split as on a GPU for few pairs, else a
    /// workgroup per (query, head) (`sink_attention`, the reference's order;
    /// `Options::per_pair_attention` runs it on a GPU too); where the per-pair kernel's loops do
    /// not fit either, `Error::Unsupported` (`Options::force_workgroup_attention` runs the GPUs'
    /// kernels there). A window or index out of range gives a NaN head.
    pub(super) fn sink_attention(
        &self,
        q: &WgpuTensor,
        kv: &WgpuTensor,
        window: &WgpuTensor,
        comp: Option<(&WgpuTensor, &WgpuTensor)>,
        sinks: &WgpuTensor,
        n_heads: usize,
    ) -> Result<WgpuTensor> {
        self.attend(q, kv, window, comp, sinks, n_heads, None)
    }

    /// [`Self::sink_attention`] with its output rotated back at the query positions: where the
    /// keys are split (decode) the merge rotates what it writes, one dispatch fewer; elsewhere
    /// `rope_tail_at` follows. The composition's sums, rotated by `rope_tail_at`'s arithmetic; a
    /// device may still round the rotation apart (NVIDIA's, by a fused multiply-add in one
    /// kernel and not the other: tests/wgpu_lane.rs bounds it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sink_attention_rope(
        &self,
        q: &WgpuTensor,
        kv: &WgpuTensor,
        window: &WgpuTensor,
        comp: Option<(&WgpuTensor, &WgpuTensor)>,
        sinks: &WgpuTensor,
        n_heads: usize,
        inv_freq: &WgpuTensor,
        positions: &WgpuTensor,
    ) -> Result<WgpuTensor> {
        self.attend(q, kv, window, comp, sinks, n_heads, Some((inv_freq, positions)))
    }

    /// `sink_attention`, and with `rope` = (inv_freq, positions) `sink_attention_rope`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &WgpuTensor,
        kv: &WgpuTensor,
        window: &WgpuTensor,
        comp: Option<(&WgpuTensor, &WgpuTensor)>,
        sinks: &WgpuTensor,
        n_heads: usize,
        rope: Option<(&WgpuTensor, &WgpuTensor)>,
    ) -> Result<WgpuTensor> {
        const OP: &str = "sink_attention";
        let (n, cols, hd, m, c_rows, kk) = checks::sink_attention(q, kv, window, comp, sinks, n_heads)?;
        let comp_inputs = comp.into_iter().flat_map(|(c, idx)| [("comp", c), ("comp_idx", idx)]);
        self.check_inputs(
            OP,
            [("q", q), ("kv", kv), ("window", window), ("sinks", sinks)].into_iter().chain(comp_inputs),
        )?;
        // the rotation's operands checked before anything is dispatched (the output is q's shape)
        let rd = match rope {
            Some((inv_freq, positions)) => {
                let (.., rd) = checks::rope_tail_at(q, n_heads, inv_freq, positions)?;
                self.check_inputs(OP, [("inv_freq", inv_freq), ("positions", positions)])?;
                rd
            }
            None => 0,
        };
        let total = n * n_heads;
        if hd > SINK_ATTENTION_MAX_HEAD_DIM {
            return Err(Self::unsupported(
                Op::SinkAttention,
                format!("head dim {hd} (at most {SINK_ATTENTION_MAX_HEAD_DIM})"),
            ));
        }
        let software = self.is_software();
        let serial = software
            && !self.opts.force_workgroup_attention
            && serial_attention_iterations(m, kk, hd) <= SOFTWARE_LOOP_BUDGET;
        if software && !serial && total > 0 && hd > 0 {
            // every kv row bounds a query's window keys; where that bound is over the budget the
            // widest window itself decides (read back: a prefill chunk's kv holds all its rows,
            // its queries see only their own windows)
            let mut keys = m;
            if workgroup_attention_iterations(keys, kk, hd) > SOFTWARE_LOOP_BUDGET {
                keys = self.widest_window(window, m)?;
            }
            self.check_loop_budget(Op::SinkAttention, workgroup_attention_iterations(keys, kk, hd), || {
                format!("{n} queries of {n_heads} heads of dim {hd} over {keys} window keys and {kk} compressed slots")
            })?;
        }
        let y = self.alloc(OP, vec![n, cols], DType::F32)?;
        if total > 0 && hd > 0 {
            let (cres, ires) = match comp {
                Some((c, idx)) => (c.binding(), idx.binding()),
                None => (self.dummy.as_entire_binding(), self.dummy.as_entire_binding()),
            };
            let scale = 1.0 / (hd as f32).sqrt();
            // a window holds at most m keys: parts for m + kk of them cover every query's
            let parts = (m + kk).div_ceil(SINK_ATTENTION_PART_KEYS);
            let record_bytes = (total * parts * (hd + 4) * 4) as u64;
            let split = !serial
                && self.opts.split_attention_keys
                && total < SINK_ATTENTION_SPLIT_BELOW
                && parts > 1
                && parts <= self.limits.max_compute_workgroups_per_dimension as usize
                && record_bytes <= self.max_binding;
            let mut params =
                vec![total as u32, n_heads as u32, hd as u32, m as u32, kk as u32, c_rows as u32, scale.to_bits()];
            let inputs = [(1, q.binding()), (2, kv.binding()), (3, cres), (4, window.binding()), (5, ires)];
            if split {
                params.push(parts as u32);
                let records = self.alloc(OP, vec![total * parts, hd + 4], DType::F32)?;
                let mut bindings = inputs.to_vec();
                bindings.push((6, records.binding()));
                let head_groups = n * n_heads.div_ceil(SINK_ATTENTION_PART_HEADS);
                let groups = (head_groups as u32, parts as u32, 1);
                self.dispatch(Shader::LmAttentionParts, "sink_attention_part", 0, &params, &bindings, groups)?;
                params.push(rd as u32);
                let (inv_freq, positions) = match rope {
                    Some((f, at)) => (f.binding(), at.binding()),
                    None => (self.dummy.as_entire_binding(), self.dummy.as_entire_binding()),
                };
                self.dispatch(
                    LM,
                    "sink_attention_merge",
                    0,
                    &params,
                    &[(1, records.binding()), (2, inv_freq), (4, positions), (9, sinks.binding()), (6, y.binding())],
                    (total as u32, 1, 1),
                )?;
                return Ok(y);
            } else {
                let (entry, groups) = if serial {
                    ("sink_attention_serial", grid(total.div_ceil(64)))
                } else if (software && !self.opts.force_workgroup_attention) || self.opts.per_pair_attention {
                    (OP, grid(total))
                } else {
                    ("sink_attention_heads", grid(n * n_heads.div_ceil(SINK_ATTENTION_PART_HEADS)))
                };
                let mut bindings = inputs.to_vec();
                bindings.extend([(9, sinks.binding()), (6, y.binding())]);
                self.dispatch(LM, entry, 0, &params, &bindings, groups)?;
            }
        }
        match rope {
            Some((inv_freq, positions)) => self.rope_tail_at(&y, n_heads, inv_freq, positions, true),
            None => Ok(y),
        }
    }

    /// The most window keys a query of `window` (`[n, 2]` inclusive bounds into `m` kv rows)
    /// has, read back from the device; an empty or out-of-range window (a NaN head) has none.
    fn widest_window(&self, window: &WgpuTensor, m: usize) -> Result<usize> {
        let bounds: Vec<i32> = bytemuck::pod_collect_to_vec(&self.read_back(window, 0, window.bytes)?);
        Ok(bounds
            .chunks_exact(2)
            .filter(|w| w[0] <= w[1] && w[0] >= 0 && (w[1] as usize) < m)
            .map(|w| (w[1] - w[0]) as usize + 1)
            .max()
            .unwrap_or(0))
    }
}

/// An upper bound on the loop iterations of one `indexer_scores_tiles` invocation (a pass through
/// a loop body counted, the pass that leaves included): for each head (heads + 1) its chunks of
/// 32 dims (⌈hd/32⌉ + 1), each with the two load loops (2 and 8 passes, each + 1 to leave) and
/// the dims (33) each with its 4 outputs (5), then the head's 4 outputs (5); and the last store
/// loop (5). 53 190 at the model's 64 heads of 128 (over the budget: a software adapter takes
/// the thread-per-output kernel there).
fn indexer_tile_iterations(heads: usize, hd: usize) -> usize {
    heads * (hd.div_ceil(32) * (1 + 3 + 9 + 33 + 32 * 5) + 1 + 5 + 1) + 1 + 5
}

/// An upper bound on the loop iterations of one `sink_attention_serial` invocation: the index
/// check (kk), zeroing its output (hd), and for each of at most m window keys and kk compressed
/// slots one iteration in each of three passes plus a dot product of hd in each pass and hd adds
/// in the last: (m + kk)·(4·hd + 3).
fn serial_attention_iterations(m: usize, kk: usize, hd: usize) -> usize {
    kk + hd + (m + kk) * (4 * hd + 3)
}

/// An upper bound on the loop iterations of one invocation of the workgroup kernel
/// (`sink_attention`, SA_THREADS 64, SA_TILE 1024) whose query sees at most `keys` window keys
/// and `kk` compressed slots; thread 0's vector loops longest (it folds each tile's max and
/// denominator alone). Per tile of `len` keys: the key loop of each pass (⌈len/64⌉ + 1 passes),
/// each pass a logit (hd + 1 in its branch's dot product, 1 in the other's, one pass of both
/// where a vector straddles window and compressed keys), taken again in passes 2 and 3 past one
/// tile; the folds (len + 1 each); and each key's value added to the thread's dims
/// ((len + 1)(⌈hd/64⌉ + 3)). With the index check, the NaN and zero fills and the tile loops.
/// Tight on Mesa 22.3: with the check lifted, one query of hd 4 came back right over 10 000 keys
/// (a bound of 64 643) and wrong over 10 500 (67 914).
fn workgroup_attention_iterations(keys: usize, kk: usize, hd: usize) -> usize {
    const THREADS: usize = 64;
    const TILE: usize = 1024;
    let all = keys + kk;
    let tiles = all.div_ceil(TILE).max(1);
    // Σ over the tiles of a strided key loop's passes, and of a serial loop's
    let strided = all.div_ceil(THREADS) + 2 * tiles;
    let serial = all + tiles;
    let logits = strided * (hd + 3) + tiles * hd;
    // past one tile the logits (and their exponentials) are taken again; else those loops only
    // pass once each, their bodies masked off
    let again = if tiles > 1 { logits + strided } else { 8 * tiles };
    let dims = hd.div_ceil(THREADS) + 1;
    let fixed = kk.div_ceil(THREADS) + 1 + 2 * dims + 3 * (tiles + 1);
    fixed + (logits + serial) + (again + strided + serial) + (again + strided + serial * (dims + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sink_attention`'s head-dim limit is each of its kernels' (the per-pair kernel's register
    /// dims, the head-group kernel's blocks of its threads), and its part sizes the split's.
    #[test]
    fn sink_attention_head_dim_limit_matches_lm_wgsl() {
        let wgsl = include_str!("../../../shaders/lm.wgsl");
        assert!(wgsl.contains("const SA_THREADS: u32 = 64u;") && wgsl.contains("const SA_DIMS: u32 = 16u;"));
        assert!(wgsl.contains("const SP_THREADS: u32 = 256u;") && wgsl.contains("const SH_BLOCKS: u32 = 4u;"));
        assert_eq!(SINK_ATTENTION_MAX_HEAD_DIM, 64 * 16);
        assert_eq!(SINK_ATTENTION_MAX_HEAD_DIM, 4 * 256);
        assert!(wgsl.contains(&format!("const SP_HEADS: u32 = {SINK_ATTENTION_PART_HEADS}u;")));
        // the part keys' default (sink_attention_heads') and the split's override: divisors of the
        // threads with whole logits a thread, within the arrays' sizes
        assert!(wgsl.contains("override SP_KEYS: u32 = 64u;") && wgsl.contains("const SP_KEYS_MAX: u32 = 64u;"));
        for keys in [64, SINK_ATTENTION_PART_KEYS] {
            assert!(
                keys <= 64 && 256usize.is_multiple_of(keys) && (SINK_ATTENTION_PART_HEADS * keys).is_multiple_of(256),
                "{keys}"
            );
        }
    }

    /// `hc_split_pre_norm`'s limits are the kernel's (its staging array, the row groups its
    /// threads hold, `HC_MAX`), and the released geometry's decode row (hc 4, 16 384 inputs, so 24
    /// mix rows) fits them.
    #[test]
    fn hc_split_pre_norm_limits_match_lm_wgsl() {
        let wgsl = include_str!("../../../shaders/lm.wgsl");
        assert!(wgsl.contains(&format!("const HS_STAGE: u32 = {HS_STAGE}u;")));
        assert!(wgsl.contains(&format!("const HS_HELD: u32 = {}u;", HS_HELD_WIDTH / 1024)));
        assert!(wgsl.contains(&format!("const HC_MAX: u32 = {HC_MAX}u;")));
        let (w, k) = (24, 16384);
        assert!(rows::k_slice(w, k) >= 256 && k.div_ceil(rows::k_slice(w, k)) * (w + 1) <= HS_STAGE);
    }

    /// The indexer's tiles are the kernel's, and the model's indexer (64 heads of 128) is past the
    /// loop budget in them (a software adapter takes the thread-per-output kernel).
    #[test]
    fn indexer_tiles_match_lm_wgsl() {
        let wgsl = include_str!("../../../shaders/lm.wgsl");
        assert!(wgsl.contains(&format!("const IT_ROWS: u32 = {INDEXER_TILE_ROWS}u;")));
        assert!(wgsl.contains(&format!("const IT_COLS: u32 = {INDEXER_TILE_COLS}u;")));
        assert!(wgsl.contains("const IT_DIMS: u32 = 32u;"));
        assert_eq!(indexer_tile_iterations(64, 128), 53_190);
        assert!(indexer_tile_iterations(64, 128) > SOFTWARE_LOOP_BUDGET);
    }

    /// The router's limits are the kernel's: its workgroup memory holds ROUTE_MAX_EXPERTS scores
    /// and a thread a slot.
    #[test]
    fn route_limits_match_lm_wgsl() {
        let wgsl = include_str!("../../../shaders/lm.wgsl");
        assert!(wgsl.contains(&format!("const RE_CACHE: u32 = {ROUTE_MAX_EXPERTS}u;")));
        assert!(wgsl.contains(&format!("const RE_THREADS: u32 = {ROUTE_MAX_K}u;")));
        assert!(wgsl.contains("const RE_K_MAX: u32 = RE_THREADS;"));
        assert!(wgsl.contains("@compute @workgroup_size(256, 1, 1)\nfn route_experts("));
    }
}
