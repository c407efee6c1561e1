// IQ2_XS, 74 bytes → 256 values: d @0, qs[32] u16 @2 (9-bit grid index | 7-bit sign index << 9),
// scales[8] @66 (two 4-bit scales per 32 values). value 8l + j of run ib =
// d·(0.5 + scale nibble l/2)·0.25 · grid[q & 511] byte j · (sign bit j ? −1 : 1).
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 74u;
    let ib = run % 8u;
    let d = f16_at(base, o);
    let sc = byte_at(base, o + 66u + ib);
    let db0 = d * (0.5 + f32(sc & 0xfu)) * 0.25;
    let db1 = d * (0.5 + f32(sc >> 4u)) * 0.25;
    var v: array<f32, 32>;
    for (var l = 0u; l < 4u; l++) {
        let q = u16_at(base, o + 2u + 2u * (4u * ib + l));
        let g = q & 511u;
        let signs = ksigns_iq2xs(q >> 9u);
        let db = select(db0, db1, l >= 2u);
        for (var j = 0u; j < 8u; j++) {
            let gv = (iq2xs_grid(2u * g + j / 4u) >> (8u * (j % 4u))) & 0xffu;
            let s = select(1.0, -1.0, (signs & (1u << j)) != 0u);
            v[8u * l + j] = db * f32(gv) * s;
        }
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: group l = r8 % 4 of run r8 / 4.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let l = r8 % 4u;
    let o = (run / 8u) * 74u;
    let ib = run % 8u;
    let sc = byte_at(base, o + 66u + ib);
    let db = f16_at(base, o) * (0.5 + f32(select(sc & 0xfu, sc >> 4u, l >= 2u))) * 0.25;
    let q = u16_at(base, o + 2u + 2u * (4u * ib + l));
    let g = q & 511u;
    let signs = ksigns_iq2xs(q >> 9u);
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let gv = (iq2xs_grid(2u * g + j / 4u) >> (8u * (j % 4u))) & 0xffu;
        v[j] = db * f32(gv) * select(1.0, -1.0, (signs & (1u << j)) != 0u);
    }
    return v;
}
