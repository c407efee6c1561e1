//! Validates every `shaders/*.wgsl` with naga (parse + full validation, f16 and subgroups
//! allowed). New files are picked up automatically; errors print as `file:line`.

use std::path::Path;

use naga::valid::{Capabilities, ValidationFlags, Validator};

fn validate(path: &Path) -> Result<(), String> {
    let src = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let shown = path.display().to_string();
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string_with_path(&src, &shown))?;
    Validator::new(ValidationFlags::all(), Capabilities::SHADER_FLOAT16 | Capabilities::SUBGROUP)
        .validate(&module)
        .map_err(|e| e.emit_to_string_with_path(&src, &shown))?;
    if module.entry_points.is_empty() {
        return Err(format!("{shown}: no entry points"));
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
    let errors: Vec<String> = files.iter().filter_map(|p| validate(p).err()).collect();
    for f in &files {
        eprintln!("checked {}", f.display());
    }
    assert!(errors.is_empty(), "{} of {} shaders failed:\n{}", errors.len(), files.len(), errors.join("\n"));
}
