// attention (non-causal, flash style): q, k, v [n, heads·hd] → out [n, heads·hd], scale 1/√hd.
// One workgroup per (block of 16 queries, head): dispatch (ceil(n/16), heads, 1).
// Workgroup 16×16 threads: lid.y = query in the block, lid.x = lane. Keys are walked in tiles of
// 32 with an online softmax (running max m, running sum l); the n×n score matrix never exists.
// Each lane owns output dims lane + 16·t (t < 8), so hd ≤ 128.
// Workgroup memory: Q block [16][hd], K-then-V tile [32][hd], probabilities [16][32] = 26 KiB.

struct P {
    n: u32,
    heads: u32,
    hd: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const BQ: u32 = 16u;
const BKEY: u32 = 32u;
const MAXD: u32 = 128u;
const NEG: f32 = -1.0e30;

var<workgroup> qs: array<f32, 2048>;  // [BQ][hd]
var<workgroup> kv: array<f32, 4096>;  // [BKEY][hd]
var<workgroup> ps: array<f32, 512>;   // [BQ][BKEY]

@compute @workgroup_size(16, 16, 1)
fn attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let hd = p.hd;
    let cols = p.heads * hd;
    let head_off = wg.y * hd;
    let q0 = wg.x * BQ;
    let qi = lid.y;
    let lane = lid.x;

    for (var e = li; e < BQ * hd; e += 256u) {
        let r = e / hd;
        let dd = e % hd;
        var val = 0.0;
        if (q0 + r < p.n) {
            val = q[(q0 + r) * cols + head_off + dd];
        }
        qs[e] = val;
    }

    var acc: array<f32, 8>;
    for (var t = 0u; t < 8u; t++) { acc[t] = 0.0; }
    var m = NEG;
    var l = 0.0;

    for (var k0 = 0u; k0 < p.n; k0 += BKEY) {
        // K tile.
        for (var e = li; e < BKEY * hd; e += 256u) {
            let r = e / hd;
            let dd = e % hd;
            var val = 0.0;
            if (k0 + r < p.n) {
                val = k[(k0 + r) * cols + head_off + dd];
            }
            kv[e] = val;
        }
        workgroupBarrier();
        // Scores: this thread does keys lane and lane + 16 for query qi.
        for (var j = 0u; j < 2u; j++) {
            let key = lane + 16u * j;
            var s = NEG;
            if (k0 + key < p.n) {
                var dot = 0.0;
                for (var dd = 0u; dd < hd; dd++) {
                    dot = fma(qs[qi * hd + dd], kv[key * hd + dd], dot);
                }
                s = dot * p.scale;
            }
            ps[qi * BKEY + key] = s;
        }
        workgroupBarrier();
        // Row max (read-only), and the V tile replaces the K tile.
        var mt = m;
        for (var j = 0u; j < BKEY; j++) {
            mt = max(mt, ps[qi * BKEY + j]);
        }
        for (var e = li; e < BKEY * hd; e += 256u) {
            let r = e / hd;
            let dd = e % hd;
            var val = 0.0;
            if (k0 + r < p.n) {
                val = v[(k0 + r) * cols + head_off + dd];
            }
            kv[e] = val;
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
        for (var j = 0u; j < BKEY; j++) {
            lsum += ps[qi * BKEY + j];
        }
        l = l * alpha + lsum;
        for (var t = 0u; t < 8u; t++) {
            let dd = lane + 16u * t;
            if (dd < hd) {
                var a = acc[t] * alpha;
                for (var j = 0u; j < BKEY; j++) {
                    a = fma(ps[qi * BKEY + j], kv[j * hd + dd], a);
                }
                acc[t] = a;
            }
        }
        workgroupBarrier();
    }

    if (q0 + qi < p.n) {
        let inv = 1.0 / l;
        for (var t = 0u; t < 8u; t++) {
            let dd = lane + 16u * t;
            if (dd < hd) {
                out[(q0 + qi) * cols + head_off + dd] = acc[t] * inv;
            }
        }
    }
}
