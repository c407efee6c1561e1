//! Data movement on `shaders/copy.wgsl`, one thread per output element: `slice_cols`,
//! `gather_rows`, `unfold` and `concat_rows`.
//!
//! `gather_rows` bounds-checks every index in the shader: an index outside `0..m` yields a row of
//! NaN (loud downstream) and never reads out of bounds.

use super::{Output, Shader, WgpuBackend, WgpuTensor};
use crate::backend::{DType, DeviceTensor, checks};
use crate::error::Result;

impl WgpuBackend {
    /// x `[n, d]` → `[n, len]`.
    pub(super) fn slice_cols(&self, x: &WgpuTensor, start: usize, len: usize) -> Result<WgpuTensor> {
        let (n, d) = checks::slice_cols(x, start, len)?;
        let out = Output { binding: 3, shape: vec![n, len], dtype: DType::F32 };
        self.per_element(Shader::Copy, "slice_cols", &[("x", 1, x)], out, &[len as u32, d as u32, start as u32])
    }

    /// `[n, d]`, `[m, d]` → `[n+m, d]` in one dispatch, either dtype's 4-byte words copied as
    /// bits: two buffer copies ended the compute pass the dispatches share (a decode step
    /// concatenates each layer's kept keys and compressor rows with the step's new ones).
    pub(super) fn concat_rows(&self, a: &WgpuTensor, b: &WgpuTensor) -> Result<WgpuTensor> {
        checks::concat_rows(a, b)?;
        let out = Output { binding: 6, shape: vec![a.rows() + b.rows(), a.cols()], dtype: a.dtype };
        self.per_element(Shader::Copy, "concat_rows", &[("a", 4, a), ("b", 5, b)], out, &[a.numel() as u32])
    }

    /// src `[m, d]`, idx i32 `[n]` → `[n, d]`; an index outside `0..m` yields a row of NaN.
    pub(super) fn gather_rows(&self, src: &WgpuTensor, idx: &WgpuTensor) -> Result<WgpuTensor> {
        let (m, d, n) = checks::gather_rows(src, idx)?;
        let out = Output { binding: 3, shape: vec![n, d], dtype: DType::F32 };
        self.per_element(Shader::Copy, "gather_rows", &[("src", 1, src), ("idx", 2, idx)], out, &[d as u32, m as u32])
    }

    /// x `[h·w, c]` → `[ceil(h/r)·ceil(w/r), c·r²]`.
    pub(super) fn unfold(&self, x: &WgpuTensor, h: usize, w: usize, r: usize) -> Result<WgpuTensor> {
        let c = checks::unfold(x, h, w, r)?;
        let (gh, gw) = (h.div_ceil(r), w.div_ceil(r));
        let out = Output { binding: 3, shape: vec![gh * gw, c * r * r], dtype: DType::F32 };
        let params = [c as u32, h as u32, w as u32, r as u32, gw as u32];
        self.per_element(Shader::Copy, "unfold", &[("x", 1, x)], out, &params)
    }
}
