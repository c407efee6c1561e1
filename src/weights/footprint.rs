//! What a checkpoint's parameters take once loaded, next to their bytes in the files, from
//! headers only (nothing is uploaded): the "device bytes ≤ 1.05 × file bytes" of the weight
//! formats, printed by `fovea inspect`.
//!
//! Each parameter the graph reads counts once, as the graph reads it (the manifests say how):
//! - a weight matrix in the format and shape its source hands to the lanes (an official FP8/FP4
//!   matrix re-laid row-local, a GGUF expert as its rows of the stacked tensor), sized per lane
//!   by [`Backend::weight_alloc_bytes`], the function each lane's `upload_weight` sizes its
//!   allocation with: the CPU and CUDA lanes keep the rows as stored, the wgpu lane pads each
//!   row to 4 bytes;
//! - a vector (norm, bias, sink, `ape`, sentinel) or `tid2eid` as 4-byte f32 / i32 values, as
//!   every lane uploads them.
//!
//! The file bytes of a quantized safetensors matrix include its `.scale`. Not in the files, so
//! not here: what the graph derives at load (RoPE frequency tables, the zero text bias of hash
//! layers, the router bias rows it duplicates, the vision tower's own copy of the sentinels),
//! a few KiB.

use std::collections::BTreeMap;
use std::fmt;

use super::Checkpoint;
use super::gguf_lm::GgufLm;
use super::gguf_vision::Mmproj;
use super::lm::{ExpectedLm, SENTINELS, lm_manifest};
use super::vision::{Expected, vision_manifest};
use crate::backend::cpu::CpuBackend;
use crate::backend::wgpu::WgpuBackend;
use crate::backend::{Backend, WeightFormat};
use crate::config::{LmConfig, VisionConfig};
use crate::error::{Error, Result};
use crate::model::ParamSource;

/// One line of the table: parameters loaded alike, their bytes in the files and on each lane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FootprintRow {
    pub tensors: usize,
    pub file_bytes: u64,
    /// On the CPU and CUDA lanes (the same sizing; a unit test holds them equal).
    pub cpu_cuda_bytes: u64,
    pub wgpu_bytes: u64,
}

impl FootprintRow {
    fn add(&mut self, o: &FootprintRow) {
        self.tensors += o.tensors;
        self.file_bytes += o.file_bytes;
        self.cpu_cuda_bytes += o.cpu_cuda_bytes;
        self.wgpu_bytes += o.wgpu_bytes;
    }

    /// The larger lane's bytes over the file bytes (1 for nothing at all).
    pub fn ratio(&self) -> f64 {
        let loaded = self.cpu_cuda_bytes.max(self.wgpu_bytes);
        if self.file_bytes == 0 {
            if loaded == 0 { 1.0 } else { f64::INFINITY }
        } else {
            loaded as f64 / self.file_bytes as f64
        }
    }
}

/// Per loaded weight format, and for the f32 / i32 vectors, what loading takes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub matrices: BTreeMap<WeightFormat, FootprintRow>,
    pub vectors: FootprintRow,
}

impl Footprint {
    fn matrix(&mut self, format: WeightFormat, rows: usize, cols: usize, file_bytes: u64) {
        self.matrices.entry(format).or_default().add(&FootprintRow {
            tensors: 1,
            file_bytes,
            cpu_cuda_bytes: CpuBackend::weight_alloc_bytes(format, rows, cols),
            wgpu_bytes: WgpuBackend::weight_alloc_bytes(format, rows, cols),
        });
    }

    fn vector(&mut self, numel: usize, file_bytes: u64) {
        let bytes = numel as u64 * 4;
        self.vectors.add(&FootprintRow { tensors: 1, file_bytes, cpu_cuda_bytes: bytes, wgpu_bytes: bytes });
    }

    /// Both parts of a model held in two files (a GGUF text file and its mmproj).
    pub fn merge(mut self, other: Footprint) -> Footprint {
        for (f, r) in other.matrices {
            self.matrices.entry(f).or_default().add(&r);
        }
        self.vectors.add(&other.vectors);
        self
    }

    /// Every weight matrix.
    pub fn matrix_total(&self) -> FootprintRow {
        let mut t = FootprintRow::default();
        self.matrices.values().for_each(|r| t.add(r));
        t
    }

    /// Everything.
    pub fn total(&self) -> FootprintRow {
        let mut t = self.matrix_total();
        t.add(&self.vectors);
        t
    }
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "loaded size (from headers; cpu and cuda keep the rows as stored, wgpu pads rows to 4 bytes):")?;
        writeln!(
            f,
            "  {:<20} {:>7} {:>14} {:>14} {:>14} {:>7}",
            "loaded as", "tensors", "file bytes", "cpu/cuda bytes", "wgpu bytes", "ratio"
        )?;
        let line = |f: &mut fmt::Formatter<'_>, label: &str, r: &FootprintRow| {
            writeln!(
                f,
                "  {label:<20} {:>7} {:>14} {:>14} {:>14} {:>7.4}",
                r.tensors,
                r.file_bytes,
                r.cpu_cuda_bytes,
                r.wgpu_bytes,
                r.ratio()
            )
        };
        for (format, r) in &self.matrices {
            line(f, format.name(), r)?;
        }
        line(f, "f32/i32 vectors", &self.vectors)?;
        line(f, "matrices", &self.matrix_total())?;
        line(f, "total", &self.total())
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The language model's entries of [`lm_manifest`] that `has` (the optional `bias_vl` may be
/// absent).
fn lm_entries(cfg: &LmConfig, has: impl Fn(&str) -> bool) -> Result<Vec<ExpectedLm>> {
    Ok(lm_manifest(cfg)?.into_iter().filter(|e| e.required || has(&e.name)).collect())
}

