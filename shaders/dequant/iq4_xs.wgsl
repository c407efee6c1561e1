// IQ4_XS, 136 bytes → 256 values: d @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8. Run ib:
// ls = nibble ib%2 of scales_l[ib/2] | bits 2ib … of scales_h << 4; value j (low nibble of
// qs[16ib + j]) and j + 16 (high) = d·(ls − 32) · KVALUES_IQ4NL[nibble].
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 136u;
    let ib = run % 8u;
    let ls = ((byte_at(base, o + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xfu) | (((u16_at(base, o + 2u) >> (2u * ib)) & 3u) << 4u);
    let dl = f16_at(base, o) * f32(i32(ls) - 32);
    var v: array<f32, 32>;
    for (var j = 0u; j < 16u; j++) {
        let q = byte_at(base, o + 8u + 16u * ib + j);
        v[j] = dl * f32(kvalues_iq4nl(q & 0xfu));
        v[j + 16u] = dl * f32(kvalues_iq4nl(q >> 4u));
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: quarter c = r8 % 4 of run r8 / 4, the low (c < 2) or high nibbles of
// bytes 8(c % 2) … of its 16.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let c = r8 % 4u;
    let o = (run / 8u) * 136u;
    let ib = run % 8u;
    let ls = ((byte_at(base, o + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xfu) | (((u16_at(base, o + 2u) >> (2u * ib)) & 3u) << 4u);
    let dl = f16_at(base, o) * f32(i32(ls) - 32);
    let q = u64_at(base, o + 8u + 16u * ib + 8u * (c % 2u));
    let shift = 4u * (c / 2u);
    var v: array<f32, 8>;
    for (var j = 0u; j < 4u; j++) {
        v[j] = dl * f32(kvalues_iq4nl((q.x >> (8u * j + shift)) & 0xfu));
        v[j + 4u] = dl * f32(kvalues_iq4nl((q.y >> (8u * j + shift)) & 0xfu));
    }
    return v;
}
