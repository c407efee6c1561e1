//! The CUDA lane's own unit tests: the probe, every kernel's launch and definition, NVRTC compiling
//! every unit, and the host-side tables and constants against the CUDA sources.

use super::kernels::dequant_tables;
use super::*;

/// Here (no driver) the probe explains why; on a GPU machine it describes the device. With
/// `FOVEA_REQUIRE_CUDA=1` (set on the GPU machines) only the description passes.
#[test]
fn probe_describes_the_device_or_says_why_not() {
    match probe() {
        Ok(desc) => assert!(desc.contains("sm_") && desc.contains("NVRTC"), "{desc}"),
        Err(e) if std::env::var("FOVEA_REQUIRE_CUDA").is_ok_and(|v| v.trim() == "1") => {
            panic!("FOVEA_REQUIRE_CUDA=1 but the CUDA probe failed: {e}")
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("CUDA"), "{msg}");
            // the probe itself found what is missing; cudarc was never left to panic
            assert!(!msg.contains("panic"), "{msg}");
            assert!(matches!(e, Error::Device(_)), "{e:?}");
        }
    }
}

/// The kernels of every file of cuda/, by the text after each kernel qualifier's opening brace
/// (macro continuations skipped): (file, the qualifier's line, the body's start).
fn kernel_bodies() -> Vec<(&'static str, String, String)> {
    let mut out = Vec::new();
    for src in Source::ALL {
        let text = src.text();
        for (at, _) in text
            .match_indices("__global__")
            .chain(text.match_indices("BASE_KERNEL "))
            .chain(text.match_indices("GEMM_KERNEL "))
        {
            let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            let line = text[line_start..].lines().next().unwrap_or_default();
            // comments, the qualifiers' own #defines, and `extern "C" __global__` found twice
            let before = &text[line_start..at];
            if before.trim_start().starts_with("//")
                || line.starts_with("#define")
                || (text[at..].starts_with("__global__") && before.contains("BASE_KERNEL"))
            {
                continue;
            }
            let open = at + text[at..].find('{').expect("a kernel has a body");
            let body = text[open + 1..].trim_start_matches([' ', '\\', '\n']);
            out.push((src.file(), line.trim().to_owned(), body.chars().take(40).collect()));
        }
    }
    out
}

/// Programmatic dependent launch (src/backend/cuda/launch.rs) is safe only if every kernel
/// waits for the one before it before it touches memory: `grid_wait();` opens every kernel.
#[test]
fn every_kernel_starts_by_waiting_for_the_previous_one() {
    let kernels = kernel_bodies();
    // the files hold 75 kernel definitions (the block-format ones as macros): the scan found them
    assert!(kernels.len() >= 75, "found only {} kernels", kernels.len());
    let missing: Vec<_> = kernels.iter().filter(|(_, _, body)| !body.starts_with("grid_wait();")).collect();
    assert!(missing.is_empty(), "kernels that do not start with grid_wait(): {missing:#?}");
}

