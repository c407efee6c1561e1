//! NVRTC's output kept on disk between processes. A process compiles each kernel unit it uses at
//! first use (a q2 model needs some twenty units across its formats and both precisions); every
//! `fovea` start on CUDA paid that again. Here each unit's PTX is stored under a key that hashes
//! everything the compile depends on — the program text (cuda/common.cuh and the file, with the
//! unit's defines), the NVRTC options, the NVRTC version — so a changed kernel, option or
//! compiler is a new key and never meets stale PTX.
//!
//! - Where: `FOVEA_CACHE_DIR`, else `$XDG_CACHE_HOME/fovea`, else `$HOME/.cache/fovea`; the files
//!   go in its `cuda-ptx/`. `FOVEA_CACHE_DIR=off` turns the cache off.
//! - A file is `// fovea-ptx <checksum of the rest>` then the PTX, written to a temporary name and
//!   renamed, so a reader sees a whole file or none; a file whose checksum does not match (cut
//!   short, edited) is ignored and overwritten by the next compile.
//! - The cache never fails a run: a directory that cannot be made or written is reported once on
//!   stderr and the process goes on compiling in memory; PTX read from it that the driver refuses
//!   is deleted and compiled again (`CudaBackend::func_in`). Builds with `FOVEA_NVRTC_OPTIONS`
//!   bypass it (an option can bring in files the key cannot see).
//! - Nothing prunes it: a changed kernel leaves its old files behind (a few hundred KiB a unit);
//!   deleting the directory is always safe.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Once;

const HEADER: &str = "// fovea-ptx ";

/// 64-bit FNV-1a: stable across Rust releases and processes (std's hashers are not promised to
/// be), which a key that outlives the process needs.
pub(super) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        // each part's length first, so ("ab", "c") and ("a", "bc") differ
        for b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The cache's directory, or `None` when it is turned off or no home is known.
pub(super) fn dir_from_env() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let base = match var("FOVEA_CACHE_DIR") {
        Some(v) if v == "off" => return None,
        Some(v) => PathBuf::from(v),
        None => var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))?
            .join("fovea"),
    };
    Some(base.join("cuda-ptx"))
}

/// The file of a unit: its source file's name (for a person reading the directory) and the key.
pub(super) fn path(dir: &Path, file: &str, key: u64) -> PathBuf {
    dir.join(format!("{}-{key:016x}.ptx", file.trim_end_matches(".cu")))
}

/// The PTX stored at `path`, if the file is there and whole.
pub(super) fn load(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let (first, ptx) = text.split_once('\n')?;
    let sum = u64::from_str_radix(first.strip_prefix(HEADER)?, 16).ok()?;
    // a NUL would make the driver's loader (a C string) panic inside cudarc
    (sum == fnv1a(&[ptx.as_bytes()]) && !ptx.contains('\0')).then(|| ptx.to_owned())
}

/// Keep `ptx` at `path`; a failure is reported once a process and otherwise ignored.
pub(super) fn store(path: &Path, ptx: &str) {
    if let Err(e) = try_store(path, ptx) {
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "fovea: cannot keep compiled CUDA kernels in {} ({e}); they are compiled again in each process \
                 (FOVEA_CACHE_DIR names another directory, =off stops trying)",
                path.parent().unwrap_or(path).display()
            )
        });
    }
}

fn try_store(path: &Path, ptx: &str) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("no directory"))?;
    std::fs::create_dir_all(dir)?;
    // a name of this process's own, so two processes compiling the same unit do not interleave
    let tmp =
        dir.join(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("ptx"), std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    let written = write!(f, "{HEADER}{:016x}\n{ptx}", fnv1a(&[ptx.as_bytes()])).and_then(|_| f.sync_all());
    drop(f);
    match written.and_then(|_| std::fs::rename(&tmp, path)) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fovea-ptx-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_stored_unit_loads_back_and_a_damaged_one_does_not() {
        let dir = scratch("roundtrip");
        let p = path(&dir, "linear.cu", 0x1234);
        assert_eq!(p.file_name().unwrap(), "linear-0000000000001234.ptx");
        assert_eq!(load(&p), None, "nothing stored yet");
        let ptx = ".version 8.8\n.target sm_90\n// a kernel\n";
        store(&p, ptx);
        assert_eq!(load(&p).as_deref(), Some(ptx));
        // cut short: the checksum no longer matches
        let whole = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, &whole[..whole.len() - 5]).unwrap();
        assert_eq!(load(&p), None);
        // one byte changed
        std::fs::write(&p, whole.replace("sm_90", "sm_80")).unwrap();
        assert_eq!(load(&p), None);
        // no header
        std::fs::write(&p, ptx).unwrap();
        assert_eq!(load(&p), None);
        // a NUL inside, checksum and all (the driver's loader takes a C string)
        store(&p, "ptx\0more");
        assert_eq!(load(&p), None);
        // overwritten whole by the next store
        store(&p, ptx);
        assert_eq!(load(&p).as_deref(), Some(ptx));
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_not_an_error() {
        let file = scratch("blocker");
        std::fs::write(&file, "a file where the directory would go").unwrap();
        let p = path(&file.join("cuda-ptx"), "norm.cu", 1);
        store(&p, "ptx"); // reports once, returns
        assert_eq!(load(&p), None);
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn the_key_sees_every_part_and_where_parts_end() {
        let k = fnv1a(&[b"program", b"--gpu-architecture=compute_90", b"13.0"]);
        assert_eq!(k, fnv1a(&[b"program", b"--gpu-architecture=compute_90", b"13.0"]));
        assert_ne!(k, fnv1a(&[b"program", b"--gpu-architecture=compute_80", b"13.0"]));
        assert_ne!(k, fnv1a(&[b"program", b"--gpu-architecture=compute_90", b"13.1"]));
        assert_ne!(k, fnv1a(&[b"program ", b"--gpu-architecture=compute_90", b"13.0"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }
}
