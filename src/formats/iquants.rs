//! ggml's "i-quants": 256-value super-blocks whose codes index fixed lattices ("grids") of 4 or
//! 8 small magnitudes, with separate sign patterns, or (IQ4_XS) a non-linear 16-value table.
//! The grids and tables are ggml's own (`tables.rs`, generated from ggml-common.h): a code *is*
//! an index into them.
//!
//! Each decoder follows ggml's `dequantize_row_iq*` (ggml/src/ggml-quants.c) operation for
//! operation, in f32 and in the same order, so the values are bit-identical to ggml's. A grid
//! entry is stored as a little-endian integer whose bytes are the magnitudes (ggml reads it
//! through a byte pointer), so magnitude j is byte j of the entry.

use super::{f16_at, u16_at, u32_at};
use crate::formats::tables::{
    IQ1_DELTA, IQ1S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS, KVALUES_IQ4NL,
};

/// Byte `j` of a grid entry (its j-th magnitude).
fn grid_byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// `−1` where the 8-bit sign pattern `signs` has bit `j` set, else `+1` (ggml
/// `signs & kmask_iq2xs[j] ? -1.f : 1.f`).
fn sign(signs: u8, j: usize) -> f32 {
    if signs & KMASK_IQ2XS[j] != 0 { -1.0 } else { 1.0 }
}

/// ggml IQ2_XXS, 66 bytes → 256 values (8 groups of 32, each 4 × 8 values):
///
/// ```text
///   0       2                                                     66
///   | d f16 | group 0: 8 bytes | group 1 | … | group 7             |
///   group: bytes 0..4 = four indices into IQ2XXS_GRID (8 magnitudes each),
///          bytes 4..8 = u32 LE: bits 7l..7l+7 sign index of sub-group l (into KSIGNS_IQ2XS),
///                       bits 28..32 the group scale s
///   value = ((d · (0.5 + s)) · 0.25) · magnitude · ±1
/// ```
pub(super) fn iq2_xxs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (group, y) in out.chunks_exact_mut(32).enumerate() {
        let g = &b[2 + 8 * group..2 + 8 * group + 8];
        let aux = u32_at(g, 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let entry = IQ2XXS_GRID[g[l] as usize];
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            for (j, o) in y.iter_mut().enumerate() {
                *o = db * grid_byte(entry, j) as f32 * sign(signs, j);
            }
        }
    }
}

/// ggml IQ2_XS, 74 bytes → 256 values (8 groups of 32, each 4 × 8 values):
///
/// ```text
///   0       2                                      66            74
///   | d f16 | qs[32] u16 LE                        | scales[8]   |
///   qs[4g + l]: bits 0..9 index into IQ2XS_GRID, bits 9..16 sign index (KSIGNS_IQ2XS)
///   scales[g]: low nibble scales sub-groups 0–1, high nibble sub-groups 2–3
///   value = ((d · (0.5 + s)) · 0.25) · magnitude · ±1
/// ```
pub(super) fn iq2_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (group, y) in out.chunks_exact_mut(32).enumerate() {
        let sc = b[66 + group];
        let db = [d * (0.5 + (sc & 0xF) as f32) * 0.25, d * (0.5 + (sc >> 4) as f32) * 0.25];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let q = u16_at(b, 2 + 2 * (4 * group + l));
            let entry = IQ2XS_GRID[(q & 511) as usize];
            let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
            for (j, o) in y.iter_mut().enumerate() {
                *o = db[l / 2] * grid_byte(entry, j) as f32 * sign(signs, j);
            }
        }
    }
}

/// ggml IQ3_XXS, 98 bytes → 256 values (8 groups of 32, each 4 × 8 values):
///
/// ```text
///   0       2                           66                        98
///   | d f16 | qs[64]                    | scales_and_signs[8] u32 LE |
///   qs[8g + 2l], qs[8g + 2l + 1]: indices into IQ3XXS_GRID (4 magnitudes each) for the two
///       halves of sub-group l of group g
///   scales_and_signs[g]: bits 7l..7l+7 sign index of sub-group l, bits 28..32 the scale s
///   value = ((d · (0.5 + s)) · 0.5) · magnitude · ±1
/// ```
pub(super) fn iq3_xxs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    for (group, y) in out.chunks_exact_mut(32).enumerate() {
        let aux = u32_at(b, 66 + 4 * group);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        let q = &qs[8 * group..8 * group + 8];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let first = IQ3XXS_GRID[q[2 * l] as usize] as u64;
            let second = IQ3XXS_GRID[q[2 * l + 1] as usize] as u64;
            for j in 0..4 {
                y[j] = db * grid_byte(first, j) as f32 * sign(signs, j);
                y[j + 4] = db * grid_byte(second, j) as f32 * sign(signs, j + 4);
            }
        }
    }
}

