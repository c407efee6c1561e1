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
