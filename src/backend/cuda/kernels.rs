//! What the CUDA lane compiles: the kernel files of `cuda/` (`Source`), each compiled in units
//! (`Unit`: the base kernels, or one block format's weight kernels) and builds (`Build`: the GEMM
//! tile path in a precision, or the small-row path), the lists of the kernels the lane launches
//! (which unit tests check against the files), and NVRTC's PTX for them (`ptx_for`, cached per
//! process and on disk: `ptx_cache.rs`).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use super::{GEMV_ROWS, no_panic, nvrtc_version, ptx_cache};
use crate::backend::{Precision, WeightFormat};
use crate::error::{Error, Result};

/// One kernel file of `cuda/`, compiled as a unit (after `cuda/common.cuh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    Elementwise,
    Copy,
    Norm,
    Rope,
    Attention,
    Linear,
    Debug,
    LmSmall,
    LmAttention,
    Moe,
}

const COMMON: &str = include_str!("../../../cuda/common.cuh");
const DEQUANT: &str = include_str!("../../../cuda/dequant.cuh");

impl Source {
    pub const ALL: [Source; 10] = [
        Source::Elementwise,
        Source::Copy,
        Source::Norm,
        Source::Rope,
        Source::Attention,
        Source::Linear,
        Source::Debug,
        Source::LmSmall,
        Source::LmAttention,
        Source::Moe,
    ];

    pub fn file(self) -> &'static str {
        match self {
            Source::Elementwise => "elementwise.cu",
            Source::Copy => "copy.cu",
            Source::Norm => "norm.cu",
            Source::Rope => "rope.cu",
            Source::Attention => "attention.cu",
            Source::Linear => "linear.cu",
            Source::Debug => "debug.cu",
            Source::LmSmall => "lm_small.cu",
            Source::LmAttention => "lm_attention.cu",
            Source::Moe => "moe.cu",
        }
    }

    /// The file's own text (without the common prelude).
    pub fn text(self) -> &'static str {
        match self {
            Source::Elementwise => include_str!("../../../cuda/elementwise.cu"),
            Source::Copy => include_str!("../../../cuda/copy.cu"),
            Source::Norm => include_str!("../../../cuda/norm.cu"),
            Source::Rope => include_str!("../../../cuda/rope.cu"),
            Source::Attention => include_str!("../../../cuda/attention.cu"),
            Source::Linear => include_str!("../../../cuda/linear.cu"),
            Source::Debug => include_str!("../../../cuda/debug.cu"),
            Source::LmSmall => include_str!("../../../cuda/lm_small.cu"),
            Source::LmAttention => include_str!("../../../cuda/lm_attention.cu"),
            Source::Moe => include_str!("../../../cuda/moe.cu"),
        }
    }

    /// Whether the file's kernels take weights, and so decode the block formats (cuda/dequant.cuh
    /// with ggml's lookup tables is prepended to it).
    pub fn takes_weights(self) -> bool {
        matches!(self, Source::Linear | Source::LmSmall | Source::LmAttention | Source::Moe)
    }

    /// What NVRTC compiles for `unit`: for a file with weight kernels the unit's definitions
    /// (cuda/common.cuh, "Compilation units"), the common prelude, the lookup tables and the block
    /// decoders, then the file; for the others the prelude and the file.
    pub fn program(self, unit: Unit) -> String {
        if !self.takes_weights() {
            return format!("{COMMON}\n#line 1 \"{}\"\n{}", self.file(), self.text());
        }
        let unit_defines = match unit {
            Unit::Base => "#define FOR_EACH_BLOCK_FORMAT(X)\n".to_string(),
            Unit::Block(f) => format!(
                "#define FOVEA_BLOCK_FORMAT {}\n#define FOR_EACH_BLOCK_FORMAT(X) X({}, WF_{})\n",
                f as usize,
                f.name().to_lowercase(),
                f.name()
            ),
        };
        format!(
            "{unit_defines}{COMMON}\n{}\n#line 1 \"dequant.cuh\"\n{DEQUANT}\n#line 1 \"{}\"\n{}",
            dequant_tables(),
            self.file(),
            self.text()
        )
    }
}

/// One compilation of a kernel file (cuda/common.cuh, "Compilation units"): its base unit (every
/// kernel but the block formats' weight kernels), or the weight kernels of one block format, so
/// that a model compiles only the formats it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Base,
    Block(WeightFormat),
}

