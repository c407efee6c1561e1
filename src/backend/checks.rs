//! Operand checks of the contract's ops that do not depend on the device: dtypes, ranks and how
//! the shapes of an op's operands fit together. One function per op, named after it; each returns
//! the sizes the lanes go on with, or the `Error::Shape` naming the op that the GPU lanes have
//! always returned (tests match on the op and on these texts).
//!
//! What stays in a lane: limits of its device (bindings, grids, shared memory, 32-bit sizes), and
//! formats or head widths its kernels do not implement (`Error::Unsupported`). One such limit is
//! here all the same, `moe_one_format` (the CUDA lane's), beside the op's check so that a unit test
//! covers it without a device.
//!
//! Shapes follow `DeviceTensor`: a tensor of any rank ≥ 1 is read as `[rows, cols]` with `rows` its
//! first dimension and `cols` the product of the others.

use crate::backend::{DType, DeviceTensor, DeviceWeight, WeightFormat};
use crate::error::{Error, Result};

/// A weight as the checks see it: its `DeviceWeight` sizes plus the checkpoint name that the GPU
/// lanes put in their errors.
pub(crate) trait NamedWeight: DeviceWeight {
    fn name(&self) -> &str;
}

fn numel(t: &impl DeviceTensor) -> usize {
    t.shape().iter().product()
}

/// Operand `what` of `op` has `dtype` and at least one dimension.
pub(crate) fn input(op: &'static str, what: &str, t: &impl DeviceTensor, dtype: DType) -> Result<()> {
    if t.dtype() != dtype {
        return Err(Error::shape(op, format!("{what} must be {dtype}, found {}", t.dtype())));
    }
    if t.shape().is_empty() {
        return Err(Error::shape(op, format!("{what} must have at least one dimension")));
    }
    Ok(())
}

/// `what` `[n, heads·hd]` (already checked by `input`) splits into `n_heads` heads:
/// `(n, heads·hd, hd)`.
fn heads(op: &'static str, what: &str, t: &impl DeviceTensor, n_heads: usize) -> Result<(usize, usize, usize)> {
    let (n, cols) = (t.rows(), t.cols());
    if n_heads == 0 || cols % n_heads != 0 {
        return Err(Error::shape(op, format!("{what} {:?} does not split into {n_heads} heads", t.shape())));
    }
    Ok((n, cols, cols / n_heads))
}

/// `e` from the check of a fused op's part, reported as the fused op's.
fn renamed(op: &'static str, e: Error) -> Error {
    match e {
        Error::Shape { msg, .. } => Error::Shape { op, msg },
        e => e,
    }
}

/// `name` `[n, 2h]` (f32, gate then up) → `(n, h)`.
fn gated(op: &'static str, name: &str, x: &impl DeviceTensor) -> Result<(usize, usize)> {
    input(op, name, x, DType::F32)?;
    let (n, d) = (x.rows(), x.cols());
    if d % 2 != 0 {
        return Err(Error::shape(op, format!("{name} {:?} has an odd number of columns", x.shape())));
    }
    Ok((n, d / 2))
}

// ---- linear & elementwise ------------------------------------------------------------------

/// [`linear`]'s operands for two weights of one input, no bias → `(n, in)`.
pub(crate) fn linear_pair<T: DeviceTensor>(
    x: &T,
    wa: &impl NamedWeight,
    wb: &impl NamedWeight,
) -> Result<(usize, usize)> {
    const OP: &str = "linear_pair";
    linear::<T>(x, wa, None).map_err(|e| renamed(OP, e))?;
    linear::<T>(x, wb, None).map_err(|e| renamed(OP, e))
}

/// x `[n, k]`, W `[out, k]`, bias `[out]` → `(n, k)`.
pub(crate) fn linear<T: DeviceTensor>(x: &T, w: &impl NamedWeight, bias: Option<&T>) -> Result<(usize, usize)> {
    const OP: &str = "linear";
    input(OP, "x", x, DType::F32)?;
    let (n, k) = (x.rows(), x.cols());
    if k != w.cols() {
        return Err(Error::shape(
            OP,
            format!("x {:?} has {k} columns, weight `{}` has {} (in_features)", x.shape(), w.name(), w.cols()),
        ));
    }
    if let Some(b) = bias {
        bias_of(OP, b, w)?;
    }
    Ok((n, k))
}

/// x `[n, k]`, weight `[out, k]`, bias `[out]`, residual `[n, out]` → `(n, k)`.
pub(crate) fn linear_add<T: DeviceTensor>(
    x: &T,
    w: &impl NamedWeight,
    bias: Option<&T>,
    residual: &T,
) -> Result<(usize, usize)> {
    const OP: &str = "linear_add";
    let (n, k) = linear(x, w, bias).map_err(|e| renamed(OP, e))?;
    input(OP, "residual", residual, DType::F32)?;
    if residual.rows() != n || residual.cols() != w.rows() {
        return Err(Error::shape(
            OP,
            format!(
                "residual {:?} for x {:?} by weight `{}` with {} rows",
                residual.shape(),
                x.shape(),
                w.name(),
                w.rows()
            ),
        ));
    }
    Ok((n, k))
}

/// x `[n, k]`, norm `[k]`, weight `[out, k]`, bias `[out]` → `(n, k)`.
pub(crate) fn rms_norm_linear<T: DeviceTensor>(
    x: &T,
    norm: &T,
    w: &impl NamedWeight,
    bias: Option<&T>,
) -> Result<(usize, usize)> {
    const OP: &str = "rms_norm_linear";
    input(OP, "norm", norm, DType::F32)?;
    let (n, k) = linear(x, w, bias).map_err(|e| renamed(OP, e))?;
    if numel(norm) != k {
        return Err(Error::shape(OP, format!("norm {:?} for x {:?}", norm.shape(), x.shape())));
    }
    Ok((n, k))
}

/// gate_up `[n, 2h]`, weight `[out, h]`, residual `[n, out]` → `(n, h)`.
pub(crate) fn swiglu_linear_add<T: DeviceTensor>(
    gate_up: &T,
    w: &impl NamedWeight,
    residual: &T,
) -> Result<(usize, usize)> {
    const OP: &str = "swiglu_linear_add";
    let (n, h) = gated(OP, "gate_up", gate_up)?;
    if w.cols() != h {
        let (shape, name, cols) = (gate_up.shape(), w.name(), w.cols());
        return Err(Error::shape(OP, format!("gate_up {shape:?} gates {h} columns, weight `{name}` takes {cols}")));
    }
    input(OP, "residual", residual, DType::F32)?;
    if residual.rows() != n || residual.cols() != w.rows() {
        let (r, name, rows) = (residual.shape(), w.name(), w.rows());
        return Err(Error::shape(OP, format!("residual {r:?} for {n} rows by weight `{name}` with {rows} rows")));
    }
    Ok((n, h))
}

/// x `[n, d]`, weight `[d]` → `(n, d)`.
pub(crate) fn rms_norm<T: DeviceTensor>(x: &T, weight: &T) -> Result<(usize, usize)> {
    const OP: &str = "rms_norm";
    input(OP, "x", x, DType::F32)?;
    input(OP, "weight", weight, DType::F32)?;
    let (n, d) = (x.rows(), x.cols());
    if numel(weight) != d {
        return Err(Error::shape(OP, format!("weight {:?} for x {:?}", weight.shape(), x.shape())));
    }
    Ok((n, d))
}

/// a, b of one shape (f32).
pub(crate) fn add<T: DeviceTensor>(a: &T, b: &T) -> Result<()> {
    const OP: &str = "add";
    input(OP, "a", a, DType::F32)?;
    input(OP, "b", b, DType::F32)?;
    if a.shape() != b.shape() {
        return Err(Error::shape(OP, format!("a {:?} and b {:?} differ", a.shape(), b.shape())));
    }
    Ok(())
}