/// Every kernel the lane launches is a `BASE_KERNEL` (`extern "C" __global__` in the base unit's
/// tiles build) or a `GEMM_KERNEL` (also in the rows build) of the file it is loaded from, or
/// an `extern "C" __global__` of a file without weight kernels (the GEMM kernels carry their
/// launch bounds, `GEMM_LAUNCH`).
#[test]
fn every_launched_kernel_is_defined_in_its_file() {
    let declared = |src: &Source, name: &str| {
        let qualifiers: &[&str] =
            if src.takes_weights() { &["BASE_KERNEL", "GEMM_KERNEL"] } else { &["extern \"C\" __global__"] };
        let text = src.text();
        qualifiers.iter().any(|q| {
            text.contains(&format!("{q} void {name}(")) || text.contains(&format!("{q} void GEMM_LAUNCH {name}("))
        })
    };
    for (src, name) in KERNELS {
        assert_eq!(Unit::of(name), Unit::Base, "{name}");
        assert!(declared(src, name), "{name} is not defined in cuda/{}", src.file());
    }
    // and the list holds every kernel the host names by its file and a literal (launch_1d,
    // func), so the device test compiles and loads each one
    let host = [
        include_str!("mod.rs"),
        include_str!("linear.rs"),
        include_str!("vision.rs"),
        include_str!("lm_small.rs"),
        include_str!("lm_attention.rs"),
        include_str!("moe.rs"),
    ];
    let mut named = 0;
    for part in host.iter().flat_map(|text| text.split("Source::").skip(1)) {
        let Some((src, rest)) = part.split_once(',').filter(|(s, _)| s.chars().all(|c| c.is_ascii_alphanumeric()))
        else {
            continue;
        };
        let Some(name) = rest.trim_start().strip_prefix('"').and_then(|r| r.split_once('"')).map(|(n, _)| n) else {
            continue;
        };
        named += 1;
        assert!(
            KERNELS.iter().any(|(s, n)| format!("{s:?}") == src && *n == name),
            "{src}'s {name} is launched but not in KERNELS"
        );
    }
    assert!(named > 20, "found {named} kernel names in the host's launches");
    // weight kernels: the float formats' written out, the block formats' instantiated by
    // FOR_EACH_BLOCK_FORMAT(X) in cuda/dequant.cuh with X defining `{family}_##SFX(`
    let dequant = include_str!("../../../cuda/dequant.cuh");
    for (src, kernels) in WEIGHT_KERNELS {
        for format in WeightFormat::ALL {
            let name = kernels.of(format);
            if name.is_empty() {
                continue;
            }
            let suffix = format.name().to_lowercase();
            if !format.is_block() {
                assert_eq!(Unit::of(name), Unit::Base, "{name}");
                assert!(declared(src, name), "{name} is not defined in cuda/{}", src.file());
                continue;
            }
            assert_eq!(Unit::of(name), Unit::Block(format), "{name}");
            let family = name.strip_suffix(&format!("_{suffix}")).expect("block kernel names end in the format");
            assert!(src.takes_weights(), "cuda/{} gets no dequant.cuh", src.file());
            assert!(dequant.contains(&format!("X({suffix}, WF_{})", format.name())), "{format} not in dequant.cuh");
            let text = src.text();
            let definer = format!("void GEMM_LAUNCH {family}_##SFX(");
            let definer_1d = format!("void {family}_##SFX(");
            let at = text.find(&definer).or_else(|| text.find(&definer_1d));
            let at = at.unwrap_or_else(|| panic!("no block-format kernel {family}_##SFX in cuda/{}", src.file()));
            // the macro defined on the lines before is the one instantiated for every format
            let macro_name = text[..at].rsplit("#define ").next().and_then(|m| m.split('(').next()).unwrap_or("");
            assert!(
                text.contains(&format!("FOR_EACH_BLOCK_FORMAT({macro_name})")),
                "cuda/{} does not instantiate {macro_name}",
                src.file()
            );
        }
    }
    // the one-token q8x kernels: one list of formats (Q8X_IF_<format> in cuda/dequant.cuh)
    // instantiates them in cuda/moe.cu and cuda/linear.cu (in their rows builds), each name in
    // its format's unit, for exactly the formats the host launches them for
    let dequant = include_str!("../../../cuda/dequant.cuh");
    let (moe, linear) = (Source::Moe.text(), Source::Linear.text());
    for (file, text, instance) in [
        ("moe.cu", moe, "MOE_Q8X_KERNEL(SFX, FMT) Q8X_IF_##SFX(MOE_Q8X_DEFINE(SFX, FMT))"),
        ("linear.cu", linear, "LINEAR_Q8X_KERNEL(SFX, FMT) Q8X_IF_##SFX(LINEAR_Q8X_DEFINE(SFX, FMT))"),
    ] {
        assert!(text.contains(&format!("#define {instance}\n")), "cuda/{file} lacks `#define {instance}`");
        let macro_name = instance.split('(').next().expect("a name");
        assert!(
            text.contains(&format!("FOR_EACH_BLOCK_FORMAT({macro_name})")),
            "cuda/{file} does not instantiate {macro_name}"
        );
    }
    for format in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
        let sfx = format.name().to_lowercase();
        let defined = dequant.contains(&format!("#define Q8X_IF_{sfx}(M) M\n"));
        let empty = dequant.contains(&format!("#define Q8X_IF_{sfx}(M)\n"));
        assert!(defined != empty, "cuda/dequant.cuh: Q8X_IF_{sfx} must be M or empty, once");
        assert_eq!(defined, q8x_format(format), "{format}: q8x_format and cuda/dequant.cuh disagree");
        assert_eq!(defined, moe_q8x_kernels(format).is_some(), "{format}: moe_q8x_kernels");
        assert_eq!(defined, linear_q8x_kernel(format).is_some(), "{format}: linear_q8x_kernel");
        let moe_names = moe_q8x_kernels(format).into_iter().flatten();
        let names = moe_names.map(|n| (moe, n));
        for (text, name) in names.chain(linear_q8x_kernel(format).map(|n| (linear, n))) {
            assert_eq!(Unit::of(name), Unit::Block(format), "{name}");
            let family = name.strip_suffix(&format!("_{sfx}")).expect("ends in the format");
            assert!(text.contains(&format!("{family}_##SFX(")), "{name} is not defined");
        }
    }
    for src in Source::ALL {
        assert!(
            KERNELS.iter().any(|(s, _)| *s == src) || WEIGHT_KERNELS.iter().any(|(s, _)| *s == src),
            "cuda/{} has no kernel in KERNELS",
            src.file()
        );
    }
}

