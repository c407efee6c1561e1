//! Weight storage formats: what a matrix row looks like in the checkpoint and in device memory,
//! and the CPU lane's readable reference decoder for each.
//!
//! Every format is **row-local**: a row of `cols` elements is a whole number of blocks, each
//! block `block_elems()` elements in `block_bytes()` bytes, so a row is `row_bytes(cols)` bytes
//! and a lane can find row `r` at `r · row_bytes(cols)` whatever the format. The GGUF block
//! formats are row-local as llama.cpp writes them (ggml stores a row as consecutive blocks along
//! `ne[0]`, the input dimension). The official DeepSeek safetensors are not: their FP8 matrices
//! keep one scale per 128×128 block in a separate tensor, and their FP4 experts one E8M0 scale per
//! 32 values in another. The loader re-lays those while reading (`weights::fp8`): FP4 e2m1 with
//! E8M0 scales per 32 *is* MXFP4 up to the nibble order, so it becomes [`WeightFormat::MXFP4`]
//! exactly as llama.cpp's converter does; FP8 rows carry their block row's scale in front of each
//! 128 codes ([`WeightFormat::FP8_E4M3_B128_E8M0`], `…_F32`): 129/128 (E8M0) or 132/128 (F32)
//! of the file's bytes.
//!
//! The decoders here are the reference the GPU lanes are checked against (the op harness), and
//! are themselves checked bit for bit against llama.cpp's `dequantize_row_*`
//! (`tests/formats.rs`, goldens from `fixtures/gen/formats/`).

use std::fmt;

mod fp;
mod iquants;
mod kquants;
pub mod tables;

pub use fp::{e4m3_to_f32, e8m0_to_f32};

/// Storage format of a weight matrix, as it lies in the checkpoint and on the device. Each is
/// decoded inside the kernels, never expanded in memory.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WeightFormat {
    F32,
    F16,
    BF16,
    /// ggml Q8_0: 32 values, f16 scale d then 32 × i8 → `d · q`.
    Q8_0,
    /// ggml Q2_K: 256 values in 16 groups of 16, 2-bit codes, 4-bit scale and min per group.
    Q2_K,
    /// ggml Q3_K: 256 values, 3-bit codes (2 low bits + a high-bit mask), 6-bit signed scales.
    Q3_K,
    /// ggml Q4_K: 256 values in 8 groups of 32, 4-bit codes, 6-bit scale and min per group.
    Q4_K,
    /// ggml Q5_K: as Q4_K with a fifth bit per code.
    Q5_K,
    /// ggml Q6_K: 256 values in 16 groups of 16, 6-bit codes, i8 scales.
    Q6_K,
    /// ggml IQ1_S: 256 values, codes into a 2048-entry ternary grid, 3-bit group scales.
    IQ1_S,
    /// ggml IQ1_M: as IQ1_S with per-half shifts and scales packed with the f16 super-scale.
    IQ1_M,
    /// ggml IQ2_XXS: 256 values, 8-value codes into a 256-entry grid plus 7-bit sign patterns.
    IQ2_XXS,
    /// ggml IQ2_XS: 256 values, 9-bit codes into a 512-entry grid, 4-bit scales.
    IQ2_XS,
    /// ggml IQ3_XXS: 256 values, 4-value codes into a 256-entry grid plus sign patterns.
    IQ3_XXS,
    /// ggml IQ4_XS: 256 values, 4-bit codes into a non-linear 16-entry table, 6-bit scales.
    IQ4_XS,
    /// ggml MXFP4 (OCP microscaling FP4): 32 values, E8M0 scale then 16 bytes of e2m1 codes,
    /// values 0–15 in the low nibbles and 16–31 in the high nibbles.
    MXFP4,
    /// FP8 e4m3 with one E8M0 scale per 128×128 block (official DeepSeek safetensors), re-laid
    /// row-local: per 128 values, the block's E8M0 byte then 128 e4m3 bytes.
    FP8_E4M3_B128_E8M0,
    /// FP8 e4m3 with one f32 scale per 128×128 block (the Base checkpoint's experts), re-laid
    /// row-local: per 128 values, the block's f32 scale (little-endian) then 128 e4m3 bytes.
    FP8_E4M3_B128_F32,
}

