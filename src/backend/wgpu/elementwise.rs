//! The elementwise ops of `shaders/elementwise.wgsl`, one thread per output element.

use super::{Output, Shader, WgpuBackend, WgpuTensor};
use crate::backend::{DType, checks};
use crate::error::Result;

impl WgpuBackend {
    /// a, b `[n, d]` → `[n, d]`.
    pub(super) fn add(&self, a: &WgpuTensor, b: &WgpuTensor) -> Result<WgpuTensor> {
        checks::add(a, b)?;
        let out = Output { binding: 3, shape: a.shape.clone(), dtype: DType::F32 };
        self.per_element(Shader::Elementwise, "add", &[("a", 1, a), ("b", 2, b)], out, &[])
    }

    /// x `[n, 2h]` → `[n, h]`, gate = first half.
    pub(super) fn swiglu(&self, x: &WgpuTensor) -> Result<WgpuTensor> {
        let (n, h) = checks::swiglu(x)?;
        let out = Output { binding: 3, shape: vec![n, h], dtype: DType::F32 };
        self.per_element(Shader::Elementwise, "swiglu", &[("x", 1, x)], out, &[h as u32])
    }

    /// `[n, d]` → `[n, d]`, exact (erf) GELU.
    pub(super) fn gelu_erf(&self, x: &WgpuTensor) -> Result<WgpuTensor> {
        checks::gelu_erf(x)?;
        let out = Output { binding: 3, shape: x.shape.clone(), dtype: DType::F32 };
        self.per_element(Shader::Elementwise, "gelu_erf", &[("x", 1, x)], out, &[])
    }
}
