//! ggml's K-quants: 256-value super-blocks with an f16 super-scale (and super-min) and small
//! integer scales per group of 16 or 32 values.
//!
//! Each decoder follows ggml's `dequantize_row_q*_K` (ggml/src/ggml-quants.c) operation for
//! operation, in f32 and in the same order, so the values are bit-identical to ggml's: a group's
//! scale `dl = d · sc` and min `ml = dmin · m` are rounded to f32 first, then each value is
//! `dl · q − ml` (two more roundings, no fused multiply-add).

use super::f16_at;

/// ggml Q2_K, 84 bytes → 256 values (16 groups of 16):
///
/// ```text
///   0            16                      80      82       84
///   | scales[16] | qs[64]                | d f16 | dmin f16 |
///   scales[g] = sc (low nibble) | m (high nibble) of group g
///   qs: 2-bit codes; half h (128 values) uses qs[32h .. 32h+32]; within it, group pair
///       j = 0..3 takes bits 2j..2j+1, the first group of the pair from qs[0..16], the second
///       from qs[16..32]
///   value = (d · sc) · q − (dmin · m)
/// ```
pub(super) fn q2_k(b: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    // group g = 8·half + 2·pair + sub holds values 16g .. 16g+16
    for (g, (y, &sc)) in out.chunks_exact_mut(16).zip(scales).enumerate() {
        let (half, pair, sub) = (g / 8, (g / 2) % 4, g % 2);
        let q = &qs[32 * half + 16 * sub..][..16];
        let dl = d * (sc & 0xF) as f32;
        let ml = dmin * (sc >> 4) as f32;
        for (o, &ql) in y.iter_mut().zip(q) {
            *o = dl * ((ql >> (2 * pair)) & 3) as f32 - ml;
        }
    }
}

/// ggml Q3_K, 110 bytes → 256 values (16 groups of 16):
///
/// ```text
///   0           32                 96            108     110
///   | hmask[32] | qs[64]           | scales[12]  | d f16 |
///   q (3 bits) = 2 low bits from qs (laid out as Q2_K's) + a high bit from hmask:
///       value index i = 128h + 32j + l' → hmask[l'] bit (4h + j); the code is
///       low − 4 when that bit is clear, low when it is set (−4 … 3)
///   scales: 16 6-bit unsigned scales s, used as (s − 32): low nibbles in scales[0..8]
///       (group g < 8: low nibble of scales[g], g ≥ 8: high nibble of scales[g−8]),
///       high 2 bits in scales[8..12] (group g: bits 2(g/4) of scales[8 + g%4])
///   value = (d · (s − 32)) · q
/// ```
pub(super) fn q3_k(b: &[u8], out: &mut [f32]) {
    let (hmask, qs, packed) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    let scale = |g: usize| -> i32 {
        let low = if g < 8 { packed[g] & 0xF } else { packed[g - 8] >> 4 };
        let high = (packed[8 + g % 4] >> (2 * (g / 4))) & 3;
        (low | high << 4) as i32 - 32
    };
    // group g = 8·half + 2·pair + sub holds values 16g .. 16g+16
    for (g, y) in out.chunks_exact_mut(16).enumerate() {
        let (half, pair, sub) = (g / 8, (g / 2) % 4, g % 2);
        let q = &qs[32 * half + 16 * sub..][..16];
        let hm = &hmask[16 * sub..][..16];
        let high_bit = 1u8 << (4 * half + pair);
        let dl = d * scale(g) as f32;
        for ((o, &ql), &h) in y.iter_mut().zip(q).zip(hm) {
            let low = ((ql >> (2 * pair)) & 3) as i32;
            let code = low - if h & high_bit != 0 { 0 } else { 4 };
            *o = dl * code as f32;
        }
    }
}

/// The 6-bit scale and min of group `g` (0..8) of a Q4_K / Q5_K block (ggml
/// `get_scale_min_k4`), from the 12 packed bytes:
///
/// ```text
///   g < 4:  sc = s[g] & 63,                      m = s[g+4] & 63
///   g ≥ 4:  sc = s[g+4] & 15 | (s[g−4] >> 6) << 4, m = s[g+4] >> 4 | (s[g] >> 6) << 4
/// ```
fn scale_min_k4(g: usize, s: &[u8]) -> (u8, u8) {
    if g < 4 {
        (s[g] & 63, s[g + 4] & 63)
    } else {
        ((s[g + 4] & 0xF) | ((s[g - 4] >> 6) << 4), (s[g + 4] >> 4) | ((s[g] >> 6) << 4))
    }
}

/// ggml Q4_K, 144 bytes → 256 values (8 groups of 32):
///
/// ```text
///   0       2          4            16                              144
///   | d f16 | dmin f16 | scales[12] | qs[128]                       |
///   qs: 4-bit codes; chunk c = 0..3 is qs[32c .. 32c+32]: its low nibbles are group 2c,
///       its high nibbles group 2c+1
///   value = (d · sc) · q − (dmin · m)      (sc, m from scale_min_k4)
/// ```
pub(super) fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        for (g, nibble_shift) in [(2 * c, 0), (2 * c + 1, 4)] {
            let (sc, m) = scale_min_k4(g, scales);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            for (o, &ql) in out[32 * g..32 * g + 32].iter_mut().zip(q) {
                *o = dl * ((ql >> nibble_shift) & 0xF) as f32 - ml;
            }
        }
    }
}

/// ggml Q5_K, 176 bytes → 256 values (8 groups of 32):
///
/// ```text
///   0       2          4            16        48                    176
///   | d f16 | dmin f16 | scales[12] | qh[32]  | qs[128]             |
///   low 4 bits as Q4_K; the fifth bit (+16) of value 32g + l is bit g of qh[l]
///   value = (d · sc) · q − (dmin · m)
/// ```
pub(super) fn q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for c in 0..4 {
        let q = &qs[32 * c..32 * c + 32];
        for (g, nibble_shift) in [(2 * c, 0), (2 * c + 1, 4)] {
            let (sc, m) = scale_min_k4(g, scales);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            for (l, o) in out[32 * g..32 * g + 32].iter_mut().enumerate() {
                let high = if qh[l] & (1 << g) != 0 { 16 } else { 0 };
                *o = dl * (((q[l] >> nibble_shift) & 0xF) + high) as f32 - ml;
            }
        }
    }
}

/// ggml Q6_K, 210 bytes → 256 values (16 groups of 16):
///
/// ```text
///   0                  128         192             208     210
///   | ql[128]          | qh[64]    | scales[16] i8 | d f16 |
///   per half h (128 values): ql[64h ..], qh[32h ..], scales[8h ..]; for l = 0..32
///     value 128h + l      : ql[l]    low nibble  | qh[l] bits 0–1 << 4
///     value 128h + l + 32 : ql[l+32] low nibble  | qh[l] bits 2–3 << 4
///     value 128h + l + 64 : ql[l]    high nibble | qh[l] bits 4–5 << 4
///     value 128h + l + 96 : ql[l+32] high nibble | qh[l] bits 6–7 << 4
///   q = that 6-bit code − 32; each 16 consecutive values share one i8 scale
///   value = (d · scale) · q
/// ```
pub(super) fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for h in 0..2 {
        let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
        let scales = &b[192 + 8 * h..192 + 8 * h + 8];
        let y = &mut out[128 * h..128 * h + 128];
        for l in 0..32 {
            let codes = [
                (ql[l] & 0xF) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, code) in codes.into_iter().enumerate() {
                let sc = scales[l / 16 + 2 * k] as i8;
                y[l + 32 * k] = d * sc as f32 * (code as i32 - 32) as f32;
            }
        }
    }
}
