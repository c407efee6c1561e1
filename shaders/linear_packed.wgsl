// linear, weight formats read as packed u32 words (binding 2); the body is linear_tile.wgsl.
// The format is a pipeline-override constant:
//   FMT = 0: f32 (one word per element, row stride = k words)
//   FMT = 1: bf16 (two elements per word, low half first; rows padded to an even element count)
//   FMT = 2: f16 decoded with integer ops (same packing as bf16; used when SHADER_F16 is absent).
//            Exact, subnormals included; unpack2x16float would need naga's
//            SHADER_FLOAT16_IN_FLOAT32 capability, which not every backend has, and may flush
//            subnormals.
override FMT: u32 = 0u;

@group(0) @binding(2) var<storage, read> w: array<u32>;

// IEEE half bits (low 16 bits of h) → f32, exact.
fn half_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        let mag = f32(m) * 5.9604644775390625e-8; // m · 2^-24
        return select(mag, -mag, sign != 0u);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// Elements (k, k+1) of W row `r` (k even), zero past the end of the row.
fn load_pair(r: u32, k: u32) -> vec2<f32> {
    if (FMT == 0u) {
        let base = r * p.w_stride + k;
        let a = bitcast<f32>(w[base]);
        var b = 0.0;
        if (k + 1u < p.k) {
            b = bitcast<f32>(w[base + 1u]);
        }
        return vec2<f32>(a, b);
    }
    let u = w[r * p.w_stride + k / 2u];
    if (FMT == 1u) {
        return vec2<f32>(bitcast<f32>(u << 16u), bitcast<f32>(u & 0xffff0000u));
    }
    return vec2<f32>(half_to_f32(u & 0xffffu), half_to_f32(u >> 16u));
}
