//! The lane's shader modules: which WGSL files each build is assembled from (the weight
//! format's part, the operands file of the precision, the small rows' reduction, the body, the
//! tiles' math), the
//! pipeline-override constants of each specialisation, and the list of every build the lane can
//! make (`shader_builds`, which `tests/wgsl.rs` validates and translates to MSL and HLSL).

use std::borrow::Cow;

use super::Reduction;
use super::formats::{self, BlockKernel};
use super::linear::{half_weight_shader, linear_shader, lm_weight_shader};
use super::q8x::q8x_shader;
use super::rows::{self, RowsBuild, rows_shader};
use crate::backend::{Precision, WeightFormat};
use crate::error::{Error, Result};

/// What both tile-load parts (`linear_tile.wgsl`, `dequant/linear.wgsl`) build on: the tiles'
/// parameters, bindings, rows and store.
pub(super) const TILE_ROWS: (&str, &str) = ("tile_rows.wgsl", include_str!("../../../shaders/tile_rows.wgsl"));
/// The cooperative tiles' store, after either body (`tile_coop.wgsl`, `tile_coop_direct.wgsl`).
const COOP_STORE: (&str, &str) = ("tile_coop_store.wgsl", include_str!("../../../shaders/tile_coop_store.wgsl"));

/// How the tiled GEMM multiplies its tiles (the body after the tile loads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tiles {
    /// f32 FMAs, 4×4 outputs per invocation (`shaders/tile_fma.wgsl`): every device, both
    /// precisions.
    Fma,
    /// Cooperative matrices, 16×16×16 f16 → f32 (`shaders/tile_coop.wgsl`): fast precision, on an
    /// adapter with EXPERIMENTAL_COOPERATIVE_MATRIX, that configuration and 32-invocation
    /// subgroups (NVIDIA under Vulkan); see `WgpuBackend::coop_tiles`.
    Coop,
}

impl Tiles {
    pub const ALL: [Tiles; 2] = [Tiles::Fma, Tiles::Coop];

    /// Weight rows (columns of y) an output tile covers: the body's BN (`tests/wgsl.rs` holds
    /// each build to it). Both bodies cover 64 rows of x.
    pub fn columns(self) -> usize {
        match self {
            Tiles::Fma => 64,
            Tiles::Coop => 128,
        }
    }

    /// Workgroup memory of the cooperative tiles (K steps of 32, `shaders/tile_coop.wgsl`): the
    /// x tile 64 × (32 + 8) f16, the W tile 32 × (128 + 8) f16, 8 subgroups' output staging
    /// 16 × 20 f32. `tests/wgsl.rs` holds every build to it.
    pub const COOP_WORKGROUP_BYTES: u32 = 64 * 40 * 2 + 32 * 136 * 2 + 8 * 16 * 20 * 4;
    /// Workgroup memory of the FMA tiles at their largest (exact precision's f32 operands, K step
    /// of 32): WebGPU's least `maxComputeWorkgroupStorageSize`, which every adapter offers.
    pub const FMA_WORKGROUP_BYTES: u32 = 16384;

    /// The body's files and WGSL (the cooperative one's store in a file of its own, which the
    /// direct tiles share).
    pub(super) fn body(self) -> Vec<(&'static str, &'static str)> {
        match self {
            Tiles::Fma => vec![("tile_fma.wgsl", include_str!("../../../shaders/tile_fma.wgsl"))],
            Tiles::Coop => vec![("tile_coop.wgsl", include_str!("../../../shaders/tile_coop.wgsl")), COOP_STORE],
        }
    }
}

