//! Block weight formats on the wgpu lane: the WGSL source of each (kernel, format, precision)
//! pipeline.
//!
//! A block-format kernel is built per format from one template: accessors of the lookup tables
//! that format needs (read from one device buffer built from the Rust arrays in
//! [`crate::formats::tables`], one source of truth, at word offsets emitted as `const`s; WGSL has
//! no u64, so a u64 grid entry becomes two u32, low word first), then
//! `shaders/dequant/common.wgsl` (byte access, f16/E8M0/e4m3 by bit construction), the format's
//! `shaders/dequant/<format>.wgsl` (its `decode_run`: 32 consecutive values of a row, each block
//! scale decoded once per run), the operands file of the precision (`shaders/operands_*.wgsl`),
//! then the kernel body (`shaders/dequant/linear.wgsl`'s tile loads and a tile body, `shaders/tile_fma.wgsl`
//! or `shaders/tile_coop.wgsl`; `shaders/dequant/lm.wgsl`; or the small-row kernels:
//! `dequant/rows.wgsl`, a reduction, `shaders/rows.wgsl`). So each
//! pipeline is specialised to one format, with no per-element branch on a runtime format code,
//! and the weights stay in their file bytes on the device.

use std::fmt::Write;

use super::rows::RowsBuild;
use super::shader::Tiles;
use crate::backend::Precision;
use crate::formats::{WeightFormat, tables};

/// The kernel bodies that read block-format weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockKernel {
    /// `linear` (and so the default `unfold_linear_gelu`): the tiled matmul, on its tiles' math.
    Linear(Tiles),
    /// `embed_rows` (lm.wgsl's weight lookup).
    Lm,
    /// The small-row kernels (rows.wgsl) in one build, after `dequant/rows.wgsl`.
    Rows(RowsBuild),
    /// One token's experts and widest linears on int8 activations (`dequant/q8x.wgsl`, fast
    /// precision), after the format's `dequant/q8x/<format>.wgsl`: the [`q8x_format`]s only.
    Q8x,
    /// A weight chunk rounded to f16 for the direct tiles (`dequant/half_weight.wgsl`, fast
    /// precision).
    HalfWeight,
}

impl BlockKernel {
    /// Every kernel body, one per shader module (each small-row build its own).
    pub fn all() -> impl Iterator<Item = BlockKernel> {
        Tiles::ALL
            .map(BlockKernel::Linear)
            .into_iter()
            .chain([BlockKernel::Lm])
            .chain(RowsBuild::all().map(BlockKernel::Rows))
            .chain([BlockKernel::Q8x, BlockKernel::HalfWeight])
    }

    /// Whether the lane builds this kernel for `format` in `precision`: the cooperative tiles
    /// take f16 operands, so only fast precision's; the small rows take f32 operands in both
    /// (`rows::rows_shader`), so only exact precision's; the int8 kernels are fast precision's,
    /// in the formats with a `q8x_dot32`; the f16 copies are fast precision's.
    pub fn builds(self, format: WeightFormat, precision: Precision) -> bool {
        match self {
            BlockKernel::Linear(Tiles::Coop) => precision == Precision::Fast,
            BlockKernel::Rows(_) => precision == Precision::Exact,
            BlockKernel::Q8x => precision == Precision::Fast && q8x_format(format),
            BlockKernel::HalfWeight => precision == Precision::Fast,
            _ => true,
        }
    }

    /// The files that follow the operands file: (name, WGSL).
    fn body(self) -> Vec<(&'static str, &'static str)> {
        match self {
            BlockKernel::Linear(tiles) => [
                super::shader::TILE_ROWS,
                ("dequant/linear.wgsl", include_str!("../../../shaders/dequant/linear.wgsl")),
            ]
            .into_iter()
            .chain(tiles.body())
            .collect(),
            BlockKernel::Lm => vec![("dequant/lm.wgsl", include_str!("../../../shaders/dequant/lm.wgsl"))],
            BlockKernel::Rows(build) => [("dequant/rows.wgsl", include_str!("../../../shaders/dequant/rows.wgsl"))]
                .into_iter()
                .chain(build.parts())
                .chain([super::rows::BODY])
                .collect(),
            BlockKernel::Q8x => vec![("dequant/q8x.wgsl", include_str!("../../../shaders/dequant/q8x.wgsl"))],
            BlockKernel::HalfWeight => {
                vec![("dequant/half_weight.wgsl", include_str!("../../../shaders/dequant/half_weight.wgsl"))]
            }
        }
    }

