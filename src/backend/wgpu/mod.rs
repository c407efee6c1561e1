//! wgpu lane.