/// A shader module. The GEMM kernels carry the precision of their operands (operands file), the
/// tiled ones also their tiles' math.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Shader {
    Linear(Precision, Tiles),
    LinearF16(Precision, Tiles),
    Elementwise,
    Copy,
    Norm,
    Rope,
    Attention,
    /// The ViT's attention on cooperative matrices (fast precision, where the tiles use them),
    /// from f16 copies of q, k and v, its matrix loads straight from them
    /// (`attention_coop_direct.wgsl`).
    AttentionCoopDirect,
    /// x rounded to f16 once for fast precision's tiled GEMMs (`half_rows.wgsl`).
    HalfRows,
    /// The cooperative tiles with their matrix loads straight from f16 copies of x and W
    /// (`tile_coop_direct.wgsl`; `Options::direct_tiles`).
    LinearCoopDirect,
    /// A float weight's rows rounded to f16 once for [`Shader::LinearCoopDirect`]
    /// (`half_weight.wgsl`), read by `linear_f16.wgsl` (true: f16 with SHADER_F16) or
    /// `linear_packed.wgsl` (false: f32, bf16).
    HalfWeight(bool),
    Debug,
    /// lm.wgsl (no weight products: one build).
    Lm,
    /// lm.wgsl with its attention parts of `SP_KEYS` = `lm::SINK_ATTENTION_PART_KEYS` keys, for
    /// the split decode attention (`sink_attention_part`; `sink_attention_heads` keeps the
    /// default 64).
    LmAttentionParts,
    /// A kernel over block-format weights, built for one format (formats.rs).
    Block(BlockKernel, WeightFormat, Precision),
    /// The small-row kernels (rows.wgsl) over `linear_packed.wgsl` (f32, bf16, f16 fallback), on
    /// f32 operands in both precisions ([`rows_shader`]).
    Rows(RowsBuild),
    /// The small-row kernels over `linear_f16.wgsl` (f16 with SHADER_F16).
    RowsF16(RowsBuild),
}

/// The operands file of a GEMM build: its label and WGSL (see `shaders/operands_exact.wgsl`).
pub(super) fn operands_part(precision: Precision) -> (&'static str, &'static str) {
    match precision {
        Precision::Exact => ("operands_exact.wgsl", include_str!("../../../shaders/operands_exact.wgsl")),
        Precision::Fast => ("operands_fast.wgsl", include_str!("../../../shaders/operands_fast.wgsl")),
    }
}

/// The directives a build starts with: `enable f16;` when any of its parts uses f16, `enable
/// wgpu_cooperative_matrix;` for the cooperative tiles (WGSL wants every directive before the
/// first declaration, so the parts themselves carry none).
pub(super) fn directives(uses_f16: bool, coop: bool) -> &'static str {
    match (uses_f16, coop) {
        (_, true) => "enable f16;\nenable wgpu_cooperative_matrix;\n",
        (true, false) => "enable f16;\n",
        (false, false) => "",
    }
}

