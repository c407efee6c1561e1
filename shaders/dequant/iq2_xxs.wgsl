// IQ2_XXS, 66 bytes → 256 values: d @0, then per 32 values (run ib) 8 bytes @2 + 8ib: a0 = four
// grid indices, a1 = four 7-bit sign-pattern indices (bits 7l …) and a 4-bit scale (bits 28 …).
// value 8l + j = d·(0.5 + a1 >> 28)·0.25 · grid[a0 byte l] byte j · (sign bit j ? −1 : 1).
// Grids are emitted by the lane as u32 pairs (low word = bytes 0-3).
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 66u;
    let q = o + 2u + 8u * (run % 8u);
    let a0 = u32_at(base, q);
    let a1 = u32_at(base, q + 4u);
    let db = f16_at(base, o) * (0.5 + f32(a1 >> 28u)) * 0.25;
    var v: array<f32, 32>;
    for (var l = 0u; l < 4u; l++) {
        let g = (a0 >> (8u * l)) & 0xffu;
        let signs = ksigns_iq2xs((a1 >> (7u * l)) & 127u);
        for (var j = 0u; j < 8u; j++) {
            let gv = (iq2xxs_grid(2u * g + j / 4u) >> (8u * (j % 4u))) & 0xffu;
            let s = select(1.0, -1.0, (signs & (1u << j)) != 0u);
            v[8u * l + j] = db * f32(gv) * s;
        }
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: grid entry l = r8 % 4 of run r8 / 4 (the same products as decode_run).
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let l = r8 % 4u;
    let o = (run / 8u) * 66u;
    let q = o + 2u + 8u * (run % 8u);
    let a1 = u32_at(base, q + 4u);
    let db = f16_at(base, o) * (0.5 + f32(a1 >> 28u)) * 0.25;
    let g = byte_at(base, q + l);
    let signs = ksigns_iq2xs((a1 >> (7u * l)) & 127u);
    let lo = iq2xxs_grid(2u * g);
    let hi = iq2xxs_grid(2u * g + 1u);
    var v: array<f32, 8>;
    for (var j = 0u; j < 4u; j++) {
        v[j] = db * f32((lo >> (8u * j)) & 0xffu) * select(1.0, -1.0, (signs & (1u << j)) != 0u);
        v[j + 4u] = db * f32((hi >> (8u * j)) & 0xffu) * select(1.0, -1.0, (signs & (1u << (j + 4u))) != 0u);
    }
    return v;
}
