//! The official DeepSeek FP8/FP4 safetensors forms (formats.md §1), re-laid row-local while
//! loading so every lane sees one of [`WeightFormat`]'s row-local block formats:
//!
//! - FP8 e4m3 `weight` F8_E4M3 `[out, in]` + `scale` `[ceil(out/128), in/128]` (F8_E8M0 when
//!   `scale_fmt` is `"ue8m0"`, F32 otherwise, and F32 on the FP8 routed experts of Flash-Base)
//!   → [`WeightFormat::FP8_E4M3_B128_E8M0`] / [`WeightFormat::FP8_E4M3_B128_F32`]: per 128
//!   values of a row, the scale of that row's block (1 byte, or 4 bytes f32 LE) then the 128 codes.
//! - FP4 e2m1 routed experts `weight` I8 `[out, in/2]` (element 2i in the low nibble of byte i)
//!   + `scale` F8_E8M0 `[out, in/32]` → [`WeightFormat::MXFP4`]: per 32 values the scale byte,
//!   then 16 bytes holding values 0–15 in the low nibbles and 16–31 in the high nibbles — the
//!   repacking llama.cpp's converter does (`repack_mxfp4_blocks`, conversion/base.py), so the
//!   block is bit-identical to what a GGUF of the same checkpoint holds. ggml's MXFP4 table is
//!   DeepSeek's FP4 table doubled with the scale halved: the same values.
//!
//! The scale is the `.scale` tensor beside the `.weight` (same stem). [`check_scales`] pairs and
//! validates them from headers when the checkpoint opens; [`relay`] does the byte moves.

use safetensors::Dtype;

use super::{Checkpoint, TensorMeta};
use crate::config::{ExpertDtype, FP8_BLOCK, QuantConfig, ScaleFmt};
use crate::error::{Error, Result};
use crate::formats::WeightFormat;

/// Suffix of a matrix's block-scale tensor.
pub const SCALE_SUFFIX: &str = ".scale";
/// Suffix of a matrix tensor.
pub const WEIGHT_SUFFIX: &str = ".weight";
/// Values per FP4 scale (one E8M0 exponent per 32 values).
pub const FP4_GROUP: usize = 32;
/// Name prefix of the multi-token-prediction block, never loaded: its pairs are not checked.
const MTP_PREFIX: &str = "mtp.";

/// `X.scale` for `X.weight`.
pub fn scale_name(weight: &str) -> Option<String> {
    weight.strip_suffix(WEIGHT_SUFFIX).map(|stem| format!("{stem}{SCALE_SUFFIX}"))
}

/// `X.weight` for `X.scale`.
pub fn weight_name(scale: &str) -> Option<String> {
    scale.strip_suffix(SCALE_SUFFIX).map(|stem| format!("{stem}{WEIGHT_SUFFIX}"))
}

/// Whether a tensor is stored in one of the official quantized forms (and so has a `.scale`).
pub fn is_quantized(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F8_E4M3 | Dtype::I8)
}

/// Whether `name` is a routed expert's matrix (`…ffn.experts.E.w{1,2,3}.weight`, not the
/// shared experts), whose storage `expert_dtype` announces.
pub fn is_routed_expert(name: &str) -> bool {
    name.contains(".ffn.experts.")
}

/// What a quantized weight becomes after the re-lay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relaid {
    pub format: WeightFormat,
    /// Logical matrix shape `[out, in]` (an FP4 header says `[out, in/2]`).
    pub rows: usize,
    pub cols: usize,
    pub scale: String,
}

fn dims(m: &TensorMeta) -> Result<(usize, usize)> {
    match m.shape {
        [r, c] if *r > 0 && *c > 0 => Ok((*r, *c)),
        s => Err(Error::tensor(
            m.name,
            format!(
                "a quantized ({}) tensor must be a non-empty 2-D matrix, found shape {s:?} in {}",
                m.dtype,
                m.file.display()
            ),
        )),
    }
}