impl Unit {
    /// The unit kernel `name` is in: a weight kernel of a block format is named
    /// `{family}_{format in lower case}` (`WeightKernels`), every other kernel is in its file's
    /// base unit.
    pub(super) fn of(name: &str) -> Unit {
        WeightFormat::ALL
            .into_iter()
            .filter(|f| f.is_block())
            .find(|f| name.strip_suffix(&f.name().to_lowercase()).is_some_and(|family| family.ends_with('_')))
            .map_or(Unit::Base, Unit::Block)
    }
}

/// One compilation of a kernel file's unit (cuda/common.cuh, "GEMM builds"): every kernel with
/// the GEMMs on their tile path, in a precision; or the GEMM kernels alone on their small-row path
/// (at most `GEMV_ROWS` rows), bounded for more blocks an SM. The small-row path's arithmetic is
/// the same in both precisions (f32 products of the decoded weights), so it has one build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Build {
    Tiles(Precision),
    Rows,
}

impl Build {
    /// The build a GEMM over operands of at most `bound_rows` rows takes (`gemm_block`'s rule), in
    /// `precision` for the tile.
    pub(super) fn gemm(bound_rows: usize, precision: Precision) -> Build {
        if bound_rows <= GEMV_ROWS { Build::Rows } else { Build::Tiles(precision) }
    }
}

impl fmt::Display for Build {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Build::Tiles(p) => write!(f, "{p}"),
            Build::Rows => f.write_str("small-row GEMMs"),
        }
    }
}

/// ggml's IQ grids and value tables (`crate::formats::tables`, the arrays the CPU lane decodes
/// with) as the `__device__ const` arrays cuda/dequant.cuh reads: one source of truth. Global
/// memory (23 KiB, IQ1S_GRID alone 16 KiB), not `__constant__`: a warp's lanes look up different
/// entries, which the constant cache would serve one address at a time (dequant.cuh says more).
/// (`kmask_iq2xs` is not emitted: entry j is `1 << j`, which the decoders shift instead.)
pub(super) fn dequant_tables() -> String {
    use crate::formats::tables::*;
    use std::fmt::Write;
    fn array<T: Copy>(out: &mut String, c_type: &str, name: &str, values: &[T], item: impl Fn(T) -> String) {
        let items: Vec<String> = values.iter().map(|&v| item(v)).collect();
        // writing to a String cannot fail
        let _ = writeln!(out, "__device__ const {c_type} {name}[{}] = {{{}}};", values.len(), items.join(","));
    }
    let mut s = String::new();
    let _ = writeln!(s, "#define IQ1_DELTA {:?}f", IQ1_DELTA);
    array(&mut s, "unsigned char", "KSIGNS_IQ2XS", &KSIGNS_IQ2XS, |v| v.to_string());
    array(&mut s, "unsigned long long", "IQ2XXS_GRID", &IQ2XXS_GRID, |v| format!("{v:#018x}ull"));
    array(&mut s, "unsigned long long", "IQ2XS_GRID", &IQ2XS_GRID, |v| format!("{v:#018x}ull"));
    array(&mut s, "unsigned int", "IQ3XXS_GRID", &IQ3XXS_GRID, |v| format!("{v:#010x}u"));
    array(&mut s, "signed char", "KVALUES_IQ4NL", &KVALUES_IQ4NL, |v| v.to_string());
    array(&mut s, "signed char", "KVALUES_MXFP4", &KVALUES_MXFP4, |v| v.to_string());
    array(&mut s, "unsigned long long", "IQ1S_GRID", &IQ1S_GRID, |v| format!("{v:#018x}ull"));
    s
}

