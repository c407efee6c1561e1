// MXFP4, 17 bytes → 32 values: E8M0 e, then 16 bytes; value j (low nibble of byte j) and j + 16
// (high nibble) = KVALUES_MXFP4[code] · 2^(e−128) (the table holds e2m1 doubled). One run per block.
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = run * 17u;
    let d = e8m0_to_f32_half(byte_at(base, o));
    var v: array<f32, 32>;
    for (var j = 0u; j < 16u; j++) {
        let q = byte_at(base, o + 1u + j);
        v[j] = f32(kvalues_mxfp4(q & 0xfu)) * d;
        v[j + 16u] = f32(kvalues_mxfp4(q >> 4u)) * d;
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: quarter c = r8 % 4 of block r8 / 4, the low (c < 2) or high nibbles of
// bytes 8(c % 2) … 8(c % 2) + 7.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let o = (r8 / 4u) * 17u;
    let c = r8 % 4u;
    let d = e8m0_to_f32_half(byte_at(base, o));
    let q = u64_at(base, o + 1u + 8u * (c % 2u));
    let shift = 4u * (c / 2u);
    var v: array<f32, 8>;
    for (var j = 0u; j < 4u; j++) {
        v[j] = f32(kvalues_mxfp4((q.x >> (8u * j + shift)) & 0xfu)) * d;
        v[j + 4u] = f32(kvalues_mxfp4((q.y >> (8u * j + shift)) & 0xfu)) * d;
    }
    return v;
}