    /// The body's files, joined as a label.
    pub fn file(self) -> String {
        self.body().iter().map(|(name, _)| *name).collect::<Vec<_>>().join(" + ")
    }
}

/// A file of `shaders/dequant/` (under `dir`, if given): its name there and its WGSL.
macro_rules! dequant_file {
    ($name:literal) => {
        ($name, include_str!(concat!("../../../shaders/dequant/", $name)))
    };
    ($dir:literal, $name:literal) => {
        ($name, include_str!(concat!("../../../shaders/dequant/", $dir, "/", $name)))
    };
}

/// The decoder file of a block format (`None` for F32/F16/BF16, which the float kernels read).
fn decoder(format: WeightFormat) -> Option<(&'static str, &'static str)> {
    use WeightFormat::*;
    Some(match format {
        F32 | F16 | BF16 => return None,
        Q8_0 => dequant_file!("q8_0.wgsl"),
        Q2_K => dequant_file!("q2_k.wgsl"),
        Q3_K => dequant_file!("q3_k.wgsl"),
        Q4_K => dequant_file!("q4_k.wgsl"),
        Q5_K => dequant_file!("q5_k.wgsl"),
        Q6_K => dequant_file!("q6_k.wgsl"),
        IQ1_S => dequant_file!("iq1_s.wgsl"),
        IQ1_M => dequant_file!("iq1_m.wgsl"),
        IQ2_XXS => dequant_file!("iq2_xxs.wgsl"),
        IQ2_XS => dequant_file!("iq2_xs.wgsl"),
        IQ3_XXS => dequant_file!("iq3_xxs.wgsl"),
        IQ4_XS => dequant_file!("iq4_xs.wgsl"),
        MXFP4 => dequant_file!("mxfp4.wgsl"),
        FP8_E4M3_B128_E8M0 | FP8_E4M3_B128_F32 => dequant_file!("fp8.wgsl"),
    })
}

/// Whether one token's experts and widest linears take int8 activations in `format` on this lane
/// (fast precision: `BlockKernel::Q8x`): the formats of the published Q2-class mix, whose codes multiply
/// int8 values as integers (the CUDA lane's `q8x_format` also takes MXFP4, by byte permutes WGSL
/// does not have).
pub fn q8x_format(format: WeightFormat) -> bool {
    q8x_dot(format).is_some()
}

/// The `q8x_dot32` of a [`q8x_format`] (`shaders/dequant/q8x/<format>.wgsl`).
fn q8x_dot(format: WeightFormat) -> Option<(&'static str, &'static str)> {
    use WeightFormat::*;
    Some(match format {
        Q8_0 => dequant_file!("q8x", "q8_0.wgsl"),
        Q2_K => dequant_file!("q8x", "q2_k.wgsl"),
        IQ2_XXS => dequant_file!("q8x", "iq2_xxs.wgsl"),
        _ => return None,
    })
}

/// The binding of the lookup-table buffer in every block kernel whose format reads a table
/// (above the kernels' own bindings: linear.wgsl uses 0–4, lm.wgsl 0–8).
pub const TABLES_BINDING: u32 = 15;

/// A lookup table of [`crate::formats::tables`] as the decoders read it from the device table
/// buffer. The tables live in one read-only storage buffer uploaded once per device, not in the
/// shader text: as `var<private>` arrays every invocation initialised its own copy, and lavapipe
/// took 18 s, 11 s and 12 s to build the IQ1_S linear, moe_up and grouped_linear pipelines (both since replaced by linear's tiles) (as
/// `const` arrays naga spilled a copy at each access); from the buffer, under 0.1 s each (one
/// measurement each). ggml's `kmask_iq2xs` is not among them: entry j is `1 << j`, which the
/// decoders shift instead (a table read per value cost the IQ2/IQ3 decoders eight loads a span).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Table {
    KsignsIq2xs,
    Iq2xxsGrid,
    Iq2xsGrid,
    Iq3xxsGrid,
    Iq1sGrid,
    KvaluesIq4nl,
    KvaluesMxfp4,
}

impl Table {
    /// Buffer order: each table starts where the one before it ends.
    const ALL: [Table; 7] = [
        Table::KsignsIq2xs,
        Table::Iq2xxsGrid,
        Table::Iq2xsGrid,
        Table::Iq3xxsGrid,
        Table::Iq1sGrid,
        Table::KvaluesIq4nl,
        Table::KvaluesMxfp4,
    ];