impl Shader {
    /// A label naming the shader's files, and its WGSL.
    pub(super) fn source(self) -> Result<(String, Cow<'static, str>)> {
        let fixed = |label: &str, src: &'static str| Ok((label.to_owned(), Cow::Borrowed(src)));
        // A GEMM build: its directives, the weight-format part (if any), the operands file of
        // the precision, then the body; (file, WGSL) pairs.
        // The small-row kernels have their row bound, reduction and rows_pairs.wgsl between the
        // operands and the body; the tiles have tile_rows.wgsl before it and their math after it.
        let gemm = |format_uses_f16: bool, format: Option<(&str, &str)>, body: (&str, &str), precision: Precision| {
            let rows = |b: RowsBuild| b.parts().into_iter().chain([rows::PAIRS]).collect();
            let (middle, last) = match self {
                Shader::Rows(b) | Shader::RowsF16(b) => (rows(b), Vec::new()),
                Shader::Linear(_, tiles) | Shader::LinearF16(_, tiles) => (vec![TILE_ROWS], tiles.body()),
                _ => (Vec::new(), Vec::new()),
            };
            let parts: Vec<(&str, &str)> =
                format.into_iter().chain([operands_part(precision)]).chain(middle).chain([body]).chain(last).collect();
            let label = parts.iter().map(|(file, _)| *file).collect::<Vec<_>>().join(" + ");
            let mut src = directives(format_uses_f16 || precision == Precision::Fast, self.needs_coop()).to_owned();
            parts.iter().for_each(|(_, text)| src += text);
            Ok((label, Cow::Owned(src)))
        };
        const TILE: (&str, &str) = ("linear_tile.wgsl", include_str!("../../../shaders/linear_tile.wgsl"));
        const PACKED: (&str, &str) = ("linear_packed.wgsl", include_str!("../../../shaders/linear_packed.wgsl"));
        const F16: (&str, &str) = ("linear_f16.wgsl", include_str!("../../../shaders/linear_f16.wgsl"));
        match self {
            Shader::Linear(precision, _) => gemm(false, Some(PACKED), TILE, precision),
            Shader::LinearF16(precision, _) => gemm(true, Some(F16), TILE, precision),
            Shader::Elementwise => fixed("elementwise.wgsl", include_str!("../../../shaders/elementwise.wgsl")),
            Shader::Copy => fixed("copy.wgsl", include_str!("../../../shaders/copy.wgsl")),
            Shader::Norm => fixed("norm.wgsl", include_str!("../../../shaders/norm.wgsl")),
            Shader::Rope => fixed("rope.wgsl", include_str!("../../../shaders/rope.wgsl")),
            Shader::Attention => fixed("attention.wgsl", include_str!("../../../shaders/attention.wgsl")),
            Shader::AttentionCoopDirect => {
                let src =
                    directives(true, true).to_owned() + include_str!("../../../shaders/attention_coop_direct.wgsl");
                Ok(("attention_coop_direct.wgsl".to_owned(), Cow::Owned(src)))
            }
            Shader::HalfRows => {
                let (operands, rounding) = operands_part(Precision::Fast);
                let src =
                    directives(true, false).to_owned() + rounding + include_str!("../../../shaders/half_rows.wgsl");
                Ok((format!("{operands} + half_rows.wgsl"), Cow::Owned(src)))
            }
            Shader::LinearCoopDirect => {
                const BODY: (&str, &str) =
                    ("tile_coop_direct.wgsl", include_str!("../../../shaders/tile_coop_direct.wgsl"));
                let parts = [operands_part(Precision::Fast), TILE_ROWS, BODY, COOP_STORE];
                let label = parts.iter().map(|(file, _)| *file).collect::<Vec<_>>().join(" + ");
                let src = parts.iter().fold(directives(true, true).to_owned(), |src, (_, text)| src + text);
                Ok((label, Cow::Owned(src)))
            }
            Shader::HalfWeight(native_f16) => {
                const BODY: (&str, &str) = ("half_weight.wgsl", include_str!("../../../shaders/half_weight.wgsl"));
                let parts = [if native_f16 { F16 } else { PACKED }, operands_part(Precision::Fast), BODY];
                let label = parts.iter().map(|(file, _)| *file).collect::<Vec<_>>().join(" + ");
                let src = parts.iter().fold(directives(true, false).to_owned(), |src, (_, text)| src + text);
                Ok((label, Cow::Owned(src)))
            }
            Shader::Debug => fixed("debug.wgsl", include_str!("../../../shaders/debug.wgsl")),
            Shader::Lm | Shader::LmAttentionParts => fixed("lm.wgsl", include_str!("../../../shaders/lm.wgsl")),
            Shader::Rows(_) => gemm(false, Some(PACKED), rows::BODY, Precision::Exact),
            Shader::RowsF16(_) => gemm(true, Some(F16), rows::BODY, Precision::Exact),
            Shader::Block(kernel, format, precision) => match formats::block_shader_source(format, kernel, precision) {
                Some((label, src)) => Ok((label, Cow::Owned(src))),
                None => Err(Error::Device(format!("{}: {format} is not a block format", kernel.file()))),
            },
        }
    }
}