/// x `[n, d]`, columns `start..start+len` inside `0..d` → `(n, d)`.
pub(crate) fn slice_cols(x: &impl DeviceTensor, start: usize, len: usize) -> Result<(usize, usize)> {
    const OP: &str = "slice_cols";
    input(OP, "x", x, DType::F32)?;
    let (n, d) = (x.rows(), x.cols());
    if start.checked_add(len).is_none_or(|end| end > d) {
        return Err(Error::shape(OP, format!("columns {start}..{} of x {:?}", start.saturating_add(len), x.shape())));
    }
    Ok((n, d))
}

/// a `[n, d]`, b `[m, d]` of one dtype (f32 or i32).
pub(crate) fn concat_rows<T: DeviceTensor>(a: &T, b: &T) -> Result<()> {
    const OP: &str = "concat_rows";
    if a.dtype() != b.dtype() {
        return Err(Error::shape(OP, format!("a is {}, b is {}", a.dtype(), b.dtype())));
    }
    input(OP, "a", a, a.dtype())?;
    input(OP, "b", b, b.dtype())?;
    if a.cols() != b.cols() {
        return Err(Error::shape(OP, format!("a {:?} and b {:?} differ in columns", a.shape(), b.shape())));
    }
    Ok(())
}

/// src `[m, d]` (f32), idx i32 `[n]` → `(m, d, n)`. The indices themselves are the kernel's to
/// check (a GPU lane cannot read them without a host round trip).
pub(crate) fn gather_rows<T: DeviceTensor>(src: &T, idx: &T) -> Result<(usize, usize, usize)> {
    const OP: &str = "gather_rows";
    input(OP, "src", src, DType::F32)?;
    input(OP, "idx", idx, DType::I32)?;
    Ok((src.rows(), src.cols(), numel(idx)))
}

/// x `[n, 2h]` → `(n, h)`.
pub(crate) fn swiglu(x: &impl DeviceTensor) -> Result<(usize, usize)> {
    gated("swiglu", "x", x)
}

/// x f32.
pub(crate) fn gelu_erf(x: &impl DeviceTensor) -> Result<()> {
    input("gelu_erf", "x", x, DType::F32)
}

// ---- vision ------------------------------------------------------------------------------

/// x `[n, heads·hd]` with hd a multiple of 4 and n a whole grid of width `grid_w` → `(n, hd)`.
pub(crate) fn rope_2d(x: &impl DeviceTensor, n_heads: usize, grid_w: usize) -> Result<(usize, usize)> {
    const OP: &str = "rope_2d";
    input(OP, "x", x, DType::F32)?;
    let (n, _, hd) = heads(OP, "x", x, n_heads)?;
    if hd % 4 != 0 {
        return Err(Error::shape(OP, format!("head dim {hd} is not a multiple of 4")));
    }
    if grid_w == 0 || n % grid_w != 0 {
        return Err(Error::shape(OP, format!("{n} rows are not a whole grid of width {grid_w}")));
    }
    Ok((n, hd))
}

/// q, k, v `[n, heads·hd]`, one shape → `(n, hd)`.
pub(crate) fn attention<T: DeviceTensor>(q: &T, k: &T, v: &T, n_heads: usize) -> Result<(usize, usize)> {
    const OP: &str = "attention";
    input(OP, "q", q, DType::F32)?;
    input(OP, "k", k, DType::F32)?;
    input(OP, "v", v, DType::F32)?;
    if q.shape() != k.shape() || q.shape() != v.shape() {
        return Err(Error::shape(OP, format!("q {:?}, k {:?}, v {:?} differ", q.shape(), k.shape(), v.shape())));
    }
    let (n, _, hd) = heads(OP, "q", q, n_heads)?;
    Ok((n, hd))
}

/// qkv `[n, 3·heads·hd]` (q | k | v) with hd a multiple of 4 and n a whole grid of width
/// `grid_w` → `(n, hd)`.
pub(crate) fn attention_rope_2d(qkv: &impl DeviceTensor, n_heads: usize, grid_w: usize) -> Result<(usize, usize)> {
    const OP: &str = "attention_rope_2d";
    input(OP, "qkv", qkv, DType::F32)?;
    let (n, cols) = (qkv.rows(), qkv.cols());
    if n_heads == 0 || cols % (3 * n_heads) != 0 {
        return Err(Error::shape(
            OP,
            format!("qkv {:?} does not split into q, k and v of {n_heads} heads", qkv.shape()),
        ));
    }
    let hd = cols / (3 * n_heads);
    if hd % 4 != 0 {
        return Err(Error::shape(OP, format!("head dim {hd} is not a multiple of 4")));
    }
    if grid_w == 0 || n % grid_w != 0 {
        return Err(Error::shape(OP, format!("{n} rows are not a whole grid of width {grid_w}")));
    }
    Ok((n, hd))
}

/// x `[h·w, c]`, r ≥ 1 → c.
pub(crate) fn unfold(x: &impl DeviceTensor, h: usize, w: usize, r: usize) -> Result<usize> {
    const OP: &str = "unfold";
    input(OP, "x", x, DType::F32)?;
    if h.checked_mul(w) != Some(x.rows()) || r == 0 {
        return Err(Error::shape(OP, format!("x {:?} is not a {h}x{w} grid (r = {r})", x.shape())));
    }
    Ok(x.cols())
}

/// x `[h·w, c]`, weight `[out, c·r²]`, bias `[out]` → `(c, cells, c·r²)` with
/// `cells = ceil(h/r)·ceil(w/r)`.
pub(crate) fn unfold_linear_gelu<T: DeviceTensor>(
    x: &T,
    h: usize,
    w: usize,
    r: usize,
    weight: &impl NamedWeight,
    bias: Option<&T>,
) -> Result<(usize, usize, usize)> {
    const OP: &str = "unfold_linear_gelu";
    input(OP, "x", x, DType::F32)?;
    if h.checked_mul(w) != Some(x.rows()) || r == 0 {
        return Err(Error::shape(OP, format!("x {:?} is not a {h}x{w} grid (r = {r})", x.shape())));
    }
    let c = x.cols();
    let feat = r.checked_mul(r).and_then(|rr| rr.checked_mul(c));
    if feat != Some(weight.cols()) {
        return Err(Error::shape(
            OP,
            format!(
                "weight `{}` has {} columns (in_features), the {r}x{r} cells of x {:?} have {c}·{r}·{r}",
                weight.name(),
                weight.cols(),
                x.shape()
            ),
        ));
    }
    if let Some(b) = bias {
        bias_of(OP, b, weight)?;
    }
    Ok((c, h.div_ceil(r) * w.div_ceil(r), weight.cols()))
}

/// A bias `[out]` for a weight of `out` rows.
fn bias_of(op: &'static str, b: &impl DeviceTensor, w: &impl NamedWeight) -> Result<()> {
    input(op, "bias", b, DType::F32)?;
    if numel(b) != w.rows() {
        return Err(Error::shape(op, format!("bias {:?} for weight `{}` with {} rows", b.shape(), w.name(), w.rows())));
    }
    Ok(())
}

// ---- language model ----------------------------------------------------------------------

/// table `[vocab, d]`, ids i32 `[n]` → `(n, d)`.
pub(crate) fn embed_rows(table: &impl DeviceWeight, ids: &impl DeviceTensor) -> Result<(usize, usize)> {
    input("embed_rows", "ids", ids, DType::I32)?;
    Ok((numel(ids), table.cols()))
}