/// The format, logical shape and scale of a quantized weight, from headers: refuses (naming the
/// tensor and file) a dtype the config does not announce, a missing or mis-shaped scale, and
/// in-dims that are not whole blocks.
pub fn plan(ckpt: &Checkpoint, w: &TensorMeta) -> Result<Relaid> {
    let file = w.file.display();
    let quant: QuantConfig = ckpt.quant().ok_or_else(|| {
        Error::tensor(
            w.name,
            format!(
                "stored as {} in {file}, but config.json has no quantization_config announcing FP8/FP4 weights",
                w.dtype
            ),
        )
    })?;
    let expert = is_routed_expert(w.name);
    let (rows, stored_cols) = dims(w)?;
    let (format, cols, scale_shape) = match w.dtype {
        Dtype::I8 => {
            if !expert || quant.expert_dtype != ExpertDtype::Fp4 {
                let why =
                    if expert { "config.json's expert_dtype is not \"fp4\"" } else { "only routed experts are FP4" };
                return Err(Error::tensor(w.name, format!("I8 (packed FP4 e2m1) weight in {file}, but {why}")));
            }
            let cols = stored_cols.checked_mul(2).ok_or_else(|| Error::tensor(w.name, "shape overflows"))?;
            if cols % FP4_GROUP != 0 {
                return Err(Error::tensor(
                    w.name,
                    format!(
                        "FP4 in-dim {cols} (I8 shape [{rows}, {stored_cols}] in {file}) is not a multiple of {FP4_GROUP}"
                    ),
                ));
            }
            (WeightFormat::MXFP4, cols, [rows, cols / FP4_GROUP])
        }
        Dtype::F8_E4M3 => {
            if expert && quant.expert_dtype == ExpertDtype::Fp4 {
                return Err(Error::tensor(
                    w.name,
                    format!("F8_E4M3 routed expert in {file}, but config.json's expert_dtype is \"fp4\""),
                ));
            }
            if stored_cols % FP8_BLOCK != 0 {
                return Err(Error::tensor(
                    w.name,
                    format!("FP8 in-dim {stored_cols} (in {file}) is not a multiple of the {FP8_BLOCK}-value block"),
                ));
            }
            // the format follows the scale's dtype, checked below against what the config announces
            (WeightFormat::FP8_E4M3_B128_E8M0, stored_cols, [rows.div_ceil(FP8_BLOCK), stored_cols / FP8_BLOCK])
        }
        d => return Err(Error::tensor(w.name, format!("dtype {d} in {file} is not a quantized weight dtype"))),
    };
    let sname = scale_name(w.name).ok_or_else(|| {
        Error::tensor(
            w.name,
            format!("a quantized ({}) tensor in {file} whose name does not end in `.weight`", w.dtype),
        )
    })?;
    let s = ckpt.meta(&sname).ok_or_else(|| {
        Error::tensor(w.name, format!("{} weight in {file} has no block scale `{sname}` in the checkpoint", w.dtype))
    })?;
    let accepted: &[Dtype] = match (format, quant.scale_fmt) {
        (WeightFormat::MXFP4, _) => &[Dtype::F8_E8M0],
        (_, ScaleFmt::F32) => &[Dtype::F32],
        // Flash-Base: FP8 routed experts with F32 block scales beside E8M0 everywhere else
        (_, ScaleFmt::Ue8m0) if expert && quant.expert_dtype == ExpertDtype::Fp8 => &[Dtype::F8_E8M0, Dtype::F32],
        (_, ScaleFmt::Ue8m0) => &[Dtype::F8_E8M0],
    };
    if !accepted.contains(&s.dtype) {
        let list: Vec<String> = accepted.iter().map(|d| d.to_string()).collect();
        return Err(Error::tensor(
            &sname,
            format!(
                "block scale of `{}` is {} in {} (config.json's quantization_config announces {})",
                w.name,
                s.dtype,
                s.file.display(),
                list.join(" or ")
            ),
        ));
    }
    if s.shape != scale_shape {
        return Err(Error::tensor(
            &sname,
            format!(
                "block scale of `{}` ({} {:?}) has shape {:?} in {}, expected {scale_shape:?}",
                w.name,
                w.dtype,
                w.shape,
                s.shape,
                s.file.display()
            ),
        ));
    }
    let format = if format == WeightFormat::MXFP4 {
        format
    } else if s.dtype == Dtype::F32 {
        WeightFormat::FP8_E4M3_B128_F32
    } else {
        WeightFormat::FP8_E4M3_B128_E8M0
    };
    Ok(Relaid { format, rows, cols, scale: sname })
}