impl Shader {
    /// The pipeline-override constants of a pipeline of this shader created with `fmt`: `FMT`
    /// for `linear_packed.wgsl` (f32, bf16, f16 fallback; tiles and small rows), `SP_KEYS` for
    /// [`Shader::LmAttentionParts`]; the others read `fmt`, if at all, from their parameter block.
    pub(super) fn constants(self, fmt: u32) -> Vec<(&'static str, f64)> {
        match self {
            Shader::Linear(..) | Shader::Rows(_) | Shader::HalfWeight(false) => vec![("FMT", f64::from(fmt))],
            Shader::LmAttentionParts => vec![("SP_KEYS", super::lm::SINK_ATTENTION_PART_KEYS as f64)],
            _ => Vec::new(),
        }
    }

    /// The shaders no weight format chooses: one module each, created with `fmt` 0.
    const FIXED: [Shader; 7] = [
        Shader::Elementwise,
        Shader::Copy,
        Shader::Norm,
        Shader::Rope,
        Shader::Attention,
        Shader::Debug,
        Shader::LmAttentionParts,
    ];
    /// The shaders no weight format chooses that fast precision alone builds (with SHADER_F16).
    const FIXED_F16: [Shader; 3] = [Shader::AttentionCoopDirect, Shader::HalfRows, Shader::LinearCoopDirect];

    /// Exhaustive on purpose: a new shader fails to compile here until it is in [`Self::FIXED`]
    /// (or, built only with SHADER_F16, [`Self::FIXED_F16`]) or chosen by [`linear_shader`] /
    /// [`half_weight_shader`] / [`lm_weight_shader`] / [`rows_shader`] / [`q8x_shader`], so
    /// [`shader_builds`] lists it.
    #[allow(dead_code)]
    fn listed(self) {
        match self {
            Shader::Elementwise | Shader::Copy | Shader::Norm | Shader::Rope | Shader::Attention | Shader::Debug => {}
            Shader::LmAttentionParts => {}
            Shader::AttentionCoopDirect | Shader::HalfRows | Shader::LinearCoopDirect => {}
            Shader::HalfWeight(_) => {}
            Shader::Linear(..) | Shader::LinearF16(..) | Shader::Lm | Shader::Block(..) => {}
            Shader::Rows(..) | Shader::RowsF16(..) => {}
        }
    }

    /// Whether the build uses subgroup operations (needs wgpu's SUBGROUP): the small rows'
    /// subgroup reduction, the cooperative tiles' `subgroup_id`.
    fn needs_subgroup(self) -> bool {
        self.needs_coop()
            || matches!(
                self,
                Shader::Rows(RowsBuild { reduction: Reduction::Subgroup, .. })
                    | Shader::RowsF16(RowsBuild { reduction: Reduction::Subgroup, .. })
                    | Shader::Block(BlockKernel::Rows(RowsBuild { reduction: Reduction::Subgroup, .. }), ..)
            )
    }

    /// Whether the build uses cooperative matrices (needs EXPERIMENTAL_COOPERATIVE_MATRIX).
    fn needs_coop(self) -> bool {
        matches!(
            self,
            Shader::Linear(_, Tiles::Coop)
                | Shader::LinearF16(_, Tiles::Coop)
                | Shader::Block(BlockKernel::Linear(Tiles::Coop), ..)
                | Shader::AttentionCoopDirect
                | Shader::LinearCoopDirect
        )
    }

