// Q8_0, 34 bytes → 32 values: d f16, then 32 × i8; value = q · d. One run per block.
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = run * 34u;
    let d = f16_at(base, o);
    var v: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        v[j] = f32(i8_of(byte_at(base, o + 2u + j))) * d;
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: quarter r8 % 4 of block r8 / 4, its 8 codes in one u64_at.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let o = (r8 / 4u) * 34u;
    let d = f16_at(base, o);
    let q = u64_at(base, o + 2u + 8u * (r8 % 4u));
    var v: array<f32, 8>;
    for (var j = 0u; j < 4u; j++) {
        v[j] = f32(i8_of((q.x >> (8u * j)) & 0xffu)) * d;
        v[j + 4u] = f32(i8_of((q.y >> (8u * j)) & 0xffu)) * d;
    }
    return v;
}