/// Every kernel the lane launches, with its file and build: the base kernels (`KERNELS`), the
/// one-token int8 kernels (rows build), and each weight kernel in every format and every build
/// the lane loads it in.
fn every_launch() -> Vec<(Source, &'static str, Build)> {
    let mut all: Vec<(Source, &'static str, Build)> =
        KERNELS.iter().map(|&(src, name)| (src, name, Build::Tiles(Precision::Exact))).collect();
    for format in WeightFormat::ALL {
        for name in moe_q8x_kernels(format).into_iter().flatten() {
            all.push((Source::Moe, name, Build::Rows));
        }
    }
    all.extend(WeightFormat::ALL.into_iter().filter_map(linear_q8x_kernel).map(|n| (Source::Linear, n, Build::Rows)));
    for (src, kernels) in WEIGHT_KERNELS {
        // the GEMMs through gemm_block also in their rows build (not the aligner's tile, nor
        // the embedding gather)
        let rows = [&LINEAR_KERNELS, &GROUPED_LINEAR_KERNELS, &MOE_GATE_KERNELS, &MOE_UP_KERNELS, &MOE_DOWN_KERNELS]
            .iter()
            .any(|k| k.0 == kernels.0);
        let builds: &[Build] = match (kernels.0 == LINEAR_PAIR_KERNELS.0, rows) {
            (true, _) => &[Build::Rows],
            (false, true) => &[Build::Tiles(Precision::Exact), Build::Tiles(Precision::Fast), Build::Rows],
            (false, false) => &[Build::Tiles(Precision::Exact), Build::Tiles(Precision::Fast)],
        };
        for format in WeightFormat::ALL.into_iter().filter(|&f| !kernels.of(f).is_empty()) {
            all.extend(builds.iter().map(|&build| (*src, kernels.of(format), build)));
        }
    }
    all
}

/// NVRTC compiles every file for this device (the weight files with the emitted tables and
/// cuda/dequant.cuh) and every kernel the lane launches, each weight kernel in every format,
/// is in its module. On a GPU machine only: skips without a driver, fails instead under
/// `FOVEA_REQUIRE_CUDA=1`.
#[test]
fn every_kernel_compiles_and_loads() {
    let b = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) if std::env::var("FOVEA_REQUIRE_CUDA").is_ok_and(|v| v.trim() == "1") => {
            panic!("FOVEA_REQUIRE_CUDA=1 but no CUDA lane: {e}")
        }
        Err(_) => return,
    };
    for (src, name, build) in every_launch() {
        b.func_in(src, name, build).unwrap_or_else(|e| panic!("{name} ({build}): {e}"));
    }
}

