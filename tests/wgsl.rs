//! Validates every `shaders/*.wgsl` with naga (parse + full validation, f16, subgroups and
//! cooperative matrices allowed; `enable f16;` and `enable wgpu_cooperative_matrix;` lead each, as
//! the lane emits them ahead of its builds that use them). New
//! files are picked up automatically; errors print as `file:line`. A few files are parts that the
//! lane concatenates into one shader (`COMPOSED`, the same order as in `src/backend/wgpu`): those
//! are validated as the composed shader, and an error line is mapped back to the part it falls
//! in. The block-format kernels (`shaders/dequant/`, built per format with emitted lookup tables)
//! are validated as the lane builds them, one per (kernel, format, precision).
//!
//! Metal and DX12 stay honest: every module the lane builds (`shader_builds`, the lane's own
//! source-building code: each shader, each block format's build, each `FMT` specialisation, with
//! and without SHADER_F16, the GEMM kernels in both precisions) is translated, one entry point at a time, to MSL and HLSL by naga's
//! backends with the options wgpu 30's Metal and DX12 backends give them, so a kernel that only
//! Vulkan accepts fails here and not on a Mac or under DX12. The exception is the cooperative-matrix
//! tiles (`Tiles::Coop`), which the lane builds only on an adapter with a 16×16 f16 configuration
//! (Vulkan's VK_KHR_cooperative_matrix; wgpu 30's Metal offers 8×8 f32 only, its DX12 none): they
//! are translated to SPIR-V, as wgpu's Vulkan backend does. Only naga's translation is checked,
//! not Apple's Metal compiler nor FXC/DXC nor a Vulkan driver's.

use std::path::Path;

use naga::valid::{Capabilities, ValidationFlags, Validator};

/// Shaders the lane builds from several files, in concatenation order (each operands file with
/// one of the GEMM kernels; the lane builds every pairing, `every_build_translates_to_msl_and_hlsl`).
const COMPOSED: &[&[&str]] = &[
    &["linear_packed.wgsl", "operands_exact.wgsl", "tile_rows.wgsl", "linear_tile.wgsl", "tile_fma.wgsl"],
    &["linear_f16.wgsl", "operands_fast.wgsl", "tile_rows.wgsl", "linear_tile.wgsl", "tile_fma.wgsl"],
    &[
        "linear_f16.wgsl",
        "operands_fast.wgsl",
        "tile_rows.wgsl",
        "linear_tile.wgsl",
        "tile_coop.wgsl",
        "tile_coop_store.wgsl",
    ],
    &["operands_fast.wgsl", "tile_rows.wgsl", "tile_coop_direct.wgsl", "tile_coop_store.wgsl"],
    &["linear_packed.wgsl", "operands_fast.wgsl", "half_weight.wgsl"],
    &["operands_fast.wgsl", "half_rows.wgsl"],
    &[
        "linear_packed.wgsl",
        "operands_exact.wgsl",
        "rows_one.wgsl",
        "rows_subgroup.wgsl",
        "rows_pairs.wgsl",
        "rows.wgsl",
    ],
    &[
        "linear_f16.wgsl",
        "operands_fast.wgsl",
        "rows_eight.wgsl",
        "rows_workgroup.wgsl",
        "rows_pairs.wgsl",
        "rows.wgsl",
    ],
];

/// What leads every validated source: the directives the lane emits ahead of its f16 and its
/// cooperative-matrix builds.
const DIRECTIVES: &str = "enable f16;\nenable wgpu_cooperative_matrix;\n";

/// Parse and validate one WGSL source; errors carry the 1-based line (when naga gives one).
fn validate_source(src: &str) -> Result<naga::Module, (Option<u32>, String)> {
    let module = naga::front::wgsl::parse_str(src)
        .map_err(|e| (e.location(src).map(|l| l.line_number), e.emit_to_string(src)))?;
    let caps = Capabilities::IMMEDIATES
        | Capabilities::SHADER_FLOAT16
        | Capabilities::SUBGROUP
        | Capabilities::COOPERATIVE_MATRIX;
    Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| (e.location(src).map(|l| l.line_number), e.emit_to_string(src)))?;
    Ok(module)
}

