// linear with native f16 weights (device has SHADER_F16); the body is linear_tile.wgsl. The lane
// emits `enable f16;` ahead of the parts of every build that uses f16 (a directive must lead the
// module, and an operands file may need it too).
// W rows hold f16 elements padded to an even count and are read as vec2<f16> pairs.

@group(0) @binding(2) var<storage, read> w: array<vec2<f16>>;

// Elements (k, k+1) of W row `r` (k even); the pad element of an odd row is zero.
fn load_pair(r: u32, k: u32) -> vec2<f32> {
    return vec2<f32>(w[r * p.w_stride + k / 2u]);
}
