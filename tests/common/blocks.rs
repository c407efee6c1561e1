//! Random *valid* weight bytes in every storage format, for lane-against-CPU cases: random codes
//! (every bit pattern of the code fields is a valid code), with the scale fields overwritten by
//! sane values so no inf/NaN appears and decoded weights are of order `1/√cols` (dot products of
//! unit-range inputs then stay O(1)). The lanes' decoders are compared with the CPU lane's
//! `formats::decode_row`, so these bytes need no golden of their own.

use fovea::backend::WeightFormat;
use rand::Rng;
use rand::rngs::StdRng;

/// Bytes of a `[rows, cols]` matrix in `format` (`cols` a whole number of blocks).
pub fn weight_bytes(r: &mut StdRng, format: WeightFormat, rows: usize, cols: usize) -> Vec<u8> {
    format.check_cols(cols).unwrap_or_else(|e| panic!("test shape: {e}"));
    let a = (3.0 / cols as f32).sqrt();
    match format {
        WeightFormat::F32 => (0..rows * cols).flat_map(|_| r.random_range(-a..a).to_le_bytes()).collect(),
        WeightFormat::F16 => {
            (0..rows * cols).flat_map(|_| half::f16::from_f32(r.random_range(-a..a)).to_le_bytes()).collect()
        }
        WeightFormat::BF16 => {
            (0..rows * cols).flat_map(|_| half::bf16::from_f32(r.random_range(-a..a)).to_le_bytes()).collect()
        }
        block => {
            let mut bytes = vec![0u8; rows * block.row_bytes(cols)];
            r.fill(&mut bytes[..]);
            for b in bytes.chunks_exact_mut(block.block_bytes()) {
                sane_scales(r, block, b, a);
            }
            bytes
        }
    }
}

/// A random f16 scale of either sign with `|d| ∈ [0.5, 1.5]·unit` (a normal half).
fn f16_scale(r: &mut StdRng, unit: f32) -> [u8; 2] {
    let d = unit * r.random_range(0.5f32..1.5) * if r.random_bool(0.5) { 1.0 } else { -1.0 };
    half::f16::from_f32(d).to_le_bytes()
}

/// An E8M0 byte for a scale near `unit` (2^(e−127) within a factor 4 of it).
fn e8m0_scale(r: &mut StdRng, unit: f32) -> u8 {
    (127 + unit.log2().round() as i32 + r.random_range(-2..=2)) as u8
}

/// Overwrite the scale fields of one block `b` so its values are of order `a` (the largest code
/// times its scale, roughly).
fn sane_scales(r: &mut StdRng, format: WeightFormat, b: &mut [u8], a: f32) {
    use WeightFormat::*;
    let mut put = |b: &mut [u8], at: usize, unit: f32| b[at..at + 2].copy_from_slice(&f16_scale(r, unit));
    match format {
        Q8_0 => put(b, 0, a / 127.0),
        // d·(4-bit scale)·(2-bit code) − dmin·(4-bit min)
        Q2_K => {
            put(b, 80, a / 45.0);
            put(b, 82, a / 15.0);
        }
        // d·(6-bit scale − 32)·(3-bit code)
        Q3_K => put(b, 108, a / 128.0),
        // d·(6-bit scale)·(4- or 5-bit code) − dmin·(6-bit min)
        Q4_K => {
            put(b, 0, a / 945.0);
            put(b, 2, a / 63.0);
        }
        Q5_K => {
            put(b, 0, a / 1953.0);
            put(b, 2, a / 63.0);
        }
        // d·(i8 scale)·(6-bit code − 32)
        Q6_K => put(b, 208, a / 4096.0),
        // d·(scale + 0.5)/4·(grid byte ≤ 43 or 62)
        IQ2_XXS | IQ2_XS | IQ3_XXS => put(b, 0, a / 160.0),
        // d·(2·scale + 1)·(±1.125)
        IQ1_S => put(b, 0, a / 17.0),
        // d·(ls − 32)·(iq4nl value ≤ 127)
        IQ4_XS => put(b, 0, a / 4064.0),
        // IQ1_M: the f16 super-scale lives in the top nibbles of the four u16 group-scale words
        IQ1_M => {
            let d = u16::from_le_bytes(f16_scale(r, a / 17.0));
            for (i, at) in [48, 50, 52, 54].into_iter().enumerate() {
                let w = u16::from_le_bytes([b[at], b[at + 1]]) & 0x0fff | ((d >> (4 * i)) & 0xf) << 12;
                b[at..at + 2].copy_from_slice(&w.to_le_bytes());
            }
        }
        // 2^(e−128)·(doubled e2m1 ≤ 12)
        MXFP4 => b[0] = e8m0_scale(r, a / 6.0),
        // e4m3 (≤ 448) times the block scale; 0x7F / 0xFF are NaN codes
        FP8_E4M3_B128_E8M0 | FP8_E4M3_B128_F32 => {
            let skip = if format == FP8_E4M3_B128_E8M0 {
                b[0] = e8m0_scale(r, a / 448.0);
                1
            } else {
                let s = a / 448.0 * r.random_range(0.5f32..1.5);
                b[..4].copy_from_slice(&s.to_le_bytes());
                4
            };
            for c in &mut b[skip..] {
                if *c & 0x7f == 0x7f {
                    *c &= 0xfe;
                }
            }
        }
        F32 | F16 | BF16 => {}
    }
}