/// Validate the concatenation of `parts`; on error name `part:line` of the offending line.
fn validate(parts: &[&Path]) -> Result<(), String> {
    let mut src = String::from(DIRECTIVES);
    let mut starts = Vec::new(); // (first line of the part in `src`, 1-based; its path)
    for p in parts {
        starts.push((src.lines().count() + 1, p.display().to_string()));
        src += &std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let locate = |line: Option<u32>| -> String {
        match line {
            Some(l) => {
                let l = l as usize;
                let (first, path) = starts.iter().rev().find(|(first, _)| *first <= l).unwrap();
                format!("{path}:{}", l - first + 1)
            }
            None => starts.iter().map(|(_, p)| p.as_str()).collect::<Vec<_>>().join(" + "),
        }
    };
    let module = validate_source(&src).map_err(|(line, e)| format!("{}: {e}", locate(line)))?;
    if module.entry_points.is_empty() {
        return Err(format!("{}: no entry points", locate(None)));
    }
    Ok(())
}

#[test]
fn every_shader_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wgsl"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no shaders found in {}", dir.display());
    let in_composed = |p: &Path| COMPOSED.iter().any(|c| c.iter().any(|name| p.ends_with(name)));
    let mut shaders: Vec<Vec<&Path>> = files.iter().filter(|p| !in_composed(p)).map(|p| vec![p.as_path()]).collect();
    let composed: Vec<Vec<std::path::PathBuf>> =
        COMPOSED.iter().map(|c| c.iter().map(|n| dir.join(n)).collect()).collect();
    shaders.extend(composed.iter().map(|c| c.iter().map(|p| p.as_path()).collect()));
    let errors: Vec<String> = shaders.iter().filter_map(|parts| validate(parts).err()).collect();
    for f in &files {
        eprintln!("checked {}", f.display());
    }
    assert!(errors.is_empty(), "{} of {} shaders failed:\n{}", errors.len(), shaders.len(), errors.join("\n"));
}

/// Every block format's build of every block kernel, as the lane creates it (tables emitted from
/// `src/formats/tables.rs` + `shaders/dequant/common.wgsl` + the format's decoder + the body).
#[test]
fn every_block_format_build_validates() {
    use fovea::backend::wgpu::formats::{BlockKernel, block_shader_source};
    use fovea::backend::{Precision, WeightFormat};
    let mut errors = Vec::new();
    let mut built = 0;
    for format in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
        let kernels = BlockKernel::all().flat_map(|k| [Precision::Exact, Precision::Fast].map(|p| (k, p)));
        for (kernel, precision) in kernels.filter(|&(k, p)| k.builds(format, p)) {
            let (label, src) =
                block_shader_source(format, kernel, precision).unwrap_or_else(|| panic!("{format}: no build"));
            built += 1;
            match validate_source(&src) {
                Ok(m) if m.entry_points.is_empty() => errors.push(format!("{label}: no entry points")),
                Ok(m) => {
                    // WebGPU's default maxStorageBuffersPerShaderStage (lavapipe allows 32); the
                    // module's count bounds each entry point's, table buffer included.
                    let storage = m
                        .global_variables
                        .iter()
                        .filter(|(_, g)| matches!(g.space, naga::AddressSpace::Storage { .. }))
                        .count();
                    if storage > 8 {
                        errors.push(format!("{label}: {storage} storage buffers, more than 8"));
                    }
                    eprintln!("checked {label}: {storage} storage buffers");
                }
                Err((line, e)) => errors.push(format!("{label}, line {line:?} of the build: {e}")),
            }
        }
    }
    assert_eq!(
        built,
        (2 * 2 + 2 * 2 + 1 + 1) * 15 + 3,
        "15 block formats x (2 modules (linear on FMA tiles, lm) x 2 precisions, rows with each reduction \
         and each row bound (f32 operands in both precisions), linear on cooperative tiles and the f16 copy in fast \
         precision), and the int8 experts of Q8_0, Q2_K and IQ2_XXS in fast precision"
    );
    assert!(errors.is_empty(), "{} of {built} block builds failed:\n{}", errors.len(), errors.join("\n"));
}