    /// The WGSL accessor `fn <name>(i: u32)` the decoders call; its offset is `<NAME>_OFF`.
    fn name(self) -> &'static str {
        match self {
            Table::KsignsIq2xs => "ksigns_iq2xs",
            Table::Iq2xxsGrid => "iq2xxs_grid",
            Table::Iq2xsGrid => "iq2xs_grid",
            Table::Iq3xxsGrid => "iq3xxs_grid",
            Table::Iq1sGrid => "iq1s_grid",
            Table::KvaluesIq4nl => "kvalues_iq4nl",
            Table::KvaluesMxfp4 => "kvalues_mxfp4",
        }
    }

    /// The value tables hold int8, stored as the u32 bits of the i32 and read back with bitcast.
    fn signed(self) -> bool {
        matches!(self, Table::KvaluesIq4nl | Table::KvaluesMxfp4)
    }

    /// The table's words: u8 and i8 entries widened to a word each, a u64 grid entry as two
    /// words, low first (WGSL has no u64).
    fn words(self) -> Vec<u32> {
        let u64_pairs = |v: &[u64]| v.iter().flat_map(|e| [*e as u32, (*e >> 32) as u32]).collect();
        let signed = |v: &[i8]| v.iter().map(|e| i32::from(*e) as u32).collect();
        match self {
            Table::KsignsIq2xs => tables::KSIGNS_IQ2XS.map(u32::from).to_vec(),
            Table::Iq2xxsGrid => u64_pairs(&tables::IQ2XXS_GRID),
            Table::Iq2xsGrid => u64_pairs(&tables::IQ2XS_GRID),
            Table::Iq3xxsGrid => tables::IQ3XXS_GRID.to_vec(),
            Table::Iq1sGrid => u64_pairs(&tables::IQ1S_GRID),
            Table::KvaluesIq4nl => signed(&tables::KVALUES_IQ4NL),
            Table::KvaluesMxfp4 => signed(&tables::KVALUES_MXFP4),
        }
    }

    /// Word offset of the table in [`table_words`].
    fn offset(self) -> usize {
        Table::ALL.iter().take_while(|t| **t != self).map(|t| t.words().len()).sum()
    }
}

/// The contents of the device table buffer: every table, end to end in `Table::ALL` order.
pub fn table_words() -> Vec<u32> {
    Table::ALL.iter().flat_map(|t| t.words()).collect()
}

/// The tables `format`'s decoder reads.
fn tables_of(format: WeightFormat) -> &'static [Table] {
    use WeightFormat::*;
    match format {
        IQ2_XXS => &[Table::KsignsIq2xs, Table::Iq2xxsGrid],
        IQ2_XS => &[Table::KsignsIq2xs, Table::Iq2xsGrid],
        IQ3_XXS => &[Table::KsignsIq2xs, Table::Iq3xxsGrid],
        IQ1_S | IQ1_M => &[Table::Iq1sGrid],
        IQ4_XS => &[Table::KvaluesIq4nl],
        MXFP4 => &[Table::KvaluesMxfp4],
        _ => &[],
    }
}

/// Whether `format`'s kernels bind the table buffer at [`TABLES_BINDING`] (formats without
/// tables declare no such binding, so their bind groups must not carry it).
pub fn uses_tables(format: WeightFormat) -> bool {
    !tables_of(format).is_empty()
}

/// The constants and table accessors `format`'s decoder reads: the table buffer's binding and,
/// per table, its word offset as a `const` and `fn <name>(i) -> u32` (`i32` for the value tables).
fn tables_for(format: WeightFormat) -> String {
    use WeightFormat::*;
    let mut s = String::new();
    let used = tables_of(format);
    if !used.is_empty() {
        let _ = writeln!(s, "@group(0) @binding({TABLES_BINDING}) var<storage, read> lut: array<u32>;");
    }
    for t in used {
        let (name, off) = (t.name(), t.offset());
        let upper = name.to_uppercase();
        let _ = writeln!(s, "const {upper}_OFF: u32 = {off}u;");
        if t.signed() {
            let _ = writeln!(s, "fn {name}(i: u32) -> i32 {{ return bitcast<i32>(lut[{upper}_OFF + i]); }}");
        } else {
            let _ = writeln!(s, "fn {name}(i: u32) -> u32 {{ return lut[{upper}_OFF + i]; }}");
        }
    }
    match format {
        // Debug prints the shortest text that parses back to the same f32 (0.125)
        IQ1_S | IQ1_M => {
            let _ = writeln!(s, "const IQ1_DELTA: f32 = {:?};", tables::IQ1_DELTA);
        }
        FP8_E4M3_B128_E8M0 => s.push_str("const FP8_SCALE_BYTES: u32 = 1u;\n"),
        FP8_E4M3_B128_F32 => s.push_str("const FP8_SCALE_BYTES: u32 = 4u;\n"),
        _ => {}
    }
    s
}