/// NVRTC alone — no driver, no device — compiles every unit the lane loads (each file's base
/// unit and each block format's weight kernels, in every build it is loaded in) for sm_90
/// (the H200: tensor-core tiles, `griddepcontrol`), sm_80 and sm_75 (the FMA tiles), and each
/// launched kernel is an entry of its unit's PTX. So a kernel that does not compile under
/// NVRTC fails here, where CI runs, not first on a GPU machine. Skips where NVRTC is not
/// found, and where a CUDA driver is (a GPU machine: `every_kernel_compiles_and_loads`
/// compiles and loads for its device, and these three architectures would cost minutes of
/// device time, the compiles being serial); `FOVEA_REQUIRE_NVRTC=1` runs it regardless and
/// makes a missing NVRTC a failure (`.ci/run` installs NVRTC from PyPI's `nvidia-cuda-nvrtc`
/// and sets it).
#[test]
fn every_unit_compiles_under_nvrtc() {
    let required = std::env::var("FOVEA_REQUIRE_NVRTC").is_ok_and(|v| v.trim() == "1");
    // SAFETY: only tries to dlopen the library under its usual names.
    if !required && unsafe { cudarc::driver::sys::is_culib_present() } {
        eprintln!("SKIPPED: a CUDA driver is present; every_kernel_compiles_and_loads compiles for its device");
        return;
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        assert!(!required, "FOVEA_REQUIRE_NVRTC=1 but NVRTC (libnvrtc.so.13) was not found");
        eprintln!("SKIPPED: NVRTC (libnvrtc.so.13) not found; the CUDA kernels were not compiled");
        return;
    }
    let launches = every_launch();
    for arch in [90, 80, 75] {
        let mut units: Vec<(Source, Build, Unit)> = Vec::new();
        for &(src, name, build) in &launches {
            let unit = Unit::of(name);
            let (ptx, _) = ptx_for(arch, src, build, unit)
                .unwrap_or_else(|e| panic!("sm_{arch}: cuda/{} ({build}): {e}", src.file()));
            let text = ptx.to_src();
            assert!(
                text.contains(&format!(".entry {name}(")),
                "sm_{arch}: `{name}` is not an entry of cuda/{} ({build}, {unit:?})",
                src.file()
            );
            if !units.contains(&(src, build, unit)) {
                units.push((src, build, unit));
            }
        }
        eprintln!("sm_{arch}: {} units compiled, {} kernels found in them", units.len(), launches.len());
    }
}

/// The block formats' codes in cuda/dequant.cuh (`WF_*`, the kernels' compile-time FMT) are
/// their positions in `WeightFormat::ALL` (which `WeightKernels` indexes by), and its block
/// geometry is `crate::formats`'.
#[test]
fn dequant_codes_and_geometry_match_weight_format() {
    let dequant = include_str!("../../../cuda/dequant.cuh");
    let common = include_str!("../../../cuda/common.cuh");
    for (i, format) in WeightFormat::ALL.into_iter().enumerate() {
        assert_eq!(format as usize, i, "{format}");
        if !format.is_block() {
            continue;
        }
        let code = format!("#define WF_{} {i}\n", format.name());
        assert!(dequant.contains(&code), "cuda/dequant.cuh lacks `{}`", code.trim_end());
        let geometry = format!("WBLOCK(WF_{}, {}, {}, ", format.name(), format.block_elems(), format.block_bytes());
        assert!(dequant.contains(&geometry), "cuda/dequant.cuh lacks `{}`", geometry.trim_end());
    }
    let first_block = WeightFormat::ALL.iter().position(|f| f.is_block()).expect("block formats exist");
    assert!(WeightFormat::ALL[first_block..].iter().all(|f| f.is_block()));
    assert!(common.contains(&format!("#define WF_FIRST_BLOCK {first_block}\n")));
}

/// The lookup tables in the NVRTC source are `crate::formats::tables`' arrays, entry for entry,
/// each in global memory.
#[test]
fn emitted_tables_are_the_rust_tables() {
    use crate::formats::tables::*;
    let text = dequant_tables();
    let entries = |name: &str| -> Vec<String> {
        let start = text.find(&format!(" {name}[")).unwrap_or_else(|| panic!("{name} not emitted"));
        let body = &text[start..];
        let open = body.find('{').expect("array body");
        let close = body.find('}').expect("array end");
        body[open + 1..close].split(',').map(|e| e.trim().to_string()).collect()
    };
    let hex =
        |e: &str| u64::from_str_radix(e.trim_start_matches("0x").trim_end_matches("ull").trim_end_matches('u'), 16);
    let as_u64 = |name: &str| -> Vec<u64> { entries(name).iter().map(|e| hex(e).expect("hex entry")).collect() };
    let as_i64 = |name: &str| -> Vec<i64> { entries(name).iter().map(|e| e.parse().expect("integer entry")).collect() };
    assert_eq!(as_u64("IQ2XXS_GRID"), IQ2XXS_GRID);
    assert_eq!(as_u64("IQ2XS_GRID"), IQ2XS_GRID);
    assert_eq!(as_u64("IQ1S_GRID"), IQ1S_GRID);
    assert_eq!(as_u64("IQ3XXS_GRID"), IQ3XXS_GRID.map(u64::from));
    assert_eq!(as_i64("KSIGNS_IQ2XS"), KSIGNS_IQ2XS.map(i64::from));
    assert_eq!(as_i64("KVALUES_IQ4NL"), KVALUES_IQ4NL.map(i64::from));
    assert_eq!(as_i64("KVALUES_MXFP4"), KVALUES_MXFP4.map(i64::from));
    assert!(text.contains(&format!("#define IQ1_DELTA {:?}f\n", IQ1_DELTA)));
    // kmask_iq2xs, not emitted, is what the decoders shift: entry j is 1 << j
    assert!(KMASK_IQ2XS.iter().enumerate().all(|(j, &m)| m == 1 << j));
    assert_eq!(text.matches("__device__ const ").count(), 7);
    assert!(!text.contains("__constant__"));
}