/// A safetensors checkpoint: the language model of `lm` (when config.json has one), the vision
/// tower when the checkpoint has a vision config, else the image sentinels the LM reads when
/// present. An official FP8/FP4 matrix is sized by its re-lay plan (headers only).
pub fn of_checkpoint(ckpt: &Checkpoint, lm: Option<&LmConfig>) -> Result<Footprint> {
    let mut fp = Footprint::default();
    let stored = |name: &str| ckpt.stored_bytes(name).ok_or_else(|| Error::tensor(name, "not in the checkpoint"));
    if let Some(cfg) = lm {
        for e in lm_entries(cfg, |n| ckpt.contains(n))? {
            if e.matrix {
                let (format, rows, cols) = ckpt.weight_layout(&e.name)?;
                fp.matrix(format, rows, cols, stored(&e.name)?);
            } else {
                fp.vector(numel(&e.shape), stored(&e.name)?);
            }
        }
    }
    match ckpt.vision_config() {
        Some(vc) => {
            for e in vision_manifest(vc) {
                add_vision(&mut fp, &e, stored(&e.name)?, |name| ckpt.weight_layout(name))?;
            }
        }
        None if lm.is_some() => {
            for name in SENTINELS.iter().filter(|n| ckpt.contains(n)) {
                let m = ckpt.meta(name).ok_or_else(|| Error::tensor(*name, "not in the checkpoint"))?;
                fp.vector(m.numel(), stored(name)?);
            }
        }
        None => {}
    }
    Ok(fp)
}

/// One vision parameter: every 2-D one is a matrix (`VisionModel::load`), the rest vectors.
fn add_vision(
    fp: &mut Footprint,
    e: &Expected,
    file_bytes: u64,
    layout: impl Fn(&str) -> Result<(WeightFormat, usize, usize)>,
) -> Result<()> {
    if e.shape.len() == 2 {
        let (format, rows, cols) = layout(&e.name)?;
        fp.matrix(format, rows, cols, file_bytes);
    } else {
        fp.vector(e.numel(), file_bytes);
    }
    Ok(())
}

/// A text GGUF's language model: each matrix as `GgufLm::matrix` gives it (borrowed from the
/// map, nothing read; a routed expert is its rows of the stacked tensor).
pub fn of_gguf_lm(lm: &GgufLm) -> Result<Footprint> {
    let mut fp = Footprint::default();
    for e in lm_entries(lm.config(), |n| lm.has(n))? {
        let file_bytes = lm.stored_bytes(&e.name)?;
        if e.matrix {
            let w = lm.matrix(&e.name)?;
            fp.matrix(w.format, w.rows, w.cols, file_bytes);
        } else {
            fp.vector(numel(&e.shape), file_bytes);
        }
    }
    Ok(fp)
}

/// An mmproj's vision tower and sentinels (a stacked parameter, `mlp.w1` or a split
/// `attn.wqkv`, is concatenated as the loader does: a transient copy of those matrices).
pub fn of_mmproj(m: &Mmproj) -> Result<Footprint> {
    let mut fp = Footprint::default();
    let cfg: &VisionConfig = m.config();
    for e in vision_manifest(cfg) {
        add_vision(&mut fp, &e, m.stored_bytes(&e.name)?, |name| {
            let w = m.matrix(name)?;
            Ok((w.format, w.rows, w.cols))
        })?;
    }
    Ok(fp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::CudaBackend;

    #[test]
    fn cpu_and_cuda_size_weights_alike_and_wgpu_pads_rows_to_words() {
        for format in WeightFormat::ALL {
            let cols = 3 * format.block_elems();
            let (cpu, cuda) =
                (CpuBackend::weight_alloc_bytes(format, 5, cols), CudaBackend::weight_alloc_bytes(format, 5, cols));
            assert_eq!(cpu, cuda, "{format}");
            assert_eq!(cpu, 5 * format.row_bytes(cols) as u64, "{format}");
            let wgpu = WgpuBackend::weight_alloc_bytes(format, 5, cols);
            assert!(wgpu >= cpu && wgpu - cpu <= 5 * 3 && wgpu % 4 == 0, "{format}: {wgpu} vs {cpu}");
        }
    }

    #[test]
    fn rows_add_up_and_the_ratio_compares_the_larger_lane() {
        let mut fp = Footprint::default();
        // IQ1_S: 50 bytes a row of 256 values, padded to 52 on wgpu
        fp.matrix(WeightFormat::IQ1_S, 2, 256, 100);
        fp.vector(3, 6);
        let t = fp.total();
        assert_eq!((t.tensors, t.file_bytes, t.cpu_cuda_bytes, t.wgpu_bytes), (2, 106, 112, 116));
        assert_eq!(fp.matrix_total().ratio(), 104.0 / 100.0);
        assert_eq!(FootprintRow::default().ratio(), 1.0);
    }
}
