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
        self.weight(name)
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

/// Bytes of parameters read so far out of a checkpoint's total, for a progress bar while large
/// weights load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadProgress {
    pub done_bytes: u64,
    pub total_bytes: u64,
}

/// Prompt tokens prefilled so far out of the prompt's total, reported after each chunk of a
/// chunked prefill (and once before the first), for a progress bar on long prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillProgress {
    pub done_tokens: usize,
    pub total_tokens: usize,
    /// How many chunks the prompt is cut into ([`lm::chunk_plan`]).
    pub chunks: usize,
}

/// A checkpoint that reports each parameter's bytes as the graph reads it, once per tensor (the
/// image sentinels are read by both halves). The total is every tensor of the checkpoint (some,
/// such as the MTP block, are never read), so [`Self::finish`] reports the end.
pub struct CountingSource<'c, 'f> {
    ckpt: &'c crate::weights::Checkpoint,
    total: u64,
    done: std::cell::Cell<u64>,
    counted: std::cell::RefCell<std::collections::HashSet<String>>,
    report: std::cell::RefCell<&'f mut dyn FnMut(LoadProgress)>,
}

impl<'c, 'f> CountingSource<'c, 'f> {
    pub fn new(ckpt: &'c crate::weights::Checkpoint, report: &'f mut dyn FnMut(LoadProgress)) -> Self {
        CountingSource {
            ckpt,
            total: ckpt.total_bytes(),
            done: std::cell::Cell::new(0),
            counted: Default::default(),
            report: std::cell::RefCell::new(report),
        }
    }

    fn count(&self, name: &str) {
        if !self.counted.borrow_mut().insert(name.to_string()) {
            return;
        }
        // a quantized weight's `.scale` is read with it
        let bytes = self.ckpt.stored_bytes(name).unwrap_or(0);
        self.done.set(self.done.get() + bytes);
        self.emit(self.done.get());
    }

    fn emit(&self, done_bytes: u64) {
        (self.report.borrow_mut())(LoadProgress { done_bytes, total_bytes: self.total });
    }

    /// Everything the graph needs is resident: report the whole checkpoint done.
    pub fn finish(&self) {
        self.emit(self.total);
    }
}

impl ParamSource for CountingSource<'_, '_> {
    fn matrix(&self, name: &str) -> Result<HostWeight<'_>> {
        let w = self.ckpt.matrix(name)?;
        self.count(name);
        Ok(w)
    }
    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let v = self.ckpt.vector(name)?;
        self.count(name);
        Ok(v)
    }
    fn integers(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let v = self.ckpt.integers(name)?;
        self.count(name);
        Ok(v)
    }
    fn has(&self, name: &str) -> bool {
        self.ckpt.has(name)
    }
}