/// A backend a module is translated for, as wgpu 30's hal drives naga for it.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// Metal: wgpu-hal picks the newest MSL the OS has (2.4 is macOS 12 / iOS 15); naga gates only
    /// ray queries (2.4), packed 8-bit dot products (2.1) and per-vertex inputs (4.0) on it.
    Msl(u8, u8),
    /// DX12: with wgpu's default compiler (`Dx12Compiler::Auto`) and no dxcompiler.dll, FXC and
    /// shader model 5.1, where wgpu exposes no SHADER_F16; with DXC, the device's model, at
    /// least 6.2 wherever SHADER_F16 is exposed.
    Hlsl(naga::back::hlsl::ShaderModel),
    /// Vulkan, SPIR-V 1.3 or newer as wgpu-hal asks for with subgroups: the cooperative-matrix
    /// builds only.
    Spv,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Msl(major, minor) => write!(f, "MSL {major}.{minor}"),
            Target::Hlsl(sm) => write!(f, "HLSL {}", sm.to_str()),
            Target::Spv => write!(f, "SPIR-V"),
        }
    }
}

/// The targets of a build: every module to MSL 2.4 and HLSL SM 6.2; those a device without
/// SHADER_F16 builds also to SM 5.1 (FXC), but for the subgroup builds; the cooperative-matrix
/// builds to SPIR-V only.
fn targets(needs_f16: bool, needs_subgroup: bool, needs_coop: bool) -> Vec<Target> {
    use naga::back::hlsl::ShaderModel;
    if needs_coop {
        return vec![Target::Spv];
    }
    let mut t = vec![Target::Msl(2, 4), Target::Hlsl(ShaderModel::V6_2)];
    // wave intrinsics need shader model 6.0: under FXC wgpu exposes no SUBGROUP
    if !needs_f16 && !needs_subgroup {
        t.push(Target::Hlsl(ShaderModel::V5_1));
    }
    t
}

/// The resources entry point `ep` of `module` uses, in binding order (wgpu derives the
/// pipeline's bind group layout from exactly these), each with whether it is a uniform buffer
/// and whether it is written.
fn used_resources(
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    ep: usize,
) -> Result<Vec<(naga::ResourceBinding, bool, bool)>, String> {
    let fun = info.get_entry_point(ep);
    let mut used = Vec::new();
    for (h, g) in module.global_variables.iter() {
        if fun[h].is_empty() {
            continue;
        }
        let Some(binding) = g.binding else { continue };
        let (uniform, writable) = match g.space {
            naga::AddressSpace::Uniform => (true, false),
            naga::AddressSpace::Storage { access } => (false, access.contains(naga::StorageAccess::STORE)),
            other => return Err(format!("binding {binding:?} in {other:?}, not a buffer")),
        };
        used.push((binding, uniform, writable));
    }
    used.sort_by_key(|(b, ..)| (b.group, b.binding));
    Ok(used)
}

/// Whether entry point `ep` reads immediate data (`var<immediate>`).
fn uses_immediates(module: &naga::Module, info: &naga::valid::ModuleInfo, ep: usize) -> bool {
    let fun = info.get_entry_point(ep);
    module.global_variables.iter().any(|(h, g)| g.space == naga::AddressSpace::Immediate && !fun[h].is_empty())
}

