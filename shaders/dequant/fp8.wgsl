// FP8 e4m3 re-laid row-local, per 128 values: the block scale (FP8_SCALE_BYTES = 1: E8M0;
// 4: f32 little-endian, emitted by the lane) then 128 e4m3 codes; value = e4m3 · scale. Four
// runs per block.
// The scale of the block at `o`.
fn fp8_block_scale(base: u32, o: u32) -> f32 {
    if (FP8_SCALE_BYTES == 1u) {
        return e8m0_to_f32(byte_at(base, o));
    }
    return bitcast<f32>(u32_at(base, o));
}

fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 4u) * (FP8_SCALE_BYTES + 128u);
    let scale = fp8_block_scale(base, o);
    let c = o + FP8_SCALE_BYTES + (run % 4u) * 32u;
    var v: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        v[j] = e4m3_to_f32(byte_at(base, c + j)) * scale;
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: codes 8(r8 % 4) … of run r8 / 4.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let o = (run / 4u) * (FP8_SCALE_BYTES + 128u);
    let scale = fp8_block_scale(base, o);
    let q = u64_at(base, o + FP8_SCALE_BYTES + (run % 4u) * 32u + 8u * (r8 % 4u));
    var v: array<f32, 8>;
    for (var j = 0u; j < 4u; j++) {
        v[j] = e4m3_to_f32((q.x >> (8u * j)) & 0xffu) * scale;
        v[j + 4u] = e4m3_to_f32((q.y >> (8u * j)) & 0xffu) * scale;
    }
    return v;
}
