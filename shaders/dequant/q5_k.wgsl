// Q5_K, 176 bytes → 256 values: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48. As Q4_K,
// with bit `sub` of qh[l] adding 16 to the code: value = d·sc · (q + 16·hbit) − dmin·mn.
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 176u;
    let sub = run % 8u;
    let dm = k_run_scale_min(base, o, sub);
    let shift = 4u * (sub % 2u);
    var v: array<f32, 32>;
    for (var l = 0u; l < 32u; l++) {
        let lo = (byte_at(base, o + 48u + 32u * (sub / 2u) + l) >> shift) & 0xfu;
        let hi = select(0u, 16u, (byte_at(base, o + 16u + l) & (1u << sub)) != 0u);
        v[l] = dm.x * f32(lo + hi) - dm.y;
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: l = 8(r8 % 4) … of run r8 / 4 (code bytes and qh bytes in a u64_at each).
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let c = r8 % 4u;
    let o = (run / 8u) * 176u;
    let sub = run % 8u;
    let dm = k_run_scale_min(base, o, sub);
    let shift = 4u * (sub % 2u);
    let q = u64_at(base, o + 48u + 32u * (sub / 2u) + 8u * c);
    let qh = u64_at(base, o + 16u + 8u * c);
    let bit = 1u << sub;
    var v: array<f32, 8>;
    for (var t = 0u; t < 4u; t++) {
        let hx = select(0u, 16u, ((qh.x >> (8u * t)) & bit) != 0u);
        let hy = select(0u, 16u, ((qh.y >> (8u * t)) & bit) != 0u);
        v[t] = dm.x * f32(((q.x >> (8u * t + shift)) & 0xfu) + hx) - dm.y;
        v[t + 4u] = dm.x * f32(((q.y >> (8u * t + shift)) & 0xfu) + hy) - dm.y;
    }
    return v;
}