/// x `[n, d]` → `(n, d)`.
pub(crate) fn hc_expand(x: &impl DeviceTensor) -> Result<(usize, usize)> {
    input("hc_expand", "x", x, DType::F32)?;
    Ok((x.rows(), x.cols()))
}

/// x `[n, heads·hd]` → `(n, heads·hd)`.
pub(crate) fn rms_norm_heads(x: &impl DeviceTensor, n_heads: usize) -> Result<(usize, usize)> {
    input("rms_norm_heads", "x", x, DType::F32)?;
    let (n, cols, _) = heads("rms_norm_heads", "x", x, n_heads)?;
    Ok((n, cols))
}

/// mix `[n, (2+hc)·hc]`, scale `[3]`, base `[(2+hc)·hc]` → `(n, (2+hc)·hc)`.
pub(crate) fn hc_split<T: DeviceTensor>(mix: &T, scale: &T, base: &T, hc: usize) -> Result<(usize, usize)> {
    const OP: &str = "hc_split";
    for (what, t) in [("mix", mix), ("scale", scale), ("base", base)] {
        input(OP, what, t, DType::F32)?;
    }
    let (n, w) = (mix.rows(), mix.cols());
    if Some(w) != hc.checked_add(2).and_then(|h2| h2.checked_mul(hc)) || numel(scale) != 3 || numel(base) != w {
        return Err(Error::shape(
            OP,
            format!("mix {:?}, scale {:?}, base {:?} do not fit hc = {hc}", mix.shape(), scale.shape(), base.shape()),
        ));
    }
    Ok((n, w))
}

/// X `[n, k]`, mix `[(2+hc)·hc, k]`, scale `[3]`, base `[(2+hc)·hc]` → `(n, k, (2+hc)·hc)`.
pub(crate) fn hc_mix_split<T: DeviceTensor>(
    x: &T,
    mix: &impl NamedWeight,
    scale: &T,
    base: &T,
    hc: usize,
) -> Result<(usize, usize, usize)> {
    const OP: &str = "hc_mix_split";
    for (what, t) in [("x", x), ("scale", scale), ("base", base)] {
        input(OP, what, t, DType::F32)?;
    }
    let (n, k) = (x.rows(), x.cols());
    let w = hc.checked_add(2).and_then(|h2| h2.checked_mul(hc));
    if Some(mix.rows()) != w || mix.cols() != k || numel(scale) != 3 || Some(numel(base)) != w {
        return Err(Error::shape(
            OP,
            format!(
                "x {:?}, mix `{}` [{}, {}], scale {:?}, base {:?} do not fit hc = {hc}",
                x.shape(),
                mix.name(),
                mix.rows(),
                mix.cols(),
                scale.shape(),
                base.shape()
            ),
        ));
    }
    Ok((n, k, mix.rows()))
}

/// X `[n, hc·d]`, w `[n, c]` with c ≥ hc → `(n, d, c)`.
pub(crate) fn hc_pre<T: DeviceTensor>(x: &T, w: &T, hc: usize) -> Result<(usize, usize, usize)> {
    const OP: &str = "hc_pre";
    input(OP, "x", x, DType::F32)?;
    input(OP, "w", w, DType::F32)?;
    let (n, cols) = (x.rows(), x.cols());
    if w.rows() != n || hc == 0 || w.cols() < hc || cols % hc != 0 {
        return Err(Error::shape(OP, format!("x {:?} and w {:?} do not fit hc = {hc}", x.shape(), w.shape())));
    }
    Ok((n, cols / hc, w.cols()))
}

/// [`hc_pre`]'s operands plus the norm weight `[d]` → `(n, d, c)`.
pub(crate) fn hc_pre_norm<T: DeviceTensor>(x: &T, w: &T, hc: usize, weight: &T) -> Result<(usize, usize, usize)> {
    const OP: &str = "hc_pre_norm";
    let (n, d, wc) = hc_pre(x, w, hc).map_err(|e| renamed(OP, e))?;
    input(OP, "weight", weight, DType::F32)?;
    if numel(weight) != d {
        return Err(Error::shape(
            OP,
            format!("weight {:?} for rows of {d} (x {:?}, hc = {hc})", weight.shape(), x.shape()),
        ));
    }
    Ok((n, d, wc))
}

/// [`hc_mix_split`]'s operands plus the norm weight `[d]` of `hc_pre_norm` (x `[n, hc·d]`) →
/// `(n, hc·d, (2+hc)·hc, d)`.
pub(crate) fn hc_mix_split_pre_norm<T: DeviceTensor>(
    x: &T,
    mix: &impl NamedWeight,
    scale: &T,
    base: &T,
    hc: usize,
    weight: &T,
) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "hc_mix_split_pre_norm";
    let (n, k, w) = hc_mix_split(x, mix, scale, base, hc).map_err(|e| renamed(OP, e))?;
    input(OP, "weight", weight, DType::F32)?;
    if hc == 0 || k % hc != 0 || numel(weight) != k / hc {
        return Err(Error::shape(
            OP,
            format!("weight {:?} for x {:?} in hc = {hc} streams", weight.shape(), x.shape()),
        ));
    }
    Ok((n, k, w, k / hc))
}

/// `hc_post(x, f, split)` then `hc_mix_split_pre_norm` of its output with `hc` streams: X
/// `[n, hc·d]`, f `[n, d]`, split `[n, (2+hc)·hc]`, mix `[(2+hc)·hc, hc·d]`, weight `[d]` →
/// `(n, hc·d, (2+hc)·hc)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn hc_post_mix_split_pre_norm<T: DeviceTensor>(
    x: &T,
    f: &T,
    split: &T,
    mix: &impl NamedWeight,
    scale: &T,
    base: &T,
    hc: usize,
    weight: &T,
) -> Result<(usize, usize, usize)> {
    const OP: &str = "hc_post_mix_split_pre_norm";
    let (_, _, _, streams) = hc_post(x, f, split).map_err(|e| renamed(OP, e))?;
    if streams != hc {
        return Err(Error::shape(OP, format!("split {:?} is for {streams} streams, not hc = {hc}", split.shape())));
    }
    let (n, k, w, _) = hc_mix_split_pre_norm(x, mix, scale, base, hc, weight).map_err(|e| renamed(OP, e))?;
    Ok((n, k, w))
}

/// X `[n, hc·d]`, f `[n, d]`, split `[n, (2+hc)·hc]` → `(n, hc·d, d, hc)`.
pub(crate) fn hc_post<T: DeviceTensor>(x: &T, f: &T, split: &T) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "hc_post";
    for (what, t) in [("x", x), ("f", f), ("split", split)] {
        input(OP, what, t, DType::F32)?;
    }
    let (n, cols, d) = (x.rows(), x.cols(), f.cols());
    let hc = if d == 0 { 0 } else { cols / d };
    if f.rows() != n || split.rows() != n || hc == 0 || hc * d != cols || split.cols() != (2 + hc) * hc {
        return Err(Error::shape(
            OP,
            format!("x {:?}, f {:?}, split {:?} do not fit", x.shape(), f.shape(), split.shape()),
        ));
    }
    Ok((n, cols, d, hc))
}

/// mix `[n, hc]`, scale `[1]`, base `[hc]` → `(n, hc)`.
pub(crate) fn hc_head_weights<T: DeviceTensor>(mix: &T, scale: &T, base: &T) -> Result<(usize, usize)> {
    const OP: &str = "hc_head_weights";
    for (what, t) in [("mix", mix), ("scale", scale), ("base", base)] {
        input(OP, what, t, DType::F32)?;
    }
    let (n, hc) = (mix.rows(), mix.cols());
    if numel(scale) != 1 || numel(base) != hc {
        return Err(Error::shape(
            OP,
            format!("mix {:?}, scale {:?}, base {:?} do not fit", mix.shape(), scale.shape(), base.shape()),
        ));
    }
    Ok((n, hc))
}

