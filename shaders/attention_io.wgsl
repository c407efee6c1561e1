// What the ViT's two attention kernels share, attention.wgsl (f32) and attention_coop.wgsl
// (cooperative matrices): the parameters and bindings attention.rs dispatches either with.
// Not a complete shader: the lane builds it just before either kernel.

struct P {
    n: u32,
    heads: u32,
    hd: u32,
    scale: f32,
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p4: u32, _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32,
    _p10: u32, _p11: u32, _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
