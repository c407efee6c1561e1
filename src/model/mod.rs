//! The model graph, written once against [`crate::backend::Backend`].

pub mod lm;
pub mod vision;

use crate::backend::HostWeight;
use crate::error::Result;

/// Where the graph reads its parameters from: a checkpoint on disk, or a test's synthetic
/// weights. Names are the official Hugging Face tensor names.
pub trait ParamSource {
    /// A 2-D weight matrix `[out, in]` in its storage format (borrowed from the mmap if possible).
    fn matrix(&self, name: &str) -> Result<HostWeight<'_>>;
    /// A 1-D parameter (bias, norm weight, sentinel) converted to f32.
    fn vector(&self, name: &str) -> Result<Vec<f32>>;
    /// An integer tensor (e.g. `tid2eid`, I64 in the checkpoint): its shape and values.
    fn integers(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        Err(crate::error::Error::tensor(name, "this parameter source holds no integer tensors"))
    }
    /// Whether a tensor of this name exists (for optional parameters such as `bias_vl`).
    fn has(&self, name: &str) -> bool {
        self.vector(name).is_ok()
    }
}

impl ParamSource for crate::weights::Checkpoint {
    fn matrix(&self, name: &str) -> Result<HostWeight<'_>> {
        self.tensor(name)?.into_weight(name)
    }
    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        self.tensor(name)?.to_f32_vec()
    }
    fn integers(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let t = self.tensor(name)?;
        Ok((t.shape.clone(), t.to_i64_vec()?))
    }
    fn has(&self, name: &str) -> bool {
        self.contains(name)
    }
}