/// Translate entry point `ep` (its module already specialised to it by `process_overrides`) for
/// `target`, with the binding maps and options wgpu-hal builds for an auto-layout compute
/// pipeline (create_pipeline_layout / load_shader of its metal and dx12 backends): bounds checks
/// on (the lane's modules are checked), workgroup memory not zero-initialised (the lane's
/// `zero_initialize_workgroup_memory: false`), every used binding mapped, none faked.
fn translate(
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    ep: usize,
    target: Target,
) -> Result<String, String> {
    let entry = &module.entry_points[ep];
    let resources = used_resources(module, info, ep)?;
    match target {
        Target::Msl(major, minor) => {
            use naga::back::msl;
            let mut map = msl::EntryPointResources::default();
            let mut slot: msl::Slot = 0;
            for &(binding, _, writable) in &resources {
                let target = msl::BindTarget { buffer: Some(slot), mutable: writable, ..Default::default() };
                map.resources.insert(binding, target);
                slot += 1;
            }
            // The immediate data's buffer, after the bindings, where the entry point has any.
            if uses_immediates(module, info, ep) {
                map.immediates_buffer = Some(slot);
                slot += 1;
            }
            // The buffer of runtime-array lengths, after those (wgpu sets it aside whenever the
            // layout has a storage buffer).
            if resources.iter().any(|&(_, uniform, _)| !uniform) {
                map.sizes_buffer = Some(slot);
            }
            let check = naga::proc::BoundsCheckPolicy::Restrict;
            let options = msl::Options {
                lang_version: (major, minor),
                per_entry_point_map: [(entry.name.clone(), map)].into_iter().collect(),
                fake_missing_bindings: false,
                bounds_check_policies: naga::proc::BoundsCheckPolicies {
                    index: check,
                    buffer: check,
                    image_load: check,
                    binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
                },
                zero_initialize_workgroup_memory: false,
                force_loop_bounding: true,
                ..Default::default()
            };
            let pipeline = msl::PipelineOptions {
                entry_point: Some((entry.stage, entry.name.clone())),
                vertex_pulling_transform: true,
                ..Default::default()
            };
            let (src, tinfo) = msl::write_string(module, info, &options, &pipeline).map_err(|e| e.to_string())?;
            // A missing or mismatched binding skips the entry point instead of failing the write.
            match tinfo.entry_point_names.first() {
                Some(Ok(_)) => Ok(src),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("no entry point written".into()),
            }
        }
        Target::Spv => {
            use naga::back::spv;
            let options = spv::Options {
                lang_version: (1, 3),
                flags: spv::WriterFlags::empty(),
                zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
                ..Default::default()
            };
            let pipeline = spv::PipelineOptions { shader_stage: entry.stage, entry_point: entry.name.clone() };
            let words = spv::write_vec(module, info, &options, Some(&pipeline)).map_err(|e| e.to_string())?;
            Ok(format!("{} SPIR-V words", words.len()))
        }
        Target::Hlsl(shader_model) => {
            use naga::back::hlsl;
            let mut options = hlsl::Options {
                shader_model,
                fake_missing_bindings: false,
                zero_initialize_workgroup_memory: false,
                restrict_indexing: true,
                force_loop_bounding: true,
                ..Default::default()
            };
            // The immediate data as root constants at the first constant-buffer register, where
            // the entry point has any; then registers per class in binding order, space 0; then
            // wgpu's special constants (num_workgroups, first vertex/instance) at the next
            // constant-buffer register.
            let (mut cbv, mut srv, mut uav) = (0, 0, 0);
            if uses_immediates(module, info, ep) {
                options.immediates_target = Some(hlsl::BindTarget { register: 0, ..Default::default() });
                cbv += 1;
            }
            for &(binding, uniform, writable) in &resources {
                let counter = if uniform {
                    &mut cbv
                } else if writable {
                    &mut uav
                } else {
                    &mut srv
                };
                let target = hlsl::BindTarget { register: *counter, restrict_indexing: uniform, ..Default::default() };
                options.binding_map.insert(binding, target);
                *counter += 1;
            }
            options.special_constants_binding = Some(hlsl::BindTarget { register: cbv, ..Default::default() });
            let pipeline = hlsl::PipelineOptions { entry_point: Some((entry.stage, entry.name.clone())) };
            let mut src = String::new();
            let reflection = hlsl::Writer::new(&mut src, &options, &pipeline)
                .write(module, info, None)
                .map_err(|e| e.to_string())?;
            match reflection.entry_point_names.first() {
                Some(Ok(_)) => Ok(src),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("no entry point written".into()),
            }
        }
    }
}