/// The names of one weight-taking kernel family per weight format, indexed by the format's
/// position in `WeightFormat::ALL` (`f as usize`): `{family}_{suffix}` with the suffix the format's
/// name in lower case. The block formats' kernels are instantiated by `FOR_EACH_BLOCK_FORMAT` in
/// cuda/dequant.cuh (a unit test checks each name against it).
pub struct WeightKernels(pub [&'static str; WeightFormat::ALL.len()]);

impl WeightKernels {
    pub fn of(&self, format: WeightFormat) -> &'static str {
        self.0[format as usize]
    }
}

macro_rules! weight_kernels {
    ($family:literal) => {
        weight_kernels!($family, concat!($family, "_f32"), concat!($family, "_f16"), concat!($family, "_bf16"))
    };
    ($family:literal, $f32:expr, $f16:expr, $bf16:expr) => {
        WeightKernels([
            $f32,
            $f16,
            $bf16,
            concat!($family, "_q8_0"),
            concat!($family, "_q2_k"),
            concat!($family, "_q3_k"),
            concat!($family, "_q4_k"),
            concat!($family, "_q5_k"),
            concat!($family, "_q6_k"),
            concat!($family, "_iq1_s"),
            concat!($family, "_iq1_m"),
            concat!($family, "_iq2_xxs"),
            concat!($family, "_iq2_xs"),
            concat!($family, "_iq3_xxs"),
            concat!($family, "_iq4_xs"),
            concat!($family, "_mxfp4"),
            concat!($family, "_fp8_e4m3_b128_e8m0"),
            concat!($family, "_fp8_e4m3_b128_f32"),
        ])
    };
}

pub const LINEAR_KERNELS: WeightKernels = weight_kernels!("linear");
/// Two weights of one format against the same few rows, in one launch of the small-row path (rows
/// build only).
pub const LINEAR_PAIR_KERNELS: WeightKernels = weight_kernels!("linear_pair");
pub const UNFOLD_LINEAR_GELU_KERNELS: WeightKernels = weight_kernels!("unfold_linear_gelu");
pub const GROUPED_LINEAR_KERNELS: WeightKernels = weight_kernels!("grouped_linear");
pub const MOE_GATE_KERNELS: WeightKernels = weight_kernels!("moe_gate");
pub const MOE_UP_KERNELS: WeightKernels = weight_kernels!("moe_up");
pub const MOE_DOWN_KERNELS: WeightKernels = weight_kernels!("moe_down");
/// Whether one token's GEMVs in `format` can take int8 activations: the formats whose codes
/// cuda/dequant.cuh's `q8x_dot32` multiplies as integers (the published Q2-class mix's experts and
/// Q8_0, and MXFP4: the official checkpoint's experts), the list `Q8X_IF_<format>` there
/// instantiates the `*_q8x_*` kernels from.
pub fn q8x_format(format: WeightFormat) -> bool {
    matches!(format, WeightFormat::Q8_0 | WeightFormat::Q2_K | WeightFormat::IQ2_XXS | WeightFormat::MXFP4)
}
/// The experts' one-token kernels on int8 activations (cuda/moe.cu, `moe_*_q8x_*`: fast precision,
/// a decode step of one sequence) as (gate, up, down), for the [`q8x_format`]s; the other formats
/// keep the small-row path.
pub fn moe_q8x_kernels(format: WeightFormat) -> Option<[&'static str; 3]> {
    match format {
        WeightFormat::Q8_0 => Some(["moe_gate_q8x_q8_0", "moe_up_q8x_q8_0", "moe_down_q8x_q8_0"]),
        WeightFormat::Q2_K => Some(["moe_gate_q8x_q2_k", "moe_up_q8x_q2_k", "moe_down_q8x_q2_k"]),
        WeightFormat::IQ2_XXS => Some(["moe_gate_q8x_iq2_xxs", "moe_up_q8x_iq2_xxs", "moe_down_q8x_iq2_xxs"]),
        WeightFormat::MXFP4 => Some(["moe_gate_q8x_mxfp4", "moe_up_q8x_mxfp4", "moe_down_q8x_mxfp4"]),
        _ => None,
    }
}
/// The linear kernel on int8 activations for one row of x (cuda/linear.cu, `linear_q8x_*`: fast
/// precision, a decode step of one sequence, at least [`LINEAR_Q8X_MIN_COLS`] outputs), for the
/// [`q8x_format`]s.
pub fn linear_q8x_kernel(format: WeightFormat) -> Option<&'static str> {
    match format {
        WeightFormat::Q8_0 => Some("linear_q8x_q8_0"),
        WeightFormat::Q2_K => Some("linear_q8x_q2_k"),
        WeightFormat::IQ2_XXS => Some("linear_q8x_iq2_xxs"),
        WeightFormat::MXFP4 => Some("linear_q8x_mxfp4"),
        _ => None,
    }
}
/// The narrowest output `linear_q8x_*` takes. A block per `Q8X_BLOCK_COLS` columns: at 4 096
/// outputs (wo_b, the shared expert's down) 128 blocks, one wave, 14.6 µs where the small-row
/// path's 2 048 blocks took 12.6; at 32 768 (wq_b) 15.6 µs for its 19.1, at the head's 129 280
/// 162 µs for its 192 (H200, Nsight Compute, Q8_0). Narrower outputs keep the small-row path.
pub const LINEAR_Q8X_MIN_COLS: usize = 8192;
/// Threads of a `*_q8x_*` block (`Q8X_THREADS` in cuda/dequant.cuh) and the columns it takes
/// (`Q8X_WARPS · Q8X_COLS`).
pub(super) const Q8X_THREADS: u32 = 256;
pub(super) const Q8X_BLOCK_COLS: usize = 32;
/// A `*_q8x_*` block's dynamic shared memory over rows of k: the int8 row (k bytes), then its
/// scales (k / 32 floats).
pub(super) fn q8x_shared_bytes(k: usize) -> usize {
    k + k / 8
}
/// `embed_rows_f32` takes the float formats by a run-time code (its argument `fmt`).
pub const EMBED_ROWS_KERNELS: WeightKernels =
    weight_kernels!("embed_rows", "embed_rows_f32", "embed_rows_f32", "embed_rows_f32");