/// The launch geometry of the shared GEMM matches the kernels' `#define`s in cuda/common.cuh.
#[test]
fn gemm_launch_constants_match_common_cuh() {
    let common = include_str!("../../../cuda/common.cuh");
    for (name, value) in
        [("GEMM_BM", GEMM_BM), ("GEMM_BN", GEMM_BN), ("GEMM_THREADS", GEMM_THREADS), ("GEMV_ROWS", GEMV_ROWS as u32)]
    {
        let define = format!("#define {name} {value}\n");
        assert!(common.contains(&define), "cuda/common.cuh lacks `{}`", define.trim_end());
    }
    // gemv_cols: a block per column pair, as gemm_grid's small-row arm sizes the grid
    assert!(common.contains("    const unsigned int c = 2u * block;\n"));
    assert_eq!(gemm_grid(GEMV_ROWS, 1025), (513, 1));
    // the one-token q8x kernels: Q8X_WARPS warps of Q8X_COLS columns a block
    let dequant = include_str!("../../../cuda/dequant.cuh");
    let (warps, cols) = (Q8X_THREADS / 32, Q8X_BLOCK_COLS as u32 / (Q8X_THREADS / 32));
    for define in [format!("#define Q8X_WARPS {warps}\n"), format!("#define Q8X_COLS {cols}\n")] {
        assert!(dequant.contains(&define), "cuda/dequant.cuh lacks `{}`", define.trim_end());
    }
}

/// The tile path's k splits: a grid of fewer blocks than the device has SMs gets about
/// TILE_SPLIT_GRID; wide grids and short rows are not split.
#[test]
fn tile_splits_fill_the_device() {
    // a hyper-connection mix over a 512-token chunk: 1 column block x 8 row tiles
    assert_eq!(k_splits(8, 16384, TILE_SPLIT_BELOW, TILE_SPLIT_GRID), (16, 1024));
    // the router (4 x 8 blocks over 4096): 4 ranges
    assert_eq!(k_splits(32, 4096, TILE_SPLIT_BELOW, TILE_SPLIT_GRID), (4, 1024));
    // a ViT projection (16 x 49 blocks) and short rows stay whole
    assert_eq!(k_splits(16 * 49, 1024, TILE_SPLIT_BELOW, TILE_SPLIT_GRID).0, 1);
    assert_eq!(k_splits(8, 1000, TILE_SPLIT_BELOW, TILE_SPLIT_GRID).0, 1);
}

/// The small-row linear's k splits: narrow outputs get about GEMV_SPLIT_GRID blocks, in
/// ranges of whole GEMV_SPLIT_K that cover k; wider ones and short rows are not split.
#[test]
fn gemv_splits_cover_k_in_whole_chunks() {
    assert_eq!(gemv_splits(12, 16384), (16, 1024)); // a hyper-connection mix
    assert_eq!(gemv_splits(2, 16384), (16, 1024));
    assert_eq!(gemv_splits(63, 4096), (4, 1024));
    assert_eq!(gemv_splits(40, 5000), (3, 2048)); // 4 wanted: ranges of 1250, rounded up to 2048
    assert_eq!(gemv_splits(GEMV_SPLIT_BELOW, 16384).0, 1);
    assert_eq!(gemv_splits(3, 1000).0, 1);
    for pairs in [1, 5, 33, 63] {
        for k in [1024, 3072, 5000, 16384, 65536] {
            let (splits, chunk) = gemv_splits(pairs, k);
            assert_eq!(chunk % GEMV_SPLIT_K, 0, "{pairs} {k}");
            assert!(splits * chunk >= k && (splits - 1) * chunk < k, "{pairs} {k}: every range is in k");
        }
    }
}