/// What a compute pipeline may use on every Metal and DX12 device wgpu 30 exposes: 32 KiB of
/// workgroup memory (D3D12's limit; Metal reports 32 KiB, 16 KiB on the oldest families) and
/// 1024 invocations per workgroup (both; some old Metal families 512). The lane asks the adapter
/// for its own limits, so a kernel sized to a Vulkan device's larger ones would build there and
/// fail here.
fn within_metal_and_dx12_limits(
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    ep: usize,
) -> Result<(), String> {
    let fun = info.get_entry_point(ep);
    let shared: u32 = module
        .global_variables
        .iter()
        .filter(|(h, g)| g.space == naga::AddressSpace::WorkGroup && !fun[*h].is_empty())
        .map(|(_, g)| module.types[g.ty].inner.size(module.to_ctx()))
        .sum();
    let invocations: u32 = module.entry_points[ep].workgroup_size.iter().product();
    if shared > 32 << 10 {
        return Err(format!("{shared} bytes of workgroup memory, more than 32768"));
    }
    if invocations > 1024 {
        return Err(format!("{invocations} invocations per workgroup, more than 1024"));
    }
    Ok(())
}

/// Every module the lane builds, each entry point, to every target; failures name
/// `build, entry point: backend: error`.
#[test]
fn every_build_translates_to_msl_and_hlsl() {
    let start = std::time::Instant::now();
    let builds = fovea::backend::wgpu::shader_builds().expect("the lane's shader builds");

    // Nothing in shaders/ escapes: each file's text is in some build.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut pending = vec![dir.clone()];
    let mut files = 0;
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                pending.push(p);
            } else if p.extension().is_some_and(|x| x == "wgsl") {
                let text = std::fs::read_to_string(&p).unwrap();
                assert!(builds.iter().any(|b| b.source.contains(&text)), "{}: in no build of the lane", p.display());
                files += 1;
            }
        }
    }

    let mut errors = Vec::new();
    let (mut modules, mut pipelines, mut translations) = (0, 0, [0usize; 3]);
    for b in &builds {
        // The capabilities wgpu validates the lane's modules with: the lane always requests
        // IMMEDIATES (every dispatch's parameters), SHADER_F16 and SUBGROUP where the adapter has
        // them, and only builds that need one may use it.
        let mut caps = Capabilities::IMMEDIATES;
        if b.needs_f16 {
            caps |= Capabilities::SHADER_FLOAT16;
        }
        if b.needs_subgroup {
            caps |= Capabilities::SUBGROUP;
        }
        if b.needs_coop {
            caps |= Capabilities::COOPERATIVE_MATRIX;
        }
        let module = match naga::front::wgsl::parse_str(&b.source) {
            Ok(m) => m,
            Err(e) => {
                errors.push(format!("{}: parse: {}", b.label, e.emit_to_string(&b.source)));
                continue;
            }
        };
        let info = match Validator::new(ValidationFlags::all(), caps).validate(&module) {
            Ok(i) => i,
            Err(e) => {
                let with = if b.needs_f16 { "with SHADER_F16" } else { "without SHADER_F16" };
                errors.push(format!("{}: validation {with}: {}", b.label, e.emit_to_string(&b.source)));
                continue;
            }
        };
        modules += 1;
        let constants: naga::back::PipelineConstants = b.constants.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        for ep in &module.entry_points {
            pipelines += 1;
            let at = format!("{}, entry point {}", b.label, ep.name);
            // As hal does per pipeline: the overrides take the pipeline's constants and the module
            // keeps only this entry point.
            let (m, i) = match naga::back::pipeline_constants::process_overrides(
                &module,
                &info,
                Some((ep.stage, &ep.name)),
                &constants,
            ) {
                Ok(x) => x,
                Err(e) => {
                    errors.push(format!("{at}: overrides: {e}"));
                    continue;
                }
            };
            let Some(idx) = m.entry_points.iter().position(|e| e.name == ep.name) else {
                errors.push(format!("{at}: lost by process_overrides"));
                continue;
            };
            // a cooperative-matrix build runs only where wgpu has 16×16×16 f16 matrices: Vulkan
            // (Metal's are 8×8, and `targets` gives it no MSL or HLSL), where the lane checks the
            // adapter's own workgroup memory before it takes one past 32 KiB (attention.rs,
            // `attention_coop_wide`)
            if !b.needs_coop
                && let Err(e) = within_metal_and_dx12_limits(&m, &i, idx)
            {
                errors.push(format!("{at}: Metal/DX12 limits: {e}"));
            }
            for target in targets(b.needs_f16, b.needs_subgroup, b.needs_coop) {
                // naga's backends panic on some things they cannot write (MSL on f64: seen; the
                // HLSL writer has `unimplemented!` for cooperative-matrix stores): a panic is that
                // build's failure, reported with the others, not the test's end.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| translate(&m, &i, idx, target)));
                match run {
                    Ok(Ok(_)) => {
                        translations[match target {
                            Target::Msl(..) => 0,
                            Target::Hlsl(_) => 1,
                            Target::Spv => 2,
                        }] += 1
                    }
                    Ok(Err(e)) => errors.push(format!("{at}: {target}: {e}")),
                    Err(p) => {
                        let msg = p
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| p.downcast_ref::<&str>().copied())
                            .unwrap_or("(no message)");
                        errors.push(format!("{at}: {target}: naga panicked: {msg}"));
                    }
                }
            }
        }
        eprintln!("translated {} ({} entry points)", b.label, module.entry_points.len());
    }
    eprintln!(
        "{} builds ({} need SHADER_F16, {} SUBGROUP, {} cooperative matrices), {modules} modules, {pipelines} \
         (module, entry point) pipelines: {} MSL, {} HLSL and {} SPIR-V translations; {files} shader files covered; \
         {:.2} s",
        builds.len(),
        builds.iter().filter(|b| b.needs_f16).count(),
        builds.iter().filter(|b| b.needs_subgroup).count(),
        builds.iter().filter(|b| b.needs_coop).count(),
        translations[0],
        translations[1],
        translations[2],
        start.elapsed().as_secs_f64()
    );
    assert!(errors.is_empty(), "{} failures:\n{}", errors.len(), errors.join("\n"));
}