/// ggml IQ1_S, 50 bytes → 256 values (8 groups of 32, each 4 × 8 values):
///
/// ```text
///   0       2                         34                    50
///   | d f16 | qs[32]                  | qh[8] u16 LE        |
///   grid index of sub-group l of group g: qs[4g + l] | ((qh[g] >> 3l) & 7) << 8
///       (into IQ1S_GRID, 2048 entries of 8 ternary values −1, 0, 1 as i8 bytes)
///   qh[g] bits 12..15: scale s; bit 15: delta sign (set → −IQ1_DELTA)
///   value = (d · (2s + 1)) · (ternary + delta)
/// ```
pub(super) fn iq1_s(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (group, y) in out.chunks_exact_mut(32).enumerate() {
        let qh = u16_at(b, 34 + 2 * group);
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let index = b[2 + 4 * group + l] as usize | (((qh >> (3 * l)) & 7) as usize) << 8;
            let entry = IQ1S_GRID[index];
            for (j, o) in y.iter_mut().enumerate() {
                *o = dl * (grid_byte(entry, j) as i8 as f32 + delta);
            }
        }
    }
}

/// ggml IQ1_M, 56 bytes → 256 values (8 groups of 32, each 4 × 8 values):
///
/// ```text
///   0                         32               48                56
///   | qs[32]                  | qh[16]         | sc[4] u16 LE    |
///   grid index of sub-group l of group g: qs[4g + l] | (3 bits of qh[2g + l/2]) << 8,
///       bits 0..3 for even l, bits 4..7 for odd l; bit 3 (even l) or 7 (odd l) of that
///       byte is the delta sign
///   sc[g/2] >> 6(g%2): bits 0..3 scale s1 of sub-groups 0–1, bits 3..6 scale s2 of 2–3
///   d: the f16 whose bits are the top nibbles of sc[0], sc[1], sc[2], sc[3] (low to high)
///   value = (d · (2s + 1)) · (ternary + delta)
/// ```
pub(super) fn iq1_m(b: &[u8], out: &mut [f32]) {
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let d_bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    let d = half::f16::from_bits(d_bits).to_f32();
    for (group, y) in out.chunks_exact_mut(32).enumerate() {
        let s = sc[group / 2] >> (6 * (group % 2));
        let dl = [d * (2 * (s & 7) + 1) as f32, d * (2 * ((s >> 3) & 7) + 1) as f32];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let qh = b[32 + 2 * group + l / 2] >> (4 * (l % 2));
            let index = b[4 * group + l] as usize | ((qh & 7) as usize) << 8;
            let delta = if qh & 0x08 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
            let entry = IQ1S_GRID[index];
            for (j, o) in y.iter_mut().enumerate() {
                *o = dl[l / 2] * (grid_byte(entry, j) as i8 as f32 + delta);
            }
        }
    }
}

/// ggml IQ4_XS, 136 bytes → 256 values (8 groups of 32):
///
/// ```text
///   0       2              4             8                        136
///   | d f16 | scales_h u16 | scales_l[4] | qs[128]                |
///   group g: 6-bit scale ls = (scales_l[g/2] >> 4(g%2)) & 15 | ((scales_h >> 2g) & 3) << 4;
///       its 32 values are the low nibbles of qs[16g .. 16g+16] then their high nibbles,
///       each an index into KVALUES_IQ4NL
///   value = (d · (ls − 32)) · KVALUES_IQ4NL[code]
/// ```
pub(super) fn iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2);
    for (group, y) in out.chunks_exact_mut(32).enumerate() {
        let low = (b[4 + group / 2] >> (4 * (group % 2))) & 0xF;
        let high = ((scales_h >> (2 * group)) & 3) as u8;
        let dl = d * ((low | high << 4) as i32 - 32) as f32;
        let qs = &b[8 + 16 * group..8 + 16 * group + 16];
        for (j, &q) in qs.iter().enumerate() {
            y[j] = dl * KVALUES_IQ4NL[(q & 0xF) as usize] as f32;
            y[j + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}
