// Q2_K, 84 bytes → 256 values: scales[16] @0 (4-bit scale | 4-bit min << 4), qs[64] @16, d @80,
// dmin @82. Value 128·n + 32·j + 16·h + l = d·sc · ((qs[32n + 16h + l] >> 2j) & 3) − dmin·mn,
// sc/mn from scales[8n + 2j + h]. Run `sub` of a block is (n, j) = (sub / 4, sub % 4).
fn decode_run(base: u32, run: u32) -> array<f32, 32> {
    let o = (run / 8u) * 84u;
    let sub = run % 8u;
    let n = sub / 4u;
    let shift = 2u * (sub % 4u);
    let d = f16_at(base, o + 80u);
    let dmin = f16_at(base, o + 82u);
    var v: array<f32, 32>;
    for (var h = 0u; h < 2u; h++) {
        let sc = byte_at(base, o + 8u * n + 2u * (sub % 4u) + h);
        let dl = d * f32(sc & 0xfu);
        let ml = dmin * f32(sc >> 4u);
        for (var l = 0u; l < 16u; l++) {
            let q = (byte_at(base, o + 16u + 32u * n + 16u * h + l) >> shift) & 3u;
            v[16u * h + l] = dl * f32(q) - ml;
        }
    }
    return v;
}

// Values 8·r8 … 8·r8 + 7: eighth c = r8 % 4 of run r8 / 4, so half h = c / 2 and l = 8(c % 2) …
// of decode_run's loops; its 8 code bytes are word-aligned (84-byte blocks, offsets 16 + 8m).
fn decode_run8(base: u32, r8: u32) -> array<f32, 8> {
    let run = r8 / 4u;
    let c = r8 % 4u;
    let o = (run / 8u) * 84u;
    let sub = run % 8u;
    let n = sub / 4u;
    let shift = 2u * (sub % 4u);
    let h = c / 2u;
    let d = f16_at(base, o + 80u);
    let dmin = f16_at(base, o + 82u);
    let sc = byte_at(base, o + 8u * n + 2u * (sub % 4u) + h);
    let dl = d * f32(sc & 0xfu);
    let ml = dmin * f32(sc >> 4u);
    let q = u64_at(base, o + 16u + 32u * n + 16u * h + 8u * (c % 2u));
    var v: array<f32, 8>;
    for (var j = 0u; j < 4u; j++) {
        v[j] = dl * f32((q.x >> (8u * j + shift)) & 3u) - ml;
        v[j + 4u] = dl * f32((q.y >> (8u * j + shift)) & 3u) - ml;
    }
    return v;
}
