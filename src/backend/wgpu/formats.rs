//! Block weight formats on the wgpu lane: the WGSL source of each (kernel, format) pipeline.
//!
//! A block-format kernel is built per format from one template: the lookup tables that format
//! needs, emitted as WGSL arrays from the Rust arrays in [`crate::formats::tables`] (one source
//! of truth; WGSL has no u64, so a u64 grid entry becomes two u32, low word first), then
//! `shaders/dequant/common.wgsl` (byte access, f16/E8M0/e4m3 by bit construction), the format's
//! `shaders/dequant/<format>.wgsl` (its `decode_run`: 32 consecutive values of a row, each block
//! scale decoded once per run), then the kernel body (`shaders/dequant/linear.wgsl` or
//! `shaders/dequant/lm.wgsl`). So each pipeline is specialised to one format, with no per-element
//! branch on a runtime format code, and the weights stay in their file bytes on the device.

use std::fmt::Write;

use crate::formats::{WeightFormat, tables};

/// The kernel bodies that read block-format weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockKernel {
    /// `linear` (and so the default `unfold_linear_gelu`): the tiled matmul.
    Linear,
    /// `embed_rows`, `grouped_linear`, `moe_up`, `moe_down` (lm.wgsl's weight ops).
    Lm,
}

impl BlockKernel {
    pub const ALL: [BlockKernel; 2] = [BlockKernel::Linear, BlockKernel::Lm];

    fn body(self) -> &'static str {
        match self {
            BlockKernel::Linear => include_str!("../../../shaders/dequant/linear.wgsl"),
            BlockKernel::Lm => include_str!("../../../shaders/dequant/lm.wgsl"),
        }
    }

    pub fn file(self) -> &'static str {
        match self {
            BlockKernel::Linear => "dequant/linear.wgsl",
            BlockKernel::Lm => "dequant/lm.wgsl",
        }
    }
}

/// The decoder file of a block format (`None` for F32/F16/BF16, which the float kernels read).
fn decoder(format: WeightFormat) -> Option<(&'static str, &'static str)> {
    use WeightFormat::*;
    macro_rules! file {
        ($name:literal) => {
            ($name, include_str!(concat!("../../../shaders/dequant/", $name)))
        };
    }
    Some(match format {
        F32 | F16 | BF16 => return None,
        Q8_0 => file!("q8_0.wgsl"),
        Q2_K => file!("q2_k.wgsl"),
        Q3_K => file!("q3_k.wgsl"),
        Q4_K => file!("q4_k.wgsl"),
        Q5_K => file!("q5_k.wgsl"),
        Q6_K => file!("q6_k.wgsl"),
        IQ1_S => file!("iq1_s.wgsl"),
        IQ1_M => file!("iq1_m.wgsl"),
        IQ2_XXS => file!("iq2_xxs.wgsl"),
        IQ2_XS => file!("iq2_xs.wgsl"),
        IQ3_XXS => file!("iq3_xxs.wgsl"),
        IQ4_XS => file!("iq4_xs.wgsl"),
        MXFP4 => file!("mxfp4.wgsl"),
        FP8_E4M3_B128_E8M0 | FP8_E4M3_B128_F32 => file!("fp8.wgsl"),
    })
}

// Tables are `var<private>` with an initializer, never written. A module-scope `const` array
// indexed at run time is spilled by naga into a function-local copy at each access (inside the
// decode loops); on lavapipe the first IQ3_XXS linear (pipeline build included) took 9.6 s with
// `const` and 4.0 s with `var<private>` (one measurement each). Building a pipeline over the
// 4096-word IQ1S grid still takes lavapipe ~30 s (issue 13: pack the grids).
fn emit_u32(out: &mut String, name: &str, values: &[u32]) {
    let _ = write!(out, "var<private> {name}: array<u32, {}> = array<u32, {}>(", values.len(), values.len());
    for (i, v) in values.iter().enumerate() {
        if i % 8 == 0 {
            out.push_str("\n   ");
        }
        let _ = write!(out, " 0x{v:08x}u,");
    }
    out.push_str("\n);\n");
}