/// A weight in its format as the f16 operand of fast precision's cuBLASLt GEMMs
/// (`weight_f16_*` in cuda/linear.cu, src/backend/cuda/blas.rs). The f16 entry is empty: an f16
/// weight is that operand as it is.
pub const WEIGHT_F16_KERNELS: WeightKernels = weight_kernels!("weight_f16", "weight_f16_f32", "", "weight_f16_bf16");

/// Every weight-kernel family with its file (a unit test checks each name is defined there; an
/// empty name is a format the family has no kernel for).
pub const WEIGHT_KERNELS: &[(Source, &WeightKernels)] = &[
    (Source::Linear, &LINEAR_KERNELS),
    (Source::Linear, &WEIGHT_F16_KERNELS),
    (Source::Linear, &LINEAR_PAIR_KERNELS),
    (Source::Linear, &UNFOLD_LINEAR_GELU_KERNELS),
    (Source::LmAttention, &GROUPED_LINEAR_KERNELS),
    (Source::Moe, &MOE_GATE_KERNELS),
    (Source::Moe, &MOE_UP_KERNELS),
    (Source::Moe, &MOE_DOWN_KERNELS),
    (Source::LmSmall, &EMBED_ROWS_KERNELS),
];

/// Every kernel the lane launches but the weight kernels (`WEIGHT_KERNELS`), with its file (a unit
/// test checks each is defined there).
pub const KERNELS: &[(Source, &str)] = &[
    (Source::Elementwise, "add_f32"),
    (Source::Elementwise, "swiglu_f32"),
    (Source::Elementwise, "gelu_erf_f32"),
    (Source::Elementwise, "sum_splits_f32"),
    (Source::Elementwise, "f32_to_f16"),
    (Source::Elementwise, "swiglu_f16"),
    (Source::Copy, "slice_cols_f32"),
    (Source::Copy, "concat_rows_u32"),
    (Source::Copy, "gather_rows_f32"),
    (Source::Copy, "unfold_f32"),
    (Source::Norm, "rms_norm_f32"),
    (Source::Norm, "rms_norm_f16"),
    (Source::Rope, "rope_2d_f32"),
    (Source::Attention, "attention_f32"),
    (Source::Attention, "attention_kv_f16"),
    (Source::Attention, "attention_qkv_rope_f16"),
    (Source::Attention, "attention_fast_d16"),
    (Source::Attention, "attention_fast_d32"),
    (Source::Attention, "attention_fast_d64"),
    (Source::Attention, "attention_fast_d128"),
    (Source::Debug, "debug_poke_u32"),
    (Source::LmSmall, "hc_expand_f32"),
    (Source::LmSmall, "rms_norm_heads_f32"),
    (Source::LmSmall, "hc_split_f32"),
    (Source::LmSmall, "hc_mix_partials_f32"),
    (Source::LmSmall, "hc_mix_partials_rows4_f32"),
    (Source::LmSmall, "hc_mix_split_f32"),
    (Source::LmSmall, "hc_mix_split_pre_norm_f32"),
    (Source::LmSmall, "hc_post_mix_partials_f32"),
    (Source::LmSmall, "hc_pre_f32"),
    (Source::LmSmall, "hc_pre_norm_f32"),
    (Source::LmSmall, "hc_post_f32"),
    (Source::LmSmall, "hc_head_weights_f32"),
    (Source::LmSmall, "rope_tail_f32"),
    (Source::LmSmall, "rope_tail_at_f32"),
    (Source::LmSmall, "rms_norm_rope_f32"),
    (Source::LmSmall, "topk_rows_i32"),
    (Source::LmSmall, "sqrt_softplus_f32"),
    (Source::LmSmall, "hash_route_i32"),
    (Source::LmSmall, "route_weights_f32"),
    (Source::LmSmall, "route_experts_f32"),
    (Source::LmSmall, "swiglu_clamp_f32"),
    (Source::LmAttention, "sink_attention_f32"),
    (Source::LmAttention, "sink_attention_merge_f32"),
    (Source::LmAttention, "sink_rows_f16"),
    (Source::LmAttention, "sink_attention_fast_d128"),
    (Source::LmAttention, "sink_attention_fast_d512"),
    (Source::LmAttention, "indexer_scores_f32"),
    (Source::LmAttention, "compress_pool_f32"),
    (Source::Moe, "moe_route"),
    (Source::Moe, "moe_combine"),
];

