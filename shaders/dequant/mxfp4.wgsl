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
