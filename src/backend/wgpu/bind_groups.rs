//! The bind groups the lane has made, kept for the next dispatch that binds the same buffer
//! ranges to the same pipeline.
//!
//! A dispatch's parameters travel as immediate data (`var<immediate> p: P` in every shader,
//! `PARAM_BYTES` of them), so its bind group holds only storage ranges: a decode step binds the
//! same weights and, through the activation free list, mostly the same activation buffers step
//! after step. Making a bind group is most of wgpu's cost of a dispatch on the host (validation,
//! a descriptor set, the resource tracking at submit): reusing one halves it (a micro-benchmark
//! on lavapipe, 2.8 → 1.4 µs a dispatch).
//!
//! A cached bind group keeps its buffers alive, so the cache is emptied whenever the lane lets a
//! buffer go for good (`Shared::released`: a weight or table dropped, the free list trimmed or a
//! size class of it let go at its bound, an activation dropped without reuse or larger than that
//! bound) and when it holds `CAPACITY` groups.

use std::collections::HashMap;
use std::num::NonZeroU64;

/// Groups kept at most: a 43-layer decode step binds about 2 500, a prefill chunk as many again.
const CAPACITY: usize = 16_384;

/// A bind group's identity: its pipeline (whose derived layout the group was made for, which no
/// other pipeline's matches) and each binding's buffer range.
#[derive(PartialEq, Eq, Hash)]
struct Key {
    pipeline: wgpu::ComputePipeline,
    entries: Vec<(u32, wgpu::Buffer, u64, Option<NonZeroU64>)>,
}

#[derive(Default)]
pub(super) struct BindGroups {
    groups: HashMap<Key, wgpu::BindGroup>,
    /// `Shared::released` when the cache was last emptied.
    released: u64,
    /// Groups made (not found in the cache), for `Backend::host_profile`.
    pub(super) made: u64,
}

impl BindGroups {
    /// The bind group of `bindings` for `pipeline`: the cached one, or one `make` makes from its
    /// entries (with `pipeline`'s layout). `released` is the lane's count of buffers let go so far.
    pub(super) fn get(
        &mut self,
        pipeline: &wgpu::ComputePipeline,
        bindings: &[(u32, wgpu::BindingResource<'_>)],
        released: u64,
        make: impl FnOnce(&[wgpu::BindGroupEntry<'_>]) -> wgpu::BindGroup,
    ) -> wgpu::BindGroup {
        if released != self.released || self.groups.len() >= CAPACITY {
            self.groups.clear();
            self.released = released;
        }
        // the lane binds buffers only; anything else is made afresh, uncached
        let key = bindings
            .iter()
            .map(|(binding, resource)| match resource {
                wgpu::BindingResource::Buffer(b) => Some((*binding, b.buffer.clone(), b.offset, b.size)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(|entries| Key { pipeline: pipeline.clone(), entries });
        if let Some(group) = key.as_ref().and_then(|k| self.groups.get(k)) {
            return group.clone();
        }
        let entries: Vec<wgpu::BindGroupEntry<'_>> = bindings
            .iter()
            .map(|(binding, resource)| wgpu::BindGroupEntry { binding: *binding, resource: resource.clone() })
            .collect();
        let group = make(&entries);
        self.made += 1;
        if let Some(key) = key {
            self.groups.insert(key, group.clone());
        }
        group
    }
}