/// The tiled GEMMs' workgroup memory, summed over each build's workgroup variables with naga's
/// layouter, stays within what the lane asks of the adapter: the cooperative tiles within
/// `Tiles::COOP_WORKGROUP_BYTES` (checked in `coop_tiles_fit`), the FMA tiles within WebGPU's
/// least limit. Each bound is also reached by some build, so neither constant can drift loose.
/// And each build's output tile is as wide as the lane's dispatch grid takes it
/// (`Tiles::columns`, the body's `const BN`): wider columns would go unwritten.
#[test]
fn tile_builds_fit_their_workgroup_memory() {
    use fovea::backend::wgpu::Tiles;
    let builds = fovea::backend::wgpu::shader_builds().expect("the lane's shader builds");
    for (body, bound, tiles) in [
        ("tile_coop.wgsl", Tiles::COOP_WORKGROUP_BYTES, Tiles::Coop),
        ("tile_fma.wgsl", Tiles::FMA_WORKGROUP_BYTES, Tiles::Fma),
    ] {
        let mut largest = 0;
        for b in builds.iter().filter(|b| b.label.contains(body)) {
            let module = naga::front::wgsl::parse_str(&b.source).unwrap_or_else(|e| panic!("{}: {e}", b.label));
            let mut layouter = naga::proc::Layouter::default();
            layouter.update(module.to_ctx()).unwrap_or_else(|e| panic!("{}: {e}", b.label));
            let bytes: u32 = module
                .global_variables
                .iter()
                .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
                .map(|(_, g)| layouter[g.ty].size)
                .sum();
            assert!(bytes <= bound, "{}: {bytes} bytes of workgroup memory, more than {bound}", b.label);
            let bn = module.constants.iter().find(|(_, c)| c.name.as_deref() == Some("BN")).map(|(_, c)| match module
                .global_expressions[c.init]
            {
                naga::Expression::Literal(naga::Literal::U32(v)) => v as usize,
                ref e => panic!("{}: BN is {e:?}, not a u32 literal", b.label),
            });
            assert_eq!(bn, Some(tiles.columns()), "{}: the output tile's width (const BN)", b.label);
            largest = largest.max(bytes);
        }
        assert_eq!(largest, bound, "{body}: the largest build's workgroup memory");
    }
}