/// x `[n, heads·hd]`, inv_freq `[rd/2]` with rd ≤ hd → `(n, heads·hd, hd, rd)`.
pub(crate) fn rope_tail<T: DeviceTensor>(x: &T, n_heads: usize, inv_freq: &T) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "rope_tail";
    input(OP, "x", x, DType::F32)?;
    input(OP, "inv_freq", inv_freq, DType::F32)?;
    let (n, cols, hd) = heads(OP, "x", x, n_heads)?;
    let rd = 2 * numel(inv_freq);
    if rd > hd {
        return Err(Error::shape(OP, format!("{rd} rotary dims exceed head_dim {hd}")));
    }
    Ok((n, cols, hd, rd))
}

/// [`rope_tail`]'s operands plus positions i32 `[n]` → `(n, heads·hd, hd, rd)`.
pub(crate) fn rope_tail_at<T: DeviceTensor>(
    x: &T,
    n_heads: usize,
    inv_freq: &T,
    positions: &T,
) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "rope_tail_at";
    input(OP, "x", x, DType::F32)?;
    input(OP, "inv_freq", inv_freq, DType::F32)?;
    input(OP, "positions", positions, DType::I32)?;
    let (n, cols, hd) = heads(OP, "x", x, n_heads)?;
    let rd = 2 * numel(inv_freq);
    if rd > hd {
        return Err(Error::shape(OP, format!("{rd} rotary dims exceed head_dim {hd}")));
    }
    if positions.shape().len() != 1 || numel(positions) != n {
        return Err(Error::shape(OP, format!("positions {:?} for {n} rows", positions.shape())));
    }
    Ok((n, cols, hd, rd))
}

/// [`rope_tail_at`]'s operands plus an optional norm weight `[hd]` (one head only) →
/// `(n, heads·hd, hd, rd)`.
pub(crate) fn rms_norm_rope<T: DeviceTensor>(
    x: &T,
    weight: Option<&T>,
    n_heads: usize,
    inv_freq: &T,
    positions: &T,
) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "rms_norm_rope";
    let (n, cols, hd, rd) = rope_tail_at(x, n_heads, inv_freq, positions).map_err(|e| renamed(OP, e))?;
    if let Some(w) = weight {
        input(OP, "weight", w, DType::F32)?;
        if n_heads != 1 || numel(w) != hd {
            return Err(Error::shape(
                OP,
                format!("a norm weight {:?} needs one head of its width, not {n_heads} of {hd}", w.shape()),
            ));
        }
    }
    Ok((n, cols, hd, rd))
}

/// q `[n, heads·hd]`, kv `[m, hd]`, window i32 `[n, 2]`, comp (`[c, hd]`, idx i32 `[n, k]`),
/// sinks `[heads]` → `(n, heads·hd, hd, m, c, k)` (`c = k = 0` without compressed entries).
#[allow(clippy::type_complexity)]
pub(crate) fn sink_attention<T: DeviceTensor>(
    q: &T,
    kv: &T,
    window: &T,
    comp: Option<(&T, &T)>,
    sinks: &T,
    n_heads: usize,
) -> Result<(usize, usize, usize, usize, usize, usize)> {
    const OP: &str = "sink_attention";
    input(OP, "q", q, DType::F32)?;
    input(OP, "kv", kv, DType::F32)?;
    input(OP, "window", window, DType::I32)?;
    input(OP, "sinks", sinks, DType::F32)?;
    let (n, cols, hd) = heads(OP, "q", q, n_heads)?;
    let (m, kd) = (kv.rows(), kv.cols());
    if kd != hd || numel(window) != 2 * n || numel(sinks) != n_heads {
        return Err(Error::shape(
            OP,
            format!(
                "q {:?}, kv {:?}, window {:?}, sinks {:?} do not fit",
                q.shape(),
                kv.shape(),
                window.shape(),
                sinks.shape()
            ),
        ));
    }
    let (c_rows, kk) = match comp {
        Some((c, idx)) => {
            input(OP, "comp", c, DType::F32)?;
            input(OP, "comp_idx", idx, DType::I32)?;
            if c.cols() != hd || idx.rows() != n {
                return Err(Error::shape(
                    OP,
                    format!("comp {:?} / comp_idx {:?} do not fit q {:?}", c.shape(), idx.shape(), q.shape()),
                ));
            }
            (c.rows(), idx.cols())
        }
        None => (0, 0),
    };
    Ok((n, cols, hd, m, c_rows, kk))
}

/// x `[n, g·k]`, W `[g·r, k]` → `(n, k, r)`.
pub(crate) fn grouped_linear(
    x: &impl DeviceTensor,
    w: &impl NamedWeight,
    groups: usize,
) -> Result<(usize, usize, usize)> {
    const OP: &str = "grouped_linear";
    input(OP, "x", x, DType::F32)?;
    let (n, cols) = (x.rows(), x.cols());
    if groups == 0 || groups.checked_mul(w.cols()) != Some(cols) || w.rows() % groups != 0 {
        return Err(Error::shape(
            OP,
            format!(
                "x {:?} and weight `{}` [{}, {}] do not split into {groups} groups",
                x.shape(),
                w.name(),
                w.rows(),
                w.cols()
            ),
        ));
    }
    Ok((n, w.cols(), w.rows() / groups))
}

/// kv, gate `[T, w]`, ape `[ratio, w]` (w even with overlap) → `(⌊T/ratio⌋, d, w)` with
/// `d = w/2` with overlap, else `w`.
pub(crate) fn compress_pool<T: DeviceTensor>(
    kv: &T,
    gate: &T,
    ape: &T,
    ratio: usize,
    overlap: bool,
) -> Result<(usize, usize, usize)> {
    const OP: &str = "compress_pool";
    for (what, t) in [("kv", kv), ("gate", gate), ("ape", ape)] {
        input(OP, what, t, DType::F32)?;
    }
    let (t, w) = (kv.rows(), kv.cols());
    if gate.shape() != kv.shape() || ratio == 0 || ape.rows() != ratio || ape.cols() != w || (overlap && w % 2 != 0) {
        return Err(Error::shape(
            OP,
            format!("kv {:?}, gate {:?}, ape {:?}, ratio {ratio}", kv.shape(), gate.shape(), ape.shape()),
        ));
    }
    let d = if overlap { w / 2 } else { w };
    Ok((t / ratio, d, w))
}

/// q `[n, heads·hd]`, k `[m, hd]`, w `[n, heads]`, ratio ≥ 1 → `(n, m, hd)`.
pub(crate) fn indexer_scores<T: DeviceTensor>(
    q: &T,
    k: &T,
    w: &T,
    n_heads: usize,
    ratio: usize,
) -> Result<(usize, usize, usize)> {
    const OP: &str = "indexer_scores";
    for (what, t) in [("q", q), ("k", k), ("w", w)] {
        input(OP, what, t, DType::F32)?;
    }
    let (n, cols) = (q.rows(), q.cols());
    let (m, hd) = (k.rows(), k.cols());
    if n_heads == 0 || n_heads.checked_mul(hd) != Some(cols) || w.rows() != n || w.cols() != n_heads || ratio == 0 {
        return Err(Error::shape(
            OP,
            format!(
                "q {:?}, k {:?}, w {:?} do not fit ({n_heads} heads, ratio {ratio})",
                q.shape(),
                k.shape(),
                w.shape()
            ),
        ));
    }
    Ok((n, m, hd))
}

