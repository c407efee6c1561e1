// Q6_K, 210 bytes → 256 values: ql[128] @0, qh[64] @128, scales[16] (i8) @192, d @208. Half n
// of the block (128 values) uses ql[64n …], qh[32n …], scales[8n …]; its quarter t (run sub =
// 4n + t) holds, for l < 32: q = (nibble t/2 of ql[64n + 32(t%2) + l]) | ((qh[32n + l] >> 2t) & 3) << 4,
// value = d·scales[8n + l/16 + 2t] · (q − 32).
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 210u;
    let sub = run % 8u;
    let n = sub / 4u;
    let t = sub % 4u;
    let d = f16_at(base, o + 208u);
    var v: array<f32, 32>;
    for (var h = 0u; h < 2u; h++) {
        let ds = d * f32(i8_of(byte_at(base, o + 192u + 8u * n + h + 2u * t)));
        for (var i = 0u; i < 16u; i++) {
            let l = 16u * h + i;
            let lo = (byte_at(base, o + 64u * n + 32u * (t % 2u) + l) >> (4u * (t / 2u))) & 0xfu;
            let hi = (byte_at(base, o + 128u + 32u * n + l) >> (2u * t)) & 3u;
            v[l] = ds * f32(i32(lo | (hi << 4u)) - 32);
        }
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: eighth c = r8 % 4 of run r8 / 4, so h = c / 2 and l = 16h + 8(c % 2) …
// of decode_run's loops.
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let c = r8 % 4u;
    let o = (run / 8u) * 210u;
    let sub = run % 8u;
    let n = sub / 4u;
    let t = sub % 4u;
    let h = c / 2u;
    let ds = f16_at(base, o + 208u) * f32(i8_of(byte_at(base, o + 192u + 8u * n + h + 2u * t)));
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let l = 16u * h + 8u * (c % 2u) + i;
        let lo = (byte_at(base, o + 64u * n + 32u * (t % 2u) + l) >> (4u * (t / 2u))) & 0xfu;
        let hi = (byte_at(base, o + 128u + 32u * n + l) >> (2u * t)) & 3u;
        v[i] = ds * f32(i32(lo | (hi << 4u)) - 32);
    }
    return v;
}
