// IQ1_M, 56 bytes → 256 values: qs[32] @0, qh[16] @32 (per group of 8: three high index bits and
// the delta sign, two groups per byte), scales @48 as four u16: 3-bit group scales (6 bits per
// 16 values) and, in their top nibbles, the f16 super-scale. value 8l + j of run ib =
// d·(2·scale + 1) · (grid byte j + ±IQ1_DELTA), groups l < 2 with the first scale of the run.
// The f16 super-scale of the block at `o`, from the top nibbles of its four scale words.
fn iq1m_super_scale(base: u32, o: u32) -> f32 {
    let s0 = u16_at(base, o + 48u);
    let s1 = u16_at(base, o + 50u);
    let s2 = u16_at(base, o + 52u);
    let s3 = u16_at(base, o + 54u);
    return half_to_f32((s0 >> 12u) | ((s1 >> 8u) & 0x00f0u) | ((s2 >> 4u) & 0x0f00u) | (s3 & 0xf000u));
}

fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 56u;
    let ib = run % 8u;
    let d = iq1m_super_scale(base, o);
    let sc = u16_at(base, o + 48u + 2u * (ib / 2u));
    let dl1 = d * f32(2u * ((sc >> (6u * (ib % 2u))) & 7u) + 1u);
    let dl2 = d * f32(2u * ((sc >> (6u * (ib % 2u) + 3u)) & 7u) + 1u);
    let qh0 = byte_at(base, o + 32u + 2u * ib);
    let qh1 = byte_at(base, o + 33u + 2u * ib);
    var v: array<f32, 32>;
    for (var l = 0u; l < 4u; l++) {
        let qh = select(qh0, qh1, l >= 2u);
        // even l: bits 0-2 (index) and 3 (delta sign); odd l: bits 4-6 and 7
        let hb = select(qh << 8u, qh << 4u, (l % 2u) == 1u) & 0x700u;
        let neg = (qh & select(0x08u, 0x80u, (l % 2u) == 1u)) != 0u;
        let g = byte_at(base, o + 4u * ib + l) | hb;
        let delta = select(IQ1_DELTA, -IQ1_DELTA, neg);
        let dl = select(dl1, dl2, l >= 2u);
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
    let o = (run / 8u) * 56u;
    let ib = run % 8u;
    let d = iq1m_super_scale(base, o);
    let sc = u16_at(base, o + 48u + 2u * (ib / 2u));
    let dl = d * f32(2u * ((sc >> (6u * (ib % 2u) + select(0u, 3u, l >= 2u))) & 7u) + 1u);
    let qh = byte_at(base, o + 32u + 2u * ib + l / 2u);
    let hb = select(qh << 8u, qh << 4u, (l % 2u) == 1u) & 0x700u;
    let neg = (qh & select(0x08u, 0x80u, (l % 2u) == 1u)) != 0u;
    let g = byte_at(base, o + 4u * ib + l) | hb;
    let delta = select(IQ1_DELTA, -IQ1_DELTA, neg);
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        let gv = i8_of((iq1s_grid(2u * g + j / 4u) >> (8u * (j % 4u))) & 0xffu);
        v[j] = dl * (f32(gv) + delta);
    }
    return v;
}