/// x `[n, m]` → `(n, m)`.
pub(crate) fn topk_rows(x: &impl DeviceTensor) -> Result<(usize, usize)> {
    input("topk_rows", "x", x, DType::F32)?;
    Ok((x.rows(), x.cols()))
}

/// x f32.
pub(crate) fn sqrt_softplus(x: &impl DeviceTensor) -> Result<()> {
    input("sqrt_softplus", "x", x, DType::F32)
}

/// table i32 `[vocab, k]`, ids i32 `[n]`, fallback i32 `[n, k]` → `(vocab, k, n)`.
pub(crate) fn hash_route<T: DeviceTensor>(table: &T, ids: &T, fallback: &T) -> Result<(usize, usize, usize)> {
    const OP: &str = "hash_route";
    input(OP, "table", table, DType::I32)?;
    input(OP, "ids", ids, DType::I32)?;
    input(OP, "fallback", fallback, DType::I32)?;
    let (vocab, k) = (table.rows(), table.cols());
    let n = fallback.rows();
    if fallback.cols() != k || numel(ids) != n {
        return Err(Error::shape(
            OP,
            format!("table {:?}, ids {:?}, fallback {:?} do not fit", table.shape(), ids.shape(), fallback.shape()),
        ));
    }
    Ok((vocab, k, n))
}

/// scores `[n, e]`, ids i32 `[n, k]` → `(n, e, k)`. The ids themselves are the kernel's to check.
pub(crate) fn route_weights<T: DeviceTensor>(scores: &T, ids: &T) -> Result<(usize, usize, usize)> {
    const OP: &str = "route_weights";
    input(OP, "scores", scores, DType::F32)?;
    input(OP, "ids", ids, DType::I32)?;
    let (n, e) = (scores.rows(), scores.cols());
    if ids.rows() != n {
        return Err(Error::shape(OP, format!("ids {:?} do not index scores {:?}", ids.shape(), scores.shape())));
    }
    Ok((n, e, ids.cols()))
}

/// logits `[n, e]`, bias `[kinds, e]`, kind i32 `[n]`, hash = (table i32 `[vocab, k]`, token ids
/// i32 `[n]`) → `(n, e)`. The kinds and expert ids themselves are the kernel's to check.
pub(crate) fn route_experts<T: DeviceTensor>(
    logits: &T,
    bias: &T,
    kind: &T,
    hash: Option<(&T, &T)>,
    k: usize,
) -> Result<(usize, usize)> {
    const OP: &str = "route_experts";
    input(OP, "logits", logits, DType::F32)?;
    input(OP, "bias", bias, DType::F32)?;
    input(OP, "kind", kind, DType::I32)?;
    let (n, e) = (logits.rows(), logits.cols());
    if logits.shape().len() != 2 || bias.shape().len() != 2 || bias.cols() != e || numel(kind) != n {
        return Err(Error::shape(
            OP,
            format!("logits {:?}, bias {:?}, kind {:?} do not fit", logits.shape(), bias.shape(), kind.shape()),
        ));
    }
    if let Some((table, tok)) = hash {
        input(OP, "table", table, DType::I32)?;
        input(OP, "token ids", tok, DType::I32)?;
        if table.cols() != k || numel(tok) != n {
            return Err(Error::shape(
                OP,
                format!("table {:?}, token ids {:?} do not fit {n} rows, k = {k}", table.shape(), tok.shape()),
            ));
        }
    }
    Ok((n, e))
}

/// g and u, both `[n, h]` → `(n, h)`.
pub(crate) fn swiglu_clamp<T: DeviceTensor>(g: &T, u: &T) -> Result<(usize, usize)> {
    const OP: &str = "swiglu_clamp";
    input(OP, "g", g, DType::F32)?;
    input(OP, "u", u, DType::F32)?;
    if g.shape() != u.shape() {
        return Err(Error::shape(OP, format!("g {:?} and u {:?} differ", g.shape(), u.shape())));
    }
    Ok((g.rows(), g.cols()))
}

/// x `[n, d]`, ids i32 `[n, k]`, weights `[n, k]`, per expert w1 and w3 `[h, d]`, w2 `[d, h]` →
/// `(n, d, k, h)`.
pub(crate) fn moe_experts<T: DeviceTensor, W: NamedWeight>(
    x: &T,
    ids: &T,
    weights: &T,
    w1: &[W],
    w3: &[W],
    w2: &[W],
) -> Result<(usize, usize, usize, usize)> {
    const OP: &str = "moe_experts";
    input(OP, "x", x, DType::F32)?;
    input(OP, "ids", ids, DType::I32)?;
    input(OP, "weights", weights, DType::F32)?;
    let (n, d) = (x.rows(), x.cols());
    let k = ids.cols();
    if ids.rows() != n || weights.shape() != ids.shape() || w1.len() != w3.len() || w1.len() != w2.len() {
        return Err(Error::shape(
            OP,
            format!(
                "ids {:?}, weights {:?}, {} / {} / {} experts (w1 / w3 / w2) do not fit",
                ids.shape(),
                weights.shape(),
                w1.len(),
                w3.len(),
                w2.len()
            ),
        ));
    }
    let h = w1.first().map_or(0, |w| w.rows());
    let shape = |w: &W| format!("`{}` [{}, {}]", w.name(), w.rows(), w.cols());
    for ((g, u), o) in w1.iter().zip(w3).zip(w2) {
        if g.rows() != h || g.cols() != d || u.rows() != h || u.cols() != d || o.rows() != d || o.cols() != h {
            return Err(Error::shape(
                OP,
                format!("expert {} / {} / {} for d = {d}, h = {h}", shape(g), shape(u), shape(o)),
            ));
        }
    }
    Ok((n, d, k, h))
}

/// `moe_experts` on a lane whose kernels take all experts of a call at once, by address: every
/// w1[e] in one weight format, every w3[e] in one and every w2[e] in one (the three may differ)
/// → `(w1 format, w3 format, w2 format)`, or the lane's `Error::Unsupported` naming the first
/// expert that differs from expert 0. No experts → f32.
pub(crate) fn moe_one_format<W: NamedWeight>(
    lane: &'static str,
    w1: &[W],
    w3: &[W],
    w2: &[W],
) -> Result<(WeightFormat, WeightFormat, WeightFormat)> {
    let one = |what: &str, ws: &[W]| {
        let Some(first) = ws.first() else { return Ok(WeightFormat::F32) };
        match ws.iter().enumerate().find(|(_, w)| w.format() != first.format()) {
            None => Ok(first.format()),
            Some((e, w)) => Err(Error::Unsupported {
                lane,
                op: "moe_experts",
                what: format!(
                    "experts in mixed weight formats: {what} of expert {e} (`{}`) is {}, of expert 0 (`{}`) {}",
                    w.name(),
                    w.format(),
                    first.name(),
                    first.format()
                ),
            }),
        }
    };
    Ok((one("w1", w1)?, one("w3", w3)?, one("w2", w2)?))
}

#[cfg(test)]
mod tests {
    //! Each check on its own (the CUDA lane's shape-error test needs a GPU): a bad operand gives
    //! the op's `Error::Shape` with the text the lanes have always given; good operands give
    //! the sizes.
    use super::*;

    struct Tensor(Vec<usize>, DType);
    impl DeviceTensor for Tensor {
        fn shape(&self) -> &[usize] {
            &self.0
        }
        fn dtype(&self) -> DType {
            self.1
        }
    }
    fn f(shape: &[usize]) -> Tensor {
        Tensor(shape.to_vec(), DType::F32)
    }
    fn i(shape: &[usize]) -> Tensor {
        Tensor(shape.to_vec(), DType::I32)
    }

