//! `rms_norm` and `hc_pre_norm` on `shaders/norm.wgsl`: one workgroup per row. (The language
//! model's per-head `rms_norm_heads` is an entry point of lm.wgsl: lm.rs.)

use super::{Shader, WgpuBackend, WgpuTensor, grid};
use crate::backend::{DType, checks};
use crate::error::Result;

impl WgpuBackend {
    /// x `[n, d]`, weight `[d]` → `[n, d]`.
    pub(super) fn rms_norm(&self, x: &WgpuTensor, weight: &WgpuTensor, eps: f32) -> Result<WgpuTensor> {
        const OP: &str = "rms_norm";
        let (n, d) = checks::rms_norm(x, weight)?;
        self.check_inputs(OP, [("x", x), ("weight", weight)])?;
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        if n == 0 || d == 0 {
            return Ok(y);
        }
        self.dispatch(
            Shader::Norm,
            OP,
            0,
            &[n as u32, d as u32, eps.to_bits()],
            &[(1, x.binding()), (2, weight.binding()), (3, y.binding())],
            grid(n),
        )?;
        Ok(y)
    }

    /// `rms_norm(hc_pre(X, w, hc), weight, eps)` in one dispatch: X `[n, hc·d]`, w `[n, c ≥ hc]`
    /// (its first hc columns), weight `[d]` → `[n, d]`; one workgroup per row.
    pub(super) fn hc_pre_norm(
        &self,
        x: &WgpuTensor,
        w: &WgpuTensor,
        hc: usize,
        weight: &WgpuTensor,
        eps: f32,
    ) -> Result<WgpuTensor> {
        const OP: &str = "hc_pre_norm";
        let (n, d, wc) = checks::hc_pre_norm(x, w, hc, weight)?;
        self.check_inputs(OP, [("x", x), ("w", w), ("weight", weight)])?;
        let y = self.alloc(OP, vec![n, d], DType::F32)?;
        if n == 0 || d == 0 {
            return Ok(y);
        }
        self.dispatch(
            Shader::Norm,
            OP,
            0,
            &[n as u32, d as u32, eps.to_bits(), hc as u32, wc as u32],
            &[(1, x.binding()), (2, weight.binding()), (3, y.binding()), (4, w.binding())],
            grid(n),
        )?;
        Ok(y)
    }
}
