//! CPU reference implementations of the language-model ops (readable f32, one shape comment
//! each). `CpuBackend`'s trait methods in `mod.rs` delegate here.

use super::{CpuBackend, CpuTensor, CpuWeight, check_2d, check_heads};
use crate::backend::{HostData, decode_row};
use crate::error::{Error, Result};

fn new_i32(shape: Vec<usize>, data: Vec<i32>) -> CpuTensor {
    CpuTensor { shape, data: std::sync::Arc::new(HostData::I32(data)) }
}

fn len_is(op: &'static str, what: &str, v: &[f32], want: usize) -> Result<()> {
    if v.len() != want {
        return Err(Error::shape(op, format!("{what} has {} elements, expected {want}", v.len())));
    }
    Ok(())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

// table [vocab, d], ids [n] → table[ids] [n, d]; ids ≥ vocab → zero row.
pub(super) fn embed_rows(table: &CpuWeight, ids: &CpuTensor) -> Result<CpuTensor> {
    let ids = ids.i32("embed_rows")?;
    let (v, d) = (table.rows, table.cols);
    let rb = table.format.row_bytes(d);
    let mut out = vec![0f32; ids.len() * d];
    for (i, &id) in ids.iter().enumerate() {
        if id < 0 {
            return Err(Error::shape("embed_rows", format!("negative token id {id}")));
        }
        if (id as usize) < v {
            decode_row(table.format, &table.bytes[id as usize * rb..][..rb], &mut out[i * d..(i + 1) * d]);
        }
    }
    Ok(CpuTensor::new_f32(vec![ids.len(), d], out))
}

// x [n, d] → [n, hc·d], each stream a copy of the row.
pub(super) fn hc_expand(x: &CpuTensor, hc: usize) -> Result<CpuTensor> {
    let (n, d) = check_2d("hc_expand", "x", x)?;
    let xs = x.f32("hc_expand")?;
    let mut out = Vec::with_capacity(n * hc * d);
    for i in 0..n {
        for _ in 0..hc {
            out.extend_from_slice(&xs[i * d..(i + 1) * d]);
        }
    }
    Ok(CpuTensor::new_f32(vec![n, hc * d], out))
}

// x [n, heads·hd] → per head x_h · rsqrt(mean(x_h²) + eps)  [n, heads·hd]
pub(super) fn rms_norm_heads(x: &CpuTensor, n_heads: usize, eps: f32) -> Result<CpuTensor> {
    let (_, cols) = check_2d("rms_norm_heads", "x", x)?;
    let hd = check_heads("rms_norm_heads", cols, n_heads)?;
    let xs = x.f32("rms_norm_heads")?;
    let mut out = xs.to_vec();
    for head in out.chunks_mut(hd) {
        let mean_sq = head.iter().map(|v| v * v).sum::<f32>() / hd as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        head.iter_mut().for_each(|v| *v *= inv);
    }
    Ok(CpuTensor::new_f32(x.shape.clone(), out))
}

// mix [n, (2+hc)·hc], scale [3], base [(2+hc)·hc] → [n, pre hc | post hc | comb hc·hc (src·hc+dst)]
pub(super) fn hc_split(
    mix: &CpuTensor,
    scale: &CpuTensor,
    base: &CpuTensor,
    hc: usize,
    iters: usize,
    eps: f32,
) -> Result<CpuTensor> {
    let (n, w) = check_2d("hc_split", "mix", mix)?;
    if w != (2 + hc) * hc {
        return Err(Error::shape("hc_split", format!("mix has {w} columns, expected (2+{hc})·{hc}")));
    }
    let (m, s, b) = (mix.f32("hc_split")?, scale.f32("hc_split")?, base.f32("hc_split")?);
    len_is("hc_split", "scale", s, 3)?;
    len_is("hc_split", "base", b, w)?;
    let mut out = vec![0f32; n * w];
    for t in 0..n {
        let (mr, o) = (&m[t * w..(t + 1) * w], &mut out[t * w..(t + 1) * w]);
        for i in 0..hc {
            o[i] = sigmoid(mr[i] * s[0] + b[i]) + eps;
            o[hc + i] = 2.0 * sigmoid(mr[hc + i] * s[1] + b[hc + i]);
        }
        let c = &mut o[2 * hc..];
        // softmax over dst for each src, + eps
        for src in 0..hc {
            let row = &mut c[src * hc..(src + 1) * hc];
            for (dst, v) in row.iter_mut().enumerate() {
                *v = mr[2 * hc + src * hc + dst] * s[2] + b[2 * hc + src * hc + dst];
            }
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            row.iter_mut().for_each(|v| *v = (*v - max).exp());
            let sum: f32 = row.iter().sum();
            row.iter_mut().for_each(|v| *v = *v / sum + eps);
        }
        let norm_src = |c: &mut [f32]| {
            for dst in 0..hc {
                let sum: f32 = (0..hc).map(|src| c[src * hc + dst]).sum::<f32>() + eps;
                (0..hc).for_each(|src| c[src * hc + dst] /= sum);
            }
        };
        let norm_dst = |c: &mut [f32]| {
            for row in c.chunks_mut(hc) {
                let sum: f32 = row.iter().sum::<f32>() + eps;
                row.iter_mut().for_each(|v| *v /= sum);
            }
        };
        norm_src(c);
        for _ in 1..iters {
            norm_dst(c);
            norm_src(c);
        }
    }
    Ok(CpuTensor::new_f32(vec![n, w], out))
}

// X [n, hc·d], w [n, c ≥ hc] (its first hc columns) → Σ_i w_i X_i  [n, d]
pub(super) fn hc_pre(x: &CpuTensor, w: &CpuTensor, hc: usize) -> Result<CpuTensor> {
    let (n, cols) = check_2d("hc_pre", "x", x)?;
    let (n2, wc) = check_2d("hc_pre", "w", w)?;
    if n2 != n || hc == 0 || wc < hc || cols % hc != 0 {
        return Err(Error::shape("hc_pre", format!("x {:?} and w {:?} do not fit hc = {hc}", x.shape, w.shape)));
    }
    let d = cols / hc;
    let (xs, ws) = (x.f32("hc_pre")?, w.f32("hc_pre")?);
    let mut out = vec![0f32; n * d];
    for t in 0..n {
        for i in 0..hc {
            let wi = ws[t * wc + i];
            for j in 0..d {
                out[t * d + j] += wi * xs[t * cols + i * d + j];
            }
        }
    }
    Ok(CpuTensor::new_f32(vec![n, d], out))
}

// X [n, hc·d], f [n, d], split [n, pre hc | post hc | comb hc·hc (src·hc+dst)]
// → X'_dst = post_dst f + Σ_src comb[src,dst] X_src
pub(super) fn hc_post(x: &CpuTensor, f: &CpuTensor, split: &CpuTensor) -> Result<CpuTensor> {
    let (n, cols) = check_2d("hc_post", "x", x)?;
    let (n2, d) = check_2d("hc_post", "f", f)?;
    let (n3, w) = check_2d("hc_post", "split", split)?;
    let hc = if d == 0 { 0 } else { cols / d };
    if n2 != n || n3 != n || hc == 0 || hc * d != cols || w != (2 + hc) * hc {
        return Err(Error::shape(
            "hc_post",
            format!("x {:?}, f {:?}, split {:?} do not fit", x.shape, f.shape, split.shape),
        ));
    }
    let (xs, fs, ss) = (x.f32("hc_post")?, f.f32("hc_post")?, split.f32("hc_post")?);
    let mut out = vec![0f32; n * cols];
    for t in 0..n {
        let (post, comb) = (&ss[t * w + hc..][..hc], &ss[t * w + 2 * hc..][..hc * hc]);
        for dst in 0..hc {
            let o = &mut out[t * cols + dst * d..][..d];
            let p = post[dst];
            for j in 0..d {
                o[j] = p * fs[t * d + j];
            }
            for src in 0..hc {
                let c = comb[src * hc + dst];
                for j in 0..d {
                    o[j] += c * xs[t * cols + src * d + j];
                }
            }
        }
    }
    Ok(CpuTensor::new_f32(vec![n, cols], out))
}

// mix [n, hc], scale [1], base [hc] → σ(mix·scale + base) + eps  [n, hc]
pub(super) fn hc_head_weights(mix: &CpuTensor, scale: &CpuTensor, base: &CpuTensor, eps: f32) -> Result<CpuTensor> {
    let (_, hc) = check_2d("hc_head_weights", "mix", mix)?;
    let (m, s, b) = (mix.f32("hc_head_weights")?, scale.f32("hc_head_weights")?, base.f32("hc_head_weights")?);
    len_is("hc_head_weights", "scale", s, 1)?;
    len_is("hc_head_weights", "base", b, hc)?;
    let out = m.iter().enumerate().map(|(i, &v)| sigmoid(v * s[0] + b[i % hc]) + eps).collect();
    Ok(CpuTensor::new_f32(mix.shape.clone(), out))
}

// x [n, heads·hd] → tail pairs (2j, 2j+1) rotated by ±(pos0 + i·stride)·inv_freq[j]  [n, heads·hd]
pub(super) fn rope_tail(
    x: &CpuTensor,
    n_heads: usize,
    inv_freq: &CpuTensor,
    pos0: usize,
    stride: usize,
    inverse: bool,
) -> Result<CpuTensor> {
    rotate_tails("rope_tail", x, n_heads, inv_freq, |i| Ok((pos0 + i * stride) as f32), inverse)
}

// x [n, heads·hd], positions i32 [n] → tail pairs rotated by ±positions[i]·inv_freq[j]  [n, heads·hd]
pub(super) fn rope_tail_at(
    x: &CpuTensor,
    n_heads: usize,
    inv_freq: &CpuTensor,
    positions: &CpuTensor,
    inverse: bool,
) -> Result<CpuTensor> {
    const OP: &str = "rope_tail_at";
    let pos = positions.i32(OP)?;
    if positions.shape.len() != 1 || pos.len() != x.shape.first().copied().unwrap_or(0) {
        return Err(Error::shape(OP, format!("positions {:?} for x {:?}", positions.shape, x.shape)));
    }
    let position = |i: usize| match pos[i] {
        p if p < 0 => Err(Error::Invalid(format!("rope_tail_at: row {i} at negative position {p}"))),
        // through usize as rope_tail's positions, so both round the same way
        p => Ok(p as usize as f32),
    };
    rotate_tails(OP, x, n_heads, inv_freq, position, inverse)
}

// Both RoPE ops: row i's tail pairs rotated by ±position(i)·inv_freq[j].
fn rotate_tails(
    op: &'static str,
    x: &CpuTensor,
    n_heads: usize,
    inv_freq: &CpuTensor,
    position: impl Fn(usize) -> Result<f32>,
    inverse: bool,
) -> Result<CpuTensor> {
    let (n, cols) = check_2d(op, "x", x)?;
    let hd = check_heads(op, cols, n_heads)?;
    let f = inv_freq.f32(op)?;
    let rd = 2 * f.len();
    if rd > hd {
        return Err(Error::shape(op, format!("{rd} rotary dims exceed head_dim {hd}")));
    }
    let xs = x.f32(op)?;
    let mut out = xs.to_vec();
    for i in 0..n {
        let p = position(i)?;
        for (j, &fj) in f.iter().enumerate() {
            let a = p * fj;
            let (c, s) = (a.cos(), if inverse { -a.sin() } else { a.sin() });
            for h in 0..n_heads {
                let k = i * cols + h * hd + hd - rd + 2 * j;
                let (x0, x1) = (xs[k], xs[k + 1]);
                out[k] = x0 * c - x1 * s;
                out[k + 1] = x1 * c + x0 * s;
            }
        }
    }
    Ok(CpuTensor::new_f32(x.shape.clone(), out))
}

// q [n, heads·hd], kv [m, hd], window [n, 2], comp ([c, hd], idx [n, k]), sinks [heads] → [n, heads·hd]
pub(super) fn sink_attention(
    b: &CpuBackend,
    q: &CpuTensor,
    kv: &CpuTensor,
    window: &CpuTensor,
    comp: Option<(&CpuTensor, &CpuTensor)>,
    sinks: &CpuTensor,
    n_heads: usize,
) -> Result<CpuTensor> {
    const OP: &str = "sink_attention";
    let (n, cols) = check_2d(OP, "q", q)?;
    let hd = check_heads(OP, cols, n_heads)?;
    let (m, kd) = check_2d(OP, "kv", kv)?;
    let win = window.i32(OP)?;
    let sk = sinks.f32(OP)?;
    if kd != hd || win.len() != 2 * n || sk.len() != n_heads {
        return Err(Error::shape(
            OP,
            format!(
                "q {:?}, kv {:?}, window {:?}, sinks {:?} do not fit",
                q.shape, kv.shape, window.shape, sinks.shape
            ),
        ));
    }
    let (cs, c_rows, idx, k) = match comp {
        Some((c, idx)) => {
            let (cr, cd) = check_2d(OP, "comp", c)?;
            let (ni, k) = check_2d(OP, "comp_idx", idx)?;
            if cd != hd || ni != n {
                return Err(Error::shape(
                    OP,
                    format!("comp {:?} / comp_idx {:?} do not fit q {:?}", c.shape, idx.shape, q.shape),
                ));
            }
            (c.f32(OP)?, cr, idx.i32(OP)?, k)
        }
        None => (&[][..], 0, &[][..], 0),
    };
    for i in 0..n {
        let (lo, hi) = (win[2 * i], win[2 * i + 1]);
        if lo <= hi && (lo < 0 || hi as usize >= m) {
            return Err(Error::shape(OP, format!("window {lo}..={hi} of query {i} outside 0..{m}")));
        }
        if let Some(&bad) = idx[i * k..(i + 1) * k].iter().find(|&&e| e >= c_rows as i32 || e < -1) {
            return Err(Error::shape(OP, format!("compressed entry {bad} of query {i} outside 0..{c_rows}")));
        }
    }
    let (qs, ks) = (q.f32(OP)?, kv.f32(OP)?);
    let scale = 1.0 / (hd as f32).sqrt();
    // each query scores and sums its window's raw keys and its k entries, per head (its window,
    // not all m keys: a batch of sequences lays all their keys out in one kv)
    let seen: usize = (0..n).map(|i| (win[2 * i + 1] as i64 - win[2 * i] as i64 + 1).max(0) as usize + k).sum();
    let out = b.par_rows(n, cols, 2 * seen * cols, |rows, out| {
        for (r, i) in rows.enumerate() {
            // the keys query i sees: raw window rows, then selected compressed entries
            let (lo, hi) = (win[2 * i], win[2 * i + 1]);
            let mut keys: Vec<&[f32]> = Vec::new();
            if lo <= hi {
                keys.extend((lo as usize..=hi as usize).map(|j| &ks[j * hd..(j + 1) * hd]));
            }
            keys.extend(idx[i * k..(i + 1) * k].iter().filter(|&&e| e >= 0).map(|&e| &cs[e as usize * hd..][..hd]));
            let mut p = vec![0f32; keys.len()];
            for h in 0..n_heads {
                let qh = &qs[i * cols + h * hd..][..hd];
                for (pj, kj) in p.iter_mut().zip(&keys) {
                    *pj = qh.iter().zip(*kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                }
                // joint softmax with the sink logit; the sink has no value
                let max = p.iter().fold(sk[h], |a, &v| a.max(v));
                let mut denom = (sk[h] - max).exp();
                for v in p.iter_mut() {
                    *v = (*v - max).exp();
                    denom += *v;
                }
                let o = &mut out[r * cols + h * hd..][..hd];
                for (pj, kj) in p.iter().zip(&keys) {
                    let w = pj / denom;
                    o.iter_mut().zip(*kj).for_each(|(od, vd)| *od += w * vd);
                }
            }
        }
    });
    Ok(CpuTensor::new_f32(vec![n, cols], out))
}

// x [n, g·k], w [g·r, k] → [n, g·r], group j: x[:, jk..(j+1)k] · w[jr..(j+1)r]ᵀ
pub(super) fn grouped_linear(x: &CpuTensor, w: &CpuWeight, groups: usize) -> Result<CpuTensor> {
    let (n, cols) = check_2d("grouped_linear", "x", x)?;
    if groups == 0 || cols != groups * w.cols || w.rows % groups != 0 {
        return Err(Error::shape(
            "grouped_linear",
            format!("x {:?} and weight [{}, {}] do not split into {groups} groups", x.shape, w.rows, w.cols),
        ));
    }
    let (k, r) = (w.cols, w.rows / groups);
    let xs = x.f32("grouped_linear")?;
    let rb = w.format.row_bytes(k);
    let mut wrow = vec![0f32; k];
    let mut out = vec![0f32; n * w.rows];
    for o in 0..w.rows {
        decode_row(w.format, &w.bytes[o * rb..][..rb], &mut wrow);
        let g = o / r;
        for i in 0..n {
            let xi = &xs[i * cols + g * k..][..k];
            out[i * w.rows + o] = xi.iter().zip(&wrow).map(|(a, b)| a * b).sum();
        }
    }
    Ok(CpuTensor::new_f32(vec![n, w.rows], out))
}

// kv, gate [T, w], ape [r, w] → [⌊T/r⌋, d] gated softmax pooling per block (overlap: w = 2d, 2r rows)
pub(super) fn compress_pool(
    kv: &CpuTensor,
    gate: &CpuTensor,
    ape: &CpuTensor,
    ratio: usize,
    overlap: bool,
) -> Result<CpuTensor> {
    const OP: &str = "compress_pool";
    let (t, w) = check_2d(OP, "kv", kv)?;
    let (ra, wa) = check_2d(OP, "ape", ape)?;
    if gate.shape != kv.shape || ratio == 0 || ra != ratio || wa != w || (overlap && w % 2 != 0) {
        return Err(Error::shape(
            OP,
            format!("kv {:?}, gate {:?}, ape {:?}, ratio {ratio}", kv.shape, gate.shape, ape.shape),
        ));
    }
    let d = if overlap { w / 2 } else { w };
    let (a, g, pe) = (kv.f32(OP)?, gate.f32(OP)?, ape.f32(OP)?);
    let n = t / ratio;
    let mut out = vec![0f32; n * d];
    // (value, logit) rows that pool into entry i, channel c
    let mut vals: Vec<(f32, f32)> = Vec::with_capacity(2 * ratio);
    for i in 0..n {
        for c in 0..d {
            vals.clear();
            if overlap && i > 0 {
                for tt in (i - 1) * ratio..i * ratio {
                    vals.push((a[tt * w + c], g[tt * w + c] + pe[(tt % ratio) * w + c]));
                }
            }
            let off = if overlap { d } else { 0 };
            for tt in i * ratio..(i + 1) * ratio {
                vals.push((a[tt * w + off + c], g[tt * w + off + c] + pe[(tt % ratio) * w + off + c]));
            }
            let max = vals.iter().fold(f32::NEG_INFINITY, |m, v| m.max(v.1));
            let denom: f32 = vals.iter().map(|v| (v.1 - max).exp()).sum();
            out[i * d + c] = vals.iter().map(|v| (v.1 - max).exp() / denom * v.0).sum();
        }
    }
    Ok(CpuTensor::new_f32(vec![n, d], out))
}

// q [n, heads·hd], k [m, hd], w [n, heads] → [n, m] scale·Σ_h w_h ReLU(q_h·k), future entries −inf
#[allow(clippy::too_many_arguments)]
pub(super) fn indexer_scores(
    q: &CpuTensor,
    k: &CpuTensor,
    w: &CpuTensor,
    n_heads: usize,
    scale: f32,
    pos0: usize,
    ratio: usize,
) -> Result<CpuTensor> {
    const OP: &str = "indexer_scores";
    let (n, cols) = check_2d(OP, "q", q)?;
    let hd = check_heads(OP, cols, n_heads)?;
    let (m, kd) = check_2d(OP, "k", k)?;
    let (nw, hw) = check_2d(OP, "w", w)?;
    if kd != hd || nw != n || hw != n_heads || ratio == 0 {
        return Err(Error::shape(
            OP,
            format!("q {:?}, k {:?}, w {:?} do not fit ({n_heads} heads, ratio {ratio})", q.shape, k.shape, w.shape),
        ));
    }
    let (qs, ks, ws) = (q.f32(OP)?, k.f32(OP)?, w.f32(OP)?);
    // The entries in groups of LANES, transposed: kt[g][d·LANES + l] = k[g·LANES + l][d] (zero past
    // m), so a query's dots with LANES entries run side by side (a vector of them per d), each
    // still adding its products in d order from −0.0: the bits of one dot at a time. (A batched
    // decode step scores every row against all its sequences' entries: this op was an eighth of
    // the CPU lane's step with 8 sequences.)
    const LANES: usize = 8;
    let groups = m.div_ceil(LANES);
    let mut kt = vec![0f32; groups * hd * LANES];
    for (j, kj) in ks.chunks_exact(hd).enumerate() {
        for (d, &v) in kj.iter().enumerate() {
            kt[(j / LANES * hd + d) * LANES + j % LANES] = v;
        }
    }
    let mut out = vec![f32::NEG_INFINITY; n * m];
    for i in 0..n {
        let visible = ((pos0 + i + 1) / ratio).min(m);
        for g in 0..visible.div_ceil(LANES) {
            let kg = &kt[g * hd * LANES..(g + 1) * hd * LANES];
            let mut s = [0f32; LANES];
            for h in 0..n_heads {
                let mut dot = [-0.0f32; LANES];
                for (&qv, kd) in qs[i * cols + h * hd..][..hd].iter().zip(kg.chunks_exact(LANES)) {
                    for l in 0..LANES {
                        dot[l] += qv * kd[l];
                    }
                }
                let wh = ws[i * n_heads + h];
                for l in 0..LANES {
                    s[l] += wh * dot[l].max(0.0);
                }
            }
            for (l, &sl) in s.iter().enumerate().take(visible - g * LANES) {
                out[i * m + g * LANES + l] = sl * scale;
            }
        }
    }
    Ok(CpuTensor::new_f32(vec![n, m], out))
}

// x [n, m] → i32 [n, k] columns of the k largest finite values, descending; −1 fills
pub(super) fn topk_rows(x: &CpuTensor, k: usize) -> Result<CpuTensor> {
    let (n, m) = check_2d("topk_rows", "x", x)?;
    let xs = x.f32("topk_rows")?;
    let mut out = vec![-1i32; n * k];
    for i in 0..n {
        let row = &xs[i * m..(i + 1) * m];
        let mut cols: Vec<usize> = (0..m).filter(|&j| row[j].is_finite()).collect();
        // stable sort: ties keep the lower column first
        cols.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap());
        for (s, &c) in cols.iter().take(k).enumerate() {
            out[i * k + s] = c as i32;
        }
    }
    Ok(new_i32(vec![n, k], out))
}

// x [n, e] → sqrt(softplus(x))  [n, e]  (softplus = ln(1 + eˣ), linear above 20 like torch)
pub(super) fn sqrt_softplus(x: &CpuTensor) -> Result<CpuTensor> {
    let xs = x.f32("sqrt_softplus")?;
    let out = xs.iter().map(|&v| if v > 20.0 { v } else { v.exp().ln_1p() }.sqrt()).collect();
    Ok(CpuTensor::new_f32(x.shape.clone(), out))
}

// table [vocab, k], ids [n], fallback [n, k] → [n, k]: table[id] if id < vocab else fallback row
pub(super) fn hash_route(table: &CpuTensor, ids: &CpuTensor, fallback: &CpuTensor) -> Result<CpuTensor> {
    const OP: &str = "hash_route";
    let (v, k) = check_2d(OP, "table", table)?;
    let (n, k2) = check_2d(OP, "fallback", fallback)?;
    let (tb, id, fb) = (table.i32(OP)?, ids.i32(OP)?, fallback.i32(OP)?);
    if k2 != k || id.len() != n {
        return Err(Error::shape(
            OP,
            format!("table {:?}, ids {:?}, fallback {:?} do not fit", table.shape, ids.shape, fallback.shape),
        ));
    }
    let mut out = Vec::with_capacity(n * k);
    for (i, &t) in id.iter().enumerate() {
        if t >= 0 && (t as usize) < v {
            out.extend_from_slice(&tb[t as usize * k..(t as usize + 1) * k]);
        } else {
            out.extend_from_slice(&fb[i * k..(i + 1) * k]);
        }
    }
    Ok(new_i32(vec![n, k], out))
}

// scores [n, e], ids [n, k] → scale · s[ids] / (Σ s[ids] + 1e-20)  [n, k]
pub(super) fn route_weights(scores: &CpuTensor, ids: &CpuTensor, scale: f32) -> Result<CpuTensor> {
    const OP: &str = "route_weights";
    let (n, e) = check_2d(OP, "scores", scores)?;
    let (n2, k) = check_2d(OP, "ids", ids)?;
    let (s, id) = (scores.f32(OP)?, ids.i32(OP)?);
    if n2 != n || id.iter().any(|&x| x < 0 || x as usize >= e) {
        return Err(Error::shape(OP, format!("ids {:?} do not index scores {:?}", ids.shape, scores.shape)));
    }
    let mut out = vec![0f32; n * k];
    for i in 0..n {
        let sel: Vec<f32> = id[i * k..(i + 1) * k].iter().map(|&x| s[i * e + x as usize]).collect();
        let sum: f32 = sel.iter().sum::<f32>() + 1e-20;
        for (j, v) in sel.iter().enumerate() {
            out[i * k + j] = v / sum * scale;
        }
    }
    Ok(CpuTensor::new_f32(vec![n, k], out))
}

// g, u [n, h] → silu(min(g, limit)) · clamp(u, −limit, limit)  [n, h]
pub(super) fn swiglu_clamp(g: &CpuTensor, u: &CpuTensor, limit: f32) -> Result<CpuTensor> {
    const OP: &str = "swiglu_clamp";
    let (n, h) = check_2d(OP, "g", g)?;
    if u.shape != g.shape {
        return Err(Error::shape(OP, format!("g {:?} and u {:?} differ", g.shape, u.shape)));
    }
    let out = g
        .f32(OP)?
        .iter()
        .zip(u.f32(OP)?)
        .map(|(&g, &u)| {
            let (g, u) = (g.min(limit), u.clamp(-limit, limit));
            g / (1.0 + (-g).exp()) * u
        })
        .collect();
    Ok(CpuTensor::new_f32(vec![n, h], out))
}

// x [n, d], ids/weights [n, k], w1[e], w3[e] [h, d], w2[e] [d, h]
//   → Σ_k w_k · w2_e(swiglu_clamp(w1_e x, w3_e x))  [n, d]
#[allow(clippy::too_many_arguments)]
pub(super) fn moe_experts(
    b: &CpuBackend,
    x: &CpuTensor,
    ids: &CpuTensor,
    weights: &CpuTensor,
    w1: &[CpuWeight],
    w3: &[CpuWeight],
    w2: &[CpuWeight],
    limit: f32,
) -> Result<CpuTensor> {
    use crate::backend::Backend;
    const OP: &str = "moe_experts";
    let (n, d) = check_2d(OP, "x", x)?;
    let (n2, k) = check_2d(OP, "ids", ids)?;
    let (id, wt) = (ids.i32(OP)?, weights.f32(OP)?);
    let e = w1.len();
    if n2 != n
        || weights.shape != ids.shape
        || w3.len() != e
        || w2.len() != e
        || id.iter().any(|&j| j < 0 || j as usize >= e)
    {
        return Err(Error::shape(
            OP,
            format!(
                "ids {:?}, weights {:?}, {e} / {} / {} experts (w1 / w3 / w2) do not fit",
                ids.shape,
                weights.shape,
                w3.len(),
                w2.len()
            ),
        ));
    }
    let xs = x.f32(OP)?;
    // each expert once, on all the (token, slot) pairs that picked it, so its weights are decoded
    // once per call; ys[i·k + s] = expert(id[i, s]) of token i
    let mut ys = vec![0f32; n * k * d];
    for (e, ((w1, w3), w2)) in w1.iter().zip(w3).zip(w2).enumerate() {
        let pairs: Vec<usize> = (0..n * k).filter(|&p| id[p] as usize == e).collect();
        if pairs.is_empty() {
            continue;
        }
        let rows: Vec<f32> = pairs.iter().flat_map(|&p| xs[(p / k) * d..(p / k + 1) * d].iter().copied()).collect();
        let xe = CpuTensor::new_f32(vec![pairs.len(), d], rows);
        let h = swiglu_clamp(&b.linear(&xe, w1, None)?, &b.linear(&xe, w3, None)?, limit)?;
        let y = b.linear(&h, w2, None)?;
        let y = y.f32(OP)?;
        if y.len() != pairs.len() * d {
            return Err(Error::shape(
                OP,
                format!("expert {e} w2 maps to {} columns, x has {d}", y.len() / pairs.len()),
            ));
        }
        for (r, &p) in pairs.iter().enumerate() {
            ys[p * d..(p + 1) * d].copy_from_slice(&y[r * d..(r + 1) * d]);
        }
    }
    // the weighted sum of each token's k outputs, in slot order
    let mut out = vec![0f32; n * d];
    for i in 0..n {
        for s in 0..k {
            let y = &ys[(i * k + s) * d..(i * k + s + 1) * d];
            for j in 0..d {
                out[i * d + j] += wt[i * k + s] * y[j];
            }
        }
    }
    Ok(CpuTensor::new_f32(vec![n, d], out))
}

#[cfg(test)]
mod tests {
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{Backend, HostData, HostTensor};

    fn t(b: &CpuBackend, shape: &[usize], v: Vec<f32>) -> super::CpuTensor {
        b.upload(&HostTensor::f32(shape.to_vec(), v).unwrap()).unwrap()
    }
    fn ti(b: &CpuBackend, shape: &[usize], v: Vec<i32>) -> super::CpuTensor {
        b.upload(&HostTensor::i32(shape.to_vec(), v).unwrap()).unwrap()
    }
    fn get(b: &CpuBackend, x: &super::CpuTensor) -> Vec<f32> {
        b.download(x).unwrap().into_f32("test").unwrap()
    }
    fn geti(b: &CpuBackend, x: &super::CpuTensor) -> Vec<i32> {
        match b.download(x).unwrap().data {
            HostData::I32(v) => v,
            HostData::F32(_) => panic!("expected i32"),
        }
    }

    #[test]
    fn hc_split_comb_is_doubly_stochastic_after_sinkhorn() {
        let b = CpuBackend::new();
        let hc = 4;
        let mix: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect();
        let base: Vec<f32> = (0..24).map(|i| (i % 5) as f32 * 0.1).collect();
        let out = get(
            &b,
            &b.hc_split(&t(&b, &[1, 24], mix), &t(&b, &[3], vec![0.5, 1.0, 2.0]), &t(&b, &[24], base), hc, 20, 1e-6)
                .unwrap(),
        );
        let c = &out[8..];
        for k in 0..hc {
            let row: f32 = (0..hc).map(|j| c[k * hc + j]).sum();
            let col: f32 = (0..hc).map(|j| c[j * hc + k]).sum();
            assert!((row - 1.0).abs() < 1e-3 && (col - 1.0).abs() < 1e-5, "row {row} col {col}");
        }
        assert!(out[..4].iter().all(|&p| p > 0.0 && p < 1.0 + 1e-5));
        assert!(out[4..8].iter().all(|&p| p > 0.0 && p < 2.0));
    }

    #[test]
    fn compress_pool_with_equal_gates_averages_and_overlaps_halves() {
        let b = CpuBackend::new();
        // ratio 2, overlap, d = 1 (w = 2): 4 rows → 2 entries; equal logits → plain means
        let kv = t(&b, &[4, 2], vec![1.0, 10.0, 2.0, 20.0, 3.0, 30.0, 4.0, 40.0]);
        let z = t(&b, &[4, 2], vec![0.0; 8]);
        let ape = t(&b, &[2, 2], vec![0.0; 4]);
        let out = get(&b, &b.compress_pool(&kv, &z, &ape, 2, true).unwrap());
        // entry 0: second halves of rows 0,1 → 15; entry 1: first halves of 0,1 ∪ second of 2,3
        assert_eq!(out.len(), 2);
        assert!((out[0] - 15.0).abs() < 1e-5 && (out[1] - (1.0 + 2.0 + 30.0 + 40.0) / 4.0).abs() < 1e-5, "{out:?}");
        // no overlap, trailing partial block dropped
        let kv3 = t(&b, &[3, 1], vec![1.0, 3.0, 100.0]);
        let z3 = t(&b, &[3, 1], vec![0.0; 3]);
        let out = get(&b, &b.compress_pool(&kv3, &z3, &t(&b, &[2, 1], vec![0.0, 0.0]), 2, false).unwrap());
        assert_eq!(out, vec![2.0]);
    }

    #[test]
    fn topk_rows_orders_descending_and_fills_minus_one() {
        let b = CpuBackend::new();
        let x = t(&b, &[2, 4], vec![0.5, 2.0, -1.0, 2.0, 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        assert_eq!(geti(&b, &b.topk_rows(&x, 3).unwrap()), vec![1, 3, 0, 0, -1, -1]);
    }

    #[test]
    fn rope_tail_at_matches_rope_tail_at_the_same_positions_and_refuses_negative_ones() {
        let b = CpuBackend::new();
        let x: Vec<f32> = (0..5 * 16).map(|i| (i as f32 * 0.37).sin()).collect();
        let xt = b.upload(&HostTensor::f32([5, 16], x).unwrap()).unwrap();
        let f = b.upload(&HostTensor::f32([2], vec![0.9, 0.013]).unwrap()).unwrap();
        let at = |p: Vec<i32>, inverse| {
            let p = b.upload(&HostTensor::i32([p.len()], p).unwrap()).unwrap();
            b.rope_tail_at(&xt, 2, &f, &p, inverse)
        };
        for inverse in [false, true] {
            let strided = get(&b, &b.rope_tail(&xt, 2, &f, 7, 3, inverse).unwrap());
            assert_eq!(get(&b, &at(vec![7, 10, 13, 16, 19], inverse).unwrap()), strided);
        }
        assert!(matches!(at(vec![7, 10, -1, 16, 19], false), Err(crate::Error::Invalid(_))));
        assert!(matches!(at(vec![7, 10, 13], false), Err(crate::Error::Shape { .. })));
    }

    #[test]
    fn rope_tail_inverse_undoes_forward_and_leaves_the_head_of_each_row() {
        let b = CpuBackend::new();
        let x: Vec<f32> = (0..2 * 2 * 6).map(|i| (i as f32 * 0.37).sin()).collect();
        let f = t(&b, &[2], vec![1.0, 0.1]);
        let xt = t(&b, &[2, 12], x.clone());
        let y = b.rope_tail(&xt, 2, &f, 5, 3, false).unwrap();
        let yv = get(&b, &y);
        for h in 0..4 {
            assert_eq!(&yv[h * 6..h * 6 + 2], &x[h * 6..h * 6 + 2], "non-rotary dims untouched");
        }
        // row 1 sits at position 8: pair (2,3) of head 0 rotates by 8 rad
        let (c, s) = (8f32.cos(), 8f32.sin());
        assert!((yv[12 + 2] - (x[14] * c - x[15] * s)).abs() < 1e-6);
        let back = get(&b, &b.rope_tail(&y, 2, &f, 5, 3, true).unwrap());
        assert!(back.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-5));
    }

    #[test]
    fn sink_attention_sink_only_scales_the_output() {
        let b = CpuBackend::new();
        // one query, two identical keys: softmax weights 1/(2 + e^(sink − s)) each
        let q = t(&b, &[1, 2], vec![0.0, 0.0]);
        let kv = t(&b, &[2, 2], vec![1.0, 2.0, 1.0, 2.0]);
        let w = ti(&b, &[1, 2], vec![0, 1]);
        let out = get(&b, &b.sink_attention(&q, &kv, &w, None, &t(&b, &[1], vec![0.0]), 1).unwrap());
        // scores are 0, sink 0 → each key 1/3
        assert!((out[0] - 2.0 / 3.0).abs() < 1e-6 && (out[1] - 4.0 / 3.0).abs() < 1e-6, "{out:?}");
        // a compressed entry joins the same softmax; −1 slots are skipped
        let comp = t(&b, &[1, 2], vec![4.0, 4.0]);
        let idx = ti(&b, &[1, 2], vec![-1, 0]);
        let out = get(
            &b,
            &b.sink_attention(&q, &kv, &w, Some((&comp, &idx)), &t(&b, &[1], vec![f32::NEG_INFINITY]), 1).unwrap(),
        );
        assert!((out[0] - 2.0).abs() < 1e-6 && (out[1] - 8.0 / 3.0).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn routing_hash_and_weights() {
        let b = CpuBackend::new();
        let table = ti(&b, &[2, 2], vec![3, 1, 0, 2]);
        let fb = ti(&b, &[2, 2], vec![9, 9, 2, 3]);
        let sel = b.hash_route(&table, &ti(&b, &[2], vec![1, 7]), &fb).unwrap();
        assert_eq!(geti(&b, &sel), vec![0, 2, 2, 3], "id 7 ≥ vocab 2 takes the fallback row");
        let s = t(&b, &[2, 4], vec![1.0, 0.0, 3.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
        let w = get(&b, &b.route_weights(&s, &sel, 1.5).unwrap());
        assert_eq!(w, vec![0.375, 1.125, 0.75, 0.75]);
    }

    #[test]
    fn swiglu_clamp_clamps_gate_above_and_up_both_ways() {
        let b = CpuBackend::new();
        let (g, u) = (t(&b, &[1, 2], vec![5.0, -3.0]), t(&b, &[1, 2], vec![9.0, -9.0]));
        let out = get(&b, &b.swiglu_clamp(&g, &u, 1.5).unwrap());
        let silu = |g: f32| g / (1.0 + (-g).exp());
        assert!((out[0] - silu(1.5) * 1.5).abs() < 1e-6 && (out[1] - silu(-3.0) * -1.5).abs() < 1e-6, "{out:?}");
    }
    fn weight(b: &CpuBackend, rows: usize, cols: usize, v: &[f32]) -> super::CpuWeight {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        b.upload_weight(&crate::backend::HostWeight {
            name: "w".into(),
            format: crate::backend::WeightFormat::F32,
            rows,
            cols,
            bytes: bytes.into(),
        })
        .unwrap()
    }

    #[test]
    fn embed_rows_gives_zero_rows_for_sentinel_ids() {
        let b = CpuBackend::new();
        let table = weight(&b, 2, 2, &[1.0, 2.0, 3.0, 4.0]);
        let out = get(&b, &b.embed_rows(&table, &ti(&b, &[3], vec![1, 2, 0])).unwrap());
        assert_eq!(out, vec![3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
    }

    #[test]
    fn grouped_linear_maps_each_group_through_its_rows() {
        let b = CpuBackend::new();
        // 2 groups, k = 2, r = 1: row 0 sees x[0..2], row 1 sees x[2..4]
        let w = weight(&b, 2, 2, &[1.0, 10.0, 100.0, 1000.0]);
        let out = get(&b, &b.grouped_linear(&t(&b, &[1, 4], vec![1.0, 2.0, 3.0, 4.0]), &w, 2).unwrap());
        assert_eq!(out, vec![21.0, 4300.0]);
    }

    /// The entries scored side by side give each score the bits of the plain formula (one dot a
    /// query, head and entry, products added in order), past a group of eight and at its tail.
    #[test]
    fn indexer_scores_are_the_plain_formula_bit_for_bit() {
        let b = CpuBackend::new();
        let (n, m, heads, hd, ratio, pos0) = (5, 19, 3, 20, 2, 30);
        let mut seed = 7u64;
        let mut rnd = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
                .collect()
        };
        let (qv, kv, wv) = (rnd(n * heads * hd), rnd(m * hd), rnd(n * heads));
        let (q, k, w) =
            (t(&b, &[n, heads * hd], qv.clone()), t(&b, &[m, hd], kv.clone()), t(&b, &[n, heads], wv.clone()));
        let got = get(&b, &b.indexer_scores(&q, &k, &w, heads, 0.3, pos0, ratio).unwrap());
        for i in 0..n {
            let visible = ((pos0 + i + 1) / ratio).min(m);
            for j in 0..m {
                let want = if j < visible {
                    let mut s = 0f32;
                    for h in 0..heads {
                        let dot: f32 = qv[i * heads * hd + h * hd..][..hd]
                            .iter()
                            .zip(&kv[j * hd..][..hd])
                            .map(|(a, b)| a * b)
                            .sum();
                        s += wv[i * heads + h] * dot.max(0.0);
                    }
                    s * 0.3
                } else {
                    f32::NEG_INFINITY
                };
                assert_eq!(got[i * m + j].to_bits(), want.to_bits(), "query {i}, entry {j}");
            }
        }
    }

    #[test]
    fn indexer_scores_hide_incomplete_blocks_and_relu_each_head() {
        let b = CpuBackend::new();
        // 2 heads of 1 dim; keys 1 and −1; weights 1 and 2; queries at positions 2..5, ratio 2
        let q = t(&b, &[3, 2], vec![1.0, -1.0, 1.0, -1.0, 1.0, -1.0]);
        let k = t(&b, &[2, 1], vec![1.0, -1.0]);
        let w = t(&b, &[3, 2], vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
        let out = get(&b, &b.indexer_scores(&q, &k, &w, 2, 0.5, 2, 2).unwrap());
        // position 2: (2+1)/2 = 1 visible; position 3, 4: 2 visible
        assert_eq!(out[0], 0.5 * 1.0);
        assert_eq!(out[1], f32::NEG_INFINITY);
        assert_eq!(&out[2..4], &[0.5, 0.5 * 2.0]);
    }
}
