// IQ3_XXS, 98 bytes → 256 values: d @0, qs[64] @2 (grid indices, 8 per 32 values), then per 32
// values a u32 @66 + 4ib: four 7-bit sign indices (bits 7l …) and a 4-bit scale (bits 28 …).
// value 8l + j (j < 4: grid[qs[2l]] byte j; j ≥ 4: grid[qs[2l+1]] byte j−4) =
// d·(0.5 + aux >> 28)·0.5 · that byte · (sign bit j ? −1 : 1).
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 98u;
    let ib = run % 8u;
    let aux = u32_at(base, o + 66u + 4u * ib);
    let db = f16_at(base, o) * (0.5 + f32(aux >> 28u)) * 0.5;
    let qs = o + 2u + 8u * ib;
    var v: array<f32, 32>;
    for (var l = 0u; l < 4u; l++) {
        let signs = ksigns_iq2xs((aux >> (7u * l)) & 127u);
        let g1 = iq3xxs_grid(byte_at(base, qs + 2u * l));
        let g2 = iq3xxs_grid(byte_at(base, qs + 2u * l + 1u));
        for (var j = 0u; j < 4u; j++) {
            let s1 = select(1.0, -1.0, (signs & (1u << j)) != 0u);
            let s2 = select(1.0, -1.0, (signs & (1u << (j + 4u))) != 0u);
            v[8u * l + j] = db * f32((g1 >> (8u * j)) & 0xffu) * s1;
            v[8u * l + j + 4u] = db * f32((g2 >> (8u * j)) & 0xffu) * s2;
        }
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: group l = r8 % 4 of run r8 / 4.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let l = r8 % 4u;
    let o = (run / 8u) * 98u;
    let ib = run % 8u;
    let aux = u32_at(base, o + 66u + 4u * ib);
    let db = f16_at(base, o) * (0.5 + f32(aux >> 28u)) * 0.5;
    let qs = o + 2u + 8u * ib;
    let signs = ksigns_iq2xs((aux >> (7u * l)) & 127u);
    let g1 = iq3xxs_grid(byte_at(base, qs + 2u * l));
    let g2 = iq3xxs_grid(byte_at(base, qs + 2u * l + 1u));
    var v: array<f32, 8>;
    for (var j = 0u; j < 4u; j++) {
        v[j] = db * f32((g1 >> (8u * j)) & 0xffu) * select(1.0, -1.0, (signs & (1u << j)) != 0u);
        v[j + 4u] = db * f32((g2 >> (8u * j)) & 0xffu) * select(1.0, -1.0, (signs & (1u << (j + 4u))) != 0u);
    }
    return v;
}