/// Pair every quantized weight with its scale and, in a checkpoint whose config announces
/// quantization, every scale with its weight, from headers (run when the checkpoint opens). In a
/// plain float checkpoint a stray `.scale` is left to the accounting, which names it as an
/// unknown tensor. `mtp.*` tensors are never loaded and are not checked.
pub fn check_scales(ckpt: &Checkpoint) -> Result<()> {
    for m in ckpt.metas() {
        if m.name.starts_with(MTP_PREFIX) {
            continue;
        }
        if is_quantized(m.dtype) {
            plan(ckpt, &m)?;
        } else if let Some(wname) = weight_name(m.name).filter(|_| ckpt.quant().is_some()) {
            let file = m.file.display();
            match ckpt.meta(&wname) {
                None => {
                    return Err(Error::tensor(
                        m.name,
                        format!("block scale ({}, in {file}) without its weight `{wname}`", m.dtype),
                    ));
                }
                Some(w) if !is_quantized(w.dtype) => {
                    return Err(Error::tensor(
                        m.name,
                        format!(
                            "block scale ({}, in {file}) beside `{wname}`, which is {} (only F8_E4M3 and packed-FP4 \
                             I8 weights have scales)",
                            m.dtype, w.dtype
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

/// The row-local bytes of a weight laid out by [`plan`]: `weight` and `scale` are the two
/// tensors' bytes. The result is an owned copy of the same size give or take the scales
/// (MXFP4: exactly the file's weight + scale bytes; FP8: 129/128 with E8M0, 132/128 with F32).
pub fn relay(name: &str, plan: &Relaid, weight: &[u8], scale: &[u8]) -> Result<Vec<u8>> {
    let Relaid { format, rows, cols, .. } = *plan;
    let row_bytes = format.row_bytes(cols);
    let total = rows.checked_mul(row_bytes).ok_or_else(|| Error::tensor(name, "re-laid size overflows"))?;
    let mismatch = |what: &str, have: usize, want: usize| {
        Error::tensor(
            name,
            format!("{what} holds {have} bytes, expected {want} for a [{rows}, {cols}] {format} matrix"),
        )
    };
    let mut out = Vec::with_capacity(total);
    match format {
        WeightFormat::MXFP4 => {
            let (packed, groups) = (cols / 2, cols / FP4_GROUP);
            if weight.len() != rows * packed {
                return Err(mismatch("the weight", weight.len(), rows * packed));
            }
            if scale.len() != rows * groups {
                return Err(mismatch("the scale", scale.len(), rows * groups));
            }
            for (src, s) in weight.chunks_exact(FP4_GROUP / 2).zip(scale) {
                // element k of the group is nibble k % 2 of byte k / 2
                let code = |k: usize| (src[k / 2] >> (4 * (k % 2))) & 0x0F;
                out.push(*s);
                out.extend((0..FP4_GROUP / 2).map(|j| code(j) | (code(j + FP4_GROUP / 2) << 4)));
            }
        }
        WeightFormat::FP8_E4M3_B128_E8M0 | WeightFormat::FP8_E4M3_B128_F32 => {
            let ssize = if format == WeightFormat::FP8_E4M3_B128_F32 { 4 } else { 1 };
            let blocks = cols / FP8_BLOCK;
            let scale_row = blocks * ssize;
            if weight.len() != rows * cols {
                return Err(mismatch("the weight", weight.len(), rows * cols));
            }
            if scale.len() != rows.div_ceil(FP8_BLOCK) * scale_row {
                return Err(mismatch("the scale", scale.len(), rows.div_ceil(FP8_BLOCK) * scale_row));
            }
            for (r, row) in weight.chunks_exact(cols).enumerate() {
                // row r lies in block row r / 128 of the scale grid
                let srow = &scale[r / FP8_BLOCK * scale_row..][..scale_row];
                for (codes, s) in row.chunks_exact(FP8_BLOCK).zip(srow.chunks_exact(ssize)) {
                    out.extend_from_slice(s);
                    out.extend_from_slice(codes);
                }
            }
        }
        other => return Err(Error::tensor(name, format!("{other} is not a re-laid official format"))),
    }
    debug_assert_eq!(out.len(), total);
    Ok(out)
}