/// The WGSL of `kernel` specialised to the block format `format` (`None` for a float format) and
/// to `precision` (its operands file, see `shaders/operands_exact.wgsl`), with a label naming its
/// parts; `None` also for a kernel the lane does not build for the format in `precision`
/// ([`BlockKernel::builds`]).
pub fn block_shader_source(
    format: WeightFormat,
    kernel: BlockKernel,
    precision: Precision,
) -> Option<(String, String)> {
    let (file, decode) = decoder(format)?;
    if !kernel.builds(format, precision) {
        return None;
    }
    let (operands_file, operands) = super::shader::operands_part(precision);
    // the int8 experts' format part: its q8x_dot32
    let dot = if kernel == BlockKernel::Q8x { q8x_dot(format) } else { None };
    let dot_label = dot.map_or(String::new(), |(name, _)| format!(" + dequant/q8x/{name}"));
    let label = format!(
        "{format} tables + dequant/common.wgsl + dequant/{file} + {operands_file}{dot_label} + {}",
        kernel.file()
    );
    let mut src = format!("// {label}\n");
    src += super::shader::directives(precision == Precision::Fast, kernel == BlockKernel::Linear(Tiles::Coop));
    src += &tables_for(format);
    src += include_str!("../../../shaders/dequant/common.wgsl");
    src += decode;
    src += operands;
    src += dot.map_or("", |(_, text)| text);
    kernel.body().iter().for_each(|(_, text)| src += text);
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
        let words = Table::Iq1sGrid.words();
        assert_eq!(words.len(), 2 * tables::IQ1S_GRID.len());
        let last = tables::IQ1S_GRID[2047];
        assert_eq!([words[4094], words[4095]], [last as u32, (last >> 32) as u32]);
    }

    /// Each table sits in the buffer at the offset its accessor reads, with its exact words
    /// (the int8 value tables as the bits of the i32).
    #[test]
    fn table_buffer_holds_every_table_at_its_offset() {
        let buf = table_words();
        let mut end = 0;
        for t in Table::ALL {
            let words = t.words();
            assert_eq!(&buf[t.offset()..t.offset() + words.len()], &words[..], "{t:?}");
            end = end.max(t.offset() + words.len());
        }
        assert_eq!(end, buf.len());
        let mx = Table::KvaluesMxfp4.offset();
        assert_eq!(buf[mx + 15] as i32, i32::from(tables::KVALUES_MXFP4[15]));
        assert_eq!(buf[Table::KvaluesIq4nl.offset()] as i32, -127);
        let src = tables_for(WeightFormat::IQ3_XXS);
        assert!(src.contains(&format!("const IQ3XXS_GRID_OFF: u32 = {}u;", Table::Iq3xxsGrid.offset())), "{src}");
    }

    #[test]
    fn formats_without_tables_declare_no_table_binding() {
        for f in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
            let (_, src) = block_shader_source(f, BlockKernel::Linear(Tiles::Fma), Precision::Exact).unwrap();
            assert_eq!(src.contains(&format!("@binding({TABLES_BINDING})")), uses_tables(f), "{f}");
        }
    }

    #[test]
    fn the_sign_mask_the_decoders_shift_is_ggmls() {
        assert!(tables::KMASK_IQ2XS.iter().enumerate().all(|(j, &m)| u32::from(m) == 1 << j));
    }

    /// dequant/q8x/iq2_xxs.wgsl computes the sign patterns (`q8x_signs`) instead of reading
    /// ggml's table: the 7 sign bits and their parity as bit 7.
    #[test]
    fn the_sign_patterns_the_int8_decoder_computes_are_ggmls() {
        let computed = |i: u32| i | ((i.count_ones() & 1) << 7);
        assert!(tables::KSIGNS_IQ2XS.iter().enumerate().all(|(i, &s)| u32::from(s) == computed(i as u32)));
        let src = include_str!("../../../shaders/dequant/q8x/iq2_xxs.wgsl");
        assert!(src.contains("return i | ((countOneBits(i) & 1u) << 7u);"));
    }

    #[test]
    fn rows_pad_to_whole_words() {
        assert_eq!(stride_words(WeightFormat::MXFP4, 32), 5); // 17 bytes
        assert_eq!(stride_words(WeightFormat::Q8_0, 64), 17); // 68 bytes
        assert_eq!(stride_words(WeightFormat::F16, 3), 2); // 6 bytes
    }
}
