//! Validates every `shaders/*.wgsl` with naga (parse + full validation, f16 and subgroups
//! allowed). New files are picked up automatically; errors print as `file:line`. A few files are
//! parts that the lane concatenates into one shader (`COMPOSED`, the same order as in
//! `src/backend/wgpu`): those are validated as the composed shader, and an error line is mapped
//! back to the part it falls in. The block-format kernels (`shaders/dequant/`, built per format
//! with emitted lookup tables) are validated as the lane builds them, one per (kernel, format).

use std::path::Path;

use naga::valid::{Capabilities, ValidationFlags, Validator};

/// Shaders the lane builds from several files, in concatenation order.
const COMPOSED: &[&[&str]] = &[&["linear_packed.wgsl", "linear_tile.wgsl"], &["linear_f16.wgsl", "linear_tile.wgsl"]];

/// Parse and validate one WGSL source; errors carry the 1-based line (when naga gives one).
fn validate_source(src: &str) -> Result<naga::Module, (Option<u32>, String)> {
    let module = naga::front::wgsl::parse_str(src)
        .map_err(|e| (e.location(src).map(|l| l.line_number), e.emit_to_string(src)))?;
    Validator::new(ValidationFlags::all(), Capabilities::SHADER_FLOAT16 | Capabilities::SUBGROUP)
        .validate(&module)
        .map_err(|e| (e.location(src).map(|l| l.line_number), e.emit_to_string(src)))?;
    Ok(module)
}

/// Validate the concatenation of `parts`; on error name `part:line` of the offending line.
fn validate(parts: &[&Path]) -> Result<(), String> {
    let mut src = String::new();
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
    use fovea::backend::WeightFormat;
    use fovea::backend::wgpu::formats::{BlockKernel, block_shader_source};
    let mut errors = Vec::new();
    let mut built = 0;
    for format in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
        for kernel in BlockKernel::ALL {
            let (label, src) = block_shader_source(format, kernel).unwrap_or_else(|| panic!("{format}: no build"));
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
    assert_eq!(built, 2 * 15, "15 block formats x 2 kernels");
    assert!(errors.is_empty(), "{} of {built} block builds failed:\n{}", errors.len(), errors.join("\n"));
}
