// attention (non-causal, flash style): q, k, v [n, heads·hd] → out [n, heads·hd], scale 1/√hd.
// hd must be a multiple of 4 and at most 128.
// One workgroup per (block of 16 queries, head): dispatch (ceil(n/16), heads, 1).
// Workgroup 16×16 threads: lid.y = query in the block, lid.x = lane. Keys are walked in tiles of
// 32 with an online softmax (running max m, running sum l); the n×n score matrix never exists.
// Scores: lane computes keys lane and lane + 16 of the tile. Output: lane owns the vec4 columns
// lane and lane + 16 of its query's head row.
// Workgroup memory: Q block [16][hd/4] vec4, K-then-V tile [32][hd/4] vec4, probabilities
// [16][32] f32 = 26 KiB.
// Every thread loops up to ≈ 80 + hd/2 times a key tile (its fixed-count loops counted): past
// ≈ 9 000 keys of hd 64 that bound is over the lane's budget for lavapipe's loop limiter, so a
// software adapter refuses those (attention.rs).
// (On cooperative matrices, fast precision, head dim 64: attention_coop_direct.wgsl.)

struct P {
    n: u32,
    heads: u32,
    hd: u32,
    scale: f32,
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p4: u32, _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32,
    _p10: u32, _p11: u32, _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const BQ: u32 = 16u;
const BKEY: u32 = 32u;
const NEG: f32 = -1.0e30;

var<workgroup> qs: array<vec4<f32>, 512>;  // [BQ][hd/4]
var<workgroup> kv: array<vec4<f32>, 1024>; // [BKEY][hd/4]
var<workgroup> ps: array<f32, 512>;        // [BQ][BKEY]

// Four consecutive elements of `row` (zero past n), columns 4c.. of this head.
fn load_q(row: u32, base: u32) -> vec4<f32> {
    if (row >= p.n) { return vec4<f32>(0.0); }
    return vec4<f32>(q[base], q[base + 1u], q[base + 2u], q[base + 3u]);
}
fn load_k(row: u32, base: u32) -> vec4<f32> {
    if (row >= p.n) { return vec4<f32>(0.0); }
    return vec4<f32>(k[base], k[base + 1u], k[base + 2u], k[base + 3u]);
}
fn load_v(row: u32, base: u32) -> vec4<f32> {
    if (row >= p.n) { return vec4<f32>(0.0); }
    return vec4<f32>(v[base], v[base + 1u], v[base + 2u], v[base + 3u]);
}

@compute @workgroup_size(16, 16, 1)
fn attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let hd4 = p.hd / 4u;
    let cols = p.heads * p.hd;
    let head_off = wg.y * p.hd;
    let q0 = wg.x * BQ;
    let qi = lid.y;
    let lane = lid.x;

    for (var e = li; e < BQ * hd4; e += 256u) {
        let r = e / hd4;
        let c = e % hd4;
        qs[e] = load_q(q0 + r, (q0 + r) * cols + head_off + 4u * c);
    }

    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var m = NEG;
    var l = 0.0;

    for (var k0 = 0u; k0 < p.n; k0 += BKEY) {
        // K tile.
        for (var e = li; e < BKEY * hd4; e += 256u) {
            let r = e / hd4;
            let c = e % hd4;
            kv[e] = load_k(k0 + r, (k0 + r) * cols + head_off + 4u * c);
        }
        workgroupBarrier();
        // Scores for keys lane and lane + 16 of query qi.
        for (var j = 0u; j < 2u; j++) {
            let key = lane + 16u * j;
            var s = NEG;
            if (k0 + key < p.n) {
                var d4 = vec4<f32>(0.0);
                for (var c = 0u; c < hd4; c++) {
                    d4 = fma(qs[qi * hd4 + c], kv[key * hd4 + c], d4);
                }
                s = (d4.x + d4.y + d4.z + d4.w) * p.scale;
            }
            ps[qi * BKEY + key] = s;
        }
        workgroupBarrier();
        // Row max (read-only), and the V tile replaces the K tile.
        var mt = m;
        for (var j = 0u; j < BKEY; j++) {
            mt = max(mt, ps[qi * BKEY + j]);
        }
        for (var e = li; e < BKEY * hd4; e += 256u) {
            let r = e / hd4;
            let c = e % hd4;
            kv[e] = load_v(k0 + r, (k0 + r) * cols + head_off + 4u * c);
        }
        workgroupBarrier();
        // Each thread turns its own two scores into probabilities.
        for (var j = 0u; j < 2u; j++) {
            let key = lane + 16u * j;
            let s = ps[qi * BKEY + key];
            ps[qi * BKEY + key] = select(exp(s - mt), 0.0, s <= NEG);
        }
        workgroupBarrier();
        let alpha = exp(m - mt);
        m = mt;
        var lsum = 0.0;
        acc0 *= alpha;
        acc1 *= alpha;
        let has0 = lane < hd4;
        let has1 = lane + 16u < hd4;
        for (var j = 0u; j < BKEY; j++) {
            let pj = ps[qi * BKEY + j];
            lsum += pj;
            if (has0) {
                acc0 = fma(vec4<f32>(pj), kv[j * hd4 + lane], acc0);
            }
            if (has1) {
                acc1 = fma(vec4<f32>(pj), kv[j * hd4 + lane + 16u], acc1);
            }
        }
        l = l * alpha + lsum;
        workgroupBarrier();
    }

    let row = q0 + qi;
    if (row < p.n) {
        let inv = 1.0 / l;
        let base = row * cols + head_off;
        if (lane < hd4) {
            let o = acc0 * inv;
            let b = base + 4u * lane;
            out[b] = o.x;
            out[b + 1u] = o.y;
            out[b + 2u] = o.z;
            out[b + 3u] = o.w;
        }
        if (lane + 16u < hd4) {
            let o = acc1 * inv;
            let b = base + 4u * (lane + 16u);
            out[b] = o.x;
            out[b + 1u] = o.y;
            out[b + 2u] = o.z;
            out[b + 3u] = o.w;
        }
    }
}
