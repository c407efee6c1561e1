// Q4_K, 144 bytes → 256 values: d @0, dmin @2, scales[12] @4 (get_scale_min_k4), qs[128] @16.
// Run `sub` (32 values) = the low (even sub) or high (odd) nibbles of qs[32·(sub/2) …]:
// value = d·sc · q − dmin·mn with (sc, mn) = scale_min_k4(sub).
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 144u;
    let sub = run % 8u;
    let dm = k_run_scale_min(base, o, sub);
    let shift = 4u * (sub % 2u);
    var v: array<f32, 32>;
    for (var l = 0u; l < 32u; l++) {
        let q = (byte_at(base, o + 16u + 32u * (sub / 2u) + l) >> shift) & 0xfu;
        v[l] = dm.x * f32(q) - dm.y;
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: l = 8(r8 % 4) … of run r8 / 4, its 8 code bytes in one u64_at.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let o = (run / 8u) * 144u;
    let sub = run % 8u;
    let dm = k_run_scale_min(base, o, sub);
    let shift = 4u * (sub % 2u);
    let q = u64_at(base, o + 16u + 32u * (sub / 2u) + 8u * (r8 % 4u));
    var v: array<f32, 8>;
    for (var t = 0u; t < 4u; t++) {
        v[t] = dm.x * f32((q.x >> (8u * t + shift)) & 0xfu) - dm.y;
        v[t + 4u] = dm.x * f32((q.y >> (8u * t + shift)) & 0xfu) - dm.y;
    }
    return v;
}
