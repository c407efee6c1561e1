// Q5_K, 176 bytes → 256 values: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48. As Q4_K,
// with bit `sub` of qh[l] adding 16 to the code: value = d·sc · (q + 16·hbit) − dmin·mn.
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 176u;
    let sub = run % 8u;
    let sm = scale_min_k4(base, o + 4u, sub);
    let d1 = f16_at(base, o) * f32(sm.x);
    let m1 = f16_at(base, o + 2u) * f32(sm.y);
    let shift = 4u * (sub % 2u);
    var v: array<f32, 32>;
    for (var l = 0u; l < 32u; l++) {
        let lo = (byte_at(base, o + 48u + 32u * (sub / 2u) + l) >> shift) & 0xfu;
        let hi = select(0u, 16u, (byte_at(base, o + 16u + l) & (1u << sub)) != 0u);
        v[l] = d1 * f32(lo + hi) - m1;
    }
    return v;
}