    /// `[rows, cols]`, named `w`.
    struct Weight(usize, usize);
    impl DeviceWeight for Weight {
        fn format(&self) -> crate::backend::WeightFormat {
            crate::backend::WeightFormat::F32
        }
        fn rows(&self) -> usize {
            self.0
        }
        fn cols(&self) -> usize {
            self.1
        }
    }
    impl NamedWeight for Weight {
        fn name(&self) -> &str {
            "w"
        }
    }

    #[track_caller]
    fn refused<T: std::fmt::Debug>(r: Result<T>, op: &str, text: &str) {
        match r {
            Err(Error::Shape { op: got, msg }) => assert_eq!((got, msg.as_str()), (op, text)),
            other => panic!("{op}: expected the shape error {text:?}, got {other:?}"),
        }
    }

    #[test]
    fn inputs_need_their_dtype_and_a_dimension() {
        refused(gelu_erf(&i(&[2])), "gelu_erf", "x must be f32, found i32");
        refused(gelu_erf(&f(&[])), "gelu_erf", "x must have at least one dimension");
        refused(gather_rows(&f(&[2, 3]), &f(&[2])), "gather_rows", "idx must be i32, found f32");
        refused(sqrt_softplus(&i(&[1])), "sqrt_softplus", "x must be f32, found i32");
        assert_eq!(gather_rows(&f(&[4, 3]), &i(&[5])).unwrap(), (4, 3, 5));
    }

    #[test]
    fn linear_and_elementwise() {
        let (a, t) = (f(&[2, 3]), f(&[3, 2]));
        refused(linear(&t, &Weight(4, 3), None), "linear", "x [3, 2] has 2 columns, weight `w` has 3 (in_features)");
        refused(linear(&a, &Weight(4, 3), Some(&f(&[3]))), "linear", "bias [3] for weight `w` with 4 rows");
        assert_eq!(linear(&a, &Weight(4, 3), Some(&f(&[4]))).unwrap(), (2, 3));
        refused(
            linear_add(&t, &Weight(4, 3), None, &f(&[3, 4])),
            "linear_add",
            "x [3, 2] has 2 columns, weight `w` has 3 (in_features)",
        );
        refused(
            linear_add(&a, &Weight(4, 3), None, &f(&[2, 3])),
            "linear_add",
            "residual [2, 3] for x [2, 3] by weight `w` with 4 rows",
        );
        refused(linear_add(&a, &Weight(4, 3), None, &i(&[2, 4])), "linear_add", "residual must be f32, found i32");
        assert_eq!(linear_add(&a, &Weight(4, 3), Some(&f(&[4])), &f(&[2, 4])).unwrap(), (2, 3));
        refused(rms_norm_linear(&a, &f(&[2]), &Weight(4, 3), None), "rms_norm_linear", "norm [2] for x [2, 3]");
        refused(rms_norm_linear(&a, &i(&[3]), &Weight(4, 3), None), "rms_norm_linear", "norm must be f32, found i32");
        refused(
            rms_norm_linear(&a, &f(&[3]), &Weight(4, 2), None),
            "rms_norm_linear",
            "x [2, 3] has 3 columns, weight `w` has 2 (in_features)",
        );
        assert_eq!(rms_norm_linear(&a, &f(&[3]), &Weight(4, 3), Some(&f(&[4]))).unwrap(), (2, 3));
        let gate_up = f(&[2, 6]);
        refused(
            swiglu_linear_add(&a, &Weight(4, 1), &f(&[2, 4])),
            "swiglu_linear_add",
            "gate_up [2, 3] has an odd number of columns",
        );
        refused(
            swiglu_linear_add(&gate_up, &Weight(4, 6), &f(&[2, 4])),
            "swiglu_linear_add",
            "gate_up [2, 6] gates 3 columns, weight `w` takes 6",
        );
        refused(
            swiglu_linear_add(&gate_up, &Weight(4, 3), &f(&[2, 3])),
            "swiglu_linear_add",
            "residual [2, 3] for 2 rows by weight `w` with 4 rows",
        );
        refused(
            swiglu_linear_add(&gate_up, &Weight(4, 3), &i(&[2, 4])),
            "swiglu_linear_add",
            "residual must be f32, found i32",
        );
        assert_eq!(swiglu_linear_add(&gate_up, &Weight(4, 3), &f(&[2, 4])).unwrap(), (2, 3));
        refused(rms_norm(&a, &f(&[2])), "rms_norm", "weight [2] for x [2, 3]");
        assert_eq!(rms_norm(&a, &f(&[3])).unwrap(), (2, 3));
        refused(add(&a, &t), "add", "a [2, 3] and b [3, 2] differ");
        refused(slice_cols(&a, 2, 2), "slice_cols", "columns 2..4 of x [2, 3]");
        refused(
            slice_cols(&a, usize::MAX, 2),
            "slice_cols",
            &format!("columns {}..{} of x [2, 3]", usize::MAX, usize::MAX),
        );
        assert_eq!(slice_cols(&a, 1, 2).unwrap(), (2, 3));
        refused(concat_rows(&a, &i(&[2])), "concat_rows", "a is f32, b is i32");
        refused(concat_rows(&a, &t), "concat_rows", "a [2, 3] and b [3, 2] differ in columns");
        assert!(concat_rows(&i(&[2, 1]), &i(&[5])).is_ok());
        refused(swiglu(&a), "swiglu", "x [2, 3] has an odd number of columns");
        assert_eq!(swiglu(&t).unwrap(), (3, 1));
        refused(swiglu_clamp(&a, &t), "swiglu_clamp", "g [2, 3] and u [3, 2] differ");
        refused(swiglu_clamp(&a, &i(&[2, 3])), "swiglu_clamp", "u must be f32, found i32");
        assert_eq!(swiglu_clamp(&a, &a).unwrap(), (2, 3));
    }