impl WeightFormat {
    /// Every format, in declaration order (for tests and tables).
    pub const ALL: [WeightFormat; 18] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::BF16,
        WeightFormat::Q8_0,
        WeightFormat::Q2_K,
        WeightFormat::Q3_K,
        WeightFormat::Q4_K,
        WeightFormat::Q5_K,
        WeightFormat::Q6_K,
        WeightFormat::IQ1_S,
        WeightFormat::IQ1_M,
        WeightFormat::IQ2_XXS,
        WeightFormat::IQ2_XS,
        WeightFormat::IQ3_XXS,
        WeightFormat::IQ4_XS,
        WeightFormat::MXFP4,
        WeightFormat::FP8_E4M3_B128_E8M0,
        WeightFormat::FP8_E4M3_B128_F32,
    ];

    /// Elements per block (1 for the plain float formats).
    pub const fn block_elems(self) -> usize {
        use WeightFormat::*;
        match self {
            F32 | F16 | BF16 => 1,
            Q8_0 | MXFP4 => 32,
            FP8_E4M3_B128_E8M0 | FP8_E4M3_B128_F32 => 128,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ4_XS => 256,
        }
    }

    /// Bytes per block (ggml's `sizeof(block_*)` for the GGUF formats).
    pub const fn block_bytes(self) -> usize {
        use WeightFormat::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            Q8_0 => 34,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            IQ1_S => 50,
            IQ1_M => 56,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ3_XXS => 98,
            IQ4_XS => 136,
            MXFP4 => 17,
            FP8_E4M3_B128_E8M0 => 129,
            FP8_E4M3_B128_F32 => 132,
        }
    }

    /// Whether values come in multi-element blocks (everything but F32/F16/BF16).
    pub const fn is_block(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes one row of `cols` elements occupies. `cols` must be a multiple of
    /// [`block_elems`](Self::block_elems) ([`check_cols`](Self::check_cols) says so by name).
    pub const fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }

    /// An error text when a row of `cols` elements is not a whole number of blocks.
    pub fn check_cols(self, cols: usize) -> std::result::Result<(), String> {
        if cols % self.block_elems() != 0 {
            return Err(format!(
                "{cols} columns are not a whole number of {self} blocks ({} values each)",
                self.block_elems()
            ));
        }
        Ok(())
    }

    /// The ggml type id this format has in a GGUF file (`None` for the re-laid FP8 formats,
    /// which exist only in memory).
    pub const fn ggml_type(self) -> Option<u32> {
        use WeightFormat::*;
        Some(match self {
            F32 => 0,
            F16 => 1,
            Q8_0 => 8,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_XS => 23,
            IQ1_M => 29,
            BF16 => 30,
            MXFP4 => 39,
            FP8_E4M3_B128_E8M0 | FP8_E4M3_B128_F32 => return None,
        })
    }

    /// The format of a ggml type id, if it is one this crate implements. Forks reuse ids (one
    /// fork's F8_E4M3_B128 is 42, another's Q2_0 is 42): anything outside this table is refused.
    pub fn from_ggml_type(id: u32) -> Option<WeightFormat> {
        WeightFormat::ALL.into_iter().find(|f| f.ggml_type() == Some(id))
    }

    pub const fn name(self) -> &'static str {
        use WeightFormat::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            Q8_0 => "Q8_0",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            IQ1_S => "IQ1_S",
            IQ1_M => "IQ1_M",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ4_XS => "IQ4_XS",
            MXFP4 => "MXFP4",
            FP8_E4M3_B128_E8M0 => "FP8_E4M3_B128_E8M0",
            FP8_E4M3_B128_F32 => "FP8_E4M3_B128_F32",
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Decode one row (`out.len()` elements, `bytes.len() == format.row_bytes(out.len())`) into f32.
pub fn decode_row(format: WeightFormat, bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), format.row_bytes(out.len()));
    use WeightFormat::*;
    // The block decoder: `block_bytes()` bytes → `block_elems()` values.
    let decode_block: fn(&[u8], &mut [f32]) = match format {
        F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
            return;
        }
        F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
            return;
        }
        BF16 => {
            // eight values at a time through a fixed-size array, which the compiler vectorises (a
            // value at a time, its byte-wise loads and inserts took 3.3x as long: the CPU lane
            // decodes every bf16 weight row each step); half's conversion, bit for bit: the upper
            // 16 bits of an f32, a NaN made quiet
            let bf16_bits = |h: u16| (h as u32 | if h & 0x7fff > 0x7f80 { 0x40 } else { 0 }) << 16;
            let whole = out.len() / 8 * 8;
            for (o8, c16) in out[..whole].chunks_exact_mut(8).zip(bytes.chunks_exact(16)) {
                let mut h = [0u16; 8];
                for (hi, c) in h.iter_mut().zip(c16.chunks_exact(2)) {
                    *hi = u16::from_le_bytes([c[0], c[1]]);
                }
                for (o, &hi) in o8.iter_mut().zip(&h) {
                    *o = f32::from_bits(bf16_bits(hi));
                }
            }
            for (o, c) in out[whole..].iter_mut().zip(bytes[2 * whole..].chunks_exact(2)) {
                *o = f32::from_bits(bf16_bits(u16::from_le_bytes([c[0], c[1]])));
            }
            return;
        }
        Q8_0 => fp::q8_0,
        MXFP4 => fp::mxfp4,
        FP8_E4M3_B128_E8M0 => fp::fp8_e4m3_b128_e8m0,
        FP8_E4M3_B128_F32 => fp::fp8_e4m3_b128_f32,
        Q2_K => kquants::q2_k,
        Q3_K => kquants::q3_k,
        Q4_K => kquants::q4_k,
        Q5_K => kquants::q5_k,
        Q6_K => kquants::q6_k,
        IQ1_S => iquants::iq1_s,
        IQ1_M => iquants::iq1_m,
        IQ2_XXS => iquants::iq2_xxs,
        IQ2_XS => iquants::iq2_xs,
        IQ3_XXS => iquants::iq3_xxs,
        IQ4_XS => iquants::iq4_xs,
    };
    let (n, nb) = (format.block_elems(), format.block_bytes());
    for (o, b) in out.chunks_exact_mut(n).zip(bytes.chunks_exact(nb)) {
        decode_block(b, o);
    }
}

