// IQ1_S, 50 bytes → 256 values: d @0, qs[32] @2 (low 8 bits of 11-bit grid indices), qh[8] u16
// @34: per 32 values three high index bits per group of 8 (bits 3l …), a 3-bit scale (bits 12 …)
// and the sign of the delta (bit 15). value 8l + j = d·(2·scale + 1) · (grid byte j + ±IQ1_DELTA),
// grid bytes being int8 (−1, 0, 1).
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 50u;
    let ib = run % 8u;
    let qh = u16_at(base, o + 34u + 2u * ib);
    let dl = f16_at(base, o) * f32(2u * ((qh >> 12u) & 7u) + 1u);
    let delta = select(IQ1_DELTA, -IQ1_DELTA, (qh & 0x8000u) != 0u);
    var v: array<f32, 32>;
    for (var l = 0u; l < 4u; l++) {
        let g = byte_at(base, o + 2u + 4u * ib + l) | (((qh >> (3u * l)) & 7u) << 8u);
        for (var j = 0u; j < 8u; j++) {
            let gv = i8_of((iq1s_grid(2u * g + j / 4u) >> (8u * (j % 4u))) & 0xffu);
            v[8u * l + j] = dl * (f32(gv) + delta);
        }
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: group l = r8 % 4 of run r8 / 4.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let l = r8 % 4u;
    let o = (run / 8u) * 50u;
    let ib = run % 8u;
    let qh = u16_at(base, o + 34u + 2u * ib);
    let dl = f16_at(base, o) * f32(2u * ((qh >> 12u) & 7u) + 1u);
    let delta = select(IQ1_DELTA, -IQ1_DELTA, (qh & 0x8000u) != 0u);
    let g = byte_at(base, o + 2u + 4u * ib + l) | (((qh >> (3u * l)) & 7u) << 8u);
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let gv = i8_of((iq1s_grid(2u * g + j / 4u) >> (8u * (j % 4u))) & 0xffu);
        v[j] = dl * (f32(gv) + delta);
    }
    return v;
}