    #[test]
    fn vision() {
        refused(rope_2d(&f(&[4, 8]), 3, 2), "rope_2d", "x [4, 8] does not split into 3 heads");
        refused(rope_2d(&f(&[4, 8]), 0, 2), "rope_2d", "x [4, 8] does not split into 0 heads");
        refused(rope_2d(&f(&[4, 6]), 1, 2), "rope_2d", "head dim 6 is not a multiple of 4");
        refused(rope_2d(&f(&[4, 8]), 1, 3), "rope_2d", "4 rows are not a whole grid of width 3");
        assert_eq!(rope_2d(&f(&[4, 8]), 2, 2).unwrap(), (4, 4));
        let op = "attention_rope_2d";
        refused(attention_rope_2d(&f(&[4, 16]), 1, 2), op, "qkv [4, 16] does not split into q, k and v of 1 heads");
        refused(attention_rope_2d(&f(&[4, 24]), 0, 2), op, "qkv [4, 24] does not split into q, k and v of 0 heads");
        refused(attention_rope_2d(&f(&[4, 18]), 1, 2), op, "head dim 6 is not a multiple of 4");
        refused(attention_rope_2d(&f(&[4, 24]), 2, 3), op, "4 rows are not a whole grid of width 3");
        refused(attention_rope_2d(&i(&[4, 24]), 2, 2), op, "qkv must be f32, found i32");
        assert_eq!(attention_rope_2d(&f(&[6, 24]), 2, 3).unwrap(), (6, 4));
        let (a, t) = (f(&[2, 4]), f(&[4, 2]));
        refused(attention(&a, &a, &t, 1), "attention", "q [2, 4], k [2, 4], v [4, 2] differ");
        refused(attention(&a, &a, &a, 3), "attention", "q [2, 4] does not split into 3 heads");
        assert_eq!(attention(&a, &a, &a, 2).unwrap(), (2, 2));
        refused(unfold(&f(&[6, 2]), 2, 2, 2), "unfold", "x [6, 2] is not a 2x2 grid (r = 2)");
        refused(unfold(&f(&[4, 2]), 2, 2, 0), "unfold", "x [4, 2] is not a 2x2 grid (r = 0)");
        refused(
            unfold(&f(&[4, 2]), usize::MAX, 2, 1),
            "unfold",
            &format!("x [4, 2] is not a {}x2 grid (r = 1)", usize::MAX),
        );
        assert_eq!(unfold(&f(&[4, 3]), 2, 2, 2).unwrap(), 3);
        let op = "unfold_linear_gelu";
        refused(
            unfold_linear_gelu(&f(&[6, 2]), 2, 2, 2, &Weight(5, 8), None),
            op,
            "x [6, 2] is not a 2x2 grid (r = 2)",
        );
        refused(
            unfold_linear_gelu(&f(&[4, 2]), 2, 2, 2, &Weight(5, 9), None),
            op,
            "weight `w` has 9 columns (in_features), the 2x2 cells of x [4, 2] have 2·2·2",
        );
        refused(
            unfold_linear_gelu(&f(&[4, 2]), 2, 2, 2, &Weight(5, 8), Some(&f(&[4]))),
            op,
            "bias [4] for weight `w` with 5 rows",
        );
        // c·r² overflows: refused, not wrapped
        let r = usize::MAX / 2;
        refused(
            unfold_linear_gelu(&f(&[4, 2]), 2, 2, r, &Weight(5, 8), None),
            op,
            &format!("weight `w` has 8 columns (in_features), the {r}x{r} cells of x [4, 2] have 2·{r}·{r}"),
        );
        assert_eq!(unfold_linear_gelu(&f(&[35, 2]), 7, 5, 3, &Weight(5, 18), Some(&f(&[5]))).unwrap(), (2, 6, 18));
    }

    #[test]
    fn language_model() {
        refused(embed_rows(&Weight(9, 4), &f(&[3])), "embed_rows", "ids must be i32, found f32");
        assert_eq!(embed_rows(&Weight(9, 4), &i(&[3])).unwrap(), (3, 4));
        assert_eq!(hc_expand(&f(&[3, 4])).unwrap(), (3, 4));
        refused(rms_norm_heads(&f(&[3, 4]), 3), "rms_norm_heads", "x [3, 4] does not split into 3 heads");
        assert_eq!(rms_norm_heads(&f(&[3, 4]), 2).unwrap(), (3, 4));

        let (mix, base) = (f(&[5, 24]), f(&[24]));
        refused(hc_split(&mix, &f(&[3]), &base, 3), "hc_split", "mix [5, 24], scale [3], base [24] do not fit hc = 3");
        refused(hc_split(&mix, &f(&[1]), &base, 4), "hc_split", "mix [5, 24], scale [1], base [24] do not fit hc = 4");
        refused(
            hc_split(&mix, &f(&[3]), &base, usize::MAX),
            "hc_split",
            &format!("mix [5, 24], scale [3], base [24] do not fit hc = {}", usize::MAX),
        );
        assert_eq!(hc_split(&mix, &f(&[3]), &base, 4).unwrap(), (5, 24));
        refused(hc_pre(&f(&[2, 8]), &f(&[2, 3]), 3), "hc_pre", "x [2, 8] and w [2, 3] do not fit hc = 3");
        refused(hc_pre(&f(&[2, 8]), &f(&[3, 4]), 4), "hc_pre", "x [2, 8] and w [3, 4] do not fit hc = 4");
        refused(hc_pre(&f(&[2, 8]), &f(&[2, 3]), 4), "hc_pre", "x [2, 8] and w [2, 3] do not fit hc = 4");
        assert_eq!(hc_pre(&f(&[2, 8]), &f(&[2, 4]), 4).unwrap(), (2, 2, 4));
        assert_eq!(hc_pre(&f(&[2, 8]), &f(&[2, 24]), 4).unwrap(), (2, 2, 24));
        let (x, fx) = (f(&[2, 8]), f(&[2, 2]));
        refused(hc_post(&x, &fx, &f(&[2, 23])), "hc_post", "x [2, 8], f [2, 2], split [2, 23] do not fit");
        refused(hc_post(&x, &f(&[2, 3]), &f(&[2, 24])), "hc_post", "x [2, 8], f [2, 3], split [2, 24] do not fit");
        assert_eq!(hc_post(&x, &fx, &f(&[2, 24])).unwrap(), (2, 8, 2, 4));
        refused(
            hc_head_weights(&f(&[2, 4]), &f(&[2]), &f(&[4])),
            "hc_head_weights",
            "mix [2, 4], scale [2], base [4] do not fit",
        );
        assert_eq!(hc_head_weights(&f(&[2, 4]), &f(&[1]), &f(&[4])).unwrap(), (2, 4));
        refused(rope_tail(&f(&[3, 8]), 2, &f(&[3])), "rope_tail", "6 rotary dims exceed head_dim 4");
        refused(rope_tail(&f(&[3, 8]), 3, &f(&[1])), "rope_tail", "x [3, 8] does not split into 3 heads");
        refused(rope_tail(&f(&[3, 8]), 2, &i(&[1])), "rope_tail", "inv_freq must be f32, found i32");
        assert_eq!(rope_tail(&f(&[3, 8]), 2, &f(&[2])).unwrap(), (3, 8, 4, 4));
        refused(rope_tail_at(&f(&[3, 8]), 2, &f(&[3]), &i(&[3])), "rope_tail_at", "6 rotary dims exceed head_dim 4");
        refused(rope_tail_at(&f(&[3, 8]), 2, &f(&[1]), &f(&[3])), "rope_tail_at", "positions must be i32, found f32");
        refused(rope_tail_at(&f(&[3, 8]), 2, &f(&[1]), &i(&[2])), "rope_tail_at", "positions [2] for 3 rows");
        refused(rope_tail_at(&f(&[3, 8]), 2, &f(&[1]), &i(&[3, 1])), "rope_tail_at", "positions [3, 1] for 3 rows");
        assert_eq!(rope_tail_at(&f(&[3, 8]), 2, &f(&[2]), &i(&[3])).unwrap(), (3, 8, 4, 4));
    }

