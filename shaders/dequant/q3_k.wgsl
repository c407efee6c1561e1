// Q3_K, 110 bytes → 256 values: hmask[32] @0, qs[64] @32, scales[12] @96 (sixteen 6-bit
// scales, ggml's kmask1/kmask2 unpacking), d @108. Value 128·n + 32·j + 16·h + l =
// d·(scale[8n + 2j + h] − 32) · (((qs[32n + 16h + l] >> 2j) & 3) − (hmask[16h + l] bit 4n + j ? 0 : 4)).
fn q3k_scale(base: u32, o: u32, is: u32) -> i32 {
    let a0 = u32_at(base, o + 96u);
    let a1 = u32_at(base, o + 100u);
    let tmp = u32_at(base, o + 104u);
    let k1 = 0x03030303u;
    let k2 = 0x0f0f0f0fu;
    var x: u32;
    switch (is / 4u) {
        case 0u: { x = (a0 & k2) | ((tmp & k1) << 4u); }
        case 1u: { x = (a1 & k2) | (((tmp >> 2u) & k1) << 4u); }
        case 2u: { x = ((a0 >> 4u) & k2) | (((tmp >> 4u) & k1) << 4u); }
        default: { x = ((a1 >> 4u) & k2) | (((tmp >> 6u) & k1) << 4u); }
    }
    return i32((x >> (8u * (is % 4u))) & 0xffu) - 32;
}

fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 110u;
    let sub = run % 8u;
    let n = sub / 4u;
    let j = sub % 4u;
    let m = 1u << (4u * n + j);
    let d_all = f16_at(base, o + 108u);
    var v: array<f32, 32>;
    for (var h = 0u; h < 2u; h++) {
        let dl = d_all * f32(q3k_scale(base, o, 8u * n + 2u * j + h));
        for (var l = 0u; l < 16u; l++) {
            let q = i32((byte_at(base, o + 32u + 32u * n + 16u * h + l) >> (2u * j)) & 3u);
            let hi = select(4, 0, (byte_at(base, o + 16u * h + l) & m) != 0u);
            v[16u * h + l] = dl * f32(q - hi);
        }
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: eighth c = r8 % 4 of run r8 / 4, so h = c / 2 and l = 8(c % 2) … of
// decode_run's loops.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let c = r8 % 4u;
    let o = (run / 8u) * 110u;
    let sub = run % 8u;
    let n = sub / 4u;
    let j = sub % 4u;
    let m = 1u << (4u * n + j);
    let h = c / 2u;
    let dl = f16_at(base, o + 108u) * f32(q3k_scale(base, o, 8u * n + 2u * j + h));
    var v: array<f32, 8>;
    for (var t = 0u; t < 8u; t++) {
        let l = 8u * (c % 2u) + t;
        let q = i32((byte_at(base, o + 32u + 32u * n + 16u * h + l) >> (2u * j)) & 3u);
        let hi = select(4, 0, (byte_at(base, o + 16u * h + l) & m) != 0u);
        v[t] = dl * f32(q - hi);
    }
    return v;
}
