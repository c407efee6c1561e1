//! `rope_2d` on `shaders/rope.wgsl`: the vision tower's 2-D rotary embedding, one thread per
//! rotated pair. (The language model's `rope_tail` is an entry point of lm.wgsl: lm.rs.)
//!
//! The cos/sin table comes from the host (f32, the reference's recipe), cached per grid and
//! counted as weight memory while cached.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use wgpu::util::DeviceExt;

use super::{Role, Shader, WgpuBackend, WgpuTensor};
use crate::backend::{DType, checks};
use crate::error::Result;

/// The cached cos/sin tables, keyed by (n, grid_w, hd, theta bits).
pub(super) type Tables = HashMap<(usize, usize, usize, u32), Arc<WgpuTensor>>;

impl WgpuBackend {
    /// x `[gh·gw, heads·hd]` → same shape; cos/sin table computed on the host in f32 and cached.
    pub(super) fn rope_2d(&self, x: &WgpuTensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<WgpuTensor> {
        const OP: &str = "rope_2d";
        let (n, hd) = checks::rope_2d(x, n_heads, grid_w)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let pairs = n * n_heads * hd / 2;
        if pairs > 0 {
            let tab = self.rope_table(n, grid_w, hd, theta)?;
            self.dispatch_1d(
                Shader::Rope,
                OP,
                pairs,
                &[n as u32, n_heads as u32, hd as u32],
                &[(1, x.binding()), (2, tab.binding()), (3, y.binding())],
            )?;
        }
        Ok(y)
    }

    fn rope_table(&self, n: usize, grid_w: usize, hd: usize, theta: f32) -> Result<Arc<WgpuTensor>> {
        let key = (n, grid_w, hd, theta.to_bits());
        if let Some(t) = self.rope_tables.lock().unwrap().get(&key) {
            return Ok(t.clone());
        }
        // Same f32 arithmetic as the reference: inv_freq = 1/θ^(2j/half), angle = pos·inv_freq.
        let half = hd / 2;
        let quarter = hd / 4;
        let inv_freq: Vec<f32> = (0..quarter).map(|j| 1.0 / theta.powf((2 * j) as f32 / half as f32)).collect();
        let mut tab = vec![0f32; 2 * n * half];
        for r in 0..n {
            let (row, col) = ((r / grid_w) as f32, (r % grid_w) as f32);
            for d in 0..half {
                let a = if d < quarter { row * inv_freq[d] } else { col * inv_freq[d - quarter] };
                tab[r * half + d] = a.cos();
                tab[n * half + r * half + d] = a.sin();
            }
        }
        let buf = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("rope table"),
            contents: bytemuck::cast_slice(&tab),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let counted = buf.size();
        self.shared.counters.weight.fetch_add(counted, Ordering::Relaxed);
        let t = Arc::new(WgpuTensor {
            buf,
            offset: 0,
            bytes: counted,
            guard_words: 0,
            counted,
            role: Role::Table,
            shape: vec![2 * n * half],
            dtype: DType::F32,
            producer: "rope_2d",
            shared: self.shared.clone(),
        });
        let mut tables = self.rope_tables.lock().unwrap();
        if tables.len() >= 8 {
            tables.clear();
        }
        tables.insert(key, t.clone());
        Ok(t)
    }
}