fn emit_u64_pairs(out: &mut String, name: &str, values: &[u64]) {
    let words: Vec<u32> = values.iter().flat_map(|v| [*v as u32, (*v >> 32) as u32]).collect();
    emit_u32(out, name, &words);
}

fn emit_i32(out: &mut String, name: &str, values: &[i8]) {
    let _ = write!(out, "var<private> {name}: array<i32, {}> = array<i32, {}>(", values.len(), values.len());
    for v in values {
        let _ = write!(out, "{v}, ");
    }
    out.push_str(");\n");
}

/// The constants and tables `format`'s decoder reads.
fn tables_for(format: WeightFormat) -> String {
    use WeightFormat::*;
    let mut s = String::new();
    let signs = |s: &mut String| {
        emit_u32(s, "KSIGNS_IQ2XS", &tables::KSIGNS_IQ2XS.map(u32::from));
        emit_u32(s, "KMASK_IQ2XS", &tables::KMASK_IQ2XS.map(u32::from));
    };
    match format {
        IQ2_XXS => {
            signs(&mut s);
            emit_u64_pairs(&mut s, "IQ2XXS_GRID", &tables::IQ2XXS_GRID);
        }
        IQ2_XS => {
            signs(&mut s);
            emit_u64_pairs(&mut s, "IQ2XS_GRID", &tables::IQ2XS_GRID);
        }
        IQ3_XXS => {
            signs(&mut s);
            emit_u32(&mut s, "IQ3XXS_GRID", &tables::IQ3XXS_GRID);
        }
        IQ1_S | IQ1_M => {
            // Debug prints the shortest text that parses back to the same f32 (0.125)
            let _ = writeln!(s, "const IQ1_DELTA: f32 = {:?};", tables::IQ1_DELTA);
            emit_u64_pairs(&mut s, "IQ1S_GRID", &tables::IQ1S_GRID);
        }
        IQ4_XS => emit_i32(&mut s, "KVALUES_IQ4NL", &tables::KVALUES_IQ4NL),
        MXFP4 => emit_i32(&mut s, "KVALUES_MXFP4", &tables::KVALUES_MXFP4),
        FP8_E4M3_B128_E8M0 => s.push_str("const FP8_SCALE_BYTES: u32 = 1u;\n"),
        FP8_E4M3_B128_F32 => s.push_str("const FP8_SCALE_BYTES: u32 = 4u;\n"),
        _ => {}
    }
    s
}

/// The WGSL of `kernel` specialised to the block format `format` (`None` for a float format),
/// with a label naming its parts.
pub fn block_shader_source(format: WeightFormat, kernel: BlockKernel) -> Option<(String, String)> {
    let (file, decode) = decoder(format)?;
    let label = format!("{format} tables + dequant/common.wgsl + dequant/{file} + {}", kernel.file());
    let mut src = format!("// {label}\n");
    src += &tables_for(format);
    src += include_str!("../../../shaders/dequant/common.wgsl");
    src += decode;
    src += kernel.body();
    Some((label, src))
}

/// Words per device row of `format` with `cols` values: rows are padded to a 4-byte stride so
/// each starts on a word (at most 3 bytes a row, counted in the memory report).
pub fn stride_words(format: WeightFormat, cols: usize) -> usize {
    format.row_bytes(cols).div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_format_has_a_decoder_and_floats_have_none() {
        for f in WeightFormat::ALL {
            assert_eq!(decoder(f).is_some(), f.is_block(), "{f}");
        }
    }

    #[test]
    fn u64_grids_split_low_word_first() {
        let mut s = String::new();
        emit_u64_pairs(&mut s, "G", &[0x0123_4567_89ab_cdef]);
        assert!(s.contains("0x89abcdefu, 0x01234567u"), "{s}");
    }

    #[test]
    fn rows_pad_to_whole_words() {
        assert_eq!(stride_words(WeightFormat::MXFP4, 32), 5); // 17 bytes
        assert_eq!(stride_words(WeightFormat::Q8_0, 64), 17); // 68 bytes
        assert_eq!(stride_words(WeightFormat::F16, 3), 2); // 6 bytes
    }
}