/// The little-endian f16 at byte `at` of a block, as f32 (exact, like ggml's
/// `GGML_FP16_TO_FP32`; a NaN keeps its payload, quieted).
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16_at(b, at)).to_f32()
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// ggml's `ggml_e8m0_to_fp32_half`: half of the E8M0 scale, `2^(e−128)`, built from bits as
/// ggml does — e = 0 and 1 give the subnormals 2^−128 and 2^−127, and e = 255 gives 2^127
/// (ggml does not treat 255 as NaN here). Used by MXFP4, whose table holds doubled values.
fn e8m0_to_f32_half(e: u8) -> f32 {
    if e < 2 { f32::from_bits(0x0020_0000 << e) } else { f32::from_bits(((e - 1) as u32) << 23) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_ids_round_trip_and_unknown_ids_are_refused() {
        for f in WeightFormat::ALL {
            if let Some(id) = f.ggml_type() {
                assert_eq!(WeightFormat::from_ggml_type(id), Some(f), "{f}");
            }
        }
        // Q4_0 (2), Q8_K (15), IQ2_S (22), NVFP4 (40), the forks' 42: not implemented here.
        for id in [2, 15, 22, 40, 42, 1000] {
            assert_eq!(WeightFormat::from_ggml_type(id), None, "id {id}");
        }
    }

    /// bf16 rows decode to half's conversion bit for bit: every one of the 65 536 patterns (NaNs
    /// made quiet), in rows whose lengths leave 0 to 7 values past the groups of eight.
    #[test]
    fn bf16_rows_decode_as_half_does() {
        let all: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        for len in [65_536, 65_529, 7, 1] {
            let mut out = vec![0f32; len];
            decode_row(WeightFormat::BF16, &all[..2 * len], &mut out);
            for (h, v) in out.iter().enumerate() {
                let want = half::bf16::from_bits(h as u16).to_f32();
                assert_eq!(v.to_bits(), want.to_bits(), "bf16 {h:#06x} in a row of {len}");
            }
        }
    }

    #[test]
    fn rows_are_whole_blocks() {
        assert_eq!(WeightFormat::Q2_K.row_bytes(512), 168);
        assert_eq!(WeightFormat::MXFP4.row_bytes(64), 34);
        assert!(WeightFormat::Q4_K.check_cols(128).unwrap_err().contains("256"));
        assert!(WeightFormat::BF16.check_cols(3).is_ok());
    }
}