/// PTX compiled in this process, per (compute capability as `major·10 + minor`, file, build,
/// unit).
static PTX_CACHE: LazyLock<Mutex<HashMap<(u32, Source, Build, Unit), (Ptx, Option<PathBuf>)>>> =
    LazyLock::new(Mutex::default);

/// PTX of `src` for architecture `arch` and a precision, compiled by NVRTC at the first request
/// in this process, or read from the disk cache where an earlier process compiled it
/// (`ptx_cache`). `Fast` defines `FOVEA_FAST` (one bf16 product per GEMM tile, cuda/common.cuh);
/// only the GEMM kernels are ever loaded from a fast module.
/// Returns the PTX and, when it was read from the disk cache, that file (which `forget_ptx`
/// removes if the driver then refuses the PTX).
pub(super) fn ptx_for(arch: u32, src: Source, build: Build, unit: Unit) -> Result<(Ptx, Option<PathBuf>)> {
    let mut cache = PTX_CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = cache.get(&(arch, src, build, unit)) {
        return Ok(p.clone());
    }
    let mut options = vec![format!("--gpu-architecture=compute_{arch}")];
    match build {
        Build::Tiles(precision) => {
            options.push("-DFOVEA_GEMM_PATH=GEMM_PATH_TILES".into());
            if precision == Precision::Fast {
                options.push("-DFOVEA_FAST=1".into());
            }
        }
        Build::Rows => options.push("-DFOVEA_GEMM_PATH=GEMM_PATH_ROWS".into()),
    }
    // Diagnostic: extra NVRTC options for tuning a kernel's compile-time constants without a
    // rebuild (e.g. `-DGEMV_MIN_BLOCKS=12`), split at white space. Such builds bypass the disk
    // cache: an option may bring in files (`--pre-include`) whose contents the key cannot see.
    let extra = std::env::var("FOVEA_NVRTC_OPTIONS").ok();
    if let Some(extra) = &extra {
        options.extend(extra.split_whitespace().map(String::from));
    }
    // The device's own compute capability as the virtual architecture: NVRTC emits PTX for it
    // (a real `sm_XY` target makes NVRTC emit a cubin, and `nvrtcGetPTX`, all cudarc reads, may
    // then have nothing), and the driver JIT-compiles that PTX for sm_XY when the module loads.
    let program = src.program(unit);
    // the disk cache's key: everything the PTX depends on (ptx_cache.rs)
    let nvrtc = nvrtc_version().map_or("?".into(), |(a, b)| format!("{a}.{b}"));
    let key = ptx_cache::fnv1a(&[program.as_bytes(), options.join("\0").as_bytes(), nvrtc.as_bytes()]);
    let stored =
        ptx_cache::dir_from_env().filter(|_| extra.is_none()).map(|dir| ptx_cache::path(&dir, src.file(), key));
    if let Some(ptx) = stored.as_deref().and_then(ptx_cache::load) {
        let read = (Ptx::from_src(ptx), stored);
        cache.insert((arch, src, build, unit), read.clone());
        return Ok(read);
    }
    let opts = CompileOptions { options, name: Some(src.file().into()), ..Default::default() };
    let ptx = no_panic("NVRTC", || {
        cudarc::nvrtc::compile_ptx_with_opts(&program, opts).map_err(|e| match e {
            CompileError::CompileError { nvrtc, options, log } => Error::Device(format!(
                "NVRTC could not compile cuda/{} for compute_{arch} ({nvrtc:?}, options {options:?}):\n{}",
                src.file(),
                log.to_string_lossy()
            )),
            e => Error::Device(format!("NVRTC failed on cuda/{} for compute_{arch}: {e:?}", src.file())),
        })
    })?;
    // (`to_src` panics on text that is not UTF-8, which NVRTC's PTX never is: then not kept)
    if let (Some(path), Ok(text)) = (&stored, no_panic("NVRTC output", || Ok(ptx.to_src()))) {
        ptx_cache::store(path, &text);
    }
    cache.insert((arch, src, build, unit), (ptx.clone(), None));
    Ok((ptx, None))
}

/// Drop a unit's PTX read from `file` (the driver refused it): from this process and from the
/// disk, so the next `ptx_for` compiles it again.
pub(super) fn forget_ptx(arch: u32, src: Source, build: Build, unit: Unit, file: &Path) {
    PTX_CACHE.lock().unwrap_or_else(|e| e.into_inner()).remove(&(arch, src, build, unit));
    let _ = std::fs::remove_file(file);
}
