//! Scaled small-float blocks: ggml Q8_0 and MXFP4, and DeepSeek's FP8 e4m3 re-laid row-local.
//!
//! Each decoder performs ggml's (or DeepSeek's) f32 operations in the same order, so the result
//! is bit-identical to theirs: `code as f32 * scale`, one rounding per value.

use super::{e8m0_to_f32_half, f16_at};
use crate::formats::tables::KVALUES_MXFP4;

/// ggml Q8_0, 34 bytes → 32 values (ggml `dequantize_row_q8_0`):
///
/// ```text
///   0      2                                      34
///   | d f16 | q[0] q[1] … q[31]   (i8)             |
///   value[j] = q[j] · d
/// ```
pub(super) fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// ggml MXFP4 (OCP microscaling FP4, E2M1 codes with one E8M0 scale), 17 bytes → 32 values
/// (ggml `dequantize_row_mxfp4`):
///
/// ```text
///   0      1                                   17
///   | e u8  | qs[0] … qs[15]                     |
///   qs[j] = code[j] (low nibble) | code[j+16] (high nibble)
///   value = KVALUES_MXFP4[code] · 2^(e−128)
/// ```
///
/// ggml's table holds the E2M1 values doubled (0, 1, 2, 3, 4, 6, 8, 12 for 0 … 6) so it can be
/// indexed as integers, and halves the scale instead (`ggml_e8m0_to_fp32_half`).
pub(super) fn mxfp4(b: &[u8], out: &mut [f32]) {
    let d = e8m0_to_f32_half(b[0]);
    let (lo, hi) = out.split_at_mut(16);
    for (j, &q) in b[1..17].iter().enumerate() {
        lo[j] = KVALUES_MXFP4[(q & 0x0F) as usize] as f32 * d;
        hi[j] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
    }
}

/// One FP8 e4m3fn code as f32 (OCP FP8 E4M3, the "fn" variant torch calls `float8_e4m3fn`):
/// sign, 4 exponent bits with bias 7, 3 mantissa bits; exponent 0 is subnormal
/// (`m · 2^−9`); there is no infinity, and `S.1111.111` (0x7F, 0xFF) is NaN. Every value is
/// exact in f32.
pub fn e4m3_to_f32(code: u8) -> f32 {
    let sign = ((code & 0x80) as u32) << 24;
    let exp = ((code >> 3) & 0x0F) as u32;
    let man = (code & 0x07) as u32;
    let magnitude = match (exp, man) {
        (15, 7) => f32::NAN,
        // subnormal: m · 2^−9 (2^−9 has f32 exponent field 127 − 9)
        (0, m) => m as f32 * f32::from_bits((127 - 9) << 23),
        // normal: (1 + m/8) · 2^(e−7): re-bias the exponent, widen the mantissa to 23 bits
        (e, m) => f32::from_bits((e + 127 - 7) << 23 | m << 20),
    };
    f32::from_bits(magnitude.to_bits() | sign)
}

/// An E8M0 byte as the f32 `2^(e−127)` (OCP MX scale; torch `float8_e8m0fnu`): e = 0 is the
/// subnormal 2^−127, e = 255 is NaN (the MX spec's NaN encoding; `2^128` would not fit f32).
pub fn e8m0_to_f32(e: u8) -> f32 {
    match e {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        e => f32::from_bits((e as u32) << 23),
    }
}

/// FP8 e4m3 with an E8M0 block scale, re-laid row-local from DeepSeek's 128×128 scale blocks,
/// 129 bytes → 128 values (DeepSeek `weight_dequant`: `float(e4m3) · scale` in f32):
///
/// ```text
///   0      1                                   129
///   | e u8  | w[0] … w[127]   (e4m3fn)           |
///   value[j] = e4m3(w[j]) · 2^(e−127)
/// ```
pub(super) fn fp8_e4m3_b128_e8m0(b: &[u8], out: &mut [f32]) {
    fp8_scaled(e8m0_to_f32(b[0]), &b[1..129], out);
}

/// FP8 e4m3 with an f32 block scale (the Base checkpoint's experts), 132 bytes → 128 values:
///
/// ```text
///   0             4                            132
///   | scale f32 LE | w[0] … w[127]   (e4m3fn)    |
///   value[j] = e4m3(w[j]) · scale
/// ```
pub(super) fn fp8_e4m3_b128_f32(b: &[u8], out: &mut [f32]) {
    let scale = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    fp8_scaled(scale, &b[4..132], out);
}

fn fp8_scaled(scale: f32, codes: &[u8], out: &mut [f32]) {
    for (o, &w) in out.iter_mut().zip(codes) {
        *o = e4m3_to_f32(w) * scale;
    }
}
