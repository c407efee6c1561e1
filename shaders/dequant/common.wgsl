// Helpers shared by every block-format decoder (shaders/dequant/<format>.wgsl). The kernel body
// that follows declares `w: array<u32>`, the weight words of one row chunk; every row starts on
// a word (upload pads rows to a 4-byte stride), but ggml blocks are 17, 34, 110 … bytes, so
// fields are read byte by byte relative to the row's first word `base`.
//
// Each decoder defines `decode_run(base, run) -> array<f32, 32>`: values 32·run … 32·run + 31 of
// the row, and `decode_run8(base, run8) -> array<f32, 8>`: values 8·run8 … 8·run8 + 7 (for the
// small-row kernels, dequant/rows.wgsl), each computed with ggml's f32 operations in ggml's order
// (`dequantize_row_*` in ggml-quants.c), so each equals the CPU lane's `formats::decode_row` bit
// for bit. Every product there is exact in f32 (scale bits + code bits ≤ 24), so a driver that
// fuses a multiply-subtract into an fma cannot change a value either.

fn byte_at(base: u32, off: u32) -> u32 {
    return (w[base + (off >> 2u)] >> ((off & 3u) * 8u)) & 0xffu;
}

// Little-endian u16 / u32 / u64 at any byte offset (fields need not be aligned), without a
// branch on the alignment: the words that may hold the field are all loaded and the shifts
// chosen by `select` (branches there kept each run's loads one behind another: the 8-layer q2
// decode step on an H200 under Vulkan took 8.1–8.3 ms with them, 7.3–7.4 without, in one
// sitting). A word past the field's may be past the binding when the field ends the row, so that
// one is read clamped to the binding's last word (`next_word`), and its value is then unused.
fn next_word(i: u32) -> u32 {
    return w[min(i + 1u, arrayLength(&w) - 1u)];
}

fn u16_at(base: u32, off: u32) -> u32 {
    let i = base + (off >> 2u);
    let sh = (off & 3u) * 8u;
    let hi = select(0u, next_word(i) << (32u - sh), sh == 24u);
    return ((w[i] >> sh) | hi) & 0xffffu;
}

fn u32_at(base: u32, off: u32) -> u32 {
    let i = base + (off >> 2u);
    let sh = (off & 3u) * 8u;
    let a = w[i];
    let b = next_word(i);
    return select((a >> sh) | (b << (32u - sh)), a, sh == 0u);
}

// The 8 bytes at any byte offset, little-endian, as (bytes 0-3, bytes 4-7): three word loads
// instead of byte_at's eight. The first two hold field bytes, so lie in the row; the third is
// `next_word`'s (unused when the field is aligned).
fn u64_at(base: u32, off: u32) -> vec2<u32> {
    let i = base + (off >> 2u);
    let sh = (off & 3u) * 8u;
    let a = w[i];
    let b = w[i + 1u];
    let c = next_word(i + 1u);
    let u = vec2<u32>((a >> sh) | (b << (32u - sh)), (b >> sh) | (c << (32u - sh)));
    return select(u, vec2<u32>(a, b), sh == 0u);
}

// A byte as the signed int8 it stores.
fn i8_of(b: u32) -> i32 {
    return bitcast<i32>(b << 24u) >> 24u;
}

fn nan_f32() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

// IEEE half bits → f32 by integer construction, exact (subnormals included; the three cases
// chosen by `select`, not branches, as the loads above), like the lane's f16 weights:
// unpack2x16float needs naga's SHADER_FLOAT16_IN_FLOAT32 capability, which not every backend
// has, and may flush subnormal halves.
fn half_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    let sub = bitcast<f32>(bitcast<u32>(f32(m) * 5.9604644775390625e-8) | sign);
    let normal = bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
    let special = bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    return select(select(normal, special, e == 31u), sub, e == 0u);
}

fn f16_at(base: u32, off: u32) -> f32 {
    return half_to_f32(u16_at(base, off));
}

// ggml_e8m0_to_fp32 with the MX NaN (as the CPU lane): 2^(e−127); e = 0 is the f32 subnormal
// 2^−127, e = 255 NaN.
fn e8m0_to_f32(e: u32) -> f32 {
    if (e == 0u) {
        return bitcast<f32>(0x00400000u);
    }
    if (e == 255u) {
        return nan_f32();
    }
    return bitcast<f32>(e << 23u);
}

// ggml_e8m0_to_fp32_half (MXFP4's table holds the e2m1 values doubled): 2^(e−128), e < 2 as the
// f32 subnormals 2^−128 and 2^−127.
fn e8m0_to_f32_half(e: u32) -> f32 {
    if (e < 2u) {
        return bitcast<f32>(0x00200000u << e);
    }
    return bitcast<f32>((e - 1u) << 23u);
}

// FP8 e4m3fn code → f32, exact: bias 7, exponent 0 subnormal (m · 2^−9), S.1111.111 NaN.
fn e4m3_to_f32(c: u32) -> f32 {
    let sign = (c & 0x80u) << 24u;
    let e = (c >> 3u) & 0xfu;
    let m = c & 7u;
    var mag: f32;
    if (e == 15u && m == 7u) {
        mag = nan_f32();
    } else if (e == 0u) {
        mag = f32(m) * bitcast<f32>(118u << 23u); // m · 2^−9
    } else {
        mag = bitcast<f32>(((e + 120u) << 23u) | (m << 20u));
    }
    return bitcast<f32>(bitcast<u32>(mag) | sign);
}

// ggml get_scale_min_k4 (Q4_K, Q5_K): 6-bit scale and min `j` of the 12 packed bytes at `off`.
fn scale_min_k4(base: u32, off: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(byte_at(base, off + j) & 63u, byte_at(base, off + j + 4u) & 63u);
    }
    let hi = byte_at(base, off + j + 4u);
    let sc = (hi & 0xfu) | ((byte_at(base, off + j - 4u) >> 6u) << 4u);
    let mn = (hi >> 4u) | ((byte_at(base, off + j) >> 6u) << 4u);
    return vec2<u32>(sc, mn);
}

// Q4_K, Q5_K: run `sub`'s scale d·sc and offset dmin·mn, of the block at `o` (d @0, dmin @2,
// scales @4).
fn k_run_scale_min(base: u32, o: u32, sub: u32) -> vec2<f32> {
    let sm = scale_min_k4(base, o + 4u, sub);
    return vec2<f32>(f16_at(base, o) * f32(sm.x), f16_at(base, o + 2u) * f32(sm.y));
}