    #[test]
    fn language_model_attention_and_routing() {
        let (q, kv, win, sinks) = (f(&[3, 4]), f(&[5, 2]), i(&[3, 2]), f(&[2]));
        refused(
            sink_attention(&q, &kv, &win, None, &sinks, 3),
            "sink_attention",
            "q [3, 4] does not split into 3 heads",
        );
        refused(
            sink_attention(&q, &kv, &i(&[3]), None, &sinks, 2),
            "sink_attention",
            "q [3, 4], kv [5, 2], window [3], sinks [2] do not fit",
        );
        refused(
            sink_attention(&q, &kv, &win, Some((&f(&[7, 2]), &i(&[2, 4]))), &sinks, 2),
            "sink_attention",
            "comp [7, 2] / comp_idx [2, 4] do not fit q [3, 4]",
        );
        assert_eq!(sink_attention(&q, &kv, &win, None, &sinks, 2).unwrap(), (3, 4, 2, 5, 0, 0));
        assert_eq!(
            sink_attention(&q, &kv, &win, Some((&f(&[7, 2]), &i(&[3, 4]))), &sinks, 2).unwrap(),
            (3, 4, 2, 5, 7, 4)
        );
        refused(
            grouped_linear(&f(&[2, 6]), &Weight(4, 3), 3),
            "grouped_linear",
            "x [2, 6] and weight `w` [4, 3] do not split into 3 groups",
        );
        refused(
            grouped_linear(&f(&[2, 6]), &Weight(4, 3), 0),
            "grouped_linear",
            "x [2, 6] and weight `w` [4, 3] do not split into 0 groups",
        );
        assert_eq!(grouped_linear(&f(&[2, 6]), &Weight(4, 3), 2).unwrap(), (2, 3, 2));
        let (kv, ape) = (f(&[9, 6]), f(&[4, 6]));
        refused(
            compress_pool(&kv, &kv, &ape, 3, false),
            "compress_pool",
            "kv [9, 6], gate [9, 6], ape [4, 6], ratio 3",
        );
        refused(
            compress_pool(&f(&[9, 5]), &f(&[9, 5]), &f(&[4, 5]), 4, true),
            "compress_pool",
            "kv [9, 5], gate [9, 5], ape [4, 5], ratio 4",
        );
        assert_eq!(compress_pool(&kv, &kv, &ape, 4, true).unwrap(), (2, 3, 6));
        assert_eq!(compress_pool(&kv, &kv, &ape, 4, false).unwrap(), (2, 6, 6));
        let (q, k, w) = (f(&[3, 8]), f(&[5, 4]), f(&[3, 2]));
        refused(
            indexer_scores(&q, &k, &w, 2, 0),
            "indexer_scores",
            "q [3, 8], k [5, 4], w [3, 2] do not fit (2 heads, ratio 0)",
        );
        refused(
            indexer_scores(&q, &k, &f(&[3, 3]), 3, 4),
            "indexer_scores",
            "q [3, 8], k [5, 4], w [3, 3] do not fit (3 heads, ratio 4)",
        );
        assert_eq!(indexer_scores(&q, &k, &w, 2, 4).unwrap(), (3, 5, 4));
        assert_eq!(topk_rows(&f(&[3, 7])).unwrap(), (3, 7));
        refused(
            hash_route(&i(&[10, 2]), &i(&[4]), &i(&[3, 2])),
            "hash_route",
            "table [10, 2], ids [4], fallback [3, 2] do not fit",
        );
        assert_eq!(hash_route(&i(&[10, 2]), &i(&[3]), &i(&[3, 2])).unwrap(), (10, 2, 3));
        refused(route_weights(&f(&[3, 8]), &i(&[2, 2])), "route_weights", "ids [2, 2] do not index scores [3, 8]");
        assert_eq!(route_weights(&f(&[3, 8]), &i(&[3, 2])).unwrap(), (3, 8, 2));
        let (logits, bias, kind) = (f(&[3, 8]), f(&[2, 8]), i(&[3]));
        refused(
            route_experts(&logits, &f(&[2, 7]), &kind, None, 2),
            "route_experts",
            "logits [3, 8], bias [2, 7], kind [3] do not fit",
        );
        refused(route_experts(&logits, &bias, &f(&[3]), None, 2), "route_experts", "kind must be i32, found f32");
        refused(
            route_experts(&f(&[3, 1, 8]), &bias, &kind, None, 2),
            "route_experts",
            "logits [3, 1, 8], bias [2, 8], kind [3] do not fit",
        );
        refused(
            route_experts(&logits, &bias, &kind, Some((&i(&[10, 3]), &i(&[3]))), 2),
            "route_experts",
            "table [10, 3], token ids [3] do not fit 3 rows, k = 2",
        );
        assert_eq!(route_experts(&logits, &bias, &kind, Some((&i(&[10, 2]), &i(&[3]))), 2).unwrap(), (3, 8));

        let (x, ids, wts) = (f(&[3, 4]), i(&[3, 2]), f(&[3, 2]));
        let (w1, w3, w2) = ([Weight(3, 4), Weight(3, 4)], [Weight(3, 4), Weight(3, 4)], [Weight(4, 3), Weight(4, 3)]);
        refused(
            moe_experts(&x, &ids, &f(&[3, 1]), &w1, &w3, &w2),
            "moe_experts",
            "ids [3, 2], weights [3, 1], 2 / 2 / 2 experts (w1 / w3 / w2) do not fit",
        );
        refused(
            moe_experts(&x, &ids, &wts, &w1, &w3, &w2[..1]),
            "moe_experts",
            "ids [3, 2], weights [3, 2], 2 / 2 / 1 experts (w1 / w3 / w2) do not fit",
        );
        refused(
            moe_experts(&x, &ids, &wts, &w1, &w3[..1], &w2),
            "moe_experts",
            "ids [3, 2], weights [3, 2], 2 / 1 / 2 experts (w1 / w3 / w2) do not fit",
        );
        refused(
            moe_experts(&x, &ids, &wts, &w1, &w3, &[Weight(4, 3), Weight(4, 2)]),
            "moe_experts",
            "expert `w` [3, 4] / `w` [3, 4] / `w` [4, 2] for d = 4, h = 3",
        );
        refused(
            moe_experts(&x, &ids, &wts, &w1, &[Weight(3, 4), Weight(2, 4)], &w2),
            "moe_experts",
            "expert `w` [3, 4] / `w` [2, 4] / `w` [4, 3] for d = 4, h = 3",
        );
        assert_eq!(moe_experts(&x, &ids, &wts, &w1, &w3, &w2).unwrap(), (3, 4, 2, 3));
    }

    /// A weight named `name` in `format` (sizes unused).
    struct Typed(&'static str, WeightFormat);
    impl DeviceWeight for Typed {
        fn format(&self) -> WeightFormat {
            self.1
        }
        fn rows(&self) -> usize {
            1
        }
        fn cols(&self) -> usize {
            1
        }
    }
    impl NamedWeight for Typed {
        fn name(&self) -> &str {
            self.0
        }
    }

    #[test]
    fn moe_experts_in_one_format_per_projection() {
        use WeightFormat::{BF16, F16, F32, IQ1_M, IQ1_S};
        // the gate and up projections may differ from each other (IQ1_S gate, IQ1_M up)
        let w1 = [Typed("gate.0", IQ1_S), Typed("gate.1", IQ1_S), Typed("gate.2", IQ1_S)];
        let w3 = [Typed("up.0", IQ1_M), Typed("up.1", IQ1_M), Typed("up.2", IQ1_M)];
        let w2 = [Typed("down.0", F16), Typed("down.1", F16), Typed("down.2", F16)];
        assert_eq!(moe_one_format("cuda", &w1, &w3, &w2).unwrap(), (IQ1_S, IQ1_M, F16));
        assert_eq!(moe_one_format::<Typed>("cuda", &[], &[], &[]).unwrap(), (F32, F32, F32));
        let mixed = [Typed("down.0", F16), Typed("down.1", F16), Typed("down.2", F32)];
        match moe_one_format("cuda", &w1, &w3, &mixed) {
            Err(e @ Error::Unsupported { lane: "cuda", op: "moe_experts", .. }) => assert_eq!(
                e.to_string(),
                "the cuda lane does not support op `moe_experts` with experts in mixed weight formats: w2 of \
                 expert 2 (`down.2`) is F32, of expert 0 (`down.0`) F16"
            ),
            other => panic!("expected the mixed-format error, got {other:?}"),
        }
        let mixed = [Typed("up.0", BF16), Typed("up.1", IQ1_M), Typed("up.2", IQ1_M)];
        match moe_one_format("cuda", &w1, &mixed, &w2) {
            Err(e) => {
                assert!(e.to_string().contains("w3 of expert 1 (`up.1`) is IQ1_M, of expert 0 (`up.0`) BF16"), "{e}")
            }
            Ok(f) => panic!("expected the mixed-format error, got {f:?}"),
        }
    }
}
