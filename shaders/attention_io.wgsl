// What the ViT's two attention kernels share, attention.wgsl (f32) and attention_coop.wgsl
// (cooperative matrices): the parameters and bindings attention.rs dispatches either with.
// Not a complete shader: the lane builds it just before either kernel.

struct P {
    n: u32,
    heads: u32,
    hd: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