    /// Every (shader, `fmt`) the lane creates pipelines from, and whether it is built only with
    /// SHADER_F16 (`native_f16`): the weight kernels come from the same choices the ops make
    /// ([`linear_shader`], [`lm_weight_shader`], [`rows_shader`] in every build,
    /// [`q8x_shader`] and [`half_weight_shader`] in fast precision) for every
    /// weight format, in both precisions with SHADER_F16 (and each tiles' math) and in exact
    /// precision without it (fast needs it); the fixed shaders in both, fast precision's
    /// ([`Self::FIXED_F16`]) with SHADER_F16. Pairs that build the same module and constants are
    /// listed once.
    fn every_build() -> Vec<(Shader, u32, bool)> {
        let mut with = Vec::new();
        let mut without = Vec::new();
        for (native_f16, precisions, list) in
            [(true, &[Precision::Exact, Precision::Fast][..], &mut with), (false, &[Precision::Exact], &mut without)]
        {
            for &precision in precisions {
                for f in WeightFormat::ALL {
                    list.extend(Tiles::ALL.map(|t| {
                        let (shader, fmt, _) = linear_shader(f, native_f16, precision, t);
                        (shader, fmt)
                    }));
                    list.push(lm_weight_shader(f));
                    list.extend(RowsBuild::all().map(|b| rows_shader(f, native_f16, b)));
                    if precision == Precision::Fast {
                        list.extend(q8x_shader(f).map(|s| (s, 0)));
                        list.push(half_weight_shader(f));
                    }
                }
            }
            list.extend(Shader::FIXED.map(|s| (s, 0)));
            if native_f16 {
                list.extend(Shader::FIXED_F16.map(|s| (s, 0)));
            }
        }
        let mut builds: Vec<(Shader, u32, bool)> = Vec::new();
        for &(s, fmt) in with.iter().chain(&without) {
            if !builds.iter().any(|&(b, bf, _)| b == s && b.constants(bf) == s.constants(fmt)) {
                let f16_only = !without.iter().any(|&(b, bf)| b == s && b.constants(bf) == s.constants(fmt));
                builds.push((s, fmt, f16_only));
            }
        }
        builds
    }
}

#[cfg(test)]
impl Shader {
    /// The workgroup memory of this build's module, its workgroup variables summed as naga lays
    /// them out (the unit tests hold each direct kernel's to its lane-side constant).
    pub(super) fn workgroup_bytes(self) -> u32 {
        let (label, source) = self.source().unwrap();
        let module = naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| panic!("{label}: {e}"));
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).unwrap();
        module
            .global_variables
            .iter()
            .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
            .map(|(_, g)| layouter[g.ty].size)
            .sum()
    }
}

/// One shader module the lane builds, with the override constants of one pipeline
/// specialisation of it (see [`shader_builds`]).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct ShaderBuild {
    /// The files it is built from, and the constants (`... [FMT=2]`) when it has any.
    pub label: String,
    /// The WGSL exactly as the lane passes it to `create_shader_module`.
    pub source: Cow<'static, str>,
    /// The pipeline-override constants exactly as the lane passes them to the pipeline.
    pub constants: Vec<(&'static str, f64)>,
    /// Built only on a device with SHADER_F16 when `force_f16_fallback` is off; every other build
    /// is also what a device without SHADER_F16 builds.
    pub needs_f16: bool,
    /// Uses subgroup operations: built only on a device with SUBGROUP (the small-row kernels'
    /// subgroup reduction; the other reduction is built where it is absent).
    pub needs_subgroup: bool,
    /// Uses cooperative matrices: built only on a device with EXPERIMENTAL_COOPERATIVE_MATRIX
    /// (the tiles' other math is built everywhere).
    pub needs_coop: bool,
}

/// Every shader module the lane can build, one entry per set of override constants, from the
/// same source-building code as the lane's pipelines: the fixed shaders, the float weight
/// kernels with and without SHADER_F16 (`force_f16_fallback`), and each block format's builds,
/// the weight kernels in both precisions (fast only with SHADER_F16).
/// For `tests/wgsl.rs`, which translates them with naga to MSL and HLSL.
#[doc(hidden)]
pub fn shader_builds() -> Result<Vec<ShaderBuild>> {
    Shader::every_build()
        .into_iter()
        .map(|(shader, fmt, needs_f16)| {
            let (mut label, source) = shader.source()?;
            let constants = shader.constants(fmt);
            if !constants.is_empty() {
                let c: Vec<String> = constants.iter().map(|(k, v)| format!("{k}={v}")).collect();
                label += &format!(" [{}]", c.join(", "));
            }
            Ok(ShaderBuild {
                label,
                source,
                constants,
                needs_f16,
                needs_subgroup: shader.needs_subgroup(),
                needs_coop: shader.needs_coop(),
            })
        })
        .collect()
}
