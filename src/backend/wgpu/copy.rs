//! Data movement: `slice_cols`, `gather_rows` and `unfold` on `shaders/copy.wgsl` (one thread per
//! output element), `concat_rows` by two buffer copies.
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

    /// `[n, d]`, `[m, d]` → `[n+m, d]` by two buffer copies.
    pub(super) fn concat_rows(&self, a: &WgpuTensor, b: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "concat_rows";
        checks::concat_rows(a, b)?;
        self.check_inputs(OP, [("a", a), ("b", b)])?;
        let y = self.alloc(OP, vec![a.rows() + b.rows(), a.cols()], a.dtype)?;
        self.with_encoder(|enc| {
            if a.bytes > 0 {
                enc.copy_buffer_to_buffer(&a.buf, a.offset, &y.buf, 0, a.bytes);
            }
            if b.bytes > 0 {
                enc.copy_buffer_to_buffer(&b.buf, b.offset, &y.buf, a.bytes, b.bytes);
            }
        });
        Ok(y)
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
